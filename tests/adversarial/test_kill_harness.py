"""The crash suite's probes survive the run they watch deleting what they list."""

from __future__ import annotations

import time
from pathlib import Path

from kill_harness import newer


def test_a_probe_listing_a_directory_the_run_deletes_says_no_instead_of_failing(
    tmp_path, monkeypatch
):
    (tmp_path / "data" / "chunk-000").mkdir(parents=True)
    (tmp_path / "data" / "chunk-000" / "file-000.parquet").write_bytes(b"x")
    probe = newer(tmp_path, "data/*/*", files_only=True)
    assert probe(time.time() - 60)

    def deleted_while_listed(self, pattern):  # what os.scandir raises once rmtree got there
        raise FileNotFoundError(2, "No such file or directory", str(self / "data"))
        yield  # pragma: no cover

    monkeypatch.setattr(Path, "glob", deleted_while_listed)
    assert not probe(time.time() - 60)

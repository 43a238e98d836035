"""What a dataset's writers fsync, and in what order: every shard's bytes by its writer, each
directory once before the manifest names the files in it, the manifest last."""

from __future__ import annotations

import os

import pytest

from shardfeed.formats.dataset_writer import DatasetWriter
from shardfeed.schemas.manifest import MANIFEST_PATH


@pytest.fixture
def synced(monkeypatch) -> list[tuple[str, str]]:
    """Every fsync and rename, in order: ``("fsync", path)`` and ``("rename", destination)``."""
    events: list[tuple[str, str]] = []
    fsync, replace = os.fsync, os.replace

    def recording_fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def recording_replace(src, dst) -> None:
        replace(src, dst)
        events.append(("rename", os.path.abspath(dst)))

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "replace", recording_replace)
    return events


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names fds through /proc")
def test_shards_are_fsynced_each_and_their_directory_once_before_the_manifest(tmp_path, synced):
    root = tmp_path / "ds"
    writer = DatasetWriter(
        str(root),
        {"x": {"dtype": "int64", "shape": [1]}, "text": {"dtype": "string", "shape": [1]}},
    )
    shards = 6
    for s in range(shards):
        writer.add_shard({"x": list(range(s * 10, s * 10 + 10)), "text": ["a b c"] * 10})
    manifest = writer.finalize()
    data_dirs = {os.path.dirname(str(root / r.path)) for r in manifest.shards}
    assert len(data_dirs) == 1
    data_dir = data_dirs.pop()

    synced_paths = [path for kind, path in synced if kind == "fsync"]
    renamed = [path for kind, path in synced if kind == "rename"]
    for record in manifest.shards:  # each shard's bytes were fsynced under its temporary name
        final = str(root / record.path)
        name = os.path.basename(final)
        assert any(os.path.basename(p).startswith(f".{name}.tmp-") for p in synced_paths), final
        assert final in renamed
    # the shards' directory: once, not once per shard, after its last rename, before the manifest
    assert synced_paths.count(data_dir) == 1
    manifest_path = str(root / MANIFEST_PATH)
    order = [(kind, path) for kind, path in synced]
    last_shard = max(order.index(("rename", str(root / r.path))) for r in manifest.shards)
    dir_sync = order.index(("fsync", data_dir))
    assert last_shard < dir_sync < order.index(("rename", manifest_path))
    # and every other file the manifest names sits in a directory synced before it
    for record in manifest.files:
        parent = os.path.dirname(str(root / record.path))
        assert order.index(("fsync", parent)) < order.index(("rename", manifest_path)), parent

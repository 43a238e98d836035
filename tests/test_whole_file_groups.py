"""A file whose units all go to one shard is not copied into ``byshard/``: its shard writer reads
the file's unit table itself (``convert.WHOLE_FILE``); a file spread over shards still is."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from test_source_lerobot import V21_FEATURES, make_v21

import shardfeed.pipelines.convert as graph
from shardfeed.cli.main import main
from shardfeed.formats.reader import open_dataset


def _count_group_copies(monkeypatch) -> list[str]:
    copied: list[str] = []
    real = graph.write_unit_groups

    def recording(path, table, groups):
        copied.append(str(path))
        return real(path, table, groups)

    monkeypatch.setattr(graph, "write_unit_groups", recording)
    return copied


def _v21_without_images(root: Path, lengths: dict[int, int]) -> dict:
    features = {k: v for k, v in V21_FEATURES.items() if v["dtype"] != "image"}
    tables = make_v21(root, lengths, features=features)
    for path in (root / "data").rglob("*.parquet"):
        pq.write_table(pq.read_table(path).drop_columns(["observation.images.top"]), path)
    return tables


def test_episode_files_are_read_whole_by_their_shard_writer(tmp_path, monkeypatch):
    lengths = {ep: 20 + ep for ep in range(12)}
    tables = _v21_without_images(tmp_path / "src", lengths)
    copied = _count_group_copies(monkeypatch)
    dst = tmp_path / "dst"
    # episodes are contiguous: each source file (one episode) lands in exactly one of the shards
    args = ["--from", "lerobot", "--target-shard-size", "2KB", "--direct_num_workers=1"]
    assert main(["convert", str(tmp_path / "src"), str(dst), *args]) == 0
    assert copied == []
    ds = open_dataset(dst)
    assert len(ds.manifest.shards) > 1
    assert len(ds) == sum(lengths.values())
    written = pa.concat_tables(pq.read_table(p) for p in sorted((dst / "data").rglob("*.parquet")))
    source = pa.concat_tables(t.select(["observation.state"]) for t in tables.values())
    # every frame once (episodes are shuffled, so compared as sorted values)
    ours = np.sort(written.column("observation.state").combine_chunks().flatten().to_numpy())
    theirs = np.sort(source.column("observation.state").combine_chunks().flatten().to_numpy())
    np.testing.assert_array_equal(ours, theirs)


def test_a_file_spread_over_shards_is_still_grouped(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    lines = [json.dumps({"text": "w" * (50 + i % 90), "id": i}) for i in range(600)]
    Path(src, "part.jsonl").write_text("\n".join(lines) + "\n")
    copied = _count_group_copies(monkeypatch)
    dst = tmp_path / "dst"
    args = ["--target-shard-size", "10KB", "--direct_num_workers=1"]
    assert main(["convert", str(src), str(dst), *args]) == 0
    assert len(copied) == 1  # the one file, shuffled over every shard
    assert len(open_dataset(dst).manifest.shards) > 1
    assert len(open_dataset(dst)) == 600

"""The per-sample size index ``meta/shardfeed/samples.parquet``, written by every writer path.

Each path (``write_dataset``, the ``shardfeed convert`` Beam pipeline, ``WriteShardedDataset``)
must write one row per sample whose ``bytes`` equal ``table_row_bytes`` of the shards read back,
list it in the manifest, and write the same bytes for the same input.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import apache_beam as beam
import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from shardfeed import open_dataset, write_dataset
from shardfeed.cli.main import main
from shardfeed.formats import sample_index
from shardfeed.formats.meta_writer import file_record
from shardfeed.formats.payload import table_row_bytes
from shardfeed.formats.publish import DatasetOptions, ShardOutcome, build_shard
from shardfeed.formats.sample_index import (
    SampleIndexError,
    SampleIndexMissingError,
    prefix_bytes,
    read_sample_bytes,
    stream_sample_index,
    write_sample_index,
)
from shardfeed.formats.storage import locate
from shardfeed.formats.store_path import StorePath
from shardfeed.formats.verify import verify_dataset
from shardfeed.pipelines.convert import reusable_outcome
from shardfeed.pipelines.runners import make_runner
from shardfeed.pipelines.write_sharded import WriteShardedDataset
from shardfeed.schemas import Feature, FeatureSpec, ShardfeedError
from shardfeed.schemas.manifest import (
    MANIFEST_PATH,
    SAMPLE_INDEX_PATH,
    Manifest,
    Provenance,
    Rejects,
    ShardRecord,
    compute_fingerprint,
)

# --------------------------------------------------------------------------------------------
# helpers


def shard_sizes_read_back(root: Path, manifest: Manifest) -> list[np.ndarray]:
    """Per shard, ``table_row_bytes`` of the shard file as written (the independent truth)."""
    return [table_row_bytes(pq.read_table(root / s.path)) for s in manifest.shards]


def assert_sample_index_is_right(root: Path) -> np.ndarray:
    """Every property of a published sample index; returns its values."""
    manifest = Manifest.loads((root / MANIFEST_PATH).read_text())
    path = root / SAMPLE_INDEX_PATH
    assert path.is_file()
    records = {f.path: f for f in manifest.files}
    assert records[SAMPLE_INDEX_PATH] == file_record(str(root), SAMPLE_INDEX_PATH)
    # the fingerprint covers it
    others = [f for f in manifest.files if f.path != SAMPLE_INDEX_PATH]
    shard_hashes = [s.sha256 for s in manifest.shards]
    options = manifest.provenance.content_options
    assert compute_fingerprint(shard_hashes, options, manifest.files) == manifest.fingerprint
    assert compute_fingerprint(shard_hashes, options, others) != manifest.fingerprint

    parquet = pq.ParquetFile(path)
    assert parquet.schema_arrow.names == ["bytes", "cost"]  # cost: tests/test_cost.py
    assert parquet.schema_arrow.field("bytes") == pa.field("bytes", pa.uint32(), nullable=False)
    assert parquet.metadata.row_group(0).column(0).compression == "ZSTD"
    values = parquet.read().column("bytes").to_numpy()
    assert len(values) == manifest.num_samples > 0

    per_shard = shard_sizes_read_back(root, manifest)
    np.testing.assert_array_equal(values, np.concatenate(per_shard))
    for shard, sizes in zip(manifest.shards, per_shard, strict=True):
        assert int(values[shard.index_start : shard.index_end].sum()) == shard.payload_bytes
        assert int(sizes.sum()) == shard.payload_bytes

    # the reader returns the same values from a path, a Location and an open Dataset
    for source in (root, str(root), locate(root)):
        np.testing.assert_array_equal(read_sample_bytes(source), values)
    with open_dataset(root) as ds:
        got = read_sample_bytes(ds)
        assert got.dtype == np.uint32
        np.testing.assert_array_equal(got, values)
    report = verify_dataset(root)
    assert report.ok, report.problems
    return values


def replace_manifest(root: Path, manifest: Manifest, **changes) -> Manifest:
    """Rewrite the manifest with ``changes`` and the fingerprint a writer would give it
    (``verify`` recomputes it)."""
    updated = dataclasses.replace(manifest, **changes)
    fingerprint = compute_fingerprint(
        [s.sha256 for s in updated.shards], updated.provenance.content_options, updated.files
    )
    updated = dataclasses.replace(updated, fingerprint=fingerprint)
    (root / MANIFEST_PATH).write_text(updated.dumps())
    return updated


def rewrite_index(root: Path, manifest: Manifest, values: np.ndarray) -> Manifest:
    """Write ``values`` as the sample index and record the new file in the manifest, so only the
    content checks (not the hash) can catch what is wrong with it."""
    record = write_sample_index(str(root), [values])
    files = tuple(record if f.path == SAMPLE_INDEX_PATH else f for f in manifest.files)
    return replace_manifest(root, manifest, files=files)


def jsonl_corpus(root: Path, n: int = 400, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True)
    sizes = rng.lognormal(6, 1.0, n).astype(int) + 1
    lines = [
        json.dumps({"text": "x" * int(s), "id": i, "score": i / 7, "meta": {"k": i % 3}})
        for i, s in enumerate(sizes)
    ]
    (root / "part-0.jsonl").write_text("\n".join(lines[: n // 2]) + "\n")
    (root / "part-1.jsonl").write_text("\n".join(lines[n // 2 :]) + "\n")
    return root


def image_folder(root: Path) -> Path:
    from PIL import Image

    for label, name in enumerate(["cat", "dog"]):
        (root / name).mkdir(parents=True)
        for i in range(9):
            Image.new("RGB", (8 + 3 * i, 8), (label * 100, i * 20, 7)).save(
                root / name / f"{i}.png"
            )
    return root


def an_outcome(root: Path, n: int = 50) -> ShardOutcome:
    spec = FeatureSpec((Feature("text", "string"), Feature("x", "float32", (3,))))
    table = pa.table(
        {
            "text": pa.array(["y" * (i % 11) for i in range(n)]),
            "x": pa.FixedSizeListArray.from_arrays(pa.array(np.ones(3 * n, np.float32)), 3),
        },
        schema=spec.arrow_schema(),
    )
    return build_shard(str(root), 3, table, spec, DatasetOptions(row_group_bytes=64), index_start=0)


# --------------------------------------------------------------------------------------------
# the writer paths


def test_write_dataset_writes_the_index_deterministically(make_small_dataset):
    one, manifest, _ = make_small_dataset("one", n=200)
    two, _, _ = make_small_dataset("two", n=200)
    assert len(manifest.shards) >= 3
    values = assert_sample_index_is_right(one)
    assert len(np.unique(values)) > 5  # the sizes really vary
    assert (one / SAMPLE_INDEX_PATH).read_bytes() == (two / SAMPLE_INDEX_PATH).read_bytes()


def test_episodic_write_dataset_writes_the_index(tmp_path):
    spec = FeatureSpec(
        (
            Feature("state", "float32", (2,)),
            Feature("note", "string"),
            Feature("episode_index", "int64"),
            Feature("index", "int64"),
            Feature("task_index", "int64"),
        )
    )
    lengths = [5, 17, 3, 30, 8, 12]
    n = sum(lengths)
    data = {
        "state": np.zeros((n, 2), np.float32),
        "note": ["n" * (i % 9) for i in range(n)],
        "episode_index": np.repeat(np.arange(len(lengths)), lengths),
        "index": np.arange(n),
        "task_index": np.zeros(n, np.int64),
    }
    manifest = write_dataset(
        tmp_path / "ep", spec, data, tasks=["t"], target_shard_size=500, row_group_size=100
    )
    assert len(manifest.shards) >= 2
    assert len(assert_sample_index_is_right(tmp_path / "ep")) == n


def test_convert_pipeline_writes_the_index_deterministically(tmp_path):
    src = jsonl_corpus(tmp_path / "src")
    one, two = tmp_path / "one", tmp_path / "two"
    args = ["--target-shard-size", "40KB"]
    assert main(["convert", str(src), str(one), *args]) == 0
    assert main(["convert", str(src), str(two), *args, "--direct_num_workers=2"]) == 0
    assert len(open_dataset(one).shards) >= 4
    values = assert_sample_index_is_right(one)
    assert len(values) == 400
    assert (one / SAMPLE_INDEX_PATH).read_bytes() == (two / SAMPLE_INDEX_PATH).read_bytes()


def test_convert_pipeline_indexes_an_image_folder(tmp_path):
    src = image_folder(tmp_path / "imgs")
    dst = tmp_path / "dst"
    assert main(["convert", str(src), str(dst), "--target-shard-size", "1KB"]) == 0
    values = assert_sample_index_is_right(dst)
    assert len(values) == 18
    # the image bytes dominate each sample's size
    ds = open_dataset(dst)
    images = ds.read(0, len(ds), columns=["image"])["image"]
    assert all(v >= len(img) for v, img in zip(values.tolist(), images, strict=True))


def test_write_sharded_dataset_writes_the_index(tmp_path):
    spec = FeatureSpec((Feature("id", "int64"), Feature("text", "string")))
    samples = [{"id": i, "text": "z" * (i * 7 % 300)} for i in range(300)]
    dst = tmp_path / "ds"
    options = PipelineOptions([])
    with beam.Pipeline(runner=make_runner(options), options=options) as pipeline:
        _ = (
            pipeline
            | beam.Create(samples)
            | WriteShardedDataset(dst, spec, target_shard_size="8KB", row_group_size="2KB")
        )
    assert len(open_dataset(dst).shards) >= 3
    values = assert_sample_index_is_right(dst)
    ids = open_dataset(dst).read(0, 300, columns=["id"])["id"]
    np.testing.assert_array_equal(values, [8 + i * 7 % 300 for i in ids.tolist()])


# --------------------------------------------------------------------------------------------
# write_sample_index and prefix_bytes


def test_uint32_until_a_value_needs_uint64(tmp_path):
    small = write_sample_index(str(tmp_path / "a"), [np.array([1, 2**32 - 1]), np.array([0])])
    table = pq.read_table(tmp_path / "a" / SAMPLE_INDEX_PATH)
    assert table.schema.field("bytes").type == pa.uint32()
    assert table.column("bytes").to_pylist() == [1, 2**32 - 1, 0]
    assert small.path == SAMPLE_INDEX_PATH

    write_sample_index(str(tmp_path / "b"), [np.array([1, 2**32]), np.array([5], np.uint64)])
    table = pq.read_table(tmp_path / "b" / SAMPLE_INDEX_PATH)
    assert table.schema.field("bytes") == pa.field("bytes", pa.uint64(), nullable=False)
    assert table.column("bytes").to_pylist() == [1, 2**32, 5]


def test_a_uint64_index_reads_back_and_checks_out(tmp_path):
    big = 2**32 + 17
    record = ShardRecord("data/x.parquet", 10, big + 1, 2, (2,), "0" * 64, 0, 2)
    files = (write_sample_index(str(tmp_path), [np.array([big, 1])]),)
    manifest = Manifest(
        2, "sha256:" + "0" * 64, (record,), files, Rejects(), Provenance("", {}, "0")
    )
    sizes = read_sample_bytes(locate(tmp_path), manifest)
    assert sizes.dtype == np.uint64 and sizes.tolist() == [big, 1]
    assert prefix_bytes(sizes).tolist() == [0, big, big + 1]


def test_row_groups_are_fixed_whatever_the_shard_split(tmp_path, monkeypatch):
    monkeypatch.setattr(sample_index, "ROW_GROUP_ROWS", 4)
    values = np.arange(10, dtype=np.int64) * 3
    splits = [[values], [values[:3], values[3:]], [values[:1], values[1:9], values[9:]]]
    written = []
    for i, arrays in enumerate(splits):
        write_sample_index(str(tmp_path / str(i)), arrays)
        path = tmp_path / str(i) / SAMPLE_INDEX_PATH
        meta = pq.read_metadata(path)
        assert [meta.row_group(g).num_rows for g in range(meta.num_row_groups)] == [4, 4, 2]
        written.append(path.read_bytes())
    assert written[0] == written[1] == written[2]
    np.testing.assert_array_equal(
        pq.read_table(tmp_path / "0" / SAMPLE_INDEX_PATH).column("bytes").to_numpy(), values
    )


def test_streamed_index_holds_one_shard_at_a_time_and_samples_costs(tmp_path, monkeypatch):
    """``stream_sample_index`` asks for the shards twice (types, then rows) and keeps every k-th
    cost beyond COST_SAMPLE samples, counted in global index order across row groups."""
    monkeypatch.setattr(sample_index, "ROW_GROUP_ROWS", 4)
    monkeypatch.setattr(sample_index, "COST_SAMPLE", 10)
    shards = [
        {"bytes": np.arange(n) + 1, "cost": np.arange(n) * 3 + start}
        for n, start in ((7, 0), (0, 0), (13, 100), (5, 7))
    ]
    calls = []

    def each_shard():
        calls.append(len(calls))
        yield from shards

    written = stream_sample_index(str(tmp_path), ["bytes", "cost"], each_shard)
    assert calls == [0, 1]
    costs = np.concatenate([shard["cost"] for shard in shards])  # 25 samples: every 3rd
    assert written.cost_sample.tolist() == costs[::3].tolist()
    table = pq.read_table(tmp_path / SAMPLE_INDEX_PATH)
    assert table.column("cost").to_numpy().tolist() == costs.tolist()
    assert (
        table.column("bytes").to_numpy().tolist()
        == np.concatenate([shard["bytes"] for shard in shards]).tolist()
    )
    monkeypatch.setattr(sample_index, "COST_SAMPLE", 1 << 20)  # up to it: every cost
    assert (
        stream_sample_index(str(tmp_path), ["bytes", "cost"], lambda: shards).cost_sample.tolist()
        == costs.tolist()
    )


def test_the_driver_reads_light_outcomes_and_reloads_one_shard_at_a_time(tmp_path):
    """convert's driver keeps no per-row arrays of its own (O(shards), not O(samples)): it reads
    each sidecar's arrays again, one shard at a time, while writing the index."""
    from shardfeed.pipelines import driver

    seen = []
    real_call, real_read = driver.SidecarReload.__call__, driver.SidecarReload.read

    def spy_call(self, outcomes):
        assert all(o.row_bytes is None and o.row_cost is None for o in outcomes)
        return real_call(self, outcomes)

    def spy_read(self, number):
        full = real_read(self, number)
        seen.append((full.number, len(full.row_bytes)))
        return full

    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": "w " * (i % 9), "n": i}) + "\n" for i in range(90)))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(driver.SidecarReload, "__call__", spy_call)
        patch.setattr(driver.SidecarReload, "read", spy_read)
        assert main(["convert", str(src), str(tmp_path / "ds"), "--target-shard-size", "300B"]) == 0
    ds = open_dataset(tmp_path / "ds")
    shards = [(i, s.rows) for i, s in enumerate(ds.manifest.shards)]
    assert len(shards) >= 3 and sorted(seen) == sorted(shards * 2)  # types, then rows
    assert (
        read_sample_bytes(ds).tolist()
        == np.concatenate(shard_sizes_read_back(tmp_path / "ds", ds.manifest)).tolist()
    )


def test_an_empty_index_has_no_rows(tmp_path):
    write_sample_index(str(tmp_path), [])
    table = pq.read_table(tmp_path / SAMPLE_INDEX_PATH)
    assert table.num_rows == 0 and table.schema.field("bytes").type == pa.uint32()


def test_negative_sizes_are_refused(tmp_path):
    with pytest.raises(ValueError, match=">= 0"):
        write_sample_index(str(tmp_path), [np.array([3, -1])])
    assert not (tmp_path / SAMPLE_INDEX_PATH).exists()


def test_prefix_bytes_starts_at_zero_and_never_overflows():
    sizes = np.full(3, 2**32 - 1, np.uint32)
    prefix = prefix_bytes(sizes)
    assert prefix.dtype == np.int64
    assert prefix.tolist() == [0, 2**32 - 1, 2 * (2**32 - 1), 3 * (2**32 - 1)]
    assert prefix_bytes(np.array([], np.uint32)).tolist() == [0]


# --------------------------------------------------------------------------------------------
# ShardOutcome state and reuse


def test_outcome_state_round_trips_row_bytes(tmp_path):
    outcome = an_outcome(tmp_path)
    assert outcome.row_bytes.tolist() == [i % 11 + 12 for i in range(50)]
    state = json.loads(json.dumps(outcome.to_state()))
    assert state["row_bytes"]["dtype"] == "uint32"
    assert set(state["row_bytes"]) == {"dtype", "zstd_b64"}
    back = ShardOutcome.from_state(state)
    assert back.record == outcome.record
    assert back.row_bytes.dtype == np.int64
    np.testing.assert_array_equal(back.row_bytes, outcome.row_bytes)


def test_outcome_state_keeps_sizes_above_uint32(tmp_path):
    record = ShardRecord("data/x.parquet", 10, 2**33 + 5, 2, (2,), "0" * 64, 0, 2)
    outcome = ShardOutcome(0, record, {}, [], np.array([2**33, 5]), np.array([1, 1]))
    state = json.loads(json.dumps(outcome.to_state()))
    assert state["row_bytes"]["dtype"] == "uint64"
    assert ShardOutcome.from_state(state).row_bytes.tolist() == [2**33, 5]


def test_from_state_refuses_sizes_that_disagree_with_the_record(tmp_path):
    outcome = an_outcome(tmp_path)
    short = msgspec.structs.replace(outcome.record, rows=49, row_groups=(49,), index_end=49)
    state = outcome.to_state() | {"record": short.to_json()}
    with pytest.raises(ShardfeedError, match=r"shard 3 .*50 row sizes.*49 rows"):
        ShardOutcome.from_state(state)
    heavier = msgspec.structs.replace(
        outcome.record, payload_bytes=outcome.record.payload_bytes + 1
    )
    with pytest.raises(ShardfeedError, match=r"shard 3 .*payload bytes"):
        ShardOutcome.from_state(outcome.to_state() | {"record": heavier.to_json()})
    garbage = outcome.to_state() | {"row_bytes": {"dtype": "uint32", "zstd_b64": "bm90IHpzdGQ="}}
    with pytest.raises(ShardfeedError, match="shard 3: unreadable row_bytes"):
        ShardOutcome.from_state(garbage)
    old = {k: v for k, v in outcome.to_state().items() if k != "row_bytes"}
    with pytest.raises(ShardfeedError, match=r"shard 3: .*no row_bytes"):
        ShardOutcome.from_state(old)


def test_a_sidecar_without_row_bytes_is_not_reused(tmp_path):
    outcome = an_outcome(tmp_path)
    sidecar = tmp_path / "sidecar.json"
    sidecar.write_text(json.dumps({"inputs": "abc", "outcome": outcome.to_state()}))
    reused = reusable_outcome(StorePath(str(tmp_path)), StorePath(str(sidecar)), "abc")
    assert reused is not None
    np.testing.assert_array_equal(reused.row_bytes, outcome.row_bytes)
    old = {k: v for k, v in outcome.to_state().items() if k != "row_bytes"}
    sidecar.write_text(json.dumps({"inputs": "abc", "outcome": old}))
    assert reusable_outcome(StorePath(str(tmp_path)), StorePath(str(sidecar)), "abc") is None
    sidecar.write_text(json.dumps(["not", "a", "sidecar"]))
    assert reusable_outcome(StorePath(str(tmp_path)), StorePath(str(sidecar)), "abc") is None
    # sidecars are not fsynced: one a power cut left empty or torn is written again, not reused
    whole = json.dumps({"inputs": "abc", "outcome": outcome.to_state()})
    for torn in ("", whole[: len(whole) // 2]):
        sidecar.write_text(torn)
        assert reusable_outcome(StorePath(str(tmp_path)), StorePath(str(sidecar)), "abc") is None


# --------------------------------------------------------------------------------------------
# read_sample_bytes and verify on bad indexes


def test_a_dataset_from_before_the_index_says_to_reconvert(small_dataset):
    root, manifest, _ = small_dataset
    (root / SAMPLE_INDEX_PATH).unlink()
    files = tuple(f for f in manifest.files if f.path != SAMPLE_INDEX_PATH)
    replace_manifest(root, manifest, files=files)
    with pytest.raises(SampleIndexMissingError, match="converted before the sample index existed"):
        read_sample_bytes(root)
    # the rest of such a dataset still reads and verifies
    assert len(open_dataset(root)) == manifest.num_samples
    assert verify_dataset(root).ok


def test_a_listed_index_that_is_gone_is_an_error(small_dataset):
    root, _, _ = small_dataset
    (root / SAMPLE_INDEX_PATH).unlink()
    with pytest.raises(SampleIndexError, match="listed in the manifest but missing"):
        read_sample_bytes(root)
    assert [(p.path, p.kind) for p in verify_dataset(root).problems] == [
        (SAMPLE_INDEX_PATH, "missing")
    ]


def test_an_index_of_the_wrong_length_is_refused_and_reported(small_dataset):
    root, manifest, _ = small_dataset
    values = read_sample_bytes(root)
    rewrite_index(root, manifest, values[:-1])
    with pytest.raises(SampleIndexError, match=f"{len(values) - 1} rows.*{len(values)} samples"):
        read_sample_bytes(root)
    for check_hashes in (True, False):
        problems = verify_dataset(root, check_hashes=check_hashes).problems
        assert [(p.path, p.kind) for p in problems] == [(SAMPLE_INDEX_PATH, "rows")]


def test_sizes_that_do_not_add_up_per_shard_are_refused(small_dataset):
    root, manifest, _ = small_dataset
    values = read_sample_bytes(root).copy()
    first, last = 0, len(values) - 1
    assert values[first] != values[last]  # swapping them moves bytes between two shards
    values[[first, last]] = values[[last, first]]
    rewrite_index(root, manifest, values)
    with pytest.raises(SampleIndexError, match=re.escape(manifest.shards[0].path) + " sum to"):
        read_sample_bytes(root)


def test_an_index_changed_behind_the_manifest_is_refused(small_dataset):
    root, _, _ = small_dataset
    write_sample_index(str(root), [read_sample_bytes(root) + 1])
    with pytest.raises(SampleIndexError, match="sha256 does not match"):
        read_sample_bytes(root)
    assert SAMPLE_INDEX_PATH in {p.path for p in verify_dataset(root).problems}


def test_sidecar_reads_ahead_by_rows_not_only_by_count(monkeypatch):
    """Big shards are read back one at a time (their arrays are the O(samples) part); small
    ones up to SIDECAR_THREADS ahead."""
    from shardfeed.pipelines import driver
    from shardfeed.schemas.manifest import ShardRecord

    big = driver.READ_AHEAD_ROWS * 3 // 4
    rows = [big, big, big, 10, 10, 10]
    lights, start = [], 0
    for number, n in enumerate(rows):
        record = ShardRecord(f"data/{number}.parquet", 1, n, n, (n,), "0" * 64, start, start + n)
        lights.append(ShardOutcome(number, record, {}, [], None, None))
        start += n
    read, held_when_yielded = [], []
    monkeypatch.setattr(
        driver.SidecarReload, "read", lambda self, number: read.append(number) or number
    )
    for number in driver.SidecarReload()(lights):
        held_when_yielded.append(sorted(n for n in read if n > number))
    # while a big shard is handed over, the next big one has not been read yet
    assert held_when_yielded[:2] == [[], []]
    assert read == list(range(6))

"""The second-generation conversion engine: columnar units, spools and in-graph inference.

What these pin down: a compressed input is inflated the same number of times whatever the shard
count (counted in decompressed bytes, never timed); Parquet rows are decoded once, in the scan,
and give identical output on every runner; the vectorised shuffle keys and bucket lookups agree
with their one-at-a-time definitions.
"""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("apache_beam")

from shardfeed import open_dataset
from shardfeed.cli.main import main
from shardfeed.formats.sources.jsonl import SAMPLE_BYTES
from shardfeed.formats.sources.jsonl_lines import _CHUNK
from shardfeed.formats.sources.parquet_table import ParquetSource
from shardfeed.formats.verify import verify_dataset
from shardfeed.planning.shard_plan import (
    BucketTotal,
    bucket_of,
    buckets_of,
    hot_bucket,
    hot_buckets,
    plan_shards,
)
from shardfeed.transforms.hashing import content_hash, mix64, shuffle_keys


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _documents(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    sizes = rng.lognormal(5, 0.8, n).astype(int) + 1
    words = np.array(["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta"])
    return [
        {"text": " ".join(rng.choice(words, int(s))), "id": i, "score": i / 7}
        for i, s in enumerate(sizes)
    ]


class _CountingGzip(gzip.GzipFile):
    """A GzipFile that adds every decompressed byte it hands out to ``inflated``."""

    inflated = 0

    def read(self, size: int = -1) -> bytes:
        data = super().read(size)
        _CountingGzip.inflated += len(data)
        return data

    def read1(self, size: int = -1) -> bytes:
        data = super().read1(size)
        _CountingGzip.inflated += len(data)
        return data

    def readinto(self, b) -> int:  # type: ignore[override]
        n = super().readinto(b)
        _CountingGzip.inflated += n
        return n


def test_a_gzip_input_is_inflated_the_same_whatever_the_shard_count(tmp_path, monkeypatch):
    docs = _documents(3000)
    raw = ("\n".join(json.dumps(d) for d in docs) + "\n").encode()
    src = tmp_path / "src"
    src.mkdir()
    (src / "corpus.jsonl.gz").write_bytes(gzip.compress(raw, mtime=0))
    monkeypatch.setattr(gzip, "GzipFile", _CountingGzip)  # the in-process runner shares it
    inflated = {}
    for shards, target in ((3, "200KB"), (40, "15KB")):
        _CountingGzip.inflated = 0
        dst = tmp_path / f"out-{shards}"
        assert main(["convert", str(src), str(dst), "--target-shard-size", target]) == 0
        assert len(open_dataset(dst).shards) >= shards
        inflated[shards] = _CountingGzip.inflated
    # the scan inflates the file once (inferring the schema as it goes), the schema's first
    # guess its head; the shard writers never do
    assert inflated[3] == inflated[40]
    assert len(raw) < inflated[3] <= len(raw) + SAMPLE_BYTES + _CHUNK


def _parquet_corpus(root: Path) -> Path:
    root.mkdir()
    docs = _documents(2400, seed=3)
    for k in range(3):  # three files of several row groups each
        part = pa.Table.from_pylist(docs[k * 800 : (k + 1) * 800])
        pq.write_table(part, root / f"part-{k}.parquet", row_group_size=150 + 50 * k)
    return root


def test_parquet_is_decoded_once_and_identical_on_every_runner(tmp_path):
    pytest.importorskip("distributed")
    src = _parquet_corpus(tmp_path / "src")
    local, dask = tmp_path / "local", tmp_path / "dask"
    args = ["--target-shard-size", "60KB"]
    assert main(["convert", str(src), str(local), *args]) == 0
    assert main(["convert", str(src), str(dask), *args, "--dask-local-workers", "2"]) == 0
    assert _tree(local) == _tree(dask)
    ds = open_dataset(local)
    assert len(ds.shards) >= 5 and verify_dataset(str(local)).ok
    ids = ds.read(0, len(ds), columns=["id"])["id"].tolist()
    assert sorted(ids) == list(range(2400)) and ids != list(range(2400))


def test_parquet_scan_rows_agree_with_scan(tmp_path):
    src = _parquet_corpus(tmp_path / "src")
    source = ParquetSource(str(src))
    spec = source.spec(source.merge_inferred(*(source.infer(f) for f in source.files()[:2])))
    file = source.files()[0]
    refs = source.scan(file, spec).units
    parts = list(source.scan_rows(file, spec))
    assert [r.position for r in refs] == np.concatenate([p.positions for p in parts]).tolist()
    assert [r.payload_bytes for r in refs] == np.concatenate([p.payload for p in parts]).tolist()
    assert [r.content_hash for r in refs] == [h for p in parts for h in p.hashes]
    rows = pa.concat_tables([p.table for p in parts])
    assert rows.equals(source.read(refs, spec))


def test_shuffle_keys_are_stable_seeded_and_place_dependent():
    hashes = [content_hash(b"%d" % (i % 50)) for i in range(2000)]  # many equal contents
    positions = np.arange(2000)
    keys = shuffle_keys(3, hashes, "a.jsonl", positions)
    assert keys.dtype == np.uint64
    assert np.array_equal(keys, shuffle_keys(3, hashes, "a.jsonl", positions))
    assert len(np.unique(keys)) == 2000  # equal contents at other places get other keys
    assert not np.array_equal(keys, shuffle_keys(4, hashes, "a.jsonl", positions))
    assert not np.array_equal(keys, shuffle_keys(3, hashes, "b.jsonl", positions))
    # roughly uniform: each of 16 top-bit ranges holds 1/16 of the keys, within 25%
    counts = np.bincount((keys >> np.uint64(60)).astype(np.int64), minlength=16)
    assert counts.min() > 2000 / 16 * 0.75 and counts.max() < 2000 / 16 * 1.25
    with pytest.raises(ValueError, match="hex digests"):
        shuffle_keys(0, ["xyz"], "a", np.arange(1))
    assert shuffle_keys(0, [], "a", np.arange(0)).shape == (0,)


def test_mix64_is_a_bijection_on_a_sample():
    values = np.arange(1 << 16, dtype=np.uint64) * np.uint64(0x10001)
    assert len(np.unique(mix64(values))) == len(values)


def test_array_bucket_helpers_match_their_scalar_definitions():
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 2**63, 500, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    sizes = rng.integers(0, 2000, 500)
    buckets = buckets_of(keys, sizes, 1000)
    assert buckets.tolist() == [
        bucket_of(int(k), int(s), 1000) for k, s in zip(keys, sizes, strict=True)
    ]
    assert hot_buckets(buckets).tolist() == [hot_bucket(int(b)) for b in buckets]
    totals = [BucketTotal(int(b), 1, 1, int(s)) for b, s in zip(buckets, sizes, strict=True)]
    plan = plan_shards(totals, 20_000)
    assert plan.shards_of(buckets).tolist() == [plan.shard_of[int(b)] for b in buckets]
    with pytest.raises(KeyError, match="not in the plan"):
        plan.shards_of(np.array([12345678901], dtype=np.uint64))


# --------------------------------------------------------------------------------------------------
# A big file is not one task


def test_line_ranges_tile_a_file_and_give_each_line_to_one_range(tmp_path):
    from shardfeed.formats.sources.line_ranges import LineRangeReader, byte_ranges

    rng = np.random.default_rng(5)
    lines = [b"x" * int(n) for n in rng.integers(0, 40, 300)]
    data = b"\n".join(lines)  # no newline at the end
    path = tmp_path / "f.jsonl"
    path.write_bytes(data)
    for piece_bytes in (1, 7, 64, 1000, len(data), len(data) + 1):
        got, counted = [], 0
        with pa.OSFile(str(path)) as handle:
            for start, stop in byte_ranges(len(data), piece_bytes):
                reader = LineRangeReader(handle, start, stop)
                chunk = reader.read()
                got.append(chunk)
                counted += reader.lines()
        assert b"".join(got) == data, piece_bytes
        assert counted == len(lines), piece_bytes


def _big_jsonl(root: Path) -> Path:
    root.mkdir()
    docs = _documents(1500, seed=11)
    lines = [json.dumps(d) for d in docs]
    lines[100] = "{not json"  # a bad line
    lines[700] = ""  # a blank line
    lines[1200] = json.dumps({"id": 5})  # no text field
    (root / "big.jsonl").write_text("\n".join(lines))  # no newline at the end
    (root / "small.jsonl").write_text("\n".join(lines[:50]) + "\n")
    return root


def spy_pieces(
    monkeypatch, source_class, method: str = "scan_piece"
) -> list[tuple[str, int, int, int]]:
    """``(file, start, stop, first)`` of each piece a source class scans from now on (JSONL's
    fused scan: ``scan_inferring``)."""
    seen = []
    scan_piece = getattr(source_class, method)

    def spy(self, file, spec, start, stop, first):
        seen.append((file, start, stop, first))
        return scan_piece(self, file, spec, start, stop, first)

    monkeypatch.setattr(source_class, method, spy)
    return seen


@pytest.mark.parametrize("order", ["shuffled", "no-shuffle"])
def test_a_large_jsonl_file_is_scanned_in_pieces_with_the_unsplit_output(
    tmp_path, monkeypatch, order
):
    from shardfeed.formats.sources.jsonl import JsonlSource

    src = _big_jsonl(tmp_path / "src")
    args = ["--target-shard-size", "40KB", "--max-reject-fraction", "0.1"]
    args += ["--no-shuffle"] if order == "no-shuffle" else []
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert main(["convert", str(src), str(whole), *args]) == 0
    seen = spy_pieces(monkeypatch, JsonlSource, "scan_inferring")
    assert main(["convert", str(src), str(cut), *args, "--task-size", "20KB"]) == 0
    big = sorted(p for p in seen if p[0] == "big.jsonl")
    assert len(big) >= 10  # the big file was many tasks, each scanned once (the guess held)
    assert [p[3] for p in big][:1] == [1] and len({p[3] for p in big}) == len(big)
    assert _tree(whole) == _tree(cut)
    assert open_dataset(cut).manifest.rejects.total == 2  # the bad line and the textless one


def test_pieces_give_the_same_output_on_dask_and_multi_processing(tmp_path):
    pytest.importorskip("distributed")
    src = _big_jsonl(tmp_path / "src")
    args = ["--target-shard-size", "40KB", "--max-reject-fraction", "0.1", "--task-size", "20KB"]
    local, dask, procs = tmp_path / "local", tmp_path / "dask", tmp_path / "procs"
    assert main(["convert", str(src), str(local), *args]) == 0
    assert main(["convert", str(src), str(dask), *args, "--dask-local-workers", "2"]) == 0
    multi = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]
    assert main(["convert", str(src), str(procs), *args, *multi]) == 0
    assert _tree(local) == _tree(dask) == _tree(procs)


def test_a_parquet_file_of_many_row_groups_is_scanned_in_pieces(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    table = pa.Table.from_pylist(_documents(3000, seed=2))
    pq.write_table(table, src / "big.parquet", row_group_size=100)
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    args = ["--target-shard-size", "60KB"]
    assert main(["convert", str(src), str(whole), *args]) == 0
    assert main(["convert", str(src), str(cut), *args, "--task-size", "30KB"]) == 0
    assert _tree(whole) == _tree(cut)
    assert len(open_dataset(cut)) == 3000


def test_parquet_pieces_are_runs_of_whole_row_groups(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist(_documents(1000)), path, row_group_size=100)
    source = ParquetSource(str(path))
    ranges = source.pieces("t.parquet", 1)
    assert ranges[0][0] == 0 and ranges[-1][1] == -1 and len(ranges) == 10
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    assert source.pieces("t.parquet", 1 << 40) == [(0, -1)]
    spans = [source.infer_piece("t.parquet", a, b)[1] for a, b in ranges]
    assert spans == [100] * 10


def test_a_gzip_webdataset_shard_is_inflated_the_same_whatever_the_shard_count(
    tmp_path, monkeypatch
):
    from test_source_webdataset import sample_members, write_tar

    docs = _documents(600, seed=4)
    members = [
        m
        for i, d in enumerate(docs)
        for m in sample_members(f"{i:05d}", {"txt": d["text"], "cls": i % 7})
    ]
    src = tmp_path / "src"
    write_tar(src / "a.tar.gz", members, gz=True)
    write_tar(src / "b.tar", members[:200])  # a plain tar beside it is read by seeking
    monkeypatch.setattr(gzip, "GzipFile", _CountingGzip)
    inflated, trees = {}, {}
    for shards, target in ((2, "150KB"), (30, "8KB")):
        _CountingGzip.inflated = 0
        dst = tmp_path / f"out-{shards}"
        assert main(["convert", str(src), str(dst), "--target-shard-size", target]) == 0
        ds = open_dataset(dst)
        assert len(ds.shards) >= shards and len(ds) == 700
        inflated[shards] = _CountingGzip.inflated
        rows = ds.read(0, len(ds), columns=["__url__", "__key__", "txt"])
        trees[shards] = sorted(zip(rows["__url__"], rows["__key__"], rows["txt"], strict=True))
    # the schema pass and the scan each inflate the gzip shard once; the writers never do
    size = len(gzip.decompress((src / "a.tar.gz").read_bytes()))
    assert size <= inflated[2] == inflated[30] <= 2 * size
    expected = sorted(
        [("a.tar.gz", f"{i:05d}", d["text"]) for i, d in enumerate(docs)]
        + [("b.tar", f"{i:05d}", d["text"]) for i, d in enumerate(docs[:100])]
    )
    assert trees[2] == trees[30] == expected


def test_spool_rows_are_read_back_exactly_in_batches_of_bounded_size(tmp_path):
    from shardfeed.formats.spool import SpoolWriter, read_rows
    from shardfeed.formats.store_path import StorePath

    rng = np.random.default_rng(9)
    schema = pa.schema([("text", pa.string()), ("n", pa.int64())])
    path = StorePath(str(tmp_path / "s.arrow"))
    parts = []
    with SpoolWriter(path, schema) as spool:
        for k in range(4):  # parts of up to 15 MB: cut into batches of about 4 MB
            n = int(rng.integers(100, 300))
            part = pa.table(
                {"text": [f"{k}-{i}-" + "x" * 50_000 for i in range(n)], "n": range(n)},
                schema=schema,
            )
            spool.write(part)
            parts.append(part)
    joined = pa.concat_tables(parts)
    with pa.OSFile(path.local) as source:
        batches = [b.nbytes for b in pa.ipc.open_file(source).read_all().to_batches()]
    assert len(batches) > 4 and max(batches) <= 8 << 20
    rows = np.sort(rng.integers(0, joined.num_rows, 500))  # ascending, repeats allowed
    assert read_rows(path, rows, schema).equals(joined.take(pa.array(rows)))
    with pytest.raises(ValueError, match="outside"):
        read_rows(path, np.array([joined.num_rows]), schema)


def test_many_units_per_shard_plan_contiguous_bucket_ranges():
    rng = np.random.default_rng(3)
    sizes = rng.lognormal(7, 0.8, 200_000).astype(np.int64) + 1
    keys = rng.integers(0, 2**63, len(sizes), dtype=np.uint64)
    target = int(sizes.sum() // 50)
    buckets = buckets_of(keys, sizes, target)
    plan = plan_shards(
        [BucketTotal(int(b), 1, 1, int(s)) for b, s in zip(buckets, sizes, strict=True)], target
    )
    _, shards = plan.bucket_arrays
    assert np.all(np.diff(shards) >= 0)  # in bucket order the shards only go up: ranges
    assert plan.num_shards == 50 and max(plan.bytes) / np.mean(plan.bytes) <= 1.01


def test_few_units_per_shard_fall_back_to_packing():
    sizes = np.array([9000, 100, 100, 5000, 4000, 900, 1000, 2000, 7000, 1], dtype=np.int64)
    keys = np.arange(10, dtype=np.uint64) * np.uint64(1000)  # buckets in this order
    plan = plan_shards(
        [BucketTotal(int(k), 1, 1, int(s)) for k, s in zip(keys, sizes, strict=True)], 9000
    )
    _, shards = plan.bucket_arrays
    assert not np.all(np.diff(shards) >= 0)  # not ranges: they balance worse than 1%
    # largest first onto the lightest: 9000+1000 | 7000+2000+900 | 5000+4000+100+100+1
    assert sorted(plan.bytes) == [9201, 9900, 10000]


def test_shard_writers_read_each_spool_about_once(tmp_path, monkeypatch):
    from shardfeed.formats import spool as spool_module
    from shardfeed.pipelines import spool_stage

    src = tmp_path / "src"
    src.mkdir()
    for k in range(3):
        docs = _documents(4000, seed=20 + k)
        (src / f"p{k}.jsonl").write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    touched = []
    read_rows = spool_module.read_rows

    def spy(path, rows, schema):
        sizes = np.frombuffer(spool_module.rows_path(path).read_bytes(), dtype="<i8")
        firsts = np.cumsum(sizes) - sizes
        batches = np.unique(np.searchsorted(firsts, rows, side="right") - 1)
        touched.append((path, len(batches), len(sizes)))
        return read_rows(path, rows, schema)

    monkeypatch.setattr(spool_stage, "read_rows", spy)
    dst = tmp_path / "out"
    assert main(["convert", str(src), str(dst), "--target-shard-size", "1MB"]) == 0
    shards = len(open_dataset(dst).shards)
    spools = {path: total for path, _, total in touched}
    assert shards >= 10 and len(spools) == 3
    read = sum(n for _, n, _ in touched)
    # each shard reads one run of rows from each spool: every batch about once, plus at most
    # the two batches at each end of each run (read twice); a random layout reads nearly
    # every batch for every shard (shards x batches)
    assert read <= sum(spools.values()) + 2 * shards * len(spools)
    assert read < shards * sum(spools.values()) / 3


def _big_tfrecord(root: Path) -> Path:
    """A plain TFRecord file of 2,000 Examples with a record whose data CRC is wrong, one that
    is not an Example and one whose feature has the wrong kind, plus a small gzip file."""
    from shardfeed.formats.tf_example import encode_example
    from shardfeed.formats.tfrecord import write_records

    root.mkdir()
    records = []
    for i, doc in enumerate(_documents(2000, seed=5)):
        features = {"id": ("int64", [i]), "text": ("bytes", [doc["text"].encode()])}
        if i == 1500:
            features["id"] = ("bytes", [b"x"])  # a kind conflict: field_type
        records.append(encode_example(features))
    records[900] = b"\x0a\x05abc"  # not an Example
    write_records(root / "big.tfrecord", records)
    data = bytearray((root / "big.tfrecord").read_bytes())
    data[-20] ^= 0xFF  # the last record's data no longer matches its CRC
    (root / "big.tfrecord").write_bytes(bytes(data))
    write_records(root / "small.tfrecord.gz", records[:40], compression="gzip")
    return root


def converted_in_pieces(
    tmp_path, monkeypatch, src, source_class, task_size, big, small, method="scan_piece"
):
    """Convert ``src`` whole and with ``--task-size``: the two trees must be equal, file ``big``
    must have been cut into contiguous pieces tiling it, and ``small`` scanned as one. Returns the
    pieces of ``big`` and the cut dataset's path."""
    args = ["--target-shard-size", "60KB", "--max-reject-fraction", "0.1"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert main(["convert", str(src), str(whole), *args]) == 0
    seen = spy_pieces(monkeypatch, source_class, method)
    assert main(["convert", str(src), str(cut), *args, "--task-size", task_size]) == 0
    pieces = sorted(p for p in seen if p[0] == big)
    assert pieces[0][1] == 0 and pieces[0][3] == 0 and pieces[-1][2] == -1
    assert all(a[2] == b[1] for a, b in itertools.pairwise(pieces))
    assert [p for p in seen if p[0] == small] == [(small, 0, -1, 0)]
    assert _tree(whole) == _tree(cut)
    return pieces, cut


def test_a_large_tfrecord_file_is_scanned_in_pieces_with_the_unsplit_output(tmp_path, monkeypatch):
    from shardfeed.formats.sources.tfrecord_source import TFRecordSource

    src = _big_tfrecord(tmp_path / "src")
    pieces, cut = converted_in_pieces(
        tmp_path,
        monkeypatch,
        src,
        TFRecordSource,
        "30KB",
        "big.tfrecord",
        "small.tfrecord.gz",
        method="scan_inferring",  # the schema rides on the scan: each piece scanned once
    )
    assert len(pieces) >= 5
    assert open_dataset(cut).manifest.rejects.total == 3  # the three bad records


def test_tfrecord_pieces_start_at_records_and_stop_at_a_damaged_header(tmp_path):
    from shardfeed.formats.sources.tfrecord_source import TFRecordSource
    from shardfeed.formats.tfrecord import iter_records

    src = _big_tfrecord(tmp_path / "src")
    source = TFRecordSource(str(src))
    starts = {offset for offset, _ in iter_records(src / "big.tfrecord", on_error=lambda e: None)}
    ranges = source.pieces("big.tfrecord", 20_000)
    assert len(ranges) >= 5 and all(a in starts for a, _ in ranges)
    spans = [source.infer_piece("big.tfrecord", a, b)[1] for a, b in ranges]
    assert sum(spans) == 1999  # every record but the one failing its data CRC
    assert [source.sample_piece("big.tfrecord", a, b)[1] for a, b in ranges] == spans
    assert source.pieces("small.tfrecord.gz", 1) == [(0, -1)]  # gzip is never entered midway
    data = bytearray((src / "big.tfrecord").read_bytes())
    cut = sorted(starts)[1000]
    data[cut + 2] ^= 0xFF  # record 1000's length no longer matches its CRC
    (src / "big.tfrecord").write_bytes(bytes(data))
    assert max(a for a, _ in source.pieces("big.tfrecord", 20_000)) <= cut


def _big_tar(root: Path) -> Path:
    """A plain WebDataset shard of 400 samples (text, json, some images, a long member name that
    needs a GNU long-name header, a sample refused for a bad image) and a small gzip shard."""
    from test_source_webdataset import encode, sample_members, write_tar

    docs = _documents(400, seed=8)
    members = []
    for i, doc in enumerate(docs):
        key = f"{i:05d}" if i != 250 else "long/" + "k" * 120  # a name past 100 bytes
        fields = {"txt": doc["text"], "json": {"i": i}}
        if i % 40 == 3:
            fields["jpg"] = encode((i % 200, 10, 20), "JPEG", (8, 6))
        if i == 77:
            fields["png"] = b"not a png"  # a reject
        members += sample_members(key, fields)
    write_tar(root / "big.tar", members)
    write_tar(root / "small.tar.gz", members[:30], gz=True)
    return root


def test_a_large_tar_shard_is_scanned_in_pieces_of_whole_samples(tmp_path, monkeypatch):
    from shardfeed.formats.sources.webdataset import WebDatasetSource

    src = _big_tar(tmp_path / "src")
    pieces, cut = converted_in_pieces(
        tmp_path, monkeypatch, src, WebDatasetSource, "40KB", "big.tar", "small.tar.gz"
    )
    assert len(pieces) >= 4
    assert open_dataset(cut).manifest.rejects.total == 1


def test_tar_pieces_cut_between_samples_and_never_where_context_matters(tmp_path):
    from test_source_webdataset import sample_members, write_tar

    from shardfeed.formats.sources.webdataset import WebDatasetSource

    src = _big_tar(tmp_path / "src")
    source = WebDatasetSource(str(src))
    ranges = source.pieces("big.tar", 30_000)
    assert len(ranges) >= 4
    spans = [source.infer_piece("big.tar", a, b)[1] for a, b in ranges]
    assert sum(spans) == 400 and min(spans) > 0  # every sample in exactly one piece
    merged = source.infer_piece("big.tar", 0, -1)[0]
    parts = [source.infer_piece("big.tar", a, b)[0] for a, b in ranges]
    assert sum(p.members for p in parts) == merged.members
    assert source.pieces("small.tar.gz", 1) == [(0, -1)]
    # a key that comes back after its sample ended is judged over the whole shard: no cuts
    members = []
    for i in range(200):
        members += sample_members(f"{i:05d}", {"txt": "x" * 500})
    members += sample_members("00003", {"cls": 1})
    write_tar(src / "again.tar", members)
    assert source.pieces("again.tar", 10_000) == [(0, -1)]


def _late_surprises(root: Path) -> Path:
    """JSONL whose heads mislead a sample: ``score`` is an integer for the first 2,000 lines and
    then a float (which an integer column rejects), ``late`` appears only near the end, and in
    ``b.jsonl`` the first 300 lines have no text field at all."""
    root.mkdir()
    docs = _documents(3000, seed=5)
    lines = []
    for i, d in enumerate(docs):
        d["score"] = i if i < 2000 else i + 0.5
        if i > 2900:
            d["late"] = f"tag-{i % 3}"
        lines.append(json.dumps(d))
    (root / "a.jsonl").write_text("\n".join(lines) + "\n")
    textless = [json.dumps({"id": i}) for i in range(300)]
    (root / "b.jsonl").write_text("\n".join(textless + lines[:400]) + "\n")
    return root


@pytest.mark.parametrize("task_size", [None, "60KB"])
def test_a_wrong_schema_guess_is_scanned_again_to_the_output_of_a_right_one(
    tmp_path, monkeypatch, task_size
):
    """The fused scan types each piece to the features its head suggests. When the full counts
    decide others (a key that turns float, a key that appears late, a file whose head has no
    text), every piece is scanned again: the dataset, its rejects and stats are byte for byte
    those of a run whose sample saw everything; the first scan's rejects are gone."""
    from shardfeed.formats.sources import jsonl
    from shardfeed.formats.sources.jsonl import JsonlSource

    src = _late_surprises(tmp_path / "src")
    args = ["--target-shard-size", "60KB", "--max-reject-fraction", "0.2"]
    args += ["--task-size", task_size] if task_size else []
    monkeypatch.setattr(jsonl, "SAMPLE_BYTES", 64 << 20)  # the sample is everything: a right guess
    right = tmp_path / "right"
    seen = spy_pieces(monkeypatch, JsonlSource, "scan_inferring")
    assert main(["convert", str(src), str(right), *args]) == 0
    once = len(seen)
    seen.clear()
    monkeypatch.setattr(jsonl, "SAMPLE_BYTES", 4096)  # a few lines: the guess is wrong
    sample_piece = JsonlSource.sample_piece

    def first_heads_only(self, file, start, stop):  # (the heads of many pieces might see it all)
        inferred, span = sample_piece(self, file, start, stop)
        return (inferred if start == 0 else jsonl.InferredSchema()), span

    monkeypatch.setattr(JsonlSource, "sample_piece", first_heads_only)
    wrong = tmp_path / "wrong"
    assert main(["convert", str(src), str(wrong), *args]) == 0
    assert len(seen) == 2 * once  # every piece scanned twice
    if task_size:
        assert once > 2  # a.jsonl was cut into pieces
    assert _tree(right) == _tree(wrong)
    ds = open_dataset(wrong)
    names = {f.name: f.dtype for f in ds.features.features}
    assert names["score"] == "float64" and names["late"] == "string"
    assert ds.manifest.rejects.total == 300  # b.jsonl's textless lines, and nothing else
    assert verify_dataset(wrong).ok


def test_a_wrong_tfrecord_guess_is_scanned_again_to_the_output_of_a_right_one(
    tmp_path, monkeypatch
):
    """TFRecord's fused scan: ``late`` appears only in the last 100 records, and ``score``
    turns from int64 to float for the last 500 (which the int64 column the majority decides
    rejects); a guess from the first records misses ``late``, and the second scan gives a
    right guess's bytes, rejects included."""
    from shardfeed.formats.sources import tfrecord_source
    from shardfeed.formats.sources.tfrecord_source import TFRecordSource
    from shardfeed.formats.tf_example import encode_example
    from shardfeed.formats.tfrecord import write_records

    src = tmp_path / "src"
    src.mkdir()
    records = []
    for i, doc in enumerate(_documents(2000, seed=9)):
        features = {"text": ("bytes", [doc["text"].encode()])}
        features["score"] = ("int64", [i]) if i < 1500 else ("float", [i + 0.5])
        if i >= 1900:
            features["late"] = ("int64", [i % 3])
        records.append(encode_example(features))
    write_records(src / "a.tfrecord", records)
    args = ["--target-shard-size", "60KB", "--max-reject-fraction", "0.3"]
    monkeypatch.setattr(tfrecord_source, "SAMPLE_RECORDS", 10_000)  # all: a right guess
    monkeypatch.setattr(tfrecord_source, "SAMPLE_BYTES", 64 << 20)
    right = tmp_path / "right"
    seen = spy_pieces(monkeypatch, TFRecordSource, "scan_inferring")
    assert main(["convert", str(src), str(right), *args]) == 0
    assert len(seen) == 1
    monkeypatch.setattr(tfrecord_source, "SAMPLE_RECORDS", 100)  # the head only: wrong
    wrong = tmp_path / "wrong"
    assert main(["convert", str(src), str(wrong), *args]) == 0
    assert len(seen) == 3  # scanned twice
    assert _tree(right) == _tree(wrong)
    ds = open_dataset(wrong)
    assert {f.name for f in ds.features.features} == {"text", "score", "late"}
    assert ds.manifest.rejects.total == 500 and len(ds) == 1500


def test_a_guess_the_source_refuses_makes_the_first_scan_count_only(tmp_path, monkeypatch):
    """Heads with no text field give no features the source accepts: the first scan only counts
    (nothing spooled, no rejects saved), and the second one writes what a right guess does."""
    from shardfeed.formats.sources import jsonl
    from shardfeed.formats.sources.jsonl import JsonlSource

    src = tmp_path / "src"
    src.mkdir()
    head = [json.dumps({"id": i, "pad": "x" * 8000}) for i in range(200)]  # 1.6 MB, no text
    body = [json.dumps(d) for d in _documents(800, seed=2)]
    (src / "a.jsonl").write_text("\n".join(head + body) + "\n")
    args = ["--target-shard-size", "40KB", "--max-reject-fraction", "0.3"]
    monkeypatch.setattr(jsonl, "SAMPLE_BYTES", 64 << 20)
    right = tmp_path / "right"
    assert main(["convert", str(src), str(right), *args]) == 0
    monkeypatch.setattr(jsonl, "SAMPLE_BYTES", 1024)  # the head (a block: the first MiB read)
    seen = []
    scan_inferring = JsonlSource.scan_inferring

    def spy(self, file, spec, start, stop, first):
        seen.append(spec is None)
        return scan_inferring(self, file, spec, start, stop, first)

    monkeypatch.setattr(JsonlSource, "scan_inferring", spy)
    wrong = tmp_path / "wrong"
    assert main(["convert", str(src), str(wrong), *args]) == 0
    assert seen == [True, False]  # counted without features, then scanned with them
    assert _tree(right) == _tree(wrong)
    assert open_dataset(wrong).manifest.rejects.total == 200

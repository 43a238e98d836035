"""Tampering with a published dataset: every case must be caught by ``verify``, and the reader
must refuse it or return exactly the original rows. Nothing is ever silently read.

One table of cases (``CASES``), run on a Parquet and a TFRecord copy of the same small dataset.
Each case damages a fresh copy (a shard's bytes, a whole shard, a manifest field, a metadata
file or an assignment) and states what ``verify`` reports and what the reader does:

- ``verify``: the exact set of problem kinds, or the error it raises for a manifest that does
  not parse;
- reader: ``refused`` (a ``ShardfeedError`` from ``open_dataset`` or while reading every row
  through ``iter_batches``, ``read_row_group`` and ``ShardLoader``) or ``intact`` (the damage
  carries no row data and every row reads back as written). A read that returns other data
  without an error fails the test, whatever the case says.

A shard swapped for another valid shard of the same size, rows and schema is refused too: the
reader checks a Parquet shard's footer against the manifest's ``footer_sha256`` when it opens
it, and hashes a TFRecord shard (which has no footer) whole (FORMAT.md §12).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_verify_and_safety import _edit_manifest, flip_byte

from shardfeed import open_dataset, write_dataset
from shardfeed.assignment import World, assign, load_assignment
from shardfeed.cli.main import main
from shardfeed.formats.errors import AssignmentError
from shardfeed.formats.verify import verify_dataset
from shardfeed.loader import ShardLoader
from shardfeed.schemas import Manifest, ShardfeedError
from shardfeed.schemas.manifest import MANIFEST_PATH, SAMPLE_INDEX_PATH

SPEC = {"blob": {"dtype": "image", "shape": [8, 8, 3]}, "id": {"dtype": "int64", "shape": [1]}}
ROWS, BLOB = 64, 200  # four shards of 16 rows, two row groups each
ENCODINGS = ("parquet", "tfrecord")
PQ_INTACT_TFR_REFUSED = {"parquet": "intact", "tfrecord": "refused"}  # TFRecord needs offsets
ASSIGNMENT = "run"


def _write(root: Path, seed: int, blob: int, encoding: str) -> Manifest:
    """Random fixed-length blobs (stored uncompressed) and ids 0..N-1: the same seedless layout
    gives shards of equal size, so same-size substitutes exist."""
    rng = np.random.default_rng(seed)
    return write_dataset(
        root,
        SPEC,
        {"blob": [rng.bytes(blob) for _ in range(ROWS)], "id": np.arange(ROWS)},
        target_shard_size=ROWS * blob // 4,
        row_group_size=ROWS * blob // 8,
        cost="bytes",
        encoding=encoding,
    )


@dataclass(frozen=True)
class Built:
    """The pristine datasets of one encoding: ``main`` (with an assignment), ``other`` (same
    schema and shard sizes, other bytes), ``bigger`` (same schema, other sizes)."""

    encoding: str
    main: Path
    other: Path
    bigger: Path
    manifest: Manifest
    other_manifest: Manifest
    rows: list[tuple[int, bytes]]  # (id, blob) of every row, in order


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Built]:
    out = {}
    for encoding in ENCODINGS:
        base = tmp_path_factory.mktemp(f"pristine-{encoding}")
        manifest = _write(base / "main", 0, BLOB, encoding)
        other_manifest = _write(base / "other", 1, BLOB, encoding)
        _write(base / "bigger", 2, BLOB + 10, encoding)
        assign(base / "main", World(1, 2), name=ASSIGNMENT)
        assign(base / "other", World(1, 2), name=ASSIGNMENT)
        with open_dataset(base / "main") as ds:
            batch = ds.read(0, len(ds))
        rows = list(zip(batch["id"].reshape(-1).tolist(), map(bytes, batch["blob"]), strict=True))
        out[encoding] = Built(
            encoding, base / "main", base / "other", base / "bigger", manifest, other_manifest, rows
        )
    return out


@dataclass(frozen=True)
class Ctx:
    """What a tamper function works on: a fresh copy ``root`` of ``built.main``."""

    root: Path
    built: Built

    def shard(self, i: int, root: Path | None = None) -> Path:
        return (root or self.root) / self.built.manifest.shards[i].path

    def same_size_pair(self) -> tuple[int, int]:
        """Two shards of the main dataset with equal byte sizes."""
        sizes = [s.bytes for s in self.built.manifest.shards]
        pairs = [(i, j) for i in range(len(sizes)) for j in range(i + 1, len(sizes))]
        return next((i, j) for i, j in pairs if sizes[i] == sizes[j])

    def same_size_other(self) -> int:
        """A shard index whose file in ``other`` has the main dataset's size at that index."""
        pairs = zip(self.built.manifest.shards, self.built.other_manifest.shards, strict=True)
        return next(k for k, (a, b) in enumerate(pairs) if a.bytes == b.bytes)


Tamper = Callable[[Ctx], None]


@dataclass(frozen=True)
class Case:
    """One row of the table. ``verify``: problem kinds per encoding (or an error type name);
    ``reader``: ``refused`` or ``intact`` for the Dataset reads; ``loader``: the same for
    ``ShardLoader`` (default: as ``reader``)."""

    id: str
    what: str
    tamper: Tamper
    verify: dict[str, frozenset[str] | str]
    reader: str | dict[str, str]
    loader: str | dict[str, str] | None = None
    encodings: tuple[str, ...] = ENCODINGS
    assignment_refused: bool = False

    def expected_reads(self, encoding: str) -> dict[str, str]:
        """The outcome of each read path for ``encoding``."""
        reader = self.reader if isinstance(self.reader, str) else self.reader[encoding]
        loader = self.loader or reader
        loader = loader if isinstance(loader, str) else loader[encoding]
        return {"iter_batches": reader, "read_row_group": reader, "loader": loader}


def both(kinds: frozenset[str] | str) -> dict[str, frozenset[str] | str]:
    return dict.fromkeys(ENCODINGS, kinds)


def k(*kinds: str) -> frozenset[str]:
    return frozenset(kinds)


# -- tamper functions -------------------------------------------------------------------------


def flip_at(where: Callable[[int], int], shard: int = 1) -> Tamper:
    def tamper(ctx: Ctx) -> None:
        path = ctx.shard(shard)
        flip_byte(path, where(path.stat().st_size))

    return tamper


def truncate(keep: Callable[[int], int]) -> Tamper:
    def tamper(ctx: Ctx) -> None:
        path = ctx.shard(1)
        path.write_bytes(path.read_bytes()[: keep(path.stat().st_size)])

    return tamper


def append(data: bytes) -> Tamper:
    def tamper(ctx: Ctx) -> None:
        with open(ctx.shard(1), "ab") as handle:
            handle.write(data)

    return tamper


def delete_shard(ctx: Ctx) -> None:
    ctx.shard(2).unlink()


def substitute_same_dataset_other_size(ctx: Ctx) -> None:
    sizes = [s.bytes for s in ctx.built.manifest.shards]
    j = next(j for j in range(len(sizes)) if sizes[j] != sizes[0])
    shutil.copyfile(ctx.shard(j), ctx.shard(0))


def substitute_same_dataset_same_size(ctx: Ctx) -> None:
    i, j = ctx.same_size_pair()
    shutil.copyfile(ctx.shard(j), ctx.shard(i))


def swap_same_size(ctx: Ctx) -> None:
    i, j = ctx.same_size_pair()
    a, b = ctx.shard(i).read_bytes(), ctx.shard(j).read_bytes()
    ctx.shard(i).write_bytes(b)
    ctx.shard(j).write_bytes(a)


def substitute_other_dataset_same_size(ctx: Ctx) -> None:
    k_ = ctx.same_size_other()
    shutil.copyfile(ctx.shard(k_, ctx.built.other), ctx.shard(k_))


def substitute_other_dataset_other_size(ctx: Ctx) -> None:
    shutil.copyfile(ctx.shard(1, ctx.built.bigger), ctx.shard(1))


def edit_manifest(edit: Callable[[dict[str, Any]], None]) -> Tamper:
    def tamper(ctx: Ctx) -> None:
        _edit_manifest(ctx.root, edit)

    return tamper


def shift_rows(m: dict[str, Any]) -> None:
    """Shard 1 claims one more row, with its index range, later shards and the total kept
    consistent, so the manifest still parses."""
    m["shards"][1]["rows"] += 1
    m["shards"][1]["row_groups"][-1] += 1
    m["shards"][1]["index_end"] += 1
    for shard in m["shards"][2:]:
        shard["index_start"] += 1
        shard["index_end"] += 1
    m["num_samples"] += 1


def regroup(m: dict[str, Any]) -> None:
    groups = m["shards"][1]["row_groups"]
    groups[0], groups[1] = groups[0] - 1, groups[1] + 1


def swap_paths(ctx: Ctx) -> None:
    """The records of two same-size shards exchange paths (each file is intact)."""
    i, j = ctx.same_size_pair()

    def edit(m: dict[str, Any]) -> None:
        a, b = m["shards"][i], m["shards"][j]
        a["path"], b["path"] = b["path"], a["path"]

    _edit_manifest(ctx.root, edit)


def set_hex(key: str) -> Callable[[dict[str, Any]], None]:
    def edit(m: dict[str, Any]) -> None:
        m["shards"][1][key] = "0" * 64

    return edit


def flip_hex_digit(value: str) -> str:
    return value[:-1] + ("0" if value[-1] != "0" else "1")


def edit_file(rel: str, edit: Callable[[bytes], bytes], *, rerecord: bool = False) -> Tamper:
    """Rewrite metadata file ``rel``; with ``rerecord`` also its manifest record (size, sha256),
    as a tamperer who knows the format would."""

    def tamper(ctx: Ctx) -> None:
        import hashlib

        path = ctx.root / rel
        data = edit(path.read_bytes())
        path.write_bytes(data)
        if rerecord:

            def fix(m: dict[str, Any]) -> None:
                record = next(f for f in m["files"] if f["path"] == rel)
                record.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())

            _edit_manifest(ctx.root, fix)

    return tamper


def replace_text(old: str, new: str) -> Callable[[bytes], bytes]:
    def edit(data: bytes) -> bytes:
        text = data.decode()
        assert old in text, (old, text[:200])
        return text.replace(old, new, 1).encode()

    return edit


def flip_middle(data: bytes) -> bytes:
    out = bytearray(data)
    out[len(out) // 2] ^= 0xFF
    return bytes(out)


def from_bigger(rel: str) -> Tamper:
    """``rel`` of the dataset with bigger rows copied in (the same-size ``other`` dataset has
    byte-identical sample sizes, so its ``samples.parquet`` is no change at all)."""

    def tamper(ctx: Ctx) -> None:
        shutil.copyfile(ctx.built.bigger / rel, ctx.root / rel)

    return tamper


def delete_file(rel: str) -> Tamper:
    def tamper(ctx: Ctx) -> None:
        (ctx.root / rel).unlink()

    return tamper


ASSIGN_TABLE = f"meta/shardfeed/assignments/{ASSIGNMENT}.parquet"
ASSIGN_HEADER = f"meta/shardfeed/assignments/{ASSIGNMENT}.json"


def other_assignment(ctx: Ctx) -> None:
    for rel in (ASSIGN_TABLE, ASSIGN_HEADER):
        shutil.copyfile(ctx.built.other / rel, ctx.root / rel)


def header_fingerprint(data: bytes) -> bytes:
    doc = json.loads(data)
    doc["dataset"]["fingerprint"] = flip_hex_digit(doc["dataset"]["fingerprint"])
    return json.dumps(doc).encode()


CASES = [
    # -- a shard's bytes ----------------------------------------------------------------------
    Case("flip-first-byte", "XOR 0xFF the first byte of shard 1", flip_at(lambda n: 0),
         {"parquet": k("hash"), "tfrecord": k("hash", "framing")}, "refused"),
    Case("flip-middle-byte", "XOR 0xFF the middle byte of shard 1", flip_at(lambda n: n // 2),
         {"parquet": k("hash"), "tfrecord": k("hash", "framing")}, "refused"),
    Case("flip-last-byte", "XOR 0xFF the last byte of shard 1", flip_at(lambda n: n - 1),
         {"parquet": k("hash"), "tfrecord": k("hash", "framing")}, "refused"),
    Case("truncate-tail", "drop the last 10 bytes of shard 1", truncate(lambda n: n - 10),
         both(k("size")), "refused"),
    Case("truncate-half", "keep the first half of shard 1", truncate(lambda n: n // 2),
         both(k("size")), "refused"),
    Case("truncate-empty", "shard 1 emptied to 0 bytes", truncate(lambda n: 0),
         both(k("size")), "refused"),
    Case("append-byte", "append one NUL byte to shard 1", append(b"\0"),
         both(k("size")), "refused"),
    Case("append-block", "append 4 KiB to shard 1", append(b"PAR1" * 1024),
         both(k("size")), "refused"),
    Case("delete", "delete shard 2", delete_shard, both(k("missing")), "refused"),
    # -- a whole shard swapped for another valid one ------------------------------------------
    Case("substitute-same-dataset-other-size",
         "shard 0 replaced by a shard of the same dataset with another size",
         substitute_same_dataset_other_size, both(k("size")), "refused",
         encodings=("parquet",)),  # TFRecord shards of this dataset all have one size
    Case("substitute-same-dataset-same-size",
         "a shard replaced by another shard of the same dataset with the same size",
         substitute_same_dataset_same_size, both(k("hash")), "refused"),
    Case("swap-same-size", "two same-size shards of the dataset swapped", swap_same_size,
         both(k("hash")), "refused"),
    Case("substitute-other-dataset-same-size",
         "a shard replaced by the same-size shard of another dataset with the same schema",
         substitute_other_dataset_same_size, both(k("hash")), "refused"),
    Case("substitute-other-dataset-other-size",
         "shard 1 replaced by a shard of another dataset with the same schema, another size",
         substitute_other_dataset_other_size, both(k("size")), "refused"),
    # -- a manifest field ---------------------------------------------------------------------
    Case("manifest-rows", "shard 1 'rows' + 1 only (the record no longer adds up)",
         edit_manifest(lambda m: m["shards"][1].update(rows=m["shards"][1]["rows"] + 1)),
         both("SchemaError"), "refused"),
    Case("manifest-rows-consistent",
         "shard 1 claims one more row; index ranges and num_samples shifted to match",
         edit_manifest(shift_rows),
         {"parquet": k("rows", "fingerprint"), "tfrecord": k("rows", "index", "fingerprint")},
         "refused", assignment_refused=True),
    # TFRecord row groups are record ranges the reader takes from the manifest: regrouping
    # changes no byte and no row read, and verify finds it against the writer's cut
    Case("manifest-row-groups", "shard 1 row groups [8, 8] -> [7, 9]", edit_manifest(regroup),
         {"parquet": k("rows"), "tfrecord": k("rows")}, {"parquet": "refused", "tfrecord": "intact"}),
    Case("manifest-bytes", "shard 1 'bytes' + 1",
         edit_manifest(lambda m: m["shards"][1].update(bytes=m["shards"][1]["bytes"] + 1)),
         both(k("size")), "refused"),
    Case("manifest-payload-bytes", "shard 1 'payload_bytes' + 1",
         edit_manifest(
             lambda m: m["shards"][1].update(payload_bytes=m["shards"][1]["payload_bytes"] + 1)
         ),
         both(k("index")), "intact", loader="refused"),
    # a Parquet shard is checked by its footer on open; a TFRecord shard is hashed whole
    Case("manifest-shard-sha256", "shard 1 'sha256' set to zeros", edit_manifest(set_hex("sha256")),
         both(k("hash", "fingerprint")), {"parquet": "intact", "tfrecord": "refused"}),
    Case("manifest-paths-swapped", "the records of two same-size shards exchange paths",
         swap_paths, both(k("hash")), "refused"),
    Case("manifest-fingerprint", "'fingerprint' changed in one hex digit",
         edit_manifest(lambda m: m.update(fingerprint=flip_hex_digit(m["fingerprint"]))),
         both(k("fingerprint")), "intact", assignment_refused=True),
    Case("manifest-content-options", "a content option changed",
         edit_manifest(lambda m: m["provenance"]["content_options"].update(target_shard_size=1)),
         both(k("fingerprint")), "intact"),
    Case("manifest-num-samples", "'num_samples' + 1",
         edit_manifest(lambda m: m.update(num_samples=m["num_samples"] + 1)),
         both("SchemaError"), "refused"),
    Case("manifest-encoding", "'encoding' switched to the other encoding",
         edit_manifest(
             lambda m: m.update(encoding="tfrecord" if m["encoding"] == "parquet" else "parquet")
         ),
         {"parquet": k("index"), "tfrecord": k("unreadable")}, "refused"),
    Case("manifest-deleted", "manifest.json deleted", delete_file(MANIFEST_PATH),
         both("IncompleteDatasetError"), "refused"),
    Case("manifest-file-sha256", "meta/info.json record's sha256 changed in one digit",
         edit_manifest(
             lambda m: next(f for f in m["files"] if f["path"] == "meta/info.json").update(
                 sha256=flip_hex_digit(
                     next(f for f in m["files"] if f["path"] == "meta/info.json")["sha256"]
                 )
             )
         ),
         both(k("hash", "fingerprint")), "refused"),
    # -- info.json ----------------------------------------------------------------------------
    Case("info-field", "info.json total_tasks 0 -> 9 (same length)",
         edit_file("meta/info.json", replace_text('"total_tasks": 0', '"total_tasks": 9')),
         both(k("hash")), "refused"),
    Case("info-total-frames-rerecorded",
         "info.json total_frames changed, its manifest record updated to match",
         edit_file("meta/info.json", replace_text('"total_frames": 64', '"total_frames": 65'),
                   rerecord=True),
         both(k("fingerprint")), "refused"),
    Case("info-feature-dtype-rerecorded",
         "info.json feature id int64 -> int32, its manifest record updated to match",
         edit_file("meta/info.json", replace_text('"dtype": "int64"', '"dtype": "int32"'),
                   rerecord=True),
         both(k("fingerprint")), {"parquet": "refused", "tfrecord": "intact"}),
    Case("info-deleted", "meta/info.json deleted", delete_file("meta/info.json"),
         both(k("missing")), "refused"),
    # -- samples.parquet, stats.json ----------------------------------------------------------
    Case("samples-flip", "XOR 0xFF the middle byte of samples.parquet",
         edit_file(SAMPLE_INDEX_PATH, flip_middle),
         {"parquet": k("hash"), "tfrecord": k("hash", "index")},
         PQ_INTACT_TFR_REFUSED, loader="refused"),
    Case("samples-from-other-dataset", "samples.parquet of a same-schema dataset copied in",
         from_bigger(SAMPLE_INDEX_PATH),
         {"parquet": k("hash"), "tfrecord": k("size", "index")},
         PQ_INTACT_TFR_REFUSED, loader="refused"),
    Case("samples-deleted", "samples.parquet deleted", delete_file(SAMPLE_INDEX_PATH),
         {"parquet": k("missing"), "tfrecord": k("missing", "index")},
         PQ_INTACT_TFR_REFUSED, loader="refused"),
    Case("stats-edit", "stats.json: one digit changed",
         edit_file("meta/stats.json", lambda d: d.replace(b"1", b"2", 1)), both(k("hash")),
         "intact"),
    # -- an assignment ------------------------------------------------------------------------
    Case("assignment-table-flip", "XOR 0xFF the middle byte of the assignment table",
         edit_file(ASSIGN_TABLE, flip_middle), both(k("hash")), "intact",
         assignment_refused=True),
    Case("assignment-table-truncated", "the assignment table loses its last byte",
         edit_file(ASSIGN_TABLE, lambda d: d[:-1]), both(k("size")), "intact",
         assignment_refused=True),
    Case("assignment-fingerprint", "the assignment header's dataset fingerprint changed",
         edit_file(ASSIGN_HEADER, header_fingerprint), both(k("fingerprint")), "intact",
         assignment_refused=True),
    Case("assignment-from-other-dataset", "header and table of the other dataset's assignment",
         other_assignment, both(k("fingerprint")), "intact", assignment_refused=True),
]  # fmt: skip


# -- outcomes ---------------------------------------------------------------------------------


def verify_outcome(root: Path) -> frozenset[str] | str:
    """The problem kinds ``verify`` reports, or the name of the error it raises."""
    try:
        report = verify_dataset(root)
    except ShardfeedError as err:
        return type(err).__name__
    assert report.ok == (not report.problems)
    return frozenset(p.kind for p in report.problems)


def _rows_of(ids: np.ndarray, blobs: Any) -> list[tuple[int, bytes]]:
    return list(zip(np.asarray(ids).reshape(-1).tolist(), map(bytes, blobs), strict=True))


def _table_rows(table: Any) -> list[tuple[int, bytes]]:
    blobs = [v["bytes"] for v in table.column("blob").to_pylist()]
    return _rows_of(table.column("id").to_numpy(), blobs)


def _read_paths(root: Path, check_hashes: bool) -> dict[str, Callable[[], list]]:
    """Each way of reading every row, returning (id, blob) rows in dataset order (the loader's
    in id order). Each opens the dataset itself, so an open error counts against each."""

    def batches() -> list:
        with open_dataset(root, check_hashes=check_hashes) as ds:
            return [row for b in ds.iter_batches(10) for row in _rows_of(b["id"], b["blob"])]

    def row_groups() -> list:
        with open_dataset(root, check_hashes=check_hashes) as ds:
            return [
                row
                for s, shard in enumerate(ds.shards)
                for g in range(len(shard.row_groups))
                for row in _table_rows(ds.read_row_group(s, g))
            ]

    def loader() -> list:
        with open_dataset(root, check_hashes=check_hashes) as ds:
            got = [
                row
                for b in ShardLoader(ds, rank=0, world=1, batch_size=10)
                for row in _rows_of(b["id"], b["blob"])
            ]
        return sorted(set(got))  # a padded epoch repeats a few rows

    return {"iter_batches": batches, "read_row_group": row_groups, "loader": loader}


def read_outcomes(root: Path, original: list, check_hashes: bool = False) -> dict[str, str]:
    """``refused`` or ``intact`` for each read path; ``SILENT`` for data that differs."""
    out = {}
    for name, read in _read_paths(root, check_hashes).items():
        try:
            got = read()
        except ShardfeedError:
            out[name] = "refused"
            continue
        want = sorted(set(original)) if name == "loader" else original
        out[name] = "intact" if got == want else "SILENT"
    return out


def _tampered(tmp_path: Path, built: Built, case: Case) -> Path:
    root = tmp_path / "ds"
    shutil.copytree(built.main, root)
    case.tamper(Ctx(root, built))
    return root


def _params() -> list:
    return [
        pytest.param(encoding, case, id=f"{encoding}-{case.id}")
        for case in CASES
        for encoding in case.encodings
    ]


@pytest.mark.parametrize(("encoding", "case"), _params())
def test_tampering_is_caught(tmp_path: Path, built: dict[str, Built], encoding: str, case: Case):
    """verify reports exactly the case's problems (or refuses the manifest), the CLI exits 1,
    and every read path refuses or reads the original rows; a silent change is a failure."""
    b = built[encoding]
    root = _tampered(tmp_path, b, case)
    expected = case.verify[encoding]
    assert expected, "every case must be caught by verify"
    assert verify_outcome(root) == expected
    assert main(["verify", str(root)]) == 1

    outcomes = read_outcomes(root, b.rows)
    assert "SILENT" not in outcomes.values(), outcomes
    assert outcomes == case.expected_reads(encoding)
    if case.assignment_refused:
        with pytest.raises((AssignmentError, ShardfeedError)):
            load_assignment(root, ASSIGNMENT)
        with pytest.raises(ShardfeedError):
            ShardLoader(root, rank=0, world=2, batch_size=8, assignment=ASSIGNMENT)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_pristine_copy_is_clean(tmp_path: Path, built: dict[str, Built], encoding: str):
    """Control: an untouched copy verifies, reads intact on every path, with and without
    hashing, and its assignment loads."""
    b = built[encoding]
    root = _tampered(tmp_path, b, Case("none", "", lambda ctx: None, {}, "intact"))
    assert verify_outcome(root) == frozenset()
    assert set(read_outcomes(root, b.rows).values()) == {"intact"}
    assert set(read_outcomes(root, b.rows, check_hashes=True).values()) == {"intact"}
    assert load_assignment(root, ASSIGNMENT).header.name == ASSIGNMENT

"""Verify a dataset against its manifest: every listed file's size and sha256, shard row counts,
the sample index's row count and per-shard sums, record framing and CRCs of record-framed shards
(TFRecord) when hashing, the manifest's fingerprint against its own records, each assignment
(planned for this dataset, its table's size and sha256), no unlisted files under ``data/`` or
``videos/``, and no temporary leftovers anywhere."""

from __future__ import annotations

import hashlib
import os
import posixpath
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from shardfeed.formats.atomic import is_temp_name
from shardfeed.formats.encoding import ShardContext, get_encoding
from shardfeed.formats.layout import LISTED_DIRS
from shardfeed.formats.reader import load_manifest
from shardfeed.formats.retry import ObjectStoreIOError, retry_counts
from shardfeed.formats.sample_index import (
    SampleIndexError,
    _check_shard_sums,
    read_record_offsets,
)
from shardfeed.formats.storage import Location, locate
from shardfeed.planning.partition import contiguous_cuts, num_parts_for
from shardfeed.schemas.assignment import ASSIGNMENTS_DIR, AssignmentHeader, table_path
from shardfeed.schemas.errors import ShardfeedError, UnsafePathError
from shardfeed.schemas.manifest import (
    MANIFEST_PATH,
    SAMPLE_INDEX_PATH,
    Manifest,
    compute_fingerprint,
)
from shardfeed.schemas.sidecar import DatasetRef

PROBLEM_KINDS = (
    "missing",
    "size",
    "hash",
    "rows",
    "extra",
    "unsafe",
    "unreadable",
    "framing",
    "index",
    "fingerprint",
    "io",  # an object-store read that still failed after its retries: nothing is known wrong
)
_READ_CHUNK = 8 << 20


@dataclass(frozen=True)
class Problem:
    path: str
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.path}: {self.kind}: {self.detail}"


def _unreadable(path: str, err: BaseException) -> Problem:
    """A read that failed: ``io`` when the object store never answered (after its retries),
    ``unreadable`` when bytes arrived and could not be read as what they should be."""
    return Problem(path, "io" if isinstance(err, ObjectStoreIOError) else "unreadable", str(err))


@dataclass
class VerifyReport:
    problems: list[Problem] = field(default_factory=list)
    shards_checked: int = 0
    files_checked: int = 0
    bytes_hashed: int = 0
    io_retries: int = 0  # object-store requests this verify repeated after a transient failure

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict:
        return {
            "ok": self.ok,
            "shards_checked": self.shards_checked,
            "files_checked": self.files_checked,
            "bytes_hashed": self.bytes_hashed,
            "io_retries": self.io_retries,
            "problems": [
                {"path": p.path, "kind": p.kind, "detail": p.detail} for p in self.problems
            ],
        }


def verify_dataset(
    path: str | os.PathLike[str],
    *,
    check_hashes: bool = True,
    filesystem: pafs.FileSystem | None = None,
) -> VerifyReport:
    """Check a dataset; raises IncompleteDatasetError/SchemaError if the manifest itself is bad."""
    location = locate(path, filesystem)
    return verify_location(location, load_manifest(location), check_hashes=check_hashes)


def verify_location(
    location: Location, manifest: Manifest, *, check_hashes: bool = True, progress=None
) -> VerifyReport:
    report = VerifyReport()
    retries_before = retry_counts().get("retries", 0)
    _check_fingerprint(manifest, report)
    encoding = get_encoding(manifest.encoding)
    offsets = _record_offsets(location, manifest, report) if encoding.framed else None
    for i, shard in enumerate(manifest.shards):
        ok = _check_file(
            location,
            shard.path,
            shard.bytes,
            shard.sha256,
            f"shards[{i}].path",
            report,
            check_hashes,
        )
        report.shards_checked += 1
        # a framed shard that fails its hash is still scanned: its CRCs say which record broke
        hash_only = not ok and report.problems[-1].kind == "hash" and encoding.framed
        if ok or hash_only:
            context = None
            if encoding.framed:
                if offsets is None:
                    continue  # the sample index problem is reported once
                rows = offsets[shard.index_start : shard.index_end]
                context = ShardContext(None, shard.row_groups, rows)
            _check_rows(location, shard, encoding, report, context, check_hashes)
        if progress is not None:
            progress(shard.bytes)
    for i, record in enumerate(manifest.files):
        ok = _check_file(
            location,
            record.path,
            record.bytes,
            record.sha256,
            f"files[{i}].path",
            report,
            check_hashes,
        )
        report.files_checked += 1
        if (
            ok
            and record.path == SAMPLE_INDEX_PATH
            and _check_sample_index_rows(location, manifest.num_samples, report)
        ):
            _check_sample_sums(location, manifest, report)
    listed = {s.path for s in manifest.shards} | {f.path for f in manifest.files} | {MANIFEST_PATH}
    for directory in LISTED_DIRS:
        for rel in location.list_files(directory):
            if rel not in listed:
                what = (
                    "leftover temporary file"
                    if is_temp_name(posixpath.basename(rel))
                    else "file not listed in the manifest"
                )
                report.problems.append(Problem(rel, "extra", what))
    # meta/ may gain files after publication (assignments, hot index) that carry their own records,
    # but a temporary leftover there is always a sign of an interrupted write
    for rel in location.list_files("meta"):
        if is_temp_name(posixpath.basename(rel)):
            report.problems.append(Problem(rel, "extra", "leftover temporary file"))
    _check_assignments(location, manifest, report, check_hashes)
    report.io_retries = retry_counts().get("retries", 0) - retries_before
    return report


def _check_fingerprint(manifest: Manifest, report: VerifyReport) -> None:
    """The fingerprint is what the manifest's own records hash to (FORMAT.md §9): an edited
    shard or file sha256, content option or fingerprint shows here."""
    expected = compute_fingerprint(
        [s.sha256 for s in manifest.shards], manifest.provenance.content_options, manifest.files
    )
    if manifest.fingerprint != expected:
        report.problems.append(
            Problem(
                MANIFEST_PATH,
                "fingerprint",
                f"fingerprint {manifest.fingerprint[:23]}… is not what its shard and file records "
                f"hash to ({expected[:23]}…)",
            )
        )


def _check_assignments(
    location: Location, manifest: Manifest, report: VerifyReport, check_hashes: bool
) -> None:
    """Each assignment header (not listed in the manifest; it vouches for its own table) was
    planned for this dataset, and its table matches the header's size and sha256."""
    ref = DatasetRef(manifest.fingerprint, manifest.num_samples, len(manifest.shards))
    for rel in location.list_files(ASSIGNMENTS_DIR):
        if not rel.endswith(".json") or is_temp_name(posixpath.basename(rel)):
            continue
        name = posixpath.basename(rel)[: -len(".json")]
        try:
            header = AssignmentHeader.loads(location.read_bytes(rel), rel)
            table = table_path(name)
            if header.name != name:
                raise ShardfeedError(f"{rel} names itself {header.name!r}")
        except (OSError, ShardfeedError) as err:
            report.problems.append(_unreadable(rel, err))
            continue
        if header.dataset != ref:
            report.problems.append(
                Problem(
                    rel,
                    "fingerprint",
                    f"planned for dataset {header.dataset.fingerprint[:23]}… "
                    f"({header.dataset.num_samples} samples, {header.dataset.num_shards} shards), "
                    f"not this one",
                )
            )
        _check_file(
            location,
            table,
            header.table.bytes,
            header.table.sha256,
            f"{rel}: table",
            report,
            check_hashes,
        )


def _check_file(
    location: Location,
    rel: str,
    size: int,
    sha256: str,
    field: str,
    report: VerifyReport,
    check_hashes: bool,
) -> bool:
    try:
        path = location.path(rel, field)
    except UnsafePathError as err:
        report.problems.append(Problem(rel, "unsafe", err.message))
        return False
    try:
        info = location.filesystem.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            report.problems.append(Problem(rel, "missing", "listed in the manifest but absent"))
            return False
        if info.size != size:
            report.problems.append(
                Problem(rel, "size", f"{info.size} bytes on disk, manifest says {size}")
            )
            return False
        digest = hashlib.sha256()
        if check_hashes:
            with location.filesystem.open_input_stream(path, compression=None) as stream:
                while chunk := stream.read(_READ_CHUNK):
                    digest.update(chunk)
    except ObjectStoreIOError as err:  # the store never answered: not a wrong file
        report.problems.append(_unreadable(rel, err))
        return False
    if check_hashes:
        report.bytes_hashed += size
        if digest.hexdigest() != sha256:
            report.problems.append(
                Problem(
                    rel,
                    "hash",
                    f"sha256 {digest.hexdigest()[:16]}… does not match manifest {sha256[:16]}…",
                )
            )
            return False
    return True


def _record_offsets(
    location: Location, manifest: Manifest, report: VerifyReport
) -> np.ndarray | None:
    """Record offsets of a framed encoding's rows, or None with the problem reported."""
    try:
        return read_record_offsets(location, manifest)
    except SampleIndexError as err:
        report.problems.append(Problem(SAMPLE_INDEX_PATH, "index", str(err)))
        return None


def _check_rows(
    location: Location,
    shard,
    encoding,
    report: VerifyReport,
    context: ShardContext | None = None,
    check_framing: bool = False,
) -> None:
    try:
        source = location.path(shard.path) if location.is_local else location.open_input(shard.path)
        opened = encoding.open(source, context)
        rows, groups = opened.num_rows, tuple(opened.row_group_rows)
        # record-framed shards: every record's CRCs, and offsets equal to the sample index's
        framing = opened.check_framing() if check_framing and encoding.framed else []
        footer = opened.footer_sha256() if shard.footer_sha256 is not None else None
    except (OSError, ValueError, pa.ArrowException, ShardfeedError) as err:
        report.problems.append(_unreadable(shard.path, err))
        return
    if footer != shard.footer_sha256:  # what the reader checks on open, without hashing
        report.problems.append(
            Problem(
                shard.path,
                "hash",
                f"footer sha256 {footer[:16]}… differs from the manifest's footer_sha256 "
                f"{shard.footer_sha256[:16]}…",
            )
        )
    for problem in framing:
        report.problems.append(Problem(shard.path, "framing", problem))
    if rows != shard.rows or groups != shard.row_groups:
        report.problems.append(
            Problem(
                shard.path,
                "rows",
                f"footer has {rows} rows in {len(groups)} groups, manifest says {shard.rows} in {len(shard.row_groups)}",
            )
        )


def _check_sample_index_rows(location: Location, num_samples: int, report: VerifyReport) -> bool:
    """The sample index holds one row per sample (its Parquet footer only; no value is read)."""
    try:
        if location.is_local:
            rows = pq.read_metadata(location.path(SAMPLE_INDEX_PATH)).num_rows
        else:
            with location.open_input(SAMPLE_INDEX_PATH) as handle:
                rows = pq.read_metadata(handle).num_rows
    except (OSError, ValueError, pa.ArrowException) as err:
        report.problems.append(_unreadable(SAMPLE_INDEX_PATH, err))
        return False
    if rows != num_samples:
        report.problems.append(
            Problem(
                SAMPLE_INDEX_PATH,
                "rows",
                f"footer has {rows} rows, manifest says {num_samples} samples",
            )
        )
        return False
    return True


def _check_row_group_cuts(sizes: np.ndarray, manifest: Manifest, report: VerifyReport) -> None:
    """Each shard's ``row_groups`` are the writer's cut of its rows' sizes at the recorded
    ``row_group_size`` (FORMAT.md §5). For a record-framed shard the manifest is the only place
    its row groups live, so this is what catches an edit of them."""
    target = manifest.provenance.content_options.get("row_group_size")
    if not isinstance(target, int) or target <= 0:
        return  # not recorded (older manifests): nothing to compare with
    for shard in manifest.shards:
        rows = sizes[shard.index_start : shard.index_end]
        cuts = contiguous_cuts(rows, num_parts_for(int(rows.sum()), target))
        expected = tuple(int(n) for n in np.diff(cuts))
        if expected != shard.row_groups:
            report.problems.append(
                Problem(
                    shard.path,
                    "rows",
                    f"row groups {list(shard.row_groups[:8])} are not the writer's cut of the "
                    f"sample sizes at row_group_size={target}: {list(expected[:8])}",
                )
            )


def _check_sample_sums(location: Location, manifest: Manifest, report: VerifyReport) -> None:
    """Each shard's per-sample sizes add up to its ``payload_bytes`` (an edited
    ``payload_bytes`` changes no file, and planners balance on these numbers)."""
    try:
        if location.is_local:
            table = pq.read_table(location.path(SAMPLE_INDEX_PATH), columns=["bytes"])
        else:
            with location.open_input(SAMPLE_INDEX_PATH) as handle:
                table = pq.read_table(handle, columns=["bytes"])
        sizes = table.column("bytes").to_numpy().astype(np.int64, copy=False)
        _check_shard_sums(sizes, manifest, SAMPLE_INDEX_PATH)
        _check_row_group_cuts(sizes, manifest, report)
    except (OSError, ValueError, KeyError, pa.ArrowException) as err:
        report.problems.append(_unreadable(SAMPLE_INDEX_PATH, err))
    except SampleIndexError as err:
        report.problems.append(Problem(SAMPLE_INDEX_PATH, "index", str(err)))

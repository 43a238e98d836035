"""Read a dataset's reject records: the JSON Lines files under ``meta/shardfeed/rejects/``.

``shardfeed convert`` writes one sorted JSONL file per scanned input (a JSONL file, a LeRobot data
file, an image-folder class directory), named by the blake2b-96 hex digest of that input's
root-relative path, and lists each in the manifest's ``files`` with its size and sha256. Only files
the manifest lists are read, and each is checked against its record (size, then sha256) before a line
of it is trusted. Every line is parsed strictly with :meth:`RejectRecord.from_json`.

No Beam here: this module serves ``shardfeed rejects`` in a training container's core install.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field

import pyarrow.fs as pafs

from shardfeed.formats.reader import load_manifest
from shardfeed.formats.storage import Location, locate
from shardfeed.schemas.errors import SchemaError, ShardfeedError
from shardfeed.schemas.manifest import FileRecord, Manifest
from shardfeed.schemas.rejects import RejectRecord

REJECTS_DIR = "meta/shardfeed/rejects"
REJECT_SUFFIX = ".jsonl"
_READ_CHUNK = 8 << 20


class RejectFileError(ShardfeedError):
    """A listed reject file is missing, differs from its manifest record, or is not reject JSONL."""


def reject_file_name(input_path: str) -> str:
    """The file name of the rejects of one scanned input (its root-relative POSIX path)."""
    return hashlib.blake2b(input_path.encode("utf-8"), digest_size=12).hexdigest() + REJECT_SUFFIX


def reject_files(manifest: Manifest) -> list[FileRecord]:
    """The manifest's records of reject files (``meta/shardfeed/rejects/*.jsonl``), by path."""
    prefix = REJECTS_DIR + "/"
    return sorted(
        (f for f in manifest.files if f.path.startswith(prefix) and f.path.endswith(REJECT_SUFFIX)),
        key=lambda f: f.path,
    )


def unlisted_reject_files(location: Location, manifest: Manifest) -> list[str]:
    """Files under ``meta/shardfeed/rejects/`` that the manifest does not list (never read)."""
    listed = {f.path for f in manifest.files}
    return [rel for rel in location.list_files(REJECTS_DIR) if rel not in listed]


def check_reject_file(location: Location, record: FileRecord) -> bytes:
    """Check one reject file's size and sha256 against its record; return its first line.

    Raises :class:`RejectFileError` when the file is absent or differs from the manifest.
    """
    path = location.path(record.path, "files.path")
    name = _display(location, record)
    info = location.filesystem.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        raise RejectFileError(f"{name}: listed in the manifest but absent")
    if info.size != record.bytes:
        raise RejectFileError(
            f"{name}: {info.size} bytes on disk, the manifest says {record.bytes}; "
            "the reject file changed after publishing (run `shardfeed verify`)"
        )
    digest = hashlib.sha256()
    head = b""
    with location.filesystem.open_input_stream(path) as stream:
        while chunk := stream.read(_READ_CHUNK):
            digest.update(chunk)
            if b"\n" not in head and len(head) < _READ_CHUNK:
                head += chunk
    if digest.hexdigest() != record.sha256:
        raise RejectFileError(
            f"{name}: sha256 {digest.hexdigest()[:16]}… does not match the manifest's "
            f"{record.sha256[:16]}…; the reject file changed after publishing (run `shardfeed verify`)"
        )
    return head.split(b"\n", 1)[0]


def _display(location: Location, record: FileRecord) -> str:
    return f"{location.display.rstrip('/')}/{record.path}"


def parse_reject_line(line: bytes, where: str) -> RejectRecord:
    """One JSONL line (without its newline) as a RejectRecord, strictly."""
    try:
        obj = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise RejectFileError(f"{where}: not valid UTF-8 ({err.reason})") from None
    except json.JSONDecodeError as err:
        raise RejectFileError(f"{where}: not valid JSON ({err.msg})") from None
    try:
        return RejectRecord.from_json(obj)
    except SchemaError as err:
        raise err.with_source(where) from None


def read_reject_file(location: Location, record: FileRecord) -> Iterator[RejectRecord]:
    """The records of one reject file in stored order, after checking it against ``record``.

    The file is read twice, both times streaming: once to check its sha256, once to parse it. The
    second read is hashed too, so a file that changes in between raises instead of passing silently.
    """
    check_reject_file(location, record)
    yield from _parse_checked(location, record)


def _parse_checked(location: Location, record: FileRecord) -> Iterator[RejectRecord]:
    name = _display(location, record)
    digest = hashlib.sha256()
    with location.filesystem.open_input_stream(location.path(record.path, "files.path")) as stream:
        pending = b""
        number = 0
        while chunk := stream.read(_READ_CHUNK):
            digest.update(chunk)
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                number += 1
                yield parse_reject_line(line, f"{name} line {number}")
    if pending:
        raise RejectFileError(f"{name} line {number + 1}: no final newline")
    if digest.hexdigest() != record.sha256:
        raise RejectFileError(f"{name}: the file changed while it was read")


def _ordered_files(location: Location, records: list[FileRecord]) -> list[FileRecord]:
    """Reject files in input order: by the ``source`` of their first record (files are named by
    a hash, so path order is arbitrary), then by path. Each file is checked here first."""
    keyed = []
    for record in records:
        first = check_reject_file(location, record)
        source = (
            parse_reject_line(first, f"{_display(location, record)} line 1").source if first else ""
        )
        keyed.append(((source, record.path), record))
    return [record for _, record in sorted(keyed, key=lambda item: item[0])]


def iter_rejects(
    location: Location,
    manifest: Manifest,
    *,
    reasons: Collection[str] | None = None,
) -> Iterator[RejectRecord]:
    """Every reject record of a dataset (optionally only ``reasons``), file by file in input order
    and in stored order inside each file. Raises RejectFileError on a missing or altered file."""
    for record in _ordered_files(location, reject_files(manifest)):
        for reject in _parse_checked(location, record):
            if reasons is None or reject.reason in reasons:
                yield reject


@dataclass
class RejectListing:
    """What ``shardfeed rejects`` shows: counts of the matching records and the first ``limit``.

    ``total``/``by_reason`` count the records that match the reason filter (all when none is
    given). ``recorded`` is the manifest's own count; ``stored`` says whether the dataset holds
    reject records at all (``write_dataset(rejects=...)`` records counts only, so ``total`` and
    ``by_reason`` then come from the manifest). ``unlisted`` are files under the rejects folder
    that the manifest does not vouch for; they are never read.
    """

    total: int
    by_reason: dict[str, int]
    rejects: list[RejectRecord]
    recorded_total: int
    recorded_by_reason: dict[str, int]
    stored: bool
    files: int
    unlisted: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "total": self.total,
            "by_reason": dict(sorted(self.by_reason.items())),
            "rejects": [r.to_json() for r in self.rejects],
        }


def list_rejects(
    dataset: str | os.PathLike[str],
    *,
    reasons: Collection[str] | None = None,
    limit: int | None = None,
    filesystem: pafs.FileSystem | None = None,
) -> RejectListing:
    """Count a dataset's rejects (every listed file is read and checked) and keep the first
    ``limit`` matching records (all when None).

    The counts in the files must equal the manifest's ``rejects`` counts; a difference raises
    RejectFileError. Raises IncompleteDatasetError when the dataset has no manifest.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    location = locate(dataset, filesystem)
    manifest = load_manifest(location)
    recorded = dict(manifest.rejects.by_reason)
    wanted = None if reasons is None else set(reasons)
    files = reject_files(manifest)
    counts: dict[str, int] = {}
    shown: list[RejectRecord] = []
    for reject in iter_rejects(location, manifest):
        counts[reject.reason] = counts.get(reject.reason, 0) + 1
        if (wanted is None or reject.reason in wanted) and (limit is None or len(shown) < limit):
            shown.append(reject)
    stored = bool(files)
    if stored and counts != recorded:
        raise RejectFileError(
            f"{location.display}: the reject files hold {sum(counts.values())} records "
            f"{dict(sorted(counts.items()))}, but the manifest counts {manifest.rejects.total} "
            f"{dict(sorted(recorded.items()))}"
        )
    source = counts if stored else recorded
    matched = {r: n for r, n in source.items() if wanted is None or r in wanted}
    return RejectListing(
        total=sum(matched.values()),
        by_reason=dict(sorted(matched.items())),
        rejects=shown,
        recorded_total=manifest.rejects.total,
        recorded_by_reason=dict(sorted(recorded.items())),
        stored=stored,
        files=len(files),
        unlisted=unlisted_reject_files(location, manifest),
    )

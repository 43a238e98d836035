"""The contract every raw-input reader implements, so the pipeline can plan by reference.

A source is read in two cheap passes and one real one:
1. ``files()``: the input files (Beam elements are files, never samples);
2. ``scan(file, spec)``: per file, validate records and emit small :class:`UnitRef` references
   (position, rows, payload size, content hash) plus :class:`RejectRecord` for bad records;
   sources whose schema comes from the data (JSONL) first run ``infer(file)`` on every file and merge
   the fragments with ``merge_inferred`` to get the spec; ``infer`` returns an ``inferred_type``
   dataclass of JSON values, so fragments travel between stages as JSON;
3. ``read(refs, spec)``: materialise the rows of some refs, in the given order, as an Arrow table
   conforming to ``spec``. Shard writers call it, so payload bytes never cross a Beam shuffle.

A unit is a sample, or a whole episode for robot data; units are never split across shards.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa

from shardfeed.schemas.features import FeatureSpec
from shardfeed.schemas.rejects import RejectRecord


def content_digest(data: bytes) -> str:
    """A unit's content hash: SHA-256 truncated to 128 bits, 32 hex characters.

    SHA-256 because CPUs with SHA extensions hash it 2x faster than BLAKE2b (this runs once per
    image of a conversion); 128 bits keep collisions out of reach for shuffle keys and dedup.
    """
    return hashlib.sha256(data).hexdigest()[:32]


@dataclass(frozen=True, order=True)
class UnitRef:
    """A reference to one planning unit inside a source file; sorts in source order.

    ``file`` is the root-relative POSIX path of the source file; ``position`` is the unit's ordinal
    inside it (line number, row offset, member index, episode number); ``locator`` holds whatever
    the reader needs to seek to it (e.g. ``(byte_offset, byte_length)``) and must be JSON-able.
    ``content_hash`` is a stable hex digest of the unit's raw bytes (shuffle key, ids, dedup).
    """

    file: str
    position: int
    rows: int
    payload_bytes: int
    content_hash: str
    locator: tuple[Any, ...] = field(default=(), compare=False)


@dataclass
class ScanResult:
    units: list[UnitRef] = field(default_factory=list)
    rejects: list[RejectRecord] = field(default_factory=list)


@dataclass
class RowsScan:
    """Part of a file's scan that also carries its good rows, decoded once: unit ``i`` is at
    ``positions[i]``, has ``rows[i]`` rows (consecutive in ``table``, in unit order),
    ``payload[i]`` bytes and content hash ``hashes[i]``; ``rejects`` are the part's bad records."""

    positions: np.ndarray
    rows: np.ndarray
    payload: np.ndarray
    hashes: list[str]
    table: pa.Table
    rejects: list[RejectRecord] = field(default_factory=list)

    @classmethod
    def one_row_each(
        cls,
        positions: Sequence[int] | np.ndarray,
        payload: Sequence[int] | np.ndarray,
        hashes: list[str],
        table: pa.Table,
        rejects: list[RejectRecord],
    ) -> RowsScan:
        """A part whose units are one row each (every source but LeRobot's episodes)."""
        positions = np.asarray(positions, np.int64)
        ones = np.ones(len(positions), np.int64)
        return cls(positions, ones, np.asarray(payload, np.int64), hashes, table, rejects)


@dataclass(frozen=True)
class DatasetMeta:
    """Dataset-level facts a source knows: LeRobot's fps/robot/tasks, or an image folder's labels."""

    fps: float = 0
    robot_type: str | None = None
    tasks: tuple[str, ...] = ()
    notes: tuple[
        str, ...
    ] = ()  # warnings for the manifest and summary (e.g. info.json totals disagree)


class MediaHook(Protocol):
    """Validate (and maybe rewrite) one encoded image; raise ``RejectError`` for bad input.

    Provided by the pipeline layer (``shardfeed.transforms.image_policy.ImagePolicy``); formats
    code only calls it. ``rewrites`` says whether output bytes can differ from the input.
    """

    rewrites: bool
    #: leading bytes of a file that may settle its check (:meth:`check_head`); None when the
    #: whole file is always needed (full validation, re-encoding)
    head_bytes: int | None

    def __call__(self, data: bytes) -> bytes: ...

    def check_head(self, head: bytes) -> bool:
        """True when a file's first ``head_bytes`` prove that it passes (``RejectError`` when
        they prove it fails); False when only the whole file can tell."""


class SourceReader(Protocol):
    kind: ClassVar[str]
    root: str

    def files(self) -> list[str]:
        """Root-relative input files, sorted (the source order)."""

    def spec(self, inferred: Any | None = None) -> FeatureSpec:
        """The output features; ``inferred`` is the merged result of ``infer`` for data-typed sources."""

    def meta(self) -> DatasetMeta: ...

    def scan(self, file: str, spec: FeatureSpec) -> ScanResult: ...

    def read(self, refs: Sequence[UnitRef], spec: FeatureSpec) -> pa.Table:
        """Rows of ``refs`` in the given order, in ``spec``'s Arrow schema."""


@runtime_checkable
class SpoolingSource(Protocol):
    """A source whose scan decodes the rows themselves, in parts of bounded size, so the pipeline
    keeps them (``formats/spool.py``) and the shard writers never read the input again.

    Units scanned this way have no locator into the input: the pipeline gives each one its row in
    the spool, and ``read`` is not called for them. A source may also define ``spools(file) ->
    bool`` to spool only some files (WebDataset: gzip shards); the others are scanned and read
    by reference."""

    def scan_rows(self, file: str, spec: FeatureSpec) -> Iterator[RowsScan]:
        """The file's units in source order, part by part, with their rows in ``spec``'s schema."""


@runtime_checkable
class SplittableSource(Protocol):
    """A spooling source that can scan one large file as several tasks ("pieces"): byte ranges
    of lines for JSONL, runs of row groups for Parquet. A piece's units keep their positions in
    the whole file, so the output is the same however the file is cut."""

    #: the position of a file's first unit (JSONL: line 1; Parquet: row 0)
    first_position: ClassVar[int]

    def pieces(self, file: str, piece_bytes: int) -> list[tuple[int, int]]:
        """``[start, stop)`` ranges (``stop`` -1: to the end) of about ``piece_bytes`` each, in
        file order; ``[(0, -1)]`` for a file that is not cut."""

    def infer_piece(self, file: str, start: int, stop: int) -> tuple[Any, int]:
        """The piece's share of ``infer(file)`` (parts merge to the whole file's), and how many
        positions the piece spans, so the next piece knows its first position."""

    def scan_piece(
        self, file: str, spec: FeatureSpec, start: int, stop: int, first: int
    ) -> Iterator[RowsScan]:
        """``scan_rows`` over the piece, whose first unit has position ``first``."""


@runtime_checkable
class InferringSource(Protocol):
    """A splittable source whose schema inference rides on its scan: the pipeline guesses the
    features from a sample of each piece, scans with the guess while counting every record's
    kinds, and scans again only where the full counts decide other features (``spec_stage``)."""

    def sample_piece(self, file: str, start: int, stop: int) -> tuple[Any, int]:
        """A guess at the piece's share of ``infer`` from its head, and (exactly) how many
        positions the piece spans, as ``infer_piece`` gives."""

    def scan_inferring(
        self, file: str, spec: FeatureSpec | None, start: int, stop: int, first: int
    ) -> InferringScan:
        """The piece's rows typed to ``spec`` (none when None), counting its share of ``infer``."""


class InferringScan(Protocol):
    """Iterating yields the piece's rows; ``inferred()`` afterwards is its share of ``infer``."""

    def __iter__(self) -> Iterator[RowsScan]: ...

    def inferred(self) -> Any: ...


@runtime_checkable
class StampedInputs(Protocol):
    """A source whose units' hashes do not cover every byte a shard is made of (LeRobot videos
    cut from MP4s; images scanned by their headers only): it names those inputs with their size
    and mtime, so a re-run never reuses an interrupted run's shard whose inputs changed since
    (rsync's quick check)."""

    def input_stamps(self, refs: Sequence[UnitRef]) -> list[str]:
        """One line per input of ``refs`` (no newlines): its name, size and mtime."""


def unit_key(source: object, ref: UnitRef) -> str:
    """A unit's user-facing id, as ``shardfeed rejects`` would name it: ``SOURCE`` when the
    source file is the unit (an image), else ``SOURCE#POSITION`` (``part.jsonl#line:12``,
    ``data/chunk-000/file-000.parquet#episode:3``). Weights given to ``convert`` use it."""
    locate = getattr(source, "reject_location", None)
    where, position = locate(ref) if locate else (ref.file, str(ref.position))
    return f"{where}#{position}" if position else where

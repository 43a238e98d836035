"""The shardfeed manifest at ``meta/shardfeed/manifest.json``: the record that makes a dataset complete.

It lists every shard with its size, payload, rows, row groups, sha256 and global index range, every
other file with its size and hash, reject counts, and provenance. It holds only content: no runner,
host, time or destination, so the same input and content options give a byte-identical manifest.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import hashlib
import itertools
import json
import operator
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

import msgspec

from shardfeed.schemas._strict import (
    check_finite,
    count,
    get,
    item_count,
    load_document,
    may_hold_surrogate,
    non_negative,
    parse_version,
    require_object,
)
from shardfeed.schemas.errors import SchemaError
from shardfeed.schemas.paths import check_relative_path

FORMAT_VERSION = "1.0"
FORMAT_MAJOR = 1
MANIFEST_PATH = "meta/shardfeed/manifest.json"
SAMPLE_INDEX_PATH = "meta/shardfeed/samples.parquet"
#: ``convert --dedup``: one JSON line per later exact copy left out of the shards
DUPLICATES_PATH = "meta/shardfeed/duplicates.jsonl"
ENCODINGS = ("parquet", "tfrecord", "tfrecord-gzip")
#: what a sample's cost (``samples.parquet`` column ``cost``) counts, for size-aware batching
COST_KINDS = ("tokens", "pixels", "frames", "bytes")


#: a count in a shard record: msgspec checks the bound while it decodes (``Manifest.loads``)
_Count = Annotated[int, msgspec.Meta(ge=0)]


class ShardRecord(msgspec.Struct, frozen=True, gc=False):
    """One data shard. ``row_groups`` lists rows per row group; indices are global, end exclusive.

    A frozen msgspec struct rather than a dataclass: ``Manifest.loads`` decodes 20,000 of them
    straight from the manifest's bytes, with their types and bounds checked in C."""

    path: str
    bytes: _Count
    payload_bytes: _Count
    rows: _Count
    row_groups: tuple[_Count, ...]
    sha256: str
    index_start: _Count
    index_end: _Count
    #: planning units in the shard (episodes for episodic data, else rows); None in manifests
    #: written before it existed. ``inspect`` leaves single oversized units out of the balance.
    units: _Count | None = None
    #: sha256 of the Parquet footer (the trailing metadata, its length and magic; FORMAT.md §5):
    #: the reader checks it when it opens the shard, so a valid shard put in another's place is
    #: refused without hashing the whole file. None for TFRecord shards and older manifests.
    footer_sha256: str | None = None

    def __post_init__(self) -> None:
        if sum(self.row_groups) != self.rows:
            raise SchemaError(
                "row_groups",
                f"{self.path}: row groups sum to {sum(self.row_groups)}, rows is {self.rows}",
            )
        if self.index_end - self.index_start != self.rows:
            raise SchemaError(
                "index_end", f"{self.path}: index range does not match rows={self.rows}"
            )

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "bytes": self.bytes,
            "payload_bytes": self.payload_bytes,
            "rows": self.rows,
            "row_groups": list(self.row_groups),
            "sha256": self.sha256,
            "index_start": self.index_start,
            "index_end": self.index_end,
            **({} if self.units is None else {"units": self.units}),
            **({} if self.footer_sha256 is None else {"footer_sha256": self.footer_sha256}),
        }

    @classmethod
    def from_json(cls, obj: Any, where: str) -> ShardRecord:
        obj = require_object(obj, where)
        values = {
            "path": check_relative_path(get(obj, "path", str, where), f"{where}.path"),
            "bytes": count(obj, "bytes", where),
            "payload_bytes": count(obj, "payload_bytes", where),
            "rows": count(obj, "rows", where),
            "row_groups": tuple(
                item_count(n, f"{where}.row_groups[{i}]")
                for i, n in enumerate(get(obj, "row_groups", list, where))
            ),
            "sha256": _sha256_field(get(obj, "sha256", str, where), f"{where}.sha256"),
            "index_start": count(obj, "index_start", where),
            "index_end": count(obj, "index_end", where),
            "units": count(obj, "units", where) if "units" in obj else None,
            "footer_sha256": (
                _sha256_field(get(obj, "footer_sha256", str, where), f"{where}.footer_sha256")
                if "footer_sha256" in obj
                else None
            ),
        }
        try:
            return cls(**values)
        except SchemaError as err:  # cross-field checks name the field relative to the record
            raise err.within(where) from None


@dataclass(frozen=True)
class FileRecord:
    """A non-shard file the manifest vouches for (meta files, videos)."""

    path: str
    bytes: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "bytes": self.bytes, "sha256": self.sha256}

    @classmethod
    def from_json(cls, obj: Any, where: str) -> FileRecord:
        obj = require_object(obj, where)
        return cls(
            path=check_relative_path(get(obj, "path", str, where), f"{where}.path"),
            bytes=non_negative(get(obj, "bytes", int, where), f"{where}.bytes"),
            sha256=_sha256_field(get(obj, "sha256", str, where), f"{where}.sha256"),
        )


@dataclass(frozen=True)
class Rejects:
    total: int = 0
    by_reason: Mapping[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"total": self.total, "by_reason": dict(sorted(self.by_reason.items()))}

    @classmethod
    def from_json(cls, obj: Any, where: str = "rejects") -> Rejects:
        obj = require_object(obj, where)
        total = non_negative(get(obj, "total", int, where), f"{where}.total")
        by_reason = get(obj, "by_reason", dict, where)
        for reason in by_reason:
            non_negative(
                get(by_reason, reason, int, f"{where}.by_reason"), f"{where}.by_reason.{reason}"
            )
        if sum(by_reason.values()) != total:
            raise SchemaError(
                f"{where}.total",
                f"{total} does not equal the sum of by_reason ({sum(by_reason.values())})",
            )
        return cls(total=total, by_reason=dict(by_reason))


@dataclass(frozen=True)
class Duplicates:
    """``convert --dedup``: how many later exact copies (equal content hash) were left out of the
    shards; each is one line of ``meta/shardfeed/duplicates.jsonl`` naming the first occurrence."""

    total: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"total": self.total}

    @classmethod
    def from_json(cls, obj: Any, where: str = "duplicates") -> Duplicates:
        obj = require_object(obj, where)
        unknown = sorted(set(obj) - {"total"})
        if unknown:
            raise SchemaError(f"{where}.{unknown[0]}", "is not a duplicates field")
        return cls(total=count(obj, "total", where))


@dataclass(frozen=True)
class Provenance:
    """Where the data came from and the options that change its bytes (never runner details)."""

    source: str
    content_options: Mapping[str, Any]
    shardfeed_version: str

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "content_options": json.loads(canonical_json(dict(self.content_options))),
            "shardfeed_version": self.shardfeed_version,
        }

    @classmethod
    def from_json(cls, obj: Any, where: str = "provenance") -> Provenance:
        obj = require_object(obj, where)
        options = get(obj, "content_options", dict, where)
        check_finite(options, f"{where}.content_options")
        return cls(
            source=get(obj, "source", str, where),
            content_options=options,
            shardfeed_version=get(obj, "shardfeed_version", str, where),
        )


@dataclass(frozen=True)
class CostSpec:
    """The per-sample cost recorded in ``samples.parquet`` (column ``cost``): what it counts and
    bucket boundaries for batching, ascending; bucket ``k`` holds costs in
    ``[buckets[k-1], buckets[k])`` (the first from 0, the last open-ended)."""

    kind: str
    buckets: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.kind not in COST_KINDS:
            raise SchemaError("cost.kind", f"expected one of {COST_KINDS}, got {self.kind!r}")
        if any(b <= a for a, b in itertools.pairwise(self.buckets)):
            raise SchemaError("cost.buckets", "boundaries must be strictly increasing")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "buckets": list(self.buckets)}

    @classmethod
    def from_json(cls, obj: Any, where: str = "cost") -> CostSpec:
        obj = require_object(obj, where)
        return cls(
            kind=get(obj, "kind", str, where),
            buckets=tuple(
                item_count(b, f"{where}.buckets[{i}]")
                for i, b in enumerate(get(obj, "buckets", list, where))
            ),
        )


SPLIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", re.ASCII)


def check_split_name(name: str, field_: str = "splits") -> str:
    """A split name: 1-100 of A-Z a-z 0-9 . _ -, starting with a letter or digit."""
    if not isinstance(name, str) or not SPLIT_NAME.fullmatch(name):
        raise SchemaError(
            field_,
            f"{name!r} is not a valid split name (1-100 of A-Z a-z 0-9 . _ -, "
            "starting with a letter or digit)",
        )
    return name


@dataclass(frozen=True)
class SplitRecord:
    """A named split (``convert --split NAME=SRC``): global rows ``[index_start, index_end)``,
    held by exactly the shards ``[shard_start, shard_end)`` (manifest positions)."""

    name: str
    index_start: int
    index_end: int
    shard_start: int
    shard_end: int

    def to_json(self) -> dict[str, Any]:
        return {
            "index_start": self.index_start,
            "index_end": self.index_end,
            "shards": [self.shard_start, self.shard_end],
        }

    @classmethod
    def from_json(cls, name: str, obj: Any, where: str) -> SplitRecord:
        obj = require_object(obj, where)
        unknown = sorted(set(obj) - {"index_start", "index_end", "shards"})
        if unknown:
            raise SchemaError(f"{where}.{unknown[0]}", "is not a split field")
        shards = get(obj, "shards", list, where)
        if len(shards) != 2:
            raise SchemaError(f"{where}.shards", f"expected [first, end), got {shards!r:.60}")
        return cls(
            name=check_split_name(name, where),
            index_start=count(obj, "index_start", where),
            index_end=count(obj, "index_end", where),
            shard_start=item_count(shards[0], f"{where}.shards[0]"),
            shard_end=item_count(shards[1], f"{where}.shards[1]"),
        )


@dataclass(frozen=True)
class Manifest:
    num_samples: int
    fingerprint: str
    shards: tuple[ShardRecord, ...]
    files: tuple[FileRecord, ...]
    rejects: Rejects
    provenance: Provenance
    encoding: str = "parquet"
    format_version: str = FORMAT_VERSION
    #: the first ``hot_shards`` shards hold exactly the hot set (``convert --hot-weights``)
    hot_shards: int = 0
    cost: CostSpec | None = None
    #: named splits in order, tiling the shards (``convert --split``); empty without splits
    splits: tuple[SplitRecord, ...] = ()
    #: ``convert --dedup``: the later exact copies left out; None when dedup was not asked for
    duplicates: Duplicates | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.hot_shards <= len(self.shards):
            raise SchemaError(
                "hot_shards",
                f"{self.hot_shards} is outside 0..{len(self.shards)} (the shard count)",
            )
        shard_paths = [shard.path for shard in self.shards]
        paths = set(shard_paths)
        starts = [shard.index_start for shard in self.shards]
        ends = [shard.index_end for shard in self.shards]
        if starts != [0, *ends[:-1]][: len(starts)] or len(paths) != len(shard_paths):
            self._check_shard_tiling()  # raises, naming the first shard at fault
        covered = ends[-1] if ends else 0
        if covered != self.num_samples:
            raise SchemaError("num_samples", f"{self.num_samples} but shards cover {covered} rows")
        for i, rec in enumerate(self.files):
            if rec.path in paths:
                raise SchemaError(f"files[{i}].path", f"duplicate path {rec.path!r}")
            paths.add(rec.path)
        self._check_splits()

    def _check_shard_tiling(self) -> None:
        """Shards tile 0..num_samples in order, each path once: the first offence, named."""
        expected = 0
        paths: set[str] = set()
        for i, shard in enumerate(self.shards):
            if shard.index_start != expected:
                raise SchemaError(
                    f"shards[{i}].index_start",
                    f"expected {expected} (shards must tile 0..num_samples), got {shard.index_start}",
                )
            expected = shard.index_end
            if shard.path in paths:
                raise SchemaError(f"shards[{i}].path", f"duplicate path {shard.path!r}")
            paths.add(shard.path)

    def _check_splits(self) -> None:
        """Splits tile the shards in order, each a non-empty run of whole shards."""
        if not self.splits:
            return
        names = [s.name for s in self.splits]
        if len(set(names)) != len(names):
            raise SchemaError("splits", f"split names repeat: {names}")
        shard = 0
        for split in self.splits:
            where = f"splits.{split.name}"
            if split.shard_start != shard or split.shard_end <= split.shard_start:
                raise SchemaError(
                    f"{where}.shards",
                    f"[{split.shard_start}, {split.shard_end}) must be a non-empty run of shards "
                    f"starting at {shard} (splits tile the shards in order)",
                )
            if split.shard_end > len(self.shards):
                raise SchemaError(f"{where}.shards", f"ends past the {len(self.shards)} shards")
            first, last = self.shards[split.shard_start], self.shards[split.shard_end - 1]
            if (split.index_start, split.index_end) != (first.index_start, last.index_end):
                raise SchemaError(
                    f"{where}.index_start",
                    f"[{split.index_start}, {split.index_end}) is not its shards' range "
                    f"[{first.index_start}, {last.index_end})",
                )
            shard = split.shard_end
        if shard != len(self.shards):
            raise SchemaError("splits", f"cover {shard} of {len(self.shards)} shards")

    def split(self, name: str) -> SplitRecord:
        """The split called ``name``; a clear error naming the splits there are."""
        for split in self.splits:
            if split.name == name:
                return split
        have = [s.name for s in self.splits]
        raise ValueError(
            f"the dataset has no split {name!r}; "
            + (f"its splits are {have}" if have else "it has no named splits")
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "encoding": self.encoding,
            "num_samples": self.num_samples,
            "fingerprint": self.fingerprint,
            "shards": [s.to_json() for s in self.shards],
            "files": [f.to_json() for f in self.files],
            "rejects": self.rejects.to_json(),
            "provenance": self.provenance.to_json(),
            # optional keys appear only when set, so older manifests keep their bytes
            **({"hot_shards": self.hot_shards} if self.hot_shards else {}),
            **({"cost": self.cost.to_json()} if self.cost is not None else {}),
            **({"splits": {s.name: s.to_json() for s in self.splits}} if self.splits else {}),
            **({"duplicates": self.duplicates.to_json()} if self.duplicates is not None else {}),
        }

    def dumps(self) -> str:
        """Readable and diffable: one line per top-level key, one line per shard or file record."""
        lines = []
        for key, value in self.to_json().items():
            if key in ("shards", "files"):
                body = ",\n".join("  " + _compact(item) for item in value)
                lines.append(f'  "{key}": [\n{body}\n  ]' if value else f'  "{key}": []')
            else:
                lines.append(f'  "{key}": {_compact(value)}')
        return "{\n" + ",\n".join(lines) + "\n}\n"

    @classmethod
    def loads(cls, text: str | bytes, source: str = MANIFEST_PATH) -> Manifest:
        # the parse allocates a few objects per field, all acyclic: pausing the cycle collector
        # keeps it from walking the growing document again and again (a quarter of the time)
        with _collector_paused():
            usual = _decode_usual(text)
            if usual is not None:
                try:
                    return cls.from_json(usual[0], shards=usual[1])
                except SchemaError as err:
                    raise err.with_source(source) from None
            return load_document(text, source, cls.from_json)

    @classmethod
    def from_json(cls, obj: Any, *, shards: tuple[ShardRecord, ...] | None = None) -> Manifest:
        """The manifest of a parsed JSON object, checked. ``shards``: the records already decoded
        and checked by :func:`_decode_usual`, in place of ``obj["shards"]``."""
        obj = require_object(obj, "")
        version = get(obj, "format_version", str, "")
        parse_version(version, "format_version", FORMAT_MAJOR)
        encoding = get(obj, "encoding", str, "")
        if encoding not in ENCODINGS:
            raise SchemaError(
                "encoding", f"unknown shard encoding {encoding!r}; expected one of {ENCODINGS}"
            )
        if shards is None:
            shards = tuple(
                ShardRecord.from_json(s, f"shards[{i}]")
                for i, s in enumerate(get(obj, "shards", list, ""))
            )
        files = get(obj, "files", list, "")
        return cls(
            format_version=version,
            encoding=encoding,
            num_samples=non_negative(get(obj, "num_samples", int, ""), "num_samples"),
            fingerprint=_fingerprint_field(get(obj, "fingerprint", str, "")),
            shards=shards,
            files=tuple(FileRecord.from_json(f, f"files[{i}]") for i, f in enumerate(files)),
            rejects=Rejects.from_json(get(obj, "rejects", dict, "")),
            provenance=Provenance.from_json(get(obj, "provenance", dict, "")),
            hot_shards=count(obj, "hot_shards", "") if "hot_shards" in obj else 0,
            cost=CostSpec.from_json(obj["cost"]) if "cost" in obj else None,
            splits=tuple(
                SplitRecord.from_json(name, value, f"splits.{name}")
                for name, value in get(obj, "splits", dict, "", optional=True, default={}).items()
            ),
            duplicates=Duplicates.from_json(obj["duplicates"]) if "duplicates" in obj else None,
        )


def compute_fingerprint(
    shard_hashes: Sequence[str],
    content_options: Mapping[str, Any],
    files: Sequence[FileRecord] = (),
) -> str:
    """sha256 over the ordered shard hashes, the canonical JSON of the content options, and the
    ``(path, sha256)`` of each listed metadata file, so any change to content changes it."""
    digest = hashlib.sha256()
    for sha in shard_hashes:
        digest.update(sha.encode("ascii") + b"\n")
    digest.update(canonical_json(content_options).encode())
    for record in sorted(files, key=lambda r: r.path):
        digest.update(f"\n{record.path}\t{record.sha256}".encode())
    return "sha256:" + digest.hexdigest()


def canonical_json(value: Any) -> str:
    """Compact JSON with keys sorted at every depth: equal values give equal bytes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _fingerprint_field(value: str) -> str:
    if not value.startswith("sha256:"):
        raise SchemaError("fingerprint", f"expected 'sha256:' and 64 hex digits, got {value!r:.40}")
    _sha256_field(value[len("sha256:") :], "fingerprint")
    return value


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


#: one or more newline-ended relative paths of plain ASCII segments (letters, digits, ``_``, ``-``
#: and ``.``, never starting with a dot): what ``check_relative_path`` accepts, in a narrower form
_PLAIN_PATHS = re.compile(r"(?:[A-Za-z0-9_-][A-Za-z0-9_.-]*(?:/[A-Za-z0-9_-][A-Za-z0-9_.-]*)*\n)+")
_HEX_DIGITS = b"0123456789abcdef"


@functools.cache
def _usual_decoder() -> msgspec.json.Decoder:
    """A decoder of the manifest's top level with ``shards`` typed as :class:`ShardRecord`: msgspec
    builds the records in C, checks each field's type (an int is never a bool) and runs their
    ``__post_init__``. Every other key stays plain JSON for :meth:`Manifest.from_json`."""
    others = [
        (f.name, Any, msgspec.UNSET) for f in dataclasses.fields(Manifest) if f.name != "shards"
    ]
    wire = msgspec.defstruct("ManifestWire", [("shards", list[ShardRecord]), *others])
    return msgspec.json.Decoder(wire)


def _decode_usual(text: str | bytes) -> tuple[dict[str, Any], tuple[ShardRecord, ...]] | None:
    """A manifest as ``convert`` writes it, decoded with its shard records checked column by column
    with the rules of :meth:`ShardRecord.from_json` (a narrower path form); None when anything is
    unusual, and the record-by-record path then names the problem. Every DataLoader worker loads
    the manifest, so 20,000 shards must cost little more than ``json.loads``
    (``scripts/bench_manifest.sh``)."""
    if may_hold_surrogate(text):
        return None
    try:
        wire = _usual_decoder().decode(text)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None
    shards = wire.shards
    if shards and not _usual_shards(shards, text):
        return None
    obj = {
        name: value
        for name in wire.__struct_fields__
        if name != "shards" and (value := getattr(wire, name)) is not msgspec.UNSET
    }
    return obj, tuple(shards)


def _usual_shards(shards: list[ShardRecord], text: str | bytes) -> bool:
    """What the typed decode leaves to check: digests 64 lowercase hex digits,
    paths plain, and an optional key never given as ``null`` (each key's mentions in ``text``
    match the values it set). Each check runs over a whole column, not per record in Python."""
    units = sum(u is not None for u in map(operator.attrgetter("units"), shards))
    footers = [f for f in map(operator.attrgetter("footer_sha256"), shards) if f is not None]
    if _mentions(text, "units") != units or _mentions(text, "footer_sha256") != len(footers):
        return False
    return (
        _sha256s(list(map(operator.attrgetter("sha256"), shards)))
        and _sha256s(footers)
        and _PLAIN_PATHS.fullmatch("\n".join(map(operator.attrgetter("path"), shards)) + "\n")
        is not None
    )


def _mentions(text: str | bytes, key: str) -> int:
    """How often ``"key"`` occurs in a JSON text (a memory-speed search)."""
    needle = f'"{key}"'
    return text.count(needle) if isinstance(text, str) else text.count(needle.encode())


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector (when it runs) for the block."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _sha256s(values: Sequence) -> bool:
    """Every value is 64 lowercase hex digits, checked over all of them joined."""
    if not values:
        return True
    if set(map(type, values)) != {str} or set(map(len, values)) != {64}:
        return False
    try:
        joined = "".join(values).encode("ascii")
    except UnicodeEncodeError:
        return False
    return not joined.translate(None, _HEX_DIGITS)  # nothing left once hex digits are deleted


def _sha256_field(value: str, field: str) -> str:
    if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise SchemaError(field, "expected 64 lowercase hex digits")
    return value

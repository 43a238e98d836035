"""WebDataset tar shards (kind ``webdataset``): ``*.tar``, ``*.tgz`` and ``*.tar.gz``.

Inputs and layout:

- **SRC** is one shard, a directory (every ``.tar``, ``.tgz``, ``.tar.gz`` below it, recursively, in
  any case), or a brace pattern such as ``shards/train-{000000..000099}.tar``: comma lists
  ``{a,b}`` and numeric ranges ``{0..9}``, zero-padded to the wider bound when either bound has a
  leading zero (as ``braceexpand``, which WebDataset uses), nested and combined. The root is the
  directory before the first brace; each expansion is a root-relative shard. Gzip is sniffed from
  the magic bytes, not the name.
- **Samples.** Members are grouped as WebDataset groups them: a member's **key** is its path up to
  the first dot of its basename (the directory is kept, a leading ``./`` dropped), its **field** is
  the rest of the basename, lower-cased (``a/b.seg.png`` is key ``a/b``, field ``seg.png``).
  Consecutive members with the same key are one sample. Members with no extension or a hidden
  basename (``README``, ``.x``) and directories belong to no sample and are skipped. The same key in
  two shards names two samples; a sample is identified by (shard, key).
- **Features**: ``__key__`` and ``__url__`` (strings: the key and the root-relative shard path), then
  one column per field over all shards, by name (``infer`` reads member names only, merged with
  :func:`merge_inferred`). A sample without a field has null there. The field's type comes from the
  last dotted part of its name: ``jpg``/``jpeg``/``png``/``webp`` are ``image`` (the Hugging Face
  ``{bytes, path}`` struct, through the media hook like the image folder source), ``cls`` is int64
  (a text integer), ``txt`` is a UTF-8 string, ``json`` is any JSON value stored as its canonical
  JSON text (sorted keys, no spaces) and marked ``"encoding": "json"`` as the JSONL source does for
  nested values, so ``json.loads`` gives back the exact value and type. Anything else is kept byte
  for byte as a base64 string marked ``"encoding": "base64"`` (the feature dtypes have no binary
  type). A field named ``index``, ``episode_index``, ``__key__`` or ``__url__`` (plus any trailing
  underscores) gets one more ``_``: the writer renumbers the first two, and the last two are ours.
- **Units**: one per sample; ``position`` is the sample's ordinal in its shard (rejected samples
  keep their slot); ``locator = (key, [[field, offset, size], ...])`` with the members' data
  offsets in the decompressed stream, sorted by field; ``content_hash`` is :func:`sample_digest`
  of the member bytes (not the key, so equal samples hash equal). ``read`` seeks in a plain tar and
  decompresses a gzip tar from its start up to the last wanted member, once per call.
- **Rejects** (source = the shard, position ``key:KEY``, or ``member:NAME`` for a refused member
  that names no sample, or ``offset:N`` for a broken archive; nothing is ever extracted, so
  nothing is written anywhere):

  - ``path_escape``: an absolute or ``..`` member name (also with ``\\`` or percent-encoded),
    or a link whose target is one; a shard
    path that escapes the root;
  - ``member_unsupported``: any other link (symbolic or hard), a device, a FIFO, a sparse file or
    another non-regular member, or a member above ``max_member_bytes``; the whole sample goes;
  - ``key_repeated``: a key that reappears after its sample ended (the later members are the
    reject; the first sample stays), or a sample with the same field twice;
  - ``io_error``: a shard that cannot be opened or is not a tar, or a truncated or corrupt archive:
    the samples before the break are kept, the one in progress and the rest are one reject at the
    offset of the break (an archive without its end-of-archive marker counts as truncated);
  - per field: ``image_*`` from the media hook, ``field_type`` (a ``cls`` that is not an int64
    text integer), ``utf8_invalid`` (``txt``, ``json``, or a key or field name that is not UTF-8),
    ``json_invalid``.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import gzip
import hashlib
import itertools
import os
import posixpath
import re
import tarfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.fs as pafs

from shardfeed.formats.columns import to_table
from shardfeed.formats.sources import json_text
from shardfeed.formats.sources.base import (
    DatasetMeta,
    MediaHook,
    RowsScan,
    ScanResult,
    UnitRef,
)
from shardfeed.formats.sources.brace_patterns import expand_braces
from shardfeed.formats.sources.jsonl import JSON_EXTRA
from shardfeed.formats.sources.listing import list_files, source_root
from shardfeed.formats.storage import Location, locate
from shardfeed.schemas.errors import ShardfeedError, UnsafePathError
from shardfeed.schemas.features import Feature, FeatureSpec
from shardfeed.schemas.rejects import RejectError, RejectRecord

__all__ = [
    "BYTES_EXTRA",
    "FIELD_KINDS",
    "KEY",
    "SUFFIXES",
    "URL",
    "InferredFields",
    "WebDatasetSource",
    "column_name",
    "expand_braces",
    "field_kind",
    "is_shard_pattern",
    "merge_inferred",
    "sample_digest",
    "split_name",
]

SUFFIXES = (".tar", ".tgz", ".tar.gz")
#: Typed fields, by the last dotted part of the field name; any other field is bytes.
FIELD_KINDS = {"jpg": "image", "jpeg": "image", "png": "image", "webp": "image"} | {
    "cls": "int",
    "txt": "text",
    "json": "json",
}
#: Marker in ``Feature.extra`` for string columns that hold a member's bytes as base64.
BYTES_EXTRA = {"encoding": "base64"}
KEY, URL = "__key__", "__url__"
_RESERVED = (KEY, URL, "index", "episode_index")
_GZIP_MAGIC = b"\x1f\x8b"
_BLOCK = tarfile.BLOCKSIZE  # 512 bytes: a tar header
_SKIP_CHUNK = 1 << 20  # gzip reads: skip to the next wanted member 1 MiB at a time
_INT64 = (-(2**63), 2**63 - 1)
_READ_ERRORS = (tarfile.TarError, EOFError, zlib.error, OSError)


# --------------------------------------------------------------------------------------------------
# Brace patterns


def is_shard_pattern(src: str) -> bool:
    """Whether ``src`` is a brace pattern whose every expansion names a tar shard."""
    try:
        names = expand_braces(src)
    except ShardfeedError:
        return False
    return names != [src] and all(n.lower().endswith(SUFFIXES) for n in names)


# --------------------------------------------------------------------------------------------------
# Member names and fields


def split_name(name: str) -> tuple[str, str] | None:
    """``(key, field)`` of a member name as WebDataset splits it, or None when the basename has no
    extension or starts with a dot."""
    directory, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    if not stem or not dot or not ext:
        return None
    return (f"{directory}/{stem}" if directory else stem), ext.lower()


def field_kind(name: str) -> str:
    """``image``, ``int``, ``text``, ``json`` or ``bytes``: the last dotted part of the field."""
    return FIELD_KINDS.get(name.rpartition(".")[2], "bytes")


def column_name(name: str) -> str:
    """The column of a field: the field itself, with one more ``_`` for a reserved name."""
    for reserved in _RESERVED:
        if name.startswith(reserved) and not name[len(reserved) :].strip("_"):
            return name + "_"
    return name


_KIND_FEATURE = {
    "image": ("image", (), {}),
    "int": ("int64", (1,), {}),
    "text": ("string", (1,), {}),
    "json": ("string", (1,), JSON_EXTRA),
    "bytes": ("string", (1,), BYTES_EXTRA),
}


def sample_digest(members: Sequence[tuple[str, bytes]]) -> str:
    """A sample's content hash: ``content_digest`` (SHA-256, 32 hex characters) of each
    ``field NUL length NUL bytes`` in field order; the key is not part of it."""
    h = hashlib.sha256()
    for name, data in sorted(members):
        h.update(f"{name}\0{len(data)}\0".encode("utf-8", "surrogateescape"))
        h.update(data)
    return h.hexdigest()[:32]


# --------------------------------------------------------------------------------------------------
# Schema inference


@dataclass(frozen=True)
class InferredFields:
    """How many members of each field some shards hold. Picklable and JSON-able; merge with
    :func:`merge_inferred`; ``InferredFields()`` is the identity."""

    members: int = 0
    fields: Mapping[str, int] = field(default_factory=dict)


def merge_inferred(a: InferredFields, b: InferredFields) -> InferredFields:
    """Sum two fragments; associative and commutative."""
    fields = dict(a.fields)
    for name, n in b.fields.items():
        fields[name] = fields.get(name, 0) + n
    return InferredFields(a.members + b.members, fields)


# --------------------------------------------------------------------------------------------------
# Walking an archive


@dataclass(frozen=True)
class _Member:
    """One member: a regular file (``data`` when read), or one refused with ``error``."""

    name: str  # normalised (no ``./``) when safe, else as stored
    offset: int  # of its data, in the decompressed stream
    size: int
    data: bytes | None = None
    error: RejectError | None = None


@dataclass(frozen=True)
class _End:
    """Where the walk stopped: ``error`` is None at a clean end-of-archive marker; ``member`` names
    the member whose data broke off, if that is where it stopped."""

    offset: int
    error: RejectError | None = None
    member: str | None = None


class _LastRead:
    """A readable, seekable file that keeps the bytes its last read returned: when tarfile stops
    without an error, they tell an end-of-archive block from a truncated or corrupt header."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.last: bytes | None = None

    def read(self, size: int = -1) -> bytes:
        self.last = self.raw.read(size)
        return self.last

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.raw.seek(offset, whence)

    def tell(self) -> int:
        return self.raw.tell()


def _walk(
    stream: Any, with_data: bool, max_member: int, base: int = 0, cut: bool = False
) -> Iterator[_Member | _End]:
    """The members of a decompressed tar stream, ending with one :class:`_End`. Never raises for
    bad input: a broken archive ends the walk with an ``io_error``. ``base`` is the stream's
    offset in the shard; ``cut``: the stream is a piece ending at a member boundary, so its end
    is a clean one, not a missing end-of-archive marker."""
    tail = _LastRead(stream)
    try:
        with tarfile.open(
            fileobj=tail, mode="r:", encoding="utf-8", errors="surrogateescape"
        ) as archive:
            for item in _walk_open(archive, tail, with_data, max_member, cut):
                yield _shifted(item, base) if base else item
    except _READ_ERRORS as err:  # tarfile.open read the first header and found no tar
        yield _End(base, RejectError("io_error", f"not a readable tar archive ({err})"))


def _shifted(item: _Member | _End, base: int) -> _Member | _End:
    """``item`` with its offset counted from the shard's start."""
    return dataclasses.replace(item, offset=item.offset + base)


def _walk_open(
    archive: tarfile.TarFile, tail: _LastRead, with_data: bool, max_member: int, cut: bool
) -> Iterator[_Member | _End]:
    while True:
        offset = archive.offset
        try:
            info = archive.next()
        except _READ_ERRORS as err:
            yield _End(offset, _broken(offset, err))
            return
        if info is None:
            error = None if cut and not tail.last else _end_error(tail.last, archive.offset)
            yield _End(archive.offset, error)
            return
        archive.members.clear()  # keep memory flat (links are never resolved)
        error = _refusal(info, max_member)
        if info.isdir() and error is None:
            continue
        data = None
        if with_data and error is None:
            try:
                data = archive.extractfile(info).read()
            except _READ_ERRORS as err:
                where = info.offset_data
                yield _End(where, _broken(where, err, info.name), _normalise(info.name))
                return
        name = info.name if error is not None else _normalise(info.name)
        yield _Member(name, info.offset_data, info.size, data, error)


def _refusal(info: tarfile.TarInfo, max_member: int) -> RejectError | None:
    """Why a member is refused, or None for a regular file or directory."""
    name = _printable(info.name)
    if _escapes(info.name):
        return RejectError(
            "path_escape",
            f"member name {name!r} is absolute or has a '..' part (also with backslashes or "
            "percent-encoded)",
        )
    if info.issym() or info.islnk():
        what = "symbolic link" if info.issym() else "hard link"
        target = _printable(info.linkname)
        if _escapes(info.linkname) or (info.issym() and _escapes_from(info.name, info.linkname)):
            return RejectError(
                "path_escape", f"member {name!r} is a {what} to {target!r}, outside the archive"
            )
        return RejectError(
            "member_unsupported", f"member {name!r} is a {what} (to {target!r}); links are refused"
        )
    if info.ischr() or info.isblk() or info.isfifo():
        what = "character device" if info.ischr() else "block device" if info.isblk() else "FIFO"
        return RejectError("member_unsupported", f"member {name!r} is a {what}")
    if info.issparse():
        return RejectError("member_unsupported", f"member {name!r} is a sparse file")
    if info.isdir():
        return None
    if not info.isreg():
        return RejectError(
            "member_unsupported", f"member {name!r} has unsupported type {info.type!r}"
        )
    if info.size > max_member:
        return RejectError(
            "member_unsupported",
            f"member {name!r} is {info.size} bytes, larger than max_member_bytes={max_member}",
        )
    return None


def _escapes(path: str) -> bool:
    """Absolute (``/x``, ``C:x``), or with a ``..`` part split at ``/`` or ``\\``, also once
    percent-decoded: what an extractor on any system, or one that decodes names, would follow."""
    for form in _decoded(path):
        if form.startswith(("/", "\\")) or form[1:2] == ":" or "\x00" in form:
            return True
        if ".." in form.replace("\\", "/").split("/"):
            return True
    return False


def _decoded(path: str) -> list[str]:
    """``path`` and its percent-decodings (at most a few; ``%252e`` decodes twice)."""
    forms = [path]
    while "%" in forms[-1] and len(forms) < 4:
        decoded = unquote(forms[-1], errors="surrogateescape")
        if decoded == forms[-1]:
            break
        forms.append(decoded)
    return forms


def _escapes_from(name: str, target: str) -> bool:
    """Whether a relative symlink target, seen from the member's directory, leaves the archive."""
    return posixpath.normpath(posixpath.join(posixpath.dirname(name), target)).startswith("..")


def _normalise(name: str) -> str:
    """A safe member name without ``.`` or empty segments (``./a//b.jpg`` -> ``a/b.jpg``)."""
    return "/".join(part for part in name.split("/") if part not in ("", "."))


def _broken(offset: int, err: BaseException, member: str = "") -> RejectError:
    inside = f" (data of member {_printable(member)!r})" if member else ""
    return RejectError(
        "io_error",
        f"the archive is truncated or corrupt at byte {offset}{inside}: {_printable(str(err))}",
    )


def _end_error(last: bytes | None, offset: int) -> RejectError | None:
    """None when the walk stopped at an end-of-archive block, else why it stopped."""
    if last is not None and len(last) == _BLOCK and last.count(0) == _BLOCK:
        return None
    if not last:
        why = "ends without an end-of-archive marker (truncated)"
    elif len(last) < _BLOCK:
        why = "is truncated inside a member header"
    else:
        why = "has an invalid member header (corrupt)"
    return RejectError("io_error", f"the archive {why} at byte {offset}")


def _printable(text: str) -> str:
    """``text`` with undecodable bytes (surrogate escapes) shown as ``\\udcxx``, so it is UTF-8."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


# --------------------------------------------------------------------------------------------------
# Field bytes -> column values

_Rule = Callable[[bytes], tuple[Any, int]]  # member bytes -> (column value, payload bytes)


_DECODER = json_text.STRICT  # strict JSON: no NaN / Infinity
_ENCODER = json_text.CANONICAL  # canonical JSON text, as the JSONL source writes nested values


def _short(data: bytes) -> str:
    return repr(data[:37] + b"..." if len(data) > 40 else data)


def _rule(feature: Feature, hook: MediaHook | None) -> _Rule:
    """How a member's bytes fill ``feature`` (raises RejectError for a bad value)."""
    name, dtype, encoding = feature.name, feature.dtype, feature.extra.get("encoding")
    if dtype == "image":

        def image(data: bytes) -> tuple[Any, int]:
            stored = hook(data) if hook is not None else data
            return stored, len(stored)

        return image
    if dtype == "int64" and feature.is_scalar:

        def integer(data: bytes) -> tuple[Any, int]:
            text = data.strip(b" \t\r\n")
            if not re.fullmatch(rb"[+-]?[0-9]+", text) or not (_INT64[0] <= int(text) <= _INT64[1]):
                raise RejectError(
                    "field_type", f"field {name!r} is not an int64 text integer: {_short(data)}"
                )
            return int(text), 8

        return integer
    if dtype != "string" or not feature.is_scalar:
        raise ShardfeedError(
            f"the webdataset source cannot fill feature {name!r} ({dtype}, shape "
            f"{list(feature.shape)}): only image, int64 and string features"
        )
    if encoding == BYTES_EXTRA["encoding"]:

        def raw(data: bytes) -> tuple[Any, int]:
            text = base64.b64encode(data).decode("ascii")
            return text, len(text)

        return raw
    if encoding == JSON_EXTRA["encoding"]:

        def parsed(data: bytes) -> tuple[Any, int]:
            text = _utf8(name, data, "utf-8-sig")
            try:
                value = _DECODER.decode(text)
            except RecursionError:
                raise RejectError("json_invalid", f"field {name!r} is nested too deeply") from None
            except ValueError as err:
                raise RejectError(
                    "json_invalid", f"field {name!r} is not valid JSON: {err}"
                ) from None
            try:
                canonical = _ENCODER.encode(value)
                return canonical, len(canonical.encode("utf-8"))
            except UnicodeEncodeError as err:
                raise RejectError(
                    "utf8_invalid", f"field {name!r} holds an unpaired surrogate ({err.reason})"
                ) from None
            except ValueError:
                raise RejectError(
                    "json_invalid", f"field {name!r} holds a number out of JSON's range"
                ) from None

        return parsed

    def text(data: bytes) -> tuple[Any, int]:
        return _utf8(name, data, "utf-8"), len(data)

    return text


def _utf8(name: str, data: bytes, codec: str) -> str:
    try:
        return data.decode(codec)
    except UnicodeDecodeError as err:
        raise RejectError(
            "utf8_invalid", f"field {name!r} is not valid UTF-8 at byte {err.start}: {err.reason}"
        ) from None


class _Converter:
    """Member bytes of one sample -> its row (a dict by column) and payload bytes."""

    def __init__(self, spec: FeatureSpec, hook: MediaHook | None) -> None:
        self.names = {KEY, URL} & set(spec.names)
        self.rules = {f.name: _rule(f, hook) for f in spec.stored if f.name not in (KEY, URL)}

    def __call__(self, url: str, key: str, members: Mapping[str, bytes]) -> tuple[dict, int]:
        row: dict[str, Any] = {}
        payload = 0
        key_bytes = _encode_name(key, "sample key")  # refused even when not stored
        if KEY in self.names:
            row[KEY] = key
            payload += len(key_bytes)
        if URL in self.names:
            row[URL] = url
            payload += len(_encode_name(url, "shard path"))
        for name, data in members.items():
            _encode_name(name, "field name")
            rule = self.rules.get(column_name(name))
            if rule is not None:
                row[column_name(name)], size = rule(data)
                payload += size
        return row, payload


def _encode_name(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise RejectError(
            "utf8_invalid", f"the {what} {_printable(text)!r} is not valid UTF-8"
        ) from None


# --------------------------------------------------------------------------------------------------
# The source


@dataclass
class _Sample:
    """Consecutive members with one key; ``error`` says why the whole sample is refused."""

    key: str
    ordinal: int  # in its shard, counting refused samples
    members: dict[str, _Member] = field(default_factory=dict)
    error: RejectError | None = None


def _samples(
    items: Iterable[_Member | _End], first: int = 0
) -> Iterator[_Sample | tuple[str, RejectError]]:
    """Group a walk's members into samples, in archive order, numbering them from ``first``. Also
    yields ``(position, error)`` for a refused member that names no sample and for a broken
    archive; the sample in progress at a break is dropped (its members may be incomplete)."""
    current: _Sample | None = None
    ended: set[str] = set()
    ordinal = first
    for item in items:
        if isinstance(item, _End):
            broken = split_name(item.member or "")
            if current is not None and (
                item.error is None or (broken is not None and broken[0] != current.key)
            ):
                yield current  # it ended before the break
                current = None
            if item.error is not None:
                key = current.key if current else broken[0] if broken else None
                lost = "" if key is None else f"; sample {key!r} is dropped"
                where = f"offset:{item.offset}" if item.offset else ""
                yield where, RejectError(item.error.reason, item.error.message + lost)
            return
        parts = split_name(item.name)
        if parts is None:
            if item.error is not None:
                yield f"member:{item.name}", item.error
            continue
        key, name = parts
        if current is None or key != current.key:
            if current is not None:
                ended.add(current.key)
                yield current
            current = _Sample(key, ordinal)
            ordinal += 1
            if key in ended:
                current.error = RejectError(
                    "key_repeated",
                    f"key {key!r} reappears at member {item.name!r} after its sample ended; "
                    "a sample's members must be contiguous",
                )
        if current.error is not None:
            continue
        if item.error is not None:
            current.error = item.error
        elif name in current.members:
            first = current.members[name].name
            current.error = RejectError(
                "key_repeated",
                f"sample {key!r} has field {name!r} twice ({first!r} and {item.name!r})",
            )
        else:
            current.members[name] = item


_SPOOL_PART_BYTES = 64 << 20  # payload per spooled part: bounds the rows held while scanning


def sample_cuts(stream: Any, every: int, max_member: int) -> list[int]:
    """Offsets where a plain shard can be cut into runs of whole samples about ``every`` bytes
    long, from a walk over its member headers (data is skipped by seeking): each cut is where a
    member's header chain starts (extended headers included) and a new key begins. None at all
    for a shard whose walk finds anything a whole-shard scan must judge in context (a refused
    member, a key that comes back after its sample ended, a broken end)."""
    cuts: list[int] = []
    key: str | None = None
    ended: set[str] = set()
    boundary = last_cut = 0  # where the header chain after the last member starts
    for item in _walk(stream, False, max_member):
        if isinstance(item, _End):
            return cuts if item.error is None else []
        if item.error is not None:
            return []
        parts = split_name(item.name)
        if parts is not None and parts[0] != key:
            if parts[0] in ended:
                return []
            if key is not None:
                ended.add(key)
                if boundary - last_cut >= every:
                    cuts.append(boundary)
                    last_cut = boundary
            key = parts[0]
        boundary = item.offset + -(-item.size // _BLOCK) * _BLOCK
    return []


class _Window:
    """Bytes ``[start, stop)`` of a seekable file as a file of their own (offsets from 0)."""

    def __init__(self, raw: Any, start: int, stop: int) -> None:
        self.raw, self.start, self.stop = raw, start, stop
        raw.seek(start)

    def read(self, size: int = -1) -> bytes:
        left = self.stop - self.raw.tell()
        return self.raw.read(left if size < 0 else min(size, left)) if left > 0 else b""

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: self.start, 1: self.raw.tell(), 2: self.stop}[whence]
        return self.raw.seek(base + offset) - self.start

    def tell(self) -> int:
        return self.raw.tell() - self.start


class WebDatasetSource:
    """WebDataset tar shards as a :class:`~shardfeed.formats.sources.base.SourceReader`.

    ``root`` is a shard, a directory of shards or a brace pattern (local paths and ``pyarrow.fs``
    URIs). ``media_hook`` validates (and maybe re-encodes) every image while scanning; None means
    ``ImagePolicy()``, a full decode that keeps the bytes (shards are untrusted input). A member
    above ``max_member_bytes`` is refused unread. ``drop_videos`` is accepted and ignored.
    """

    kind: ClassVar[str] = "webdataset"
    first_position: ClassVar[int] = 0  # a sample's position is its ordinal in its shard
    #: The combine function for ``infer`` results, reachable from the class.
    merge_inferred = staticmethod(merge_inferred)
    #: The dataclass ``infer`` returns, rebuilt from its JSON form between pipeline stages.
    inferred_type = InferredFields

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        media_hook: MediaHook | None = None,
        max_member_bytes: int = 1 << 30,  # 1 GiB
        drop_videos: bool = False,
    ) -> None:
        if media_hook is None:
            from shardfeed.transforms.image_policy import ImagePolicy

            media_hook = ImagePolicy()
        if max_member_bytes <= 0:
            raise ShardfeedError("max_member_bytes must be positive")
        self.media_hook = media_hook
        self.max_member_bytes = max_member_bytes
        text = os.fspath(root)
        self._listed: list[str] | None = None  # shards named by a pattern or a single file
        if not _exists(text) and is_shard_pattern(text):
            cut = text.rfind("/", 0, text.index("{"))
            base = (text[:cut] or "/") if cut >= 0 else "."
            self._listed = sorted({name[cut + 1 :] for name in expand_braces(text)})
            location = locate(base)
            if not _any_file(location, self._listed):  # the others become io_error rejects
                raise ShardfeedError(
                    f"WebDataset source {text!r}: none of its {len(self._listed)} shards exists"
                )
        else:
            location, single = source_root(text, "WebDataset source")
            if single is not None:
                self._listed = [single]
        self._location = location
        self.root = location.root
        if not self.files():
            raise ShardfeedError(f"WebDataset source {text!r}: no *.tar, *.tgz or *.tar.gz shards")

    def __repr__(self) -> str:
        return f"WebDatasetSource({self.root!r})"

    # -- files -------------------------------------------------------------------------------------

    def files(self) -> list[str]:
        """Root-relative shard paths, sorted. Local directory symlinks are not followed; those
        leading outside the root are listed so that ``scan`` reports them as ``path_escape``."""
        if self._listed is not None:
            return list(self._listed)
        return list_files(self._location, lambda path: path.lower().endswith(SUFFIXES))

    @contextlib.contextmanager
    def _open(self, file: str) -> Iterator[tuple[Any, Any, bool]]:
        """(raw handle, decompressed stream, whether it is gzip) of one shard."""
        with self._location.open_input(file, "file") as handle:
            gzipped = handle.read_at(2, 0) == _GZIP_MAGIC
            handle.seek(0)  # read_at leaves the implicit position undefined
            stream = gzip.GzipFile(fileobj=handle, mode="rb") if gzipped else handle
            try:
                yield handle, stream, gzipped
            finally:
                if stream is not handle:
                    stream.close()

    def _members(
        self, file: str, with_data: bool, start: int = 0, stop: int = -1
    ) -> Iterator[_Member | _End]:
        """``_walk`` of one shard (of its bytes ``[start, stop)``, a piece from :meth:`pieces`);
        a shard that cannot be opened is one ``_End`` with its error."""
        try:
            with self._open(file) as (handle, stream, _gz):
                if (start, stop) != (0, -1):
                    stream = _Window(handle, start, stop if stop >= 0 else handle.size())
                cut = stop >= 0
                yield from _walk(stream, with_data, self.max_member_bytes, start, cut)
        except UnsafePathError as err:
            yield _End(0, RejectError("path_escape", err.message))
        except OSError as err:
            yield _End(0, RejectError("io_error", f"cannot read the shard: {err}"))

    # -- schema ------------------------------------------------------------------------------------

    def infer(self, file: str) -> InferredFields:
        """Member counts per field of one shard, from its headers alone (refused members and
        names that are not UTF-8 do not count)."""
        return self.infer_piece(file, 0, -1)[0]

    def infer_piece(self, file: str, start: int, stop: int) -> tuple[InferredFields, int]:
        """``infer`` over the members in bytes ``[start, stop)``, and how many samples start
        there (positions the piece spans)."""
        fields: dict[str, int] = {}
        members = 0
        walked: list[_Member | _End] = []
        for item in self._members(file, False, start, stop):
            walked.append(item)
            if isinstance(item, _End) or item.error is not None:
                continue
            parts = split_name(item.name)
            if parts is None or not _is_utf8(parts[1]):
                continue
            members += 1
            fields[parts[1]] = fields.get(parts[1], 0) + 1
        span = sum(isinstance(group, _Sample) for group in _samples(walked))
        return InferredFields(members, fields), span

    def pieces(self, file: str, piece_bytes: int) -> list[tuple[int, int]]:
        """Byte ranges of whole samples, about ``piece_bytes`` each, from a walk over a plain
        shard's headers (:func:`sample_cuts`); one piece ``(0, -1)`` for a gzip shard, a shard
        that fits, or one the walk finds anything odd in (the scan then judges it whole)."""
        try:
            with self._location.open_input(file, "file") as handle:
                if handle.size() <= piece_bytes or handle.read_at(2, 0) == _GZIP_MAGIC:
                    return [(0, -1)]
                handle.seek(0)
                cuts = sample_cuts(handle, piece_bytes, self.max_member_bytes)
        except (OSError, UnsafePathError):
            return [(0, -1)]  # the scan reports it
        return list(itertools.pairwise([0, *cuts, -1]))

    def spec(self, inferred: Any | None = None) -> FeatureSpec:
        """``__key__``, ``__url__``, then one column per field by name (see the module docstring)."""
        if not isinstance(inferred, InferredFields):
            raise ShardfeedError(
                f"WebDataset source {self.root}: no inferred fields; pass the merged "
                "InferredFields of infer() over all shards"
            )
        if not inferred.fields:
            raise ShardfeedError(
                f"WebDataset source {self.root}: no member with a key and an extension in "
                f"{len(self.files())} shard(s)"
            )
        features = [Feature(KEY, "string"), Feature(URL, "string")]
        for name in sorted(inferred.fields):
            dtype, shape, extra = _KIND_FEATURE[field_kind(name)]
            features.append(Feature(column_name(name), dtype, shape, extra=dict(extra)))
        return FeatureSpec(tuple(features))

    def meta(self) -> DatasetMeta:
        return DatasetMeta()

    def reject_location(self, ref: UnitRef) -> tuple[str, str]:
        """``(source, position)`` naming a unit, as its rejects do: ``(shard, "key:KEY")``."""
        return ref.file, f"key:{_printable(str(ref.locator[0]))}"

    # -- scan and read -----------------------------------------------------------------------------

    def scan(self, file: str, spec: FeatureSpec) -> ScanResult:
        """One UnitRef per good sample of shard ``file``, one RejectRecord per bad one (see the
        module docstring); reads every member once, passing images through the media hook."""
        result = ScanResult()
        for sample in self._converted(file, spec, keep_rows=False):
            if isinstance(sample, RejectRecord):
                result.rejects.append(sample)
                continue
            group, members, payload, _ = sample
            result.units.append(
                UnitRef(
                    file=file,
                    position=group.ordinal,
                    rows=1,
                    payload_bytes=payload,
                    content_hash=sample_digest(list(members.items())),
                    locator=(
                        group.key,
                        [[n, m.offset, m.size] for n, m in sorted(group.members.items())],
                    ),
                )
            )
        return result

    def spools(self, file: str) -> bool:
        """Whether the pipeline keeps this shard's rows from the scan: a gzip shard, whose stream
        would otherwise be inflated from its start by every shard writer that needs a sample of
        it. A plain tar is read again by seeking, which costs no second decode."""
        try:
            with self._location.open_input(file, "file") as handle:
                return handle.read_at(2, 0) == _GZIP_MAGIC
        except (OSError, UnsafePathError):
            return False  # the scan reports it

    def scan_rows(self, file: str, spec: FeatureSpec) -> Iterator[RowsScan]:
        """The good samples of ``file`` converted to ``spec`` (images as the media hook leaves
        them), in parts of about ``_SPOOL_PART_BYTES``, with the rejects
        (:class:`~shardfeed.formats.sources.base.SpoolingSource`)."""
        return self.scan_piece(file, spec, 0, -1, 0)

    def scan_piece(
        self, file: str, spec: FeatureSpec, start: int, stop: int, first: int
    ) -> Iterator[RowsScan]:
        """``scan_rows`` over the samples in bytes ``[start, stop)``, the first of them sample
        ``first`` of the shard."""
        positions: list[int] = []
        payloads: list[int] = []
        hashes: list[str] = []
        rows: list[dict] = []
        rejects: list[RejectRecord] = []
        held = 0
        for sample in self._converted(file, spec, True, (start, stop, first)):
            if isinstance(sample, RejectRecord):
                rejects.append(sample)
                continue
            group, members, payload, row = sample
            positions.append(group.ordinal)
            payloads.append(payload)
            hashes.append(sample_digest(list(members.items())))
            rows.append(row)
            held += payload
            if held >= _SPOOL_PART_BYTES:
                yield RowsScan.one_row_each(
                    positions, payloads, hashes, to_table(rows, spec), rejects
                )
                positions, payloads, hashes, rows, rejects, held = [], [], [], [], [], 0
        if rows or rejects:
            yield RowsScan.one_row_each(positions, payloads, hashes, to_table(rows, spec), rejects)

    def _converted(
        self,
        file: str,
        spec: FeatureSpec,
        keep_rows: bool,
        piece: tuple[int, int, int] = (0, -1, 0),
    ) -> Iterator[tuple[_Sample, dict[str, bytes], int, dict | None] | RejectRecord]:
        """Each sample of ``file`` (of the piece ``(start, stop, first ordinal)``) converted (its
        members, payload and, with ``keep_rows``, its row), or the reject saying why not, in
        archive order."""
        convert = _Converter(spec, self.media_hook)
        start, stop, first = piece
        for group in _samples(self._members(file, True, start, stop), first):
            position, error = (
                group if isinstance(group, tuple) else (f"key:{group.key}", group.error)
            )
            if error is None:
                members = {name: m.data or b"" for name, m in group.members.items()}
                try:
                    row, payload = convert(file, group.key, members)
                except RejectError as err:
                    error = err
            if error is not None:
                yield RejectRecord(
                    file, _printable(position), error.reason, _printable(error.message)
                )
                continue
            yield group, members, payload, row if keep_rows else None

    def read(self, refs: Sequence[UnitRef], spec: FeatureSpec) -> pa.Table:
        """The rows of ``refs`` in the given order, in ``spec.arrow_schema()``. Raises
        ShardfeedError if a sample no longer matches its ref (the shard changed since ``scan``).
        Images pass through the media hook again only if it rewrites them (scan validated them)."""
        rewrites = self.media_hook is not None and self.media_hook.rewrites
        convert = _Converter(spec, self.media_hook if rewrites else None)
        slots: dict[str, dict[int, list[int]]] = {}  # file -> position -> ref indices
        for i, ref in enumerate(refs):
            slots.setdefault(ref.file, {}).setdefault(ref.position, []).append(i)
        rows: list[dict | None] = [None] * len(refs)
        for file in sorted(slots):
            wanted = {position: refs[ix[0]] for position, ix in slots[file].items()}
            for position, members in self._fetch(file, wanted):
                ref = wanted[position]
                if sample_digest(list(members.items())) != ref.content_hash:
                    raise _changed(ref)
                try:
                    row, payload = convert(file, str(ref.locator[0]), members)
                except RejectError as err:
                    raise ShardfeedError(f"{file} key {ref.locator[0]!r}: {err}") from None
                if payload != ref.payload_bytes:
                    raise _changed(ref)
                for i in slots[file][position]:
                    rows[i] = row
        missing = [refs[i] for i, row in enumerate(rows) if row is None]
        if missing:
            raise _changed(missing[0])
        return to_table(rows, spec)

    def _fetch(
        self, file: str, wanted: Mapping[int, UnitRef]
    ) -> Iterator[tuple[int, dict[str, bytes]]]:
        """(position, {field: bytes}) of each wanted sample, in archive order."""
        spans = sorted(
            (int(offset), int(size), position, str(name))
            for position, ref in wanted.items()
            for name, offset, size in _locator(ref)
        )
        by_sample: dict[int, dict[str, bytes]] = {}
        left = {position: len(_locator(ref)) for position, ref in wanted.items()}
        try:
            with self._open(file) as (handle, stream, gzipped):
                pos = 0  # gzip: where the decompressed stream stands
                for offset, size, position, name in spans:
                    if not gzipped:
                        data = handle.read_at(size, offset)
                    else:
                        while pos < offset:
                            skipped = len(stream.read(min(_SKIP_CHUNK, offset - pos)))
                            if not skipped:
                                raise _changed(wanted[position])
                            pos += skipped
                        data = stream.read(size)
                        pos += len(data)
                    if len(data) != size:
                        raise _changed(wanted[position])
                    by_sample.setdefault(position, {})[name] = data
                    left[position] -= 1
                    if not left[position]:
                        yield position, by_sample.pop(position)
        except (*_READ_ERRORS, UnsafePathError) as err:
            raise ShardfeedError(
                f"{file}: cannot read the shard since it was scanned ({err})"
            ) from None


def _locator(ref: UnitRef) -> list[tuple[str, int, int]]:
    try:
        key, members = ref.locator
        out = [(str(n), int(o), int(s)) for n, o, s in members]
    except (TypeError, ValueError):
        raise ShardfeedError(
            f"{ref.file} sample {ref.position}: bad locator {ref.locator!r}"
        ) from None
    if not isinstance(key, str) or any(o < 0 or s < 0 for _, o, s in out):
        raise ShardfeedError(f"{ref.file} sample {ref.position}: bad locator {ref.locator!r}")
    return out


def _changed(ref: UnitRef) -> ShardfeedError:
    return ShardfeedError(
        f"{ref.file} key {_printable(str(ref.locator[0]))!r} changed since it was scanned; "
        "re-run the conversion"
    )


def _any_file(location: Location, names: Sequence[str]) -> bool:
    join = os.path.join if location.is_local else posixpath.join
    paths = [join(location.root, name) for name in names]
    return any(i.type == pafs.FileType.File for i in location.filesystem.get_file_info(paths))


def _exists(path: str) -> bool:
    return "://" not in path and os.path.exists(path)


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True

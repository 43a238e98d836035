"""``tf.train.Example`` in the protobuf wire format, encoded and decoded by hand (no TensorFlow, no
``protobuf``).

The messages (``tensorflow/core/example/{example,feature}.proto``, proto3)::

    Example   { Features features = 1; }
    Features  { map<string, Feature> feature = 1; }  // entry: string key = 1; Feature value = 2
    Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
                             Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }
    FloatList { repeated float value = 1 [packed = true]; }
    Int64List { repeated int64 value = 1 [packed = true]; }

A feature is ``(kind, values)``: ``("bytes", list[bytes])``, ``("float", float32 array)``,
``("int64", int64 array)``, or ``(None, None)`` for a Feature with no kind set. Values are flat:
the encoder flattens arrays in C order.

**Encoding** is deterministic: entries are written sorted by key (code point order, which is UTF-8
byte order: the order protobuf's deterministic serialization uses), floats and int64s packed, an
empty list as an empty list message (``float_list {}``), as protobuf writes them. Negative int64s are
10-byte two's-complement varints.

**Decoding** follows protobuf's parsing rules: packed and unpacked repeated floats and int64s are
both accepted (and may be mixed); unknown fields are skipped by wire type (groups included); a
field with the wrong wire type is an unknown field; a repeated ``features`` or ``value`` message
merges, a later entry for the same key replaces the earlier one, and a later kind of a Feature
replaces an earlier one. Malformed input raises :class:`ExampleDecodeError` naming the problem
and its byte offset.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

import numpy as np

from shardfeed.schemas.errors import ShardfeedError

__all__ = [
    "KINDS",
    "ExampleDecodeError",
    "ExampleEncodeError",
    "FeatureValue",
    "decode_example",
    "encode_example",
]

Kind = Literal["bytes", "float", "int64"]
#: Feature kinds, by their field number in ``Feature`` (1, 2, 3).
KINDS: tuple[Kind, ...] = ("bytes", "float", "int64")
FeatureValue = tuple[Kind | None, np.ndarray | list | None]

_MASK64 = (1 << 64) - 1
_INT64_MAX = (1 << 63) - 1
_MAX_DEPTH = 100  # nested groups, as protobuf's default recursion limit
_PACKED_LOOP_BYTES = 16  # packed int64s up to this many bytes decode in Python, longer with numpy
_SMALL_ENCODE = 8  # int64 lists up to this long encode in Python, longer with numpy
# varint bytes of 0 .. 2**14 - 1 (every length of a value up to 16 KiB)
_VARINT = [bytes((i,)) for i in range(128)] + [
    bytes(((i & 0x7F) | 0x80, i >> 7)) for i in range(128, 1 << 14)
]
_SHIFTS = np.arange(0, 70, 7, dtype=np.uint64)
_SLOTS = np.arange(10)


class ExampleDecodeError(ShardfeedError, ValueError):
    """Bytes that are not a valid serialized ``tf.train.Example``; ``offset`` is the byte offset of
    the problem and ``problem`` says what it is."""

    def __init__(self, problem: str, offset: int) -> None:
        self.problem = problem
        self.offset = offset
        super().__init__(f"malformed tf.train.Example: {problem} at byte {offset}")

    def __reduce__(self):  # survives pickling across worker processes
        return (type(self), (self.problem, self.offset))


class ExampleEncodeError(ShardfeedError, ValueError):
    """A feature that cannot be written as a ``tf.train.Example`` feature; names the key."""


# ---------------------------------------------------------------------------------------------------
# Encoding


def _varint(value: int) -> bytes:
    """Varint bytes of a non-negative int below 2**64."""
    if value < 1 << 14:
        return _VARINT[value]
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _varint_size(value: int) -> int:
    return 1 if value < 0x80 else (value.bit_length() + 6) // 7


def _varints(values: np.ndarray) -> bytes:
    """Packed varints of int64 ``values`` (negatives as 64-bit two's complement: 10 bytes)."""
    if len(values) <= _SMALL_ENCODE:
        return b"".join(_varint(v & _MASK64) for v in values.tolist())
    u = values.view(np.uint64)[:, None]
    groups = (u >> _SHIFTS) & np.uint64(0x7F)  # (n, 10) 7-bit groups, least significant first
    size = 1 + ((u >> _SHIFTS[1:]) != 0).sum(axis=1)  # bytes per value: 1 + higher groups in use
    more = (size - 1)[:, None] > _SLOTS  # a continuation bit on all but each value's last byte
    out = groups.astype(np.uint8) | (more.astype(np.uint8) << np.uint8(7))
    return out[size[:, None] > _SLOTS].tobytes()


def _as_bytes_list(key: str, values: Any) -> list[bytes]:
    if isinstance(values, (bytes, bytearray, memoryview, str)):
        raise ExampleEncodeError(
            f"feature {key!r}: bytes values must be a list, not one {type(values).__name__}"
        )
    out = []
    for value in values:
        if isinstance(value, bytes):
            out.append(value)
        elif isinstance(value, str):
            out.append(value.encode("utf-8"))
        elif isinstance(value, (bytearray, memoryview, np.bytes_)):
            out.append(bytes(value))
        else:
            raise ExampleEncodeError(
                f"feature {key!r}: a bytes value must be bytes or str, not {type(value).__name__}"
            )
    return out


def _as_int64(key: str, values: Any) -> np.ndarray:
    arr = np.asarray(values)
    if arr.size == 0:
        return np.zeros(0, np.int64)
    if arr.dtype.kind == "u" and arr.max() > _INT64_MAX:
        raise ExampleEncodeError(f"feature {key!r}: value {arr.max()} is above the int64 range")
    if arr.dtype.kind not in "biu":
        raise ExampleEncodeError(
            f"feature {key!r}: int64 values must be integers (or within the int64 range), "
            f"got dtype {arr.dtype}"
        )
    return arr.astype(np.int64, copy=False).ravel()


def _as_float32(key: str, values: Any) -> np.ndarray:
    try:
        arr = np.asarray(values)
    except (TypeError, ValueError) as err:
        raise ExampleEncodeError(f"feature {key!r}: float values: {err}") from None
    if arr.size and arr.dtype.kind not in "biuf":
        raise ExampleEncodeError(
            f"feature {key!r}: float values must be numbers, got dtype {arr.dtype}"
        )
    return arr.astype("<f4", copy=False).ravel()


def _feature_parts(key: str, kind: Kind | None, values: Any) -> tuple[list[bytes], int]:
    """The body of one Feature message, as parts and their total size."""
    if kind is None:
        if values is not None:
            raise ExampleEncodeError(f"feature {key!r}: kind None takes values None")
        return [], 0
    if kind == "bytes":
        items = _as_bytes_list(key, values)
        parts = [b""]
        size = 0
        for item in items:
            head = b"\x0a" + _varint(len(item))
            parts += (head, item)
            size += len(head) + len(item)
        parts[0] = b"\x0a" + _varint(size)
        return parts, size + len(parts[0])
    if kind == "float":
        body = _as_float32(key, values).tobytes()
    elif kind == "int64":
        body = _varints(_as_int64(key, values))
    else:
        raise ExampleEncodeError(f"feature {key!r}: unknown kind {kind!r}; kinds: {KINDS}")
    tag = b"\x12" if kind == "float" else b"\x1a"
    if not body:
        return [tag + b"\x00"], 2
    packed = b"\x0a" + _varint(len(body))
    head = tag + _varint(len(packed) + len(body)) + packed
    return [head, body], len(head) + len(body)


def encode_example(features: Mapping[str, FeatureValue], *, sort_keys: bool = True) -> bytes:
    """Serialize ``{key: (kind, values)}`` as a ``tf.train.Example``.

    ``values`` per kind: ``"bytes"`` a list of bytes-likes (``str`` items are UTF-8 encoded);
    ``"float"`` anything numpy turns into float32 (rounded to float32); ``"int64"`` an integer or bool
    array or list within the int64 range; kind None (a Feature with no kind) takes None. Entries are
    written sorted by key unless ``sort_keys=False`` (then in the mapping's order). Raises
    :class:`ExampleEncodeError`.
    """
    for key in features:
        if not isinstance(key, str):
            raise ExampleEncodeError(f"feature key {key!r} is not a str")
    keys: Iterable[str] = sorted(features) if sort_keys else features
    parts: list[bytes] = [b""]
    size = 0
    for key in keys:
        try:
            kind, values = features[key]
        except (TypeError, ValueError):
            raise ExampleEncodeError(f"feature {key!r}: expected a (kind, values) pair") from None
        try:
            name = key.encode("utf-8")
        except UnicodeEncodeError:
            raise ExampleEncodeError(f"feature key {key!r} is not valid Unicode") from None
        body, body_size = _feature_parts(key, kind, values)
        entry_size = 2 + len(name) + _varint_size(len(name)) + _varint_size(body_size) + body_size
        head = b"\x0a" + _varint(entry_size) + b"\x0a" + _varint(len(name)) + name
        parts += (head, b"\x12" + _varint(body_size), *body)
        size += 1 + _varint_size(entry_size) + entry_size
    parts[0] = b"\x0a" + _varint(size)
    return b"".join(parts)


# ---------------------------------------------------------------------------------------------------
# Decoding: each parser takes (buf, pos, end) and reads only buf[pos:end]


def _read_varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """``(value, next pos)`` of the varint at ``pos``, its value masked to 64 bits as protobuf does."""
    if pos >= end:
        raise ExampleDecodeError("truncated varint", pos)
    byte = buf[pos]
    if byte < 0x80:
        return byte, pos + 1
    start = pos
    result = byte & 0x7F
    shift = 7
    pos += 1
    while True:
        if pos >= end:
            raise ExampleDecodeError("truncated varint", start)
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result & _MASK64, pos
        shift += 7
        if shift >= 70:
            raise ExampleDecodeError("varint longer than 10 bytes", start)


def _read_tag(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    byte = buf[pos]  # callers loop while pos < end
    if 0x08 <= byte < 0x80:
        return byte, pos + 1
    tag, after = _read_varint(buf, pos, end)
    if after - pos > 5 or tag > 0xFFFFFFFF:
        raise ExampleDecodeError("tag longer than 32 bits", pos)
    if tag >> 3 == 0:
        raise ExampleDecodeError("field number 0", pos)
    return tag, after


def _read_length(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """``(start, stop)`` of the length-delimited field whose length varint is at ``pos``."""
    size, start = _read_varint(buf, pos, end)
    stop = start + size
    if stop > end:
        raise ExampleDecodeError(f"length {size} runs past the end of its message", pos)
    return start, stop


def _skip_field(buf: bytes, pos: int, end: int, tag: int, tag_pos: int) -> int:
    """The position after the unknown field whose value starts at ``pos``."""
    wire = tag & 7
    if wire == 0:
        return _read_varint(buf, pos, end)[1]
    if wire == 2:
        return _read_length(buf, pos, end)[1]
    if wire == 1 or wire == 5:
        stop = pos + (8 if wire == 1 else 4)
        if stop > end:
            raise ExampleDecodeError("truncated fixed-width field", pos)
        return stop
    if wire == 3:
        return _skip_group(buf, pos, end, tag >> 3, tag_pos)
    if wire == 4:
        raise ExampleDecodeError("end-group tag outside a group", tag_pos)
    raise ExampleDecodeError(f"bad wire type {wire}", tag_pos)


def _skip_group(buf: bytes, pos: int, end: int, field: int, tag_pos: int) -> int:
    open_groups = [field]
    while open_groups:
        if pos >= end:
            raise ExampleDecodeError("unterminated group", tag_pos)
        tag_pos = pos
        tag, pos = _read_tag(buf, pos, end)
        wire = tag & 7
        if wire == 4:
            if tag >> 3 != open_groups.pop():
                raise ExampleDecodeError("end-group tag does not match its group", tag_pos)
        elif wire == 3:
            open_groups.append(tag >> 3)
            if len(open_groups) > _MAX_DEPTH:
                raise ExampleDecodeError("groups nested too deeply", tag_pos)
        else:
            pos = _skip_field(buf, pos, end, tag, tag_pos)
    return pos


def packed_varints(buf: bytes, pos: int, stop: int) -> np.ndarray:
    """Packed varints of ``buf[pos:stop]`` as uint64 (bit patterns of the int64s); raises
    :class:`ExampleDecodeError` for a truncated or overlong one."""
    if stop - pos <= _PACKED_LOOP_BYTES:
        out = []
        while pos < stop:
            value, pos = _read_varint(buf, pos, stop)
            out.append(value)
        return np.array(out, dtype=np.uint64)
    raw = np.frombuffer(buf, np.uint8, stop - pos, pos)
    last = np.flatnonzero(raw < 0x80)  # each varint's last byte
    if len(last) == 0 or last[-1] != len(raw) - 1:
        at = int(last[-1]) + 1 if len(last) else 0
        raise ExampleDecodeError("truncated varint in a packed list", pos + at)
    if len(last) == len(raw):
        return raw.astype(np.uint64)
    first = np.empty_like(last)
    first[0] = 0
    first[1:] = last[:-1] + 1
    sizes = last - first + 1
    if sizes.max() > 10:
        at = int(first[np.argmax(sizes > 10)])
        raise ExampleDecodeError("varint longer than 10 bytes", pos + at)
    shift = (np.arange(len(raw)) - np.repeat(first, sizes)).astype(np.uint64) * np.uint64(7)
    groups = (raw & 0x7F).astype(np.uint64) << shift
    return np.bitwise_or.reduceat(groups, first)


class _Feature:
    """A Feature being parsed: its kind and the value chunks in order (merging as protobuf does)."""

    __slots__ = ("kind", "parts")

    def __init__(self) -> None:
        self.kind: Kind | None = None
        self.parts: list = []

    def value(self) -> FeatureValue:
        kind, parts = self.kind, self.parts
        if kind is None:
            return None, None
        if kind == "bytes":
            return kind, parts
        dtype = np.float32 if kind == "float" else np.int64
        if not parts:
            return kind, np.zeros(0, dtype)
        if kind == "float":
            arr = parts[0] if len(parts) == 1 else np.concatenate(parts)
            return kind, arr.astype(np.float32)  # a copy: no view of the record's buffer
        arr = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return kind, arr.view(np.int64)


def _fields(buf: bytes, pos: int, end: int) -> list[tuple[int, int, int]]:
    """``(tag, start, stop)`` of each field of the message body ``buf[pos:end]``: the payload of a
    length-delimited field, the bytes of a varint or fixed-width one. Groups are skipped (no known
    field is one). One call per message keeps the per-field cost to a few bytecodes."""
    out = []
    while pos < end:
        tag_pos = pos
        tag = buf[pos]
        if 0x08 <= tag < 0x80:
            pos += 1
        else:
            tag, pos = _read_tag(buf, pos, end)
        wire = tag & 7
        if wire == 2:
            if pos < end and buf[pos] < 0x80:
                start = pos + 1
                stop = start + buf[pos]
            elif pos + 1 < end and buf[pos + 1] < 0x80:  # a two-byte length (128 B .. 16 KiB)
                start = pos + 2
                stop = start + (buf[pos] & 0x7F | buf[pos + 1] << 7)
            else:
                size, start = _read_varint(buf, pos, end)
                stop = start + size
            if stop > end:
                raise ExampleDecodeError(
                    f"length {stop - start} runs past the end of its message", pos
                )
        elif wire == 0:
            start = pos
            stop = pos + 1 if pos < end and buf[pos] < 0x80 else _read_varint(buf, pos, end)[1]
        elif wire == 5 or wire == 1:
            start = pos
            stop = pos + (4 if wire == 5 else 8)
            if stop > end:
                raise ExampleDecodeError("truncated fixed-width field", pos)
        else:
            pos = _skip_field(buf, pos, end, tag, tag_pos)  # a group, or an invalid wire type
            continue
        out.append((tag, start, stop))
        pos = stop
    return out


def _parse_list(buf: bytes, pos: int, end: int, kind: Kind, parts: list) -> None:
    """Append the values of a BytesList, FloatList or Int64List message body to ``parts``: field 1
    length-delimited (a bytes value, packed floats or packed int64s), or one unpacked float
    (fixed32) or int64 (varint); other fields are unknown."""
    fields = _fields(buf, pos, end)
    if kind == "bytes":
        parts += [buf[start:stop] for tag, start, stop in fields if tag == 0x0A]
        return
    for tag, start, stop in fields:
        if tag == 0x0A:
            if kind == "float":
                if (stop - start) % 4:
                    raise ExampleDecodeError(
                        f"packed floats of {stop - start} bytes (not a multiple of 4)", start
                    )
                parts.append(np.frombuffer(buf, "<f4", (stop - start) // 4, start))
            else:
                parts.append(packed_varints(buf, start, stop))
        elif tag == 0x0D and kind == "float":
            parts.append(np.frombuffer(buf, "<f4", 1, start))
        elif tag == 0x08 and kind == "int64":
            parts.append(np.array([_read_varint(buf, start, stop)[0]], np.uint64))


def _parse_entry(buf: bytes, pos: int, end: int) -> tuple[str, _Feature]:
    """One ``Features.feature`` map entry: ``(key, Feature)``, defaults ``""`` and no kind."""
    key = ""
    feature = _Feature()
    for tag, start, stop in _fields(buf, pos, end):
        if tag == 0x0A:  # every occurrence must be UTF-8, even one a later key replaces
            try:
                key = buf[start:stop].decode("utf-8")
            except UnicodeDecodeError:
                raise ExampleDecodeError("feature key is not valid UTF-8", start) from None
        elif tag == 0x12:  # a Feature: bytes_list = 1, float_list = 2, int64_list = 3
            for kind_tag, list_start, list_stop in _fields(buf, start, stop):
                if kind_tag in (0x0A, 0x12, 0x1A):
                    kind = KINDS[(kind_tag >> 3) - 1]
                    if feature.kind != kind:  # another member of the oneof clears the old one
                        feature.kind = kind
                        feature.parts = []
                    _parse_list(buf, list_start, list_stop, kind, feature.parts)
    return key, feature


def decode_example(data: bytes | bytearray | memoryview) -> dict[str, FeatureValue]:
    """Parse a serialized ``tf.train.Example`` into ``{key: (kind, values)}``, in the order the
    entries appear: ``("bytes", list[bytes])``, ``("float", float32 array)``, ``("int64", int64
    array)`` or ``(None, None)``. Arrays are new (not views of ``data``). Raises
    :class:`ExampleDecodeError`."""
    buf = data if type(data) is bytes else bytes(data)
    features: dict[str, _Feature] = {}
    for tag, start, stop in _fields(buf, 0, len(buf)):
        if tag == 0x0A:  # Example.features; a repeated one merges
            for entry_tag, entry_start, entry_stop in _fields(buf, start, stop):
                if entry_tag == 0x0A:
                    key, feature = _parse_entry(buf, entry_start, entry_stop)
                    features.pop(key, None)  # a later entry for a key replaces the earlier one
                    features[key] = feature
    return {key: feature.value() for key, feature in features.items()}

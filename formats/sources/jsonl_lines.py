"""JSONL lines, one at a time: decompressing, splitting a stream into bounded lines, parsing one
line strictly and checking its values against the features.

This is the exact path every rule of the JSONL source is defined by; the block reader
(:mod:`shardfeed.formats.sources.jsonl_blocks`) parses whole blocks with Arrow and falls back to
these functions inside a block whenever Arrow could disagree with them.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import zstandard

from shardfeed.formats.sources import json_text
from shardfeed.schemas.errors import ShardfeedError
from shardfeed.schemas.features import Feature, FeatureSpec
from shardfeed.schemas.rejects import RejectError

_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_BOM = b"\xef\xbb\xbf"
_CHUNK = 1 << 20  # 1 MiB decompressed per read


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    return "json"


# --------------------------------------------------------------------------------------------------
# Bytes -> lines -> records


@dataclass(frozen=True)
class _Line:
    """One line of the decompressed stream, without its newline; dropped lines carry an ``error``."""

    number: int  # 1-based
    offset: int  # byte offset in the decompressed stream
    data: bytes  # empty when the line was dropped
    error: RejectError | None = None


def _sniff(head: bytes) -> str:
    if head.startswith(_GZIP_MAGIC):
        return "gzip"
    if head.startswith(_ZSTD_MAGIC):
        return "zstd"
    return "none"


class _ZstdFrames:
    """Follows zstd frame and block headers through the compressed bytes, to tell a complete stream
    from a truncated one (zstandard's stream reader ends silently at a truncation)."""

    def __init__(self) -> None:
        self.state = "magic"
        self.pending = bytearray()
        self.skip = 0
        self.checksum = False

    @property
    def complete(self) -> bool:
        return self.state == "magic" and not self.pending and not self.skip

    def feed(self, data: bytes) -> None:
        i, n = 0, len(data)
        while i < n and self.state != "invalid":
            if self.skip:
                take = min(self.skip, n - i)
                self.skip -= take
                i += take
                continue
            need = {"magic": 4, "size": 4, "descriptor": 1, "block": 3}[self.state]
            take = min(need - len(self.pending), n - i)
            self.pending += data[i : i + take]
            i += take
            if len(self.pending) == need:
                self._header(bytes(self.pending))
                self.pending.clear()

    def _header(self, head: bytes) -> None:
        value = int.from_bytes(head, "little")
        if self.state == "magic":
            if head == _ZSTD_MAGIC:
                self.state = "descriptor"
            elif head[0] & 0xF0 == 0x50 and head[1:] == b"\x2a\x4d\x18":  # skippable frame
                self.state = "size"
            else:
                self.state = "invalid"  # the decompressor reports it
        elif self.state == "size":
            self.skip, self.state = value, "magic"
        elif self.state == "descriptor":
            fcs, single, dict_id = value >> 6, (value >> 5) & 1, value & 3
            self.checksum = bool((value >> 2) & 1)
            self.skip = (0 if single else 1) + (0, 1, 2, 4)[dict_id] + (single, 2, 4, 8)[fcs]
            self.state = "block"
        else:  # block header: last flag, type (raw, RLE, compressed), size
            kind, size = (value >> 1) & 3, value >> 3
            self.skip = 1 if kind == 1 else size
            if value & 1:
                self.skip += 4 if self.checksum else 0
                self.state = "magic"


class _ZstdReader:
    """zstandard's streaming reader, across frames, that raises ZstdError on a truncated stream."""

    def __init__(self, handle: Any) -> None:
        self._frames = _ZstdFrames()
        self._reader = zstandard.ZstdDecompressor().stream_reader(
            _Observed(handle, self._frames.feed), read_across_frames=True, closefd=False
        )

    def read(self, size: int) -> bytes:
        data = self._reader.read(size)
        if not data and not self._frames.complete:
            raise zstandard.ZstdError("it ends inside a frame")
        return data

    def close(self) -> None:
        self._reader.close()


@dataclass
class _Observed:
    """A readable that shows every byte it returns to ``observe``."""

    handle: Any
    observe: Callable[[bytes], None]

    def read(self, size: int = -1) -> bytes:
        data = self.handle.read(size)
        self.observe(data)
        return data


def _iter_lines(
    stream: Any, compression: str, max_line: int, max_expanded: int | None
) -> Iterator[_Line]:
    """Split a (decompressed) byte stream into lines without ever holding more than ``max_line``
    bytes of one line. Ends with a dropped line if the stream breaks or passes ``max_expanded``."""
    buf = bytearray()
    start = 0  # offset of the line in progress
    number = 1
    overlong = False  # the line in progress passed max_line; its bytes are being discarded
    consumed = 0
    while True:
        try:
            chunk = stream.read(_CHUNK)
        except (OSError, EOFError, zlib.error, zstandard.ZstdError) as err:
            yield _Line(
                number, start, b"", RejectError("io_error", _broken(compression, consumed, err))
            )
            return
        if not chunk:
            break
        bomb = max_expanded is not None and consumed + len(chunk) > max_expanded
        if bomb:
            chunk = chunk[: max_expanded - consumed]
        base = consumed
        consumed += len(chunk)
        pos = 0
        while True:
            nl = chunk.find(b"\n", pos)
            if nl < 0:
                if not overlong:
                    buf += chunk[pos:]
                    if len(buf) > max_line:
                        overlong = True
                        buf.clear()
                break
            if not overlong:
                buf += chunk[pos:nl]
            end = base + nl
            if overlong or len(buf) > max_line:
                yield _Line(number, start, b"", _too_long(end - start, max_line))
            else:
                yield _Line(number, start, bytes(buf))
            buf.clear()
            overlong = False
            start, number, pos = end + 1, number + 1, nl + 1
        if bomb:
            message = (
                f"the {compression} stream expands beyond max_expanded_bytes={max_expanded}; "
                f"line {number} and the rest of the file are dropped"
            )
            yield _Line(number, start, b"", RejectError("decompression_bomb", message))
            return
    if overlong:
        yield _Line(number, start, b"", _too_long(consumed - start, max_line))
    elif buf:
        yield _Line(number, start, bytes(buf))


def _too_long(length: int, max_line: int) -> RejectError:
    return RejectError(
        "json_invalid", f"line is {length} bytes, longer than max_line_bytes={max_line}"
    )


def _broken(compression: str, consumed: int, err: BaseException) -> str:
    what = f"{compression} stream" if compression != "none" else "file"
    return f"the {what} is corrupt or truncated after {consumed} bytes ({err}); the rest is dropped"


def _is_blank(data: bytes) -> bool:
    return not data.strip(b" \t\r")


_DECODER = json_text.STRICT  # strict JSON: no NaN / Infinity
_ENCODER = json_text.CANONICAL  # canonical JSON text of nested values (the ``json`` kind)


def _json_type(value: Any) -> str:
    return {
        "null": "null",
        "bool": "boolean",
        "int": "number",
        "float": "number",
        "string": "string",
    }.get(_kind(value), "array" if isinstance(value, list) else "object")


def _parse(data: bytes, number: int) -> dict[str, Any]:
    """One line as a JSON object, or RejectError (utf8_invalid / json_invalid)."""
    skip = 3 if number == 1 and data.startswith(_BOM) else 0
    try:
        text = data[skip:].decode("utf-8")
    except UnicodeDecodeError as err:
        raise RejectError(
            "utf8_invalid", f"invalid UTF-8 at byte {err.start + skip} of the line: {err.reason}"
        ) from None
    try:
        value = _DECODER.decode(text)
    except RecursionError:
        raise RejectError("json_invalid", "JSON nesting is too deep") from None
    except ValueError as err:
        raise RejectError("json_invalid", f"not valid JSON: {err}") from None
    if not isinstance(value, dict):
        raise RejectError("json_invalid", f"a JSON {_json_type(value)} is not an object")
    if "" in value:
        raise RejectError("json_invalid", 'the empty key "" cannot be a column name')
    return value


# --------------------------------------------------------------------------------------------------
# Records -> typed rows

_Rule = Callable[[Any], tuple[Any, int]]  # value -> (column value, payload bytes), or RejectError


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _utf8_len(name: str, text: str) -> int:
    if text.isascii():
        return len(text)
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError as err:
        raise RejectError(
            "utf8_invalid", f"field {name!r} holds an unpaired surrogate ({err.reason})"
        ) from None


def _mismatch(name: str, value: Any, expected: str) -> RejectError:
    return RejectError(
        "field_type",
        f"field {name!r} is a {_json_type(value)} ({_short(value)}), but the column is {expected}",
    )


def _rule(feature: Feature) -> _Rule:
    name, dtype = feature.name, feature.dtype
    if not feature.is_scalar or dtype in ("image", "video"):
        raise ShardfeedError(
            f"the jsonl source cannot fill feature {name!r} ({dtype}, shape {list(feature.shape)}): "
            "only scalar bool, integer, float and string features"
        )
    if dtype == "bool":

        def rule(v: Any) -> tuple[Any, int]:
            if isinstance(v, bool):
                return v, 1
            raise _mismatch(name, v, "bool")

    elif dtype.startswith(("int", "uint")):
        info, width = np.iinfo(dtype), np.dtype(dtype).itemsize

        def rule(v: Any) -> tuple[Any, int]:
            if not isinstance(v, int) or isinstance(v, bool):
                raise _mismatch(name, v, dtype)
            if not info.min <= v <= info.max:
                raise RejectError(
                    "field_type", f"field {name!r} = {_short(v)} does not fit {dtype}"
                )
            return v, width

    elif dtype.startswith("float"):
        width = np.dtype(dtype).itemsize

        def rule(v: Any) -> tuple[Any, int]:
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                raise _mismatch(name, v, dtype)
            try:
                return float(v), width
            except OverflowError:
                raise RejectError(
                    "field_type", f"field {name!r} = {_short(v)} does not fit {dtype}"
                ) from None

    elif feature.extra.get("encoding") == "json":
        # --unify-schemas: a key whose kind differs across files holds any value as JSON text
        any_value = feature.extra.get("unified") == "any"

        def rule(v: Any) -> tuple[Any, int]:
            if not any_value and not isinstance(v, (dict, list)):
                raise _mismatch(name, v, "nested JSON (object or array)")
            try:
                text = _ENCODER.encode(v)
            except ValueError:
                raise RejectError(
                    "json_invalid", f"field {name!r} holds a number out of JSON's range"
                ) from None
            except RecursionError:
                raise RejectError("json_invalid", f"field {name!r} is nested too deeply") from None
            return text, _utf8_len(name, text)

    else:

        def rule(v: Any) -> tuple[Any, int]:
            if not isinstance(v, str):
                raise _mismatch(name, v, "string")
            return v, _utf8_len(name, v)

    return rule


class _Converter:
    """Checks one record against a spec and returns its column values and payload bytes."""

    def __init__(self, spec: FeatureSpec, text_field: str) -> None:
        if text_field not in spec:
            raise ShardfeedError(
                f"the spec has no text field {text_field!r} (features: {spec.names})"
            )
        text = spec[text_field]
        if text.dtype != "string" or text.extra.get("encoding") == "json":
            raise ShardfeedError(f"text field {text_field!r} must be a plain string feature")
        self.text_field = text_field
        self.names = [f.name for f in spec.stored]
        self.rules = [_rule(f) for f in spec.stored]

    def __call__(self, record: Mapping[str, Any]) -> tuple[list[Any], int]:
        text = record.get(self.text_field)
        if text is None:
            state = "null" if self.text_field in record else "missing"
            raise RejectError("field_missing", f"text field {self.text_field!r} is {state}")
        if not isinstance(text, str):
            raise _mismatch(self.text_field, text, "a string (the text field)")
        values, payload = [], 0
        for name, rule in zip(self.names, self.rules, strict=True):
            value = record.get(name)
            if value is None:
                values.append(None)
                continue
            converted, size = rule(value)
            values.append(converted)
            payload += size
        return values, payload

"""Strict accessors for untrusted JSON: every failure names the field it came from."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from shardfeed.schemas.errors import SchemaError

T = TypeVar("T")
_VERSION_RE = re.compile(r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)", re.ASCII)
_TYPE_NAMES = {
    int: "integer",
    float: "number",
    str: "string",
    bool: "boolean",
    list: "array",
    dict: "object",
}


def _type_ok(value: Any, kind: type | tuple[type, ...]) -> bool:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        return False  # JSON true is not an integer
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        return True
    return isinstance(value, kinds)


def get(
    obj: dict[str, Any],
    key: str,
    kind: type | tuple[type, ...],
    where: str,
    *,
    optional: bool = False,
    default: Any = None,
    nullable: bool = False,
) -> Any:
    """Return ``obj[key]`` checked against ``kind``; raise SchemaError naming ``where.key``."""
    field = f"{where}.{key}" if where else key
    if key not in obj:
        if optional:
            return default
        raise SchemaError(field, "is missing")
    value = obj[key]
    if value is None and nullable:
        return None
    if not _type_ok(value, kind):
        kinds = kind if isinstance(kind, tuple) else (kind,)
        expected = " or ".join(_TYPE_NAMES.get(k, k.__name__) for k in kinds)
        raise SchemaError(field, f"expected {expected}, got {type(value).__name__} {value!r:.60}")
    return value


def count(obj: dict[str, Any], key: str, where: str) -> int:
    """A required non-negative integer field."""
    return non_negative(get(obj, key, int, where), f"{where}.{key}" if where else key)


def item_count(value: Any, field: str) -> int:
    """A non-negative integer array element."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise SchemaError(field, f"expected integer, got {type(value).__name__} {value!r:.60}")
    return non_negative(value, field)


def non_negative(value: int, field: str) -> int:
    if value < 0:
        raise SchemaError(field, f"must be >= 0, got {value}")
    return value


def require_object(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SchemaError(field or "<root>", f"expected object, got {type(value).__name__}")
    return value


def parse_version(value: str, field: str, supported_major: int) -> tuple[int, int]:
    """Parse 'MAJOR.MINOR'; refuse an unknown major version."""
    match = _VERSION_RE.fullmatch(value)
    if match is None:
        raise SchemaError(field, f"expected 'MAJOR.MINOR' in ASCII digits, got {value!r:.40}")
    major, minor = int(match.group(1)), int(match.group(2))
    if major != supported_major:
        raise SchemaError(
            field, f"unsupported major version {major} (this shardfeed reads {supported_major}.x)"
        )
    return major, minor


_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]|[\ud800-\udfff]")
_SURROGATE_BYTES = re.compile(rb"\\u[dD][89a-fA-F]")


def _nodes(value: Any, where: str) -> Iterator[tuple[Any, str]]:
    """Every value, key and container of a decoded JSON document with its field path (a key
    comes before its value; the root's path is ``where``, or ``<root>`` when empty)."""
    stack = [(value, where)]
    while stack:
        node, field = stack.pop()
        yield node, field or "<root>"
        if isinstance(node, dict):
            for key, child in node.items():
                path = f"{field}.{key}" if field else str(key)
                stack += [(child, path), (key, field)]  # the key is popped first
        elif isinstance(node, list):
            stack += [(child, f"{field}[{i}]") for i, child in enumerate(node)]


def check_unicode(value: Any, where: str = "") -> None:
    """Refuse a lone surrogate (JSON allows ``"\\ud800"``) in any key or string of a decoded
    document: it cannot be written as UTF-8, so it would fail later, far from the parser."""
    for node, field in _nodes(value, where):
        if isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError as err:
                raise SchemaError(
                    field, f"is not valid Unicode ({err.reason} at {err.start})"
                ) from None


def check_finite(value: Any, where: str) -> None:
    """Refuse NaN or an infinity anywhere in a decoded JSON value: Python's decoder accepts
    ``NaN`` and ``Infinity``, which no other JSON reader does, and NaN breaks equality."""
    for node, field in _nodes(value, where):
        if isinstance(node, float) and not math.isfinite(node):
            raise SchemaError(field, f"is {node!r}, not a finite number")


def may_hold_surrogate(text: str | bytes) -> bool:
    """Whether a JSON text may hold a lone surrogate: only an escape (a backslash) or, in a str, a
    non-ASCII character can. Both tests run at memory speed (a one-character search is a
    ``memchr``); the pattern search they spare cost as much as parsing a 20,000-shard manifest."""
    if isinstance(text, str):
        if text.isascii() and "\\" not in text:
            return False
        return _SURROGATE.search(text) is not None
    return b"\\" in text and _SURROGATE_BYTES.search(text) is not None


def load_document(text: str | bytes, source: str, parse: Callable[[Any], T]) -> T:
    """Parse a JSON document with ``parse``; errors name the file and the field.

    Raises only :class:`SchemaError` (``UnsafePathError`` for a path), also for bytes that are
    not UTF-8, nest too deeply for the JSON decoder, or hold a lone surrogate.
    """
    try:
        obj = json.loads(text)
    except (ValueError, UnicodeDecodeError) as err:
        raise SchemaError("<root>", f"not valid JSON ({err})", source=source) from None
    except RecursionError:
        raise SchemaError("<root>", "not valid JSON (nested too deeply)", source=source) from None
    try:
        if may_hold_surrogate(text):
            check_unicode(obj)
        return parse(obj)
    except SchemaError as err:
        raise err.with_source(source) from None


class JsonDocument:
    """``dumps``/``loads`` for the small JSON headers planners write: subclasses define
    ``to_json`` and a ``from_json`` classmethod; ``loads`` names the file in every error."""

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1) + "\n"  # type: ignore[attr-defined]

    @classmethod
    def loads(cls: type[T], text: str | bytes, source: str) -> T:
        return load_document(text, source, cls.from_json)  # type: ignore[attr-defined]

"""Text checks: strict UTF-8 decoding of raw bytes, and string-typed JSON values.

Both raise :class:`~shardfeed.schemas.rejects.RejectError`: ``utf8_invalid`` for bytes (or lone
surrogates) that are not UTF-8, ``field_type`` for a JSON value that is not a string.
"""

from __future__ import annotations

from typing import Any

from shardfeed.schemas.rejects import RejectError


def decode_utf8(data: bytes) -> str:
    """Decode strict UTF-8 (no replacement characters; a leading BOM is kept as U+FEFF)."""
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as e:
        bad = bytes(data[e.start : min(e.end, e.start + 4)]).hex(" ")
        raise RejectError(
            "utf8_invalid", f"invalid UTF-8 at byte offset {e.start} ({e.reason}: {bad})"
        ) from e


def check_text(value: Any, field: str = "text") -> str:
    """Return ``value`` if it is a string that UTF-8 can encode, else raise a RejectError.

    JSON allows ``"\\ud800"`` escapes that decode to lone surrogates; Arrow (and any UTF-8 writer)
    cannot store them, so they are rejected as ``utf8_invalid`` with their character offset.
    """
    if not isinstance(value, str):
        raise RejectError(
            "field_type", f"field {field!r} must be a string, got {_json_type(value)}"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RejectError(
            "utf8_invalid",
            f"field {field!r} holds a lone surrogate U+{ord(value[e.start]):04X} "
            f"at character offset {e.start}",
        ) from e
    return value


def _json_type(value: Any) -> str:
    """The JSON name of a decoded value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__

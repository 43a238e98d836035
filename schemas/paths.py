"""Relative paths inside a dataset: refuse anything that could escape the root."""

from __future__ import annotations

import os
from urllib.parse import unquote

from shardfeed.schemas.errors import UnsafePathError


def check_relative_path(path: str, field: str) -> str:
    """Return ``path`` if it is a clean POSIX path relative to the dataset root, else raise.

    Refused: empty, absolute (``/x``, ``C:\\x``), backslashes, ``.``/``..``/empty segments, NUL, and
    percent-encoded forms of those (``%2e%2e``), which object stores would decode; and a string
    that is not valid Unicode (a lone surrogate). Raises only :class:`UnsafePathError`.
    """
    if not isinstance(path, str) or not path:
        raise UnsafePathError(field, "path must be a non-empty string")
    if not path.isascii():
        try:
            path.encode("utf-8")  # a lone surrogate (JSON allows "\ud800") names no file
        except UnicodeEncodeError as err:
            raise UnsafePathError(
                field, f"path {path!r:.80} is not valid Unicode ({err.reason} at {err.start})"
            ) from None
    # only a path with a '%' can decode to something else (this runs once per file read)
    for candidate in percent_decodings(path) if "%" in path else (path,):
        if "\x00" in candidate or "\\" in candidate:
            raise UnsafePathError(field, f"path {path!r} contains a NUL or backslash")
        if candidate.startswith("/") or (len(candidate) > 1 and candidate[1] == ":"):
            raise UnsafePathError(
                field, f"path {path!r} is absolute; paths must be relative to the dataset root"
            )
        parts = candidate.split("/")
        if any(part in ("", ".", "..") for part in parts):
            raise UnsafePathError(
                field, f"path {path!r} escapes or is not normalised ('..', '.' or empty segment)"
            )
    return path


def percent_decodings(path: str) -> list[str]:
    """``path`` and each percent-decoding of it until nothing changes (``%252e`` is ``%2e``
    once decoded, ``.`` twice: a layer that decodes again must not see an escape either)."""
    forms = [path]
    while "%" in forms[-1] and len(forms) < 8:
        decoded = unquote(forms[-1])
        if decoded == forms[-1]:
            break
        forms.append(decoded)
    return forms


def resolve_within(root: str, path: str, field: str, *, real_root: str | None = None) -> str:
    """Join a checked relative path to a local root and refuse it if symlinks lead outside the root.

    ``real_root`` is ``os.path.realpath(root)`` when the caller has it already (a hot loop).
    """
    check_relative_path(path, field)
    real_root = real_root or os.path.realpath(root)
    real = os.path.realpath(os.path.join(real_root, path))
    if real != real_root and not real.startswith(real_root + os.sep):
        raise UnsafePathError(field, f"path {path!r} resolves outside the dataset root (symlink?)")
    return real

"""Path templates read from dataset metadata (LeRobot ``info.json``'s ``data_path`` and
``video_path``): checked before anything is expanded.

A template is input data. ``str.format`` on it honours attribute and index lookups
(``{chunk_index.__class__}``, ``{x[0]}``) and widths of any size (``{chunk_index:>999999999}``
builds a string of a gigabyte before any path check). So a template may name only the
placeholders LeRobot defines, each bare or with a zero-padded integer width of at most
:data:`MAX_WIDTH` (``{chunk_index:03d}``); anything else is a :class:`SchemaError` naming the field.
"""

from __future__ import annotations

import functools
import re
import string
from typing import Any

from shardfeed.schemas.errors import SchemaError
from shardfeed.schemas.paths import check_relative_path

#: every placeholder a LeRobot path template uses (v3.0: chunk and file; v2.1: episode)
INTEGER_PLACEHOLDERS = frozenset({"chunk_index", "file_index", "episode_chunk", "episode_index"})
TEXT_PLACEHOLDERS = frozenset({"video_key"})
MAX_WIDTH = 20  # digits: a 64-bit integer has at most 20
MAX_TEMPLATE_CHARS = 1024
_INTEGER_SPEC = re.compile(r"(0?)([0-9]{0,2})d?")


def check_template(template: str, field: str, required: tuple[str, ...] = ()) -> str:
    """Return ``template`` if it names only known placeholders (with at most a zero-padded
    integer width) and every one of ``required``, and is a safe relative path; else raise."""
    if len(template) > MAX_TEMPLATE_CHARS:
        raise SchemaError(
            field, f"template is {len(template)} characters, over {MAX_TEMPLATE_CHARS}"
        )
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as err:
        raise SchemaError(field, f"template {template!r} is malformed: {err}") from None
    named = set()
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        known = sorted(INTEGER_PLACEHOLDERS | TEXT_PLACEHOLDERS)
        if name not in INTEGER_PLACEHOLDERS and name not in TEXT_PLACEHOLDERS:
            raise SchemaError(
                field, f"template {template!r}: placeholder {{{name}}} is not one of {known}"
            )
        if conversion is not None:
            raise SchemaError(field, f"template {template!r}: {{{name}!{conversion}}} is refused")
        if name in TEXT_PLACEHOLDERS and spec:
            raise SchemaError(field, f"template {template!r}: {{{name}}} takes no format spec")
        match = _INTEGER_SPEC.fullmatch(spec or "")
        if match is None or int(match.group(2) or 0) > MAX_WIDTH:
            raise SchemaError(
                field,
                f"template {template!r}: {{{name}:{spec}}} is refused; a placeholder takes at "
                f"most a zero-padded integer width of {MAX_WIDTH} (e.g. {{{name}:03d}})",
            )
        named.add(name)
    missing = [f"{{{name}}}" for name in required if name not in named]
    if missing:
        raise SchemaError(field, f"template {template!r} lacks {missing}")
    check_relative_path(template, field)
    return template


@functools.lru_cache(maxsize=64)
def _checked(template: str, field: str) -> str:
    return check_template(template, field)


def expand(template: str, field: str, **values: Any) -> str:
    """The path ``template`` names for ``values``: the template checked first (once per
    template), the result checked to be a safe relative path."""
    _checked(template, field)
    try:
        path = template.format(**values)
    except (KeyError, ValueError) as err:
        raise SchemaError(field, f"cannot expand template {template!r}: {err!r}") from None
    return check_relative_path(path, field)

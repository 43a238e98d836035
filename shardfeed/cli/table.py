"""The CLI's text tables: each column as wide as its widest cell, numbers right-aligned."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Note", "format_table"]

#: a cell that reads as a number: 1,234  0.9876  12.5%  95.4 MiB  3.2s  [-] and "-" for none
_NUMBER = re.compile(r"^(-|[-+]?[\d,]*\.?\d+ ?(%|[KMGTP]?i?B|s|x)?)$")


@dataclass(frozen=True)
class Note:
    """A free line inside a table, starting where column ``column`` starts; it sizes nothing."""

    text: str
    column: int = 0


def format_table(
    headers: Sequence[str] | None,
    rows: Sequence[Sequence[object] | Note],
    align: str | None = None,
    *,
    indent: str = "  ",
    gap: str = "  ",
) -> list[str]:
    """The lines of a table: ``headers`` (None for no header line), then one line per row.

    Every column is ``max(len(header), len(cell))`` wide, so its cells start at the same offset
    on every line. ``align`` holds one ``<`` or ``>`` per column; by default a column is
    right-aligned when all its cells read as numbers (``1,234``, ``12.5%``, ``95.4 MiB``, ``-``).
    A left-aligned last column is not padded, and lines carry no trailing blanks."""
    cells = [[str(c) for c in row] for row in rows if not isinstance(row, Note)]
    head = list(headers) if headers is not None else None
    if head is None and not cells:  # nothing to size
        return [(indent + row.text).rstrip() for row in rows if isinstance(row, Note)]
    count = max([len(head or ())] + [len(row) for row in cells])
    if align is None:
        align = "".join(
            ">" if column and all(_NUMBER.match(c) for c in column) else "<"
            for column in ([row[i] for row in cells if i < len(row)] for i in range(count))
        )
    if len(align) != count or set(align) - {"<", ">"}:
        raise ValueError(f"align needs one '<' or '>' per column ({count}), got {align!r}")
    widths = [
        max(
            [len(head[i]) if head and i < len(head) else 0]
            + [len(r[i]) for r in cells if i < len(r)]
        )
        for i in range(count)
    ]

    def line(row: Sequence[str]) -> str:
        last = max((i for i, c in enumerate(row) if c), default=-1)
        out = []
        for i, cell in enumerate(row[: last + 1]):
            if align[i] == ">":
                out.append(cell.rjust(widths[i]))
            else:
                out.append(cell if i == last else cell.ljust(widths[i]))
        return indent + gap.join(out)

    lines = [] if head is None else [line(head)]
    for row in rows:
        if isinstance(row, Note):
            offset = sum(widths[: row.column]) + len(gap) * row.column
            lines.append((indent + " " * offset + row.text).rstrip())
        else:
            lines.append(line([str(c) for c in row]))
    return lines

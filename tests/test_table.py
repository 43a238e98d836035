"""Text tables size their columns from the data: long shard paths and reject reasons keep every
column where the header puts it."""

from __future__ import annotations

import msgspec
import pytest

from shardfeed import open_dataset
from shardfeed.cli.inspect_cmd import render
from shardfeed.cli.table import Note, format_table
from shardfeed.schemas import Rejects
from shardfeed.summary import dataset_summary

LONG_REASON = "a_reason_longer_than_twenty_characters"  # inspect printed reasons in 20 columns


def spans(line: str, cells: list[str]) -> list[tuple[int, int]]:
    """Where each cell sits in ``line``, found left to right."""
    out, pos = [], 0
    for cell in cells:
        start = line.index(cell, pos)
        out.append((start, start + len(cell)))
        pos = start + len(cell)
    return out


def assert_aligned(header: tuple[int, int], cell: tuple[int, int], align: str) -> None:
    """A left-aligned cell starts where its header starts; a right-aligned one ends where its
    header ends."""
    assert (cell[0] == header[0]) if align == "<" else (cell[1] == header[1]), (header, cell)


def test_columns_are_as_wide_as_their_widest_cell():
    rows = [
        ("data/chunk-000/a-very-long-shard-name-past-34-columns.parquet", "1,234", LONG_REASON),
        ("b", "5", "x"),
        ("c", "-", ""),
    ]
    lines = format_table(("path", "rows", "reason"), rows)
    head = spans(lines[0], ["path", "rows", "reason"])
    for line, row in zip(lines[1:], rows, strict=True):
        cells = [c for c in row if c]
        for h, c, a in zip(head, spans(line, cells), "<><", strict=False):
            assert_aligned(h, c, a)  # numbers right-aligned by default, text left
    assert lines[0] == "  " + "path".ljust(len(rows[0][0])) + "  " + " rows" + "  reason"
    assert lines[3] == lines[3].rstrip() and lines[3].endswith("-")  # no trailing blanks


def test_alignment_notes_and_bad_align():
    lines = format_table(("a", "n"), [("xyz", 7), Note("under n", column=1), ("", 10)], "<>")
    assert lines == ["  a     n", "  xyz   7", "       under n", "       10"]
    assert format_table(None, [("k", "v")], indent="") == ["k  v"]
    assert format_table(None, [], "<>") == []  # e.g. no rejects by reason
    assert format_table(("a", "n"), [], "<>") == ["  a  n"]
    with pytest.raises(ValueError, match="one '<' or '>' per column"):
        format_table(("a", "b"), [("x", "y")], "<")


def test_inspect_keeps_columns_aligned_with_long_paths_and_reasons(make_small_dataset):
    root, _, _ = make_small_dataset(rejects=Rejects(5, {LONG_REASON: 2, "short": 3}))
    with open_dataset(root, use_locations=False) as ds:
        summary = dataset_summary(ds.manifest, ds.info)
        shards = [
            msgspec.structs.replace(s, path=f"data/chunk-000/{'x' * (30 + 7 * i)}-{i}.parquet")
            for i, s in enumerate(ds.manifest.shards)
        ]
    assert all(len(s.path) > 34 for s in shards)
    lines = render("ds", summary, shards, -1).splitlines()

    # the shard table: every row's columns at the header's offsets
    at = lines.index("shards")
    header = ["path", "rows", "groups", "bytes", "payload", "index range"]
    head = spans(lines[at + 1], header)
    for line, shard in zip(lines[at + 2 :], shards, strict=True):
        line_cells = spans(line, [shard.path, f"{shard.rows:,}", str(len(shard.row_groups))])
        for h, c, a in zip(head, line_cells, "<>>", strict=False):
            assert_aligned(h, c, a)
        span = f"[{shard.index_start}, {shard.index_end})"
        assert line.index(span) == head[5][0] and line.endswith(span)

    # the reject counts: the counts end in one column, after the longest reason
    at = next(i for i, line in enumerate(lines) if line.startswith("rejects"))
    reasons = lines[at + 1 : at + 3]
    assert [r.split() for r in reasons] == [[LONG_REASON, "2"], ["short", "3"]]
    assert len({len(r) for r in reasons}) == 1 and reasons[1].startswith("  short ")

"""``shardfeed rejects DATASET``: list the input records a conversion refused, and why."""

from __future__ import annotations

import argparse
import sys

from shardfeed.cli._common import EXIT_OK, print_json
from shardfeed.cli.table import format_table
from shardfeed.formats.rejects import REJECTS_DIR, RejectListing, list_rejects
from shardfeed.schemas.rejects import REASONS, RejectRecord


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "rejects",
        help="list the input records a conversion refused (source, position, reason, message)",
        description=(
            f"List the reject records under {REJECTS_DIR}/ with a count per reason. Only files the "
            "manifest lists are read, and each is checked against its size and sha256 first."
        ),
    )
    parser.add_argument("dataset", help="dataset directory or URI")
    parser.add_argument(
        "--reason",
        action="append",
        metavar="R",
        help="only rejects with this reason code, e.g. json_invalid (repeatable)",
    )
    parser.add_argument(
        "--limit",
        type=_non_negative,
        metavar="N",
        help="list at most N records (the counts still cover all of them; default: all)",
    )
    parser.add_argument(
        "--json", action="store_true", help='print {"total", "by_reason", "rejects": [...]}'
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    listing = list_rejects(args.dataset, reasons=args.reason, limit=args.limit)
    if listing.unlisted:
        print(
            f"shardfeed: note: ignored {len(listing.unlisted)} file(s) under {REJECTS_DIR}/ that the "
            f"manifest does not list: {', '.join(listing.unlisted)}",
            file=sys.stderr,
        )
    if args.json:
        print_json(listing.to_json())
    else:
        print(render(args.dataset, listing, args.reason))
    return EXIT_OK


def render(name: str, listing: RejectListing, reasons: list[str] | None) -> str:
    """The human listing: a header with the count per reason, then one line per record."""
    everything = ", ".join(f"{_printable(r)} {n:,}" for r, n in listing.recorded_by_reason.items())
    wanted = f" with reason {' or '.join(reasons)}" if reasons else ""
    if listing.total == 0:
        if reasons and listing.recorded_total:
            return f"no rejects{wanted} in {name} ({listing.recorded_total:,} in all: {everything})"
        return f"no rejects in {name}: every input record was converted"
    of = f" of {listing.recorded_total:,}" if reasons else ""
    noun = "reject" if listing.total == 1 else "rejects"
    lines = [f"{listing.total:,}{of} {noun}{wanted} in {name}"]
    counts = [(_printable(r), f"{n:,}", REASONS.get(r, "")) for r, n in listing.by_reason.items()]
    lines += format_table(None, counts, "<><")
    if not listing.stored:
        lines += [
            "",
            "(counts only: the manifest lists no reject files, so there are no records to show)",
        ]
        return "\n".join(lines)
    if listing.rejects:
        rows = [_row(r) for r in listing.rejects]
        lines.append("")
        lines += format_table(("source", "position", "reason", "message"), rows, "<<<<", indent="")
    hidden = listing.total - len(listing.rejects)
    if hidden:
        lines += ["", f"... and {hidden:,} more (raise --limit to list them)"]
    return "\n".join(lines)


def _row(reject: RejectRecord) -> tuple[str, str, str, str]:
    return (
        _printable(reject.source),
        _printable(reject.position) or "-",
        _printable(reject.reason),
        _printable(reject.message),
    )


def _printable(text: str) -> str:
    """One table cell: control characters (newlines, escapes from the data) are shown escaped."""
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
    )

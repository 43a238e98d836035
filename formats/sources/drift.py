"""Schema drift across files, decided the same way for every source typed from its data.

A field's values vote for their kind, and each file (or piece of one) for its own majority kind.
Where files hold different majority kinds and the minority kinds hold more than
:data:`DRIFT_SHARE` of all values, the files disagree on the field's type (ExampleGen outputs of
different versions, JSONL dumps of different producers): the conversion stops with one line
naming the field, each kind's record count and example files, and what ``--unify-schemas`` would
do. Otherwise the odd values are stray records, rejected one by one (``field_type``), however
messy one file is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

#: a minority kind above this share of a field's values is schema drift, not stray records
DRIFT_SHARE = 0.05
#: files named per field and kind in a drift message
EXAMPLE_FILES = 2

#: ``files[field][kind]``: the first few files (sorted) holding that kind
ExampleFiles = Mapping[str, Mapping[str, Sequence[str]]]


def example_files(file: str, kinds: Mapping[str, Mapping[str, int]]) -> dict:
    """One file's :data:`ExampleFiles`: it holds every kind it counted."""
    return {name: {kind: [file] for kind, n in held.items() if n} for name, held in kinds.items()}


def file_majority(name_kinds: Mapping[str, Mapping[str, int]], resolve) -> dict:
    """One file's majority kind per field, as counts to sum across files:
    ``{field: {resolve(counts): 1}}``."""
    return {name: {resolve(held): 1} for name, held in name_kinds.items() if any(held.values())}


def merge_counts(a: Mapping[str, Mapping[str, int]], b: Mapping[str, Mapping[str, int]]) -> dict:
    """Per-field per-kind counts of two fragments, summed."""
    out = {name: dict(kinds) for name, kinds in a.items()}
    for name, kinds in b.items():
        into = out.setdefault(name, {})
        for kind, n in kinds.items():
            into[kind] = into.get(kind, 0) + n
    return out


def merge_example_files(a: ExampleFiles, b: ExampleFiles) -> dict:
    """The union of two fragments, keeping the first :data:`EXAMPLE_FILES` names per kind."""
    out = {name: {kind: list(files) for kind, files in kinds.items()} for name, kinds in a.items()}
    for name, kinds in b.items():
        for kind, files in kinds.items():
            into = out.setdefault(name, {}).setdefault(kind, [])
            into[:] = sorted(set(into) | set(files))[:EXAMPLE_FILES]
    return out


def drifts(votes: Mapping[str, int], winner: str, majorities: Mapping[str, int]) -> bool:
    """Whether files disagree on a field: they hold different majority kinds, and the kinds
    other than ``winner`` hold more than :data:`DRIFT_SHARE` of the values."""
    if sum(1 for n in majorities.values() if n) < 2:
        return False
    total = sum(votes.values())
    return sum(n for kind, n in votes.items() if kind != winner) > DRIFT_SHARE * total


def describe(
    name: str, votes: Mapping[str, int], examples: Mapping[str, Sequence[str]], remedy: str
) -> str:
    """The one-line drift message: ``feature 'x' differs across files: int64 in 1,000 records
    (e.g. a, b); float in 900 records (e.g. c); REMEDY``."""
    held = "; ".join(
        f"{kind} in {n:,} records (e.g. {', '.join(examples.get(kind, [])) or '?'})"
        for kind, n in votes.items()
        if n
    )
    return f"feature {name!r} differs across files: {held}; {remedy}"

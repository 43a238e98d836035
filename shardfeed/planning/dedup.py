"""Exact deduplication by content hash (``convert --dedup``): the first occurrence in source order
wins, every later copy is a :class:`Duplicate` naming it.

Pure: no files, no Beam. The conversion graph (``shardfeed.pipelines.dedup``) calls
:func:`first_occurrences` once per group of units whose content hashes share a prefix, so every
copy of one content meets in one call.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar


class HashedUnit(Protocol):
    """What dedup needs of a unit: its content hash and its place in source order."""

    @property
    def file(self) -> str: ...

    @property
    def position(self) -> int: ...

    @property
    def content_hash(self) -> str: ...


U = TypeVar("U", bound=HashedUnit)


@dataclass(frozen=True)
class Duplicate(Generic[U]):
    """``unit`` holds exactly the content of ``first``, which comes before it in source order."""

    unit: U
    first: U


def source_order(unit: HashedUnit) -> tuple[str, int]:
    """Source order: root-relative file path (``files()`` is sorted), then position inside it."""
    return unit.file, unit.position


def first_occurrences(units: Iterable[U]) -> tuple[list[U], list[Duplicate[U]]]:
    """``(kept, duplicates)``, both in source order: ``kept`` holds the first unit of each content
    hash, ``duplicates`` every other unit with the first one it copies (never a chain: a third
    copy names the first, not the second). The result does not depend on the input order.

    Raises ``ValueError`` if two units claim one ``(file, position)``."""
    ordered = sorted(units, key=source_order)
    first: dict[str, U] = {}
    kept: list[U] = []
    duplicates: list[Duplicate[U]] = []
    previous: tuple[str, int] | None = None
    for unit in ordered:
        place = source_order(unit)
        if place == previous:
            raise ValueError(f"two units at {unit.file!r} position {unit.position}")
        previous = place
        original = first.setdefault(unit.content_hash, unit)
        if original is unit:
            kept.append(unit)
        else:
            duplicates.append(Duplicate(unit, original))
    return kept, duplicates

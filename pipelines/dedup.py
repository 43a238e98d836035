"""``convert --dedup`` in the conversion graph, between the scan and the plan.

The scan wrote each file's unit table (content hash per unit). Dedup then needs every copy of a
content in one place, but never the whole corpus in one place:

1. ``HashParts``: scanned file -> (hash prefix, [unit]) for each of :data:`HASH_PARTS` prefixes the
   file has units in (one element per file and prefix, not per unit).
2. ``GroupByHash``: all units whose hashes share a prefix meet; :func:`first_occurrences` keeps the
   first of each content in source order and names the rest -> (file, [duplicate]) per file.
3. ``GroupByFile`` (joined with every scanned file): each file drops its duplicates from its unit
   table and bucket totals and writes them, in position order, to a ``duplicates`` work part.

The plan then sees only kept units, so shard sizes, ``index`` and episode numbering follow as if
the copies never existed, and copies count toward nothing (not the reject fraction). The driver
concatenates the parts in source order into ``meta/shardfeed/duplicates.jsonl``
(:func:`publish_duplicates`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.typehints.decorators import no_annotations

from shardfeed.formats.atomic import atomic_open
from shardfeed.formats.meta_writer import file_record
from shardfeed.formats.sources.base import SourceReader
from shardfeed.formats.store_path import StorePath
from shardfeed.formats.unit_table import (
    UNIT_SUFFIX,
    KeyedUnit,
    read_unit_table,
    read_unit_tuples,
    work_part,
    write_totals,
    write_unit_table,
)
from shardfeed.pipelines.worker_guard import guard_worker
from shardfeed.planning.dedup import first_occurrences
from shardfeed.schemas.manifest import DUPLICATES_PATH, FileRecord

if TYPE_CHECKING:  # convert.py wires this module in; a runtime import would be circular
    from shardfeed.pipelines.graph_config import GraphConfig

#: hash-prefix groups: a group holds about 1/256 of the units (all copies of a content are in one)
HASH_PARTS = 256
_SUFFIX = ".jsonl"

# a unit on its way to its hash group: (content hash, file, position, source name, position name),
# the names as ``shardfeed rejects`` gives them (``reject_location``)
HashedTuple = tuple[str, str, int, str, str]
# a duplicate on its way to its file: (position, source, at, first source, first at, content hash)
DuplicateTuple = tuple[int, str, str, str, str, str]


class _Hashed(tuple):
    """A :data:`HashedTuple` with the attribute names :func:`first_occurrences` reads."""

    __slots__ = ()
    content_hash = property(lambda self: self[0])
    file = property(lambda self: self[1])
    position = property(lambda self: self[2])


@no_annotations  # a SourceReader is a Protocol, which Beam 2.78's type check cannot compare
def hash_parts(
    file: str, source: SourceReader, config: GraphConfig
) -> Iterable[tuple[int, list[HashedTuple]]]:
    """scanned file -> (hash prefix, its units with that prefix) per prefix present."""
    guard_worker()
    locate = getattr(source, "reject_location", None)
    parts: dict[int, list[HashedTuple]] = {}
    for unit in read_unit_tuples(config.part("units", file, UNIT_SUFFIX)):
        ref = KeyedUnit.from_tuple(unit).ref
        where, at = locate(ref) if locate else (ref.file, str(ref.position))
        part = int(ref.content_hash[:8], 16) % HASH_PARTS
        parts.setdefault(part, []).append((ref.content_hash, ref.file, ref.position, where, at))
    yield from sorted(parts.items())


def find_duplicates(
    item: tuple[int, Iterable[list[HashedTuple]]],
) -> Iterable[tuple[str, list[DuplicateTuple]]]:
    """(hash prefix, [[unit], ...]) -> (file, its later copies) per file holding any."""
    _, groups = item
    _, duplicates = first_occurrences(_Hashed(u) for group in groups for u in group)
    by_file: dict[str, list[DuplicateTuple]] = {}
    for d in duplicates:
        copy, first = d.unit, d.first
        by_file.setdefault(copy.file, []).append(
            (copy.position, copy[3], copy[4], first[3], first[4], copy.content_hash)
        )
    yield from sorted(by_file.items())


def drop_duplicates(item: tuple[str, Iterable[list[DuplicateTuple]]], config: GraphConfig) -> str:
    """(file, [[duplicate], ...]) -> ``file``, once its unit table and totals hold only the units
    it keeps and its duplicates are written (position order) to its ``duplicates`` part."""
    file, groups = item
    records = sorted(d for group in groups for d in group)
    if records:
        path = config.part("units", file, UNIT_SUFFIX)
        table = read_unit_table(path)
        drop = pa.array(sorted({d[0] for d in records}), pa.int64())
        kept = table.filter(pc.invert(pc.is_in(table.column("position"), value_set=drop)))
        write_unit_table(path, kept)
        write_totals(config.part("totals", file, UNIT_SUFFIX), kept)
        body = "".join(duplicate_line(d) + "\n" for d in records)
        config.part("duplicates", file, _SUFFIX).write_bytes(body.encode(), durable=True)
        beam.metrics.Metrics.counter("shardfeed", "duplicates").inc(len(records))
    return file


def duplicate_line(d: DuplicateTuple) -> str:
    """One line of ``duplicates.jsonl`` (FORMAT.md §9): the copy, the first occurrence it repeats
    (named as ``shardfeed rejects`` names inputs) and their content hash."""
    _, where, at, first_where, first_at, digest = d
    record = {
        "source": where,
        "position": at,
        "duplicate_of": {"source": first_where, "position": first_at},
        "content_hash": digest,
    }
    return json.dumps(record, ensure_ascii=False, sort_keys=True)


def publish_duplicates(dst: str, work: StorePath, files: Sequence[str]) -> tuple[int, FileRecord]:
    """Concatenate the ``duplicates`` parts in source order into ``DST/duplicates.jsonl`` (written
    even when empty, so a ``--dedup`` dataset always says what it dropped); returns the number of
    duplicates and the file's manifest record."""
    total = 0
    with atomic_open(os.path.join(dst, DUPLICATES_PATH)) as out:
        for file in files:
            try:
                body = work_part(work, "duplicates", file, _SUFFIX).read_bytes()
            except FileNotFoundError:
                continue
            total += body.count(b"\n")
            out.write(body)
    return total, file_record(dst, DUPLICATES_PATH)


class DropDuplicates(beam.PTransform):
    """scanned file paths -> the same paths, once each file's later copies of an earlier unit are
    out of its unit table and written to its ``duplicates`` part."""

    def __init__(self, source: SourceReader, config: GraphConfig) -> None:
        super().__init__()
        self.source, self.config = source, config

    def expand(self, files: beam.PCollection) -> beam.PCollection:
        copies = (
            files
            # (hash prefix, [(hash, file, position, source, at)]) per file and prefix
            | "HashParts" >> beam.FlatMap(hash_parts, self.source, self.config)
            | "GroupByHash" >> beam.GroupByKey()
            # (hash prefix, [[unit], ...]) -> (file, [duplicate]) per file holding copies
            | "FindDuplicates" >> beam.FlatMap(find_duplicates)
        )
        every_file = files | "KeyByFile" >> beam.Map(_no_duplicates)
        return (
            (every_file, copies)
            | "Join" >> beam.Flatten()
            # (file, [[duplicate], ...]), one element per scanned file
            | "GroupByFile" >> beam.GroupByKey()
            | "DropCopies" >> beam.Map(drop_duplicates, self.config)
        )


def _no_duplicates(file: str) -> tuple[str, list[DuplicateTuple]]:
    return file, []


__all__ = ["HASH_PARTS", "DropDuplicates", "publish_duplicates"]

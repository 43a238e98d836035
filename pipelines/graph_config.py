"""What every step of a conversion graph shares: where its work files go and how it runs."""

from __future__ import annotations

from dataclasses import dataclass, field

from shardfeed.formats.publish import DatasetOptions
from shardfeed.formats.store_path import StorePath
from shardfeed.formats.unit_table import work_part

DEFAULT_PIECE_BYTES = 256 << 20  # a scan task's input: a few seconds of work, bounded memory
WORK_DIR = ".shardfeed-work"  # under DST while a run is in flight; removed after publishing
INTERRUPTED = "overwriting"  # under WORK_DIR: an --overwrite run had begun to replace a dataset
PREVIOUS = "previous-shards"  # sidecars of an interrupted run, under WORK_DIR, checked for reuse


@dataclass(frozen=True)
class GraphConfig:
    """``dst`` and ``work_root`` are paths every worker reaches the same way: local or shared
    POSIX paths, or object-store keys. The work dir is ``DST/.shardfeed-work`` unless
    ``work_root`` (``--temp_location``) puts it elsewhere."""

    dst: StorePath
    seed: int
    options: DatasetOptions
    #: one named split of ``convert --split``: its work dir is ``WORK_DIR/split-NAME``, and its
    #: shards, rows and episodes are numbered on from the previous splits'
    split: str | None = None
    #: input bytes per scan task: a larger JSONL, Parquet or TFRecord file or plain tar shard is
    #: scanned as several pieces;
    #: also the decoded bytes per spool segment
    piece_bytes: int = DEFAULT_PIECE_BYTES
    #: the plan is shuffled: spool segments are sorted by bucket, so that each shard (a range of
    #: buckets) reads one run of rows from each (``--no-shuffle`` keeps them in source order)
    sort_spools: bool = True
    shard_offset: int = 0
    row_offset: int = 0
    unit_offset: int = 0
    work_root: StorePath | None = None
    work: StorePath = field(init=False)

    def __post_init__(self) -> None:
        work = self.work_root or self.dst / WORK_DIR
        if self.split is not None:
            work = work / f"split-{self.split}"
        object.__setattr__(self, "work", work)

    def sidecar(self, number: int, *, previous: bool = False) -> StorePath:
        """Work path of shard ``number``'s JSON sidecar (its outcome and the digest of its inputs);
        ``previous``: the one an interrupted earlier run left, which this run may reuse."""
        return self.work / (PREVIOUS if previous else "shards") / f"{number:06d}.json"

    def part(self, kind: str, source_file: str, suffix: str) -> StorePath:
        """Work path of one source file's part (units, totals, rejects), named by a stable hash."""
        return work_part(self.work, kind, source_file, suffix)

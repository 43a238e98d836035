"""A published dataset as planners see it: where it is, its manifest, and its sample sizes."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from shardfeed.formats.reader import Dataset, load_manifest
from shardfeed.formats.sample_index import read_sample_bytes
from shardfeed.formats.storage import Location, locate
from shardfeed.planning.spans import RowBytes, Spans
from shardfeed.schemas.manifest import Manifest
from shardfeed.schemas.sidecar import DatasetRef


@dataclass(frozen=True)
class DatasetSource:
    """A dataset's location and manifest; planners check their files against :meth:`ref`."""

    location: Location
    manifest: Manifest

    @classmethod
    def of(cls, dataset: Dataset | str | os.PathLike[str]) -> DatasetSource:
        if isinstance(dataset, Dataset):
            return cls(dataset.location, dataset.manifest)
        location = locate(dataset)
        return cls(location, load_manifest(location))

    def ref(self) -> DatasetRef:
        m = self.manifest
        return DatasetRef(m.fingerprint, m.num_samples, len(m.shards))

    def row_bytes(self) -> RowBytes:
        """Every sample's payload bytes, from ``meta/shardfeed/samples.parquet``, and where each
        row group starts."""
        shards = self.manifest.shards
        rows = np.array([s.rows for s in shards], dtype=np.int64)
        sizes = read_sample_bytes(self.location, self.manifest)
        return RowBytes.from_sizes(sizes, rows, [s.row_groups for s in shards])

    def sequence(self, split: str | None = None) -> Spans:
        """Every row of every shard, in shard order; with ``split``, only the shards of that
        named split (``convert --split``). An unknown split is a ValueError naming the splits."""
        rows = np.array([s.rows for s in self.manifest.shards], dtype=np.int64)
        whole = Spans.whole_shards(rows)
        if split is None:
            return whole
        record = self.manifest.split(split)
        return whole.take(np.arange(record.shard_start, record.shard_end))

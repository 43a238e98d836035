"""tf.data adapter: one loader worker's batches of an epoch as a ``tf.data.Dataset``.

Needs the ``[tf]`` extra (tensorflow-cpu 2.16, tensorflow-io 0.37.1, so numpy < 2 and
pyarrow < 18: give it its own environment). ``tf_dataset`` takes ``ShardLoader``'s arguments and
reads exactly the spans ``ShardLoader`` would (``shardfeed.loader.streams.Stream``: the stored or
given assignment, else the in-memory ``pad`` plan), cut into batches at the same rows: every
``batch_size`` rows of the worker's stream, the remainder last. Elements are dicts of tensors:

- numbers: ``(N,)`` for scalars (shape ``[1]``) and ``(N, *shape)`` for tensors, in the
  feature's dtype (``tf.bool``, ``tf.int8`` ... ``tf.uint64``, ``tf.float16/32/64``);
- strings: ``tf.string`` (UTF-8); images: ``tf.string`` holding the encoded bytes as stored
  (``tf.io.decode_image`` decodes them).

Each column takes one of two routes (:func:`column_routes` says which, per column):

``"parquet"``: ``tfio.IODataset.from_parquet(shard, columns=...)`` per span, ``.skip(row_start)``
``.take(rows)``, the spans flat-mapped in order, then ``.batch(batch_size)``. What tensorflow-io
0.37.1 reads correctly from shardfeed's Parquet, found by trying every type:

- scalar ``bool``, ``int32``, ``int64``, ``float32``, ``float64``: as they are;
- scalar ``int8``, ``int16``, ``uint8``, ``uint16``, ``uint32`` (tfio gives Parquet's physical
  int32) and ``uint64`` (int64): cast back to the feature's dtype here (a bitcast for the
  unsigned 32- and 64-bit ones, so values past the signed range survive);
- ``string``: the column itself;
- ``image``: the struct's ``bytes`` leaf (tfio names it ``NAME.bytes``).

This route holds only when (else the column, or every column, goes the other way):

- the dataset uses the Parquet encoding and its shards are local files (a staged node or
  shared-tier copy counts: the shard is read where the reader would read it);
- no stored feature is ``float16``: opening a file with a Float16 column (scalar or tensor)
  crashes tensorflow-io 0.37.1 with a segmentation fault, whatever columns are asked for;
- the column has no nulls in the shards read, by the row-group statistics in their footers:
  tfio aborts the process on a null in a primitive or string column, and silently shifts the
  values of a struct child (an image) with nulls.

``"tfrecord"``: a dataset converted with ``--format tfrecord`` (FORMAT.md §16) whose shards are
local files is read by TensorFlow itself: ``tf.data.TFRecordDataset`` per span (GZIP for
``.tfrecord.gz``), ``.skip(row_start).take(rows)``, batched, then ``tf.io.parse_example`` with
:func:`parse_spec` and a cast back to each feature's dtype and shape. Every column goes this way.
A null string or image becomes ``b""``; a null number fails the parse.

``"generator"``: ``tf.data.Dataset.from_generator`` over a ``ShardLoader`` (same arguments,
these columns only). It takes everything else:

- fixed-size tensors (any shape but ``[1]``, stored as nested fixed-size lists): tfio exposes
  them only as their flattened leaf (``NAME.list.element``, one dataset element per value, so a
  96x96x3 image tensor would be 27,648 elements per row, and nulls would misalign rows);
- ``float16`` (above), columns with nulls, remote datasets, other encodings.

Both routes cut batches at the same rows, so they are zipped into one element. A null string or
image becomes ``b""`` on the generator route; a null number cannot be a tensor and raises.

``skip`` decodes the rows it passes over: a span starting at row ``r`` of its shard costs about
``r`` rows of reading on top of its own (about 1.5 µs a row here). The parquet route suits
scalar and short string columns; the generator route reads whole row groups ahead in threads.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow.parquet as pq

try:
    import tensorflow as tf
    import tensorflow_io as tfio
except ImportError as err:  # pragma: no cover - the main venv has no TensorFlow
    raise ImportError(
        "shardfeed.tf needs TensorFlow and tensorflow-io: pip install 'shardfeed[tf]' "
        "(in its own environment: it needs numpy < 2)"
    ) from err

from shardfeed.assignment import Assignment
from shardfeed.formats.reader import Dataset, open_dataset
from shardfeed.loader import ShardLoader
from shardfeed.loader.streams import Stream, as_world
from shardfeed.planning.assign import World
from shardfeed.schemas.features import Feature

__all__ = ["GENERATOR", "PARQUET", "TFRECORD", "column_routes", "parse_spec", "tf_dataset"]

PARQUET = "parquet"
TFRECORD = "tfrecord"
GENERATOR = "generator"
_TFRECORD_ENCODINGS = {"tfrecord": "", "tfrecord-gzip": "GZIP"}  # -> compression_type

#: feature dtype -> the dtype tfio 0.37.1 reads it as (Parquet's physical type)
_TFIO_DTYPES: dict[str, tf.DType] = {
    "bool": tf.bool,
    "int8": tf.int32,
    "int16": tf.int32,
    "int32": tf.int32,
    "int64": tf.int64,
    "uint8": tf.int32,
    "uint16": tf.int32,
    "uint32": tf.int32,
    "uint64": tf.int64,
    "float32": tf.float32,
    "float64": tf.float64,
    "string": tf.string,
    "image": tf.string,
}
_BITCAST = {"uint32", "uint64"}  # same width as what tfio returns, values past the signed range


def tf_dataset(
    dataset: Dataset | str | os.PathLike[str],
    *,
    rank: int,
    world: World | int,
    worker: int = 0,
    num_workers: int = 1,
    epoch: int = 0,
    seed: int = 0,
    batch_size: int,
    columns: Sequence[str] | None = None,
    assignment: Assignment | str | None = None,
) -> tf.data.Dataset:
    """Batches (dicts of tensors) of ``worker`` (of ``num_workers``) of ``rank`` in ``epoch``,
    the same rows ``ShardLoader`` with these arguments yields; see the module docstring."""
    ds = dataset if isinstance(dataset, Dataset) else open_dataset(dataset)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    names = _names(ds, columns)
    stream = Stream.open(
        ds,
        as_world(world, num_workers),
        rank,
        worker,
        epoch,
        seed=seed,
        batch_size=batch_size,
        assignment=assignment,
    )
    spans = stream.spans
    keep = spans.end > spans.start
    read = sorted(set(spans.shard[keep].tolist()))
    routes = column_routes(ds, names, shards=read)
    if all(routes[n] == TFRECORD for n in names):
        paths = [_local_path(ds, s) for s in spans.shard[keep].tolist()]
        return _tfrecord_batches(ds, names, paths, spans.start[keep], spans.rows[keep], batch_size)
    direct = [n for n in names if routes[n] == PARQUET]
    loaded = [n for n in names if routes[n] == GENERATOR]
    parts = []
    if direct:
        paths = [_local_path(ds, s) for s in spans.shard[keep].tolist()]
        parts.append(
            _parquet_batches(ds, direct, paths, spans.start[keep], spans.rows[keep], batch_size)
        )
    if loaded:
        loader_args = {
            "rank": rank,
            "world": world,
            "worker": worker,
            "num_workers": num_workers,
            "epoch": epoch,
            "seed": seed,
            "batch_size": batch_size,
            "assignment": assignment,
        }
        parts.append(_generator_batches(ds, loaded, loader_args))
    if len(parts) == 1:
        return parts[0]
    return tf.data.Dataset.zip(tuple(parts)).map(lambda a, b: {**a, **b})


def column_routes(
    dataset: Dataset | str | os.PathLike[str],
    columns: Sequence[str] | None = None,
    *,
    shards: Sequence[int] | None = None,
) -> dict[str, str]:
    """``{column: "parquet" | "generator"}``: how :func:`tf_dataset` reads each column from
    ``shards`` (positions in the manifest; default every shard), by the rules in the module
    docstring. Reads shard footers only."""
    ds = dataset if isinstance(dataset, Dataset) else open_dataset(dataset)
    names = _names(ds, columns)
    shards = range(len(ds.shards)) if shards is None else shards
    stored = ds.features.stored
    if ds.manifest.encoding in _TFRECORD_ENCODINGS:
        local = all(_local_path(ds, s) is not None for s in shards if ds.shards[s].rows)
        return dict.fromkeys(names, TFRECORD if local else GENERATOR)
    blocked = ds.manifest.encoding != "parquet" or any(f.dtype == "float16" for f in stored)
    paths = [] if blocked else [_local_path(ds, s) for s in shards if ds.shards[s].rows]
    if blocked or any(p is None for p in paths):
        return dict.fromkeys(names, GENERATOR)
    return {
        n: PARQUET
        if ds.features[n].dtype in _TFIO_DTYPES
        and not ds.features[n].is_tensor
        and all(_no_nulls(p, _leaf(ds.features[n])) for p in paths)
        else GENERATOR
        for n in names
    }


# -- the tfrecord route ------------------------------------------------------------------------


def parse_spec(
    dataset: Dataset | str | os.PathLike[str], columns: Sequence[str] | None = None
) -> dict[str, tf.io.FixedLenFeature]:
    """``tf.io.parse_example`` specs for a TFRecord dataset's features (FORMAT.md §16): numbers
    as flat ``[prod(shape)]`` float32 or int64 lists, strings and images as one ``tf.string``
    (``b""`` when null)."""
    ds = dataset if isinstance(dataset, Dataset) else open_dataset(dataset)
    out = {}
    for name in _names(ds, columns):
        f = ds.features[name]
        if f.is_numeric:
            kind = tf.float32 if f.dtype.startswith("float") else tf.int64
            out[name] = tf.io.FixedLenFeature([f.num_elements], kind)
        else:
            out[name] = tf.io.FixedLenFeature([], tf.string, default_value=b"")
    return out


def _tfrecord_batches(
    ds: Dataset,
    names: list[str],
    paths: list[str],
    starts: np.ndarray,
    rows: np.ndarray,
    batch_size: int,
) -> tf.data.Dataset:
    features = [ds.features[n] for n in names]
    spec = parse_spec(ds, names)
    compression = _TFRECORD_ENCODINGS[ds.manifest.encoding]

    def span(path: tf.Tensor, start: tf.Tensor, count: tf.Tensor) -> tf.data.Dataset:
        records = tf.data.TFRecordDataset(path, compression_type=compression)
        return records.skip(start).take(count)

    def convert(serialized: tf.Tensor) -> dict[str, tf.Tensor]:
        parsed = tf.io.parse_example(serialized, spec)
        return {f.name: _from_example(parsed[f.name], f) for f in features}

    return _spans(paths, starts, rows).flat_map(span).batch(batch_size).map(convert)


def _spans(paths: list[str], starts: np.ndarray, rows: np.ndarray) -> tf.data.Dataset:
    """One element per span, in stream order: (path, first row in the shard, rows)."""
    return tf.data.Dataset.from_tensor_slices(
        (
            tf.constant(paths, tf.string),
            tf.constant(starts, tf.int64),
            tf.constant(rows, tf.int64),
        )
    )


def _from_example(values: tf.Tensor, feature: Feature) -> tf.Tensor:
    """A parsed Example column back in the feature's dtype and ``(N, *shape)`` (or ``(N,)``)."""
    if not feature.is_numeric:
        return values
    shape = (-1,) if feature.is_scalar else (-1, *feature.shape)
    values = tf.reshape(values, shape)
    target = tf.as_dtype(feature.dtype)
    if feature.dtype == "uint64":
        return tf.bitcast(values, target)  # stored as its int64 bit pattern
    if feature.dtype == "bool":
        return tf.not_equal(values, 0)
    return tf.cast(values, target) if values.dtype != target else values


# -- the parquet route -------------------------------------------------------------------------


def _parquet_batches(
    ds: Dataset,
    names: list[str],
    paths: list[str],
    starts: np.ndarray,
    rows: np.ndarray,
    batch_size: int,
) -> tf.data.Dataset:
    features = [ds.features[n] for n in names]
    specs = {_leaf(f): tf.TensorSpec((), _TFIO_DTYPES[f.dtype]) for f in features}

    def span(path: tf.Tensor, start: tf.Tensor, count: tf.Tensor) -> tf.data.Dataset:
        # graph mode (inside flat_map): tfio wants the columns as a dict of TensorSpec
        return tfio.IODataset.from_parquet(path, columns=specs).skip(start).take(count)

    def convert(batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        return {f.name: _cast(batch[_leaf(f)], f) for f in features}

    # element: one row, {leaf: scalar}; then a batch, {column: (N,)}
    return _spans(paths, starts, rows).flat_map(span).batch(batch_size).map(convert)


def _cast(values: tf.Tensor, feature: Feature) -> tf.Tensor:
    target = tf.as_dtype(feature.dtype) if feature.is_numeric else tf.string
    if values.dtype == target:
        return values
    if feature.dtype in _BITCAST:
        return tf.bitcast(values, target)
    return tf.cast(values, target)


def _leaf(feature: Feature) -> str:
    """The Parquet leaf column tfio names for ``feature``."""
    return f"{feature.name}.bytes" if feature.dtype == "image" else feature.name


def _local_path(ds: Dataset, shard: int) -> str | None:
    """The local file ``shard`` is read from (a tier copy or the dataset), or None (remote)."""
    extent = ds.local_extent(shard, 0)
    return None if extent is None else extent[0]


@lru_cache(maxsize=4096)
def _footer(path: str, mtime_ns: int) -> pq.FileMetaData:
    return pq.read_metadata(path)


def _no_nulls(path: str, leaf: str) -> bool:
    """Whether every row group of ``path`` proves, by its statistics, ``leaf`` has no null."""
    meta = _footer(path, os.stat(path).st_mtime_ns)
    index = [meta.schema.column(i).path for i in range(meta.num_columns)].index(leaf)
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(index).statistics
        if stats is None or not stats.has_null_count or stats.null_count != 0:
            return False
    return True


# -- the generator route -----------------------------------------------------------------------


def _generator_batches(
    ds: Dataset, names: list[str], loader_args: dict[str, Any]
) -> tf.data.Dataset:
    features = [ds.features[n] for n in names]
    signature = {
        f.name: tf.TensorSpec(
            (None, *(() if f.is_scalar or not f.is_numeric else f.shape)),
            tf.as_dtype(f.dtype) if f.is_numeric else tf.string,
        )
        for f in features
    }

    def batches() -> Iterator[dict[str, np.ndarray]]:
        with ShardLoader(ds, columns=names, **loader_args) as loader:
            for batch in loader:
                yield {f.name: _to_tf_value(batch[f.name], f) for f in features}

    return tf.data.Dataset.from_generator(batches, output_signature=signature)


def _to_tf_value(values: np.ndarray, feature: Feature) -> np.ndarray:
    if not feature.is_numeric:  # str, memoryview or None -> bytes
        out = np.empty(len(values), dtype=object)
        out[:] = [
            b"" if v is None else v.encode() if isinstance(v, str) else bytes(v) for v in values
        ]
        return out
    if values.dtype != np.dtype(feature.dtype):
        raise ValueError(
            f"{feature.name}: a null {feature.dtype} value has no tensor form (tf.data)"
        )
    return values


def _names(ds: Dataset, columns: Sequence[str] | None) -> list[str]:
    stored = [f.name for f in ds.features.stored]
    if columns is None:
        return stored
    unknown = [c for c in columns if c not in stored]
    if unknown:
        raise KeyError(f"{ds.location.display} does not store {unknown}; it has {stored}")
    return list(columns)

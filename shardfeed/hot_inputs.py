"""Inputs of the hot index: per-sample weights and access logs, read and checked.

``--weights`` takes one of:
- ``column:NAME``: a numeric column of the dataset, one weight per sample;
- ``mixture:SRC=W,SRC=W`` (or just ``SRC=W,...``): per-source shares over the string column
  ``source_column``; a source's share is spread evenly over its samples;
- a file mapping global sample index to weight: Parquet with columns ``index`` and ``weight``,
  or text lines ``index,weight`` (comma, tab or space; a non-numeric first line is a header).
  Samples the file does not name weigh 0.

``--access-log`` takes a file of accessed global sample indices: one per line, or Parquet with
an ``index`` column. Each occurrence is one access.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from shardfeed.dataset_source import DatasetSource
from shardfeed.formats.reader import Dataset, open_dataset
from shardfeed.formats.weights_file import is_parquet, read_pairs
from shardfeed.planning.hot import mixture_weights
from shardfeed.schemas.errors import ShardfeedError


class HotInputError(ShardfeedError):
    """A weights spec or access log is malformed (weights files raise InputFileError)."""


def read_weights(
    source: DatasetSource, spec: str, source_column: str = "source"
) -> tuple[np.ndarray, str, str]:
    """Per-sample weights (float64, one per sample) and the source kind and detail."""
    n = source.manifest.num_samples
    if spec.startswith("column:"):
        name = spec[len("column:") :]
        values = _column(source, name).astype(np.float64)
        if values.ndim != 1:
            raise HotInputError(f"weights column {name!r} must hold one number per sample")
        return values, "weights-column", name
    mixture_text = spec[len("mixture:") :] if spec.startswith("mixture:") else None
    if mixture_text is None and "=" in spec and not os.path.exists(spec):
        mixture_text = spec
    if mixture_text is not None:
        mixture = _parse_mixture(mixture_text)
        names = _column(source, source_column)
        try:
            return mixture_weights(names, mixture), "mixture", f"{source_column}: {mixture_text}"
        except ValueError as err:
            raise HotInputError(str(err)) from None
    ids, weights = _index_value_file(spec, "weight")
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        raise HotInputError(
            f"{spec}: sample index {ids[(ids < 0) | (ids >= n)][0]} is outside 0..{n - 1}"
        )
    if len(np.unique(ids)) != len(ids):
        raise HotInputError(f"{spec}: a sample index appears twice")
    out = np.zeros(n)
    out[ids] = weights
    return out, "weights-file", os.path.basename(spec)


def read_access_log(path: str) -> tuple[np.ndarray, str]:
    """Accessed global sample indices, in log order. Raises only HotInputError (or
    InputFileError for a missing file), naming the file and, for text, the line."""
    if is_parquet(path):
        try:
            table = pq.read_table(path)
        except (pa.ArrowException, OSError) as err:
            raise HotInputError(f"{path}: not a readable Parquet file ({err})") from None
        if "index" not in table.column_names:
            raise HotInputError(f"{path}: a Parquet access log needs an 'index' column")
        try:
            return table.column("index").to_numpy().astype(np.int64), os.path.basename(path)
        except (ValueError, TypeError, pa.ArrowException) as err:
            raise HotInputError(f"{path}: column 'index': {err}") from None
    ids = []
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            try:
                text = raw.decode("utf-8").strip()
            except UnicodeDecodeError as err:
                raise HotInputError(
                    f"{path}:{number}: not valid UTF-8 at byte {err.start} of the line"
                ) from None
            if not text:
                continue
            try:
                ids.append(int(text))
            except ValueError:
                if number == 1:
                    continue  # a header line
                raise HotInputError(
                    f"{path}:{number}: {text[:40]!r} is not a sample index"
                ) from None
    return _int64(ids, path), os.path.basename(path)


def _parse_mixture(text: str) -> dict[str, float]:
    mixture: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.rpartition("=")
        if not sep or not name:
            raise HotInputError(f"mixture entry {part!r}: expected SOURCE=WEIGHT")
        try:
            weight = float(value)
        except ValueError:
            raise HotInputError(f"mixture entry {part!r}: {value!r} is not a number") from None
        if not np.isfinite(weight) or weight < 0:
            raise HotInputError(f"mixture entry {part!r}: the weight must be finite and >= 0")
        if name in mixture:
            raise HotInputError(f"mixture names {name!r} twice")
        mixture[name] = weight
    if not mixture:
        raise HotInputError("the mixture is empty")
    return mixture


def _column(source: DatasetSource, name: str) -> np.ndarray:
    ds: Dataset = open_dataset(source.location.display, filesystem=source.location.filesystem)
    with ds:
        if name not in ds.info.features:
            raise HotInputError(f"the dataset has no column {name!r}")
        parts = [batch[name] for batch in ds.iter_batches(1 << 16, columns=[name])]
    values = np.concatenate(parts) if parts else np.zeros(0)
    return values.reshape(len(values), -1)[:, 0] if values.ndim > 1 else values


def _index_value_file(path: str, value: str) -> tuple[np.ndarray, np.ndarray]:
    ids, values = read_pairs(path, "index", value, int)
    return _int64(ids, path), values


def _int64(ids: list[int], path: str) -> np.ndarray:
    """Sample indices as int64; one beyond int64 is a HotInputError, not an OverflowError."""
    try:
        return np.asarray(ids, dtype=np.int64)
    except OverflowError:
        big = next(i for i in ids if not -(2**63) <= i < 2**63)
        raise HotInputError(f"{path}: sample index {big} is outside the int64 range") from None

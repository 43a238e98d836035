"""Bring user data into the exact Arrow schema of a FeatureSpec, and back out as numpy."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from shardfeed.schemas.errors import SchemaError
from shardfeed.schemas.features import NUMERIC_DTYPES, Feature, FeatureSpec

TableLike = (
    pa.Table
    | pa.RecordBatch
    | Iterable[pa.RecordBatch]
    | Mapping[str, Any]
    | Sequence[Mapping[str, Any]]
)


def to_table(data: TableLike, spec: FeatureSpec) -> pa.Table:
    """Accept a Table, record batches, a dict of columns or a list of row dicts; cast to the spec."""
    schema = spec.arrow_schema()
    if isinstance(data, pa.RecordBatch):
        table = pa.Table.from_batches([data])
    elif isinstance(data, pa.Table):
        table = data
    elif isinstance(data, Mapping):
        table = pa.table({f.name: _column(data, f) for f in spec.stored})
    else:
        items = list(data)
        if items and isinstance(items[0], pa.RecordBatch):
            table = pa.Table.from_batches(items)
        else:
            columns = {f.name: [row.get(f.name, None) for row in items] for f in spec.stored}
            table = pa.table({f.name: _column(columns, f) for f in spec.stored})
    return conform(table, spec, schema)


def conform(table: pa.Table, spec: FeatureSpec, schema: pa.Schema | None = None) -> pa.Table:
    """Select and cast the spec's columns in spec order; e.g. constant-length lists become tensors."""
    schema = schema or spec.arrow_schema()
    missing = [name for name in schema.names if name not in table.column_names]
    if missing:
        raise SchemaError("features", f"data has no column for {missing}")
    columns = []
    for field in schema:
        column = table.column(field.name)
        if column.type != field.type:
            try:
                column = column.cast(field.type)
            # ArrowTypeError: e.g. a fixed_size_list of another size than the spec's shape
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
                column = _reshaped(column, spec[field.name]) if field.name in spec else None
                if column is None:
                    raise SchemaError(
                        f"features.{field.name}",
                        f"cannot store {table.column(field.name).type} as {field.type}: {err}",
                    ) from None
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=schema)


def nest(flat: pa.Array, shape: Sequence[int]) -> pa.Array:
    """Row-major leaf values -> one fixed-size list level per dimension of ``shape``."""
    out = flat
    for size in reversed(shape):
        out = pa.FixedSizeListArray.from_arrays(out, size)
    return out


def _column(columns: Mapping[str, Any], feature: Feature) -> pa.Array:
    if feature.name not in columns:
        raise SchemaError("features", f"data has no column for {feature.name!r}")
    values = columns[feature.name]
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return values
    if feature.is_tensor:
        arr = np.asarray(values, dtype=feature.dtype)
        if arr.shape[1:] != tuple(feature.shape):
            raise SchemaError(
                f"features.{feature.name}.shape",
                f"data has shape {list(arr.shape[1:])}, spec says {list(feature.shape)}",
            )
        return nest(pa.array(np.ascontiguousarray(arr).reshape(-1)), feature.shape)
    if feature.dtype == "image":
        return pa.array(
            [v if v is None or isinstance(v, dict) else {"bytes": v, "path": None} for v in values],
            feature.arrow_type,
        )
    if feature.is_numeric:
        return pa.array(
            np.asarray(values).reshape(-1).astype(feature.dtype)
            if not _has_none(values)
            else values,
            feature.arrow_type,
        )
    return pa.array(values, feature.arrow_type)


def _reshaped(column: pa.ChunkedArray, feature: Feature) -> pa.Array | None:
    """A flat list column with exactly ``num_elements`` values in every row (a (2, 3) tensor
    written as ``list<float>`` or ``fixed_size_list<float>[6]``), nested to the feature's shape;
    None when the column is anything else."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    atype = array.type
    flat_list = pa.types.is_list(atype) or pa.types.is_fixed_size_list(atype)
    if not feature.is_tensor or not flat_list or array.null_count:
        return None
    if pa.types.is_list(atype.value_type) or pa.types.is_fixed_size_list(atype.value_type):
        return None
    import pyarrow.compute as pc  # only here: it costs ~50 ms to import

    lengths = pc.list_value_length(array).to_numpy()
    if not (lengths == feature.num_elements).all():
        return None
    try:
        return nest(array.flatten().cast(NUMERIC_DTYPES[feature.dtype]), feature.shape)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def _has_none(values: Any) -> bool:
    return isinstance(values, list) and any(v is None for v in values)


def column_to_numpy(column: pa.ChunkedArray | pa.Array, feature: Feature) -> np.ndarray:
    """SoA numpy view of one column: tensors as ``(N, *shape)``; strings and images as object arrays.

    Fixed-size tensors without nulls are zero-copy views of the Arrow buffer when the column is one chunk.
    """
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    n = len(column)
    if feature.is_tensor:
        values = column
        for _ in feature.shape:
            values = values.flatten()  # honours the slice offset, unlike .values
        flat = values.to_numpy(
            zero_copy_only=column.null_count == 0
            and values.null_count == 0
            and feature.dtype != "bool"
        )
        return flat.reshape((n, *feature.shape))
    if feature.dtype == "image":
        out = column.field("bytes").to_numpy(zero_copy_only=False)
        if column.null_count:  # a null image is a null struct, whatever its child slot holds
            out[~np.asarray(column.is_valid())] = None
        return out
    return column.to_numpy(zero_copy_only=False)

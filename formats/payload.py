"""Payload bytes: the raw size of the values, without offsets, bitmaps or encoding overhead.

Binary and string values count their length; numbers count itemsize x elements. Nulls count 0.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def column_row_bytes(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Payload bytes of each row of one column, as int64."""
    if isinstance(array, pa.ChunkedArray):
        if array.num_chunks == 0:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([column_row_bytes(chunk) for chunk in array.chunks])
    atype = array.type
    valid = _valid_mask(array)
    if pa.types.is_struct(atype):
        total = np.zeros(len(array), dtype=np.int64)
        for i in range(atype.num_fields):
            total += column_row_bytes(array.field(i))
        return total * valid
    if pa.types.is_fixed_size_list(atype):
        inner = column_row_bytes(array.flatten())
        # every list has list_size children; sum them per row
        sums = (
            inner.reshape(len(array), atype.list_size).sum(axis=1)
            if atype.list_size
            else np.zeros(len(array), np.int64)
        )
        return sums.astype(np.int64) * valid
    if pa.types.is_list(atype) or pa.types.is_large_list(atype):
        inner = column_row_bytes(array.flatten())
        offsets = array.offsets.to_numpy() - array.offsets[0].as_py()
        csum = np.concatenate([[0], np.cumsum(inner)])
        return (csum[offsets[1:]] - csum[offsets[:-1]]).astype(np.int64) * valid
    if (
        pa.types.is_binary(atype)
        or pa.types.is_string(atype)
        or pa.types.is_large_binary(atype)
        or pa.types.is_large_string(atype)
    ):
        lengths = pc.binary_length(array).fill_null(0)
        return lengths.to_numpy(zero_copy_only=False).astype(np.int64)
    if pa.types.is_boolean(atype):
        return valid.astype(np.int64)
    width = atype.bit_width // 8
    return valid.astype(np.int64) * width


def table_row_bytes(table: pa.Table | pa.RecordBatch) -> np.ndarray:
    """Payload bytes of each row, summed over columns."""
    total = np.zeros(table.num_rows, dtype=np.int64)
    for column in table.columns:
        total += column_row_bytes(column)
    return total


def _valid_mask(array: pa.Array) -> np.ndarray:
    if array.null_count == 0:
        return np.ones(len(array), dtype=np.int64)
    return array.is_valid().to_numpy(zero_copy_only=False).astype(np.int64)

"""Two-column input files: a key and a number per line (CSV, TSV or space separated, with an
optional header line), or Parquet with the two named columns. Used for sampling weights."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from shardfeed.schemas.errors import ShardfeedError

K = TypeVar("K")


class InputFileError(ShardfeedError):
    """A weights (or similar) input file is missing or malformed; the message names the line."""


def read_pairs(
    path: str, key: str, value: str, parse_key: Callable[[str], K]
) -> tuple[list[K], np.ndarray]:
    """``(keys, values)`` in file order. Values must be finite numbers >= 0. Text lines split on
    the last comma, tab or space run, so keys may hold spaces or commas before it. Raises only
    :class:`InputFileError`, naming the file and, for text, the line."""
    if is_parquet(path):
        try:
            table = pq.read_table(path)
        except (pa.ArrowException, OSError) as err:
            raise InputFileError(f"{path}: not a readable Parquet file ({err})") from None
        if {key, value} - set(table.column_names):
            raise InputFileError(f"{path}: a Parquet file here needs columns '{key}' and '{value}'")
        try:
            keys = [parse_key(str(k)) for k in table.column(key).to_pylist()]
            values = table.column(value).to_numpy(zero_copy_only=False).astype(np.float64)
        except (ValueError, TypeError) as err:
            raise InputFileError(f"{path}: column '{key}' or '{value}': {err}") from None
    else:
        keys, numbers = [], []
        with open(path, "rb") as handle:
            for number, raw in enumerate(handle, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise InputFileError(
                        f"{path}:{number}: not valid UTF-8 at byte {err.start} of the line"
                    ) from None
                text = line.rstrip("\r\n")
                if not text.strip():
                    continue
                parts = re.split(r"[,\t ]+(?=[^,\t ]*$)", text.strip(), maxsplit=1)
                try:
                    if len(parts) != 2:
                        raise ValueError
                    parsed = parse_key(parts[0])
                    numbers.append(float(parts[1]))
                    keys.append(parsed)
                except ValueError:
                    if number == 1:
                        continue  # a header line
                    raise InputFileError(
                        f"{path}:{number}: expected '{key},{value}', got {text[:60]!r}"
                    ) from None
        values = np.asarray(numbers, dtype=np.float64)
    if values.size and (not np.all(np.isfinite(values)) or values.min() < 0):
        raise InputFileError(f"{path}: every {value} must be a finite number >= 0")
    return keys, values


def is_parquet(path: str) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == b"PAR1"
    except FileNotFoundError:
        raise InputFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputFileError(f"{path}: is a directory, not a file") from None

"""Parquet table source (kind ``parquet``): one sample per row of one or many Parquet files.

``root`` is a ``.parquet`` file, a directory (every ``*.parquet`` below it, sorted by path; names
starting with ``.`` or ``_`` are skipped, as pyarrow's dataset discovery does) or a local glob
(``data/*.parquet``, ``**`` allowed). Local paths and ``pyarrow.fs`` URIs work (globs: local only).

Passes (see :mod:`shardfeed.formats.sources.base`):

1. ``infer(file)`` reads one footer: each column's *kind* (below), its row count and, where the kind
   needs it, statistics from the data: per-level list lengths and whether a list holds any null
   (list columns are read for it), and with ``unify_schemas`` the largest ``|value|`` of 64-bit
   integers (footer statistics, else the column). Fragments are JSON and merge by file
   (:func:`merge_inferred`, associative and commutative).
2. ``spec(merged)`` settles one schema over all files (:func:`resolve_schema`).
3. ``scan(file, spec)`` checks the file's schema against the spec, then reads it one row group at a
   time: one :class:`UnitRef` per good row, ``position`` = the row's offset in the file,
   ``locator = (row_group, row_in_group)``, ``content_hash`` = :func:`row_digests` of the row's
   converted values (before any image re-encoding), payload = the converted row's payload bytes.
4. ``read(refs, spec)`` reads each needed row group once, takes the refs' rows, converts them as
   ``scan`` did and checks their digests. A row group is the smallest read, so with a shuffled plan
   (every shard holds rows of nearly every row group) the writers decode the corpus about once per
   shard; ``--no-shuffle`` reads each row group about once.

Column kinds and the features they become:

============================================  ==============  ==========================================
Parquet / Arrow type                          kind            feature
============================================  ==============  ==========================================
bool, int8..64, uint8..64, float16..64        the dtype name  that dtype, shape [1]
string, large_string (dictionary: decoded)    ``string``      string
binary, large_binary, fixed_size_binary       ``binary``      string, base64 text (``encoding: base64``)
struct<bytes: binary, path: string>           ``image``       image (HF ``{bytes, path}``; bytes through
                                                              the media hook, so a bad image is a reject)
(fixed_size_/large_)list of numbers, nested   ``list<f4>``    tensor of shape [n1, n2, ...] when every
                                                              value over the accepted files is a non-null
                                                              list of the same length per level with no
                                                              null inside; else canonical JSON text
                                                              (``encoding: json``), as jsonl.py stores
                                                              nested values (a feature has no
                                                              variable-length list dtype)
struct, map, list of non-numbers, other       ``nested``      string, canonical JSON (``encoding: json``;
                                                              bytes inside as base64, dates as text)
timestamp, date, time, duration, decimal      its type text   string, Arrow's text cast
null (an all-null column)                     ``null``        joins any kind (a wildcard, as a JSON null
                                                              never votes); only nulls: string
============================================  ==============  ==========================================

String features that are not plain strings, and a one-element list read as a scalar, record their
kind in the feature as ``parquet_type`` (e.g. ``"list<float32>"``), so ``scan`` can check a file
against the spec alone. NaN or infinity cannot be canonical JSON: such a row of a JSON-stored list is
a ``field_type`` reject. Columns named ``index`` or ``episode_index`` are refused (the writer
renumbers them).

Schema drift: the dataset's columns are those of the files holding the most rows (ties: the first
file), each column's kind the majority kind by rows. A file whose columns differ (one missing or
extra, or another kind) is one ``schema_drift`` reject naming the file, and none of its rows
convert. With ``unify_schemas`` the columns are the union of all files' and kinds join by safe
promotions only: integers widen (int32 -> int64, uint8 -> int16, ...), floats widen (float32 ->
float64), integers become float64 when lossless (up to 32 bits always; 64-bit when every ``|value|``
is at most 2**53), and a missing column is null; list kinds promote element-wise. Anything else is
still a reject. (``pa.unify_schemas(promote_options="permissive")`` is not used: it turns int64 into
float64 whatever the values, and it compares Arrow types, where a ``list`` and a ``fixed_size_list``
of the same numbers are one feature here.)

A file that is not Parquet or whose footer is corrupt is one ``parquet_corrupt`` reject (the rest
continues); a row group that cannot be decoded is one ``parquet_corrupt`` reject at
``row_group:N``. Row rejects are at ``row:N`` (the row's offset in the file).
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import decimal
import glob
import hashlib
import itertools
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shardfeed.formats.columns import nest
from shardfeed.formats.payload import table_row_bytes
from shardfeed.formats.sources import json_text
from shardfeed.formats.sources.base import DatasetMeta, MediaHook, RowsScan, ScanResult, UnitRef
from shardfeed.formats.sources.listing import list_files, source_root
from shardfeed.formats.storage import locate
from shardfeed.schemas.errors import ShardfeedError, UnsafePathError
from shardfeed.schemas.features import IMAGE_ARROW_TYPE, NUMERIC_DTYPES, Feature, FeatureSpec
from shardfeed.schemas.rejects import RejectError, RejectRecord

__all__ = [
    "SUFFIX",
    "InferredParquet",
    "ParquetSource",
    "column_kind",
    "feature_kind",
    "join_kinds",
    "kind_promotes",
    "merge_inferred",
    "resolve_schema",
    "row_digests",
]

SUFFIX = ".parquet"
#: Path components skipped when listing a directory (Spark's ``_SUCCESS``, ``_temporary``, dot files).
HIDDEN_PREFIXES = (".", "_")
#: Column names the shard writer renumbers, so a source column of that name would be overwritten.
RESERVED = ("index", "episode_index")
#: Integers of at most this magnitude are exact in float64.
FLOAT64_EXACT = 2**53
_DTYPE_NAMES = {atype: name for name, atype in NUMERIC_DTYPES.items()}
#: Candidate joins of two numeric dtypes, tried in this order (the first both promote to wins).
_JOIN_ORDER = (
    *("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"),
    *("float16", "float32", "float64"),
)
_BASE64 = {"encoding": "base64", "parquet_type": "binary"}


# --------------------------------------------------------------------------------------------------
# Kinds


def column_kind(atype: pa.DataType) -> str:
    """The kind of one Arrow column type (see the module table)."""
    if pa.types.is_dictionary(atype):
        atype = atype.value_type
    if pa.types.is_null(atype):
        return "null"
    if atype in _DTYPE_NAMES:
        return _DTYPE_NAMES[atype]
    if pa.types.is_string(atype) or pa.types.is_large_string(atype):
        return "string"
    if (
        pa.types.is_binary(atype)
        or pa.types.is_large_binary(atype)
        or pa.types.is_fixed_size_binary(atype)
    ):
        return "binary"
    if _is_image(atype):
        return "image"
    if _is_list(atype):
        depth, leaf = 0, atype
        while _is_list(leaf):
            depth, leaf = depth + 1, leaf.value_type
        if leaf in _DTYPE_NAMES:
            return "list<" * depth + _DTYPE_NAMES[leaf] + ">" * depth
        return "nested"
    if (pa.types.is_temporal(atype) or pa.types.is_decimal(atype)) and not pa.types.is_interval(
        atype
    ):
        return str(atype)
    return "nested"


def _is_list(atype: pa.DataType) -> bool:
    return (
        pa.types.is_list(atype)
        or pa.types.is_large_list(atype)
        or pa.types.is_fixed_size_list(atype)
    )


def _is_image(atype: pa.DataType) -> bool:
    """The Hugging Face ``datasets.Image`` storage: ``struct<bytes: binary, path: string>``."""
    if not pa.types.is_struct(atype) or atype.num_fields != 2:
        return False
    types = {atype.field(i).name: atype.field(i).type for i in range(2)}
    data, path = types.get("bytes"), types.get("path")
    return (
        data is not None
        and path is not None
        and (pa.types.is_binary(data) or pa.types.is_large_binary(data))
        and (pa.types.is_string(path) or pa.types.is_large_string(path))
    )


def _list_parts(kind: str) -> tuple[int, str] | None:
    """``"list<list<float32>>"`` -> ``(2, "float32")``; None for other kinds."""
    depth = 0
    while kind.startswith("list<") and kind.endswith(">"):
        kind, depth = kind[5:-1], depth + 1
    return (depth, kind) if depth else None


def _list_kind(depth: int, leaf: str) -> str:
    return "list<" * depth + leaf + ">" * depth


def _leaf(kind: str) -> str:
    parts = _list_parts(kind)
    return parts[1] if parts else kind


def _int_bound(dtype: str, absmax: int | None) -> int | None:
    """The largest ``|value|`` of a column of ``dtype``: ``absmax`` when measured, else the range of
    an integer type narrower than 64 bits; None when unknown; 0 for floats and bools (never needed)."""
    if dtype not in NUMERIC_DTYPES or np.dtype(dtype).kind not in "iu":
        return 0
    if absmax is not None or dtype in ("int64", "uint64"):
        return absmax
    info = np.iinfo(np.dtype(dtype))
    return max(-int(info.min), int(info.max))


def _dtype_promotes(src: str, dst: str, absmax: int | None) -> bool:
    """Whether every ``src`` value is exactly a ``dst`` value (``absmax``: the largest ``|value|``,
    needed when a 64-bit integer would become float64)."""
    if src == dst:
        return True
    if src not in NUMERIC_DTYPES or dst not in NUMERIC_DTYPES or "bool" in (src, dst):
        return False
    a, b = np.dtype(src), np.dtype(dst)
    if a.kind == "f":
        return b.kind == "f" and b.itemsize >= a.itemsize
    if b.kind == "f":  # integers become float64 only, and only when exact
        bound = _int_bound(src, absmax)
        return dst == "float64" and bound is not None and bound <= FLOAT64_EXACT
    return bool(np.can_cast(a, b, "safe"))


def kind_promotes(src: str, dst: str, absmax: int | None = None) -> bool:
    """Whether a column of kind ``src`` converts into kind ``dst`` without loss (the safe
    promotions of ``--unify-schemas``): numbers, and lists of numbers element-wise. ``absmax`` is
    the largest ``|value|`` of ``src``, needed only for 64-bit integers into float64."""
    if src == dst:
        return True
    a, b = _list_parts(src), _list_parts(dst)
    if a is not None or b is not None:
        return (
            a is not None and b is not None and a[0] == b[0] and _dtype_promotes(a[1], b[1], absmax)
        )
    return _dtype_promotes(src, dst, absmax)


def join_kinds(
    a: str, a_absmax: int | None, b: str, b_absmax: int | None
) -> tuple[str, int | None] | None:
    """The narrowest kind both ``a`` and ``b`` promote to (by :data:`_JOIN_ORDER`) and the largest
    ``|value|`` it then holds (None if unknown), or None when no kind holds both."""
    bounds = (_int_bound(_leaf(a), a_absmax), _int_bound(_leaf(b), b_absmax))
    absmax = None if None in bounds else max(bounds)  # type: ignore[type-var]
    if kind_promotes(b, a, b_absmax):
        return a, absmax
    if kind_promotes(a, b, a_absmax):
        return b, absmax
    la, lb = _list_parts(a), _list_parts(b)
    if (la is None) != (lb is None) or (la and lb and la[0] != lb[0]):
        return None
    depth = la[0] if la else 0
    for dtype in _JOIN_ORDER:
        kind = _list_kind(depth, dtype) if depth else dtype
        if kind_promotes(a, kind, a_absmax) and kind_promotes(b, kind, b_absmax):
            return kind, absmax
    return None


def feature_kind(feature: Feature) -> str:
    """The column kind a feature is filled from (``parquet_type``, else read from dtype/shape)."""
    recorded = feature.extra.get("parquet_type")
    if isinstance(recorded, str):
        return recorded
    if feature.dtype in ("image", "string"):
        return feature.dtype
    if feature.is_tensor:
        return _list_kind(len(feature.shape), feature.dtype)
    return feature.dtype


def _feature_for(name: str, kind: str, shape: tuple[int, ...] | None) -> Feature:
    """The feature of a settled column kind; ``shape`` is the constant list shape, if any."""
    parts = _list_parts(kind)
    if parts is not None:
        if shape is None:
            return Feature(name, "string", (1,), extra={"encoding": "json", "parquet_type": kind})
        extra = {"parquet_type": kind} if shape == (1,) else {}
        return Feature(name, parts[1], shape, extra=extra)
    if kind in NUMERIC_DTYPES:
        return Feature(name, kind, (1,))
    if kind in ("string", "null"):
        return Feature(name, "string", (1,))
    if kind == "binary":
        return Feature(name, "string", (1,), extra=dict(_BASE64))
    if kind == "image":
        return Feature(name, "image", ())
    if kind == "nested":
        return Feature(name, "string", (1,), extra={"encoding": "json", "parquet_type": kind})
    return Feature(name, "string", (1,), extra={"parquet_type": kind})


# --------------------------------------------------------------------------------------------------
# Schema inference


@dataclass(frozen=True)
class InferredParquet:
    """What ``infer`` learned of some files: ``files[file]`` is ``{"rows", "error", "columns"}``,
    ``columns`` a list of ``{"name", "kind", "absmax", "lengths", "nulls"}`` in file order
    (``lengths``: ``[min, max]`` per list level, or null where no list was seen). JSON values only;
    merge with :func:`merge_inferred`; ``InferredParquet()`` is the identity."""

    files: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


def merge_inferred(a: InferredParquet, b: InferredParquet) -> InferredParquet:
    """The union of two fragments (a file seen twice keeps its smaller canonical JSON)."""
    files = dict(a.files)
    for name, entry in b.files.items():
        if name not in files or _canonical(entry) < _canonical(files[name]):
            files[name] = entry
    return InferredParquet(files)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class ResolvedSchema:
    """The settled schema: the spec, the files that fit it and why each other file does not."""

    spec: FeatureSpec
    accepted: tuple[str, ...]
    drifted: Mapping[str, str]
    failed: Mapping[str, str]


def resolve_schema(inferred: InferredParquet, unify: bool = False) -> ResolvedSchema:
    """One schema over every readable file (see the module docstring for the rules).

    Raises ShardfeedError when no file is readable or the result has no (or a reserved) column."""
    failed = {f: e["error"] for f, e in inferred.files.items() if e.get("error")}
    good = sorted(f for f in inferred.files if f not in failed)
    if not good:
        detail = f"; e.g. {min(failed)}: {failed[min(failed)]}" if failed else ""
        raise ShardfeedError(f"no readable Parquet file among {len(inferred.files)}{detail}")
    columns = {f: {c["name"]: c for c in inferred.files[f]["columns"]} for f in good}
    rows = {f: int(inferred.files[f]["rows"]) for f in good}
    if unify:
        names = list(dict.fromkeys(c["name"] for f in good for c in inferred.files[f]["columns"]))
        scope = good
    else:
        groups: dict[frozenset[str], list[str]] = {}
        for f in good:
            groups.setdefault(frozenset(columns[f]), []).append(f)
        scope = min(groups.values(), key=lambda fs: (-sum(rows[f] for f in fs), fs[0]))
        names = [c["name"] for c in inferred.files[scope[0]]["columns"]]
    kinds = {name: _settle_kind(name, scope, columns, rows, unify) for name in names}
    accepted, drifted = [], {}
    for f in good:
        file_kinds = {name: c["kind"] for name, c in columns[f].items()}
        problem = _misfit(file_kinds, kinds, unify, lambda name, f=f: columns[f][name]["absmax"])
        if problem is None:
            accepted.append(f)
        else:
            drifted[f] = problem
    if unify:
        names = [n for n in names if any(n in columns[f] for f in accepted)]
    reserved = [n for n in names if n in RESERVED]
    if reserved:
        raise ShardfeedError(
            f"Parquet column(s) {reserved} collide with LeRobot's {list(RESERVED)}, which the "
            "writer renumbers; rename them in the source (a LeRobot dataset converts with "
            "--from lerobot)"
        )
    if not names:
        raise ShardfeedError("the Parquet files have no columns")
    features = [
        _feature_for(n, kinds[n], _tensor_shape(n, kinds[n], accepted, columns, rows))
        for n in names
    ]
    return ResolvedSchema(FeatureSpec(tuple(features)), tuple(accepted), drifted, failed)


def _settle_kind(
    name: str,
    scope: Sequence[str],
    columns: Mapping[str, Mapping[str, Any]],
    rows: Mapping[str, int],
    unify: bool,
) -> str:
    """Majority kind by rows (ties: the earliest file); with ``unify`` the others join it when a
    safe promotion allows. Nulls never vote; a column of nulls only is ``string``."""
    votes: dict[str, list[Any]] = {}  # kind -> [rows, first file index, largest |value|]
    for i, f in enumerate(scope):
        column = columns[f].get(name)
        if column is None or column["kind"] == "null":
            continue
        kind = column["kind"]
        bound = _int_bound(_leaf(kind), column.get("absmax"))  # None: unknown
        vote = votes.setdefault(kind, [0, i, 0])
        vote[0] += rows[f]
        vote[2] = None if vote[2] is None or bound is None else max(vote[2], bound)
    if not votes:
        return "string"
    ordered = sorted(votes, key=lambda k: (-votes[k][0], votes[k][1]))
    kind, bound = ordered[0], votes[ordered[0]][2]
    if unify:
        for other in ordered[1:]:
            joined = join_kinds(kind, bound, other, votes[other][2])
            if joined is not None:
                kind, bound = joined
    return kind


def _misfit(
    file_kinds: Mapping[str, str],
    targets: Mapping[str, str],
    unify: bool,
    absmax: Callable[[str], int | None],
) -> str | None:
    """Why a file's columns (name -> kind) do not fit the dataset's (name -> kind), or None;
    ``absmax(name)`` measures a 64-bit integer column of the file when a promotion needs it."""
    for name, target in targets.items():
        kind = file_kinds.get(name)
        if kind is None:
            if unify:
                continue
            hint = " (--unify-schemas fills a missing column with nulls)"
            return f"column {name!r} ({target} in the dataset schema) is missing{hint}"
        if kind in (target, "null"):
            continue
        if unify:
            wide = _leaf(kind) in ("int64", "uint64") and _leaf(target) == "float64"
            if kind_promotes(kind, target, absmax(name) if wide else None):
                continue
            hint = ", and no lossless promotion turns one into the other"
        else:
            hint = (
                " (--unify-schemas promotes it when that is lossless)"
                if join_kinds(kind, 0, target, 0) is not None
                else ""
            )
        return f"column {name!r} is {kind}, but the dataset schema has {target}{hint}"
    extra = [n for n in file_kinds if n not in targets]
    if extra:
        hint = "" if unify else " (--unify-schemas takes the union of the columns)"
        return f"column(s) {extra} are not in the dataset schema{hint}"
    return None


def _tensor_shape(
    name: str,
    kind: str,
    accepted: Sequence[str],
    columns: Mapping[str, Mapping[str, Any]],
    rows: Mapping[str, int],
) -> tuple[int, ...] | None:
    """The constant list shape of a list column over the accepted files, or None (JSON text)."""
    parts = _list_parts(kind)
    if parts is None:
        return None
    shape: list[int | None] = [None] * parts[0]
    for f in accepted:
        column = columns[f].get(name)
        if column is None or column["kind"] == "null":
            if rows[f]:
                return None  # nulls: a tensor row cannot be null
            continue
        if column["nulls"]:
            return None
        for level, seen in enumerate(column["lengths"]):
            if seen is None:
                if rows[f]:
                    return None
                continue
            low, high = seen
            if low != high or low < 1 or shape[level] not in (None, low):
                return None
            shape[level] = low
    if any(size is None for size in shape):
        return None
    return tuple(int(s) for s in shape)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# Footers and column statistics


class _FileProblem(Exception):
    """A whole file cannot be used: its reject reason and message."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


def _file_kinds(pf: pq.ParquetFile) -> dict[str, str]:
    """Column name -> kind, in file order; raises _FileProblem for unusable column names."""
    kinds: dict[str, str] = {}
    for f in pf.schema_arrow:
        if not f.name or f.name in kinds:
            what = "an empty column name" if not f.name else f"column {f.name!r} twice"
            raise _FileProblem("schema_drift", f"the file has {what}")
        kinds[f.name] = column_kind(f.type)
    return kinds


def _leaf_count(atype: pa.DataType) -> int:
    """How many Parquet leaf columns an Arrow type is stored in."""
    if pa.types.is_dictionary(atype):
        return 1
    if pa.types.is_struct(atype):
        return sum(_leaf_count(atype.field(i).type) for i in range(atype.num_fields))
    if pa.types.is_map(atype):
        return _leaf_count(atype.key_type) + _leaf_count(atype.item_type)
    if _is_list(atype):
        return _leaf_count(atype.value_type)
    return 1


def _absmax(pf: pq.ParquetFile, name: str) -> int | None:
    """The largest ``|value|`` of a (list of) 64-bit integer column: from the footer's statistics
    when every row group has them, else from the data. None if the column holds no value."""
    schema = pf.schema_arrow
    index = schema.get_field_index(name)
    leaf = sum(_leaf_count(schema.field(i).type) for i in range(index))
    meta = pf.metadata
    best = 0
    for rg in range(meta.num_row_groups):
        chunk = meta.row_group(rg).column(leaf)
        stats = chunk.statistics
        if stats is not None and stats.has_min_max:
            best = max(best, abs(int(stats.min)), abs(int(stats.max)))
        elif stats is None or not stats.has_null_count or stats.null_count != chunk.num_values:
            return _data_absmax(pf, name)
    return best


def _data_absmax(pf: pq.ParquetFile, name: str) -> int:
    best = 0
    for rg in range(pf.metadata.num_row_groups):
        values = pf.read_row_group(rg, columns=[name]).column(name).combine_chunks()
        while _is_list(values.type):
            values = values.flatten()
        if pa.types.is_dictionary(values.type):
            values = values.dictionary_decode()
        low, high = pc.min_max(values).values()
        if low.is_valid:
            best = max(best, abs(low.as_py()), abs(high.as_py()))
    return best


def _list_stats(pf: pq.ParquetFile, name: str, depth: int) -> tuple[list[Any], bool]:
    """Per level ``[min, max]`` list length (None where no list was seen) and whether any value,
    list or element is null, from a read of the column."""
    lows: list[int | None] = [None] * depth
    highs: list[int | None] = [None] * depth
    nulls = False
    for rg in range(pf.metadata.num_row_groups):
        level = pf.read_row_group(rg, columns=[name]).column(name).combine_chunks()
        for d in range(depth):
            nulls = nulls or level.null_count > 0
            lengths = pc.list_value_length(level)
            low, high = pc.min_max(lengths).values()
            if low.is_valid:
                lows[d] = low.as_py() if lows[d] is None else min(lows[d], low.as_py())
                highs[d] = high.as_py() if highs[d] is None else max(highs[d], high.as_py())
            level = level.flatten()
        nulls = nulls or level.null_count > 0
    lengths = [None if lo is None else [lo, hi] for lo, hi in zip(lows, highs, strict=True)]
    return lengths, nulls


# --------------------------------------------------------------------------------------------------
# Conversion of raw rows into the spec's columns


@dataclass(frozen=True)
class _Column:
    """How one feature is filled from one file: the file column's kind (``null`` when absent)."""

    feature: Feature
    kind: str


def _plan_columns(file_kinds: Mapping[str, str], spec: FeatureSpec) -> list[_Column]:
    return [_Column(f, file_kinds.get(f.name, "null")) for f in spec.stored]


def _convert(
    raw: pa.Table, plan: Sequence[_Column]
) -> tuple[list[pa.Array], dict[int, RejectError]]:
    """Every feature's column for the rows of ``raw``; rows that cannot convert are returned as
    errors (first by feature order) and the arrays are then unusable."""
    errors: dict[int, RejectError] = {}
    arrays = []
    for column in plan:
        name = column.feature.name
        source = (
            raw.column(name).combine_chunks()
            if column.kind != "null" and name in raw.column_names
            else None
        )
        array, problems = _convert_column(source, column, raw.num_rows)
        for row, err in problems.items():
            errors.setdefault(row, err)
        arrays.append(array)
    return arrays, errors


def convert_rows(
    raw: pa.Table, plan: Sequence[_Column], schema: pa.Schema
) -> tuple[pa.Table, np.ndarray, dict[int, RejectError]]:
    """``raw`` rows in the spec's schema: (table of the good rows, their indices in ``raw``,
    row -> RejectError for the others)."""
    arrays, errors = _convert(raw, plan)
    good = np.arange(raw.num_rows, dtype=np.int64)
    if errors:
        good = np.setdiff1d(good, np.fromiter(errors, np.int64, len(errors)))
        arrays, again = _convert(raw.take(pa.array(good)), plan)
        if again:
            row, err = next(iter(again.items()))
            raise ShardfeedError(f"row {int(good[row])} did not convert after its rejects: {err}")
    return pa.Table.from_arrays(arrays, schema=schema), good, errors


def _convert_column(
    source: pa.Array | None, column: _Column, n: int
) -> tuple[pa.Array | None, dict[int, RejectError]]:
    feature, target = column.feature, feature_kind(column.feature)
    name = feature.name
    if source is None:
        if _list_parts(target) and feature.dtype != "string":
            why = f"column {name!r} is null or missing, but it is a {feature.dtype} tensor"
            return None, dict.fromkeys(range(n), RejectError("field_type", why))
        return pa.nulls(n, feature.arrow_type), {}
    if pa.types.is_dictionary(source.type):
        source = source.dictionary_decode()
    if _list_parts(target):
        if feature.dtype == "string":
            return _json_list(source, target, name)
        return _tensor(source, feature)
    if target == "image":
        return _image(source, name)
    if target == "binary":
        return _base64(source), {}
    if target == "nested":
        return _json(source, name)
    if target == "string":
        return _string(source, name)
    return _cast(source, feature.arrow_type, name)


def _cast(source: pa.Array, atype: pa.DataType, name: str) -> tuple[pa.Array | None, dict]:
    try:
        return source.cast(atype), {}
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    errors = {}
    for row in range(len(source)):
        try:
            source.slice(row, 1).cast(atype)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
            value = _short(source[row].as_py())
            message = f"column {name!r}: {value} cannot be stored as {atype} ({_text(err)})"
            errors[row] = RejectError("field_type", message)
    if not errors:
        raise ShardfeedError(f"column {name!r} does not cast to {atype}, though each row does")
    return None, errors


def _string(source: pa.Array, name: str) -> tuple[pa.Array | None, dict]:
    out = source.cast(pa.string())
    try:
        out.validate(full=True)
        return out, {}
    except pa.ArrowInvalid:
        pass
    errors = {}
    for row in range(len(out)):
        try:
            out.slice(row, 1).validate(full=True)
        except pa.ArrowInvalid as err:
            errors[row] = RejectError(
                "utf8_invalid", f"column {name!r} is not valid UTF-8 ({_text(err)})"
            )
    return None, errors


def _base64(source: pa.Array) -> pa.Array:
    values = source.cast(pa.binary()).to_pylist()
    return pa.array(
        [None if v is None else base64.b64encode(v).decode("ascii") for v in values], pa.string()
    )


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, (datetime.date, datetime.time, datetime.timedelta, decimal.Decimal)):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


_ENCODER = json.JSONEncoder(default=_json_default, **json_text.CANONICAL_OPTIONS)


def _json(source: pa.Array, name: str) -> tuple[pa.Array | None, dict]:
    out: list[str | None] = []
    errors = {}
    for row, value in enumerate(source.to_pylist()):
        if value is None:
            out.append(None)
            continue
        try:
            out.append(_ENCODER.encode(value))
        except (ValueError, TypeError) as err:
            message = f"column {name!r} cannot be canonical JSON ({_text(err)})"
            errors[row] = RejectError("field_type", message)
            out.append(None)
    return (None, errors) if errors else (pa.array(out, pa.string()), {})


def _list_type(kind: str) -> pa.DataType:
    depth, leaf = _list_parts(kind) or (0, kind)
    atype = NUMERIC_DTYPES[leaf]
    for _ in range(depth):
        atype = pa.list_(atype)
    return atype


def _json_list(source: pa.Array, kind: str, name: str) -> tuple[pa.Array | None, dict]:
    """A list column as canonical JSON text, its numbers first cast to the dataset's kind."""
    cast, errors = _cast(source, _list_type(kind), name)
    return (None, errors) if cast is None else _json(cast, name)


def _tensor(source: pa.Array, feature: Feature) -> tuple[pa.Array | None, dict]:
    """A (nested) list column as fixed-size lists of ``feature.shape``; a row that is null, holds a
    null, or has another length at some level is a ``field_type`` reject."""
    shape, n = feature.shape, len(source)
    bad: dict[int, str] = {}
    row_of = np.arange(n, dtype=np.int64)  # the row each element of the current level belongs to
    level = source
    for depth, size in enumerate(shape):
        lengths = pc.list_value_length(level).fill_null(-1).to_numpy(zero_copy_only=False)
        for i in np.flatnonzero(lengths != size).tolist():
            what = "a null" if lengths[i] < 0 else f"a list of {lengths[i]}"
            bad.setdefault(int(row_of[i]), f"{what} at level {depth}, where the shape says {size}")
        row_of = np.repeat(row_of, np.maximum(lengths, 0))
        level = level.flatten()
    if level.null_count:
        for i in np.flatnonzero(level.is_null().to_numpy(zero_copy_only=False)).tolist():
            bad.setdefault(int(row_of[i]), "a null element")
    if bad:
        return None, {
            row: RejectError(
                "field_type",
                f"column {feature.name!r} holds {why}; it is a {feature.dtype} tensor "
                f"of shape {list(shape)}",
            )
            for row, why in sorted(bad.items())
        }
    flat, errors = _cast(level, NUMERIC_DTYPES[feature.dtype], feature.name)
    if flat is None:
        per = max(1, feature.num_elements)
        return None, {int(i) // per: e for i, e in errors.items()}
    return (nest(flat, shape) if feature.is_tensor else flat), {}


def _image(source: pa.Array, name: str) -> tuple[pa.Array | None, dict]:
    """An HF image struct as the image column; a present image without bytes is a reject."""
    data = pc.struct_field(source, "bytes").cast(pa.binary())
    path = pc.struct_field(source, "path").cast(pa.string())
    valid = source.is_valid()
    missing = pc.and_(valid, data.is_null()).to_numpy(zero_copy_only=False)
    if missing.any():
        paths = path.to_pylist()
        return None, {
            int(i): RejectError(
                "field_missing",
                f"column {name!r} holds an image without bytes (path {paths[i]!r}); "
                "external image files are not read",
            )
            for i in np.flatnonzero(missing).tolist()
        }
    mask = pc.invert(valid) if source.null_count else None
    return pa.StructArray.from_arrays([data, path], fields=list(IMAGE_ARROW_TYPE), mask=mask), {}


def _text(err: BaseException) -> str:
    """An error as one line (pyarrow's messages may hold newlines)."""
    return " ".join(str(err).split())


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# --------------------------------------------------------------------------------------------------
# Row digests


def row_digests(table: pa.Table) -> list[str]:
    """A content hash per row of a table in a spec's schema: SHA-256 (first 128 bits, hex) of the
    row's values in a canonical byte form.

    Each column adds a fixed-width part (a validity byte, then the little-endian value bytes; for
    strings and the parts of an image a validity byte and a u64 length) and, for strings and
    images, a variable part (their bytes). A row hashes its fixed parts, built for the whole table
    at once, then its variable parts, in column order."""
    n = table.num_rows
    if n == 0:
        return []
    fixed: list[np.ndarray] = []  # (n, width) uint8 blocks
    variable: list[tuple[np.ndarray, np.ndarray, memoryview]] = []  # (starts, ends, data)
    for column in table.columns:
        _digest_parts(_one(column), fixed, variable)
    block = np.ascontiguousarray(np.hstack(fixed))
    if not variable:
        return [hashlib.sha256(row).hexdigest()[:32] for row in block]
    out = []
    spans = [(starts.tolist(), ends.tolist(), data) for starts, ends, data in variable]
    for i in range(n):
        h = hashlib.sha256(block[i])
        for starts, ends, data in spans:
            if ends[i] > starts[i]:
                h.update(data[starts[i] : ends[i]])
        out.append(h.hexdigest()[:32])
    return out


def _digest_parts(
    array: pa.Array,
    fixed: list[np.ndarray],
    variable: list[tuple[np.ndarray, np.ndarray, memoryview]],
) -> None:
    n = len(array)
    is_valid = array.is_valid().to_numpy(zero_copy_only=False)
    fixed.append(is_valid.astype(np.uint8).reshape(n, 1))
    atype = array.type
    if pa.types.is_struct(atype):  # an image: its parts (struct_field applies the struct's nulls)
        for i in range(atype.num_fields):
            _digest_parts(pc.struct_field(array, atype.field(i).name), fixed, variable)
        return
    if pa.types.is_string(atype) or pa.types.is_binary(atype):
        buffers = array.buffers()
        offsets = np.frombuffer(buffers[1], np.int32)[array.offset : array.offset + n + 1]
        starts = offsets[:-1].astype(np.int64)
        ends = np.where(is_valid, offsets[1:], offsets[:-1]).astype(np.int64)
        data = memoryview(buffers[2] if buffers[2] is not None else b"").cast("B")
        fixed.append((ends - starts).astype("<u8").view(np.uint8).reshape(n, 8))
        variable.append((starts, ends, data))
        return
    values = array
    if pa.types.is_fixed_size_list(atype):
        if array.null_count:
            raise ShardfeedError("a tensor column holds a null row, which has no digest")
        while pa.types.is_fixed_size_list(values.type):
            values = values.flatten()
    elif array.null_count:
        values = array.fill_null(False if pa.types.is_boolean(atype) else 0)
    if pa.types.is_boolean(values.type):
        values = values.cast(pa.uint8())
    flat = values.to_numpy(zero_copy_only=False)
    flat = np.ascontiguousarray(flat.astype(flat.dtype.newbyteorder("<"), copy=False))
    fixed.append(flat.view(np.uint8).reshape(n, -1))


# --------------------------------------------------------------------------------------------------
# The source


@dataclass
class _GroupScan:
    """One row group's scan: its good rows (``table``, converted, images as the media hook
    leaves them) with their index in the group, position in the file, payload and digest."""

    row_group: int
    indices: np.ndarray
    positions: np.ndarray
    payload: np.ndarray
    hashes: list[str]
    table: pa.Table
    rejects: list[RejectRecord]

    @classmethod
    def empty(cls, rg: int, schema: pa.Schema, rejects: list[RejectRecord]) -> _GroupScan:
        none = np.zeros(0, np.int64)
        return cls(rg, none, none, none, [], schema.empty_table(), rejects)


class ParquetSource:
    """Parquet files as a :class:`~shardfeed.formats.sources.base.SourceReader`; one unit per row.

    ``unify_schemas`` lets files whose schema differs by safe promotions convert (module
    docstring); ``media_hook`` validates (and maybe re-encodes) each image while scanning, and a
    ``RejectError`` from it becomes the row's reject; ``drop_videos`` is accepted and ignored.
    """

    kind: ClassVar[str] = "parquet"
    first_position: ClassVar[int] = 0  # a unit's position is its row offset
    #: The combine function for ``infer`` results, reachable from the class (``type(src).merge_inferred``).
    merge_inferred = staticmethod(merge_inferred)
    #: The dataclass ``infer`` returns, rebuilt from its JSON form between pipeline stages.
    inferred_type = InferredParquet

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        unify_schemas: bool = False,
        media_hook: MediaHook | None = None,
        drop_videos: bool = False,
    ) -> None:
        self.unify_schemas = unify_schemas
        self.media_hook = media_hook
        text = os.fspath(root)
        self._pattern: str | None = None
        self._single: str | None = None
        if glob.has_magic(text):
            if "://" in text and not text.startswith("file://"):
                raise ShardfeedError(f"{text}: globs work on local paths only; pass a directory")
            local = text.removeprefix("file://")
            base = _glob_base(local)
            self._pattern = os.path.abspath(local)
            location = locate(base)
        else:
            location, self._single = source_root(text, "Parquet source")
        self._location = location
        self.root = location.root

    def __repr__(self) -> str:
        return f"ParquetSource({self._pattern or self.root!r}, unify_schemas={self.unify_schemas})"

    # -- files -------------------------------------------------------------------------------------

    def files(self) -> list[str]:
        """Root-relative POSIX paths of the input files, sorted.

        Local directory symlinks are not followed; those that lead outside the root are listed as
        they are, so that ``scan`` reports them as ``path_escape`` (as it does escaping file links).
        """
        if self._single is not None:
            return [self._single]
        if self._pattern is not None:
            matches = glob.glob(self._pattern, recursive=True)
            rels = [os.path.relpath(m, self.root).replace(os.sep, "/") for m in matches]
            return sorted(r for r, m in zip(rels, matches, strict=True) if not os.path.isdir(m))
        return list_files(
            self._location, _wanted, skip_dir=lambda name: name.startswith(HIDDEN_PREFIXES)
        )

    @contextlib.contextmanager
    def _open(self, file: str) -> Iterator[pq.ParquetFile]:
        """The file with its footer read; raises _FileProblem when it is unsafe, unreadable or not
        Parquet."""
        try:
            handle = self._location.open_input(file, "file")
        except UnsafePathError as err:
            raise _FileProblem("path_escape", err.message) from None
        except OSError as err:
            raise _FileProblem("io_error", f"cannot read {file}: {_text(err)}") from None
        with handle:
            try:
                pf = pq.ParquetFile(handle)
            except (OSError, pa.ArrowException) as err:
                raise _FileProblem(
                    "parquet_corrupt", f"{file} is not a readable Parquet file: {_text(err)}"
                ) from None
            yield pf

    # -- schema ------------------------------------------------------------------------------------

    def infer(self, file: str) -> InferredParquet:
        """The kinds and statistics of ``file``'s columns (an unreadable file records its error)."""
        try:
            with self._open(file) as pf:
                kinds = _file_kinds(pf)
                columns = []
                for name, kind in kinds.items():
                    entry: dict[str, Any] = {"name": name, "kind": kind}
                    entry["absmax"] = (
                        _absmax(pf, name)
                        if self.unify_schemas and _leaf(kind) in ("int64", "uint64")
                        else None
                    )
                    parts = _list_parts(kind)
                    entry["lengths"], entry["nulls"] = (
                        _list_stats(pf, name, parts[0]) if parts else (None, False)
                    )
                    columns.append(entry)
                rows = pf.metadata.num_rows
        except _FileProblem as problem:
            return InferredParquet({file: {"rows": 0, "error": problem.message, "columns": []}})
        except (OSError, pa.ArrowException) as err:
            message = f"{file}: a column cannot be read ({_text(err)})"
            return InferredParquet({file: {"rows": 0, "error": message, "columns": []}})
        return InferredParquet({file: {"rows": rows, "error": None, "columns": columns}})

    def resolve(self, inferred: Any) -> ResolvedSchema:
        """The settled schema of the merged :class:`InferredParquet` (see :func:`resolve_schema`)."""
        if not isinstance(inferred, InferredParquet):
            raise ShardfeedError(
                f"Parquet source {self.root}: no inferred schema ({len(self.files())} input "
                "files); the columns are typed from the footers: pass the merged InferredParquet "
                "of infer() over all files"
            )
        return resolve_schema(inferred, self.unify_schemas)

    def spec(self, inferred: Any | None = None) -> FeatureSpec:
        """The features of the merged :class:`InferredParquet` (see :func:`resolve_schema`)."""
        return self.resolve(inferred).spec

    def meta(self) -> DatasetMeta:
        return DatasetMeta()

    def reject_location(self, ref: UnitRef) -> tuple[str, str]:
        """``(source, position)`` naming a unit, as its rejects do: ``(file, "row:N")``."""
        return ref.file, f"row:{ref.position}"

    def _check(self, file: str, pf: pq.ParquetFile, spec: FeatureSpec) -> list[_Column]:
        """How ``file`` fills ``spec``; raises _FileProblem (``schema_drift``) when it does not fit."""
        kinds = _file_kinds(pf)
        targets = {f.name: feature_kind(f) for f in spec.stored}

        def absmax(name: str) -> int | None:
            try:
                return _absmax(pf, name)
            except (OSError, pa.ArrowException) as err:
                raise _FileProblem(
                    "parquet_corrupt", f"{file}: column {name!r} cannot be read ({_text(err)})"
                ) from None

        problem = _misfit(kinds, targets, self.unify_schemas, absmax)
        if problem is not None:
            rows = pf.metadata.num_rows
            raise _FileProblem(
                "schema_drift", f"{file}: {problem}; all {rows:,} row(s) of the file are rejected"
            )
        return _plan_columns(kinds, spec)

    # -- scan and read -----------------------------------------------------------------------------

    def scan(self, file: str, spec: FeatureSpec) -> ScanResult:
        """One UnitRef per good row of ``file``, read one row group at a time; a file that does not
        fit ``spec`` or cannot be read is one reject naming it."""
        result = ScanResult()
        for group in self._scan_groups(file, spec):
            result.rejects.extend(group.rejects)
            for position, payload, digest, index in zip(
                group.positions.tolist(),
                group.payload.tolist(),
                group.hashes,
                group.indices.tolist(),
                strict=True,
            ):
                locator = (group.row_group, index)
                result.units.append(UnitRef(file, position, 1, payload, digest, locator))
        return result

    def scan_rows(self, file: str, spec: FeatureSpec) -> Iterator[RowsScan]:
        """The good rows of ``file`` row group by row group, converted to ``spec`` (images as
        the media hook leaves them), with the rejects: the file is decoded once
        (:class:`~shardfeed.formats.sources.base.SpoolingSource`)."""
        for group in self._scan_groups(file, spec):
            yield RowsScan.one_row_each(
                group.positions, group.payload, group.hashes, group.table, group.rejects
            )

    # -- pieces of a large file (``SplittableSource``) ----------------------------------------

    def pieces(self, file: str, piece_bytes: int) -> list[tuple[int, int]]:
        """Runs of whole row groups ``[first, stop)`` of about ``piece_bytes`` (uncompressed, by
        the footer) for separate scan tasks; one piece ``(0, -1)`` when the file fits."""
        try:
            with self._open(file) as pf:
                sizes = [pf.metadata.row_group(g).total_byte_size for g in range(pf.num_row_groups)]
        except _FileProblem:
            return [(0, -1)]  # the scan reports it
        if sum(sizes) <= piece_bytes:
            return [(0, -1)]
        ranges, first, held = [], 0, 0
        for group, size in enumerate(sizes):
            held += size
            if held >= piece_bytes and group + 1 < len(sizes):
                ranges.append((first, group + 1))
                first, held = group + 1, 0
        return [*ranges, (first, -1)]

    def infer_piece(self, file: str, start: int, stop: int) -> tuple[InferredParquet, int]:
        """The file's inference in its first piece (the footer speaks for the whole file; the
        other pieces add nothing) and the rows of the piece's row groups."""
        inferred = self.infer(file) if start == 0 else InferredParquet()
        try:
            with self._open(file) as pf:
                stop = pf.num_row_groups if stop < 0 else stop
                rows = sum(pf.metadata.row_group(g).num_rows for g in range(start, stop))
        except _FileProblem:
            rows = 0
        return inferred, rows

    def scan_piece(
        self, file: str, spec: FeatureSpec, start: int, stop: int, first: int
    ) -> Iterator[RowsScan]:
        """``scan_rows`` over row groups ``[start, stop)``, whose first row is row ``first``."""
        for group in self._scan_groups(file, spec, (start, stop, first)):
            yield RowsScan.one_row_each(
                group.positions, group.payload, group.hashes, group.table, group.rejects
            )

    def _scan_groups(
        self, file: str, spec: FeatureSpec, piece: tuple[int, int, int] = (0, -1, 0)
    ) -> Iterator[_GroupScan]:
        """Row groups ``[start, stop)`` (the piece; whole file by default) one by one, the
        first at row ``first``; a file-level problem is reported by the first piece only."""
        first_group, stop, start = piece
        schema = spec.arrow_schema()
        try:
            with self._open(file) as pf:
                plan = self._check(file, pf, spec)
                stop = pf.metadata.num_row_groups if stop < 0 else stop
                for rg in range(first_group, stop):
                    count = pf.metadata.row_group(rg).num_rows
                    yield self._scan_group(file, pf, rg, start, count, plan, schema)
                    start += count
        except _FileProblem as problem:  # raised before any row group is read
            if first_group == 0:
                reject = RejectRecord(file, "", problem.reason, problem.message)
                yield _GroupScan.empty(-1, schema, [reject])

    def _scan_group(
        self,
        file: str,
        pf: pq.ParquetFile,
        rg: int,
        start: int,
        count: int,
        plan: Sequence[_Column],
        schema: pa.Schema,
    ) -> _GroupScan:
        try:
            raw = pf.read_row_group(rg)
            if raw.num_rows != count:
                raise OSError(f"it holds {raw.num_rows} rows, the footer says {count}")
        except (OSError, pa.ArrowException) as err:
            message = f"rows {start}..{start + count - 1} of {file} cannot be read: {_text(err)}"
            reject = RejectRecord(file, f"row_group:{rg}", "parquet_corrupt", message)
            return _GroupScan.empty(rg, schema, [reject])
        table, good, errors = convert_rows(raw, plan, schema)
        payload = table_row_bytes(table)
        digests = row_digests(table)
        keep = np.ones(table.num_rows, dtype=bool)
        for position, f in enumerate(table.schema):
            if f.type != IMAGE_ARROW_TYPE or self.media_hook is None:
                continue
            column = _one(table.column(position))
            blobs = pc.struct_field(column, "bytes").to_pylist()
            for row, blob in enumerate(blobs):
                if blob is None or not keep[row]:
                    continue
                try:
                    hooked = self.media_hook(blob)
                except RejectError as err:
                    errors[int(good[row])] = err
                    keep[row] = False
                    continue
                payload[row] += len(hooked) - len(blob)
                blobs[row] = hooked
            if self.media_hook.rewrites:
                rebuilt = pa.StructArray.from_arrays(
                    [pa.array(blobs, pa.binary()), pc.struct_field(column, "path")],
                    fields=list(IMAGE_ARROW_TYPE),
                    mask=pc.invert(column.is_valid()) if column.null_count else None,
                )
                table = table.set_column(position, f, rebuilt)
        rejects = [
            RejectRecord.from_error(file, f"row:{start + index}", err)
            for index, err in sorted(errors.items())
        ]
        kept = np.flatnonzero(keep)
        return _GroupScan(
            row_group=rg,
            indices=good[kept].astype(np.int64),
            positions=start + good[kept].astype(np.int64),
            payload=payload[kept].astype(np.int64),
            hashes=[digests[i] for i in kept.tolist()],
            table=table if len(kept) == table.num_rows else table.take(pa.array(kept)),
            rejects=rejects,
        )

    def read(self, refs: Sequence[UnitRef], spec: FeatureSpec) -> pa.Table:
        """The rows of ``refs`` in the given order, in ``spec.arrow_schema()``: each row group a ref
        needs is read once, and its refs' rows are taken from it. Raises ShardfeedError if a row
        changed since ``scan``."""
        schema = spec.arrow_schema()
        if not refs:
            return schema.empty_table()
        names = sorted({ref.file for ref in refs})
        number = {name: i for i, name in enumerate(names)}
        keys = np.array([(number[ref.file], *_locator(ref)) for ref in refs], dtype=np.int64)
        order = np.lexsort((keys[:, 2], keys[:, 1], keys[:, 0]))  # by file, row group, row
        bounds = np.flatnonzero(np.any(np.diff(keys[order, :2], axis=0) != 0, axis=1)) + 1
        groups = np.split(order, bounds)  # ref indices of one (file, row group) each
        pieces: list[pa.Table] = []
        where = np.zeros(len(refs), dtype=np.int64)  # ref -> its row in the concatenated pieces
        done = 0
        for fi, mine in itertools.groupby(groups, key=lambda g: int(keys[g[0], 0])):
            file = names[fi]
            try:
                with self._open(file) as pf:
                    plan = self._check(file, pf, spec)
                    for group in mine:
                        rows, inverse = np.unique(keys[group, 2], return_inverse=True)
                        rg = int(keys[group[0], 1])
                        table = self._read_rows(file, pf, rg, rows, plan, schema)
                        digests = row_digests(table)
                        for i, k in zip(group.tolist(), inverse.tolist(), strict=True):
                            if refs[i].content_hash != digests[k]:
                                raise ShardfeedError(
                                    f"{file} row {refs[i].position} changed since it was "
                                    "scanned (content hash)"
                                )
                        if self.media_hook is not None and self.media_hook.rewrites:
                            table = self._rewrite_images(file, table)
                        where[group] = done + inverse
                        pieces.append(table)
                        done += len(rows)
            except _FileProblem as problem:
                raise ShardfeedError(
                    f"{file} changed since it was scanned: {problem.message}"
                ) from None
        return pa.concat_tables(pieces).take(pa.array(where)).combine_chunks()

    def _read_rows(
        self,
        file: str,
        pf: pq.ParquetFile,
        rg: int,
        rows: np.ndarray,
        plan: Sequence[_Column],
        schema: pa.Schema,
    ) -> pa.Table:
        """Rows ``rows`` (sorted, distinct) of row group ``rg``, converted as ``scan`` did."""
        try:
            raw = pf.read_row_group(rg).take(pa.array(rows))
            table, _, errors = convert_rows(raw, plan, schema)
        except (OSError, pa.ArrowException, IndexError) as err:
            raise ShardfeedError(
                f"{file} row group {rg} changed since it was scanned: {err}"
            ) from None
        if errors:
            row, err = min(errors.items())
            raise ShardfeedError(
                f"{file} row group {rg} row {int(rows[row])} changed since it was scanned: {err}"
            )
        return table

    def _rewrite_images(self, file: str, table: pa.Table) -> pa.Table:
        """The table with every image re-encoded by the media hook (as scan sized it)."""
        for position, f in enumerate(table.schema):
            if f.type != IMAGE_ARROW_TYPE:
                continue
            column = _one(table.column(position))
            blobs = []
            for blob in pc.struct_field(column, "bytes").to_pylist():
                try:
                    blobs.append(None if blob is None else self.media_hook(blob))
                except RejectError as err:  # it passed at scan time, so the file changed since
                    raise ShardfeedError(f"{file} changed since it was scanned ({err})") from None
            rebuilt = pa.StructArray.from_arrays(
                [pa.array(blobs, pa.binary()), pc.struct_field(column, "path")],
                fields=list(IMAGE_ARROW_TYPE),
                mask=pc.invert(column.is_valid()) if column.null_count else None,
            )
            table = table.set_column(position, f, rebuilt)
        return table


def _one(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _locator(ref: UnitRef) -> tuple[int, int]:
    """``(row_group, row_in_group)`` of a ref (a JSON-able locator, checked)."""
    loc = ref.locator
    if (
        len(loc) != 2
        or type(loc[0]) is not int  # not a bool either
        or type(loc[1]) is not int
        or loc[0] < 0
        or loc[1] < 0
    ):
        raise ShardfeedError(f"{ref.file} row {ref.position}: bad parquet locator {loc!r}")
    return loc[0], loc[1]


def _wanted(path: str) -> bool:
    """A ``*.parquet`` file none of whose path components is hidden."""
    parts = path.split("/")
    return path.endswith(SUFFIX) and not any(p.startswith(HIDDEN_PREFIXES) for p in parts)


def _glob_base(pattern: str) -> str:
    """The directory a glob's matches are relative to: its leading components without magic."""
    parts = os.path.abspath(pattern).split(os.sep)
    keep = []
    for part in parts[:-1]:
        if glob.has_magic(part):
            break
        keep.append(part)
    return os.sep.join(keep) or os.sep

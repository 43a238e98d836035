"""Per-sample cost: what a training step's memory and time grow with, recorded at conversion.

``publish`` writes one cost per sample to ``meta/shardfeed/samples.parquet`` (column ``cost``) and
the kind and bucket boundaries to the manifest (``cost``); ``shardfeed.batching`` packs batches
under a cost budget from it. Every function here is pure: a pyarrow table and its FeatureSpec in,
one int64 per row out. The kinds (``schemas.manifest.COST_KINDS``):

``tokens``
    Sum over the row's ``string`` features of ``ceil(utf8_bytes / 4)``; a null string costs 0.
    A tokenizer-free proxy: byte-level BPE vocabularies (GPT-2/Llama style) average about four
    bytes per token on English prose and code, and the count is one vectorised pyarrow kernel
    (``binary_length``). A regex word count was the alternative; it needs a regex pass and counts
    a whole sentence of a script written without spaces (Chinese, Japanese) as one word. The
    proxy under-counts such scripts too (three UTF-8 bytes a character, about one token each),
    so leave headroom in a token budget for them.
``pixels``
    Sum over the row's ``image`` features of width x height, read from the encoded image's
    header (``PIL.Image.open`` parses the header only, nothing is decoded); a null image costs 0.
    An image with no inline bytes, or whose header Pillow cannot read (a format without a
    plugin), takes its size from the feature's declared shape: the dimensions named ``height``
    and ``width`` in ``names``, else the first two of ``shape`` (LeRobot's ``(H, W, C)``).
    With neither, a :class:`CostError` names the row.
``frames``
    1 per row. In this layout a row of episodic (LeRobot) data is one frame, one timestep of an
    episode; videos live outside the rows, and a tensor's time dimension is part of its fixed
    shape, so it is the same for every row and would only rescale the budget. A ``frames``
    budget is therefore a maximum batch size in samples. Allowed for any data.
``bytes``
    The row's payload bytes (``formats.payload.table_row_bytes``), the ``bytes`` column.

``auto`` (the default) picks from the feature types: any ``image`` feature -> ``pixels``; else any
``string`` feature -> ``tokens``; else episodic data (an ``episode_index`` feature) -> ``frames``;
else ``bytes``. Images come first because decoded pixels dwarf any caption next to them.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from PIL import Image

from shardfeed.formats.image_header import read_header
from shardfeed.formats.payload import table_row_bytes
from shardfeed.schemas.errors import ShardfeedError
from shardfeed.schemas.features import Feature, FeatureSpec
from shardfeed.schemas.manifest import COST_KINDS

__all__ = [
    "AUTO",
    "BYTES_PER_TOKEN",
    "COST_CHOICES",
    "DEFAULT_COST_BUCKETS",
    "CostError",
    "cost_buckets",
    "image_pixels",
    "resolve_cost_kind",
    "row_cost",
    "text_tokens",
]

AUTO = "auto"
#: what ``DatasetOptions.cost``, ``write_dataset(cost=...)`` and ``convert --cost`` accept
COST_CHOICES = (AUTO, *COST_KINDS)
BYTES_PER_TOKEN = 4  # UTF-8 bytes per token of the ``tokens`` proxy
DEFAULT_COST_BUCKETS = 16  # buckets of the manifest's ``cost.buckets`` (one boundary fewer)

#: a kind's cost function: (table, spec, row payload bytes) -> int64 cost per row
CostFn = Callable[[pa.Table, FeatureSpec, np.ndarray], np.ndarray]


class CostError(ShardfeedError):
    """A sample's cost cannot be computed with the requested kind."""


def resolve_cost_kind(spec: FeatureSpec, requested: str = AUTO) -> str:
    """The cost kind ``requested`` means for data of ``spec``: ``auto`` by the rule in the module
    docstring; an explicit ``tokens`` or ``pixels`` needs a ``string`` or ``image`` feature."""
    if requested not in COST_CHOICES:
        raise CostError(f"cost must be one of {COST_CHOICES}, got {requested!r}")
    dtypes = {f.dtype for f in spec.stored}
    if requested == AUTO:
        if "image" in dtypes:
            return "pixels"
        if "string" in dtypes:
            return "tokens"
        return "frames" if "episode_index" in spec else "bytes"
    needs = {"tokens": "string", "pixels": "image"}.get(requested)
    if needs is not None and needs not in dtypes:
        raise CostError(
            f"cost={requested!r} needs a {needs!r} feature; the features are {spec.names}"
        )
    return requested


def row_cost(
    table: pa.Table, spec: FeatureSpec, kind: str, row_bytes: np.ndarray | None = None
) -> np.ndarray:
    """Each row's cost of ``kind`` (a resolved kind, not ``auto``), as int64 in row order.

    ``row_bytes``: the table's ``table_row_bytes`` when the caller has them (kind ``bytes``)."""
    if kind not in _KINDS:
        raise CostError(f"unknown cost kind {kind!r}; expected one of {COST_KINDS}")
    if row_bytes is None:
        row_bytes = table_row_bytes(table) if kind == "bytes" else np.zeros(0, np.int64)
    return np.asarray(_KINDS[kind](table, spec, row_bytes), dtype=np.int64)


def text_tokens(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """``ceil(utf8_bytes / 4)`` per value of a string column, nulls 0, as int64."""
    lengths = pc.binary_length(column).fill_null(0).to_numpy(zero_copy_only=False)
    return (lengths.astype(np.int64) + (BYTES_PER_TOKEN - 1)) // BYTES_PER_TOKEN


def image_pixels(column: pa.Array | pa.ChunkedArray, feature: Feature) -> np.ndarray:
    """width x height per value of an ``image`` column (nulls 0), as int64: from each image's
    header, else the feature's declared size (see the module docstring)."""
    out = np.zeros(len(column), dtype=np.int64)
    if not len(column):
        return out
    valid = pc.is_valid(column).to_numpy(zero_copy_only=False)
    declared = _declared_pixels(feature)
    for row, (view, present) in enumerate(zip(_values(column), valid, strict=True)):
        if not present:
            continue
        pixels = _view_pixels(view) if len(view) else None
        if pixels is None:
            if declared is None:
                raise CostError(
                    f"image feature {feature.name!r}, row {row}: no readable image header and no "
                    "declared shape to take its size from; declare the feature's shape, validate "
                    "the images, or record another cost (cost='bytes', --cost bytes)"
                )
            pixels = declared
        out[row] = pixels
    return out


def cost_buckets(costs: np.ndarray, buckets: int = DEFAULT_COST_BUCKETS) -> tuple[int, ...]:
    """Bucket boundaries for the manifest: the costs at the ``k / buckets`` quantiles
    (``k = 1 .. buckets - 1``; the sorted cost at position ``k * N // buckets``), without 0 and
    duplicates. So each bucket ``[b[k-1], b[k])`` holds about ``N / buckets`` samples, a cost that
    many samples share gets a bucket to itself, and there are at most ``buckets - 1`` boundaries,
    strictly increasing. Exact and deterministic over ``costs``: publish passes every sample's
    cost up to ``sample_index.COST_SAMPLE`` samples, and every k-th sample's beyond (global index
    a multiple of k), so a driver never holds every cost of a large dataset."""
    values = np.asarray(costs, dtype=np.int64).reshape(-1)
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, got {buckets}")
    if values.size == 0 or buckets == 1:
        return ()
    positions = np.arange(1, buckets, dtype=np.int64) * values.size // buckets
    picked = np.partition(values, positions)[positions]
    return tuple(int(b) for b in np.unique(picked) if b > 0)


def _tokens(table: pa.Table, spec: FeatureSpec, row_bytes: np.ndarray) -> np.ndarray:
    total = np.zeros(table.num_rows, dtype=np.int64)
    for feature in spec.stored:
        if feature.dtype == "string":
            total += text_tokens(table.column(feature.name))
    return total


def _pixels(table: pa.Table, spec: FeatureSpec, row_bytes: np.ndarray) -> np.ndarray:
    total = np.zeros(table.num_rows, dtype=np.int64)
    for feature in spec.stored:
        if feature.dtype == "image":
            total += image_pixels(table.column(feature.name), feature)
    return total


def _frames(table: pa.Table, spec: FeatureSpec, row_bytes: np.ndarray) -> np.ndarray:
    return np.ones(table.num_rows, dtype=np.int64)


def _bytes(table: pa.Table, spec: FeatureSpec, row_bytes: np.ndarray) -> np.ndarray:
    if len(row_bytes) != table.num_rows:
        raise ValueError(f"{len(row_bytes)} row sizes for a table of {table.num_rows} rows")
    return row_bytes


_KINDS: dict[str, CostFn] = {
    "tokens": _tokens,
    "pixels": _pixels,
    "frames": _frames,
    "bytes": _bytes,
}


#: Bytes of an image tried first for its size: a header in them settles it (the header reader
#: answers on a prefix only when it saw everything up to the scan data, the answer it gives on the
#: whole image); else the whole image is read
HEAD_BYTES = 4096


def _values(column: pa.Array | pa.ChunkedArray) -> Iterator[memoryview]:
    """Each value of an image column's ``bytes`` field as a view of Arrow's buffer (null and
    empty: an empty view), not a Python copy of every image."""
    field = pc.struct_field(column, "bytes")
    chunks = field.chunks if isinstance(field, pa.ChunkedArray) else [field]
    for chunk in chunks:
        if not len(chunk):
            continue
        wide = pa.types.is_large_binary(chunk.type) or pa.types.is_large_string(chunk.type)
        _, offsets, data = chunk.buffers()
        ends = np.frombuffer(offsets, np.int64 if wide else np.int32)
        ends = ends[chunk.offset : chunk.offset + len(chunk) + 1]
        view = memoryview(data) if data is not None else memoryview(b"")
        starts = ends[:-1].tolist()
        for a, b in zip(starts, ends[1:].tolist(), strict=True):
            yield view[a:b]


def _view_pixels(view: memoryview) -> int | None:
    """:func:`_header_pixels` of an image, from its first :data:`HEAD_BYTES` when they hold its
    header."""
    if len(view) > HEAD_BYTES:
        header = read_header(bytes(view[:HEAD_BYTES]))
        if header is not None:
            return header.width * header.height
    return _header_pixels(bytes(view))


def _header_pixels(data: bytes) -> int | None:
    """width x height from an encoded image's header, or None when Pillow cannot read it: our
    own header reader answers plain JPEGs and PNGs as Pillow would (about 10 us instead of 60),
    Pillow the rest."""
    header = read_header(data)
    if header is not None:
        return header.width * header.height
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
    except Exception:  # Pillow raises many types on foreign bytes; all mean "unreadable"
        return None
    return int(width) * int(height)


def _declared_pixels(feature: Feature) -> int | None:
    """height x width from the feature's shape: the dimensions ``names`` calls so, else the first
    two (LeRobot's ``(H, W, C)``); None without a 2-D or larger shape."""
    shape: Sequence[int] = feature.shape
    if len(shape) < 2:
        return None
    names = feature.names
    named = isinstance(names, (list, tuple)) and len(names) == len(shape)
    if named and "height" in names and "width" in names:
        return int(shape[names.index("height")]) * int(shape[names.index("width")])
    return int(shape[0]) * int(shape[1])

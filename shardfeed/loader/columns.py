"""Arrow columns to the loader's numpy batch: zero-copy wherever the data allows it.

- fixed tensors and numbers: ``(N, *shape)`` views of the Arrow buffers (``column_to_numpy``);
- images and other binary values: an object array of read-only ``memoryview`` slices of the
  column's value buffer (no per-sample copy; ``bytes(v)`` makes one when a consumer needs it),
  or, with ``decode_images``, uint8 pixel arrays decoded by Pillow in the loader's threads;
- strings: an object array of ``str``.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from concurrent.futures import Executor

import numpy as np
import pyarrow as pa

from shardfeed.formats.columns import column_to_numpy
from shardfeed.schemas.errors import ShardfeedError
from shardfeed.schemas.features import Feature, FeatureSpec

Batch = dict[str, np.ndarray]


class ImageDecodeError(ShardfeedError):
    """A stored image that Pillow cannot decode."""


def binary_views(array: pa.Array) -> np.ndarray:
    """Object array of memoryviews over each value of a binary array (None for nulls)."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    n = len(array)
    out = np.empty(n, dtype=object)
    if n == 0:
        return out
    _, offsets_buf, values_buf = array.buffers()[:3]
    width = np.int64 if pa.types.is_large_binary(array.type) else np.int32
    offsets = np.frombuffer(offsets_buf, dtype=width)[array.offset : array.offset + n + 1].tolist()
    values = memoryview(values_buf) if values_buf is not None else memoryview(b"")
    out[:] = [values[offsets[i] : offsets[i + 1]] for i in range(n)]
    if array.null_count:
        out[np.asarray(array.is_null())] = None
    return out


def to_batch(pieces: Sequence[pa.Table], features: FeatureSpec, names: Sequence[str]) -> Batch:
    """The columns ``names`` of the concatenated ``pieces`` as numpy. Binary values stay views
    of each piece's buffers (never combined: that would copy them); other columns are combined
    once. Images stay encoded (:func:`decode_images` decodes them)."""
    out: Batch = {}
    for name in names:
        feature = features[name]
        chunks = [c for piece in pieces for c in piece.column(name).chunks]
        if feature.dtype == "image":
            out[name] = _concat([_image_views(c) for c in chunks])
        elif pa.types.is_binary(chunks[0].type) or pa.types.is_large_binary(chunks[0].type):
            out[name] = _concat([binary_views(c) for c in chunks])
        else:
            out[name] = column_to_numpy(pa.chunked_array(chunks, chunks[0].type), feature)
    return out


def join_rows(parts: Sequence[tuple[Batch, int, int]], names: Sequence[str]) -> Batch:
    """Rows ``[a, b)`` of each converted part, in order: slices (views) when there is one part,
    else one concatenation per column (a copy of tensors; of pointers for object columns)."""
    if len(parts) == 1:
        arrays, a, b = parts[0]
        return {name: arrays[name][a:b] for name in names}
    return {name: np.concatenate([arrays[name][a:b] for arrays, a, b in parts]) for name in names}


def _image_views(chunk: pa.StructArray) -> np.ndarray:
    views = binary_views(chunk.field("bytes"))
    if chunk.null_count:  # a null image: its struct is null, whatever its child holds
        views[~np.asarray(chunk.is_valid())] = None
    return views


def _concat(arrays: list[np.ndarray]) -> np.ndarray:
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def decode_images(views: np.ndarray, feature: Feature, pool: Executor) -> np.ndarray:
    """Decode encoded images to uint8 arrays, in ``pool``'s threads (Pillow releases the GIL
    while decoding). One ``(N, H, W, C)`` array when every image has the same shape, else an
    object array of ``(H, W, C)`` arrays."""
    mode = "RGB" if feature.shape and feature.shape[-1] == 3 else None
    arrays = list(pool.map(lambda v: _decode(v, mode, feature.name), views))
    shapes = {a.shape for a in arrays}
    if len(shapes) == 1 and arrays:
        return np.stack(arrays)
    out = np.empty(len(arrays), dtype=object)
    out[:] = arrays
    return out


def _decode(view: memoryview | None, mode: str | None, name: str) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    if view is None:
        raise ImageDecodeError(f"{name}: a null image cannot be decoded")
    try:
        with Image.open(io.BytesIO(view)) as image:
            if mode is not None and image.mode != mode:
                image = image.convert(mode)
            return np.asarray(image)
    except (UnidentifiedImageError, OSError, ValueError) as err:
        raise ImageDecodeError(f"{name}: cannot decode a stored image: {err}") from None

"""Per-episode statistics of ``image`` features, computed the way LeRobot computes camera stats.

LeRobot (``lerobot.datasets.compute_stats``) samples an episode's frames at evenly spaced indices,
decodes them to RGB, downsamples large ones by striding to about 150 px, and takes per-channel
statistics over all sampled pixels, scaled to [0, 1]: every statistic has shape ``(3, 1, 1)`` and
``count`` is the number of sampled frames. We do the same so a policy that normalises its cameras
(ACT's MEAN_STD on VISUAL features) finds stats for them. The result is a :class:`FeatureStats`
(one row per pixel, ``frames`` set), so shard and dataset merging and the quantile sketch are the
numeric ones. Sampling is deterministic (no RNG) and Pillow decoding is too, so the bytes are.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from PIL import Image

from shardfeed.formats.stats import FeatureStats
from shardfeed.schemas.errors import ShardfeedError

#: shape of every image statistic: one value per RGB channel, as LeRobot writes them
IMAGE_STATS_SHAPE = (3, 1, 1)
MIN_SAMPLES = 100
MAX_SAMPLES = 10_000
SAMPLES_POWER = 0.75
DOWNSAMPLE_TARGET = 150  # px: LeRobot's auto_downsample_height_width target_size
DOWNSAMPLE_THRESHOLD = 300  # px: images whose larger side is below this are kept whole


def estimate_num_samples(
    n: int,
    min_num_samples: int = MIN_SAMPLES,
    max_num_samples: int = MAX_SAMPLES,
    power: float = SAMPLES_POWER,
) -> int:
    """How many of an episode's ``n`` frames to decode: all up to 100, then ``n**0.75``, at most 10k."""
    if n < min_num_samples:
        min_num_samples = n
    return max(min_num_samples, min(int(n**power), max_num_samples))


def sample_indices(n: int) -> np.ndarray:
    """Evenly spaced frame indices in ``[0, n)``, rounded as LeRobot does (may repeat for tiny n)."""
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    return np.round(np.linspace(0, n - 1, estimate_num_samples(n))).astype(np.int64)


def downsample(pixels: np.ndarray) -> np.ndarray:
    """Stride an ``(H, W, C)`` image down to about 150 px on its larger side, when it is >= 300 px."""
    height, width = pixels.shape[:2]
    if max(width, height) < DOWNSAMPLE_THRESHOLD:
        return pixels
    factor = int(width / DOWNSAMPLE_TARGET) if width > height else int(height / DOWNSAMPLE_TARGET)
    return pixels[::factor, ::factor]


def decode_rgb(data: bytes) -> np.ndarray:
    """Decode encoded image bytes to ``(H, W, 3)`` uint8, converted to RGB like LeRobot's loader."""
    with Image.open(io.BytesIO(data)) as img:
        return np.asarray(img.convert("RGB"), dtype=np.uint8)


def inline_positions(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Rows of an image column that hold inline bytes (null rows and path-only rows are skipped)."""
    if len(column) == 0:
        return np.zeros(0, dtype=np.int64)
    data = pc.struct_field(column, "bytes")
    valid = pc.and_(pc.is_valid(column), pc.is_valid(data))
    if isinstance(valid, pa.ChunkedArray):
        valid = valid.combine_chunks()
    return np.flatnonzero(valid.to_numpy(zero_copy_only=False))


def episode_image_stats(
    column: pa.ChunkedArray | pa.Array,
    positions: np.ndarray,
    *,
    name: str,
    episode: int,
    first_index: int = 0,
) -> FeatureStats | None:
    """Stats of the sampled frames among ``positions`` (rows of ``column`` with inline bytes).

    Only the sampled frames are read and decoded, one at a time. None when the episode has no
    inline image. A frame that fails to decode raises ShardfeedError naming the feature, episode
    and global row (``first_index`` + row): scan validated the images, so this means corrupt input.
    """
    if len(positions) == 0:
        return None
    chosen = positions[sample_indices(len(positions))]
    blobs = pc.struct_field(column.take(pa.array(chosen)), "bytes").to_pylist()
    stats = FeatureStats(IMAGE_STATS_SHAPE)
    for row, data in zip(chosen.tolist(), blobs, strict=True):
        try:
            pixels = decode_rgb(data)
        except Exception as exc:  # Pillow raises many types (OSError, ValueError, SyntaxError…)
            raise ShardfeedError(
                f"image feature {name!r}, episode {episode}: the frame at index "
                f"{first_index + row} does not decode ({type(exc).__name__}: {exc})"
            ) from exc
        stats.add(downsample(pixels).reshape(-1, 3).astype(np.float64) / 255.0)
    stats.frames = len(chosen)
    return stats


def image_stats_per_episode(
    column: pa.ChunkedArray | pa.Array,
    ranges: Sequence[tuple[int, int, int]],
    *,
    name: str,
    first_index: int = 0,
) -> list[FeatureStats | None]:
    """Per-episode image stats for ``ranges`` of ``(episode, start_row, end_row)`` in the column."""
    positions = inline_positions(column)
    out: list[FeatureStats | None] = []
    for episode, a, b in ranges:
        rows = positions[np.searchsorted(positions, a) : np.searchsorted(positions, b)]
        out.append(
            episode_image_stats(column, rows, name=name, episode=episode, first_index=first_index)
        )
    return out

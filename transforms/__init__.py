"""Per-sample logic as plain functions (decode, validate, hash, sizes), plus thin Beam wrappers.

The conversion pipeline fills this layer; nothing here may import Beam at module level except the
``*_fn.py`` wrappers that ``shardfeed.pipelines`` loads.
"""

from shardfeed.transforms.hashing import content_hash, shuffle_key, stable_bucket
from shardfeed.transforms.images import (
    DEFAULT_MAX_PIXELS,
    SUPPORTED_FORMATS,
    ImageInfo,
    reencode_image,
    validate_image,
)
from shardfeed.transforms.text import check_text, decode_utf8

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "SUPPORTED_FORMATS",
    "ImageInfo",
    "check_text",
    "content_hash",
    "decode_utf8",
    "reencode_image",
    "shuffle_key",
    "stable_bucket",
    "validate_image",
]

"""One image policy per conversion: validate every image, then optionally shrink and re-encode.

An ``ImagePolicy`` is a picklable callable ``bytes -> bytes`` that raises ``RejectError`` for bad
input; sources take it as their media hook, so validation happens while they scan (one read of each
file) and re-encoding happens again, deterministically, when a shard writer reads the image.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shardfeed.transforms.images import (
    DEFAULT_MAX_PIXELS,
    ImageFormat,
    ValidateMode,
    reencode_image,
    validate_image,
)


@dataclass(frozen=True)
class ImagePolicy:
    validate: ValidateMode = "full"
    image_format: ImageFormat = "keep"
    max_side: int | None = None
    max_pixels: int = DEFAULT_MAX_PIXELS

    @property
    def rewrites(self) -> bool:
        """Whether the output bytes may differ from the input (a shard writer must re-apply it)."""
        return self.image_format != "keep" or self.max_side is not None

    def __call__(self, data: bytes) -> bytes:
        validate_image(data, mode=self.validate, max_pixels=self.max_pixels)
        if not self.rewrites:
            return data
        return reencode_image(
            data, fmt=self.image_format, max_side=self.max_side, max_pixels=self.max_pixels
        )

    def content_options(self) -> dict[str, Any]:
        return {
            "validate": self.validate,
            "image_format": self.image_format,
            "max_image_side": self.max_side,
        }

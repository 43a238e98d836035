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
    validate_head,
    validate_image,
)

#: leading bytes read to check a header: JPEG headers end at the start of scan, past any
#: EXIF/ICC segments (tens of KB in camera files); PNG headers at the first IDAT chunk
HEAD_BYTES = 64 << 10


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

    @property
    def head_bytes(self) -> int | None:
        """How much of a file may settle its check: nothing with ``--validate none``, the header
        with ``--validate header``; None (the whole file) for full validation or re-encoding."""
        if self.rewrites or self.validate == "full":
            return None
        return 0 if self.validate == "none" else HEAD_BYTES

    def check_head(self, head: bytes) -> bool:
        """Whether a file's first :attr:`head_bytes` prove it passes (``RejectError`` when its
        header fails a check); False when only the whole file can tell (a format or header only
        Pillow reads, or a header longer than the head)."""
        return self.validate == "none" or validate_head(head, max_pixels=self.max_pixels)

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

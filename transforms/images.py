"""Image validation and re-encoding with Pillow, for untrusted image bytes.

Every failure is a :class:`~shardfeed.schemas.rejects.RejectError`; nothing else escapes for bad input
(bad *arguments* are ``ValueError``). Reason codes used here:

- ``image_empty``: zero bytes.
- ``image_not_image``: no image format recognised at all (text, random bytes, ...).
- ``image_unsupported``: a recognised image outside :data:`SUPPORTED_FORMATS` (TIFF, ICO, ...),
  or an animated image (GIF, WebP or APNG with more than one frame).
- ``image_too_large``: declared width x height above the pixel bound (checked from the header,
  before any pixel is decoded), or a PNG text-chunk bomb. The bound is
  ``min(max_pixels, Image.MAX_IMAGE_PIXELS)``, or ``max_pixels`` alone when Pillow's guard is off.
- ``image_truncated``: the data ends before the image does. Found by ``mode="full"``, and for
  WebP (whose RIFF header declares the file size) in any mode.
- ``image_corrupt``: any other decode or header error.

Pillow's process-wide settings are never changed: ``Image.MAX_IMAGE_PIXELS`` and
``ImageFile.LOAD_TRUNCATED_IMAGES`` are read, not written. If user code sets
``LOAD_TRUNCATED_IMAGES = True`` globally, Pillow pads truncated images and ``mode="full"`` can no
longer report them.

``DecompressionBombWarning`` is raised as an error inside a local ``warnings.catch_warnings``
block, which also silences Pillow's own chatter (corrupt EXIF, malformed MPO). CPython's
``catch_warnings`` is not thread-safe: concurrent blocks on several threads (Dask workers, the
multi-threaded DirectRunner) can lose or leak those two filters. So nothing depends on them: this
module checks the declared size against the bound itself, and both paths give the same reason and
the same message (``declared size of N pixels exceeds the bound of B``), as deterministic output
requires. A leaked filter can only make Pillow's bomb warning an error, or hide Pillow warnings.
"""

from __future__ import annotations

import io
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import numpy as np
from PIL import Image, UnidentifiedImageError

from shardfeed.formats.image_header import read_header
from shardfeed.schemas.rejects import RejectError

#: Pillow's own decompression-bomb bound (``Image.MAX_IMAGE_PIXELS``, about 9459 x 9459). Pillow
#: raises at twice this and warns above it; the warning is an error here, so the effective bound is
#: ``min(max_pixels, Image.MAX_IMAGE_PIXELS)``. Raise both to accept larger images.
DEFAULT_MAX_PIXELS = 89_478_485

#: Formats accepted as image payloads: the common still formats any Pillow-based loader reads
#: (torchvision's ``decode_image`` reads all but BMP). MPO is a JPEG with extra pictures appended (phone cameras write it); any JPEG
#: decoder reads its primary picture, so it is accepted and its extra frames are ignored.
#: TIFF (libtiff's large attack surface, multi-page semantics), ICO, PSD, JPEG 2000, AVIF and the
#: like are refused as ``image_unsupported``. GIF, WebP and PNG are accepted only as still images.
SUPPORTED_FORMATS: frozenset[str] = frozenset({"JPEG", "MPO", "PNG", "WEBP", "GIF", "BMP"})

#: Plugins tried on open, in this order (Pillow's JPEG plugin returns MPO images itself).
_OPEN_FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP")
#: Formats with a strong magic number, matched (never parsed) to name an unsupported format.
_OTHER_FORMATS = ("TIFF", "JPEG2000", "ICO", "CUR", "ICNS", "PSD", "DDS", "QOI", "AVIF")

ValidateMode = Literal["full", "header", "none"]
ImageFormat = Literal["keep", "jpeg", "webp", "png"]

_PIL_FORMAT = {"jpeg": "JPEG", "webp": "WEBP", "png": "PNG"}
#: Output format for ``fmt="keep"`` when a resize forces a re-encode.
_KEEP_TARGET = {
    "JPEG": "jpeg",
    "MPO": "jpeg",
    "PNG": "png",
    "WEBP": "webp",
    "GIF": "png",
    "BMP": "png",
}
#: EXIF orientation -> the transpose that displays the image upright.
_ORIENTATION = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_EXIF_ORIENTATION_TAG = 0x0112


@dataclass(frozen=True)
class ImageInfo:
    """What the header says: Pillow's format name, stored size (before EXIF orientation), mode,
    and frame count (1, or more only for MPO)."""

    format: str
    width: int
    height: int
    mode: str
    frames: int


def validate_image(
    data: bytes, *, mode: ValidateMode = "full", max_pixels: int = DEFAULT_MAX_PIXELS
) -> ImageInfo | None:
    """Prove that ``data`` is one supported still image within ``max_pixels``.

    ``"header"`` parses headers and checks format, size and animation; ``"full"`` also decodes
    every pixel, which is what catches truncation and corrupt data; ``"none"`` checks nothing
    and returns None. Raises RejectError for bad input. In ``"header"`` mode plain JPEG and PNG
    headers are read by :func:`~shardfeed.formats.image_header.read_header` without Pillow
    (same result, several times faster); everything else goes through Pillow.
    """
    _check_mode(mode)
    _check_max_pixels(max_pixels)
    if mode == "none":
        return None
    # Plain JPEG/PNG headers are read without Pillow, only where the answer is provably Pillow's.
    fast = read_header(data) if mode == "header" else None
    if fast is not None:
        _check_pixels(fast.width, fast.height, max_pixels)
        return ImageInfo(fast.format, fast.width, fast.height, fast.mode, 1)
    with _pillow_guard(max_pixels):
        img, frames = _open(data, max_pixels)
        with img:
            if mode == "full":
                img.load()
            return ImageInfo(img.format or "", img.width, img.height, img.mode, frames)


def validate_head(head: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS) -> bool:
    """``validate_image(data, mode="header")`` from the first bytes of ``data`` alone, where they
    settle it: True (passes) when :func:`~shardfeed.formats.image_header.read_header` answers,
    since it never looks past the header (JPEG: up to the start of scan; PNG: up to the first
    IDAT), so its answer on a prefix is its answer on the whole file; raises RejectError when
    that header is over ``max_pixels``; False when only the whole file can tell."""
    _check_max_pixels(max_pixels)
    fast = read_header(head)
    if fast is None:
        return False
    _check_pixels(fast.width, fast.height, max_pixels)
    return True


def reencode_image(
    data: bytes,
    *,
    fmt: ImageFormat = "keep",
    max_side: int | None = None,
    quality: int = 90,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> bytes:
    """Optionally shrink and re-encode one image; deterministic (same input, same bytes).

    - ``fmt="keep"`` with no resize needed returns ``data`` itself, untouched. Only the header is
      checked then, and nothing at all when ``max_side`` is None: validation is
      :func:`validate_image`'s job.
    - ``max_side`` shrinks (never enlarges) so the longer side equals it, keeping the aspect ratio,
      with LANCZOS.
    - ``fmt="keep"`` re-encodes JPEG/MPO as JPEG, PNG as PNG, WebP as WebP (lossless stays
      lossless) and GIF/BMP as PNG.
    - Re-encoded images carry no metadata (EXIF, ICC, XMP, comments, timestamps). The EXIF
      orientation is applied to the pixels first, so the image still displays upright.
    - Modes: palette images become RGB or RGBA (when transparent); JPEG drops alpha the way
      ``convert("RGB")`` does; CMYK and other colour spaces become RGB; 16-bit grayscale stays
      16-bit in PNG and is scaled to 8 bits for JPEG and WebP.

    ``quality`` (1-100) applies to JPEG and lossy WebP. Raises RejectError for bad input.
    """
    if fmt not in ("keep", *_PIL_FORMAT):
        raise ValueError(f"fmt must be keep, jpeg, webp or png, got {fmt!r}")
    if max_side is not None and (isinstance(max_side, bool) or max_side < 1):
        raise ValueError(f"max_side must be a positive int or None, got {max_side!r}")
    if isinstance(quality, bool) or not 1 <= quality <= 100:
        raise ValueError(f"quality must be in 1..100, got {quality!r}")
    _check_max_pixels(max_pixels)
    if fmt == "keep" and max_side is None:
        return data
    with _pillow_guard(max_pixels):
        img, _ = _open(data, max_pixels)
        with img:
            size = _fit(img.size, max_side)
            if fmt == "keep" and size == img.size:
                return data
            target = _KEEP_TARGET[img.format or ""] if fmt == "keep" else fmt
            lossless = fmt == "keep" and img.format == "WEBP" and _webp_is_lossless(data)
            img.load()
            out = _prepare(img, target, size)
            return _encode(out, target, quality, lossless)


# --- opening and error mapping ---------------------------------------------------------------


@contextmanager
def _pillow_guard(max_pixels: int) -> Iterator[None]:
    """Run Pillow code, turning every exception into a RejectError with a reason code."""
    with warnings.catch_warnings():
        # Pillow's other warnings (corrupt EXIF, malformed MPO, ...) are not actionable per record,
        # and would print for every image since catch_warnings resets the once-per-site registry.
        warnings.filterwarnings("ignore", module=r"PIL\.")
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            yield
        except RejectError:
            raise
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
            # Pillow's check ran first; say what the explicit check would have said
            found = re.search(r"\((\d+) pixels\)", str(e))
            if found is None:
                raise RejectError("image_too_large", f"decompression bomb guard: {e}") from e
            raise _too_large(int(found.group(1)), _pixel_bound(max_pixels)) from e
        except UnidentifiedImageError as e:
            raise RejectError("image_not_image", "no image format recognised") from e
        except Exception as e:  # Pillow raises OSError, ValueError, SyntaxError, struct.error, ...
            raise _classify(e) from e


def _classify(e: Exception) -> RejectError:
    text = str(e) or type(e).__name__
    low = text.lower()
    if "truncated" in low:
        return RejectError("image_truncated", text)
    if isinstance(e, MemoryError) or "decompressed data too large" in low:
        return RejectError("image_too_large", f"{type(e).__name__}: {text}")
    return RejectError("image_corrupt", f"{type(e).__name__}: {text}")


def _open(data: bytes, max_pixels: int) -> tuple[Image.Image, int]:
    """Open the header (no pixel decoding) and check format, size and animation."""
    if not data:
        raise RejectError("image_empty", "the image has 0 bytes")
    _check_riff_size(data)
    try:
        img = Image.open(io.BytesIO(data), formats=_OPEN_FORMATS)
    except UnidentifiedImageError:
        raise _unidentified(data) from None
    try:
        frames = _check_opened(img, max_pixels)
    except BaseException:
        img.close()
        raise
    return img, frames


def _check_opened(img: Image.Image, max_pixels: int) -> int:
    fmt = img.format or "?"
    if fmt not in SUPPORTED_FORMATS:
        raise RejectError("image_unsupported", f"format {fmt} is not supported")
    width, height = img.size
    _check_pixels(width, height, max_pixels)
    if width <= 0 or height <= 0:
        raise RejectError("image_corrupt", f"{fmt} declares an empty size {width}x{height}")
    if fmt == "MPO":
        return int(getattr(img, "n_frames", 1))
    if getattr(img, "is_animated", False):
        raise RejectError(
            "image_unsupported",
            f"animated {fmt} (more than one frame); only still images are supported",
        )
    return 1


def _check_pixels(width: int, height: int, max_pixels: int) -> None:
    pixels = max(1, width) * max(1, height)  # counted as Pillow's bomb check counts them
    if pixels > _pixel_bound(max_pixels):
        raise _too_large(pixels, _pixel_bound(max_pixels))


def _pixel_bound(max_pixels: int) -> int:
    pillow = Image.MAX_IMAGE_PIXELS
    return max_pixels if pillow is None else min(max_pixels, int(pillow))


def _too_large(pixels: int, bound: int) -> RejectError:
    return RejectError(
        "image_too_large", f"declared size of {pixels} pixels exceeds the bound of {bound}"
    )


def _unidentified(data: bytes) -> RejectError:
    """Name what the data is, after the supported plugins failed to open it.

    Only magic numbers are compared here; unsupported formats are never parsed.
    """
    prefix = bytes(data[:16])
    Image.init()
    for names, reason, text in (
        (_OPEN_FORMATS, "image_corrupt", "data starts like {} but its header does not parse"),
        (_OTHER_FORMATS, "image_unsupported", "format {} (by its magic number) is not supported"),
    ):
        for name in names:
            accept = Image.OPEN.get(name, (None, None))[1]
            if accept is not None and accept(prefix) is True:
                return RejectError(reason, text.format(name))
    return RejectError("image_not_image", "no image format recognised")


def _check_riff_size(data: bytes) -> None:
    """libwebp refuses a short RIFF container on open, so WebP truncation shows in any mode."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        declared = int.from_bytes(data[4:8], "little") + 8
        if declared > len(data):
            raise RejectError(
                "image_truncated", f"WebP declares {declared} bytes but has only {len(data)}"
            )


def _webp_is_lossless(data: bytes) -> bool:
    """True when the first image chunk of a RIFF/WebP file is VP8L (lossless)."""
    pos = 12
    while pos + 8 <= len(data):
        tag = bytes(data[pos : pos + 4])
        if tag == b"VP8L":
            return True
        if tag in (b"VP8 ", b"ANMF"):
            return False
        size = int.from_bytes(data[pos + 4 : pos + 8], "little")
        pos += 8 + size + (size & 1)
    return False


# --- pixel preparation and encoding ----------------------------------------------------------


def _fit(size: tuple[int, int], max_side: int | None) -> tuple[int, int]:
    """The size whose longer side is ``max_side`` (integer rounding, half up); never larger."""
    width, height = size
    longer = max(width, height)
    if max_side is None or longer <= max_side:
        return size
    return _scaled(width, max_side, longer), _scaled(height, max_side, longer)


def _scaled(side: int, num: int, den: int) -> int:
    """``side * num / den`` rounded half up, at least 1, in exact integer arithmetic."""
    return max(1, (2 * side * num + den) // (2 * den))


def _prepare(img: Image.Image, target: str, size: tuple[int, int]) -> Image.Image:
    """Orientation, working mode, resize, output mode; the result carries no metadata."""
    orientation = _orientation(img)
    img = _working_mode(img)
    if orientation in _ORIENTATION:
        img = img.transpose(_ORIENTATION[orientation])
        if orientation >= 5:  # transposed: the target size swaps too
            size = (size[1], size[0])
    if img.size != size:
        img = img.resize(size, Image.Resampling.LANCZOS)
    img = _target_mode(img, target)
    img.info = {}
    return img


def _orientation(img: Image.Image) -> int:
    try:
        return int(img.getexif().get(_EXIF_ORIENTATION_TAG, 1))
    except Exception:  # unreadable EXIF: the pixels are fine, keep them as stored
        return 1


def _working_mode(img: Image.Image) -> Image.Image:
    """One of L, LA, RGB, RGBA or I (16-bit grayscale widened), all of which LANCZOS supports."""
    mode = img.mode
    if mode in ("L", "LA", "RGB", "RGBA"):
        return img
    if mode == "1":
        return img.convert("L")
    if mode in ("P", "PA"):
        return img.convert("RGBA" if mode == "PA" or "transparency" in img.info else "RGB")
    if mode.startswith("I;16") or mode == "I":
        return img if mode == "I" else img.convert("I")
    if mode == "F":
        return Image.fromarray(np.clip(np.asarray(img), 0, 255).astype(np.uint8))
    if mode in ("La", "RGBa"):
        return img.convert(mode.upper())
    return img.convert("RGBA" if "A" in mode else "RGB")


def _target_mode(img: Image.Image, target: str) -> Image.Image:
    mode = img.mode
    if mode == "I":
        if target == "png":
            wide = np.clip(np.asarray(img), 0, 65535).astype(np.uint16)
            return Image.fromarray(wide)  # 2-D uint16: mode I;16
        narrow = (np.clip(np.asarray(img), 0, 65535) >> 8).astype(np.uint8)
        img = Image.fromarray(narrow)  # 2-D uint8: mode L
        mode = "L"
    if target == "jpeg":
        return img.convert({"LA": "L", "RGBA": "RGB"}[mode]) if mode in ("LA", "RGBA") else img
    if target == "webp" and mode in ("L", "LA"):
        return img.convert("RGB" if mode == "L" else "RGBA")
    return img


def _encode(img: Image.Image, target: str, quality: int, lossless: bool) -> bytes:
    buf = io.BytesIO()
    if target == "jpeg":
        img.save(buf, "JPEG", quality=quality, optimize=False, progressive=False)
    elif target == "webp":
        img.save(buf, "WEBP", quality=quality, method=4, lossless=lossless, exact=False)
    else:
        img.save(buf, "PNG", compress_level=6, optimize=False)
    return buf.getvalue()


def _check_mode(mode: str) -> None:
    if mode not in ("full", "header", "none"):
        raise ValueError(f"mode must be full, header or none, got {mode!r}")


def _check_max_pixels(max_pixels: int) -> None:
    if isinstance(max_pixels, bool) or not isinstance(max_pixels, int) or max_pixels < 1:
        raise ValueError(f"max_pixels must be a positive int, got {max_pixels!r}")

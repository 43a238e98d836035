"""Image validation and re-encoding (``shardfeed.transforms.images``).

Generated fixtures cover every reason code; the corpus tests run over Pillow's own odd and broken
test images in ``$SHARDFEED_CORPORA/pillow_test_images`` (skipped when the variable is unset).
"""

from __future__ import annotations

import contextlib
import io
import os
import resource
import struct
import time
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFile, ImageOps

from shardfeed.schemas.rejects import REASONS, RejectError
from shardfeed.transforms.images import (
    DEFAULT_MAX_PIXELS,
    SUPPORTED_FORMATS,
    ImageInfo,
    reencode_image,
    validate_image,
)

# --- fixtures ----------------------------------------------------------------------------------


def noise(width: int, height: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    """A deterministic noise image (noise does not compress, so truncation cuts pixel data)."""
    rng = np.random.default_rng(seed)
    arr = rng.integers(0, 256, size=(height, width, len(mode)), dtype=np.uint8)
    return Image.frombytes(mode, (width, height), arr.tobytes())


def encode(img: Image.Image, fmt: str, **params: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **params)
    return buf.getvalue()


def decode(data: bytes) -> Image.Image:
    img = Image.open(io.BytesIO(data))
    img.load()
    return img


def png_chunk(kind: bytes, payload: bytes) -> bytes:
    return (
        struct.pack(">I", len(payload))
        + kind
        + payload
        + struct.pack(">I", zlib.crc32(kind + payload) & 0xFFFFFFFF)
    )


def png_declaring(width: int, height: int) -> bytes:
    """A PNG whose IHDR (valid CRC) declares ``width`` x ``height``, followed by garbage IDAT data."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    garbage = np.random.default_rng(7).bytes(512)
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", ihdr)
        + png_chunk(b"IDAT", garbage)
        + png_chunk(b"IEND", b"")
    )


def animated(fmt: str) -> bytes:
    frames = [noise(32, 24, seed=s) for s in range(3)]
    if fmt == "GIF":
        frames = [f.convert("P") for f in frames]
    return encode(frames[0], fmt, save_all=True, append_images=frames[1:], duration=100, loop=0)


JPEG = encode(noise(256, 192), "JPEG", quality=90)
PNG = encode(noise(256, 192), "PNG")
WEBP = encode(noise(256, 192), "WEBP", quality=80)
WEBP_LOSSLESS = encode(noise(64, 48), "WEBP", lossless=True)
GIF = encode(noise(64, 48).convert("P"), "GIF")
BMP = encode(noise(64, 48), "BMP")
TIFF = encode(noise(64, 48), "TIFF")
GOOD = {"JPEG": JPEG, "PNG": PNG, "WEBP": WEBP, "GIF": GIF, "BMP": BMP}


def reject_of(data: bytes, **kwargs: object) -> RejectError:
    with pytest.raises(RejectError) as info:
        validate_image(data, **kwargs)
    assert info.value.reason in REASONS
    return info.value


# --- validate_image: accepted images ---------------------------------------------------------


@pytest.mark.parametrize("mode", ["full", "header"])
@pytest.mark.parametrize("fmt", sorted(GOOD))
def test_supported_still_images_pass(fmt: str, mode: str) -> None:
    info = validate_image(GOOD[fmt], mode=mode)
    size = (256, 192) if fmt in ("JPEG", "PNG", "WEBP") else (64, 48)
    assert info == ImageInfo(fmt, *size, "P" if fmt == "GIF" else "RGB", 1)


def test_mode_none_checks_nothing() -> None:
    assert validate_image(b"", mode="none") is None
    assert validate_image(b"not an image", mode="none") is None


def test_bad_arguments_are_value_errors() -> None:
    with pytest.raises(ValueError):
        validate_image(PNG, mode="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        validate_image(PNG, max_pixels=0)


def test_mpo_is_accepted_as_a_still_jpeg() -> None:
    data = encode(noise(40, 30), "MPO", save_all=True, append_images=[noise(40, 30, seed=1)])
    info = validate_image(data)
    assert (info.format, info.width, info.height, info.frames) == ("MPO", 40, 30, 2)
    out = reencode_image(data, max_side=20)
    assert decode(out).format == "JPEG" and decode(out).size == (20, 15)


def test_declared_pixels_bound_is_inclusive() -> None:
    data = encode(noise(64, 64), "PNG")
    assert validate_image(data, max_pixels=64 * 64).width == 64
    for mode in ("header", "full"):
        err = reject_of(data, mode=mode, max_pixels=64 * 64 - 1)
        assert err.reason == "image_too_large"
        assert err.message == "declared size of 4096 pixels exceeds the bound of 4095"


# --- validate_image: rejects -------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["full", "header"])
def test_empty_random_and_text_bytes(mode: str) -> None:
    assert reject_of(b"", mode=mode).reason == "image_empty"
    random_bytes = np.random.default_rng(3).bytes(4096)
    assert reject_of(random_bytes, mode=mode).reason == "image_not_image"
    text = b"hello, this is a caption and not an image\n" * 20
    assert reject_of(text, mode=mode).reason == "image_not_image"
    assert reject_of(b'{"text": "json"}\n', mode=mode).reason == "image_not_image"


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "GIF", "BMP"])
def test_truncation_caught_by_full_mode_only(fmt: str) -> None:
    half = GOOD[fmt][: len(GOOD[fmt]) // 2]
    assert validate_image(half, mode="header") is not None  # header parses, pixels unchecked
    err = reject_of(half, mode="full")
    assert err.reason == "image_truncated", err


@pytest.mark.parametrize("mode", ["full", "header"])
def test_truncated_webp_caught_in_any_mode(mode: str) -> None:
    """libwebp needs the whole RIFF container to open, so its declared size is checked first."""
    err = reject_of(WEBP[: len(WEBP) // 2], mode=mode)
    assert err.reason == "image_truncated" and "WebP declares" in err.message


def test_corrupt_pixel_data_caught_by_full_mode_only() -> None:
    data = bytearray(PNG)
    at = data.find(b"IDAT") + 400
    data[at : at + 2] = bytes([data[at] ^ 0xFF, data[at + 1] ^ 0x55])
    assert validate_image(bytes(data), mode="header").format == "PNG"
    assert reject_of(bytes(data), mode="full").reason == "image_corrupt"


@pytest.mark.parametrize("mode", ["full", "header"])
def test_magic_without_a_parsable_header_is_corrupt(mode: str) -> None:
    for prefix in (b"\x89PNG\r\n\x1a\n", b"GIF89a", b"\xff\xd8\xff"):
        err = reject_of(prefix + np.random.default_rng(5).bytes(300), mode=mode)
        assert err.reason == "image_corrupt", (prefix, err)


@pytest.mark.parametrize("mode", ["full", "header"])
def test_declared_huge_png_is_too_large_without_decoding(mode: str) -> None:
    data = png_declaring(100_000, 100_000)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    err = reject_of(data, mode=mode)
    assert err.reason == "image_too_large"
    assert time.perf_counter() - start < 1.0
    # 10^10 RGB pixels would be 30 GB; ru_maxrss is in KiB on Linux
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 100_000


@pytest.mark.parametrize("mode", ["full", "header"])
def test_own_bound_holds_when_pillows_guard_is_off(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    err = reject_of(png_declaring(100_000, 100_000), mode=mode)
    assert err.reason == "image_too_large"
    assert (
        err.message == f"declared size of {10**10} pixels exceeds the bound of {DEFAULT_MAX_PIXELS}"
    )


def test_pillow_bomb_warning_range_is_rejected() -> None:
    # above MAX_IMAGE_PIXELS but below 2x: Pillow only warns; the warning is an error here, and
    # Pillow's bound caps a larger max_pixels
    side = int((DEFAULT_MAX_PIXELS * 1.5) ** 0.5)
    err = reject_of(png_declaring(side, side), max_pixels=10 * DEFAULT_MAX_PIXELS)
    assert err.reason == "image_too_large"
    assert (
        err.message
        == f"declared size of {side * side} pixels exceeds the bound of {DEFAULT_MAX_PIXELS}"
    )


@pytest.mark.parametrize("side", [10_000, 100_000])  # Pillow warns / Pillow raises
def test_too_large_outcome_does_not_depend_on_warning_filters(
    side: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another thread's catch_warnings can drop our filter; the reject must read the same."""
    data = png_declaring(side, side)
    expected = reject_of(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        monkeypatch.setattr(warnings, "simplefilter", lambda *a, **k: None)
        monkeypatch.setattr(warnings, "filterwarnings", lambda *a, **k: None)
        raced = reject_of(data)
    assert (raced.reason, raced.message) == (expected.reason, expected.message)
    assert expected.message.startswith(f"declared size of {side * side} pixels")


@pytest.mark.parametrize("fmt", ["GIF", "WEBP", "PNG"])
@pytest.mark.parametrize("mode", ["full", "header"])
def test_animated_images_are_unsupported(fmt: str, mode: str) -> None:
    err = reject_of(animated(fmt), mode=mode)
    assert err.reason == "image_unsupported"
    assert "animated" in err.message


def test_other_formats_are_unsupported() -> None:
    assert "TIFF" not in SUPPORTED_FORMATS
    err = reject_of(TIFF)
    assert err.reason == "image_unsupported" and "TIFF" in err.message
    ico = encode(noise(32, 32), "ICO")
    assert reject_of(ico).reason == "image_unsupported"


def test_fuzzed_images_raise_only_reject_errors() -> None:
    """Random truncations and byte flips of every supported format: an ImageInfo or a RejectError."""
    rng = np.random.default_rng(11)
    reasons = set()
    for _ in range(60):
        for data in GOOD.values():
            mutated = bytearray(data[: int(rng.integers(1, len(data) + 1))])
            for _ in range(int(rng.integers(0, 4))):
                at = int(rng.integers(0, len(mutated)))
                mutated[at] = int(rng.integers(0, 256))
            for mode in ("header", "full"):
                try:
                    validate_image(bytes(mutated), mode=mode)
                except RejectError as e:
                    assert e.reason in REASONS
                    reasons.add(e.reason)
    assert {"image_truncated", "image_corrupt"} <= reasons


def test_no_global_pillow_or_warnings_state_leaks() -> None:
    filters = list(warnings.filters)
    bound = Image.MAX_IMAGE_PIXELS
    for data in (JPEG, JPEG[:1000], png_declaring(100_000, 100_000), b"", TIFF, animated("GIF")):
        for mode in ("full", "header"):
            with contextlib.suppress(RejectError):
                validate_image(data, mode=mode)
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False
    assert bound == Image.MAX_IMAGE_PIXELS
    assert list(warnings.filters) == filters


# --- reencode_image ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["jpeg", "webp", "png"])
def test_reencode_resizes_to_the_longer_side(fmt: str) -> None:
    out = reencode_image(JPEG, fmt=fmt, max_side=64)  # type: ignore[arg-type]
    img = decode(out)
    assert img.format == fmt.upper()
    assert img.size == (64, 48)
    portrait = encode(noise(30, 100), "PNG")
    assert decode(reencode_image(portrait, fmt=fmt, max_side=10)).size == (3, 10)  # type: ignore[arg-type]
    sliver = encode(noise(1000, 1), "PNG")
    assert decode(reencode_image(sliver, fmt=fmt, max_side=10)).size == (10, 1)  # type: ignore[arg-type]


@pytest.mark.parametrize("fmt", ["jpeg", "webp", "png"])
def test_reencode_is_deterministic(fmt: str) -> None:
    first = reencode_image(PNG, fmt=fmt, max_side=100, quality=80)  # type: ignore[arg-type]
    second = reencode_image(bytes(PNG), fmt=fmt, max_side=100, quality=80)  # type: ignore[arg-type]
    assert first == second
    assert reencode_image(PNG, fmt=fmt) == reencode_image(PNG, fmt=fmt)  # type: ignore[arg-type]


def test_keep_returns_the_same_bytes_object() -> None:
    assert reencode_image(JPEG) is JPEG
    assert reencode_image(JPEG, max_side=256) is JPEG  # already fits
    assert reencode_image(b"anything", fmt="keep") == b"anything"  # pure pass-through


@pytest.mark.parametrize(
    ("data", "expected"),
    [(JPEG, "JPEG"), (PNG, "PNG"), (WEBP, "WEBP"), (GIF, "PNG"), (BMP, "PNG")],
)
def test_keep_with_resize_keeps_the_encoding(data: bytes, expected: str) -> None:
    out = reencode_image(data, max_side=32)
    assert decode(out).format == expected
    assert max(decode(out).size) == 32


def test_keep_keeps_lossless_webp_lossless() -> None:
    out = reencode_image(WEBP_LOSSLESS, max_side=32)
    assert out[12:16] == b"VP8L"
    assert reencode_image(WEBP, max_side=32)[12:16] == b"VP8 "


def test_rgba_and_palette_transparency() -> None:
    rgba = encode(noise(50, 40, "RGBA"), "PNG")
    as_jpeg = decode(reencode_image(rgba, fmt="jpeg"))
    assert (as_jpeg.format, as_jpeg.mode, as_jpeg.size) == ("JPEG", "RGB", (50, 40))
    assert decode(reencode_image(rgba, fmt="webp")).mode == "RGBA"
    palette = noise(20, 20).convert("P")
    palette.info["transparency"] = 0
    as_png = decode(reencode_image(encode(palette, "PNG"), fmt="png"))
    assert as_png.mode == "RGBA"


def test_cmyk_and_16_bit_modes() -> None:
    cmyk = encode(noise(20, 10, "CMYK"), "JPEG")
    assert decode(reencode_image(cmyk, fmt="jpeg")).mode == "RGB"
    values = np.arange(200, dtype=np.uint16).reshape(10, 20) * 300
    gray16 = encode(Image.frombytes("I;16", (20, 10), values.astype("<u2").tobytes()), "PNG")
    as_png = decode(reencode_image(gray16, fmt="png"))
    assert as_png.mode.startswith("I")
    assert np.array_equal(np.asarray(as_png).astype(np.int64), values.astype(np.int64))
    as_jpeg = decode(reencode_image(gray16, fmt="jpeg"))
    assert as_jpeg.mode == "L"
    assert abs(int(np.asarray(as_jpeg).max()) - (199 * 300 >> 8)) <= 4


def test_metadata_is_stripped_and_orientation_applied() -> None:
    src = Image.new("RGB", (40, 20), (255, 0, 0))
    src.paste((0, 0, 255), (0, 0, 10, 10))  # a blue corner to tell orientations apart
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise on display
    exif[0x010E] = "a description"
    data = encode(src, "PNG", exif=exif.tobytes(), icc_profile=b"\0" * 64)
    out = reencode_image(data, fmt="png")
    img = decode(out)
    assert "exif" not in img.info and "icc_profile" not in img.info
    expected = ImageOps.exif_transpose(decode(data)).convert("RGB")
    assert img.size == expected.size == (20, 40)
    assert np.array_equal(np.asarray(img), np.asarray(expected))
    jpeg = encode(src, "JPEG", exif=exif.tobytes(), comment=b"timestamp 2024-01-01")
    out = decode(reencode_image(jpeg, fmt="jpeg", max_side=20))
    assert out.size == (10, 20)
    assert "exif" not in out.info and "comment" not in out.info


def test_reencode_rejects_bad_input() -> None:
    with pytest.raises(RejectError) as e:
        reencode_image(JPEG[: len(JPEG) // 2], fmt="png")
    assert e.value.reason == "image_truncated"
    for data, reason in (
        (b"", "image_empty"),
        (b"plain text", "image_not_image"),
        (animated("GIF"), "image_unsupported"),
        (png_declaring(100_000, 100_000), "image_too_large"),
    ):
        with pytest.raises(RejectError) as e:
            reencode_image(data, fmt="jpeg")
        assert e.value.reason == reason
    with pytest.raises(RejectError) as e:
        reencode_image(PNG, max_side=10, max_pixels=100)
    assert e.value.reason == "image_too_large"


def test_reencode_bad_arguments() -> None:
    for kwargs in ({"fmt": "gif"}, {"max_side": 0}, {"quality": 0}, {"quality": 101}):
        with pytest.raises(ValueError):
            reencode_image(PNG, **kwargs)  # type: ignore[arg-type]


# --- the real corpus: Pillow's own test images ------------------------------------------------

CORPORA = os.environ.get("SHARDFEED_CORPORA")
PILLOW_IMAGES = Path(CORPORA, "pillow_test_images") if CORPORA else None
needs_corpus = pytest.mark.skipif(
    not CORPORA, reason="SHARDFEED_CORPORA is not set (scripts/test.sh sets it)"
)

#: Known-bad files and the reason each must get.
KNOWN_BAD = {
    "truncated_jpeg.jpg": "image_truncated",
    "truncated_image.png": "image_truncated",
    "truncated_end_chunk.png": "image_truncated",
    "bmp/b/shortfile.bmp": "image_truncated",
    "decompression_bomb.gif": "image_too_large",
    "bmp/b/reallybig.bmp": "image_too_large",
    "bmp/b/badwidth.bmp": "image_too_large",
    "l2rgb_read.bmp": "image_too_large",  # 151M pixels: over the default bound
    "png_decompression_dos.png": "image_too_large",  # text-chunk bomb
    "broken.png": "image_corrupt",
    "broken_data_stream.png": "image_corrupt",
    "unknown_compression_method.png": "image_corrupt",
    "zero_width.gif": "image_corrupt",
    "bmp/b/badbitcount.bmp": "image_corrupt",
    "bmp/b/badheadersize.bmp": "image_corrupt",
    "bmp/b/badpalettesize.bmp": "image_corrupt",
    "libtiff_segfault.tif": "image_unsupported",
    "oom-225817ca0f8c663be7ab4b9e717b02c661e66834.tif": "image_unsupported",
    "chi.gif": "image_unsupported",  # animated
    "iss634.webp": "image_unsupported",  # animated
    "blend_transparency.png": "image_unsupported",  # APNG
    "bmp/README.txt": "image_not_image",
}
KNOWN_GOOD = {
    "hopper.jpg": ("JPEG", 128, 128),
    "hopper.png": ("PNG", 128, 128),
    "hopper.webp": ("WEBP", 128, 128),
    "hopper.bmp": ("BMP", 128, 128),
    "hopper.gif": ("GIF", 128, 128),
    "flower.jpg": ("JPEG", 480, 360),
    "pil_sample_cmyk.jpg": ("JPEG", 100, 100),
    "transparent.webp": ("WEBP", 200, 150),
    "i_trns.png": ("PNG", 64, 64),
    "bmp/g/pal8rle.bmp": ("BMP", 127, 64),
}


def corpus_files() -> dict[str, bytes]:
    assert PILLOW_IMAGES is not None and PILLOW_IMAGES.is_dir(), PILLOW_IMAGES
    return {
        p.relative_to(PILLOW_IMAGES).as_posix(): p.read_bytes()
        for p in sorted(PILLOW_IMAGES.rglob("*"))
        if p.is_file()
    }


def outcome(data: bytes, mode: str) -> ImageInfo | RejectError:
    try:
        info = validate_image(data, mode=mode)  # type: ignore[arg-type]
    except RejectError as e:
        assert e.reason in REASONS
        return e
    assert isinstance(info, ImageInfo)
    return info


@needs_corpus
def test_corpus_full_validation() -> None:
    files = corpus_files()
    assert len(files) > 250
    results = {name: outcome(data, "full") for name, data in files.items()}
    for name, reason in KNOWN_BAD.items():
        got = results[name]
        assert isinstance(got, RejectError) and got.reason == reason, (name, got)
    for name, (fmt, width, height) in KNOWN_GOOD.items():
        got = results[name]
        assert isinstance(got, ImageInfo), (name, got)
        assert (got.format, got.width, got.height) == (fmt, width, height)
    for name in files:
        if name.startswith("bmp/g/") and name != "bmp/g/rgb32bf.bmp":  # Pillow cannot read that one
            assert isinstance(results[name], ImageInfo), (name, results[name])
        if name.startswith("crash-") or name.endswith((".tif", ".tiff")):
            assert results[name].reason == "image_unsupported", name  # type: ignore[union-attr]

    # Never accept what Pillow itself cannot load (the collector's per-file record).
    expected = {}
    for line in (PILLOW_IMAGES / "EXPECTED_PIL_RESULTS.txt").read_text().splitlines():
        if "|" in line and not line.startswith("#"):
            name, result = line.split("|", 1)
            expected[name] = result
    assert len(expected) > 250
    for name, result in expected.items():
        got = results[name]
        if result.startswith("FAIL"):
            assert isinstance(got, RejectError), (name, result, got)
        elif isinstance(got, ImageInfo):
            _, fmt, mode, size = result.split(" ", 3)
            assert (got.format, got.mode, f"({got.width}, {got.height})") == (fmt, mode, size)
        else:  # Pillow reads it, we refuse it: only for formats or features we do not support
            assert got.reason == "image_unsupported", (name, got)
    accepted = [r for r in results.values() if isinstance(r, ImageInfo)]
    assert len(accepted) > 150


@needs_corpus
def test_corpus_header_mode_is_a_superset_and_reencode_works() -> None:
    for name, data in corpus_files().items():
        full = outcome(data, "full")
        header = outcome(data, "header")
        if isinstance(full, ImageInfo):
            assert header == full, name
            out = decode(reencode_image(data, fmt="jpeg", max_side=48))
            longer = max(full.width, full.height)
            assert max(out.size) == min(48, longer), name
        elif isinstance(header, RejectError):
            assert header.reason == full.reason, name
        else:  # only decoding finds these
            assert full.reason in ("image_truncated", "image_corrupt"), (name, full)

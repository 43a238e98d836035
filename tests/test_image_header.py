"""Differential tests for the fast header reader (``shardfeed.formats.image_header``).

``validate_image(data, mode="header")`` must give exactly what the pure Pillow path gives (the same
ImageInfo, or a RejectError with the same reason and message) for every input: generated JPEGs and
PNGs, hand-patched odd ones, truncated prefixes, mutations and random bytes, and every file of
Pillow's own test-image corpus in ``$SHARDFEED_CORPORA/pillow_test_images`` (skipped only when the
variable is unset). Plain common images must also be answered by the fast path itself, so these
tests fail if it silently always defers to Pillow.
"""

from __future__ import annotations

import functools
import io
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFile, PngImagePlugin

from shardfeed.formats import image_header
from shardfeed.formats.image_header import read_header
from shardfeed.schemas.rejects import RejectError
from shardfeed.transforms import images as images_module
from shardfeed.transforms.images import DEFAULT_MAX_PIXELS, ImageInfo, validate_image

Outcome = tuple[str, object, object]

# --- the differential check ----------------------------------------------------------------


def outcome(data: bytes, max_pixels: int) -> Outcome:
    """What header validation says: ("ok", ImageInfo, None) or ("reject", reason, message)."""
    try:
        info = validate_image(data, mode="header", max_pixels=max_pixels)
    except RejectError as e:
        return ("reject", e.reason, e.message)
    assert isinstance(info, ImageInfo)
    return ("ok", info, None)


def pillow_outcome(data: bytes, max_pixels: int) -> Outcome:
    """The same validation with the fast path switched off: Pillow alone decides."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(images_module, "read_header", lambda data: None)
        return outcome(data, max_pixels)


def check(data: bytes, *, answered: bool = False, label: str = "") -> Outcome:
    """Assert the fast and pure-Pillow paths agree, at the default and a tiny pixel bound.

    ``answered=True`` also asserts that the fast path itself answered (did not defer to Pillow).
    """
    for max_pixels in (DEFAULT_MAX_PIXELS, 1000):
        fast, slow = outcome(data, max_pixels), pillow_outcome(data, max_pixels)
        assert fast == slow, (label, max_pixels, fast, slow)
    if answered:
        assert image_header._ENABLED, "fast path disabled: re-verify it for this Pillow version"
        assert read_header(data) is not None, (label, slow)
    return outcome(data, DEFAULT_MAX_PIXELS)


# --- generators ----------------------------------------------------------------------------


def noise(width: int, height: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    """A deterministic noise image in any mode (converted from RGB noise)."""
    arr = np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    if mode == "I;16":
        return Image.fromarray(arr[..., 0].astype(np.uint16) * 257)
    return Image.frombytes("RGB", (width, height), arr.tobytes()).convert(mode)


def encode(img: Image.Image, fmt: str, **params: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **params)
    return buf.getvalue()


def png_chunk(kind: bytes, payload: bytes) -> bytes:
    crc = zlib.crc32(kind + payload) & 0xFFFFFFFF
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", crc)


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def raw_png(
    width: int,
    height: int,
    depth: int,
    colour: int,
    *,
    before_idat: tuple[bytes, ...] = (),
    interlace: int = 0,
    ihdr_extra: bytes = b"",
) -> bytes:
    """A hand-built PNG of any bit depth / colour type, with chunks inserted before IDAT."""
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}.get(colour, 1)
    row = (width * channels * depth + 7) // 8
    raw = b"".join(b"\0" + bytes(row) for _ in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, interlace) + ihdr_extra
    plte = png_chunk(b"PLTE", bytes(range(48))) if colour == 3 else b""
    return (
        PNG_MAGIC
        + png_chunk(b"IHDR", ihdr)
        + plte
        + b"".join(before_idat)
        + png_chunk(b"IDAT", zlib.compress(raw))
        + png_chunk(b"IEND", b"")
    )


def with_chunks(png: bytes, *chunks: bytes) -> bytes:
    """Insert chunks right after IHDR (signature 8 + IHDR 25 bytes)."""
    return png[:33] + b"".join(chunks) + png[33:]


def jpeg_segments(data: bytes) -> Iterator[tuple[int, int, int]]:
    """(offset, marker, total length) of each length-prefixed segment up to and including SOS."""
    pos = 2
    while pos + 4 <= len(data) and data[pos] == 0xFF:
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        length = struct.unpack_from(">H", data, pos + 2)[0]
        yield pos, marker, 2 + length
        if marker == 0xDA:
            return
        pos += 2 + length


def sof_offset(data: bytes) -> int:
    return next(pos for pos, marker, _ in jpeg_segments(data) if marker in (0xC0, 0xC1, 0xC2))


def patch(data: bytes, offset: int, new: bytes) -> bytes:
    return data[:offset] + new + data[offset + len(new) :]


def jpeg_sized(data: bytes, width: int, height: int) -> bytes:
    """Patch the SOF size fields (T.81 B.2.2: P at +4, Y at +5, X at +7 from the marker)."""
    return patch(data, sof_offset(data) + 5, struct.pack(">HH", height, width))


def png_sized(data: bytes, width: int, height: int) -> bytes:
    """Patch the IHDR size fields and recompute its CRC."""
    ihdr = struct.pack(">II", width, height) + data[24:29]
    return data[:8] + png_chunk(b"IHDR", ihdr) + data[33:]


def sof_grown(data: bytes, extra: bytes) -> bytes:
    """Append ``extra`` to the SOF segment (fixing its length field)."""
    sof = sof_offset(data)
    length = struct.unpack_from(">H", data, sof + 2)[0]
    end = sof + 2 + length
    grown = data[:end] + extra + data[end:]
    return patch(grown, sof + 2, struct.pack(">H", length + len(extra)))


def insert_after_soi(data: bytes, segment: bytes) -> bytes:
    return data[:2] + segment + data[2:]


def app(marker: int, payload: bytes) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">H", len(payload) + 2) + payload


def exif_block(**tags: object) -> bytes:
    exif = Image.Exif()
    for tag, value in tags.items():
        exif[int(tag[1:], 16)] = value
    return exif.tobytes()


def exif_resolution(rationals: list[tuple[int, int]], unit: int | None = 2) -> bytes:
    """An EXIF block (little-endian TIFF) holding XResolution as ``rationals``, raw."""
    data = b"".join(struct.pack("<II", num, den) for num, den in rationals)
    return exif_xres(5, len(rationals), data, unit)


def exif_xres(kind: int, count: int, value: bytes, unit: int | None = 2) -> bytes:
    """An EXIF block whose XResolution has any TIFF type, count and raw value bytes."""
    entries = [(0x011A, kind, count, 26 + 12 * (unit is not None))]
    if unit is not None:
        entries.append((0x0128, 3, 1, unit))
    if len(value) <= 4:  # TIFF stores values of up to 4 bytes in the offset field itself
        entries[0] = (0x011A, kind, count, int.from_bytes(value.ljust(4, b"\0"), "little"))
        value = b""
    ifd = struct.pack("<H", len(entries))
    ifd += b"".join(struct.pack("<HHII", *entry) for entry in entries) + struct.pack("<I", 0)
    return b"Exif\0\0II*\0" + struct.pack("<I", 8) + ifd + value


def cuts(data: bytes) -> list[int]:
    """Cut points: tiny prefixes, every JPEG/PNG structure boundary +-1, and fractions."""
    points = {1, 2, 3, 4, 5, 8, 9, 12, 16, 20, 33, len(data) // 4, len(data) // 2, len(data) - 1}
    if data.startswith(b"\xff\xd8"):
        for pos, _, total in jpeg_segments(data):
            points.update({pos + 1, pos + 3, pos + 5, pos + total - 1, pos + total})
    elif data.startswith(PNG_MAGIC):
        pos = 8
        while pos + 8 <= len(data):
            length = struct.unpack_from(">I", data, pos)[0]
            points.update({pos + 4, pos + 7, pos + 8, pos + 12 + length - 1, pos + 12 + length})
            pos += 12 + length
    return sorted(p for p in points if 0 < p < len(data))


# --- fixtures: plain images the fast path must answer ----------------------------------------

_ICC = b"\0" * 36 + b"acsp" + bytes(range(256)) * 4  # writers do not parse profiles
_BIG_ICC = bytes(range(256)) * 400  # 102 400 bytes: split over two APP2 segments


@functools.cache
def plain_jpegs() -> dict[str, bytes]:
    rgb = noise(97, 61)
    exif = exif_block(x0112=6, x011A=300.0, x011B=300.0, x0128=2)
    return {
        "L": encode(noise(40, 30, "L"), "JPEG"),
        "RGB": encode(rgb, "JPEG", quality=90),
        "RGB-444": encode(rgb, "JPEG", subsampling=0),
        "RGB-q100": encode(rgb, "JPEG", quality=100),
        "CMYK": encode(noise(33, 17, "CMYK"), "JPEG"),
        "progressive": encode(rgb, "JPEG", progressive=True),
        "optimized": encode(rgb, "JPEG", optimize=True),
        "dpi": encode(rgb, "JPEG", dpi=(150, 150)),
        "exif": encode(rgb, "JPEG", exif=exif),
        "exif-no-dpi": encode(rgb, "JPEG", exif=exif_block(x0112=3)),
        "exif-cm": encode(rgb, "JPEG", exif=exif_block(x011A=30.0, x0128=3)),
        "exif-and-dpi": encode(rgb, "JPEG", exif=exif, dpi=(72, 72)),
        "icc": encode(rgb, "JPEG", icc_profile=_ICC),
        "big-icc": encode(rgb, "JPEG", icc_profile=_BIG_ICC),
        "comment": encode(rgb, "JPEG", comment=b"made by a test \xff\xd9"),
        "xmp": encode(rgb, "JPEG", xmp=b'<x:xmpmeta tiff:Orientation="3"/>'),
        "restart": encode(rgb, "JPEG", restart_marker_blocks=2),
        "everything": encode(
            rgb, "JPEG", progressive=True, exif=exif, icc_profile=_ICC, comment=b"hi", xmp=b"<x/>"
        ),
        "1x1": encode(noise(1, 1), "JPEG"),
        "wide": encode(noise(2000, 1), "JPEG"),
        "sof1": patch(encode(rgb, "JPEG"), sof_offset(encode(rgb, "JPEG")) + 1, b"\xc1"),
        "photoshop": insert_after_soi(
            encode(rgb, "JPEG"),
            app(
                0xED,
                b"Photoshop 3.0\0"
                + b"8BIM\x03\xed\0\0"
                + struct.pack(">I", 16)
                + struct.pack(">IHHIHH", 72 << 16, 1, 1, 72 << 16, 1, 1)
                + b"8BIM\x04\x04\x03abc"
                + struct.pack(">I", 3)
                + b"xyz\0",
            ),
        ),
        "adobe": insert_after_soi(encode(rgb, "JPEG"), app(0xEE, b"Adobe\0\x64\0\0\0\0\x01")),
        "fill-bytes": insert_after_soi(encode(rgb, "JPEG"), b"\xff\xff\xff"),
        "app15": insert_after_soi(encode(rgb, "JPEG"), app(0xEF, b"whatever")),
        "16-bit-dqt": insert_after_soi(encode(rgb, "JPEG"), app(0xDB, b"\x13" + bytes(128))),
        "empty-app": insert_after_soi(encode(rgb, "JPEG"), app(0xE3, b"")),
    }


@functools.cache
def plain_pngs() -> dict[str, bytes]:
    info = PngImagePlugin.PngInfo()
    info.add_text("Software", "test")
    info.add_text("Comment", "zipped " * 50, zip=True)
    info.add_itxt("Title", "\u00e9t\u00e9", lang="fr", tkey="Titre")
    info.add_itxt("Description", "long " * 100, zip=True)
    info.add_itxt("XML:com.adobe.xmp", '<x tiff:Orientation="6"/>')
    p = noise(21, 13, "P")
    out = {
        mode: encode(noise(23, 11, mode), "PNG")
        for mode in ("1", "L", "LA", "P", "RGB", "RGBA", "I;16")
    }
    out |= {
        "P-trns-index": encode(p, "PNG", transparency=3),
        "P-trns-bytes": encode(p, "PNG", transparency=bytes(range(0, 255, 3))),
        "L-trns": encode(noise(9, 9, "L"), "PNG", transparency=7),
        "RGB-trns": encode(noise(9, 9), "PNG", transparency=(1, 2, 3)),
        "1-trns": encode(noise(9, 9, "1"), "PNG", transparency=1),
        "I16-trns": encode(noise(9, 9, "I;16"), "PNG", transparency=300),
        "P-2bit": encode(p, "PNG", bits=2),
        "P-4bit": encode(p, "PNG", bits=4),
        "text": encode(noise(9, 9), "PNG", pnginfo=info),
        "icc": encode(noise(9, 9), "PNG", icc_profile=_ICC),
        "exif": encode(noise(9, 9), "PNG", exif=exif_block(x0112=6)),
        "dpi": encode(noise(9, 9), "PNG", dpi=(300, 300)),
        "optimized": encode(noise(9, 9), "PNG", optimize=True),
        "gray-2bit": raw_png(7, 5, 2, 0),
        "gray-4bit": raw_png(7, 5, 4, 0),
        "rgb-16": raw_png(7, 5, 16, 2),
        "rgba-16": raw_png(7, 5, 16, 6),
        "la-16": raw_png(7, 5, 16, 4),
        "interlaced": raw_png(7, 5, 8, 2, interlace=1),
        "interlaced-P": raw_png(7, 5, 8, 3, interlace=1),
        "ancillary": raw_png(
            7,
            5,
            8,
            6,
            before_idat=(
                png_chunk(b"gAMA", struct.pack(">I", 45455)),
                png_chunk(b"cHRM", struct.pack(">8I", *range(8))),
                png_chunk(b"sRGB", b"\0"),
                png_chunk(b"pHYs", struct.pack(">IIB", 2835, 2835, 1)),
                png_chunk(b"prVt", b"private data"),
                png_chunk(b"tIME", bytes(7)),
                png_chunk(b"tEXt", b"no separator"),
                png_chunk(b"tEXt", b"\0empty key"),
                png_chunk(b"iTXt", b"bad"),
                png_chunk(b"iTXt", b"k\0\x01\x05\0\0unknown method"),
                png_chunk(b"iTXt", b"k\0\x01\0\0\0not zlib"),
                png_chunk(b"iTXt", b"k\0\0\0\0\0\xff\xfe not utf-8"),
                png_chunk(b"zTXt", b"k\0\0not zlib"),
                png_chunk(b"zTXt", b"only a key"),
                png_chunk(b"iCCP", b"name\0\0not zlib"),
            ),
        ),
        "huge-1x": png_sized(encode(noise(4, 4), "PNG"), 1, 2**31 - 1),
    }
    return out


# --- generated cases -------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(plain_jpegs()))
def test_plain_jpegs_are_answered_and_agree(name: str) -> None:
    data = plain_jpegs()[name]
    got = check(data, answered=True, label=name)
    assert got[0] == "ok", got
    with Image.open(io.BytesIO(data)) as img:  # the answer is also what Pillow itself reports
        assert got[1] == ImageInfo("JPEG", img.width, img.height, img.mode, 1)


@pytest.mark.parametrize("name", sorted(plain_pngs()))
def test_plain_pngs_are_answered_and_agree(name: str) -> None:
    data = plain_pngs()[name]
    got = check(data, answered=True, label=name)
    if name.startswith("huge"):
        assert got[:2] == ("reject", "image_too_large"), got
        return
    assert got[0] == "ok", got
    with Image.open(io.BytesIO(data)) as img:
        assert got[1] == ImageInfo("PNG", img.width, img.height, img.mode, 1)


@pytest.mark.parametrize(
    ("width", "height"), [(65535, 65535), (10000, 10000), (9460, 9459), (9459, 9459), (40, 3)]
)
def test_bomb_sized_declarations_agree(width: int, height: int) -> None:
    for name, data in plain_jpegs().items():
        check(jpeg_sized(data, width, height), answered=True, label=name)
    for name, data in plain_pngs().items():
        if not name.startswith("huge"):
            check(png_sized(data, width, height), answered=True, label=name)
    for side in (2**32 - 1, 2**31, 100_000):
        check(png_sized(plain_pngs()["RGB"], side, side), answered=True)


def test_bounds_agree_when_pillows_guard_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    check(jpeg_sized(plain_jpegs()["RGB"], 65535, 65535), answered=True)
    check(png_sized(plain_pngs()["RGB"], 2**32 - 1, 2**32 - 1), answered=True)


def test_exact_pixel_bound_messages() -> None:
    data = jpeg_sized(plain_jpegs()["RGB"], 50, 21)  # 1050 pixels
    with pytest.raises(RejectError) as info:
        validate_image(data, mode="header", max_pixels=1049)
    assert (info.value.reason, info.value.message) == (
        "image_too_large",
        "declared size of 1050 pixels exceeds the bound of 1049",
    )
    assert validate_image(data, mode="header", max_pixels=1050) == ImageInfo(
        "JPEG", 50, 21, "RGB", 1
    )


@functools.cache
def odd_jpegs() -> dict[str, bytes]:
    """Hand-patched JPEGs, most of which the fast path must leave to Pillow."""
    base = plain_jpegs()["RGB"]
    sof = sof_offset(base)
    no_jfif = base[:2] + base[20:]  # Pillow's APP0 JFIF segment is 18 bytes
    assert base[2:4] == b"\xff\xe0" and base[20:22] != b"\xff\xe0"
    return {
        "12-bit": patch(base, sof + 4, b"\x0c"),
        "sof3": patch(base, sof + 1, b"\xc3"),
        "sof9-arith": patch(base, sof + 1, b"\xc9"),
        "sof10-arith": patch(base, sof + 1, b"\xca"),
        "2-components": patch(base, sof + 9, b"\x02"),
        "5-components": patch(base, sof + 9, b"\x05"),
        "zero-height": jpeg_sized(base, 10, 0),
        "zero-width": jpeg_sized(base, 0, 10),
        "sof-too-long": insert_after_soi(base, app(0xC0, b"\x08\0\x10\0\x10\x01\x01\x11\0\0")),
        "two-sofs": insert_after_soi(base, app(0xC0, b"\x08\0\x10\0\x10\x01\x01\x11\0")),
        "sof-short": insert_after_soi(base, app(0xC0, b"\x08\0\x10")),
        "mpf": insert_after_soi(base, app(0xE2, b"MPF\0garbage")),
        "mpo": encode(noise(20, 10), "MPO", save_all=True, append_images=[noise(20, 10, seed=1)]),
        "junk-between": insert_after_soi(base, b"\x00\x01"),
        "escaped-ff00": insert_after_soi(base, b"\xff\x00"),
        "rst-before-sos": insert_after_soi(base, b"\xff\xd0"),
        "eoi-before-sos": insert_after_soi(base, b"\xff\xd9"),
        "second-soi": insert_after_soi(base, b"\xff\xd8"),
        "no-marker": insert_after_soi(base, b"\xff\x01\x00\x04ab"),
        "length-0": insert_after_soi(base, b"\xff\xe3\x00\x00"),
        "length-1": insert_after_soi(base, b"\xff\xe3\x00\x01"),
        "jfif-short": insert_after_soi(base, app(0xE0, b"JFIF\0")),
        "jfif-7": insert_after_soi(base, app(0xE0, b"JFIF\0\x01\x02")),
        "jfif-dpi-unit-2": insert_after_soi(base, app(0xE0, b"JFIF\0\x01\x02\x02\0\x48\0\x48")),
        "adobe-short": insert_after_soi(base, app(0xEE, b"Adobe\0")),
        "icc-short": insert_after_soi(base, app(0xE2, b"ICC_PROFILE\0\x01")),
        "icc-wrong-count": insert_after_soi(base, app(0xE2, b"ICC_PROFILE\0\x01\x05data")),
        "photoshop-no-name-len": insert_after_soi(
            base, app(0xED, b"Photoshop 3.0\x008BIM\x04\x04")
        ),
        "photoshop-short-size": insert_after_soi(
            base, app(0xED, b"Photoshop 3.0\x008BIM\x04\x04\0\0")
        ),
        "photoshop-short-id": insert_after_soi(base, app(0xED, b"Photoshop 3.0\x008BIM\x04")),
        "photoshop-bad-res": insert_after_soi(
            base, app(0xED, b"Photoshop 3.0\x008BIM\x03\xed\0\0\0\0\0\x02ab")
        ),
        "dqt-short": insert_after_soi(base, app(0xDB, b"\x00" + bytes(10))),
        "dqt-16-short": insert_after_soi(base, app(0xDB, b"\x10" + bytes(64))),
        "dqt-empty": insert_after_soi(base, app(0xDB, b"")),
        "dnl": insert_after_soi(base, app(0xDC, b"\0\x10")),
        "exif-garbage": insert_after_soi(no_jfif, app(0xE1, b"Exif\0\0garbage!!")),
        "exif-only-header": insert_after_soi(no_jfif, app(0xE1, b"Exif\0\0")),
        "exif-twice": insert_after_soi(
            no_jfif, app(0xE1, b"Exif\0\0" + exif_block(x011A=96.0)) * 2
        ),
        "exif-nan": insert_after_soi(no_jfif, app(0xE1, exif_resolution([(0, 0)]))),
        "exif-zero-den": insert_after_soi(no_jfif, app(0xE1, exif_resolution([(5, 0)]))),
        "exif-no-rational": insert_after_soi(no_jfif, app(0xE1, exif_resolution([]))),
        "exif-two-rationals": insert_after_soi(
            no_jfif, app(0xE1, exif_resolution([(72, 1), (1, 0)]))
        ),
        "exif-no-unit": insert_after_soi(no_jfif, app(0xE1, exif_resolution([(72, 1)], unit=None))),
        "exif-ok": insert_after_soi(no_jfif, app(0xE1, exif_resolution([(72, 1)]))),
        # an UNDEFINED XResolution of one byte: Pillow's DPI code indexes [1] (IndexError)
        "exif-undefined-1": insert_after_soi(no_jfif, app(0xE1, exif_xres(7, 1, b"\x05"))),
        "exif-undefined-2": insert_after_soi(no_jfif, app(0xE1, exif_xres(7, 2, b"\x05\x01"))),
        "exif-ascii": insert_after_soi(no_jfif, app(0xE1, exif_xres(2, 3, b"ab\0"))),
        "exif-short": insert_after_soi(no_jfif, app(0xE1, exif_xres(3, 1, b"\x48\0"))),
        "sof-one-byte-long": sof_grown(base, b"\0"),
        "sof-three-bytes-long": sof_grown(base, b"\x04\x11\0"),
        "sos-first": insert_after_soi(base, app(0xDA, b"\x01\x01\x00\x00\x3f\x00")),
        "sos-truncated": base[: next(p for p, m, _ in jpeg_segments(base) if m == 0xDA) + 6],
        "magic-only": b"\xff\xd8\xff",
        "magic-and-marker": b"\xff\xd8\xff\xe0",
    }


@pytest.mark.parametrize("name", sorted(odd_jpegs()))
def test_odd_jpegs_agree(name: str) -> None:
    check(odd_jpegs()[name], label=name)


def test_odd_jpegs_that_are_still_plain_are_answered() -> None:
    odd = odd_jpegs()
    for name in ("jfif-7", "jfif-dpi-unit-2", "icc-wrong-count", "photoshop-short-size"):
        check(odd[name], answered=True, label=name)
    for name in ("12-bit", "sof3", "sof9-arith", "mpf", "mpo", "junk-between", "zero-height"):
        assert read_header(odd[name]) is None, name
    for name in ("exif-ok", "exif-nan", "exif-no-unit", "exif-undefined-2", "exif-ascii"):
        check(odd[name], answered=True, label=name)  # Pillow's own EXIF code decides these
    assert read_header(odd["exif-undefined-1"]) is None


@functools.cache
def odd_pngs() -> dict[str, bytes]:
    """Hand-patched PNGs, most of which the fast path must leave to Pillow."""
    rgb = plain_pngs()["RGB"]
    bad_crc = bytearray(with_chunks(rgb, png_chunk(b"tEXt", b"a\0b")))
    bad_crc[33 + 8 + 3] ^= 1  # the CRC of the inserted chunk
    big = zlib.compress(b"x" * (PngImagePlugin.MAX_TEXT_CHUNK + 10))
    frames = [noise(12, 8, seed=s) for s in range(2)]
    return {
        "bad-crc": bytes(bad_crc),
        "bad-cid": with_chunks(rgb, png_chunk(b"a c!", b"")),
        "iend-first": with_chunks(rgb, png_chunk(b"IEND", b"")),
        "ihdr-twice": with_chunks(rgb, png_chunk(b"IHDR", rgb[16:29])),
        "text-before-ihdr": PNG_MAGIC + png_chunk(b"tEXt", b"a\0b") + rgb[8:],
        "ihdr-short": PNG_MAGIC + png_chunk(b"IHDR", rgb[16:28]) + rgb[33:],
        "ihdr-long": PNG_MAGIC + png_chunk(b"IHDR", rgb[16:29] + b"\0") + rgb[33:],
        "bad-depth": raw_png(4, 4, 3, 0),
        "bad-colour": raw_png(4, 4, 8, 5),
        "palette-16": raw_png(4, 4, 16, 3),
        "filter-1": PNG_MAGIC + png_chunk(b"IHDR", rgb[16:27] + b"\x01\0") + rgb[33:],
        "zero-width": png_sized(rgb, 0, 4),
        "zero-height": png_sized(rgb, 4, 0),
        "trns-short-L": raw_png(4, 4, 8, 0, before_idat=(png_chunk(b"tRNS", b"\0"),)),
        "trns-short-RGB": raw_png(4, 4, 8, 2, before_idat=(png_chunk(b"tRNS", bytes(4)),)),
        "trns-short-1": raw_png(4, 4, 1, 0, before_idat=(png_chunk(b"tRNS", b""),)),
        "trns-short-I16": raw_png(4, 4, 16, 0, before_idat=(png_chunk(b"tRNS", b"\0"),)),
        "trns-empty-P": raw_png(4, 4, 8, 3, before_idat=(png_chunk(b"tRNS", b""),)),
        "trns-LA": raw_png(4, 4, 8, 4, before_idat=(png_chunk(b"tRNS", b""),)),
        "gama-short": with_chunks(rgb, png_chunk(b"gAMA", b"\0\0")),
        "chrm-odd": with_chunks(rgb, png_chunk(b"cHRM", bytes(30))),
        # Pillow 12 unpacks len // 4 values (an exact fit), 13 the first eight (32 bytes or more)
        "chrm-short": with_chunks(rgb, png_chunk(b"cHRM", bytes(8))),
        "chrm-long-odd": with_chunks(rgb, png_chunk(b"cHRM", bytes(33))),
        "chrm-long": with_chunks(rgb, png_chunk(b"cHRM", bytes(36))),
        "srgb-empty": with_chunks(rgb, png_chunk(b"sRGB", b"")),
        "phys-short": with_chunks(rgb, png_chunk(b"pHYs", bytes(8))),
        "iccp-no-method": with_chunks(rgb, png_chunk(b"iCCP", b"name\0")),
        "iccp-empty": with_chunks(rgb, png_chunk(b"iCCP", b"")),
        "iccp-method-1": with_chunks(rgb, png_chunk(b"iCCP", b"name\0\x01xx")),
        "iccp-bomb": with_chunks(rgb, png_chunk(b"iCCP", b"name\0\0" + big)),
        "ztxt-method-1": with_chunks(rgb, png_chunk(b"zTXt", b"k\0\x01xx")),
        "ztxt-bomb": with_chunks(rgb, png_chunk(b"zTXt", b"k\0\0" + big)),
        "itxt-bomb": with_chunks(rgb, png_chunk(b"iTXt", b"k\0\x01\0\0\0" + big)),
        "actl-short": with_chunks(rgb, png_chunk(b"acTL", b"\0")),
        "actl-zero": with_chunks(rgb, png_chunk(b"acTL", bytes(8))),
        "apng-1": with_chunks(
            rgb,
            png_chunk(b"acTL", struct.pack(">II", 1, 0)),
            png_chunk(b"fcTL", struct.pack(">IIIIIHHBB", 0, 23, 11, 0, 0, 1, 10, 0, 0)),
        ),
        "apng-1-default": encode(
            frames[0], "PNG", save_all=True, append_images=[frames[1]], default_image=True
        ),
        "apng-2": encode(frames[0], "PNG", save_all=True, append_images=frames[1:]),
        "no-idat": rgb[: rgb.index(b"IDAT") - 4] + png_chunk(b"IEND", b""),
        "idat-head-only": rgb[: rgb.index(b"IDAT") + 4],
        "magic-only": PNG_MAGIC,
    }


@pytest.mark.parametrize("name", sorted(odd_pngs()))
def test_odd_pngs_agree(name: str) -> None:
    check(odd_pngs()[name], label=name)


def test_odd_pngs_that_are_still_plain_are_answered() -> None:
    odd = odd_pngs()
    for name in ("trns-empty-P", "trns-LA", "idat-head-only"):
        check(odd[name], answered=True, label=name)
    for name in ("bad-crc", "iend-first", "apng-1", "apng-2", "ztxt-bomb", "iccp-bomb"):
        assert read_header(odd[name]) is None, name


def test_text_memory_limit_agrees(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(PngImagePlugin, "MAX_TEXT_MEMORY", 40)
    plain = plain_pngs()
    for name in ("text", "ancillary", "RGB"):
        check(plain[name], label=name)
    assert read_header(plain["text"]) is None
    check(plain["RGB"], answered=True)


def test_lenient_truncation_setting_agrees(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    for data in [*plain_pngs().values(), *odd_pngs().values(), *plain_jpegs().values()]:
        check(data)
    assert read_header(plain_pngs()["RGB"]) is None  # PNG is then left to Pillow


@functools.cache
def all_generated() -> dict[str, bytes]:
    """Every generated case by name (the cached dicts are shared: tests must not mutate them)."""
    cases = {}
    for group in (plain_jpegs(), plain_pngs(), odd_jpegs(), odd_pngs()):
        cases |= group
    return cases


@pytest.mark.parametrize("name", sorted(all_generated()))
def test_truncated_prefixes_agree(name: str) -> None:
    data = all_generated()[name]
    for cut in cuts(data):
        check(data[:cut], label=f"{name}[:{cut}]")


@pytest.mark.parametrize("kind", ["jpeg", "png"])
def test_mutated_headers_agree(kind: str) -> None:
    rng = np.random.default_rng(1 if kind == "jpeg" else 2)
    sources = plain_jpegs() if kind == "jpeg" else plain_pngs()
    for name in ("RGB", "exif" if kind == "jpeg" else "text", "L"):
        data = sources[name]
        head = min(len(data), 700)
        for _ in range(150):
            mutated = bytearray(data)
            for _ in range(int(rng.integers(1, 4))):
                mutated[int(rng.integers(2, head))] = int(rng.integers(0, 256))
            check(bytes(mutated), label=f"{name} mutated")


def test_random_bytes_agree() -> None:
    rng = np.random.default_rng(3)
    for size in (0, 1, 3, 8, 64, 600):
        for prefix in (b"", b"\xff\xd8\xff", PNG_MAGIC):
            check(prefix + rng.bytes(size))
    assert read_header(b"") is None
    assert read_header(bytearray(plain_jpegs()["RGB"])) is None  # type: ignore[arg-type]


def test_webp_gif_bmp_are_left_to_pillow() -> None:
    img = noise(16, 8)
    for fmt in ("WEBP", "GIF", "BMP", "TIFF"):
        data = encode(img, fmt)
        assert read_header(data) is None, fmt
        check(data, label=fmt)


# --- Pillow's own test images ----------------------------------------------------------------

CORPORA = os.environ.get("SHARDFEED_CORPORA")
needs_corpus = pytest.mark.skipif(
    not CORPORA, reason="SHARDFEED_CORPORA is not set (scripts/test.sh sets it)"
)


def corpus_files() -> dict[str, bytes]:
    root = Path(CORPORA or "", "pillow_test_images")
    assert root.is_dir(), root
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@needs_corpus
def test_corpus_agrees() -> None:
    files = corpus_files()
    assert len(files) > 250
    answered = set()
    for name, data in files.items():
        check(data, label=name)
        if read_header(data) is not None:
            answered.add(name)
        if data.startswith((b"\xff\xd8\xff", PNG_MAGIC)):
            for cut in cuts(data):
                check(data[:cut], label=f"{name}[:{cut}]")
    for name in ("hopper.jpg", "hopper.png", "flower.jpg", "pil_sample_cmyk.jpg", "i_trns.png"):
        assert name in answered, name
    assert len(answered) > 40, sorted(answered)

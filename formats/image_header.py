"""A fast, exact header reader for plain JPEG and PNG files, used by ``validate_image(mode="header")``.

Pillow's Python-level JPEG ``_open`` parses every quantization table byte by byte and dominates the
cost of a header-only scan. :func:`read_header` walks the same segments with ``struct`` and slice
comparisons instead, and answers only when the answer is *provably* what Pillow's ``Image.open``
would give: the same format, size and mode, with Pillow raising nothing on the way. For anything
else it returns None and the caller asks Pillow. So a None is always safe; a non-None answer is a
promise, checked against Pillow by ``tests/test_image_header.py``.

The rules below mirror ``PIL.JpegImagePlugin`` and ``PIL.PngImagePlugin`` of Pillow 12 and 13 (the
versions in :data:`_VERIFIED_PILLOW`; 13 changed how a short ``cHRM`` chunk fails, followed below);
other Pillow versions always get None until someone re-reads those plugins. Not covered (always None): WebP (libwebp's demuxer validates the whole container, so
only libwebp can say what it accepts), GIF, BMP, MPO, APNG, and every unusual JPEG or PNG feature
listed in :func:`_jpeg` and :func:`_png`.
"""

from __future__ import annotations

import re
import struct
import warnings
import zlib
from typing import NamedTuple

import PIL
from PIL import Image, ImageFile, JpegImagePlugin, PngImagePlugin

#: Pillow major versions whose JPEG and PNG ``_open`` this module was checked against.
_VERIFIED_PILLOW = frozenset({12, 13})
_PILLOW_MAJOR = int(PIL.__version__.split(".", 1)[0])
_ENABLED = _PILLOW_MAJOR in _VERIFIED_PILLOW

_MARKER = struct.Struct(">BBH")  # JPEG: FF, marker code, segment length
_U32 = struct.Struct(">I")
_CHUNK_HEAD = struct.Struct(">I4s")  # PNG chunk: 4-byte big-endian length, 4-byte type

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
#: Pillow's test for a valid PNG chunk type (``PngImagePlugin.is_cid``): four ASCII word bytes.
_IS_CID = re.compile(rb"\w\w\w\w").match

#: PNG (bit depth, colour type) -> Pillow mode, as in ``PngImagePlugin._MODES``. Pairs missing
#: here (invalid per the PNG spec) leave Pillow without a mode, so it refuses the file.
_PNG_MODES = {
    (1, 0): "1",
    (2, 0): "L",
    (4, 0): "L",
    (8, 0): "L",
    (16, 0): "I;16",
    (8, 2): "RGB",
    (16, 2): "RGB",
    (1, 3): "P",
    (2, 3): "P",
    (4, 3): "P",
    (8, 3): "P",
    (8, 4): "LA",
    (16, 4): "RGBA",  # Pillow has no 16-bit LA mode
    (8, 6): "RGBA",
    (16, 6): "RGBA",
}
#: PNG chunks after IHDR whose Pillow handler is modelled in :func:`_png_chunk_ok`. Any other chunk
#: type Pillow has a ``chunk_*`` handler for (a second IHDR, IEND, acTL, fcTL, fdAT, future ones)
#: means None.
_PNG_MODELLED = frozenset(
    {
        b"PLTE",
        b"tRNS",
        b"gAMA",
        b"cHRM",
        b"sRGB",
        b"pHYs",
        b"tEXt",
        b"zTXt",
        b"iTXt",
        b"eXIf",
        b"iCCP",
    }
)

#: JPEG SOF markers handled: SOF0 baseline, SOF1 extended sequential, SOF2 progressive (Huffman).
#: Pillow also treats SOF3/5-7/9-11/13-15 and DHP as frame headers; those are left to it.
_SOF = frozenset({0xC0, 0xC1, 0xC2})
#: JPEG markers with a length-prefixed segment that Pillow reads and ignores (apart from the
#: ``APPn``/``DQT`` checks made below): DHT, DQT, DRI, APP0-APP15, COM.
_PLAIN_SEGMENTS = frozenset({0xC4, 0xDB, 0xDD, *range(0xE0, 0xF0), 0xFE})
_SOS = 0xDA
_XMP_PREFIX = b"http://ns.adobe.com/xap/1.0/\x00"


class Header(NamedTuple):
    """What Pillow's ``Image.open`` reports for a still image: format, stored size, mode.

    The frame count is always 1 (MPO and APNG are never answered here).
    """

    format: str
    width: int
    height: int
    mode: str


def read_header(data: bytes) -> Header | None:
    """The header facts of a plain JPEG or PNG, or None when only Pillow can say.

    Never raises for any input.
    """
    if not _ENABLED or type(data) is not bytes:
        return None
    try:
        # Image.open tries JPEG first (magic FF D8 FF), then PNG; neither magic is a prefix of the
        # other, so the first accepting plugin is decided by these bytes alone.
        if data.startswith(b"\xff\xd8\xff"):
            return _jpeg(data)
        if data.startswith(_PNG_MAGIC):
            return _png(data)
    except Exception:  # a parse doubt we did not foresee: let Pillow decide
        return None
    return None


# --- JPEG --------------------------------------------------------------------------------------


def _jpeg(data: bytes) -> Header | None:
    """Walk JPEG marker segments from SOI to SOS the way ``JpegImageFile._open`` does.

    Layout (ITU-T T.81, B.1.1): SOI ``FF D8``, then segments ``FF xx`` + a 2-byte big-endian length
    that counts itself but not the marker, up to SOS ``FF DA``. Any number of ``FF`` fill bytes may
    precede a marker (B.1.1.2). Returns None for: junk or stuffed bytes between segments, markers
    without a length (RSTn, EOI, a second SOI, JPGn), any segment running past the data (Pillow says
    "truncated"), other SOF types, a second SOF, precision other than 8 bits, component counts
    other than 1/3/4, zero sizes, MPO (``APP2 "MPF\\0"``), and the inputs on which Pillow's
    APP/DQT/SOF handlers raise.
    """
    n = len(data)
    unpack_marker = _MARKER.unpack_from
    pos = 2
    header: Header | None = None
    dpi = False  # Pillow's info["dpi"], set by a JFIF APP0 with a density unit
    exif: bytes | None = None  # info["exif"]
    xmp: bytes | None = None  # info["xmp"]
    icc: list[bytes] = []  # Pillow's icclist of ICC_PROFILE APP2 segments
    while True:
        if pos + 4 > n:
            return None  # Pillow runs out of data before SOS and refuses the file
        ff, marker, length = unpack_marker(data, pos)
        if ff != 0xFF:
            return None  # junk between segments: Pillow skips it byte by byte; not modelled
        if marker == 0xFF:
            pos += 1  # fill byte: the next FF starts the marker
            continue
        start, end = pos + 4, pos + 2 + length
        if length < 2 or end > n:
            return None  # Pillow raises "Truncated File Read" or misreads
        if marker == _SOS:
            break
        if marker in _SOF:
            if header is not None:
                return None
            header = _jpeg_sof(data, start, end, icc)
            if header is None:
                return None
            icc = []  # Pillow clears icclist after its SOF fix-up
        elif marker not in _PLAIN_SEGMENTS:
            return None
        elif marker == 0xDB:
            if not _jpeg_dqt_ok(data, start, end):
                return None
        elif 0xE0 <= marker <= 0xEF:
            # JpegImagePlugin.APP, branch by branch (the prefixes are checked in Pillow's order)
            if marker == 0xE0 and data.startswith(b"JFIF", start, end):
                if length - 2 < 7:
                    return None  # i16(s, 5) raises struct.error
                # unit and densities are read inside a try; a unit of 1 or 2 sets info["dpi"]
                if length - 2 >= 12 and data[start + 7] in (1, 2):
                    dpi = True
            elif marker == 0xE1 and data.startswith(b"Exif\0\0", start, end):
                exif = data[start:end] if exif is None else exif + data[start + 6 : end]
            elif marker == 0xE1 and data.startswith(_XMP_PREFIX, start, end):
                xmp = data[start:end].split(b"\0", 1)[1]
            elif marker == 0xE2 and data.startswith(b"FPXR\0", start, end):
                pass
            elif marker == 0xE2 and data.startswith(b"ICC_PROFILE\0", start, end):
                icc.append(data[start:end])
            elif marker == 0xED and data.startswith(b"Photoshop 3.0\0", start, end):
                if not _jpeg_photoshop_ok(data[start:end]):
                    return None
            elif marker == 0xEE and data.startswith(b"Adobe", start, end):
                if length - 2 < 7:
                    return None  # i16(s, 5) raises struct.error; the transform byte is optional
            elif marker == 0xE2 and data.startswith(b"MPF\0", start, end):
                return None  # MPO: Pillow parses the MP index and may return an MpoImageFile
        pos = end
    if header is None:
        return None  # SOS before any frame header
    if exif is not None and not dpi and not _exif_dpi_ok(exif, xmp):
        return None
    return header


def _jpeg_sof(data: bytes, start: int, end: int, icc: list[bytes]) -> Header | None:
    """The SOF segment (T.81 B.2.2): P (8 bits), Y (16), X (16), Nf (8), then Nf x 3 bytes."""
    if end - start < 6:
        return None
    bits, height, width, layers = data[start], *struct.unpack_from(">HHB", data, start + 1)
    if bits != 8 or layers not in (1, 3, 4):
        return None  # Pillow: "cannot handle N-bit layers" / "N-layer images"
    if end - start != 6 + 3 * layers:
        return None  # Pillow indexes each 3-byte component triple; only the exact length is plain
    if width == 0 or height == 0:
        return None  # Y = 0 defers the height to a DNL marker; Pillow refuses such files
    if icc and len(min(icc)) < 14:
        return None  # Pillow's ICC fix-up reads byte 13 of the first fragment: IndexError
    return Header("JPEG", width, height, {1: "L", 3: "RGB", 4: "CMYK"}[layers])


def _jpeg_dqt_ok(data: bytes, start: int, end: int) -> bool:
    """True when every table in a DQT segment is complete, as Pillow's DQT handler requires.

    Each table (T.81 B.2.4.1) is one Pq/Tq byte and 64 entries of 1 byte (Pq = 0) or 2 bytes; Pillow
    takes any Pq other than 0 as 2 bytes.
    """
    pos = start
    while pos < end:
        pos += 1 + (64 if data[pos] >> 4 == 0 else 128)
        if pos > end:
            return False  # Pillow: "bad quantization table marker"
    return True


def _jpeg_photoshop_ok(s: bytes) -> bool:
    """False when Pillow's Photoshop APP13 loop would raise (it catches only struct.error).

    Resource blocks: ``8BIM``, 2-byte id, Pascal name padded to even length, 4-byte size, data
    padded to even length. The name length byte is read with ``s[offset]``: an IndexError when it
    lies past the end.
    """
    offset = 14
    while s[offset : offset + 4] == b"8BIM":
        offset += 4
        if offset + 2 > len(s):
            return True  # i16 raises struct.error: caught, parsing stops
        offset += 2
        if offset >= len(s):
            return False
        offset += 1 + s[offset]
        offset += offset & 1
        if offset + 4 > len(s):
            return True  # i32 raises struct.error: caught
        size = _U32.unpack_from(s, offset)[0]
        offset += 4 + size  # ResolutionInfo's own reads only raise struct.error: caught
        offset += offset & 1
    return True


class _ExifProbe:
    """Just the part of a JpegImageFile that Pillow's ``_read_dpi_from_exif`` touches."""

    getexif = Image.Image.getexif

    def __init__(self, info: dict[str, object]) -> None:
        self.info = info
        self._exif: Image.Exif | None = None


def _exif_dpi_ok(exif: bytes, xmp: bytes | None) -> bool:
    """True when Pillow's EXIF DPI lookup, run at the end of its JPEG ``_open``, does not raise.

    Without a JFIF density Pillow parses the EXIF block for a resolution and lets some exceptions
    escape (an IndexError for an empty rational, for one). Rather than model Pillow's TIFF reader,
    run that very method on the same inputs (the EXIF bytes and the XMP packet it reads for the
    orientation): the same code on the same bytes raises or not alike.
    """
    method = getattr(JpegImagePlugin.JpegImageFile, "_read_dpi_from_exif", None)
    if method is None:
        return False
    info: dict[str, object] = {"exif": exif}
    if xmp is not None:
        info["xmp"] = xmp
    # The warning filter images._pillow_guard sets around Image.open, so that a warning turns into
    # an exception here exactly when it would there.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"PIL\.")
        try:
            method(_ExifProbe(info))
        except Exception:  # Pillow's open would fail here too: defer, and Pillow gives the reject
            return False
    return True


# --- PNG ---------------------------------------------------------------------------------------


def _png(data: bytes) -> Header | None:
    """Walk PNG chunks from IHDR to the first IDAT the way ``PngImageFile._open`` does.

    Layout (PNG spec, 5.3): 8-byte signature, then chunks of a 4-byte big-endian data length, a
    4-byte type, the data and a CRC-32 over type and data. Pillow checks each CRC before IDAT and
    stops at the IDAT chunk's 8-byte head without reading its data. Returns None for: Pillow's
    lenient-truncation mode, IHDR not first or not exactly 13 bytes or repeated, an invalid bit
    depth / colour type pair, a nonzero filter method, zero sizes, any chunk running past the data,
    a bad CRC, an invalid chunk type, APNG (acTL) and IEND before IDAT, and the inputs on which
    Pillow's chunk handlers raise (short chunks, compressed text or ICC over Pillow's limits).
    """
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        return None  # Pillow then skips CRCs and tolerates short chunks: not modelled
    n = len(data)
    view = memoryview(data)
    pos = 8
    header: Header | None = None
    text_memory = 0
    while True:
        if pos + 8 > n:
            return None
        length, cid = _CHUNK_HEAD.unpack_from(data, pos)
        if cid == b"IDAT":
            break  # Pillow's IDAT handler ends the header walk before reading data or CRC
        end = pos + 8 + length
        if end + 4 > n or _IS_CID(cid) is None:
            return None
        if zlib.crc32(view[pos + 4 : end]) != _U32.unpack_from(data, end)[0]:
            return None
        s = view[pos + 8 : end]
        if header is None:
            if cid != b"IHDR":
                return None
            header = _png_ihdr(s)
            if header is None:
                return None
        elif cid in _PNG_MODELLED:
            grown = _png_chunk_ok(cid, bytes(s), header.mode)
            if grown is None:
                return None
            text_memory += grown
            if text_memory > PngImagePlugin.MAX_TEXT_MEMORY:
                return None  # Pillow: "Too much memory used in text chunks"
        elif hasattr(PngImagePlugin.PngStream, f"chunk_{cid.decode('ascii')}"):
            return None  # IEND, APNG chunks, or a handler this module does not know
        pos = end + 4
    return header


def _png_ihdr(s: memoryview) -> Header | None:
    """IHDR (PNG spec 11.2.2): width, height (4 bytes each), bit depth, colour type, compression,
    filter, interlace (1 byte each)."""
    if len(s) != 13:
        return None
    width, height, depth, colour, _, filter_method, _ = struct.unpack(">IIBBBBB", s)
    mode = _PNG_MODES.get((depth, colour))
    if mode is None or filter_method != 0 or width == 0 or height == 0:
        return None
    return Header("PNG", width, height, mode)


def _png_chunk_ok(cid: bytes, s: bytes, mode: str) -> int | None:
    """Mirror the Pillow handler for one chunk after IHDR.

    Returns the characters the handler adds to Pillow's text-memory count (0 for non-text chunks),
    or None when the handler would raise.
    """
    if cid == b"tRNS":
        # Pillow reads one 16-bit sample (grayscale, bilevel) or three (RGB); palette is free-form
        need = {"1": 2, "L": 2, "I;16": 2, "RGB": 6}.get(mode, 0)
        return 0 if len(s) >= need else None
    if cid == b"gAMA":
        return 0 if len(s) >= 4 else None
    if cid == b"cHRM":
        if _PILLOW_MAJOR >= 13:  # eight 32-bit values, the rest ignored; fewer raise
            return 0 if len(s) >= 32 else None
        return 0 if len(s) % 4 == 0 else None  # struct.unpack of len // 4 ints needs an exact fit
    if cid == b"sRGB":
        return 0 if len(s) >= 1 else None
    if cid == b"pHYs":
        return 0 if len(s) >= 9 else None
    if cid == b"tEXt":
        key, _, value = s.partition(b"\0")  # no NUL: key is everything, value empty
        return len(value) if key else 0  # latin-1 text: one character per byte
    if cid == b"zTXt":
        return _png_ztxt(s)
    if cid == b"iTXt":
        return _png_itxt(s)
    if cid == b"iCCP":
        # profile name, NUL, compression method (must be 0), zlib stream
        i = s.find(b"\0")
        if i + 1 >= len(s) or s[i + 1] != 0:
            return None
        return 0 if _inflate(s[i + 2 :]) is not None else None
    if cid in (b"PLTE", b"eXIf"):
        return 0  # stored, never checked
    return None


def _inflate(s: bytes) -> bytes | None:
    """Pillow's bounded text/ICC decompression; None where it raises (output over MAX_TEXT_CHUNK).

    A zlib error is no failure for Pillow: it drops the value, which counts as no text. Empty
    output counts the same, so both give b"".
    """
    try:
        return PngImagePlugin._safe_zlib_decompress(s)
    except zlib.error:
        return b""
    except ValueError:
        return None


def _png_ztxt(s: bytes) -> int | None:
    """zTXt (PNG spec 11.3.4.4): keyword, NUL, compression method 0, zlib latin-1 text."""
    key, sep, value = s.partition(b"\0")
    if not sep:
        key, value = s, b""
    if value and value[0] != 0:
        return None  # Pillow: "Unknown compression method"
    text = _inflate(value[1:])
    if text is None:
        return None
    return len(text) if key else 0


def _png_itxt(s: bytes) -> int | None:
    """iTXt (PNG spec 11.3.4.5): keyword, NUL, flag, method, language, NUL, keyword, NUL, text.

    Pillow silently skips malformed iTXt chunks; only an over-limit decompression raises.
    """
    key, sep, rest = s.partition(b"\0")
    if not sep or len(rest) < 2:
        return 0
    flag, method, rest = rest[0], rest[1], rest[2:]
    parts = rest.split(b"\0", 2)
    if len(parts) != 3:
        return 0
    lang, tkey, value = parts
    if flag != 0:
        if method != 0:
            return 0
        text = _inflate(value)
        if text is None:
            return None
        value = text  # on a zlib error Pillow skips the chunk: no text either way
    try:
        key.decode("latin-1")
        lang.decode("utf-8")
        tkey.decode("utf-8")
        return len(value.decode("utf-8"))
    except UnicodeError:
        return 0

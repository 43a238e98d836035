"""TFRecord framing: write and read ``*.tfrecord`` files, plain or GZIP, with both CRCs checked.

Each record is::

    uint64 length          little endian
    uint32 masked_crc32c(the 8 length bytes)
    bytes  data[length]
    uint32 masked_crc32c(data)

where ``masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2**32)`` and crc32c is
Castagnoli's CRC (``crc32c``). A GZIP file is the same stream inside gzip members.

Offsets are byte offsets of a record's first header byte in the *uncompressed* stream, counted from
where reading (or writing) started. Only plain files are random access (:func:`read_record_at`).

Reading checks both CRCs. A failure is a :class:`TFRecordError` with ``.offset`` and ``.reason``:

- ``"data crc"``: the data does not match its CRC. The framing is intact, so a tolerant reader
  (``on_error=``) reports it and goes on with the next record;
- ``"too large"``: the length exceeds ``max_record_bytes``. The length itself passed its CRC, so the
  record is skipped unread and reading goes on;
- ``"length crc"``: the length bytes do not match their CRC, so no later record can be found: the file
  stops here;
- ``"truncated"``: the stream (or its gzip member) ends inside a record: the file stops here;
- ``"gzip"``: the compressed stream is corrupt (bad deflate data, or a gzip trailer CRC/size that
  does not match): the file stops here.

Every record before the failure has been yielded by then.
"""

from __future__ import annotations

import gzip
import io
import os
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import BinaryIO, Literal

import crc32c
import numpy as np

from shardfeed.schemas.errors import ShardfeedError

__all__ = [
    "REASONS",
    "TFRecordError",
    "TFRecordWriter",
    "iter_records",
    "masked_crc32c",
    "read_record_at",
    "sniff_compression",
    "write_records",
]

#: ``TFRecordError.reason`` values; the first two leave the framing intact, so reading goes on.
REASONS = ("data crc", "too large", "length crc", "truncated", "gzip")
_RESUMABLE = frozenset(REASONS[:2])

Compression = Literal["gzip"] | None
Source = str | os.PathLike[str] | BinaryIO
Sink = str | os.PathLike[str] | BinaryIO

READ_CHUNK = 4 << 20  # 4 MiB per read of the (decompressed) stream
_MAX_READ = 256 << 20  # a huge record is read in 256 MiB steps
_ZIN = 64 << 10  # compressed bytes per zlib call
WRITE_BUFFER = 1 << 20  # 1 MiB of small records are joined before one write
GZIP_LEVEL = 6  # zlib's default, as TensorFlow's ZlibCompressionOptions uses
HEADER_BYTES = 12  # uint64 length + uint32 masked crc
FOOTER_BYTES = 4  # uint32 masked crc of the data

_GZIP_MAGIC = b"\x1f\x8b"
_MASK_DELTA = 0xA282EAD8
_HEADER = struct.Struct("<QI")
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_crc32c = crc32c.crc32c


class TFRecordError(ShardfeedError):
    """A record that cannot be read: ``source`` (file), ``offset`` (of its header in the
    uncompressed stream), ``reason`` (one of :data:`REASONS`) and a human ``detail``."""

    def __init__(self, source: str, offset: int, reason: str, detail: str = "") -> None:
        self.source = source
        self.offset = offset
        self.reason = reason
        self.detail = detail
        tail = f": {detail}" if detail else ""
        super().__init__(f"{source}: TFRecord {reason} error at offset {offset}{tail}")

    @property
    def resumable(self) -> bool:
        """True when later records can still be read (the framing is intact)."""
        return self.reason in _RESUMABLE

    @property
    def reject_reason(self) -> str:
        """The snake_case reject code: ``tfrecord_data_crc``, ``tfrecord_truncated``, ..."""
        return "tfrecord_" + self.reason.replace(" ", "_")

    def __reduce__(self):  # survives pickling across worker processes
        return (type(self), (self.source, self.offset, self.reason, self.detail))


def masked_crc32c(data: bytes | bytearray | memoryview) -> int:
    """The masked CRC32C TFRecord stores for ``data``."""
    crc = _crc32c(data if type(data) is bytes else np.frombuffer(data, np.uint8))
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


# ---------------------------------------------------------------------------------------------------
# Writing


class TFRecordWriter:
    """Append records to ``sink`` (a path, created or replaced, or a binary file object, which
    :meth:`close` flushes but leaves open).

    ``compression="gzip"`` writes one gzip member with mtime 0, no file name and level
    ``compresslevel``, so equal records give byte-identical files (with the same zlib).
    """

    def __init__(
        self, sink: Sink, *, compression: Compression = None, compresslevel: int = GZIP_LEVEL
    ) -> None:
        if compression not in (None, "gzip"):
            raise ValueError(f"compression must be None or 'gzip', got {compression!r}")
        self._owned = isinstance(sink, (str, os.PathLike))
        self._file: BinaryIO = open(sink, "wb") if self._owned else sink  # noqa: SIM115
        self._out: BinaryIO = self._file
        if compression == "gzip":
            self._out = gzip.GzipFile(  # type: ignore[assignment]
                filename="", mode="wb", compresslevel=compresslevel, fileobj=self._file, mtime=0
            )
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._offset = 0
        self._closed = False

    @property
    def bytes_written(self) -> int:
        """Bytes of the uncompressed stream so far: the offset the next record gets."""
        return self._offset

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Append one record and return its offset."""
        if self._closed:
            raise ValueError("write to a closed TFRecordWriter")
        payload = data if type(data) is bytes else np.frombuffer(data, np.uint8)
        size = len(payload)
        length = _LENGTH.pack(size)
        header = length + _CRC.pack(masked_crc32c(length))
        crc = _crc32c(payload)
        footer = _CRC.pack((((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF)
        offset = self._offset
        self._offset += HEADER_BYTES + size + FOOTER_BYTES
        if size >= WRITE_BUFFER:
            self._flush_pending()
            self._out.write(header)
            self._out.write(payload)
            self._out.write(footer)
        else:
            self._pending += (header, payload if type(payload) is bytes else bytes(data), footer)
            self._pending_bytes += HEADER_BYTES + size + FOOTER_BYTES
            if self._pending_bytes >= WRITE_BUFFER:
                self._flush_pending()
        return offset

    def _flush_pending(self) -> None:
        if self._pending:
            self._out.write(b"".join(self._pending))
            self._pending = []
            self._pending_bytes = 0

    def flush(self) -> None:
        """Hand buffered records to the file (a gzip member stays open until :meth:`close`)."""
        self._flush_pending()
        self._out.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._flush_pending()
        if self._out is not self._file:
            self._out.close()  # writes the gzip trailer; GzipFile leaves its fileobj open
        if self._owned:
            self._file.close()
        else:
            self._file.flush()

    def __enter__(self) -> TFRecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_records(
    sink: Sink,
    records: Iterable[bytes | bytearray | memoryview],
    *,
    compression: Compression = None,
    compresslevel: int = GZIP_LEVEL,
) -> list[int]:
    """Write ``records`` to ``sink`` and return each record's offset (see :class:`TFRecordWriter`)."""
    with TFRecordWriter(sink, compression=compression, compresslevel=compresslevel) as writer:
        return [writer.write(record) for record in records]


# ---------------------------------------------------------------------------------------------------
# Reading


class _StreamError(Exception):
    """The decompressed stream cannot go on; carries a :data:`REASONS` value."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class _GzipReader:
    """``read(n)`` over concatenated gzip members: about ``n`` decompressed bytes, ``b""`` only at
    a clean end. A truncated or corrupt stream raises :class:`_StreamError`, but only once every
    byte decompressed before the damage has been returned. Compressed input goes to zlib in pieces
    of ``_ZIN`` bytes, so one call inflates a bounded amount (no bomb can inflate a read)."""

    def __init__(self, raw: Callable[[int], bytes], head: bytes) -> None:
        self._raw = raw
        self._buf = head  # compressed input; self._at is the first byte not given to zlib yet
        self._at = 0
        self._raw_eof = False
        self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._in_member = True
        self._error: _StreamError | None = None

    def _input(self) -> memoryview:
        """The next compressed piece (empty at the end of the raw stream)."""
        if self._at >= len(self._buf) and not self._raw_eof:
            self._buf = self._raw(READ_CHUNK)
            self._at = 0
            self._raw_eof = not self._buf
        return memoryview(self._buf)[self._at : self._at + _ZIN]

    def read(self, n: int) -> bytes:
        if self._error is not None:
            raise self._error
        out: list[bytes] = []
        got = 0
        while got < n:
            data = self._input()
            if not self._in_member:
                if not data:
                    break  # clean end after a whole member
                self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)
                self._in_member = True
            saved = self._z.copy()
            try:
                piece = self._z.decompress(data, n - got)
            except zlib.error as err:
                out.append(_salvage(saved, data))
                self._error = _StreamError("gzip", f"corrupt gzip stream ({err})")
                break
            if self._z.eof:
                self._in_member = False
                self._at += len(data) - len(self._z.unused_data)
            else:
                self._at += len(data) - len(self._z.unconsumed_tail)
            if piece:
                out.append(piece)
                got += len(piece)
            elif not data and not self._z.eof:
                self._error = _StreamError(
                    "truncated", "the gzip stream ends before its end marker"
                )
                break
        if self._error is not None and not got and not any(out):
            raise self._error
        return out[0] if len(out) == 1 else b"".join(out)


def _salvage(z: zlib._Decompress, data: memoryview) -> bytes:
    """What ``z`` inflates from ``data`` before the error, fed one byte at a time (error path only)."""
    parts = []
    for i in range(len(data)):
        try:
            parts.append(z.decompress(data[i : i + 1]))
        except zlib.error:
            break
    return b"".join(parts)


def _read_full(read: Callable[[int], bytes], n: int) -> bytes:
    """Up to ``n`` bytes, fewer only at the end of the stream (pipes may return short reads)."""
    first = read(n)
    if len(first) >= n or not first:
        return first
    parts = [first]
    got = len(first)
    while got < n:
        more = read(n - got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def sniff_compression(head: bytes) -> Compression:
    """``"gzip"`` or None from a stream's first 12 bytes.

    A plain file whose first record is 35615 bytes long (+ k * 65536) also starts with ``1f 8b``,
    so a head that is a valid TFRecord header (its length CRC matches) is plain; else ``1f 8b``
    means gzip.
    """
    if len(head) >= HEADER_BYTES and masked_crc32c(head[:8]) == _CRC.unpack_from(head, 8)[0]:
        return None
    return "gzip" if head.startswith(_GZIP_MAGIC) else None


def _source_name(source: Source, name: str | None) -> str:
    if name is not None:
        return name
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    return str(getattr(source, "name", "<stream>"))


def iter_records(
    source: Source,
    *,
    compression: Compression | Literal["auto"] = "auto",
    on_error: Callable[[TFRecordError], None] | None = None,
    max_record_bytes: int | None = None,
    name: str | None = None,
    base_offset: int = 0,
) -> Iterator[tuple[int, bytes]]:
    """Yield ``(offset, data)`` for each record of ``source`` (a path or a binary file object,
    read from its current position), checking both CRCs. Offsets (in records and errors) count
    from ``base_offset``: the file offset of a file object's current position.

    ``compression="auto"`` sniffs gzip (see :func:`sniff_compression`). Without ``on_error`` the
    first bad record raises :class:`TFRecordError`; with it, each bad record is passed to
    ``on_error`` and reading goes on if the error is ``resumable``, else the file ends there.
    ``name`` labels errors (default: the path or the file object's ``name``).
    """
    label = _source_name(source, name)
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb", buffering=0) as handle:
            yield from _iter_stream(
                handle.read, compression, on_error, max_record_bytes, label, base_offset
            )
    else:
        yield from _iter_stream(
            source.read, compression, on_error, max_record_bytes, label, base_offset
        )


def _iter_stream(
    raw_read: Callable[[int], bytes],
    compression: Compression | Literal["auto"],
    on_error: Callable[[TFRecordError], None] | None,
    max_record_bytes: int | None,
    label: str,
    base_offset: int = 0,
) -> Iterator[tuple[int, bytes]]:
    if compression not in ("auto", None, "gzip"):
        raise ValueError(f"compression must be 'auto', None or 'gzip', got {compression!r}")
    head = _read_full(raw_read, HEADER_BYTES)
    if compression == "auto":
        compression = sniff_compression(head)
    if compression == "gzip":
        read: Callable[[int], bytes] = _GzipReader(raw_read, head).read
        buf = b""
    else:
        read = raw_read
        buf = head
    limit = max_record_bytes if max_record_bytes is not None else 1 << 64
    crc32c = _crc32c
    unpack_header = _HEADER.unpack_from
    unpack_crc = _CRC.unpack_from
    pos = 0  # next record's position in buf
    base = base_offset  # stream offset of buf[0]
    end = len(buf)

    def fail(offset: int, reason: str, detail: str) -> bool:
        """Report one bad record; True when reading may go on."""
        err = TFRecordError(label, offset, reason, detail)
        if on_error is None:
            raise err
        on_error(err)
        return err.resumable

    while True:
        try:
            if end - pos < HEADER_BYTES:
                buf, pos, base, end = _refill(read, buf, pos, base, HEADER_BYTES)
                if end == pos:
                    return  # clean end at a record boundary
                if end - pos < HEADER_BYTES:
                    fail(base + pos, "truncated", f"{end - pos} of {HEADER_BYTES} header bytes")
                    return
            length, length_crc = unpack_header(buf, pos)
            crc = crc32c(buf[pos : pos + 8])
            if (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF != length_crc:
                fail(base + pos, "length crc", "the length bytes do not match their CRC")
                return
            total = HEADER_BYTES + length + FOOTER_BYTES
            if length > limit:
                offset = base + pos
                too_large = f"{length} bytes > max_record_bytes {limit}"
                if on_error is None:
                    fail(offset, "too large", too_large)  # raises before reading the record
                buf, pos, base, end, skipped = _skip(read, buf, pos, base, total)
                if skipped < total:
                    fail(offset, "truncated", f"{skipped} of {total} bytes of a record")
                    return
                fail(offset, "too large", too_large)
                continue
            if end - pos < total:
                buf, pos, base, end = _refill(read, buf, pos, base, total)
                if end - pos < total:
                    fail(base + pos, "truncated", f"{end - pos} of {total} bytes of a record")
                    return
        except _StreamError as err:
            fail(base + pos, err.reason, err.detail)
            return
        start = pos + HEADER_BYTES
        data = buf[start : start + length]
        crc = crc32c(data)
        offset = base + pos
        pos += total
        if (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF != unpack_crc(
            buf, start + length
        )[0]:
            if fail(offset, "data crc", f"the {length} data bytes do not match their CRC"):
                continue
            return
        yield offset, data


def _refill(
    read: Callable[[int], bytes], buf: bytes, pos: int, base: int, need: int
) -> tuple[bytes, int, int, int]:
    """Make ``need`` bytes from ``pos`` available (fewer only at the end of the stream); returns
    the new ``(buf, pos, base, end)`` with ``pos`` 0."""
    parts = [buf[pos:]] if pos < len(buf) else []
    have = len(buf) - pos
    while have < need:
        # at most as much again as the stream has given (doubling): a huge declared length
        # over a short stream never sizes a read (a raw file read allocates what it is asked)
        chunk = read(min(max(READ_CHUNK, need - have), _MAX_READ, max(READ_CHUNK, have)))
        if not chunk:
            break
        parts.append(chunk)
        have += len(chunk)
    new = parts[0] if len(parts) == 1 else b"".join(parts)
    return new, 0, base + pos, len(new)


def _skip(
    read: Callable[[int], bytes], buf: bytes, pos: int, base: int, count: int
) -> tuple[bytes, int, int, int, int]:
    """Drop ``count`` bytes from ``pos`` without holding them; returns ``(buf, pos, base, end,
    skipped)`` with ``skipped < count`` only at the end of the stream."""
    have = len(buf) - pos
    if have >= count:
        return buf, pos + count, base, len(buf), count
    skipped = have
    while skipped < count:
        chunk = read(min(READ_CHUNK, count - skipped))
        if not chunk:
            return b"", 0, base + pos + skipped, 0, skipped
        skipped += len(chunk)
    return b"", 0, base + pos + count, 0, count


def record_boundaries(handle: BinaryIO, size: int, every: int) -> list[int]:
    """File offsets of record starts about ``every`` bytes apart in a plain (uncompressed) file,
    found from the record headers alone (12 bytes each, checked against their CRC): cutting there
    splits the file into runs of whole records. The walk stops at the first header that is
    damaged or runs past the end; what follows stays with the last run, as a reader sees it."""
    cuts: list[int] = []
    pos, next_cut = 0, every
    while pos + HEADER_BYTES <= size:
        handle.seek(pos)
        head = handle.read(HEADER_BYTES)
        if len(head) < HEADER_BYTES:
            break
        length, length_crc = _HEADER.unpack(head)
        if masked_crc32c(head[:8]) != length_crc:
            break
        pos += HEADER_BYTES + length + FOOTER_BYTES
        if pos >= size:
            break
        if pos >= next_cut:
            cuts.append(pos)
            next_cut = pos + every
    return cuts


def read_record_at(source: Source, offset: int, *, name: str | None = None) -> bytes:
    """The data of the record at ``offset`` of a plain (uncompressed) TFRecord file, both CRCs
    checked. ``source`` is a path or a seekable binary file object; raises :class:`TFRecordError`
    (a declared length beyond the end of the file is ``truncated``, found before any read)."""
    label = _source_name(source, name)
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as handle:
            return _read_at(handle, offset, label)
    return _read_at(source, offset, label)


def _read_at(handle: BinaryIO, offset: int, label: str) -> bytes:
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    handle.seek(offset, io.SEEK_SET)
    head = _read_full(handle.read, HEADER_BYTES)
    if len(head) < HEADER_BYTES:
        raise TFRecordError(label, offset, "truncated", f"{len(head)} of 12 header bytes")
    length, length_crc = _HEADER.unpack(head)
    if masked_crc32c(head[:8]) != length_crc:
        raise TFRecordError(label, offset, "length crc", "no record starts here, or it is corrupt")
    if length > READ_CHUNK:  # a huge declared length must not size a read: check the file first
        here = handle.tell()
        left = handle.seek(0, io.SEEK_END) - here
        handle.seek(here, io.SEEK_SET)
        if left < length + FOOTER_BYTES:
            raise TFRecordError(
                label, offset, "truncated", f"{left} of {length + 4} data and CRC bytes"
            )
    body = _read_full(handle.read, length + FOOTER_BYTES)
    if len(body) < length + FOOTER_BYTES:
        raise TFRecordError(
            label, offset, "truncated", f"{len(body)} of {length + 4} data and CRC bytes"
        )
    data = body[:length]
    if masked_crc32c(data) != _CRC.unpack_from(body, length)[0]:
        raise TFRecordError(label, offset, "data crc", f"the {length} data bytes do not match")
    return data

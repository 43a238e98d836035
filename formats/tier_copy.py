"""Copy one dataset file to a tier: temporary name, sha256 while copying, fsync, then rename.

What users know from rclone (``.partial`` plus checksum) and Beam sinks (temp, then rename): a
file under its final name is always whole and verified. On a local tier the temporary file sits
next to the target and ``os.replace`` publishes it; on S3 the bytes stream to the final key as a
multipart upload completed only once the hash matched (``object_upload.send``); on other object
stores they go to a temporary key, which a server-side move publishes once the hash matched. The copy is never read
back: the hash is computed on the bytes as they are copied. Local to local, the kernel copies
each chunk (``copy_file_range``, no trip through user space) and the hash reads that chunk's
pages from the page cache the copy just filled; elsewhere each chunk is read, hashed, written.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import hashlib
import os
import posixpath
import sys
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow.fs as pafs

from shardfeed.formats.atomic import fsync_dir, is_temp_name, temp_name
from shardfeed.formats.object_upload import SendMismatchError, s3_client, send
from shardfeed.formats.retry import retried
from shardfeed.formats.retrying_fs import retrying
from shardfeed.formats.storage import Location
from shardfeed.schemas.errors import ShardfeedError

CHUNK = 8 << 20
_SYNC_FILE_RANGE_WRITE = 2  # linux/fs.h: start writeback of dirty pages, do not wait


class CopyMismatchError(ShardfeedError):
    """The bytes read from the source do not match the manifest: the source changed or rotted."""


@dataclass(frozen=True)
class Target:
    """A tier copy's root: a local directory, or a path on a pyarrow filesystem (S3, GCS)."""

    root: str
    filesystem: pafs.FileSystem | None = None  # None: local

    def __post_init__(self) -> None:
        if self.filesystem is not None:  # every object-store call retried (formats/retry.py)
            object.__setattr__(self, "filesystem", retrying(self.filesystem))

    @property
    def is_local(self) -> bool:
        return self.filesystem is None

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel) if self.is_local else posixpath.join(self.root, rel)

    def display(self, rel: str = "") -> str:
        return self.path(rel) if rel else self.root


def file_matches(target: Target, rel: str, size: int, sha256: str) -> bool:
    """Whether ``rel`` exists on the tier with this size and sha256 (re-read in full: only a
    hash catches a copy that rotted in place)."""
    path = target.path(rel)
    try:
        if target.is_local:
            if os.path.getsize(path) != size:
                return False
            with open(path, "rb") as handle:
                return hashlib.file_digest(handle, "sha256").hexdigest() == sha256
        info = target.filesystem.get_file_info(path)
        if info.type != pafs.FileType.File or info.size != size:
            return False
        digest = hashlib.sha256()
        with target.filesystem.open_input_stream(path, compression=None) as stream:
            while chunk := stream.read(CHUNK):
                digest.update(chunk)
        return digest.hexdigest() == sha256
    except (FileNotFoundError, OSError):
        return False


def copy_file(
    source: Location,
    target: Target,
    rel: str,
    size: int,
    sha256: str,
    *,
    before_write: Callable[[str, int], None] | None = None,
    progress: Callable[[int], None] | None = None,
) -> None:
    """Copy ``rel`` from ``source`` to ``target`` and publish it only once its size and sha256
    match. ``before_write(temp_path, size)`` may prepare the local temporary file (Lustre
    striping creates it with a layout); ``progress(n)`` hears every chunk."""
    if target.is_local:
        _copy_through_temp(source, target, rel, size, sha256, before_write, progress)
    elif s3_client(target.filesystem) is not None:
        _send_to_s3(source, target, rel, size, sha256, progress)
    else:  # another object store: a stream cannot be resumed, so the whole copy is retried
        retried(
            lambda: _copy_through_temp(source, target, rel, size, sha256, None, progress),
            f"copy {source.display}/{rel} to {target.path(rel)}",
        )


def _copy_through_temp(
    source: Location,
    target: Target,
    rel: str,
    size: int,
    sha256: str,
    before_write: Callable[[str, int], None] | None,
    progress: Callable[[int], None] | None,
) -> None:
    """Copy to a temporary name, check size and sha256, then rename it to its final name."""
    final = target.path(rel)
    temp = temp_name(final)
    if target.is_local:
        os.makedirs(os.path.dirname(final) or ".", exist_ok=True)
        if before_write is not None:
            before_write(temp, size)
    digest = hashlib.sha256()
    try:
        with _open_input(source, rel) as reader, _open_output(target, temp) as writer:
            written = None
            if source.is_local and target.is_local:
                written = _copy_in_kernel(reader.fileno(), writer.fileno(), digest, progress)
            if written is None:  # not local to local, or the kernel cannot copy these files
                written = _copy_streaming(reader, writer, target.is_local, digest, progress)
            if target.is_local:
                os.fdatasync(writer.fileno())  # the data; the rename then makes the name durable
        if written != size or digest.hexdigest() != sha256:
            raise CopyMismatchError(
                f"{source.display}/{rel}: read {written} bytes with sha256 {digest.hexdigest()[:16]}…, "
                f"but the manifest says {size} bytes, {sha256[:16]}…; the source changed or is corrupt"
            )
        if target.is_local:
            os.replace(temp, final)
            fsync_dir(os.path.dirname(final))
        else:
            target.filesystem.move(temp, final)
    except BaseException:
        _remove(target, temp)
        raise


def _send_to_s3(
    source: Location,
    target: Target,
    rel: str,
    size: int,
    sha256: str,
    progress: Callable[[int], None] | None,
) -> None:
    """Stream ``rel`` to its final key on S3, hashed while sent: the object appears only once
    the bytes matched (a multipart upload completed, or a single PUT made, after the check), so
    no temporary key and no server-side copy, whose 5 GiB limit a video file can pass."""
    try:
        with _open_input(source, rel) as reader:
            send(
                target.filesystem, reader, target.path(rel), size, (size, sha256), progress=progress
            )
    except SendMismatchError as err:
        raise CopyMismatchError(
            f"{source.display}/{rel}: {err}; the source changed or is corrupt"
        ) from None


def _copy_in_kernel(
    source_fd: int, target_fd: int, digest, progress: Callable[[int], None] | None
) -> int | None:
    """Copy with ``copy_file_range`` chunk by chunk, hashing each chunk from the page cache the
    copy filled; the bytes copied, or None when the kernel refuses these files before any byte
    moved (no such call, or a file system pair it cannot copy between)."""
    if not hasattr(os, "copy_file_range"):
        return None
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    written = 0
    while True:
        try:
            n = os.copy_file_range(source_fd, target_fd, CHUNK, written, written)
        except OSError as error:
            if written == 0 and error.errno in _NO_KERNEL_COPY:
                return None
            raise
        if n == 0:
            return written
        got = os.preadv(source_fd, [view[:n]], written)  # the pages just copied, still cached
        if got != n:
            raise OSError(errno.EIO, f"re-reading {n} copied bytes at {written} gave {got}")
        digest.update(view[:n])  # releases the GIL: the pool's copies run in parallel
        start_writeback(target_fd, written, n)
        written += n
        if progress is not None:
            progress(n)


# copy_file_range refuses: not implemented, across file systems (old kernels), or unsupported
_NO_KERNEL_COPY = {errno.ENOSYS, errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF}


def _copy_streaming(reader, writer, local: bool, digest, progress) -> int:
    """Read, hash and write chunk by chunk; the bytes copied."""
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    written = 0
    while n := reader.readinto(buffer):
        chunk = view[:n]
        digest.update(chunk)  # releases the GIL: the pool's copies run in parallel
        writer.write(chunk)
        if local:  # start writing this chunk back now, not all at the fsync
            writer.flush()
            start_writeback(writer.fileno(), written, n)
        written += n
        if progress is not None:
            progress(n)
    if local:
        writer.flush()
    return written


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Have the kernel start writing ``[offset, offset + nbytes)`` of ``fd`` to disk, without
    waiting (Linux ``sync_file_range``). The copy's final ``fdatasync`` then finds little left
    to flush, so durability overlaps the copy instead of following it. A no-op elsewhere."""
    call = _sync_file_range()
    if call is not None:
        call(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)


@functools.cache
def _sync_file_range():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    call.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    call.restype = ctypes.c_int
    return call


def copy_if_needed(
    source: Location,
    target: Target,
    rel: str,
    size: int,
    sha256: str,
    *,
    before_write: Callable[[str, int], None] | None = None,
    progress: Callable[[int], None] | None = None,
) -> tuple[str, int]:
    """Make the tier's ``rel`` a verified copy: ``("skipped", 0)`` when it already is,
    ``("recopied", size)`` when a copy there had rotted, ``("copied", size)`` otherwise."""
    if exists(target, rel):
        if file_matches(target, rel, size, sha256):
            if progress is not None:
                progress(size)
            return "skipped", 0
        outcome = "recopied"
    else:
        outcome = "copied"
    copy_file(source, target, rel, size, sha256, before_write=before_write, progress=progress)
    return outcome, size


def exists(target: Target, rel: str) -> bool:
    if target.is_local:
        return os.path.lexists(target.path(rel))
    return target.filesystem.get_file_info(target.path(rel)).type != pafs.FileType.NotFound


def remove_temporaries(target: Target) -> list[str]:
    """Delete temporary files a killed copy left under the target (only shardfeed's own
    temporary names); returns their paths relative to the root."""
    removed = []
    if target.is_local:
        if not os.path.isdir(target.root):
            return removed
        for directory, _, names in os.walk(target.root):
            for name in names:
                if is_temp_name(name):
                    path = os.path.join(directory, name)
                    os.unlink(path)
                    removed.append(os.path.relpath(path, target.root))
        return removed
    selector = pafs.FileSelector(target.root, recursive=True, allow_not_found=True)
    for info in target.filesystem.get_file_info(selector):
        if info.type == pafs.FileType.File and is_temp_name(info.base_name):
            target.filesystem.delete_file(info.path)
            removed.append(info.path[len(target.root) :].lstrip("/"))
    return removed


def _open_input(source: Location, rel: str):
    """A local source is read with plain unbuffered I/O (its path checked like every read, and
    the kernel told the read is sequential); others through pyarrow."""
    if not source.is_local:
        return source.open_input(rel)
    handle = open(source.path(rel), "rb", buffering=0)  # noqa: SIM115 (the caller closes it)
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
    return handle


def _open_output(target: Target, path: str):
    if target.is_local:
        return open(path, "wb", buffering=0)
    parent = posixpath.dirname(path)
    if parent:
        target.filesystem.create_dir(parent, recursive=True)
    return target.filesystem.open_output_stream(path)


def _remove(target: Target, path: str) -> None:
    try:
        if target.is_local:
            os.unlink(path)
        else:
            target.filesystem.delete_file(path)
    except (FileNotFoundError, OSError):
        pass

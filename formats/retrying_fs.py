"""A pyarrow filesystem that retries every call to an object store (``formats/retry.py``).

``retrying(fs)`` wraps a remote ``pyarrow.fs`` filesystem in a ``PyFileSystem`` whose handler
passes each call through :func:`~shardfeed.formats.retry.retried`: listings, heads, deletes,
moves, and every read. Files opened for reading are Python readers over the inner filesystem's
random-access file: each read is a ranged read of exactly the bytes asked for, checked to be
whole (a body cut off midway is retried, never served), and the inner file is reopened after a
transient failure. Writes are not wrapped: a stream cannot be replayed, so whole objects are
sent by ``formats/object_upload.py``, whose calls botocore retries. Local filesystems are
returned as they are; the wrapper pickles (Beam ships it to workers) and :func:`unwrap` gives
the inner filesystem back.
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from shardfeed.formats.retry import ShortReadError, io_timeout, retried


def from_uri(uri: str) -> tuple[pafs.FileSystem, str]:
    """The retrying filesystem and path an object-store URI names. On S3 the client's connect
    and request timeouts come from ``SHARDFEED_IO_TIMEOUT`` (a URI cannot set them), so an
    answer that never comes fails the request in bounded time and is retried."""
    filesystem, path = pafs.FileSystem.from_uri(uri)
    if isinstance(filesystem, pafs.S3FileSystem):
        rebuild, (options,) = filesystem.__reduce__()
        seconds = io_timeout()
        filesystem = rebuild({**options, "connect_timeout": seconds, "request_timeout": seconds})
    return retrying(filesystem), path


def retrying(filesystem: pafs.FileSystem) -> pafs.FileSystem:
    """``filesystem`` with retried calls; local and already wrapped filesystems unchanged."""
    if isinstance(filesystem, pafs.LocalFileSystem) or _handler(filesystem) is not None:
        return filesystem
    return pafs.PyFileSystem(RetryingHandler(filesystem))


def unwrap(filesystem: pafs.FileSystem) -> pafs.FileSystem:
    """The filesystem :func:`retrying` wrapped (or ``filesystem`` itself)."""
    handler = _handler(filesystem)
    return filesystem if handler is None else handler.inner


def _handler(filesystem: pafs.FileSystem) -> RetryingHandler | None:
    if isinstance(filesystem, pafs.PyFileSystem) and isinstance(
        filesystem.handler, RetryingHandler
    ):
        return filesystem.handler
    return None


class RetryingHandler(pafs.FileSystemHandler):
    """Every call of ``inner`` retried on transient errors."""

    def __init__(self, inner: pafs.FileSystem) -> None:
        self.inner = inner

    def __reduce__(self) -> tuple:
        return (RetryingHandler, (self.inner,))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RetryingHandler) and self.inner.equals(other.inner)

    def __hash__(self) -> int:
        return hash(self.inner.type_name)

    def _name(self, path: str) -> str:
        return f"{self.inner.type_name}://{path}"

    def get_type_name(self) -> str:
        return self.inner.type_name

    def normalize_path(self, path: str) -> str:
        return self.inner.normalize_path(path)

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        what = self._name(paths[0]) if len(paths) == 1 else f"{len(paths)} paths"
        return retried(lambda: self.inner.get_file_info(paths), f"head {what}")

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return retried(
            lambda: self.inner.get_file_info(selector), f"list {self._name(selector.base_dir)}"
        )

    def create_dir(self, path: str, recursive: bool) -> None:
        retried(lambda: self.inner.create_dir(path, recursive=recursive), self._name(path))

    def delete_dir(self, path: str) -> None:
        retried(lambda: self.inner.delete_dir(path), f"delete {self._name(path)}")

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        retried(
            lambda: self.inner.delete_dir_contents(path, missing_dir_ok=missing_dir_ok),
            f"delete {self._name(path)}/*",
        )

    def delete_root_dir_contents(self) -> None:
        raise OSError("shardfeed never deletes a whole object store")

    def delete_file(self, path: str) -> None:
        retried(lambda: self.inner.delete_file(path), f"delete {self._name(path)}")

    def move(self, src: str, dest: str) -> None:
        retried(lambda: self.inner.move(src, dest), f"move {self._name(src)}")

    def copy_file(self, src: str, dest: str) -> None:
        retried(lambda: self.inner.copy_file(src, dest), f"copy {self._name(src)}")

    def open_input_stream(self, path: str) -> pa.NativeFile:
        return pa.PythonFile(RetryingReader(self.inner, path), mode="r")

    def open_input_file(self, path: str) -> pa.NativeFile:
        return pa.PythonFile(RetryingReader(self.inner, path), mode="r")

    def open_output_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        return self.inner.open_output_stream(path, metadata=metadata)

    def open_append_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        return self.inner.open_append_stream(path, metadata=metadata)


class RetryingReader(io.RawIOBase):
    """A seekable reader of one object: each read a ranged read, whole or retried."""

    def __init__(self, inner: pafs.FileSystem, path: str) -> None:
        super().__init__()
        self._fs = inner
        self._path = path
        self._name = f"{inner.type_name}://{path}"
        self._file: pa.NativeFile | None = None
        self._size = retried(lambda: self._open().size(), f"open {self._name}")
        self._at = 0

    def _open(self) -> pa.NativeFile:
        if self._file is None:
            self._file = self._fs.open_input_file(self._path)
        return self._file

    def _drop(self) -> None:
        if self._file is not None:
            with contextlib.suppress(Exception):  # a broken connection may fail to close
                self._file.close()
            self._file = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._at

    def size(self) -> int:
        return self._size

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: self._size}[whence]
        self._at = max(0, base + offset)
        return self._at

    def read(self, n: int = -1) -> bytes:
        want = self._size - self._at if n is None or n < 0 else min(n, self._size - self._at)
        if want <= 0:
            return b""
        data = self._read_at(self._at, want)
        self._at += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(memoryview(buffer)))
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)

    def _read_at(self, offset: int, want: int) -> bytes:
        def attempt() -> bytes:
            try:
                data = self._open().read_at(want, offset)
            except Exception:
                self._drop()  # the connection may be broken: a fresh one next time
                raise
            if len(data) != want:
                self._drop()
                raise ShortReadError(f"got {len(data)} of {want} bytes")
            return data

        return retried(attempt, f"read {self._name} bytes {offset}-{offset + want - 1}")

    def close(self) -> None:
        self._drop()
        super().close()

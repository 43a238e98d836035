"""A path on the storage a conversion writes: a local directory or an object-store key.

DST, its work directory and every work file are ``StorePath`` values, so the same pipeline code
runs with DST on a local disk, a shared POSIX mount or an object store, and a worker never needs a
path another process can see. Local paths go through ``os``, written under a temporary name and
renamed; object-store keys go through ``pyarrow.fs``, and a whole file a worker built in its own
temporary directory is sent by :func:`~shardfeed.formats.object_upload.upload_file` (multipart,
sha256 while sending). Paths here are our own (work files, planned shard names), so no escape
check is made; readers of untrusted manifests use :class:`~shardfeed.formats.storage.Location`.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.fs as pafs

from shardfeed.formats.atomic import atomic_write_bytes
from shardfeed.formats.object_upload import put_bytes, upload_file
from shardfeed.formats.retrying_fs import from_uri, retrying, unwrap

if TYPE_CHECKING:
    from shardfeed.formats.storage import Location


def is_remote(uri: str) -> bool:
    """Whether ``uri`` names an object store (``s3://``, ``gs://`` ...) rather than a local path."""
    return "://" in uri and not uri.startswith("file://")


@dataclass(frozen=True)
class StorePath:
    """``path`` on ``filesystem`` (None: the local file system, ``path`` absolute)."""

    path: str
    filesystem: pafs.FileSystem | None = None

    @classmethod
    def of(cls, uri: str | os.PathLike[str]) -> StorePath:
        """A local path, ``file://`` URI or object-store URI (query parameters such as
        ``endpoint_override`` configure the filesystem)."""
        text = os.fspath(uri)
        if is_remote(text):
            filesystem, path = from_uri(text)
            return cls(path.rstrip("/"), filesystem)
        return cls(os.path.abspath(text.removeprefix("file://")))

    @classmethod
    def at(cls, location: Location) -> StorePath:
        """The root of a dataset :class:`~shardfeed.formats.storage.Location`."""
        return cls(location.root, None if location.is_local else retrying(location.filesystem))

    @property
    def is_local(self) -> bool:
        return self.filesystem is None

    @property
    def local(self) -> str:
        """The local path; raises for an object-store key (callers check :attr:`is_local`)."""
        if self.filesystem is not None:
            raise ValueError(f"{self} is not a local path")
        return self.path

    @property
    def name(self) -> str:
        return posixpath.basename(self.path)

    @property
    def parent(self) -> StorePath:
        return StorePath(posixpath.dirname(self.path), self.filesystem)

    def __truediv__(self, rel: str) -> StorePath:
        return StorePath(posixpath.join(self.path, rel), self.filesystem)

    def __str__(self) -> str:
        if self.filesystem is None:
            return self.path
        return f"{unwrap(self.filesystem).type_name}://{self.path}"

    def __hash__(self) -> int:  # a pyarrow filesystem is not hashable; equal paths hash alike
        return hash((self.path, None if self.filesystem is None else str(self)))

    # --- reading -------------------------------------------------------------------------

    def exists(self) -> bool:
        if self.filesystem is None:
            return os.path.exists(self.path)
        return self.filesystem.get_file_info(self.path).type != pafs.FileType.NotFound

    def is_file(self) -> bool:
        if self.filesystem is None:
            return os.path.isfile(self.path)
        return self.filesystem.get_file_info(self.path).type == pafs.FileType.File

    def stamp(self) -> int | None:
        """The file's modification time in nanoseconds (a cache key), None when it is absent."""
        if self.filesystem is None:
            try:
                return os.stat(self.path).st_mtime_ns
            except FileNotFoundError:
                return None
        info = self.filesystem.get_file_info(self.path)
        if info.type == pafs.FileType.NotFound:
            return None
        return info.mtime_ns or 0

    def read_bytes(self) -> bytes:
        """The whole file; FileNotFoundError when it is absent."""
        if self.filesystem is None:
            with open(self.path, "rb") as handle:
                return handle.read()
        try:
            with self.filesystem.open_input_stream(self.path, compression=None) as stream:
                return stream.read()
        except FileNotFoundError:
            raise
        except OSError as err:
            if not self.exists():
                raise FileNotFoundError(str(self)) from err
            raise

    def read_text(self) -> str:
        return self.read_bytes().decode("utf-8")

    def open_input(self) -> pa.NativeFile:
        """A random-access file (ranged reads on an object store)."""
        if self.filesystem is None:
            return pa.OSFile(self.path)
        return self.filesystem.open_input_file(self.path)

    def names(self) -> list[str]:
        """Names of the entries directly under this directory, sorted; [] when it is absent."""
        if self.filesystem is None:
            try:
                return sorted(os.listdir(self.path))
            except (FileNotFoundError, NotADirectoryError):
                return []
        selector = pafs.FileSelector(self.path, recursive=False, allow_not_found=True)
        return sorted(posixpath.basename(i.path) for i in self.filesystem.get_file_info(selector))

    def files(self) -> list[str]:
        """Paths of every file under this directory relative to it (recursive), sorted."""
        if self.filesystem is None:
            out = []
            for directory, _, names in os.walk(self.path):
                for name in names:
                    rel = os.path.relpath(os.path.join(directory, name), self.path)
                    out.append(rel.replace(os.sep, "/"))
            return sorted(out)
        selector = pafs.FileSelector(self.path, recursive=True, allow_not_found=True)
        prefix = self.path.rstrip("/") + "/"
        return sorted(
            info.path[len(prefix) :]
            for info in self.filesystem.get_file_info(selector)
            if info.type == pafs.FileType.File and info.path.startswith(prefix)
        )

    # --- writing -------------------------------------------------------------------------

    def makedirs(self) -> None:
        """Create this directory (object stores have none: nothing to do)."""
        if self.filesystem is None:
            os.makedirs(self.path, exist_ok=True)

    def write_bytes(self, data: bytes | pa.Buffer, *, durable: bool = False) -> None:
        """Write the whole file at once: it appears complete or not at all (a local temporary
        name then a rename; one object-store PUT). ``durable``: fsync a local file. A pyarrow
        ``Buffer`` is written to a local file as it is, with no copy into ``bytes``."""
        if self.filesystem is None:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            atomic_write_bytes(
                self.path, data if isinstance(data, bytes) else memoryview(data), durable=durable
            )
            return
        put_bytes(
            self.filesystem, self.path, data if isinstance(data, bytes) else data.to_pybytes()
        )

    def unlink(self) -> None:
        """Delete the file if it exists."""
        with contextlib.suppress(FileNotFoundError):
            if self.filesystem is None:
                os.unlink(self.path)
            elif self.is_file():
                self.filesystem.delete_file(self.path)

    def rmtree(self) -> None:
        """Delete this directory and everything under it, if it exists."""
        if self.filesystem is None:
            shutil.rmtree(self.path, ignore_errors=True)
            return
        with contextlib.suppress(FileNotFoundError):
            self.filesystem.delete_dir_contents(self.path, missing_dir_ok=True)
        with contextlib.suppress(OSError):  # a directory marker, where the store keeps one
            if self.filesystem.get_file_info(self.path).type == pafs.FileType.Directory:
                self.filesystem.delete_dir(self.path)

    def remove(self) -> None:
        """Delete this file, or this directory and everything under it, if it exists."""
        if self.is_file():
            self.unlink()
        else:
            self.rmtree()

    def move_to(self, other: StorePath) -> None:
        """Rename this file to ``other`` (a server-side copy and delete on an object store: for
        small work files only)."""
        if self.filesystem is None:
            os.makedirs(os.path.dirname(other.path), exist_ok=True)
            os.replace(self.path, other.path)
        else:
            self.filesystem.move(self.path, other.path)

    @contextlib.contextmanager
    def staged(self) -> Iterator[str]:
        """A local path to write this file at, by any writer that takes a path: locally the
        final path itself (the writer renames into place as it always does); on an object
        store a file in this process's own temporary directory, uploaded when the block ends
        without error and then removed. Nothing is uploaded if the block raises."""
        if self.filesystem is None:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            yield self.path
            return
        with local_scratch() as scratch:
            path = os.path.join(scratch, self.name)
            yield path
            if os.path.exists(path):
                self.upload(path)

    @contextlib.contextmanager
    def staged_root(self) -> Iterator[str]:
        """A local directory to build files under this directory at their relative paths:
        locally this directory itself; on an object store a private temporary directory, whose
        files :meth:`land` then sends."""
        if self.filesystem is None:
            os.makedirs(self.path, exist_ok=True)
            yield self.path
            return
        with local_scratch() as scratch:
            yield scratch

    @contextlib.contextmanager
    def writing(self) -> Iterator[tuple[str, list[str]]]:
        """A local root to write files under at their relative paths, and a list to name them in:
        on success an object-store directory receives the named files, in that order (the last
        is the commit point, e.g. a header naming a table); a local one is written in place."""
        names: list[str] = []
        with self.staged_root() as root:
            yield root, names
            if self.filesystem is not None:
                for rel in names:
                    (self / rel).upload(os.path.join(root, rel))

    def land(self, root: str, files: Sequence[tuple[str, int, str]]) -> None:
        """Send files built under ``staged_root``'s ``root`` to their keys under this directory:
        ``(relative path, size, sha256)`` each, checked against the bytes as they are sent (a
        file that changed on the local disk is never published:
        :class:`~shardfeed.formats.object_upload.SendMismatchError`). Nothing to do locally."""
        if self.filesystem is None:
            return
        for rel, size, sha256 in files:
            (self / rel).upload(os.path.join(root, rel), expect=(size, sha256))

    def upload(self, local_path: str, expect: tuple[int, str] | None = None) -> tuple[int, str]:
        """Send a local file to this key (multipart, hashed while sending); (size, sha256).
        ``expect``: the (size, sha256) the bytes must have to be published."""
        if self.filesystem is None:
            raise ValueError(f"{self} is local: move the file instead")
        return upload_file(self.filesystem, local_path, self.path, expect)


@contextlib.contextmanager
def local_scratch() -> Iterator[str]:
    """A private temporary directory of this process (``TMPDIR``), removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="shardfeed-") as scratch:
        yield scratch

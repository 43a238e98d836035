"""Where a dataset lives: a local directory or an object-store URI, reached through ``pyarrow.fs``.

Every path handed out is a manifest-relative path checked against escapes; on local disks it is also
resolved through symlinks and refused if it lands outside the root.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import functools
import itertools
import os
import posixpath
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import pyarrow.fs as pafs

from shardfeed.formats.retrying_fs import from_uri, retrying
from shardfeed.schemas.errors import ShardfeedError
from shardfeed.schemas.paths import check_relative_path, resolve_within

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_FADVISE = hasattr(os, "posix_fadvise")
READ_AHEAD = 128  # files read_ahead keeps open and advised ahead of the one being read


@dataclass(frozen=True)
class Location:
    filesystem: pafs.FileSystem
    root: str
    is_local: bool
    display: str

    @functools.cached_property
    def real_root(self) -> str:
        """The root with symlinks resolved, computed once (it anchors every escape check)."""
        return os.path.realpath(self.root)

    @functools.cached_property
    def _real_dirs(self) -> dict[str, str]:
        """Checked real paths of the directories read from so far (see :meth:`read_bytes`)."""
        return {}

    def __getstate__(self) -> dict:
        # recompute the real root and directories where the object lands (a worker may mount
        # things differently)
        return {k: v for k, v in self.__dict__.items() if k not in ("real_root", "_real_dirs")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def path(self, rel: str, field: str = "path") -> str:
        """Filesystem path of ``rel``; raises UnsafePathError if it escapes the root."""
        if self.is_local:
            return resolve_within(self.root, rel, field, real_root=self.real_root)
        return posixpath.join(self.root, check_relative_path(rel, field))

    def open_input(self, rel: str, field: str = "path"):
        return self.filesystem.open_input_file(self.path(rel, field))

    def read_bytes(self, rel: str, field: str = "path") -> bytes:
        """The whole file ``rel``; raises UnsafePathError if it escapes the root.

        Local reads are the hot loop of a conversion (one call per image), so they skip pyarrow and
        resolve each *directory* once: the file is then opened with ``O_NOFOLLOW``, so a leaf that
        is a symlink (``ELOOP``) falls back to resolving the whole path. This checks exactly what
        :meth:`path` checks, with one ``realpath`` per directory instead of one per file.
        """
        if not self.is_local:
            with self.open_input(rel, field) as handle:
                return handle.read()
        fd = self._open_local(rel, field)
        try:
            return _read_all(fd)
        finally:
            os.close(fd)

    def read_into(self, rel: str, view: memoryview, field: str = "path") -> None:
        """Fill ``view`` with the whole file ``rel``, which must be exactly ``len(view)`` bytes
        (raises ValueError otherwise): the shard writer reads images straight into the column
        buffer, with no bytes object per file. Same escape checks as :meth:`read_bytes`."""
        if not self.is_local:
            data = self.read_bytes(rel, field)
            if len(data) != len(view):
                raise ValueError(f"{rel} has {len(data)} bytes, expected {len(view)}")
            view[:] = data
            return
        fd = self._open_local(rel, field)
        try:
            size = os.fstat(fd).st_size
            if size != len(view):
                raise ValueError(f"{rel} has {size} bytes, expected {len(view)}")
            done = 0
            while done < size:
                got = os.readv(fd, [view[done:]])
                if not got:
                    raise ValueError(f"{rel} ended after {done} of {size} bytes")
                done += got
        finally:
            os.close(fd)

    def read_ahead(
        self, rels: Sequence[str], window: int = READ_AHEAD, head: int | None = None
    ) -> Iterator[bytes | FileHead | OSError | ShardfeedError]:
        """Each file's bytes (with ``head``: its size and first ``head`` bytes, a
        :class:`FileHead`), or the error that stopped its read, in order.

        Local files are opened ``window`` files ahead of the one being read and the OS is asked to
        start reading them (``POSIX_FADV_WILLNEED``), so on a cold disk the reads overlap the
        caller's work on earlier files (with ``head``, the rest of each file then waits in the page
        cache for whoever reads it next); each descriptor is then read and closed in turn. Escape
        checks are those of :meth:`read_bytes`.
        """
        if not self.is_local:
            for rel in rels:
                try:
                    yield (
                        self.read_bytes(rel, rel) if head is None else self._remote_head(rel, head)
                    )
                except (OSError, ShardfeedError) as err:
                    yield err
            return
        pending: collections.deque[int | OSError | ShardfeedError] = collections.deque()

        def open_next(rel: str) -> None:
            try:
                fd = self._open_local(rel, rel)
            except (OSError, ShardfeedError) as err:
                pending.append(err)
                return
            if _FADVISE:
                with contextlib.suppress(OSError):
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            pending.append(fd)

        upcoming = iter(rels)
        try:
            for rel in itertools.islice(upcoming, window):
                open_next(rel)
            while pending:
                item = pending.popleft()
                for rel in itertools.islice(upcoming, 1):
                    open_next(rel)
                if isinstance(item, int):
                    try:
                        data: bytes | FileHead | OSError = (
                            _read_all(item) if head is None else _read_head(item, head)
                        )
                    except OSError as err:
                        data = err
                    finally:
                        os.close(item)
                    yield data
                else:
                    yield item
        finally:  # the caller stopped early: close what is still open
            for item in pending:
                if isinstance(item, int):
                    os.close(item)

    def _remote_head(self, rel: str, head: int) -> FileHead:
        with self.open_input(rel, rel) as handle:
            size = handle.size()
            return FileHead(size, handle.read_at(min(head, size), 0) if head else b"")

    def _open_local(self, rel: str, field: str) -> int:
        """A read-only descriptor of local ``rel``: its directory resolved once and cached, the
        file itself opened with ``O_NOFOLLOW`` (a symlinked leaf is resolved in full)."""
        try:
            return os.open(self._local_leaf(rel, field), os.O_RDONLY | _O_NOFOLLOW)
        except OSError as err:
            if err.errno != errno.ELOOP:
                raise
            return os.open(self.path(rel, field), os.O_RDONLY)

    def _local_leaf(self, rel: str, field: str) -> str:
        """Local ``rel`` under its directory's checked real path (resolved once per directory);
        the leaf itself is not resolved, so callers must not follow it if it is a symlink."""
        check_relative_path(rel, field)
        head, _, leaf = rel.rpartition("/")
        real_dir = self._real_dirs.get(head)
        if real_dir is None:
            real_dir = self.real_root
            if head:
                real_dir = resolve_within(self.root, head, field, real_root=self.real_root)
            self._real_dirs[head] = real_dir
        return os.path.join(real_dir, leaf)

    def info(self, rel: str, field: str = "path") -> pafs.FileInfo:
        return self.filesystem.get_file_info(self.path(rel, field))

    def size_and_mtime(self, rel: str, field: str = "path") -> tuple[int, int]:
        """(size, mtime in ns) of file ``rel``; raises OSError if it is missing. Locally one
        ``lstat`` under the cached directory (a symlinked leaf is resolved in full), with the escape
        checks of :meth:`read_bytes`: a shard writer stamps every image it takes this way."""
        if not self.is_local:
            info = self.info(rel, field)
            if info.type == pafs.FileType.NotFound:
                raise FileNotFoundError(errno.ENOENT, "no such file", rel)
            return int(info.size), int(info.mtime_ns)
        st = os.lstat(self._local_leaf(rel, field))
        if stat.S_ISLNK(st.st_mode):
            st = os.stat(self.path(rel, field))
        return st.st_size, st.st_mtime_ns

    def list_files(self, directory: str) -> list[str]:
        """Root-relative paths of all files under ``directory`` (recursive); [] if it is absent."""
        base = (
            posixpath.join(self.root, directory)
            if not self.is_local
            else os.path.join(self.root, directory)
        )
        selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
        out = []
        for info in self.filesystem.get_file_info(selector):
            if info.type == pafs.FileType.Directory:
                continue
            rel = (
                os.path.relpath(info.path, self.root)
                if self.is_local
                else posixpath.relpath(info.path, self.root)
            )
            out.append(rel.replace(os.sep, "/"))
        return sorted(out)


class FileHead(NamedTuple):
    """A file's size and its first bytes (all of them when ``whole``)."""

    size: int
    data: bytes

    @property
    def whole(self) -> bool:
        return len(self.data) >= self.size


def _read_head(fd: int, head: int) -> FileHead:
    """The size of an open file and its first ``head`` bytes (fewer only at its end)."""
    size = os.fstat(fd).st_size
    want = min(head, size)
    chunks, got = [], 0
    while got < want:
        chunk = os.pread(fd, want - got, got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return FileHead(size, b"".join(chunks))


def _read_all(fd: int) -> bytes:
    """Read an open file descriptor to its end (the size is a hint: a file may grow or shrink)."""
    size = os.fstat(fd).st_size
    chunks = []
    while chunk := os.read(fd, size + 1 if not chunks else 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)  # one chunk: the same object, no copy


def locate(uri: str | os.PathLike[str], filesystem: pafs.FileSystem | None = None) -> Location:
    """Resolve a local path, ``file://`` or object-store URI (``s3://bucket/prefix``) to a Location."""
    text = os.fspath(uri)
    if filesystem is not None:
        root = text.split("://", 1)[-1].rstrip("/")
        local = isinstance(filesystem, pafs.LocalFileSystem)
        return Location(retrying(filesystem), root, local, text)
    if "://" in text and not text.startswith("file://"):
        fs, root = from_uri(text)
        return Location(fs, root.rstrip("/"), False, text)
    local = text[len("file://") :] if text.startswith("file://") else text
    return Location(pafs.LocalFileSystem(), os.path.abspath(local), True, text)

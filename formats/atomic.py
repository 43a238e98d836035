"""Atomic local writes: a temporary name in the same directory, fsync, then rename.

``durable=False`` skips both fsyncs, for scratch files a re-run recomputes anyway (a conversion's
work directory): the rename still makes them appear whole or not at all to other processes.
``sync_dir=False`` fsyncs the file but leaves the rename's durability to the caller, who syncs each
directory once (``fsync_dirs``) before anything points at the file: a dataset's shards are
published by a manifest, written after their directories are synced, not one sync per shard.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterable, Iterator
from typing import BinaryIO

TMP_MARKER = ".tmp-"


def temp_name(path: str) -> str:
    """A hidden sibling name that no reader or verifier mistakes for a finished file."""
    head, tail = os.path.split(path)
    return os.path.join(head, f".{tail}{TMP_MARKER}{uuid.uuid4().hex}")


def is_temp_name(name: str) -> bool:
    return name.startswith(".") and TMP_MARKER in name


@contextlib.contextmanager
def atomic_open(path: str, *, durable: bool = True, sync_dir: bool = True) -> Iterator[BinaryIO]:
    """Yield a binary file; on success it is fsynced and renamed to ``path``, on error removed."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = temp_name(path)
    try:
        with open(tmp, "wb") as handle:
            yield handle
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable and sync_dir:
        fsync_dir(os.path.dirname(path) or ".")


def atomic_write_bytes(path: str, data: bytes | memoryview, *, durable: bool = True) -> None:
    with atomic_open(path, durable=durable) as handle:
        handle.write(data)


def fsync_dirs(root: str, rel_paths: Iterable[str]) -> None:
    """Fsync, once each, the directories under ``root`` holding ``rel_paths`` (and ``root``):
    the renames of files written with ``sync_dir=False`` become durable."""
    parents = {os.path.dirname(rel) for rel in rel_paths}
    for parent in sorted(parents | {""}):
        fsync_dir(os.path.join(root, parent))


def fsync_dir(directory: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

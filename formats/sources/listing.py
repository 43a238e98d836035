"""Where a file-based source's inputs are: its root, and the files below it.

Every file-based source (JSONL, Parquet, WebDataset, TFRecord) takes a file or a directory, on a
local path or a ``pyarrow.fs`` URI, and lists the inputs below a directory the same way.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable

import pyarrow.fs as pafs

from shardfeed.formats.storage import Location, locate
from shardfeed.schemas.errors import ShardfeedError


def source_root(text: str, what: str) -> tuple[Location, str | None]:
    """The directory a source reads from and, when ``text`` names one file, that file's name in
    it. Raises a ShardfeedError naming ``what`` (e.g. "JSONL source") when nothing is there."""
    location = locate(text)
    info = location.filesystem.get_file_info(location.root)
    if info.type == pafs.FileType.NotFound:
        raise ShardfeedError(f"{what} {text!r} does not exist")
    if info.type != pafs.FileType.File:
        return location, None
    path = os.path.realpath(location.root) if location.is_local else location.root
    parent, single = (os.path if location.is_local else posixpath).split(path)
    return Location(location.filesystem, parent, location.is_local, parent), single


def list_files(
    location: Location,
    wanted: Callable[[str], bool],
    *,
    skip_dir: Callable[[str], bool] = lambda name: False,
) -> list[str]:
    """Root-relative POSIX paths of the files below ``location`` that are ``wanted`` (called with
    that path), sorted.

    Local directory symlinks are not followed; those that lead outside the root are listed as
    they are, so that a source's scan reports them as ``path_escape`` (as it does escaping file
    links). ``skip_dir`` prunes directories by name (local roots). An unreadable directory is a
    ShardfeedError, never a silently shorter list.
    """
    if not location.is_local:
        return sorted(p for p in location.list_files("") if wanted(p))
    root = os.path.realpath(location.root)
    out = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=_raise_listing):
        rel_dir = os.path.relpath(dirpath, root).replace(os.sep, "/")
        prefix = "" if rel_dir == "." else rel_dir + "/"
        dirnames[:] = [d for d in dirnames if not skip_dir(d)]
        for name in dirnames:
            full = os.path.join(dirpath, name)
            target = os.path.realpath(full)
            if os.path.islink(full) and not (target + os.sep).startswith(root + os.sep):
                out.append(prefix + name)
        out += [prefix + n for n in filenames if wanted(prefix + n)]
    return sorted(out)


def _raise_listing(err: OSError) -> None:
    raise ShardfeedError(f"cannot list {err.filename}: {err.strerror}") from err

"""Readers for raw inputs, one module per kind, behind a name -> class registry and autodetection."""

from __future__ import annotations

import glob
import importlib
import itertools
import os
from typing import Any

import pyarrow.fs as pafs

from shardfeed.formats.sources.base import DatasetMeta, ScanResult, SourceReader, UnitRef
from shardfeed.schemas.errors import ShardfeedError

#: kind -> (module, class); imported on use so one broken optional reader never breaks the others
READERS: dict[str, tuple[str, str]] = {
    "lerobot": ("shardfeed.formats.sources.lerobot", "LeRobotSource"),
    "imagefolder": ("shardfeed.formats.sources.imagefolder", "ImageFolderSource"),
    "jsonl": ("shardfeed.formats.sources.jsonl", "JsonlSource"),
    "parquet": ("shardfeed.formats.sources.parquet_table", "ParquetSource"),
    "webdataset": ("shardfeed.formats.sources.webdataset", "WebDatasetSource"),
    "tfrecord": ("shardfeed.formats.sources.tfrecord_source", "TFRecordSource"),
}
PLANNED: tuple[str, ...] = ()
_JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")
_PARQUET_SUFFIX = ".parquet"
_TAR_SUFFIXES = (".tar", ".tgz", ".tar.gz")  # WebDataset shards
_SUFFIX_KINDS = (
    (_JSONL_SUFFIXES, "jsonl"),
    (_PARQUET_SUFFIX, "parquet"),
    (_TAR_SUFFIXES, "webdataset"),
)

__all__ = [
    "READERS",
    "DatasetMeta",
    "ScanResult",
    "SourceReader",
    "UnitRef",
    "detect_kind",
    "open_source",
]


def reader_class(kind: str) -> type:
    if kind in PLANNED:
        raise ShardfeedError(
            f"--from {kind} is not supported yet (planned); supported: {sorted(READERS)}"
        )
    if kind not in READERS:
        raise ShardfeedError(f"unknown source kind {kind!r}; supported: {sorted(READERS)}")
    module, name = READERS[kind]
    return getattr(importlib.import_module(module), name)


def detect_kind(src: str) -> str:
    """LeRobot by meta/info.json codebase_version; JSONL and Parquet (a file, a glob, or a directory
    that is not a LeRobot dataset) by suffix; an image folder by class dirs of images. An
    object-store URI (``s3://bucket/prefix``) is listed through ``pyarrow.fs``."""
    if "://" in src and not src.startswith("file://"):
        return _detect_remote(src)
    if not os.path.exists(src):
        if glob.has_magic(src) and src.endswith(_PARQUET_SUFFIX):  # e.g. data/*.parquet
            return "parquet"
        from shardfeed.formats.sources.webdataset import is_shard_pattern

        if is_shard_pattern(src):  # e.g. shards/train-{000000..000099}.tar
            return "webdataset"
        raise ShardfeedError(f"{src}: no such file or directory")
    from shardfeed.formats.sources.lerobot import lerobot_codebase_version

    if os.path.isdir(src) and lerobot_codebase_version(src) is not None:
        return "lerobot"
    if os.path.isfile(src):
        if src.endswith(_JSONL_SUFFIXES):
            return "jsonl"
        if src.endswith(_PARQUET_SUFFIX):
            return "parquet"
        if src.lower().endswith(_TAR_SUFFIXES):
            return "webdataset"
        if "tfrecord" in os.path.basename(src).lower():
            return "tfrecord"
        raise ShardfeedError(f"{src}: cannot tell the source kind from the file name; pass --from")
    names = []
    for dirpath, _dirs, files in os.walk(src):
        names += [os.path.join(dirpath, f) for f in files]
        if len(names) > 10_000:
            break
    if any(n.endswith(_JSONL_SUFFIXES) for n in names):
        return "jsonl"
    if any(n.endswith(_PARQUET_SUFFIX) for n in names):  # LeRobot datasets were recognised above
        return "parquet"
    if any(n.lower().endswith(_TAR_SUFFIXES) for n in names):
        return "webdataset"
    if any("tfrecord" in os.path.basename(n).lower() for n in names):
        return "tfrecord"
    if any(
        n.lower().endswith(_IMAGE_SUFFIXES) and os.sep in os.path.relpath(n, src) for n in names
    ):
        return "imagefolder"
    raise ShardfeedError(
        f"{src}: found no LeRobot meta/info.json, *.jsonl[.gz|.zst], *.parquet, *.tar, *tfrecord* or class/*.jpg|png|webp; pass --from"
    )


def _detect_remote(src: str) -> str:
    """:func:`detect_kind` for a URI: the same rules over the keys under it (at most 10,000)."""
    from shardfeed.formats.storage import locate

    location = locate(src)
    info = location.filesystem.get_file_info(location.root)
    name = location.root.rsplit("/", 1)[-1]
    if info.type == pafs.FileType.File:
        for suffixes, kind in _SUFFIX_KINDS:
            if name.lower().endswith(suffixes):
                return kind
        if "tfrecord" in name.lower():
            return "tfrecord"
        raise ShardfeedError(f"{src}: cannot tell the source kind from the key; pass --from")
    selector = pafs.FileSelector(location.root, recursive=True, allow_not_found=True)
    prefix = location.root.rstrip("/") + "/"
    names = [
        i.path[len(prefix) :]
        for i in itertools.islice(location.filesystem.get_file_info(selector), 10_000)
        if i.type == pafs.FileType.File and i.path.startswith(prefix)
    ]
    if not names:
        raise ShardfeedError(f"{src}: no such key or prefix (or it is empty)")
    if "meta/info.json" in names:
        return "lerobot"
    for suffixes, kind in _SUFFIX_KINDS:
        if any(n.lower().endswith(suffixes) for n in names):
            return kind
    if any("tfrecord" in n.rsplit("/", 1)[-1].lower() for n in names):
        return "tfrecord"
    if any(n.lower().endswith(_IMAGE_SUFFIXES) and "/" in n for n in names):
        return "imagefolder"
    raise ShardfeedError(
        f"{src}: found no meta/info.json, *.jsonl[.gz|.zst], *.parquet, *.tar, *tfrecord* or class/*.jpg|png|webp; pass --from"
    )


def open_source(src: str, kind: str | None = None, **options: Any) -> SourceReader:
    """Open ``src`` with the reader for ``kind`` (autodetected when None)."""
    kind = kind or detect_kind(src)
    return reader_class(kind)(src, **options)

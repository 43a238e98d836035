"""Object-store DST names and readiness: endpoints in URIs, display names, and the checks made
before a conversion writes to ``s3://bucket/prefix``.

An object store has no atomic rename of a tree, so publishing is ordered instead: workers send
each shard straight to its final key (``formats/object_upload.py``) and the driver sends the
manifest last. Readers trust only the manifest, so a prefix without one is never taken for a
dataset, whatever else it holds. :func:`prepare_remote` runs before any work: it refuses a
published dataset unless ``overwrite`` (then the old manifest is deleted first, then the rest),
and removes the temporary keys an older shardfeed's killed upload left.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence
from urllib.parse import urlsplit

import pyarrow.fs as pafs

from shardfeed.formats.layout import DATASET_DIRS, LEASE_NAME
from shardfeed.formats.publish import DatasetExistsError
from shardfeed.formats.store_path import is_remote
from shardfeed.formats.tier_copy import Target, remove_temporaries
from shardfeed.schemas.manifest import MANIFEST_PATH

__all__ = [
    "display_uri",
    "is_remote",
    "prepare_remote",
    "source_name",
    "with_endpoint",
]


def with_endpoint(uri: str, endpoint_url: str | None) -> str:
    """``uri`` with pyarrow's ``endpoint_override`` and ``scheme`` query parameters set from
    ``endpoint_url`` (``http://host:port``), for an ``s3://`` URI that names no endpoint itself;
    any other ``uri`` is returned as it is. Without it, pyarrow reads ``AWS_ENDPOINT_URL``."""
    if not endpoint_url or not uri.startswith("s3://") or "endpoint_override=" in uri:
        return uri
    parts = urlsplit(endpoint_url)
    host = parts.netloc or parts.path
    scheme = parts.scheme or "https"
    return f"{uri}{'&' if '?' in uri else '?'}endpoint_override={host}&scheme={scheme}"


def display_uri(uri: str) -> str:
    """``uri`` without its query parameters (endpoints, credentials never go in a summary)."""
    return uri.split("?", 1)[0] if is_remote(uri) else uri


def source_name(src: str) -> str:
    """The manifest's ``source``: the last path component (the bucket for a bare bucket URI)."""
    if is_remote(src):
        parts = urlsplit(display_uri(src))
        return posixpath.basename(parts.path.rstrip("/")) or parts.netloc
    return os.path.basename(os.path.abspath(src.removeprefix("file://")).rstrip("/"))


def prepare_remote(target: Target, overwrite: bool, leftovers: Sequence[str] = ()) -> None:
    """Make ``target`` ready for an upload, before any work is done.

    A published dataset (a manifest) is refused unless ``overwrite``: then its manifest is
    deleted first, so an interrupted overwrite never looks complete, then every key under the
    dataset directories. Without ``overwrite``, a prefix holding keys outside the dataset
    directories is refused too; keys inside them are an interrupted run's leftovers, which the
    upload replaces or deletes, as are keys under the top-level names in ``leftovers`` (a
    conversion's work directory). Temporary keys of a killed upload are removed in every case.
    """
    fs = target.filesystem
    manifest = target.path(MANIFEST_PATH)
    published = fs.get_file_info(manifest).type == pafs.FileType.File
    if published and not overwrite:
        raise DatasetExistsError(
            f"{target.root} already holds a dataset; pass --overwrite to replace it"
        )
    remove_temporaries(target)
    keys = _keys(target)
    if not overwrite:
        ours = (*DATASET_DIRS, *leftovers)
        foreign = [k for k in keys if k.split("/", 1)[0] not in ours and k != LEASE_NAME]
        if foreign:
            raise DatasetExistsError(
                f"{target.root} already holds files ({foreign[0]}, ...); pass --overwrite to "
                "replace the dataset there"
            )
        return
    if published:
        fs.delete_file(manifest)
    for key in keys:
        if key != MANIFEST_PATH and key.split("/", 1)[0] in DATASET_DIRS:
            fs.delete_file(target.path(key))


def _keys(target: Target) -> list[str]:
    """Root-relative keys of every object under ``target`` (temporary names included)."""
    selector = pafs.FileSelector(target.root, recursive=True, allow_not_found=True)
    prefix = target.root.rstrip("/") + "/"
    return sorted(
        info.path[len(prefix) :]
        for info in target.filesystem.get_file_info(selector)
        if info.type == pafs.FileType.File and info.path.startswith(prefix)
    )

"""Publish a dataset built in a local directory to an object store (``s3://bucket/prefix``).

An object store has no atomic rename of a tree, so publishing is ordered instead: every file goes
to a temporary key, hashed while it is uploaded, and a server-side move gives it its final name
only once its size and sha256 match (:func:`~shardfeed.formats.tier_copy.copy_file`); the
manifest is uploaded last, only after every other file is in place and verified. Readers trust
only the manifest, so a prefix without one is never taken for a dataset, whatever else it holds.

:func:`prepare_remote` runs before any work: it refuses a published dataset unless ``overwrite``
(then the old manifest is deleted first, then the rest), and removes temporary keys a killed run
left. :func:`upload_dataset` runs after the local build.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pyarrow.fs as pafs

from shardfeed.formats.atomic import is_temp_name
from shardfeed.formats.layout import DATASET_DIRS
from shardfeed.formats.publish import DatasetExistsError
from shardfeed.formats.storage import locate
from shardfeed.formats.store_path import is_remote
from shardfeed.formats.tier_copy import Target, copy_file, copy_if_needed, remove_temporaries
from shardfeed.schemas.errors import ShardfeedError
from shardfeed.schemas.manifest import MANIFEST_PATH, Manifest

UPLOAD_WORKERS = 8  # parallel uploads (each streams 8 MiB chunks)

__all__ = [
    "UPLOAD_WORKERS",
    "display_uri",
    "is_remote",
    "prepare_remote",
    "remote_target",
    "source_name",
    "upload_dataset",
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


def remote_target(uri: str) -> Target:
    """The object-store root of ``uri`` as a tier-copy :class:`Target`."""
    location = locate(uri)
    return Target(location.root, location.filesystem)


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
        foreign = [k for k in keys if k.split("/", 1)[0] not in ours]
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


def upload_dataset(local_root: str, target: Target, workers: int = UPLOAD_WORKERS) -> int:
    """Upload the published local dataset at ``local_root`` to ``target``; returns bytes sent.

    Every file the manifest lists is uploaded and verified against its manifest size and sha256
    (a key already holding exactly those bytes is kept, so a re-run after a failed upload sends
    only what is missing); any other file of the local tree is hashed locally first and uploaded
    the same way. Keys under the dataset directories that the new tree does not hold are
    deleted. Only then is the manifest uploaded, verified against the local copy's hash.
    """
    source = locate(local_root)
    with open(os.path.join(local_root, MANIFEST_PATH), "rb") as handle:
        manifest_bytes = handle.read()
    manifest = Manifest.loads(manifest_bytes)
    wanted = {r.path: (r.bytes, r.sha256) for r in (*manifest.shards, *manifest.files)}
    for rel in _local_files(local_root):
        if rel != MANIFEST_PATH and rel not in wanted:
            wanted[rel] = _local_hash(os.path.join(local_root, rel))
    sent = 0
    with ThreadPoolExecutor(max(1, workers)) as pool:
        futures = [
            pool.submit(copy_if_needed, source, target, rel, size, sha)
            for rel, (size, sha) in sorted(wanted.items())
        ]
        for future in futures:
            sent += future.result()[1]  # the first failure raises; the manifest is never sent
    for key in _keys(target):
        if key != MANIFEST_PATH and key not in wanted and key.split("/", 1)[0] in DATASET_DIRS:
            target.filesystem.delete_file(target.path(key))
    digest = hashlib.sha256(manifest_bytes).hexdigest()
    copy_file(source, target, MANIFEST_PATH, len(manifest_bytes), digest)
    return sent + len(manifest_bytes)


def _keys(target: Target) -> list[str]:
    """Root-relative keys of every object under ``target`` (temporary names included)."""
    selector = pafs.FileSelector(target.root, recursive=True, allow_not_found=True)
    prefix = target.root.rstrip("/") + "/"
    return sorted(
        info.path[len(prefix) :]
        for info in target.filesystem.get_file_info(selector)
        if info.type == pafs.FileType.File and info.path.startswith(prefix)
    )


def _local_files(root: str) -> list[str]:
    out = []
    for directory, _, names in os.walk(root):
        for name in names:
            if is_temp_name(name):
                raise ShardfeedError(
                    f"{os.path.join(directory, name)}: a temporary file in the build"
                )
            out.append(os.path.relpath(os.path.join(directory, name), root).replace(os.sep, "/"))
    return sorted(out)


def _local_hash(path: str) -> tuple[int, str]:
    with open(path, "rb") as handle:
        return os.fstat(handle.fileno()).st_size, hashlib.file_digest(handle, "sha256").hexdigest()

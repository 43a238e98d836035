"""Publish as a compare-and-swap: the manifest is written only where none is, by the lease holder.

A job that publishes a dataset saw DST without a manifest once it had prepared it (a new DST, or
the old manifest removed by ``--overwrite``). Writing the manifest checks both that this job
still holds DST's writer lease and that DST still has no manifest, with an operation the store
makes atomic: ``link(2)`` of a complete temporary file locally, ``PutObject`` with
``If-None-Match: *`` on S3. A manifest some other job published meanwhile is left as it was,
and this job fails with :class:`PublishConflictError`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os

from shardfeed.formats.atomic import fsync_dir, temp_name
from shardfeed.formats.object_upload import s3_client
from shardfeed.formats.retry import retried
from shardfeed.formats.store_path import StorePath
from shardfeed.formats.writer_lease import WriterLease
from shardfeed.schemas.errors import ShardfeedError
from shardfeed.schemas.manifest import MANIFEST_PATH, Manifest


class PublishConflictError(ShardfeedError):
    """DST gained a manifest this job did not write: nothing of this job's was published."""


def commit_manifest(
    dst: StorePath, data: bytes, lease: WriterLease | None, scratch: StorePath | None = None
) -> None:
    """Write ``data`` as DST's manifest if this job holds ``lease`` and DST has no manifest.

    ``scratch``: a local directory on DST's file system (the run's work directory) for the
    temporary file the link is made from, so a run killed between the link and the temporary's
    removal leaves it where the run's own clean-up goes, not beside the published manifest."""
    if lease is not None:
        lease.check()
    target = dst / MANIFEST_PATH
    conflict = PublishConflictError(
        f"{dst} gained a manifest from another job while this one ran; it was left as it was "
        "and nothing of this run was published"
    )
    if target.is_local:
        _link_new(target.local, data, conflict, scratch.local if scratch is not None else None)
        return
    client = s3_client(target.filesystem)
    if client is None:  # other stores: check, then write (not atomic; docs/RELIABILITY.md)
        if target.exists():
            raise conflict
        target.write_bytes(data)
        return
    bucket, _, key = target.path.partition("/")
    try:
        retried(
            lambda: client.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*"),
            f"put {target}",
        )
    except Exception as err:
        code = (getattr(err, "response", None) or {}).get("Error", {}).get("Code")
        if code not in ("PreconditionFailed", "ConditionalRequestConflict"):
            raise
        # refused: by another job's manifest, or by our own put whose answer was lost
        head = retried(lambda: client.head_object(Bucket=bucket, Key=key), f"head {target}")
        if head.get("ETag", "").strip('"') != hashlib.md5(data).hexdigest():
            raise conflict from None


def _link_new(
    path: str, data: bytes, conflict: PublishConflictError, scratch: str | None = None
) -> None:
    """Create ``path`` holding ``data`` only if it does not exist: complete and fsynced under a
    temporary name (in ``scratch`` if given, else beside ``path``), then hard-linked to its name
    (atomic, and refused if the name exists)."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    if scratch is not None:
        os.makedirs(scratch, exist_ok=True)
        temp = temp_name(os.path.join(scratch, os.path.basename(path)))
    else:
        temp = temp_name(path)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(temp, path)
    except FileExistsError:
        raise conflict from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
    fsync_dir(directory)


def dataset_version(dst: StorePath) -> str | None:
    """A published dataset's version as ``convert --overwrite`` names it: its manifest's content
    fingerprint (short), sample and shard counts; None without a manifest."""
    try:
        manifest = Manifest.loads((dst / MANIFEST_PATH).read_bytes())
    except FileNotFoundError:
        return None
    except ShardfeedError:
        return "an unreadable manifest"
    return (
        f"version {manifest.fingerprint[:16]} ({manifest.num_samples:,} samples in "
        f"{len(manifest.shards)} shards)"
    )

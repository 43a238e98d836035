"""Object-store SRC and DST for ``convert`` (``s3://bucket/prefix``).

SRC is read by the sources through ``pyarrow.fs``. A DST on an object store is built in a local
scratch directory by the unchanged pipeline, then uploaded by
:func:`~shardfeed.formats.object_publish.upload_dataset` (verified, manifest last). The endpoint
is pyarrow's: ``AWS_ENDPOINT_URL``, or Beam's ``--s3_endpoint_url`` when given, which is passed
to pyarrow as the URI's ``endpoint_override``/``scheme`` (so the filesystem objects pickled to
Beam workers carry it).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

from shardfeed.formats.object_publish import (
    display_uri,
    is_remote,
    prepare_remote,
    remote_target,
    upload_dataset,
    with_endpoint,
)
from shardfeed.formats.publish import prepare_root
from shardfeed.formats.tier_copy import Target

SCRATCH_PREFIX = "shardfeed-convert-"


@dataclass(frozen=True)
class ObjectStores:
    """Where one conversion reads and writes.

    ``src``: SRC as the sources open it; ``dst``: the local directory the pipeline writes (DST
    itself, or a scratch directory for an object-store DST); ``target``: the object-store DST
    the scratch build is uploaded to (None for a local DST); ``display``: DST for the summary.
    """

    src: str
    dst: str
    target: Target | None
    display: str

    def prepare(self, overwrite: bool, takeover: bool) -> None:
        """Ready DST: the object store first (refuse a dataset there unless ``overwrite``), then
        the local directory (a scratch directory is always ours to clear)."""
        if self.target is not None:
            prepare_remote(self.target, overwrite)
        if not takeover:
            prepare_root(self.dst, overwrite or self.target is not None)

    def finish(self) -> None:
        """Upload a scratch build to the object-store DST (manifest last) and remove it."""
        if self.target is None:
            return
        upload_dataset(self.dst, self.target)
        shutil.rmtree(self.dst, ignore_errors=True)


def object_stores(src: str, dst: str, beam_args: Sequence[str]) -> ObjectStores:
    """Resolve SRC and DST for a run with these Beam flags (nothing is touched yet)."""
    endpoint, temp_location = _beam_flags(beam_args)
    src = with_endpoint(src, endpoint)
    if not is_remote(dst):
        return ObjectStores(src, os.path.abspath(dst.removeprefix("file://")), None, dst)
    uri = with_endpoint(dst, endpoint)
    return ObjectStores(
        src, scratch_dir(display_uri(dst), temp_location), remote_target(uri), display_uri(dst)
    )


def scratch_dir(dst: str, temp_location: str | None) -> str:
    """The local build directory of an object-store DST: under ``--temp_location`` when it is a
    local path, else the system temporary directory; named by DST, so a re-run after a failure
    reuses the shards the failed run finished there."""
    parent = temp_location if temp_location and not is_remote(temp_location) else None
    parent = parent or tempfile.gettempdir()
    digest = hashlib.sha256(dst.encode()).hexdigest()[:16]
    return os.path.join(os.path.abspath(parent), SCRATCH_PREFIX + digest)


def _beam_flags(beam_args: Sequence[str]) -> tuple[str | None, str | None]:
    """Beam's ``--s3_endpoint_url`` and ``--temp_location``, if given."""
    from apache_beam.options.pipeline_options import (
        GoogleCloudOptions,
        PipelineOptions,
        S3Options,
    )

    options = PipelineOptions(list(beam_args))
    return options.view_as(S3Options).s3_endpoint_url, options.view_as(
        GoogleCloudOptions
    ).temp_location

"""Where a conversion reads and writes: SRC, DST and the work directory, local or on an object store.

SRC is read by the sources through ``pyarrow.fs``. DST and the work directory are
:class:`~shardfeed.formats.store_path.StorePath` values that every worker reaches by itself: the
workers write shards straight to their final keys and work files under ``DST/.shardfeed-work/``
(or under ``--temp_location``), and the driver writes only ``meta/`` and, last, the manifest. No
process needs a path another one can see. The endpoint is pyarrow's: ``AWS_ENDPOINT_URL``, or
Beam's ``--s3_endpoint_url`` when given, which is passed to pyarrow as the URI's
``endpoint_override``/``scheme`` (so the filesystem objects pickled to Beam workers carry it).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from shardfeed.formats.object_publish import display_uri, prepare_remote, with_endpoint
from shardfeed.formats.object_upload import abort_stale_uploads
from shardfeed.formats.publish import prepare_root
from shardfeed.formats.store_path import StorePath, is_remote
from shardfeed.formats.tier_copy import Target
from shardfeed.pipelines.graph_config import WORK_DIR

WORK_PREFIX = "shardfeed-work-"  # a work directory under --temp_location, named by DST


@dataclass(frozen=True)
class ObjectStores:
    """Where one conversion reads and writes.

    ``src``: SRC as the sources open it; ``dst``: DST; ``work_root``: the work directory when
    ``--temp_location`` moves it out of DST (None: ``DST/.shardfeed-work``); ``display``: DST
    for the summary (no endpoint or credentials)."""

    src: str
    dst: StorePath
    work_root: StorePath | None
    display: str


def object_stores(src: str, dst: str, beam_args: Sequence[str]) -> ObjectStores:
    """Resolve SRC, DST and the work directory for a run with these Beam flags (nothing is
    touched yet)."""
    endpoint, temp_location = _beam_flags(beam_args)
    target = StorePath.of(with_endpoint(dst, endpoint))
    work_root = None
    if temp_location:
        digest = hashlib.sha256(display_uri(dst).encode()).hexdigest()[:16]
        work_root = StorePath.of(with_endpoint(temp_location, endpoint)) / (WORK_PREFIX + digest)
    display = display_uri(dst) if is_remote(dst) else target.path
    return ObjectStores(with_endpoint(src, endpoint), target, work_root, display)


def prepare_destination(dst: StorePath, overwrite: bool) -> None:
    """Ready DST before any work: refuse a dataset (or, locally, any files) there unless
    ``overwrite``, which removes the manifest first, then the rest. On an object store an
    interrupted run's keys (dataset directories, its work directory) are leftovers the run
    replaces, and the multipart uploads a killed worker left are aborted."""
    if dst.is_local:
        prepare_root(dst.local, overwrite)
        return
    prepare_remote(Target(dst.path, dst.filesystem), overwrite, leftovers=(WORK_DIR,))
    abort_stale_uploads(dst.filesystem, dst.path)


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

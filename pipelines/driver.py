"""Run a conversion end to end: prepare DST, run the Beam graph, check rejects, publish, summarise.

The summary is built from what the pipeline wrote (shard sidecars and reject parts), never from
``result.metrics()``, which some runners (Dask on Beam 2.77) do not implement.
"""

from __future__ import annotations

import builtins
import collections
import hashlib
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState

from shardfeed.formats.atomic import atomic_write_bytes
from shardfeed.formats.cost import resolve_cost_kind
from shardfeed.formats.layout import LISTED_DIRS
from shardfeed.formats.manifest_commit import commit_manifest, dataset_version
from shardfeed.formats.meta_writer import file_record
from shardfeed.formats.object_publish import source_name
from shardfeed.formats.object_upload import abort_stale_uploads
from shardfeed.formats.publish import DatasetOptions, ShardOutcome, publish
from shardfeed.formats.rejects import REJECTS_DIR
from shardfeed.formats.shard_writer import DEFAULT_ROW_GROUP_BYTES
from shardfeed.formats.sources import SourceReader, detect_kind, open_source
from shardfeed.formats.sources.base import DatasetMeta
from shardfeed.formats.store_path import StorePath
from shardfeed.formats.writer_lease import WriterLease
from shardfeed.pipelines.convert import ConvertFiles
from shardfeed.pipelines.dedup import publish_duplicates
from shardfeed.pipelines.graph_config import (
    DEFAULT_PIECE_BYTES,
    INTERRUPTED,
    PREVIOUS,
    GraphConfig,
)
from shardfeed.pipelines.object_store import ObjectStores, object_stores, prepare_destination
from shardfeed.pipelines.plan_stage import (
    HotSettings,
    PlanInfo,
    PlanSettings,
    load_hot_weights,
    read_plan_info,
)
from shardfeed.pipelines.progress import WorkDirProgress
from shardfeed.pipelines.runners import make_runner, quiet_workers
from shardfeed.pipelines.spec_stage import spec_outcome
from shardfeed.pipelines.stats_combine import load_merged_stats
from shardfeed.schemas.errors import ShardfeedError
from shardfeed.schemas.manifest import MANIFEST_PATH, Duplicates, FileRecord, Manifest, Rejects
from shardfeed.schemas.units import parse_size_or_share
from shardfeed.transforms.image_policy import ImagePolicy


class TooManyRejectsError(ShardfeedError):
    pass


#: source kinds that hold encoded images: they get the image policy (validate, re-encode)
_MEDIA_KINDS = ("imagefolder", "parquet", "webdataset", "lerobot")


#: which source kinds take each source option of the CLI
_OPTION_KINDS = {
    "unify_schemas": ("parquet", "tfrecord", "jsonl"),
    "text_field": ("jsonl",),
    "drop_videos": ("lerobot",),
}


@dataclass(frozen=True)
class ConvertConfig:
    """What a conversion produces. ``content_options`` lists the fields that change output bytes."""

    src: str
    dst: str
    kind: str | None = None
    target_shard_bytes: int = 100 * 10**6
    row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES
    task_bytes: int = DEFAULT_PIECE_BYTES  # input bytes per scan task (large files are cut)
    encoding: str = "parquet"  # shard encoding: parquet (LeRobot v3.0), tfrecord[-gzip]
    shuffle_seed: int | None = 0  # None keeps the source order (--no-shuffle)
    validate: str = "full"
    image_format: str = "keep"
    max_image_side: int | None = None
    max_reject_fraction: float = 0.01
    cost: str = "auto"  # what samples.parquet's per-sample cost counts (formats/cost.py)
    hot_weights: str | None = None  # key,weight file: the hot set goes to leading shards
    hot_budget: str = "10%"
    dedup: bool = False  # leave later exact copies out (listed in duplicates.jsonl)
    overwrite: bool = False
    break_lease: bool = False  # take DST's writer lease even from a live-looking holder
    progress: bool | None = None  # the progress line: None when stderr is a terminal, or on/off
    source_options: dict[str, Any] = field(default_factory=dict)
    #: ``convert --split NAME=SRC``: (name, source) per split, in order; ``src`` is then unused
    splits: tuple[tuple[str, str], ...] = ()

    def image_policy(self) -> ImagePolicy:
        return ImagePolicy(self.validate, self.image_format, self.max_image_side)

    def open_source(self, src: str, kind: str) -> SourceReader:
        """``src`` opened as a ``kind`` source with this run's options; sources that hold
        encoded images get the image policy."""
        media = {"media_hook": self.image_policy()} if kind in _MEDIA_KINDS else {}
        if self.dedup and kind == "imagefolder":  # copies are found by the images' own bytes
            media["hash_content"] = True
        for option in self.source_options:
            kinds = _OPTION_KINDS.get(option)  # other options are the caller's own to check
            if kinds is not None and kind not in kinds:
                flag = "--" + option.replace("_", "-")
                raise ShardfeedError(
                    f"{flag} applies to {' and '.join(kinds)} sources; this source is {kind}"
                )
        return open_source(src, kind, **media, **self.source_options)

    def dataset_options(self, meta: DatasetMeta, kind: str, source: str) -> DatasetOptions:
        """What the written dataset's bytes depend on, for sources of ``kind`` with ``meta``."""
        return DatasetOptions(
            tasks=meta.tasks,
            fps=meta.fps,
            robot_type=meta.robot_type,
            target_shard_bytes=self.target_shard_bytes,
            row_group_bytes=self.row_group_bytes,
            encoding=self.encoding,
            source=source,
            content_options=self.content_options(kind),
            cost=self.cost,
        )

    def hot_settings(self) -> HotSettings | None:
        """The hot-shard settings, after checking the weights file and budget (fail before
        any work, not inside the pipeline)."""
        if self.hot_weights is None:
            return None
        load_hot_weights(self.hot_weights)
        parse_size_or_share(self.hot_budget, 0)
        if self.shuffle_seed is None:
            raise ShardfeedError("--hot-weights needs the shuffled plan; drop --no-shuffle")
        return HotSettings(self.hot_weights, self.hot_budget)

    def content_options(self, kind: str) -> dict[str, Any]:
        hot = {}
        if self.hot_weights is not None:  # the weights' bytes, not their path, shape the shards
            with open(self.hot_weights, "rb") as handle:
                digest = hashlib.file_digest(handle, "sha256").hexdigest()
            hot = {"hot_weights_sha256": digest, "hot_budget": self.hot_budget}
        return {
            "from": kind,
            "target_shard_size": self.target_shard_bytes,
            "row_group_size": self.row_group_bytes,
            **({"encoding": self.encoding} if self.encoding != "parquet" else {}),
            "shuffle_seed": self.shuffle_seed,
            **self.image_policy().content_options(),
            **self.source_options,
            **hot,
            **({"splits": [name for name, _ in self.splits]} if self.splits else {}),
            **({"dedup": True} if self.dedup else {}),
        }


@dataclass
class ConvertSummary:
    dst: str
    samples_in: int
    samples_out: int
    shards: int
    rejects: dict[str, int]
    payload_bytes: int
    bytes: int
    seconds: float
    notes: list[str]
    published: bool
    phases: dict[str, float] = field(default_factory=dict)  # wall seconds per phase, in run order
    duplicates: int | None = None  # later exact copies left out (--dedup); None without it

    def to_json(self) -> dict[str, Any]:
        return {
            "dst": self.dst,
            "published": self.published,
            "samples_in": self.samples_in,
            "samples_out": self.samples_out,
            "shards": self.shards,
            "rejects": {
                "total": sum(self.rejects.values()),
                "by_reason": dict(sorted(self.rejects.items())),
            },
            **({"duplicates": {"total": self.duplicates}} if self.duplicates is not None else {}),
            "payload_bytes": self.payload_bytes,
            "bytes": self.bytes,
            "compression_ratio": round(self.payload_bytes / self.bytes, 4) if self.bytes else None,
            "seconds": round(self.seconds, 3),
            "samples_per_s": round(self.samples_out / self.seconds, 1) if self.seconds else None,
            "phases": {name: round(seconds, 3) for name, seconds in self.phases.items()},
            "notes": self.notes,
        }


def run_convert(config: ConvertConfig, beam_args: Sequence[str] = ()) -> ConvertSummary:
    """Convert ``config.src`` into a published dataset at ``config.dst`` (raises on failure),
    holding DST's writer lease from before anything is written there until the end."""
    if config.splits:  # one dataset of named splits (pipelines/splits.py)
        from shardfeed.pipelines.splits import run_split_convert

        dst = StorePath.of(config.dst)
        with WriterLease(dst, "convert", break_lease=config.break_lease or None) as lease:
            summary = run_split_convert(config, beam_args, lease)
    else:
        hot = config.hot_settings()  # checked before anything is written
        stores = object_stores(config.src, config.dst, beam_args)  # s3:// or local paths
        with WriterLease(stores.dst, "convert", break_lease=config.break_lease or None) as lease:
            summary = _convert(config, beam_args, hot, stores, lease)
    summary.notes[:0] = lease.notes
    return summary


def _convert(
    config: ConvertConfig,
    beam_args: Sequence[str],
    hot: HotSettings | None,
    stores: ObjectStores,
    lease: WriterLease,
) -> ConvertSummary:
    started = time.monotonic()
    clock = _PhaseClock(started)
    kind = config.kind or detect_kind(stores.src)
    if config.dedup and kind == "lerobot":
        raise ShardfeedError(
            "--dedup does not support episodic (LeRobot) sources: an episode's content hash covers "
            "its episode_index, index and timestamps, so no two episodes can be exact copies"
        )
    source = config.open_source(stores.src, kind)
    meta = source.meta()
    dst = stores.dst  # a local directory or an object-store prefix: workers write there directly
    options = config.dataset_options(meta, kind, source_name(config.src))
    graph = GraphConfig(
        dst=dst,
        seed=config.shuffle_seed or 0,
        options=options,
        piece_bytes=config.task_bytes,
        sort_spools=config.shuffle_seed is not None,
        work_root=stores.work_root,
    )
    takeover = only_leftovers(dst, graph.work) and not config.overwrite
    replaced = dataset_version(dst) if config.overwrite else None
    if config.overwrite:
        mark_interrupted(dst, graph.work)
    if takeover:
        keep_finished_shards(dst, graph.work)
    else:
        prepare_destination(dst, config.overwrite)
        graph.work.rmtree()
    if hot is not None:  # the planning worker reads the weights from the work directory
        hot = hot.copied_to(graph.work)
    files = source.files()
    pipeline_options = PipelineOptions(quiet_workers(beam_args))
    clock.mark("open")

    # data-typed sources (JSONL, Parquet, ...) infer their schema from every file first, in the
    # same pipeline (spec_stage.py); the others know their features now
    spec = None if hasattr(source, "infer") else source.spec(None)
    if spec is not None:
        resolve_cost_kind(
            spec, config.cost
        )  # refuse a cost kind the features cannot give, up front

    progress = WorkDirProgress(graph.work, len(files), enabled=config.progress)
    settings = PlanSettings(
        config.target_shard_bytes,
        config.shuffle_seed is not None,
        config.max_reject_fraction,
        hot,
        dedup=config.dedup,
    )
    # one pipeline: (infer,) scan every file, plan once from the small per-file totals, then each
    # shard writer reads its own units (payloads never cross the shuffle)
    pipeline_started = time.time()
    with progress:
        _run(
            pipeline_options,
            lambda p: (
                p
                # no reshuffle here: every branch of ConvertFiles spreads its elements first
                | "ListFiles" >> beam.Create(files, reshuffle=False)
                | "Convert" >> ConvertFiles(source, spec, graph, settings)
            ),
        )
    scan_started = pipeline_started
    if spec is None:
        spec, _, scan_started = spec_outcome(graph.work)
        clock.split(("infer", scan_started - pipeline_started))
    planned = read_plan_info(graph.work)
    if planned is None:
        raise ShardfeedError(
            "the runner finished without planning any shard; nothing was published"
        )
    clock.split(
        ("scan", planned.started - scan_started),
        ("plan", planned.finished - planned.started),
        ("write", time.time() - planned.finished),
    )
    reject_names, reject_counts = planned.reject_files, planned.reject_counts
    rejected_units = planned.rejected_units
    outcomes = checked_outcomes(planned, graph.work, config.max_reject_fraction)
    reload = SidecarReload()
    reload.add(graph, outcomes)
    remove_unplanned(dst, outcomes)
    duplicates = None
    # meta/ is written here (on an object store: in a local directory, then sent), manifest last
    with dst.staged_root() as root:
        extra = move_rejects(root, graph.work, reject_names)
        if config.dedup:  # the parts in source order -> meta/shardfeed/duplicates.jsonl
            total, record = publish_duplicates(root, graph.work, files)
            duplicates, extra = Duplicates(total), [*extra, record]
        manifest = publish(
            root,
            spec,
            outcomes,
            options,
            rejects=Rejects(rejected_units, reject_counts),
            extra_files=extra,
            stats=load_merged_stats(graph.work),
            hot_shards=planned.hot_shards,
            duplicates=duplicates,
            reload=reload,
            commit=(lambda body: commit_manifest(dst, body, lease, graph.work))
            if dst.is_local
            else None,
        )
        land_metadata(dst, root, manifest, lease)
    graph.work.rmtree()
    clock.mark("publish")
    samples_out = sum(o.record.rows for o in outcomes)
    return ConvertSummary(
        dst=stores.display,
        samples_in=samples_out + rejected_units + (duplicates.total if duplicates else 0),
        samples_out=samples_out,
        shards=len(outcomes),
        rejects=reject_counts,
        duplicates=None if duplicates is None else duplicates.total,
        payload_bytes=sum(o.record.payload_bytes for o in outcomes),
        bytes=sum(o.record.bytes for o in outcomes),
        seconds=time.monotonic() - started,
        notes=[
            *(["replaced the published " + replaced] if replaced else []),
            *meta.notes,
            *_hot_notes(planned),
        ],
        published=True,
        phases=clock.phases,
    )


class _PhaseClock:
    """Wall seconds per named phase, each measured from the previous mark."""

    def __init__(self, started: float) -> None:
        self.last = started
        self.phases: dict[str, float] = {}

    def mark(self, name: str) -> None:
        now = time.monotonic()
        self.phases[name] = now - self.last
        self.last = now

    def split(self, *parts: tuple[str, float]) -> None:
        """Phases that ran inside one pipeline, timed there; the clock moves to now."""
        for name, seconds in parts:
            self.phases[name] = max(0.0, seconds)
        self.last = time.monotonic()


def _run(options: PipelineOptions, build: Callable[[beam.Pipeline], object]) -> None:
    """Build and run one pipeline to completion; close a Dask client the runner opened."""
    pipeline = beam.Pipeline(runner=make_runner(options), options=options)
    build(pipeline)
    result = None
    try:
        result = pipeline.run()
        state = result.wait_until_finish()
    except Exception as err:
        failure = _cluster_failure(err)
        if failure is None:
            raise
        raise failure from None
    finally:
        client = getattr(result, "client", None)  # DaskRunnerResult holds its distributed.Client
        if client is not None:
            client.close()
    if state is not None and state != PipelineState.DONE:
        raise ShardfeedError(f"the Beam pipeline ended in state {state}; nothing was published")


def _cluster_failure(err: Exception) -> ShardfeedError | None:
    """A one-line error for a failure of the cluster itself (a Dask worker that died on every
    attempt at a task, a lost scheduler), which no input caused, or for shardfeed's own error
    raised in an SDK worker process and handed back as text; None for anything else."""
    remote = _remote_shardfeed_error(err) or _remote_os_error(err)
    if remote is not None:
        return remote
    if not type(err).__module__.startswith("distributed"):
        return None
    what = str(err).split(". ")[0].strip() or type(err).__name__
    return ShardfeedError(
        f"the Dask cluster failed ({type(err).__name__}: {what}); nothing was published. Run the "
        "same command again: the shards already written are kept"
    )


_REMOTE_ERROR = re.compile(r"^(shardfeed(?:\.\w+)+): (.+)$", re.MULTILINE)


def _remote_shardfeed_error(err: Exception) -> ShardfeedError | None:
    """Beam's multi-process runner raises a worker's failure as ``RuntimeError(traceback text)``:
    when its last exception is one of shardfeed's own errors, that error's one line."""
    if type(err) is not RuntimeError:
        return None
    found = _REMOTE_ERROR.findall(str(err)[-100_000:])
    if not found:
        return None
    name, message = found[-1]
    module, _, cls_name = name.rpartition(".")
    cls = getattr(sys.modules.get(module), cls_name, None)
    if not (isinstance(cls, type) and issubclass(cls, ShardfeedError)):
        return None
    return ShardfeedError(message.strip())


_REMOTE_LAST = re.compile(r"^(\w+): (.*?)(?: \[while running '([^']*)'\])?$")


def _remote_os_error(err: Exception) -> ShardfeedError | None:
    """Beam hands a step's ``OSError`` (a full disk, a lost mount, a permission) back as
    ``RuntimeError`` text, in every runner: its last line, the error and the step, in one line."""
    if type(err) is not RuntimeError:
        return None
    lines = str(err).strip().splitlines()
    last = lines[-1] if lines else ""
    while last.startswith("RuntimeError: "):
        last = last.removeprefix("RuntimeError: ")
    found = _REMOTE_LAST.match(last)
    cls = getattr(builtins, found.group(1), None) if found else None
    if not (isinstance(cls, type) and issubclass(cls, OSError)):
        return None
    name, message, step = found.groups()
    where = f" in step {step.rpartition('/')[2]}" if step else ""
    return ShardfeedError(
        f"{name}: {message}{where}; nothing was published. Run the same command again once "
        "it is fixed: the shards already written are kept"
    )


def only_leftovers(dst: StorePath, work: StorePath) -> bool:
    """DST holds an interrupted run's leftovers (a work dir, no manifest): it may be taken over."""
    return work.exists() and not (dst / MANIFEST_PATH).exists()


def mark_interrupted(dst: StorePath, work: StorePath) -> None:
    """Before ``--overwrite`` removes a published dataset, give DST a work directory: a run
    killed while the old files go then leaves an interrupted run's DST, which the plain command
    takes over, not loose files it refuses (tests/adversarial/test_crash_injection.py)."""
    if (dst / MANIFEST_PATH).exists():
        (work / INTERRUPTED).write_bytes(b"")


def keep_finished_shards(dst: StorePath, work: StorePath) -> None:
    """Take over an interrupted run's DST: its shard files stay, and its sidecars move aside to
    ``previous-shards/``, where each writer checks whether its shard is already done
    (:func:`~shardfeed.pipelines.convert.reusable_outcome`); the rest of the work dir is redone."""
    previous = work / PREVIOUS
    previous.makedirs()
    finished = work / "shards"
    for name in finished.names():
        (finished / name).move_to(previous / name)
    for name in work.names():
        if name != PREVIOUS:
            (work / name).remove()
    (dst / "meta").rmtree()
    if not dst.is_local:
        abort_stale_uploads(dst.filesystem, dst.path)


def _hot_notes(planned: PlanInfo) -> list[str]:
    if not planned.hot_shards:
        return []
    notes = [
        f"{planned.hot_units} hot sample(s) packed into the first {planned.hot_shards} shard(s)"
    ]
    if planned.hot_keys_unmatched:
        notes.append(
            f"{planned.hot_keys_unmatched} key(s) of the hot weights matched no record "
            "(keys are named as shardfeed rejects names inputs)"
        )
    return notes


def remove_unplanned(dst: StorePath, outcomes: Sequence[ShardOutcome]) -> None:
    """Delete data and video files this run did not write (an interrupted run's other shards,
    temporary files), so the published tree holds exactly what the manifest lists; on an object
    store, abort the multipart uploads of workers killed during this run (a retried task wrote
    its shard again, under a new upload)."""
    keep = {r.path for o in outcomes for r in (o.record, *getattr(o, "files", ()))}
    for top in LISTED_DIRS:
        for rel in (dst / top).files():
            if f"{top}/{rel}" not in keep:
                (dst / top / rel).unlink()
    if not dst.is_local:
        abort_stale_uploads(dst.filesystem, dst.path)


def land_metadata(
    dst: StorePath, root: str, manifest: Manifest, lease: WriterLease | None = None
) -> None:
    """Send the metadata the driver wrote under ``root`` to an object-store DST, checked against
    the manifest's sizes and hashes, and then the manifest, last: the commit point, made only
    while this job holds ``lease`` and DST has no manifest (``formats/manifest_commit.py``).
    Nothing to do for a local DST, where ``root`` is DST itself."""
    if dst.is_local:
        return
    records = {f.path: f for f in manifest.files}
    written = [rel for rel in StorePath(root).files() if rel != MANIFEST_PATH]
    missing = [rel for rel in written if rel not in records]
    if missing:
        raise ShardfeedError(f"the manifest does not list {missing[0]}; nothing was published")
    dst.land(root, [(rel, records[rel].bytes, records[rel].sha256) for rel in written])
    commit_manifest(dst, (StorePath(root) / MANIFEST_PATH).read_bytes(), lease)


def checked_outcomes(
    planned: PlanInfo, work: StorePath, max_reject_fraction: float, label: str = ""
) -> list[ShardOutcome]:
    """The outcomes a run wrote, once its rejects are within bounds and every planned shard is
    there; otherwise the error that publishes nothing. ``label`` prefixes messages (a split)."""
    if planned.too_many_rejects:
        rejected = planned.rejected_units
        total = planned.planned_units + rejected
        raise TooManyRejectsError(
            f"{label}{rejected} of {total} records rejected ({rejected / total:.2%}) exceeds "
            f"--max-reject-fraction {max_reject_fraction:.2%}; nothing was published. "
            f"Reasons: {planned.reject_counts}. Reject details are in {work}/rejects/"
        )
    outcomes = _read_outcomes(work)
    if len(outcomes) != planned.num_shards:
        raise ShardfeedError(
            f"{label}the runner wrote {len(outcomes)} of {planned.num_shards} planned shards; "
            "nothing was published"
        )
    return outcomes


SIDECAR_THREADS = 16  # sidecar reads in flight: on an object store each is a round trip
READ_AHEAD_ROWS = 1 << 18  # per-row arrays read ahead while the sample index is written


def _read_outcomes(work: StorePath) -> list[ShardOutcome]:
    """The light outcomes (no per-row arrays) of the sidecars under ``work``: O(shards)."""
    directory = work / "shards"
    names = [n for n in directory.names() if n.endswith(".json") and not n.startswith(".")]

    def light(name: str) -> ShardOutcome:
        state = json.loads((directory / name).read_bytes())
        return ShardOutcome.from_state(state["outcome"], per_row=False)

    with ThreadPoolExecutor(SIDECAR_THREADS, thread_name_prefix="shardfeed-sidecars") as pool:
        return list(pool.map(light, names))


class SidecarReload:
    """Read the shards' full outcomes (per-row sizes, costs, offsets) back from their sidecars,
    in order, for ``publish(..., reload=...)``: the driver holds the arrays of at most
    SIDECAR_THREADS shards at a time, read ahead by as many threads."""

    def __init__(self) -> None:
        self.graphs: dict[int, GraphConfig] = {}

    def add(self, graph: GraphConfig, outcomes: Sequence[ShardOutcome]) -> None:
        """``outcomes`` were written under ``graph``'s work directory."""
        for outcome in outcomes:
            self.graphs[outcome.number] = graph

    def read(self, number: int) -> ShardOutcome:
        sidecar = self.graphs[number].sidecar(number)
        return ShardOutcome.from_state(json.loads(sidecar.read_bytes())["outcome"])

    def __call__(self, outcomes: Sequence[ShardOutcome]) -> Iterator[ShardOutcome]:
        with ThreadPoolExecutor(SIDECAR_THREADS, thread_name_prefix="shardfeed-sidecars") as pool:
            ahead: collections.deque[tuple[int, Future[ShardOutcome]]] = collections.deque()
            rows = 0
            for light in outcomes:
                # read ahead up to SIDECAR_THREADS shards, but never more than READ_AHEAD_ROWS
                # rows' arrays beyond the one being written (one big shard at a time)
                while ahead and (
                    len(ahead) >= SIDECAR_THREADS or rows + light.record.rows > READ_AHEAD_ROWS
                ):
                    held, done = ahead.popleft()
                    rows -= held
                    yield done.result()
                ahead.append((light.record.rows, pool.submit(self.read, light.number)))
                rows += light.record.rows
            while ahead:
                yield ahead.popleft()[1].result()


def move_rejects(root: str, work: StorePath, names: list[str]) -> list[FileRecord]:
    """Move the scan's reject parts from the work dir to ``root``'s rejects directory (the
    local directory the driver publishes from); their manifest records."""
    records = []
    target = os.path.join(root, REJECTS_DIR)
    for name in names:
        os.makedirs(target, exist_ok=True)
        part = work / "rejects" / name
        if part.is_local:
            os.replace(part.local, os.path.join(target, name))
        else:
            atomic_write_bytes(os.path.join(target, name), part.read_bytes())
        records.append(file_record(root, f"{REJECTS_DIR}/{name}"))
    return records

"""Build one shard with its stats and episodes, and publish a dataset from finished shards.

These are the two halves every writer shares: ``build_shard`` runs once per shard, anywhere
(a Beam worker, a thread, the local loop), and ``publish`` runs once, after every shard is done:
it merges stats in shard order and writes stats, tasks, episodes and info, then the manifest, last.
``add_videos`` is the optional third step of a shard writer whose source has MP4s (LeRobot): it
writes the shard's videos next to it and records them on the outcome.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import zstandard

from shardfeed import __version__
from shardfeed.formats.atomic import atomic_write_bytes, fsync_dirs
from shardfeed.formats.columns import column_to_numpy
from shardfeed.formats.cost import COST_CHOICES, cost_buckets, resolve_cost_kind, row_cost
from shardfeed.formats.encoding import get_encoding
from shardfeed.formats.image_stats import image_stats_per_episode
from shardfeed.formats.layout import (
    DATASET_DIRS,
    chunk_file_index,
    data_path,
    episodes_path,
    is_lease_file,
)
from shardfeed.formats.meta_writer import (
    EpisodeRecord,
    EpisodeVideo,
    episodes_table,
    write_info,
    write_parquet_file,
    write_stats,
    write_tasks,
)
from shardfeed.formats.payload import table_row_bytes
from shardfeed.formats.sample_index import (
    COLUMN,
    COST_COLUMN,
    OFFSET_COLUMN,
    SampleIndexWritten,
    stream_sample_index,
)
from shardfeed.formats.shard_writer import DEFAULT_ROW_GROUP_BYTES, write_shard
from shardfeed.formats.sources.base import UnitRef
from shardfeed.formats.stats import FeatureStats, merge_all, segment_stats, stats_from_state
from shardfeed.schemas.errors import ShardfeedError
from shardfeed.schemas.features import Feature, FeatureSpec
from shardfeed.schemas.info import DEFAULT_VIDEO_PATH, Info
from shardfeed.schemas.manifest import (
    MANIFEST_PATH,
    CostSpec,
    Duplicates,
    FileRecord,
    Manifest,
    Provenance,
    Rejects,
    ShardRecord,
    SplitRecord,
    compute_fingerprint,
)

DEFAULT_TARGET_SHARD_BYTES = 100 * 10**6  # 100 MB, LeRobot's data_files_size_in_mb default


class DatasetExistsError(ShardfeedError):
    pass


@dataclass(frozen=True)
class DatasetOptions:
    """What a dataset's bytes depend on besides its rows (content options go in provenance).

    ``cost``: what each sample's cost in ``samples.parquet`` counts, one of
    :data:`~shardfeed.formats.cost.COST_CHOICES` (``auto`` infers it from the feature types).
    """

    tasks: tuple[str, ...] = ()
    fps: int | float = 0
    robot_type: str | None = None
    target_shard_bytes: int = DEFAULT_TARGET_SHARD_BYTES
    row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES
    encoding: str = "parquet"
    source: str = ""
    content_options: Mapping[str, Any] = field(default_factory=dict)
    cost: str = "auto"

    def __post_init__(self) -> None:
        if self.cost not in COST_CHOICES:
            raise ValueError(f"cost must be one of {COST_CHOICES}, got {self.cost!r}")

    @property
    def data_template(self) -> str:
        return (
            "data/chunk-{chunk_index:03d}/file-{file_index:03d}"
            + get_encoding(self.encoding).extension
        )


@dataclass
class ShardOutcome:
    """A written shard: its manifest record, its stats and (episodic data) its episodes.

    ``row_bytes`` is each row's payload bytes (int64, ``table_row_bytes``), in row order: it must
    have ``record.rows`` values summing to ``record.payload_bytes``. ``row_cost`` is each row's
    cost (int64, ``formats.cost.row_cost`` of the options' cost kind), ``record.rows`` values.
    ``publish`` writes both to the sample index. ``files`` are other files written with the
    shard (its videos), for the manifest's ``files``. ``to_state``/``from_state`` give a JSON
    form, so parallel writers can leave outcomes as small sidecar files that ``publish`` reads
    back in shard order (never pickles); sizes and costs go in it zstd-compressed. A *light*
    outcome (``from_state(..., per_row=False)``) has no per-row arrays (None): a driver holds
    one per shard and reads the arrays again, one shard at a time, for the sample index.
    """

    number: int
    record: ShardRecord
    stats: dict[str, FeatureStats]
    episodes: list[EpisodeRecord]
    row_bytes: np.ndarray | None
    row_cost: np.ndarray | None
    files: list[FileRecord] = field(default_factory=list)
    row_offsets: np.ndarray | None = None  # framed encodings: each row's record offset

    def __post_init__(self) -> None:
        if self.row_bytes is None or self.row_cost is None:  # a light outcome
            self.row_bytes = self.row_cost = self.row_offsets = None
            return
        self.row_bytes = np.asarray(self.row_bytes, dtype=np.int64).reshape(-1)
        self.row_cost = np.asarray(self.row_cost, dtype=np.int64).reshape(-1)
        if self.row_offsets is not None:
            self.row_offsets = np.asarray(self.row_offsets, dtype=np.int64).reshape(-1)
            if len(self.row_offsets) != self.record.rows:
                raise ShardfeedError(
                    f"shard {self.number} ({self.record.path}): {len(self.row_offsets)} record "
                    f"offsets for {self.record.rows} rows"
                )
        total = int(self.row_bytes.sum())
        if len(self.row_bytes) != self.record.rows or total != self.record.payload_bytes:
            raise ShardfeedError(
                f"shard {self.number} ({self.record.path}): {len(self.row_bytes)} row sizes "
                f"summing to {total}, but the shard has {self.record.rows} rows and "
                f"{self.record.payload_bytes} payload bytes"
            )
        if len(self.row_cost) != self.record.rows or (self.row_cost < 0).any():
            raise ShardfeedError(
                f"shard {self.number} ({self.record.path}): {len(self.row_cost)} row costs for "
                f"{self.record.rows} rows (costs must be >= 0)"
            )

    def to_state(self) -> dict[str, Any]:
        if self.row_bytes is None or self.row_cost is None:
            raise ValueError(f"shard {self.number}: a light outcome has no state to write")
        return {
            "number": self.number,
            "record": self.record.to_json(),
            "row_bytes": _encode_sizes(self.row_bytes),
            "row_cost": _encode_sizes(self.row_cost),
            "stats": {name: s.to_state() for name, s in self.stats.items()},
            "episodes": [
                {
                    "episode_index": e.episode_index,
                    "data_chunk_index": e.data_chunk_index,
                    "data_file_index": e.data_file_index,
                    "dataset_from_index": e.dataset_from_index,
                    "dataset_to_index": e.dataset_to_index,
                    "tasks": list(e.tasks),
                    # finished values: the sketches are merged into the shard's stats already
                    "stats": {name: s.summary().to_state() for name, s in e.stats.items()},
                    "source_episode_index": e.source_episode_index,
                    "videos": {key: v.to_json() for key, v in e.videos.items()},
                }
                for e in self.episodes
            ],
            "files": [f.to_json() for f in self.files],
            **(
                {"row_offsets": _encode_sizes(self.row_offsets)}
                if self.row_offsets is not None
                else {}
            ),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any], *, per_row: bool = True) -> ShardOutcome:
        """The outcome ``to_state`` gave; ``per_row=False``: a light one (no per-row arrays)."""
        episodes = [
            EpisodeRecord(
                e["episode_index"],
                e["data_chunk_index"],
                e["data_file_index"],
                e["dataset_from_index"],
                e["dataset_to_index"],
                list(e["tasks"]),
                {name: stats_from_state(s) for name, s in e["stats"].items()},
                e.get("source_episode_index"),
                {key: EpisodeVideo.from_json(v) for key, v in e.get("videos", {}).items()},
            )
            for e in state["episodes"]
        ]
        number = state["number"]
        for key in _PER_ROW:
            if key not in state:
                raise ShardfeedError(
                    f"shard {number}: the outcome has no {key} (written by an older shardfeed)"
                )
        return cls(
            number=int(number),
            record=ShardRecord.from_json(state["record"], f"shard[{number}]"),
            stats={name: FeatureStats.from_state(s) for name, s in state["stats"].items()},
            episodes=episodes,
            row_bytes=(
                _decode_sizes(state["row_bytes"], f"shard {number}", "row_bytes")
                if per_row
                else None
            ),
            row_cost=(
                _decode_sizes(state["row_cost"], f"shard {number}", "row_cost") if per_row else None
            ),
            files=[
                FileRecord.from_json(f, f"shard[{number}].files[{i}]")
                for i, f in enumerate(state.get("files", []))
            ],
            row_offsets=(
                _decode_sizes(state["row_offsets"], f"shard {number}", "row_offsets")
                if per_row and "row_offsets" in state
                else None
            ),
        )


def prepare_root(root: str, overwrite: bool) -> None:
    """Create ``root``; refuse a non-empty one unless ``overwrite`` (manifest deleted first)."""
    manifest = os.path.join(root, MANIFEST_PATH)
    held = os.listdir(root) if os.path.isdir(root) else []
    if [name for name in held if not is_lease_file(name)]:  # leases are not content
        if not overwrite:
            what = "a dataset" if os.path.exists(manifest) else "files"
            raise DatasetExistsError(
                f"{root} already holds {what}; pass overwrite=True (--overwrite) to replace it"
            )
        # the manifest goes first, so an interrupted overwrite never looks complete
        if os.path.exists(manifest):
            os.unlink(manifest)
        for name in DATASET_DIRS:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    os.makedirs(root, exist_ok=True)


def build_shard(
    root: str,
    number: int,
    table: pa.Table,
    spec: FeatureSpec,
    options: DatasetOptions,
    *,
    index_start: int,
    source_episode_ids: Sequence[int] | None = None,
) -> ShardOutcome:
    """Write shard ``number`` (rows in final order, in ``spec``'s schema) and summarise it.

    ``source_episode_ids`` gives, per episode in shard order, its id in the source when the
    caller renumbered episodes; it is kept in the episodes metadata.
    """
    episodic = "episode_index" in spec
    if episodic and "index" in spec:
        index = table.column("index").to_numpy()
        if not np.array_equal(index, np.arange(index_start, index_start + table.num_rows)):
            raise ShardfeedError(
                "the 'index' column must run 0..N-1 in file order (LeRobot reads it that way); renumber it before writing"
            )
    row_bytes = table_row_bytes(table)
    written = write_shard(
        root,
        data_path(number, template=options.data_template),
        table,
        spec,
        index_start=index_start,
        row_group_bytes=options.row_group_bytes,
        encoding=options.encoding,
        row_bytes=row_bytes,
    )
    record = written.record
    columns = {f.name: _valid_values(table.column(f.name), f) for f in spec.stored if f.is_numeric}
    if episodic:
        # the shard's stats are its episodes' merged in order, so they do not depend on where
        # shards split; each episode keeps its finished stats
        images = {f.name: table.column(f.name) for f in spec.stored if f.dtype == "image"}
        episodes, parts = _episodes(columns, spec, options.tasks, number, index_start, images)
        stats = merge_all(parts)
    else:
        episodes = []
        stats = {name: _new_stats(spec[name]).add(values) for name, (values, _) in columns.items()}
    if source_episode_ids is not None:
        if len(source_episode_ids) != len(episodes):
            raise ShardfeedError(
                f"shard {number}: {len(source_episode_ids)} source episode ids for {len(episodes)} episodes"
            )
        for episode, source_id in zip(episodes, source_episode_ids, strict=True):
            episode.source_episode_index = int(source_id)
    record = msgspec.structs.replace(record, units=len(episodes) if episodic else record.rows)
    cost = row_cost(table, spec, resolve_cost_kind(spec, options.cost), row_bytes)
    return ShardOutcome(
        number, record, stats, episodes, row_bytes, cost, row_offsets=written.row_offsets
    )


def add_videos(
    outcome: ShardOutcome, root: str, source: object, refs: Sequence[UnitRef]
) -> ShardOutcome:
    """Write the shard's videos when ``source`` has any, and record them on ``outcome``.

    ``refs`` are the shard's units (episodes) in shard order. A source with videos has a
    ``write_videos(refs, root, chunk_index, file_index)`` method returning, per episode, a dict
    video key -> :class:`EpisodeVideo`, and the FileRecords of the MP4s it wrote; other sources
    are left alone. The videos use the shard's chunk and file numbers.
    """
    write = getattr(source, "write_videos", None)
    if write is None:
        return outcome
    chunk, file = chunk_file_index(outcome.number)
    per_episode, files = write(refs, root, chunk, file)
    if not files:
        return outcome
    if len(per_episode) != len(outcome.episodes):
        raise ShardfeedError(
            f"shard {outcome.number}: videos for {len(per_episode)} episodes, "
            f"but the shard holds {len(outcome.episodes)}"
        )
    for episode, videos in zip(outcome.episodes, per_episode, strict=True):
        episode.videos.update(videos)
    outcome.files.extend(files)
    return outcome


def publish(
    root: str,
    spec: FeatureSpec,
    outcomes: Sequence[ShardOutcome],
    options: DatasetOptions,
    *,
    rejects: Rejects | None = None,
    extra_files: Sequence[FileRecord] = (),
    stats: Mapping[str, FeatureStats] | None = None,
    hot_shards: int = 0,
    splits: Sequence[tuple[str, int]] = (),
    duplicates: Duplicates | None = None,
    reload: Callable[[Sequence[ShardOutcome]], Iterable[ShardOutcome]] | None = None,
    commit: Callable[[bytes], None] | None = None,
) -> Manifest:
    """Write stats, tasks, episodes, info and the sample index from the shard outcomes, then the
    manifest, last.

    ``reload``: given light outcomes (no per-row arrays), yields the full ones in the same order;
    the sample index is then written one shard at a time, so memory stays O(shards), not
    O(samples).

    The manifest's ``cost`` names the cost kind of ``options.cost`` for ``spec`` and holds
    :func:`~shardfeed.formats.cost.cost_buckets` of every sample's cost; the kind is also
    recorded as the content option ``cost``. ``duplicates``: what ``convert --dedup`` left out (its
    ``duplicates.jsonl`` comes in ``extra_files``); None without dedup.

    ``stats``: the outcomes' stats already merged in shard order (a pipeline's CombineFn did it);
    by default they are merged here. ``hot_shards``: how many leading shards hold the hot set.
    ``splits``: ``(name, shard count)`` per named split, in shard order (``convert --split``);
    recorded in the manifest and as ``info.json`` ranges (episodes for episodic data, else rows).
    ``commit(bytes)`` writes the manifest (the publish itself, e.g. a compare-and-swap,
    ``formats/manifest_commit.py``); by default it is written atomically under ``root``."""
    outcomes = sorted(outcomes, key=lambda o: o.number)
    if [o.number for o in outcomes] != list(range(len(outcomes))):
        raise ShardfeedError(
            f"shards must be numbered 0..{len(outcomes) - 1}; got {[o.number for o in outcomes][:10]}…"
        )
    episodic = "episode_index" in spec
    episodes: dict[int, EpisodeRecord] = {}
    for outcome in outcomes:
        for episode in outcome.episodes:
            if episode.episode_index in episodes:
                raise ShardfeedError(
                    f"episode {episode.episode_index} appears in two places; an episode must be contiguous in one shard"
                )
            episodes[episode.episode_index] = episode
    if stats is None:
        stats = merge_all([o.stats for o in outcomes])
    files: list[FileRecord] = [write_stats(root, spec, stats)]
    if episodic or options.tasks:
        files.append(write_tasks(root, options.tasks))
    if episodic:
        ordered = [episodes[k] for k in sorted(episodes)]
        files.append(write_parquet_file(root, episodes_path(0), episodes_table(spec, ordered)))
    shards = tuple(o.record for o in outcomes)
    num_samples = shards[-1].index_end if shards else 0
    split_records = _split_records(shards, splits)
    info = _info(spec, options, num_samples, len(episodes) if episodic else 0)
    if split_records:
        info = dataclasses.replace(info, splits=_info_splits(split_records, outcomes, episodic))
    files.append(write_info(root, info))
    index = _write_sample_index(root, outcomes, options.encoding, reload)
    files.append(index.record)
    files.extend(extra_files)
    files.extend(f for o in outcomes for f in o.files)
    files.sort(key=lambda r: r.path)
    kind = resolve_cost_kind(spec, options.cost)
    content_options = {**options.content_options, "cost": kind}
    manifest = Manifest(
        num_samples=num_samples,
        fingerprint=compute_fingerprint([s.sha256 for s in shards], content_options, files),
        shards=shards,
        files=tuple(files),
        rejects=rejects or Rejects(),
        provenance=Provenance(options.source, content_options, __version__),
        encoding=options.encoding,
        cost=CostSpec(kind, cost_buckets(index.cost_sample)),
        hot_shards=hot_shards,
        splits=split_records,
        duplicates=duplicates,
    )
    # shards and videos were fsynced by their writers, their renames not: one sync per directory
    fsync_dirs(root, [*(s.path for s in shards), *(f.path for f in files)])
    body = manifest.dumps().encode()
    if commit is None:
        atomic_write_bytes(os.path.join(root, MANIFEST_PATH), body)
    else:
        commit(body)
    return manifest


def _write_sample_index(
    root: str,
    outcomes: Sequence[ShardOutcome],
    encoding: str,
    reload: Callable[[Sequence[ShardOutcome]], Iterable[ShardOutcome]] | None,
) -> SampleIndexWritten:
    """``samples.parquet`` from the outcomes' per-row arrays, one shard at a time."""
    framed = get_encoding(encoding).framed
    names = [COLUMN, COST_COLUMN, *([OFFSET_COLUMN] if framed else [])]

    def shards() -> Iterator[dict[str, np.ndarray]]:
        full = outcomes if reload is None else reload(outcomes)
        for light, outcome in zip(outcomes, full, strict=True):
            if outcome.number != light.number:
                raise ShardfeedError(f"shard {light.number}: reloaded as shard {outcome.number}")
            if outcome.row_bytes is None or outcome.row_cost is None:
                raise ShardfeedError(f"shard {outcome.number}: no per-row sizes to index")
            if framed and outcome.row_offsets is None:
                raise ShardfeedError(
                    f"{encoding} shard {outcome.number} ({outcome.record.path}) has no record "
                    "offsets"
                )
            columns = {COLUMN: outcome.row_bytes, COST_COLUMN: outcome.row_cost}
            if framed:
                columns[OFFSET_COLUMN] = outcome.row_offsets
            yield columns

    return stream_sample_index(root, names, shards)


def _split_records(
    shards: Sequence[ShardRecord], splits: Sequence[tuple[str, int]]
) -> tuple[SplitRecord, ...]:
    """``(name, shard count)`` in order -> the manifest's split records (contiguous shard runs)."""
    records, first = [], 0
    for name, count in splits:
        end = first + count
        if count < 1 or end > len(shards):
            raise ShardfeedError(f"split {name!r}: {count} shard(s) from shard {first} do not fit")
        records.append(
            SplitRecord(name, shards[first].index_start, shards[end - 1].index_end, first, end)
        )
        first = end
    if splits and first != len(shards):
        raise ShardfeedError(f"the splits hold {first} of {len(shards)} shards")
    return tuple(records)


def _info_splits(
    splits: Sequence[SplitRecord], outcomes: Sequence[ShardOutcome], episodic: bool
) -> dict[str, str]:
    """LeRobot's ``"start:end"`` per split: episode ranges for episodic data, else row ranges."""
    if not episodic:
        return {s.name: f"{s.index_start}:{s.index_end}" for s in splits}
    ranges, start = {}, 0
    for split in splits:
        end = start + sum(len(o.episodes) for o in outcomes[split.shard_start : split.shard_end])
        ranges[split.name] = f"{start}:{end}"
        start = end
    return ranges


_PER_ROW = ("row_bytes", "row_cost")  # per-row arrays of an outcome's state (``_encode_sizes``)


def _encode_sizes(sizes: np.ndarray) -> dict[str, str]:
    """Per-row counts (sizes, costs) as compact JSON: the narrowest of uint32/uint64,
    little-endian, zstd, base64."""
    dtype = "uint64" if sizes.size and int(sizes.max()) >= 1 << 32 else "uint32"
    raw = sizes.astype("<u8" if dtype == "uint64" else "<u4").tobytes()
    blob = zstandard.ZstdCompressor(level=3).compress(raw)
    return {"dtype": dtype, "zstd_b64": base64.b64encode(blob).decode("ascii")}


def _decode_sizes(state: Mapping[str, Any], where: str, name: str) -> np.ndarray:
    try:
        dtype = {"uint32": "<u4", "uint64": "<u8"}[state["dtype"]]
        raw = zstandard.ZstdDecompressor().decompress(base64.b64decode(state["zstd_b64"]))
        return np.frombuffer(raw, dtype=dtype).astype(np.int64)
    except (KeyError, TypeError, ValueError, zstandard.ZstdError) as err:
        raise ShardfeedError(f"{where}: unreadable {name} ({err!r})") from None


def _info(spec: FeatureSpec, options: DatasetOptions, num_samples: int, episodes: int) -> Info:
    episodic = "episode_index" in spec
    return Info(
        features=spec,
        total_frames=num_samples,
        total_episodes=episodes,
        total_tasks=len(options.tasks),
        fps=options.fps,
        robot_type=options.robot_type,
        splits={"train": f"0:{episodes if episodic else num_samples}"},
        data_path=options.data_template,
        video_path=DEFAULT_VIDEO_PATH if any(f.dtype == "video" for f in spec) else None,
        data_files_size_in_mb=max(1, round(options.target_shard_bytes / 10**6)),
    )


def _episodes(
    columns: dict[str, tuple[np.ndarray, np.ndarray | None]],
    spec: FeatureSpec,
    tasks: Sequence[str],
    number: int,
    start: int,
    images: Mapping[str, pa.ChunkedArray] | None = None,
) -> tuple[list[EpisodeRecord], list[dict[str, FeatureStats]]]:
    """Split the shard's rows into episodes, each with its tasks and per-feature stats (numeric
    ones finished), and each episode's mergeable stats.

    ``images`` are the shard's ``image`` columns: each episode gets LeRobot-style camera stats
    (sampled frames, per channel, see ``formats/image_stats.py``) after its numeric ones.
    """
    for required in ("episode_index", "task_index"):
        if required in columns and columns[required][1] is not None:
            raise ShardfeedError(f"'{required}' has nulls; every frame needs one")
    episode_ids = columns["episode_index"][0].reshape(-1)
    chunk, file = chunk_file_index(number)
    run_starts = np.flatnonzero(np.r_[True, episode_ids[1:] != episode_ids[:-1]])
    run_ends = np.r_[run_starts[1:], len(episode_ids)]
    task_ids = columns["task_index"][0].reshape(-1) if "task_index" in columns else None
    out: list[EpisodeRecord] = []
    seen: set[int] = set()
    for a, b in zip(run_starts.tolist(), run_ends.tolist(), strict=True):
        ep = int(episode_ids[a])
        if ep in seen:
            raise ShardfeedError(
                f"episode {ep} is split within shard {number}; an episode must be contiguous in one shard"
            )
        seen.add(ep)
        names = []
        if task_ids is not None:
            for t in dict.fromkeys(task_ids[a:b].tolist()):
                if not 0 <= t < len(tasks):
                    raise ShardfeedError(
                        f"episode {ep}: task_index {t} has no entry in tasks ({len(tasks)} tasks)"
                    )
                names.append(tasks[t])
        out.append(EpisodeRecord(ep, chunk, file, start + a, start + b, names))
    parts: list[dict[str, FeatureStats]] = [{} for _ in out]
    for name, (values, positions) in columns.items():
        edges = np.r_[run_starts, len(episode_ids)]
        if positions is not None:  # each episode's rows among the non-null values
            edges = np.searchsorted(positions, edges)
        feature = spec[name]
        per_episode = segment_stats(values, edges.tolist(), feature.shape, _integer(feature))
        for episode, part, (stats, summary) in zip(out, parts, per_episode, strict=True):
            part[name], episode.stats[name] = stats, summary
    ranges = [
        (e.episode_index, e.dataset_from_index - start, e.dataset_to_index - start) for e in out
    ]
    for name, column in (images or {}).items():
        per_episode = image_stats_per_episode(column, ranges, name=name, first_index=start)
        for episode, part, image_stats in zip(out, parts, per_episode, strict=True):
            if image_stats is not None:
                episode.stats[name] = part[name] = image_stats
    return out, parts


def _new_stats(feature: Feature) -> FeatureStats:
    return FeatureStats(feature.shape, integer=_integer(feature))


def _integer(feature: Feature) -> bool:
    """Whether ``feature``'s stats keep integer min and max."""
    return feature.dtype.startswith(("int", "uint")) or feature.dtype == "bool"


def _valid_values(
    column: pa.ChunkedArray, feature: Feature
) -> tuple[np.ndarray, np.ndarray | None]:
    """Non-null values for stats, and the row positions they came from (None when no nulls)."""
    if column.null_count == 0:
        return column_to_numpy(column, feature), None
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    return column_to_numpy(column.filter(valid), feature), np.flatnonzero(valid)

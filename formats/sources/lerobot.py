"""LeRobot sources: read v2.1 and v3.0 datasets in place, by episode.

:class:`LeRobotSource` (kind ``lerobot``) is the :class:`~shardfeed.formats.sources.base.SourceReader`
the conversion pipeline uses. It dispatches on ``meta/info.json``'s ``codebase_version`` (``v2.1``
metadata is parsed by :mod:`shardfeed.formats.sources.lerobot_v21`). Its units are whole episodes:
``files()`` are the data Parquet files, ``scan`` yields one :class:`UnitRef` per episode found in a
file (rejecting episodes whose rows disagree with the episode metadata), and ``read`` returns the
rows of some episodes, in the order asked, conformed to the spec. It never trusts totals:
``inconsistencies()`` lists where ``info.json`` disagrees with the data (a published Reachy2 subset
claims 14,983 frames and holds 899).

Videos (LeRobot's ``video`` features, frames in MP4 files): when every MP4 a video feature needs is
present, the feature is kept and ``write_videos`` re-muxes each shard's episodes, in shard order, into
one MP4 per (video key, shard) at ``videos/{key}/chunk-{c:03d}/file-{f:03d}.mp4`` by stream copy
(:mod:`shardfeed.formats.video`; needs ``shardfeed[video]``), returning LeRobot v3.0's per-episode
``from_timestamp``/``to_timestamp``. v2.1 sources give one MP4 per episode; v3.0 sources give each
episode's time range inside a shared MP4 (re-sharding). ``scan`` demuxes (never decodes) each episode's
segment and rejects the episode when its MP4 is unreadable, holds another number of frames than the
episode has rows, does not start on a keyframe, or has codec parameters unlike the feature's reference
MP4 (its first readable one in path order, which also refreshes the feature's ``info``). A video feature whose MP4s are all absent is
dropped with a note; ``drop_videos=True`` (``--drop-videos``) drops every video feature with a note;
a feature with only some of its MP4s is a clean :class:`ShardfeedError` at construction that names a
missing file.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import struct
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from shardfeed.formats import video
from shardfeed.formats.columns import conform
from shardfeed.formats.layout import INFO_PATH, TASKS_PATH
from shardfeed.formats.meta_writer import EpisodeVideo, file_record
from shardfeed.formats.payload import table_row_bytes
from shardfeed.formats.sources import lerobot_v21 as v21
from shardfeed.formats.sources.base import DatasetMeta, MediaHook, ScanResult, UnitRef
from shardfeed.formats.storage import Location, locate
from shardfeed.schemas.errors import SchemaError, ShardfeedError, UnsafePathError
from shardfeed.schemas.features import Feature, FeatureSpec
from shardfeed.schemas.info import DEFAULT_VIDEO_PATH, Info
from shardfeed.schemas.manifest import FileRecord
from shardfeed.schemas.path_template import expand
from shardfeed.schemas.rejects import RejectError, RejectRecord

SUPPORTED_VERSIONS = ("v2.1", "v3.0")
EPISODES_DIR = "meta/episodes"


def tasks_from_table(table: pa.Table, source: str = TASKS_PATH) -> list[str]:
    """Task strings of a v3.0 ``tasks.parquet`` ordered by task_index (pandas index or ``task``)."""
    name = "task" if "task" in table.column_names else "__index_level_0__"
    if name not in table.column_names or "task_index" not in table.column_names:
        raise SchemaError(
            source,
            f"expected task_index and a task string column, found {table.column_names}",
        )
    pairs = sorted(
        zip(table.column("task_index").to_pylist(), table.column(name).to_pylist(), strict=True)
    )
    if [i for i, _ in pairs] != list(range(len(pairs))):
        raise SchemaError(f"{source}.task_index", "task indices are not 0..n-1")
    return [task for _, task in pairs]


def lerobot_codebase_version(
    path: str | os.PathLike[str], filesystem: pafs.FileSystem | None = None
) -> str | None:
    """``codebase_version`` of ``path/meta/info.json``, or None when it is absent or unreadable.

    For source autodetection: a cheap look that never raises for a directory that is not LeRobot.
    """
    try:
        obj = json.loads(locate(path, filesystem).read_bytes(INFO_PATH, "info"))
    except (OSError, ValueError, ShardfeedError):
        return None
    version = obj.get("codebase_version") if isinstance(obj, dict) else None
    return version if isinstance(version, str) else None


@dataclass(frozen=True)
class EpisodeMeta:
    """What episode metadata says about one episode, whichever version it came from.

    ``data_file`` is the root-relative data file that must hold its rows; ``from_index`` and
    ``to_index`` are v3.0's ``dataset_from_index``/``dataset_to_index`` (None for v2.1).
    """

    episode_index: int
    length: int
    data_file: str
    from_index: int | None = None
    to_index: int | None = None
    tasks: tuple[str, ...] = ()


@dataclass(frozen=True)
class VideoSegment:
    """Where one episode's frames of one video feature are in the source.

    ``path`` is the root-relative MP4; ``start``/``end`` are v3.0's ``from_timestamp`` and
    ``to_timestamp`` in it (None for v2.1, whose MP4s hold one episode each).
    """

    path: str
    start: float | None = None
    end: float | None = None


class LeRobotSource:
    """A LeRobot v2.1 or v3.0 dataset as a :class:`SourceReader` whose units are episodes.

    Construction reads and strictly parses the metadata (``info.json``, tasks, episodes) and settles
    the video features (see the module docstring); it raises :class:`ShardfeedError` for a dataset
    that cannot be converted. Instances are picklable (Beam ships them to workers).

    Attributes: ``root``, ``version`` (``"v2.1"``/``"v3.0"``), ``fps``, ``robot_type``, ``tasks``
    (by task_index), ``features`` (info.json's, videos included), ``episodes`` (episode_index ->
    :class:`EpisodeMeta`), ``video_keys``, ``dropped_videos``, ``drop_videos``.
    """

    kind: ClassVar[str] = "lerobot"

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        drop_videos: bool = False,
        filesystem: pafs.FileSystem | None = None,
        media_hook: MediaHook | None = None,
    ) -> None:
        """``media_hook`` (the pipeline's ``ImagePolicy``) validates every frame of the ``image``
        features while scanning; an episode with a bad frame is a reject with the hook's reason.
        Only validation: its output is not used, so LeRobot frames are stored as they are."""
        self.media_hook = media_hook
        self.location: Location = locate(root, filesystem)
        self.root: str = self.location.root if self.location.is_local else self.location.display
        self.drop_videos = drop_videos
        self._notes: list[str] = []
        info_obj = self._read_json(INFO_PATH)
        version = info_obj.get("codebase_version") if isinstance(info_obj, dict) else None
        if version == "v3.0":
            self._load_v30(info_obj)
        elif version in v21.V21_VERSIONS:
            self._load_v21(info_obj)
        else:
            raise ShardfeedError(
                f"{self.root}: unsupported LeRobot codebase_version {version!r} in {INFO_PATH}; "
                f"shardfeed reads {', '.join(SUPPORTED_VERSIONS)}"
            )
        self.video_keys: list[str] = [f.name for f in self.features if f.dtype == "video"]
        self.dropped_videos: list[str] = []
        #: video key -> (path, codec parameters) of the MP4 every episode's video must match
        self._video_reference: dict[str, tuple[str, dict[str, Any]]] = {}
        self._settle_videos()
        self._video_files = {}  # only needed to settle the videos; keeps pickles small
        self._video_segments = {
            k: v for k, v in self._video_segments.items() if k not in self.dropped_videos
        }
        self._by_file: dict[str, list[int]] = {}
        for ep in self.episodes.values():
            self._by_file.setdefault(ep.data_file, []).append(ep.episode_index)
        self._files: list[str] | None = None
        self._data_rows: int | None = None

    # ---- metadata loading -------------------------------------------------------------------

    def _read_json(self, rel: str) -> Any:
        try:
            raw = self.location.read_bytes(rel, rel)
        except FileNotFoundError:
            raise ShardfeedError(f"{self.root}: no {rel}; not a LeRobot dataset") from None
        try:
            return json.loads(raw)
        except ValueError as err:
            raise SchemaError("<root>", f"not valid JSON ({err})", source=rel) from None

    def _read_text(self, rel: str) -> str:
        try:
            return v21.load_text(lambda r: self.location.read_bytes(r, r), rel)
        except FileNotFoundError:
            raise ShardfeedError(
                f"{self.root}: LeRobot {self.version} dataset has no {rel}"
            ) from None

    def _load_v30(self, obj: Any) -> None:
        info = Info.from_json(obj, source=INFO_PATH)
        self.version = "v3.0"
        self.info: Info | v21.V21Info = info
        self.features = info.features
        self.fps = info.fps
        self.robot_type = info.robot_type
        self._totals = (info.total_frames, info.total_episodes, info.total_tasks)
        self._episodes_source = "meta/episodes"
        try:
            with self.location.open_input(TASKS_PATH, TASKS_PATH) as handle:
                self.tasks: list[str] = tasks_from_table(pq.read_table(handle))
        except FileNotFoundError:
            raise ShardfeedError(f"{self.root}: LeRobot v3.0 dataset has no {TASKS_PATH}") from None
        files = [
            f
            for f in self.location.list_files(EPISODES_DIR)
            if f.endswith(".parquet") and not _hidden(f)
        ]
        if not files:
            raise ShardfeedError(
                f"{self.root}: LeRobot v3.0 dataset has no {EPISODES_DIR}/*/*.parquet"
            )
        wanted = {"episode_index", "length", "data/chunk_index", "data/file_index"}
        wanted |= {"dataset_from_index", "dataset_to_index", "tasks"}
        for key in (f.name for f in self.features if f.dtype == "video"):
            wanted |= {f"videos/{key}/{c}" for c in ("chunk_index", "file_index")}
            wanted |= {f"videos/{key}/{c}" for c in ("from_timestamp", "to_timestamp")}
        tables = []
        for rel in files:
            with self.location.open_input(rel, rel) as handle:
                pf = pq.ParquetFile(handle)
                names = [n for n in pf.schema_arrow.names if n in wanted]
                tables.append((rel, pf.read(columns=names).to_pylist()))
        self.episodes: dict[int, EpisodeMeta] = {}
        self._video_files: dict[str, set[str] | None] = {}
        self._video_segments: dict[str, dict[int, VideoSegment]] = {}
        for rel, rows in tables:
            for i, row in enumerate(rows):
                where = f"row {i}"
                for key in ("episode_index", "length", "data/chunk_index", "data/file_index"):
                    value = row.get(key)
                    if not isinstance(value, int) or value < 0:
                        raise SchemaError(
                            f"{where}.{key}",
                            f"expected a non-negative integer, got {value!r}",
                            source=rel,
                        )
                index = row["episode_index"]
                if index in self.episodes:
                    raise SchemaError(
                        f"{where}.episode_index", f"duplicate episode {index}", source=rel
                    )
                data_file = expand(
                    info.data_path,
                    "data_path",
                    chunk_index=row["data/chunk_index"],
                    file_index=row["data/file_index"],
                )
                lo, hi = row.get("dataset_from_index"), row.get("dataset_to_index")
                self.episodes[index] = EpisodeMeta(
                    index,
                    row["length"],
                    data_file,
                    lo if isinstance(lo, int) else None,
                    hi if isinstance(hi, int) else None,
                    tuple(t for t in (row.get("tasks") or []) if isinstance(t, str)),
                )
                for key in (f.name for f in self.features if f.dtype == "video"):
                    chunk = row.get(f"videos/{key}/chunk_index")
                    number = row.get(f"videos/{key}/file_index")
                    if info.video_path is None or chunk is None or number is None:
                        self._video_files[key] = None  # metadata does not say where they are
                    elif self._video_files.get(key, set()) is not None:
                        path = expand(
                            info.video_path,
                            "video_path",
                            video_key=key,
                            chunk_index=chunk,
                            file_index=number,
                        )
                        self._video_files.setdefault(key, set()).add(path)
                        self._video_segments.setdefault(key, {})[index] = VideoSegment(
                            path,
                            _seconds(row.get(f"videos/{key}/from_timestamp")),
                            _seconds(row.get(f"videos/{key}/to_timestamp")),
                        )
        self.episodes = dict(sorted(self.episodes.items()))

    def _load_v21(self, obj: Any) -> None:
        info = v21.parse_info(obj, INFO_PATH)
        self.version = info.codebase_version
        self.info = info
        self.fps = info.fps
        self.robot_type = info.robot_type
        self._totals = (info.total_frames, info.total_episodes, info.total_tasks)
        self._episodes_source = v21.EPISODES_JSONL
        # v3.0 (and LeRobot's own v2.1 -> v3.0 converter) records fps on every non-video feature
        self.features = FeatureSpec(
            tuple(
                f
                if f.dtype == "video" or "fps" in f.extra
                else Feature(f.name, f.dtype, f.shape, f.names, {**f.extra, "fps": info.fps})
                for f in info.features
            )
        )
        self.tasks = v21.parse_tasks_jsonl(self._read_text(v21.TASKS_JSONL))
        episodes = v21.parse_episodes_jsonl(self._read_text(v21.EPISODES_JSONL))
        self.episodes = {
            ep.episode_index: EpisodeMeta(
                ep.episode_index, ep.length, info.data_file(ep.episode_index), tasks=ep.tasks
            )
            for ep in episodes
        }
        self._video_segments = {
            f.name: {i: VideoSegment(info.video_file(f.name, i)) for i in self.episodes}
            for f in info.features
            if f.dtype == "video"
        }
        self._video_files = {
            key: {seg.path for seg in segments.values()}
            for key, segments in self._video_segments.items()
        }

    def episodes_stats(self) -> dict[int, dict[str, Any]]:
        """v2.1's per-episode stats from ``episodes_stats.jsonl`` ({} when absent or for v3.0)."""
        if self.version == "v3.0":
            return {}
        try:
            text = self._read_text(v21.EPISODES_STATS_JSONL)
        except ShardfeedError:
            return {}
        return v21.parse_episodes_stats_jsonl(text)

    def _settle_videos(self) -> None:
        """Keep video features with all their MP4s (re-muxed later), drop those with none."""
        if not self.video_keys:
            return
        if self.drop_videos:
            for key in self.video_keys:
                self._notes.append(f"video feature {key!r} dropped (--drop-videos)")
            self.dropped_videos = list(self.video_keys)
            return
        present = set(self.location.list_files("videos"))
        complete = []
        for key in self.video_keys:
            expected = self._video_files.get(key)
            if expected is None:  # the metadata does not say which MP4 holds which episode
                found = sorted(p for p in present if f"/{key}/" in f"/{p}")
                if found:
                    raise ShardfeedError(
                        f"{self.root}: video feature {key!r} has MP4 files (e.g. {found[0]}) but "
                        f"{self._episodes_source} does not say which file holds which episode; "
                        "pass --drop-videos to convert without the video features"
                    )
                self._drop_missing(key, 0)
                continue
            missing = sorted(p for p in expected if p not in present)
            if len(missing) == len(expected):
                self._drop_missing(key, len(expected), missing[0] if missing else None)
            elif missing:
                raise ShardfeedError(
                    f"{self.root}: video feature {key!r} is missing {len(missing)} of its "
                    f"{len(expected)} MP4 files, e.g. {missing[0]}; pass --drop-videos to convert "
                    "without the video features"
                )
            else:
                complete.append(key)
        for key in complete:
            self._keep_video(key)

    def _keep_video(self, key: str) -> None:
        """Check a kept video feature can be re-muxed and refresh its ``info`` from one MP4."""
        segments = self._video_segments[key]
        if self.version == "v3.0":
            untimed = [n for n, seg in segments.items() if seg.start is None or seg.end is None]
            if untimed:
                raise ShardfeedError(
                    f"{self.root}: {self._episodes_source} gives no videos/{key}/from_timestamp "
                    f"and to_timestamp for episode {untimed[0]}, so its frames cannot be found "
                    "in the MP4; pass --drop-videos to convert without the video features"
                )
        probed = self._reference_video(key)
        feature = self.features[key]
        info = dict(feature.extra.get("info") or {})
        info.update(probed.feature_info())
        info["has_audio"] = False  # only the video stream is copied
        extra = {**feature.extra, "info": info}
        self.features = FeatureSpec(
            tuple(
                Feature(f.name, f.dtype, f.shape, f.names, extra) if f.name == key else f
                for f in self.features
            )
        )

    def _reference_video(self, key: str) -> video.VideoProbe:
        """The probe of ``key``'s first readable MP4 in path order: the feature's ``info`` and the
        codec parameters every episode must match (scan rejects the others). Path order makes the
        choice the same on every worker; unreadable files are skipped (scan rejects their episodes).
        """
        first_error: video.VideoUnreadable | None = None
        for path in sorted({seg.path for seg in self._video_segments[key].values()}):
            try:
                probed = video.probe(self.location, path)
            except video.VideoUnreadable as err:
                first_error = first_error or err
                continue
            self._video_reference[key] = (path, probed.params)
            return probed
        raise ShardfeedError(
            f"{self.root}: no MP4 of video feature {key!r} is readable: {first_error}"
        )

    def _drop_missing(self, key: str, count: int, example: str | None = None) -> None:
        what = f"none of its {count} MP4 files exists (e.g. {example})" if example else "no MP4s"
        self._notes.append(f"video feature {key!r} dropped: {what}")
        self.dropped_videos.append(key)

    # ---- SourceReader -----------------------------------------------------------------------

    def files(self) -> list[str]:
        """Data Parquet files under ``data/``, plus any file the episode metadata names, sorted.

        A named file that does not exist is listed too: scanning it rejects its episodes.
        """
        if self._files is None:
            listed = [
                f
                for f in self.location.list_files("data")
                if f.endswith(".parquet") and not _hidden(f)
            ]
            self._files = sorted(set(listed) | set(self._by_file))
        return list(self._files)

    def spec(self, inferred: Any | None = None) -> FeatureSpec:
        """info.json's features in their order, without the dropped video features."""
        return FeatureSpec(tuple(f for f in self.features if f.name not in self.dropped_videos))

    def meta(self) -> DatasetMeta:
        return DatasetMeta(
            fps=self.fps,
            robot_type=self.robot_type,
            tasks=tuple(self.tasks),
            notes=tuple(self.inconsistencies() + self._notes),
        )

    def reject_location(self, ref: UnitRef) -> tuple[str, str]:
        """``(source, position)`` for a RejectRecord about this unit: ``(data file, "episode:N")``."""
        return ref.file, f"episode:{ref.position}"

    def inconsistencies(self) -> list[str]:
        """Where info.json totals or episode lengths disagree with the data (notes, not rejects)."""
        rows = self.data_rows()
        frames, episodes, tasks = self._totals
        out = []
        if frames != rows:
            out.append(f"info.json total_frames={frames} but the data has {rows} rows")
        if episodes != len(self.episodes):
            out.append(
                f"info.json total_episodes={episodes} but {self._episodes_source} has "
                f"{len(self.episodes)} episodes"
            )
        if tasks != len(self.tasks):
            out.append(f"info.json total_tasks={tasks} but the tasks table has {len(self.tasks)}")
        lengths = sum(ep.length for ep in self.episodes.values())
        if lengths != rows:
            out.append(
                f"episode lengths in {self._episodes_source} sum to {lengths} but the data has "
                f"{rows} rows (the disagreeing episodes are rejected)"
            )
        return out

    def data_rows(self) -> int:
        """Rows in all readable data files, from their Parquet footers."""
        if self._data_rows is None:
            total = 0
            for rel in self.files():
                try:
                    with self.location.open_input(rel, rel) as handle:
                        total += pq.ParquetFile(handle).metadata.num_rows
                except (OSError, pa.ArrowException, ShardfeedError):
                    continue  # missing or unreadable files are rejected by scan
            self._data_rows = total
        return self._data_rows

    def scan(self, file: str, spec: FeatureSpec) -> ScanResult:
        """One :class:`UnitRef` per episode of ``file`` (position = episode_index), or its rejects.

        ``locator`` is ``(row_start, row_stop)`` inside the file; ``payload_bytes`` counts the spec's
        columns; ``content_hash`` is a blake2b-128 hex digest of the episode's values in the spec's
        Arrow types (stable across runs and chunkings). Rejects: ``episode_inconsistent`` (rows
        disagree with episode metadata, an episode missing from metadata or from the data, rows of
        one episode not contiguous), ``field_missing``/``field_type`` (a spec column absent, or not
        castable to the spec's type, e.g. a list whose length is not the declared shape),
        ``path_escape`` and ``io_error`` for whole files, the media hook's ``image_*`` for an
        episode with a bad frame in an ``image`` feature, and for each kept video feature
        ``video_corrupt``/``video_mismatch``/``video_incompatible`` (see :meth:`_video_problems`).
        """
        result = ScanResult()
        expected = self._by_file.get(file, [])
        schema = spec.arrow_schema()
        columns = schema.names

        def file_reject(reason: str, message: str) -> ScanResult:
            result.rejects.append(RejectRecord(file, "", reason, message))
            return result

        try:
            with self.location.open_input(file, "data file") as handle:
                pf = pq.ParquetFile(handle)
                names = pf.schema_arrow.names
                if "episode_index" not in names:
                    return file_reject("field_missing", f"{file} has no episode_index column")
                extra = [c for c in ("episode_index", "index", "task_index") if c in names]
                wanted = [c for c in columns if c in names]
                wanted += [c for c in extra if c not in wanted]
                table = pf.read(columns=wanted).replace_schema_metadata(None)
        except UnsafePathError as err:
            return file_reject("path_escape", err.message)
        except FileNotFoundError:
            for n in expected:
                result.rejects.append(
                    RejectRecord(
                        file,
                        f"episode:{n}",
                        "episode_inconsistent",
                        f"{self._episodes_source} places episode {n} in {file}, which does not exist",
                    )
                )
            return result
        except (OSError, pa.ArrowException) as err:
            return file_reject("io_error", f"cannot read {file} as Parquet: {err}")
        missing_columns = [c for c in columns if c not in names]
        episode_column = table.column("episode_index")
        if episode_column.null_count:
            return file_reject(
                "episode_inconsistent",
                f"{episode_column.null_count} rows of {file} have a null episode_index",
            )
        runs = _runs(episode_column.to_numpy())
        run_counts = Counter(n for n, _, _ in runs)
        seen: set[int] = set()
        for n, start, stop in runs:
            position = f"episode:{n}"
            if n in seen:
                continue
            seen.add(n)
            if run_counts[n] > 1:
                problem = (
                    f"rows of episode {n} are not contiguous in {file} "
                    f"({run_counts[n]} separate runs)"
                )
            else:
                problem = self._episode_problem(n, file, table, start, stop)
            if problem:
                result.rejects.append(RejectRecord(file, position, "episode_inconsistent", problem))
                continue
            if missing_columns:
                result.rejects.append(
                    RejectRecord(
                        file,
                        position,
                        "field_missing",
                        f"{file} has no column for {missing_columns}",
                    )
                )
                continue
            try:
                piece = conform(table.slice(start, stop - start), spec, schema)
            except SchemaError as err:
                result.rejects.append(
                    RejectRecord(file, position, "field_type", f"episode {n}: {err}")
                )
                continue
            bad_frame = self._bad_frame(piece, spec, n)
            if bad_frame is not None:
                result.rejects.append(RejectRecord(file, position, *bad_frame))
                continue
            result.units.append(
                UnitRef(
                    file=file,
                    position=n,
                    rows=stop - start,
                    payload_bytes=int(table_row_bytes(piece).sum()),
                    content_hash=table_hash(piece),
                    locator=(start, stop),
                )
            )
        if self._video_segments and result.units:
            problems = self._video_problems(result.units)
            for ref in result.units:
                if ref.position in problems:
                    reason, message = problems[ref.position]
                    result.rejects.append(
                        RejectRecord(file, f"episode:{ref.position}", reason, message)
                    )
            result.units = [ref for ref in result.units if ref.position not in problems]
        for n in expected:
            if n not in seen:
                length = self.episodes[n].length
                result.rejects.append(
                    RejectRecord(
                        file,
                        f"episode:{n}",
                        "episode_inconsistent",
                        f"{self._episodes_source} places episode {n} ({length} frames) in {file}, "
                        "which holds no rows of it",
                    )
                )
        return result

    def _bad_frame(
        self, piece: pa.Table, spec: FeatureSpec, episode: int
    ) -> tuple[str, str] | None:
        """``(reason, message)`` for the first frame of an ``image`` feature that the media hook
        refuses (the writer decodes frames for camera stats, so a bad one must not get that far)."""
        if self.media_hook is None:
            return None
        for feature in spec.stored:
            if feature.dtype != "image":
                continue
            frames = pc.struct_field(piece.column(feature.name), "bytes").to_pylist()
            for row, data in enumerate(frames):
                if data is None:
                    continue
                try:
                    self.media_hook(data)
                except RejectError as err:
                    where = f"episode {episode}, {feature.name!r} frame {row}"
                    return err.reason, f"{where}: {err.message}"
        return None

    def _video_problems(self, refs: Sequence[UnitRef]) -> dict[int, tuple[str, str]]:
        """episode -> ``(reason, message)`` for the episodes of ``refs`` whose videos would not
        re-mux: unreadable (``video_corrupt``), another frame count than rows (``video_mismatch``),
        or not stream-copyable (``video_incompatible``: no keyframe start, or codec parameters
        unlike the feature's reference MP4). Demuxes packets only, each MP4 opened once.
        """
        found: dict[int, list[tuple[str, str]]] = {}
        for key, segments in self._video_segments.items():
            reference_path, reference = self._video_reference[key]
            by_path: dict[str, list[tuple[UnitRef, VideoSegment]]] = {}
            for ref in refs:
                seg = segments.get(ref.position)
                if seg is None:
                    found.setdefault(ref.position, []).append(
                        ("video_corrupt", f"no video of {key!r} is known for the episode")
                    )
                    continue
                by_path.setdefault(seg.path, []).append((ref, seg))
            for path, members in sorted(by_path.items()):
                try:
                    params, probes = video.probe_segments(
                        self.location, path, [(seg.start, seg.end) for _, seg in members]
                    )
                except UnsafePathError as err:
                    for ref, _ in members:
                        found.setdefault(ref.position, []).append(("path_escape", err.message))
                    continue
                except (video.VideoUnreadable, OSError) as err:
                    reason = (
                        "video_corrupt" if isinstance(err, video.VideoUnreadable) else "io_error"
                    )
                    for ref, _ in members:
                        found.setdefault(ref.position, []).append((reason, f"{key!r}: {err}"))
                    continue
                difference = video.params_difference(reference, params)
                for (ref, seg), probed in zip(members, probes, strict=True):
                    where = video.Segment(self.location, seg.path, seg.start, seg.end).describe()
                    problems = found.setdefault(ref.position, [])
                    if probed.error:
                        problems.append(("video_corrupt", f"{key!r}: {probed.error}"))
                    elif probed.frames != ref.rows:
                        problems.append(
                            (
                                "video_mismatch",
                                f"{where} holds {probed.frames} frames of {key!r} but episode "
                                f"{ref.position} has {ref.rows} rows",
                            )
                        )
                    elif difference is not None:
                        name, got, want = difference
                        problems.append(
                            (
                                "video_incompatible",
                                f"{where}: {name} is {got} but {reference_path}, the reference "
                                f"video of {key!r}, has {want}; it cannot be stream-copied with "
                                "the other episodes",
                            )
                        )
                    elif not probed.starts_with_keyframe:
                        problems.append(
                            (
                                "video_incompatible",
                                f"{where}: the episode's video of {key!r} does not start on a "
                                "keyframe, so it cannot be stream-copied without re-encoding",
                            )
                        )
        return {
            n: (problems[0][0], "; ".join(message for _, message in problems))
            for n, problems in found.items()
            if problems
        }

    def _episode_problem(
        self, n: int, file: str, table: pa.Table, start: int, stop: int
    ) -> str | None:
        rows = stop - start
        src = self._episodes_source
        meta = self.episodes.get(n)
        if meta is None:
            return f"episode {n} has {rows} rows in {file} but no entry in {src}"
        if meta.data_file != file:
            return f"episode {n} has rows in {file} but {src} places it in {meta.data_file}"
        if meta.length != rows:
            return (
                f"{src} gives episode {n} length {meta.length} but {file} holds {rows} rows of it"
            )
        index = (
            table.column("index").slice(start, rows).to_numpy(zero_copy_only=False)
            if "index" in table.column_names
            else None
        )
        if meta.from_index is not None and meta.to_index is not None:
            lo, hi = meta.from_index, meta.to_index
            if hi - lo != rows:
                return (
                    f"{src} gives episode {n} dataset_from_index..dataset_to_index = {lo}..{hi} "
                    f"({hi - lo} rows) but {file} holds {rows} rows of it"
                )
            if index is not None and not np.array_equal(index, np.arange(lo, hi)):
                return (
                    f"the index column of episode {n} in {file} does not run {lo}..{hi - 1} as "
                    f"dataset_from_index/dataset_to_index in {src} say"
                )
        elif index is not None and rows > 1 and not np.all(np.diff(index) == 1):
            return f"the index column of episode {n} in {file} is not consecutive"
        if "task_index" in table.column_names:
            tasks = table.column("task_index").slice(start, rows)
            bad = tasks.null_count or (
                rows and (pc.min(tasks).as_py() < 0 or pc.max(tasks).as_py() >= len(self.tasks))
            )
            if bad:
                return (
                    f"episode {n} in {file} has a task_index outside the tasks table "
                    f"(0..{len(self.tasks) - 1})"
                )
        return None

    def read(self, refs: Sequence[UnitRef], spec: FeatureSpec) -> pa.Table:
        """The rows of ``refs`` (episodes from ``scan``), in the given order, in ``spec``'s schema.

        Each file is opened once and only the row groups holding the requested episodes are read.
        Raises :class:`ShardfeedError` if a file no longer holds the episode a ref names.
        """
        schema = spec.arrow_schema()
        if not refs:
            return schema.empty_table()
        groups: dict[str, list[int]] = {}
        for i, ref in enumerate(refs):
            groups.setdefault(ref.file, []).append(i)
        pieces: list[pa.Table | None] = [None] * len(refs)
        for file, indices in groups.items():
            with self.location.open_input(file, "data file") as handle:
                pf = pq.ParquetFile(handle)
                md = pf.metadata
                starts = [0]
                for g in range(md.num_row_groups):
                    starts.append(starts[-1] + md.row_group(g).num_rows)
                spans = []
                for i in indices:
                    start, stop = (int(x) for x in refs[i].locator)
                    if not 0 <= start < stop <= md.num_rows or stop - start != refs[i].rows:
                        raise ShardfeedError(
                            f"{file}: rows {start}:{stop} of episode {refs[i].position} are not in "
                            f"the file ({md.num_rows} rows); the source changed since it was scanned"
                        )
                    spans.append((i, start, stop))
                needed = sorted(
                    {
                        g
                        for _, start, stop in spans
                        for g in range(
                            bisect.bisect_right(starts, start) - 1,
                            bisect.bisect_left(starts, stop),
                        )
                    }
                )
                names = pf.schema_arrow.names
                wanted = list(schema.names)
                if "episode_index" in names and "episode_index" not in wanted:
                    wanted.append("episode_index")
                table = pf.read_row_groups(
                    needed, columns=[c for c in wanted if c in names]
                ).replace_schema_metadata(None)
            offset = {}
            acc = 0
            for g in needed:
                offset[g] = acc
                acc += starts[g + 1] - starts[g]
            for i, start, stop in spans:
                g = bisect.bisect_right(starts, start) - 1
                piece = table.slice(offset[g] + start - starts[g], stop - start)
                if "episode_index" in piece.column_names:
                    episode = piece.column("episode_index")
                    if (
                        episode.null_count
                        or pc.any(pc.not_equal(episode, refs[i].position)).as_py()
                    ):
                        raise ShardfeedError(
                            f"{file}: rows {start}:{stop} no longer hold episode "
                            f"{refs[i].position}; the source changed since it was scanned"
                        )
                pieces[i] = conform(piece, spec, schema)
        return pa.concat_tables(pieces)

    def write_videos(
        self, refs: Sequence[UnitRef], root: str, chunk_index: int, file_index: int
    ) -> tuple[list[dict[str, EpisodeVideo]], list[FileRecord]]:
        """Re-mux the episodes of ``refs`` (shard order) into one MP4 per kept video feature.

        Writes ``videos/{key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4`` under local
        ``root`` by stream copy; returns, per ref, video key -> :class:`EpisodeVideo`, and the
        FileRecords of the files written. ``scan`` already rejected episodes whose videos would
        fail; these checks are the last line of defence (an MP4 that changed since the scan) and
        raise :class:`ShardfeedError` when an episode's video does not hold exactly its frames, or
        cannot be stream-copied.
        """
        per_episode: list[dict[str, EpisodeVideo]] = [{} for _ in refs]
        files: list[FileRecord] = []
        if not refs:
            return per_episode, files
        for key, segments in self._video_segments.items():
            inputs = []
            for ref in refs:
                seg = segments.get(ref.position)
                if seg is None:
                    raise ShardfeedError(
                        f"{self.root}: no video of {key!r} is known for episode {ref.position}"
                    )
                inputs.append(video.Segment(self.location, seg.path, seg.start, seg.end))
            rel = expand(
                DEFAULT_VIDEO_PATH,
                "video_path",
                video_key=key,
                chunk_index=chunk_index,
                file_index=file_index,
            )
            spans = video.concat_segments(inputs, os.path.join(root, rel))
            for ref, segment, span, out in zip(refs, inputs, spans, per_episode, strict=True):
                if span.frames != ref.rows:
                    os.unlink(os.path.join(root, rel))
                    raise ShardfeedError(
                        f"{self.root}: {segment.describe()} holds {span.frames} frames of "
                        f"{key!r} but episode {ref.position} has {ref.rows} rows; pass "
                        "--drop-videos to convert without the video features"
                    )
                out[key] = EpisodeVideo(
                    chunk_index, file_index, span.from_timestamp, span.to_timestamp
                )
            files.append(file_record(root, rel))
        return per_episode, files

    def input_stamps(self, refs: Sequence[UnitRef]) -> list[str]:
        """What :meth:`write_videos` would cut for ``refs``: each segment's path and range, with
        the source file's size and mtime, so a re-run never reuses a shard's video whose source
        MP4 changed since (rsync's quick check)."""
        out = []
        seen: dict[str, pafs.FileInfo] = {}
        for key, segments in self._video_segments.items():
            for ref in refs:
                seg = segments.get(ref.position)
                if seg is None:
                    continue
                if seg.path not in seen:
                    seen[seg.path] = self.location.info(seg.path, "video_path")
                info = seen[seg.path]
                out.append(
                    f"{key}\0{seg.path}\0{seg.start}\0{seg.end}\0{info.size}\0{info.mtime_ns}"
                )
        return out

    def __repr__(self) -> str:
        return f"LeRobotSource({self.root!r}, version={self.version!r}, drop_videos={self.drop_videos})"


def _seconds(value: Any) -> float | None:
    """A timestamp from episode metadata, or None when absent or not a finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if np.isfinite(value) else None


def _hidden(rel: str) -> bool:
    return any(part.startswith(".") for part in rel.split("/"))


def _runs(values: np.ndarray) -> list[tuple[int, int, int]]:
    """Maximal runs of equal values as ``(value, start, stop)``, in row order."""
    if len(values) == 0:
        return []
    change = np.flatnonzero(values[1:] != values[:-1]) + 1
    starts = np.concatenate([[0], change])
    stops = np.concatenate([change, [len(values)]])
    return [
        (int(values[a]), int(a), int(b))
        for a, b in zip(starts.tolist(), stops.tolist(), strict=True)
    ]


def table_hash(table: pa.Table) -> str:
    """blake2b-128 hex digest of a table's names, types and values.

    Canonical: it depends on the logical values only (not on chunking, slice offsets, padding or
    the bytes under null slots), so the same rows hash the same in every run and on every worker.
    """
    h = hashlib.blake2b(digest_size=16)
    h.update(struct.pack("<q", table.num_rows))
    for field, column in zip(table.schema, table.columns, strict=True):
        h.update(f"{field.name}\x00{field.type}\x00".encode())
        array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        _feed(h, array)
    return h.hexdigest()


def _feed(h: Any, array: pa.Array) -> None:
    n = len(array)
    h.update(struct.pack("<qq", n, array.null_count))
    if array.null_count:
        valid = array.is_valid().to_numpy(zero_copy_only=False).astype(np.uint8)
        h.update(valid.tobytes())
    atype = array.type
    if pa.types.is_struct(atype):
        for child in array.flatten():
            _feed(h, child)
    elif pa.types.is_fixed_size_list(atype):
        _feed(h, array.flatten())
    elif pa.types.is_list(atype) or pa.types.is_large_list(atype):
        lengths = pc.list_value_length(array).fill_null(0).cast(pa.int64())
        h.update(lengths.to_numpy(zero_copy_only=False).tobytes())
        _feed(h, array.flatten())
    elif (
        pa.types.is_binary(atype)
        or pa.types.is_string(atype)
        or pa.types.is_large_binary(atype)
        or pa.types.is_large_string(atype)
    ):
        lengths = (
            pc.binary_length(array).fill_null(0).cast(pa.int64()).to_numpy(zero_copy_only=False)
        )
        h.update(lengths.tobytes())
        if array.null_count:
            array = array.fill_null(
                b"" if pa.types.is_binary(atype) or pa.types.is_large_binary(atype) else ""
            )
        buffers = array.buffers()
        if n and buffers[2] is not None:
            wide = pa.types.is_large_binary(atype) or pa.types.is_large_string(atype)
            offsets = np.frombuffer(buffers[1], dtype=np.int64 if wide else np.int32)
            lo, hi = int(offsets[array.offset]), int(offsets[array.offset + n])
            h.update(memoryview(buffers[2])[lo:hi])
    elif pa.types.is_boolean(atype):
        h.update(array.fill_null(False).to_numpy(zero_copy_only=False).astype(np.uint8).tobytes())
    elif pa.types.is_integer(atype) or pa.types.is_floating(atype):
        if array.null_count:
            array = array.fill_null(pa.scalar(0, atype))
        h.update(np.ascontiguousarray(array.to_numpy(zero_copy_only=False)).tobytes())
    else:
        h.update(json.dumps(array.to_pylist(), default=str, sort_keys=True).encode())

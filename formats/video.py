"""MP4 stream copy for LeRobot videos: probe a file, and concatenate episode segments into one file.

Never re-encodes: packets are copied as they are, shifted in time so that segment ``i`` starts where
segment ``i - 1`` ended, exactly in the stream's time base. LeRobot reads frame ``k`` of an episode at
``from_timestamp + k / fps`` in the concatenated file, so the returned ``from_timestamp`` of each
segment is the exact output time of its first frame.

PyAV (``av``) is an optional dependency (``pip install 'shardfeed[video]'``), imported lazily so the
core install still imports this module. All inputs are read through a :class:`Location` (local or
object store); the output is a local path written under a temporary name and renamed. The output
bytes depend only on the input packets and the PyAV/FFmpeg version: the muxer runs bit-exact (no
encoder tag, no creation time) and every metadata field is fixed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from shardfeed.formats.atomic import atomic_open
from shardfeed.formats.storage import Location
from shardfeed.schemas.errors import ShardfeedError

INSTALL_HINT = "pip install 'shardfeed[video]'"


class VideoUnreadable(ShardfeedError):
    """A video file that cannot be read: missing, not a video, corrupt or truncated."""


def require_av() -> Any:
    """The ``av`` module, or a ShardfeedError saying how to install it."""
    try:
        import av
    except ImportError:
        raise ShardfeedError(
            f"reading or writing MP4 videos needs PyAV: {INSTALL_HINT} "
            "(or pass --drop-videos to convert without the video features)"
        ) from None
    return av


@dataclass(frozen=True)
class VideoProbe:
    """What a video stream holds, from its container and packets (nothing is decoded)."""

    codec: str
    width: int
    height: int
    pix_fmt: str | None
    fps: float
    frames: int
    duration: float  # seconds from the first frame's start to the last frame's end
    time_base: str  # "num/den"
    keyframes: int
    starts_with_keyframe: bool
    has_audio: bool
    #: codec parameters that must match for stream copy (see :func:`params_difference`)
    params: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def feature_info(self) -> dict[str, Any]:
        """LeRobot's ``info`` entries of a video feature (``video.codec``, ``video.fps``, ...)."""
        fps: int | float = int(self.fps) if float(self.fps).is_integer() else self.fps
        return {
            "video.height": self.height,
            "video.width": self.width,
            "video.codec": self.codec,
            "video.pix_fmt": self.pix_fmt,
            "video.fps": fps,
        }


@dataclass(frozen=True)
class Segment:
    """One input to :func:`concat_segments`: a file, or the ``[start, end)`` seconds of one.

    ``start``/``end`` are LeRobot v3.0's ``from_timestamp``/``to_timestamp`` of an episode inside a
    file that holds several; None means the whole file.
    """

    location: Location
    path: str
    start: float | None = None
    end: float | None = None

    def describe(self) -> str:
        where = self.path
        if self.start is not None or self.end is not None:
            where += f" [{self.start}, {self.end})"
        return where


@dataclass(frozen=True)
class SegmentProbe:
    """One segment's packets, from demuxing only (checked before anything is copied).

    ``error`` says why its packets could not all be read (a corrupt or truncated file); ``frames``
    and ``starts_with_keyframe`` then describe what was read before the error.
    """

    frames: int
    starts_with_keyframe: bool
    error: str | None = None


@dataclass(frozen=True)
class SegmentSpan:
    """Where one segment landed in the output: LeRobot's from/to timestamps, and its frame count."""

    from_timestamp: float
    to_timestamp: float
    frames: int


def probe(location: Location, path: str) -> VideoProbe:
    """Codec, size, fps, frame count, duration and keyframes of ``path``'s first video stream."""
    av = require_av()
    with _open_input(av, location, path) as container:
        stream = _video_stream(container, path)
        params = _params(stream)
        frames = keyframes = 0
        first_key = False
        start = end = None
        tick = _frame_ticks(stream)
        try:
            for packet in container.demux(stream):
                if packet.size == 0 or packet.pts is None:
                    continue
                if frames == 0:
                    first_key = bool(packet.is_keyframe)
                frames += 1
                keyframes += bool(packet.is_keyframe)
                stop = packet.pts + (packet.duration or tick)
                start = packet.pts if start is None else min(start, packet.pts)
                end = stop if end is None else max(end, stop)
        except av.FFmpegError as err:
            raise VideoUnreadable(_unreadable(path, err)) from None
        duration = float((end - start) * stream.time_base) if frames else 0.0
        return VideoProbe(
            codec=params["codec"],
            width=params["width"],
            height=params["height"],
            pix_fmt=params["pix_fmt"],
            fps=float(_rate(stream) or 0),
            frames=frames,
            duration=duration,
            time_base=str(stream.time_base),
            keyframes=keyframes,
            starts_with_keyframe=first_key,
            has_audio=bool(container.streams.audio),
            params=params,
        )


def probe_segments(
    location: Location, path: str, ranges: Sequence[tuple[float | None, float | None]]
) -> tuple[dict[str, Any], list[SegmentProbe]]:
    """Codec parameters of ``path``'s first video stream, and each ``(start, end)`` range's packets.

    A range selects packets exactly as :func:`concat_segments` will (None: the whole file), so its
    ``frames`` is what a copy would hold. Nothing is decoded and the file is opened once for
    ranges in ascending order. Raises :class:`VideoUnreadable` when the file cannot be opened or
    holds no video stream; a range whose packets cannot be read gets an ``error`` instead.
    """
    av = require_av()
    out: list[SegmentProbe | None] = [None] * len(ranges)
    order = sorted(range(len(ranges)), key=lambda i: _range_key(ranges[i]))
    params: dict[str, Any] = {}
    pending = list(reversed(order))
    while pending:  # one pass per open; reopen only to go back to the start of the file
        with _open_input(av, location, path) as container:
            stream = _video_stream(container, path)
            params = _params(stream)
            fresh = True
            while pending:
                i = pending[-1]
                start, end = ranges[i]
                if not fresh and (start is None or _seek_target(stream, start) <= 0):
                    break  # needs the file's start again: reopen rather than seek to it
                pending.pop()
                segment = Segment(location, path, start, end)
                frames, first_key, error = 0, False, None
                try:
                    for packet in _segment_packets(container, stream, segment, need_key=False):
                        if frames == 0:
                            first_key = bool(packet.is_keyframe)
                        frames += 1
                except av.FFmpegError as err:
                    error = _unreadable(segment.describe(), err)
                out[i] = SegmentProbe(frames, first_key, error)
                fresh = False
    return params, [p for p in out if p is not None]


def concat_segments(segments: Sequence[Segment], out_path: str) -> list[SegmentSpan]:
    """Stream-copy ``segments`` in order into one MP4 at local ``out_path``; their spans in it.

    Every segment must share codec, size, pixel format, codec extradata and time base with the
    first, and start on a keyframe; otherwise a :class:`ShardfeedError` names the offending file.
    Only the first video stream is copied (audio and other streams are left out).
    """
    if not segments:
        raise ShardfeedError("concat_segments needs at least one segment")
    av = require_av()
    spans: list[SegmentSpan] = []
    with atomic_open(out_path, sync_dir=False) as handle:  # publish() syncs the directory
        output = av.open(handle, "w", format="mp4", options={"fflags": "+bitexact"})
        try:
            out_stream = None
            reference: dict[str, Any] | None = None
            time_base: Fraction | None = None
            offset = 0  # output ticks where the next segment starts
            last_dts: int | None = None
            for segment in segments:
                with _open_input(av, segment.location, segment.path) as container:
                    stream = _video_stream(container, segment.path)
                    params = _params(stream)
                    if reference is None:
                        reference, time_base = params, Fraction(stream.time_base)
                        out_stream = _output_stream(output, stream)
                    else:
                        _check_same(reference, params, segment)
                    try:
                        packets = list(_segment_packets(container, stream, segment))
                    except av.FFmpegError as err:
                        raise VideoUnreadable(_unreadable(segment.describe(), err)) from None
                    if not packets:
                        raise ShardfeedError(
                            f"{segment.describe()}: no video frames in this range; "
                            "pass --drop-videos to convert without the video features"
                        )
                    tick = _frame_ticks(stream)
                    first = min(p.pts for p in packets)
                    stop = max(p.pts + (p.duration or tick) for p in packets)
                    shift = offset - first
                    for packet in packets:
                        packet.pts += shift
                        packet.dts = (packet.pts if packet.dts is None else packet.dts) + shift
                        if last_dts is not None and packet.dts <= last_dts:
                            raise ShardfeedError(
                                f"{segment.describe()}: its decode timestamps overlap the previous "
                                "segment's, so it cannot be stream-copied after it; pass "
                                "--drop-videos to convert without the video features"
                            )
                        last_dts = packet.dts
                        if not packet.duration:
                            packet.duration = tick
                        packet.stream = out_stream
                        packet.time_base = stream.time_base
                        output.mux(packet)
                    spans.append(
                        SegmentSpan(
                            float(offset * time_base),
                            float((offset + stop - first) * time_base),
                            len(packets),
                        )
                    )
                    offset += stop - first
            if out_stream is not None and Fraction(out_stream.time_base) != time_base:
                raise ShardfeedError(
                    f"the MP4 muxer changed the time base from {time_base} to "
                    f"{out_stream.time_base}; timestamps would not be exact"
                )
        finally:
            output.close()
    return spans


def params_difference(
    reference: dict[str, Any], params: dict[str, Any]
) -> tuple[str, str, str] | None:
    """The first codec parameter in which ``params`` differs from ``reference``, as ``(name, got,
    want)`` text; None when packets of both can share one output stream."""
    for key, want in reference.items():
        got = params.get(key)
        if got != want:
            if key == "extradata":
                return key, f"{len(got or b'')} bytes (different)", f"{len(want)} bytes"
            return key, str(got), str(want)
    return None


# ---- internals ----------------------------------------------------------------------------


@contextlib.contextmanager
def _open_input(av: Any, location: Location, path: str) -> Iterator[Any]:
    """``path`` opened through ``location`` as a PyAV input container (both closed on exit)."""
    try:
        handle = location.open_input(path, "video file")
    except FileNotFoundError:
        raise VideoUnreadable(
            f"{path}: MP4 file not found; pass --drop-videos to convert without the video features"
        ) from None
    with handle:
        try:
            container = av.open(handle, "r")
        except av.FFmpegError as err:
            raise VideoUnreadable(_unreadable(path, err)) from None
        with container:
            yield container


def _unreadable(where: str, err: Exception) -> str:
    return (
        f"{where}: not a readable video file ({err}); pass --drop-videos to convert without "
        "the video features"
    )


def _video_stream(container: Any, path: str) -> Any:
    if not container.streams.video:
        raise VideoUnreadable(f"{path}: holds no video stream")
    return container.streams.video[0]


def _params(stream: Any) -> dict[str, Any]:
    """The codec parameters that must match for packets of two files to share one stream."""
    context = stream.codec_context
    codec = context.codec
    return {
        "codec": getattr(codec, "canonical_name", None) or codec.name,
        "width": int(context.width),
        "height": int(context.height),
        "pix_fmt": context.pix_fmt,
        "extradata": bytes(context.extradata or b""),
        "time_base": str(stream.time_base),
    }


def _check_same(reference: dict[str, Any], params: dict[str, Any], segment: Segment) -> None:
    difference = params_difference(reference, params)
    if difference is not None:
        key, got, want = difference
        raise ShardfeedError(
            f"{segment.describe()}: {key} is {got} but the first video of this file has "
            f"{want}; videos with different codec parameters cannot be stream-copied into "
            "one file (pass --drop-videos to convert without the video features)"
        )


def _rate(stream: Any) -> Fraction | None:
    for name in ("average_rate", "guessed_rate", "base_rate"):
        rate = getattr(stream, name, None)
        if rate:
            return Fraction(rate)
    return None


def _frame_ticks(stream: Any) -> int:
    """One frame's duration in time-base ticks (from the frame rate; 1 if unknown)."""
    rate = _rate(stream)
    if not rate:
        return 1
    return max(1, round(1 / (rate * Fraction(stream.time_base))))


def _seek_target(stream: Any, seconds: float) -> int:
    """The first tick of a range starting at ``seconds`` (half a frame early, for rounding)."""
    return round(Fraction(seconds) / Fraction(stream.time_base)) - _frame_ticks(stream) // 2


def _range_key(bounds: tuple[float | None, float | None]) -> tuple[float, float]:
    start, end = bounds
    return (
        float("-inf") if start is None else start,
        float("inf") if end is None else end,
    )


def _segment_packets(
    container: Any, stream: Any, segment: Segment, *, need_key: bool = True
) -> Iterator[Any]:
    """The segment's packets in decode order; with ``need_key`` the first must be a keyframe."""
    lo = None if segment.start is None else _seek_target(stream, segment.start)
    hi = None if segment.end is None else _seek_target(stream, segment.end)
    if lo is not None and lo > 0:
        container.seek(lo, stream=stream, backward=True, any_frame=False)
    first = True
    for packet in container.demux(stream):
        if packet.size == 0 or packet.pts is None:
            continue  # the demuxer's flush packet
        if hi is not None and packet.dts is not None and packet.dts >= hi:
            break  # dts <= pts, so every later packet is past the end too
        if (lo is not None and packet.pts < lo) or (hi is not None and packet.pts >= hi):
            continue
        if first and need_key and not packet.is_keyframe:
            raise ShardfeedError(
                f"{segment.describe()}: the segment does not start on a keyframe, so it cannot be "
                "stream-copied without re-encoding; pass --drop-videos to convert without the "
                "video features"
            )
        first = False
        yield packet


def _output_stream(output: Any, template: Any) -> Any:
    """A copy of ``template``'s codec parameters in ``output``, in the same time base."""
    stream = output.add_stream_from_template(template, opaque=True)
    stream.time_base = template.time_base
    return stream

"""formats/video.py: probe and stream-copy concatenation of MP4s, on small files encoded here."""

from __future__ import annotations

import hashlib
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("av")

import av
from video_fixtures import FPS, HEIGHT, WIDTH, decoded, encode, frame_pixels

from shardfeed.formats.storage import locate
from shardfeed.formats.video import (
    Segment,
    SegmentProbe,
    VideoUnreadable,
    concat_segments,
    params_difference,
    probe,
    probe_segments,
)
from shardfeed.schemas.errors import ShardfeedError


def packet_hashes(path: Path) -> list[str]:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return [hashlib.sha256(bytes(p)).hexdigest() for p in container.demux(stream) if p.size]


def at(frames: list[tuple[float, np.ndarray]], t: float) -> np.ndarray:
    """The frame shown at ``t`` seconds, as LeRobot looks it up (within 1e-4 s)."""
    times = np.array([ts for ts, _ in frames])
    i = int(np.argmin(np.abs(times - t)))
    assert abs(times[i] - t) < 1e-4, (t, times[i])
    return frames[i][1]


@pytest.fixture
def episodes(tmp_path: Path) -> dict[int, Path]:
    """Three one-episode MP4s of 5, 7 and 4 frames."""
    out = {}
    for ep, n in ((0, 5), (1, 7), (2, 4)):
        out[ep] = tmp_path / f"src/episode_{ep}.mp4"
        encode(out[ep], [frame_pixels(ep, i) for i in range(n)], gop=3)
    return out


def test_probe_reads_codec_size_rate_frames_and_keyframes(tmp_path, episodes):
    info = probe(locate(tmp_path), "src/episode_1.mp4")
    assert (info.codec, info.width, info.height, info.pix_fmt) == (
        "mpeg4",
        WIDTH,
        HEIGHT,
        "yuv420p",
    )
    assert info.fps == FPS and info.frames == 7 and info.starts_with_keyframe
    assert info.duration == pytest.approx(0.7)
    assert info.keyframes == 3  # gop 3: frames 0, 3, 6
    assert info.has_audio is False
    assert info.feature_info() == {
        "video.height": HEIGHT,
        "video.width": WIDTH,
        "video.codec": "mpeg4",
        "video.pix_fmt": "yuv420p",
        "video.fps": FPS,
    }


def test_concat_places_each_episode_exactly_and_is_deterministic(tmp_path, episodes):
    root = locate(tmp_path)
    order = [2, 0, 1]
    segments = [Segment(root, f"src/episode_{ep}.mp4") for ep in order]
    spans = concat_segments(segments, str(tmp_path / "out/a.mp4"))
    assert [s.frames for s in spans] == [4, 5, 7]
    assert [(s.from_timestamp, s.to_timestamp) for s in spans] == [
        (0.0, float(Fraction(4, FPS))),
        (float(Fraction(4, FPS)), float(Fraction(9, FPS))),
        (float(Fraction(9, FPS)), float(Fraction(16, FPS))),
    ]
    out = decoded(tmp_path / "out/a.mp4")
    assert len(out) == 16
    for ep, span in zip(order, spans, strict=True):
        source = decoded(episodes[ep])
        for k, (_, pixels) in enumerate(source):
            np.testing.assert_array_equal(at(out, span.from_timestamp + k / FPS), pixels)
    # stream copy: the packets are the sources' packets, in order
    expected = [h for ep in order for h in packet_hashes(episodes[ep])]
    assert packet_hashes(tmp_path / "out/a.mp4") == expected
    # deterministic bytes, no wall-clock metadata, no leftover temporary file
    concat_segments(segments, str(tmp_path / "out/b.mp4"))
    assert (tmp_path / "out/a.mp4").read_bytes() == (tmp_path / "out/b.mp4").read_bytes()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a.mp4", "b.mp4"]
    with av.open(str(tmp_path / "out/a.mp4")) as container:
        assert "creation_time" not in container.metadata
        assert "encoder" not in container.metadata
        assert "creation_time" not in container.streams.video[0].metadata
    whole = probe(root, "out/a.mp4")
    assert whole.frames == 16 and whole.duration == pytest.approx(1.6)


def shared_file(tmp_path: Path) -> tuple[list[int], np.ndarray, list[tuple[float, float]]]:
    """``shared.mp4``: three episodes of 6, 4 and 5 frames in one file, each starting on a
    keyframe, as a v3.0 dataset stores them; returns lengths, first frames and time ranges."""
    lengths = [6, 4, 5]
    starts = np.cumsum([0, *lengths])
    frames = [frame_pixels(ep, i) for ep, n in enumerate(lengths) for i in range(n)]
    encode(tmp_path / "shared.mp4", frames, keyframes={int(s) for s in starts[:-1]})
    return lengths, starts, [(starts[e] / FPS, starts[e + 1] / FPS) for e in range(3)]


def test_ranges_of_a_shared_file_are_cut_on_keyframes(tmp_path):
    """v3.0 re-sharding: episodes are [from, to) ranges of one file; take them in another order."""
    lengths, starts, ranges = shared_file(tmp_path)
    root = locate(tmp_path)
    order = [1, 2, 0]
    spans = concat_segments(
        [Segment(root, "shared.mp4", *ranges[e]) for e in order], str(tmp_path / "out.mp4")
    )
    assert [s.frames for s in spans] == [lengths[e] for e in order]
    out, source = decoded(tmp_path / "out.mp4"), decoded(tmp_path / "shared.mp4")
    for e, span in zip(order, spans, strict=True):
        assert span.to_timestamp - span.from_timestamp == pytest.approx(lengths[e] / FPS)
        for k in range(lengths[e]):
            np.testing.assert_array_equal(
                at(out, span.from_timestamp + k / FPS), source[starts[e] + k][1]
            )
    # a range that starts between keyframes cannot be stream-copied
    assert probe(root, "shared.mp4").keyframes == 3  # frame 2 (0.2 s) is not one
    with pytest.raises(
        ShardfeedError, match=r"shared\.mp4.*not start on a keyframe.*--drop-videos"
    ):
        concat_segments([Segment(root, "shared.mp4", 0.2, 0.6)], str(tmp_path / "bad.mp4"))
    assert not (tmp_path / "bad.mp4").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_different_codec_parameters_are_refused_by_name(tmp_path, episodes):
    big = [frame_pixels(9, i, height=32, width=32) for i in range(3)]
    encode(tmp_path / "src/big.mp4", big)
    root = locate(tmp_path)
    with pytest.raises(
        ShardfeedError, match=r"src/big\.mp4: height is 32 but the first video of this file has 16"
    ):
        concat_segments(
            [Segment(root, "src/episode_0.mp4"), Segment(root, "src/big.mp4")],
            str(tmp_path / "out.mp4"),
        )
    assert not (tmp_path / "out.mp4").exists()


def test_missing_and_unreadable_inputs_are_clear_errors(tmp_path, episodes):
    root = locate(tmp_path)
    with pytest.raises(ShardfeedError, match=r"src/nope\.mp4: MP4 file not found.*--drop-videos"):
        concat_segments([Segment(root, "src/nope.mp4")], str(tmp_path / "out.mp4"))
    (tmp_path / "src/junk.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42 not a video")
    with pytest.raises(ShardfeedError, match=r"src/junk\.mp4: not a readable video file"):
        probe(root, "src/junk.mp4")
    with pytest.raises(ShardfeedError, match="no video frames in this range"):
        concat_segments([Segment(root, "src/episode_0.mp4", 5.0, 6.0)], str(tmp_path / "o.mp4"))


def test_probe_segments_counts_each_range_as_concat_would_cut_it(tmp_path):
    """Ranges of a shared file, in any order, in one open (plus a reopen to go back to the start):
    the packet count concat_segments would copy and whether the range starts on a keyframe."""
    _, _, ranges = shared_file(tmp_path)
    root = locate(tmp_path)
    asked = [ranges[2], ranges[0], (0.2, 0.6), ranges[1], (None, None), (2.0, 3.0)]
    params, probes = probe_segments(root, "shared.mp4", asked)
    assert probes == [
        SegmentProbe(5, True),
        SegmentProbe(6, True),
        SegmentProbe(4, False),  # frame 2 is not a keyframe
        SegmentProbe(4, True),
        SegmentProbe(15, True),
        SegmentProbe(0, False),  # past the end: no frames
    ]
    assert params == probe(root, "shared.mp4").params
    assert params["codec"] == "mpeg4" and params["time_base"] == str(Fraction(1, 10240))
    spans = concat_segments(
        [Segment(root, "shared.mp4", *ranges[e]) for e in (2, 0, 1)], str(tmp_path / "o.mp4")
    )
    assert [s.frames for s in spans] == [5, 6, 4]


def test_params_difference_names_the_first_differing_parameter(tmp_path, episodes):
    encode(tmp_path / "src/big.mp4", [frame_pixels(9, i, height=32) for i in range(3)])
    root = locate(tmp_path)
    reference = probe(root, "src/episode_0.mp4").params
    assert params_difference(reference, probe(root, "src/episode_1.mp4").params) is None
    big = probe(root, "src/big.mp4").params
    assert params_difference(reference, big) == ("height", "32", "16")
    other = {**reference, "extradata": b"x"}
    assert params_difference(reference, other) == (
        "extradata",
        "1 bytes (different)",
        f"{len(reference['extradata'])} bytes",
    )


def test_unreadable_files_raise_video_unreadable(tmp_path, episodes):
    root = locate(tmp_path)
    (tmp_path / "src/random.mp4").write_bytes(np.random.default_rng(1).bytes(2048))
    for path in ("src/random.mp4", "src/nope.mp4"):
        with pytest.raises(VideoUnreadable, match=path.replace(".", r"\.")):
            probe_segments(root, path, [(None, None)])
        with pytest.raises(VideoUnreadable):
            probe(root, path)
    # a file cut in half: its moov box (at the end, as FFmpeg writes it) is gone
    whole = episodes[1].read_bytes()
    (tmp_path / "src/cut.mp4").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(VideoUnreadable, match=r"src/cut\.mp4: "):
        probe_segments(root, "src/cut.mp4", [(None, None)])


def test_without_pyav_the_error_says_what_to_install(tmp_path, episodes, monkeypatch):
    monkeypatch.setitem(sys.modules, "av", None)  # makes `import av` raise ImportError
    with pytest.raises(ShardfeedError, match=r"pip install 'shardfeed\[video\]'"):
        probe(locate(tmp_path), "src/episode_0.mp4")

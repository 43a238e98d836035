"""Small MP4s for the video tests: distinct frames, FFmpeg's built-in mpeg4 encoder, decoding.

Shared by tests/test_video.py and tests/test_lerobot_videos.py (import only after
``pytest.importorskip("av")``).
"""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np

FPS = 10
HEIGHT, WIDTH = 16, 32


def frame_pixels(seed: int, i: int, height: int = HEIGHT, width: int = WIDTH) -> np.ndarray:
    """A frame that differs from every other (seed, i): a level plus a moving bar."""
    img = np.full((height, width, 3), (seed * 50 + i * 9) % 200, np.uint8)
    img[:, (i * 3) % width : (i * 3) % width + 3] = 255
    img[: (seed % height) + 1, 0, 1] = 10
    return img


def encode(
    path: Path,
    frames: list[np.ndarray],
    *,
    fps: int = FPS,
    keyframes: set[int] | None = None,
    gop: int = 1000,
) -> None:
    """Encode ``frames`` with no B-frames; I-frames every ``gop`` frames and at ``keyframes``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w", format="mp4") as out:
        stream = out.add_stream("mpeg4", rate=fps, options={"sc_threshold": "1000000000"})
        stream.height, stream.width = frames[0].shape[:2]
        stream.pix_fmt = "yuv420p"
        stream.codec_context.gop_size = gop
        stream.codec_context.max_b_frames = 0
        for i, img in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(img, format="rgb24")
            if keyframes and i in keyframes:
                frame.pict_type = av.video.frame.PictureType.I
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def decoded(path: Path) -> list[tuple[float, np.ndarray]]:
    """(seconds, rgb pixels) of every frame, in presentation order."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return [
            (float(f.pts * stream.time_base), f.to_ndarray(format="rgb24"))
            for f in container.decode(stream)
        ]

#!/usr/bin/env python3
"""Make a small, deterministic sample corpus with numpy and Pillow (no network, no files read).

Two kinds of in-memory samples, which the script writes as a shardfeed dataset:

- ``robot``: an episodic, LeRobot-style dataset: ``observation.state`` and ``action`` (float32 [6]),
  ``timestamp``, ``frame_index``, ``episode_index``, ``index`` and ``task_index``; 20 episodes of
  50-200 frames at 30 fps over 3 tasks; ``index`` runs 0..N-1 in row order.
- ``images``: one row per image: ``image`` (real JPEG or PNG bytes), ``label`` (int64) and
  ``caption`` (string); the picture shows its label's shape and colour, so it is learnable.

And two kinds of raw input for ``shardfeed convert`` (files on disk, not a dataset):

- ``imagefolder-corpus``: ``OUT/<class>/<nnnn>.jpg|png``, the ``images`` samples as files, one
  directory per class (``circle``, ``cross``, ``square``, ``triangle``);
- ``jsonl-corpus``: ``OUT/part-<k>.jsonl``, records ``{"id", "text", "label", "score", "meta"}``
  with captions of varying length, spread over a few files.

``--bad N`` adds N deliberately broken inputs to a raw corpus (truncated JPEGs and text files named
``.png``; lines that are not JSON or lack ``text``), which ``convert`` turns into rejects.

The same seed gives the same samples and the same bytes. Tests and the quickstart import
``make_robot_samples`` and ``make_image_samples``; run as a script::

    python scripts/make_sample_corpus.py --kind robot --out out/sample --overwrite
    python scripts/make_sample_corpus.py --kind imagefolder-corpus --out out/sample-src --bad 2
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

ROBOT_FPS = 30
ROBOT_TYPE = "sample_arm_6dof"
ROBOT_TASKS = (
    "pick up the red cube",
    "push the blue block to the left",
    "open the drawer",
)
JOINT_NAMES = ["shoulder_pan", "shoulder_lift", "elbow", "wrist_flex", "wrist_roll", "gripper"]

IMAGE_CLASSES = (
    ("circle", (220, 40, 40), "red"),
    ("square", (40, 90, 220), "blue"),
    ("triangle", (40, 170, 60), "green"),
    ("cross", (230, 200, 30), "yellow"),
)
IMAGE_SIZE = (48, 64)  # (height, width) in pixels
DEFAULT_SEED = 0
DEFAULT_TARGET_SHARD_SIZE = {"robot": "48KB", "images": "200KB"}
RAW_KINDS = ("imagefolder-corpus", "jsonl-corpus")
DEFAULT_COUNT = {"imagefolder-corpus": 240, "jsonl-corpus": 2000}
JSONL_FILES = 4
# fmt: off
WORDS = (
    "robot", "arm", "gripper", "cube", "block", "drawer", "table", "camera", "light", "shadow",
    "red", "blue", "green", "yellow", "left", "right", "near", "far", "slowly", "quickly",
    "opens", "closes", "lifts", "pushes", "turns", "holds", "the", "a", "on", "under", "beside",
)
# fmt: on

Samples = tuple[dict[str, Any], dict[str, Any], list[str]]


def make_robot_samples(
    seed: int = DEFAULT_SEED,
    *,
    num_episodes: int = 20,
    min_length: int = 50,
    max_length: int = 200,
) -> Samples:
    """Return ``(features, data, tasks)`` for an episodic robot dataset held in memory.

    ``data`` is a dict of columns: ``(N, 6)`` float32 arrays for state and action and ``(N,)``
    arrays for the scalar features. Episode lengths are uniform in ``[min_length, max_length]``
    frames; ``timestamp`` is ``frame_index / ROBOT_FPS`` seconds.
    """
    if not 1 <= min_length <= max_length:
        raise ValueError(f"need 1 <= min_length <= max_length, got {min_length}, {max_length}")
    rng = np.random.default_rng(seed)
    dof = len(JOINT_NAMES)
    lengths = rng.integers(min_length, max_length + 1, size=num_episodes)
    task_of_episode = rng.integers(0, len(ROBOT_TASKS), size=num_episodes)
    # every task appears at least once when there are enough episodes
    task_of_episode[: min(num_episodes, len(ROBOT_TASKS))] = np.arange(
        min(num_episodes, len(ROBOT_TASKS))
    )
    states, actions, frames, episodes, tasks = [], [], [], [], []
    for ep, (length, task) in enumerate(
        zip(lengths.tolist(), task_of_episode.tolist(), strict=True)
    ):
        t = np.arange(length, dtype=np.float64) / ROBOT_FPS
        start = rng.uniform(-1.0, 1.0, size=dof)
        freq = rng.uniform(0.2, 1.5, size=dof)
        phase = rng.uniform(0, 2 * np.pi, size=dof)
        amplitude = rng.uniform(0.1, 0.6, size=dof)
        wave = amplitude * np.sin(2 * np.pi * freq * t[:, None] + phase) - amplitude * np.sin(phase)
        state = start + wave + rng.normal(0.0, 0.005, size=(length, dof))
        # the action is the next commanded position: the state one frame ahead, plus a little noise
        action = np.vstack([state[1:], state[-1:]]) + rng.normal(0.0, 0.002, size=(length, dof))
        states.append(state.astype(np.float32))
        actions.append(action.astype(np.float32))
        frames.append(np.arange(length, dtype=np.int64))
        episodes.append(np.full(length, ep, dtype=np.int64))
        tasks.append(np.full(length, task, dtype=np.int64))
    frame_index = np.concatenate(frames)
    data = {
        "observation.state": np.concatenate(states),
        "action": np.concatenate(actions),
        "timestamp": (frame_index / ROBOT_FPS).astype(np.float32),
        "frame_index": frame_index,
        "episode_index": np.concatenate(episodes),
        "index": np.arange(len(frame_index), dtype=np.int64),
        "task_index": np.concatenate(tasks),
    }
    features = {
        "observation.state": {"dtype": "float32", "shape": [dof], "names": list(JOINT_NAMES)},
        "action": {"dtype": "float32", "shape": [dof], "names": list(JOINT_NAMES)},
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
        "frame_index": {"dtype": "int64", "shape": [1], "names": None},
        "episode_index": {"dtype": "int64", "shape": [1], "names": None},
        "index": {"dtype": "int64", "shape": [1], "names": None},
        "task_index": {"dtype": "int64", "shape": [1], "names": None},
    }
    return features, data, list(ROBOT_TASKS)


def make_image_samples(
    seed: int = DEFAULT_SEED,
    *,
    num_images: int = 240,
    size: tuple[int, int] = IMAGE_SIZE,
) -> Samples:
    """Return ``(features, data, tasks)`` for an image classification/captioning corpus.

    ``data["image"]`` is a list of encoded bytes, alternating JPEG and PNG; ``label`` indexes
    ``IMAGE_CLASSES``; ``tasks`` is empty (the corpus is not episodic).
    """
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    height, width = size
    labels = rng.integers(0, len(IMAGE_CLASSES), size=num_images).astype(np.int64)
    images: list[bytes] = []
    captions: list[str] = []
    for i, label in enumerate(labels.tolist()):
        shape, colour, colour_name = IMAGE_CLASSES[label]
        background = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8) // 4 + 96
        img = Image.fromarray(background, "RGB")
        draw = ImageDraw.Draw(img)
        r = int(rng.integers(min(height, width) // 6, min(height, width) // 3 + 1))
        cx = int(rng.integers(r, width - r + 1))
        cy = int(rng.integers(r, height - r + 1))
        box = (cx - r, cy - r, cx + r, cy + r)
        if shape == "circle":
            draw.ellipse(box, fill=colour)
        elif shape == "square":
            draw.rectangle(box, fill=colour)
        elif shape == "triangle":
            draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=colour)
        else:
            draw.line([box[:2], box[2:]], fill=colour, width=max(2, r // 3))
            draw.line([(cx - r, cy + r), (cx + r, cy - r)], fill=colour, width=max(2, r // 3))
        buf = io.BytesIO()
        if i % 2 == 0:
            img.save(buf, format="JPEG", quality=85)
        else:
            img.save(buf, format="PNG", optimize=False)
        images.append(buf.getvalue())
        place = ("left" if cx < width / 2 else "right") + (" top" if cy < height / 2 else " bottom")
        captions.append(f"a {colour_name} {shape} near the {place} on a grey background")
    features = {
        "image": {
            "dtype": "image",
            "shape": [height, width, 3],
            "names": ["height", "width", "channels"],
        },
        "label": {"dtype": "int64", "shape": [1], "names": [c[0] for c in IMAGE_CLASSES]},
        "caption": {"dtype": "string", "shape": [1], "names": None},
    }
    data = {"image": images, "label": labels, "caption": captions}
    return features, data, []


def make_samples(kind: str, seed: int = DEFAULT_SEED) -> Samples:
    """Dispatch on ``kind`` (``robot`` or ``images``)."""
    makers = {"robot": make_robot_samples, "images": make_image_samples}
    if kind not in makers:
        raise ValueError(f"unknown kind {kind!r}; expected one of {sorted(makers)}")
    return makers[kind](seed)


def write_imagefolder_corpus(
    out: str | os.PathLike[str],
    seed: int = DEFAULT_SEED,
    *,
    num_images: int = DEFAULT_COUNT["imagefolder-corpus"],
    bad: int = 0,
    overwrite: bool = False,
) -> int:
    """Write the ``images`` samples as ``out/<class>/<nnnn>.jpg|png``; return the files written.

    ``bad`` broken files are added round-robin over the classes as ``bad-<j>.jpg`` (the first
    half of a JPEG: truncated) and ``bad-<j>.png`` (text, not an image).
    """
    _, data, _ = make_image_samples(seed, num_images=num_images)
    classes = [c[0] for c in IMAGE_CLASSES]
    _prepare(out, set(classes), overwrite)
    written = 0
    for i, (blob, label) in enumerate(zip(data["image"], data["label"].tolist(), strict=True)):
        ext = "jpg" if i % 2 == 0 else "png"  # make_image_samples alternates JPEG and PNG
        written += _write(out, f"{classes[label]}/{i:04d}.{ext}", blob)
    jpeg = data["image"][0]
    for j in range(bad):
        folder = classes[j % len(classes)]
        if j % 2 == 0:
            written += _write(out, f"{folder}/bad-{j}.jpg", jpeg[: len(jpeg) // 2])
        else:
            written += _write(out, f"{folder}/bad-{j}.png", b"this is a text file, not a PNG\n")
    return written


def write_jsonl_corpus(
    out: str | os.PathLike[str],
    seed: int = DEFAULT_SEED,
    *,
    num_records: int = DEFAULT_COUNT["jsonl-corpus"],
    num_files: int = JSONL_FILES,
    bad: int = 0,
    overwrite: bool = False,
) -> int:
    """Write ``num_records`` JSON records over ``out/part-<k>.jsonl``; return the files written.

    Texts are 3-120 random words (a long tail of sizes). ``bad`` broken lines are spread over the
    files: alternately a truncated JSON object and a record without ``text``.
    """
    rng = np.random.default_rng(seed)
    names = [f"part-{k}.jsonl" for k in range(num_files)]
    _prepare(out, set(names), overwrite)
    lines: list[str] = []
    for i in range(num_records):
        count = int(min(120, 3 + rng.lognormal(2.5, 0.8)))
        text = " ".join(rng.choice(WORDS, size=count).tolist())
        label = int(rng.integers(0, len(IMAGE_CLASSES)))
        record = {
            "id": i,
            "text": text,
            "label": label,
            "score": round(float(rng.uniform(0, 1)), 6),
            "meta": {"words": count, "class": IMAGE_CLASSES[label][0]},
        }
        lines.append(json.dumps(record, ensure_ascii=False))
    for j in reversed(range(bad)):  # from the end, so earlier insert positions stay put
        broken = '{"id": -1, "text": "cut off' if j % 2 == 0 else json.dumps({"id": -1 - j})
        lines.insert((2 * j + 1) * len(lines) // (2 * bad), broken)
    per_file = -(-len(lines) // num_files)
    for k, name in enumerate(names):
        chunk = lines[k * per_file : (k + 1) * per_file]
        _write(out, name, "".join(line + "\n" for line in chunk).encode())
    return len(names)


def _prepare(out: str | os.PathLike[str], ours: set[str], overwrite: bool) -> None:
    """Make ``out``; an existing non-empty ``out`` is replaced only with ``overwrite``, and only
    when it holds nothing but what this script writes there (so a wrong path is never wiped)."""
    if os.path.isdir(out) and os.listdir(out):
        if not overwrite:
            raise FileExistsError(f"{out} is not empty; pass --overwrite to replace it")
        foreign = sorted(set(os.listdir(out)) - ours)
        if foreign:
            raise FileExistsError(
                f"{out} holds {foreign[:3]}, which this script did not write; not replacing it"
            )
        shutil.rmtree(out)
    os.makedirs(out, exist_ok=True)


def _write(out: str | os.PathLike[str], rel: str, blob: bytes) -> int:
    path = os.path.join(out, *rel.split("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(blob)
    return 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=(
            "Generate a small deterministic sample corpus (numpy + Pillow, no network): write it "
            "as a shardfeed dataset (robot, images), or as raw input files for `shardfeed "
            "convert` (imagefolder-corpus, jsonl-corpus)."
        )
    )
    parser.add_argument("--out", required=True, help="directory to write")
    parser.add_argument(
        "--kind",
        choices=("robot", "images", *RAW_KINDS),
        default="robot",
        help=(
            "robot: episodic LeRobot-style frames; images: JPEG/PNG + label + caption (both as a "
            "dataset); imagefolder-corpus: OUT/<class>/*.jpg|png; jsonl-corpus: OUT/part-*.jsonl "
            "(default robot)"
        ),
    )
    parser.add_argument(
        "--count",
        type=int,
        default=None,
        help="raw kinds: images or records to write (default 240 images, 2000 records)",
    )
    parser.add_argument(
        "--bad",
        type=int,
        default=0,
        help="raw kinds: add this many deliberately broken inputs, which convert rejects (default 0)",
    )
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="random seed (default 0)")
    parser.add_argument(
        "--target-shard-size",
        default=None,
        help="payload bytes per shard, e.g. 48KB (default: 48KB for robot, 200KB for images)",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an existing dataset or corpus at --out"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.kind in RAW_KINDS:
        if args.target_shard_size is not None:
            parser.error("--target-shard-size is for robot and images (datasets), not raw corpora")
        if args.bad < 0 or (args.count is not None and args.count < 1):
            parser.error("--bad must be >= 0 and --count >= 1")
        return _write_raw(args)
    if args.count is not None or args.bad:
        parser.error("--count and --bad are for the raw kinds (imagefolder-corpus, jsonl-corpus)")
    from shardfeed import write_dataset
    from shardfeed.schemas.errors import ShardfeedError

    features, data, tasks = make_samples(args.kind, args.seed)
    robot = args.kind == "robot"
    try:
        manifest = write_dataset(
            args.out,
            features,
            data,
            target_shard_size=args.target_shard_size or DEFAULT_TARGET_SHARD_SIZE[args.kind],
            tasks=tasks,
            fps=ROBOT_FPS if robot else 0,
            robot_type=ROBOT_TYPE if robot else None,
            source=f"make_sample_corpus --kind {args.kind} --seed {args.seed}",
            overwrite=args.overwrite,
        )
    except (ShardfeedError, ValueError) as err:
        print(f"make_sample_corpus: error: {err}", file=sys.stderr)
        return 1
    print(f"wrote {manifest.num_samples} samples in {len(manifest.shards)} shards to {args.out}")
    return 0


def _write_raw(args: argparse.Namespace) -> int:
    count = args.count or DEFAULT_COUNT[args.kind]
    try:
        if args.kind == "imagefolder-corpus":
            files = write_imagefolder_corpus(
                args.out, args.seed, num_images=count, bad=args.bad, overwrite=args.overwrite
            )
            what = f"{count} images"
        else:
            files = write_jsonl_corpus(
                args.out, args.seed, num_records=count, bad=args.bad, overwrite=args.overwrite
            )
            what = f"{count} records"
    except OSError as err:
        print(f"make_sample_corpus: error: {err}", file=sys.stderr)
        return 1
    broken = f" and {args.bad} broken input(s)" if args.bad else ""
    print(f"wrote {what}{broken} in {files} files to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``shardfeed convert SRC DST``: run the Beam conversion pipeline; unknown flags go to Beam."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator

from shardfeed import BEAM_INSTALL_HINT
from shardfeed.cli._common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    add_break_lease,
    add_progress_flags,
    fail,
    print_json,
    progress_setting,
)
from shardfeed.schemas.manifest import SPLIT_NAME
from shardfeed.schemas.units import format_size, parse_size


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "convert",
        help="convert a raw corpus into size-balanced shards (Apache Beam; needs shardfeed[beam])",
        description=(
            "Convert SRC (a LeRobot v2.1/v3.0 dataset, an image folder, JSONL files, WebDataset tars, "
            "Parquet tables or TFRecord files of tf.train.Example) into a shardfeed "
            "dataset at DST. Runs on Beam's in-process runner by default, with no network access, "
            "one thread per available core (at most 4; --direct_num_workers=1 for one). Any flag "
            "not listed here goes to Beam's PipelineOptions, e.g. --direct_running_mode=multi_processing "
            "--direct_num_workers=2, or --runner=dask."
        ),
    )
    parser.add_argument("src", nargs="?", help="source file or directory (omitted with --split)")
    parser.add_argument("dst", help="output dataset directory")
    parser.add_argument(
        "--split",
        action="append",
        default=[],
        metavar="NAME=SRC",
        help="a named split from its own source, instead of SRC; repeat for each split, in "
        "order (e.g. --split train=raw/train --split eval=raw/eval). Each split is shuffled, "
        "planned and balanced by itself, so no shard mixes splits",
    )
    parser.add_argument(
        "--from",
        dest="kind",
        choices=["lerobot", "imagefolder", "jsonl", "webdataset", "parquet", "tfrecord"],
        help="source kind (autodetected when omitted)",
    )
    parser.add_argument(
        "--target-shard-size",
        default="100MB",
        type=parse_size,
        help="payload bytes per shard, e.g. 100MB or 64MiB (default 100MB)",
    )
    parser.add_argument(
        "--task-size",
        default="256MiB",
        type=parse_size,
        help="input bytes per scan task: a larger uncompressed JSONL file is scanned as several "
        "tasks (by lines), a larger Parquet file by runs of row groups; the output is the same "
        "however files are cut (default 256MiB)",
    )
    parser.add_argument(
        "--format",
        dest="shard_format",
        choices=["lerobot-v3", "tfrecord"],
        default="lerobot-v3",
        help="shard format: LeRobot v3.0 Parquet (default) or TFRecord of tf.train.Example "
        "(docs/FORMAT.md §16)",
    )
    parser.add_argument(
        "--tfrecord-compression",
        choices=["none", "gzip"],
        default="none",
        help="with --format tfrecord: compress each shard as one gzip member (default none)",
    )
    parser.add_argument(
        "--row-group-size",
        default="4MiB",
        type=parse_size,
        help="payload bytes per Parquet row group (default 4MiB)",
    )
    order = parser.add_mutually_exclusive_group()
    order.add_argument(
        "--shuffle-seed",
        type=int,
        default=0,
        help="seed of the global sample (or episode) order (default 0)",
    )
    order.add_argument(
        "--no-shuffle",
        action="store_true",
        help="keep the source order exactly, cut into contiguous shards as evenly as the order allows",
    )
    parser.add_argument(
        "--max-reject-fraction",
        type=float,
        default=0.01,
        help="fail and publish nothing above this reject fraction (default 0.01)",
    )
    parser.add_argument(
        "--drop-videos",
        action="store_true",
        help="LeRobot: drop video features (e.g. when the MP4s are absent)",
    )
    parser.add_argument(
        "--text-field", default="text", help="JSONL: the required text field (default 'text')"
    )
    parser.add_argument(
        "--unify-schemas",
        action="store_true",
        help="Parquet, TFRecord and JSONL: convert files whose schema differs instead of "
        "rejecting them (Parquet) or stopping with the field's name (TFRecord, JSONL): lossless "
        "promotions (int32->int64, float32->float64, int->float64, a missing column -> nulls); "
        "a JSONL key holding text in some files and numbers in others is kept as JSON text",
    )
    parser.add_argument(
        "--dedup",
        action="store_true",
        help="leave out exact duplicates (equal content hash) across the whole corpus: the first "
        "occurrence in source order is kept, each later copy is counted in the summary and the "
        "manifest and listed in meta/shardfeed/duplicates.jsonl (not for LeRobot sources; "
        "an image folder's images are then read twice, to hash their bytes)",
    )
    parser.add_argument(
        "--validate",
        choices=["full", "header", "none"],
        default="full",
        help="how much of each image is decoded to prove it sound: full catches truncation, header "
        "checks headers and pixel counts (default full). With header or none (and no "
        "--image-format, --max-image-side or --dedup) an image folder's scan reads only each "
        "image's header, so every image is read in full once, by its shard writer; full, "
        "re-encoding and --dedup read each image twice (scan, then writer)",
    )
    parser.add_argument(
        "--image-format",
        choices=["keep", "jpeg", "webp", "png"],
        default="keep",
        help="re-encode images to this format (default keep)",
    )
    parser.add_argument(
        "--max-image-side",
        type=int,
        metavar="N",
        help="shrink images so the longer side is at most N pixels",
    )
    parser.add_argument(
        "--cost",
        choices=["auto", "tokens", "pixels", "frames", "bytes"],
        default="auto",
        help="what each sample's cost in meta/shardfeed/samples.parquet counts, for size-aware "
        "batching: auto picks pixels with an image feature, else tokens with a string feature, "
        "else frames for episodic data, else bytes (default auto)",
    )
    parser.add_argument(
        "--hot-weights",
        metavar="FILE",
        help="pack the highest-weight samples into dedicated leading hot shards: a file of "
        "'key,weight' lines (or Parquet columns key, weight), keys as shardfeed rejects names "
        "inputs: an image path, FILE#line:N for JSONL, FILE#episode:N for LeRobot",
    )
    parser.add_argument(
        "--hot-budget",
        default="10%",
        help="payload the hot shards hold at most: a size (2GB) or a share of the dataset "
        "(default 10%%); with --hot-weights",
    )
    add_progress_flags(parser, force=True)
    parser.add_argument(
        "--dask-address",
        metavar="ADDR",
        help="run on Beam's DaskRunner against this Dask scheduler (implies --runner=dask)",
    )
    parser.add_argument(
        "--dask-local-workers",
        type=int,
        metavar="N",
        help="run on Beam's DaskRunner with a distributed.LocalCluster of N worker processes",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a published dataset at DST (the summary names the version replaced)",
    )
    add_break_lease(parser, "DST's")
    parser.add_argument("--json", action="store_true", help="print the end-of-run summary as JSON")
    parser.set_defaults(run=run, accepts_extra=True)


@contextlib.contextmanager
def _quiet_imports():
    """Beam logs optional-dependency warnings (GCP clients) at import; they are noise here."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


@contextlib.contextmanager
def _ctrl_c_ends_at_once(enabled: bool) -> Iterator[None]:
    """While a local run with worker processes goes on, Ctrl-C ends this process at once, in
    one line and exit status 130, as a kill would (the dataset is left as a killed run leaves
    it: the next run resumes it). Unwinding instead, Beam's teardown waits for each worker and
    its threads print a traceback per broken connection. The worker processes ignore Ctrl-C
    and end with this process (``worker_forks.WITHOUT_CTRL_C``)."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupted(signum: int, frame: object) -> None:
        fail("interrupted", EXIT_INTERRUPTED)
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(EXIT_INTERRUPTED)

    previous = signal.signal(signal.SIGINT, interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def run(args: argparse.Namespace, beam_args: list[str]) -> int:
    with contextlib.ExitStack() as stack:
        return _run(args, beam_args, stack)


def _run(args: argparse.Namespace, beam_args: list[str], stack: contextlib.ExitStack) -> int:
    try:
        with _quiet_imports():
            from shardfeed.pipelines import worker_forks
            from shardfeed.pipelines.beam_import import import_beam, runs_locally

            dask = args.dask_address is not None or args.dask_local_workers is not None
            in_process = not dask and runs_locally(beam_args)
            # worker processes, if asked for, import while this process does
            processes = in_process and worker_forks.wants_worker_processes(beam_args)
            stack.enter_context(_ctrl_c_ends_at_once(processes))
            stack.enter_context(worker_forks.serving(processes, lean=in_process))
            import_beam(lean=in_process, own_process=getattr(args, "own_process", False))
            from shardfeed.pipelines.driver import ConvertConfig, TooManyRejectsError, run_convert
            from shardfeed.pipelines.runners import (
                dask_args,
                with_local_threads,
                without_graph_type_checks,
            )
            from shardfeed.pipelines.step_errors import errors_once
    except ImportError as err:
        if "apache_beam" in str(err) or "shardfeed[beam]" in str(err):
            return fail(BEAM_INSTALL_HINT)
        raise
    try:
        splits = parse_splits(args.split)
    except ValueError as err:
        return fail(str(err), EXIT_USAGE)
    if splits and args.src is not None:
        return fail(
            f"--split NAME=SRC replaces the positional SRC; got both {args.src!r} and --split "
            "(give only DST after the --split options)",
            EXIT_USAGE,
        )
    if not splits and args.src is None:
        return fail("convert needs SRC and DST, or --split NAME=SRC ... and DST", EXIT_USAGE)
    source_options = {}
    if args.drop_videos:
        source_options["drop_videos"] = True
    if args.text_field != "text":
        source_options["text_field"] = args.text_field
    if args.unify_schemas:
        source_options["unify_schemas"] = True
    if args.task_size < 1:
        return fail("--task-size must be at least 1 byte", EXIT_USAGE)
    if args.shard_format != "tfrecord" and args.tfrecord_compression != "none":
        return fail("--tfrecord-compression needs --format tfrecord")
    config = ConvertConfig(
        src=args.src or "",
        dst=args.dst,
        kind=args.kind,
        target_shard_bytes=args.target_shard_size,
        row_group_bytes=args.row_group_size,
        task_bytes=args.task_size,
        encoding=shard_encoding(args.shard_format, args.tfrecord_compression),
        shuffle_seed=None if args.no_shuffle else args.shuffle_seed,
        validate=args.validate,
        image_format=args.image_format,
        max_image_side=args.max_image_side,
        max_reject_fraction=args.max_reject_fraction,
        cost=args.cost,
        hot_weights=args.hot_weights,
        hot_budget=args.hot_budget,
        dedup=args.dedup,
        overwrite=args.overwrite,
        break_lease=args.break_lease,
        progress=progress_setting(args),
        source_options=source_options,
        splits=splits,
    )
    if in_process:  # the default: a thread per core (Beam's own default is one)
        beam_args = without_graph_type_checks(with_local_threads(beam_args))
    try:
        with (
            dask_args(beam_args, args.dask_address, args.dask_local_workers) as runner_args,
            errors_once(),
        ):
            summary = run_convert(config, runner_args)
    except TooManyRejectsError as err:
        return fail(str(err))
    if args.json:
        print_json(summary.to_json())
    else:
        s = summary.to_json()
        print(
            f"converted {s['samples_out']:,} of {s['samples_in']:,} samples into {s['shards']} shard{'' if s['shards'] == 1 else 's'} at {s['dst']}\n"
            f"  rejects   {s['rejects']['total']:,} {s['rejects']['by_reason'] or ''}\n"
            f"  bytes     {format_size(s['bytes'])} on disk, {format_size(s['payload_bytes'])} payload (x{s['compression_ratio']})\n"
            f"  time      {s['seconds']} s, {s['samples_per_s']} samples/s ("
            + ", ".join(f"{name} {sec} s" for name, sec in s["phases"].items())
            + ")",
            file=sys.stdout,
        )
        if "duplicates" in s:
            print(
                f"  duplicates {s['duplicates']['total']:,} later exact copies left out "
                "(meta/shardfeed/duplicates.jsonl)"
            )
        for note in s["notes"]:
            print(f"  note      {note}")
    return EXIT_OK if summary.published else EXIT_FAILED


def parse_splits(values: list[str]) -> tuple[tuple[str, str], ...]:
    """``--split NAME=SRC`` values -> ``(name, src)`` in order; ValueError names a bad one."""
    splits = []
    for value in values:
        name, sep, src = value.partition("=")
        if not sep or not src:
            raise ValueError(f"--split expects NAME=SRC, got {value!r}")
        if not SPLIT_NAME.fullmatch(name):
            raise ValueError(
                f"--split {value!r}: {name!r} is not a valid split name (1-100 of A-Z a-z 0-9 "
                ". _ -, starting with a letter or digit)"
            )
        splits.append((name, src))
    names = [name for name, _ in splits]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"--split names must be distinct; {repeated} given more than once")
    return tuple(splits)


def shard_encoding(shard_format: str, compression: str) -> str:
    """The manifest's encoding name for ``--format`` and ``--tfrecord-compression``."""
    if shard_format == "tfrecord":
        return "tfrecord-gzip" if compression == "gzip" else "tfrecord"
    return "parquet"

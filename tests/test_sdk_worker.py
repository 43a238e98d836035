"""``multi_processing`` runs use shardfeed's worker module (``pipelines/sdk_worker.py``):
Beam's harness, quiet at start, then an exit without the cycle collector's last pass;
``in_memory`` runs start none."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

beam = pytest.importorskip("apache_beam")

from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402

from shardfeed.pipelines.runners import WORKER_MODULE, make_runner  # noqa: E402


def _main_module(_: object) -> str:
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    return spec.name if spec is not None else sys.modules["__main__"].__file__


def _run(args: list[str], out) -> list[str]:
    from worker_reports import reports_from_workers

    return sorted(reports_from_workers(args, _main_module, out))


def test_multi_processing_workers_run_shardfeeds_worker_module(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))  # workers import this module
    workers = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]
    assert _run(workers, tmp_path) == [WORKER_MODULE]


def _s3_filesystem_loaded(_: object) -> str:
    return str("apache_beam.io.aws.s3filesystem" in sys.modules)


def _pandas_loaded(_: object) -> str:
    return f"pandas-{'pandas' in sys.modules}"


@pytest.mark.parametrize("lean", [True, False])
def test_workers_import_beam_lean_when_their_driver_did(tmp_path, monkeypatch, lean):
    """A lean driver (``beam_import.py``, the ``shardfeed`` command on the local runner) marks
    the environment; its workers then leave Beam's object-store filesystems out too, and pandas."""
    from shardfeed.pipelines.beam_import import LEAN_ENV

    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))  # workers import this module
    if lean:
        monkeypatch.setenv(LEAN_ENV, "1")
    else:
        monkeypatch.delenv(LEAN_ENV, raising=False)
    options = PipelineOptions(["--direct_running_mode=multi_processing", "--direct_num_workers=2"])
    with beam.Pipeline(runner=make_runner(options), options=options) as p:
        _ = (
            p
            | beam.Create(range(8))
            | beam.Reshuffle()
            | beam.FlatMap(lambda x: [_s3_filesystem_loaded(x), _pandas_loaded(x)])
            | beam.Map(lambda loaded: tmp_path.joinpath(loaded).write_text(loaded))
        )
    names = sorted(path.name for path in tmp_path.iterdir())
    assert names == [str(not lean), f"pandas-{not lean}"]


def test_in_memory_runs_start_no_worker(tmp_path):
    assert WORKER_MODULE not in _run([], tmp_path)


def test_a_two_worker_convert_prints_no_beam_log_lines(tmp_path):
    """Beam's workers warn at start (no BigQuery client, no staging directory, options of the
    driver's runner) and, once their imports give the root logger a handler, print every
    record on stderr; a user sees none of it, only the summary."""
    import json
    import subprocess

    src = tmp_path / "src"
    src.mkdir()
    lines = [json.dumps({"text": f"document {i}", "n": i}) for i in range(500)]
    (src / "a.jsonl").write_text("\n".join(lines) + "\n")
    workers = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]
    command = [sys.executable, "-m", "shardfeed.cli.main", "convert", str(src)]
    command += [str(tmp_path / "dst"), "--no-progress", *workers]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "converted 500 of 500 samples" in done.stdout
    assert done.stderr == ""


@pytest.mark.parametrize(
    ("args", "cores", "added"),
    [
        ([], 2, ["--direct_running_mode=multi_threading", "--direct_num_workers=2"]),
        ([], 64, ["--direct_running_mode=multi_threading", "--direct_num_workers=4"]),
        ([], 1, []),  # one core: Beam's own in-memory default
        (["--direct_num_workers=1"], 8, []),  # the user's choice stands
        (["--direct_running_mode=multi_processing"], 8, []),
    ],
)
def test_the_local_default_is_a_thread_per_core(args, cores, added):
    from shardfeed.pipelines.runners import with_local_threads

    assert with_local_threads(args, cores) == [*args, *added]


@pytest.mark.parametrize(
    ("args", "added"),
    [
        ([], ["--no_pipeline_type_check"]),
        (["--pipeline_type_check"], []),  # the user's choice stands
        (["--no_pipeline_type_check"], []),
    ],
)
def test_the_command_builds_its_graph_without_type_checks(args, added):
    from shardfeed.pipelines.runners import without_graph_type_checks

    assert without_graph_type_checks(args) == [*args, *added]


def test_a_convert_without_type_checks_writes_the_same_bytes(tmp_path, monkeypatch):
    """On the local runner the ``convert`` command skips Beam's construction-time type checks (its
    tests build the graph with them on, as ``--pipeline_type_check`` does here); the dataset is
    byte-identical."""
    import json

    from apache_beam.transforms import ptransform

    from shardfeed.cli.main import main

    checks = []
    check = ptransform.PTransform.type_check_inputs

    def counted(self, *args, **kwargs):
        checks.append(self.label)
        return check(self, *args, **kwargs)

    monkeypatch.setattr(ptransform.PTransform, "type_check_inputs", counted)
    src = tmp_path / "src"
    src.mkdir()
    for k in range(3):
        rows = (json.dumps({"text": f"doc {k}-{i} " * (i % 7), "n": i}) for i in range(300))
        (src / f"{k}.jsonl").write_text("\n".join(rows) + "\n")
    base = ["--no-progress", "--target-shard-size", "20KB"]
    assert main(["convert", str(src), str(tmp_path / "default"), *base]) == 0
    assert checks == []
    on = [*base, "--pipeline_type_check"]
    assert main(["convert", str(src), str(tmp_path / "checked"), *on]) == 0
    assert len(checks) > 10
    files = sorted(p for p in (tmp_path / "checked").rglob("*") if p.is_file())
    assert len(files) > 4
    for path in files:
        twin = tmp_path / "default" / path.relative_to(tmp_path / "checked")
        assert path.read_bytes() == twin.read_bytes(), path


def test_a_default_convert_runs_its_steps_on_threads(tmp_path, monkeypatch):
    """The ``shardfeed`` command's default runs steps on more than one thread (on a machine
    with at least two cores); the result is the same dataset as one thread's."""
    import json
    import threading

    from shardfeed.cli.main import main
    from shardfeed.pipelines import convert

    monkeypatch.setattr("shardfeed.pipelines.runners.available_cores", lambda: 2)
    scan = convert.scan_guessing
    names = tmp_path / "threads.txt"

    def spy(*args, **kwargs):  # pickled with the step, so it records in a file
        with open(names, "a") as out:
            out.write(threading.current_thread().name + "\n")
        return scan(*args, **kwargs)

    monkeypatch.setattr(convert, "scan_guessing", spy)
    src = tmp_path / "src"
    src.mkdir()
    for k in range(4):
        rows = (json.dumps({"text": f"doc {k}-{i} " * (i % 9)}) for i in range(400))
        (src / f"{k}.jsonl").write_text("\n".join(rows) + "\n")
    assert main(["convert", str(src), str(tmp_path / "threads"), "--no-progress"]) == 0
    seen = set(names.read_text().split())
    assert len(seen) == 2 and threading.main_thread().name not in seen
    one = ["--direct_num_workers=1"]
    assert main(["convert", str(src), str(tmp_path / "one"), "--no-progress", *one]) == 0
    for path in sorted((tmp_path / "one").rglob("*")):
        twin = tmp_path / "threads" / path.relative_to(tmp_path / "one")
        assert path.is_dir() or path.read_bytes() == twin.read_bytes(), path


@pytest.mark.parametrize("large", [True, False])
def test_threads_write_one_large_shard_at_a_time(tmp_path, monkeypatch, large):
    """A shard of many units costs its writer memory per unit; the default runner's threads
    write at most one shard above ``LARGE_SHARD_UNITS`` at a time (bench_memory's 10M-record
    run), while smaller shards are written side by side."""
    import json
    import threading

    from shardfeed.cli.main import main
    from shardfeed.pipelines import convert

    monkeypatch.setattr(convert, "LARGE_SHARD_UNITS", 10 if large else 10**9)
    write = convert._write_shard
    seen = threading.Condition()  # the writer threads share this process's state
    writes = {"active": 0, "peak": 0, "started": 0}

    def spy(*args, **kwargs):
        with seen:
            writes["active"] += 1
            writes["started"] += 1
            writes["peak"] = max(writes["peak"], writes["active"])
            seen.notify_all()
            # meet the other thread's shard when one may start beside this one (bounded: the
            # last shard, or a large one holding the lock, meets none)
            seen.wait_for(lambda: writes["active"] > 1, timeout=0.5)
        try:
            return write(*args, **kwargs)
        finally:
            with seen:
                writes["active"] -= 1

    monkeypatch.setattr(convert, "_write_shard", spy)
    src = tmp_path / "src"
    src.mkdir()
    for k in range(4):
        rows = (json.dumps({"text": f"doc {k}-{i} " * (1 + i % 5)}) for i in range(300))
        (src / f"{k}.jsonl").write_text("\n".join(rows) + "\n")
    threads = ["--direct_running_mode=multi_threading", "--direct_num_workers=2"]
    dst = tmp_path / "dst"
    assert main(["convert", str(src), str(dst), "--target-shard-size", "6KB", *threads]) == 0
    assert writes["started"] >= 4
    assert writes["peak"] == (1 if large else 2)

"""A local ``shardfeed convert`` imports Beam without the object-store filesystems it never uses
(``pipelines/beam_import.py``), and so do the worker processes of such a run; the command's own
process also runs without pandas."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("apache_beam")

from shardfeed.pipelines.beam_import import LEAN_ENV, SKIPPED, UNUSED_LIBRARIES, runs_locally

S3_FS = "apache_beam.io.aws.s3filesystem"


@pytest.mark.parametrize(
    ("args", "local"),
    [
        ([], True),
        (["--direct_running_mode=multi_processing", "--direct_num_workers=2"], True),
        (["--runner=DirectRunner"], True),
        (["--runner", "FnApiRunner"], True),
        (["--runner=dask"], False),
        (["--runner", "DataflowRunner", "--project=p"], False),
        (["--runner=FlinkRunner"], False),
    ],
)
def test_runs_locally_reads_the_runner_flag(args, local):
    assert runs_locally(args) is local


def _python(code: str, env: dict[str, str] | None = None) -> dict:
    """Run ``code`` in a fresh interpreter; its last stdout line is JSON."""
    import os

    run_env = {k: v for k, v in os.environ.items() if k != LEAN_ENV}
    run_env.update(env or {})
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=run_env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1])


PROBE = """
    import importlib, json, os, sys
    from apache_beam.io.filesystems import FileSystems
    try:
        FileSystems.get_filesystem("s3://bucket/key")
        s3 = True
    except ValueError:
        s3 = False
    loaded = [name for name in {skipped!r} if name in sys.modules]
    importlib.import_module("{s3_fs}")  # still importable once Beam is in
    print(json.dumps({{"loaded": loaded, "s3": s3, "env": os.environ.get("{env}")}}))
"""


def _probe() -> str:
    return PROBE.format(skipped=SKIPPED, s3_fs=S3_FS, env=LEAN_ENV)


def test_a_lean_import_leaves_the_filesystems_out_and_marks_the_environment():
    lean = _python(
        "from shardfeed.pipelines.beam_import import import_beam\nimport_beam(lean=True)\n"
        + textwrap.dedent(_probe())
    )
    assert lean == {"loaded": [], "s3": False, "env": "1"}


def test_a_full_import_keeps_beams_filesystems():
    import importlib.util

    assert importlib.util.find_spec("boto3") is not None  # the [beam] extra installs it
    full = _python(
        "from shardfeed.pipelines.beam_import import import_beam\nimport_beam(lean=False)\n"
        + textwrap.dedent(_probe())
    )
    assert full["s3"] is True and S3_FS in full["loaded"] and full["env"] is None


def _convert_args(tmp_path) -> list[str]:
    """``convert`` arguments for a small JSONL source made under ``tmp_path``."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text("".join(json.dumps({"text": f"d{i}"}) + "\n" for i in range(50)))
    return ["convert", str(src), str(tmp_path / "dst"), "--no-progress"]


def test_a_local_convert_imports_beam_lean(tmp_path):
    args = _convert_args(tmp_path)
    found = _python(
        f"""
        import json, os, sys
        from shardfeed.cli.main import main
        code = main({args!r})
        print(json.dumps({{"code": code, "s3": "{S3_FS}" in sys.modules,
                          "env": os.environ.get("{LEAN_ENV}")}}))
        """
    )
    assert found == {"code": 0, "s3": False, "env": "1"}


PYARROW_WITHOUT_PANDAS = """
    import io, json, sys
    import pyarrow as pa, pyarrow.compute as pc, pyarrow.parquet as pq
    table = pa.table({"n": pa.array([1, None, 3]), "s": pa.array(["a", "b", None])})
    table = table.set_column(0, "n", pc.fill_null(table["n"], 0))  # pa.scalar: pyarrow's check
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    # one thread: Arrow's threaded Parquet read can abort the interpreter's exit under load
    # ("terminate called without an active exception", apache/arrow#34314; seen here 4 in 30)
    rows = pq.read_table(io.BytesIO(sink.getvalue()), use_threads=False).to_pylist()
    try:
        import pandas
        refused = False
    except ModuleNotFoundError:
        refused = True
    print(json.dumps({"pandas": "pandas" in sys.modules, "refused": refused, "rows": rows}))
"""


def test_an_own_lean_process_runs_without_pandas_and_pyarrow_still_works():
    assert "pandas" in UNUSED_LIBRARIES
    found = _python(
        "from shardfeed.pipelines.beam_import import import_beam\n"
        "import_beam(lean=True, own_process=True)\n" + textwrap.dedent(PYARROW_WITHOUT_PANDAS)
    )
    rows = [{"n": 1, "s": "a"}, {"n": 0, "s": "b"}, {"n": 3, "s": None}]
    assert found == {"pandas": False, "refused": True, "rows": rows}


@pytest.mark.parametrize("lean", [True, False])
def test_a_shared_process_keeps_pandas(lean):
    """``main()`` called by another program (a test, a notebook): pandas is not taken from it."""
    import importlib.util

    assert importlib.util.find_spec("pandas") is not None  # installed with Beam
    found = _python(
        "from shardfeed.pipelines.beam_import import import_beam\n"
        f"import_beam(lean={lean})\n" + textwrap.dedent(PYARROW_WITHOUT_PANDAS)
    )
    assert found["pandas"] is True and found["refused"] is False


def test_the_shardfeed_command_converts_without_pandas(tmp_path):
    args = _convert_args(tmp_path)
    found = _python(
        f"""
        import atexit, json, sys
        atexit.register(lambda: print(json.dumps({{"pandas": "pandas" in sys.modules}})))
        from shardfeed.cli.main import entry
        sys.argv = ["shardfeed", *{args!r}]
        entry()
        """
    )
    assert found == {"pandas": False}
    assert (tmp_path / "dst" / "meta" / "info.json").exists()


SAMPLING_PROBE = """
    import json
    {imports}
    import apache_beam as beam
    from apache_beam.runners.worker import statesampler

    def period(_):
        return statesampler.get_current_tracker().sampling_period_ms

    with beam.Pipeline() as p:  # Beam's in-process runner: the sampler of a real bundle
        seen = p | beam.Create([0]) | beam.Map(period)
        seen | beam.Map(lambda v: print(json.dumps({{"period": v}})))
"""


@pytest.mark.parametrize("lean", [True, False])
def test_a_lean_import_shortens_the_bundles_state_sampling(lean):
    """A bundle's end waits for its sampler thread's next wake-up, up to Beam's 200 ms; a lean
    (local shardfeed) process samples every SAMPLING_PERIOD_MS, a full import as Beam does."""
    from shardfeed.pipelines.beam_tuning import SAMPLING_PERIOD_MS

    imports = f"from shardfeed.pipelines.beam_import import import_beam; import_beam(lean={lean})"
    found = _python(SAMPLING_PROBE.format(imports=imports))
    assert found == {"period": SAMPLING_PERIOD_MS if lean else 200}
    assert SAMPLING_PERIOD_MS < 200


def test_a_lean_worker_shortens_its_state_sampling():
    """A ``multi_processing`` worker of a lean driver (``sdk_worker.prepare``) does the same."""
    from shardfeed.pipelines.beam_tuning import SAMPLING_PERIOD_MS

    found = _python(
        """
        import json
        from shardfeed.pipelines.sdk_worker import prepare
        prepare()
        from apache_beam.runners.worker import statesampler
        from apache_beam.utils.counters import CounterFactory
        sampler = statesampler.StateSampler("x", CounterFactory())
        print(json.dumps({"period": sampler.sampling_period_ms}))
        """,
        env={LEAN_ENV: "1"},
    )
    assert found == {"period": SAMPLING_PERIOD_MS}

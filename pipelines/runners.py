"""Pick and configure the Beam runner; the local default never touches the network.

Beam's ``DirectRunner`` first tries Prism, which downloads a binary from GitHub. shardfeed runs the
in-process FnApiRunner instead (it honours ``--direct_running_mode`` and ``--direct_num_workers``),
and maps ``--runner=dask`` to Beam's DaskRunner (``dask_args`` adds a scheduler address, or
starts a ``distributed.LocalCluster`` for the run).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import shlex
import sys
from collections.abc import Iterator, Sequence

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.runner import PipelineRunner

from shardfeed.pipelines import worker_forks
from shardfeed.pipelines.beam_import import LOCAL_RUNNER_NAMES
from shardfeed.pipelines.step_errors import ERROR_LOGGERS
from shardfeed.pipelines.worker_guard import mark_driver
from shardfeed.schemas.errors import ShardfeedError

LOCAL_RUNNERS = {None, *LOCAL_RUNNER_NAMES}
DASK_RUNNERS = {"dask", "daskrunner"}


#: The module each ``multi_processing`` worker process runs (Beam's harness, a quicker exit)
WORKER_MODULE = "shardfeed.pipelines.sdk_worker"
#: Loggers of Beam's SDK workers that warn at every worker's start about what a local run does
#: not use (a staging directory for a pickled main session, options of the driver's runner)
WORKER_STARTUP_LOGGERS = (
    "apache_beam.runners.worker.sdk_worker_main",
    "apache_beam.options.pipeline_options",
)


def quiet_workers(beam_args: Sequence[str]) -> list[str]:
    """``beam_args`` with SDK worker processes (``--direct_running_mode=multi_processing``)
    logging warnings and up, not every channel they open, and their failing step's traceback
    left to the driver; a log level the user set is kept."""
    args = list(beam_args)
    if not any(a.startswith("--default_sdk_harness_log_level") for a in args):
        args.append("--default_sdk_harness_log_level=WARNING")
    if not any(a.startswith("--sdk_harness_log_level_overrides") for a in args):
        overrides = {name: "CRITICAL" for name in ERROR_LOGGERS}
        overrides.update({name: "ERROR" for name in WORKER_STARTUP_LOGGERS})
        args.append(f"--sdk_harness_log_level_overrides={json.dumps(overrides)}")
    return args


#: Most threads the in-process runner takes by default (one per available core up to this):
#: Arrow's parsing, zstd, hashing and file I/O release the GIL, so threads use several cores
#: with no process and no Beam import per worker; the per-record Python left caps the gain
DEFAULT_THREADS_MAX = 4


def with_local_threads(beam_args: Sequence[str], cores: int | None = None) -> list[str]:
    """``beam_args`` for the in-process runner with one thread per available core (at most
    :data:`DEFAULT_THREADS_MAX`), unless they set ``--direct_running_mode`` or
    ``--direct_num_workers`` themselves; on one core, unchanged."""
    args = list(beam_args)
    if any(a.startswith(("--direct_running_mode", "--direct_num_workers")) for a in args):
        return args
    threads = min(cores if cores is not None else available_cores(), DEFAULT_THREADS_MAX)
    if threads < 2:
        return args
    return [*args, "--direct_running_mode=multi_threading", f"--direct_num_workers={threads}"]


def without_graph_type_checks(beam_args: Sequence[str]) -> list[str]:
    """``beam_args`` with Beam's construction-time type checks off (``--no_pipeline_type_check``),
    unless they set ``--pipeline_type_check`` or ``--no_pipeline_type_check`` themselves; for the
    in-process runner. The ``convert`` graph is fixed and its tests build it with the checks on;
    in every run they cost about 0.2 s of the GIL before the first step (``view_as`` per hint
    comparison). Elements then travel with Beam's pickling coder; the output is byte-identical
    (tested). Not for Dask: there a killed worker's upload once went unnoticed without them
    (2 runs in 6 of ``test_a_run_failed_by_a_killed_uploader_is_completed_by_the_next``, 0 in 4 with)."""
    args = list(beam_args)
    if any(a.split("=")[0] in ("--pipeline_type_check", "--no_pipeline_type_check") for a in args):
        return args
    return [*args, "--no_pipeline_type_check"]


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity, where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def make_runner(options: PipelineOptions) -> PipelineRunner | str:
    """A runner instance for local and Dask runs; other names go to Beam unchanged."""
    name = options.view_as(StandardOptions).runner
    key = (name or "").lower()
    if key in LOCAL_RUNNERS:
        mark_driver()  # its multi_processing workers end with it (worker_guard.py)
        return _local_runner(options)
    if key in DASK_RUNNERS:
        from apache_beam.runners.dask.dask_runner import DaskRunner

        return DaskRunner()
    return name


def _local_runner(options: PipelineOptions) -> PipelineRunner:
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle

    encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    provision = fn_runner.ExtendedProvisionInfo(
        beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded)
    )
    return _local_runner_class()(provision_info=provision)


def worker_command() -> str:
    """The shell command of each ``multi_processing`` worker: a client of the fork server while
    one serves this process (``worker_forks.py``), else a new interpreter running
    :data:`WORKER_MODULE`."""
    python = shlex.quote(sys.executable)
    if os.environ.get(worker_forks.SERVER_ENV):
        return (
            f"{worker_forks.WITHOUT_CTRL_C} {python} -I -S {shlex.quote(str(worker_forks.CLIENT))}"
        )
    return f"{worker_forks.WITHOUT_CTRL_C} {python} -m {WORKER_MODULE}"


@functools.cache
def _local_runner_class() -> type:
    """Beam's in-process runner whose ``multi_processing`` workers run :func:`worker_command`."""
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.transforms import environments

    class LocalRunner(fn_runner.FnApiRunner):
        """FnApiRunner; the subprocess environment it picks for ``multi_processing`` is
        replaced with one running :func:`worker_command` (same harness, quicker start and exit)."""

        @property
        def _default_environment(self) -> environments.Environment:
            return self._environment

        @_default_environment.setter
        def _default_environment(self, environment: environments.Environment) -> None:
            if isinstance(environment, environments.SubprocessSDKEnvironment):
                command = worker_command()
                environment = environments.SubprocessSDKEnvironment.from_command_string(command)
            self._environment = environment

    return LocalRunner


@contextlib.contextmanager
def dask_args(
    beam_args: Sequence[str], address: str | None, local_workers: int | None
) -> Iterator[list[str]]:
    """Beam flags for ``--runner=dask``: an existing scheduler, or a LocalCluster started here."""
    args = list(beam_args)
    if address is None and local_workers is None:
        yield args
        return
    if not any(a.lower() in ("--runner=dask", "--runner=daskrunner") for a in args):
        args.append("--runner=dask")
    if address is not None:
        yield [*args, f"--dask_client_address={address}"]
        return
    try:
        from distributed import LocalCluster
    except ImportError:
        raise ShardfeedError(
            "--dask-local-workers needs Dask: pip install 'shardfeed[dask]'"
        ) from None
    quiet = logging.getLogger("distributed")  # its scheduler and nannies live in this process
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        with LocalCluster(
            n_workers=local_workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            silence_logs=logging.CRITICAL,  # a failed task reaches the driver, said there once
        ) as cluster:
            try:
                yield [*args, f"--dask_client_address={cluster.scheduler_address}"]
            finally:
                _close_default_client()
    finally:
        quiet.setLevel(level)


def _close_default_client() -> None:
    """Close the client Beam's DaskRunner opened, before its cluster goes away (no reconnect noise)."""
    from distributed import get_client

    with contextlib.suppress(ValueError):  # no client was opened
        get_client().close()

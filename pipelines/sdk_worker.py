"""The SDK worker process of ``--direct_running_mode=multi_processing`` runs
(``python -m shardfeed.pipelines.sdk_worker``, set by ``runners.py``): Beam's own harness
(``apache_beam.runners.worker.sdk_worker_main``), quiet at start, then the same exit the
``shardfeed`` command takes (``shardfeed.cli.main.entry``): no cycle collection over Beam's object
graph as the interpreter ends, which cost each worker about half a second after the last step.
Importing ``shardfeed.pipelines`` only checks that Beam is installed, so this runs before Beam loads,
and it loads lean (``beam_import.py``: also without pandas) when its driver did.
``worker_forks.py`` runs the same two halves, :func:`prepare` once and :func:`run_harness` in
each worker it forks.

When the harness returns, the runner has closed the control channel: every bundle's outputs were
sent and every file a step wrote was closed and renamed inside that step.
"""

from __future__ import annotations

import gc
import logging
import os
import sys

from shardfeed.pipelines.worker_guard import die_with_parent


def prepare() -> None:
    """Import Beam's harness as the driver imported Beam (lean or not), logging nothing."""
    # Beam's imports log a warning through ``logging.warning`` (no BigQuery client), which also
    # gives the root logger a stderr handler that then prints every record of the run; the
    # harness sends its records to the driver, which shows those at the level asked for
    root = logging.getLogger()
    root.addHandler(logging.NullHandler())
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        from shardfeed.pipelines.beam_import import import_beam, lean_worker

        import_beam(lean=lean_worker(), own_process=True)  # as its driver did
        from apache_beam.runners.worker import sdk_worker_main  # noqa: F401
    finally:
        root.setLevel(level)


def run_harness(argv: list[str]) -> None:
    """Run Beam's harness until the runner closes its control channel (its address and the
    pipeline options come from the environment)."""
    from apache_beam.runners.worker import sdk_worker_main

    from shardfeed.pipelines.step_errors import StderrWithoutTracebacks

    sys.stderr = StderrWithoutTracebacks(sys.stderr)  # a failing step is said by the driver
    sdk_worker_main.main(argv)


def main() -> None:
    # started with Ctrl-C ignored (worker_forks.WITHOUT_CTRL_C); it ends with its driver
    die_with_parent(os.getppid())
    prepare()
    run_harness(sys.argv)
    gc.disable()
    gc.freeze()


if __name__ == "__main__":
    main()

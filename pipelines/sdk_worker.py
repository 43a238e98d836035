"""The SDK worker process of ``--direct_running_mode=multi_processing`` runs: Beam's own
harness (``apache_beam.runners.worker.sdk_worker_main``), then the same exit the ``shardfeed``
command takes (``shardfeed.cli.main.entry``): no cycle collection over Beam's object graph as the
interpreter ends, which cost each worker about half a second after the pipeline's last step.

When the harness returns, the runner has closed the control channel: every bundle's outputs were
sent and every file a step wrote was closed and renamed inside that step.
"""

from __future__ import annotations

import gc
import sys

#: the worker command ``runners.py`` gives the in-process runner for its worker processes
WORKER_MODULE = "shardfeed.pipelines.sdk_worker"


def main() -> None:
    from apache_beam.runners.worker import sdk_worker_main

    sdk_worker_main.main(sys.argv)
    gc.disable()
    gc.freeze()


if __name__ == "__main__":
    main()

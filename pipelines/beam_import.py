"""Import Beam for a local run without the parts a local run never uses.

``import apache_beam`` also imports every optional filesystem whose client library is installed
(S3 through boto3, Azure Blob, GCS, HDFS), and its Google Cloud connectors. A local shardfeed run
uses none of them: its files go through ``pyarrow.fs``. In an environment that also holds those clients (a mosaicml-streaming
install brings Azure's and Google's) they cost about half a second of every command's start and
of every ``multi_processing`` worker's (BENCHMARKS.md).

pandas is the largest import left (about 0.4 s), and Beam takes it only because it is installed;
pyarrow would import it anyway on its first ``pa.array`` call, and then never look again. So a
process of its own (the ``shardfeed`` command, its workers) also runs *without* pandas (and
MongoDB's client) from start to end: :func:`leave_out_unused_libraries`. A process that is not
ours (a test, a notebook calling ``main()``) keeps them: another caller may need pandas later.

Only the ``shardfeed`` command on the local runner, and the worker processes of such a run, take
the lean import (:data:`LEAN_ENV`); a pipeline of the user's own imports Beam as Beam does.
"""

from __future__ import annotations

import argparse
import importlib.abc
import os
import sys
from collections.abc import Sequence

#: Set by a lean driver, so its ``multi_processing`` workers (``sdk_worker.py``) import lean too
LEAN_ENV = "SHARDFEED_LEAN_BEAM"

#: Modules Beam imports at start that a local shardfeed run never uses; each import is tried by
#: Beam inside ``except ImportError``, so leaving them out only leaves those features out
SKIPPED = (
    "apache_beam.io.aws.s3filesystem",
    "apache_beam.io.azure.blobstoragefilesystem",
    "apache_beam.io.gcp.gcsfilesystem",
    "apache_beam.io.hadoopfilesystem",
    # Beam's Google Cloud connectors (BigQuery, Pub/Sub, GCS I/O), tried in one block by
    # ``apache_beam.io``: with Google's client libraries installed, about 0.09 s (5 runs each)
    "apache_beam.io.gcp.bigquery",
)

#: Libraries a local shardfeed process never uses that Beam (pandas: also pyarrow) imports when
#: they are installed; each is tried inside ``except ImportError``. Top-level names.
UNUSED_LIBRARIES = ("pandas", "pymongo", "bson")

#: Runner names (lower-cased) that mean Beam's in-process runner
LOCAL_RUNNER_NAMES = frozenset({"", "direct", "directrunner", "fnapirunner"})


def beam_flag(beam_args: Sequence[str], name: str) -> str:
    """The value Beam flags ``beam_args`` give ``--name`` ("" when none), as Beam parses it."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument(f"--{name}", dest="value", default="")
    known, _ = parser.parse_known_args(list(beam_args))
    return known.value


def runs_locally(beam_args: Sequence[str]) -> bool:
    """Whether Beam flags ``beam_args`` pick the in-process runner (the default)."""
    return beam_flag(beam_args, "runner").lower() in LOCAL_RUNNER_NAMES


def import_beam(lean: bool, own_process: bool = False) -> None:
    """Import Beam, without :data:`SKIPPED` when ``lean`` (and mark the environment, so this
    process's worker processes do the same). Modules already imported stay; once Beam is in,
    each skipped module can be imported again as usual. ``own_process`` (lean only): this process
    runs shardfeed alone, so :data:`UNUSED_LIBRARIES` stay out of it to the end. A lean import
    also tunes Beam for a local run (``beam_tuning.tune_local_beam``)."""
    if lean and own_process:
        leave_out_unused_libraries()
    if not lean:
        import apache_beam  # noqa: F401

        return
    if "apache_beam" not in sys.modules:
        os.environ[LEAN_ENV] = "1"
        _import_without(SKIPPED)
    from shardfeed.pipelines.beam_tuning import tune_local_beam

    tune_local_beam()


def _import_without(modules: Sequence[str]) -> None:
    """Import Beam with ``modules`` (those not imported yet) refused for its duration only."""
    blocked = [name for name in modules if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None  # type: ignore[assignment]  # "import X" raises ImportError
    try:
        import apache_beam  # noqa: F401
    finally:
        for name in blocked:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


class _LeftOut(importlib.abc.MetaPathFinder):
    """Finds none of :data:`UNUSED_LIBRARIES`: importing one raises ``ModuleNotFoundError``, which
    Beam and pyarrow take as "not installed". (A ``None`` in ``sys.modules`` would not do:
    pyarrow's compiled import takes it for the module.)"""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.partition(".")[0] in UNUSED_LIBRARIES:
            raise ModuleNotFoundError(f"No module named {name!r} in a shardfeed process", name=name)
        return None


def leave_out_unused_libraries() -> None:
    """Keep :data:`UNUSED_LIBRARIES` out of this process from now on; nothing is done when one is
    already imported, or they are already kept out."""
    if any(isinstance(finder, _LeftOut) for finder in sys.meta_path):
        return
    if not any(name in sys.modules for name in UNUSED_LIBRARIES):
        sys.meta_path.insert(0, _LeftOut())


def lean_worker() -> bool:
    """Whether this process is the worker of a driver that imported Beam lean."""
    return os.environ.get(LEAN_ENV) == "1"

"""Pick and configure the Beam runner; the local default never touches the network.

Beam's ``DirectRunner`` first tries Prism, which downloads a binary from GitHub. shardfeed runs the
in-process FnApiRunner instead (it honours ``--direct_running_mode`` and ``--direct_num_workers``),
and maps ``--runner=dask`` to Beam's DaskRunner.
"""

from __future__ import annotations

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.runner import PipelineRunner

LOCAL_RUNNERS = {None, "", "direct", "directrunner", "fnapirunner"}
DASK_RUNNERS = {"dask", "daskrunner"}


def make_runner(options: PipelineOptions) -> PipelineRunner | str:
    """A runner instance for local and Dask runs; other names go to Beam unchanged."""
    name = options.view_as(StandardOptions).runner
    key = (name or "").lower()
    if key in LOCAL_RUNNERS:
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
    return fn_runner.FnApiRunner(provision_info=provision)

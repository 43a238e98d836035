"""``ShardIterableDataset`` from S3 under a real ``DataLoader`` with 2 workers, 3 epochs, through
object-store faults (issue 27).

Run by ``scripts/test_lerobot_interop.sh`` inside ``.venv-lerobot`` (CPU torch). A moto server on
loopback stands for the object store, behind the project's fault-injecting proxy
(``tests/s3_proxy.py``): one request in ten is answered 503 SlowDown, 500 or 429, dropped before
or after it reached the store, or cut off midway. Each epoch the loader must deliver exactly the
samples it delivers with no fault. The workers start with ``spawn``, as a job reading an object
store should (the AWS SDK under pyarrow is not fork-safe).
"""

from __future__ import annotations

import collections
import os
import sys
from pathlib import Path

import numpy as np
import pyarrow.fs as pafs
import pytest
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the proxy
from s3_proxy import RecordingProxy, Schedule, start_moto

from shardfeed import write_dataset
from shardfeed.torch import ShardIterableDataset

pytest.importorskip("moto.server")

N = 3000
FEATURES = {
    "id": {"dtype": "int64", "shape": [1], "names": None},
    "state": {"dtype": "float32", "shape": [8], "names": None},
    "caption": {"dtype": "string", "shape": [1], "names": None},
}
KINDS = ["slowdown", "internal", "throttle", "drop_before", "drop_after", "truncate"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A dataset on a moto server, and the proxy in front of it; AWS variables point there."""
    server, host, direct = start_moto()
    proxy = RecordingProxy(host).start()
    root = tmp_path_factory.mktemp("s3-torch") / "ds"
    rng = np.random.default_rng(1)
    write_dataset(
        root,
        FEATURES,
        {
            "id": np.arange(N, dtype=np.int64),
            "state": rng.normal(size=(N, 8)).astype(np.float32),
            "caption": [f"sample {i}" for i in range(N)],
        },
        target_shard_size="24KB",
        row_group_size="6KB",
    )
    pafs.copy_files(str(root), "bucket/ds", pafs.LocalFileSystem(), direct)
    scratch = tmp_path_factory.mktemp("aws")
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": str(scratch / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(scratch / "none"),
        "AWS_ENDPOINT_URL": f"http://{proxy.host}",
        "SHARDFEED_IO_BACKOFF": "0.01",
    }
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)  # the spawned workers inherit them
    yield proxy
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    proxy.stop()
    server.stop()


def epoch_ids(epoch: int) -> list[int]:
    ds = ShardIterableDataset("s3://bucket/ds", batch_size=50, rank=0, world=1, seed=3)
    ds.set_epoch(epoch)
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    return [int(i) for batch in loader for i in batch["id"].tolist()]


def test_two_workers_three_epochs_deliver_the_same_samples_through_faults(served):
    proxy = served
    clean = [epoch_ids(epoch) for epoch in range(3)]
    for ids in clean:
        assert set(ids) == set(range(N))
    proxy.injected.clear()
    proxy.hook = Schedule(KINDS, period=10)
    try:
        faulted = [epoch_ids(epoch) for epoch in range(3)]
    finally:
        proxy.hook = None
    for want, got in zip(clean, faulted, strict=True):
        assert collections.Counter(got) == collections.Counter(want)
    assert {kind for kind, _ in proxy.injected} == set(KINDS)

"""``convert`` on a Dask cluster with SRC and DST on S3 and no file system shared with the driver.

A moto server on loopback stands for the object store, behind a recording proxy
(``s3_proxy.py``) that tells the driver's requests from the workers'. Two Nanny workers run in
their own processes, each with its own private ``TMPDIR`` and Dask directory; SRC exists only on
S3. The published dataset must equal, object for object, the same conversion into a local
directory; the driver sends only ``meta/`` and the manifest; shards bigger than the (lowered)
part size go up as multipart uploads; a worker killed in the middle of one is ridden out, and a
run that fails of it is completed by the next run with nothing left behind.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import random
import signal
import sys
import time

import pyarrow.fs as pafs
import pytest
from conftest import aws_test_env, s3_tree, tree_bytes
from s3_proxy import RecordingProxy, Request, WriteSchedule, client_pid

from shardfeed import open_dataset
from shardfeed.cli.main import main
from shardfeed.formats import object_upload
from shardfeed.formats.layout import LEASE_NAME
from shardfeed.formats.verify import verify_dataset
from shardfeed.schemas.manifest import MANIFEST_PATH

pytest.importorskip("apache_beam")
pytest.importorskip("moto.server")
distributed = pytest.importorskip("distributed")
cloudpickle = pytest.importorskip("cloudpickle")

PART = 5 * 1024 * 1024  # S3's smallest part: every shard here is sent in two or three parts
CONVERT = ["--target-shard-size", "9MB", "--row-group-size", "1MB", "--shuffle-seed", "7"]
HOT = ["--hot-budget", "9MB"]  # one hot shard; the weights file is in a directory of the driver's


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """About 24 MB of JSONL in three files, hard to compress, with one bad line."""
    root = tmp_path_factory.mktemp("jsonl") / "corpus"
    root.mkdir()
    rng = random.Random(3)
    for part in range(3):
        lines = [
            json.dumps(
                {"id": f"{part}-{i}", "text": base64.b64encode(rng.randbytes(6000)).decode()}
            )
            for i in range(1000)
        ]
        if part == 2:
            lines.insert(5, '{"id": "broken"')
        (root / f"part-{part}.jsonl").write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> str:
    """Hot weights for the records of part-0 and part-1, a file only the driver can see."""
    path = tmp_path_factory.mktemp("driver-only") / "weights.csv"
    rows = [f"part-{i % 2}.jsonl#line:{i // 2 + 1},{1 + i % 11}" for i in range(2000)]
    path.write_text("key,weight\n" + "\n".join(rows) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def reference(corpus, weights, tmp_path_factory):
    """The same conversion into a local directory, in this process (DirectRunner)."""
    dst = tmp_path_factory.mktemp("ref") / "ds"
    assert main(["convert", str(corpus), str(dst), *CONVERT, *HOT, "--hot-weights", weights]) == 0
    assert open_dataset(dst).manifest.hot_shards == 1
    return tree_bytes(dst)


@pytest.fixture(scope="module")
def aws_env(proxy, tmp_path_factory):
    """This process speaks to S3 through the proxy, with test credentials."""
    env = aws_test_env(tmp_path_factory.mktemp("aws"), f"http://{proxy.host}")
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        yield env


@pytest.fixture(scope="module")
def s3_corpus(s3, corpus, aws_env):
    """SRC on S3 only: the workers never see the local copy it was sent from."""
    fs = s3[0]
    pafs.copy_files(
        str(corpus), "bucket/dask-src/corpus", pafs.LocalFileSystem(), destination_filesystem=fs
    )
    return "s3://bucket/dask-src/corpus"


def _cluster(tmp_path_factory, aws_env: dict[str, str], allowed_failures: int):
    """Two Nanny workers (own processes), each with its own private temporary directory and the
    lowered part size; the scheduler runs here."""
    import dask
    from distributed import Nanny, Scheduler, SpecCluster

    private = {}
    workers = {}
    for name in ("w0", "w1"):
        own = tmp_path_factory.mktemp(f"private-{name}")
        private[name] = str(own)
        env = {**aws_env, "TMPDIR": str(own), "SHARDFEED_S3_PART_SIZE": str(PART)}
        options = {"nthreads": 1, "env": env, "local_directory": str(own / "dask")}
        workers[name] = {"cls": Nanny, "options": options}
    config = {"distributed.scheduler.allowed-failures": allowed_failures}
    with dask.config.set(config):
        cluster = SpecCluster(
            scheduler={"cls": Scheduler, "options": {"dashboard_address": None}},
            workers=workers,
        )
    return cluster, private


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, aws_env):
    cluster, private = _cluster(tmp_path_factory, aws_env, allowed_failures=3)
    with cluster:
        yield cluster, private


def _convert(src: str, dst: str, address: str, weights: str, *extra: str) -> int:
    hot = [*HOT, "--hot-weights", weights]
    return main(["convert", src, dst, *CONVERT, *hot, "--dask-address", address, *extra])


def _multipart_uploads(fs: pafs.FileSystem, prefix: str) -> list:
    client = object_upload.s3_client(fs)
    return client.list_multipart_uploads(Bucket="bucket", Prefix=prefix).get("Uploads", [])


def _watch_paths(root: str, own: str, dask_dirs: tuple[str, ...]) -> None:
    """In a worker: log every file-system call under ``root`` (the test's temporary tree) outside
    ``own`` (the worker's private directory) and Dask's own workspaces (``dask_dirs``, which
    Dask's workers scan for each other's leftovers); mkdirs inside ``own`` are kept."""
    events = {"open", "os.mkdir", "os.rename", "os.remove", "os.listdir", "os.scandir"}
    log: dict[str, list] = {"outside": [], "own_mkdirs": []}

    def hook(event: str, args: tuple) -> None:
        if event in events and args and isinstance(args[0], str):
            path = os.path.abspath(args[0])
            if path.startswith(own):
                if event == "os.mkdir":
                    log["own_mkdirs"].append(path)
            elif path.startswith(root) and not path.startswith(dask_dirs):
                log["outside"].append((event, path))

    sys.addaudithook(hook)
    sys.modules["_shardfeed_path_log"] = log  # type: ignore[assignment]


def _path_log() -> dict:
    return dict(sys.modules["_shardfeed_path_log"])  # type: ignore[arg-type]


@contextlib.contextmanager
def _client(address: str):
    from distributed import Client

    with Client(address, set_as_default=False) as client:
        yield client


def test_workers_write_straight_to_s3_and_the_driver_sends_only_meta(
    s3, s3_corpus, weights, reference, cluster, proxy, tmp_path_factory, capsys
):
    fs = s3[0]
    cluster, private = cluster
    root = str(tmp_path_factory.getbasetemp())
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with _client(cluster.scheduler_address) as client:
        for worker, name in client.run(lambda dask_worker: dask_worker.name).items():
            dask_dirs = tuple(os.path.join(p, "dask") for p in private.values())
            client.run(_watch_paths, root, private[name], dask_dirs, workers=[worker])
    proxy.clear()
    assert (
        _convert(s3_corpus, "s3://bucket/dask/ds", cluster.scheduler_address, weights, "--json")
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert summary["samples_out"] == 3000 and summary["shards"] >= 2

    # every object equals the local conversion's; nothing else is left (work dir, uploads)
    assert s3_tree(fs, "dask/ds") == reference
    assert _multipart_uploads(fs, "dask/") == []
    assert verify_dataset("s3://bucket/dask/ds").ok
    assert main(["verify", "s3://bucket/dask/ds"]) == 0
    assert len(open_dataset("s3://bucket/dask/ds")) == 3000

    # the driver sent only meta/ and the manifest; the shards came from the workers, in parts
    writes = [  # bodies that are data: a bulk delete's body only names keys
        r for r in proxy.requests if r.method in ("PUT", "POST") and r.sent and r.query != "delete"
    ]
    driver = [r for r in writes if r.from_driver]
    leases = [r for r in driver if r.key == f"dask/ds/{LEASE_NAME}"]  # taken, renewed: no data
    assert leases and all(r.sent < 1024 for r in leases)
    driver = [r for r in driver if r not in leases]
    inputs = [r for r in driver if r.key.startswith("dask/ds/.shardfeed-work/")]
    # besides meta/, the driver sends only the one input the workers cannot reach: the weights
    assert [r.key for r in inputs] == ["dask/ds/.shardfeed-work/hot-weights/weights.csv"]
    driver = [r for r in driver if r not in inputs]
    assert driver and all(r.key.startswith("dask/ds/meta/") for r in driver)
    assert driver[-1].key == f"dask/ds/{MANIFEST_PATH}"
    worker_keys = {r.key for r in writes if not r.from_driver}
    shards = [k for k in reference if k.startswith("data/")]
    assert {f"dask/ds/{k}" for k in shards} <= worker_keys
    assert sum(r.sent for r in driver) < min(len(reference[k]) for k in shards)
    parts = [r for r in writes if not r.from_driver and "partNumber=" in r.query]
    multipart = {r.key for r in parts if r.key.startswith("dask/ds/data/")}
    assert multipart == {f"dask/ds/{k}" for k in shards}  # every shard is over one part

    # no worker touched a path of the driver's (the corpus, the weights file, the reference, the
    # other worker's directory)
    with _client(cluster.scheduler_address) as client:
        logs = client.run(_path_log)
    assert [log["outside"] for log in logs.values()] == [[], []]
    built = [path for log in logs.values() for path in log["own_mkdirs"] if path.endswith("/data")]
    assert len(built) >= len(shards)  # each shard was built in its worker's own TMPDIR


def test_multipart_shards_carry_their_sha256(s3, s3_corpus, weights, reference, cluster):
    """The shards of the previous run went up in parts (ETag ``...-N``); each object's bytes hash
    to the manifest's sha256."""
    fs = s3[0]
    cluster, _ = cluster
    dst = "s3://bucket/dask/ds"
    if MANIFEST_PATH not in s3_tree(fs, "dask/ds"):
        assert _convert(s3_corpus, dst, cluster.scheduler_address, weights) == 0
    client = object_upload.s3_client(fs)
    manifest = open_dataset(dst).manifest
    shards = manifest.shards
    assert shards
    for record in shards:
        head = client.head_object(Bucket="bucket", Key=f"dask/ds/{record.path}")
        assert head["ETag"].strip('"').endswith(f"-{-(-record.bytes // PART)}")
        body = client.get_object(Bucket="bucket", Key=f"dask/ds/{record.path}")["Body"].read()
        assert len(body) == record.bytes > PART
        assert hashlib.sha256(body).hexdigest() == record.sha256
        assert body == reference[record.path]


def _kill_on_part(proxy: RecordingProxy, times: int) -> list[int]:
    """Make the proxy SIGKILL the worker sending a second part of a shard, ``times`` times."""
    killed: list[int] = []

    def hook(request: Request, port: int) -> bool:
        if len(killed) >= times or request.from_driver or "partNumber=2" not in request.query:
            return True
        pid = None
        # the socket's owner, read from /proc, can lag behind the request: up to 2 s (0.2 s
        # missed every part of a run once, under the full suite's load)
        for _ in range(100):
            pid = client_pid(port)
            if pid is not None:
                break
            time.sleep(0.02)
        if pid is None or pid == os.getpid():
            return True
        killed.append(pid)
        os.kill(pid, signal.SIGKILL)
        return False  # the request dies with its sender

    proxy.hook = hook
    return killed


def test_a_worker_killed_while_uploading_is_ridden_out(
    s3, s3_corpus, weights, reference, cluster, proxy
):
    fs = s3[0]
    cluster, _ = cluster
    killed = _kill_on_part(proxy, times=1)
    try:
        assert _convert(s3_corpus, "s3://bucket/killed/ds", cluster.scheduler_address, weights) == 0
    finally:
        proxy.hook = None
    assert len(killed) == 1
    assert s3_tree(fs, "killed/ds") == reference
    assert _multipart_uploads(fs, "killed/") == []  # the killed worker's upload was aborted


def test_a_run_failed_by_a_killed_uploader_is_completed_by_the_next(
    s3, s3_corpus, weights, reference, proxy, aws_env, tmp_path_factory, capsys
):
    """With no task retries, killing an uploading worker fails the run: no manifest is
    published, the half-sent upload stays; the next run (no ``--overwrite``) takes DST over and
    leaves exactly the local conversion's objects."""
    fs = s3[0]
    cluster, _ = _cluster(tmp_path_factory, aws_env, allowed_failures=0)
    with cluster:
        killed = _kill_on_part(proxy, times=1)
        try:
            assert (
                _convert(s3_corpus, "s3://bucket/failed/ds", cluster.scheduler_address, weights)
                == 1
            )
        finally:
            proxy.hook = None
        assert len(killed) == 1
        err = capsys.readouterr().err
        assert "the Dask cluster failed (KilledWorker" in err and "Traceback" not in err
        left = s3_tree(fs, "failed/ds")
        assert MANIFEST_PATH not in left and any(k.startswith(".shardfeed-work/") for k in left)
        assert _multipart_uploads(fs, "failed/")  # the killed worker's, never completed
        assert _convert(s3_corpus, "s3://bucket/failed/ds", cluster.scheduler_address, weights) == 0
    assert s3_tree(fs, "failed/ds") == reference
    assert _multipart_uploads(fs, "failed/") == []


def test_the_cluster_rides_out_object_store_faults(
    s3, s3_corpus, weights, reference, cluster, proxy, monkeypatch
):
    """Workers and driver through one failed request in ten (SlowDown, 500, 429, connections
    dropped before and after the store, bodies cut off midway, answers later than the client
    waits) and every other multipart
    complete answered 200 with an error body: the published objects are the local run's."""
    from shardfeed.formats import retry

    monkeypatch.setenv(retry.BACKOFF_ENV, "0.01")  # the driver's; the workers keep the default
    monkeypatch.setenv(retry.TIMEOUT_ENV, "1")  # pickled with the filesystems the workers get
    fs = s3[0]
    cluster, _ = cluster
    kinds = ["slowdown", "internal", "throttle", "drop_before", "drop_after", "truncate", "slow"]
    proxy.hook = WriteSchedule(kinds, period=10)
    proxy.injected.clear()
    try:
        assert _convert(s3_corpus, "s3://bucket/faulty/ds", cluster.scheduler_address, weights) == 0
    finally:
        proxy.hook = None
    assert {kind for kind, _ in proxy.injected} >= {"complete_200_error", *kinds}
    assert s3_tree(fs, "faulty/ds") == reference
    assert _multipart_uploads(fs, "faulty/") == []

"""Object-store I/O that rides out throttling and dropped connections (``formats/retry.py``,
``formats/retrying_fs.py``), against a moto server behind a fault-injecting proxy on loopback.

The proxy answers a fixed share of requests with ``503 SlowDown``, ``500 InternalError`` or
``429``, drops connections before and after the request reached the store, cuts bodies off midway
and answers late. Every reader-side path must still deliver the exact bytes; with the faults made
permanent, it must fail within its bounded time with one line naming the object and the
attempts, and never call a healthy shard corrupt.
"""

from __future__ import annotations

import itertools
import os

import numpy as np
import pyarrow.fs as pafs
import pytest
from conftest import aws_test_env, s3_tree, tree_bytes
from s3_proxy import FAULTS, RecordingProxy, Request, Schedule, WriteSchedule, s3_filesystem

from shardfeed import open_dataset, write_dataset
from shardfeed.formats import object_upload, retry
from shardfeed.formats.retry import (
    ObjectStoreIOError,
    RetryPolicy,
    ShortReadError,
    is_transient,
    retried,
)
from shardfeed.formats.retrying_fs import retrying, unwrap
from shardfeed.formats.verify import verify_dataset
from shardfeed.loader import ShardLoader

pytest.importorskip("moto.server")

FEATURES = {
    "x": {"dtype": "float32", "shape": [4], "names": None},
    "label": {"dtype": "int64", "shape": [1], "names": None},
    "text": {"dtype": "string", "shape": [1], "names": None},
}
READ_FAULTS = [f for f in FAULTS if f != "complete_200_error"]  # a read has no multipart complete


# --------------------------------------------------------------------------------------------
# the policy, without a server


@pytest.mark.parametrize(
    "err",
    [
        OSError(
            "AWS Error INTERNAL_FAILURE during GetObject operation: Failed to flush response "
            "stream (eof: 0, bad: 1)"
        ),
        OSError(
            "AWS Error SLOW_DOWN during HeadObject operation: Please reduce your request rate."
        ),
        OSError("When reading information for key 'a' in bucket 'b': AWS Error NETWORK_CONNECTION"),
        OSError("curlCode: 28, Timeout was reached"),
        OSError(
            "AWS Error UNKNOWN (HTTP status 503) during HeadObject operation: No response body."
        ),
        ConnectionResetError(104, "Connection reset by peer"),
        TimeoutError("read timed out"),
        ShortReadError("got 3 of 8 bytes"),
    ],
)
def test_transient_errors(err):
    assert is_transient(err)


@pytest.mark.parametrize(
    "err",
    [
        FileNotFoundError("no such key"),
        PermissionError("denied"),
        OSError("AWS Error ACCESS_DENIED during GetObject operation: Access Denied"),
        ValueError("bad argument"),
        OSError("Parquet magic bytes not found in footer"),
    ],
)
def test_permanent_errors(err):
    assert not is_transient(err)


def test_retried_gives_up_in_one_line_naming_the_object_and_attempts():
    calls = []

    def always_slow():
        calls.append(1)
        raise OSError("AWS Error SLOW_DOWN during GetObject operation: reduce your request rate")

    slept = []
    with pytest.raises(ObjectStoreIOError) as caught:
        retried(
            always_slow, "read s3://b/k bytes 0-7", RetryPolicy(4, 60.0, 0.01), sleep=slept.append
        )
    message = str(caught.value)
    assert len(calls) == 4 and len(slept) == 3 and "\n" not in message
    assert message.startswith("read s3://b/k bytes 0-7: failed after 4 attempt(s)")
    assert "SLOW_DOWN" in message
    assert all(0 <= s <= 0.01 * 2**i for i, s in enumerate(slept))  # full jitter, doubling caps


def test_retried_stops_at_its_time_budget_and_raises_permanent_errors_at_once():
    clock = itertools.count()
    with pytest.raises(ObjectStoreIOError, match="failed after 1 attempt"):
        retried(
            lambda: (_ for _ in ()).throw(TimeoutError("slow")),
            "head s3://b/k",
            RetryPolicy(100, 0.0, 1.0),  # no time for a second attempt
            sleep=lambda s: next(clock),
        )
    with pytest.raises(FileNotFoundError):
        retried(lambda: (_ for _ in ()).throw(FileNotFoundError("k")), "x", RetryPolicy())


def test_the_environment_sets_the_policy(monkeypatch):
    monkeypatch.setenv(retry.ATTEMPTS_ENV, "3")
    monkeypatch.setenv(retry.SECONDS_ENV, "7.5")
    monkeypatch.setenv(retry.BACKOFF_ENV, "0.5")
    assert RetryPolicy.from_env() == RetryPolicy(3, 7.5, 0.5)
    monkeypatch.setenv(retry.ATTEMPTS_ENV, "0")
    with pytest.raises(retry.ShardfeedError, match="SHARDFEED_IO_ATTEMPTS=0 is outside"):
        RetryPolicy.from_env()


# --------------------------------------------------------------------------------------------
# through the fault-injecting proxy


@pytest.fixture(scope="module")
def dataset_on_s3(s3, tmp_path_factory):
    """A small dataset written locally, then sent to S3 fault-free; its local copy."""
    rng = np.random.default_rng(5)
    n = 600
    data = {
        "x": rng.normal(size=(n, 4)).astype(np.float32),
        "label": np.arange(n),
        "text": [f"t{i}" for i in range(n)],
    }
    root = tmp_path_factory.mktemp("faults") / "ds"
    write_dataset(root, FEATURES, data, target_shard_size="8KB", row_group_size="2KB")
    fs = s3[0]
    pafs.copy_files(str(root), "bucket/faults/ds", pafs.LocalFileSystem(), fs)
    return root


def _through(proxy: RecordingProxy) -> pafs.S3FileSystem:
    """A client of the proxy whose requests time out well before a slow answer comes."""
    return s3_filesystem(
        proxy.host,
        request_timeout=1.0,
        connect_timeout=1.0,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1),  # ours alone
    )


@pytest.fixture
def fast_retries(monkeypatch):
    monkeypatch.setenv(retry.BACKOFF_ENV, "0.01")


def test_reads_ride_out_every_kind_of_fault(proxy, dataset_on_s3, fast_retries):
    """A fault on one request in five, every kind in turn: open, verify and read every sample;
    the bytes are exactly the local copy's."""
    schedule = Schedule(READ_FAULTS, period=5)
    proxy.hook = schedule
    proxy.injected.clear()
    before = retry.retry_counts().get("retries", 0)
    try:
        fs = retrying(_through(proxy))
        ds = open_dataset("s3://bucket/faults/ds", filesystem=fs)
        report = verify_dataset("s3://bucket/faults/ds", filesystem=fs)
        got = ds.read(0, len(ds))
        fresh = open_dataset("s3://bucket/faults/ds", filesystem=fs)  # no handle open yet
        loader = ShardLoader(fresh, rank=0, world=1, batch_size=100)
        labels = [int(v) for batch in loader for v in batch["label"]]
        loader_retries = loader.metrics()["io_retries"]
    finally:
        proxy.hook = None
    assert report.ok and report.io_retries > 0, report
    assert sorted(labels) == list(range(len(ds))) and loader_retries > 0
    want = open_dataset(dataset_on_s3).read(0, len(ds))
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(want[name]))
    kinds = {kind for kind, _ in proxy.injected}
    assert kinds == set(READ_FAULTS)  # each kind was injected at least once
    assert retry.retry_counts()["retries"] > before  # some faults got past the SDK's retries


def test_without_the_retry_layer_the_same_faults_break_the_reads(proxy, dataset_on_s3, monkeypatch):
    """What the layer is for: the AWS SDK's own retries do not ride these faults out (a SlowDown
    on a small ranged read fails as INTERNAL_FAILURE, a cut body is not retried)."""
    from shardfeed.formats import storage

    monkeypatch.setattr(storage, "retrying", lambda fs: fs)
    proxy.hook = Schedule(READ_FAULTS, period=5)
    try:
        fs = _through(proxy)
        with pytest.raises(Exception) as caught:
            ds = open_dataset("s3://bucket/faults/ds", filesystem=fs)
            assert verify_dataset("s3://bucket/faults/ds", filesystem=fs).ok
            ds.read(0, len(ds))
    finally:
        proxy.hook = None
    assert not isinstance(caught.value, AssertionError), caught.value


def test_permanent_faults_fail_in_one_line_and_nothing_is_called_corrupt(
    proxy, dataset_on_s3, monkeypatch
):
    monkeypatch.setenv(retry.ATTEMPTS_ENV, "3")
    monkeypatch.setenv(retry.BACKOFF_ENV, "0.01")
    fs = retrying(_through(proxy))
    ds = open_dataset("s3://bucket/faults/ds", filesystem=fs)
    proxy.hook = lambda request, port: "slowdown"
    try:
        with pytest.raises(ObjectStoreIOError) as caught:
            ds.read(0, len(ds))
    finally:
        proxy.hook = None
    message = str(caught.value)
    assert "failed after 3 attempt(s)" in message and "s3://bucket/faults/ds/" in message
    assert "corrupt" not in message.lower()
    # only the shards' reads fail: verify says IO, never BAD; the loader raises the I/O error
    proxy.hook = lambda request, port: "slowdown" if "/data/" in request.key else None
    try:
        report = verify_dataset("s3://bucket/faults/ds", filesystem=fs)
        with pytest.raises(ObjectStoreIOError):
            list(ShardLoader(ds, rank=0, world=1, batch_size=50))
    finally:
        proxy.hook = None
    assert report.problems and {p.kind for p in report.problems} == {"io"}


def test_the_wrapper_keeps_the_filesystem_it_wraps(s3):
    fs = s3[0]
    wrapped = retrying(fs)
    assert retrying(wrapped) is wrapped and unwrap(wrapped) is fs
    assert retrying(pafs.LocalFileSystem()).type_name == "local"
    import pickle

    again = pickle.loads(pickle.dumps(wrapped))
    assert unwrap(again).equals(fs)


# --------------------------------------------------------------------------------------------
# convert and the reader-side commands through faults


@pytest.fixture
def via_proxy(proxy, monkeypatch, tmp_path):
    """Every command of this process reaches S3 through the proxy, with fast retries."""
    env = aws_test_env(tmp_path, f"http://{proxy.host}")
    env[retry.BACKOFF_ENV] = "0.01"
    env[retry.TIMEOUT_ENV] = "1"  # well before the proxy's slow answers
    env[object_upload.PART_SIZE_ENV] = str(object_upload.MIN_PART_SIZE)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return proxy


def test_convert_and_the_commands_ride_out_faults(via_proxy, s3, tmp_path, capsys):
    """local -> s3 and s3 -> s3 conversions (shards in two parts each) through one fault in ten
    of every kind: byte-identical to the local conversion; then inspect,
    verify, assign and the loader read the result through the same faults."""
    import base64
    import json
    import random

    from shardfeed.cli.main import main

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = random.Random(9)
    for part in range(2):
        lines = [
            json.dumps(
                {"id": f"{part}-{i}", "text": base64.b64encode(rng.randbytes(4000)).decode()}
            )
            for i in range(1200)
        ]
        (corpus / f"part-{part}.jsonl").write_text("\n".join(lines) + "\n")
    args = ["--target-shard-size", "6MB", "--row-group-size", "1MB"]
    assert main(["convert", str(corpus), str(tmp_path / "ref"), *args]) == 0
    reference = tree_bytes(tmp_path / "ref")
    fs = s3[0]
    pafs.copy_files(str(corpus), "bucket/faults/src/corpus", pafs.LocalFileSystem(), fs)
    schedule = WriteSchedule(READ_FAULTS, period=10)
    via_proxy.hook = schedule
    via_proxy.injected.clear()
    try:
        assert main(["convert", str(corpus), "s3://bucket/faults/l2s", *args]) == 0
        assert (
            main(["convert", "s3://bucket/faults/src/corpus", "s3://bucket/faults/s2s", *args]) == 0
        )
        capsys.readouterr()
        for command in (["inspect", "--json"], ["verify", "--json"]):
            assert main([command[0], "s3://bucket/faults/l2s", *command[1:]]) == 0
        world = ["--nodes", "1", "--gpus-per-node", "2", "--name", "run"]
        assert main(["assign", "s3://bucket/faults/l2s", *world]) == 0
        seen = []
        for rank in range(2):
            loader = ShardLoader("s3://bucket/faults/l2s", rank=rank, world=2, batch_size=50)
            seen.extend(i for batch in loader for i in batch["id"])
    finally:
        via_proxy.hook = None
    kinds = {kind for kind, _ in via_proxy.injected}
    assert kinds >= {
        "complete_200_error",
        "slowdown",
        "internal",
        "throttle",
        "drop_before",
        "slow",
    }
    for prefix in ("faults/l2s", "faults/s2s"):
        tree = s3_tree(fs, prefix)
        tree = {k: v for k, v in tree.items() if not k.startswith("meta/shardfeed/assignments/")}
        assert tree == reference, prefix
    assert sorted(seen) == sorted(f"{p}-{i}" for p in range(2) for i in range(1200))


def test_a_complete_whose_answer_was_lost_counts_as_done(proxy, monkeypatch):
    """The store completed the upload but the answer never came: the retry hears NoSuchUpload,
    and the object's ETag (md5 of the parts' md5s) shows the first attempt made it."""
    import hashlib
    import io

    monkeypatch.setenv(object_upload.PART_SIZE_ENV, str(object_upload.MIN_PART_SIZE))
    monkeypatch.setenv(retry.BACKOFF_ENV, "0.01")
    lost = []

    def drop_first_complete(request: Request, port: int) -> str | None:
        if request.method == "POST" and "uploadId=" in request.query and not lost:
            lost.append(request)
            return "drop_after"
        return None

    data = os.urandom(object_upload.MIN_PART_SIZE + 1000)
    digest = hashlib.sha256(data).hexdigest()
    proxy.hook = drop_first_complete
    try:
        fs = _through(proxy)
        sent = object_upload.send(
            fs, io.BytesIO(data), "bucket/faults/lost.bin", len(data), (len(data), digest)
        )
    finally:
        proxy.hook = None
    assert lost and sent == (len(data), digest)
    with fs.open_input_stream("bucket/faults/lost.bin") as handle:
        assert handle.read() == data


def test_stage_and_warm_ride_out_faults(via_proxy, s3, tmp_path):
    """stage to an S3 tier, then stage and warm from the S3 copy as the source, through one
    failed request in five: every copy verifies."""
    from staging_fixtures import dataset, tiers_toml

    from shardfeed.staging import stage
    from shardfeed.warming import warm

    src = dataset(tmp_path / "faultds", n=120, hot_shards=2)
    config = tiers_toml(tmp_path)
    kinds = ["throttle", "truncate", "slowdown", "internal", "drop_before", "drop_after", "slow"]
    via_proxy.hook = WriteSchedule(kinds, period=5)
    via_proxy.injected.clear()
    try:
        first = stage(src, config, only=("cold",))
        remote = "s3://bucket/datasets/faultds"
        second = stage(remote, config, only=("pfs",))
        warmed = warm(remote, config, node_rank=0, nodes=1)
    finally:
        via_proxy.hook = None
    assert first.results[0].copied > 0 and second.results[0].copied > 0
    assert warmed.copied > 0
    assert len(via_proxy.injected) >= 5
    assert verify_dataset(remote, filesystem=s3[0]).ok
    assert verify_dataset(tmp_path / "pfs" / "faultds").ok


def _every(request: Request, port: int) -> str:
    return "slowdown"


def _writes_under(prefix: str):
    """503 for every write (a put, a part, a start or complete of an upload) under ``prefix``."""

    def hook(request: Request, port: int) -> str | None:
        writing = request.method in ("PUT", "POST") and request.key.startswith(prefix)
        return "slowdown" if writing else None

    return hook


def _shard_reads(request: Request, port: int) -> str | None:
    return "slowdown" if request.method == "GET" and "/data/" in request.key else None


@pytest.mark.parametrize(
    "command",
    [
        "inspect",
        "verify",
        "assign",
        "convert",
        "convert-shards",
        "convert-workers",
        "stage",
        "warm",
    ],
)
def test_permanent_faults_end_each_command_in_one_line(
    via_proxy, s3, dataset_on_s3, tmp_path, monkeypatch, capsys, command
):
    """Every request answered 503 (or, mid-run: every shard a conversion's workers send, every
    write of a stage, every shard read of a warm): the command fails within its bounded time,
    with one line naming the object and the attempts; no traceback, nothing published."""
    from staging_fixtures import tiers_toml

    from shardfeed.cli.main import main

    monkeypatch.delenv(retry.ATTEMPTS_ENV, raising=False)  # the flag sets it, for workers too
    ds = "s3://bucket/faults/ds"
    world = ["--nodes", "1", "--gpus-per-node", "1", "--name", "never"]
    src = str(dataset_on_s3 / "data")
    tiers = ["--tiers", str(tiers_toml(tmp_path))]
    workers = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]
    argv, hook = {
        "inspect": (["inspect", ds], _every),
        "verify": (["verify", ds], _every),
        "assign": (["assign", ds, *world], _every),
        "convert": (["convert", src, "s3://bucket/faults/never", "--from", "parquet"], _every),
        "convert-shards": (
            ["convert", src, "s3://bucket/faults/never2", "--from", "parquet"],
            _writes_under("faults/never2/data/"),
        ),
        "convert-workers": (  # SDK worker processes: Beam hands their error back as text
            ["convert", src, "s3://bucket/faults/never2", "--from", "parquet", *workers],
            _writes_under("faults/never2/data/"),
        ),
        "stage": (["stage", str(dataset_on_s3), *tiers, "--tier", "cold"], _writes_under("")),
        "warm": (
            ["warm", ds, *tiers, "--node-rank", "0", "--nodes", "1", "--assignment", "warmed"],
            _shard_reads,
        ),
    }[command]
    if command == "warm":  # the shards a node warms are those its assignment reads
        assert main(["assign", ds, "--nodes", "1", "--gpus-per-node", "1", "--name", "warmed"]) == 0
    via_proxy.hook = hook
    try:
        code = main(["--io-attempts", "2", *argv])
    finally:
        via_proxy.hook = None
    err = capsys.readouterr().err
    assert code != 0 and retry.ATTEMPTS_ENV not in os.environ
    lines = [line for line in err.splitlines() if line.startswith("shardfeed:")]
    assert len(lines) == 1 and "failed after 2 attempt(s)" in lines[0], err
    assert "s3://bucket/" in lines[0], lines[0]  # the object is named
    assert "Traceback" not in err and "corrupt" not in err.lower()
    fs = s3[0]
    for published in ("faults/never2", "datasets/ds"):
        manifest = f"bucket/{published}/meta/shardfeed/manifest.json"
        assert fs.get_file_info(manifest).type == pafs.FileType.NotFound
    nvme = tmp_path / "nvme"
    assert not nvme.exists() or not [p for p in nvme.rglob("*.parquet")]


def test_uris_give_clients_the_io_timeout(monkeypatch):
    """An answer that never comes fails its request in bounded time, to be retried: every
    filesystem a URI names has ``SHARDFEED_IO_TIMEOUT`` as its connect and request timeout."""
    from shardfeed.formats.storage import locate
    from shardfeed.formats.store_path import StorePath
    from shardfeed.staging import tier_target

    monkeypatch.setenv(retry.TIMEOUT_ENV, "2.5")
    uri = "s3://bucket/ds?endpoint_override=127.0.0.1:9&scheme=http"
    named = [
        locate(uri).filesystem,
        StorePath.of(uri).filesystem,
        tier_target(uri, None).filesystem,
    ]
    for filesystem in named:
        options = unwrap(filesystem).__reduce__()[1][0]
        assert (options["connect_timeout"], options["request_timeout"]) == (2.5, 2.5)
        assert options["endpoint_override"] == "127.0.0.1:9"


def test_streams_to_other_stores_are_sent_again_after_a_fault(
    proxy, monkeypatch, tmp_path, fast_retries
):
    """Stores without the boto3 sender (GCS, Azure) get whole objects through pyarrow's output
    streams, which cannot resume: a transient failure sends the object again from its start.
    Driven through S3's pyarrow stream with boto3 taken away and the SDK's own retries off."""
    import hashlib

    from shardfeed.formats import tier_copy
    from shardfeed.formats.storage import locate

    monkeypatch.setattr(object_upload, "s3_client", lambda filesystem: None)
    monkeypatch.setattr(tier_copy, "s3_client", lambda filesystem: None)
    fs = retrying(_through(proxy))
    data = os.urandom(300_000)
    (tmp_path / "blob.bin").write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    kinds = ["slowdown", "internal", "throttle", "drop_before", "drop_after"]
    writes_seen = itertools.count()

    def spaced_write_faults(request: Request, port: int) -> str | None:
        """Faults on the 1st, 3rd, 6th, 10th and 15th write: each stream (a start, parts and a
        complete) fails at least once, and a retry gets further before the next fault."""
        if request.method not in ("PUT", "POST"):
            return None
        n = next(writes_seen)
        return kinds[n % len(kinds)] if n in {0, 2, 5, 9, 14} else None

    proxy.hook = spaced_write_faults
    proxy.injected.clear()
    try:
        object_upload.upload_file(
            fs, str(tmp_path / "blob.bin"), "bucket/streams/sent.bin", (len(data), digest)
        )
        object_upload.put_bytes(fs, "bucket/streams/put.bin", data[:1000])
        target = tier_copy.Target("bucket/streams/tier", fs)
        tier_copy.copy_file(locate(tmp_path), target, "blob.bin", len(data), digest)
    finally:
        proxy.hook = None
    writes = [r for kind, r in proxy.injected if r.method in ("PUT", "POST")]
    assert len(writes) >= 3, proxy.injected
    want = {"sent.bin": data, "put.bin": data[:1000], "tier/blob.bin": data}
    for name, content in want.items():
        with fs.open_input_stream(f"bucket/streams/{name}") as handle:
            assert handle.read() == content, name


def test_a_dask_run_failed_by_the_store_prints_one_line(via_proxy, dataset_on_s3, tmp_path):
    """``convert --dask-local-workers 2`` as a user runs it, every shard upload answered 503:
    the whole terminal output (driver, scheduler, workers) is one line naming the object and
    the attempts; no traceback, no ``Compute Failed`` log, no cluster chatter."""
    import subprocess
    import sys

    pytest.importorskip("distributed")
    src, dst = str(dataset_on_s3 / "data"), "s3://bucket/faults/dasknever"
    argv = ["--io-attempts", "2", "convert", src, dst, "--from", "parquet"]
    via_proxy.hook = _writes_under("faults/dasknever/data/")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "shardfeed.cli.main", *argv, "--dask-local-workers", "2"],
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        via_proxy.hook = None
    assert proc.returncode == 1, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    noise = [line for line in lines if not line.startswith(("shardfeed:", "WARNING:"))]
    assert noise == [], proc.stderr  # Beam's import-time warnings aside
    errors = [line for line in lines if line.startswith("shardfeed:")]
    assert len(errors) == 1 and "failed after 2 attempt(s)" in errors[0], proc.stderr
    assert "s3://bucket/faults/dasknever/data/" in errors[0]

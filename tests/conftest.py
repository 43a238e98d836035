"""Shared fixtures: small multi-shard datasets built with the public writer."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardfeed import write_dataset
from shardfeed.schemas import Feature, FeatureSpec, Manifest

#: Four stored features covering a tensor, a scalar, a string and an image column.
SMALL_SPEC = FeatureSpec(
    (
        Feature("observation.state", "float32", (3,)),
        Feature("label", "int64"),
        Feature("caption", "string"),
        Feature("image", "image", (8, 8, 3)),
    )
)


@pytest.fixture(autouse=True)
def _root_log_handlers():
    """Beam's PipelineOptions calls ``logging.basicConfig()``, which binds a root handler to the
    stderr of the moment (a test's captured stream, closed after it); drop what a test added."""
    import logging

    root = logging.getLogger()
    before = list(root.handlers)
    yield
    root.handlers[:] = before


def small_data(n: int, seed: int = 0) -> dict[str, Any]:
    """Deterministic columns for SMALL_SPEC (about 30 payload bytes per row)."""
    rng = np.random.default_rng(seed)
    return {
        "observation.state": rng.normal(size=(n, 3)).astype(np.float32),
        "label": np.arange(n, dtype=np.int64) * 7 - 3,
        "caption": [f"row {i} \u00e9\u6f22" if i % 5 else "" for i in range(n)],
        "image": [bytes([i % 256]) * (i % 13) for i in range(n)],
    }


def tree_bytes(root: str | os.PathLike[str]) -> dict[str, bytes]:
    """Every file under ``root`` as {relative posix path: bytes}."""
    out = {}
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            full = os.path.join(dirpath, name)
            out[os.path.relpath(full, root).replace(os.sep, "/")] = Path(full).read_bytes()
    return out


def s3_tree(filesystem: Any, prefix: str) -> dict[str, bytes]:
    """Every object under ``bucket/prefix/`` as {relative key: bytes}."""
    import pyarrow.fs as pafs

    base = f"bucket/{prefix}/"
    selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
    out = {}
    for info in filesystem.get_file_info(selector):
        if info.type == pafs.FileType.File:
            with filesystem.open_input_stream(info.path) as handle:
                out[info.path[len(base) :]] = handle.read()
    return out


def aws_test_env(scratch: str | os.PathLike[str], endpoint: str | None) -> dict[str, str]:
    """The variables that point every AWS client of a process at a test server: test
    credentials, no instance metadata, no profile files (``scratch``: a directory for the
    absent ones), and ``endpoint`` (``http://host:port``) when given."""
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": os.path.join(scratch, "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": os.path.join(scratch, "no-aws-credentials"),
    }
    if endpoint is not None:
        env["AWS_ENDPOINT_URL"] = endpoint
    return env


@pytest.fixture
def make_small_dataset(
    tmp_path: Path,
) -> Callable[..., tuple[Path, Manifest, dict[str, Any]]]:
    """Factory: write a multi-shard dataset (4 shards, several row groups each) under tmp_path.

    Returns ``(root, manifest, data)``; keyword arguments go to ``write_dataset``.
    """

    def make(
        name: str = "ds", n: int = 120, seed: int = 0, **kwargs: Any
    ) -> tuple[Path, Manifest, dict[str, Any]]:
        root = tmp_path / name
        data = small_data(n, seed)
        kwargs.setdefault("target_shard_size", 900)
        kwargs.setdefault("row_group_size", 300)
        manifest = write_dataset(root, SMALL_SPEC, data, **kwargs)
        return root, manifest, data

    return make


@pytest.fixture
def small_dataset(make_small_dataset) -> tuple[Path, Manifest, dict[str, Any]]:
    """A fresh multi-shard dataset per test (tests may corrupt it freely)."""
    root, manifest, data = make_small_dataset()
    assert len(manifest.shards) >= 3, "fixture must be multi-shard"
    assert all(len(s.row_groups) >= 2 for s in manifest.shards), "fixture needs several row groups"
    return root, manifest, data


@pytest.fixture
def small_spec() -> FeatureSpec:
    return SMALL_SPEC


@pytest.fixture
def read_tree() -> Callable[[str | os.PathLike[str]], dict[str, bytes]]:
    """The ``tree_bytes`` helper, for byte-for-byte comparisons of whole datasets."""
    return tree_bytes


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on loopback with a bucket named ``bucket``: ``(filesystem, host:port)``.

    moto keeps its buckets per process, so every module's server sees the same objects: each
    test module writes under prefixes of its own."""
    pytest.importorskip("moto.server")
    from s3_proxy import start_moto

    server, host, fs = start_moto()
    yield fs, host
    server.stop()


@pytest.fixture(scope="module")
def proxy(s3):
    """A recording, fault-injecting proxy (``s3_proxy.py``) in front of the module's server."""
    from s3_proxy import RecordingProxy

    recording = RecordingProxy(s3[1]).start()
    yield recording
    recording.stop()

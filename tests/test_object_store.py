"""The reader and verifier over real S3 protocol: a moto server on loopback, reached via pyarrow.fs."""

from __future__ import annotations

import numpy as np
import pyarrow.fs as pafs
import pytest

from shardfeed import open_dataset, write_dataset
from shardfeed.formats.errors import IncompleteDatasetError
from shardfeed.formats.verify import verify_dataset

moto_server = pytest.importorskip("moto.server")

FEATURES = {
    "x": {"dtype": "float32", "shape": [4], "names": None},
    "label": {"dtype": "int64", "shape": [1], "names": None},
    "text": {"dtype": "string", "shape": [1], "names": None},
}


@pytest.fixture(scope="module")
def local_dataset(tmp_path_factory):
    rng = np.random.default_rng(3)
    n = 2000
    data = {
        "x": rng.normal(size=(n, 4)).astype(np.float32),
        "label": np.arange(n),
        "text": [f"t{i}" for i in range(n)],
    }
    root = tmp_path_factory.mktemp("s3src") / "ds"
    write_dataset(root, FEATURES, data, target_shard_size="20KB", row_group_size="4KB")
    return root, data


def _upload(fs: pafs.S3FileSystem, root, prefix: str) -> None:
    pafs.copy_files(
        str(root),
        f"bucket/{prefix}",
        source_filesystem=pafs.LocalFileSystem(),
        destination_filesystem=fs,
    )


def test_read_and_verify_over_s3(s3, local_dataset):
    fs, _ = s3
    root, data = local_dataset
    _upload(fs, root, "ds")
    ds = open_dataset("s3://bucket/ds", filesystem=fs)
    assert len(ds) == 2000 and len(ds.shards) >= 3
    batch = ds.read(100, 1500)
    np.testing.assert_array_equal(batch["x"], data["x"][100:1500])
    np.testing.assert_array_equal(ds.take([1999, 0, 777])["label"], [1999, 0, 777])
    assert ds[5]["text"] == "t5"
    report = verify_dataset("s3://bucket/ds", filesystem=fs)
    assert report.ok and report.shards_checked == len(ds.shards)


def test_uri_with_endpoint_needs_no_filesystem_object(s3, local_dataset, monkeypatch):
    fs, endpoint = s3
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    root, _data = local_dataset
    _upload(fs, root, "uri")
    uri = f"s3://bucket/uri?endpoint_override={endpoint}&scheme=http&region=us-east-1"
    ds = open_dataset(uri)
    np.testing.assert_array_equal(ds.read(0, 10)["label"], np.arange(10))


def test_tampered_object_is_caught_and_missing_manifest_refused(s3, local_dataset):
    fs, _ = s3
    root, _ = local_dataset
    _upload(fs, root, "tamper")
    shard = open_dataset("s3://bucket/tamper", filesystem=fs).shards[1].path
    with fs.open_input_file(f"bucket/tamper/{shard}") as handle:
        body = bytearray(handle.read())
    body[len(body) // 2] ^= 0xFF
    with fs.open_output_stream(f"bucket/tamper/{shard}") as out:
        out.write(bytes(body))
    report = verify_dataset("s3://bucket/tamper", filesystem=fs)
    assert [(p.path, p.kind) for p in report.problems] == [(shard, "hash")]
    fs.delete_file("bucket/tamper/meta/shardfeed/manifest.json")
    with pytest.raises(IncompleteDatasetError):
        open_dataset("s3://bucket/tamper", filesystem=fs)

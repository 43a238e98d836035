"""``convert`` with object-store SRC and DST, over real S3 protocol: a moto server on loopback.

Every command finds the server through ``AWS_ENDPOINT_URL`` (or ``convert --s3_endpoint_url``);
an S3 build must be byte-identical to the same conversion into a local directory.
"""

from __future__ import annotations

import io
import json
import os

import pyarrow.fs as pafs
import pytest
from conftest import aws_test_env, s3_tree, tree_bytes

from shardfeed import open_dataset
from shardfeed.cli.main import main
from shardfeed.formats import object_upload
from shardfeed.formats.errors import IncompleteDatasetError
from shardfeed.formats.object_publish import prepare_remote, source_name, with_endpoint
from shardfeed.formats.store_path import StorePath
from shardfeed.formats.tier_copy import Target
from shardfeed.formats.verify import verify_dataset
from shardfeed.pipelines.progress import WorkDirProgress
from shardfeed.schemas.manifest import MANIFEST_PATH

pytest.importorskip("apache_beam")
pytest.importorskip("moto.server")

ROWS = 240
CONVERT = ["--target-shard-size", "3KB", "--row-group-size", "1KB"]


@pytest.fixture
def aws(s3, monkeypatch, tmp_path):
    """Credentials and region from the usual AWS variables, and no endpoint yet."""
    for name, value in aws_test_env(tmp_path, None).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    return s3


@pytest.fixture
def endpoint(aws, monkeypatch):
    """``AWS_ENDPOINT_URL`` set: the only thing that tells the commands where S3 is."""
    fs, host = aws
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{host}")
    return fs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A small JSONL corpus in a directory named ``corpus``: two files, one bad line."""
    root = tmp_path_factory.mktemp("jsonl") / "corpus"
    root.mkdir()
    for part in range(2):
        lines = [
            json.dumps({"text": f"doc {part}-{i} " + "word " * (i % 17), "n": i, "ok": i % 3 == 0})
            for i in range(ROWS // 2)
        ]
        if part == 1:
            lines.insert(7, "{not json")
        (root / f"part-{part}.jsonl").write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    """The same conversion into a local directory: every S3 build must equal it byte for byte."""
    dst = tmp_path_factory.mktemp("ref") / "ds"
    assert main(["convert", str(corpus), str(dst), *CONVERT]) == 0
    return tree_bytes(dst)


def _upload_dir(fs: pafs.FileSystem, local, prefix: str) -> None:
    pafs.copy_files(
        str(local),
        f"bucket/{prefix}",
        source_filesystem=pafs.LocalFileSystem(),
        destination_filesystem=fs,
    )


def _convert(src: str, dst: str, tmp_path, *extra: str) -> int:
    return main(["convert", src, dst, *CONVERT, *extra])


def test_local_to_s3_then_inspect_verify_and_read(
    endpoint, corpus, reference, tmp_path, capsys, monkeypatch
):
    fs = endpoint
    sent = _record_uploads(monkeypatch)
    assert _convert(str(corpus), "s3://bucket/l2s", tmp_path, "--json") == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["dst"] == "s3://bucket/l2s" and summary["samples_out"] == ROWS
    assert s3_tree(fs, "l2s") == reference  # byte-identical; the work dir on S3 is gone
    # every file is sent once, straight to its key; the manifest last, the commit point
    assert sorted(sent) == sorted(reference) and sent[-1] == MANIFEST_PATH
    ds = open_dataset("s3://bucket/l2s")
    assert len(ds) == ROWS and len(ds.shards) >= 3
    assert sorted(ds.read(0, ROWS)["n"].tolist()) == sorted(list(range(ROWS // 2)) * 2)
    assert ds.manifest.provenance.source == "corpus"
    assert verify_dataset("s3://bucket/l2s").ok
    assert main(["verify", "s3://bucket/l2s", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    assert main(["inspect", "s3://bucket/l2s", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_samples"] == ROWS
    assert main(["rejects", "s3://bucket/l2s", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total"] == 1


def test_s3_to_local_autodetects_jsonl(endpoint, corpus, reference, tmp_path):
    _upload_dir(endpoint, corpus, "src/corpus")
    dst = tmp_path / "out"
    assert main(["convert", "s3://bucket/src/corpus", str(dst), *CONVERT]) == 0
    assert tree_bytes(dst) == reference


def test_s3_to_s3_with_beam_endpoint_flag_only(aws, corpus, reference, tmp_path):
    fs, host = aws
    _upload_dir(fs, corpus, "flag/corpus")
    assert "AWS_ENDPOINT_URL" not in os.environ
    argv = ["s3://bucket/flag/corpus", "s3://bucket/flag/ds", tmp_path]
    assert _convert(*argv, f"--s3_endpoint_url=http://{host}") == 0
    assert s3_tree(fs, "flag/ds") == reference
    uri = with_endpoint("s3://bucket/flag/ds", f"http://{host}")
    assert verify_dataset(uri).ok and len(open_dataset(uri)) == ROWS


def test_image_folder_from_s3(endpoint, tmp_path):
    from PIL import Image

    local = tmp_path / "images"
    for label in ("cat", "dog"):
        (local / label).mkdir(parents=True)
        for i in range(6):
            buffer = io.BytesIO()
            Image.new("RGB", (8 + i, 8), (i * 40, 0, 0)).save(buffer, format="PNG")
            (local / label / f"{i}.png").write_bytes(buffer.getvalue())
    _upload_dir(endpoint, local, "imgs")
    assert (
        main(["convert", "s3://bucket/imgs", str(tmp_path / "out"), "--target-shard-size", "1KB"])
        == 0
    )
    ds = open_dataset(tmp_path / "out")
    assert len(ds) == 12 and sorted(set(ds.read(0, 12)["label"].tolist())) == [0, 1]
    assert ds.manifest.provenance.source == "imgs"
    # header-only scans read heads with ranged reads; the images are the same ones
    header = ["--target-shard-size", "1KB", "--validate", "header"]
    assert main(["convert", "s3://bucket/imgs", str(tmp_path / "heads"), *header]) == 0

    def rows(dataset) -> list:
        got = dataset.read(0, 12)
        return sorted(zip(list(got["path"]), got["label"].tolist(), strict=True))

    assert rows(open_dataset(tmp_path / "heads")) == rows(ds)


def test_tfrecord_from_s3_equals_the_local_conversion(endpoint, tmp_path):
    """TFRecord files (plain and gzip, with a record failing its CRC) read from S3 give the same
    dataset as the same files read locally; an S3 file is never cut into pieces."""
    from shardfeed.formats.tf_example import encode_example
    from shardfeed.formats.tfrecord import write_records

    local = tmp_path / "tfr"
    local.mkdir()
    records = [
        encode_example({"id": ("int64", [i]), "text": ("bytes", [f"doc {i}".encode()])})
        for i in range(300)
    ]
    write_records(local / "a.tfrecord", records[:200])
    write_records(local / "b.tfrecord.gz", records[200:], compression="gzip")
    data = bytearray((local / "a.tfrecord").read_bytes())
    data[-10] ^= 0xFF  # the last record of a.tfrecord fails its data CRC
    (local / "a.tfrecord").write_bytes(bytes(data))
    _upload_dir(endpoint, local, "tfr")
    args = ["--target-shard-size", "4KB", "--max-reject-fraction", "0.1", "--task-size", "2KB"]
    assert main(["convert", "s3://bucket/tfr", str(tmp_path / "from-s3"), *args]) == 0
    assert main(["convert", str(local), str(tmp_path / "from-disk"), *args]) == 0
    ds = open_dataset(tmp_path / "from-s3")
    assert len(ds) == 299 and ds.manifest.rejects.total == 1
    got, want = tree_bytes(tmp_path / "from-s3"), tree_bytes(tmp_path / "from-disk")
    source_names = {"meta/info.json", "meta/shardfeed/manifest.json"}  # name the SRC given
    assert {k: v for k, v in got.items() if k not in source_names} == {
        k: v for k, v in want.items() if k not in source_names
    }


def test_lerobot_with_videos_from_s3_equals_the_local_conversion(endpoint, tmp_path):
    """A LeRobot v2.1 dataset with MP4s read from S3 (every source kind reads object stores now)
    gives the local conversion's dataset: videos cut from the objects, byte for byte."""
    from test_lerobot_videos import make_v21_with_videos

    local = make_v21_with_videos(tmp_path / "v21")
    _upload_dir(endpoint, local, "robot")
    args = ["--from", "lerobot", "--target-shard-size", "150B"]
    assert main(["convert", "s3://bucket/robot", str(tmp_path / "from-s3"), *args]) == 0
    assert main(["convert", str(local), str(tmp_path / "from-disk"), *args]) == 0
    got, want = tree_bytes(tmp_path / "from-s3"), tree_bytes(tmp_path / "from-disk")
    assert any(name.endswith(".mp4") for name in got)
    named = "meta/shardfeed/manifest.json"  # its provenance names the SRC given
    assert {k: v for k, v in got.items() if k != named} == {
        k: v for k, v in want.items() if k != named
    }


def test_failed_publish_leaves_no_manifest_and_a_rerun_completes(
    endpoint, corpus, reference, tmp_path, monkeypatch
):
    from shardfeed.pipelines import driver

    fs = endpoint
    real_commit = driver.commit_manifest

    def fail_on_manifest(dst, body, lease):
        raise OSError("simulated crash before the manifest upload")

    monkeypatch.setattr(driver, "commit_manifest", fail_on_manifest)
    assert _convert(str(corpus), "s3://bucket/crash", tmp_path) == 1
    left = s3_tree(fs, "crash")
    assert MANIFEST_PATH not in left and any(k.startswith("data/") for k in left)
    assert any(k.startswith(".shardfeed-work/") for k in left)
    with pytest.raises(IncompleteDatasetError):
        open_dataset("s3://bucket/crash")
    # a killed worker's unfinished multipart upload and a stale shard of another plan go
    client = object_upload.s3_client(fs)
    client.create_multipart_upload(Bucket="bucket", Key="crash/data/chunk-000/file-000.parquet")
    with fs.open_output_stream("bucket/crash/data/chunk-000/file-999.parquet") as out:
        out.write(b"stale")
    monkeypatch.setattr(driver, "commit_manifest", real_commit)
    assert _convert(str(corpus), "s3://bucket/crash", tmp_path) == 0  # no --overwrite needed
    assert s3_tree(fs, "crash") == reference
    assert client.list_multipart_uploads(Bucket="bucket", Prefix="crash/").get("Uploads", []) == []


def test_temp_location_holds_the_work_dir(endpoint, corpus, reference, tmp_path, monkeypatch):
    """``--temp_location`` moves the work files out of DST; they are removed after publishing."""
    scratch = tmp_path / "scratch"
    seen = []
    real = WorkDirProgress.__enter__

    def spy(self):
        seen.append(self.work)
        return real(self)

    monkeypatch.setattr(WorkDirProgress, "__enter__", spy)
    argv = [str(corpus), "s3://bucket/tl", tmp_path, "--temp_location", str(scratch)]
    assert _convert(*argv) == 0
    assert [str(w).startswith(str(scratch)) for w in seen] == [True]
    assert s3_tree(endpoint, "tl") == reference and not seen[0].exists()


def test_overwrite_refused_then_manifest_deleted_first(
    endpoint, corpus, reference, tmp_path, capsys
):
    fs = endpoint
    assert _convert(str(corpus), "s3://bucket/ow", tmp_path) == 0
    assert _convert(str(corpus), "s3://bucket/ow", tmp_path) == 1
    assert "already holds a dataset" in capsys.readouterr().err
    with fs.open_output_stream("bucket/ow/README.txt") as out:  # not the dataset's: kept
        out.write(b"mine")
    recording = _Recording(fs)
    prepare_remote(Target("bucket/ow", recording), overwrite=True)
    deleted = [path for op, path in recording.calls if op == "delete_file"]
    assert deleted[0] == f"bucket/ow/{MANIFEST_PATH}" and len(deleted) == len(reference)
    assert set(s3_tree(fs, "ow")) == {"README.txt"}
    assert _convert(str(corpus), "s3://bucket/ow", tmp_path, "--overwrite") == 0
    tree = s3_tree(fs, "ow")
    assert tree.pop("README.txt") == b"mine" and tree == reference


def test_refuses_a_prefix_holding_other_files(endpoint, corpus, tmp_path, capsys):
    with endpoint.open_output_stream("bucket/busy/notes.txt") as out:
        out.write(b"x")
    assert _convert(str(corpus), "s3://bucket/busy", tmp_path) == 1
    assert "already holds files" in capsys.readouterr().err


def test_names_and_endpoints():
    assert source_name("s3://bucket/a/corpus/?endpoint_override=h:1") == "corpus"
    assert source_name("s3://bucket") == "bucket"
    assert source_name("/x/y/") == "y"
    assert with_endpoint("s3://b/p", "http://127.0.0.1:9") == (
        "s3://b/p?endpoint_override=127.0.0.1:9&scheme=http"
    )
    assert with_endpoint("/local", "http://h:1") == "/local"
    assert with_endpoint("s3://b/p", None) == "s3://b/p"


def _record_uploads(monkeypatch) -> list[str]:
    """The dataset-relative keys of every dataset file sent with :meth:`StorePath.upload`, and
    the manifest's commit, in order (work files left out)."""
    from shardfeed.pipelines import driver

    sent: list[str] = []
    real, real_commit = StorePath.upload, driver.commit_manifest

    def record(self, local_path, expect=None):
        rel = self.path.split("/", 2)[2]
        if not rel.startswith(".shardfeed-work/"):
            sent.append(rel)
        return real(self, local_path, expect)

    def commit(dst, body, lease):
        sent.append(MANIFEST_PATH)
        return real_commit(dst, body, lease)

    monkeypatch.setattr(StorePath, "upload", record)
    monkeypatch.setattr(driver, "commit_manifest", commit)
    return sent


class _Recording:
    """A filesystem that records moves and deletes, and passes every call to the real one."""

    def __init__(self, fs: pafs.FileSystem) -> None:
        self.fs = fs
        self.calls: list[tuple[str, str]] = []

    def move(self, src: str, dest: str) -> None:
        self.calls.append(("move", dest))
        self.fs.move(src, dest)

    def delete_file(self, path: str) -> None:
        self.calls.append(("delete_file", path))
        self.fs.delete_file(path)

    def __getattr__(self, name: str):
        return getattr(self.fs, name)


def test_reader_side_commands_work_on_the_s3_dataset(endpoint, corpus, tmp_path, capsys):
    """assign, hot and the loader read (and assign/hot write their files into) a dataset that
    exists only on S3, as they do with a local one."""
    from shardfeed.loader import ShardLoader

    assert _convert(str(corpus), "s3://bucket/reads", tmp_path) == 0
    capsys.readouterr()
    dst = "s3://bucket/reads"
    world = ["--nodes", "2", "--gpus-per-node", "2"]
    assert main(["assign", dst, *world, "--name", "run1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)
    assert main(["hot", dst, "--weights", "column:n", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)
    tree = s3_tree(endpoint, "reads")
    assert "meta/shardfeed/assignments/run1.parquet" in tree
    assert "meta/shardfeed/hot_index.parquet" in tree
    assert verify_dataset(dst).ok
    seen = []
    for rank in range(4):
        loader = ShardLoader(dst, rank=rank, world=4, batch_size=4, columns=["n"])
        seen.extend(n for batch in loader for n in batch["n"].tolist())
    assert sorted(seen) == sorted(list(range(ROWS // 2)) * 2)
    seen = []  # the same through the plan assign stored on S3
    for rank in range(4):
        loader = ShardLoader(dst, rank=rank, world=4, batch_size=4, assignment="run1")
        seen.extend(n for batch in loader for n in batch["n"].tolist())
    assert sorted(seen) == sorted(list(range(ROWS // 2)) * 2)

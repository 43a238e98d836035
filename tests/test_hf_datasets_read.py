"""Clients that read the shards directly, with no shardfeed code: Hugging Face ``datasets`` and DuckDB.

Each shard's Arrow schema carries the ``huggingface`` metadata key (``schemas/hf_features.py``), so
``datasets.load_dataset("parquet", data_files="DST/data/*/*.parquet")`` sees an image column as
``Image()`` (decoded to PIL), an image-folder label as a ``ClassLabel`` with the class names, and
every other column as the ``Value`` or fixed-length ``List`` its Arrow type stores. The datasets
come from the real ``shardfeed convert`` pipeline: a generated image folder, and the real LeRobot
v3.0 corpus under ``$SHARDFEED_CORPORA``. DuckDB reads the same files with ``read_parquet``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

pytest.importorskip("apache_beam")
pytest.importorskip("datasets")
pytest.importorskip("duckdb")

from shardfeed import open_dataset, write_dataset
from shardfeed.cli.main import main
from shardfeed.schemas import Feature, FeatureSpec

duckdb = pytest.importorskip("duckdb")

CORPORA = os.environ.get("SHARDFEED_CORPORA")
needs_corpora = pytest.mark.skipif(
    not CORPORA, reason="SHARDFEED_CORPORA is not set (scripts/test.sh sets it)"
)
#: created in this order; labels follow the sorted order (apple 0, mango 1, zebra 2, été 3)
CLASSES = ["zebra", "apple", "été", "mango"]


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """The real ``datasets``, offline, with every Hugging Face cache in a temporary directory."""
    home = tmp_path_factory.mktemp("hf-home")
    saved = {k: os.environ.get(k) for k in ("HF_HOME", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    os.environ.update(HF_HOME=str(home), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    import datasets

    yield datasets
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def load(hf, dst: Path, cache: Path):
    """``load_dataset("parquet")`` on the shards alone, as a user would call it."""
    return hf.load_dataset(
        "parquet",
        data_files=str(dst / "data" / "*" / "*.parquet"),
        split="train",
        cache_dir=str(cache),
    )


def shard_paths(dst: Path) -> list[Path]:
    paths = sorted(dst.glob("data/*/*.parquet"))
    assert paths
    return paths


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory):
    """A generated image folder (PNG and JPEG, every image of another size) and its conversion
    into several shards; returns (dst, {relative path: (label, (width, height))})."""
    from PIL import Image

    root = tmp_path_factory.mktemp("imagefolder")
    src = root / "src"
    expected: dict[str, tuple[int, tuple[int, int]]] = {}
    for c, name in enumerate(CLASSES):
        (src / name).mkdir(parents=True)
        for i in range(5):
            size = (6 + 3 * i + c, 5 + 2 * c + i)
            fmt = "png" if i % 2 == 0 else "jpg"
            path = src / name / f"{i}.{fmt}"
            Image.new("RGB", size, (40 * c, 30 * i, 90)).save(path)
            expected[f"{name}/{i}.{fmt}"] = (sorted(CLASSES).index(name), size)
    dst = root / "dst"
    assert main(["convert", str(src), str(dst), "--target-shard-size", "2KB"]) == 0
    assert len(shard_paths(dst)) >= 3
    return dst, expected


@pytest.fixture(scope="module")
def reachy(tmp_path_factory):
    if not CORPORA:
        pytest.skip("SHARDFEED_CORPORA is not set (scripts/test.sh sets it)")
    src = Path(CORPORA, "lerobot_v30_reachy2_apple_storage")
    dst = tmp_path_factory.mktemp("reachy") / "dst"
    assert main(["convert", str(src), str(dst), "--target-shard-size", "60KB"]) == 0
    assert len(shard_paths(dst)) == 3
    return dst


def test_image_folder_loads_as_image_and_class_label(hf, image_folder, tmp_path):
    from PIL import Image as PILImage

    dst, expected = image_folder
    ds = load(hf, dst, tmp_path)
    assert ds.features["image"] == hf.Image()
    assert ds.features["label"] == hf.ClassLabel(names=sorted(CLASSES))
    assert ds.features["label"].names == ["apple", "mango", "zebra", "été"]
    assert ds.features["path"] == hf.Value("string")
    assert list(ds.features) == ["image", "label", "path"]
    # rows in shard order: the same samples, in the same order, as shardfeed's own reader
    ours = open_dataset(dst)
    assert len(ds) == len(ours) == len(expected)
    assert ds[:]["path"] == list(ours.read(0, len(ours))["path"])
    seen = set()
    for row in ds:
        label, size = expected[row["path"]]
        assert isinstance(row["image"], PILImage.Image), type(row["image"])
        assert row["image"].size == size, row["path"]
        assert row["label"] == label
        assert ds.features["label"].int2str(row["label"]) == row["path"].split("/")[0]
        seen.add(row["path"])
    assert seen == set(expected)


@needs_corpora
def test_lerobot_tensors_and_scalars_load_with_their_shapes(hf, reachy, tmp_path):
    ds = load(hf, reachy, tmp_path)
    ours = open_dataset(reachy)
    rows = ours.read(0, len(ours))
    assert len(ds) == len(ours) == 899
    for name in ("observation.state", "action"):
        assert ds.features[name] == hf.Sequence(hf.Value("float32"), length=19), name
    for name in ("frame_index", "episode_index", "index", "task_index"):
        # LeRobot's own declaration of a [1] int64: a Value, never a ClassLabel
        assert ds.features[name] == hf.Value("int64"), name
    assert ds.features["timestamp"] == hf.Value("float32")
    assert "observation.image" not in ds.features  # a video feature has no column
    # declared in every shard, not inferred: the declaration is what datasets used
    for path in shard_paths(reachy):
        meta = json.loads(pq.read_schema(path).metadata[b"huggingface"])
        assert hf.Features.from_dict(meta["info"]["features"]) == ds.features
    array = ds.with_format("numpy")[:]  # every column, as numpy arrays
    state = array["observation.state"]
    assert state.shape == (899, 19) and state.dtype == np.float32
    np.testing.assert_array_equal(state, rows["observation.state"])
    np.testing.assert_array_equal(array["index"], np.arange(899))
    np.testing.assert_array_equal(array["episode_index"], rows["episode_index"])


def test_every_dtype_is_declared_and_matches_its_column(hf, tmp_path):
    """Every stored column's declared feature is what ``datasets`` uses: its Arrow type equals the
    column's exactly (a mismatch would make ``datasets`` silently fall back to inference)."""
    numeric = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
    numeric += ["float16", "float32", "float64"]
    features = [Feature(f"s.{d}", d) for d in numeric]
    features += [
        Feature("vec", "float32", (4,)),
        Feature("grid", "int16", (2, 3)),
        Feature("cube", "uint8", (2, 1, 3)),
        Feature("text", "string"),
        Feature("picture", "image", (4, 4, 3)),
        Feature("named", "int64", names=["only"]),  # LeRobot's naming of its one element
        Feature("kind", "int64", names=["no", "yes"]),  # class names
        Feature("dims", "float32", (2,), names=["x", "y"]),
    ]
    spec = FeatureSpec(tuple(features))
    n = 5
    rng = np.random.default_rng(3)
    data = {f"s.{d}": (np.arange(n) % 2).astype(d) for d in numeric}
    data |= {
        "vec": rng.normal(size=(n, 4)).astype(np.float32),
        "grid": np.arange(n * 6, dtype=np.int16).reshape(n, 2, 3),
        "cube": np.arange(n * 6, dtype=np.uint8).reshape(n, 2, 1, 3),
        "text": [f"t{i} é" for i in range(n)],
        "picture": [_png(4, 4)] * n,
        "named": np.arange(n, dtype=np.int64),
        "kind": np.arange(n, dtype=np.int64) % 2,
        "dims": rng.normal(size=(n, 2)).astype(np.float32),
    }
    dst = tmp_path / "ds"
    write_dataset(dst, spec, data)
    schema = pq.read_schema(shard_paths(dst)[0])
    declared = hf.Features.from_dict(
        json.loads(schema.metadata[b"huggingface"])["info"]["features"]
    )
    assert sorted(declared) == sorted(f.name for f in features)  # keys are sorted
    # what datasets builds from the file: the declared feature for every column, none inferred
    assert hf.Features.from_arrow_schema(schema) == declared
    for field in schema:
        assert declared.arrow_schema.field(field.name) == field, field.name
    for d in numeric:
        assert declared[f"s.{d}"] == hf.Value(d), d
    assert declared["vec"] == hf.Sequence(hf.Value("float32"), length=4)
    assert declared["grid"] == hf.Sequence(hf.Sequence(hf.Value("int16"), length=3), length=2)
    assert declared["text"] == hf.Value("string")
    assert declared["picture"] == hf.Image()
    assert declared["named"] == hf.Value("int64")  # a one-name list is not a class list
    assert declared["kind"] == hf.ClassLabel(names=["no", "yes"])
    assert declared["dims"] == hf.Sequence(hf.Value("float32"), length=2)
    loaded = load(hf, dst, tmp_path / "cache")
    assert loaded.features == declared
    ds = loaded.with_format("numpy")[:]
    assert ds["grid"].shape == (n, 2, 3)  # the numpy formatter picks its own int dtype
    np.testing.assert_array_equal(ds["grid"], data["grid"])
    np.testing.assert_array_equal(ds["cube"], data["cube"])
    np.testing.assert_array_equal(ds["s.uint64"], data["s.uint64"])


def test_the_metadata_is_deterministic_and_compact(image_folder):
    """Every shard of a dataset carries the same bytes (sorted keys, no timestamps)."""
    dst, _ = image_folder
    values = {pq.read_schema(p).metadata[b"huggingface"] for p in shard_paths(dst)}
    assert len(values) == 1
    (value,) = values
    assert json.loads(value)["info"]["features"]["label"] == {
        "_type": "ClassLabel",
        "names": ["apple", "mango", "zebra", "été"],
    }
    assert (
        value
        == json.dumps(
            json.loads(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False
        ).encode()
    )


def test_duckdb_reads_the_image_folder_shards(image_folder):
    dst, expected = image_folder
    glob = str(dst / "data" / "*" / "*.parquet")
    ((count, labels, paths, nulls),) = duckdb.sql(
        f"select count(*), count(distinct label), count(distinct path), "
        f"count(*) filter (where image.bytes is null) from read_parquet('{glob}')"
    ).fetchall()
    assert (count, labels, paths, nulls) == (len(expected), len(CLASSES), len(expected), 0)
    per_label = duckdb.sql(
        f"select label, count(*), min(split_part(path, '/', 1)), max(split_part(path, '/', 1)) "
        f"from read_parquet('{glob}') group by label order by label"
    ).fetchall()
    assert per_label == [(i, 5, name, name) for i, name in enumerate(sorted(CLASSES))]
    sizes = dict(
        duckdb.sql(f"select path, octet_length(image.bytes) from read_parquet('{glob}')").fetchall()
    )
    src = dst.parent / "src"
    assert sizes == {p: (src / p).stat().st_size for p in expected}


@needs_corpora
def test_duckdb_reads_the_lerobot_shards(reachy):
    glob = str(reachy / "data" / "*" / "*.parquet")
    (row,) = duckdb.sql(
        "select count(*), count(distinct episode_index), min(index), max(index), "
        'min(len("observation.state")), max(len("observation.state")), '
        'sum("observation.state"[1]) '
        f"from read_parquet('{glob}')"
    ).fetchall()
    rows = open_dataset(reachy).read(0, 899)
    assert row[:6] == (899, 3, 0, 898, 19, 19)
    assert row[6] == pytest.approx(float(rows["observation.state"][:, 0].astype(np.float64).sum()))
    # rows come back in file order: the global index order of the shards
    index = duckdb.sql(f"select index from read_parquet('{glob}')").fetchnumpy()["index"]
    np.testing.assert_array_equal(index, np.arange(899))


def _png(width: int, height: int) -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), (1, 2, 3)).save(out, format="PNG")
    return out.getvalue()

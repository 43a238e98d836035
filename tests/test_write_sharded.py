"""WriteShardedDataset: the writer as a PTransform over a user's PCollection of samples."""

from __future__ import annotations

import math
import os
import random
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("apache_beam")

import apache_beam as beam
import pyarrow.parquet as pq
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from shardfeed import open_dataset
from shardfeed.formats.publish import DatasetExistsError
from shardfeed.formats.verify import verify_dataset
from shardfeed.pipelines.runners import make_runner
from shardfeed.pipelines.write_sharded import WriteShardedDataset
from shardfeed.schemas.errors import ShardfeedError
from shardfeed.schemas.features import Feature, FeatureSpec

SPEC = FeatureSpec(
    (
        Feature("id", "int64"),
        Feature("text", "string"),
        Feature("vec", "float32", (2, 3)),
        Feature("image", "image", (4, 4, 3)),
        Feature("flag", "bool"),
        Feature("score", "float64"),
    )
)
MULTI_PROCESSING = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` as {relative path: bytes}."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def corpus(n: int, seed: int = 0, sigma: float = 1.0, duplicates: int = 0) -> list[dict[str, Any]]:
    """Samples with log-normal text sizes, nulls, bools, images; the first ``duplicates`` repeat."""
    rng = np.random.default_rng(seed)
    sizes = rng.lognormal(5, sigma, n).astype(int) + 1
    samples = [
        {
            "id": i,
            "text": "".join(chr(97 + (i + j) % 26) for j in range(int(size))),
            "vec": rng.normal(size=(2, 3)).astype(np.float32),
            "image": bytes(rng.integers(0, 256, int(i % 17), dtype=np.uint8)),
            "flag": np.bool_(i % 3 == 0),
            "score": None if i % 11 == 0 else float(rng.normal()),
        }
        for i, size in enumerate(sizes)
    ]
    return samples + [dict(s) for s in samples[:duplicates]]


def as_python(sample: dict[str, Any]) -> dict[str, Any]:
    """The same sample with plain Python values (lists, bool, image as a struct dict)."""
    out = dict(sample)
    out["vec"] = np.asarray(sample["vec"]).tolist()
    out["flag"] = bool(sample["flag"])
    out["image"] = {"bytes": sample["image"], "path": None}
    return out


def write(
    samples: Sequence[dict[str, Any]],
    dst: Path,
    args: Sequence[str] = (),
    expect_samples: int | None = None,
    **kwargs: Any,
) -> None:
    """Run WriteShardedDataset over ``beam.Create(samples)`` on the runner ``args`` select."""
    kwargs.setdefault("target_shard_size", "20KB")
    kwargs.setdefault("row_group_size", "4KB")
    options = PipelineOptions(list(args))
    with beam.Pipeline(runner=make_runner(options), options=options) as pipeline:
        manifests = (
            pipeline
            | "Samples" >> beam.Create(list(samples))
            | "Write" >> WriteShardedDataset(dst, SPEC, **kwargs)
        )
        if expect_samples is not None:
            assert_that(manifests | beam.Map(lambda m: m.num_samples), equal_to([expect_samples]))


def row_keys(root: Path) -> Counter:
    """Every row of the dataset at ``root``, read with open_dataset, as a multiset of tuples."""
    ds = open_dataset(root)
    data = ds.read(0, len(ds))
    return Counter(
        (
            int(data["id"][i]),
            data["text"][i],
            data["vec"][i].tobytes(),
            data["image"][i],
            bool(data["flag"][i]),
            None if math.isnan(data["score"][i]) else float(data["score"][i]),
        )
        for i in range(len(ds))
    )


def source_keys(samples: Sequence[dict[str, Any]]) -> Counter:
    return Counter(
        (
            s["id"],
            s["text"],
            np.asarray(s["vec"], np.float32).tobytes(),
            s["image"],
            bool(s["flag"]),
            s["score"],
        )
        for s in samples
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
    """A corpus with exact duplicates, and its DST tree written on the in-process runner."""
    samples = corpus(600, seed=1, duplicates=25)
    dst = tmp_path_factory.mktemp("reference") / "ds"
    write(samples, dst, expect_samples=len(samples))
    return samples, tree_bytes(dst)


def test_values_round_trip_and_the_dataset_verifies(reference, tmp_path):
    samples, tree = reference
    dst = tmp_path / "ds"
    write(samples, dst)
    assert tree_bytes(dst) == tree
    assert not any(path.startswith(".shardfeed-work") for path in tree)
    assert verify_dataset(dst).ok
    ds = open_dataset(dst)
    assert len(ds) == len(samples) == ds.info.total_frames
    assert len(ds.shards) > 3
    assert row_keys(dst) == source_keys(samples)
    provenance = ds.manifest.provenance
    assert provenance.source == "beam"
    assert provenance.content_options == {
        "cost": "pixels",  # the resolved cost kind, recorded by publish
        "from": "beam",
        "row_group_size": 4000,
        "shuffle_seed": 0,
        "target_shard_size": 20000,
    }
    # the 25 duplicated samples sit next to their twins (same key, same hash)
    ids = ds.read(0, len(ds))["id"]
    twins = np.flatnonzero(ids[1:] == ids[:-1])
    assert len(twins) == 25


def test_any_input_order_and_value_types_give_identical_trees(reference, tmp_path):
    samples, tree = reference
    shuffled = [as_python(s) for s in samples]
    random.Random(7).shuffle(shuffled)
    write(shuffled, tmp_path / "ds")
    assert tree_bytes(tmp_path / "ds") == tree


def test_multi_processing_direct_runner_gives_identical_tree(reference, tmp_path):
    samples, tree = reference
    shuffled = list(reversed(samples))
    write(shuffled, tmp_path / "ds", MULTI_PROCESSING, expect_samples=len(samples))
    assert tree_bytes(tmp_path / "ds") == tree


def test_payload_balance_on_a_long_tail_corpus(tmp_path):
    samples = corpus(3000, seed=3, sigma=1.2)
    dst = tmp_path / "ds"
    write(samples, dst, target_shard_size="60KB")
    manifest = open_dataset(dst).manifest
    payload = [s.payload_bytes for s in manifest.shards]
    assert len(payload) == round(sum(payload) / 60_000) >= 8
    ratio = max(payload) / (sum(payload) / len(payload))
    assert ratio <= 1.02, ratio
    assert manifest.num_samples == 3000 and verify_dataset(dst).ok


def test_cost_kind_is_chosen_by_the_caller(tmp_path):
    dst = tmp_path / "ds"
    write(corpus(200, seed=4), dst, cost="bytes")
    ds = open_dataset(dst)
    assert ds.manifest.cost.kind == "bytes"
    assert ds.manifest.provenance.content_options["cost"] == "bytes"
    costs = pq.read_table(dst / "meta/shardfeed/samples.parquet")
    assert costs.column("cost").to_pylist() == costs.column("bytes").to_pylist()


def test_published_dataset_is_refused_without_overwrite(reference, tmp_path):
    samples, tree = reference
    dst = tmp_path / "ds"
    write(samples, dst)
    with pytest.raises(DatasetExistsError, match="overwrite=True"):
        write(samples[:10], dst)
    assert tree_bytes(dst) == tree  # untouched
    write(samples, dst, overwrite=True, shuffle_seed=5)
    assert verify_dataset(dst).ok and row_keys(dst) == source_keys(samples)
    assert tree_bytes(dst) != tree  # another seed, another order
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(DatasetExistsError, match="holds files"):
        write(samples[:10], other)


def test_a_lease_and_another_attempt_s_lease_temporary_are_not_files_in_dst(tmp_path):
    """A caller holding DST's writer lease, with another attempt's lease temporary beside it
    (two jobs started together), writes there: neither is content."""
    from shardfeed.formats.atomic import temp_name
    from shardfeed.formats.layout import LEASE_NAME

    dst = tmp_path / "ds"
    dst.mkdir()
    (dst / LEASE_NAME).write_text("{}")
    open(temp_name(str(dst / LEASE_NAME)), "wb").close()
    samples = corpus(50)
    write(samples, dst)
    assert row_keys(dst) == source_keys(samples)


def test_an_interrupted_runs_leftovers_are_taken_over(tmp_path):
    dst = tmp_path / "ds"
    (dst / ".shardfeed-work" / "shards").mkdir(parents=True)
    (dst / "data" / "chunk-000").mkdir(parents=True)
    (dst / "data" / "chunk-000" / "file-000.parquet").write_bytes(b"half")
    samples = corpus(50)
    write(samples, dst)
    assert verify_dataset(dst).ok and row_keys(dst) == source_keys(samples)


def test_episodic_features_are_refused():
    features = {
        "episode_index": {"dtype": "int64", "shape": [1]},
        "x": {"dtype": "float32", "shape": [1]},
    }
    with pytest.raises(ShardfeedError, match="episode_index"):
        WriteShardedDataset("unused", features)


def test_dask_runner_is_refused(tmp_path):
    dask_runner = pytest.importorskip("apache_beam.runners.dask.dask_runner")
    pipeline = beam.Pipeline(runner=dask_runner.DaskRunner())
    with pytest.raises(ShardfeedError, match="DaskRunner"):
        _ = pipeline | beam.Create([{"id": 1}]) | WriteShardedDataset(tmp_path / "ds", SPEC)
    assert not (tmp_path / "ds").exists()


def test_index_is_renumbered_and_empty_input_publishes_an_empty_dataset(tmp_path):
    features = {"index": {"dtype": "int64", "shape": [1]}, "x": {"dtype": "float32", "shape": [1]}}
    options = PipelineOptions([])
    with beam.Pipeline(runner=make_runner(options), options=options) as pipeline:
        samples = pipeline | beam.Create([{"index": 99, "x": float(i)} for i in range(40)])
        _ = samples | "Some" >> WriteShardedDataset(
            tmp_path / "some", features, target_shard_size=120
        )
        _ = (
            samples
            | beam.Filter(lambda s: False)
            | "None" >> WriteShardedDataset(tmp_path / "none", features)
        )
    some = open_dataset(tmp_path / "some")
    assert len(some.shards) == 4
    data = some.read(0, 40)
    np.testing.assert_array_equal(data["index"], np.arange(40))
    assert sorted(data["x"].tolist()) == list(range(40))
    none = open_dataset(tmp_path / "none")
    assert len(none) == 0 and verify_dataset(tmp_path / "none").ok


def test_a_sample_that_does_not_fit_the_features_fails_the_pipeline(tmp_path):
    with pytest.raises(Exception, match="shape"):
        write([{"id": 1, "vec": [1.0, 2.0]}], tmp_path / "ds")
    assert not (tmp_path / "ds").exists()


def test_the_documented_example_runs(tmp_path, monkeypatch, capsys):
    text = Path(__file__).parents[1].joinpath("docs", "PIPELINE.md").read_text(encoding="utf-8")
    section = text.split("## Using shardfeed inside your own Beam pipeline", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "PIPELINE.md", "exec"), {"__name__": "__doc_example__"})
    out = capsys.readouterr().out
    assert "1000 samples," in out
    assert verify_dataset(os.path.join(tmp_path, "out", "captions")).ok


def test_a_shards_inputs_digest_joins_string_columns_as_python_would():
    """The resume digest joins each unit's file and content hash in Arrow (no Python string
    per unit); the bytes are those of ``"\\n".join`` over the values, so digests of interrupted
    runs still match."""
    import pyarrow as pa

    from shardfeed.pipelines.convert import _joined_lines

    columns = [
        pa.chunked_array([pa.array(["a/b.jsonl", "c", "ü/ß.jsonl"])]),
        pa.chunked_array([pa.array(["x"]), pa.array(["yy", "z"]).slice(1)]),
        pa.chunked_array(
            [pa.array([], pa.large_string()), pa.array(["q", "r"], pa.large_string())]
        ),
        pa.chunked_array([], pa.string()),
    ]
    for column in columns:
        joined = b"".join(bytes(part) for part in _joined_lines(column))
        assert joined == "\n".join(column.to_pylist()).encode()

"""Hot shards at conversion: ``convert --hot-weights --hot-budget`` packs the hot set into
dedicated leading shards, balanced on their own, with no row duplicated or lost."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("apache_beam")

from shardfeed import open_dataset
from shardfeed.cli.main import main
from shardfeed.formats.verify import verify_dataset
from shardfeed.planning.balance import max_over_mean
from shardfeed.planning.hot import fill, heat_order
from shardfeed.planning.shard_plan import BucketTotal, hot_bucket, plan_classes


def jsonl_corpus(root: Path, n: int = 3000, seed: int = 0) -> tuple[Path, np.ndarray]:
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True)
    lengths = np.minimum(rng.lognormal(6, 0.7, n).astype(int) + 1, 20_000)
    with open(root / "part-0.jsonl", "w") as a, open(root / "part-1.jsonl", "w") as b:
        for i, k in enumerate(lengths):
            (a if i % 2 == 0 else b).write(json.dumps({"id": i, "text": "z" * int(k)}) + "\n")
    return root, lengths


def key_of(i: int) -> str:
    """The unit key of record ``i``: its file and 1-based line, as shardfeed rejects names it."""
    return f"part-{i % 2}.jsonl#line:{i // 2 + 1}"


def test_hot_shards_hold_exactly_the_hot_set_and_each_class_balances(tmp_path, capsys):
    src, lengths = jsonl_corpus(tmp_path / "src")
    n = len(lengths)
    weights = 1.0 / (1 + np.random.default_rng(4).permutation(n))
    weights[::7] = 0  # zero weight: never hot
    lines = ["key,weight", *(f"{key_of(i)},{w!r}" for i, w in enumerate(weights.tolist()))]
    lines.append("part-9.jsonl#line:1,5.0")  # a key that names no record
    (tmp_path / "w.csv").write_text("\n".join(lines) + "\n")
    dst = tmp_path / "out"
    args = ["convert", str(src), str(dst), "--target-shard-size", "40KB", "--json"]
    assert main([*args, "--hot-weights", str(tmp_path / "w.csv"), "--hot-budget", "15%"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert any("1 key(s) of the hot weights matched no record" in note for note in summary["notes"])
    ds = open_dataset(dst)
    hot_shards = ds.manifest.hot_shards
    assert hot_shards >= 2 and verify_dataset(dst).ok
    # the hot set, chosen by hand: payload = text + id, hottest first, first fit within 15%
    ids = ds.read(0, len(ds), ["id"])["id"].reshape(-1)
    sizes = np.empty(n, dtype=np.int64)
    from shardfeed.formats.sample_index import read_sample_bytes

    sizes[ids] = read_sample_bytes(dst)
    budget = int(sizes.sum() * 0.15)
    expected = set(fill(heat_order(weights, sizes), sizes, budget).tolist())
    boundary = ds.shards[hot_shards].index_start
    assert set(ids[:boundary].tolist()) == expected
    assert sorted(ids.tolist()) == list(range(n))  # nothing duplicated or lost
    payload = [s.payload_bytes for s in ds.shards]
    assert max_over_mean(payload[:hot_shards]) <= 1.05
    assert max_over_mean(payload[hot_shards:]) <= 1.05
    # the cache plan from the same weights pins exactly the hot shards, as whole files
    (tmp_path / "by_index.csv").write_text(
        "\n".join(f"{i},{float(weights[v])!r}" for i, v in enumerate(ids.tolist())) + "\n"
    )
    budget_arg = str(sum(payload[:hot_shards]))
    assert (
        main(
            [
                "hot",
                str(dst),
                "--weights",
                str(tmp_path / "by_index.csv"),
                "--node-budget",
                budget_arg,
                "--json",
            ]
        )
        == 0
    )
    pins = json.loads(capsys.readouterr().out)["cache_plan"]["pins"][0]
    assert pins["whole_shards"] == hot_shards and pins["samples"] == len(expected)


def test_hot_weights_refuse_no_shuffle_and_bad_files(tmp_path, capsys):
    src, _ = jsonl_corpus(tmp_path / "src", n=200)
    (tmp_path / "w.csv").write_text("key,weight\npart-0.jsonl#line:1,oops\n")
    args = ["convert", str(src), str(tmp_path / "out"), "--hot-weights", str(tmp_path / "w.csv")]
    assert main([*args, "--hot-budget", "10%"]) == 1
    assert "expected 'key,weight'" in capsys.readouterr().err
    (tmp_path / "w.csv").write_text("part-0.jsonl#line:1,1\n")
    assert main([*args, "--hot-budget", "10%", "--no-shuffle", "--overwrite"]) == 1
    assert "needs the shuffled plan" in capsys.readouterr().err


def test_plan_classes_never_mixes_hot_and_rest():
    hot = [BucketTotal(hot_bucket(b), 1, 1, 10 + b % 10) for b in range(500)]
    rest = [BucketTotal(b, 3, 3, 30) for b in range(2000)]
    plan, hot_shards = plan_classes(hot, rest, 1000)
    assert hot_shards == round(sum(t.bytes for t in hot) / 1000)
    assert all(plan.shard_of[t.bucket] < hot_shards for t in hot)
    assert all(plan.shard_of[t.bucket] >= hot_shards for t in rest)
    assert max_over_mean(plan.bytes[:hot_shards]) <= 1.05
    assert max_over_mean(plan.bytes[hot_shards:]) <= 1.02


def test_the_planning_worker_reads_the_weights_from_the_work_directory(tmp_path):
    """The driver copies the weights file into the work directory, so a worker sharing no path
    with the driver plans from the copy (here the original is gone before the plan reads it)."""
    from shardfeed.formats.store_path import StorePath
    from shardfeed.pipelines.plan_stage import HotSettings

    original = tmp_path / "driver" / "w.csv"
    original.parent.mkdir()
    original.write_text("key,weight\npart-0.jsonl#line:1,2.5\npart-1.jsonl#line:3,1\n")
    settings = HotSettings(str(original), "10%").copied_to(StorePath(str(tmp_path / "work")))
    original.unlink()
    assert settings.copy is not None and settings.copy.exists()
    assert settings.load() == {"part-0.jsonl#line:1": 2.5, "part-1.jsonl#line:3": 1.0}

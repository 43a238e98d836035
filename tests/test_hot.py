"""The hot-sample index, the node-cache plan, and their CLI views."""

from __future__ import annotations

import collections
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfeed.assignment import World, assign
from shardfeed.cli.main import main
from shardfeed.formats.dataset_writer import write_dataset
from shardfeed.formats.errors import HotIndexError, HotIndexMissingError
from shardfeed.formats.sample_index import read_sample_bytes
from shardfeed.hot import build_hot_index, load_cache_plan, load_hot_index, plan_cache
from shardfeed.planning.hot import fill, heat_order, node_pins
from shardfeed.schemas.errors import ShardfeedError

SPEC = {
    "text": {"dtype": "string", "shape": [1]},
    "source": {"dtype": "string", "shape": [1]},
    "w": {"dtype": "float64", "shape": [1]},
}


def corpus(root: Path, n: int = 3000, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    lengths = np.minimum(rng.lognormal(5, 0.8, n).astype(int) + 1, 5000)
    sources = np.array(["web", "books", "code"])[rng.integers(0, 3, n)]
    write_dataset(
        root,
        SPEC,
        {
            "text": ["y" * int(k) for k in lengths],
            "source": sources.tolist(),
            "w": (1.0 / (1 + rng.permutation(n))).reshape(-1, 1),
        },
        target_shard_size=int(lengths.sum() // 12),
    )
    return root


def zipf_file(path: Path, n: int, seed: int = 1) -> np.ndarray:
    weights = 1.0 / (1 + np.random.default_rng(seed).permutation(n))
    lines = ["index,weight", *(f"{i},{w!r}" for i, w in enumerate(weights.tolist()))]
    path.write_text("\n".join(lines) + "\n")
    return weights


def test_weights_file_ranks_by_independently_computed_accesses(tmp_path):
    root = corpus(tmp_path / "ds")
    weights = zipf_file(tmp_path / "w.csv", 3000)
    hot = build_hot_index(root, weights=str(tmp_path / "w.csv")).save()
    sizes = read_sample_bytes(root).astype(np.int64)
    expected = 3000 * weights / weights.sum()  # draws per epoch = samples, with replacement
    by_hand = sorted(range(3000), key=lambda i: (-expected[i], sizes[i], i))
    assert hot.index.tolist() == by_hand
    np.testing.assert_allclose(hot.accesses, expected[by_hand])
    np.testing.assert_array_equal(hot.bytes, sizes[by_hand])
    loaded = load_hot_index(root)
    np.testing.assert_array_equal(loaded.index, hot.index)
    np.testing.assert_allclose(loaded.accesses, hot.accesses)
    # shard and row locate each sample
    table = pq.read_table(root / "meta/shardfeed/hot_index.parquet")
    assert table.column_names == ["index", "shard", "row", "bytes", "expected_accesses_per_epoch"]
    starts = np.array([s.index_start for s in loaded.source.manifest.shards])
    np.testing.assert_array_equal(starts[loaded.shard] + loaded.row, loaded.index)


def test_access_log_counts_and_mixture_and_column(tmp_path):
    root = corpus(tmp_path / "ds", n=1200)
    log = np.random.default_rng(3).integers(0, 1200, 5000)
    (tmp_path / "log.txt").write_text("\n".join(map(str, log)) + "\n")
    hot = build_hot_index(root, access_log=str(tmp_path / "log.txt"), log_epochs=2)
    counts = collections.Counter(log.tolist())
    assert dict(zip(hot.index.tolist(), hot.accesses.tolist(), strict=True)) == {
        i: c / 2 for i, c in counts.items()
    }
    pq.write_table(pa.table({"index": log}), tmp_path / "log.parquet")
    from_parquet = build_hot_index(root, access_log=str(tmp_path / "log.parquet"), log_epochs=2)
    np.testing.assert_array_equal(from_parquet.index, hot.index)

    mixed = build_hot_index(root, weights="web=2,books=1,code=0")
    source = pq.read_table(root / "data").column("source").to_pylist()
    names = np.array([s[0] if isinstance(s, list) else s for s in source])
    share = {"web": 2 / 3, "books": 1 / 3}
    for i, a in zip(mixed.index.tolist(), mixed.accesses.tolist(), strict=True):
        assert a == pytest.approx(1200 * share[names[i]] / (names == names[i]).sum())
    assert not set(mixed.index.tolist()) & set(np.flatnonzero(names == "code").tolist())

    column = build_hot_index(root, weights="column:w")
    w = np.concatenate([b["w"].reshape(-1) for b in _batches(root, "w")])
    np.testing.assert_allclose(column.accesses, (1200 * w / w.sum())[column.index])


def _batches(root, name):
    from shardfeed.formats.reader import open_dataset

    with open_dataset(root) as ds:
        yield from ds.iter_batches(4096, columns=[name])


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 500), min_size=1, max_size=60),
    data=st.data(),
)
def test_fill_never_exceeds_the_budget_and_takes_the_hottest_prefix(sizes, data):
    sizes = np.array(sizes)
    accesses = np.array(
        data.draw(st.lists(st.floats(0, 50), min_size=len(sizes), max_size=len(sizes)))
    )
    budget = data.draw(st.integers(0, int(sizes.sum()) + 10))
    order = heat_order(accesses, sizes)
    pinned = fill(order, sizes, budget)
    assert sizes[pinned].sum() <= budget
    assert len(set(pinned.tolist())) == len(pinned)
    prefix = np.cumsum(sizes[order]) <= budget
    head = order[: int(np.argmin(prefix)) if not prefix.all() else len(order)]
    assert set(head.tolist()) <= set(pinned.tolist())  # the fitting hottest prefix is always pinned
    rest = [i for i in order.tolist() if i not in set(pinned.tolist())]
    assert all(sizes[i] > budget - sizes[pinned].sum() for i in rest)  # nothing else fits


def test_cache_plan_respects_every_node_budget_with_and_without_an_assignment(tmp_path, capsys):
    root = corpus(tmp_path / "ds")
    zipf_file(tmp_path / "w.csv", 3000)
    assign(root, World(3, 2, 1), name="a")
    hot = build_hot_index(root, weights=str(tmp_path / "w.csv")).save()
    sizes = read_sample_bytes(root).astype(np.int64)
    dataset_bytes = int(sizes.sum())
    for budget, assignment in (("10%", None), ("5%", "a"), ("20000", "a")):
        from shardfeed.assignment import load_assignment

        plan = plan_cache(
            hot,
            budget,
            assignment=load_assignment(root, assignment) if assignment else None,
            nodes=3,
        ).save()
        limit = (
            int(dataset_bytes * 0.1)
            if budget == "10%"
            else (int(dataset_bytes * 0.05) if budget == "5%" else 20000)
        )
        assert plan.header.node_budget == limit
        starts = np.array([s.index_start for s in hot.source.manifest.shards])
        for node in range(3):
            spans = plan.node_spans(node)
            ids = np.concatenate(
                [
                    np.arange(starts[s] + a, starts[s] + b)
                    for s, a, b in zip(spans.shard, spans.start, spans.end, strict=True)
                ]
            )
            assert sizes[ids].sum() <= limit
            assert plan.header.pins[node].bytes == sizes[ids].sum()
            assert plan.header.pins[node].samples == len(ids)
        if assignment is None:  # every node pins the same global hot set
            assert plan.node_spans(0).shard.tolist() == plan.node_spans(2).shard.tolist()
    loaded = load_cache_plan(root)
    assert loaded.header.assignment == "a" and loaded.header.node_budget == 20000


def test_hot_files_refuse_another_dataset_tampering_and_absence(tmp_path):
    first, other = corpus(tmp_path / "a", seed=1), corpus(tmp_path / "b", seed=2)
    with pytest.raises(HotIndexMissingError, match="has no hot index"):
        load_hot_index(first)
    zipf_file(tmp_path / "w.csv", 3000)
    build_hot_index(first, weights=str(tmp_path / "w.csv")).save()
    for name in ("hot_index.parquet", "hot_index.json"):
        shutil.copy(first / "meta/shardfeed" / name, other / "meta/shardfeed" / name)
    with pytest.raises(HotIndexError, match="made for dataset sha256:"):
        load_hot_index(other)
    table = first / "meta/shardfeed/hot_index.parquet"
    table.write_bytes(table.read_bytes()[:-9] + b"tampered!")
    with pytest.raises(HotIndexError, match="does not match its header"):
        load_hot_index(first)


@pytest.mark.parametrize(
    ("spec", "content", "message"),
    [
        ("web=x", None, "is not a number"),
        ("web=1,web=2", None, "names 'web' twice"),
        ("nosuch=1", None, "sources with no sample"),
        ("FILE", "index,weight\n0,1\n99999,2\n", "outside 0..2999"),
        ("FILE", "0,1\n0,2\n", "appears twice"),
        ("FILE", "index,weight\n0,1\nfoo\n", "expected 'index,weight'"),
        ("FILE", "0,-1\n", "finite number >= 0"),
        ("column:nope", None, "no column 'nope'"),
    ],
)
def test_bad_weights_get_clear_errors(tmp_path, spec, content, message):
    root = corpus(tmp_path / "ds")
    if content is not None:
        spec = str(tmp_path / "w.txt")
        Path(spec).write_text(content)
    with pytest.raises(ShardfeedError, match=message):
        build_hot_index(root, weights=spec)


def test_cli_hot_and_inspect_hot(tmp_path, capsys):
    root = corpus(tmp_path / "ds")
    zipf_file(tmp_path / "w.csv", 3000)
    assert (
        main(["hot", str(root), "--weights", str(tmp_path / "w.csv"), "--nodes", "2", "--json"])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["hot_index"]["samples"] == 3000 and out["cache_plan"]["nodes"] == 2
    shares = [p["bytes_share"] for p in out["curve"]]
    assert shares == sorted(shares) and shares[-1] == pytest.approx(1.0)
    plot = tmp_path / "cdf.png"
    assert main(["inspect", str(root), "--hot", "--json", "--plot", str(plot)]) == 0
    view = json.loads(capsys.readouterr().out)["hot"]
    assert view["curve"] == out["curve"]
    assert view["cache_plan"]["pins"][0]["bytes"] <= view["cache_plan"]["node_budget"]
    assert plot.read_bytes()[:4] == b"\x89PNG"
    assert main(["inspect", str(root), "--hot"]) == 0
    assert "cache for 90% of accessed bytes" in capsys.readouterr().out
    with pytest.raises(SystemExit) as usage:  # one of --weights / --access-log is required
        main(["hot", str(root)])
    assert usage.value.code == 2
    capsys.readouterr()
    assert main(["hot", str(root), "--weights", "web=1", "--node-budget", "lots"]) == 1
    assert "lots" in capsys.readouterr().err


def test_node_pins_without_owner_match_fill():
    sizes = np.array([5, 1, 4, 2, 8])
    accesses = np.array([0.5, 3.0, 3.0, 0.0, 1.0])
    pins = node_pins(accesses, sizes, 9, nodes=2)
    assert (
        pins[0].tolist() == pins[1].tolist() == [1, 2]
    )  # 1 then 2 (ties: smaller first); 4 (8) does not fit


@pytest.mark.parametrize("nodes", [2**64, 10**12, 1, 3])
def test_a_cache_plan_claiming_other_node_counts_is_refused_without_counting_them(tmp_path, nodes):
    """``nodes`` comes from the file: a huge count is refused by comparing it with the pins, never
    by building ``range(nodes)`` (2**64 raised OverflowError; 10**12 filled memory)."""
    import json

    from shardfeed.schemas.errors import SchemaError
    from shardfeed.schemas.hot import CachePlanHeader

    root = corpus(tmp_path / "ds")
    zipf_file(tmp_path / "w.csv", 3000)
    hot = build_hot_index(root, weights=str(tmp_path / "w.csv")).save()
    header = plan_cache(hot, "10%", nodes=2).header
    obj = json.loads(header.dumps())
    assert CachePlanHeader.loads(json.dumps(obj), "cache_plan.json").nodes == 2
    obj["nodes"] = nodes
    with pytest.raises(SchemaError, match="one entry per node"):
        CachePlanHeader.loads(json.dumps(obj), "cache_plan.json")

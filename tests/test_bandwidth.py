"""The bandwidth planner (``shardfeed/planning/bandwidth.py``) against hand computations, and the
``shardfeed plan`` command on a small real dataset.

GB = 10^9 and MB = 10^6 throughout. The seed's world (docs/PLANNING.md): 1,024 GPUs, 8 per node
(128 nodes), each consuming R = 3,125 samples/s of S = 125 KB on disk:
    per GPU   = 3,125 x 125,000 B      = 390,625,000 B/s = 390.625 MB/s
    per node  = 8 x 390.625 MB/s       = 3.125 GB/s
    aggregate = 1,024 x 390.625 MB/s   = 400 GB/s
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tier_fixtures import EXAMPLE_TIERS

from shardfeed.cli.main import main
from shardfeed.planning.bandwidth import (
    MIN_SHARDS_PER_NODE,
    OK_HEADROOM,
    TIGHT_HEADROOM,
    BandwidthPlanError,
    LoaderModel,
    NodeCache,
    SharedTier,
    Workload,
    plan_bandwidth,
    uniform_coverage,
)

GB, MB, TB = 10**9, 10**6, 10**12
SEED = Workload(
    gpus=1024,
    gpus_per_node=8,
    samples_per_gpu_per_s=3125,
    bytes_per_sample=125_000,
    dataset_bytes=30 * TB,
    num_shards=10_000,
)
PFS = SharedTier("pfs", 400 * GB)


def approx(x: float):
    return pytest.approx(x, rel=1e-12)


# --------------------------------------------------------------------------------------------
# documented case 1: the seed's world without a node cache


def test_case_1_seed_world_without_cache():
    """No cache: the shared tier carries all 400 GB/s.
    headroom = 400 / 400 = 1.0 -> "tight" (>= 1.0, < 1.2).
    workers  = ceil(390.625 MB/s / 100 MB/s) = ceil(3.906) = 4 per rank (32 per node).
    prefetch = ceil(0.010 s x 3,125 samples/s / 32) + 1 = ceil(0.977) + 1 = 2 batches;
               DataLoader prefetch_factor = ceil(2 / 4) = 1.
    shards   = 128 nodes x max(4, 8 GPUs x 4 workers = 32) = 4,096; the dataset's 10,000 is
               enough; largest advised shard = 30 TB // 4,096 = 7,324,218,750 B.
    """
    p = plan_bandwidth(SEED, shared=PFS)
    assert p.nodes == 128
    assert p.per_gpu_bytes_per_s == approx(390.625 * MB)
    assert p.per_node_bytes_per_s == approx(3.125 * GB)
    assert p.aggregate_bytes_per_s == approx(400 * GB)
    assert (p.node_share, p.node_served_bytes_per_s, p.node_headroom) == (0.0, 0.0, None)
    assert p.shared_needed_bytes_per_s == approx(400 * GB)
    assert p.shared_headroom == approx(1.0) and p.headroom == approx(1.0)
    assert (p.verdict, p.limiting_tier) == ("tight", "pfs")
    assert (p.workers_per_rank, p.loader_workers_per_node) == (4, 32)
    assert (p.prefetch_depth, p.prefetch_factor) == (2, 1)
    assert (p.min_shards_per_node, p.min_shards) == (32, 4096)
    assert p.shards_ok and p.max_shard_bytes == 7_324_218_750
    assert p.notes == ()


# --------------------------------------------------------------------------------------------
# documented case 2: the same world with a 10% node cache that serves 60% of reads


def test_case_2_seed_world_with_hot_cache():
    """Node budget 3 TB = 10% of 30 TB; the hot index says it serves 60% of read bytes.
    node tier   = 0.6 x 3.125 GB/s = 1.875 GB/s per node; NVMe 12 GB/s -> 12 / 1.875 = 6.4x.
    shared tier = (1 - 0.6) x 400 GB/s = 160 GB/s; pfs 400 GB/s -> 400 / 160 = 2.5x.
    headroom    = min(6.4, 2.5) = 2.5 on pfs -> "ok" (>= 1.2).
    Loader for an object-store-like tier: 150 MB/s per worker, 50 ms latency, batch 16:
    workers  = ceil(390.625 / 150) = ceil(2.604) = 3;
    prefetch = ceil(0.050 x 3,125 / 16) + 1 = ceil(9.766) + 1 = 11; prefetch_factor ceil(11/3) = 4.
    shards   = 128 x max(4, 8 x 3 = 24) = 3,072.
    """
    asked = []

    def coverage(budget: int) -> float:
        asked.append(budget)
        return 0.6

    cache = NodeCache(3 * TB, coverage, read_bandwidth=12 * GB, capacity=3_500 * 10**9, name="nvme")
    loader = LoaderModel(worker_bytes_per_s=150 * MB, latency_s=0.050, batch_size=16)
    p = plan_bandwidth(SEED, cache, PFS, loader)
    assert asked == [3 * TB]
    assert p.node_share == 0.6
    assert p.node_served_bytes_per_s == approx(1.875 * GB)
    assert p.node_headroom == approx(6.4)
    assert p.shared_needed_bytes_per_s == approx(160 * GB)
    assert p.shared_headroom == approx(2.5)
    assert (p.headroom, p.verdict, p.limiting_tier) == (approx(2.5), "ok", "pfs")
    assert (p.workers_per_rank, p.prefetch_depth, p.prefetch_factor) == (3, 11, 4)
    assert (p.min_shards_per_node, p.min_shards) == (24, 3072)


def test_case_3_node_tier_is_the_bottleneck():
    """64 GPUs, 4 per node (16 nodes), 500 samples/s of 1 MB: 500 MB/s per GPU, 2 GB/s per node,
    32 GB/s in aggregate. Shared tier 25 GB/s.
    No cache: 25 / 32 = 0.78125 -> "short".
    Cache serving 90% on a 1.5 GB/s NVMe: node tier 0.9 x 2 = 1.8 GB/s per node ->
    1.5 / 1.8 = 0.8333 "short" on nvme, although the shared tier now needs only 3.2 GB/s
    (25 / 3.2 = 7.8125x). workers = ceil(500 / 100) = 5; shards = 16 x max(4, 4 x 5) = 320.
    """
    w = Workload(64, 4, 500, 1_000_000, 10 * GB, 100)
    shared = SharedTier("pfs", 25 * GB)
    p = plan_bandwidth(w, shared=shared)
    assert p.aggregate_bytes_per_s == approx(32 * GB)
    assert (p.headroom, p.verdict) == (approx(0.78125), "short")
    assert (p.workers_per_rank, p.min_shards) == (5, 320)
    assert not p.shards_ok and "fewer than the 320" in p.notes[0]
    assert "at most 31.25 MB" in p.notes[0]  # 10 GB // 320 = 31.25 MB
    cache = NodeCache(GB, lambda b: 0.9, read_bandwidth=1.5 * GB, name="nvme")
    p = plan_bandwidth(w, cache, shared)
    assert p.node_served_bytes_per_s == approx(1.8 * GB)
    assert p.node_headroom == approx(1.5 / 1.8)
    assert p.shared_needed_bytes_per_s == pytest.approx(3.2 * GB)
    assert p.shared_headroom == pytest.approx(7.8125)
    assert (p.verdict, p.limiting_tier) == ("short", "nvme")


# --------------------------------------------------------------------------------------------
# uniform fallback, thresholds, unknowns


def test_uniform_coverage_fallback():
    """Uniform access: a 3 TB cache of a 30 TB dataset serves 3 / 30 = 10% of reads, so the
    shared tier still needs 0.9 x 400 = 360 GB/s: 400 / 360 = 1.111 -> "tight"."""
    coverage = uniform_coverage(30 * TB)
    assert coverage(0) == 0.0 and coverage(3 * TB) == approx(0.1) and coverage(60 * TB) == 1.0
    assert uniform_coverage(0)(5) == 1.0
    p = plan_bandwidth(SEED, NodeCache(3 * TB, coverage, 12 * GB, name="nvme"), PFS)
    assert p.shared_needed_bytes_per_s == approx(360 * GB)
    assert (p.headroom, p.verdict) == (approx(400 / 360), "tight")


def test_cache_that_holds_everything_leaves_only_the_node_tier():
    cache = NodeCache(40 * TB, uniform_coverage(30 * TB), 12 * GB, name="nvme")
    p = plan_bandwidth(SEED, cache, PFS)
    assert p.node_share == 1.0 and p.shared_needed_bytes_per_s == 0.0
    assert p.shared_headroom is None
    assert (p.headroom, p.verdict, p.limiting_tier) == (approx(12 / 3.125), "ok", "nvme")


@pytest.mark.parametrize(
    ("declared", "verdict"),
    [
        (400 * GB * OK_HEADROOM, "ok"),
        (400 * GB * OK_HEADROOM * 0.999, "tight"),
        (400 * GB * TIGHT_HEADROOM, "tight"),
        (400 * GB * 0.999, "short"),
    ],
)
def test_verdict_thresholds(declared, verdict):
    assert plan_bandwidth(SEED, shared=SharedTier("pfs", declared)).verdict == verdict


def test_unknown_without_declared_bandwidth():
    p = plan_bandwidth(SEED)
    assert (p.verdict, p.headroom, p.shared_tier) == ("unknown", None, None)
    assert any("no declared read bandwidth for shared tier" in n for n in p.notes)
    # a cache on an undeclared node tier carries load too
    p = plan_bandwidth(SEED, NodeCache(3 * TB, lambda b: 0.5), PFS)
    assert p.verdict == "unknown" and p.shared_headroom == approx(2.0)


def test_notes_for_budget_over_capacity_and_hot_set():
    w = Workload(8, 8, 100, 1000, 10 * TB, 1000, hot_set_bytes=2 * TB)
    cache = NodeCache(TB, lambda b: 0.5, GB, capacity=TB // 2, name="nvme")
    notes = plan_bandwidth(w, cache, PFS).notes
    assert any("exceeds the node tier's capacity" in n for n in notes)
    assert any("hot shards (2 TB) do not fit" in n for n in notes)


def test_tiny_dataset_note_says_it_cannot_be_cut():
    w = Workload(1024, 8, 3125, 125_000, dataset_bytes=50_000, num_shards=4)
    (note,) = plan_bandwidth(w, shared=PFS).notes
    assert "too small to cut into that many shards" in note


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: Workload(1001, 8, 1, 1, 0, 0), "multiple of gpus_per_node"),
        (lambda: Workload(0, 8, 1, 1, 0, 0), "gpus must be"),
        (lambda: Workload(8, 8, 0, 1, 0, 0), "samples_per_gpu_per_s must be > 0"),
        (lambda: Workload(8, 8, 1, math.inf, 0, 0), "bytes_per_sample must be finite"),
        (lambda: Workload(8, 8, 1, 1, -1, 0), "dataset_bytes"),
        (lambda: NodeCache(5), "needs a coverage function"),
        (lambda: NodeCache(-1), "hot budget"),
        (lambda: SharedTier("pfs", 0), "pfs read_bandwidth"),
        (lambda: LoaderModel(batch_size=0), "batch_size"),
        (lambda: LoaderModel(latency_s=-1), "latency_s"),
        (lambda: LoaderModel(worker_bytes_per_s=0), "worker_bytes_per_s"),
        (lambda: plan_bandwidth(SEED, NodeCache(5, lambda b: 1.5)), "expected a share"),
        (lambda: plan_bandwidth(SEED, NodeCache(5, lambda b: math.nan)), "expected a share"),
    ],
)
def test_bad_inputs(make, words):
    with pytest.raises(BandwidthPlanError, match=words):
        make()


@given(
    nodes=st.integers(1, 512),
    gpus_per_node=st.integers(1, 16),
    rate=st.floats(0.1, 1e5),
    size=st.floats(1.0, 1e8),
    share=st.floats(0.0, 1.0),
    declared=st.floats(1e6, 1e13),
)
def test_invariants(nodes, gpus_per_node, rate, size, share, declared):
    """Node-served plus shared bytes add up to the demand, headroom is declared / needed,
    and the recommendations respect their floors."""
    w = Workload(nodes * gpus_per_node, gpus_per_node, rate, size, 10**12, 0)
    p = plan_bandwidth(
        w, NodeCache(1, lambda b: share, 1e12, name="nvme"), SharedTier("s", declared)
    )
    assert p.node_served_bytes_per_s * nodes + p.shared_needed_bytes_per_s == pytest.approx(
        p.aggregate_bytes_per_s
    )
    if p.shared_needed_bytes_per_s > 0:
        assert p.shared_headroom == pytest.approx(declared / p.shared_needed_bytes_per_s)
    assert p.headroom == min(h for h in (p.node_headroom, p.shared_headroom) if h is not None)
    assert p.workers_per_rank >= 1 and p.prefetch_depth >= 2
    assert p.min_shards >= nodes * MIN_SHARDS_PER_NODE


# --------------------------------------------------------------------------------------------
# the command


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


SEED_FLAGS = ("--gpus", "1024", "--gpus-per-node", "8", "--samples-per-gpu-per-s", "3125")


@pytest.fixture
def dataset(make_small_dataset):
    root, manifest, _ = make_small_dataset()
    return root, manifest


@pytest.fixture
def tiers(tmp_path):
    path = tmp_path / "tiers.toml"
    path.write_text(EXAMPLE_TIERS, encoding="utf-8")
    return path


def test_help_explains_the_flags(capsys):
    with pytest.raises(SystemExit) as info:
        main(["plan", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for flag in (
        "--gpus",
        "--gpus-per-node",
        "--samples-per-gpu-per-s",
        "--tiers",
        "--hot-budget",
        "--hot-coverage",
        "--bytes-per-sample",
        "--worker-mb-per-s",
        "--latency-ms",
        "--batch-size",
        "--json",
        "10^9",
    ):
        assert flag in out


def test_cli_json_models_the_seed_case(capsys, dataset, tiers):
    """Case 2 through the CLI on a small real dataset: --bytes-per-sample 125KB models the
    seed's samples; with no hot index, a 10% budget serves 10% (uniform access), so the shared
    tier needs 0.9 x 400 = 360 GB/s (400 / 360 = 1.11x, tight); --hot-coverage 0.6 gives case
    2's 160 GB/s and 2.5x."""
    root, manifest = dataset
    payload = sum(s.payload_bytes for s in manifest.shards)
    argv = ["plan", str(root), *SEED_FLAGS, "--bytes-per-sample", "125KB", "--tiers", str(tiers)]
    rc, out, _ = run_cli(capsys, *argv, "--hot-budget", "10%", "--json")
    assert rc == 0
    doc = json.loads(out)
    inputs, plan = doc["inputs"], doc["plan"]
    assert inputs["bytes_per_sample"] == 125_000
    assert inputs["bytes_per_sample_source"] == "--bytes-per-sample"
    assert inputs["hot_budget_bytes"] == int(0.1 * payload)
    assert inputs["coverage_source"].startswith("uniform access")
    assert inputs["num_shards"] == len(manifest.shards)
    assert plan["aggregate_bytes_per_s"] == approx(400 * GB)
    assert plan["per_node_bytes_per_s"] == approx(3.125 * GB)
    assert (plan["node_tier"], plan["shared_tier"]) == ("nvme", "pfs")
    assert plan["node_share"] == pytest.approx(0.1, abs=1e-3)
    assert plan["shared_needed_bytes_per_s"] == pytest.approx(360 * GB, rel=1e-2)
    assert plan["verdict"] == "tight"
    assert plan["thresholds"] == {"ok": 1.2, "tight": 1.0}
    assert (plan["workers_per_rank"], plan["prefetch_depth"], plan["min_shards"]) == (4, 2, 4096)
    assert plan["shards_ok"] is False and plan["notes"]

    rc, out, _ = run_cli(capsys, *argv, "--hot-budget", "10%", "--hot-coverage", "0.6", "--json")
    plan = json.loads(out)["plan"]
    assert plan["shared_needed_bytes_per_s"] == approx(160 * GB)
    assert (plan["shared_headroom"], plan["node_headroom"]) == (approx(2.5), approx(6.4))
    assert (plan["verdict"], plan["limiting_tier"]) == ("ok", "pfs")


def test_cli_defaults_from_manifest_and_tiers(capsys, dataset, tiers):
    """Without --bytes-per-sample, S = sum(shard bytes) / samples; without --hot-budget the
    budget is the node tier's 3.5 TB, which holds this tiny dataset whole: node share 1."""
    root, manifest = dataset
    rc, out, _ = run_cli(capsys, "plan", str(root), *SEED_FLAGS, "--tiers", str(tiers), "--json")
    assert rc == 0
    inputs, plan = (json.loads(out)[k] for k in ("inputs", "plan"))
    disk = sum(s.bytes for s in manifest.shards)
    assert inputs["bytes_per_sample"] == approx(disk / manifest.num_samples)
    assert inputs["hot_budget_bytes"] == 3_500 * 10**9
    assert inputs["hot_budget_source"] == "capacity of node tier nvme"
    assert plan["aggregate_bytes_per_s"] == approx(1024 * 3125 * disk / manifest.num_samples)
    assert plan["node_share"] == 1.0 and plan["shared_needed_bytes_per_s"] == 0.0
    assert plan["verdict"] == "ok" and plan["limiting_tier"] == "nvme"


def test_cli_human_output(capsys, dataset, tiers):
    root, _ = dataset
    rc, out, _ = run_cli(
        capsys, "plan", str(root), *SEED_FLAGS, "--bytes-per-sample", "125KB",
        "--tiers", str(tiers), "--hot-budget", "0",
    )  # fmt: skip
    assert rc == 0
    for text in (
        "1,024 GPUs = 128 nodes x 8",
        "per node     3.125 GB/s",
        "aggregate    400 GB/s",
        "needs        400 GB/s (declared 400 GB/s, headroom 1.00x)",
        "verdict: TIGHT, headroom 1.00x on pfs",
        "4 workers per rank",
        "at least 4,096 for this world",
        "note: the dataset has",
    ):
        assert text in out, out


def test_cli_without_tiers_has_no_verdict(capsys, dataset):
    root, _ = dataset
    rc, out, _ = run_cli(capsys, "plan", str(root), *SEED_FLAGS)
    assert rc == 0
    assert "verdict: UNKNOWN" in out and "declare the tiers" in out


def test_cli_uses_the_hot_index(capsys, dataset, tiers, monkeypatch):
    """The contract with shardfeed.hot: load_hot_index(dataset).coverage(budget_bytes)."""
    import shardfeed.hot

    asked = []

    class FakeHot:
        def coverage(self, budget_bytes: int) -> float:
            asked.append(budget_bytes)
            return 0.75

    monkeypatch.setattr(shardfeed.hot, "load_hot_index", lambda ds: FakeHot())
    root, _ = dataset
    rc, out, _ = run_cli(
        capsys, "plan", str(root), *SEED_FLAGS, "--bytes-per-sample", "125KB",
        "--tiers", str(tiers), "--hot-budget", "2KB", "--json",
    )  # fmt: skip
    assert rc == 0
    inputs, plan = (json.loads(out)[k] for k in ("inputs", "plan"))
    assert asked == [2000] and inputs["coverage_source"] == "hot index"
    assert plan["shared_needed_bytes_per_s"] == approx(100 * GB)  # 0.25 x 400


def test_cli_with_a_real_hot_index(capsys, dataset, tiers, tmp_path):
    """A hot index built by ``shardfeed hot`` from a skewed access log serves more than the
    uniform share at the same budget."""
    root, _ = dataset
    log = tmp_path / "access.txt"
    log.write_text("\n".join(["0"] * 50 + ["1"] * 30 + [str(i) for i in range(100)]) + "\n")
    assert run_cli(capsys, "hot", str(root), "--access-log", str(log))[0] == 0
    rc, out, _ = run_cli(
        capsys, "plan", str(root), *SEED_FLAGS, "--tiers", str(tiers), "--hot-budget", "10%",
        "--json",
    )  # fmt: skip
    assert rc == 0
    inputs, plan = (json.loads(out)[k] for k in ("inputs", "plan"))
    assert inputs["coverage_source"] == "hot index"
    assert plan["node_share"] > 0.3  # uniform would be 0.1


@pytest.mark.parametrize(
    ("argv", "code", "words"),
    [
        (["--gpus", "1001", "--gpus-per-node", "8", "--samples-per-gpu-per-s", "1"], 1, "multiple"),
        ([*SEED_FLAGS, "--hot-coverage", "0.5"], 2, "--hot-coverage needs a node cache"),
        ([*SEED_FLAGS, "--hot-budget", "10 potatoes"], 2, "invalid size"),
        ([*SEED_FLAGS, "--hot-budget", "150%"], 2, "within 0..100"),
        ([*SEED_FLAGS, "--hot-coverage", "1.5"], 2, "0..1"),
        ([*SEED_FLAGS, "--bytes-per-sample", "0"], 2, "must be > 0"),
        (["--gpus", "0", "--gpus-per-node", "8", "--samples-per-gpu-per-s", "1"], 2, "> 0"),
        ([*SEED_FLAGS, "--tiers", "/nonexistent/tiers.toml"], 1, "FileNotFoundError"),
    ],
)
def test_cli_errors(capsys, dataset, argv, code, words):
    root, _ = dataset
    if code == 2 and "needs a node cache" not in words:
        with pytest.raises(SystemExit) as info:
            main(["plan", str(root), *argv])
        assert info.value.code == 2
        assert words in capsys.readouterr().err
        return
    rc, _, err = run_cli(capsys, "plan", str(root), *argv)
    assert rc == code and words in err, err


def test_cli_bad_tier_config_names_the_field(capsys, dataset, tmp_path):
    root, _ = dataset
    path = tmp_path / "tiers.toml"
    path.write_text(EXAMPLE_TIERS.replace('hot = ["nvme", "pfs"]', 'hot = ["ssd"]'))
    rc, _, err = run_cli(capsys, "plan", str(root), *SEED_FLAGS, "--tiers", str(path))
    assert rc == 1
    assert "field 'policy.hot[0]': unknown tier 'ssd'" in err and str(path) in err


def test_cli_missing_dataset(capsys, tmp_path):
    rc, _, err = run_cli(capsys, "plan", str(tmp_path / "nope"), *SEED_FLAGS)
    assert rc == 1 and "manifest" in err

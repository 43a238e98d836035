"""Assignments end to end: plan, save, load, resume, refuse, and the CLI views."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from shardfeed.assignment import (
    AssignmentError,
    World,
    assign,
    load_assignment,
    plan_assignment,
    resume,
)
from shardfeed.cli.main import main
from shardfeed.formats.dataset_writer import write_dataset
from shardfeed.formats.reader import open_dataset
from shardfeed.formats.sample_index import read_sample_bytes
from shardfeed.schemas.errors import SchemaError

CORPORA = os.environ.get("SHARDFEED_CORPORA")
SPEC = {"text": {"dtype": "string", "shape": [1]}, "id": {"dtype": "int64", "shape": [1]}}


def text_dataset(root: Path, n: int = 6000, seed: int = 0) -> Path:
    """Long-tailed text rows (lognormal lengths) in about 20 shards."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum(rng.lognormal(5, 1.0, n).astype(int) + 1, 20_000)
    write_dataset(
        root,
        SPEC,
        {"text": ["x" * int(k) for k in lengths], "id": [[i] for i in range(n)]},
        target_shard_size=int(lengths.sum() // 20),
        row_group_size=int(lengths.sum() // 80),
    )
    return root


def global_ids(assignment, ds, rank: int, epoch: int) -> np.ndarray:
    starts = np.array([s.index_start for s in ds.manifest.shards])
    out = []
    for worker in range(assignment.world.workers):
        spans = assignment.spans(rank, worker, epoch)
        for shard, a, b in zip(spans.shard, spans.start, spans.end, strict=True):
            out.append(np.arange(starts[shard] + a, starts[shard] + b))
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def test_assign_save_load_and_read_every_rank(tmp_path):
    root = text_dataset(tmp_path / "ds")
    world = World(3, 2, 2)
    planned = assign(root, world, name="run1", epochs=2, seed=5)
    loaded = load_assignment(root, "run1")
    assert loaded.header == planned.header
    assert loaded.epochs == (0, 1)
    sizes = read_sample_bytes(root).astype(np.int64)
    with open_dataset(root) as ds:
        for epoch in (0, 1):
            ids = [global_ids(loaded, ds, r, epoch) for r in range(world.ranks)]
            counts = {len(i) for i in ids}
            assert counts == {loaded.header.counts(epoch).samples_per_rank}  # equal per rank
            every = np.concatenate(ids)
            np.testing.assert_array_equal(np.unique(every), np.arange(len(ds)))  # pad: all read
            loads = np.array([sizes[i].sum() for i in ids])
            assert loads.max() / loads.mean() <= 1.02
            # the reader returns exactly the rows a span names: the id column is the global row
            spans = loaded.spans(4, 1, epoch)
            shard = int(spans.shard[0])
            first = ds.shards[shard].index_start + int(spans.start[0])
            batch = ds.read(first, first + int(spans.end[0] - spans.start[0]), ["id"])
            np.testing.assert_array_equal(
                batch["id"].reshape(-1), np.arange(first, first + len(batch["id"]))
            )
    report = loaded.report(1)
    assert report["samples_equal"] and report["bytes_max_over_mean"] <= 1.02
    assert sum(r["spans"] for r in report["ranks"]) == loaded.header.counts(1).spans


def test_load_refuses_another_dataset_a_modified_table_and_a_missing_name(tmp_path):
    first = text_dataset(tmp_path / "a", seed=1)
    other = text_dataset(tmp_path / "b", seed=2)
    assign(first, World(2, 2), name="plan")
    shutil.copytree(first / "meta/shardfeed/assignments", other / "meta/shardfeed/assignments")
    with pytest.raises(AssignmentError, match=r"planned for dataset sha256:.*not this one"):
        load_assignment(other, "plan")
    table = first / "meta/shardfeed/assignments/plan.parquet"
    data = bytearray(table.read_bytes())
    data[len(data) // 2] ^= 0xFF
    table.write_bytes(bytes(data))
    with pytest.raises(AssignmentError, match="does not match its header"):
        load_assignment(first, "plan")
    with pytest.raises(AssignmentError, match="no assignment named 'nope'"):
        load_assignment(first, "nope")
    header = first / "meta/shardfeed/assignments/plan.json"
    header.write_text(header.read_text().replace('"nodes": 2', '"nodes": 0'))
    with pytest.raises(SchemaError, match=r"world\.nodes.*must be >= 1"):
        load_assignment(first, "plan")


def test_names_and_overwrite(tmp_path):
    root = text_dataset(tmp_path / "ds", n=2000)
    with pytest.raises(SchemaError, match="not a valid assignment name"):
        assign(root, World(1, 2), name="../escape")
    assign(root, World(1, 2), name="x")
    with pytest.raises(AssignmentError, match="already has an assignment named 'x'"):
        assign(root, World(1, 2), name="x")
    assert assign(root, World(2, 2), name="x", overwrite=True).world == World(2, 2)


def test_resume_on_a_smaller_world_loses_and_repeats_nothing(tmp_path):
    root = text_dataset(tmp_path / "ds")
    old = assign(root, World(4, 2, 2), name="big", epochs=2, batch_size=4, mode="drop")
    seen = 40 * 4 * old.world.ranks  # 40 steps of batch 4 on 8 ranks
    rest = resume(old, 1, seen, World(3, 2, 1)).save()
    reloaded = load_assignment(root, rest.name)
    assert reloaded.header.resumed_from.name == "big"
    with open_dataset(root) as ds:
        plan = old.epoch_plan(1)
        from shardfeed.planning.resume import consumed_per_worker

        done = consumed_per_worker(plan.samples_per_rank, 2, 4, seen // 8)
        consumed = np.concatenate(
            [global_ids_worker(old, ds, r, w, 1)[: done[w]] for r in range(8) for w in range(2)]
        )
        epoch_set = np.concatenate([global_ids(old, ds, r, 1) for r in range(8)])
        resumed = np.concatenate([global_ids(reloaded, ds, r, 1) for r in range(6)])
    assert not np.intersect1d(consumed, resumed).size
    assert len(np.unique(resumed)) == len(resumed)
    missing = np.setdiff1d(epoch_set, np.union1d(consumed, resumed))
    assert len(missing) == reloaded.header.counts(1).dropped


def global_ids_worker(assignment, ds, rank, worker, epoch):
    starts = np.array([s.index_start for s in ds.manifest.shards])
    spans = assignment.spans(rank, worker, epoch)
    parts = [
        np.arange(starts[s] + a, starts[s] + b)
        for s, a, b in zip(spans.shard, spans.start, spans.end, strict=True)
    ]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def test_cli_assign_inspect_json_rank_and_plot(tmp_path, capsys):
    root = text_dataset(tmp_path / "ds")
    args = ["assign", str(root), "--nodes", "2", "--gpus-per-node", "4", "--workers", "2"]
    assert main([*args, "--epochs", "2", "--batch-size", "8", "--drop-last", "--name", "cli"]) == 0
    out = capsys.readouterr().out
    assert "assignment cli: 2 nodes x 4 GPUs x 2 workers, mode drop" in out
    assert main(["inspect", str(root), "--assignment", "cli", "--epoch", "1", "--json"]) == 0
    view = json.loads(capsys.readouterr().out)["assignment"]
    assert view["samples_equal"] is True and view["bytes_max_over_mean"] <= 1.02
    assert [r["rank"] for r in view["ranks"]] == list(range(8))
    assert {r["samples"] for r in view["ranks"]} == {view["samples_per_rank"]}
    assert (
        view["samples_per_rank"] % 8 == 0 and view["dropped"] == 6000 - 8 * view["samples_per_rank"]
    )
    assert all(set(r) >= {"rank", "node", "samples", "bytes", "spans"} for r in view["ranks"])
    plot = tmp_path / "plan.png"
    assert (
        main(
            [
                "inspect",
                str(root),
                "--assignment",
                "cli",
                "--rank",
                "5",
                "--json",
                "--plot",
                str(plot),
            ]
        )
        == 0
    )
    one = json.loads(capsys.readouterr().out)["assignment"]
    assert [r["rank"] for r in one["ranks"]] == [5]
    assert sum(s["row_end"] - s["row_start"] for s in one["rank_spans"]) == one["samples_per_rank"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 10_000
    assert main(["inspect", str(root), "--assignment", "cli", "--rank", "2"]) == 0
    text = capsys.readouterr().out
    assert "samples/rank" in text and "data/chunk-000/file-0" in text
    assert main(["inspect", str(root), "--assignment", "cli", "--rank", "99"]) == 2
    assert "outside the world's 8 ranks" in capsys.readouterr().err
    assert main(["inspect", str(root), "--assignment", "missing"]) == 1
    assert "no assignment named 'missing'" in capsys.readouterr().err
    resumed = [
        *args,
        "--name",
        "r",
        "--resume-from",
        "cli",
        "--resume-epoch",
        "0",
        "--samples-seen",
        "640",
    ]
    assert main(resumed) == 0
    assert "resumed from cli epoch 0" in capsys.readouterr().out


def test_row_group_runs_are_counted_and_many_per_group_get_a_note(tmp_path, capsys):
    """The report counts runs of one worker's rows inside one row group (at most one decode
    each); the CLI says when ranks will share row groups heavily, and why."""
    root = text_dataset(tmp_path / "ds")
    with open_dataset(root) as ds:
        starts = np.cumsum([0, *(n for s in ds.manifest.shards for n in s.row_groups)])
        for world, noted in ((World(2, 4, 2), False), (World(4, 4, 2), True)):
            planned = plan_assignment(ds, world, batch_size=8)
            runs = planned.report(0)["row_group_runs"]
            expected, touched = 0, set()
            for rank in range(world.ranks):
                for worker in range(world.workers):
                    spans = planned.spans(rank, worker, 0)
                    base = np.array([s.index_start for s in ds.manifest.shards])[spans.shard]
                    ids = np.concatenate(
                        [
                            np.arange(a, b)
                            for a, b in zip(base + spans.start, base + spans.end, strict=True)
                        ]
                    )
                    group = np.searchsorted(starts, ids, side="right") - 1
                    expected += int(np.sum(np.r_[True, group[1:] != group[:-1]]))
                    touched.update(group.tolist())
            assert runs["runs"] == expected and runs["groups"] == len(touched)
            assert (runs["runs_per_group"] > 1.5) == noted
            args = ["assign", str(root), "--nodes", str(world.nodes), "--overwrite"]
            args += ["--gpus-per-node", str(world.gpus_per_node), "--workers", str(world.workers)]
            assert main([*args, "--batch-size", "8", "--name", "n"]) == 0
            out = capsys.readouterr().out
            assert ("note: loaders will decode up to" in out) == noted
            assert f"{runs['runs_per_group']:.2f}" in out
    assert main(["inspect", str(root), "--assignment", "n"]) == 0
    assert "runs in" in capsys.readouterr().out


def test_dataset_without_sample_index_gets_a_clear_error(tmp_path, capsys):
    root = text_dataset(tmp_path / "ds", n=1500)
    (root / "meta/shardfeed/samples.parquet").unlink()
    assert main(["assign", str(root), "--nodes", "1", "--gpus-per-node", "2", "--name", "a"]) == 1
    assert "samples.parquet" in capsys.readouterr().err


def test_assignment_api_does_not_import_beam(tmp_path):
    code = (
        "import sys; sys.modules['apache_beam'] = None\n"
        "from shardfeed.assignment import plan_assignment, load_assignment, resume, World\n"
        "import shardfeed.cli.assign_cmd, shardfeed.cli.assignment_view\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


@pytest.mark.skipif(not CORPORA, reason="SHARDFEED_CORPORA is not set (scripts/test.sh sets it)")
def test_real_lerobot_dataset_assignment_reads_whole_episodes_frames(tmp_path, capsys):
    """reachy2 (v3.0, real robot data) converted, then planned for 2 x 2 ranks: every rank's
    spans read back through the reader cover each frame once, with equal counts."""
    pytest.importorskip("apache_beam")
    src = Path(CORPORA, "lerobot_v30_reachy2_apple_storage")
    dst = tmp_path / "out"
    assert main(["convert", str(src), str(dst), "--target-shard-size", "60KB"]) == 0
    capsys.readouterr()
    planned = plan_assignment(dst, World(2, 2, 2), mode="drop", seed=3)
    with open_dataset(dst) as ds:
        ids = [global_ids(planned, ds, r, 0) for r in range(4)]
        assert {len(i) for i in ids} == {len(ds) // 4}
        every = np.concatenate(ids)
        assert len(np.unique(every)) == len(every) == 4 * (len(ds) // 4)
        frames = np.concatenate(
            [ds.read(int(i), int(i) + 1, ["index"])["index"] for i in ids[0][:50]]
        )
        np.testing.assert_array_equal(frames, ids[0][:50])
    assert planned.report(0)["bytes_max_over_mean"] <= 1.02

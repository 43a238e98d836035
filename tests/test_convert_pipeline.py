"""The Beam conversion pipeline end to end, through the CLI, on the in-process runner."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

pytest.importorskip("apache_beam")

from shardfeed import open_dataset
from shardfeed.cli.main import main
from shardfeed.formats.verify import verify_dataset

CORPORA = os.environ.get("SHARDFEED_CORPORA")
needs_corpora = pytest.mark.skipif(
    not CORPORA, reason="SHARDFEED_CORPORA is not set (scripts/test.sh sets it)"
)


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _jsonl_corpus(root: Path, n: int = 400, seed: int = 0, bad: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    sizes = rng.lognormal(6, 1.0, n).astype(int) + 1
    lines = [
        json.dumps({"text": "x" * int(s), "id": i, "score": float(i) / 7, "meta": {"k": i % 3}})
        for i, s in enumerate(sizes)
    ]
    for j in range(bad):
        lines.insert(5 + j * 3, "{not json" if j % 2 == 0 else json.dumps({"id": -j}))
    (root / "part-0.jsonl").write_text("\n".join(lines[: len(lines) // 2]) + "\n")
    (root / "part-1.jsonl").write_text("\n".join(lines[len(lines) // 2 :]) + "\n")
    return root


@needs_corpora
def test_lerobot_v30_frames_equal_their_source(tmp_path, capsys):
    src = Path(CORPORA, "lerobot_v30_reachy2_apple_storage")
    dst = tmp_path / "out"
    assert main(["convert", str(src), str(dst), "--target-shard-size", "60KB", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["samples_out"] == 899 and summary["rejects"]["total"] == 0
    assert any("total_frames=14983" in note for note in summary["notes"])
    ds = open_dataset(dst)
    assert len(ds) == 899 and ds.info.total_episodes == 3
    out = ds.read(0, len(ds))
    np.testing.assert_array_equal(out["index"], np.arange(899))
    source = pq.read_table(src / "data/chunk-000/file-000.parquet")
    episodes = pq.read_table(dst / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert sorted(e["source_episode_index"] for e in episodes) == [0, 1, 2]
    for ep in episodes:
        a, b = ep["dataset_from_index"], ep["dataset_to_index"]
        assert set(out["episode_index"][a:b].tolist()) == {ep["episode_index"]}
        src_rows = source.filter(
            np.asarray(source.column("episode_index")) == ep["source_episode_index"]
        )
        assert src_rows.num_rows == b - a == ep["length"]
        np.testing.assert_array_equal(
            out["observation.state"][a:b],
            np.array(src_rows.column("observation.state").to_pylist(), np.float32),
        )
        np.testing.assert_array_equal(
            out["frame_index"][a:b], src_rows.column("frame_index").to_numpy()
        )
        np.testing.assert_array_equal(
            out["timestamp"][a:b], src_rows.column("timestamp").to_numpy()
        )
    stats = json.loads((dst / "meta/stats.json").read_text())
    np.testing.assert_allclose(
        stats["action"]["mean"], out["action"].astype(np.float64).mean(axis=0), rtol=1e-6
    )
    np.testing.assert_allclose(
        stats["action"]["std"], out["action"].astype(np.float64).std(axis=0), rtol=1e-6
    )
    np.testing.assert_array_equal(stats["action"]["min"], out["action"].min(axis=0))
    np.testing.assert_array_equal(stats["action"]["max"], out["action"].max(axis=0))
    # 899 frames are below the sketch size, so quantiles are exact (inverted-CDF, docs/FORMAT.md)
    for key, q in {"q01": 0.01, "q10": 0.1, "q50": 0.5, "q90": 0.9, "q99": 0.99}.items():
        expected = np.quantile(out["action"].astype(np.float64), q, axis=0, method="inverted_cdf")
        np.testing.assert_allclose(stats["action"][key], expected, rtol=1e-6)
    assert verify_dataset(dst).ok


def test_jsonl_is_balanced_and_deterministic_across_running_modes(tmp_path):
    src = _jsonl_corpus(tmp_path / "src", n=3000)
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(["convert", str(src), str(one), "--target-shard-size", "150KB"]) == 0
    assert (
        main(
            [
                "convert",
                str(src),
                str(two),
                "--target-shard-size",
                "150KB",
                "--direct_running_mode=multi_processing",
                "--direct_num_workers=2",
            ]
        )
        == 0
    )
    assert _tree(one) == _tree(two)
    threads = tmp_path / "threads"
    multi_threading = ["--direct_running_mode=multi_threading", "--direct_num_workers=2"]
    assert (
        main(["convert", str(src), str(threads), "--target-shard-size", "150KB", *multi_threading])
        == 0
    )
    assert _tree(one) == _tree(threads)
    ds = open_dataset(one)
    assert len(ds) == 3000 and len(ds.shards) >= 5
    payload = [s.payload_bytes for s in ds.shards]
    assert max(payload) / np.mean(payload) <= 1.02
    # every source record arrives exactly once, shuffled
    ids = ds.read(0, len(ds), columns=["id"])["id"]
    assert sorted(ids.tolist()) == list(range(3000)) and ids.tolist() != list(range(3000))
    assert not (one / ".shardfeed-work").exists()


def test_dask_local_cluster_gives_byte_identical_output(tmp_path):
    pytest.importorskip("distributed")
    src = _jsonl_corpus(tmp_path / "src", n=1500, bad=2)
    local, dask = tmp_path / "local", tmp_path / "dask"
    args = ["--target-shard-size", "80KB", "--max-reject-fraction", "0.1"]
    assert main(["convert", str(src), str(local), *args]) == 0
    assert main(["convert", str(src), str(dask), *args, "--dask-local-workers", "2"]) == 0
    assert _tree(local) == _tree(dask)
    assert len(open_dataset(dask).shards) >= 5


def test_bad_records_become_rejects_and_the_threshold_publishes_nothing(tmp_path, capsys):
    src = _jsonl_corpus(tmp_path / "src", n=200, bad=4)
    dst = tmp_path / "dst"
    assert main(["convert", str(src), str(dst), "--max-reject-fraction", "0.5", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["rejects"] == {"total": 4, "by_reason": {"field_missing": 2, "json_invalid": 2}}
    manifest = json.loads((dst / "meta/shardfeed/manifest.json").read_text())
    assert manifest["rejects"] == summary["rejects"]
    reject_files = [
        f["path"] for f in manifest["files"] if f["path"].startswith("meta/shardfeed/rejects/")
    ]
    records = [
        json.loads(line) for p in reject_files for line in (dst / p).read_text().splitlines()
    ]
    assert sorted(r["reason"] for r in records) == [
        "field_missing",
        "field_missing",
        "json_invalid",
        "json_invalid",
    ]
    assert all(
        r["source"].endswith(".jsonl") and r["position"].startswith("line:") for r in records
    )
    assert verify_dataset(dst).ok

    strict = tmp_path / "strict"
    assert main(["convert", str(src), str(strict), "--max-reject-fraction", "0.001"]) == 1
    err = capsys.readouterr().err
    assert "exceeds --max-reject-fraction" in err and "Traceback" not in err
    assert not (strict / "meta/shardfeed/manifest.json").exists()


def test_published_dst_is_refused_without_overwrite(tmp_path, capsys):
    src = _jsonl_corpus(tmp_path / "src", n=50)
    dst = tmp_path / "dst"
    assert main(["convert", str(src), str(dst)]) == 0
    capsys.readouterr()
    assert main(["convert", str(src), str(dst)]) == 1
    assert "--overwrite" in capsys.readouterr().err
    assert main(["convert", str(src), str(dst), "--overwrite", "--shuffle-seed", "7"]) == 0
    assert (
        json.loads((dst / "meta/shardfeed/manifest.json").read_text())["provenance"][
            "content_options"
        ]["shuffle_seed"]
        == 7
    )


def test_image_folder_converts_with_labels(tmp_path):
    from PIL import Image

    src = tmp_path / "imgs"
    expected = {}
    for label, name in enumerate(["cat", "dog"]):
        (src / name).mkdir(parents=True)
        for i in range(6):
            path = src / name / f"{i}.png"
            Image.new("RGB", (8 + i, 8), (label * 100, i * 20, 0)).save(path)
            expected[f"{name}/{i}.png"] = (label, path.read_bytes())
    dst = tmp_path / "dst"
    assert main(["convert", str(src), str(dst), "--target-shard-size", "1KB"]) == 0
    ds = open_dataset(dst)
    rows = ds.read(0, len(ds))
    assert len(ds) == 12
    for path, label, image in zip(rows["path"], rows["label"], rows["image"], strict=True):
        assert (label, image) == expected[path]


def test_image_policy_rejects_bad_images_and_reencodes(tmp_path, capsys):
    from io import BytesIO

    from PIL import Image

    src = tmp_path / "imgs"
    (src / "a").mkdir(parents=True)
    for i in range(8):
        Image.new("RGB", (64, 32), (i * 30, 0, 0)).save(src / "a" / f"{i}.png")
    good = (src / "a" / "0.png").read_bytes()
    (src / "a" / "truncated.png").write_bytes(good[: len(good) // 2])
    (src / "a" / "empty.jpg").write_bytes(b"")
    (src / "a" / "text.png").write_bytes(b"not an image at all")
    dst = tmp_path / "dst"
    args = [
        "--max-reject-fraction",
        "0.5",
        "--image-format",
        "jpeg",
        "--max-image-side",
        "16",
        "--json",
    ]
    assert main(["convert", str(src), str(dst), *args]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["rejects"]["by_reason"] == {
        "image_empty": 1,
        "image_not_image": 1,
        "image_truncated": 1,
    }
    ds = open_dataset(dst)
    assert len(ds) == 8
    for blob in ds.read(0, 8)["image"]:
        img = Image.open(BytesIO(blob))
        assert img.format == "JPEG" and img.size == (16, 8)
    options = ds.manifest.provenance.content_options
    assert (options["validate"], options["image_format"], options["max_image_side"]) == (
        "full",
        "jpeg",
        16,
    )
    # header mode does not decode pixels, so the truncated PNG passes as a sample
    loose = tmp_path / "loose"
    assert (
        main(
            [
                "convert",
                str(src),
                str(loose),
                "--validate",
                "header",
                "--max-reject-fraction",
                "0.5",
            ]
        )
        == 0
    )
    assert len(open_dataset(loose)) == 9


def test_no_shuffle_keeps_source_order_in_even_contiguous_shards(tmp_path):
    src = _jsonl_corpus(tmp_path / "src", n=2000)
    dst = tmp_path / "dst"
    assert (
        main(["convert", str(src), str(dst), "--no-shuffle", "--target-shard-size", "100KB"]) == 0
    )
    ds = open_dataset(dst)
    assert ds.read(0, len(ds), columns=["id"])["id"].tolist() == list(range(2000))
    payload = [s.payload_bytes for s in ds.shards]
    biggest_record = max(len(t) for t in ds.read(0, len(ds), columns=["text"])["text"])
    assert len(payload) >= 5
    # contiguous cuts at the nearest record boundary: every shard within about one record of the mean
    assert max(abs(p - np.mean(payload)) for p in payload) <= biggest_record + 200
    assert ds.manifest.provenance.content_options["shuffle_seed"] is None


@needs_corpora
def test_no_shuffle_lerobot_keeps_episodes_in_source_order(tmp_path):
    src = Path(CORPORA, "lerobot_v21_unitree_g1")
    dst = tmp_path / "dst"
    assert (
        main(
            [
                "convert",
                str(src),
                str(dst),
                "--drop-videos",
                "--no-shuffle",
                "--target-shard-size",
                "1MB",
            ]
        )
        == 0
    )
    episodes = pq.read_table(dst / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert [e["source_episode_index"] for e in episodes] == list(range(100))
    assert [e["episode_index"] for e in episodes] == list(range(100))
    ds = open_dataset(dst)
    assert len(ds) == 35965 and len(ds.shards) >= 5
    first = pq.read_table(src / "data/chunk-000/episode_000000.parquet")
    np.testing.assert_array_equal(
        ds.read(0, first.num_rows)["action"],
        np.array(first.column("action").to_pylist(), np.float32),
    )


def test_progress_line_and_takeover_of_an_interrupted_run(tmp_path, capsys):
    src = _jsonl_corpus(tmp_path / "src", n=600)
    clean = tmp_path / "clean"
    assert main(["convert", str(src), str(clean), "--target-shard-size", "40KB", "--progress"]) == 0
    err = capsys.readouterr().err
    shards = len(open_dataset(clean).shards)
    assert f"files 2/2  shards {shards}/{shards}  samples 600" in err
    # leftovers of an interrupted run: a work dir and a stray shard, no manifest
    dst = tmp_path / "dst"
    (dst / ".shardfeed-work" / "units").mkdir(parents=True)
    (dst / "data" / "chunk-000").mkdir(parents=True)
    (dst / "data" / "chunk-000" / "file-000.parquet").write_bytes(b"half a shard")
    assert main(["convert", str(src), str(dst), "--target-shard-size", "40KB"]) == 0
    assert _tree(dst) == _tree(clean)


def test_a_rerun_reuses_the_shards_an_interrupted_run_finished(tmp_path, capsys, monkeypatch):
    import shardfeed.pipelines.convert as graph

    src = _jsonl_corpus(tmp_path / "src", n=600)
    args = ["--target-shard-size", "40KB"]
    clean = tmp_path / "clean"
    assert main(["convert", str(src), str(clean), *args]) == 0
    dst = tmp_path / "dst"
    real_build_shard = graph.build_shard
    calls = []

    def crash_on_third_shard(root, number, *a, **kw):
        calls.append(number)
        if len(calls) == 3:
            raise RuntimeError(f"simulated crash while writing shard {number}")
        return real_build_shard(root, number, *a, **kw)

    monkeypatch.setattr(graph, "build_shard", crash_on_third_shard)
    with pytest.raises(Exception, match="simulated crash"):  # counted in write order: one thread
        main(["convert", str(src), str(dst), *args, "--direct_num_workers=1"])
    monkeypatch.undo()
    assert not (dst / "meta" / "manifest.json").exists()
    with pytest.raises(Exception, match="manifest"):
        open_dataset(dst)
    finished = {p: _identity(p) for p in (dst / "data").rglob("*.parquet")}
    assert len(finished) == 2  # the two shards written before the crash
    # one finished shard is damaged after the crash: its hash no longer checks out
    damaged = sorted(finished)[0]
    damaged.write_bytes(damaged.read_bytes()[:-1] + b"\0")
    finished.pop(damaged)

    assert main(["convert", str(src), str(dst), *args]) == 0
    assert _tree(dst) == _tree(clean)
    # intact shards were kept as they were (same inode and mtime); the damaged one was written anew
    # (the trees are equal)
    for path, identity in finished.items():
        assert _identity(path) == identity, path


def _identity(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_ino, st.st_mtime_ns


def _long_tail_text_corpus(root: Path, n: int, seed: int = 0) -> Path:
    """Natural-looking text: log-normal document lengths, words from a Zipf vocabulary."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = ["".join(rng.choice(letters, rng.integers(2, 10))) for _ in range(3000)]
    weights = 1 / np.arange(1, len(vocab) + 1)
    lengths = rng.lognormal(5.5, 1.0, n).astype(int) + 5
    root.mkdir(parents=True)
    with open(root / "docs.jsonl", "w") as out:
        for i, length in enumerate(lengths):
            words = rng.choice(len(vocab), length, p=weights / weights.sum())
            text = " ".join(vocab[w] for w in words)
            out.write(json.dumps({"text": text, "id": i, "lang": ["en", "de", "fr"][i % 3]}) + "\n")
    return root


def test_long_tail_text_balances_payload_and_disk_bytes(tmp_path, capsys):
    src = _long_tail_text_corpus(tmp_path / "src", n=3000)
    dst = tmp_path / "out"
    assert main(["convert", str(src), str(dst), "--target-shard-size", "800KB"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(dst), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["num_shards"] >= 8
    sizes = [s["bytes"] for s in summary["shards"]]
    assert summary["bytes"] < 0.6 * summary["payload_bytes"]  # the text really is compressed
    assert summary["balance"]["payload_bytes_max_over_mean"] <= 1.02
    assert summary["balance"]["bytes_max_over_mean"] <= 1.05
    assert summary["balance"]["bytes_max_over_mean"] == pytest.approx(
        max(sizes) / np.mean(sizes), abs=1e-4
    )


def test_a_unit_larger_than_the_target_gets_its_own_shard_left_out_of_the_balance(tmp_path, capsys):
    src = _long_tail_text_corpus(tmp_path / "src", n=1000)
    with open(src / "docs.jsonl", "a") as out:
        out.write(json.dumps({"text": "huge " * 60_000, "id": 10**6, "lang": "en"}) + "\n")
    dst = tmp_path / "out"
    assert main(["convert", str(src), str(dst), "--target-shard-size", "200KB"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(dst), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    # the huge unit is 300 KB; the others' shards stay within a unit of the mean (about 200 KB)
    alone = [s for s in summary["shards"] if s["payload_bytes"] > 250_000]
    assert len(alone) == 1 and alone[0]["rows"] == alone[0]["units"] == 1
    rest = [s for s in summary["shards"] if s is not alone[0]]
    assert summary["balance"]["oversized_unit_shards"] == 1
    assert summary["balance"]["payload_bytes_max_over_mean"] == pytest.approx(
        max(s["payload_bytes"] for s in rest) / np.mean([s["payload_bytes"] for s in rest]),
        abs=1e-4,
    )
    assert summary["balance"]["payload_bytes_max_over_mean"] <= 1.02
    assert main(["inspect", str(dst)]) == 0
    assert "1 shard(s) holding one unit larger than the target left out" in capsys.readouterr().out

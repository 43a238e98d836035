"""``convert --split NAME=SRC ... DST``: one dataset of named splits, each a contiguous run of
shards planned, shuffled and balanced by itself; recorded in info.json and the manifest, shown by
inspect, and selected by ``assign --split`` and ``ShardLoader(split=...)``."""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

pytest.importorskip("apache_beam")

from test_convert_pipeline import _tree
from test_source_lerobot import V21_FEATURES, make_v21

from shardfeed import open_dataset
from shardfeed.assignment import load_assignment
from shardfeed.cli.main import main
from shardfeed.formats.verify import verify_dataset
from shardfeed.loader import ShardLoader
from shardfeed.schemas.errors import SchemaError
from shardfeed.schemas.manifest import Manifest

BALANCE = 1.2  # bytes max/mean per split: small shards of a few hundred short documents


def _corpus(root: Path, tag: str, n: int, seed: int) -> list[str]:
    """Two JSONL files of ``n`` documents whose ``text`` starts with ``tag``; returns the texts."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    texts = [
        f"{tag}-{i} " + " ".join(f"w{int(w)}" for w in rng.zipf(1.5, int(rng.integers(20, 120))))
        for i in range(n)
    ]
    half = n // 2
    for k, part in enumerate((texts[:half], texts[half:])):
        lines = [json.dumps({"text": t, "id": i}) for i, t in enumerate(part)]
        (root / f"part-{k}.jsonl").write_text("\n".join(lines) + "\n")
    return texts


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[Path, dict[str, list[str]]]:
    base = tmp_path_factory.mktemp("splits")
    texts = {"train": _corpus(base / "A", "tr", 800, 1), "eval": _corpus(base / "B", "ev", 300, 2)}
    dst = base / "out"
    args = ["convert", "--split", f"train={base / 'A'}", "--split", f"eval={base / 'B'}"]
    assert main([*args, str(dst), "--target-shard-size", "12KB"]) == 0
    return dst, texts


def _split_rows(dst: Path, name: str) -> list[str]:
    ds = open_dataset(dst)
    split = ds.split(name)
    return list(ds.read(split.index_start, split.index_end)["text"])


def test_each_split_holds_exactly_its_source_and_no_shard_mixes(converted):
    dst, texts = converted
    assert verify_dataset(dst).ok
    ds = open_dataset(dst)
    manifest = ds.manifest
    assert [s.name for s in manifest.splits] == ["train", "eval"]
    train, eval_ = manifest.splits
    assert (train.index_start, train.index_end, train.shard_start) == (0, 800, 0)
    assert (eval_.index_start, eval_.index_end) == (800, 1100)
    assert train.shard_end == eval_.shard_start and eval_.shard_end == len(manifest.shards)
    assert train.shard_end >= 3 and eval_.shard_end - eval_.shard_start >= 2
    for name, split in (("train", train), ("eval", eval_)):
        rows = _split_rows(dst, name)
        assert sorted(rows) == sorted(texts[name])  # exactly its source's records
        assert rows != texts[name]  # shuffled within the split
        for shard in manifest.shards[split.shard_start : split.shard_end]:
            prefixes = {
                t.split("-")[0] for t in ds.read(shard.index_start, shard.index_end)["text"]
            }
            assert prefixes == {"tr" if name == "train" else "ev"}


def test_each_split_is_balanced_and_inspect_shows_the_splits(converted, capsys):
    dst, _ = converted
    assert main(["inspect", str(dst), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    splits = summary["splits"]
    assert list(splits) == ["train", "eval"]
    assert splits["train"]["info_range"] == "0:800" and splits["eval"]["info_range"] == "800:1100"
    for split in splits.values():
        assert split["payload_bytes_max_over_mean"] <= 1.05
        assert split["bytes_max_over_mean"] <= BALANCE
    assert main(["inspect", str(dst)]) == 0
    text = capsys.readouterr().out
    assert "splits" in text and "train  rows [0, 800)" in text and "eval   rows [800, 1100)" in text


def test_info_json_and_manifest_record_the_ranges(converted):
    dst, _ = converted
    info = json.loads((dst / "meta/info.json").read_text())
    assert info["splits"] == {"train": "0:800", "eval": "800:1100"}
    raw = json.loads((dst / "meta/shardfeed/manifest.json").read_text())
    assert list(raw["splits"]) == ["train", "eval"]
    assert raw["splits"]["train"]["index_start"] == 0
    assert raw["splits"]["eval"]["index_end"] == 1100
    assert raw["provenance"]["content_options"]["splits"] == ["train", "eval"]
    assert Manifest.loads((dst / "meta/shardfeed/manifest.json").read_text()).splits


def test_the_json_schemas_accept_the_split_manifest_and_info(converted):
    jsonschema = pytest.importorskip("jsonschema")
    dst, _ = converted
    for name, path in (("manifest", "meta/shardfeed/manifest.json"), ("info", "meta/info.json")):
        text = files("shardfeed.schemas").joinpath(f"jsonschema/{name}.schema.json").read_text()
        validator = jsonschema.Draft202012Validator(json.loads(text))
        assert list(validator.iter_errors(json.loads((dst / path).read_text()))) == []
    raw = json.loads((dst / "meta/shardfeed/manifest.json").read_text())
    raw["splits"]["train"]["extra"] = 1
    text = files("shardfeed.schemas").joinpath("jsonschema/manifest.schema.json").read_text()
    assert list(jsonschema.Draft202012Validator(json.loads(text)).iter_errors(raw))


def test_manifest_split_parsing_is_strict(converted):
    dst, _ = converted
    raw = json.loads((dst / "meta/shardfeed/manifest.json").read_text())
    old = {k: v for k, v in raw.items() if k != "splits"}
    assert Manifest.from_json(old).splits == ()  # manifests without splits still load
    bad_cases = [
        lambda s: s["eval"].update(index_start=799),  # not its shards' range
        lambda s: s["eval"].update(shards=[s["train"]["shards"][1] + 1, s["eval"]["shards"][1]]),
        lambda s: s["train"].update(extra=1),  # unknown field
        lambda s: s["train"].update(shards=[0]),
        lambda s: s.pop("eval"),  # does not cover every shard
        lambda s: s.update({"bad name": s.pop("eval")}),
    ]
    for mutate in bad_cases:
        broken = json.loads(json.dumps(raw))
        mutate(broken["splits"])
        with pytest.raises(SchemaError):
            Manifest.from_json(broken)


def test_assign_split_covers_exactly_that_split(converted, capsys):
    dst, _ = converted
    args = ["assign", str(dst), "--nodes", "1", "--gpus-per-node", "2", "--name", "ev"]
    assert main([*args, "--split", "eval", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["header"]["split"] == "eval"
    plan = load_assignment(dst, "ev")
    assert plan.header.split == "eval"
    split = open_dataset(dst).split("eval")
    covered = []
    for rank in range(2):
        spans = plan.spans(rank)
        assert np.all((spans.shard >= split.shard_start) & (spans.shard < split.shard_end))
        starts = np.array([s.index_start for s in open_dataset(dst).shards])
        for shard, a, b in zip(spans.shard, spans.start, spans.end, strict=True):
            covered.extend(range(starts[shard] + a, starts[shard] + b))
    assert sorted(covered) == list(range(split.index_start, split.index_end))
    assert main([*args[:-1], "all", "--json"]) == 0  # without --split: the whole dataset
    assert "split" not in json.loads(capsys.readouterr().out)["header"]
    assert main([*args[:-1], "x", "--split", "test"]) != 0
    assert "no split 'test'" in capsys.readouterr().err


def test_loader_with_split_reads_only_that_split(converted):
    dst, texts = converted
    seen = []
    for rank in range(2):
        loader = ShardLoader(
            str(dst), rank=rank, world=2, batch_size=10, split="eval", columns=["text"]
        )
        for batch in loader:
            seen.extend(batch["text"])
    assert set(seen) == set(texts["eval"])  # pad may repeat a few, nothing from train
    with pytest.raises(ValueError, match="no split 'nope'"):
        ShardLoader(str(dst), rank=0, world=1, batch_size=4, split="nope")
    with pytest.raises(ValueError, match="no split"):
        open_dataset(dst).split("test")


def test_split_conversion_is_deterministic(converted, tmp_path):
    dst, _ = converted
    base = dst.parent
    again = tmp_path / "again"
    args = ["convert", "--split", f"train={base / 'A'}", "--split", f"eval={base / 'B'}"]
    assert main([*args, str(again), "--target-shard-size", "12KB"]) == 0
    first = {k: v for k, v in _tree(dst).items() if "assignments" not in k}
    assert _tree(again) == first


def test_split_argument_errors(converted, tmp_path, capsys):
    dst, _ = converted
    a, b = dst.parent / "A", dst.parent / "B"
    out = str(tmp_path / "x")
    cases = [
        (["--split", f"train={a}", "--split", f"train={b}", out], "given more than once"),
        (["--split", f"train{a}", out], "expects NAME=SRC"),
        (["--split", "train=", out], "expects NAME=SRC"),
        ([f"--split=.bad={a}", out], "not a valid split name"),
        ([str(a), out, "--split", f"eval={b}"], "replaces the positional SRC"),
        (["--split", f"train={a}", "--split", f"eval={a}", out], "its own SRC"),
    ]
    for args, message in cases:
        assert main(["convert", *args]) != 0
        assert message in capsys.readouterr().err, args
    assert not (tmp_path / "x" / "meta").exists()


def test_lerobot_splits_use_episode_ranges(tmp_path):
    features = {k: v for k, v in V21_FEATURES.items() if v["dtype"] != "image"}
    make_v21(tmp_path / "A", {0: 30, 1: 50, 2: 40, 3: 45}, features=features)
    make_v21(tmp_path / "B", {0: 20, 1: 35}, features=features)
    dst = tmp_path / "out"
    args = ["convert", "--split", f"train={tmp_path / 'A'}", "--split", f"eval={tmp_path / 'B'}"]
    assert main([*args, str(dst), "--target-shard-size", "3KB"]) == 0
    info = json.loads((dst / "meta/info.json").read_text())
    assert info["splits"] == {"train": "0:4", "eval": "4:6"}
    assert info["total_episodes"] == 6
    ds = open_dataset(dst)
    train, eval_ = ds.manifest.splits
    assert (train.index_end, eval_.index_end) == (165, 220)
    episodes = pq.read_table(dst / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert [e["episode_index"] for e in episodes] == list(range(6))
    rows = ds.read(eval_.index_start, eval_.index_end)
    assert set(np.unique(rows["episode_index"]).tolist()) == {4, 5}
    assert sorted(e["length"] for e in episodes[4:]) == [20, 35]
    assert np.array_equal(ds.read(0, len(ds))["index"], np.arange(220))

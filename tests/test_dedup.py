"""``convert --dedup``: the pure first-occurrence rule, then the CLI on JSONL and image folders."""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from shardfeed.planning.dedup import Duplicate, first_occurrences
from shardfeed.schemas.errors import SchemaError
from shardfeed.schemas.manifest import DUPLICATES_PATH, MANIFEST_PATH, Duplicates, Manifest

# -- the pure function ---------------------------------------------------------------------------


@dataclass(frozen=True)
class U:
    file: str
    position: int
    content_hash: str


def test_first_occurrence_in_source_order_wins():
    units = [U("b", 0, "x"), U("a", 5, "x"), U("a", 2, "y"), U("a", 9, "y"), U("c", 1, "z")]
    kept, dups = first_occurrences(units)
    assert kept == [U("a", 2, "y"), U("a", 5, "x"), U("c", 1, "z")]
    assert dups == [
        Duplicate(U("a", 9, "y"), U("a", 2, "y")),
        Duplicate(U("b", 0, "x"), U("a", 5, "x")),
    ]


def test_file_order_beats_position():
    """Source order is (file, position): a low position in a later file comes after."""
    kept, dups = first_occurrences([U("b", 0, "h"), U("a", 100, "h")])
    assert kept == [U("a", 100, "h")] and dups == [Duplicate(U("b", 0, "h"), U("a", 100, "h"))]


def test_every_copy_names_the_first_not_a_chain():
    units = [U("f", i, "same") for i in range(5)]
    kept, dups = first_occurrences(units)
    assert kept == [U("f", 0, "same")]
    assert [d.first for d in dups] == [U("f", 0, "same")] * 4
    assert [d.unit.position for d in dups] == [1, 2, 3, 4]


@pytest.mark.parametrize("seed", range(5))
def test_independent_of_input_order(seed):
    rng = random.Random(seed)
    units = [
        U(f"f{rng.randrange(4)}", p, f"h{rng.randrange(12)}") for p in rng.sample(range(1000), 60)
    ]
    expected = first_occurrences(units)
    for _ in range(10):
        rng.shuffle(units)
        assert first_occurrences(units) == expected
    kept, dups = expected
    # invariants: kept + copies is the input; each hash kept once; each copy after its first
    assert len(kept) + len(dups) == len(units)
    assert len({u.content_hash for u in kept}) == len(kept)
    assert {u.content_hash for u in kept} == {u.content_hash for u in units}
    for d in dups:
        assert d.first in kept and d.first.content_hash == d.unit.content_hash
        assert (d.first.file, d.first.position) < (d.unit.file, d.unit.position)


def test_no_duplicates_and_empty():
    units = [U("a", i, f"h{i}") for i in range(3)]
    assert first_occurrences(reversed(units)) == (units, [])
    assert first_occurrences([]) == ([], [])


def test_two_units_in_one_place_are_an_error():
    with pytest.raises(ValueError, match="position 1"):
        first_occurrences([U("a", 1, "x"), U("a", 1, "y")])


# -- the manifest field --------------------------------------------------------------------------


def test_duplicates_field_is_strict_and_optional():
    assert Duplicates.from_json({"total": 3}) == Duplicates(3)
    for bad in ({}, {"total": -1}, {"total": 1.0}, {"total": 2, "extra": 1}, []):
        with pytest.raises(SchemaError):
            Duplicates.from_json(bad)


# -- the CLI -------------------------------------------------------------------------------------

beam = pytest.importorskip("apache_beam")

from shardfeed import open_dataset  # noqa: E402
from shardfeed.cli.main import main  # noqa: E402
from shardfeed.formats.verify import verify_dataset  # noqa: E402


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _convert(src: Path, dst: Path, capsys, *extra: str) -> dict:
    args = ["convert", str(src), str(dst), "--target-shard-size", "400B", "--json", *extra]
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


def _jsonl_corpus(root: Path) -> tuple[Path, list[str], list[tuple[str, str, str, str]]]:
    """Three files with copies inside a file and across files. Returns the root, the distinct
    texts, and each copy as (file, line, first file, first line)."""
    root.mkdir(parents=True)
    texts = [f"doc {i} " + "y" * (i * 7 % 50) for i in range(40)]
    files = {
        "a.jsonl": [texts[i] for i in range(0, 20)] + [texts[3], texts[3]],  # lines 21, 22
        "b.jsonl": [texts[5]] + [texts[i] for i in range(20, 40)] + [texts[0]],  # lines 1, 22
        "c.jsonl": [texts[21], texts[39]],  # lines 1, 2: both first seen in b.jsonl
    }
    for name, lines in files.items():
        (root / name).write_text("".join(json.dumps({"text": t}) + "\n" for t in lines))
    copies = [
        ("a.jsonl", "line:21", "a.jsonl", "line:4"),
        ("a.jsonl", "line:22", "a.jsonl", "line:4"),
        ("b.jsonl", "line:1", "a.jsonl", "line:6"),
        ("b.jsonl", "line:22", "a.jsonl", "line:1"),
        ("c.jsonl", "line:1", "b.jsonl", "line:3"),
        ("c.jsonl", "line:2", "b.jsonl", "line:21"),
    ]
    return root, texts, copies


def _read_duplicates(dst: Path) -> list[dict]:
    return [json.loads(line) for line in (dst / DUPLICATES_PATH).read_text().splitlines()]


def test_jsonl_dedup_keeps_each_content_once(tmp_path, capsys):
    src, texts, copies = _jsonl_corpus(tmp_path / "src")
    dst = tmp_path / "out"
    summary = _convert(src, dst, capsys, "--dedup")
    assert summary["duplicates"] == {"total": 6}
    assert summary["samples_out"] == 40 and summary["samples_in"] == 46
    assert summary["rejects"]["total"] == 0 and summary["shards"] > 1

    ds = open_dataset(dst)
    assert sorted(ds.read(0, len(ds))["text"]) == sorted(texts)

    manifest = Manifest.loads((dst / MANIFEST_PATH).read_text())
    assert manifest.duplicates == Duplicates(6)
    assert manifest.provenance.content_options["dedup"] is True
    assert DUPLICATES_PATH in {f.path for f in manifest.files}
    records = _read_duplicates(dst)
    assert [
        (r["source"], r["position"], r["duplicate_of"]["source"], r["duplicate_of"]["position"])
        for r in records
    ] == copies
    for r in records:
        line = json.dumps({"text": _text_at(src, r["source"], r["position"])}).encode()
        assert r["content_hash"] == hashlib.sha256(line).hexdigest()[:32]
    assert verify_dataset(str(dst)).ok

    assert main(["inspect", str(dst), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["duplicates"] == {"total": 6}
    assert main(["inspect", str(dst)]) == 0
    assert "duplicates     6" in capsys.readouterr().out


def _text_at(src: Path, file: str, position: str) -> str:
    line = int(position.removeprefix("line:"))
    return json.loads((src / file).read_text().splitlines()[line - 1])["text"]


def test_jsonl_dedup_is_deterministic_and_order_shaped(tmp_path, capsys):
    src, _, _ = _jsonl_corpus(tmp_path / "src")
    _convert(src, tmp_path / "one", capsys, "--dedup")
    _convert(
        src,
        tmp_path / "two",
        capsys,
        "--dedup",
        "--direct_running_mode=multi_processing",
        "--direct_num_workers=2",
    )
    assert _tree(tmp_path / "one") == _tree(tmp_path / "two")
    # --no-shuffle keeps source order: the first occurrences, in order
    summary = _convert(src, tmp_path / "ordered", capsys, "--dedup", "--no-shuffle")
    assert summary["duplicates"] == {"total": 6}
    ds = open_dataset(tmp_path / "ordered")
    seen = []
    for name in ("a.jsonl", "b.jsonl", "c.jsonl"):
        for line in (src / name).read_text().splitlines():
            if (text := json.loads(line)["text"]) not in seen:
                seen.append(text)
    assert list(ds.read(0, len(ds))["text"]) == seen


def test_without_dedup_nothing_changes(tmp_path, capsys):
    src, _, _ = _jsonl_corpus(tmp_path / "src")
    dst = tmp_path / "out"
    summary = _convert(src, dst, capsys)
    assert "duplicates" not in summary
    assert summary["samples_out"] == 46
    assert not (dst / DUPLICATES_PATH).exists()
    text = (dst / MANIFEST_PATH).read_text()
    assert '"duplicates"' not in text and "dedup" not in text
    assert Manifest.loads(text).duplicates is None
    assert main(["inspect", str(dst), "--json"]) == 0
    assert "duplicates" not in json.loads(capsys.readouterr().out)


def test_dedup_without_copies_writes_an_empty_list(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text("".join(json.dumps({"text": f"t{i}"}) + "\n" for i in range(9)))
    summary = _convert(src, tmp_path / "out", capsys, "--dedup")
    assert summary["duplicates"] == {"total": 0} and summary["samples_out"] == 9
    assert (tmp_path / "out" / DUPLICATES_PATH).read_bytes() == b""
    assert verify_dataset(str(tmp_path / "out")).ok


def test_duplicates_do_not_count_as_rejects(tmp_path, capsys):
    """Half the corpus is copies: far above --max-reject-fraction, yet it publishes."""
    src = tmp_path / "src"
    src.mkdir()
    body = "".join(json.dumps({"text": f"t{i % 5}"}) + "\n" for i in range(50))
    (src / "a.jsonl").write_text(body)
    summary = _convert(src, tmp_path / "out", capsys, "--dedup", "--max-reject-fraction", "0")
    assert summary["duplicates"] == {"total": 45} and summary["samples_out"] == 5


def _png(colour: tuple[int, int, int], size: int = 12) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buf, format="PNG")
    return buf.getvalue()


def test_imagefolder_dedup(tmp_path, capsys):
    src = tmp_path / "src"
    distinct = {
        f"{c}/{i}.png": _png((i * 20, 200 if c == "dog" else 0, 9))
        for c in ("cat", "dog")
        for i in range(8)
    }
    planted = {
        "cat/x_copy.png": distinct["cat/3.png"],  # same class
        "dog/y_copy.png": distinct["cat/5.png"],  # across class directories (source files)
        "dog/z_copy.png": distinct["dog/0.png"],
    }
    for rel, data in itertools.chain(distinct.items(), planted.items()):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    dst = tmp_path / "out"
    summary = _convert(src, dst, capsys, "--dedup")
    assert summary["duplicates"] == {"total": 3} and summary["samples_out"] == 16
    records = {r["source"]: r["duplicate_of"]["source"] for r in _read_duplicates(dst)}
    assert records == {
        "cat/x_copy.png": "cat/3.png",
        "dog/y_copy.png": "cat/5.png",
        "dog/z_copy.png": "dog/0.png",
    }
    ds = open_dataset(dst)
    image = next(f.name for f in ds.info.features if f.dtype == "image")
    stored = ds.read(0, len(ds))[image]
    blobs = sorted(s["bytes"] if isinstance(s, dict) else s for s in stored)
    assert blobs == sorted(distinct.values())
    assert verify_dataset(str(dst)).ok
    again = tmp_path / "again"
    _convert(src, again, capsys, "--dedup")
    assert _tree(dst) == _tree(again)


def test_dedup_refuses_lerobot(tmp_path, capsys):
    from shardfeed.cli.main import main as cli

    src = tmp_path / "src"
    (src / "meta").mkdir(parents=True)
    (src / "meta" / "info.json").write_text("{}")
    code = cli(["convert", str(src), str(tmp_path / "out"), "--from", "lerobot", "--dedup"])
    assert code != 0
    assert "--dedup does not support episodic" in capsys.readouterr().err

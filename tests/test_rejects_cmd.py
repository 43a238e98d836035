"""``shardfeed rejects``: datasets with rejects built by ``shardfeed convert`` from bad JSONL input.

The reject files are read back independently here (plain ``json``) to check the command's table and
JSON exactly; the tamper tests show a reject file is never trusted unless it matches its manifest
record.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("apache_beam")

from shardfeed import write_dataset
from shardfeed.cli.main import main
from shardfeed.formats.meta_writer import file_record
from shardfeed.formats.rejects import (
    REJECTS_DIR,
    RejectFileError,
    list_rejects,
    parse_reject_line,
    reject_file_name,
)
from shardfeed.schemas.errors import SchemaError
from shardfeed.schemas.manifest import MANIFEST_PATH, Manifest, Rejects

#: (source, position, reason) of every bad line the corpus below holds, in listing order
EXPECTED = [
    ("part-0.jsonl", "line:2", "json_invalid"),
    ("part-0.jsonl", "line:4", "field_missing"),
    ("part-1.jsonl", "line:2", "json_invalid"),
    ("part-1.jsonl", "line:3", "field_type"),
    ("part-1.jsonl", "line:4", "utf8_invalid"),
    ("part-1.jsonl", "line:5", "field_type"),
]
BY_REASON = {"field_missing": 1, "field_type": 2, "json_invalid": 2, "utf8_invalid": 1}


def _good(i: int) -> bytes:
    return json.dumps({"text": f"sample {i} " + "x" * (i % 7), "id": i}).encode()


def _jsonl_corpus(root: Path, bad: bool = True) -> Path:
    """Two JSONL files of 10 lines each; with ``bad``, 6 lines are invalid in 4 different ways."""
    root.mkdir(parents=True)
    first = [_good(i) for i in range(10)]
    second = [_good(i) for i in range(10, 20)]
    if bad:
        first[1] = b"{not json"  # line 2: json_invalid
        first[3] = b'{"id": 2}'  # line 4: field_missing (no text)
        second[1] = b"[1, 2]"  # line 2: json_invalid (not an object)
        second[2] = b'{"text": 5, "id": 11}'  # line 3: field_type (text must be a string)
        second[3] = b'{"text": "\xff\xfe", "id": 12}'  # line 4: utf8_invalid
        second[4] = b'{"text": "b4", "id": "x"}'  # line 5: field_type (id is int64)
    (root / "part-0.jsonl").write_bytes(b"\n".join(first) + b"\n")
    (root / "part-1.jsonl").write_bytes(b"\n".join(second) + b"\n")
    return root


def _convert(src: Path, dst: Path) -> None:
    assert main(["convert", str(src), str(dst), "--max-reject-fraction", "0.5"]) == 0


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A converted dataset with 6 rejects in 2 reject files (built once; copy before changing)."""
    base = tmp_path_factory.mktemp("rejects")
    dst = base / "dst"
    _convert(_jsonl_corpus(base / "src"), dst)
    return dst


@pytest.fixture
def dataset(built: Path, tmp_path: Path) -> Path:
    """A private copy of the built dataset, free to tamper with."""
    return Path(shutil.copytree(built, tmp_path / "ds"))


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _stored(root: Path) -> list[dict]:
    """Every reject record in the files the manifest lists, read with plain json."""
    manifest = json.loads((root / MANIFEST_PATH).read_text())
    out = []
    for rec in manifest["files"]:
        if rec["path"].startswith(REJECTS_DIR + "/"):
            out += [json.loads(line) for line in (root / rec["path"]).read_text().splitlines()]
    return out


def _messages(root: Path) -> dict[tuple[str, str], str]:
    return {(r["source"], r["position"]): r["message"] for r in _stored(root)}


def _reject_paths(root: Path) -> list[Path]:
    return sorted((root / REJECTS_DIR).iterdir())


def _rewrite_manifest(root: Path, **changes) -> None:
    manifest = Manifest.loads((root / MANIFEST_PATH).read_bytes())
    (root / MANIFEST_PATH).write_text(dataclasses.replace(manifest, **changes).dumps())


# --------------------------------------------------------------------------------------------
# the files convert writes


def test_reject_files_are_listed_named_by_input_and_sorted(built: Path):
    manifest = json.loads((built / MANIFEST_PATH).read_text())
    assert manifest["rejects"] == {"total": 6, "by_reason": BY_REASON}
    listed = [r for r in manifest["files"] if r["path"].startswith(REJECTS_DIR + "/")]
    names = sorted(reject_file_name(f) for f in ("part-0.jsonl", "part-1.jsonl"))
    assert [r["path"] for r in listed] == [f"{REJECTS_DIR}/{n}" for n in names]
    for record in listed:
        blob = (built / record["path"]).read_bytes()
        assert record["bytes"] == len(blob)
        assert record["sha256"] == hashlib.sha256(blob).hexdigest()
        lines = blob.decode().splitlines()
        rows = [json.loads(line) for line in lines]
        # one input file per reject file, compact sorted-key JSON, sorted by line number
        assert len({r["source"] for r in rows}) == 1
        assert reject_file_name(rows[0]["source"]) == record["path"].rsplit("/", 1)[1]
        assert all(list(r) == ["message", "position", "reason", "source"] for r in rows)
        assert lines == [json.dumps(r, ensure_ascii=False, sort_keys=True) for r in rows]
        numbers = [int(r["position"].split(":")[1]) for r in rows]
        assert numbers == sorted(numbers)
    assert sorted((r["source"], r["position"], r["reason"]) for r in _stored(built)) == sorted(
        EXPECTED
    )
    assert main(["verify", str(built)]) == 0


# --------------------------------------------------------------------------------------------
# output


def test_table_is_exact(built: Path, capsys):
    rc, out, err = run_cli(capsys, "rejects", str(built))
    assert rc == 0 and err == ""
    messages = _messages(built)
    rows = "".join(
        f"{source:<12}  {position:<8}  {reason:<13}  {messages[source, position]}\n"
        for source, position, reason in EXPECTED
    )
    assert out == (
        f"6 rejects in {built}\n"
        "  field_missing  1  a required field is absent\n"
        "  field_type     2  a field's type conflicts with the dataset schema\n"
        "  json_invalid   2  a line is not valid JSON, or not a JSON object\n"
        "  utf8_invalid   1  bytes are not valid UTF-8\n"
        "\n"
        "source        position  reason         message\n" + rows
    )
    # the messages say what was wrong with each line
    assert "not valid JSON" in messages["part-0.jsonl", "line:2"]
    assert "'text'" in messages["part-0.jsonl", "line:4"]
    assert "'id'" in messages["part-1.jsonl", "line:5"]


def test_json_is_exact(built: Path, capsys):
    rc, out, err = run_cli(capsys, "rejects", "--json", str(built))
    assert rc == 0 and err == ""
    messages = _messages(built)
    assert json.loads(out) == {
        "total": 6,
        "by_reason": BY_REASON,
        "rejects": [
            {"source": s, "position": p, "reason": r, "message": messages[s, p]}
            for s, p, r in EXPECTED
        ],
    }


def test_reason_filter(built: Path, capsys):
    rc, out, _ = run_cli(capsys, "rejects", "--json", "--reason", "field_type", str(built))
    assert rc == 0
    got = json.loads(out)
    assert got["total"] == 2 and got["by_reason"] == {"field_type": 2}
    assert [(r["source"], r["position"]) for r in got["rejects"]] == [
        ("part-1.jsonl", "line:3"),
        ("part-1.jsonl", "line:5"),
    ]

    rc, out, _ = run_cli(
        capsys, "rejects", "--reason", "json_invalid", "--reason", "utf8_invalid", str(built)
    )
    assert rc == 0
    lines = out.splitlines()
    assert lines[0] == f"3 of 6 rejects with reason json_invalid or utf8_invalid in {built}"
    assert lines[1:3] == [
        "  json_invalid  2  a line is not valid JSON, or not a JSON object",
        "  utf8_invalid  1  bytes are not valid UTF-8",
    ]
    assert [line.split()[:3] for line in lines[5:]] == [
        ["part-0.jsonl", "line:2", "json_invalid"],
        ["part-1.jsonl", "line:2", "json_invalid"],
        ["part-1.jsonl", "line:4", "utf8_invalid"],
    ]

    # a reason with no records is an answer, not an error
    rc, out, _ = run_cli(capsys, "rejects", "--reason", "image_corrupt", str(built))
    assert rc == 0
    assert out == (
        f"no rejects with reason image_corrupt in {built} (6 in all: field_missing 1, "
        "field_type 2, json_invalid 2, utf8_invalid 1)\n"
    )
    rc, out, _ = run_cli(capsys, "rejects", "--json", "--reason", "image_corrupt", str(built))
    assert json.loads(out) == {"total": 0, "by_reason": {}, "rejects": []}


def test_limit(built: Path, capsys):
    rc, out, _ = run_cli(capsys, "rejects", "--json", "--limit", "2", str(built))
    assert rc == 0
    got = json.loads(out)
    assert got["total"] == 6 and got["by_reason"] == BY_REASON
    assert [(r["source"], r["position"]) for r in got["rejects"]] == [
        ("part-0.jsonl", "line:2"),
        ("part-0.jsonl", "line:4"),
    ]
    rc, out, _ = run_cli(capsys, "rejects", "--limit", "2", str(built))
    lines = out.splitlines()
    assert len([line for line in lines if line.startswith("part-")]) == 2
    assert lines[-1] == "... and 4 more (raise --limit to list them)"
    rc, out, _ = run_cli(capsys, "rejects", "--limit", "0", "--reason", "field_type", str(built))
    assert out.splitlines() == [
        f"2 of 6 rejects with reason field_type in {built}",
        "  field_type  2  a field's type conflicts with the dataset schema",
        "",
        "... and 2 more (raise --limit to list them)",
    ]


def test_no_rejects(tmp_path: Path, capsys):
    dst = tmp_path / "clean"
    _convert(_jsonl_corpus(tmp_path / "src", bad=False), dst)
    assert not (dst / REJECTS_DIR).exists()
    rc, out, err = run_cli(capsys, "rejects", str(dst))
    assert (rc, err) == (0, "")
    assert out == f"no rejects in {dst}: every input record was converted\n"
    rc, out, _ = run_cli(capsys, "rejects", "--json", str(dst))
    assert json.loads(out) == {"total": 0, "by_reason": {}, "rejects": []}


def test_counts_without_records(tmp_path: Path, capsys):
    """write_dataset(rejects=...) records counts only; they are shown, with no records."""
    root = tmp_path / "counts"
    features = {"x": {"dtype": "int64", "shape": [1], "names": None}}
    write_dataset(root, features, {"x": [1, 2]}, rejects=Rejects(5, {"io_error": 2, "odd": 3}))
    rc, out, _ = run_cli(capsys, "rejects", str(root))
    assert rc == 0
    assert out == (
        f"5 rejects in {root}\n"
        "  io_error  2  the input could not be read\n"
        "  odd       3\n"
        "\n"
        "(counts only: the manifest lists no reject files, so there are no records to show)\n"
    )
    rc, out, _ = run_cli(capsys, "rejects", "--json", "--reason", "odd", str(root))
    assert json.loads(out) == {"total": 3, "by_reason": {"odd": 3}, "rejects": []}


# --------------------------------------------------------------------------------------------
# errors: clean messages, exit 1, nothing on stdout


def _fails(capsys, root: Path, *fragments: str) -> None:
    rc, out, err = run_cli(capsys, "rejects", str(root))
    assert rc == 1 and out == ""
    assert err.startswith("shardfeed: error: ") and "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, err


def test_tampered_reject_file_is_refused(dataset: Path, capsys):
    path = _reject_paths(dataset)[0]
    blob = path.read_bytes()
    # same size, one record's reason changed: only the sha256 can tell
    tampered = blob.replace(b'"reason": "json_invalid"', b'"reason": "json_invalie"', 1)
    assert tampered != blob and len(tampered) == len(blob)
    path.write_bytes(tampered)
    _fails(capsys, dataset, str(path.relative_to(dataset)), "sha256", "does not match")
    assert main(["verify", str(dataset)]) == 1
    rc, out, _ = run_cli(capsys, "rejects", "--json", "--reason", "field_type", str(dataset))
    assert rc == 1 and out == ""  # a filter never skips the check

    path.write_bytes(blob + b"\n")
    _fails(capsys, dataset, "bytes on disk", f"the manifest says {len(blob)}")
    path.unlink()
    _fails(capsys, dataset, "listed in the manifest but absent")


def test_counts_must_match_the_manifest(dataset: Path, capsys):
    manifest = Manifest.loads((dataset / MANIFEST_PATH).read_bytes())
    _rewrite_manifest(dataset, rejects=Rejects(5, {**BY_REASON, "field_type": 1}))
    _fails(capsys, dataset, "the reject files hold 6 records", "the manifest counts 5")
    # a manifest that drops a reject file's record leaves that file unread (and noted)
    kept = tuple(f for f in manifest.files if f.path != manifest.files[1].path)
    assert manifest.files[1].path.startswith(REJECTS_DIR)
    _rewrite_manifest(dataset, files=kept, rejects=Rejects(6, BY_REASON))
    _fails(capsys, dataset, "the reject files hold")


def test_malformed_lines_are_refused_even_with_a_matching_hash(dataset: Path, capsys):
    """Strict parsing: a listed file whose hash matches but whose lines are not reject records."""
    path = _reject_paths(dataset)[0]
    rel = str(path.relative_to(dataset))
    manifest = Manifest.loads((dataset / MANIFEST_PATH).read_bytes())
    for body, fragment in [
        (b'{"source": "a", "position": "", "reason": "io_error"}\n', "reject.message"),
        (b'{"source": "a", "position": 3, "reason": "x", "message": ""}\n', "reject.position"),
        (b'{"source": "a", "position": "", "reason": "", "message": ""}\n', "non-empty"),
        (b"[1]\n", "expected object"),
        (b"{oops\n", "not valid JSON"),
        (b'{"source": "\xff"}\n', "not valid UTF-8"),
        (b'{"source": "a", "position": "", "reason": "x", "message": ""}', "no final newline"),
    ]:
        path.write_bytes(body)
        files = tuple(
            file_record(str(dataset), rel) if f.path == rel else f for f in manifest.files
        )
        _rewrite_manifest(dataset, files=files)
        _fails(capsys, dataset, rel, fragment)


def test_whole_file_rejects_and_control_characters(dataset: Path, capsys):
    """An empty position (a whole-file reject) shows as '-'; control characters are escaped."""
    path = _reject_paths(dataset)[0]
    rel = str(path.relative_to(dataset))
    row = {
        "source": "cat/a.png",
        "position": "",
        "reason": "image_corrupt",
        "message": "x\n\x1b[2J",
    }
    path.write_text(json.dumps(row, sort_keys=True) + "\n")
    manifest = Manifest.loads((dataset / MANIFEST_PATH).read_bytes())
    files = tuple(file_record(str(dataset), rel) if f.path == rel else f for f in manifest.files)
    others = [r for r in _stored(dataset) if r["source"] != "cat/a.png"]
    counts = {"image_corrupt": 1}
    for r in others:
        counts[r["reason"]] = counts.get(r["reason"], 0) + 1
    _rewrite_manifest(dataset, files=files, rejects=Rejects(1 + len(others), counts))
    rc, out, _ = run_cli(capsys, "rejects", "--reason", "image_corrupt", str(dataset))
    assert rc == 0
    assert out.splitlines()[-1] == "cat/a.png  -         image_corrupt  x\\n\\x1b[2J"
    rc, out, _ = run_cli(capsys, "rejects", "--json", "--reason", "image_corrupt", str(dataset))
    assert json.loads(out)["rejects"] == [row]


def test_missing_manifest_and_usage_errors(tmp_path: Path, built: Path, capsys):
    _fails(capsys, tmp_path / "nope", "no meta/shardfeed/manifest.json")
    for argv in (
        ["rejects"],
        ["rejects", "--limit", "-1", str(built)],
        ["rejects", "--limit", "x"],
    ):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
        assert "usage:" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["rejects", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--reason", "--limit", "--json", "dataset"):
        assert flag in out


def test_unlisted_files_are_ignored_with_a_note(dataset: Path, capsys):
    (dataset / REJECTS_DIR / "stray.jsonl").write_text('{"not": "a reject"}\n')
    rc, out, err = run_cli(capsys, "rejects", "--json", str(dataset))
    assert rc == 0
    assert json.loads(out)["total"] == 6
    assert f"{REJECTS_DIR}/stray.jsonl" in err and "does not list" in err


# --------------------------------------------------------------------------------------------
# the library


def test_library_listing_and_strict_lines(built: Path):
    listing = list_rejects(built, reasons=["field_missing"])
    assert (listing.total, listing.by_reason, listing.files) == (1, {"field_missing": 1}, 2)
    assert listing.recorded_total == 6 and listing.stored
    assert [(r.source, r.position, r.reason) for r in listing.rejects] == [EXPECTED[1]]
    assert len(list_rejects(built, limit=3).rejects) == 3
    with pytest.raises(ValueError):
        list_rejects(built, limit=-1)
    record = parse_reject_line(
        b'{"source": "s", "position": "", "reason": "io_error", "message": "m\\u00e9"}',
        "here",
    )
    assert (record.position, record.message) == ("", "m\u00e9")
    with pytest.raises(SchemaError, match="here"):
        parse_reject_line(b'{"source": "s"}', "here")
    with pytest.raises(RejectFileError, match="here: not valid JSON"):
        parse_reject_line(b"", "here")

"""Damage a published dataset in every way we know; verify, the reader and the CLI must all notice.

Also path safety (manifest paths that escape, symlinks out of the root), a missing manifest, and
overwrite protection in the writer.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from shardfeed import open_dataset, write_dataset
from shardfeed.cli.main import main
from shardfeed.formats.errors import CorruptShardError, IncompleteDatasetError
from shardfeed.formats.verify import verify_dataset
from shardfeed.schemas import ShardfeedError, UnsafePathError

MANIFEST = "meta/shardfeed/manifest.json"


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()  # drop anything earlier in the test
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def flip_byte(path: Path, pos: int, mask: int = 0xFF) -> None:
    data = bytearray(path.read_bytes())
    data[pos] ^= mask
    path.write_bytes(bytes(data))


def bad_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("BAD ")]


def assert_clean_one_line_error(rc: int, out: str, err: str, *needles: str) -> None:
    """A failed command: non-zero, one 'shardfeed: error:' line on stderr, no traceback."""
    assert rc != 0
    assert "Traceback" not in err and "Traceback" not in out
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("shardfeed: error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def read_all(root: Path) -> dict:
    with open_dataset(root) as ds:
        return ds.read(0, len(ds))


def same_batch(a: dict, b: dict) -> bool:
    if list(a) != list(b):
        return False
    for name in a:
        x, y = a[name], b[name]
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if x.dtype == object:
            if x.tolist() != y.tolist():
                return False
        elif not np.array_equal(x, y, equal_nan=x.dtype.kind == "f"):
            return False
    return True


# --------------------------------------------------------------------------------------------
# verify: clean and damaged


def test_clean_dataset_verifies(small_dataset, capsys):
    root, manifest, _ = small_dataset
    rc, out, err = run_cli(capsys, "verify", str(root))
    assert rc == 0, err
    assert out.startswith("OK: ") and f"{len(manifest.shards)} shards" in out
    assert err == ""
    rc, out, _ = run_cli(capsys, "verify", "--json", str(root))
    report = json.loads(out)
    assert rc == 0 and report["ok"] is True and report["problems"] == []
    assert report["shards_checked"] == len(manifest.shards)
    assert report["files_checked"] == len(manifest.files)
    assert report["bytes_hashed"] == sum(s.bytes for s in manifest.shards) + sum(
        f.bytes for f in manifest.files
    )
    assert verify_dataset(root).ok
    assert open_dataset(root).verify().ok


def _expect_problem(capsys, root: Path, rel: str, kind: str, *flags: str) -> str:
    rc, out, err = run_cli(capsys, "verify", *flags, str(root))
    assert rc == 1, (out, err)
    assert "Traceback" not in err
    lines = bad_lines(err)
    assert any(line.startswith(f"BAD {rel}: {kind}: ") for line in lines), err
    assert err.rstrip().splitlines()[-1].startswith("FAILED: ")
    # the JSON report says the same
    rc, out, _ = run_cli(capsys, "verify", "--json", *flags, str(root))
    report = json.loads(out)
    assert rc == 1 and report["ok"] is False
    assert {"path": rel, "kind": kind} in [
        {"path": p["path"], "kind": p["kind"]} for p in report["problems"]
    ]
    return err


def test_flipped_byte_is_a_hash_problem(small_dataset, capsys):
    root, manifest, _ = small_dataset
    rel = manifest.shards[1].path
    flip_byte(root / rel, (root / rel).stat().st_size // 2)
    err = _expect_problem(capsys, root, rel, "hash")
    assert len(bad_lines(err)) == 1, err


@pytest.mark.parametrize("where", ["first", "last"])
def test_flipped_byte_at_the_ends_is_a_hash_problem(small_dataset, capsys, where):
    root, manifest, _ = small_dataset
    rel = manifest.shards[0].path
    size = (root / rel).stat().st_size
    flip_byte(root / rel, 0 if where == "first" else size - 1, mask=0x01)
    _expect_problem(capsys, root, rel, "hash")


def test_truncated_shard_is_a_size_problem(small_dataset, capsys):
    root, manifest, _ = small_dataset
    rel = manifest.shards[2].path
    data = (root / rel).read_bytes()
    (root / rel).write_bytes(data[:-10])
    _expect_problem(capsys, root, rel, "size")
    # --no-hash still checks sizes
    _expect_problem(capsys, root, rel, "size", "--no-hash")


def test_grown_shard_is_a_size_problem(small_dataset, capsys):
    root, manifest, _ = small_dataset
    rel = manifest.shards[0].path
    with open(root / rel, "ab") as handle:
        handle.write(b"\0")
    _expect_problem(capsys, root, rel, "size", "--no-hash")


def test_missing_shard(small_dataset, capsys):
    root, manifest, _ = small_dataset
    rel = manifest.shards[-1].path
    (root / rel).unlink()
    _expect_problem(capsys, root, rel, "missing")


def test_extra_unlisted_shard(small_dataset, capsys):
    root, manifest, _ = small_dataset
    rel = "data/chunk-000/file-999.parquet"
    shutil.copy(root / manifest.shards[0].path, root / rel)
    err = _expect_problem(capsys, root, rel, "extra")
    assert len(bad_lines(err)) == 1
    _expect_problem(capsys, root, rel, "extra", "--no-hash")


@pytest.mark.parametrize(
    "rel", ["videos/cam/chunk-000/file-000.mp4", "data/README", "data/chunk-001/x"]
)
def test_extra_files_under_data_and_videos(small_dataset, capsys, rel):
    root, _, _ = small_dataset
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_bytes(b"x")
    _expect_problem(capsys, root, rel, "extra")


def test_extra_files_under_meta_are_allowed(small_dataset, capsys):
    """meta/ may gain files after publication (they carry their own records); verify allows them."""
    root, _, _ = small_dataset
    (root / "meta/assignments").mkdir()
    (root / "meta/assignments/ranks.json").write_text("{}")
    rc, out, err = run_cli(capsys, "verify", str(root))
    assert rc == 0, err
    assert out.startswith("OK: ")


def test_edited_info_json_is_a_hash_problem(small_dataset, capsys):
    root, _, _ = small_dataset
    info = root / "meta/info.json"
    text = info.read_text()
    edited = text.replace('"total_tasks": 0', '"total_tasks": 9')
    assert edited != text and len(edited) == len(text)
    info.write_text(edited)
    _expect_problem(capsys, root, "meta/info.json", "hash")
    # and the reader refuses the dataset with a clean error
    with pytest.raises(CorruptShardError, match=r"meta/info\.json"):
        open_dataset(root)
    rc, out, err = run_cli(capsys, "inspect", str(root))
    assert_clean_one_line_error(rc, out, err, "meta/info.json")


def test_edited_stats_json_is_a_problem(small_dataset, capsys):
    root, _, _ = small_dataset
    with open(root / "meta/stats.json", "a") as handle:
        handle.write(" ")
    _expect_problem(capsys, root, "meta/stats.json", "size")


@pytest.mark.parametrize(
    "rel",
    [
        f"data/chunk-000/.file-001.parquet.tmp-{'0' * 32}",
        f"meta/.stats.json.tmp-{'1' * 32}",
        f"meta/shardfeed/.manifest.json.tmp-{'2' * 32}",
    ],
)
def test_leftover_temp_file(small_dataset, capsys, rel):
    root, manifest, _ = small_dataset
    shutil.copy(root / manifest.shards[1].path, root / rel)
    err = _expect_problem(capsys, root, rel, "extra")
    assert "temporary" in err
    _expect_problem(capsys, root, rel, "extra", "--no-hash")


def test_every_problem_is_reported_at_once(small_dataset, capsys):
    root, manifest, _ = small_dataset
    flip_byte(root / manifest.shards[0].path, 100)
    (root / manifest.shards[1].path).unlink()
    (root / "data/chunk-000/file-999.parquet").write_bytes(b"junk")
    rc, _, err = run_cli(capsys, "verify", str(root))
    assert rc == 1
    kinds = {line.split(": ")[1] for line in bad_lines(err)}
    assert kinds == {"hash", "missing", "extra"}


# --------------------------------------------------------------------------------------------
# the reader on damaged shards


@pytest.mark.parametrize("shard", [0, 1, 2])
def test_reader_on_a_flipped_middle_byte(small_dataset, shard):
    """Reading all rows after flipping the middle byte of a shard must either raise
    CorruptShardError naming the shard, or (if the byte carried no data, e.g. a statistic)
    return exactly the original rows. Any other exception is a crash, not a clean error."""
    root, manifest, _ = small_dataset
    original = read_all(root)
    rel = manifest.shards[shard].path
    flip_byte(root / rel, (root / rel).stat().st_size // 2)
    try:
        got = read_all(root)
    except CorruptShardError as err:
        assert rel in str(err)
    else:
        assert same_batch(got, original), "silently returned different data"


def test_reader_detects_a_flipped_byte_in_every_column_chunk(small_dataset):
    """A byte flipped inside a data page (the last byte of each column chunk) fails the page CRC."""
    root, manifest, _ = small_dataset
    original = read_all(root)
    rel = manifest.shards[2].path
    path = root / rel
    pristine = path.read_bytes()
    meta = pq.ParquetFile(path).metadata
    checked = 0
    for g in range(meta.num_row_groups):
        for c in range(meta.num_columns):
            col = meta.row_group(g).column(c)
            start = col.dictionary_page_offset or col.data_page_offset
            end = start + col.total_compressed_size
            path.write_bytes(pristine)
            flip_byte(path, end - 1)
            with pytest.raises(CorruptShardError) as info:
                read_all(root)
            assert rel in str(info.value)
            checked += 1
    path.write_bytes(pristine)
    assert checked >= 2 * len(original)
    assert same_batch(read_all(root), original)


def test_reader_never_returns_silently_different_data(make_small_dataset):
    """Flip (XOR 0xFF) every third byte of a shard, footer and tail included: each read either
    raises a ShardfeedError (clean, user-facing) or returns exactly the original rows."""
    root, manifest, _ = make_small_dataset(
        "tiny", n=24, target_shard_size="1MB", row_group_size=400
    )
    assert len(manifest.shards) == 1
    original = read_all(root)
    path = root / manifest.shards[0].path
    pristine = path.read_bytes()
    positions = sorted({*range(0, len(pristine), 3), *range(len(pristine) - 12, len(pristine))})
    silent, unclean = [], []
    for pos in positions:
        data = bytearray(pristine)
        data[pos] ^= 0xFF
        path.write_bytes(bytes(data))
        try:
            got = read_all(root)
        except ShardfeedError:
            continue
        except Exception as err:  # not a clean error: a crash in a training loop or the CLI
            unclean.append((pos, f"{type(err).__name__}: {err}"[:120]))
            continue
        if not same_batch(got, original):
            silent.append(pos)
    path.write_bytes(pristine)
    assert not silent, f"silently different data after flipping byte(s) at {silent[:10]}"
    assert not unclean, f"{len(unclean)} flips raised a non-shardfeed error, e.g. {unclean[:3]}"


def _footer_schema_name_offset(path: Path, name: bytes) -> int:
    """Offset of the first occurrence of ``name`` inside the Parquet footer (its schema section)."""
    data = path.read_bytes()
    footer_len = int.from_bytes(data[-8:-4], "little")
    footer_start = len(data) - 8 - footer_len
    pos = data.find(name, footer_start)
    assert pos > 0
    return pos


def test_corrupt_footer_column_name_is_a_corrupt_shard(make_small_dataset):
    """Minimal case of the sweep above: one non-UTF-8 byte in a column name of the footer schema."""
    root, manifest, _ = make_small_dataset(
        "tiny", n=24, target_shard_size="1MB", row_group_size=400
    )
    path = root / manifest.shards[0].path
    flip_byte(path, _footer_schema_name_offset(path, b"caption"))
    with pytest.raises(CorruptShardError):
        read_all(root)


def test_verify_no_hash_reports_a_corrupt_footer_without_traceback(make_small_dataset, capsys):
    root, manifest, _ = make_small_dataset(
        "tiny", n=24, target_shard_size="1MB", row_group_size=400
    )
    rel = manifest.shards[0].path
    flip_byte(root / rel, _footer_schema_name_offset(root / rel, b"caption"))
    # with hashes the damage is a hash mismatch
    _expect_problem(capsys, root, rel, "hash")
    # without, the footer is opened to count rows: it must be reported, not crash
    _expect_problem(capsys, root, rel, "unreadable", "--no-hash")


def test_truncated_shard_read_raises_corrupt_shard(small_dataset):
    root, manifest, _ = small_dataset
    rel = manifest.shards[1].path
    data = (root / rel).read_bytes()
    (root / rel).write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptShardError) as info:
        read_all(root)
    assert rel in str(info.value) and "size" in str(info.value)
    # rows in the other shards are still readable
    ds = open_dataset(root)
    assert len(ds.read(0, manifest.shards[0].rows)["label"]) == manifest.shards[0].rows
    with pytest.raises(CorruptShardError):
        ds[manifest.shards[1].index_start]
    with pytest.raises(CorruptShardError):
        ds.take([0, manifest.shards[1].index_end - 1])


def test_missing_shard_read_raises_corrupt_shard(small_dataset):
    root, manifest, _ = small_dataset
    rel = manifest.shards[0].path
    (root / rel).unlink()
    with pytest.raises(CorruptShardError, match="missing"):
        read_all(root)


# --------------------------------------------------------------------------------------------
# path safety


def _edit_manifest(root: Path, edit) -> None:
    obj = json.loads((root / MANIFEST).read_text())
    edit(obj)
    (root / MANIFEST).write_text(json.dumps(obj))


@pytest.mark.parametrize("bad", ["../../etc/passwd", "/etc/passwd", "data/%2e%2e/%2e%2e/x"])
def test_escaping_manifest_path_is_refused(small_dataset, capsys, bad):
    root, _, _ = small_dataset
    _edit_manifest(root, lambda m: m["shards"][0].update(path=bad))
    with pytest.raises(UnsafePathError) as info:
        open_dataset(root)
    assert isinstance(info.value, ShardfeedError)
    assert "shards[0].path" in str(info.value)
    for command in ("inspect", "verify"):
        rc, out, err = run_cli(capsys, command, str(root))
        assert_clean_one_line_error(rc, out, err, "shards[0].path")
        assert out == ""


def test_escaping_file_path_is_refused(small_dataset, capsys):
    root, _, _ = small_dataset
    _edit_manifest(root, lambda m: m["files"][0].update(path="../../../etc/hostname"))
    with pytest.raises(UnsafePathError, match=r"files\[0\]\.path"):
        open_dataset(root)
    rc, out, err = run_cli(capsys, "verify", str(root))
    assert_clean_one_line_error(rc, out, err, "files[0].path")


def _symlink_out(root: Path, outside: Path, rel: str) -> None:
    """Move ``root/rel`` (file or directory) outside the root and leave a symlink to it."""
    target = outside / rel.replace("/", "_")
    shutil.move(str(root / rel), str(target))
    os.symlink(target, root / rel)


@pytest.mark.parametrize("which", ["shard", "data-dir", "info"])
def test_symlink_out_of_the_root_is_refused(small_dataset, tmp_path, capsys, which):
    root, manifest, _ = small_dataset
    outside = tmp_path / "outside"
    outside.mkdir()
    rel = {
        "shard": manifest.shards[1].path,
        "data-dir": "data/chunk-000",
        "info": "meta/info.json",
    }[which]
    _symlink_out(root, outside, rel)
    # same bytes, same sizes: only the location is wrong
    assert (root / manifest.shards[1].path).stat().st_size == manifest.shards[1].bytes

    with pytest.raises(UnsafePathError) as info:
        open_dataset(root)
    message = str(info.value)
    assert "outside the dataset root" in message
    assert rel.split("/")[-1] in message or ".path" in message

    rc, out, err = run_cli(capsys, "inspect", str(root))
    assert_clean_one_line_error(rc, out, err, "outside the dataset root")

    rc, out, err = run_cli(capsys, "verify", str(root))
    assert rc == 1
    assert "Traceback" not in err
    unsafe = [line for line in bad_lines(err) if ": unsafe: " in line]
    assert unsafe, err
    if which == "shard":
        assert unsafe == [line for line in bad_lines(err)]
        assert unsafe[0].startswith(f"BAD {manifest.shards[1].path}: unsafe: ")


def test_symlinked_root_is_fine(small_dataset, tmp_path, capsys):
    """Control: the root itself may be reached through a symlink."""
    root, _, data = small_dataset
    link = tmp_path / "link-to-ds"
    os.symlink(root, link)
    np.testing.assert_array_equal(read_all(link)["label"], data["label"])
    rc, _, err = run_cli(capsys, "verify", str(link))
    assert rc == 0, err


def test_symlink_inside_the_root_is_fine(small_dataset, capsys):
    """Control: a symlink that stays inside the root is not an escape."""
    root, manifest, data = small_dataset
    rel = manifest.shards[0].path
    (root / "data" / "store").mkdir()
    shutil.move(str(root / rel), str(root / "data" / "store" / "s0"))
    os.symlink(root / "data" / "store" / "s0", root / rel)
    np.testing.assert_array_equal(read_all(root)["label"], data["label"])


# --------------------------------------------------------------------------------------------
# incomplete datasets


def test_no_manifest(small_dataset, capsys):
    root, _, _ = small_dataset
    (root / MANIFEST).unlink()
    with pytest.raises(IncompleteDatasetError) as info:
        open_dataset(root)
    assert "manifest.json" in str(info.value)
    rc, out, err = run_cli(capsys, "inspect", str(root))
    assert rc == 1
    assert_clean_one_line_error(rc, out, err, "manifest.json")
    rc, out, err = run_cli(capsys, "verify", str(root))
    assert rc == 1
    assert_clean_one_line_error(rc, out, err, "manifest.json")


@pytest.mark.parametrize("kind", ["empty-dir", "no-such-dir"])
def test_not_a_dataset(tmp_path, capsys, kind):
    root = tmp_path / "x"
    if kind == "empty-dir":
        root.mkdir()
    with pytest.raises(IncompleteDatasetError):
        open_dataset(root)
    rc, out, err = run_cli(capsys, "inspect", str(root))
    assert_clean_one_line_error(rc, out, err)


@pytest.mark.parametrize("text", ["{not json", "[]", '{"format_version": "9.0"}', ""])
def test_garbled_manifest_is_a_clean_error(small_dataset, capsys, text):
    root, _, _ = small_dataset
    (root / MANIFEST).write_text(text)
    with pytest.raises(ShardfeedError):
        open_dataset(root)
    for command in ("inspect", "verify"):
        rc, out, err = run_cli(capsys, command, str(root))
        assert_clean_one_line_error(rc, out, err, "manifest.json")


def test_info_json_missing(small_dataset, capsys):
    root, _, _ = small_dataset
    (root / "meta/info.json").unlink()
    with pytest.raises(IncompleteDatasetError, match=r"info\.json"):
        open_dataset(root)
    rc, out, err = run_cli(capsys, "inspect", str(root))
    assert_clean_one_line_error(rc, out, err, "info.json")


# --------------------------------------------------------------------------------------------
# overwrite protection


def test_write_into_existing_dataset_needs_overwrite(small_dataset, small_spec, read_tree):
    root, _, data = small_dataset
    before = read_tree(root)
    with pytest.raises(ShardfeedError, match="overwrite"):
        write_dataset(root, small_spec, data)
    assert read_tree(root) == before


def test_write_into_non_empty_directory_needs_overwrite(tmp_path, small_spec, make_small_dataset):
    root = tmp_path / "occupied"
    root.mkdir()
    (root / "notes.txt").write_text("mine")
    _, _, data = make_small_dataset("other")
    with pytest.raises(ShardfeedError, match="overwrite"):
        write_dataset(root, small_spec, data)
    assert os.listdir(root) == ["notes.txt"]
    assert (root / "notes.txt").read_text() == "mine"


def test_overwrite_replaces_everything_under_data(small_dataset, small_spec, capsys):
    root, old_manifest, _ = small_dataset
    (root / "data/chunk-000/file-999.parquet").write_bytes(b"stale")
    (root / "data/chunk-000/.file-000.parquet.tmp-deadbeef").write_bytes(b"stale temp")
    (root / "videos/cam").mkdir(parents=True)
    (root / "videos/cam/old.mp4").write_bytes(b"stale video")
    (root / "meta/old.json").write_text("{}")
    new = {
        "observation.state": np.ones((30, 3), np.float32),
        "label": np.arange(30, dtype=np.int64),
        "caption": ["new"] * 30,
        "image": [b"n"] * 30,
    }
    manifest = write_dataset(
        root, small_spec, new, target_shard_size=900, row_group_size=300, overwrite=True
    )
    assert len(manifest.shards) < len(old_manifest.shards)
    files = {str(p.relative_to(root)).replace(os.sep, "/") for p in root.rglob("*") if p.is_file()}
    expected = {s.path for s in manifest.shards} | {f.path for f in manifest.files} | {MANIFEST}
    assert files == expected
    assert not (root / "data/chunk-000/file-999.parquet").exists()
    rc, _, err = run_cli(capsys, "verify", str(root))
    assert rc == 0, err
    got = read_all(root)
    np.testing.assert_array_equal(got["label"], new["label"])
    assert got["caption"].tolist() == ["new"] * 30

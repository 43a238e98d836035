"""Location.read_bytes: the local fast path checks exactly what the resolving path checks."""

from __future__ import annotations

import os

import pytest

from shardfeed.formats.storage import locate
from shardfeed.schemas.errors import UnsafePathError


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "x.bin").write_bytes(b"x" * 100_000)
    (root / "top.bin").write_bytes(b"top")
    (root / "empty.bin").write_bytes(b"")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.bin").write_bytes(b"secret")
    os.symlink(root / "a" / "b" / "x.bin", root / "a" / "inside_link.bin")
    os.symlink(outside / "secret.bin", root / "a" / "escape_link.bin")
    os.symlink(outside, root / "a" / "escape_dir")
    os.symlink(root / "a" / "b", root / "dir_link")
    return root


def test_reads_whole_files_at_any_depth(tree):
    loc = locate(tree)
    assert loc.read_bytes("a/b/x.bin") == b"x" * 100_000
    assert loc.read_bytes("top.bin") == b"top"
    assert loc.read_bytes("empty.bin") == b""
    # a second read of the same directory uses the cached real directory
    assert loc.read_bytes("a/b/x.bin") == b"x" * 100_000


def test_symlinks_inside_the_root_are_followed(tree):
    loc = locate(tree)
    assert loc.read_bytes("a/inside_link.bin") == b"x" * 100_000
    assert loc.read_bytes("dir_link/x.bin") == b"x" * 100_000


@pytest.mark.parametrize(
    "rel", ["a/escape_link.bin", "a/escape_dir/secret.bin", "../outside/secret.bin", "/etc/passwd"]
)
def test_escapes_are_refused(tree, rel):
    with pytest.raises(UnsafePathError):
        locate(tree).read_bytes(rel)


def test_a_file_swapped_for_an_escaping_symlink_after_its_directory_was_cached(tree, tmp_path):
    loc = locate(tree)
    assert loc.read_bytes("a/b/x.bin")  # caches a/b
    os.unlink(tree / "a" / "b" / "x.bin")
    os.symlink(tmp_path / "outside" / "secret.bin", tree / "a" / "b" / "x.bin")
    with pytest.raises(UnsafePathError):
        loc.read_bytes("a/b/x.bin")


def test_missing_file_is_an_os_error(tree):
    with pytest.raises(FileNotFoundError):
        locate(tree).read_bytes("a/b/nope.bin")


def test_pickled_location_recomputes_its_caches(tree):
    import pickle

    loc = locate(tree)
    loc.read_bytes("a/b/x.bin")
    state = loc.__getstate__()
    assert "_real_dirs" not in state and "real_root" not in state
    assert pickle.loads(pickle.dumps(loc)).read_bytes("a/b/x.bin") == b"x" * 100_000


def test_read_into_fills_exactly_the_view(tree):
    loc = locate(tree)
    buf = bytearray(100_003)
    loc.read_into("a/b/x.bin", memoryview(buf)[3:])
    assert bytes(buf[3:]) == b"x" * 100_000 and bytes(buf[:3]) == b"\0\0\0"
    loc.read_into("empty.bin", memoryview(bytearray(0)))
    with pytest.raises(ValueError, match="100000 bytes, expected 99999"):
        loc.read_into("a/b/x.bin", memoryview(bytearray(99_999)))
    with pytest.raises(UnsafePathError):
        loc.read_into("a/escape_link.bin", memoryview(bytearray(6)))


def test_read_ahead_yields_each_file_or_its_error_in_order(tree, monkeypatch):
    import shardfeed.formats.storage as storage

    advised = []
    real = storage.os.posix_fadvise
    monkeypatch.setattr(
        storage.os, "posix_fadvise", lambda fd, *a: advised.append(a) or real(fd, *a)
    )
    rels = ["a/b/x.bin", "a/escape_link.bin", "top.bin", "a/b/nope.bin", "../x", "empty.bin"]
    out = list(locate(tree).read_ahead(rels, window=2))
    assert out[0] == b"x" * 100_000 and out[2] == b"top" and out[5] == b""
    assert isinstance(out[1], UnsafePathError) and isinstance(out[4], UnsafePathError)
    assert isinstance(out[3], FileNotFoundError)
    # only the three readable files were opened (and advised); escapes never were
    assert len(advised) == 3


def test_read_ahead_closes_what_it_opened_when_abandoned(tree):
    before = len(os.listdir("/proc/self/fd"))
    reads = locate(tree).read_ahead(["a/b/x.bin", "top.bin", "empty.bin"], window=3)
    assert next(reads) == b"x" * 100_000
    assert len(os.listdir("/proc/self/fd")) == before + 2
    reads.close()
    assert len(os.listdir("/proc/self/fd")) == before


def test_size_and_mtime_are_the_files_own_with_the_same_escape_checks(tree, tmp_path):
    loc = locate(tree)
    for rel, real in [
        ("a/b/x.bin", tree / "a" / "b" / "x.bin"),
        ("top.bin", tree / "top.bin"),
        ("a/inside_link.bin", tree / "a" / "b" / "x.bin"),  # a symlinked leaf: its target's
        ("dir_link/x.bin", tree / "a" / "b" / "x.bin"),
    ]:
        st = os.stat(real)
        assert loc.size_and_mtime(rel) == (st.st_size, st.st_mtime_ns), rel
    for rel in ("a/escape_link.bin", "a/escape_dir/secret.bin", "../outside/secret.bin"):
        with pytest.raises(UnsafePathError):
            loc.size_and_mtime(rel)
    with pytest.raises(FileNotFoundError):
        loc.size_and_mtime("a/b/nope.bin")
    # a file swapped for an escaping symlink after its directory was cached
    os.unlink(tree / "top.bin")
    os.symlink(tmp_path / "outside" / "secret.bin", tree / "top.bin")
    with pytest.raises(UnsafePathError):
        loc.size_and_mtime("top.bin")


def test_a_store_path_writes_an_arrow_buffer_whole(tmp_path):
    """Scratch tables are written from Arrow's buffer (no copy into bytes on a local disk);
    an object store gets the same bytes."""
    import pyarrow as pa
    import pyarrow.fs as pafs

    from shardfeed.formats.store_path import StorePath

    data = pa.py_buffer(bytes(range(256)) * 1000)
    local = StorePath.of(tmp_path / "sub" / "local.bin")
    local.write_bytes(data)
    assert local.read_bytes() == data.to_pybytes()
    remote = StorePath(str(tmp_path / "remote.bin"), pafs.LocalFileSystem())
    remote.write_bytes(data)
    assert remote.read_bytes() == data.to_pybytes()
    assert [name for name in os.listdir(tmp_path) if name != "sub"] == ["remote.bin"]
    assert os.listdir(tmp_path / "sub") == ["local.bin"]  # no temporary name left

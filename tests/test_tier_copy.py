"""One verified file copy (``formats/tier_copy.copy_file``): the in-kernel path and its fallback."""

from __future__ import annotations

import errno
import hashlib
import os

import pytest

from shardfeed.formats import tier_copy
from shardfeed.formats.storage import locate
from shardfeed.formats.tier_copy import CopyMismatchError, Target, copy_file

REL = "data/chunk-000/file-000.parquet"


@pytest.fixture
def source(tmp_path):
    payload = os.urandom(10_000 + 123)  # not a whole number of chunks
    path = tmp_path / "src" / REL
    path.parent.mkdir(parents=True)
    path.write_bytes(payload)
    return locate(tmp_path / "src"), payload


@pytest.fixture(params=["kernel", "streaming"])
def copy_path(request, monkeypatch):
    """Run each test through copy_file_range, and through the read/hash/write fallback taken
    when the kernel refuses (EXDEV: another file system on an old kernel)."""
    monkeypatch.setattr(tier_copy, "CHUNK", 4096)  # several chunks per file
    calls = []
    real = os.copy_file_range

    def refusing(*args):
        calls.append(args)
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    def counting(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(os, "copy_file_range", counting if request.param == "kernel" else refusing)
    return request.param, calls


def test_a_copy_is_whole_and_reports_every_byte(tmp_path, source, copy_path):
    location, payload = source
    mode, calls = copy_path
    heard = []
    target = Target(str(tmp_path / "tier"))
    copy_file(
        location,
        target,
        REL,
        len(payload),
        hashlib.sha256(payload).hexdigest(),
        progress=heard.append,
    )
    assert (tmp_path / "tier" / REL).read_bytes() == payload
    assert sum(heard) == len(payload) and len(heard) == 3  # 4096 + 4096 + the rest
    assert os.listdir(tmp_path / "tier/data/chunk-000") == ["file-000.parquet"]
    assert calls, "the kernel copy was tried"
    if mode == "kernel":
        assert len(calls) == 4  # three chunks, then the zero-length end


def test_a_source_that_differs_from_the_manifest_is_not_published(tmp_path, source, copy_path):
    location, payload = source
    target = Target(str(tmp_path / "tier"))
    wrong = hashlib.sha256(payload + b"x").hexdigest()
    with pytest.raises(CopyMismatchError, match="the source changed or is corrupt"):
        copy_file(location, target, REL, len(payload), wrong)
    with pytest.raises(CopyMismatchError, match=f"read {len(payload)} bytes"):
        copy_file(location, target, REL, len(payload) + 1, hashlib.sha256(payload).hexdigest())
    assert os.listdir(tmp_path / "tier/data/chunk-000") == []  # no final name, no temporary


def test_a_kernel_failure_mid_copy_is_an_error_not_a_fallback(tmp_path, source, monkeypatch):
    """Only a refusal before any byte moved falls back; a failure after that is raised, and the
    temporary file is removed."""
    location, payload = source
    monkeypatch.setattr(tier_copy, "CHUNK", 4096)
    real = os.copy_file_range

    def failing_later(src, dst, count, offset_src, offset_dst):
        if offset_src > 0:
            raise OSError(errno.EIO, "Input/output error")
        return real(src, dst, count, offset_src, offset_dst)

    monkeypatch.setattr(os, "copy_file_range", failing_later)
    with pytest.raises(OSError, match="Input/output error"):
        copy_file(
            location,
            Target(str(tmp_path / "tier")),
            REL,
            len(payload),
            hashlib.sha256(payload).hexdigest(),
        )
    assert os.listdir(tmp_path / "tier/data/chunk-000") == []

"""ImageFolderSource: class directories, labels, rejects for escaping symlinks, and a bytes round trip."""

from __future__ import annotations

import hashlib
import io
import os
import pickle
from pathlib import Path

import pytest
from PIL import Image

from shardfeed.formats.sources.imagefolder import ImageFolderSource
from shardfeed.schemas.errors import ShardfeedError
from shardfeed.schemas.features import IMAGE_ARROW_TYPE


def encode(colour: tuple[int, int, int], fmt: str, size: int = 6) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buf, format=fmt)
    return buf.getvalue()


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """root/{cat,dog,zebra} with mixed-case extensions, a nested dir, a non-image, an empty
    image, a hidden dir, a loose root image, an escaping symlink and a broken symlink."""
    root = tmp_path / "root"
    images = {
        "cat/a.jpg": encode((255, 0, 0), "JPEG"),
        "cat/B.JPEG": encode((250, 10, 0), "JPEG"),
        "cat/c.png": encode((240, 0, 20), "PNG"),
        "dog/d.webp": encode((0, 255, 0), "WEBP"),
        "dog/puppies/p1.PNG": encode((0, 200, 0), "PNG", 9),
        "dog/puppies/deeper/p2.jpg": encode((0, 180, 30), "JPEG", 5),
        "zebra/z.Jpg": encode((0, 0, 0), "JPEG"),
        "zebra/empty.png": b"",
    }
    for rel, data in images.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (root / "cat/notes.txt").write_text("not an image")
    (root / "dog/puppies/README").write_text("ignored")
    (root / ".cache").mkdir()
    (root / ".cache/x.jpg").write_bytes(encode((1, 2, 3), "JPEG"))
    (root / "zebra/.hidden.jpg").write_bytes(b"hidden")
    (root / "loose.jpg").write_bytes(encode((9, 9, 9), "JPEG"))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.jpg").write_bytes(encode((7, 7, 7), "JPEG"))
    os.symlink(outside / "secret.jpg", root / "cat/evil.jpg")
    os.symlink(outside, root / "dog/evil_dir")
    os.symlink(root / "cat/missing.jpg", root / "zebra/broken.jpg")
    return root, images


def scan_all(source: ImageFolderSource):
    spec = source.spec()
    units, rejects = [], []
    for rel in source.files():
        result = source.scan(rel, spec)
        units += result.units
        rejects += result.rejects
    return spec, units, rejects


def test_labels_spec_and_meta(tree):
    root, _ = tree
    source = ImageFolderSource(root)
    assert source.kind == "imagefolder"
    assert source.label_names == ["cat", "dog", "zebra"]
    assert source.files() == ["cat", "dog", "zebra"]
    spec = source.spec()
    assert spec.names == ["image", "label", "path"]
    assert spec["image"].dtype == "image" and spec["image"].arrow_type == IMAGE_ARROW_TYPE
    assert spec["label"].dtype == "int64" and spec["label"].names == ["cat", "dog", "zebra"]
    assert spec["path"].dtype == "string"
    notes = source.meta().notes
    assert '3 classes (label 0..2): ["cat", "dog", "zebra"]' in notes
    assert any("1 image file(s) directly under the root" in n and "loose.jpg" in n for n in notes)


def test_scan_units_and_rejects(tree):
    root, images = tree
    source = ImageFolderSource(root)
    _spec, units, rejects = scan_all(source)
    assert sorted(u.locator[0] for u in units) == sorted(images)
    for unit in units:
        rel = unit.locator[0]
        data = images[rel]
        assert unit.file == rel.split("/")[0] and unit.rows == 1
        assert unit.payload_bytes == len(data) + len(rel.encode()) + 8
        assert unit.content_hash == hashlib.sha256(data).hexdigest()[:32]
    # positions index the class's sorted listing (rejected entries keep their slot)
    assert [(u.file, u.position, u.locator[0]) for u in units] == [
        ("cat", 0, "cat/B.JPEG"),
        ("cat", 1, "cat/a.jpg"),
        ("cat", 2, "cat/c.png"),
        ("dog", 0, "dog/d.webp"),
        ("dog", 2, "dog/puppies/deeper/p2.jpg"),
        ("dog", 3, "dog/puppies/p1.PNG"),
        ("zebra", 1, "zebra/empty.png"),
        ("zebra", 2, "zebra/z.Jpg"),
    ]
    assert {(r.source, r.position, r.reason) for r in rejects} == {
        ("cat/evil.jpg", "", "path_escape"),
        ("dog/evil_dir", "", "path_escape"),
        ("zebra/broken.jpg", "", "io_error"),
    }
    assert source.reject_location(units[0]) == ("cat/B.JPEG", "")
    # the empty file is a unit: scan never decodes
    empty = next(u for u in units if u.locator[0] == "zebra/empty.png")
    assert empty.payload_bytes == len("zebra/empty.png") + 8


def test_read_round_trip_in_any_order(tree):
    root, images = tree
    source = ImageFolderSource(root)
    spec, units, _ = scan_all(source)
    order = list(reversed(units))
    table = source.read(order, spec)
    assert table.schema == spec.arrow_schema()
    rows = table.to_pylist()
    assert [r["path"] for r in rows] == [u.locator[0] for u in order]
    for row in rows:
        assert row["image"] == {"bytes": images[row["path"]], "path": None}
        assert row["label"] == source.label_names.index(row["path"].split("/")[0])
        assert row["image"]["bytes"] == (root / row["path"]).read_bytes()
    assert source.read([], spec).num_rows == 0


def test_pickles_and_detects_changes(tree):
    root, _ = tree
    source = pickle.loads(pickle.dumps(ImageFolderSource(root, drop_videos=True)))
    spec, units, _ = scan_all(source)
    assert scan_all(source)[1] == units  # deterministic
    (root / units[0].locator[0]).write_bytes(b"different length")
    with pytest.raises(ShardfeedError, match="changed since it was scanned"):
        source.read(units[:1], spec)


def test_empty_class_and_errors(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "b/x.png").write_bytes(encode((1, 1, 1), "PNG"))
    source = ImageFolderSource(tmp_path)
    assert source.label_names == ["a", "b"]  # an empty class keeps its label
    _spec, units, rejects = scan_all(source)
    assert [(u.file, u.locator[0]) for u in units] == [("b", "b/x.png")]
    assert rejects == []
    with pytest.raises(ShardfeedError, match="not a class directory"):
        source.scan("c", source.spec())
    with pytest.raises(ShardfeedError, match="no class directories"):
        ImageFolderSource(tmp_path / "a")
    with pytest.raises(ShardfeedError, match="no such directory"):
        ImageFolderSource(tmp_path / "missing")


def test_symlinked_class_inside_root_is_followed_once(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real/x.jpg").write_bytes(encode((3, 3, 3), "JPEG"))
    os.symlink(tmp_path / "real", tmp_path / "real/loop")  # a cycle
    source = ImageFolderSource(tmp_path)
    _spec, units, rejects = scan_all(source)
    assert [u.locator[0] for u in units] == ["real/x.jpg"] and rejects == []


# --------------------------------------------------------------------------------------------------
# Header-only scans (--validate header / none): each image is read once, by its shard writer


def noisy_jpeg(seed: int, side: int = 160, app_bytes: int = 0) -> bytes:
    """A JPEG of random pixels (tens of KB), optionally with a comment segment of ``app_bytes``
    before the frame header, which pushes the header past the scan's head."""
    import numpy as np

    pixels = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=95)
    data = buf.getvalue()
    for _ in range(app_bytes // 65_000):
        data = data[:2] + b"\xff\xfe" + (65_002).to_bytes(2, "big") + b"c" * 65_000 + data[2:]
    return data


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    root = tmp_path / "photos"
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    for i in range(6):
        (root / "a" / f"{i}.jpg").write_bytes(noisy_jpeg(i))
    (root / "b" / "big_header.jpg").write_bytes(noisy_jpeg(9, app_bytes=130_000))
    (root / "b" / "w.webp").write_bytes(encode((1, 2, 3), "WEBP"))  # Pillow only
    (root / "b" / "bad.jpg").write_bytes(b"\xff\xd8\xff\xe0" + b"\x00" * 40)  # no frame header
    (root / "b" / "huge.png").write_bytes(_png_header(50_000, 50_000))
    return root


def _png_header(width: int, height: int) -> bytes:
    """A PNG whose header declares ``width x height`` (its data is not valid)."""
    import struct
    import zlib

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return (
        b"\x89PNG\r\n\x1a\n"
        + struct.pack(">I", len(ihdr))
        + chunk
        + struct.pack(">I", zlib.crc32(chunk))
        + struct.pack(">I", 4)
        + b"IDAT"
        + b"\x00" * 8
    )


def _whole_reads(monkeypatch) -> list[str]:
    """Names of the files the storage layer reads whole from now on."""
    from shardfeed.formats import storage

    seen: list[str] = []
    real_all, real_bytes = storage._read_all, storage.Location.read_bytes

    def read_all(fd):
        seen.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_all(fd)

    def read_bytes(self, rel, field="path"):
        seen.append(rel)
        return real_bytes(self, rel, field)

    monkeypatch.setattr(storage, "_read_all", read_all)
    monkeypatch.setattr(storage.Location, "read_bytes", read_bytes)
    return seen


def test_a_header_scan_reads_heads_and_settles_the_rest_as_a_whole_scan(photos, monkeypatch):
    from shardfeed.transforms.image_policy import HEAD_BYTES, ImagePolicy

    policy = ImagePolicy(validate="header")
    _, whole_units, whole_rejects = scan_all(
        ImageFolderSource(str(photos), media_hook=policy, hash_content=True)
    )
    seen = _whole_reads(monkeypatch)
    _, units, rejects = scan_all(ImageFolderSource(str(photos), media_hook=policy))
    # only what the head cannot settle is read again whole: a header past the head (a WebP, or a
    # JPEG without a frame header, which only Pillow settles, fit in their heads)
    assert {Path(p).name for p in seen} == {"big_header.jpg"}
    assert len((photos / "a" / "0.jpg").read_bytes()) > HEAD_BYTES // 4
    key = lambda u: u.locator  # noqa: E731
    assert [(u.locator, u.payload_bytes) for u in sorted(units, key=key)] == [
        (u.locator, u.payload_bytes) for u in sorted(whole_units, key=key)
    ]
    assert [(r.source, r.reason) for r in rejects] == [(r.source, r.reason) for r in whole_rejects]
    assert {r.source for r in rejects} == {"b/bad.jpg", "b/huge.png"}  # the second by its header
    digests = {u.locator[0]: u.content_hash for u in units}
    assert digests["a/0.jpg"] == hashlib.sha256(b"a/0.jpg").hexdigest()[:32]


def test_validate_none_reads_nothing_in_the_scan(photos, monkeypatch):
    from shardfeed.transforms.image_policy import ImagePolicy

    seen = _whole_reads(monkeypatch)
    _, units, rejects = scan_all(
        ImageFolderSource(str(photos), media_hook=ImagePolicy(validate="none"))
    )
    assert seen == [] and rejects == [] and len(units) == 10
    sizes = {u.locator[0]: u.payload_bytes for u in units}
    assert sizes["a/1.jpg"] == (photos / "a/1.jpg").stat().st_size + len("a/1.jpg") + 8


def test_full_validation_and_re_encoding_still_read_whole_files(photos, monkeypatch):
    from shardfeed.transforms.image_policy import ImagePolicy

    for policy in (ImagePolicy(validate="full"), ImagePolicy("header", image_format="png")):
        seen = _whole_reads(monkeypatch)
        scan_all(ImageFolderSource(str(photos), media_hook=policy))
        assert len(seen) == 10, policy


def test_a_rerun_never_reuses_a_shard_whose_images_changed(photos, tmp_path, monkeypatch):
    """Header-only scans hash paths, not bytes: the resume digest takes each image's size and
    mtime instead, so a changed image (same size, other bytes) is written anew."""
    from test_lerobot_videos import interrupted_convert

    from shardfeed.cli.main import main

    args = ["--validate", "header", "--target-shard-size", "20KB", "--max-reject-fraction", "0.5"]
    dst = tmp_path / "dst"
    interrupted_convert(monkeypatch, [str(photos), str(dst), *args])
    for path in sorted((photos / "a").glob("*.jpg")):  # other pixels, same size and header
        data = bytearray(path.read_bytes())
        data[-100] ^= 0x01
        path.write_bytes(bytes(data))
    assert main(["convert", str(photos), str(dst), *args]) == 0
    clean = tmp_path / "clean"
    assert main(["convert", str(photos), str(clean), *args]) == 0
    files = lambda root: {  # noqa: E731
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and ".shardfeed-work" not in p.parts
    }
    assert files(dst) == files(clean)

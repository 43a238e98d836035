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

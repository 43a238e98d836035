"""WebDataset tar source: brace patterns, grouping and typing, hostile members, truncation, and
conversions through the real CLI (round trip, .tgz / pattern / directory, rejects, determinism).

Every tar is written here with ``tarfile`` (real JPEG/PNG from Pillow); the WebDataset project's own
test shards (``$SHARDFEED_CORPORA/wds_*``, set by scripts/test.sh) are checked against an
independent grouping of their members.
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import os
import tarfile
import zlib
from functools import reduce
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from shardfeed.formats.payload import table_row_bytes
from shardfeed.formats.sources import detect_kind, open_source
from shardfeed.formats.sources.base import UnitRef
from shardfeed.formats.sources.webdataset import (
    InferredFields,
    WebDatasetSource,
    column_name,
    expand_braces,
    field_kind,
    is_shard_pattern,
    merge_inferred,
    split_name,
)
from shardfeed.schemas.errors import ShardfeedError
from shardfeed.schemas.rejects import REASONS
from shardfeed.transforms.image_policy import ImagePolicy

CORPORA = os.environ.get("SHARDFEED_CORPORA")


def encode(colour: tuple[int, int, int], fmt: str, size: tuple[int, int] = (6, 4)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, fmt)
    return out.getvalue()


def member(name: str, data: bytes = b"", **attrs: object) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for attr, value in attrs.items():
        setattr(info, attr, value)
    return info, data


def write_tar(path: Path, members: list, gz: bool = False) -> Path:
    """A tar (gzipped with a fixed mtime when ``gz``) of ``(name, bytes)`` or ``member(...)``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for item in members:
            info, data = item if isinstance(item[0], tarfile.TarInfo) else member(*item)
            archive.addfile(info, io.BytesIO(data) if info.isreg() else None)
    body = buf.getvalue()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(body, mtime=0) if gz else body)
    return path


def sample_members(key: str, fields: dict[str, object]) -> list[tuple[str, bytes]]:
    out = []
    for ext, value in fields.items():
        if ext == "json":
            data = json.dumps(value).encode()
        elif isinstance(value, int):
            data = f"{value}\n".encode()
        elif isinstance(value, str):
            data = value.encode()
        else:
            data = value
        out.append((f"{key}.{ext}", data))
    return out


def good_samples(shard: int, n: int) -> dict[str, dict[str, object]]:
    """Samples with every field kind; some lack fields, some carry an unknown extension."""
    samples = {}
    for i in range(n):
        fields: dict[str, object] = {}
        if i % 3 != 2:
            fields["jpg" if i % 2 else "png"] = encode(
                (shard * 40, i * 9, 200), "JPEG" if i % 2 else "PNG", (6 + i % 5, 4)
            )
        fields["cls"] = shard * 100 + i - 3
        if i % 4 != 1:
            fields["txt"] = f"caption {shard}/{i} ünï 漢字 " * (1 + i % 3)
        if i % 2 == 0:
            fields["json"] = {"i": i, "score": i / 7, "tags": ["a", None, True], "ok": i % 4 == 0}
        if i % 5 == 0:
            fields["npy"] = bytes(range(i % 256)) + b"\x00\xff"
        samples[f"s{shard}/{i:04d}" if i % 6 == 5 else f"{i:04d}"] = fields
    return samples


SHARDS = {"train-000.tar": 0, "train-001.tar": 1, "train-002.tgz": 2, "train-003.tar.gz": 3}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, dict[tuple[str, str], dict[str, object]]]:
    """Four shards (.tar, .tgz, .tar.gz); keys 0000.. repeat across shards, as real datasets do."""
    root = tmp_path_factory.mktemp("wds") / "shards"
    expected = {}
    for name, shard in SHARDS.items():
        samples = good_samples(shard, 12 + shard * 2)
        members = [m for key, fields in samples.items() for m in sample_members(key, fields)]
        members.insert(3, ("README", b"no extension: not part of any sample"))
        write_tar(root / name, members, gz=not name.endswith(".tar"))
        expected.update({(name, key): fields for key, fields in samples.items()})
    return root, expected


def stored(value: object, ext: str) -> object:
    """What a field value reads back as."""
    kind = field_kind(ext)
    if kind == "json":
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    if kind == "bytes":
        return base64.b64encode(value).decode()
    return value


def merged(source: WebDatasetSource) -> InferredFields:
    return reduce(merge_inferred, (source.infer(f) for f in source.files()), InferredFields())


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


# --------------------------------------------------------------------------------------------------
# Names, patterns and inference


@pytest.mark.parametrize(
    ("pattern", "names"),
    [
        ("a-{000..003}.tar", ["a-000.tar", "a-001.tar", "a-002.tar", "a-003.tar"]),
        ("a-{8..11}.tar", ["a-8.tar", "a-9.tar", "a-10.tar", "a-11.tar"]),
        ("a-{08..10}.tar", ["a-08.tar", "a-09.tar", "a-10.tar"]),
        ("a-{3..1}.tar", ["a-3.tar", "a-2.tar", "a-1.tar"]),
        ("{x,y}/p{0..1}.tgz", ["x/p0.tgz", "x/p1.tgz", "y/p0.tgz", "y/p1.tgz"]),
        ("a{b,c{1..2}}d", ["abd", "ac1d", "ac2d"]),
        ("a{b}c{1,2}", ["a{b}c1", "a{b}c2"]),
        ("plain.tar", ["plain.tar"]),
        ("a-{1..10..3}.tar", ["a-1.tar", "a-4.tar", "a-7.tar", "a-10.tar"]),
        ("{a..c}.tar", ["a.tar", "b.tar", "c.tar"]),
        ("\\{a,b\\}.tar", ["{a,b}.tar"]),
        ("{Y..b}", ["Y", "Z", "a", "b"]),
    ],
)
def test_expand_braces(pattern, names) -> None:
    assert expand_braces(pattern) == names


BRACE_CASES = [
    "a{1..10..3}b",
    "{10..1..3}",
    "{a..g..2}",
    "{g..a..2}",
    "{Z..a}",
    "{a..Z}",
    "{A..A}",
    "{07..10}",
    "{-05..3}",
    "{2..-1}",
    "{0..0}",
    "{1..3..0}",
    "x{,.bak}",
    "{a,b}{c,d}{e,f}",
    "python{2.{5..7},3.{2,3}}",
    "\\{a,b\\}",
    "{1\\{2,3}",
    "{a\\,b}",
    "\\\\{a,b}",
    "{}",
    "{a}",
    "{{a,b}}",
    "}{",
    "a}b{",
    "{1..3}\n",
    "{1..3\n}",
]


@pytest.mark.parametrize("pattern", BRACE_CASES)
def test_braces_expand_as_braceexpand_does(pattern) -> None:
    from braceexpand import UnbalancedBracesError, braceexpand

    try:
        want: list[str] | type = list(braceexpand(pattern))
    except UnbalancedBracesError:
        want = ShardfeedError
    if want is ShardfeedError:
        with pytest.raises(ShardfeedError, match="unbalanced"):
            expand_braces(pattern)
    else:
        assert expand_braces(pattern) == want


@given(st.text(alphabet="{}a,.01Z9\\-", max_size=24))
@settings(max_examples=800, deadline=None)
def test_any_pattern_expands_as_braceexpand_does(pattern) -> None:
    from braceexpand import UnbalancedBracesError, braceexpand

    try:
        want = list(braceexpand(pattern))
    except UnbalancedBracesError:
        with pytest.raises(ShardfeedError, match="unbalanced"):
            expand_braces(pattern)
        return
    if len(want) <= 10_000:
        assert expand_braces(pattern) == want


def test_huge_and_deep_patterns_are_refused_before_any_name_is_made() -> None:
    # braceexpand would build every member of the range first; here only its length is computed
    with pytest.raises(ShardfeedError, match="more than 1,000,000"):
        expand_braces("x-{0..999999999999999999}.tar")
    with pytest.raises(ShardfeedError, match="more than 1,000,000"):
        expand_braces("{0..999}{0..999}{0..9}")
    with pytest.raises(ShardfeedError, match="nested more than"):
        expand_braces("{" * 200 + "a,b" + "}" * 200)
    with pytest.raises(ShardfeedError, match="unbalanced"):
        expand_braces("{" * 20_000 + "a{1,2}")


def test_brace_bounds_and_pattern_detection() -> None:
    with pytest.raises(ShardfeedError, match="more than"):
        expand_braces("x-{0..99999999}.tar")
    assert is_shard_pattern("s/train-{000000..000099}.tar")
    assert is_shard_pattern("s/{a,b}.tgz") and is_shard_pattern("s/{a,b}.TAR.GZ")
    assert not is_shard_pattern("s/train.tar")  # no braces
    assert not is_shard_pattern("s/{a,b}.jsonl")
    assert not is_shard_pattern("s/x-{0..99999999}.tar")


@pytest.mark.parametrize(
    ("name", "parts"),
    [
        ("0001.jpg", ("0001", "jpg")),
        ("dir/sub/0001.JPG", ("dir/sub/0001", "jpg")),
        ("a/b.seg.PNG", ("a/b", "seg.png")),
        ("x.txt.gz", ("x", "txt.gz")),
        ("README", None),
        ("dir/.hidden", None),
        ("dir/.hidden.jpg", None),
        ("trailing.", None),
    ],
)
def test_split_name_like_webdataset(name, parts) -> None:
    assert split_name(name) == parts


def test_field_kinds_and_reserved_columns() -> None:
    kinds = {e: field_kind(e) for e in ("jpg", "jpeg", "png", "webp", "seg.png", "cls", "txt")}
    assert kinds == dict.fromkeys(("jpg", "jpeg", "png", "webp", "seg.png"), "image") | {
        "cls": "int",
        "txt": "text",
    }
    assert field_kind("meta.json") == "json"
    assert field_kind("txt.gz") == field_kind("npy") == field_kind("mp4") == "bytes"
    assert column_name("jpg") == "jpg" and column_name("__key") == "__key"
    renamed = [column_name(n) for n in ("index", "index_", "episode_index", "__key__", "__url__")]
    assert renamed == ["index_", "index__", "episode_index_", "__key___", "__url___"]


@given(
    st.lists(st.dictionaries(st.sampled_from("abcd"), st.integers(0, 9)), min_size=3, max_size=3)
)
def test_merge_inferred_is_associative_and_commutative(parts) -> None:
    a, b, c = (InferredFields(sum(p.values()), p) for p in parts)
    assert merge_inferred(merge_inferred(a, b), c) == merge_inferred(a, merge_inferred(b, c))
    assert merge_inferred(a, b) == merge_inferred(b, a)
    assert merge_inferred(a, InferredFields()) == a


def test_detect_kind(corpus, tmp_path) -> None:
    root, _ = corpus
    assert detect_kind(str(root)) == "webdataset"
    assert detect_kind(str(root / "train-002.tgz")) == "webdataset"
    assert detect_kind(str(root / "train-{000..001}.tar")) == "webdataset"  # no such file
    with pytest.raises(ShardfeedError, match="no such file"):
        detect_kind(str(tmp_path / "missing-{a,b}.jsonl"))


def test_spec_is_the_union_of_fields(corpus) -> None:
    root, _ = corpus
    source = WebDatasetSource(root)
    assert source.files() == sorted(SHARDS)
    spec = source.spec(merged(source))
    assert spec.to_json() == {
        "__key__": {"dtype": "string", "shape": [1], "names": None},
        "__url__": {"dtype": "string", "shape": [1], "names": None},
        "cls": {"dtype": "int64", "shape": [1], "names": None},
        "jpg": {"dtype": "image", "shape": [], "names": None},
        "json": {"dtype": "string", "shape": [1], "names": None, "encoding": "json"},
        "npy": {"dtype": "string", "shape": [1], "names": None, "encoding": "base64"},
        "png": {"dtype": "image", "shape": [], "names": None},
        "txt": {"dtype": "string", "shape": [1], "names": None},
    }
    with pytest.raises(ShardfeedError, match="no inferred fields"):
        source.spec(None)


# --------------------------------------------------------------------------------------------------
# Scan and read, at the source


def test_read_round_trip_in_any_order_and_payload_is_exact(corpus) -> None:
    root, expected = corpus
    source = WebDatasetSource(root)
    spec = source.spec(merged(source))
    units = [u for f in source.files() for u in source.scan(f, spec).units]
    assert len(units) == len(expected)
    assert all(not source.scan(f, spec).rejects for f in source.files())
    order = np.random.default_rng(1).permutation(len(units))
    refs = [units[i] for i in order] + [units[0]]  # shuffled, across shards, one repeated
    table = source.read(refs, spec)
    assert table.schema == spec.arrow_schema()
    assert table_row_bytes(table).tolist() == [r.payload_bytes for r in refs]
    for ref, row in zip(refs, table.to_pylist(), strict=True):
        fields = expected[(row["__url__"], row["__key__"])]
        assert (
            ref.file == row["__url__"] and source.reject_location(ref)[1] == f"key:{row['__key__']}"
        )
        for ext in ("jpg", "png", "cls", "txt", "json", "npy"):
            value = row[ext]["bytes"] if ext in ("jpg", "png") and row[ext] else row[ext]
            assert value == (stored(fields[ext], ext) if ext in fields else None), (ref, ext)


def test_content_hash_ignores_the_key_and_read_refuses_changed_shards(tmp_path) -> None:
    image = encode((1, 2, 3), "PNG")
    path = write_tar(
        tmp_path / "s.tar", [("a.png", image), ("a.cls", b"1"), ("b.png", image), ("b.cls", b"1")]
    )
    source = WebDatasetSource(path)
    spec = source.spec(merged(source))
    a, b = source.scan("s.tar", spec).units
    assert a.content_hash == b.content_hash and a.locator[0] == "a" and b.position == 1
    data = path.read_bytes()
    flip = data.index(image) + 30  # one bit of a's image
    path.write_bytes(data[:flip] + bytes([data[flip] ^ 1]) + data[flip + 1 :])
    with pytest.raises(ShardfeedError, match="changed since it was scanned"):
        source.read([a], spec)
    with pytest.raises(ShardfeedError, match="changed since it was scanned"):
        source.read([UnitRef("s.tar", 9, 1, 10, "0" * 32, ("z", [["cls", 10**6, 1]]))], spec)


def test_bad_values_and_oversized_members_are_rejects(tmp_path) -> None:
    good = encode((9, 9, 9), "JPEG")
    path = write_tar(
        tmp_path / "v.tar",
        [
            ("ok.jpg", good),
            ("ok.cls", b" 42 \n"),
            ("cls.cls", b"4two"),
            ("big.cls", str(2**63).encode()),
            ("txt.txt", b"caf\xe9"),
            ("json.json", b"{broken"),
            ("nan.json", b'{"x": NaN}'),
            ("img.jpg", good[: len(good) // 2]),
            ("empty.png", b""),
            ("huge.npy", b"x" * (len(good) + 1)),
            ("twice.jpg", good),
            ("twice.JPG", good),
        ],
    )
    source = WebDatasetSource(path, max_member_bytes=len(good))
    spec = source.spec(merged(source))
    result = source.scan("v.tar", spec)
    assert [u.locator[0] for u in result.units] == ["ok"]
    assert {r.position: r.reason for r in result.rejects} == {
        "key:cls": "field_type",
        "key:big": "field_type",
        "key:txt": "utf8_invalid",
        "key:json": "json_invalid",
        "key:nan": "json_invalid",
        "key:img": "image_truncated",
        "key:empty": "image_empty",
        "key:huge": "member_unsupported",
        "key:twice": "key_repeated",
    }
    assert all(r.reason in REASONS and r.source == "v.tar" for r in result.rejects)
    assert source.read(result.units, spec).column("cls").to_pylist() == [42]
    # without validation, a truncated image is a sample
    loose = WebDatasetSource(path, media_hook=ImagePolicy(validate="none"))
    assert "key:img" not in {r.position for r in loose.scan("v.tar", spec).rejects}


def test_a_rewriting_media_hook_applies_at_scan_and_read(corpus) -> None:
    root, expected = corpus
    source = WebDatasetSource(
        root / "train-000.tar", media_hook=ImagePolicy(image_format="webp", max_side=3)
    )
    spec = source.spec(merged(source))
    units = source.scan("train-000.tar", spec).units
    table = source.read(units, spec)
    assert table_row_bytes(table).tolist() == [u.payload_bytes for u in units]
    images = [r["png"] or r["jpg"] for r in table.to_pylist() if r["png"] or r["jpg"]]
    assert len(images) == sum(
        1 for (u, _), f in expected.items() if u == "train-000.tar" and ({"png", "jpg"} & f.keys())
    )
    for image in images:
        with Image.open(io.BytesIO(image["bytes"])) as img:
            assert img.format == "WEBP" and max(img.size) == 3


def test_pattern_source_pickles_and_a_missing_shard_is_an_io_error(corpus) -> None:
    import pickle

    root, _ = corpus
    source = pickle.loads(pickle.dumps(WebDatasetSource(str(root / "train-{001..002}.{tar,tgz}"))))
    names = ["train-001.tar", "train-001.tgz", "train-002.tar", "train-002.tgz"]
    assert source.root == str(root) and source.files() == names
    spec = source.spec(merged(source))
    assert [len(source.scan(f, spec).units) for f in names] == [14, 0, 0, 16]
    (missing,) = source.scan("train-001.tgz", spec).rejects
    assert (missing.source, missing.position, missing.reason) == ("train-001.tgz", "", "io_error")
    with pytest.raises(ShardfeedError, match="none of its 2 shards exists"):
        WebDatasetSource(str(root / "empty-{0..1}.tar"))
    (root.parent / "empty-dir").mkdir(exist_ok=True)
    with pytest.raises(ShardfeedError, match=r"no \*\.tar"):
        WebDatasetSource(root.parent / "empty-dir")
    with pytest.raises(ShardfeedError, match="does not exist"):
        WebDatasetSource(str(root / "missing.tar"))


# --------------------------------------------------------------------------------------------------
# Through the CLI

beam = pytest.importorskip("apache_beam")

from shardfeed import open_dataset  # noqa: E402
from shardfeed.cli.main import main  # noqa: E402


@pytest.fixture(scope="module")
def converted(corpus, tmp_path_factory) -> Path:
    root, _ = corpus
    dst = tmp_path_factory.mktemp("out") / "ds"
    assert main(["convert", str(root), str(dst), "--target-shard-size", "6KB"]) == 0
    return dst


def test_convert_round_trip_every_sample_typed(corpus, converted, capsys) -> None:
    _, expected = corpus
    ds = open_dataset(converted)
    assert len(ds) == len(expected) and len(ds.shards) >= 3
    batch = ds.read(0, len(ds))
    assert batch["cls"].dtype == np.int64
    seen = set()
    for i in range(len(ds)):
        url, key = batch["__url__"][i], batch["__key__"][i]
        fields = expected[(url, key)]
        seen.add((url, key))
        assert batch["cls"][i] == fields["cls"]
        for ext in ("jpg", "png", "txt", "json", "npy"):
            got = batch[ext][i]
            assert got == (stored(fields[ext], ext) if ext in fields else None), (url, key, ext)
            if ext == "json" and got is not None:
                assert json.loads(got) == fields["json"]  # types survive: float, null, bool
    assert seen == set(expected)
    info = json.loads((converted / "meta/info.json").read_text())
    assert info["features"]["npy"]["encoding"] == "base64"
    assert info["features"]["json"]["encoding"] == "json"
    assert ds.manifest.provenance.content_options["from"] == "webdataset"
    assert main(["verify", str(converted)]) == 0
    capsys.readouterr()


def test_single_tgz_pattern_and_directory_agree(corpus, converted, tmp_path) -> None:
    root, expected = corpus

    def rows(dst: Path) -> set[tuple]:
        batch = open_dataset(dst).read(0, len(open_dataset(dst)))
        columns = (batch["__url__"], batch["__key__"], batch["cls"])
        return {(u, k, int(c)) for u, k, c in zip(*columns, strict=True)}

    def want(*shards: str) -> set[tuple]:
        return {(u, k, f["cls"]) for (u, k), f in expected.items() if u in shards}

    tgz = tmp_path / "tgz"
    assert (
        main(["convert", str(root / "train-002.tgz"), str(tgz), "--target-shard-size", "4KB"]) == 0
    )
    assert rows(tgz) == want("train-002.tgz")
    pattern = tmp_path / "pattern"
    src = str(root / "train-{000..001}.tar")
    assert main(["convert", src, str(pattern), "--target-shard-size", "4KB"]) == 0
    assert rows(pattern) == want("train-000.tar", "train-001.tar")
    assert open_dataset(pattern).manifest.provenance.source == "train-{000..001}.tar"
    assert rows(converted) == want(*SHARDS)


def test_convert_is_deterministic_across_running_modes(corpus, converted, tmp_path) -> None:
    root, _ = corpus
    again = tmp_path / "again"
    workers = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]
    assert main(["convert", str(root), str(again), "--target-shard-size", "6KB", *workers]) == 0
    assert tree(again) == tree(converted)


def gzip_prefix(body: bytes, size: int) -> bytes:
    """The shortest prefix of ``body``'s gzip stream that decompresses to ``size`` bytes or more."""
    packed = gzip.compress(body, mtime=0)
    inflate = zlib.decompressobj(31)
    out = 0
    for n in range(len(packed)):
        out += len(inflate.decompress(packed[n : n + 1]))
        if out >= size:
            return packed[: n + 1]
    raise AssertionError("the stream is shorter than that")


def hostile_tar(path: Path, outside: Path) -> dict[str, str]:
    """Good samples around every hostile member; returns position -> expected reason."""
    good = encode((10, 20, 30), "JPEG")
    members = [
        ("good0.jpg", good),
        ("good0.cls", b"0"),
        ("../evil.jpg", b"escape"),
        (f"{outside}/abs_evil.txt", b"absolute"),
        ("good1.jpg", good),
        ("good1.txt", b"one"),
        member("sym.jpg", type=tarfile.SYMTYPE, linkname=str(outside / "sym_target")),
        member("rel.jpg", type=tarfile.SYMTYPE, linkname="../../rel_target"),
        ("inner.txt", b"links to an earlier member"),
        member("inner.jpg", type=tarfile.SYMTYPE, linkname="good0.jpg"),
        member("hard.jpg", type=tarfile.LNKTYPE, linkname="good0.jpg"),
        member("hardout.jpg", type=tarfile.LNKTYPE, linkname="../hard_target"),
        member("dev.bin", type=tarfile.CHRTYPE, devmajor=1, devminor=3),
        member("blk.bin", type=tarfile.BLKTYPE, devmajor=7, devminor=0),
        member("fifo.txt", type=tarfile.FIFOTYPE),
        member("../dir_evil", type=tarfile.DIRTYPE),
        ("again.txt", b"first"),
        ("good2.jpg", good),
        ("again.cls", b"2"),  # key "again" reappears
        ("bad.png", b"not a png"),
        ("good3.jpg", good),
        ("good3.cls", b"3"),
    ]
    write_tar(path, members)
    return {
        "key:../evil": "path_escape",
        f"key:{outside}/abs_evil": "path_escape",
        "key:sym": "path_escape",
        "key:rel": "path_escape",
        "key:inner": "member_unsupported",
        "key:hard": "member_unsupported",
        "key:hardout": "path_escape",
        "key:dev": "member_unsupported",
        "key:blk": "member_unsupported",
        "key:fifo": "member_unsupported",
        "member:../dir_evil": "path_escape",
        "key:again": "key_repeated",
        "key:bad": "image_not_image",
    }


def test_hostile_members_and_truncation_become_rejects_and_nothing_escapes(
    tmp_path, capsys, monkeypatch
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    src = tmp_path / "in" / "shards"
    expected = hostile_tar(src / "a-hostile.tar", outside)
    # truncated shards of three samples, cut inside the third one's (incompressible) image
    images = []
    for i in range(3):
        pixels = np.random.default_rng(i).integers(0, 256, (40, 40, 3), dtype=np.uint8)
        out = io.BytesIO()
        Image.fromarray(pixels).save(out, "PNG")
        images.append(out.getvalue())
    parts = [
        (f"t{i}.{e}", images[i] if e == "png" else b"%d" % i)
        for i in range(3)
        for e in ("png", "cls")
    ]
    body = write_tar(tmp_path / "whole.tar", parts).read_bytes()
    cut = body.index(images[2]) + len(images[2]) // 2
    (src / "b-truncated.tar").write_bytes(body[:cut])
    (src / "c-truncated.tgz").write_bytes(gzip_prefix(body, cut))
    before = {p for p in tmp_path.rglob("*")}
    work = tmp_path / "in" / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)  # a relative "../evil" would land next to the source
    dst = tmp_path / "in" / "dst"
    assert main(["convert", str(src), str(dst), "--max-reject-fraction", "0.9", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert main(["rejects", str(dst), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    hostile = {
        r["position"]: r["reason"] for r in listed["rejects"] if r["source"] == "a-hostile.tar"
    }
    assert hostile == expected
    truncated = [r for r in listed["rejects"] if r["source"] != "a-hostile.tar"]
    assert [(r["source"], r["reason"]) for r in truncated] == [
        ("b-truncated.tar", "io_error"),
        ("c-truncated.tgz", "io_error"),
    ]
    assert all("sample 't2' is dropped" in r["message"] for r in truncated), truncated
    assert all(r["reason"] in REASONS for r in listed["rejects"])
    assert listed["total"] == summary["rejects"]["total"] == len(expected) + 2
    batch = open_dataset(dst).read(0, summary["samples_out"])
    got = set(zip(batch["__url__"], batch["__key__"], strict=True))
    kept = ["again", "good0", "good1", "good2", "good3"]  # the first "again" sample stays
    assert got == {("a-hostile.tar", key) for key in kept} | {
        (shard, f"t{i}") for shard in ("b-truncated.tar", "c-truncated.tgz") for i in range(2)
    }
    assert main(["verify", str(dst)]) == 0
    # nothing was written outside DST: the only new paths are DST, its contents and the cwd
    created = {p for p in tmp_path.rglob("*")} - before
    assert all(p in (work, dst) or dst in p.parents for p in created), created - {work, dst}
    assert not any(
        "evil" in p.name or "target" in p.name
        for p in tmp_path.rglob("*")
        if "shards" not in p.parts
    )


# --------------------------------------------------------------------------------------------------
# The WebDataset project's own shards

needs_corpora = pytest.mark.skipif(
    not CORPORA, reason="SHARDFEED_CORPORA is not set (scripts/test.sh sets it)"
)


def reference_samples(path: Path) -> list[tuple[str, dict[str, bytes]]]:
    """Contiguous members grouped by key, independently of the source."""
    out: list[tuple[str, dict[str, bytes]]] = []
    with tarfile.open(path) as archive:
        for info in archive:
            base = info.name.rsplit("/", 1)[-1]
            if not info.isreg() or "." not in base or base.startswith("."):
                continue
            key = info.name[: len(info.name) - len(base)] + base.split(".", 1)[0]
            if not out or out[-1][0] != key:
                out.append((key, {}))
            out[-1][1][base.split(".", 1)[1].lower()] = archive.extractfile(info).read()
    return out


@needs_corpora
@pytest.mark.parametrize(
    "name", ["wds_webdataset_testdata", "wds_video2dataset_videos", "wds_clip_retrieval_images"]
)
def test_real_shards_match_an_independent_grouping(name) -> None:
    root = Path(CORPORA, name)
    source = open_source(str(root))
    assert source.kind == "webdataset"
    spec = source.spec(merged(source))
    for file in source.files():
        result = source.scan(file, spec)
        assert not result.rejects
        rows = source.read(result.units, spec).to_pylist()
        reference = reference_samples(root / file)
        assert [r["__key__"] for r in rows] == [key for key, _ in reference]
        for row, (_, fields) in zip(rows, reference, strict=True):
            for ext, data in fields.items():
                value = row[column_name(ext)]
                kind = field_kind(ext)
                if kind == "image":
                    assert value["bytes"] == data
                elif kind == "json":
                    assert json.loads(value) == json.loads(data)
                elif kind == "int":
                    assert value == int(data)
                else:
                    assert value == (
                        data.decode() if kind == "text" else base64.b64encode(data).decode()
                    )


@needs_corpora
def test_real_duplicate_keys_across_shards_are_distinct_samples(tmp_path, capsys) -> None:
    src = Path(CORPORA, "wds_clip_retrieval_images")
    dst = tmp_path / "clip"
    assert (
        main(
            [
                "convert",
                str(src / "image{1..4}.tar"),
                str(dst),
                "--target-shard-size",
                "50KB",
                "--json",
            ]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert summary["samples_out"] == 11 and summary["rejects"]["total"] == 0
    batch = open_dataset(dst).read(0, 11)
    pairs = set(zip(batch["__url__"], batch["__key__"], strict=True))
    assert len(pairs) == 11 and len(set(batch["__key__"])) == 7  # image3/4 repeat image1's keys

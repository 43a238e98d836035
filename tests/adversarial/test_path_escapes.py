"""Paths that try to leave their root: manifest paths, symlinks in a dataset, ``locations.json``
tier URIs and file keys, tier path templates (tiers TOML ``path``) and WebDataset tar members.

Each hostile path is refused with an error naming the field (or, for an input, a
``path_escape`` reject), and nothing outside the root is read or written. Where an escape would
land, a valid decoy is planted (a copy of the shard, a different valid dataset), so a followed
escape would read successfully and the test would see it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
from test_source_webdataset import encode, member, write_tar
from test_verify_and_safety import _edit_manifest

from shardfeed import open_dataset, write_dataset
from shardfeed.cli.main import main
from shardfeed.formats.sources.webdataset import WebDatasetSource, split_name
from shardfeed.formats.verify import verify_dataset
from shardfeed.loader import ShardLoader
from shardfeed.schemas import ShardfeedError, UnsafePathError
from shardfeed.schemas.errors import SchemaError
from shardfeed.schemas.locations import LOCATIONS_PATH, Locations, TierCopy
from shardfeed.schemas.paths import check_relative_path
from shardfeed.schemas.sidecar import DatasetRef
from shardfeed.schemas.tiers import Tier, TierConfig

SPEC = {"blob": {"dtype": "image", "shape": [8, 8, 3]}, "id": {"dtype": "int64", "shape": [1]}}

#: (id, relative path) pairs that must never be accepted as a dataset-relative path
ESCAPING_RELATIVE = [
    ("dotdot", "../outside/file-000.parquet"),
    ("dotdot-deep", "data/../../outside/file-000.parquet"),
    ("dotdot-only", ".."),
    ("absolute", "/etc/passwd"),
    ("absolute-double-slash", "//etc/passwd"),
    ("drive-letter", "C:/outside/file-000.parquet"),
    ("backslash-dotdot", "..\\outside\\file-000.parquet"),
    ("backslash-inner", "data\\..\\..\\outside"),
    ("nul", "data/chunk-000/file-000.parquet\x00.txt"),
    ("pct-dotdot", "%2e%2e/outside/file-000.parquet"),
    ("pct-dotdot-upper", "%2E%2E/outside/file-000.parquet"),
    ("pct-mixed", ".%2e/outside/file-000.parquet"),
    ("pct-slash", "..%2Foutside%2Ffile-000.parquet"),
    ("pct-slash-inner", "data%2F..%2F..%2Foutside"),
    ("pct-absolute", "%2Fetc%2Fpasswd"),
    ("pct-backslash", "..%5Coutside"),
    ("pct-nul", "data/x%00.parquet"),
    ("pct-drive", "C%3A/outside"),
    ("pct-double", "%252e%252e/outside/file-000.parquet"),
    ("file-uri", "file:///etc/passwd"),
    ("dot-segment", "./data/chunk-000/file-000.parquet"),
    ("empty-segment", "data//chunk-000/file-000.parquet"),
]

#: Unicode look-alikes of '.', '/' and '\\': ordinary file names on POSIX and object stores
#: (nothing here normalises them), so they are not escapes; they must read as literal names.
LOOKALIKES = [
    ("fullwidth-dots", "\uff0e\uff0e/outside/file-000.parquet"),
    ("two-dot-leader", "\u2025/outside/file-000.parquet"),
    ("one-dot-leaders", "\u2024\u2024/outside/file-000.parquet"),
    ("division-slash", "..\u2215outside\u2215file-000.parquet"),
    ("fullwidth-solidus", "..\uff0foutside"),
    ("fullwidth-backslash", "..\uff3coutside"),
]


def _ids(cases: list[tuple[str, str]]) -> list[str]:
    return [name for name, _ in cases]


@pytest.fixture
def dataset(tmp_path: Path) -> tuple[Path, Path, list[int]]:
    """A four-shard dataset under ``tmp_path/ds`` and, next to it, ``tmp_path/outside`` holding
    a valid copy of shard 0 (the decoy an escape would find). Returns (root, outside, ids)."""
    root = tmp_path / "ds"
    rng = np.random.default_rng(0)
    n = 32
    write_dataset(
        root,
        SPEC,
        {"blob": [rng.bytes(100) for _ in range(n)], "id": np.arange(n)},
        target_shard_size=n * 100 // 4,
        row_group_size=n * 100 // 8,
        cost="bytes",
    )
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copyfile(root / "data/chunk-000/file-000.parquet", outside / "file-000.parquet")
    return root, outside, list(range(n))


def _ids_read(root: Path) -> list[int]:
    with open_dataset(root) as ds:
        return ds.read(0, len(ds))["id"].reshape(-1).tolist()


# -- manifest paths -------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "rel"), ESCAPING_RELATIVE, ids=_ids(ESCAPING_RELATIVE))
def test_check_relative_path_refuses(name: str, rel: str) -> None:
    """The one gate every manifest, locations and source path goes through."""
    with pytest.raises(UnsafePathError) as info:
        check_relative_path(rel, "shards[0].path")
    assert info.value.field == "shards[0].path"


@pytest.mark.parametrize("where", ["shards", "files"])
@pytest.mark.parametrize(("name", "rel"), ESCAPING_RELATIVE, ids=_ids(ESCAPING_RELATIVE))
def test_escaping_manifest_path_is_refused(dataset, where: str, name: str, rel: str) -> None:
    """open_dataset and verify refuse the manifest with the field named; the decoy is never
    read (a followed escape would have read a valid shard)."""
    root, _, _ = dataset
    _edit_manifest(root, lambda m: m[where][0].update(path=rel))
    field = f"{where}[0].path"
    with pytest.raises(UnsafePathError) as refused:
        open_dataset(root)
    assert refused.value.field == field
    try:
        report = verify_dataset(root)
    except UnsafePathError as err:
        assert err.field == field
    else:
        assert [(p.path, p.kind) for p in report.problems if p.kind == "unsafe"] == [
            (rel, "unsafe")
        ]


@pytest.mark.parametrize(("name", "rel"), LOOKALIKES, ids=_ids(LOOKALIKES))
def test_lookalike_manifest_path_is_a_literal_name(dataset, name: str, rel: str) -> None:
    """A look-alike is a plain (missing) file inside the root: the shard is reported missing,
    and the decoy it resembles a path to is not read."""
    root, _, _ = dataset
    assert check_relative_path(rel, "p") == rel
    _edit_manifest(root, lambda m: m["shards"][0].update(path=rel))
    with pytest.raises(ShardfeedError, match="missing"):
        _ids_read(root)
    kinds = {p.kind for p in verify_dataset(root).problems if p.path == rel}
    assert kinds == {"missing"}


# -- symlinks inside a dataset ----------------------------------------------------------------

SYMLINKED = [
    ("shard", "data/chunk-000/file-001.parquet"),
    ("chunk-dir", "data/chunk-000"),
    ("data-dir", "data"),
    ("info", "meta/info.json"),
    ("samples", "meta/shardfeed/samples.parquet"),
    ("manifest", "meta/shardfeed/manifest.json"),
    ("meta-dir", "meta"),
]


@pytest.mark.parametrize(("name", "rel"), SYMLINKED, ids=_ids(SYMLINKED))
def test_symlink_out_of_the_root_is_refused(dataset, tmp_path: Path, name: str, rel: str):
    """The same bytes, moved out and linked back: every reader path refuses, verify reports
    'unsafe' (or refuses the manifest itself)."""
    root, outside, ids = dataset
    target = outside / rel.replace("/", "_")
    shutil.move(str(root / rel), str(target))
    os.symlink(target, root / rel)
    if name == "samples":  # the Parquet reader never opens the sample index; the loader does
        assert _ids_read(root) == ids
    else:
        with pytest.raises(UnsafePathError, match="outside the dataset root"):
            _ids_read(root)
    with pytest.raises(UnsafePathError):
        ShardLoader(root, rank=0, world=1, batch_size=8)
    try:
        report = verify_dataset(root)
    except UnsafePathError:
        assert name in ("manifest", "meta-dir")
    else:
        assert "unsafe" in {p.kind for p in report.problems}, report.problems


def test_relative_symlink_escape_is_refused(dataset) -> None:
    """A relative link (``../../../outside/...``) is resolved, not trusted by its text."""
    root, outside, _ = dataset
    rel = root / "data/chunk-000/file-000.parquet"
    rel.unlink()
    os.symlink("../../../outside/file-000.parquet", rel)
    assert rel.resolve() == (outside / "file-000.parquet").resolve()
    with pytest.raises(UnsafePathError):
        _ids_read(root)


# -- locations.json ---------------------------------------------------------------------------

BAD_TIER_URIS = [
    ("relative", "pfs/ds"),
    ("dotdot", "{base}/pfs/../evil"),
    ("dotdot-end", "{base}/pfs/.."),
    ("pct-dotdot", "{base}/pfs/%2e%2e/evil"),
    ("pct-mixed", "{base}/pfs/.%2E/evil"),
    ("pct-slash", "{base}/pfs%2F..%2Fevil"),
    ("pct-double", "{base}/pfs/%252e%252e/evil"),
    ("backslash", "{base}/pfs\\..\\evil"),
    ("nul", "{base}/pfs/evil\x00"),
    ("file-uri", "file://{base}/evil"),
    ("http-uri", "http://127.0.0.1/evil"),
    ("s3-dotdot", "s3://bucket/../evil"),
    ("s3-pct", "s3://bucket/a/%2e%2e/evil"),
    ("s3-userinfo", "s3://user@bucket/evil"),
]


def _stage_decoy(base: Path, root: Path) -> Path:
    """A different valid dataset at ``base/evil``, with the same schema and shard paths: if a
    tier URI escaped there, its shards would pass every open check and read other ids."""
    evil = base / "evil"
    write_dataset(
        evil,
        SPEC,
        {"blob": [b"x" * 100] * 32, "id": np.arange(1000, 1032)},
        target_shard_size=800,
        row_group_size=400,
        cost="bytes",
    )
    return evil


def _locations(root: Path, uri: str, files: dict[str, list[str]] | None = None) -> None:
    """Write a locations.json naming one complete shared tier at ``uri`` (unchecked JSON)."""
    with open_dataset(root, use_locations=False) as ds:
        ref = DatasetRef(ds.manifest.fingerprint, len(ds), len(ds.shards))
        paths = [s.path for s in ds.shards]
    doc = {
        "format_version": "1.0",
        "dataset": ref.to_json(),
        "tiers": {"pfs": {"uri": uri, "scope": "shared", "complete": True, "read_bandwidth": 1}},
        "files": files if files is not None else {p: ["pfs"] for p in paths},
    }
    (root / LOCATIONS_PATH).write_text(json.dumps(doc))


@pytest.mark.parametrize(("name", "uri"), BAD_TIER_URIS, ids=_ids(BAD_TIER_URIS))
def test_escaping_tier_uri_in_locations_is_refused(dataset, tmp_path, caplog, name, uri):
    """The parser refuses the URI naming the field; the reader ignores the file with a warning
    and reads every shard from the dataset itself, never from the decoy."""
    root, _, ids = dataset
    _stage_decoy(tmp_path, root)
    (tmp_path / "pfs").mkdir()
    uri = uri.format(base=tmp_path)
    _locations(root, uri)
    with pytest.raises(SchemaError) as info:
        Locations.loads((root / LOCATIONS_PATH).read_bytes())
    assert info.value.field == "tiers.pfs.uri"
    with pytest.raises(SchemaError):
        TierCopy.from_json({"uri": uri, "scope": "shared", "complete": True}, "t")
    with caplog.at_level(logging.WARNING, logger="shardfeed"), open_dataset(root) as ds:
        assert ds.locations is None
        assert {ds.shard_source(i) for i in range(len(ds.shards))} == {"source"}
        assert ds.read(0, len(ds))["id"].reshape(-1).tolist() == ids
    assert "locations.json ignored" in caplog.text


@pytest.mark.parametrize(("name", "rel"), ESCAPING_RELATIVE, ids=_ids(ESCAPING_RELATIVE))
def test_escaping_file_key_in_locations_is_refused(dataset, tmp_path, caplog, name, rel):
    """A ``files`` key that escapes the tier root is refused by the parser; the reader falls
    back to the dataset itself."""
    root, _, ids = dataset
    (tmp_path / "pfs").mkdir()
    _locations(root, str(tmp_path / "pfs"), files={rel: ["pfs"]})
    with pytest.raises(UnsafePathError) as info:
        Locations.loads((root / LOCATIONS_PATH).read_bytes())
    assert info.value.field == f"files.{rel}"
    with caplog.at_level(logging.WARNING, logger="shardfeed"):
        assert _ids_read(root) == ids
    assert "locations.json ignored" in caplog.text


# -- tier path templates (tiers TOML) ---------------------------------------------------------

BAD_TEMPLATES = [
    ("dotdot", "{base}/nvme/../../evil/{{dataset}}"),
    ("dotdot-after-placeholder", "{base}/nvme/{{dataset}}/.."),
    ("pct-dotdot", "{base}/nvme/%2e%2e/evil/{{dataset}}"),
    ("pct-mixed", "{base}/nvme/%2E./evil"),
    ("pct-slash", "{base}/nvme%2F..%2Fevil/{{dataset}}"),
    ("pct-double", "{base}/nvme/%252E%252E/evil"),
    ("backslash", "{base}/nvme\\\\..\\\\evil"),
    ("nul", "{base}/nvme/\\u0000evil"),
    ("relative", "nvme/{{dataset}}"),
    ("file-uri", "file://{base}/evil/{{dataset}}"),
    ("http-uri", "http://127.0.0.1/{{dataset}}"),
    ("s3-dotdot", "s3://bucket/../{{dataset}}"),
    ("s3-placeholder-bucket", "s3://{{dataset}}/x"),
    ("unknown-placeholder", "{base}/nvme/{{name}}"),
]


def _tiers_toml(base: Path, path: str) -> Path:
    text = f"""
[tiers.pfs]
path = "{path}"
scope = "shared"
capacity = "1GB"
read_bandwidth = "1GB/s"

[policy]
all = ["pfs"]
"""
    out = base / "tiers.toml"
    out.write_text(text)
    return out


def _tree(base: Path) -> set[str]:
    return {str(p.relative_to(base)) for p in base.rglob("*")}


@pytest.mark.parametrize(("name", "template"), BAD_TEMPLATES, ids=_ids(BAD_TEMPLATES))
def test_escaping_tier_template_is_refused(dataset, tmp_path, capsys, name, template):
    """The tier config is refused naming ``tiers.pfs.path``; ``shardfeed stage`` exits with one
    clean error line and writes nothing anywhere."""
    root, _, _ = dataset
    config = _tiers_toml(tmp_path, template.format(base=tmp_path))
    with pytest.raises(SchemaError) as info:
        TierConfig.loads(config.read_bytes(), str(config))
    assert info.value.field == "tiers.pfs.path"
    before = _tree(tmp_path)
    capsys.readouterr()
    assert main(["stage", str(root), "--tiers", str(config)]) != 0
    _, err = capsys.readouterr()
    assert "tiers.pfs.path" in err and "Traceback" not in err
    assert _tree(tmp_path) == before


@pytest.mark.parametrize(
    "dataset_name", ["..", ".", "a/b", "%2e%2e", "a\\b", "a\x00b", "{dataset}", "x?y", ""]
)
def test_dataset_name_cannot_escape_the_template(dataset_name: str) -> None:
    """``{dataset}`` takes one plain path segment: a name that would climb or re-decode is
    refused before any path is built."""
    tier = Tier("pfs", "/lustre/{dataset}", "shared", 10**9, 10**9)
    with pytest.raises(SchemaError):
        tier.location(dataset_name)


@pytest.mark.parametrize("dataset_name", ["\uff0e\uff0e", "\u2025", "ds\u2215x"])
def test_lookalike_dataset_name_stays_one_segment(dataset_name: str) -> None:
    """Look-alikes are literal names: the result stays one segment under the template root."""
    tier = Tier("pfs", "/lustre/{dataset}", "shared", 10**9, 10**9)
    assert tier.location(dataset_name) == f"/lustre/{dataset_name}"


# -- WebDataset tar members -------------------------------------------------------------------

HOSTILE_MEMBERS = [
    ("dotdot", "../evil.jpg"),
    ("dotdot-inner", "a/../../evil.jpg"),
    ("absolute", "/tmp/evil.jpg"),
    ("drive-letter", "C:/evil.jpg"),
    ("backslash-dotdot", "..\\evil.jpg"),
    ("backslash-inner", "a\\..\\..\\evil.jpg"),
    ("pct-dotdot", "%2e%2e/evil.jpg"),
    ("pct-mixed", ".%2E/evil.jpg"),
    ("pct-slash", "..%2fevil.jpg"),
    ("pct-absolute", "%2Ftmp%2Fevil.jpg"),
]
HOSTILE_LINKS = [
    ("symlink-absolute", "/etc/passwd"),
    ("symlink-dotdot", "../../evil"),
    ("symlink-pct", "%2e%2e/%2e%2e/evil"),
    ("symlink-backslash", "..\\..\\evil"),
]


def test_hostile_tar_members_are_path_escape_rejects(tmp_path: Path) -> None:
    """Every escaping member name or link target is one ``path_escape`` reject; the good
    samples around them stay; a NUL ends a name (the tar format), so it cannot smuggle a
    suffix; nothing is extracted, so nothing appears outside the source."""
    good = encode((10, 20, 30), "JPEG")
    members: list = [("good0.jpg", good)]
    members += [(name, good) for _, name in HOSTILE_MEMBERS]
    for i, (_, target) in enumerate(HOSTILE_LINKS):
        members.append(member(f"link{i}.jpg", type=tarfile.SYMTYPE, linkname=target))
    members += [("nul\x00.jpg", good), ("good1.jpg", good)]
    src = tmp_path / "src"
    write_tar(src / "hostile.tar", members)
    before = _tree(tmp_path)
    source = WebDatasetSource(src)
    spec = source.spec(source.infer("hostile.tar"))
    result = source.scan("hostile.tar", spec)
    reasons = {r.position: r.reason for r in result.rejects}
    # a refused member is reported by its sample key, or by its full name when the name has
    # no key (a hidden basename such as '..\\evil.jpg')
    wanted = [(f"key:{(split_name(n) or ('',))[0]}", f"member:{n}") for _, n in HOSTILE_MEMBERS]
    wanted += [(f"key:link{i}", f"member:link{i}.jpg") for i in range(len(HOSTILE_LINKS))]
    missing = [w for w in wanted if "path_escape" not in (reasons.get(w[0]), reasons.get(w[1]))]
    assert not missing, (missing, reasons)
    assert {u.locator[0] for u in result.units} == {"good0", "good1"}
    assert _tree(tmp_path) == before


@pytest.mark.parametrize(
    "pattern",
    ["{../outside/x,a}.tar", "{%2e%2e/outside/x,a}.tar", "{..\\outside\\x,a}.tar"],
)
def test_brace_pattern_shards_outside_the_root_are_rejects(tmp_path: Path, pattern: str):
    """A shard pattern whose expansion climbs out of its root is a ``path_escape`` (or, for a
    name that is only odd, an unreadable-shard) reject; the decoy outside is never opened."""
    good = encode((1, 2, 3), "PNG")
    src = tmp_path / "src"
    write_tar(src / "a.tar", [("k.png", good)])
    write_tar(tmp_path / "outside" / "x.tar", [("stolen.png", good)])
    source = WebDatasetSource(f"{src}/{pattern}")
    shards = source.files()
    assert "a.tar" in shards
    spec = source.spec(source.infer("a.tar"))
    for shard in shards:
        if shard == "a.tar":
            continue
        result = source.scan(shard, spec)
        assert not result.units, shard
        assert [r.reason for r in result.rejects] in (["path_escape"], ["io_error"]), result
        assert all("stolen" not in r.message for r in result.rejects)

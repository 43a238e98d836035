"""The JSON Schemas in schemas/jsonschema/ agree with the strict parsers they describe.

Real files written by ``write_dataset`` (and, when ``$SHARDFEED_CORPORA`` is set, LeRobot's own
Reachy2 info.json) must validate; broken documents must be refused both by the schema and by
``Manifest.from_json`` / ``Info.from_json``; and the relative-path pattern must accept exactly the
paths ``check_relative_path`` accepts.
"""

from __future__ import annotations

import copy
import json
import os
import random
from importlib.resources import files
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest

from shardfeed import write_dataset
from shardfeed.schemas import Info, Manifest, SchemaError, check_relative_path
from shardfeed.schemas.features import ALL_DTYPES, NUMERIC_DTYPES
from shardfeed.schemas.manifest import FORMAT_VERSION, MANIFEST_PATH

CORPORA = os.environ.get("SHARDFEED_CORPORA")

SCALAR = {"shape": [1], "names": None}
PLAIN_FEATURES = {
    "x": {"dtype": "float32", "shape": [3], "names": None},
    "label": {"dtype": "int64", **SCALAR},
}
EPISODIC_FEATURES = {
    "x": {"dtype": "float32", "shape": [2, 3], "names": None},
    "episode_index": {"dtype": "int64", **SCALAR},
    "index": {"dtype": "int64", **SCALAR},
    "task_index": {"dtype": "int64", **SCALAR},
    "frame_index": {"dtype": "int64", **SCALAR},
    "timestamp": {"dtype": "float32", **SCALAR},
}


def _load_schema(name: str) -> dict[str, Any]:
    text = files("shardfeed.schemas").joinpath(f"jsonschema/{name}.schema.json").read_text("utf-8")
    return json.loads(text)


MANIFEST_SCHEMA = _load_schema("manifest")
INFO_SCHEMA = _load_schema("info")
MANIFEST_VALIDATOR = jsonschema.Draft202012Validator(MANIFEST_SCHEMA)
INFO_VALIDATOR = jsonschema.Draft202012Validator(INFO_SCHEMA)
PATH_VALIDATOR = jsonschema.Draft202012Validator(
    {
        "$schema": MANIFEST_SCHEMA["$schema"],
        "$defs": MANIFEST_SCHEMA["$defs"],
        "$ref": "#/$defs/relativePath",
    }
)


def _plain_data(n: int) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    return {"x": rng.normal(size=(n, 3)).astype(np.float32), "label": np.arange(n) % 5}


def _episodic_data(episodes: int, length: int) -> dict[str, Any]:
    rng = np.random.default_rng(1)
    n = episodes * length
    episode = np.repeat(np.arange(episodes), length)
    frame = np.tile(np.arange(length), episodes)
    return {
        "x": rng.normal(size=(n, 2, 3)).astype(np.float32),
        "episode_index": episode,
        "index": np.arange(n),
        "task_index": episode % 2,
        "frame_index": frame,
        "timestamp": (frame / 10).astype(np.float32),
    }


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("jsonschema")
    write_dataset(root / "plain", PLAIN_FEATURES, _plain_data(200), target_shard_size="1KB")
    write_dataset(
        root / "episodic",
        EPISODIC_FEATURES,
        _episodic_data(episodes=4, length=30),
        tasks=["a", "b"],
        fps=10,
        target_shard_size="2KB",
    )
    return {"plain": root / "plain", "episodic": root / "episodic"}


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _messages(validator: jsonschema.Validator, doc: Any) -> list[str]:
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]


def test_schema_files_are_valid_draft_2020_12():
    for schema in (MANIFEST_SCHEMA, INFO_SCHEMA):
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        jsonschema.Draft202012Validator.check_schema(schema)


def test_feature_dtypes_match_the_code():
    feature = INFO_SCHEMA["$defs"]["feature"]
    assert feature["properties"]["dtype"]["enum"] == list(ALL_DTYPES)
    assert feature["if"]["properties"]["dtype"]["enum"] == list(NUMERIC_DTYPES)
    assert MANIFEST_SCHEMA["properties"]["format_version"]["pattern"] == r"^1\.(0|[1-9][0-9]*)$"
    assert FORMAT_VERSION.startswith("1.")


@pytest.mark.parametrize("name", ["plain", "episodic"])
def test_written_dataset_validates(datasets, name):
    root = datasets[name]
    manifest = _read_json(root / MANIFEST_PATH)
    info = _read_json(root / "meta" / "info.json")
    assert _messages(MANIFEST_VALIDATOR, manifest) == []
    assert _messages(INFO_VALIDATOR, info) == []
    assert len(manifest["shards"]) >= 2, "the fixture should be multi-shard"
    # and the parsers agree
    assert Manifest.from_json(manifest).num_samples == info["total_frames"]
    assert Info.from_json(info).features.names == list(info["features"])


def test_episodic_dataset_lists_its_lerobot_metadata(datasets):
    manifest = _read_json(datasets["episodic"] / MANIFEST_PATH)
    assert [f["path"] for f in manifest["files"]] == [
        "meta/episodes/chunk-000/file-000.parquet",
        "meta/info.json",
        "meta/shardfeed/samples.parquet",
        "meta/stats.json",
        "meta/tasks.parquet",
    ]
    info = _read_json(datasets["episodic"] / "meta" / "info.json")
    assert info["total_episodes"] == 4 and info["total_tasks"] == 2 and info["fps"] == 10


@pytest.mark.skipif(not CORPORA, reason="SHARDFEED_CORPORA is not set (scripts/test.sh sets it)")
def test_real_lerobot_v30_info_validates():
    path = Path(CORPORA or "", "lerobot_v30_reachy2_apple_storage", "meta", "info.json")
    info = _read_json(path)
    assert _messages(INFO_VALIDATOR, info) == []
    parsed = Info.from_json(info)
    assert parsed.features["observation.image"].dtype == "video"


def _manifest_doc(datasets) -> dict[str, Any]:
    return _read_json(datasets["plain"] / MANIFEST_PATH)


def _drop(key):
    def edit(doc):
        del doc[key]

    return edit


def _set(*path_and_value):
    *path, value = path_and_value

    def edit(doc):
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return edit


BROKEN_MANIFESTS = {
    "missing num_samples": _drop("num_samples"),
    "missing provenance": _drop("provenance"),
    "shard path ../x": _set("shards", 0, "path", "../x"),
    "shard path absolute": _set("shards", 0, "path", "/etc/passwd"),
    "shard path backslash": _set("shards", 0, "path", "data\\chunk-000\\file-000.parquet"),
    "shard path percent-encoded ..": _set("shards", 0, "path", "%2e%2e/x"),
    "file path with empty segment": _set("files", 0, "path", "meta//info.json"),
    "sha256 wrong length": _set("shards", 0, "sha256", "ab" * 31),
    "sha256 uppercase": _set("files", 0, "sha256", "AB" * 32),
    "sha256 trailing newline": _set("shards", 0, "sha256", "a" * 64 + "\n"),
    "format_version 2.0": _set("format_version", "2.0"),
    "format_version without minor": _set("format_version", "1"),
    "format_version trailing newline": _set("format_version", "1.0\n"),
    "format_version as number": _set("format_version", 1.0),
    "unknown encoding": _set("encoding", "arrow"),
    "negative num_samples": _set("num_samples", -1),
    "boolean num_samples": _set("num_samples", True),
    "row_groups holds a string": _set("shards", 0, "row_groups", ["25"]),
    "negative reject count": _set("rejects", "by_reason", {"bad": -1}),
    "content_options not an object": _set("provenance", "content_options", []),
}


@pytest.mark.parametrize("edit", BROKEN_MANIFESTS.values(), ids=BROKEN_MANIFESTS.keys())
def test_broken_manifest_is_refused_by_schema_and_parser(datasets, edit):
    doc = _manifest_doc(datasets)
    edit(doc)
    assert _messages(MANIFEST_VALIDATOR, doc), "the JSON Schema accepted it"
    with pytest.raises(SchemaError):
        Manifest.from_json(doc)


def test_parser_ignores_unknown_keys_and_so_does_the_schema(datasets):
    doc = _manifest_doc(datasets)
    doc["future_field"] = {"anything": 1}
    doc["shards"][0]["tier_hint"] = "hot"
    assert _messages(MANIFEST_VALIDATOR, doc) == []
    Manifest.from_json(doc)


def test_cross_field_rules_are_the_parsers_alone(datasets):
    """JSON Schema cannot relate fields; these pass the schema and only the parser refuses them."""
    for edit in (
        _set("num_samples", 7),  # shards cover 200 rows
        _set("shards", 0, "row_groups", [1]),  # does not sum to rows
        _set("rejects", "total", 3),  # by_reason is empty
    ):
        doc = _manifest_doc(datasets)
        edit(doc)
        assert _messages(MANIFEST_VALIDATOR, doc) == []
        with pytest.raises(SchemaError):
            Manifest.from_json(doc)


MINIMAL_INFO = {
    "codebase_version": "v3.0",
    "total_frames": 0,
    "total_episodes": 0,
    "total_tasks": 0,
    "fps": 0,
    "chunks_size": 1000,
    "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
    "features": {
        "caption": {"dtype": "string", "shape": []},
        "x": {"dtype": "uint8", "shape": [4]},
    },
}

BROKEN_INFOS = {
    "codebase_version v2.1": _set("codebase_version", "v2.1"),
    "missing features": _drop("features"),
    "missing chunks_size": _drop("chunks_size"),
    "negative total_frames": _set("total_frames", -1),
    "fps as string": _set("fps", "30"),
    "robot_type as number": _set("robot_type", 5),
    "split value not a string": _set("splits", {"train": 3}),
    "splits null": _set("splits", None),
    "unknown dtype": _set("features", "x", "dtype", "float128"),
    "shape with a string": _set("features", "x", "shape", ["4"]),
    "negative dimension": _set("features", "x", "shape", [-1]),
    "numeric feature without shape": _set("features", "x", "shape", []),
    "feature missing shape": _set("features", "x", {"dtype": "int64"}),
    "empty feature name": _set("features", "", {"dtype": "int64", "shape": [1]}),
    "feature not an object": _set("features", "x", "int64"),
}


def test_minimal_info_is_accepted_by_both():
    assert _messages(INFO_VALIDATOR, MINIMAL_INFO) == []
    Info.from_json(MINIMAL_INFO)


@pytest.mark.parametrize("edit", BROKEN_INFOS.values(), ids=BROKEN_INFOS.keys())
def test_broken_info_is_refused_by_schema_and_parser(edit):
    doc = copy.deepcopy(MINIMAL_INFO)
    edit(doc)
    assert _messages(INFO_VALIDATOR, doc), "the JSON Schema accepted it"
    with pytest.raises(SchemaError):
        Info.from_json(doc)


def _code_accepts(path: str) -> bool:
    try:
        check_relative_path(path, "path")
    except SchemaError:
        return False
    return True


TRICKY_PATHS = [
    "data/chunk-000/file-000.parquet",
    "a",
    "a.b/c..d/...",
    "caf\u00e9/\u6f22.parquet",
    "a%2Fb",
    "a%252e%252e",
    "%41:x",
    "a%3Ab",
    "%:x",
    "%4:x",
    "%C3%A9:x",
    "%C0%8C:x",
    "%E2%82:x",
    "%E2%82%AC:x",
    "a%zz",
    "",
    "/abs",
    "%2Fabs",
    "C:/x",
    "a:",
    "C%3A/x",
    "a\\b",
    "a%5cb",
    "a\x00b",
    "a%00b",
    "..",
    "../x",
    "a/../b",
    "a/..",
    "%2e%2E/x",
    ".",
    "./a",
    "a/./b",
    "a//b",
    "a/",
    "a%2F",
    ".\n",
    "a\n",
]


@pytest.mark.parametrize("path", TRICKY_PATHS)
def test_path_pattern_matches_check_relative_path(path):
    assert PATH_VALIDATOR.is_valid(path) == _code_accepts(path)


def test_path_pattern_matches_check_relative_path_on_random_paths():
    tokens = ["a", "B", ".", "..", "/", ":", "\\", "\x00", "\n", "%", "\u00e9", "%2e", "%2F", "%3a"]
    tokens += ["%5C", "%00", "%25", "%C3%A9", "%E2%82%AC", "%F0%9F%98%80", "%zz"]
    rng = random.Random(20240601)
    for _ in range(4000):
        parts = []
        for _ in range(rng.randint(0, 6)):
            if rng.random() < 0.25:
                parts.append(f"%{rng.randrange(256):02{rng.choice('xX')}}")
            else:
                parts.append(rng.choice(tokens))
        path = "".join(parts)
        assert PATH_VALIDATOR.is_valid(path) == _code_accepts(path), repr(path)

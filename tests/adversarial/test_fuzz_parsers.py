"""Fuzzing of the parsers that read untrusted bytes (issue 10, item 5).

Each parser has a documented contract: the exception types it may raise on bad input (see its
docstring). These tests feed each parser hostile input and check that only those types escape,
and that the message names the problem (the JSON field, the byte offset, the line). Inputs are
structure-aware: a valid document written by shardfeed itself (a real manifest, info.json,
assignment header, locations.json, tier config, TFRecord stream, tf.Example, tar shard) mutated by
dropping keys, changing types, huge/negative/NaN numbers, deep nesting, lone surrogates,
duplicated keys and byte edits, plus raw random bytes and text.

| parser | contract |
|---|---|
| ``Manifest.loads`` (also via ``open_dataset``) | ``SchemaError`` (``UnsafePathError`` for paths) |
| ``Info.from_json`` (via ``open_dataset``) | ``SchemaError`` |
| ``TierConfig.loads`` | ``SchemaError`` |
| ``AssignmentHeader.loads`` / ``load_assignment`` | ``SchemaError`` / ``AssignmentError`` |
| ``Locations.loads`` | ``SchemaError`` |
| ``HotIndexHeader.loads``, ``CachePlanHeader.loads`` | ``SchemaError`` |
| ``iter_records``, ``read_record_at`` | ``TFRecordError`` (``.offset``, ``.reason``) |
| ``decode_example`` | ``ExampleDecodeError`` (``at byte N``) |
| ``WebDatasetSource.infer``/``scan`` | none: every bad member or archive is a reject |
| ``split_name``, ``expand_braces`` | none / ``ShardfeedError`` |
| ``read_pairs`` / ``read_access_log`` | ``InputFileError`` / ``HotInputError`` (``path:line``) |

The number of examples per test is ``SHARDFEED_FUZZ_EXAMPLES`` (default 40, small enough for CI);
``scripts/fuzz.sh --examples N`` runs more.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import re
import struct
import tarfile
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import SMALL_SPEC, small_data
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tier_fixtures import EXAMPLE_TIERS

from shardfeed import write_dataset
from shardfeed.assignment import World, assign, load_assignment
from shardfeed.formats.errors import AssignmentError, CorruptShardError
from shardfeed.formats.reader import open_dataset
from shardfeed.formats.sources.webdataset import (
    WebDatasetSource,
    expand_braces,
    split_name,
)
from shardfeed.formats.tf_example import ExampleDecodeError, decode_example, encode_example
from shardfeed.formats.tfrecord import (
    REASONS,
    TFRecordError,
    iter_records,
    masked_crc32c,
    read_record_at,
    write_records,
)
from shardfeed.formats.weights_file import InputFileError, read_pairs
from shardfeed.hot_inputs import HotInputError, read_access_log
from shardfeed.schemas.assignment import AssignmentHeader
from shardfeed.schemas.errors import SchemaError
from shardfeed.schemas.hot import CachePlanHeader, HotIndexHeader
from shardfeed.schemas.info import INFO_FIELDS, Info
from shardfeed.schemas.locations import Locations, TierCopy
from shardfeed.schemas.manifest import MANIFEST_PATH, Manifest
from shardfeed.schemas.rejects import REASONS as REJECT_REASONS
from shardfeed.schemas.sidecar import DatasetRef, TableRecord
from shardfeed.schemas.tiers import TierConfig

EXAMPLES = int(os.environ.get("SHARDFEED_FUZZ_EXAMPLES", "40"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# ---------------------------------------------------------------------------------------------------
# Hostile JSON: a mutator over a valid document, and a serializer that can write what json.dumps
# cannot (duplicated keys, raw deep nesting, NaN).


@dataclass(frozen=True)
class Raw:
    """JSON text written verbatim (deep nesting that no Python value could be built from)."""

    text: str
    label: str = ""

    def __repr__(self) -> str:  # failing examples print this, not megabytes of brackets
        return self.label or f"Raw({self.text[:40]!r})"


@dataclass(frozen=True)
class Pairs:
    """A JSON object with repeated keys: json.loads keeps the last one."""

    items: tuple[tuple[str, Any], ...]


def dump(value: Any) -> str:
    """JSON text of ``value``; NaN and Infinity as Python writes them, Raw verbatim."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, Pairs | dict):
        items = value.items if isinstance(value, Pairs) else value.items()
        return "{" + ",".join(f"{json.dumps(str(k))}:{dump(v)}" for k, v in items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(dump(v) for v in value) + "]"
    return json.dumps(value)


def _deep(depth: int, kind: str) -> Raw:
    opener, closer = ("[", "]") if kind == "[" else ('{"a":', "}")
    return Raw(opener * depth + "0" + closer * depth, f"_deep({depth}, {kind!r})")


LONE_SURROGATES = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
HOSTILE_TEXT = st.one_of(
    st.text(max_size=12),
    st.text(st.one_of(LONE_SURROGATES, st.characters()), min_size=1, max_size=6),
    st.sampled_from(
        [
            "",
            "../x",
            "/etc/passwd",
            "%2e%2e/x",
            "a\\b",
            "a\x00b",
            "data/chunk-000/file-000.parquet",
            "meta/info.json",
            "sha256:" + "0" * 64,
            "0" * 64,
            "2.0",
            "1.0",
            "v3.0",
            "s3://b/{dataset}",
            "\ufeff",
            "\ud800",
        ]
    ),
)
HOSTILE_NUMBERS = st.one_of(
    st.integers(-3, 3),
    st.sampled_from([-1, 2**31, 2**63, 2**64, -(2**63) - 1, 10**30, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([float("nan"), float("inf"), -0.0, 1.0, 1e308]),
)
HOSTILE_LEAVES = st.one_of(st.none(), st.booleans(), HOSTILE_NUMBERS, HOSTILE_TEXT)
HOSTILE_VALUES = st.one_of(
    HOSTILE_LEAVES,
    st.lists(HOSTILE_LEAVES, max_size=3),
    st.dictionaries(HOSTILE_TEXT, HOSTILE_LEAVES, max_size=3),
    st.builds(_deep, st.sampled_from([50, 2000, 100_000]), st.sampled_from(["[", "{"])),
)
#: one edit: (which node, what to do, the value it uses)
EDITS = st.lists(
    st.tuples(
        st.integers(0, 10**6),
        st.sampled_from(["drop", "set", "dupkey", "wrap", "append"]),
        HOSTILE_VALUES,
    ),
    min_size=1,
    max_size=4,
)
#: byte-level damage after serialization: (where, what, byte)
BYTE_EDITS = st.lists(
    st.tuples(st.integers(0, 10**6), st.sampled_from("sdit"), st.integers(0, 255)),
    max_size=2,
)


def _slots(value: Any) -> list[tuple[Any, Any]]:
    """Every (container, key) in a document, depth first; the root is (None, None)."""
    out: list[tuple[Any, Any]] = [(None, None)]
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, child in node.items():
                out.append((node, key))
                stack.append(child)
        elif isinstance(node, list):
            for i, child in enumerate(node):
                out.append((node, i))
                stack.append(child)
    return out


def mutate(doc: Any, edits: list[tuple[int | str, str, Any]]) -> Any:
    """Apply structural edits to a copy of ``doc`` (a JSON value): drop a key or item, set it to
    a hostile value, repeat a key with another value, wrap it in a list, append a hostile item.
    Each edit picks its node by number (any int, modulo the node count) or by dotted path."""
    root = json.loads(json.dumps(doc))
    for pick, op, value in edits:
        if isinstance(pick, str):  # a dotted path, for explicit regression examples
            *steps, last = pick.split(".")
            parent = root
            for step in steps:
                parent = parent[int(step)] if isinstance(parent, list) else parent[step]
            key: Any = int(last) if isinstance(parent, list) else last
        else:
            slots = _slots(root)
            parent, key = slots[pick % len(slots)]
        if parent is None:
            root = value if op == "set" else [root] if op == "wrap" else root
            continue
        if op == "drop":
            del parent[key]
        elif op == "set":
            parent[key] = value
        elif op == "wrap":
            parent[key] = [parent[key]]
        elif op == "append" and isinstance(parent, list):
            parent.append(value)
        elif op == "dupkey" and isinstance(parent, dict):
            # the original stays first in the text, the hostile value wins (json keeps the last)
            parent[key] = Pairs(((str(key), parent[key]), (str(key), value)))
        else:
            parent[key] = value
    return root


def _unpair(value: Any) -> Any:
    """Pairs as written to the text: a dict in json.loads' view (the last key wins)."""
    if isinstance(value, Pairs):
        return _unpair(value.items[-1][1])
    if isinstance(value, dict):
        return {k: _unpair(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unpair(v) for v in value]
    return value


def render(doc: Any, byte_edits: list[tuple[int, str, int]]) -> bytes:
    """Serialize a mutated document, with each Pairs node as a duplicated key, then byte edits."""

    def fix(value: Any) -> Any:
        if isinstance(value, dict):
            out: list[tuple[str, Any]] = []
            for k, v in value.items():
                if isinstance(v, Pairs):
                    out += [(k, fix(item)) for _, item in v.items]
                else:
                    out.append((k, fix(v)))
            return Pairs(tuple(out))
        if isinstance(value, list):
            return [fix(v) for v in value]
        return value

    data = bytearray(dump(fix(doc)).encode("utf-8", "surrogatepass"))
    for at, op, byte in byte_edits:
        at %= len(data) + 1
        if op == "s" and at < len(data):
            data[at] = byte
        elif op == "d":
            del data[at : at + 1]
        elif op == "i":
            data[at:at] = bytes([byte])
        else:
            del data[at:]
    return bytes(data)


# ---------------------------------------------------------------------------------------------------
# Contract checks


def _field_root(field: str) -> str:
    return re.split(r"[.\[]", field, maxsplit=1)[0]


def check_schema_error(err: SchemaError, roots: set[str]) -> None:
    """A SchemaError names a field under one of ``roots`` (or the whole document) and says what
    is wrong with it."""
    assert isinstance(err, SchemaError), repr(err)
    assert err.field, f"no field named: {err!r}"
    known = _field_root(err.field) in roots | {"<root>"} or "unknown key" in err.message
    assert known, f"field {err.field!r} is not a field of this document: {err}"
    assert err.message.strip(), f"empty message: {err!r}"
    assert f"field '{err.field}'" in str(err)


def parse_or_schema_error(parse: Callable[[], Any], roots: set[str]) -> Any | None:
    """The parsed value, or None after checking that the failure is a well-formed SchemaError."""
    try:
        return parse()
    except SchemaError as err:
        check_schema_error(err, roots)
        return None


# ---------------------------------------------------------------------------------------------------
# A real dataset with an assignment: the valid documents the mutations start from


@dataclass
class Corpus:
    root: Path
    manifest_text: str = dc_field(repr=False)
    info_text: str = dc_field(repr=False)
    assignment_text: str = dc_field(repr=False)

    def restore(self) -> None:
        (self.root / MANIFEST_PATH).write_text(self.manifest_text, encoding="utf-8")
        (self.root / "meta/info.json").write_text(self.info_text, encoding="utf-8")
        (self.root / ASSIGNMENT).write_text(self.assignment_text, encoding="utf-8")


ASSIGNMENT = "meta/shardfeed/assignments/fuzz.json"
MANIFEST_ROOTS = {
    "format_version",
    "encoding",
    "num_samples",
    "fingerprint",
    "shards",
    "files",
    "rejects",
    "provenance",
    "hot_shards",
    "cost",
    "splits",
    "duplicates",
}
INFO_ROOTS = set(INFO_FIELDS)
HEADER_ROOTS = {
    "format_version",
    "name",
    "world",
    "seed",
    "policy",
    "dataset",
    "epochs",
    "table",
    "resumed_from",
    "split",
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Corpus]:
    """A 4-shard dataset written by write_dataset, with a 2-epoch assignment ``fuzz``."""
    root = tmp_path_factory.mktemp("fuzz") / "ds"
    write_dataset(root, SMALL_SPEC, small_data(40), target_shard_size=400, row_group_size=200)
    assign(root, World(1, 2, 2), name="fuzz", epochs=2)
    found = Corpus(
        root,
        (root / MANIFEST_PATH).read_text(encoding="utf-8"),
        (root / "meta/info.json").read_text(encoding="utf-8"),
        (root / ASSIGNMENT).read_text(encoding="utf-8"),
    )
    yield found
    found.restore()


# ---------------------------------------------------------------------------------------------------
# Manifest


@FUZZ
@given(edits=EDITS, byte_edits=BYTE_EDITS)
@example(edits=[(0, "set", _deep(100_000, "["))], byte_edits=[])  # RecursionError escaped
@example(edits=[("shards.0.path", "set", "data/\ud800.parquet")], byte_edits=[])
def test_manifest_parser(corpus: Corpus, edits, byte_edits) -> None:
    """Manifest.loads raises only SchemaError naming a manifest field; whatever it accepts
    serializes to UTF-8 and parses back to the same bytes."""
    data = render(mutate(json.loads(corpus.manifest_text), edits), byte_edits)
    manifest = parse_or_schema_error(lambda: Manifest.loads(data), MANIFEST_ROOTS)
    if manifest is not None:
        text = manifest.dumps()
        assert Manifest.loads(text.encode("utf-8")).dumps() == text


@FUZZ
@given(edits=EDITS)
@example(edits=[("shards.1.path", "set", "d/\ud800.parquet")])  # UnicodeEncodeError from the OS
def test_manifest_through_open_dataset(corpus: Corpus, edits) -> None:
    """open_dataset on a mutated manifest: only the reader's documented errors escape."""
    doc = mutate(json.loads(corpus.manifest_text), edits)
    try:
        (corpus.root / MANIFEST_PATH).write_bytes(render(doc, []))
        try:
            with open_dataset(corpus.root) as ds:
                assert ds.manifest.num_samples == sum(s.rows for s in ds.manifest.shards)
        except SchemaError as err:
            check_schema_error(err, MANIFEST_ROOTS | {"total_frames"})
        except CorruptShardError as err:
            assert "info.json" in str(err)
    finally:
        corpus.restore()


def test_manifest_raw_text_and_bytes() -> None:
    """Arbitrary bytes: not JSON, invalid UTF-8, a BOM, NUL: SchemaError on the whole document."""
    for data in (b"", b"\xff\xfe{", b"\xef\xbb\xbf{}", b"{\x00}", b"[" * 200_000, b"1e999999"):
        with pytest.raises(SchemaError) as raised:
            Manifest.loads(data)
        check_schema_error(raised.value, MANIFEST_ROOTS)


@FUZZ
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode)))
def test_manifest_random_bytes(data: bytes) -> None:
    parse_or_schema_error(lambda: Manifest.loads(data), MANIFEST_ROOTS)


# ---------------------------------------------------------------------------------------------------
# info.json


def _info_doc(corpus: Corpus) -> dict:
    return json.loads(corpus.info_text)


@FUZZ
@given(edits=EDITS)
@example(edits=[(0, "set", _deep(100_000, "{"))])  # RecursionError escaped the reader's _json
@example(edits=[("robot_type", "set", "\ud800")])  # accepted; failed when written as UTF-8
@example(edits=[("fps", "set", float("nan"))])  # fps NaN was accepted
@example(edits=[("fps", "set", float("inf"))])  # fps Infinity was accepted
@example(edits=[("data_files_size_in_mb", "set", float("nan"))])  # accepted too
@example(edits=[("fps", "set", 10**400)])  # accepted; float(fps) raised OverflowError
def test_info_parser(corpus: Corpus, edits) -> None:
    """Info.from_json raises only SchemaError naming an info field; what it accepts has finite,
    non-negative numbers and an Arrow schema."""
    doc = mutate(_info_doc(corpus), edits)
    try:
        obj = json.loads(render(doc, []))
    except RecursionError:
        obj = None  # too deep for json itself; the reader's path is checked below
    except ValueError:
        return
    if obj is not None:
        info = parse_or_schema_error(lambda: Info.from_json(obj), INFO_ROOTS)
        if info is not None:
            assert math.isfinite(info.fps) and info.fps >= 0
            assert math.isfinite(info.data_files_size_in_mb) and info.data_files_size_in_mb > 0
            assert math.isfinite(info.video_files_size_in_mb) and info.video_files_size_in_mb > 0
            info.features.arrow_schema()
            assert json.loads(info.dumps().encode("utf-8")) == json.loads(info.dumps())


@FUZZ
@given(edits=EDITS)
@example(edits=[(0, "set", _deep(100_000, "["))])  # RecursionError escaped open_dataset
@example(edits=[("features.label.shape", "set", [2**40])])  # beyond Arrow: OverflowError
@example(edits=[("features.caption.dtype", "set", "int8")])  # schema mismatch at read
def test_info_through_open_dataset(corpus: Corpus, edits) -> None:
    """open_dataset with a mutated info.json that the manifest vouches for (an attacker who
    edits both): only SchemaError escapes, and an accepted dataset reads its first batch."""
    data = render(mutate(_info_doc(corpus), edits), [])
    manifest = json.loads(corpus.manifest_text)
    for record in manifest["files"]:
        if record["path"] == "meta/info.json":
            record["bytes"] = len(data)
            record["sha256"] = hashlib.sha256(data).hexdigest()
    try:
        (corpus.root / "meta/info.json").write_bytes(data)
        (corpus.root / MANIFEST_PATH).write_text(json.dumps(manifest), encoding="utf-8")
        try:
            with open_dataset(corpus.root) as ds:
                next(iter(ds.iter_batches(8)))
        except SchemaError as err:
            check_schema_error(err, INFO_ROOTS)
        except CorruptShardError as err:  # the features disagree with the shard's schema
            assert "schema" in str(err)
    finally:
        corpus.restore()


# ---------------------------------------------------------------------------------------------------
# Tier config (TOML)

# issue 7's example (tests/tier_fixtures.py) with every optional field set
TIERS_TOML = EXAMPLE_TIERS.replace(
    'stripe_count = "auto"\n', 'stripe_count = "auto"\nstripe_size = "4MiB"\n'
)
TOML_SNIPPETS = st.sampled_from(
    [
        "capacity = 1e400",
        'capacity = "99999999999999999999999999999PB"',
        'read_bandwidth = "1e3GB/s"',
        "stripe_count = -1",
        "stripe_count = 9223372036854775808",
        'path = "/x/%2e%2e/{dataset}"',
        'path = "s3://b/{dataset}/../x"',
        "[tiers.nvme]",
        "[[policy]]",
        'hot = ["nvme", "nvme"]',
        "a = " + "[" * 5000 + "]" * 5000,
        "x = 1979-05-27T07:32:00Z",
        'scope = "\\ud800"',
        "\x00",
        "\ufeff",
        'key = """',
    ]
)


@FUZZ
@given(
    st.lists(
        st.tuples(
            st.integers(0, 10**6),
            st.one_of(TOML_SNIPPETS, st.text(max_size=20)),
            st.booleans(),
        ),
        min_size=1,
        max_size=3,
    ),
    BYTE_EDITS,
)
def test_tier_config_parser(edits, byte_edits) -> None:
    """TierConfig.loads on the documented example with lines replaced or inserted and bytes
    damaged: only SchemaError naming a tiers/policy field escapes; what it accepts round-trips."""
    lines = TIERS_TOML.splitlines()
    for at, text, replace in edits:
        at %= len(lines) + 1
        if replace and at < len(lines):
            lines[at] = text
        else:
            lines.insert(at, text)
    data = bytearray("\n".join(lines).encode("utf-8", "surrogatepass"))
    for at, op, byte in byte_edits:
        at %= len(data) + 1
        if op == "s" and at < len(data):
            data[at] = byte
        elif op == "i":
            data[at:at] = bytes([byte])
        elif op == "d":
            del data[at : at + 1]
        else:
            del data[at:]
    config = parse_or_schema_error(lambda: TierConfig.loads(bytes(data)), {"tiers", "policy"})
    if config is not None:
        assert TierConfig.from_dict(config.to_json()) == config


# ---------------------------------------------------------------------------------------------------
# Assignment header


@FUZZ
@given(edits=EDITS, byte_edits=BYTE_EDITS)
@example(edits=[(0, "set", _deep(100_000, "{"))], byte_edits=[])  # RecursionError escaped
def test_assignment_header_parser(corpus: Corpus, edits, byte_edits) -> None:
    """AssignmentHeader.loads raises only SchemaError naming a header field."""
    data = render(mutate(json.loads(corpus.assignment_text), edits), byte_edits)
    header = parse_or_schema_error(lambda: AssignmentHeader.loads(data, "a.json"), HEADER_ROOTS)
    if header is not None:
        text = header.dumps()
        assert AssignmentHeader.loads(text.encode("utf-8"), "a.json").dumps() == text


HEADER_FIELDS = (
    *("world.nodes", "world.gpus_per_node", "world.workers", "seed", "policy.mode", "name"),
    *("epochs.0.epoch", "epochs.1.epoch", "epochs.0.spans", "epochs.0.samples_per_rank"),
    *("policy.batch_size", "policy.block_rows", "split"),
)


@FUZZ
@given(
    st.lists(
        st.tuples(
            st.sampled_from(HEADER_FIELDS),
            HOSTILE_VALUES,
        ),
        min_size=1,
        max_size=3,
    )
)
@example([("world.nodes", 2**62)])  # OverflowError in the span index
@example([("world.workers", 2**40)])  # int64 overflow: wrong spans instead of an error
def test_load_assignment_with_a_mutated_header(corpus: Corpus, changes) -> None:
    """load_assignment with header fields changed (the table untouched, so its sha256 still
    matches): only SchemaError or AssignmentError escapes, and an accepted assignment answers
    ``spans`` for every rank and worker of its world, or refuses with ValueError."""
    doc = json.loads(corpus.assignment_text)
    for path, value in changes:
        node = doc
        *parents, last = path.split(".")
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[int(last) if isinstance(node, list) else last] = value
    try:
        (corpus.root / ASSIGNMENT).write_bytes(render(doc, []))
        try:
            loaded = load_assignment(corpus.root, "fuzz")
        except SchemaError as err:
            check_schema_error(err, HEADER_ROOTS)
            return
        except AssignmentError as err:
            assert "fuzz" in str(err) or "assignment" in str(err)
            return
        world = loaded.header.world
        total = 0
        for epoch in loaded.epochs:
            for rank in range(min(world.nodes * world.gpus_per_node, 4)):
                for worker in range(min(world.workers, 2)):
                    total += len(loaded.spans(rank, worker, epoch))
        assert total <= loaded.header.table.rows
    finally:
        corpus.restore()


# ---------------------------------------------------------------------------------------------------
# locations.json and the hot index / cache plan headers


def _locations_doc() -> dict:
    ref = DatasetRef("sha256:" + "ab" * 32, 40, 4)
    locations = Locations(
        ref,
        {
            "pfs": TierCopy("/lustre/datasets/ds", "shared", True, 400 * 10**9),
            "cold": TierCopy("s3://bucket/datasets/ds", "shared", False, 20 * 10**9),
            "nvme": TierCopy("/local/nvme/ds", "node", False, 12 * 10**9),
        },
        {"data/chunk-000/file-000.parquet": ("pfs", "cold"), "meta/info.json": ("pfs",)},
    )
    return json.loads(locations.dumps())


def _hot_doc() -> dict:
    table = TableRecord("hot_index.parquet", 3, 100, "c" * 64).to_json()
    return {
        "format_version": "1.0",
        "dataset": {"fingerprint": "sha256:" + "ab" * 32, "num_samples": 40, "num_shards": 4},
        "source": {"kind": "weights-file", "detail": "w.csv", "draws_per_epoch": 40},
        "samples": 3,
        "expected_accesses": 40.0,
        "accessed_bytes": 1200.5,
        "table": table,
    }


def _cache_doc() -> dict:
    pins = [
        {"node": i, "samples": 3, "bytes": 90, "spans": 1, "whole_shards": 0, "coverage": 0.5}
        for i in range(2)
    ]
    return {
        "format_version": "1.0",
        "dataset": {"fingerprint": "sha256:" + "ab" * 32, "num_samples": 40, "num_shards": 4},
        "hot_index_sha256": "d" * 64,
        "nodes": 2,
        "node_budget": 100,
        "budget_spec": "10%",
        "assignment": None,
        "pins": pins,
        "table": TableRecord("cache_plan.parquet", 6, 100, "e" * 64).to_json(),
    }


SIDECARS: dict[str, tuple[Callable[[], dict], Callable[[bytes], Any], set[str]]] = {
    "locations": (
        _locations_doc,
        lambda data: Locations.loads(data),
        {"format_version", "dataset", "tiers", "files"},
    ),
    "hot_index": (
        _hot_doc,
        lambda data: HotIndexHeader.loads(data, "hot_index.json"),
        set(_hot_doc()),
    ),
    "cache_plan": (
        _cache_doc,
        lambda data: CachePlanHeader.loads(data, "cache_plan.json"),
        set(_cache_doc()),
    ),
}


def test_sidecar_documents_are_valid() -> None:
    """The starting documents parse, so the fuzzing below starts from valid input."""
    for make, parse, _ in SIDECARS.values():
        parse(json.dumps(make()).encode())


@pytest.mark.parametrize(
    "kind, where", [("cache_plan", ("pins", 0, "coverage")), ("hot_index", ("expected_accesses",))]
)
def test_an_integer_beyond_any_float_is_a_schema_error(kind: str, where: tuple) -> None:
    """Found by the fuzzer: 10**400 where a number goes raised OverflowError."""
    make, parse, _ = SIDECARS[kind]
    doc = make()
    node = doc
    for step in where[:-1]:
        node = node[step]
    node[where[-1]] = 10**400
    with pytest.raises(SchemaError, match=where[-1]):
        parse(json.dumps(doc).encode())


@FUZZ
@given(st.sampled_from(sorted(SIDECARS)), EDITS, BYTE_EDITS)
@example("locations", [(0, "set", _deep(100_000, "["))], [])  # RecursionError escaped
@example("locations", [("files", "set", {"data/\udc80": ["pfs"]})], [])  # lone surrogate
def test_sidecar_parsers(kind: str, edits, byte_edits) -> None:
    """locations.json, hot_index.json and cache_plan.json: only SchemaError naming a field."""
    make, parse, roots = SIDECARS[kind]
    data = render(mutate(make(), edits), byte_edits)
    doc = parse_or_schema_error(lambda: parse(data), roots)
    if doc is not None:
        text = doc.dumps()
        assert parse(text.encode("utf-8")).dumps() == text


# ---------------------------------------------------------------------------------------------------
# TFRecord framing


def _frame(data: bytes, length: int | None = None) -> bytes:
    """One framed record; ``length`` overrides the declared length (its CRC stays valid)."""
    head = struct.pack("<Q", len(data) if length is None else length)
    crc = struct.pack("<I", masked_crc32c(data))
    return head + struct.pack("<I", masked_crc32c(head)) + data + crc


RECORDS = st.lists(st.binary(max_size=40), min_size=1, max_size=5)


def _read_all(source: Any, **kwargs: Any) -> tuple[list[tuple[int, bytes]], list[TFRecordError]]:
    """Every readable record and every error, reading tolerantly."""
    errors: list[TFRecordError] = []
    good = list(iter_records(source, on_error=errors.append, **kwargs))
    return good, errors


def check_tfrecord_error(err: TFRecordError, size: int) -> None:
    assert err.reason in REASONS, err
    assert 0 <= err.offset <= size, err
    assert f"at offset {err.offset}" in str(err) and err.reason in str(err)


@FUZZ
@given(
    RECORDS,
    st.sampled_from(["plain", "gzip"]),
    st.lists(
        st.tuples(st.integers(0, 10**6), st.sampled_from("fdi"), st.integers(1, 255)),
        max_size=3,
    ),
    st.integers(0, 10**6),
)
def test_tfrecord_damaged_streams(records, compression, flips, cut) -> None:
    """A valid stream with flipped, dropped or inserted bytes and a truncation: reading raises
    only TFRecordError with its offset; every record read tolerantly is one that was written,
    at its own offset."""
    stream = io.BytesIO()
    offsets = write_records(stream, records, compression="gzip" if compression == "gzip" else None)
    data = bytearray(stream.getvalue())
    for at, op, value in flips:
        at %= len(data) + 1
        if op == "f" and at < len(data):
            data[at] ^= value
        elif op == "d":
            del data[at : at + value % 8 + 1]
        else:
            data[at:at] = bytes([value])
    data = bytes(data[: len(data) - cut % (len(data) + 1)])
    with contextlib.suppress(TFRecordError):
        for _ in iter_records(io.BytesIO(data)):
            pass
    good, errors = _read_all(io.BytesIO(data))
    for err in errors:
        check_tfrecord_error(err, 12 + sum(12 + len(r) + 4 for r in records) + 64)
    written = dict(zip(offsets, records, strict=True))
    for offset, record in good:
        assert record in records
        if not flips:
            assert written[offset] == record


HUGE_LENGTHS = st.one_of(
    st.sampled_from([2**31, 2**35, 2**62, 2**64 - 1]), st.integers(2**30, 2**64 - 1)
)


@FUZZ
@given(HUGE_LENGTHS, st.binary(max_size=20), st.booleans())
@example(2**64 - 1, b"x", True)  # OverflowError in read_record_at
@example(2**62, b"x", True)  # MemoryError in read_record_at
def test_tfrecord_huge_declared_length_is_bounded(tmp_path_factory, length, tail, on_disk) -> None:
    """A header declaring a huge length (with a valid length CRC) over a short file: iter_records
    and read_record_at report 'truncated' without allocating anything near the length."""
    blob = _frame(b"ok") + _frame(tail, length)
    if on_disk:
        source: Any = tmp_path_factory.mktemp("huge") / "x.tfrecord"
        source.write_bytes(blob)
    else:
        source = io.BytesIO(blob)
    tracemalloc.start()
    try:
        good, errors = _read_all(source, compression=None)
        if not on_disk:
            source.seek(0)
        with pytest.raises(TFRecordError) as raised:
            read_record_at(source, 18)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [r for _, r in good] == [b"ok"]
    assert [(e.reason, e.offset) for e in errors] == [("truncated", 18)]
    assert raised.value.reason == "truncated" and raised.value.offset == 18
    assert peak < 32 << 20, f"{peak} bytes allocated for a {len(blob)}-byte file"


@FUZZ
@given(HUGE_LENGTHS)
def test_tfrecord_max_record_bytes_is_enforced_before_reading(length) -> None:
    """With max_record_bytes set, a huge declared length fails as 'too large' before any read."""
    blob = _frame(b"x" * 8, length)
    reads: list[int] = []
    stream = io.BytesIO(blob)

    def read(n: int = -1) -> bytes:
        reads.append(n)
        return stream.read(n)

    class Spy:
        pass

    spy = Spy()
    spy.read = read  # type: ignore[attr-defined]
    with pytest.raises(TFRecordError) as raised:
        list(iter_records(spy, compression=None, max_record_bytes=1 << 20))  # type: ignore[arg-type]
    assert raised.value.reason == "too large" and str(length) in str(raised.value)
    assert all(0 <= n <= 1 << 24 for n in reads), reads


# ---------------------------------------------------------------------------------------------------
# tf.Example codec


FEATURES = st.dictionaries(
    st.text(max_size=6),
    st.one_of(
        st.tuples(st.just("bytes"), st.lists(st.binary(max_size=8), max_size=3)),
        st.tuples(
            st.just("int64"),
            st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4).map(
                lambda v: np.array(v, np.int64)
            ),
        ),
        st.tuples(
            st.just("float"),
            st.lists(st.floats(width=32, allow_nan=False), max_size=4).map(
                lambda v: np.array(v, np.float32)
            ),
        ),
        st.just((None, None)),
    ),
    max_size=4,
)


def _nest(data: bytes, depth: int, field: int) -> bytes:
    """``data`` wrapped in ``depth`` nested length-delimited fields (deep messages)."""
    for _ in range(depth):
        size = len(data)
        varint = bytearray()
        while True:
            byte, size = size & 0x7F, size >> 7
            varint.append(byte | (0x80 if size else 0))
            if not size:
                break
        data = bytes([(field << 3) | 2]) + bytes(varint) + data
    return data


@FUZZ
@given(
    FEATURES,
    st.lists(
        st.tuples(st.integers(0, 10**6), st.sampled_from("fdi"), st.integers(1, 255)), max_size=3
    ),
    st.integers(0, 3000),
)
@example({}, [], 3000)  # deep nesting of unknown messages
def test_tf_example_decoder(features, flips, depth) -> None:
    """decode_example on damaged and deeply nested Examples raises only ExampleDecodeError with
    the byte offset inside the input; whatever decodes re-encodes to a fixed point."""
    data = bytearray(encode_example(features))
    for at, op, value in flips:
        at %= len(data) + 1
        if op == "f" and at < len(data):
            data[at] ^= value
        elif op == "d":
            del data[at : at + 1]
        else:
            data[at:at] = bytes([value])
    blob = bytes(data) + _nest(b"\x08\x01", depth, 7)
    try:
        decoded = decode_example(blob)
    except ExampleDecodeError as err:
        assert 0 <= err.offset <= len(blob) and f"at byte {err.offset}" in str(err)
        assert err.problem
        return
    again = encode_example(decoded)
    assert encode_example(decode_example(again)) == again


# ---------------------------------------------------------------------------------------------------
# WebDataset key splitting and hostile tar shards


@FUZZ
@given(st.text(st.one_of(st.characters(), LONE_SURROGATES, st.sampled_from("./")), max_size=30))
def test_webdataset_split_name(name: str) -> None:
    """split_name: the key is the path up to the first dot of the basename, the field the rest,
    lower-cased; None exactly when the basename has no stem or no extension."""
    parts = split_name(name)
    base = name.rpartition("/")[2]
    stem, dot, ext = base.partition(".")
    if parts is None:
        assert not stem or not dot or not ext
        return
    key, field = parts
    assert name.startswith(key + ".")
    assert field == name[len(key) + 1 :].lower()
    assert "." not in key.rpartition("/")[2] and key.rpartition("/")[2]
    assert "/" not in field


MEMBER_NAMES = st.one_of(
    st.sampled_from(
        [
            "a.jpg",
            "a.cls",
            "a.txt",
            "a.json",
            "a.seg.PNG",
            "b.cls",
            "./c.txt",
            "d//e.txt",
            "../up.txt",
            "/abs.txt",
            "README",
            ".hidden.txt",
            "dir/x.bin",
            "a.cls",
            "trailing.",
            "__key__.txt",
            "index.cls",
        ]
    ),
    st.text(st.one_of(st.characters(), LONE_SURROGATES, st.sampled_from("./")), max_size=12),
)
MEMBER_TYPES = st.sampled_from(
    [tarfile.REGTYPE] * 6
    + [tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.FIFOTYPE]
    + [tarfile.DIRTYPE, b"Z"]
)
MEMBER_DATA = st.one_of(
    st.binary(max_size=16),
    st.sampled_from([b"7", b"-9223372036854775809", b"\xff\xfe", b"[" * 5000, b'{"a":NaN}']),
)


def _tar(members: list[tuple[str, bytes, bytes, str]], gz: bool) -> bytes:
    out = io.BytesIO()
    with tarfile.open(
        fileobj=out, mode="w:gz" if gz else "w", format=tarfile.PAX_FORMAT, errors="surrogateescape"
    ) as archive:
        for name, kind, data, link in members:
            # a lone surrogate goes in as the invalid UTF-8 bytes it stands for
            raw = (name or "x").encode("utf-8", "surrogatepass")
            info = tarfile.TarInfo(raw.decode("utf-8", "surrogateescape"))
            info.type = kind
            info.linkname = link
            if kind == tarfile.REGTYPE:
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
            else:
                archive.addfile(info)
    return out.getvalue()


class _PassHook:
    """A media hook that keeps image bytes as they are (the fuzz target is the tar layer)."""

    rewrites = False

    def __call__(self, data: bytes) -> bytes:
        return data


@FUZZ
@given(
    st.lists(
        st.tuples(MEMBER_NAMES, MEMBER_TYPES, MEMBER_DATA, st.sampled_from(["t", "../t", "/t"])),
        min_size=1,
        max_size=8,
    ),
    st.booleans(),
    st.lists(
        st.tuples(st.integers(0, 10**6), st.sampled_from("fdt"), st.integers(1, 255)), max_size=2
    ),
)
def test_webdataset_hostile_shards(tmp_path_factory, members, gz, damage) -> None:
    """A tar shard of hostile member names and types, maybe damaged: infer and scan never raise;
    every sample's members share its key, no rejected or escaping member becomes a unit, and
    every reject has a known reason and a message."""
    data = bytearray(_tar(members, gz))
    for at, op, value in damage:
        at %= len(data) + 1
        if op == "f" and at < len(data):
            data[at] ^= value
        elif op == "d":
            del data[at : at + 512]
        else:
            del data[at:]
    path = tmp_path_factory.mktemp("wds") / "shard.tar"
    path.write_bytes(bytes(data))
    source = WebDatasetSource(path, media_hook=_PassHook(), max_member_bytes=1 << 16)
    inferred = source.infer("shard.tar")
    if not inferred.fields:
        return
    result = source.scan("shard.tar", source.spec(inferred))
    known = set(REJECT_REASONS) | {"member_unsupported", "key_repeated"}
    for reject in result.rejects:
        assert reject.reason in known, reject
        assert reject.message and reject.source == "shard.tar"
        reject.message.encode("utf-8")  # printable: no lone surrogates reach a reject file
    for unit in result.units:
        key, fields = unit.locator
        assert fields and all(split_name(f"{key}.{name}") == (key, name) for name, _, _ in fields)
        assert ".." not in key.split("/") and not key.startswith("/")
    if result.units and not damage:
        table = source.read(result.units, source.spec(inferred))
        assert table.num_rows == len(result.units)


@FUZZ
@given(st.text(st.sampled_from("{},.0123-a"), max_size=40))
@example("{" * 3000 + "a,b" + "}" * 3000)  # deep nesting
def test_webdataset_brace_patterns(pattern: str) -> None:
    """expand_braces on arbitrary patterns: a list of names, or ShardfeedError when too many."""
    from shardfeed.schemas.errors import ShardfeedError

    try:
        names = expand_braces(pattern)
    except ShardfeedError as err:
        assert pattern[:20] in str(err) or "shards" in str(err)
        return
    assert names and all(isinstance(n, str) for n in names)


# ---------------------------------------------------------------------------------------------------
# Weights files and access logs (the hot index inputs)


@FUZZ
@given(
    st.lists(
        st.one_of(
            st.sampled_from(["index,weight", "0,1.5", "1\t2", "2 3e-1", "3,nan", "4,-1"]),
            st.sampled_from(["99999999999999999999999,1", "5,1e999", "x,y,z", "\ud800,1"]),
            st.text(max_size=12),
        ),
        max_size=6,
    ),
    st.binary(max_size=8),
    st.booleans(),
)
@example(["0,1"], b"\xff\xfe", False)  # invalid UTF-8 escaped as UnicodeDecodeError
@example(["99999999999999999999999,1"], b"", False)  # OverflowError converting the index
@example([], b"PAR1garbage", True)  # a corrupt Parquet file escaped as ArrowInvalid
def test_weights_and_access_logs(tmp_path_factory, lines, junk, parquet_magic) -> None:
    """read_pairs raises only InputFileError and read_access_log only HotInputError or
    InputFileError, each naming the file (and the line when there is one)."""
    path = tmp_path_factory.mktemp("weights") / "w.csv"
    body = "\n".join(lines).encode("utf-8", "surrogatepass") + b"\n" + junk
    path.write_bytes((b"PAR1" if parquet_magic else b"") + body)
    try:
        keys, values = read_pairs(str(path), "index", "weight", int)
    except InputFileError as err:
        assert str(path) in str(err), err
    else:
        assert len(keys) == len(values)
        assert np.all(np.isfinite(values)) and np.all(values >= 0)
    try:
        ids, _ = read_access_log(str(path))
    except (InputFileError, HotInputError) as err:
        assert str(path) in str(err), err
    else:
        assert ids.dtype == np.int64

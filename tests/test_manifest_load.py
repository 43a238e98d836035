"""``Manifest.loads`` decodes a manifest written as shardfeed writes it on a fast path (msgspec
builds the shard records, the rest is checked column by column), and record by record otherwise:
both give the same manifest, and everything the fast path refuses gets the record-by-record
error, word for word."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest

from shardfeed.schemas import manifest as manifest_module
from shardfeed.schemas.errors import SchemaError, ShardfeedError
from shardfeed.schemas.manifest import (
    FileRecord,
    Manifest,
    Provenance,
    Rejects,
    ShardRecord,
    compute_fingerprint,
)


def a_manifest(shards: int = 40) -> Manifest:
    records, start = [], 0
    for i in range(shards):
        rows = 10 + i % 3
        records.append(
            ShardRecord(
                path=f"data/chunk-{i // 10:03d}/file-{i:03d}.parquet",
                bytes=1000 + i,
                payload_bytes=900 + i,
                rows=rows,
                row_groups=(4, rows - 4) if i % 2 else (rows,),
                sha256=hashlib.sha256(b"%d" % i).hexdigest(),
                index_start=start,
                index_end=start + rows,
                units=rows if i % 3 else None,
                footer_sha256=hashlib.sha256(b"f%d" % i).hexdigest() if i % 4 else None,
            )
        )
        start += rows
    files = (FileRecord("meta/info.json", 10, "0" * 64),)
    return Manifest(
        num_samples=start,
        fingerprint=compute_fingerprint([r.sha256 for r in records], {}, files),
        shards=tuple(records),
        files=files,
        rejects=Rejects(),
        provenance=Provenance("test", {}, "0"),
    )


def load_both(text: str, monkeypatch) -> tuple[object, object]:
    """``Manifest.loads`` as shipped, then with the column checks turned off: each result is a
    Manifest or the error's text."""

    def attempt() -> object:
        try:
            return Manifest.loads(text)
        except (SchemaError, ShardfeedError) as err:
            return str(err)

    fast = attempt()
    monkeypatch.setattr(manifest_module, "_decode_usual", lambda text: None)
    slow = attempt()
    monkeypatch.undo()
    return fast, slow


def test_the_column_checks_take_a_written_manifest_and_give_the_same_records(monkeypatch):
    manifest = a_manifest()
    text = manifest.dumps()
    assert manifest_module._decode_usual(text) is not None  # really the fast path
    assert manifest_module._decode_usual(text.encode()) is not None
    assert Manifest.loads(text) == Manifest.loads(text.encode()) == manifest
    fast, slow = load_both(text, monkeypatch)
    assert fast == slow == manifest
    # from_json on a caller's object leaves it as it was
    obj = json.loads(text)
    before = copy.deepcopy(obj)
    assert Manifest.from_json(obj) == manifest and obj == before


def _set(i: int, key: str, value: object):
    def change(shards: list) -> None:
        shards[i][key] = value

    return change


def _drop(i: int, key: str):
    def change(shards: list) -> None:
        del shards[i][key]

    return change


CHANGES = {
    "a bool count": _set(3, "bytes", True),
    "a negative count": _set(5, "payload_bytes", -1),
    "a float count": _set(2, "rows", 11.0),
    "uppercase hex": _set(1, "sha256", "A" * 64),
    "short hex": _set(7, "sha256", "a" * 63),
    "a non-hex footer": _set(9, "footer_sha256", "g" * 64),
    "an escaping path": _set(4, "path", "data/../x.parquet"),
    "an absolute path": _set(4, "path", "/data/x.parquet"),
    "a path with a percent": _set(4, "path", "data/%2e%2e/x.parquet"),
    "a path with a space": _set(4, "path", "data/my file.parquet"),
    "a non-ascii path": _set(4, "path", "data/é.parquet"),
    "row groups off their sum": _set(6, "row_groups", [1, 2]),
    "row groups as an object": _set(6, "row_groups", {"a": 1}),
    "a bool row group": _set(8, "row_groups", [True, 9]),
    "index not matching rows": _set(10, "index_end", 10_000),
    "units negative": _set(11, "units", -3),
    "units null": _set(12, "units", None),
    "a null footer": _set(16, "footer_sha256", None),
    "a missing key": _drop(13, "sha256"),
    "a string count": _set(3, "bytes", "12"),
    "a non-ascii digest": _set(1, "sha256", "é" * 64),
    "a shard that is a list": lambda shards: shards.__setitem__(15, [1, 2]),
}


@pytest.mark.parametrize("change", CHANGES.values(), ids=CHANGES.keys())
def test_what_the_fast_path_refuses_gets_the_record_by_record_answer(change, monkeypatch):
    obj = json.loads(a_manifest().dumps())
    change(obj["shards"])
    text = json.dumps(obj, ensure_ascii=False)
    assert manifest_module._decode_usual(text) is None
    fast, slow = load_both(text, monkeypatch)
    assert fast == slow


@pytest.mark.parametrize(("key", "value"), [("colour", "blue"), ("bytes", 10**30)])
def test_what_both_paths_accept_the_fast_path_takes(key, value, monkeypatch):
    obj = json.loads(a_manifest().dumps())
    obj["shards"][14][key] = value
    text = json.dumps(obj)
    assert manifest_module._decode_usual(text) is not None
    fast, slow = load_both(text, monkeypatch)
    assert isinstance(fast, Manifest) and fast == slow


TOP_LEVEL = {
    "no shards": lambda o: o.update(shards=[]),
    "samples not covered": lambda o: o.update(num_samples=3),
    "shards not a list": lambda o: o.update(shards="nope"),
    "a repeated shard": lambda o: o["shards"].append(o["shards"][0]),
    "a shard that is a number": lambda o: o["shards"].insert(0, 5),
    "a null cost": lambda o: o.update(cost=None),
    "hot shards": lambda o: o.update(hot_shards=2),
    "too many hot shards": lambda o: o.update(hot_shards=99),
    "no files": lambda o: o.pop("files"),
    "an unknown key": lambda o: o.update(extra={"x": 1}),
    "escapes in an option": lambda o: o["provenance"]["content_options"].update(
        s="a\\b \ud83d\ude00"
    ),
    "a lone surrogate in an option": lambda o: o["provenance"]["content_options"].update(
        s="\ud800"
    ),
    "a new major version": lambda o: o.update(format_version="2.0"),
}


@pytest.mark.parametrize("change", TOP_LEVEL.values(), ids=TOP_LEVEL.keys())
def test_both_paths_agree_on_changes_to_the_top_level(change, monkeypatch):
    obj = json.loads(a_manifest().dumps())
    change(obj)
    fast, slow = load_both(json.dumps(obj), monkeypatch)
    assert fast == slow


@pytest.mark.parametrize(
    "text", ['{"shards": [' * 5000, '"\\ud800"', "[]", '{"shards": [{"path": "\\ud800"}]}', "NaN"]
)
def test_bad_documents_are_one_schema_error(text):
    with pytest.raises(SchemaError):
        Manifest.loads(text)

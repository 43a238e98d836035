"""Hostile corpora converted for real: every kind is a reject with its reason, nothing else breaks.

``hostile.py`` writes one corpus per source type (good records plus every hostile kind of that type).
Each corpus is converted once, by the real ``shardfeed convert`` on the in-process runner (module
fixture), with a reject limit of 100% so that the run publishes. The tests then check, per kind, the
exact reject records it caused, and per corpus that the rejects are exactly the expected ones (also
in the summary and the manifest), every good record arrived, the dataset verifies, and nothing was
created, changed or followed outside DST: the whole run directory (source, the links' targets, the
working directory, the places ``..`` and absolute tar members name) is snapshotted before and after.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import stat
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from adversarial.hostile import (
    JSONL_MAX_EXPANDED,
    JSONL_MAX_LINE,
    KINDS,
    SOURCES,
    Corpus,
    Expect,
    build_corpus,
)

from shardfeed.cli.main import main
from shardfeed.formats.reader import Dataset, open_dataset
from shardfeed.formats.rejects import iter_rejects
from shardfeed.schemas.rejects import REASONS, RejectRecord

Snapshot = dict[str, tuple]


@dataclass
class Run:
    """One corpus, converted: what was written, what came out, and the tree around it."""

    corpus: Corpus
    dst: Path
    summary: dict
    rejects: list[RejectRecord]
    good_out: list[str]
    before: Snapshot
    after: Snapshot


def snapshot(base: Path, skip: Path) -> Snapshot:
    """Every path under ``base`` except ``skip``'s subtree: type, and bytes, mode and mtime of files
    or the target of links (links are never followed)."""
    out: Snapshot = {}
    for dirpath, dirnames, filenames in os.walk(base):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if here / d != skip]
        for name in dirnames + filenames:
            path = here / name
            info = path.lstat()
            rel = path.relative_to(base).as_posix()
            if stat.S_ISLNK(info.st_mode):
                out[rel] = ("link", os.readlink(path))
            elif stat.S_ISDIR(info.st_mode):
                out[rel] = ("dir", info.st_mode)
            else:
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                out[rel] = ("file", digest, info.st_mode, info.st_mtime_ns)
    return out


@contextlib.contextmanager
def working_directory(path: Path) -> Iterator[None]:
    """Run in ``path``: a relative ``../`` member name would resolve from here."""
    previous = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


def convert(source: str, src: Path, dst: Path) -> dict:
    """``shardfeed convert`` through the CLI; JSONL through the pipeline API, the only way to set
    the decompression bound low enough (the CLI's is 8 GiB) for a bomb to pass it quickly."""
    if source == "jsonl":
        from shardfeed.pipelines.driver import ConvertConfig, run_convert

        options = {"max_expanded_bytes": JSONL_MAX_EXPANDED, "max_line_bytes": JSONL_MAX_LINE}
        config = ConvertConfig(
            str(src), str(dst), kind="jsonl", max_reject_fraction=1.0, source_options=options
        )
        return run_convert(config).to_json()
    out = io.StringIO()
    args = ["convert", str(src), str(dst), "--from", source, "--max-reject-fraction", "1", "--json"]
    with contextlib.redirect_stdout(out):
        code = main(args)
    assert code == 0, out.getvalue()
    return json.loads(out.getvalue())


def good_ids(source: str, ds: Dataset, dst: Path) -> list[str]:
    """The identifiers hostile.py gives good records, read back from the converted dataset."""
    if source == "lerobot":
        table = pq.read_table(dst / "meta/episodes")
        column = (
            "source_episode_index"
            if "source_episode_index" in table.column_names
            else "episode_index"
        )
        return [f"episode:{n}" for n in table.column(column).to_pylist()]
    rows = ds.read(0, len(ds))
    if source == "imagefolder":
        return list(rows["path"])
    if source == "webdataset":
        return [f"{url}/{key}" for url, key in zip(rows["__url__"], rows["__key__"], strict=True)]
    return [str(v) for v in np.asarray(rows["id"], dtype=object).reshape(-1).tolist()]


def convert_corpus(source: str, base: Path) -> Run:
    """Build ``source``'s corpus under ``base``, convert it from a working directory two levels
    below ``base/in`` (so ``../../x`` stays inside the snapshot), and snapshot around it."""
    corpus = build_corpus(source, base / "in" / "src", base / "outside")
    cwd = base / "in" / "work" / "cwd"
    cwd.mkdir(parents=True)
    (base / "out").mkdir()
    dst = base / "out" / "dst"
    before = snapshot(base, dst)
    with working_directory(cwd):
        summary = convert(source, corpus.root, dst)
    after = snapshot(base, dst)
    ds = open_dataset(dst)
    rejects = list(iter_rejects(ds.location, ds.manifest))
    return Run(corpus, dst, summary, rejects, good_ids(source, ds, dst), before, after)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Run]:
    """``runs(source)`` converts that source type's corpus on first use (one pipeline per type)."""
    cache: dict[str, Run] = {}

    def get(source: str) -> Run:
        if source not in cache:
            cache[source] = convert_corpus(source, tmp_path_factory.mktemp(f"hostile-{source}"))
        return cache[source]

    return get


def matching(run: Run, expect: Expect) -> list[RejectRecord]:
    return [
        r
        for r in run.rejects
        if r.source == expect.source and expect.position in (None, r.position)
    ]


# --------------------------------------------------------------------------------------------------
# the registry


def test_registry_has_the_issue_kinds() -> None:
    """At least 15 kinds, every reason a documented one, every source type covered."""
    assert len(KINDS) >= 15
    assert {k.reason for k in KINDS.values()} <= set(REASONS)
    assert {k.source for k in KINDS.values()} == set(SOURCES)
    for prefix in (
        "image_",
        "jsonl_",
        "parquet_",
        "tfrecord_",
        "tar_",
        "lerobot_",
        "symlink_escape_",
    ):
        assert sum(name.startswith(prefix) for name in KINDS) >= 2, prefix


# --------------------------------------------------------------------------------------------------
# per kind


@pytest.mark.parametrize("kind", list(KINDS))
def test_kind_is_a_reject_with_its_reason(runs: Callable[[str], Run], kind: str) -> None:
    """Each record the kind wrote is exactly one reject, with the kind's reason and a one-line
    message; the good records written around it still arrive."""
    run = runs(KINDS[kind].source)
    written = run.corpus.written[kind]
    for expect in written.expects:
        found = matching(run, expect)
        assert [r.reason for r in found] == [expect.reason], (expect, found)
        assert found[0].message.strip() and "\n" not in found[0].message
    assert written.good <= set(run.good_out)


# --------------------------------------------------------------------------------------------------
# per corpus


@pytest.mark.parametrize("source", SOURCES)
def test_rejects_are_exactly_the_expected_ones(runs: Callable[[str], Run], source: str) -> None:
    """No reject beyond those the kinds cause; the summary and the manifest count the same."""
    run = runs(source)
    expects = run.corpus.expects
    claimed = [r for r in run.rejects if any(r in matching(run, e) for e in expects)]
    assert claimed == run.rejects, [r for r in run.rejects if r not in claimed]
    assert len(run.rejects) == len(expects)
    counts = dict(Counter(e.reason for e in expects))
    assert run.summary["rejects"] == {
        "total": len(expects),
        "by_reason": dict(sorted(counts.items())),
    }
    manifest = open_dataset(run.dst).manifest.rejects
    assert (manifest.total, dict(manifest.by_reason)) == (len(expects), counts)


@pytest.mark.parametrize("source", SOURCES)
def test_every_good_record_arrives_once(runs: Callable[[str], Run], source: str) -> None:
    """Hostile neighbours cost nothing else: every good record (also those before a break in the
    same file) is in the shards exactly once, and the run published."""
    run = runs(source)
    assert sorted(run.good_out) == sorted(run.corpus.good)
    assert run.summary["published"] is True


@pytest.mark.parametrize("source", SOURCES)
def test_nothing_outside_dst_is_written_changed_or_followed(
    runs: Callable[[str], Run], source: str
) -> None:
    """The run directory outside DST (SRC, the links' targets, the working directory) is
    byte-identical before and after, and no archive member or link target came into being."""
    run = runs(source)
    assert run.after == run.before, {
        k: (run.before.get(k), run.after.get(k))
        for k in run.before.keys() | run.after.keys()
        if run.before.get(k) != run.after.get(k)
    }
    assert not [p for p in run.corpus.forbidden if os.path.lexists(p)]


@pytest.mark.parametrize("source", SOURCES)
def test_the_dataset_verifies(runs: Callable[[str], Run], source: str) -> None:
    """``shardfeed verify`` accepts the result: shards, reject files and manifest agree."""
    run = runs(source)
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["verify", str(run.dst)]) == 0

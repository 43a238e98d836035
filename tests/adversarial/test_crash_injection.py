"""Crash injection: SIGKILL ``shardfeed convert`` and ``shardfeed stage`` at random moments.

What must hold after every kill (issue 10, item 2):

* **Nothing partial is ever accepted.** Without a manifest, ``open_dataset`` refuses the DST or
  tier copy and ``verify`` fails (API and CLI). With one, ``verify`` passes and every file equals
  the uninterrupted run's.
* **A re-run finishes and is byte-identical** to an uninterrupted run: every file of the output
  tree, manifest and meta files included, and nothing else (no work directory, no temporary).
  Nothing is excluded from the comparison: convert output embeds no timestamps or paths (the
  phase timings go to the summary only), and stage's ``locations.json`` is deterministic.

Re-run semantics (docs/PIPELINE.md "Re-runs reuse finished shards"): a DST with no manifest is
an interrupted run's and the **plain command** takes it over, keeping the shards it can prove
finished; that holds whichever run was killed, an ``--overwrite`` run included (it marks DST as an
interrupted run's before deleting the old dataset). A kill after the manifest was published
(while the work directory was being removed) leaves a complete dataset: the plain command then
refuses it as existing, and ``--overwrite`` converts again. ``stage`` needs no flag: it resumes,
skipping verified copies, and removes what a killed run left (temporaries in the tiers, and
locations.json's temporary in the source).

``convert --split ... --overwrite`` over a published split dataset has a test of its own: each
round kills one overwrite run (at the moment it marks DST, twice inside the deletion of the old
dataset, which the test slows to a few milliseconds a file, then at the other phases in turn).
A DST left with a manifest is the old or the new dataset exactly; one without holds a work
directory, so the plain command takes it over and finishes it.

Kills are spread over the whole run: the uninterrupted reference run is timed by the same probes,
and each kill targets a phase (startup, scan, write, publish for convert; startup, copy, record
for stage), round-robin, at a seeded random delay inside that phase's window. Every round kills
a fresh run, then kills the re-run that resumes it, then lets a third run finish. The test counts
what state each kill left and asserts a spread, so it cannot decay into startup-only kills.
In ``multi_processing`` mode the resume kills take only the driver (as the OOM killer would).
Its SDK workers then get ``ORPHAN_GRACE`` seconds to exit on their own (and to do damage: the
checks run after that); Beam 2.77's workers do not always notice, so survivors are counted,
reported and killed. ``SHARDFEED_FULL=1`` runs four times as many rounds.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from adversarial.kill_harness import (
    ORPHAN_GRACE,
    Kill,
    Moment,
    Probe,
    kill_at,
    newer,
    timeline,
)
from staging_fixtures import dataset, tiers_toml

from shardfeed import open_dataset
from shardfeed.cli.main import main
from shardfeed.formats.atomic import is_temp_name
from shardfeed.formats.errors import IncompleteDatasetError
from shardfeed.formats.layout import LEASE_NAME
from shardfeed.formats.verify import verify_dataset
from shardfeed.pipelines.graph_config import INTERRUPTED
from shardfeed.schemas.locations import LOCATIONS_PATH, Locations
from shardfeed.schemas.manifest import MANIFEST_PATH

pytest.importorskip("apache_beam")

FULL = os.environ.get("SHARDFEED_FULL") == "1"
#: convert rounds per running mode; each round kills twice (a run, then its resume)
CONVERT_ROUNDS = 20 if FULL else 5
STAGE_ROUNDS = 40 if FULL else 10
WORK_DIR = ".shardfeed-work"
CLI = [sys.executable, "-m", "shardfeed.cli.main"]

MODES = {
    "in_memory": [],
    "multi_processing": ["--direct_running_mode=multi_processing", "--direct_num_workers=2"],
}
CONVERT_ARGS = ["--target-shard-size", "40KB", "--max-reject-fraction", "0.1"]
CONVERT_PHASES = ("startup", "scan", "write", "publish", "cleanup")
STAGE_PHASES = ("startup", "copy", "record", "exit")
#: instants too short for a timed window, hit by killing as soon as the poll sees them: the
#: manifest's temporary before its rename, and locations.json's before its rename
COMMIT, LOCATIONS_TMP = "commit", "locations_tmp"


def _image_corpus(root: Path) -> Path:
    """Three classes of 60 random-noise PNGs (8-40 px: ~820 KB, 9 shards at 40KB) and one file
    that is not an image, so the run also publishes a reject part."""
    from PIL import Image

    rng = np.random.default_rng(10)
    for label in ("cat", "dog", "owl"):
        (root / label).mkdir(parents=True)
        for i in range(60):
            side = int(rng.integers(8, 40))
            pixels = rng.integers(0, 255, (side, side, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / label / f"{i:03d}.png")
    (root / "cat" / "broken.png").write_bytes(b"not an image")
    return root


def _convert_cmd(src: Path, dst: Path, mode: str, *extra: str) -> list[str]:
    return [*CLI, "convert", str(src), str(dst), *CONVERT_ARGS, *MODES[mode], *extra]


def _convert_probes(dst: Path) -> dict[str, Probe]:
    """scan: a unit table of this run; write: a shard file (or its temporary), or the sidecar
    of a shard a resumed run kept; publish: the
    driver's first move into meta/ (reject parts, then stats, info, ...); cleanup: the manifest
    is published and the work directory is being removed (then the interpreter exits)."""
    return {
        "scan": newer(dst, f"{WORK_DIR}/units/*"),
        "write": newer(dst, "data/*/*", f"{WORK_DIR}/shards/*"),
        "publish": newer(dst, "meta/*", "meta/shardfeed/*"),
        "cleanup": newer(dst, MANIFEST_PATH),
        COMMIT: newer(dst, "meta/shardfeed/.manifest.json.tmp-*"),
    }


def _moments(
    rng: random.Random, windows: dict[str, tuple[str | None, float]], count: int
) -> list[Moment]:
    """``count`` kill moments, phases round-robin from a random start, each at a uniform
    random delay inside its phase's window (at least 5 ms wide)."""
    phases = list(windows)
    first = rng.randrange(len(phases))
    out = []
    for i in range(count):
        phase = phases[(first + i) % len(phases)]
        after, length = windows[phase]
        out.append(Moment(phase, after, rng.uniform(0.0, max(length, 0.005))))
    return out


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root``, temporaries included, as {relative posix path: bytes}; not a
    writer's lease, which a run killed after publishing leaves for the next writer to take over
    (readers never look at it)."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and p.name != LEASE_NAME
    }


def _differences(tree: dict[str, bytes], reference: dict[str, bytes]) -> list[str]:
    """Paths that differ from the reference; for JSON files, the top-level keys that differ."""
    out = []
    for path in sorted(tree.keys() | reference.keys()):
        got, want = tree.get(path), reference.get(path)
        if got == want:
            continue
        if got is None or want is None:
            out.append(f"{path}: {'missing' if got is None else 'unexpected'}")
        elif path.endswith(".json"):
            a, b = json.loads(got), json.loads(want)
            keys = [k for k in a.keys() | b.keys() if a.get(k) != b.get(k)]
            out.append(
                f"{path}: keys {sorted(keys)} differ: {[(a.get(k), b.get(k)) for k in keys]}"
            )
        else:
            out.append(f"{path}: {len(got)} bytes, reference {len(want)}")
    return out


def _without_work_dir(tree: dict[str, bytes]) -> dict[str, bytes]:
    return {k: v for k, v in tree.items() if not k.startswith(f"{WORK_DIR}/")}


def _convert_state(dst: Path) -> str:
    """What a killed conversion left: ``nothing`` (no shard file), ``shards`` (shard files, no
    metadata), ``meta`` (publishing had begun), ``commit`` (the manifest's temporary, not yet
    renamed), ``published`` (a manifest)."""
    if (dst / MANIFEST_PATH).exists():
        return "published"
    if any((dst / MANIFEST_PATH).parent.glob(".manifest.json.tmp-*")):
        return "commit"
    if (dst / "meta").exists() and any(p.is_file() for p in (dst / "meta").rglob("*")):
        return "meta"
    if (dst / "data").exists() and any(p.is_file() for p in (dst / "data").rglob("*")):
        return "shards"
    return "nothing"


def _refused(path: Path) -> None:
    """``open_dataset`` and ``verify`` (API and CLI) refuse a tree with no manifest."""
    with pytest.raises(IncompleteDatasetError, match="manifest"):
        open_dataset(path)
    with pytest.raises(IncompleteDatasetError, match="manifest"):
        verify_dataset(path)
    assert main(["verify", str(path)]) != 0, f"verify CLI accepted {path}"


def _check_killed_convert(dst: Path, reference: dict[str, bytes], src: Path, mode: str) -> str:
    """Assert that a killed conversion's DST is refused, or complete and equal to the reference;
    return its state. A published DST is refused by the same command (it exists)."""
    state = _convert_state(dst)
    if state != "published":
        _refused(dst)
        return state
    report = verify_dataset(dst)
    assert report.ok, f"killed run published a dataset that fails verify: {report.problems}"
    assert len(open_dataset(dst)) == json.loads(reference[MANIFEST_PATH])["num_samples"]
    tree = _without_work_dir(_tree(dst))
    assert tree == reference, f"published output differs: {_differences(tree, reference)}"
    before = _tree(dst)
    argv = _convert_cmd(src, dst, mode)[len(CLI) :]
    assert main(argv) != 0, "the same command must refuse a DST that holds a dataset"
    assert _tree(dst) == before, "a refused re-run changed the DST"
    return state


@pytest.fixture(scope="module")
def image_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _image_corpus(tmp_path_factory.mktemp("corpus") / "imgs")


@pytest.mark.parametrize("mode", list(MODES))
def test_sigkill_convert_never_publishes_partial_and_reruns_byte_identical(
    mode: str, image_corpus: Path, tmp_path: Path
) -> None:
    """Kill ``convert`` 2x per round in ``mode``; check every kill's leftovers, then re-run."""
    src = image_corpus
    clean = tmp_path / "clean"
    ref_timeline = timeline(_convert_cmd(src, clean, mode), _convert_probes(clean))
    reference = _tree(clean)
    assert MANIFEST_PATH in reference and not any(k.startswith(WORK_DIR) for k in reference)
    assert sum(k.startswith("data/") for k in reference) >= 6, "corpus must give several shards"
    assert any(k.startswith("meta/shardfeed/rejects/") for k in reference)
    windows = ref_timeline.windows(CONVERT_PHASES)
    rng = random.Random(f"convert-{mode}")
    moments = _moments(rng, windows, 2 * CONVERT_ROUNDS)
    moments[0] = Moment(COMMIT, COMMIT, 0.0)  # round 0: the fresh run dies committing
    kills: list[tuple[Kill, str]] = []
    for r in range(CONVERT_ROUNDS):
        dst = tmp_path / f"dst-{r}"
        for moment in moments[2 * r : 2 * r + 2]:  # a fresh run, then the resume of it
            overwrite = ["--overwrite"] if (dst / MANIFEST_PATH).exists() else []
            cmd = _convert_cmd(src, dst, mode, *overwrite)
            # multi_processing: every resume kill takes the driver only; its SDK workers must
            # notice and exit (kill_at waits for them) before the checks look at DST
            driver_only = mode == "multi_processing" and moment is moments[2 * r + 1]
            kill = kill_at(cmd, moment, _convert_probes(dst), driver_only=driver_only)
            assert kill.returncode == (0 if kill.exited_first else -9), kill
            if driver_only and kill.phase(CONVERT_PHASES) in ("write", "publish", "cleanup"):
                # workers that ran shardfeed steps watch their driver (pipelines/worker_guard.py)
                assert kill.orphans == 0, f"SDK workers outlived the killed driver: {kill}"
            kills.append((kill, _check_killed_convert(dst, reference, src, mode)))
        overwrite = ["--overwrite"] if (dst / MANIFEST_PATH).exists() else []
        done = subprocess.run(
            _convert_cmd(src, dst, mode, *overwrite), capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-4000:]
        tree = _tree(dst)
        assert tree == reference, (
            f"re-run after kills {kills[-2:]} differs: {_differences(tree, reference)}"
        )
        shutil.rmtree(dst)

    _report(mode, kills, CONVERT_PHASES, ref_timeline)
    reached = Counter(k.phase(CONVERT_PHASES) for k, _ in kills)
    assert len(kills) >= 10
    assert reached["startup"] + reached["scan"] >= 2, f"too few kills before a shard: {reached}"
    assert reached["write"] >= 2, f"too few kills mid-write: {reached}"
    assert reached["publish"] + reached["cleanup"] >= 1, f"no kill while publishing: {reached}"
    # a resume reuses finished work, so it can end before a window timed on the reference run:
    # some late kills are expected, but most must land
    assert sum(k.exited_first for k, _ in kills) <= len(kills) // 2, "most kills came too late"


def _report(what: str, kills: list[tuple[Kill, str]], phases: tuple[str, ...], ref) -> None:
    """Print each kill and the tallies (visible with ``pytest -s``; the numbers in RELIABILITY.md)."""
    print(f"\n{what}: reference run {ref}")
    for kill, state in kills:
        who = f"driver ({kill.orphans} workers outlived it)" if kill.driver_only else "group"
        print(f"  {kill.moment} {who} -> reached {kill.phase(phases)}, left {state}")
    reached = dict(Counter(k.phase(phases) for k, _ in kills))
    left = dict(Counter(state for _, state in kills))
    edge = sum(k.moment.after in (COMMIT, LOCATIONS_TMP) for k, _ in kills)
    driver = sum(k.driver_only for k, _ in kills)
    orphans = sum(k.orphans > 0 for k, _ in kills)
    print(
        f"{what}: {len(kills)} kills ({edge} at a commit instant, {driver} of the driver only, "
        f"{orphans} leaving workers alive {ORPHAN_GRACE}s later); reached {reached}; left {left}"
    )


# ------------------------------------------------------------------------------------------
# convert --split --overwrite over a published split dataset

#: seconds each file of the old dataset takes to delete in the split-overwrite runs: a large
#: dataset on a slow file system, so seeded kills land inside the deletion (else ~1 ms long)
DELETE_SECONDS_PER_FILE = 0.005
#: runs ``shardfeed`` with ``prepare_root``'s ``shutil.rmtree`` deleting one file at a time,
#: DELETE_SECONDS_PER_FILE apart; nothing else differs from the CLI
SLOW_DELETE_CLI = [
    sys.executable,
    "-c",
    f"""
import os, sys, time, types
from shardfeed.formats import publish
from shardfeed.cli.main import main

def rmtree(path, ignore_errors=False):
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files:
            os.unlink(os.path.join(root, name))
            time.sleep({DELETE_SECONDS_PER_FILE})
        for name in dirs:
            os.rmdir(os.path.join(root, name))
    if os.path.isdir(path):
        os.rmdir(path)

publish.shutil = types.SimpleNamespace(rmtree=rmtree)
sys.exit(main(sys.argv[1:]))
""",
]
SPLIT_ROUNDS = 28 if FULL else 7
SPLIT_PHASES = ("startup", "delete", "scan", "write", "publish", "cleanup")
#: the instant an --overwrite run has marked DST as an interrupted run's, before it deletes
MARK = "mark"
OLD_SHARD_SIZE = "10KB"  # the old dataset: about three times as many shards as the new one


def _split_cmd(src: Path, dst: Path, *extra: str, cli: Sequence[str] = CLI) -> list[str]:
    splits = ["--split", f"train={src / 'train'}", "--split", f"eval={src / 'eval'}"]
    return [*cli, "convert", *splits, str(dst), *CONVERT_ARGS, *extra]


def _split_probes(dst: Path) -> dict[str, Probe]:
    """delete: the old manifest is gone (it goes first, then the old files); scan, write,
    publish, cleanup and the commit instant as for convert, within the split work directories;
    the mark: DST's work directory marks an interrupted --overwrite (written before deleting)."""
    return {
        "delete": lambda started: not (dst / MANIFEST_PATH).exists(),
        "scan": newer(dst, f"{WORK_DIR}/split-*/units/*", files_only=True),
        "write": newer(dst, "data/*/*", f"{WORK_DIR}/split-*/shards/*", files_only=True),
        "publish": newer(dst, "meta/*", "meta/shardfeed/*", files_only=True),
        "cleanup": newer(dst, MANIFEST_PATH, files_only=True),
        MARK: newer(dst, f"{WORK_DIR}/{INTERRUPTED}", files_only=True),
        COMMIT: newer(dst, "meta/shardfeed/.manifest.json.tmp-*", files_only=True),
    }


def _split_state(dst: Path, old: dict[str, bytes], reference: dict[str, bytes]) -> str:
    """``old`` (the old dataset's manifest is still there), ``deleting`` (no manifest, some of
    the old files left), ``published`` (the new manifest), else what ``_convert_state`` says."""
    manifest = dst / MANIFEST_PATH
    if manifest.exists():
        return "old" if manifest.read_bytes() == old[MANIFEST_PATH] else "published"
    tree = _tree(dst)
    # an old file the new dataset has too, byte for byte (rejects, stats), tells nothing
    if any(tree.get(k) == v != reference.get(k) for k, v in old.items()):
        return "deleting"
    return _convert_state(dst)


def _check_killed_split(
    dst: Path, src: Path, old: dict[str, bytes], reference: dict[str, bytes]
) -> str:
    """A DST with a manifest verifies and is the old or the new dataset exactly, and the plain
    command refuses it unchanged; one without is refused, and holds a work directory (or no
    content at all), so the plain command takes it over. Returns the state."""
    state = _split_state(dst, old, reference)
    if state in ("old", "published"):
        report = verify_dataset(dst)
        assert report.ok, (
            f"killed overwrite left a {state} DST that fails verify: {report.problems}"
        )
        tree = _without_work_dir(_tree(dst))
        want = old if state == "old" else reference
        assert tree == want, f"{state} DST differs: {_differences(tree, want)}"
        before = _tree(dst)
        assert main(_split_cmd(src, dst)[len(CLI) :]) != 0, "the plain command took over a dataset"
        assert _tree(dst) == before, "a refused re-run changed the DST"
        return state
    _refused(dst)
    content = [p.name for p in dst.iterdir() if p.name != LEASE_NAME] if dst.exists() else []
    assert WORK_DIR in content or not content, (
        f"a killed --overwrite left {state} DST {sorted(content)} with no work directory: "
        "the plain command would refuse it"
    )
    return state


@pytest.fixture(scope="module")
def split_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two image folders: train (2 x 40 PNGs and a file that is not an image), eval (2 x 20)."""
    from PIL import Image

    root = tmp_path_factory.mktemp("split-corpus")
    rng = np.random.default_rng(11)
    for split, count in (("train", 40), ("eval", 20)):
        for label in ("cat", "dog"):
            (root / split / label).mkdir(parents=True)
            for i in range(count):
                side = int(rng.integers(8, 40))
                pixels = rng.integers(0, 255, (side, side, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / label / f"{i:03d}.png")
    (root / "train" / "cat" / "broken.png").write_bytes(b"not an image")
    return root


def test_sigkill_split_overwrite_leaves_a_dst_the_plain_command_finishes(
    split_corpus: Path, tmp_path: Path
) -> None:
    """Kill ``convert --split ... --overwrite`` over a published split dataset at a phase of its
    timed run (the mark, and the deletion of the old dataset, first); each kill's DST is the old
    dataset, the new one, or an interrupted run's; the plain command (``--overwrite`` only
    where a manifest is left) finishes it byte-identical to an uninterrupted conversion."""
    src = split_corpus
    clean, pristine = tmp_path / "clean", tmp_path / "old"
    setup = [  # the reference and the old dataset, side by side
        subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for cmd in (
            _split_cmd(src, clean),
            _split_cmd(src, pristine, "--target-shard-size", OLD_SHARD_SIZE),
        )
    ]
    assert [process.wait(timeout=300) for process in setup] == [0, 0]
    reference, old = _tree(clean), _tree(pristine)
    assert any(k.startswith("meta/shardfeed/rejects/") for k in reference)
    assert list(json.loads(old[MANIFEST_PATH])["splits"]) == ["train", "eval"]
    assert sum(k.startswith("data/") for k in old) > sum(k.startswith("data/") for k in reference)

    def fresh(dst: Path) -> None:
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(pristine, dst)  # file times kept: older than any run's start

    timed = tmp_path / "timed"
    fresh(timed)
    overwrite = _split_cmd(src, timed, "--overwrite", cli=SLOW_DELETE_CLI)
    ref_timeline = timeline(overwrite, _split_probes(timed))
    assert _tree(timed) == reference
    windows = ref_timeline.windows(SPLIT_PHASES)
    # the mark's instant, two seeded points inside the deletion, then the other phases in turn
    deleting = (len(old) - 1) * DELETE_SECONDS_PER_FILE  # at least: the manifest goes at once
    rng = random.Random("split-overwrite")
    moments = [
        Moment(MARK, MARK, 0.0),
        *(Moment("delete", "delete", rng.uniform(0.0, 0.8 * deleting)) for _ in range(2)),
        *_moments(rng, {p: w for p, w in windows.items() if p != "delete"}, SPLIT_ROUNDS - 3),
    ]
    kills: list[tuple[Kill, str]] = []
    for r, moment in enumerate(moments):
        dst = tmp_path / f"dst-{r}"
        fresh(dst)
        cmd = _split_cmd(src, dst, "--overwrite", cli=SLOW_DELETE_CLI)
        kill = kill_at(cmd, moment, _split_probes(dst))
        assert kill.returncode == (0 if kill.exited_first else -9), kill
        kills.append((kill, _check_killed_split(dst, src, old, reference)))
        again = ["--overwrite"] if (dst / MANIFEST_PATH).exists() else []  # else: plain
        # in this process (the CLI's own entry point): no interpreter or Beam start to pay
        assert main(_split_cmd(src, dst, *again)[len(CLI) :]) == 0, f"re-run after {kills[-1]}"
        tree = _tree(dst)
        assert tree == reference, (
            f"re-run after {kills[-1]} differs: {_differences(tree, reference)}"
        )
        assert verify_dataset(dst).ok
        shutil.rmtree(dst)

    _report("convert --split --overwrite", kills, SPLIT_PHASES, ref_timeline)
    left = Counter(state for _, state in kills)
    assert left["deleting"] >= 2, f"too few kills while the old dataset was deleted: {left}"
    assert sum(k.exited_first for k, _ in kills) <= len(kills) // 2, "most kills came too late"


# ------------------------------------------------------------------------------------------
# stage


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _stage_probes(tmp_path: Path, src: Path) -> dict[str, Probe]:
    """copy: any file (or temporary) of this run in a tier copy; record: the complete tier's
    manifest is in place (the hot-only tier and locations.json follow); exit: locations.json."""
    return {
        "copy": newer(tmp_path, "pfs/ds/**/*", "warm/ds/**/*"),
        "record": newer(tmp_path / "pfs/ds", MANIFEST_PATH),
        "exit": newer(src, LOCATIONS_PATH),
        LOCATIONS_TMP: newer(src, "meta/shardfeed/.locations.json.tmp-*"),
    }


def _tier_state(tmp_path: Path, src: Path) -> str:
    """What a killed stage left: ``nothing`` copied, ``copying`` (no manifest on pfs yet),
    ``copied`` (the pfs copy is complete), ``recording`` (locations.json's temporary is
    there), ``recorded`` (locations.json written)."""
    if any((src / LOCATIONS_PATH).parent.glob(".locations.json.tmp-*")):
        return "recording"
    if (src / LOCATIONS_PATH).exists():
        return "recorded"
    if (tmp_path / "pfs/ds" / MANIFEST_PATH).exists():
        return "copied"
    finals = [
        p
        for tier in ("pfs", "warm")
        for p in (tmp_path / tier).rglob("*")
        if p.is_file() and not is_temp_name(p.name) and p.name != LEASE_NAME
    ]
    return "copying" if finals else "nothing"


def _check_killed_stage(
    tmp_path: Path, src: Path, expected: dict[str, str], refs: dict[str, dict[str, bytes]]
) -> str:
    """Every file under a final name in a tier is whole; the complete tier verifies exactly when
    its manifest is there; locations.json lists only verified copies; the source still verifies."""
    for tier in ("pfs", "warm"):
        root = tmp_path / tier / "ds"
        finals = {
            k: v
            for k, v in (_tree(root) if root.exists() else {}).items()
            if not is_temp_name(k.rsplit("/", 1)[-1])
        }
        for rel, data in finals.items():
            assert rel in refs[tier], f"{tier}: unexpected {rel}"
            assert _sha(data) == expected[rel], f"{tier}: partial {rel} under its final name"
    pfs = tmp_path / "pfs/ds"
    if (pfs / MANIFEST_PATH).exists():
        report = verify_dataset(pfs)
        assert report.ok, f"complete-looking tier copy fails verify: {report.problems}"
        assert _tree(pfs) == refs["pfs"]
    else:
        _refused(pfs)
    # the source is never harmed; a kill mid-record may leave locations.json's temporary,
    # which verify reports and the next stage removes (checked after the re-run)
    problems = verify_dataset(src).problems
    assert all(
        p.kind == "extra" and p.path.startswith(f"{LOCATIONS_PATH.rsplit('/', 1)[0]}/.")
        for p in problems
    ), f"stage harmed the source: {problems}"
    if (src / LOCATIONS_PATH).exists():
        locations = Locations.loads((src / LOCATIONS_PATH).read_bytes())
        for rel, tiers in locations.files.items():
            for tier in tiers:
                if locations.tiers[tier].scope != "shared":
                    continue
                copy = tmp_path / tier / "ds" / rel
                assert copy.is_file() and _sha(copy.read_bytes()) == expected[rel], (
                    f"locations.json lists an unverified copy {tier}:{rel}"
                )
        for name, tier in locations.tiers.items():
            if tier.complete:
                assert verify_dataset(tier.uri).ok, f"{name} marked complete but fails verify"
    return _tier_state(tmp_path, src)


def test_sigkill_stage_never_exposes_partial_copies_and_reruns_byte_identical(
    tmp_path: Path,
) -> None:
    """Kill ``stage`` 2x per round at phases of a timed reference run; a third run must leave
    tier copies and locations.json byte-identical to an uninterrupted stage."""
    src = dataset(tmp_path / "ds", n=200, size=200_000, hot_shards=2)  # ~40 MB, 8 shards
    config = tiers_toml(tmp_path, cold=False)  # pfs: every file; warm: the 2 hot shards
    cmd = [*CLI, "stage", str(src), "--tiers", str(config), "--workers", "2"]
    manifest_bytes = (src / MANIFEST_PATH).read_bytes()
    manifest = json.loads(manifest_bytes)
    expected = {r["path"]: r["sha256"] for r in [*manifest["shards"], *manifest["files"]]}
    expected[MANIFEST_PATH] = _sha(manifest_bytes)
    source_before = _tree(src)

    def reset() -> None:
        shutil.rmtree(tmp_path / "pfs", ignore_errors=True)
        shutil.rmtree(tmp_path / "warm", ignore_errors=True)
        (src / LOCATIONS_PATH).unlink(missing_ok=True)

    probes = _stage_probes(tmp_path, src)
    ref_timeline = timeline(cmd, probes)
    refs = {tier: _tree(tmp_path / tier / "ds") for tier in ("pfs", "warm")}
    ref_locations = (src / LOCATIONS_PATH).read_bytes()
    assert verify_dataset(tmp_path / "pfs/ds").ok and len(refs["warm"]) == 2
    assert _tree(src) == {**source_before, LOCATIONS_PATH: ref_locations}
    windows = ref_timeline.windows(STAGE_PHASES)
    moments = _moments(random.Random("stage"), windows, 2 * STAGE_ROUNDS)
    for r in range(0, STAGE_ROUNDS, 4):  # every 4th fresh run dies writing locations.json
        moments[2 * r] = Moment(LOCATIONS_TMP, LOCATIONS_TMP, 0.0)
    kills: list[tuple[Kill, str]] = []
    for r in range(STAGE_ROUNDS):
        reset()
        for moment in moments[2 * r : 2 * r + 2]:
            kill = kill_at(cmd, moment, probes)
            assert kill.returncode == (0 if kill.exited_first else -9), kill
            kills.append((kill, _check_killed_stage(tmp_path, src, expected, refs)))
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-4000:]
        for tier in ("pfs", "warm"):
            assert _tree(tmp_path / tier / "ds") == refs[tier], f"{tier} differs after re-run"
        assert (src / LOCATIONS_PATH).read_bytes() == ref_locations
        assert _tree(src) == {**source_before, LOCATIONS_PATH: ref_locations}

    _report("stage", kills, STAGE_PHASES, ref_timeline)
    reached = Counter(k.phase(STAGE_PHASES) for k, _ in kills)
    assert len(kills) >= 20
    assert reached["startup"] >= 2 and reached["copy"] >= 2, reached
    assert reached["record"] + reached["exit"] >= 2, reached
    # a resume reuses finished work, so it can end before a window timed on the reference run:
    # some late kills are expected, but most must land
    assert sum(k.exited_first for k, _ in kills) <= len(kills) // 2, "most kills came too late"

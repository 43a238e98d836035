"""Lustre detection, the stripe layout rule, the striping decision and ``lfs setstripe``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from shardfeed.formats.lustre import (
    DEFAULT_STRIPE_SIZE,
    LUSTRE_SUPER_MAGIC,
    FilesystemProbe,
    LustreError,
    find_mount,
    is_lustre,
    lfs_available,
    parse_mounts,
    plan_striping,
    probe_filesystem,
    set_stripe,
    statfs_type,
    stripe_layout,
)
from shardfeed.schemas.errors import ShardfeedError

MiB, GiB = 1 << 20, 1 << 30
EXT4_MAGIC = 0xEF53

MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
61 27 0:50 / /lustre rw,relatime shared:30 - lustre 10.0.0.1@o2ib:/fs rw,flock
62 27 0:51 / /lustre2 rw,relatime - nfs4 server:/export rw
63 61 0:52 / /lustre/scratch\\040space rw,relatime - xfs /dev/sdb rw
"""

PROC_MOUNTS = """\
/dev/vda / ext4 rw,relatime 0 0
10.0.0.1@o2ib:/fs /lustre lustre rw,flock 0 0
"""


def _not_lustre_statfs(path: str) -> int:
    return EXT4_MAGIC


def _table(tmp_path: Path, lines: list[tuple[str, str]], name: str = "mountinfo") -> str:
    """A fake mountinfo file with (mount point, type) entries, in order."""
    text = "".join(
        f"{30 + i} 1 0:{40 + i} / {point} rw,relatime - {fs_type} src{i} rw\n"
        for i, (point, fs_type) in enumerate(lines)
    )
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# --- mount table parsing and longest-prefix matching --------------------------------------------


@pytest.mark.parametrize("text", [MOUNTINFO, PROC_MOUNTS])
def test_parse_mounts_reads_both_formats(text):
    mounts = parse_mounts(text)
    assert ("/", "ext4") in mounts
    assert ("/lustre", "lustre") in mounts


def test_parse_mounts_decodes_octal_escapes_and_skips_junk():
    mounts = parse_mounts(MOUNTINFO + "\n garbage\n1 2 3 4 5 6 -\n")
    assert ("/lustre/scratch space", "xfs") in mounts
    assert len(mounts) == 5


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/lustre", ("/lustre", "lustre")),
        ("/lustre/datasets/laion", ("/lustre", "lustre")),
        ("/lustre2/x", ("/lustre2", "nfs4")),  # a name prefix is not a path prefix
        ("/lustre/scratch space/ds", ("/lustre/scratch space", "xfs")),  # longest wins
        ("/home/user/ds", ("/", "ext4")),
        ("/", ("/", "ext4")),
    ],
)
def test_find_mount_longest_prefix(path, expected):
    assert find_mount(path, parse_mounts(MOUNTINFO)) == expected


def test_find_mount_later_mount_hides_earlier_and_empty_table():
    assert find_mount("/data/x", [("/", "ext4"), ("/data", "ext4"), ("/data", "lustre")]) == (
        "/data",
        "lustre",
    )
    assert find_mount("/data/x", []) is None


# --- detection ---------------------------------------------------------------------------------


def test_mount_type_detection_under_a_lustre_mount(tmp_path):
    root = os.path.realpath(tmp_path)
    (tmp_path / "lustre").mkdir()
    table = _table(tmp_path, [("/", "ext4"), (f"{root}/lustre", "lustre")])
    target = tmp_path / "lustre" / "datasets" / "new"  # does not exist yet

    probe = probe_filesystem(target, mounts_file=table, statfs=_not_lustre_statfs)
    assert probe.lustre and probe.via == "mount type"
    assert probe.mount_point == f"{root}/lustre" and probe.probed == f"{root}/lustre"
    assert is_lustre(str(target), mounts_file=table, statfs=_not_lustre_statfs)
    # the mount point itself, and a path outside it (only "/" ext4 holds it)
    assert is_lustre(str(tmp_path / "lustre"), mounts_file=table, statfs=_not_lustre_statfs)
    outside = probe_filesystem(tmp_path / "elsewhere", mounts_file=table, statfs=_not_lustre_statfs)
    assert not outside.lustre and outside.fs_type == "ext4" and outside.mount_point == "/"


def test_mount_type_detection_reads_proc_mounts_format(tmp_path):
    root = os.path.realpath(tmp_path)
    (tmp_path / "pfs").mkdir()
    table = tmp_path / "mounts"
    table.write_text(f"/dev/vda / ext4 rw 0 0\nmgs@tcp:/fs {root}/pfs lustre rw 0 0\n")
    assert is_lustre(tmp_path / "pfs" / "x", mounts_file=str(table), statfs=_not_lustre_statfs)
    assert not is_lustre(tmp_path / "x", mounts_file=str(table), statfs=_not_lustre_statfs)


def test_longest_prefix_beats_root_and_follows_symlinks(tmp_path):
    root = os.path.realpath(tmp_path)
    (tmp_path / "lustre").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "lustre")
    # "/" is declared lustre and the deeper mount ext4: the deeper one decides
    table = _table(tmp_path, [("/", "lustre"), (f"{root}/lustre", "ext4")])
    assert not is_lustre(tmp_path / "link" / "ds", mounts_file=table, statfs=_not_lustre_statfs)
    assert is_lustre(tmp_path / "other", mounts_file=table, statfs=_not_lustre_statfs)


def test_statfs_magic_alone_detects_lustre(tmp_path):
    table = _table(tmp_path, [("/", "ext4")])
    seen = []

    def fake_statfs(path: str) -> int:
        seen.append(path)
        return LUSTRE_SUPER_MAGIC

    probe = probe_filesystem(tmp_path / "a" / "b", mounts_file=table, statfs=fake_statfs)
    assert probe.lustre and probe.via == "statfs" and probe.magic == 0x0BD00BD0
    assert seen == [os.path.realpath(tmp_path)]  # the nearest existing ancestor


def test_statfs_failure_falls_back_to_the_mount_table(tmp_path):
    root = os.path.realpath(tmp_path)
    table = _table(tmp_path, [("/", "ext4"), (root, "lustre")])

    def broken(path: str) -> int:
        raise OSError("no statfs here")

    probe = probe_filesystem(tmp_path, mounts_file=table, statfs=broken)
    assert probe.lustre and probe.via == "mount type" and probe.magic is None
    assert is_lustre(tmp_path, mounts_file=table, statfs=lambda p: None)
    assert not is_lustre(tmp_path, mounts_file=str(tmp_path / "missing"), statfs=broken)


def test_real_tmp_is_not_lustre():
    assert is_lustre("/tmp") is False
    assert is_lustre("/tmp/shardfeed-does-not-exist/deeper") is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="statfs via ctypes is Linux-only")
def test_real_statfs_reads_f_type(tmp_path):
    magic = statfs_type(str(tmp_path))
    assert isinstance(magic, int) and magic != LUSTRE_SUPER_MAGIC
    stat = shutil.which("stat")
    if stat:  # coreutils prints the same f_type in hex: the struct layout is right
        shown = subprocess.run(
            [stat, "-f", "-c", "%t", str(tmp_path)], capture_output=True, text=True, check=True
        ).stdout.strip()
        assert magic == int(shown, 16)
    assert statfs_type(str(tmp_path / "missing")) is None


def test_lfs_available_searches_the_given_path(tmp_path):
    assert lfs_available(str(tmp_path)) is None
    tool = tmp_path / "lfs"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    assert lfs_available(str(tmp_path)) == str(tool)


# --- the layout rule ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("file_size", "expected_count"),
    [
        (0, 1),
        (200 * MiB, 1),
        (GiB - 1, 1),
        (GiB, 1),
        (GiB + 1, 2),
        (int(3.5 * GiB), 4),
        (16 * GiB, 16),
        (500 * GiB, 16),  # capped
    ],
)
def test_auto_rule(file_size, expected_count):
    assert stripe_layout(file_size, "auto", None) == (expected_count, DEFAULT_STRIPE_SIZE)


def test_auto_never_exceeds_the_number_of_stripe_chunks():
    assert stripe_layout(3 * GiB, "auto", 2 * GiB) == (2, 2 * GiB)
    assert stripe_layout(3 * GiB, "auto", 64 << 10) == (3, 64 << 10)


def test_explicit_and_default_settings():
    assert stripe_layout(10 * GiB, 8, 1 * MiB) == (8, 1 * MiB)
    assert stripe_layout(1, 8, None) == (8, 4 * MiB)  # an explicit count is kept as given
    assert stripe_layout(10 * GiB, None, 8 * MiB) == (0, 8 * MiB)  # 0: the filesystem's count


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ((-1, "auto", None), "file_size"),
        ((1.5, "auto", None), "file_size"),
        ((True, "auto", None), "file_size"),
        ((1, 0, None), "stripe_count"),
        ((1, -1, None), "stripe_count"),
        ((1, 2001, None), "stripe_count"),
        ((1, "wide", None), "stripe_count"),
        ((1, True, None), "stripe_count"),
        ((1, 4, 1000 * 1000), "64 KiB"),
        ((1, 4, 0), "64 KiB"),
        ((1, 4, 4 * GiB), "4 GiB"),
        ((1, 4, float(MiB)), "64 KiB"),
    ],
)
def test_stripe_layout_rejects_bad_arguments(args, needle):
    with pytest.raises(ValueError, match=needle):
        stripe_layout(*args)


# --- the striping decision ---------------------------------------------------------------------


def _probe(lustre: bool, fs_type: str = "lustre", via: str = "mount type"):
    def detect(path: str) -> FilesystemProbe:
        return FilesystemProbe(
            path, path, lustre, via if lustre else "", "/lustre" if lustre else "/", fs_type
        )

    return detect


def test_plan_no_settings_does_not_probe():
    def detect(path: str) -> bool:
        raise AssertionError("no settings: nothing to detect")

    decision = plan_striping("/lustre/ds", None, None, detect=detect)
    assert not decision.enabled and decision.lfs is None
    assert decision.reason == "striping skipped: no stripe settings for this tier"


def test_plan_not_lustre(tmp_path):
    decision = plan_striping("/tmp/x", "auto", None, detect=_probe(False, "ext4"))
    assert not decision.enabled
    assert decision.reason == "striping skipped: /tmp/x is not Lustre (ext4)"
    # the real machine: a tmp dir is never Lustre
    real = plan_striping(str(tmp_path / "tier"), 4, None, lfs="/usr/bin/lfs")
    assert not real.enabled and real.reason.startswith(f"striping skipped: {tmp_path}/tier is not")


def test_plan_lustre_without_lfs(tmp_path):
    decision = plan_striping(
        "/lustre/ds", "auto", None, detect=_probe(True), search_path=str(tmp_path)
    )
    assert not decision.enabled and decision.lfs is None
    assert (
        decision.reason == "striping skipped: Lustre at /lustre via mount type but no lfs on PATH"
    )


def test_plan_lustre_with_lfs():
    decision = plan_striping("/lustre/ds", "auto", None, lfs="/usr/bin/lfs", detect=_probe(True))
    assert decision.enabled and decision.lfs == "/usr/bin/lfs"
    assert decision.reason == (
        "Lustre at /lustre via mount type; lfs at /usr/bin/lfs; stripe count auto, stripe size 4 MiB"
    )


def test_plan_accepts_a_bool_detector_and_finds_lfs_on_path(tmp_path, monkeypatch):
    tool = tmp_path / "lfs"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    decision = plan_striping("/pfs/ds", 8, 1 * MiB, detect=lambda p: True)
    assert decision.enabled and decision.lfs == str(tool)
    assert decision.reason == f"Lustre; lfs at {tool}; stripe count 8, stripe size 1 MiB"
    off = plan_striping("/pfs/ds", 8, None, detect=lambda p: False)
    assert off.reason == "striping skipped: /pfs/ds is not Lustre (not detected)"


def test_plan_rejects_bad_settings_before_probing():
    with pytest.raises(ValueError, match="64 KiB"):
        plan_striping("/lustre/ds", "auto", 1000, detect=_probe(True))


# --- lfs setstripe -----------------------------------------------------------------------------


def _fake_lfs(directory: Path, body: str) -> Path:
    tool = directory / "lfs"
    tool.write_text("#!/bin/sh\n" + body)
    tool.chmod(0o755)
    return tool


def test_set_stripe_runs_lfs_setstripe_and_creates_the_file(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    argv_file = tmp_path / "argv"
    # record one argument per line, then create the last argument (the file), as lfs does
    _fake_lfs(
        bindir,
        f'printf "%s\\n" "$@" > "{argv_file}"\nfor last in "$@"; do :; done\ntouch "$last"\n',
    )
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    lfs = lfs_available()
    assert lfs == str(bindir / "lfs")

    target = tmp_path / "tier" / ".file-000.parquet.tmp-abc"
    target.parent.mkdir()
    set_stripe(str(target), 4, 4 * MiB, lfs)
    assert argv_file.read_text().splitlines() == [
        "setstripe",
        "-c",
        "4",
        "-S",
        str(4 * MiB),
        str(target),
    ]
    assert target.exists() and target.stat().st_size == 0


def test_set_stripe_failure_carries_lfs_stderr(tmp_path, monkeypatch):
    _fake_lfs(
        tmp_path, 'echo "error: setstripe: create stripe file failed: File exists" >&2\nexit 1\n'
    )
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    with pytest.raises(ShardfeedError, match="File exists") as info:
        set_stripe(str(tmp_path / "f"), 2, 1 * MiB, lfs_available())
    assert isinstance(info.value, LustreError)
    assert "exit 1" in str(info.value) and "-c 2 -S 1048576" in str(info.value)


def test_set_stripe_timeout_and_missing_tool(tmp_path):
    slow = _fake_lfs(tmp_path, "sleep 5\n")
    with pytest.raises(LustreError, match="no answer"):
        set_stripe(str(tmp_path / "f"), 1, 1 * MiB, str(slow), timeout=0.2)
    with pytest.raises(LustreError, match="cannot run"):
        set_stripe(str(tmp_path / "f"), 1, 1 * MiB, str(tmp_path / "no-such-lfs"))


def test_set_stripe_validates_and_guards_dash_names(tmp_path, monkeypatch):
    argv_file = tmp_path / "argv"
    tool = _fake_lfs(tmp_path, f'printf "%s\\n" "$@" > "{argv_file}"\n')
    with pytest.raises(ValueError, match="count"):
        set_stripe(str(tmp_path / "f"), 2001, 1 * MiB, str(tool))
    with pytest.raises(ValueError, match="64 KiB"):
        set_stripe(str(tmp_path / "f"), 1, 1000, str(tool))
    assert not argv_file.exists()  # nothing ran
    monkeypatch.chdir(tmp_path)
    set_stripe("-c", 1, 0, str(tool))
    assert argv_file.read_text().splitlines()[-1] == "./-c"


def test_stage_stripes_each_temporary_file_on_lustre(tmp_path, monkeypatch):
    """Staging to a Lustre tier creates every temporary file through lfs before writing it."""
    from staging_fixtures import dataset

    from shardfeed.formats import lustre
    from shardfeed.staging import stage

    src = dataset(tmp_path / "ds", n=60)
    (tmp_path / "tiers.toml").write_text(
        f"""
[tiers.pfs]
path = "{tmp_path}/pfs/{{dataset}}"
scope = "shared"
capacity = "1GB"
read_bandwidth = "1GB/s"
stripe_count = "auto"

[policy]
hot = ["pfs"]
all = ["pfs"]
"""
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = bin_dir / "calls"
    script = bin_dir / "lfs"
    script.write_text(f'#!/bin/sh\necho "$@" >> "{calls}"\ntouch "$6"\n')
    script.chmod(0o755)
    plan = lustre.plan_striping
    monkeypatch.setattr(
        lustre,
        "plan_striping",
        lambda root, count, size, **kw: plan(
            root, count, size, lfs=str(script), detect=lambda p: True
        ),
    )
    report = stage(src, tmp_path / "tiers.toml")
    assert report.striping["pfs"].startswith("Lustre") and "lfs at" in report.striping["pfs"]
    lines = [line.split() for line in calls.read_text().splitlines()]
    staged = report.results[0].copied
    assert len(lines) == staged  # one layout per file copied
    assert all(
        a[:5] == ["setstripe", "-c", "1", "-S", str(4 << 20)] and ".tmp-" in a[5] for a in lines
    )

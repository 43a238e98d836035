"""Lustre awareness for staging: detect a Lustre target and stripe each file by its size.

A shared tier on Lustre reads fastest when large shards are spread over several OSTs (object
storage targets), while small files are best left on one. ``lfs setstripe`` can only set a
file's layout when it creates the file, so the staging copier asks :func:`plan_striping` once
per tier whether striping applies (and prints why or why not), then calls :func:`set_stripe` on
each temporary file before writing into it; the layout survives the rename into place.

Detection (:func:`probe_filesystem`) uses two independent signals, either of which suffices:
the ``statfs(2)`` filesystem magic (``LL_SUPER_MAGIC`` = ``0x0BD00BD0``), read through ctypes on
Linux, and the mount type (``lustre``) of the longest mount point holding the path in
``/proc/self/mountinfo`` (or ``/proc/mounts``). Both are probed on the nearest existing ancestor,
since a tier root is often created by the copy itself. Stdlib only; no Beam.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from shardfeed.schemas.errors import ShardfeedError

__all__ = [
    "AUTO_BYTES_PER_STRIPE",
    "AUTO_MAX_STRIPE_COUNT",
    "DEFAULT_STRIPE_SIZE",
    "LUSTRE_SUPER_MAGIC",
    "FilesystemProbe",
    "LustreError",
    "StripingDecision",
    "find_mount",
    "is_lustre",
    "lfs_available",
    "parse_mounts",
    "plan_striping",
    "probe_filesystem",
    "set_stripe",
    "statfs_type",
    "stripe_layout",
]

LUSTRE_SUPER_MAGIC = 0x0BD00BD0  # statfs f_type of a Lustre client mount (LL_SUPER_MAGIC)
LUSTRE_MOUNT_TYPE = "lustre"
MOUNT_TABLES = ("/proc/self/mountinfo", "/proc/mounts")

STRIPE_SIZE_UNIT = 64 << 10  # 64 KiB: Lustre stripe sizes are multiples of this
MAX_STRIPE_SIZE = 4 << 30  # 4 GiB: stripe sizes must be below this (a 32-bit field)
DEFAULT_STRIPE_SIZE = 4 << 20  # 4 MiB: Lustre's compiled default; suits large sequential reads
MAX_STRIPE_COUNT = 2000  # Lustre's upper bound on stripes per file (LOV_MAX_STRIPE_COUNT)
AUTO_BYTES_PER_STRIPE = 1 << 30  # 1 GiB: "auto" adds one stripe per started GiB ...
AUTO_MAX_STRIPE_COUNT = 16  # ... up to 16 stripes
DEFAULT_LFS_TIMEOUT_S = 60.0  # an MDS under load can be slow; a hung one must not hang staging

_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


class LustreError(ShardfeedError):
    """``lfs setstripe`` failed, timed out, or could not be run."""


# ---------------------------------------------------------------------------------------------
# Detection


def statfs_type(path: str) -> int | None:
    """The ``f_type`` magic of the filesystem holding ``path`` (``statfs(2)`` via ctypes), or
    None when it cannot be read: not Linux, no libc, or the call failed.

    On Linux (x86_64, aarch64 and other glibc/musl ABIs) ``f_type`` is the first member of
    ``struct statfs`` and is a C ``long``. The struct is 120 bytes on 64-bit ABIs; a 512-byte
    buffer leaves room for any variant, so the call never writes past our memory.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        statfs = libc.statfs
        statfs.argtypes = (ctypes.c_char_p, ctypes.c_void_p)
        statfs.restype = ctypes.c_int
        buffer = ctypes.create_string_buffer(512)
        if statfs(os.fsencode(path), buffer) != 0:
            return None
        f_type = ctypes.c_long.from_buffer(buffer).value
    except (OSError, AttributeError, TypeError, ValueError, ctypes.ArgumentError):
        return None
    return f_type & 0xFFFFFFFF  # magics are 32-bit; undo sign extension where `long` is signed


def parse_mounts(text: str) -> list[tuple[str, str]]:
    """``(mount point, filesystem type)`` per line, in file order, from the text of
    ``/proc/self/mountinfo`` or ``/proc/mounts`` (the format is told per line by mountinfo's
    ``-`` separator). Octal escapes in mount points (``\\040`` for a space) are decoded;
    malformed lines are skipped."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if "-" in fields[6:]:  # mountinfo: ID PARENT MAJ:MIN ROOT MOUNT OPTS [TAGS...] - TYPE ...
            separator = fields.index("-", 6)
            if separator + 1 >= len(fields):
                continue
            mount_point, fs_type = fields[4], fields[separator + 1]
        elif len(fields) >= 3:  # mounts: SOURCE MOUNT TYPE OPTS FREQ PASSNO
            mount_point, fs_type = fields[1], fields[2]
        else:
            continue
        mount_point = _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), mount_point)
        mounts.append((mount_point, fs_type))
    return mounts


def find_mount(real_path: str, mounts: Iterable[tuple[str, str]]) -> tuple[str, str] | None:
    """The ``(mount point, type)`` holding ``real_path`` (absolute, symlinks resolved): the
    longest mount point that is the path or a whole-segment prefix of it (``/lustre`` holds
    ``/lustre/x`` but not ``/lustre2``). Among equal mount points the last wins, as a later
    mount hides an earlier one. None when no mount point matches."""
    best: tuple[str, str] | None = None
    for mount_point, fs_type in mounts:
        base = mount_point.rstrip("/")
        inside = real_path == mount_point or real_path.startswith(base + "/")
        if inside and (best is None or len(base) >= len(best[0].rstrip("/"))):
            best = (mount_point, fs_type)
    return best


@dataclass(frozen=True)
class FilesystemProbe:
    """What :func:`probe_filesystem` found for a path.

    ``probed`` is the existing ancestor actually examined (symlinks resolved); ``via`` says
    which signal found Lustre (``"statfs"`` or ``"mount type"``, empty when not Lustre);
    ``mount_point`` and ``fs_type`` come from the mount table and ``magic`` from statfs, each
    None when unavailable.
    """

    path: str
    probed: str
    lustre: bool
    via: str = ""
    mount_point: str | None = None
    fs_type: str | None = None
    magic: int | None = None

    def describe(self) -> str:
        """A short name for the filesystem, for plans: ``ext4``, ``statfs type 0xef53``."""
        if self.fs_type:
            return self.fs_type
        if self.magic is not None:
            return f"statfs type {self.magic:#x}"
        return "unknown filesystem"


def probe_filesystem(
    path: str | os.PathLike[str],
    *,
    mounts_file: str | None = None,
    statfs: Callable[[str], int | None] = statfs_type,
) -> FilesystemProbe:
    """Whether ``path`` (or, when it does not exist yet, its nearest existing ancestor) is on
    Lustre, and how that was decided.

    ``statfs(path) -> magic or None`` defaults to :func:`statfs_type`; any exception it raises
    counts as "unavailable", so detection falls back to the mount table. ``mounts_file`` names
    the mount table to read (default: ``/proc/self/mountinfo``, else ``/proc/mounts``).
    """
    text_path = os.fspath(path)
    probed = _existing_ancestor(os.path.abspath(text_path))
    try:
        magic = statfs(probed)
    except Exception:  # ctypes and OS failures alike: fall back to the mount table
        magic = None
    mount = find_mount(probed, parse_mounts(_read_mount_table(mounts_file)))
    mount_point, fs_type = mount if mount else (None, None)
    if magic is not None and magic & 0xFFFFFFFF == LUSTRE_SUPER_MAGIC:
        via = "statfs"
    elif fs_type == LUSTRE_MOUNT_TYPE:
        via = "mount type"
    else:
        via = ""
    return FilesystemProbe(
        path=text_path,
        probed=probed,
        lustre=bool(via),
        via=via,
        mount_point=mount_point,
        fs_type=fs_type,
        magic=magic,
    )


def is_lustre(
    path: str | os.PathLike[str],
    *,
    mounts_file: str | None = None,
    statfs: Callable[[str], int | None] = statfs_type,
) -> bool:
    """True when the filesystem holding ``path`` (or its nearest existing ancestor) is Lustre,
    by statfs magic or by mount type; see :func:`probe_filesystem`."""
    return probe_filesystem(path, mounts_file=mounts_file, statfs=statfs).lustre


def lfs_available(search_path: str | None = None) -> str | None:
    """The path of the ``lfs`` tool, searched in ``search_path`` (default: ``$PATH``), or None."""
    return shutil.which("lfs", path=search_path)


def _existing_ancestor(path: str) -> str:
    """``path`` itself if it exists, else its nearest existing ancestor; symlinks resolved."""
    current = path
    while not os.path.exists(current):
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return os.path.realpath(current)


def _read_mount_table(mounts_file: str | None) -> str:
    """The mount table's text, or "" when none can be read (not Linux, no /proc)."""
    for candidate in (mounts_file,) if mounts_file else MOUNT_TABLES:
        try:
            with open(candidate, encoding="utf-8", errors="surrogateescape") as handle:
                return handle.read()
        except OSError:
            continue
    return ""


# ---------------------------------------------------------------------------------------------
# Layout


def stripe_layout(
    file_size: int, stripe_count: int | str | None, stripe_size: int | None
) -> tuple[int, int]:
    """The ``(stripe count, stripe size in bytes)`` to create a file of ``file_size`` bytes with.

    ``stripe_size`` defaults to 4 MiB (:data:`DEFAULT_STRIPE_SIZE`) and must be a positive
    multiple of 64 KiB below 4 GiB. ``stripe_count`` is an explicit count (1..2000), None
    (returned as 0: ``lfs setstripe -c 0`` keeps the filesystem's default count), or
    ``"auto"``, which follows the usual Lustre guidance (Lustre wiki "Lustre Striping Best
    Practices"; HPE/Cray "Configuration and Performance Trade-off for Striping"): files under
    1 GiB get 1 stripe, larger ones one stripe per started GiB (ceil(size / 1 GiB)), capped at
    16. The cap, rather than ``-1`` (all OSTs), is deliberate: a training job reads many shards
    at once from many ranks, so the other files already keep the other OSTs busy, and wide
    stripes only add locks, RPCs and exposure to one failed OST. ``"auto"`` also never uses
    more stripes than the file has stripe-size chunks. Bad arguments raise ValueError.
    """
    if isinstance(file_size, bool) or not isinstance(file_size, int) or file_size < 0:
        raise ValueError(f"file_size must be an integer >= 0 bytes, got {file_size!r:.40}")
    size = DEFAULT_STRIPE_SIZE if stripe_size is None else stripe_size
    if (
        isinstance(size, bool)
        or not isinstance(size, int)
        or not 0 < size < MAX_STRIPE_SIZE
        or size % STRIPE_SIZE_UNIT
    ):
        raise ValueError(
            f"stripe_size must be a positive multiple of 64 KiB below 4 GiB, got {size!r:.40}"
        )
    if stripe_count is None:
        return 0, size
    if stripe_count == "auto":
        if file_size < AUTO_BYTES_PER_STRIPE:
            return 1, size
        wanted = min(math.ceil(file_size / AUTO_BYTES_PER_STRIPE), AUTO_MAX_STRIPE_COUNT)
        return max(1, min(wanted, math.ceil(file_size / size))), size
    if (
        isinstance(stripe_count, bool)
        or not isinstance(stripe_count, int)
        or not 1 <= stripe_count <= MAX_STRIPE_COUNT
    ):
        raise ValueError(
            f"stripe_count must be an integer in 1..{MAX_STRIPE_COUNT} or 'auto', "
            f"got {stripe_count!r:.40}"
        )
    return stripe_count, size


# ---------------------------------------------------------------------------------------------
# Plan and apply


@dataclass(frozen=True)
class StripingDecision:
    """Whether staging stripes a tier's files, and why, for the staging plan to print.

    When ``enabled``, ``lfs`` is the tool's path to pass to :func:`set_stripe`.
    """

    enabled: bool
    reason: str
    lfs: str | None = None


def plan_striping(
    target_root: str | os.PathLike[str],
    stripe_count: int | str | None,
    stripe_size: int | None,
    lfs: str | None = None,
    detect: Callable[[str], FilesystemProbe | bool] = probe_filesystem,
    *,
    search_path: str | None = None,
) -> StripingDecision:
    """Decide whether to stripe the files staged under ``target_root``.

    Striping is enabled only when the tier has stripe settings, ``detect`` finds Lustre and an
    ``lfs`` tool exists: ``lfs`` when given, else :func:`lfs_available` on ``search_path``.
    ``detect`` may return a :class:`FilesystemProbe` (the default, whose details go into the
    reason) or a plain bool (e.g. :func:`is_lustre`). Settings are validated first, so a bad
    setting fails the plan (ValueError) rather than the copy.
    """
    root = os.fspath(target_root)
    if stripe_count is None and stripe_size is None:
        return StripingDecision(False, "striping skipped: no stripe settings for this tier")
    stripe_layout(0, stripe_count, stripe_size)  # validate now, not at the first file
    probe = detect(root)
    lustre = probe.lustre if isinstance(probe, FilesystemProbe) else bool(probe)
    if not lustre:
        what = probe.describe() if isinstance(probe, FilesystemProbe) else "not detected"
        return StripingDecision(False, f"striping skipped: {root} is not Lustre ({what})")
    where = "Lustre"
    if isinstance(probe, FilesystemProbe):
        where = f"Lustre at {probe.mount_point or probe.probed} via {probe.via}"
    tool = lfs if lfs is not None else lfs_available(search_path)
    if tool is None:
        return StripingDecision(False, f"striping skipped: {where} but no lfs on PATH")
    settings = _describe_settings(stripe_count, stripe_size)
    return StripingDecision(True, f"{where}; lfs at {tool}; {settings}", tool)


def set_stripe(
    path: str | os.PathLike[str],
    count: int,
    size: int,
    lfs: str,
    *,
    timeout: float = DEFAULT_LFS_TIMEOUT_S,
) -> None:
    """Create the empty file ``path`` with ``count`` stripes of ``size`` bytes by running
    ``lfs setstripe -c COUNT -S SIZE PATH`` (no shell), before anything is written to it.

    Lustre fixes a file's layout when the file is created, so this must come first. The copier
    passes its *temporary* file here, then writes into it (``open(..., "wb")`` truncates an
    empty file without touching its layout) and renames it into place; a rename keeps the
    layout. ``path`` must not exist yet. ``count`` is 0 (filesystem default), -1 (all OSTs) or
    1..2000; ``size`` is 0 (default) or a multiple of 64 KiB below 4 GiB. Raises
    :class:`LustreError` carrying lfs's stderr when it fails, and on a timeout.
    """
    if isinstance(count, bool) or not isinstance(count, int) or not -1 <= count <= MAX_STRIPE_COUNT:
        raise ValueError(f"count must be -1, 0 or 1..{MAX_STRIPE_COUNT}, got {count!r:.40}")
    if (
        isinstance(size, bool)
        or not isinstance(size, int)
        or not 0 <= size < MAX_STRIPE_SIZE
        or size % STRIPE_SIZE_UNIT
    ):
        raise ValueError(f"size must be a multiple of 64 KiB below 4 GiB, got {size!r:.40}")
    target = os.fspath(path)
    if target.startswith("-"):
        target = os.path.join(".", target)  # never let a file name be read as an option
    argv = [lfs, "setstripe", "-c", str(count), "-S", str(size), target]
    try:
        result = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise LustreError(
            f"lfs setstripe -c {count} -S {size} {target}: no answer after {timeout:g} s"
        ) from None
    except OSError as err:
        raise LustreError(f"cannot run {lfs!r} to stripe {target}: {err}") from None
    if result.returncode != 0:
        stderr = result.stderr.decode("utf-8", "replace").strip()[-2000:] or "(no stderr)"
        raise LustreError(
            f"lfs setstripe -c {count} -S {size} {target} failed "
            f"(exit {result.returncode}): {stderr}"
        )


def _describe_settings(stripe_count: int | str | None, stripe_size: int | None) -> str:
    count = "filesystem default" if stripe_count is None else str(stripe_count)
    size = DEFAULT_STRIPE_SIZE if stripe_size is None else stripe_size
    shown = f"{size >> 20} MiB" if size % (1 << 20) == 0 else f"{size >> 10} KiB"
    return f"stripe count {count}, stripe size {shown}"

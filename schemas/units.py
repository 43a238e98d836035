"""Human size strings: decimal units (KB = 10^3) and binary units (KiB = 2^10)."""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "PB": 10**15,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
    "PIB": 2**50,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Parse '100MB', '1.5GiB', '512' (bytes) into an integer byte count."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"size must be >= 0, got {text}")
        return text
    match = _SIZE_RE.match(str(text))
    if not match:
        raise ValueError(
            f"invalid size {text!r}: expected a number with a unit like 100MB or 64MiB"
        )
    number, unit = match.groups()
    factor = _UNITS.get(unit.upper())
    if factor is None:
        raise ValueError(
            f"invalid size unit {unit!r} in {text!r}: use B, KB, MB, GB, TB, PB or KiB, MiB, GiB, TiB, PiB"
        )
    return round(float(number) * factor)


def format_size(num_bytes: int | float) -> str:
    """Format a byte count with binary units, e.g. '95.4 MiB'."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")

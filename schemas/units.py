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


_PERCENT_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$", re.ASCII)


def parse_share(text: str | int) -> float | None:
    """``'10%'`` -> 0.1; None when ``text`` is not a percentage; ValueError beyond 100%."""
    match = _PERCENT_RE.match(text) if isinstance(text, str) else None
    if match is None:
        return None
    share = float(match.group(1)) / 100
    if share > 1:
        raise ValueError(f"{text!r}: a percentage must be within 0..100")
    return share


def parse_size_or_share(text: str | int, total: int) -> int:
    """A size (``'2TB'``, bytes) or a share of ``total`` (``'10%'``), in bytes."""
    share = parse_share(text)
    if share is not None:
        return int(total * share)
    try:
        return parse_size(text)
    except ValueError as err:
        raise ValueError(f"{err} (or a percentage like 10%)") from None


def format_size(num_bytes: int | float) -> str:
    """Format a byte count with binary units, e.g. '95.4 MiB'."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


_BANDWIDTH_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*/\s*s\s*$", re.ASCII)


def parse_bandwidth(text: str | int) -> int:
    """Parse '12GB/s', '400 GB/s', '1.5TiB/s' into integer bytes per second; an int is bytes/s.

    The units are those of :func:`parse_size` (GB = 10^9, GiB = 2^30) followed by ``/s``. The
    prefix letter may be either case, but the ``B`` must be upper case: ``100Gb/s`` is the usual
    spelling of 100 gigabits per second, which is 12.5 GB/s, so a lower-case ``b`` is refused
    rather than read as bytes.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"bandwidth must be >= 0, got {text}")
        return text
    match = _BANDWIDTH_RE.match(str(text))
    if not match:
        raise ValueError(
            f"invalid bandwidth {text!r}: expected a number with a unit like 12GB/s or 1.5TiB/s"
        )
    number, unit = match.groups()
    if unit.endswith("b"):
        raise ValueError(
            f"invalid bandwidth unit {unit!r} in {text!r}: a lower-case 'b' means bits; "
            "write bytes, e.g. 12.5GB/s for 100Gb/s"
        )
    factor = _UNITS.get(unit.upper())
    if factor is None:
        raise ValueError(
            f"invalid bandwidth unit {unit!r} in {text!r}: use B/s, KB/s, MB/s, GB/s, TB/s, PB/s "
            "or KiB/s, MiB/s, GiB/s, TiB/s, PiB/s"
        )
    value = float(number) * factor
    if value != value or value == float("inf"):
        raise ValueError(f"invalid bandwidth {text!r:.60}: the number is too large")
    return round(value)


def format_decimal_size(num_bytes: float) -> str:
    """Format a byte count in decimal units (GB = 10^9) to 4 significant digits, e.g. '3.5 TB'."""
    value = float(num_bytes)
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(value) < 1000 or unit == "PB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.4g} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def format_rate(bytes_per_s: float) -> str:
    """Format a rate in decimal units (GB/s = 10^9 bytes/s), e.g. '390.6 MB/s'."""
    return f"{format_decimal_size(bytes_per_s)}/s"

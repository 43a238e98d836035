"""Human size strings: decimal (KB = 10^3) and binary (KiB = 2^10) units."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardfeed.schemas import format_size, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1KB", 10**3),
        ("1MB", 10**6),
        ("1GB", 10**9),
        ("100MB", 100 * 10**6),
        ("1TB", 10**12),
        ("1PB", 10**15),
        ("1KiB", 2**10),
        ("1MiB", 2**20),
        ("1GiB", 2**30),
        ("64MiB", 64 * 2**20),
        ("1TiB", 2**40),
        ("1PiB", 2**50),
    ],
)
def test_units(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1kb", 10**3), ("1mib", 2**20), ("1GIB", 2**30), (" 5 MB ", 5 * 10**6), ("7 KiB", 7 * 1024)],
)
def test_units_are_case_insensitive_and_allow_spaces(text, expected):
    assert parse_size(text) == expected


def test_decimal_and_binary_units_differ():
    assert parse_size("1KB") == 1000 != parse_size("1KiB") == 1024
    assert parse_size("1GB") < parse_size("1GiB")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (0, 0),
        (512, 512),
        (10**12, 10**12),
        ("0", 0),
        ("512", 512),
        ("512B", 512),
        ("512b", 512),
    ],
)
def test_plain_ints_and_bytes(text, expected):
    result = parse_size(text)
    assert result == expected
    assert type(result) is int


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1.5GiB", 3 * 2**29),
        ("1.5KB", 1500),
        ("0.5MiB", 2**19),
        ("2.25KiB", 2304),
        ("1.001KB", 1001),
        ("0.1KB", 100),
    ],
)
def test_decimals(text, expected):
    result = parse_size(text)
    assert result == expected
    assert type(result) is int


@given(st.integers(min_value=0, max_value=2**50))
def test_integer_strings_are_exact(n):
    assert parse_size(str(n)) == n
    assert parse_size(n) == n


@given(
    st.integers(min_value=0, max_value=10**6),
    st.sampled_from([("KB", 10**3), ("MB", 10**6), ("KiB", 2**10), ("MiB", 2**20), ("GiB", 2**30)]),
)
def test_whole_numbers_times_unit(n, unit):
    name, factor = unit
    assert parse_size(f"{n}{name}") == n * factor


@pytest.mark.parametrize(
    "bad",
    ["abc", "10XB", "-5", "-5MB", -1, "", "MB", "1.5.3GB", "1e3", "10 M B", "0x10", "5MBs", True],
)
def test_invalid_sizes_raise_value_error(bad):
    with pytest.raises(ValueError) as info:
        parse_size(bad)
    assert repr(bad) in str(info.value) or str(bad) in str(info.value)


def test_unknown_unit_error_names_the_unit():
    with pytest.raises(ValueError, match="XB"):
        parse_size("10XB")


@pytest.mark.parametrize(
    ("num_bytes", "expected"),
    [
        (0, "0 B"),
        (1, "1 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (2**20, "1.0 MiB"),
        (100 * 10**6, "95.4 MiB"),
        (3 * 2**29, "1.5 GiB"),
        (2**40, "1.0 TiB"),
        (2**50, "1024.0 TiB"),
    ],
)
def test_format_size(num_bytes, expected):
    assert format_size(num_bytes) == expected


@given(st.integers(min_value=0, max_value=2**45))
def test_format_size_parses_back_within_rounding(n):
    text = format_size(n).replace(" ", "")
    back = parse_size(text)
    # one decimal of a binary unit: at most 0.05 of that unit off
    unit = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}[
        format_size(n).split()[1]
    ]
    assert abs(back - n) <= 0.05 * unit + 1

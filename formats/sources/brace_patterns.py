"""Brace patterns (``shards/train-{000000..000099}.tar``) expanded exactly as the ``braceexpand``
package does, which is what WebDataset uses, with the number of names bounded before any is made.

The rules are braceexpand 0.1.7's (tested against it): comma sequences ``{a,b}``, integer ranges
``{1..10}`` with an optional step ``{1..10..3}``, zero padding when an end is written with a leading
zero (``{07..10}``), letter ranges over ``A-Za-z`` (``{a..c}``, ``{Z..a}``), ranges in either
direction, nesting, a group that is none of these kept with its braces, and backslash escapes
(``\\{`` is a literal brace; escapes are removed from the names, once per level of nesting, as the
package removes them). Unbalanced braces are an error.

Unlike the package, nothing is materialised before the size is known: a pattern is parsed into a
tree whose size is computed arithmetically (a range's length, not its members), so
``{1..999999999999}`` is refused at once instead of filling memory.
"""

from __future__ import annotations

import math
import re
import string
from dataclasses import dataclass
from itertools import product

from shardfeed.schemas.errors import ShardfeedError

MAX_NAMES = 1_000_000  # names one pattern may stand for
MAX_DEPTH = 64  # nested groups
_ALPHABET = string.ascii_uppercase + string.ascii_lowercase
_INT_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)(?:\.\.-?(\d+))?$")
_CHAR_RANGE = re.compile(r"^([A-Za-z])\.\.([A-Za-z])(?:\.\.-?(\d+))?$")
_ESCAPE = re.compile(r"\\(.)")


class BracePatternError(ShardfeedError):
    """A pattern that is unbalanced, nested too deeply, or names too many names."""


class _Refused(Exception):
    """Why a pattern (or a group inside it) cannot be expanded; named with the whole pattern."""


@dataclass(frozen=True)
class _Choice:
    """One position of a pattern: a literal (one value), a range, or a sequence of patterns."""

    values: str | tuple[str, ...] = ()  # literal texts, or a run of letters
    numbers: range | None = None
    width: int = 0  # zero padding of ``numbers``
    patterns: tuple[tuple[_Choice, ...], ...] = ()  # a sequence: each alternative a pattern

    def size(self) -> int:
        if self.numbers is not None:
            return len(self.numbers)
        if self.patterns:
            return sum(_pattern_size(p) for p in self.patterns)
        return len(self.values)

    def names(self) -> list[str]:
        if self.numbers is not None:
            return [f"{i:0{self.width}d}" for i in self.numbers]
        if self.patterns:
            return [name for p in self.patterns for name in _pattern_names(p)]
        return list(self.values)


def expand_braces(pattern: str) -> list[str]:
    """Every name ``pattern`` stands for, in braceexpand's order; raises
    :class:`BracePatternError` for unbalanced braces or more than :data:`MAX_NAMES` names."""
    shown = repr(pattern) if len(pattern) <= 80 else repr(pattern[:80]) + "..."
    try:
        tree = _parse_pattern(pattern, 0)
    except _Refused as err:
        raise BracePatternError(f"brace pattern {shown}: {err}") from None
    total = _pattern_size(tree)
    if total > MAX_NAMES:
        raise BracePatternError(f"brace pattern {shown} names more than {MAX_NAMES:,} shards")
    return _pattern_names(tree)


def _pattern_size(pattern: tuple[_Choice, ...]) -> int:
    return math.prod(choice.size() for choice in pattern)


def _pattern_names(pattern: tuple[_Choice, ...]) -> list[str]:
    """The names of a pattern, escapes removed from each; as in braceexpand, a nested pattern's
    names are unescaped once at their own level and again in every pattern around them."""
    return [
        _ESCAPE.sub(r"\1", "".join(parts))
        for parts in product(*(choice.names() for choice in pattern))
    ]


def _parse_pattern(pattern: str, depth: int) -> tuple[_Choice, ...]:
    if depth > MAX_DEPTH:
        raise _Refused(f"brace groups nested more than {MAX_DEPTH} deep")
    start = pos = level = 0
    items: list[_Choice] = []
    while pos < len(pattern):
        char = pattern[pos]
        if char == "\\":
            pos += 2
            continue
        if char == "{":
            if level == 0 and pos > start:
                items.append(_Choice(values=(pattern[start:pos],)))
                start = pos
            level += 1
        elif char == "}":
            level -= 1
            if level == 0:
                expr = pattern[start + 1 : pos]
                item = _parse_expression(expr, depth + 1)
                if item is None:  # not a range or a sequence: the braces stay
                    inner = _Choice(patterns=(_parse_pattern(expr, depth + 1),))
                    items += [_Choice(values=("{",)), inner, _Choice(values=("}",))]
                else:
                    items.append(item)
                start = pos + 1
        pos += 1
    if level != 0:
        raise _Refused("unbalanced braces")
    if start < pos:
        items.append(_Choice(values=(pattern[start:],)))
    return tuple(items)


def _parse_expression(expr: str, depth: int) -> _Choice | None:
    match = _INT_RANGE.match(expr)
    if match is not None:
        return _int_range(*match.groups())
    match = _CHAR_RANGE.match(expr)
    if match is not None:
        return _char_range(*match.groups())
    return _parse_sequence(expr, depth)


def _parse_sequence(seq: str, depth: int) -> _Choice | None:
    start = pos = level = 0
    parts: list[str] = []
    while pos < len(seq):
        char = seq[pos]
        if char == "\\":
            pos += 2
            continue
        if char == "{":
            level += 1
        elif char == "}":
            level -= 1
        elif char == "," and level == 0:
            parts.append(seq[start:pos])
            start = pos + 1
        pos += 1
    if level != 0 or not parts:
        return None
    parts.append(seq[start:])
    return _Choice(patterns=tuple(_parse_pattern(part, depth) for part in parts))


def _int_range(first: str, last: str, step: str | None) -> _Choice:
    padded = any(s.startswith(("0", "-0")) for s in (first, last) if s not in ("0", "-0"))
    width = max(len(first), len(last)) if padded else 0
    by = (int(step) or 1) if step else 1
    a, b = int(first), int(last)
    numbers = range(a, b + 1, by) if a < b else range(a, b - 1, -by)
    return _Choice(numbers=numbers, width=width)


def _char_range(first: str, last: str, step: str | None) -> _Choice:
    by = (int(step) or 1) if step else 1
    a, b = _ALPHABET.index(first), _ALPHABET.index(last)
    if a < b:
        return _Choice(values=_ALPHABET[a : b + 1 : by])
    b = b or -len(_ALPHABET)
    return _Choice(values=_ALPHABET[a : b - 1 : -by])

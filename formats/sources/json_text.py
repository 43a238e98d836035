"""Strict JSON in, canonical JSON out: the one JSON dialect every source uses.

Sources that keep nested values as text (``"encoding": "json"`` string features) write them
with :data:`CANONICAL` (sorted keys, no whitespace, UTF-8 kept, no NaN or Infinity), so equal
values give equal bytes whichever source they came from; :data:`STRICT` parses input JSON and
refuses the NaN/Infinity constants Python's ``json`` would otherwise accept.
"""

from __future__ import annotations

import json
from typing import Any

#: keyword options of the canonical encoder (a caller adding ``default=`` reuses them)
CANONICAL_OPTIONS: dict[str, Any] = {
    "sort_keys": True,
    "ensure_ascii": False,
    "separators": (",", ":"),
    "allow_nan": False,
}


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


STRICT = json.JSONDecoder(parse_constant=_refuse_constant)
CANONICAL = json.JSONEncoder(**CANONICAL_OPTIONS)

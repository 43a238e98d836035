"""The storage tier config: a TOML file naming the tiers a dataset is staged to and read from.

```toml
[tiers.nvme]
path = "/local/nvme/{dataset}"      # absolute local path template, or an object-store URI
scope = "node"                      # "node": one copy per node; "shared": one for the cluster
capacity = "3.5TB"                  # per node for a node tier, in total for a shared tier
read_bandwidth = "12GB/s"           # per node for a node tier, aggregate for a shared tier

[tiers.pfs]
path = "/lustre/datasets/{dataset}"
scope = "shared"
capacity = "2PB"
read_bandwidth = "400GB/s"
stripe_count = "auto"               # Lustre only: an integer >= 1 or "auto"
# stripe_size = "4MiB"              # Lustre only: a multiple of 64 KiB

[policy]
hot = ["nvme", "pfs"]               # hot shards go to these tiers
all = ["pfs", "cold"]               # every shard goes to these tiers
```

``{dataset}`` is the only placeholder; it stands for the dataset directory's name and must be a
single safe path segment (:meth:`Tier.location`). A template may not escape its root: no ``.``,
``..`` or empty segments, also not percent-encoded (``%2e%2e``), no backslash, NUL or control
characters, no ``?`` or ``#`` in URIs, and no placeholder in the bucket. Sizes use
:func:`~shardfeed.schemas.units.parse_size` (GB = 10^9, GiB = 2^30) and bandwidths
:func:`~shardfeed.schemas.units.parse_bandwidth` (``12GB/s``). Unknown keys are refused, so a typo
never silently drops a setting. Every problem raises :class:`SchemaError` naming the field.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardfeed.schemas._strict import get, require_object
from shardfeed.schemas.errors import SchemaError
from shardfeed.schemas.paths import percent_decodings
from shardfeed.schemas.units import parse_bandwidth, parse_size

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

SCOPES = ("node", "shared")
#: shard classes a policy maps to tiers: the hot set, and every shard
SHARD_CLASSES = ("hot", "all")
#: object-store schemes a tier path may use (pyarrow filesystems)
URI_SCHEMES = ("s3", "gs", "gcs", "hdfs", "abfs", "abfss")
PLACEHOLDER = "{dataset}"
STRIPE_SIZE_UNIT = 64 * 1024  # 64 KiB: Lustre stripe sizes are multiples of this
MAX_PATH_CHARS = 4096
MAX_CONFIG_BYTES = 1 << 20  # 1 MiB: a tier config is a few hundred bytes
_TIER_KEYS = ("path", "scope", "capacity", "read_bandwidth", "stripe_count", "stripe_size")
_TIER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", re.ASCII)
_BUCKET = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}", re.ASCII)
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://(.*)", re.ASCII | re.DOTALL)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _check_segments(path: str, text: str, field: str) -> None:
    """Refuse '.', '..' and empty segments, backslashes, NUL and control characters in ``path``
    and in its percent-decoded forms; ``text`` is the whole template, for the message."""
    for form in percent_decodings(path):
        if _CONTROL.search(form) or "\\" in form:
            raise SchemaError(field, f"{text!r:.80} contains a backslash or control character")
        for segment in form.split("/"):
            if segment in ("", ".", ".."):
                raise SchemaError(
                    field,
                    f"{text!r:.80} escapes its root or is not normalised "
                    "('..', '.', '//' or a trailing '/', also percent-encoded)",
                )


def _check_placeholders(text: str, field: str) -> None:
    rest = text.replace(PLACEHOLDER, "")
    if "{" in rest or "}" in rest:
        raise SchemaError(
            field, f"{text!r:.80} has a placeholder other than {PLACEHOLDER} (the only one)"
        )


def check_path_template(text: Any, field: str) -> str:
    """Return ``text`` if it is a safe tier path template, else raise SchemaError.

    A template is an absolute POSIX path (``/local/nvme/{dataset}``) or a URI with a scheme from
    :data:`URI_SCHEMES`, a bucket and a key prefix (``s3://bucket/datasets/{dataset}``).
    """
    if not isinstance(text, str):
        raise SchemaError(field, f"expected string, got {type(text).__name__}")
    if not text:
        raise SchemaError(field, "must not be empty")
    if len(text) > MAX_PATH_CHARS:
        raise SchemaError(field, f"is {len(text)} characters long (at most {MAX_PATH_CHARS})")
    _check_placeholders(text, field)
    uri = _SCHEME.fullmatch(text)
    if uri is None:
        if not text.startswith("/") or text.startswith("//"):
            raise SchemaError(
                field,
                f"{text!r:.80} is neither an absolute local path ('/local/nvme/{{dataset}}') "
                f"nor a URI with a scheme of {', '.join(URI_SCHEMES)}",
            )
        _check_segments(text[1:], text, field)
        return text
    scheme, rest = uri.groups()
    if scheme not in URI_SCHEMES:
        raise SchemaError(
            field,
            f"URI scheme {scheme!r:.20} is not supported; use one of {', '.join(URI_SCHEMES)}",
        )
    bucket, slash, key = rest.partition("/")
    if not _BUCKET.fullmatch(bucket) or ".." in bucket:
        raise SchemaError(
            field,
            f"{text!r:.80}: bucket {bucket!r:.40} must be 1-255 of A-Z a-z 0-9 . _ - "
            "(no placeholder, user, port or '..')",
        )
    if any(c in rest for c in "?#@"):
        raise SchemaError(field, f"{text!r:.80}: a tier URI may not contain '?', '#' or '@'")
    if slash:
        _check_segments(key, text, field)
    return text


def check_dataset_name(name: Any, field: str = "dataset") -> str:
    """A dataset name for ``{dataset}``: one path segment that cannot escape or be re-decoded."""
    if not isinstance(name, str) or not name:
        raise SchemaError(field, "the dataset name must be a non-empty string")
    if len(name) > 255:
        raise SchemaError(field, f"the dataset name is {len(name)} characters long (at most 255)")
    if name in (".", "..") or any(c in name for c in "/\\%{}?#") or _CONTROL.search(name):
        raise SchemaError(
            field,
            f"{name!r:.80} is not a usable dataset name: it must be one path segment, not '.' "
            "or '..', without / \\ % { } ? # or control characters",
        )
    return name


def _size(obj: dict[str, Any], key: str, where: str) -> int:
    field = f"{where}.{key}"
    value = get(obj, key, (str, int), where)
    try:
        size = parse_size(value)
    except (ValueError, OverflowError) as err:
        raise SchemaError(field, str(err)[:200]) from None
    if size <= 0:
        raise SchemaError(field, f"must be > 0, got {value!r:.40}")
    return size


def _bandwidth(obj: dict[str, Any], key: str, where: str) -> int:
    field = f"{where}.{key}"
    value = get(obj, key, (str, int), where)
    try:
        rate = parse_bandwidth(value)
    except (ValueError, OverflowError) as err:
        raise SchemaError(field, str(err)[:200]) from None
    if rate <= 0:
        raise SchemaError(field, f"must be > 0, got {value!r:.40}")
    return rate


def _tier_name(name: Any, field: str) -> str:
    if not isinstance(name, str) or not _TIER_NAME.fullmatch(name):
        raise SchemaError(
            field, f"tier name {name!r:.40} must be 1-64 of A-Z a-z 0-9 _ -, starting alphanumeric"
        )
    return name


def _refuse_unknown(obj: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(str(k)[:64] or '""' for k in obj if k not in allowed)
    if unknown:
        field = f"{where}.{unknown[0]}" if where else unknown[0]
        raise SchemaError(field, f"unknown key; allowed here: {', '.join(allowed)}")


@dataclass(frozen=True)
class Tier:
    """One storage tier.

    ``capacity`` is bytes and ``read_bandwidth`` bytes per second, both *per node* for a
    ``node`` tier (each node has its own NVMe) and for the whole cluster for a ``shared`` tier.
    ``stripe_count`` (an int or ``"auto"``) and ``stripe_size`` (bytes) are Lustre layout hints
    for a shared local tier; None when not given.
    """

    name: str
    path: str
    scope: str
    capacity: int
    read_bandwidth: int
    stripe_count: int | str | None = None
    stripe_size: int | None = None

    def __post_init__(self) -> None:
        where = f"tiers.{self.name}"
        _tier_name(self.name, where)
        check_path_template(self.path, f"{where}.path")
        if self.scope not in SCOPES:
            raise SchemaError(f"{where}.scope", f"expected one of {SCOPES}, got {self.scope!r:.40}")
        for key in ("capacity", "read_bandwidth"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise SchemaError(
                    f"{where}.{key}", f"must be a positive integer, got {value!r:.40}"
                )
        striped = self.stripe_count is not None or self.stripe_size is not None
        if striped and (self.scope != "shared" or self.is_uri):
            raise SchemaError(
                f"{where}.stripe_count"
                if self.stripe_count is not None
                else f"{where}.stripe_size",
                "stripe settings apply only to a shared tier on a local (Lustre) path",
            )
        if self.stripe_count is not None and self.stripe_count != "auto":
            count = self.stripe_count
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise SchemaError(
                    f"{where}.stripe_count",
                    f"expected an integer >= 1 or 'auto', got {count!r:.40}",
                )
        if self.stripe_size is not None and (
            isinstance(self.stripe_size, bool)
            or not isinstance(self.stripe_size, int)
            or self.stripe_size <= 0
            or self.stripe_size % STRIPE_SIZE_UNIT
        ):
            raise SchemaError(
                f"{where}.stripe_size",
                f"must be a positive multiple of 64 KiB (Lustre), got {self.stripe_size!r:.40}",
            )

    @property
    def is_uri(self) -> bool:
        """True for an object-store URI, False for a local path."""
        return "://" in self.path

    @property
    def is_node(self) -> bool:
        return self.scope == "node"

    def location(self, dataset: str) -> str:
        """The tier path for a dataset: ``{dataset}`` replaced by ``dataset``, a single safe
        path segment (no ``/``, ``..``, ``%`` or braces), so the result stays under the root."""
        name = check_dataset_name(dataset)
        result = self.path.replace(PLACEHOLDER, name)
        check_path_template(result, f"tiers.{self.name}.path")
        return result

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "path": self.path,
            "scope": self.scope,
            "capacity": self.capacity,
            "read_bandwidth": self.read_bandwidth,
        }
        if self.stripe_count is not None:
            out["stripe_count"] = self.stripe_count
        if self.stripe_size is not None:
            out["stripe_size"] = self.stripe_size
        return out

    @classmethod
    def from_dict(cls, name: Any, obj: Any) -> Tier:
        """Parse ``[tiers.NAME]``: sizes and bandwidths as strings (``"3.5TB"``, ``"12GB/s"``)
        or integers (bytes, bytes/s)."""
        where = f"tiers.{name}"
        _tier_name(name, where)
        obj = require_object(obj, where)
        _refuse_unknown(obj, _TIER_KEYS, where)
        stripe_count = get(obj, "stripe_count", (int, str), where, optional=True)
        if isinstance(stripe_count, str) and stripe_count != "auto":
            raise SchemaError(
                f"{where}.stripe_count",
                f"expected an integer >= 1 or 'auto', got {stripe_count!r:.40}",
            )
        return cls(
            name=name,
            path=check_path_template(get(obj, "path", str, where), f"{where}.path"),
            scope=get(obj, "scope", str, where),
            capacity=_size(obj, "capacity", where),
            read_bandwidth=_bandwidth(obj, "read_bandwidth", where),
            stripe_count=stripe_count,
            stripe_size=_size(obj, "stripe_size", where) if "stripe_size" in obj else None,
        )


@dataclass(frozen=True)
class TierPolicy:
    """Which tiers each shard class goes to, in order: ``hot`` (the hot set's shards, may be
    empty) and ``all`` (every shard; at least one tier). Reads of a shard not cached on the node
    go to the first shared tier of ``all``."""

    hot: tuple[str, ...]
    all: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"hot": list(self.hot), "all": list(self.all)}

    @classmethod
    def from_dict(cls, obj: Any, tiers: Mapping[str, Tier]) -> TierPolicy:
        obj = require_object(obj, "policy")
        _refuse_unknown(obj, SHARD_CLASSES, "policy")
        lists = {}
        for key in SHARD_CLASSES:
            names = get(obj, key, list, "policy", optional=key == "hot", default=[])
            seen: list[str] = []
            for i, name in enumerate(names):
                field = f"policy.{key}[{i}]"
                if not isinstance(name, str):
                    raise SchemaError(field, f"expected a tier name, got {type(name).__name__}")
                if name not in tiers:
                    raise SchemaError(
                        field,
                        f"unknown tier {name!r:.40}; declared tiers: {', '.join(tiers) or 'none'}",
                    )
                if name in seen:
                    raise SchemaError(field, f"tier {name!r} is listed twice")
                seen.append(name)
            lists[key] = tuple(seen)
        if not lists["all"]:
            raise SchemaError("policy.all", "must name at least one tier (every shard goes there)")
        return cls(hot=lists["hot"], all=lists["all"])


@dataclass(frozen=True)
class TierConfig:
    """A parsed tier config: the tiers in file order and the policy."""

    tiers: tuple[Tier, ...]
    policy: TierPolicy

    def __post_init__(self) -> None:
        names = [t.name for t in self.tiers]
        if len(set(names)) != len(names):
            raise SchemaError("tiers", f"tier names must be unique: {names}")
        for key in SHARD_CLASSES:
            for i, name in enumerate(getattr(self.policy, key)):
                if name not in names:
                    raise SchemaError(f"policy.{key}[{i}]", f"unknown tier {name!r:.40}")

    def tier(self, name: str) -> Tier:
        for tier in self.tiers:
            if tier.name == name:
                return tier
        raise KeyError(f"unknown tier {name!r}; declared tiers: {', '.join(self.names)}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tiers)

    @property
    def node_tier(self) -> Tier | None:
        """The node-local cache tier: the first node-scope tier in ``policy.hot``, else in
        ``policy.all``; None when the policy puts no shard on a node tier."""
        for name in (*self.policy.hot, *self.policy.all):
            if self.tier(name).is_node:
                return self.tier(name)
        return None

    @property
    def read_tier(self) -> Tier | None:
        """The shared tier that serves reads a node cache misses: the first shared tier in
        ``policy.all``; None when every tier of ``all`` is node-local."""
        for name in self.policy.all:
            if not self.tier(name).is_node:
                return self.tier(name)
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "tiers": {t.name: t.to_json() for t in self.tiers},
            "policy": self.policy.to_json(),
        }

    @classmethod
    def from_dict(cls, obj: Any) -> TierConfig:
        """Parse the decoded TOML document (a dict), strictly."""
        obj = require_object(obj, "")
        _refuse_unknown(obj, ("tiers", "policy"), "")
        declared = get(obj, "tiers", dict, "")
        if not declared:
            raise SchemaError("tiers", "declare at least one tier, e.g. [tiers.pfs]")
        tiers = {name: Tier.from_dict(name, spec) for name, spec in declared.items()}
        policy = TierPolicy.from_dict(get(obj, "policy", dict, ""), tiers)
        return cls(tiers=tuple(tiers.values()), policy=policy)

    @classmethod
    def loads(cls, text: str | bytes, source: str = "<tiers>") -> TierConfig:
        """Parse TOML text; every problem is a SchemaError attributed to ``source``."""
        try:
            if len(text) > MAX_CONFIG_BYTES:
                raise SchemaError("<root>", f"{len(text)} bytes is too large for a tier config")
            if isinstance(text, bytes):
                text = text.decode("utf-8")
            document = tomllib.loads(text)
        except SchemaError as err:
            raise err.with_source(source) from None
        except (ValueError, UnicodeDecodeError, RecursionError) as err:
            # tomllib.TOMLDecodeError is a ValueError
            raise SchemaError("<root>", f"not valid TOML ({err})", source=source) from None
        try:
            return cls.from_dict(document)
        except SchemaError as err:
            raise err.with_source(source) from None


def load_tier_config(path: str | os.PathLike[str]) -> TierConfig:
    """Read and parse a tier config file (TOML); OSError if it cannot be read."""
    with open(path, "rb") as handle:
        data = handle.read(MAX_CONFIG_BYTES + 1)
    return TierConfig.loads(data, source=os.fspath(path))

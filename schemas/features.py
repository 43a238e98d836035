"""Feature spec: LeRobot-style feature dicts and their Arrow column types.

A feature is ``{"dtype", "shape", "names", ...}`` as in LeRobot's ``meta/info.json``. dtypes are numpy
numeric names, ``bool``, ``string``, ``image`` (encoded bytes) and ``video`` (frames live in MP4 files
under ``videos/``; the data files hold no column for them, as in LeRobot). Numeric features of shape
``[1]`` are scalar columns; any other shape is a fixed-size list of the primitive type, row-major, so a
batch becomes an ``(N, *shape)`` numpy array without copying.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from shardfeed.schemas._strict import get, require_object
from shardfeed.schemas.errors import SchemaError

NUMERIC_DTYPES: dict[str, pa.DataType] = {
    "bool": pa.bool_(),
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "uint8": pa.uint8(),
    "uint16": pa.uint16(),
    "uint32": pa.uint32(),
    "uint64": pa.uint64(),
    "float16": pa.float16(),
    "float32": pa.float32(),
    "float64": pa.float64(),
}
MEDIA_DTYPES = ("image", "video")
#: values in one sample of a numeric feature: Arrow's fixed-size list length is an int32
MAX_ELEMENTS = 2**31 - 1
ALL_DTYPES = (*NUMERIC_DTYPES, "string", *MEDIA_DTYPES)

#: Arrow type of an ``image`` column: the Hugging Face ``datasets.Image`` storage, which LeRobot reads.
IMAGE_ARROW_TYPE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


@dataclass(frozen=True)
class Feature:
    """One named feature; ``extra`` keeps LeRobot keys such as ``info`` and ``fps`` verbatim."""

    name: str
    dtype: str
    shape: tuple[int, ...] = (1,)
    names: Any = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        where = f"features.{self.name}"
        if not self.name:
            raise SchemaError("features", "feature names must be non-empty")
        if self.dtype not in ALL_DTYPES:
            raise SchemaError(
                f"{where}.dtype", f"unknown dtype {self.dtype!r}; expected one of {ALL_DTYPES}"
            )
        if any((not isinstance(d, int)) or isinstance(d, bool) or d < 0 for d in self.shape):
            raise SchemaError(
                f"{where}.shape",
                f"dimensions must be non-negative integers, got {list(self.shape)!r:.80}",
            )
        if self.dtype in NUMERIC_DTYPES and math.prod(self.shape) > MAX_ELEMENTS:
            # a tensor is a fixed-size list, whose length Arrow holds in an int32
            raise SchemaError(
                f"{where}.shape",
                f"{list(self.shape)!r:.80} holds more than {MAX_ELEMENTS} values per sample",
            )
        if self.dtype in NUMERIC_DTYPES and not self.shape:
            raise SchemaError(
                f"{where}.shape", "numeric features need a shape; use [1] for a scalar"
            )

    @property
    def is_numeric(self) -> bool:
        return self.dtype in NUMERIC_DTYPES

    @property
    def is_scalar(self) -> bool:
        return tuple(self.shape) == (1,)

    @property
    def is_tensor(self) -> bool:
        """A numeric feature stored as a fixed-size list (anything but shape [1])."""
        return self.is_numeric and not self.is_scalar

    @property
    def stored(self) -> bool:
        """Whether the data files hold a column for this feature (videos live in MP4s)."""
        return self.dtype != "video"

    @property
    def num_elements(self) -> int:
        return math.prod(self.shape)

    @property
    def arrow_type(self) -> pa.DataType:
        if self.dtype == "video":
            raise SchemaError(f"features.{self.name}", "video features have no data column")
        if self.dtype == "string":
            return pa.string()
        if self.dtype == "image":
            return IMAGE_ARROW_TYPE
        if self.is_scalar:
            return NUMERIC_DTYPES[self.dtype]
        # one fixed-size list level per dimension, outermost first: Hugging Face datasets (so
        # LeRobot) stores a 2-D feature as Array2D, list<list<...>>, and casts only from nested lists
        atype = NUMERIC_DTYPES[self.dtype]
        for size in reversed(self.shape):
            atype = pa.list_(atype, size)
        return atype

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"dtype": self.dtype, "shape": list(self.shape), "names": self.names}
        out.update(self.extra)
        return out

    @classmethod
    def from_json(cls, name: str, obj: Any) -> Feature:
        where = f"features.{name}"
        obj = require_object(obj, where)
        dtype = get(obj, "dtype", str, where)
        shape = get(obj, "shape", list, where)
        for i, dim in enumerate(shape):
            get({str(i): dim}, str(i), int, f"{where}.shape")
        names = obj.get("names")
        extra = {k: v for k, v in obj.items() if k not in ("dtype", "shape", "names")}
        return cls(name=name, dtype=dtype, shape=tuple(shape), names=names, extra=extra)


@dataclass(frozen=True)
class FeatureSpec:
    """An ordered set of features; the order is the column order of every shard."""

    features: tuple[Feature, ...]

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for feat in self.features:
            if feat.name in seen:
                raise SchemaError(f"features.{feat.name}", "duplicate feature name")
            seen.add(feat.name)

    @classmethod
    def of(cls, features: Iterable[Feature] | Mapping[str, Any]) -> FeatureSpec:
        """Build from Feature objects or from a LeRobot ``features`` dict."""
        if isinstance(features, Mapping):
            return cls.from_json(features)
        return cls(tuple(features))

    @classmethod
    def from_json(cls, obj: Any, where: str = "features") -> FeatureSpec:
        obj = require_object(obj, where)
        return cls(tuple(Feature.from_json(name, value) for name, value in obj.items()))

    def to_json(self) -> dict[str, Any]:
        return {f.name: f.to_json() for f in self.features}

    def __iter__(self):
        return iter(self.features)

    def __len__(self) -> int:
        return len(self.features)

    def __getitem__(self, name: str) -> Feature:
        for feat in self.features:
            if feat.name == name:
                return feat
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        return any(f.name == name for f in self.features)

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.features]

    @property
    def stored(self) -> list[Feature]:
        return [f for f in self.features if f.stored]

    def arrow_schema(self) -> pa.Schema:
        """The shard schema: one column per stored feature, in spec order, no metadata."""
        return pa.schema([pa.field(f.name, f.arrow_type, nullable=True) for f in self.stored])


def feature_from_arrow(
    name: str, arrow_type: pa.DataType, shape: tuple[int, ...] | None = None
) -> Feature:
    """Infer a Feature from an Arrow column type: nested fixed-size lists become tensors of their
    dimensions, or of ``shape`` when it holds as many values (a flat list reshaped)."""
    for dtype, atype in NUMERIC_DTYPES.items():
        if arrow_type == atype:
            return Feature(name, dtype, (1,))
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return Feature(name, "string", (1,))
    if arrow_type == IMAGE_ARROW_TYPE:
        return Feature(name, "image", tuple(shape or ()))
    if pa.types.is_fixed_size_list(arrow_type):
        found: list[int] = []  # nested fixed-size lists: one dimension per level
        leaf = arrow_type
        while pa.types.is_fixed_size_list(leaf):
            found.append(leaf.list_size)
            leaf = leaf.value_type
        inner = feature_from_arrow(name, leaf)
        if not inner.is_numeric:
            raise SchemaError(f"features.{name}", f"fixed-size list of {leaf} is not a tensor")
        dims = tuple(shape or found)
        if math.prod(dims) != math.prod(found):
            raise SchemaError(
                f"features.{name}.shape",
                f"{list(dims)} does not hold {math.prod(found)} values",
            )
        return Feature(name, inner.dtype, dims)
    raise SchemaError(f"features.{name}", f"no shardfeed dtype for Arrow type {arrow_type}")

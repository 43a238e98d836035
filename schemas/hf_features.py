"""Hugging Face ``datasets`` features for a FeatureSpec: the ``huggingface`` schema metadata of a shard.

``datasets`` builds a Parquet file's features with ``Features.from_arrow_schema``: it reads the
Arrow schema's metadata key ``huggingface``, JSON ``{"info": {"features": {name: feature}}}``, and
takes a declared feature only when its Arrow type equals the column's exactly; any other column is
inferred from its Arrow type (an image is then a plain ``{bytes, path}`` struct, a label a bare
int). Each feature is a dict with a ``_type`` key, the form ``Features.from_dict`` reads:

- ``image`` -> ``Image()``: ``struct<bytes: binary, path: string>``, decoded to PIL by ``datasets``;
- an ``int64`` scalar with class names -> ``ClassLabel(names=...)``: ``int64``;
- any other numeric or ``bool`` scalar (shape ``[1]``) -> ``Value(dtype)``: the primitive;
- a numeric or ``bool`` tensor of shape ``[d0, d1, ...]`` -> ``Sequence(Sequence(Value(dtype),
  length=d1), length=d0)``, one level per dimension: one fixed-size list per dimension;
- ``string`` -> ``Value("string")``: ``string``;
- ``video``: no column, nothing declared.

- **Class names.** An ``int64`` scalar is a ``ClassLabel`` when its ``names`` is a list of at least
  two distinct strings and the data is not episodic (no ``episode_index`` feature): the image-folder
  source's ``label``. LeRobot's ``names`` name a tensor's elements, and LeRobot reads every scalar as
  a ``Value``, so episodic data never gets a ``ClassLabel``, nor does a scalar with one name.
- **Tensors** are ``Sequence`` with a ``length``, nested one level per dimension, since that is
  what a nested fixed-size list is to ``datasets`` (``List`` since datasets 4.0, which still
  reads ``Sequence``; datasets 2 and 3 know only ``Sequence``). LeRobot declares a 2-D feature as
  ``Array2D``, an extension type over variable-size lists that the column does not hold; LeRobot
  passes its own features when it loads, so the two never meet, and a plain ``load_dataset``
  gets the shape from the nesting.
- **Deterministic bytes.** Compact JSON with sorted keys and no timestamps: every shard of a
  dataset, on every runner, carries the same value.
"""

from __future__ import annotations

import json
from typing import Any

from shardfeed.schemas.features import Feature, FeatureSpec

#: the schema metadata key ``datasets`` reads (``datasets.arrow_writer``, ``Features.from_arrow_schema``)
HF_METADATA_KEY = b"huggingface"


def hf_feature(feature: Feature, episodic: bool = False) -> dict[str, Any] | None:
    """The ``datasets`` feature dict of one stored feature (``_type`` as ``Features.from_dict``
    reads it), or None for a feature with no column (``video``)."""
    if not feature.stored:
        return None
    if feature.dtype == "image":
        return {"_type": "Image"}
    if feature.dtype == "string":
        return {"_type": "Value", "dtype": "string"}
    if feature.is_scalar:
        if not episodic and _class_names(feature) is not None:
            return {"_type": "ClassLabel", "names": list(feature.names)}
        return {"_type": "Value", "dtype": feature.dtype}
    out: dict[str, Any] = {"_type": "Value", "dtype": feature.dtype}
    for size in reversed(feature.shape):  # outermost dimension last: the outermost list
        out = {"_type": "Sequence", "feature": out, "length": size}
    return out


def hf_features(spec: FeatureSpec) -> dict[str, dict[str, Any]]:
    """``{name: feature dict}`` for every stored feature, in spec (column) order."""
    episodic = "episode_index" in spec
    out = {}
    for feature in spec.stored:
        declared = hf_feature(feature, episodic)
        if declared is not None:
            out[feature.name] = declared
    return out


def hf_schema_metadata(spec: FeatureSpec) -> dict[bytes, bytes]:
    """``{b"huggingface": JSON}``: the schema metadata that makes ``datasets`` read a shard of
    ``spec`` with its features (compact, sorted keys, UTF-8)."""
    document = {"info": {"features": hf_features(spec)}}
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return {HF_METADATA_KEY: text.encode("utf-8")}


def _class_names(feature: Feature) -> list[str] | None:
    names = feature.names
    if feature.dtype != "int64" or not isinstance(names, list) or len(names) < 2:
        return None
    if not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        return None
    return names

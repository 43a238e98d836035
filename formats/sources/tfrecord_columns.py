"""A decoded batch of ``tf.train.Example`` records (``formats/tf_example_batch.py``) counted for
schema inference and typed to a feature spec, column by column.

Both give exactly what the per-record path of ``tfrecord_source`` gives for the batch's regular
records (the same counts, values, payload sizes and reject messages); only a record that needs it
costs Python: a varying-length list stored as JSON text, a base64 value, a reject's message.
"""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardfeed.formats.sources import json_text
from shardfeed.formats.tf_example_batch import KIND_CODES, KIND_NAMES, ExampleBatch, KeyValues
from shardfeed.schemas.features import IMAGE_ARROW_TYPE, Feature, FeatureSpec
from shardfeed.schemas.rejects import RejectError

BYTES, FLOAT, INT64 = KIND_CODES["bytes"], KIND_CODES["float"], KIND_CODES["int64"]
_EXACT = 2**53  # the largest integer float64 holds exactly


@dataclass
class KindTally:
    """What ``TFRecordSource.infer`` counts, as mutable dicts (see ``InferredExamples``)."""

    records: int = 0
    kinds: dict[str, dict[str, int]] | None = None
    lengths: dict[str, dict[str, int]] | None = None
    text: dict[str, int] | None = None
    images: dict[str, int] | None = None

    def __post_init__(self) -> None:
        self.kinds, self.lengths, self.text, self.images = {}, {}, {}, {}


def tally_batch(batch: ExampleBatch, tally: KindTally, magic: tuple[bytes, ...]) -> None:
    """Add the regular records of ``batch`` to ``tally``: per key, each kind's records with
    values, their list lengths, and how many bytes records are all UTF-8 or all images."""
    tally.records += int(batch.size - batch.irregular.sum())
    for name, kv in batch.keys.items():
        present = kv.present()
        if not present.any():
            continue
        held = kv.kind[present]
        counts = tally.kinds.setdefault(name, {})
        for code in np.unique(held).tolist():
            kind = KIND_NAMES[code]
            counts[kind] = counts.get(kind, 0) + int((held == code).sum())
        sizes, times = np.unique(kv.counts[present], return_counts=True)
        seen = tally.lengths.setdefault(name, {})
        for size, n in zip(sizes.tolist(), times.tolist(), strict=True):
            seen[str(size)] = seen.get(str(size), 0) + n
        if (held == BYTES).any():
            utf8, image = _bytes_flags(batch, kv, magic)
            tally.text[name] = tally.text.get(name, 0) + int(_all_per_record(kv, utf8).sum())
            tally.images[name] = tally.images.get(name, 0) + int(_all_per_record(kv, image).sum())


def _bytes_flags(
    batch: ExampleBatch, kv: KeyValues, magic: tuple[bytes, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """Per bytes value: whether it is UTF-8, and whether it starts with an image signature."""
    try:
        kv.blobs.cast(pa.large_string())
        utf8 = np.ones(len(kv.blobs), bool)
    except pa.ArrowInvalid:  # some value is not UTF-8: find which (rare)
        utf8 = np.array([is_utf8(v) for v in kv.blobs.to_pylist()], bool)
    starts, stops = kv.blob_ranges
    image = np.zeros(len(starts), bool)
    buf = batch.buffer
    for sig in magic:
        fits = np.flatnonzero(stops - starts >= len(sig))
        match = np.ones(len(fits), bool)
        for j, octet in enumerate(sig):
            match &= buf[starts[fits] + j] == octet
        image[fits[match]] = True
    return utf8, image


def _all_per_record(kv: KeyValues, flags: np.ndarray) -> np.ndarray:
    """Per bytes record with values: whether every one of its values has the flag."""
    mine = kv.kind == BYTES
    counts = kv.counts[mine]
    owner = np.repeat(np.arange(len(counts)), counts)
    failed = np.zeros(len(counts), bool)
    failed[owner[~flags]] = True
    return (counts > 0) & ~failed


def is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# --------------------------------------------------------------------------------------------------
# Typing to a spec


@dataclass(frozen=True)
class TypedBatch:
    """The regular records of a batch typed to a spec: ``kept`` (record indices, ascending), their
    payload bytes and table, and ``rejects`` as (record index, error)."""

    kept: np.ndarray
    payload: np.ndarray
    table: pa.Table
    rejects: list[tuple[int, RejectError]]


def type_batch(batch: ExampleBatch, spec: FeatureSpec) -> TypedBatch:
    """Type the batch's regular records to ``spec``, as ``tfrecord_source._Converter`` does one
    record at a time: the first feature (in spec order) a record fails rejects it."""
    n = batch.size
    failed = batch.irregular.copy()  # records already decided (irregular, or rejected)
    rejects: list[tuple[int, RejectError]] = []
    features = list(spec.stored)
    empty = _empty_key(n)
    for f in features:
        kv = batch.keys.get(f.name, empty)
        for record, err in _failures(f, kv, ~failed):
            failed[record] = True
            rejects.append((record, err))
    kept = np.flatnonzero(~failed)
    payload = np.zeros(len(kept), np.int64)
    columns = []
    for f in features:
        column, size = _column(f, batch.keys.get(f.name, empty), kept)
        columns.append(column)
        payload += size
    table = pa.Table.from_arrays(columns, schema=spec.arrow_schema())
    rejects.sort(key=lambda item: item[0])
    return TypedBatch(kept, payload, table, rejects)


def _empty_key(n: int) -> KeyValues:
    zero = np.zeros(0, np.int64)
    return KeyValues(
        np.zeros(n, np.int8),
        np.zeros(n, np.int64),
        np.zeros(0, np.float32),
        zero,
        pa.array([], pa.large_binary()),
        (zero, zero),
    )


def _failures(f: Feature, kv: KeyValues, open_: np.ndarray) -> list[tuple[int, RejectError]]:
    """The records among ``open_`` that ``f`` rejects, with the converter's messages."""
    present = kv.present() & open_
    kind, counts = kv.kind, kv.counts
    out: list[tuple[int, RejectError]] = []

    def reject(mask: np.ndarray, message: Any, reason: str = "field_type") -> np.ndarray:
        for record in np.flatnonzero(mask).tolist():
            out.append((record, RejectError(reason, message(record))))
        return present & ~mask

    encoding = f.extra.get("encoding")
    if f.is_numeric:
        want = FLOAT if f.dtype.startswith("float") else INT64
        as_want = kind == want
        if f.extra.get("unified"):
            beyond = _beyond_exact(kv, present & (kind == INT64))
            present = reject(
                beyond,
                lambda r: (
                    f"feature {f.name!r} holds an integer beyond 2**53, which float64 "
                    "cannot hold exactly"
                ),
            )
            as_want |= kind == INT64
        present = reject(
            present & ~as_want,
            lambda r: (
                f"feature {f.name!r} holds {KIND_NAMES[int(kind[r])]}, the schema has "
                f"{KIND_NAMES[want]}"
            ),
        )
        reject(
            present & (counts != f.num_elements),
            lambda r: (
                f"feature {f.name!r} holds {counts[r]} values, the schema has {f.num_elements}"
            ),
        )
        return out
    if encoding == "json":
        example_kind = f.extra.get("example_kind")
        if example_kind not in (None, "number"):
            present = reject(
                present & (kind != KIND_CODES[example_kind]),
                lambda r: (
                    f"feature {f.name!r} holds {KIND_NAMES[int(kind[r])]}, the schema "
                    f"has {example_kind}"
                ),
            )
        if example_kind == "number":
            reject(
                present & (kind == BYTES),
                lambda r: f"feature {f.name!r} holds bytes, not numbers",
            )
        return out
    present = reject(
        present & (kind != BYTES),
        lambda r: f"feature {f.name!r} holds {KIND_NAMES[int(kind[r])]}, the schema has bytes",
    )
    present = reject(
        present & (counts != 1), lambda r: f"feature {f.name!r} holds {counts[r]} values, not 1"
    )
    if f.dtype != "image" and encoding != "base64":
        invalid = _invalid_text(kv, present)
        reject(invalid, lambda r: f"feature {f.name!r} is not UTF-8 text", "utf8_invalid")
    return out


def _beyond_exact(kv: KeyValues, mask: np.ndarray) -> np.ndarray:
    """Records in ``mask`` (int64 kind) holding an integer beyond +-2**53."""
    owner = np.repeat(np.flatnonzero(kv.kind == INT64), kv.counts[kv.kind == INT64])
    out = np.zeros(len(kv.kind), bool)
    out[owner[(kv.ints > _EXACT) | (kv.ints < -_EXACT)]] = True
    return out & mask


def _invalid_text(kv: KeyValues, mask: np.ndarray) -> np.ndarray:
    """Records in ``mask`` (one bytes value each) whose value is not UTF-8."""
    out = np.zeros(len(kv.kind), bool)
    if not mask.any():
        return out
    try:
        kv.blobs.cast(pa.large_string())
        return out
    except pa.ArrowInvalid:
        pass
    owner = np.repeat(np.flatnonzero(kv.kind == BYTES), kv.counts[kv.kind == BYTES])
    for record, value in zip(owner.tolist(), kv.blobs.to_pylist(), strict=True):
        if mask[record] and not is_utf8(value):
            out[record] = True
    return out


def _column(f: Feature, kv: KeyValues, kept: np.ndarray) -> tuple[pa.Array, np.ndarray]:
    """Feature ``f``'s column over the ``kept`` records (null where a record has no value), and
    each record's payload bytes."""
    present = kv.present()[kept]
    rows = kept[present]  # records with a value, ascending
    size = np.zeros(len(kept), np.int64)
    encoding = f.extra.get("encoding")
    if f.is_numeric:
        flat = _numbers(kv, rows, f.num_elements).astype(f.dtype)
        size[present] = f.num_elements * flat.itemsize
        filled = np.zeros((len(kept), f.num_elements), f.dtype)
        filled[present] = flat.reshape(len(rows), f.num_elements)
        if f.is_tensor:
            values = pa.array(filled.reshape(-1))
            column = pa.FixedSizeListArray.from_arrays(
                values, f.num_elements, mask=pa.array(~present)
            )
            return column.cast(f.arrow_type), size
        return pa.array(filled[:, 0], f.arrow_type, mask=~present), size
    if encoding == "json":
        texts = _json_texts(kv, rows)
        size[present] = pc.binary_length(texts).to_numpy(zero_copy_only=False)
        return _spread(texts, present, pa.string()), size
    blobs, lengths = _single_blobs(kv, rows)
    size[present] = lengths
    if f.dtype == "image":
        data = _spread(blobs, present, pa.binary())
        paths = pa.nulls(len(kept), pa.string())
        column = pa.StructArray.from_arrays(
            [data, paths], fields=list(IMAGE_ARROW_TYPE), mask=pa.array(~present)
        )
        return column, size
    if encoding == "base64":
        texts = [None] * len(kept)
        for i, value in zip(np.flatnonzero(present).tolist(), blobs.to_pylist(), strict=True):
            texts[i] = base64.b64encode(value).decode("ascii")
        return pa.array(texts, pa.string()), size
    return _spread(blobs.cast(pa.large_string()), present, pa.string()), size


def _numbers(kv: KeyValues, rows: np.ndarray, width: int) -> np.ndarray:
    """The values of ``rows`` (each holding ``width`` numbers, float or int64 kind), flat, in
    record order; float64 where both kinds occur (``--unify-schemas``)."""
    kinds = kv.kind[rows]
    out_type = np.float64 if (kinds == FLOAT).any() and (kinds == INT64).any() else None
    parts = [(code, flat, _value_starts(kv, code)) for code, flat in _number_flats(kv)]
    total = len(rows) * width
    index = np.repeat(np.arange(len(rows)), width)
    within = np.arange(total) - index * width
    if out_type is None:
        code, flat, starts = parts[0] if (kinds == FLOAT).any() else parts[1]
        if not len(rows):
            return np.zeros(0, np.float32 if code == FLOAT else np.int64)
        return flat[starts[rows][index] + within]
    out = np.empty(total, out_type)
    for code, flat, starts in parts:
        take = kinds[index] == code
        out[take] = flat[starts[rows][index[take]] + within[take]]
    return out


def _json_texts(kv: KeyValues, rows: np.ndarray) -> pa.Array:
    """Each row's values as canonical JSON text (a list of text or of finite numbers).

    Lists of plain text (UTF-8 without quotes, backslashes or control characters, which JSON
    writes as they are) are joined by Arrow; every other row is encoded by ``json_text``."""
    plain = _plain_text_rows(kv, rows)
    if plain.any():
        starts = _value_starts(kv, BYTES)[rows[plain]]
        counts = kv.counts[rows[plain]]
        index = np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
        values = kv.blobs.take(pa.array(index)).cast(pa.large_string())
        offsets = np.concatenate(([0], np.cumsum(counts)))
        lists = pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), values)
        text = pa.large_string()
        inner = pc.binary_join(lists, pa.scalar('","', text))
        joined = pc.binary_join_element_wise(
            pa.scalar('["', text), inner, pa.scalar('"]', text), pa.scalar("", text)
        )
    if plain.all():
        return joined
    others = [json_text.CANONICAL.encode(items) for items in _json_items(kv, rows[~plain])]
    if not plain.any():
        return pa.array(others, pa.large_string())
    out = np.empty(len(rows), object)
    out[plain] = joined.to_numpy(zero_copy_only=False)
    out[~plain] = others
    return pa.array(out, pa.large_string())


def _plain_text_rows(kv: KeyValues, rows: np.ndarray) -> np.ndarray:
    """Rows of bytes values that are all UTF-8 without a byte JSON escapes (``"``, ``\\``,
    0x00-0x1f)."""
    plain = kv.kind[rows] == BYTES
    if not plain.any() or not len(kv.blobs):
        return plain
    data, offsets = kv.blobs.buffers()[2], kv.blobs.buffers()[1]
    octets = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    bounds = np.frombuffer(offsets, np.int64)[kv.blobs.offset : kv.blobs.offset + len(kv.blobs) + 1]
    special = np.flatnonzero((octets < 0x20) | (octets == 0x22) | (octets == 0x5C))
    bad_value = np.zeros(len(kv.blobs), bool)
    bad_value[np.searchsorted(bounds, special, side="right") - 1] = True
    try:
        kv.blobs.cast(pa.large_string())
    except pa.ArrowInvalid:  # find the values that are not UTF-8 (rare)
        bad_value |= ~np.array([is_utf8(v) for v in kv.blobs.to_pylist()], bool)
    mine = kv.kind == BYTES
    owner = np.repeat(np.flatnonzero(mine), kv.counts[mine])
    bad_record = np.zeros(len(kv.kind), bool)
    bad_record[owner[bad_value]] = True
    return plain & ~bad_record[rows]


def _json_items(kv: KeyValues, rows: np.ndarray) -> list[list[Any]]:
    """Each row's values as the JSON list the converter writes (text, or finite numbers)."""
    out: list[list[Any]] = []
    flats = {code: flat.tolist() for code, flat in _number_flats(kv)}
    flats[BYTES] = kv.blobs.to_pylist() if (kv.kind[rows] == BYTES).any() else []
    starts = {code: _value_starts(kv, code).tolist() for code in (BYTES, FLOAT, INT64)}
    for r, code, n in zip(
        rows.tolist(), kv.kind[rows].tolist(), kv.counts[rows].tolist(), strict=True
    ):
        a = starts[code][r]
        values = flats[code][a : a + n]
        if code == BYTES:
            out.append([v.decode("utf-8", "backslashreplace") for v in values])
        else:
            out.append([_json_number(v) for v in values])
    return out


def _number_flats(kv: KeyValues) -> tuple[tuple[int, np.ndarray], ...]:
    return ((FLOAT, kv.floats), (INT64, kv.ints))


def _json_number(v: float | int) -> float | int | None:
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _value_starts(kv: KeyValues, code: int) -> np.ndarray:
    """Per record of kind ``code``: where its values start in that kind's flat array."""
    mine = kv.kind == code
    starts = np.zeros(len(kv.kind), np.int64)
    starts[mine] = np.cumsum(kv.counts[mine]) - kv.counts[mine]
    return starts


def _single_blobs(kv: KeyValues, rows: np.ndarray) -> tuple[pa.LargeBinaryArray, np.ndarray]:
    """The one bytes value of each of ``rows`` (bytes kind, one value each), and their sizes."""
    picked = kv.blobs.take(pa.array(_value_starts(kv, BYTES)[rows], pa.int64()))
    lengths = pc.binary_length(picked).to_numpy(zero_copy_only=False).astype(np.int64)
    return picked, lengths


def _spread(values: pa.Array, present: np.ndarray, atype: pa.DataType) -> pa.Array:
    """``values`` placed at the ``present`` rows, null elsewhere, as ``atype``."""
    if not present.all():
        index = np.cumsum(present) - 1
        values = values.take(pa.array(np.maximum(index, 0), mask=~present))
    return values.cast(atype)

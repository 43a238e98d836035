"""``tf.train.Example`` records decoded a batch at a time into columns, with numpy.

Protobuf messages nest, but every message of one nesting level in a batch can be walked at once:
the walker reads the first field of all of them together, then the second, and so on, so a batch
costs a few numpy calls per field of its longest message, not Python per value. Records laid out
as TensorFlow and protobuf write them (one ``features`` field; entries of key then value; one kind
per Feature; packed numbers; each key once) decode here. Any other record (unknown fields,
unpacked numbers, a repeated key, a group, malformed bytes, an overlong list) is marked
``irregular`` and left to :func:`~shardfeed.formats.tf_example.decode_example`, which applies
every rule of the format. The two agree on every regular record (``tests/test_tf_example_batch.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardfeed.formats.tf_example import packed_varints

__all__ = ["KIND_CODES", "ExampleBatch", "KeyValues", "decode_batch", "gather"]

#: kind codes of :attr:`KeyValues.kind`: 0 for a record without the key (or a Feature with no
#: kind), then the ``Feature`` oneof's field numbers
KIND_CODES = {"bytes": 1, "float": 2, "int64": 3}
KIND_NAMES = {code: name for name, code in KIND_CODES.items()}

#: fields walked per message before it counts as irregular (bounds the walk's steps per batch: a
#: list of more values than this is decoded by the record decoder, which has no per-step cost)
MAX_FIELDS = 512
_GATHER_CHUNK = 1 << 20  # bytes of small ranges gathered per index
_LARGE_RANGE = 4 << 10  # ranges at least this long are copied as slices
_TEN = np.arange(10)
_SHIFTS = (np.arange(10) * 7).astype(np.uint64)
_TAG_FEATURES = _TAG_ENTRY = _TAG_KEY = _TAG_VALUE_LIST = 0x0A
_TAG_VALUE = 0x12


@dataclass(frozen=True)
class KeyValues:
    """One feature key over a batch's records (zeros for irregular records and those without it).

    ``kind`` and ``counts`` have one entry per record; the value arrays hold the values of the
    records of that kind, one after another in record order (``counts`` says how many each)."""

    kind: np.ndarray  # int8
    counts: np.ndarray  # int64
    floats: np.ndarray  # float32
    ints: np.ndarray  # int64
    blobs: pa.LargeBinaryArray  # bytes values
    blob_ranges: tuple[np.ndarray, np.ndarray]  # where each bytes value lies in the batch buffer

    def present(self) -> np.ndarray:
        """Records holding at least one value (an empty list reads as missing)."""
        return (self.kind > 0) & (self.counts > 0)


@dataclass(frozen=True)
class ExampleBatch:
    """A batch of serialized Examples as per-key columns, with the records left to the record
    decoder flagged in ``irregular``."""

    size: int
    irregular: np.ndarray  # bool per record
    keys: dict[str, KeyValues]
    buffer: np.ndarray  # uint8: the records one after another (``blob_ranges`` index into it)


def decode_batch(records: Sequence[bytes]) -> ExampleBatch:
    """Decode ``records`` (serialized ``tf.train.Example`` messages) into per-key columns."""
    n = len(records)
    buf = np.frombuffer(b"".join(records), np.uint8)
    lengths = np.fromiter(map(len, records), np.int64, count=n)
    stops = np.cumsum(lengths)
    starts = stops - lengths
    irregular = np.zeros(n, bool)

    # Example: at most one field, ``features`` (1)
    top = _walk(buf, starts, stops, 2)
    irregular[top.bad] = True
    _flag(irregular, top.msg, (top.tag != _TAG_FEATURES) | (top.step > 0))
    # Features: entries (1) only
    feats = np.flatnonzero(top.tag == _TAG_FEATURES)
    feat_rec = top.msg[feats]
    entries = _walk(buf, top.start[feats], top.stop[feats], MAX_FIELDS)
    irregular[feat_rec[entries.bad]] = True
    entry_rec = feat_rec[entries.msg]
    _flag(irregular, entry_rec, entries.tag != _TAG_ENTRY)
    # Entry: exactly a key (1) then a value (2)
    inner = _walk(buf, entries.start, entries.stop, 3)
    per_entry = np.bincount(inner.msg, minlength=len(entries.msg))
    odd = (per_entry != 2) | _bad_of(inner, len(entries.msg))
    expected = np.where(inner.step == 0, _TAG_KEY, _TAG_VALUE)
    odd[inner.msg[inner.tag != expected]] = True
    _flag(irregular, entry_rec, odd)
    key_at = np.flatnonzero((inner.step == 0) & ~odd[inner.msg])
    value_at = np.flatnonzero((inner.step == 1) & ~odd[inner.msg])
    # the surviving entries, in entry order: both lists are sorted by entry (steps are walked
    # for all messages in turn, so within one step fields come in message order)
    kept = inner.msg[key_at]
    rec = entry_rec[kept]
    key_a, key_b = inner.start[key_at], inner.stop[key_at]
    val_a, val_b = inner.start[value_at], inner.stop[value_at]
    # Feature: no field (no kind) or one list field (1, 2 or 3)
    feature = _walk(buf, val_a, val_b, 2)
    kind = np.zeros(len(kept), np.int8)
    bad = _bad_of(feature, len(kept))
    bad[feature.msg[(feature.step > 0) | ~np.isin(feature.tag, (0x0A, 0x12, 0x1A))]] = True
    first = feature.step == 0
    kind[feature.msg[first]] = (feature.tag[first] >> 3).astype(np.int8)
    list_a = np.zeros(len(kept), np.int64)
    list_b = np.zeros(len(kept), np.int64)
    list_a[feature.msg[first]] = feature.start[first]
    list_b[feature.msg[first]] = feature.stop[first]
    # lists: bytes values (1, any number); packed floats or int64s (one field 1 at most)
    values = _walk(buf, list_a, list_b, MAX_FIELDS)
    bad |= _bad_of(values, len(kept))
    vkind = kind[values.msg]
    bad[values.msg[values.tag != _TAG_VALUE_LIST]] = True
    bad[values.msg[(vkind != KIND_CODES["bytes"]) & (values.step > 0)]] = True
    floats_at = vkind == KIND_CODES["float"]
    bad[values.msg[floats_at & ((values.stop - values.start) % 4 != 0)]] = True
    ints_at = vkind == KIND_CODES["int64"]
    ends_ok = _packed_ends_ok(buf, values.start[ints_at], values.stop[ints_at])
    bad[values.msg[ints_at][~ends_ok]] = True
    _flag(irregular, rec, bad)

    # keys: one id per distinct key; a key that is not UTF-8, or repeated in a record, is left
    # to the record decoder (which rejects the first and keeps the last of the second)
    key_blobs = gather(buf, key_a, key_b)
    encoded = pc.dictionary_encode(key_blobs) if len(key_blobs) else None
    names: list[str | None] = []
    if encoded is not None:
        for raw in encoded.dictionary.to_pylist():
            try:
                names.append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                names.append(None)
    key_id = np.asarray(encoded.indices, np.int64) if encoded is not None else np.zeros(0, np.int64)
    invalid = np.array([name is None for name in names], bool)
    if invalid.any():
        irregular[rec[invalid[key_id]]] = True
    pair = rec * max(len(names), 1) + key_id
    ordered = np.sort(pair)
    repeated = ordered[1:][ordered[1:] == ordered[:-1]]
    if repeated.size:
        irregular[rec[np.isin(pair, repeated)]] = True

    good = ~irregular[rec]
    good_values = good[values.msg]
    counts = np.zeros(len(kept), np.int64)
    blob_at = good_values & (vkind == KIND_CODES["bytes"])
    counts += np.bincount(values.msg[blob_at], minlength=len(kept))
    float_at = good_values & floats_at
    counts[values.msg[float_at]] = (values.stop[float_at] - values.start[float_at]) // 4
    int_at = good_values & ints_at
    counts[values.msg[int_at]] = _packed_counts(buf, values.start[int_at], values.stop[int_at])

    keys: dict[str, KeyValues] = {}
    for kid, name in enumerate(names):
        if name is None:
            continue
        mine = np.flatnonzero(good & (key_id == kid))
        if not mine.size:
            continue
        mine = mine[np.argsort(rec[mine], kind="stable")]  # entries come in walk order
        keys[name] = _key_values(buf, n, mine, rec, kind, counts, values, blob_at, float_at, int_at)
    return ExampleBatch(n, irregular, keys, buf)


def _key_values(
    buf: np.ndarray,
    n: int,
    mine: np.ndarray,
    rec: np.ndarray,
    kind: np.ndarray,
    counts: np.ndarray,
    values: _Fields,
    blob_at: np.ndarray,
    float_at: np.ndarray,
    int_at: np.ndarray,
) -> KeyValues:
    """One key's columns from its entries ``mine`` (sorted by record, one per record)."""
    record_kind = np.zeros(n, np.int8)
    record_counts = np.zeros(n, np.int64)
    record_kind[rec[mine]] = kind[mine]
    record_counts[rec[mine]] = counts[mine]
    # each value field of this key's lists, ordered by record then by place in its list
    rank = np.full(len(kind), -1, np.int64)
    rank[mine] = np.arange(len(mine))
    owned = rank[values.msg]
    order = np.lexsort((values.step, owned))
    order = order[owned[order] >= 0]
    fa, fb = values.start[order], values.stop[order]
    floats_here, ints_here, blobs_here = float_at[order], int_at[order], blob_at[order]
    floats = gather(buf, fa[floats_here], fb[floats_here]).buffers()[2]
    ints_raw = gather(buf, fa[ints_here], fb[ints_here]).buffers()[2]
    return KeyValues(
        kind=record_kind,
        counts=record_counts,
        floats=(
            np.frombuffer(floats, "<f4").astype(np.float32)
            if floats is not None
            else np.zeros(0, np.float32)
        ),
        ints=_varints_of(np.frombuffer(ints_raw, np.uint8) if ints_raw is not None else None),
        blobs=gather(buf, fa[blobs_here], fb[blobs_here]),
        blob_ranges=(fa[blobs_here], fb[blobs_here]),
    )


def gather(buf: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> pa.LargeBinaryArray:
    """``buf[starts[i]:stops[i]]`` for each i, as one Arrow array. Small ranges are gathered by
    a byte index a chunk of about ``_GATHER_CHUNK`` bytes at a time (the index costs 8 bytes per
    byte); large ones (images) are copied slice by slice, so memory stays near the output's."""
    sizes = (stops - starts).astype(np.int64)
    offsets = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    data = np.empty(int(offsets[-1]), np.uint8)
    large = sizes >= _LARGE_RANGE
    for i in np.flatnonzero(large).tolist():
        data[offsets[i] : offsets[i + 1]] = buf[starts[i] : stops[i]]
    small = np.flatnonzero(~large & (sizes > 0))
    if small.size:
        ends = np.cumsum(sizes[small])
        cuts = np.searchsorted(ends, np.arange(_GATHER_CHUNK, int(ends[-1]), _GATHER_CHUNK))
        for part in np.split(small, np.unique(cuts)):
            if not part.size:
                continue
            counts = sizes[part]
            within = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(
                np.cumsum(counts) - counts, counts
            )
            data[np.repeat(offsets[part], counts) + within] = buf[
                np.repeat(starts[part], counts) + within
            ]
    return pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), len(sizes), [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


# --------------------------------------------------------------------------------------------------
# The walk


@dataclass(frozen=True)
class _Fields:
    """Every field of a set of messages: its message, its place in the message (``step``), its tag
    and the bytes it spans (a length-delimited field's payload, else the value's bytes); ``bad``
    lists the messages the walk gave up on (malformed, a group, too many fields)."""

    msg: np.ndarray
    step: np.ndarray
    tag: np.ndarray
    start: np.ndarray
    stop: np.ndarray
    bad: np.ndarray


def _walk(buf: np.ndarray, starts: np.ndarray, stops: np.ndarray, max_fields: int) -> _Fields:
    """The fields of the messages ``buf[starts[i]:stops[i]]``, walked all together."""
    pos = np.asarray(starts, np.int64).copy()
    stops = np.asarray(stops, np.int64)
    active = np.flatnonzero(pos < stops)
    bad: list[np.ndarray] = []
    out: list[tuple[np.ndarray, ...]] = []
    step = 0
    while active.size:
        if step == max_fields:
            bad.append(active)
            break
        p, end = pos[active], stops[active]
        tag, p, ok = _varints(buf, p, end)
        wire = tag & np.uint64(7)
        ok &= (tag >> np.uint64(3)) > 0
        a = p.copy()
        b = p.copy()
        delimited = ok & (wire == 2)
        if delimited.any():
            length, after, fine = _varints(buf, p[delimited], end[delimited])
            room = (end[delimited] - after).astype(np.uint64)
            fine &= length <= room
            a[delimited] = after
            b[delimited] = after + np.where(fine, length, 0).astype(np.int64)
            ok[np.flatnonzero(delimited)[~fine]] = False
        plain = ok & (wire == 0)
        if plain.any():
            _, after, fine = _varints(buf, p[plain], end[plain])
            b[plain] = after
            ok[np.flatnonzero(plain)[~fine]] = False
        b[ok & (wire == 5)] += 4
        b[ok & (wire == 1)] += 8
        ok &= (wire <= 2) | (
            wire == 5
        )  # groups (3, 4) and wire types 6, 7 go to the record decoder
        ok &= b <= end
        if not ok.all():
            bad.append(active[~ok])
        got = active[ok]
        out.append((got, np.full(len(got), step, np.int64), tag[ok].astype(np.int64), a[ok], b[ok]))
        pos[got] = b[ok]
        active = got[b[ok] < end[ok]]
        step += 1
    columns = [np.concatenate(c) if c else np.zeros(0, np.int64) for c in zip(*out, strict=True)]
    if not out:
        columns = [np.zeros(0, np.int64) for _ in range(5)]
    badness = np.concatenate(bad) if bad else np.zeros(0, np.int64)
    if badness.size:  # drop the fields of messages given up on
        keep = ~np.isin(columns[0], badness)
        columns = [c[keep] for c in columns]
    return _Fields(*columns, badness)


def _varints(
    buf: np.ndarray, pos: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The varint at each ``pos`` (before ``end``): its value (uint64), the position after it,
    and whether it is whole and fits 64 bits."""
    if not len(pos):
        empty = np.zeros(0, np.int64)
        return empty.astype(np.uint64), empty, np.zeros(0, bool)
    inside = pos < end
    first = buf[np.minimum(pos, len(buf) - 1)] if len(buf) else np.zeros(len(pos), np.uint8)
    short = (first < 0x80) & inside  # tags and most lengths are one byte
    if short.all():
        return first.astype(np.uint64), pos + 1, short
    value, after, ok = first.astype(np.uint64), pos + 1, short.copy()
    longer = np.flatnonzero(~short)
    value[longer], after[longer], ok[longer] = _long_varints(buf, pos[longer], end[longer])
    return value, after, ok


def _long_varints(
    buf: np.ndarray, pos: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_varints` for any length: up to ten bytes at each position at once."""
    index = pos[:, None] + _TEN
    inside = index < end[:, None]
    octets = buf[np.minimum(index, len(buf) - 1)] if len(buf) else np.zeros(index.shape, np.uint8)
    last = (octets < 0x80) & inside
    whole = last.any(axis=1)
    size = np.argmax(last, axis=1) + 1
    used = size[:, None] > _TEN
    groups = (octets & 0x7F).astype(np.uint64) << _SHIFTS
    value = np.bitwise_or.reduce(np.where(used, groups, np.uint64(0)), axis=1)
    fits = (size < 10) | (octets[:, 9] <= 1)
    return value, pos + size, whole & fits


def _packed_ends_ok(buf: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """Each packed varint run ends on a varint's last byte and holds no varint over 10 bytes
    (the per-run check; values themselves are decoded key by key)."""
    ok = np.ones(len(starts), bool)
    nonempty = stops > starts
    ok[nonempty] = buf[stops[nonempty] - 1] < 0x80
    runs = gather(buf, starts, stops).buffers()[2]
    if runs is None:
        return ok
    raw = np.frombuffer(runs, np.uint8)
    last = np.flatnonzero(raw < 0x80)
    sizes = np.diff(np.concatenate(([-1], last)))
    if sizes.size and sizes.max() > 10:  # rare: find the runs holding an overlong varint
        lengths = stops - starts
        run_of = np.repeat(np.arange(len(starts)), lengths)
        ok[np.unique(run_of[last[sizes > 10]])] = False
    return ok


def _packed_counts(buf: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """Varints in each packed run (its bytes below 0x80)."""
    runs = gather(buf, starts, stops)
    raw = np.frombuffer(runs.buffers()[2], np.uint8) if len(runs) else np.zeros(0, np.uint8)
    terminal = np.concatenate(([0], np.cumsum(raw < 0x80, dtype=np.int64)))
    offsets = np.frombuffer(runs.buffers()[1], np.int64)[: len(runs) + 1] if len(runs) else [0]
    return terminal[offsets[1:]] - terminal[offsets[:-1]]


def _varints_of(raw: np.ndarray | None) -> np.ndarray:
    """Concatenated whole varints -> int64 values (two's complement bit patterns)."""
    if raw is None or not raw.size:
        return np.zeros(0, np.int64)
    return packed_varints(raw.tobytes(), 0, raw.size).view(np.int64)


def _bad_of(fields: _Fields, messages: int) -> np.ndarray:
    out = np.zeros(messages, bool)
    out[fields.bad] = True
    return out


def _flag(irregular: np.ndarray, records: np.ndarray, mask: np.ndarray) -> None:
    """Mark the records of the items ``mask`` selects irregular."""
    irregular[records[mask]] = True

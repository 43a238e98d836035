"""Stable hashes: content ids, seeded shuffle keys and hash buckets.

All three use BLAKE2b from :mod:`hashlib`, never Python's ``hash()`` (salted per process), so the
values are identical across runs, machines, Python versions and runners.

- :func:`content_hash`: 128-bit BLAKE2b, 32 hex characters. Each part is framed by its length as
  8 bytes little-endian, so ``("ab", "c")`` and ``("a", "bc")`` hash differently.
- :func:`shuffle_key`: unsigned 64-bit (store as ``uint64``, not ``int64``).
- :func:`shuffle_keys`: the conversion's shuffle keys of a whole file's units at once (numpy).
- :func:`stable_bucket`: 64-bit BLAKE2b of the UTF-8 key, modulo ``buckets``.
"""

from __future__ import annotations

import functools
import hashlib
import operator
from collections.abc import Sequence

import numpy as np

#: Version tag mixed into shuffle keys; changing it changes every shuffled order.
_SHUFFLE_DOMAIN = b"shardfeed.shuffle.v1"


def content_hash(*parts: bytes) -> str:
    """Hex BLAKE2b-128 of the length-framed ``parts`` (bytes-like; ``str`` is refused)."""
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        _update_framed(h, part)
    return h.hexdigest()


def shuffle_key(seed: int, content_hash: str, position_key: str) -> int:
    """A stable 64-bit sort key in ``[0, 2**64)`` for a seeded shuffle.

    The key hashes seed, content hash and position together: another seed gives another order,
    and identical contents at different positions get different keys. Sort by
    ``(shuffle_key(...), position_key)`` for a total order: two keys can still collide, at 64 bits.
    """
    h = _seeded(operator.index(seed)).copy()
    digest, position = content_hash.encode("utf-8"), position_key.encode("utf-8")
    # the same length-framed byte stream as _update_framed, in one update (once per sample)
    h.update(
        b"".join(
            (
                len(digest).to_bytes(8, "little"),
                digest,
                len(position).to_bytes(8, "little"),
                position,
            )
        )
    )
    return int.from_bytes(h.digest(), "big")


#: Version tag of :func:`shuffle_keys`; changing it changes every converted dataset's order.
_UNIT_SHUFFLE_DOMAIN = b"shardfeed.unit-shuffle.v2"
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def shuffle_keys(
    seed: int, content_hashes: Sequence[str], file: str, positions: np.ndarray
) -> np.ndarray:
    """Stable 64-bit shuffle keys (``uint64``) of one file's units, computed with array operations.

    Each key mixes the seed, the unit's content hash (its first 64 bits) and its place (the file
    and the unit's position in it): another seed gives another order, and identical contents at
    different places get different keys. The mixer is SplitMix64's finaliser, a bijection on 64
    bits, so keys are as uniform as the content hashes. Hashes are hex digests of at least 16
    digits (``content_digest``, ``content_hash``). One hashlib call per file, none per unit: at
    ten million units a per-unit BLAKE2b call costs about a minute of Python.
    """
    positions = np.asarray(positions, dtype=np.int64)
    if len(content_hashes) != len(positions):
        raise ValueError(f"{len(content_hashes)} content hashes for {len(positions)} positions")
    if not len(positions):
        return np.zeros(0, dtype=np.uint64)
    try:
        heads = bytes.fromhex("".join(digest[:16] for digest in content_hashes))
    except ValueError:
        heads = b""
    if len(heads) != 8 * len(positions):
        raise ValueError("content hashes must be hex digests of at least 16 digits")
    words = np.frombuffer(heads, dtype=">u8").astype(np.uint64)
    h = hashlib.blake2b(digest_size=16)
    for part in (_UNIT_SHUFFLE_DOMAIN, str(operator.index(seed)).encode("ascii"), file.encode()):
        _update_framed(h, part)
    digest = h.digest()
    seed_word = np.uint64(int.from_bytes(digest[:8], "big"))
    file_word = np.uint64(int.from_bytes(digest[8:], "big"))
    place = mix64(file_word + positions.astype(np.uint64) * _GOLDEN)
    return mix64(words ^ seed_word ^ place)


def mix64(values: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser over a ``uint64`` array (wrapping arithmetic): a bijection whose
    every output bit depends on every input bit."""
    z = np.asarray(values, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@functools.lru_cache(maxsize=16)
def _seeded(seed: int) -> hashlib._Hash:
    """The shuffle hasher with domain and seed already fed (copied, never updated, by callers)."""
    h = hashlib.blake2b(digest_size=8)
    for part in (_SHUFFLE_DOMAIN, str(seed).encode("ascii")):
        _update_framed(h, part)
    return h


def stable_bucket(key: str, buckets: int) -> int:
    """The bucket in ``[0, buckets)`` of ``key``, uniform and stable everywhere."""
    buckets = operator.index(buckets)
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, got {buckets}")
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % buckets


def _update_framed(h: hashlib._Hash, part: bytes) -> None:
    if isinstance(part, str):
        raise TypeError("hash parts must be bytes, not str (encode them first)")
    view = memoryview(part)
    h.update(view.nbytes.to_bytes(8, "little"))
    h.update(view)

"""Stable hashes: content ids, seeded shuffle keys and hash buckets.

All three use BLAKE2b from :mod:`hashlib`, never Python's ``hash()`` (salted per process), so the
values are identical across runs, machines, Python versions and runners.

- :func:`content_hash`: 128-bit BLAKE2b, 32 hex characters. Each part is framed by its length as
  8 bytes little-endian, so ``("ab", "c")`` and ``("a", "bc")`` hash differently.
- :func:`shuffle_key`: unsigned 64-bit (store as ``uint64``, not ``int64``).
- :func:`stable_bucket`: 64-bit BLAKE2b of the UTF-8 key, modulo ``buckets``.
"""

from __future__ import annotations

import functools
import hashlib
import operator

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

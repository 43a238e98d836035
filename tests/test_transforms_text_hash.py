"""UTF-8 and text-field checks (``transforms.text``) and stable hashes (``transforms.hashing``)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from shardfeed.schemas.rejects import RejectError
from shardfeed.transforms.hashing import content_hash, shuffle_key, stable_bucket
from shardfeed.transforms.text import check_text, decode_utf8

# --- decode_utf8 -------------------------------------------------------------------------------


def test_decode_valid_utf8() -> None:
    text = "plain ascii, caf\u00e9, \u6f22\u5b57, \U0001f389, \u0000 nul"
    assert decode_utf8(text.encode("utf-8")) == text
    assert decode_utf8(b"") == ""
    assert decode_utf8(bytearray(b"abc")) == "abc"
    assert decode_utf8(memoryview(b"xyz")) == "xyz"
    assert decode_utf8(b"\xef\xbb\xbfbom") == "\ufeffbom"  # a BOM is data, kept


@pytest.mark.parametrize(
    ("data", "offset"),
    [
        (b"abc\xffdef", 3),  # never valid in UTF-8
        (b"ok\xe2\x82", 2),  # multi-byte sequence cut at the end
        (b"\xc0\xaf", 0),  # overlong encoding of '/'
        (b"x\xed\xa0\x80", 1),  # an encoded surrogate
        ("\u00e9\u00e9".encode() + b"\x80", 4),  # stray continuation byte after 4 good bytes
        (b"\xf4\x90\x80\x80", 0),  # above U+10FFFF
    ],
)
def test_decode_invalid_utf8_reports_the_byte_offset(data: bytes, offset: int) -> None:
    with pytest.raises(RejectError) as info:
        decode_utf8(data)
    assert info.value.reason == "utf8_invalid"
    assert f"byte offset {offset} " in info.value.message


# --- check_text --------------------------------------------------------------------------------


def test_check_text_accepts_strings() -> None:
    value = json.loads('{"text": "hello \\u00e9"}')["text"]
    assert check_text(value) is value
    assert check_text("") == ""


@pytest.mark.parametrize(
    ("value", "name"),
    [
        (1, "number"),
        (1.5, "number"),
        (None, "null"),
        (True, "boolean"),
        ([], "array"),
        ({}, "object"),
    ],
)
def test_check_text_rejects_other_json_types(value: object, name: str) -> None:
    with pytest.raises(RejectError) as info:
        check_text(value, field="caption")
    assert info.value.reason == "field_type"
    assert "'caption'" in info.value.message and name in info.value.message


def test_check_text_rejects_lone_surrogates_from_json() -> None:
    value = json.loads('"ab\\ud800c"')  # valid JSON, not representable in UTF-8
    with pytest.raises(RejectError) as info:
        check_text(value)
    assert info.value.reason == "utf8_invalid"
    assert "U+D800" in info.value.message and "offset 2" in info.value.message
    assert check_text(json.loads('"\\ud83c\\udf89"')) == "\U0001f389"  # a proper pair is fine


# --- content_hash ------------------------------------------------------------------------------


def test_content_hash_is_stable() -> None:
    # computed once; a change here changes every id and dedup key
    assert content_hash(b"shardfeed") == "03434367b94e371cb4b3f2877bbb578e"
    assert content_hash() == "cae66941d9efbd404e4d88758ea67670"
    # and the documented construction: BLAKE2b-128 over (u64 LE length, bytes) per part
    h = hashlib.blake2b(digest_size=16)
    for part in (b"img", b"\x00\x01"):
        h.update(len(part).to_bytes(8, "little") + part)
    assert content_hash(b"img", b"\x00\x01") == h.hexdigest()


def test_content_hash_framing_prevents_collisions() -> None:
    assert content_hash(b"ab", b"c") != content_hash(b"a", b"bc")
    assert content_hash(b"abc") != content_hash(b"ab", b"c")
    assert content_hash(b"") != content_hash()
    assert content_hash(b"", b"") != content_hash(b"")
    assert len(content_hash(b"x")) == 32
    assert (
        content_hash(b"abc") == content_hash(bytearray(b"abc")) == content_hash(memoryview(b"abc"))
    )


def test_content_hash_refuses_str() -> None:
    with pytest.raises(TypeError):
        content_hash("text")  # type: ignore[arg-type]


# --- shuffle_key -------------------------------------------------------------------------------


def _order(seed: int, n: int = 1000) -> list[int]:
    keys = [(shuffle_key(seed, content_hash(b"%d" % i), f"f.jsonl:{i}"), i) for i in range(n)]
    return [i for _, i in sorted(keys)]


def test_shuffle_key_is_deterministic_and_64_bit() -> None:
    key = shuffle_key(0, content_hash(b"shardfeed"), "a.jsonl:0")
    assert key == shuffle_key(0, content_hash(b"shardfeed"), "a.jsonl:0")
    assert key == 3719788559020684200  # computed once: a stability check
    h = hashlib.blake2b(digest_size=8)  # the documented construction
    for part in (b"shardfeed.shuffle.v1", b"0", content_hash(b"shardfeed").encode(), b"a.jsonl:0"):
        h.update(len(part).to_bytes(8, "little") + part)
    assert key == int.from_bytes(h.digest(), "big")
    keys = [shuffle_key(s, "00", "p") for s in (-(2**70), -1, 0, 1, 2**70)]
    assert all(0 <= k < 2**64 for k in keys)
    assert len(set(keys)) == len(keys)
    assert _order(7) == _order(7)


def test_shuffle_key_seeds_give_different_orders() -> None:
    base = _order(0)
    assert sorted(base) == list(range(1000))
    assert base != list(range(1000))
    for seed in (1, 2, 12345):
        other = _order(seed)
        assert other != base
        # independent permutations: rank correlation near zero
        assert abs(np.corrcoef(np.argsort(base), np.argsort(other))[0, 1]) < 0.1


def test_shuffle_key_breaks_ties_between_identical_contents() -> None:
    same = content_hash(b"duplicate line")
    keys = {shuffle_key(3, same, f"f.jsonl:{i}") for i in range(100)}
    assert len(keys) == 100
    assert shuffle_key(3, same, "a:1") != shuffle_key(3, content_hash(b"other"), "a:1")


def test_shuffle_key_seed_must_be_an_integer() -> None:
    with pytest.raises(TypeError):
        shuffle_key(1.5, "00", "p")  # type: ignore[arg-type]


# --- stable_bucket -----------------------------------------------------------------------------


def test_stable_bucket_range_and_stability() -> None:
    assert stable_bucket("anything", 1) == 0
    assert stable_bucket("shard-key-0", 1000) == stable_bucket("shard-key-0", 1000)
    assert stable_bucket("shard-key-0", 1000) == 806  # computed once: a stability check
    for buckets in (2, 7, 1000, 2**40):
        assert all(0 <= stable_bucket(f"k{i}", buckets) < buckets for i in range(500))
    for bad in (0, -3):
        with pytest.raises(ValueError):
            stable_bucket("k", bad)


def test_stable_bucket_is_roughly_uniform() -> None:
    buckets, n = 16, 64_000
    counts = Counter(stable_bucket(f"sample-{i}", buckets) for i in range(n))
    expected = n / buckets
    chi2 = sum((counts[b] - expected) ** 2 / expected for b in range(buckets))
    assert len(counts) == buckets
    assert chi2 < 37.7  # chi-square, 15 degrees of freedom, p = 0.001 (deterministic input)


def test_hashes_do_not_depend_on_the_process() -> None:
    """Python's hash() is salted per process; these must not be."""
    code = (
        "from shardfeed.transforms.hashing import content_hash, shuffle_key, stable_bucket\n"
        "print(content_hash(b'a', b'b'), shuffle_key(5, 'ff', 'x:1'), stable_bucket('k', 97))\n"
    )
    mine = f"{content_hash(b'a', b'b')} {shuffle_key(5, 'ff', 'x:1')} {stable_bucket('k', 97)}"
    for salt in ("1", "98765"):
        env = {**os.environ, "PYTHONHASHSEED": salt}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == mine

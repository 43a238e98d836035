"""The tier config (``schemas/tiers.py``) and the bandwidth parser (``schemas/units.py``): the
documented example is accepted as written, every mistake is a SchemaError naming its field, and
random documents raise nothing else."""

from __future__ import annotations

import contextlib
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tier_fixtures import EXAMPLE_TIERS

from shardfeed.schemas.errors import SchemaError
from shardfeed.schemas.tiers import (
    Tier,
    TierConfig,
    check_path_template,
    load_tier_config,
)
from shardfeed.schemas.units import format_rate, parse_bandwidth


def example_dict() -> dict:
    """The example as the decoded TOML document, for tests that change one field."""
    return {
        "tiers": {
            "nvme": {
                "path": "/local/nvme/{dataset}",
                "scope": "node",
                "capacity": "3.5TB",
                "read_bandwidth": "12GB/s",
            },
            "pfs": {
                "path": "/lustre/datasets/{dataset}",
                "scope": "shared",
                "capacity": "2PB",
                "read_bandwidth": "400GB/s",
                "stripe_count": "auto",
            },
            "cold": {
                "path": "s3://bucket/datasets/{dataset}",
                "scope": "shared",
                "capacity": "10PB",
                "read_bandwidth": "20GB/s",
            },
        },
        "policy": {"hot": ["nvme", "pfs"], "all": ["pfs", "cold"]},
    }


def refused(obj: dict) -> SchemaError:
    with pytest.raises(SchemaError) as info:
        TierConfig.from_dict(obj)
    return info.value


# --------------------------------------------------------------------------------------------
# the example


def test_example_is_accepted_as_written(tmp_path):
    path = tmp_path / "tiers.toml"
    path.write_text(EXAMPLE_TIERS, encoding="utf-8")
    config = load_tier_config(path)
    assert config.names == ("nvme", "pfs", "cold")
    nvme, pfs, cold = config.tiers
    assert nvme == Tier("nvme", "/local/nvme/{dataset}", "node", 3_500 * 10**9, 12 * 10**9)
    assert pfs.capacity == 2 * 10**15 and pfs.read_bandwidth == 400 * 10**9
    assert pfs.stripe_count == "auto" and pfs.stripe_size is None
    assert cold.capacity == 10 * 10**15 and cold.read_bandwidth == 20 * 10**9 and cold.is_uri
    assert config.policy.hot == ("nvme", "pfs") and config.policy.all == ("pfs", "cold")
    assert config.node_tier is nvme and config.read_tier is pfs
    assert config == TierConfig.from_dict(example_dict())
    assert TierConfig.from_dict(config.to_json()) == config  # to_json round-trips


def test_location_substitutes_the_dataset_name():
    config = TierConfig.loads(EXAMPLE_TIERS)
    assert config.tier("nvme").location("laion-sf") == "/local/nvme/laion-sf"
    assert config.tier("pfs").location("ds.v2") == "/lustre/datasets/ds.v2"
    assert config.tier("cold").location("ds_1") == "s3://bucket/datasets/ds_1"


@pytest.mark.parametrize(
    "name", ["", ".", "..", "a/b", "../x", "a\\b", "%2e%2e", "x%2fy", "{dataset}", "a\x00b", "a\nb"]
)
def test_location_refuses_names_that_would_escape(name):
    tier = TierConfig.loads(EXAMPLE_TIERS).tier("nvme")
    with pytest.raises(SchemaError) as info:
        tier.location(name)
    assert info.value.field == "dataset"


def test_stripe_settings_and_integer_sizes():
    obj = example_dict()
    obj["tiers"]["pfs"].update(stripe_count=8, stripe_size="4MiB", capacity=10**15)
    obj["tiers"]["pfs"]["read_bandwidth"] = 5 * 10**9  # integers are bytes and bytes/s
    pfs = TierConfig.from_dict(obj).tier("pfs")
    assert (pfs.stripe_count, pfs.stripe_size) == (8, 4 * 2**20)
    assert (pfs.capacity, pfs.read_bandwidth) == (10**15, 5 * 10**9)


def test_policy_without_hot_and_without_node_tier():
    obj = example_dict()
    del obj["tiers"]["nvme"]
    obj["policy"] = {"all": ["pfs", "cold"]}
    config = TierConfig.from_dict(obj)
    assert config.policy.hot == () and config.node_tier is None and config.read_tier.name == "pfs"


def test_node_tier_only_in_all_and_no_shared_read_tier():
    obj = example_dict()
    obj["policy"] = {"hot": [], "all": ["nvme"]}
    config = TierConfig.from_dict(obj)
    assert config.node_tier.name == "nvme" and config.read_tier is None


# --------------------------------------------------------------------------------------------
# errors name their field


def _set(obj: dict, dotted: str, value) -> dict:
    *parents, last = dotted.split(".")
    target = obj
    for key in parents:
        target = target[key]
    if value is _DELETE:
        del target[last]
    else:
        target[last] = value
    return obj


_DELETE = object()


@pytest.mark.parametrize(
    ("dotted", "value", "field", "words"),
    [
        ("policy.hot", ["nvme", "ssd"], "policy.hot[1]", "unknown tier 'ssd'"),
        ("policy.all", ["tape"], "policy.all[0]", "unknown tier"),
        ("policy.all", [], "policy.all", "at least one tier"),
        ("policy.all", ["pfs", "pfs"], "policy.all[1]", "twice"),
        ("policy.all", "pfs", "policy.all", "expected array"),
        ("policy.hot", [3], "policy.hot[0]", "expected a tier name"),
        ("policy.warm", ["pfs"], "policy.warm", "unknown key"),
        ("policy", _DELETE, "policy", "is missing"),
        ("tiers", {}, "tiers", "at least one tier"),
        ("tiers", _DELETE, "tiers", "is missing"),
        ("tiers.nvme.capacity", _DELETE, "tiers.nvme.capacity", "is missing"),
        ("tiers.nvme.capacity", "3.5 TeraBytes", "tiers.nvme.capacity", "invalid size unit"),
        ("tiers.nvme.capacity", "lots", "tiers.nvme.capacity", "invalid size"),
        ("tiers.nvme.capacity", "0TB", "tiers.nvme.capacity", "must be > 0"),
        ("tiers.nvme.capacity", 3.5, "tiers.nvme.capacity", "expected string or integer"),
        ("tiers.nvme.capacity", True, "tiers.nvme.capacity", "expected string or integer"),
        ("tiers.nvme.capacity", "9" * 400 + "PB", "tiers.nvme.capacity", ""),
        ("tiers.nvme.read_bandwidth", "12GB", "tiers.nvme.read_bandwidth", "invalid bandwidth"),
        ("tiers.nvme.read_bandwidth", "100Gb/s", "tiers.nvme.read_bandwidth", "bits"),
        ("tiers.nvme.read_bandwidth", "12 parsecs/s", "tiers.nvme.read_bandwidth", "unit"),
        ("tiers.nvme.read_bandwidth", "0GB/s", "tiers.nvme.read_bandwidth", "must be > 0"),
        ("tiers.nvme.read_bandwidth", _DELETE, "tiers.nvme.read_bandwidth", "is missing"),
        ("tiers.nvme.scope", "local", "tiers.nvme.scope", "expected one of"),
        ("tiers.nvme.scope", _DELETE, "tiers.nvme.scope", "is missing"),
        ("tiers.nvme.path", _DELETE, "tiers.nvme.path", "is missing"),
        ("tiers.nvme.path", 7, "tiers.nvme.path", "expected string"),
        ("tiers.nvme.read_bandwith", "1GB/s", "tiers.nvme.read_bandwith", "unknown key"),
        ("tiers.pfs.stripe_count", "many", "tiers.pfs.stripe_count", "'auto'"),
        ("tiers.pfs.stripe_count", 0, "tiers.pfs.stripe_count", ">= 1"),
        ("tiers.pfs.stripe_count", -1, "tiers.pfs.stripe_count", ">= 1"),
        ("tiers.pfs.stripe_count", 2.5, "tiers.pfs.stripe_count", "expected integer or string"),
        ("tiers.pfs.stripe_size", "1000KB", "tiers.pfs.stripe_size", "64 KiB"),
        ("tiers.pfs.stripe_size", "1MB/s", "tiers.pfs.stripe_size", "invalid size"),
        ("tiers.cold.stripe_count", 4, "tiers.cold.stripe_count", "Lustre"),
        ("tiers.nvme.stripe_size", "1MiB", "tiers.nvme.stripe_size", "Lustre"),
        ("tiers.bad name", example_dict()["tiers"]["pfs"], "tiers.bad name", "tier name"),
        ("format", 1, "format", "unknown key"),
    ],
)
def test_errors_name_the_field(dotted, value, field, words):
    err = refused(_set(example_dict(), dotted, value))
    assert err.field == field, str(err)
    assert words in err.message, str(err)


@pytest.mark.parametrize(
    "path",
    [
        "/local/../etc/{dataset}",
        "/local/nvme/..",
        "/local/./nvme",
        "/local//nvme",
        "/local/nvme/",
        "/",
        "/local/%2e%2e/etc",
        "/local/%2E%2E/etc",
        "/local/%252e%252e/etc",  # double-encoded
        "/local/..%2fetc",
        "/local/nvme\\..\\x",
        "/local/a\x00b",
        "/local/a\nb",
        "//server/share/{dataset}",
        "relative/{dataset}",
        "./x",
        "~/x",
        "C:\\data",
        "C:/data",
        "file:///etc",
        "http://host/x",
        "s3://bucket/../x",
        "s3://bucket/a/%2e%2e/x",
        "s3://bucket/",
        "s3://bucket//x",
        "s3://",
        "s3://../x",
        "s3://{dataset}/x",
        "s3://user@bucket/x",
        "s3://bucket/x?versionId=1",
        "s3://bucket/x#frag",
        "/local/{name}",
        "/local/{dataset",
        "",
    ],
)
def test_path_templates_may_not_escape(path):
    obj = example_dict()
    obj["tiers"]["cold"]["path"] = path
    err = refused(obj)
    assert err.field == "tiers.cold.path", str(err)


@pytest.mark.parametrize(
    "path",
    [
        "/local/nvme/{dataset}",
        "/local/nvme/{dataset}/shards",
        "/lustre/ds-{dataset}-v1",
        "/data",
        "s3://bucket",
        "s3://my.bucket-1/prefix/{dataset}",
        "gs://bucket/{dataset}",
        "/local/caf\u00e9/{dataset}",
        "/local/100%/x",  # a literal percent that decodes to nothing bad
    ],
)
def test_good_path_templates(path):
    assert check_path_template(path, "p") == path


def test_bad_toml_and_source_in_message(tmp_path):
    path = tmp_path / "tiers.toml"
    path.write_text("[tiers.nvme\npath = 1\n", encoding="utf-8")
    with pytest.raises(SchemaError) as info:
        load_tier_config(path)
    assert info.value.field == "<root>" and "not valid TOML" in str(info.value)
    assert str(path) in str(info.value)
    path.write_bytes(b"\xff\xfe[tiers]")
    with pytest.raises(SchemaError, match="not valid TOML"):
        load_tier_config(path)
    path.write_text(EXAMPLE_TIERS.replace('"3.5TB"', '"3.5 TiBs"'), encoding="utf-8")
    with pytest.raises(SchemaError) as info:
        load_tier_config(path)
    assert info.value.field == "tiers.nvme.capacity" and str(path) in str(info.value)


def test_deeply_nested_toml_is_a_schema_error():
    with pytest.raises(SchemaError):
        TierConfig.loads("a = " + "[" * 5000 + "]" * 5000)


# --------------------------------------------------------------------------------------------
# bandwidth strings


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("12GB/s", 12 * 10**9),
        ("400 GB/s", 400 * 10**9),
        ("1.5TiB/s", 1.5 * 2**40),
        ("20 MB / s", 20 * 10**6),
        ("3gB/s", 3 * 10**9),
        ("512B/s", 512),
        (1000, 1000),
    ],
)
def test_parse_bandwidth(text, expected):
    assert parse_bandwidth(text) == expected


@pytest.mark.parametrize(
    "text", ["12GB", "GB/s", "12 GB/h", "1e9B/s", "-1GB/s", "100Gb/s", "12XB/s", "", -5]
)
def test_parse_bandwidth_refuses(text):
    with pytest.raises(ValueError):
        parse_bandwidth(text)


def test_format_rate_is_decimal():
    assert format_rate(390_625_000) == "390.6 MB/s"
    assert format_rate(400e9) == "400 GB/s"
    assert format_rate(3.125e9) == "3.125 GB/s"


# --------------------------------------------------------------------------------------------
# fuzz: only SchemaError escapes

_text = st.text(alphabet=string.printable + "\u00e9\x00%{}", max_size=30)
_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    _text,
    st.sampled_from(
        [
            "3.5TB",
            "12GB/s",
            "node",
            "shared",
            "auto",
            "nvme",
            "pfs",
            "/local/{dataset}",
            "s3://b/{dataset}",
            "9" * 400 + "PB",
            "9" * 400 + "PB/s",
        ]
    ),
)
_values = st.recursive(
    _scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_text, inner, max_size=4)),
    max_leaves=12,
)
_tier = st.fixed_dictionaries(
    {},
    optional={
        "path": st.one_of(_values, st.sampled_from(["/a/{dataset}", "/a/../b", "s3://x/%2e%2e"])),
        "scope": st.one_of(_values, st.sampled_from(["node", "shared"])),
        "capacity": st.one_of(_values, st.sampled_from(["1TB", "0B", "1.5 PiB"])),
        "read_bandwidth": st.one_of(_values, st.sampled_from(["1GB/s", "0GB/s", "2 TiB/s"])),
        "stripe_count": st.one_of(_values, st.sampled_from(["auto", 4, 0])),
        "stripe_size": st.one_of(_values, st.sampled_from(["1MiB", "1MB"])),
        "extra": _values,
    },
)
_names = st.one_of(st.sampled_from(["nvme", "pfs", "cold"]), _text)
_document = st.one_of(
    _values,
    st.fixed_dictionaries(
        {},
        optional={
            "tiers": st.one_of(_values, st.dictionaries(_names, _tier, max_size=3)),
            "policy": st.one_of(
                _values,
                st.fixed_dictionaries(
                    {},
                    optional={
                        "hot": st.one_of(_values, st.lists(_names, max_size=3)),
                        "all": st.one_of(_values, st.lists(_names, max_size=3)),
                        "warm": _values,
                    },
                ),
            ),
        },
    ),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_document)
def test_fuzz_only_schema_errors(document):
    try:
        config = TierConfig.from_dict(document)
    except SchemaError as err:
        assert err.field and err.message
        return
    for tier in config.tiers:  # whatever is accepted is safe to substitute into
        assert tier.location("ds").count("ds") >= 1 or "{dataset}" not in tier.path


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_fuzz_toml_text_only_schema_errors(text):
    with contextlib.suppress(SchemaError):
        TierConfig.loads(text)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="/.%2eEfF5c{}datse\\:s3", max_size=24))
def test_fuzz_path_templates(path):
    try:
        check_path_template(path, "p")
    except SchemaError:
        return
    if "://" not in path:
        segments = path[1:].split("/")
        assert path.startswith("/") and ".." not in segments and "" not in segments


_FIELDS = [
    "tiers.nvme.path",
    "tiers.nvme.scope",
    "tiers.nvme.capacity",
    "tiers.nvme.read_bandwidth",
    "tiers.pfs.stripe_count",
    "tiers.pfs.stripe_size",
    "tiers.cold.path",
    "policy.hot",
    "policy.all",
]


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(_FIELDS), _values)
def test_fuzz_one_field_of_the_example(dotted, value):
    """Deeper than random documents: change one field of the example; the result is either
    accepted or refused by a SchemaError naming that field (or an element of it)."""
    try:
        config = TierConfig.from_dict(_set(example_dict(), dotted, value))
    except SchemaError as err:
        assert err.field == dotted or err.field.startswith(dotted + "["), (dotted, str(err))
        return
    for tier in config.tiers:
        check_path_template(tier.location("ds"), "p")

"""Loader batches from per-read numpy: ``to_batch`` once per row group, ``join_rows`` per batch."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from shardfeed.formats.columns import to_table
from shardfeed.loader.columns import join_rows, to_batch
from shardfeed.schemas import Feature, FeatureSpec

SPEC = FeatureSpec(
    (
        Feature("state", "float32", (4,)),
        Feature("image", "image", ()),
        Feature("label", "int64", (1,)),
    )
)
NAMES = ["state", "image", "label"]


def group(first: int, n: int) -> pa.Table:
    ids = np.arange(first, first + n)
    return to_table(
        {
            "state": np.repeat(ids[:, None], 4, axis=1).astype(np.float32),
            "image": [{"bytes": f"img{i}".encode(), "path": None} for i in ids],
            "label": ids[:, None],
        },
        SPEC,
    )


def test_one_part_gives_views_of_the_converted_group():
    arrays = to_batch([group(0, 50)], SPEC, NAMES)
    batch = join_rows([(arrays, 10, 26)], NAMES)
    assert batch["state"].shape == (16, 4)
    assert np.shares_memory(batch["state"], arrays["state"])  # no copy of the tensor
    np.testing.assert_array_equal(batch["label"], np.arange(10, 26))
    assert [bytes(v) for v in batch["image"]] == [f"img{i}".encode() for i in range(10, 26)]


def test_parts_of_several_groups_join_in_order_and_match_a_direct_conversion():
    a, b = group(0, 30), group(30, 40)
    parts = [(to_batch([a], SPEC, NAMES), 25, 30), (to_batch([b], SPEC, NAMES), 0, 11)]
    batch = join_rows(parts, NAMES)
    direct = to_batch([a.slice(25, 5), b.slice(0, 11)], SPEC, NAMES)
    for name in ("state", "label"):
        np.testing.assert_array_equal(batch[name], direct[name])
        assert batch[name].dtype == direct[name].dtype
    assert [bytes(v) for v in batch["image"]] == [bytes(v) for v in direct["image"]]
    np.testing.assert_array_equal(batch["label"], np.arange(25, 41))

"""Exact counts and values of the new sources on the real public corpora in ``../shared/corpora``.

WebDataset's own test shards, video2dataset and clip-retrieval outputs (whose shards 3 and 4 repeat
shard 1's keys and photos), and TFX's Chicago taxi TFRecords, converted whole and as two splits.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from shardfeed.cli.main import main
from shardfeed.formats.reader import open_dataset
from shardfeed.formats.tf_example import decode_example
from shardfeed.formats.tfrecord import iter_records

CORPORA = os.environ.get("SHARDFEED_CORPORA")
pytestmark = pytest.mark.skipif(
    not CORPORA, reason="SHARDFEED_CORPORA is not set (scripts/test.sh sets it)"
)


def convert(capsys, *args: str) -> dict:
    assert main(["convert", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("src", "count"),
    [
        ("wds_webdataset_testdata/sample.tgz", 90),
        ("wds_webdataset_testdata/testgz.tar", 1000),
        ("wds_video2dataset_videos", 6),
        ("wds_clip_retrieval_images", 11),
    ],
)
def test_webdataset_corpora_give_their_exact_sample_counts(tmp_path, capsys, src, count):
    summary = convert(capsys, str(Path(CORPORA, src)), str(tmp_path / "ds"))
    assert summary["samples_out"] == count and summary["rejects"]["total"] == 0
    assert len(open_dataset(tmp_path / "ds")) == count


def test_clip_retrieval_dedup_removes_the_repeated_photos(tmp_path, capsys):
    """Shards 3 and 4 repeat shard 1's keys and photos: 11 samples, 7 distinct contents."""
    src = str(Path(CORPORA, "wds_clip_retrieval_images", "image{1..4}.tar"))
    summary = convert(capsys, src, str(tmp_path / "ds"), "--dedup")
    assert summary["samples_out"] == 7 and summary["duplicates"]["total"] == 4
    ds = open_dataset(tmp_path / "ds")
    assert ds.manifest.duplicates.total == 4
    rows = ds.read(0, len(ds))
    assert all(url.endswith(("image1.tar", "image2.tar")) for url in rows["__url__"])
    lines = (tmp_path / "ds/meta/shardfeed/duplicates.jsonl").read_text().splitlines()
    assert len(lines) == 4


def chicago(split: str) -> list[dict]:
    folder = Path(CORPORA, "tfrecord_chicago_taxi/csv_example_gen", split)
    return [decode_example(data) for f in sorted(folder.iterdir()) for _, data in iter_records(f)]


def first_value(example: dict, feature: str):
    _, values = example.get(feature, (None, None))
    return values[0] if values is not None and len(values) else None


def test_chicago_splits_convert_into_one_dataset_and_read_back_exactly(tmp_path, capsys):
    base = Path(CORPORA, "tfrecord_chicago_taxi/csv_example_gen")
    dst = tmp_path / "taxi"
    args = ["--split", f"train={base / 'Split-train'}", "--split", f"eval={base / 'Split-eval'}"]
    summary = convert(capsys, *args, str(dst), "--no-shuffle")
    assert summary["samples_out"] == 15000
    ds = open_dataset(dst)
    splits = {s.name: (s.index_start, s.index_end) for s in ds.manifest.splits}
    assert splits == {"train": (0, 9909), "eval": (9909, 15000)}
    for name, (a, b) in splits.items():
        rows = ds.read(a, b)
        direct = chicago("Split-train" if name == "train" else "Split-eval")
        assert len(direct) == b - a
        for feature in ("fare", "trip_start_timestamp", "company"):
            got = rows[feature]
            want = [first_value(e, feature) for e in direct]
            if ds.features[feature].dtype == "string":
                assert list(got) == [None if w is None else w.decode() for w in want]
            else:
                expected = np.array([np.nan if w is None else w for w in want], dtype=got.dtype)
                np.testing.assert_array_equal(got, expected)

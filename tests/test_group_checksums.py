"""Row-group CRC32Cs in the Parquet footer (``formats/group_checksums.py``): written for every
group, checked before a local group is decoded, and the fallback to page checksums."""

from __future__ import annotations

import json
from pathlib import Path

import crc32c
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardfeed import write_dataset
from shardfeed.formats.encoding import get_encoding
from shardfeed.formats.errors import CorruptShardError
from shardfeed.formats.group_checksums import KEY, ChecksumError, GroupChecksums
from shardfeed.formats.reader import open_dataset
from shardfeed.schemas import Feature, FeatureSpec

SPEC = FeatureSpec((Feature("image", "image"), Feature("label", "int64")))


@pytest.fixture
def shard(tmp_path) -> Path:
    """A one-shard dataset of incompressible payloads in several row groups."""
    rng = np.random.default_rng(0)
    n = 400
    data = {
        "image": [rng.bytes(int(rng.integers(500, 3000))) for _ in range(n)],
        "label": np.arange(n, dtype=np.int64),
    }
    write_dataset(tmp_path / "ds", SPEC, data, row_group_size=100_000, cost="bytes")
    (path,) = (tmp_path / "ds/data").rglob("*.parquet")
    return path


def entry(path: Path) -> dict:
    return json.loads(pq.read_metadata(path).metadata[KEY])


def test_every_group_is_checksummed_over_contiguous_ranges(shard):
    metadata = pq.read_metadata(shard)
    value = entry(shard)
    assert metadata.num_row_groups >= 4 and len(value["ends"]) == metadata.num_row_groups
    data = shard.read_bytes()
    start = 0
    for g, (end, crc) in enumerate(zip(value["ends"], value["crc32c"], strict=True)):
        assert crc32c.crc32c(data[start:end]) == crc, f"group {g}"
        first = metadata.row_group(g).column(0)
        assert start <= (first.dictionary_page_offset or first.data_page_offset) < end
        start = end
    assert data[start:].endswith(b"PAR1") and len(data) - start < 64 << 10  # just the footer


def test_page_checksums_are_still_written_for_other_readers(shard):
    table = pq.ParquetFile(shard, page_checksum_verification=True).read()
    assert table.num_rows == 400


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_flipped_byte_in_any_group_is_refused_before_decoding(shard, where):
    value = entry(shard)
    g = {"first": 0, "middle": len(value["ends"]) // 2, "last": len(value["ends"]) - 1}[where]
    start = value["ends"][g - 1] if g else 0
    data = bytearray(shard.read_bytes())
    pos = (start + value["ends"][g]) // 2
    data[pos] ^= 0x01
    shard.write_bytes(bytes(data))
    opened = get_encoding("parquet").open(str(shard))
    for other in range(len(value["ends"])):
        if other != g:
            assert opened.read_row_groups([other], None).num_rows > 0
    with pytest.raises(ChecksumError, match=f"row group {g} .* fails its CRC32C"):
        opened.read_row_groups([g], ["label"])  # whichever columns: the whole range is checked


def test_the_reader_reports_a_failed_group_as_a_corrupt_shard(shard):
    value = entry(shard)
    data = bytearray(shard.read_bytes())
    data[value["ends"][0] + 10] ^= 0x80  # inside group 1
    shard.write_bytes(bytes(data))
    ds = open_dataset(shard.parents[2])
    with pytest.raises(CorruptShardError, match="CRC32C"):
        ds.read_row_group(0, 1)
    assert ds.read_row_group(0, 0).num_rows > 0


def test_a_shard_without_the_entry_falls_back_to_page_checksums(tmp_path):
    """Shards written before the entry existed: page CRCs are checked, as before."""
    path = tmp_path / "old.parquet"
    table = pa.table({"image": [bytes(range(256)) * 40] * 50, "label": list(range(50))})
    pq.write_table(table, path, write_page_checksum=True, compression="none")
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x01
    path.write_bytes(bytes(data))
    opened = get_encoding("parquet").open(str(path))
    with pytest.raises(OSError, match=r"(?i)crc|checksum"):
        opened.read_row_groups([0], None)


def test_object_store_shards_keep_page_checksums(shard):
    """A remote shard is not re-read for a range CRC: its page CRCs are checked instead."""
    data = bytearray(shard.read_bytes())
    data[entry(shard)["ends"][0] // 2] ^= 0x01  # a payload byte of group 0
    opened = get_encoding("parquet").open(pa.BufferReader(bytes(data)))
    with pytest.raises(OSError, match=r"(?i)crc|checksum"):
        opened.read_row_groups([0], ["image"])


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (b"not json", "malformed"),
        (b'{"ends": [10]}', "malformed"),
        (b'{"ends": [10, 20], "crc32c": [1]}', "2 ranges and 1 CRCs for 2 row groups"),
        (b'{"ends": [10, -5], "crc32c": [1, 2]}', "non-negative integers"),
        (b'{"ends": [10, 20], "crc32c": [1, 4294967296]}', "non-negative integers"),
        (b'{"ends": [10, 15], "crc32c": [1, 2]}', r"row group 1 spans bytes \[12, 18\)"),
    ],
)
def test_a_malformed_entry_names_the_problem(value, message):
    with pytest.raises(ValueError, match=message):
        GroupChecksums.from_metadata({KEY: value}, [(4, 10), (12, 18)])


def test_a_tampered_entry_makes_the_footer_unreadable(shard, tmp_path):
    """An entry whose ranges disagree with the footer is a corrupt shard, not a skipped check."""
    table = pq.read_table(shard)
    bad = tmp_path / "bad.parquet"
    with pq.ParquetWriter(bad, table.schema) as writer:
        writer.write_table(table)
        writer.add_key_value_metadata({KEY: b'{"ends": [5], "crc32c": [0]}'})
    with pytest.raises(ValueError, match="checksummed range"):
        get_encoding("parquet").open(str(bad))

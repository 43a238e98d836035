"""A generator of hostile corpora: one small builder per kind of bad input, and the rejects it must give.

Every builder writes one hostile input (usually with good records around it) into a corpus of its
source type and returns a :class:`Written`: the reject records the conversion must produce (source,
position, reason), the good records that must still arrive, and the paths a careless reader would
create or follow (they must never exist after the run). ``KINDS`` maps each kind name to its source
type, builder and expected reason; :func:`build_corpus` writes one corpus per source type holding a
base of good records plus every kind of that type, so one conversion per source type covers them
all. ``outside`` is a directory next to the corpus root (never inside it): symlinks point there, and
archive members try to write there.

Identifiers of good records, per source type (see :func:`good_ids` in the tests): the image's
root-relative path (imagefolder), the ``id`` field (jsonl, parquet, tfrecord), ``shard/key``
(webdataset) and ``episode:N`` of the source episode (lerobot).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import struct
import tarfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard
from PIL import Image
from test_source_lerobot import V21_DATA, episode_table, make_v21

from shardfeed.formats.tf_example import encode_example
from shardfeed.formats.tfrecord import masked_crc32c, write_records
from shardfeed.schemas.features import IMAGE_ARROW_TYPE

#: Decompressed-size bound the JSONL corpus is converted with (the CLI default is 8 GiB, far too slow
#: to exceed in a test); the bombs expand to 16x this.
JSONL_MAX_EXPANDED = 4 << 20
#: Line bound the JSONL corpus is converted with (the CLI default is 64 MiB).
JSONL_MAX_LINE = 64 << 10
#: Pillow's bound is about 89.5 megapixels; the image bombs declare 40-110x that.
BOMB_SIDE_PNG = 100_000
BOMB_SIDE_JPEG = 65_000


class Expect(NamedTuple):
    """One reject record the conversion must write; ``position`` None matches any position."""

    source: str
    position: str | None
    reason: str


@dataclass
class Written:
    """What a builder wrote: the rejects it must cause, the good records that must survive it, and
    paths outside DST that must not exist after the conversion."""

    expects: list[Expect]
    good: set[str] = field(default_factory=set)
    spoiled: set[str] = field(default_factory=set)  # good records of the base this kind breaks
    forbidden: list[Path] = field(default_factory=list)


Builder = Callable[[Path, Path], Written]


class Kind(NamedTuple):
    source: str  # --from source type
    build: Builder
    reason: str  # the reject reason every record in Written.expects carries


# --------------------------------------------------------------------------------------------------
# small encoders


def image_bytes(
    fmt: str, mode: str = "RGB", size: tuple[int, int] = (16, 12), seed: int = 0
) -> bytes:
    """A small real image of random pixels in ``fmt`` and ``mode``."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(out, fmt)
    return out.getvalue()


def animated(fmt: str) -> bytes:
    """A two-frame animation (GIF, APNG or WebP)."""
    first, second = Image.new("RGB", (8, 8), (255, 0, 0)), Image.new("RGB", (8, 8), (0, 0, 255))
    out = io.BytesIO()
    first.save(out, fmt, save_all=True, append_images=[second], duration=100)
    return out.getvalue()


def png_chunk(tag: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body))


def png_bomb() -> bytes:
    """A valid 16x12 PNG whose IHDR (CRC fixed up) declares BOMB_SIDE_PNG^2 pixels."""
    data = bytearray(image_bytes("PNG"))
    struct.pack_into(">II", data, 16, BOMB_SIDE_PNG, BOMB_SIDE_PNG)
    struct.pack_into(">I", data, 29, zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def jpeg_bomb() -> bytes:
    """A valid JPEG whose SOF0 frame header declares BOMB_SIDE_JPEG^2 pixels."""
    data = bytearray(image_bytes("JPEG"))
    sof = data.index(b"\xff\xc0")
    struct.pack_into(">HH", data, sof + 5, BOMB_SIDE_JPEG, BOMB_SIDE_JPEG)
    return bytes(data)


def png_text_bomb() -> bytes:
    """A valid PNG with a zTXt chunk that inflates to 64 MiB (Pillow's text bound is 1 MiB)."""
    data = image_bytes("PNG")
    ztxt = png_chunk(b"zTXt", b"Comment\0\0" + zlib.compress(b"\0" * (64 << 20), 9))
    return data[:33] + ztxt + data[33:]  # right after the 8-byte signature and 25-byte IHDR


def png_corrupt_pixels() -> bytes:
    """A PNG whose IDAT holds garbage (with a correct chunk CRC): the header is fine, decoding fails."""
    data = bytearray(image_bytes("PNG", size=(32, 32), seed=3))
    idat = data.index(b"IDAT")
    length = struct.unpack_from(">I", data, idat - 4)[0]
    body = idat + 4
    data[body + 2 : body + length] = bytes((i * 37 + 11) % 256 for i in range(length - 2))
    struct.pack_into(">I", data, body + length, zlib.crc32(bytes(data[idat : body + length])))
    return bytes(data)


def jl(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def tar_member(name: str, data: bytes = b"", **attrs: object) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data) if attrs.get("type", tarfile.REGTYPE) == tarfile.REGTYPE else 0
    info.mtime = 0
    for key, value in attrs.items():
        setattr(info, key, value)
    return info, data


def write_tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    """Write a plain tar of ``members`` (names kept exactly, even absolute or ``..``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    path.write_bytes(out.getvalue())
    return out.getvalue()


def good_sample(key: str) -> list[tuple[tarfile.TarInfo, bytes]]:
    return [
        tar_member(f"{key}.jpg", image_bytes("JPEG", seed=sum(key.encode()))),
        tar_member(f"{key}.cls", b"1"),
    ]


def tf_example(i: int) -> bytes:
    return encode_example(
        {"id": ("int64", [i]), "vec": ("float", [i, i / 2]), "text": ("bytes", [b"t%d" % i])}
    )


def parquet_rows(start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "score": pa.array(ids / 4.0, pa.float64()),
            "caption": pa.array([f"row {i}" for i in ids.tolist()]),
        }
    )


def write_parquet(path: Path, table: pa.Table, row_group_size: int = 4) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=row_group_size, compression="zstd")
    return path.read_bytes()


def ids_of(table: pa.Table) -> set[str]:
    return {str(i) for i in table.column("id").to_pylist()}


# --------------------------------------------------------------------------------------------------
# imagefolder: root/<class>/<image>; hostile images go to class "cat"


def _image(name: str, data: bytes, reason: str) -> Builder:
    def build(root: Path, outside: Path) -> Written:
        (root / "cat" / name).write_bytes(data)
        return Written([Expect(f"cat/{name}", "", reason)])

    build.__doc__ = f"cat/{name}: {reason}"
    return build


def image_symlink_file(root: Path, outside: Path) -> Written:
    """cat/escape.jpg -> a good JPEG outside the root."""
    (outside / "secret.jpg").write_bytes(image_bytes("JPEG", seed=9))
    os.symlink(outside / "secret.jpg", root / "cat" / "escape.jpg")
    return Written([Expect("cat/escape.jpg", "", "path_escape")])


def image_symlink_dir(root: Path, outside: Path) -> Written:
    """cat/more -> a directory of good images outside the root, and class ``zoo`` -> the same."""
    (outside / "more").mkdir()
    (outside / "more" / "a.png").write_bytes(image_bytes("PNG", seed=10))
    os.symlink(outside / "more", root / "cat" / "more")
    os.symlink(outside / "more", root / "zoo")
    return Written([Expect("cat/more", "", "path_escape"), Expect("zoo", "", "path_escape")])


def image_symlink_relative(root: Path, outside: Path) -> Written:
    """cat/up.png -> ../../outside/up.png, a relative link climbing out of the root."""
    (outside / "up.png").write_bytes(image_bytes("PNG", seed=11))
    rel = os.path.relpath(outside / "up.png", root / "cat")
    os.symlink(rel, root / "cat" / "up.png")
    return Written([Expect("cat/up.png", "", "path_escape")])


def imagefolder_base(root: Path, outside: Path) -> set[str]:
    """Good images, including odd but supported ones (CMYK, 16-bit, palette, a PNG named .jpg)."""
    goods = {
        "cat/good0.jpg": image_bytes("JPEG", seed=1),
        "cat/good1.png": image_bytes("PNG", seed=2),
        "dog/good2.webp": image_bytes("WEBP", seed=3),
        "dog/cmyk.jpg": image_bytes("JPEG", "CMYK", seed=4),
        "dog/gray16.png": image_bytes("PNG", "I;16", seed=5),
        "dog/palette.png": image_bytes("PNG", "P", seed=6),
        "dog/png_named.jpg": image_bytes("PNG", seed=7),  # content decides the format
        "dog/sub/nested.jpeg": image_bytes("JPEG", seed=8),
    }
    for rel, data in goods.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return set(goods)


# --------------------------------------------------------------------------------------------------
# jsonl: each kind is its own file: a good line, the hostile line, a good line


def _jsonl(name: str, bad: bytes, reason: str) -> Builder:
    def build(root: Path, outside: Path) -> Written:
        stem = name.replace(".", "_")
        before, after = f"{stem}-before", f"{stem}-after"
        lines = [
            jl({"id": before, "text": "ok", "score": 1.0}),
            bad,
            jl({"id": after, "text": "ok", "score": 2.0}),
        ]
        (root / name).write_bytes(b"\n".join(lines) + b"\n")
        return Written([Expect(name, "line:2", reason)], good={before, after})

    build.__doc__ = f"{name}: line 2 is a {reason} reject"
    return build


def _jsonl_bomb(name: str, compress: Callable[[bytes], bytes], zeros: bytes) -> Builder:
    def build(root: Path, outside: Path) -> Written:
        stem = name.replace(".", "_")
        head = b"".join(
            jl({"id": f"{stem}-{i}", "text": "before the bomb", "score": 0.5}) + b"\n"
            for i in range(2)
        )
        copies = 16 * JSONL_MAX_EXPANDED // (1 << 20)  # each copy inflates to 1 MiB of zeros
        (root / name).write_bytes(compress(head) + zeros * copies)
        return Written(
            [Expect(name, "line:3", "decompression_bomb")], good={f"{stem}-0", f"{stem}-1"}
        )

    build.__doc__ = f"{name}: two good lines, then 16x the bound of zeros without a newline"
    return build


def jsonl_symlink(root: Path, outside: Path) -> Written:
    """escape.jsonl -> a good JSONL file outside the root."""
    (outside / "secret.jsonl").write_bytes(
        jl({"id": "secret", "text": "outside", "score": 9.0}) + b"\n"
    )
    os.symlink(outside / "secret.jsonl", root / "escape.jsonl")
    return Written([Expect("escape.jsonl", "", "path_escape")])


def jsonl_base(root: Path, outside: Path) -> set[str]:
    """Twelve good records: ``score`` votes float and ``meta`` json, so wrong types stand out."""
    records = [
        {"id": f"good-{i}", "text": f"document {i}", "score": i / 3, "meta": {"k": i}}
        for i in range(12)
    ]
    (root / "good.jsonl").write_bytes(b"".join(jl(r) + b"\n" for r in records))
    return {r["id"] for r in records}


_GZIP_ZEROS = gzip.compress(b"\0" * (1 << 20), 9, mtime=0)
_ZSTD_ZEROS = zstandard.ZstdCompressor(level=19).compress(b"\0" * (1 << 20))


# --------------------------------------------------------------------------------------------------
# parquet: good files hold the most rows, so they set the corpus schema


def parquet_corrupt_footer(root: Path, outside: Path) -> Written:
    """A real Parquet file whose footer metadata is overwritten (magic and length intact)."""
    data = bytearray(write_parquet(root / "corrupt_footer.parquet", parquet_rows(100, 6)))
    footer_len = struct.unpack_from("<I", data, len(data) - 8)[0]
    start = len(data) - 8 - footer_len
    data[start : start + footer_len // 2] = b"\xff" * (footer_len // 2)
    (root / "corrupt_footer.parquet").write_bytes(bytes(data))
    return Written([Expect("corrupt_footer.parquet", "", "parquet_corrupt")])


def parquet_truncated(root: Path, outside: Path) -> Written:
    """A Parquet file cut in half: no footer at all."""
    data = write_parquet(root / "truncated.parquet", parquet_rows(200, 6))
    (root / "truncated.parquet").write_bytes(data[: len(data) // 2])
    return Written([Expect("truncated.parquet", "", "parquet_corrupt")])


def parquet_not_parquet(root: Path, outside: Path) -> Written:
    """A CSV named .parquet."""
    (root / "not_parquet.parquet").write_bytes(b"id,score\n1,2.0\n")
    return Written([Expect("not_parquet.parquet", "", "parquet_corrupt")])


def parquet_bad_pages(root: Path, outside: Path) -> Written:
    """A readable footer, but row group 1's data pages are garbage: that row group is one reject."""
    table = pa.table(
        {
            "id": np.arange(300, 330),
            "score": np.arange(30) * 1.5,
            "caption": [f"row {i} " * 6 for i in range(30)],
        }
    )
    path = root / "bad_pages.parquet"
    write_parquet(path, table, row_group_size=10)
    column = pq.ParquetFile(path).metadata.row_group(1).column(2)
    data = bytearray(path.read_bytes())
    start = column.data_page_offset + column.total_compressed_size // 2
    data[start : start + 16] = b"\xaa" * 16
    path.write_bytes(bytes(data))
    good = {str(i) for i in range(300, 330) if not 310 <= i < 320}
    return Written([Expect("bad_pages.parquet", "row_group:1", "parquet_corrupt")], good=good)


def parquet_drift_type(root: Path, outside: Path) -> Written:
    """``score`` is a string column in this file (float64 in the corpus)."""
    table = parquet_rows(400, 5).set_column(1, "score", pa.array(["high"] * 5))
    write_parquet(root / "drift_type.parquet", table)
    return Written([Expect("drift_type.parquet", "", "schema_drift")])


def parquet_drift_columns(root: Path, outside: Path) -> Written:
    """A file without ``caption`` and with an extra column."""
    table = parquet_rows(500, 5).drop(["caption"]).append_column("extra", pa.array([1] * 5))
    write_parquet(root / "drift_columns.parquet", table)
    return Written([Expect("drift_columns.parquet", "", "schema_drift")])


def parquet_symlink(root: Path, outside: Path) -> Written:
    """escape.parquet -> a good Parquet file outside the root."""
    write_parquet(outside / "secret.parquet", parquet_rows(900, 3))
    os.symlink(outside / "secret.parquet", root / "escape.parquet")
    return Written([Expect("escape.parquet", "", "path_escape")])


def parquet_base(root: Path, outside: Path) -> set[str]:
    tables = [parquet_rows(0, 20), parquet_rows(20, 20)]
    for number, table in enumerate(tables):
        write_parquet(root / f"good-{number}.parquet", table)
    return set().union(*(ids_of(t) for t in tables))


# --------------------------------------------------------------------------------------------------
# tfrecord


def _tfrecord_file(root: Path, name: str, ids: range) -> tuple[Path, list[int], bytearray]:
    path = root / name
    offsets = write_records(path, [tf_example(i) for i in ids])
    return path, offsets, bytearray(path.read_bytes())


def tfrecord_data_crc(root: Path, outside: Path) -> Written:
    """Record 1's data bytes flipped: that record goes, reading goes on."""
    path, offsets, data = _tfrecord_file(root, "data_crc.tfrecord", range(1000, 1004))
    data[offsets[1] + 14] ^= 0xFF
    path.write_bytes(bytes(data))
    return Written(
        [Expect(path.name, f"offset:{offsets[1]}", "tfrecord_data_crc")],
        good={"1000", "1002", "1003"},
    )


def tfrecord_length_crc(root: Path, outside: Path) -> Written:
    """Record 2's length field changed: nothing after it can be framed."""
    path, offsets, data = _tfrecord_file(root, "length_crc.tfrecord", range(1100, 1104))
    data[offsets[2]] ^= 0x01
    path.write_bytes(bytes(data))
    return Written(
        [Expect(path.name, f"offset:{offsets[2]}", "tfrecord_length_crc")], good={"1100", "1101"}
    )


def tfrecord_truncated(root: Path, outside: Path) -> Written:
    """The file ends in the middle of record 2."""
    path, offsets, data = _tfrecord_file(root, "truncated.tfrecord", range(1200, 1203))
    path.write_bytes(bytes(data[: offsets[2] + 20]))
    return Written(
        [Expect(path.name, f"offset:{offsets[2]}", "tfrecord_truncated")], good={"1200", "1201"}
    )


def tfrecord_length_bomb(root: Path, outside: Path) -> Written:
    """Record 1's header declares 2^40 bytes (its length CRC valid): never allocated, never read."""
    path, offsets, data = _tfrecord_file(root, "length_bomb.tfrecord", range(1300, 1302))
    length = struct.pack("<Q", 1 << 40)
    header = length + struct.pack("<I", masked_crc32c(length))
    path.write_bytes(bytes(data[: offsets[1]]) + header + b"\0" * 64)
    return Written([Expect(path.name, f"offset:{offsets[1]}", "tfrecord_truncated")], good={"1300"})


def tfrecord_not_example(root: Path, outside: Path) -> Written:
    """A well-framed record holding a truncated protobuf instead of a tf.train.Example."""
    path = root / "not_example.tfrecord"
    offsets = write_records(path, [tf_example(1400), b"\x0a\x05\x0a\x03\x0a\x01", tf_example(1401)])
    return Written(
        [Expect(path.name, f"offset:{offsets[1]}", "example_invalid")], good={"1400", "1401"}
    )


def tfrecord_wrong_type(root: Path, outside: Path) -> Written:
    """``id`` holds bytes in one record (int64 everywhere else)."""
    path = root / "wrong_type.tfrecord"
    bad = encode_example(
        {"id": ("bytes", [b"not an int"]), "vec": ("float", [0, 0]), "text": ("bytes", [b"x"])}
    )
    write_records(path, [tf_example(1500), bad])
    return Written([Expect(path.name, "record:1", "field_type")], good={"1500"})


def tfrecord_bad_gzip(root: Path, outside: Path) -> Written:
    """A GZIP TFRecord whose first deflate block has an invalid type (the gzip header is fine)."""
    path = root / "bad_gzip.tfrecord.gz"
    write_records(path, [tf_example(i) for i in range(1600, 1640)], compression="gzip")
    data = bytearray(path.read_bytes())
    data[10] = 0xFF  # the first byte after the 10-byte gzip header: BTYPE=11 is reserved
    path.write_bytes(bytes(data))
    return Written([Expect(path.name, "offset:0", "tfrecord_gzip")])


def tfrecord_symlink(root: Path, outside: Path) -> Written:
    """escape.tfrecord -> a good TFRecord file outside the root."""
    write_records(outside / "secret.tfrecord", [tf_example(1700)])
    os.symlink(outside / "secret.tfrecord", root / "escape.tfrecord")
    return Written([Expect("escape.tfrecord", "", "path_escape")])


def tfrecord_base(root: Path, outside: Path) -> set[str]:
    write_records(root / "good.tfrecord", [tf_example(i) for i in range(20)])
    return {str(i) for i in range(20)}


# --------------------------------------------------------------------------------------------------
# webdataset: one tar per kind, a good sample before and after the hostile members


def _tar_kind(
    name: str, reason: str, hostile: Callable[[Path], list], positions: Callable[[Path], list[str]]
) -> Builder:
    def build(root: Path, outside: Path) -> Written:
        shard = f"{name}.tar"
        members = [*good_sample("first"), *hostile(outside), *good_sample("last")]
        write_tar(root / shard, members)
        expects = [Expect(shard, p, reason) for p in positions(outside)]
        return Written(
            expects,
            good={f"{shard}/first", f"{shard}/last"},
            forbidden=_tar_targets(root, outside, members),
        )

    build.__doc__ = f"{name}.tar: {reason}"
    return build


def _tar_targets(root: Path, outside: Path, members: list) -> list[Path]:
    """Where each member or link would land if extracted in the root, the cwd or next to it."""
    out = []
    for info, _ in members:
        for name in (info.name, info.linkname):
            if name and (name.startswith("/") or ".." in name.split("/")):
                out += [Path(name)] if name.startswith("/") else [root / name, outside / name]
    return out


def tar_truncated(root: Path, outside: Path) -> Written:
    """A tar cut inside its third sample's image: the first two samples stay."""
    members = [*good_sample("t0"), *good_sample("t1"), *good_sample("t2")]
    body = write_tar(root / "truncated.tar", members)
    image = members[4][1]
    cut = body.index(image) + len(image) // 2
    (root / "truncated.tar").write_bytes(body[:cut])
    return Written(
        [Expect("truncated.tar", None, "io_error")], good={"truncated.tar/t0", "truncated.tar/t1"}
    )


def tar_not_a_tar(root: Path, outside: Path) -> Written:
    """Random bytes named .tar."""
    (root / "garbage.tar").write_bytes(np.random.default_rng(5).bytes(3000))
    return Written([Expect("garbage.tar", None, "io_error")])


def tar_repeated_key(root: Path, outside: Path) -> Written:
    """Key ``k`` ends, another sample follows, then ``k`` comes back."""
    members = [*good_sample("k"), *good_sample("other"), tar_member("k.txt", b"again")]
    write_tar(root / "repeated.tar", members)
    return Written(
        [Expect("repeated.tar", "key:k", "key_repeated")],
        good={"repeated.tar/k", "repeated.tar/other"},
    )


def tar_bad_image(root: Path, outside: Path) -> Written:
    """A sample whose .png is a decompression bomb: the whole sample goes."""
    members = [
        *good_sample("fine"),
        tar_member("bomb.png", png_bomb()),
        tar_member("bomb.cls", b"2"),
    ]
    write_tar(root / "bad_image.tar", members)
    return Written(
        [Expect("bad_image.tar", "key:bomb", "image_too_large")], good={"bad_image.tar/fine"}
    )


def tar_shard_symlink(root: Path, outside: Path) -> Written:
    """escape.tar -> a good shard outside the root."""
    write_tar(outside / "secret.tar", good_sample("secret"))
    os.symlink(outside / "secret.tar", root / "escape.tar")
    return Written([Expect("escape.tar", None, "path_escape")])


def webdataset_base(root: Path, outside: Path) -> set[str]:
    write_tar(root / "good.tar", [m for i in range(6) for m in good_sample(f"g{i}")])
    return {f"good.tar/g{i}" for i in range(6)}


# --------------------------------------------------------------------------------------------------
# lerobot (v2.1): a consistent base of episodes 0..9; each kind breaks one episode


LEROBOT_BASE = {n: 3 + n % 3 for n in range(10)}
CAMERA = "observation.images.top"


def _episodes(root: Path) -> list[dict]:
    return [json.loads(line) for line in (root / "meta/episodes.jsonl").read_text().splitlines()]


def _set_episodes(root: Path, rows: list[dict]) -> None:
    (root / "meta/episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _data(n: int) -> str:
    return V21_DATA.format(episode_chunk=0, episode_index=n)


def _first_index(n: int) -> int:
    return sum(LEROBOT_BASE[m] for m in range(n))


def _episode(n: int) -> pa.Table:
    """Episode ``n`` of the base as the v2.1 fixture writes it, but with real PNG frames (the
    fixture's placeholder bytes are not images, and the writer decodes frames for camera stats)."""
    table = episode_table(n, LEROBOT_BASE[n], _first_index(n), task=n % 2)
    frames = [image_bytes("PNG", size=(4, 4), seed=n * 100 + i) for i in range(LEROBOT_BASE[n])]
    column = pa.array([{"bytes": b, "path": None} for b in frames], IMAGE_ARROW_TYPE)
    return table.set_column(table.schema.get_field_index(CAMERA), CAMERA, column)


def lerobot_length_mismatch(root: Path, outside: Path) -> Written:
    """meta/episodes.jsonl says episode 1 has 9 frames; its file has 4."""
    rows = _episodes(root)
    for row in rows:
        if row["episode_index"] == 1:
            row["length"] = 9
    _set_episodes(root, rows)
    return Written([Expect(_data(1), "episode:1", "episode_inconsistent")], spoiled={"episode:1"})


def lerobot_unlisted_episode(root: Path, outside: Path) -> Written:
    """Episode 2 has rows but no entry in meta/episodes.jsonl."""
    _set_episodes(root, [r for r in _episodes(root) if r["episode_index"] != 2])
    return Written([Expect(_data(2), "episode:2", "episode_inconsistent")], spoiled={"episode:2"})


def lerobot_missing_data(root: Path, outside: Path) -> Written:
    """meta/episodes.jsonl lists episode 12, whose data file does not exist."""
    _set_episodes(root, [*_episodes(root), {"episode_index": 12, "tasks": ["task 0"], "length": 5}])
    return Written([Expect(_data(12), "episode:12", "episode_inconsistent")])


def lerobot_index_gap(root: Path, outside: Path) -> Written:
    """Episode 3's global ``index`` column jumps by 5 in the middle."""
    table = _episode(3)
    index = table.column("index").to_numpy().copy()
    index[1:] += 5
    pq.write_table(
        table.set_column(table.schema.get_field_index("index"), "index", pa.array(index)),
        root / _data(3),
    )
    return Written([Expect(_data(3), "episode:3", "episode_inconsistent")], spoiled={"episode:3"})


def lerobot_unknown_task(root: Path, outside: Path) -> Written:
    """Episode 4's rows name task_index 7; meta/tasks.jsonl has tasks 0 and 1."""
    table = _episode(4)
    column = pa.array(np.full(LEROBOT_BASE[4], 7, dtype=np.int64))
    pq.write_table(
        table.set_column(table.schema.get_field_index("task_index"), "task_index", column),
        root / _data(4),
    )
    return Written([Expect(_data(4), "episode:4", "episode_inconsistent")], spoiled={"episode:4"})


def lerobot_feature_shape(root: Path, outside: Path) -> Written:
    """info.json declares observation.state [3]; episode 5's file stores 4 values per frame."""
    table = _episode(5)
    wide = np.arange(LEROBOT_BASE[5] * 4, dtype=np.float32)
    column = pa.FixedSizeListArray.from_arrays(pa.array(wide), 4)
    pq.write_table(table.set_column(0, "observation.state", column), root / _data(5))
    return Written([Expect(_data(5), "episode:5", "field_type")], spoiled={"episode:5"})


def lerobot_no_episode_column(root: Path, outside: Path) -> Written:
    """Episode 6's file lacks the episode_index column altogether."""
    table = _episode(6)
    pq.write_table(table.drop(["episode_index"]), root / _data(6))
    return Written([Expect(_data(6), "", "field_missing")], spoiled={"episode:6"})


def lerobot_corrupt_frame(root: Path, outside: Path) -> Written:
    """Frame 1 of episode 8's image feature is a truncated PNG (the other frames are fine)."""
    table = _episode(8)
    frames = table.column(CAMERA).to_pylist()
    frames[1] = {"bytes": image_bytes("PNG", size=(64, 64))[:-300], "path": None}
    column = pa.array(frames, IMAGE_ARROW_TYPE)
    pq.write_table(
        table.set_column(table.schema.get_field_index(CAMERA), CAMERA, column), root / _data(8)
    )
    return Written([Expect(_data(8), "episode:8", "image_truncated")], spoiled={"episode:8"})


def lerobot_symlink(root: Path, outside: Path) -> Written:
    """Episode 7's data file is a link to a good copy of it outside the root."""
    path = root / _data(7)
    os.replace(path, outside / "episode_000007.parquet")
    os.symlink(outside / "episode_000007.parquet", path)
    return Written([Expect(_data(7), "", "path_escape")], spoiled={"episode:7"})


def lerobot_base(root: Path, outside: Path) -> set[str]:
    """Episodes 0..9; info.json's totals then disagree with the broken metadata (a note, not a reject)."""
    make_v21(root, LEROBOT_BASE)
    for n in LEROBOT_BASE:
        pq.write_table(_episode(n), root / _data(n))
    return {f"episode:{n}" for n in LEROBOT_BASE}


# --------------------------------------------------------------------------------------------------
# the registry

KINDS: dict[str, Kind] = {
    # images (imagefolder, validated in full as the CLI default does)
    "image_truncated_png": Kind(
        "imagefolder",
        _image("trunc.png", image_bytes("PNG", size=(64, 64))[:-300], "image_truncated"),
        "image_truncated",
    ),
    "image_truncated_jpeg": Kind(
        "imagefolder",
        _image("trunc.jpg", image_bytes("JPEG", size=(64, 64))[:400], "image_truncated"),
        "image_truncated",
    ),
    "image_empty": Kind("imagefolder", _image("empty.jpg", b"", "image_empty"), "image_empty"),
    "image_random_bytes": Kind(
        "imagefolder",
        _image("random.png", np.random.default_rng(7).bytes(2048), "image_not_image"),
        "image_not_image",
    ),
    "image_wrong_extension": Kind(
        "imagefolder",
        _image("report.webp", b"%PDF-1.4\n1 0 obj\n<<>>\nendobj\n", "image_not_image"),
        "image_not_image",
    ),
    "image_bomb_png": Kind(
        "imagefolder", _image("bomb.png", png_bomb(), "image_too_large"), "image_too_large"
    ),
    "image_bomb_jpeg": Kind(
        "imagefolder", _image("bomb.jpg", jpeg_bomb(), "image_too_large"), "image_too_large"
    ),
    "image_png_text_bomb": Kind(
        "imagefolder", _image("ztxt.png", png_text_bomb(), "image_too_large"), "image_too_large"
    ),
    "image_corrupt_pixels": Kind(
        "imagefolder",
        _image("garbage_idat.png", png_corrupt_pixels(), "image_corrupt"),
        "image_corrupt",
    ),
    "image_animated_gif": Kind(
        "imagefolder",
        _image("anim_gif.jpg", animated("GIF"), "image_unsupported"),
        "image_unsupported",
    ),
    "image_animated_png": Kind(
        "imagefolder", _image("anim.png", animated("PNG"), "image_unsupported"), "image_unsupported"
    ),
    "image_animated_webp": Kind(
        "imagefolder",
        _image("anim.webp", animated("WEBP"), "image_unsupported"),
        "image_unsupported",
    ),
    "image_unsupported_tiff": Kind(
        "imagefolder",
        _image("scan.png", image_bytes("TIFF"), "image_unsupported"),
        "image_unsupported",
    ),
    "symlink_escape_image_file": Kind("imagefolder", image_symlink_file, "path_escape"),
    "symlink_escape_image_dir": Kind("imagefolder", image_symlink_dir, "path_escape"),
    "symlink_escape_image_relative": Kind("imagefolder", image_symlink_relative, "path_escape"),
    # JSONL
    "jsonl_invalid_json": Kind(
        "jsonl",
        _jsonl("invalid.jsonl", b'{"id": "x", "text": "unterminated', "json_invalid"),
        "json_invalid",
    ),
    "jsonl_not_an_object": Kind(
        "jsonl",
        _jsonl("array.jsonl", b'["text", "in", "an", "array"]', "json_invalid"),
        "json_invalid",
    ),
    "jsonl_nesting_bomb": Kind(
        "jsonl",
        _jsonl(
            "deep.jsonl",
            b'{"text": "t", "meta": ' + b"[" * 20_000 + b"]" * 20_000 + b"}",
            "json_invalid",
        ),
        "json_invalid",
    ),
    "jsonl_overlong_line": Kind(
        "jsonl",
        _jsonl("long.jsonl", jl({"text": "x" * (2 * JSONL_MAX_LINE)}), "json_invalid"),
        "json_invalid",
    ),
    "jsonl_non_utf8": Kind(
        "jsonl",
        _jsonl(
            "latin1.jsonl", '{"id": "l", "text": "caf\u00e9"}'.encode("latin-1"), "utf8_invalid"
        ),
        "utf8_invalid",
    ),
    "jsonl_lone_surrogate": Kind(
        "jsonl",
        _jsonl("surrogate.jsonl", b'{"id": "s", "text": "\\ud800 alone"}', "utf8_invalid"),
        "utf8_invalid",
    ),
    "jsonl_wrong_type": Kind(
        "jsonl",
        _jsonl("wrong_type.jsonl", jl({"id": "w", "text": "t", "score": "high"}), "field_type"),
        "field_type",
    ),
    "jsonl_text_not_string": Kind(
        "jsonl",
        _jsonl("text_number.jsonl", jl({"id": "n", "text": 42}), "field_type"),
        "field_type",
    ),
    "jsonl_missing_field": Kind(
        "jsonl",
        _jsonl("missing.jsonl", jl({"id": "m", "score": 3.0}), "field_missing"),
        "field_missing",
    ),
    "jsonl_gzip_bomb": Kind(
        "jsonl",
        _jsonl_bomb("bomb.jsonl.gz", lambda b: gzip.compress(b, mtime=0), _GZIP_ZEROS),
        "decompression_bomb",
    ),
    "jsonl_zstd_bomb": Kind(
        "jsonl",
        _jsonl_bomb("bomb.jsonl.zst", zstandard.ZstdCompressor().compress, _ZSTD_ZEROS),
        "decompression_bomb",
    ),
    "symlink_escape_jsonl": Kind("jsonl", jsonl_symlink, "path_escape"),
    # Parquet
    "parquet_corrupt_footer": Kind("parquet", parquet_corrupt_footer, "parquet_corrupt"),
    "parquet_truncated": Kind("parquet", parquet_truncated, "parquet_corrupt"),
    "parquet_not_parquet": Kind("parquet", parquet_not_parquet, "parquet_corrupt"),
    "parquet_corrupt_pages": Kind("parquet", parquet_bad_pages, "parquet_corrupt"),
    "parquet_schema_drift_type": Kind("parquet", parquet_drift_type, "schema_drift"),
    "parquet_schema_drift_columns": Kind("parquet", parquet_drift_columns, "schema_drift"),
    "symlink_escape_parquet": Kind("parquet", parquet_symlink, "path_escape"),
    # TFRecord
    "tfrecord_bad_data_crc": Kind("tfrecord", tfrecord_data_crc, "tfrecord_data_crc"),
    "tfrecord_bad_length_crc": Kind("tfrecord", tfrecord_length_crc, "tfrecord_length_crc"),
    "tfrecord_truncated": Kind("tfrecord", tfrecord_truncated, "tfrecord_truncated"),
    "tfrecord_length_bomb": Kind("tfrecord", tfrecord_length_bomb, "tfrecord_truncated"),
    "tfrecord_not_example": Kind("tfrecord", tfrecord_not_example, "example_invalid"),
    "tfrecord_wrong_type": Kind("tfrecord", tfrecord_wrong_type, "field_type"),
    "tfrecord_bad_gzip": Kind("tfrecord", tfrecord_bad_gzip, "tfrecord_gzip"),
    "symlink_escape_tfrecord": Kind("tfrecord", tfrecord_symlink, "path_escape"),
    # WebDataset tar members
    "tar_dotdot_member": Kind(
        "webdataset",
        _tar_kind(
            "dotdot",
            "path_escape",
            lambda o: [
                tar_member("../../evil.jpg", b"escape"),
                tar_member("a/../../b/evil.txt", b"escape"),
            ],
            lambda o: ["key:../../evil", "key:a/../../b/evil"],
        ),
        "path_escape",
    ),
    "tar_absolute_member": Kind(
        "webdataset",
        _tar_kind(
            "absolute",
            "path_escape",
            lambda o: [tar_member(f"{o}/abs_evil.txt", b"absolute")],
            lambda o: [f"key:{o}/abs_evil"],
        ),
        "path_escape",
    ),
    "tar_symlink_outside": Kind(
        "webdataset",
        _tar_kind(
            "symlink_out",
            "path_escape",
            lambda o: [
                tar_member("sym.jpg", type=tarfile.SYMTYPE, linkname=str(o / "sym_target")),
                tar_member("rel.jpg", type=tarfile.SYMTYPE, linkname="../../rel_target"),
            ],
            lambda o: ["key:sym", "key:rel"],
        ),
        "path_escape",
    ),
    "tar_symlink_inside": Kind(
        "webdataset",
        _tar_kind(
            "symlink_in",
            "member_unsupported",
            lambda o: [
                tar_member("inner2.jpg", type=tarfile.SYMTYPE, linkname="first.jpg"),
            ],
            lambda o: ["key:inner2"],
        ),
        "member_unsupported",
    ),
    "tar_hardlink": Kind(
        "webdataset",
        _tar_kind(
            "hardlink",
            "member_unsupported",
            lambda o: [tar_member("hard.jpg", type=tarfile.LNKTYPE, linkname="first.jpg")],
            lambda o: ["key:hard"],
        ),
        "member_unsupported",
    ),
    "tar_hardlink_outside": Kind(
        "webdataset",
        _tar_kind(
            "hardlink_out",
            "path_escape",
            lambda o: [tar_member("hardout.jpg", type=tarfile.LNKTYPE, linkname="../hard_target")],
            lambda o: ["key:hardout"],
        ),
        "path_escape",
    ),
    "tar_device_files": Kind(
        "webdataset",
        _tar_kind(
            "devices",
            "member_unsupported",
            lambda o: [
                tar_member("chr.bin", type=tarfile.CHRTYPE, devmajor=1, devminor=3),
                tar_member("blk.bin", type=tarfile.BLKTYPE, devmajor=7, devminor=0),
                tar_member("fifo.txt", type=tarfile.FIFOTYPE),
            ],
            lambda o: ["key:chr", "key:blk", "key:fifo"],
        ),
        "member_unsupported",
    ),
    "tar_dotdot_directory": Kind(
        "webdataset",
        _tar_kind(
            "dotdot_dir",
            "path_escape",
            lambda o: [tar_member("../evil_dir", type=tarfile.DIRTYPE)],
            lambda o: ["member:../evil_dir"],
        ),
        "path_escape",
    ),
    "tar_truncated": Kind("webdataset", tar_truncated, "io_error"),
    "tar_not_a_tar": Kind("webdataset", tar_not_a_tar, "io_error"),
    "tar_repeated_key": Kind("webdataset", tar_repeated_key, "key_repeated"),
    "tar_image_bomb": Kind("webdataset", tar_bad_image, "image_too_large"),
    "symlink_escape_tar_shard": Kind("webdataset", tar_shard_symlink, "path_escape"),
    # LeRobot v2.1: info.json / episode metadata / data disagreeing
    "lerobot_length_mismatch": Kind("lerobot", lerobot_length_mismatch, "episode_inconsistent"),
    "lerobot_unlisted_episode": Kind("lerobot", lerobot_unlisted_episode, "episode_inconsistent"),
    "lerobot_missing_data_file": Kind("lerobot", lerobot_missing_data, "episode_inconsistent"),
    "lerobot_index_gap": Kind("lerobot", lerobot_index_gap, "episode_inconsistent"),
    "lerobot_unknown_task": Kind("lerobot", lerobot_unknown_task, "episode_inconsistent"),
    "lerobot_feature_shape": Kind("lerobot", lerobot_feature_shape, "field_type"),
    "lerobot_no_episode_column": Kind("lerobot", lerobot_no_episode_column, "field_missing"),
    "lerobot_corrupt_frame": Kind("lerobot", lerobot_corrupt_frame, "image_truncated"),
    "symlink_escape_lerobot_data": Kind("lerobot", lerobot_symlink, "path_escape"),
}

BASES: dict[str, Callable[[Path, Path], set[str]]] = {
    "imagefolder": imagefolder_base,
    "jsonl": jsonl_base,
    "parquet": parquet_base,
    "tfrecord": tfrecord_base,
    "webdataset": webdataset_base,
    "lerobot": lerobot_base,
}

#: Source types in a stable order.
SOURCES: tuple[str, ...] = tuple(BASES)


@dataclass
class Corpus:
    """One source type's hostile corpus as written."""

    source: str
    root: Path
    outside: Path
    good: set[str]
    written: dict[str, Written]

    @property
    def expects(self) -> list[Expect]:
        return [e for w in self.written.values() for e in w.expects]

    @property
    def forbidden(self) -> list[Path]:
        return [p for w in self.written.values() for p in w.forbidden]


def build_corpus(source: str, root: Path, outside: Path) -> Corpus:
    """Write the good base of ``source`` into ``root``, then every kind of that source type (in
    KINDS order; a kind may spoil base records, which then no longer count as good)."""
    root.mkdir(parents=True, exist_ok=True)
    outside.mkdir(parents=True, exist_ok=True)
    good = set(BASES[source](root, outside))
    written = {}
    for name, kind in KINDS.items():
        if kind.source != source:
            continue
        result = kind.build(root, outside)
        assert result.expects and all(e.reason == kind.reason for e in result.expects), name
        written[name] = result
        good = (good | result.good) - result.spoiled
    return Corpus(source, root, outside, good, written)

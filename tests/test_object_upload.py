"""Sending one object to S3 (``formats/object_upload.py``) over real S3 protocol: a moto server.

An object appears under its key only whole and only with the bytes it was expected to have: a
single PUT is made after the bytes checked out, a multipart upload is completed after they did,
and aborted otherwise. The tier copy to an S3 tier goes the same way (no temporary key, no
server-side copy).
"""

from __future__ import annotations

import hashlib
import io
import os

import pyarrow.fs as pafs
import pytest

from shardfeed.formats import object_upload
from shardfeed.formats.object_upload import MIN_PART_SIZE, SendMismatchError, send, upload_file
from shardfeed.formats.retry import ObjectStoreIOError
from shardfeed.formats.storage import locate
from shardfeed.formats.tier_copy import CopyMismatchError, Target, copy_file

pytest.importorskip("moto.server")
pytest.importorskip("boto3")


class Trickle(io.RawIOBase):
    """A reader that returns at most 1 MiB per read, as a socket or a pipe may."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = min(n if n >= 0 else len(self.data), 1 << 20)
        chunk = self.data[self.at : self.at + n]
        self.at += len(chunk)
        return chunk


def _head(fs, key: str) -> dict | None:
    client = object_upload.s3_client(fs)
    try:
        return client.head_object(Bucket="bucket", Key=key)
    except client.exceptions.ClientError:
        return None


def _pending(fs, prefix: str) -> list:
    client = object_upload.s3_client(fs)
    return client.list_multipart_uploads(Bucket="bucket", Prefix=prefix).get("Uploads", [])


@pytest.fixture
def small_parts(monkeypatch):
    monkeypatch.setenv(object_upload.PART_SIZE_ENV, str(MIN_PART_SIZE))


def test_a_multipart_object_round_trips_from_a_short_reading_stream(s3, small_parts):
    fs, _ = s3
    data = os.urandom(2 * MIN_PART_SIZE + 12345)
    digest = hashlib.sha256(data).hexdigest()
    sent = send(fs, Trickle(data), "bucket/up/multi.bin", len(data), (len(data), digest))
    assert sent == (len(data), digest)
    assert _head(fs, "up/multi.bin")["ETag"].strip('"').endswith("-3")  # three parts
    with fs.open_input_stream("bucket/up/multi.bin") as handle:
        assert handle.read() == data


def test_bytes_that_do_not_match_never_appear_under_the_key(s3, small_parts, tmp_path):
    fs, _ = s3
    big = os.urandom(MIN_PART_SIZE + 7)
    wrong = (len(big), "0" * 64)
    with pytest.raises(SendMismatchError, match="nothing was published"):
        send(fs, io.BytesIO(big), "bucket/up/bad-multi.bin", len(big), wrong)
    assert _head(fs, "up/bad-multi.bin") is None and _pending(fs, "up/") == []  # aborted
    small = tmp_path / "small.bin"
    small.write_bytes(b"abc")
    with pytest.raises(SendMismatchError):
        upload_file(fs, str(small), "bucket/up/bad-small.bin", (3, "0" * 64))
    assert _head(fs, "up/bad-small.bin") is None  # the PUT was never made
    assert upload_file(fs, str(small), "bucket/up/small.bin") == (
        3,
        hashlib.sha256(b"abc").hexdigest(),
    )
    assert _head(fs, "up/small.bin")["ContentLength"] == 3


def test_a_part_that_keeps_failing_aborts_the_upload(s3, small_parts, monkeypatch):
    """A part is retried; when its retries run out the upload is aborted and the error names the
    object, the part and the attempts."""
    fs, _ = s3
    monkeypatch.setenv("SHARDFEED_IO_ATTEMPTS", "3")
    monkeypatch.setenv("SHARDFEED_IO_BACKOFF", "0")
    client = object_upload.s3_client(fs)
    real = client.upload_part
    calls = []

    def second_part_fails(**kwargs):
        calls.append(kwargs["PartNumber"])
        if kwargs["PartNumber"] == 2:
            raise ConnectionResetError("simulated: the connection dropped")
        return real(**kwargs)

    monkeypatch.setattr(client, "upload_part", second_part_fails)
    data = os.urandom(2 * MIN_PART_SIZE + 1)
    with pytest.raises(ObjectStoreIOError, match=r"part 2: failed after 3 attempt\(s\)"):
        send(fs, io.BytesIO(data), "bucket/up/dropped.bin", len(data))
    assert calls == [1, 2, 2, 2]
    assert _head(fs, "up/dropped.bin") is None and _pending(fs, "up/dropped") == []


def test_a_tier_copy_to_s3_goes_straight_to_its_key(s3, small_parts, tmp_path, monkeypatch):
    """stage's copy to an S3 tier: no temporary key and no server-side move, however large."""
    fs, _ = s3
    (tmp_path / "src" / "data").mkdir(parents=True)
    data = os.urandom(MIN_PART_SIZE + 99)
    (tmp_path / "src" / "data" / "s.parquet").write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    target = Target("bucket/tier", fs)
    seen = []
    copy_file(
        locate(tmp_path / "src"), target, "data/s.parquet", len(data), digest, progress=seen.append
    )
    assert sum(seen) == len(data)
    # our own two 5 MiB parts, completed in place: no other key was ever made under the tier
    assert _head(fs, "tier/data/s.parquet")["ETag"].strip('"').endswith("-2")
    selector = pafs.FileSelector("bucket/tier", recursive=True)
    assert [i.path for i in fs.get_file_info(selector) if i.type == pafs.FileType.File] == [
        "bucket/tier/data/s.parquet"
    ]
    with fs.open_input_stream("bucket/tier/data/s.parquet") as handle:
        assert handle.read() == data
    with pytest.raises(CopyMismatchError, match="the source changed or is corrupt"):
        copy_file(locate(tmp_path / "src"), target, "data/s.parquet", len(data), "f" * 64)
    assert _pending(fs, "tier/") == []


class _LostAnswerClient:
    """A client whose first complete reaches the store but whose answer is lost; the retry then
    hears NoSuchUpload, as S3 may answer for an upload it has completed."""

    def __init__(self, etag: str) -> None:
        self.etag, self.calls = etag, []

    def complete_multipart_upload(self, **kwargs):
        from botocore.exceptions import ClientError

        self.calls.append("complete")
        if len(self.calls) == 1:
            raise ConnectionResetError("the answer never came")
        error = {"Error": {"Code": "NoSuchUpload", "Message": "gone"}}
        raise ClientError(error, "CompleteMultipartUpload")

    def head_object(self, **kwargs):
        return {"ETag": f'"{self.etag}"'}


def test_a_lost_complete_answer_is_a_success_only_with_the_parts_etag(monkeypatch):
    monkeypatch.setenv("SHARDFEED_IO_BACKOFF", "0")
    parts = [{"ETag": '"' + "ab" * 16 + '"', "PartNumber": 1}, {"ETag": "cd" * 16, "PartNumber": 2}]
    etag = object_upload.multipart_etag(parts)
    assert etag == hashlib.md5(bytes.fromhex("ab" * 16 + "cd" * 16)).hexdigest() + "-2"
    object_upload._complete(_LostAnswerClient(etag), "bucket", "k", "u", parts)  # no error
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError, match="NoSuchUpload"):  # another object is at the key
        object_upload._complete(_LostAnswerClient("0" * 32 + "-2"), "bucket", "k", "u", parts)

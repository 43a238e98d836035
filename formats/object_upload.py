"""Send one local file to an object-store key: written once, streamed, hashed while sending.

On S3 (with boto3 installed, as the ``beam`` extra does) a file larger than one part is a
multipart upload that this process controls: parts of ``SHARDFEED_S3_PART_SIZE`` bytes (default
64 MiB, at least S3's 5 MiB), each part's bytes hashed as they are read, and the upload aborted
if anything fails, so no half-written object and no orphaned parts are left. The object appears
under its final key only when the store completes the upload; no temporary key, no server-side
copy, no size limit below the store's own (10,000 parts). Other stores (``gs://``, ``abfs://``)
go through ``pyarrow.fs`` output streams, which upload in parts of their own.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

import pyarrow.fs as pafs

from shardfeed.formats.retry import io_timeout, retried
from shardfeed.formats.retrying_fs import unwrap
from shardfeed.schemas.errors import ShardfeedError

PART_SIZE_ENV = "SHARDFEED_S3_PART_SIZE"
DEFAULT_PART_SIZE = 64 << 20
MIN_PART_SIZE = 5 << 20  # S3's floor for every part but the last
MAX_PARTS = 10_000
_READ = 8 << 20


class UploadError(ShardfeedError):
    """A file could not be sent whole to its key."""


def part_size() -> int:
    """The multipart part size: ``SHARDFEED_S3_PART_SIZE`` bytes, or 64 MiB."""
    text = os.environ.get(PART_SIZE_ENV)
    if not text:
        return DEFAULT_PART_SIZE
    try:
        value = int(text)
    except ValueError:
        raise ShardfeedError(f"{PART_SIZE_ENV}={text!r} is not a number of bytes") from None
    if value < MIN_PART_SIZE:
        raise ShardfeedError(f"{PART_SIZE_ENV}={value} is below S3's 5 MiB part minimum")
    return value


class SendMismatchError(UploadError):
    """The bytes read for an object differ from the size and sha256 they were expected to have;
    nothing was published under its key (on S3) or the key was deleted again (elsewhere)."""


def upload_file(
    filesystem: pafs.FileSystem,
    local_path: str,
    key: str,
    expect: tuple[int, str] | None = None,
) -> tuple[int, str]:
    """Send ``local_path`` to ``key`` (``bucket/path``) on ``filesystem``; (size, sha256) of the
    bytes sent. ``expect``: the (size, sha256) the bytes must have (see :func:`send`)."""
    with open(local_path, "rb") as source:
        return send(filesystem, source, key, os.path.getsize(local_path), expect, what=local_path)


def send(
    filesystem: pafs.FileSystem,
    reader: BinaryIO,
    key: str,
    size: int,
    expect: tuple[int, str] | None = None,
    *,
    what: str = "",
    progress: Callable[[int], None] | None = None,
) -> tuple[int, str]:
    """Stream ``reader`` (``size`` bytes) to ``key``, hashing every chunk; (size, sha256) sent.

    With ``expect``, bytes that do not match it raise :class:`SendMismatchError`: on S3 before the
    object exists (the single PUT is not made, the multipart upload is aborted instead of
    completed), on other stores after, the key then deleted. ``progress(n)`` hears every chunk."""
    client = s3_client(filesystem)
    if client is not None:
        return _send_s3(client, reader, key, size, expect, what or key, progress)
    start = reader.tell() if reader.seekable() else None

    def attempt() -> tuple[int, str]:
        if start is not None:
            reader.seek(start)
        digest = hashlib.sha256()
        sent = 0
        with filesystem.open_output_stream(key) as out:
            while chunk := reader.read(_READ):
                digest.update(chunk)
                out.write(chunk)
                sent += len(chunk)
                if progress is not None:
                    progress(len(chunk))
        return sent, digest.hexdigest()

    # a stream cannot be resumed: a transient failure sends the object again from its start,
    # which a reader that cannot seek back does not allow
    sent, sha256 = attempt() if start is None else retried(attempt, f"write {key}")
    try:
        _check(expect, sent, sha256, what or key)
    except SendMismatchError:
        with contextlib.suppress(OSError):
            filesystem.delete_file(key)
        raise
    return sent, sha256


def _check(expect: tuple[int, str] | None, sent: int, sha256: str, what: str) -> None:
    if expect is not None and (sent, sha256) != tuple(expect):
        raise SendMismatchError(
            f"{what}: read {sent} bytes with sha256 {sha256[:16]}…, expected {expect[0]} bytes, "
            f"{expect[1][:16]}…; nothing was published under its name"
        )


def put_bytes(filesystem: pafs.FileSystem, key: str, data: bytes) -> None:
    """Write ``data`` to ``key`` as a whole: one PUT on S3 (pyarrow's stream would start a
    multipart upload, three requests, for a small work file), a pyarrow stream elsewhere."""
    client = s3_client(filesystem)
    if client is not None:
        bucket, _, name = key.partition("/")
        retried(lambda: client.put_object(Bucket=bucket, Key=name, Body=data), f"put s3://{key}")
        return

    def attempt() -> None:
        with filesystem.open_output_stream(key, compression=None) as out:
            out.write(data)

    retried(attempt, f"write {key}")


def _read_full(reader: BinaryIO, n: int) -> bytes:
    """Up to ``n`` bytes: fewer only at the end of the stream (a raw read may return less)."""
    chunks, held = [], 0
    while held < n:
        chunk = reader.read(min(_READ, n - held))
        if not chunk:
            break
        chunks.append(chunk)
        held += len(chunk)
    return b"".join(chunks)


def _send_s3(
    client: Any,
    reader: BinaryIO,
    key: str,
    size: int,
    expect: tuple[int, str] | None,
    what: str,
    progress: Callable[[int], None] | None,
) -> tuple[int, str]:
    bucket, _, name = key.partition("/")
    part = max(part_size(), -(-size // MAX_PARTS))
    digest = hashlib.sha256()
    body = _read_full(reader, part)
    digest.update(body)
    if len(body) < part:  # the whole object: one request, made only once it checked out
        _check(expect, len(body), digest.hexdigest(), what)
        retried(lambda: client.put_object(Bucket=bucket, Key=name, Body=body), f"put s3://{key}")
        if progress is not None:
            progress(len(body))
        return len(body), digest.hexdigest()
    upload = retried(
        lambda: client.create_multipart_upload(Bucket=bucket, Key=name), f"start s3://{key}"
    )["UploadId"]
    try:
        parts, sent = [], 0
        while body:
            number = len(parts) + 1
            if number > MAX_PARTS:
                raise UploadError(f"{what}: more than {MAX_PARTS} parts of {part} bytes")
            answer = retried(
                lambda body=body, number=number: client.upload_part(
                    Bucket=bucket, Key=name, UploadId=upload, PartNumber=number, Body=body
                ),
                f"send s3://{key} part {number}",
            )
            parts.append({"ETag": answer["ETag"], "PartNumber": number})
            sent += len(body)
            if progress is not None:
                progress(len(body))
            body = _read_full(reader, part)
            digest.update(body)
        _check(expect, sent, digest.hexdigest(), what)
        if expect is None and sent != size:
            raise UploadError(f"{what} changed while it was sent ({sent} of {size} bytes)")
        _complete(client, bucket, name, upload, parts)
    except BaseException:
        with contextlib.suppress(Exception):
            client.abort_multipart_upload(Bucket=bucket, Key=name, UploadId=upload)
        raise
    return sent, digest.hexdigest()


def _complete(client: Any, bucket: str, name: str, upload: str, parts: list[dict]) -> None:
    """Complete a multipart upload, retried. A retry answered ``NoSuchUpload`` after an earlier
    attempt whose answer was lost is a success when the object's ETag is the one these parts
    make (md5 of their md5s, ``-N``): then that attempt completed it."""
    attempts = 0

    def attempt() -> None:
        nonlocal attempts
        attempts += 1
        try:
            client.complete_multipart_upload(
                Bucket=bucket, Key=name, UploadId=upload, MultipartUpload={"Parts": parts}
            )
        except Exception as err:
            if attempts > 1 and _error_code(err) == "NoSuchUpload":
                head = client.head_object(Bucket=bucket, Key=name)
                if head.get("ETag", "").strip('"') == multipart_etag(parts):
                    return
            raise

    retried(attempt, f"complete s3://{bucket}/{name}")


def multipart_etag(parts: list[dict]) -> str:
    """The ETag S3 gives an object completed from ``parts`` (their ETags, in order)."""
    digests = b"".join(bytes.fromhex(p["ETag"].strip('"')) for p in parts)
    return f"{hashlib.md5(digests, usedforsecurity=False).hexdigest()}-{len(parts)}"


def _error_code(err: BaseException) -> str | None:
    response = getattr(err, "response", None)
    return (response.get("Error") or {}).get("Code") if isinstance(response, dict) else None


def abort_stale_uploads(filesystem: pafs.FileSystem, prefix: str) -> int:
    """Abort unfinished multipart uploads under ``prefix`` (``bucket/path``) that a killed worker
    left (their parts are billed but never seen); returns how many. Nothing to do elsewhere."""
    client = s3_client(filesystem)
    if client is None:
        return 0
    bucket, _, name = prefix.partition("/")
    aborted = 0
    for upload in _uploads(client, bucket, name.rstrip("/") + "/"):
        with contextlib.suppress(Exception):
            client.abort_multipart_upload(
                Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"]
            )
            aborted += 1
    return aborted


def _uploads(client: Any, bucket: str, prefix: str) -> Iterator[dict]:
    paginator = client.get_paginator("list_multipart_uploads")
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
        yield from page.get("Uploads", [])


_CLIENTS: dict[tuple, Any] = {}


def s3_client(filesystem: pafs.FileSystem) -> Any | None:
    """A boto3 client speaking to the same S3 endpoint, region and credentials as
    ``filesystem`` (one per process and setting), or None for another store or without boto3."""
    filesystem = unwrap(filesystem)
    if not isinstance(filesystem, pafs.S3FileSystem):
        return None
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        return None
    options = filesystem.__reduce__()[1][0]  # the settings pyarrow pickles the filesystem with
    endpoint = options.get("endpoint_override") or None
    if endpoint and "://" not in endpoint:
        endpoint = f"{options.get('scheme') or 'https'}://{endpoint}"
    settings = (
        os.getpid(),  # a client is not shared across a fork
        endpoint,
        options.get("region") or None,
        options.get("access_key") or None,
        options.get("secret_key") or None,
        options.get("session_token") or None,
    )
    client = _CLIENTS.get(settings)
    if client is None:
        client = boto3.session.Session().client(
            "s3",
            endpoint_url=settings[1],
            region_name=settings[2],
            aws_access_key_id=settings[3],
            aws_secret_access_key=settings[4],
            aws_session_token=settings[5],
            # one attempt per call: formats/retry.py retries, with the policy every call shares
            config=Config(
                retries={"mode": "standard", "max_attempts": 1},
                connect_timeout=io_timeout(),
                read_timeout=io_timeout(),
            ),
        )
        _CLIENTS[settings] = client
    return client

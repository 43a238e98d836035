"""Reject records: one bad input record, where it came from and why it was refused.

Rejects are written as JSON Lines under ``meta/shardfeed/rejects/`` and counted by ``reason`` in the
manifest. Reason codes are stable identifiers (snake_case); messages are free text for humans.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from shardfeed.schemas._strict import get, require_object
from shardfeed.schemas.errors import SchemaError

#: Known reason codes. Sources may add their own, but must use snake_case.
REASONS = {
    "image_corrupt": "the image does not decode (corrupt or not an image)",
    "image_truncated": "the image ends before its data does",
    "image_empty": "the image file is empty",
    "image_not_image": "a file with an image extension holds no supported image format",
    "image_too_large": "declared pixels exceed the bound (decompression bomb guard)",
    "image_unsupported": "an image mode or feature that is not supported (e.g. animation)",
    "json_invalid": "a line is not valid JSON, or not a JSON object",
    "utf8_invalid": "bytes are not valid UTF-8",
    "field_missing": "a required field is absent",
    "field_type": "a field's type conflicts with the dataset schema",
    "decompression_bomb": "a compressed input expands beyond the bound",
    "path_escape": "a path or symlink leads outside the source root",
    "episode_inconsistent": "episode metadata disagrees with its rows",
    "video_corrupt": "an episode's video file cannot be read (missing, corrupt, truncated, no video)",
    "video_mismatch": "an episode's video holds a different number of frames than it has rows",
    "video_incompatible": "an episode's video cannot be stream-copied (not starting on a keyframe, "
    "or codec parameters that differ from the reference video of its feature)",
    "io_error": "the input could not be read",
    "member_unsupported": "an archive member that is not a regular file or directory (symlink, "
    "hard link, device, FIFO, sparse file), or one above the size bound",
    "key_repeated": "an archive sample key reappears after its sample ended, or a sample holds "
    "the same field twice",
    "schema_drift": "a file's columns or types differ from the corpus schema (see --unify-schemas)",
    "parquet_corrupt": "a Parquet file or row group cannot be read (corrupt footer or pages)",
    "tfrecord_data_crc": "a TFRecord record's data does not match its CRC",
    "tfrecord_length_crc": "a TFRecord length header does not match its CRC (the rest of the file "
    "cannot be framed)",
    "tfrecord_truncated": "a TFRecord file ends inside a record",
    "tfrecord_too_large": "a TFRecord record is larger than the bound",
    "tfrecord_gzip": "a GZIP TFRecord stream is corrupt",
    "example_invalid": "a TFRecord record is not a valid tf.train.Example",
}


class RejectError(Exception):
    """Raised by per-record transforms; the caller turns it into a RejectRecord (never a crash)."""

    def __init__(self, reason: str, message: str) -> None:
        if not reason or not reason.replace("_", "").isalnum() or reason.lower() != reason:
            raise ValueError(f"reject reason must be snake_case, got {reason!r}")
        self.reason = reason
        self.message = message
        super().__init__(f"{reason}: {message}")

    def __reduce__(self):  # survives pickling across worker processes
        return (type(self), (self.reason, self.message))


@dataclass(frozen=True)
class RejectRecord:
    """``source`` is the input URI or root-relative path; ``position`` locates the record inside it
    (``line:12``, ``member:a/b.jpg``, ``episode:3``, ``row:40``); empty for whole files."""

    source: str
    position: str
    reason: str
    message: str

    @classmethod
    def from_error(cls, source: str, position: str, error: RejectError) -> RejectRecord:
        return cls(source, position, error.reason, error.message)

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "position": self.position,
            "reason": self.reason,
            "message": self.message,
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), ensure_ascii=False, sort_keys=True)

    @classmethod
    def from_json(cls, obj: Any, where: str = "reject") -> RejectRecord:
        obj = require_object(obj, where)
        reason = get(obj, "reason", str, where)
        if not reason:
            raise SchemaError(f"{where}.reason", "must be non-empty")
        return cls(
            get(obj, "source", str, where),
            get(obj, "position", str, where),
            reason,
            get(obj, "message", str, where),
        )

"""Errors the reader and verifier raise; all are clean, user-facing messages."""

from __future__ import annotations

from shardfeed.schemas.errors import ShardfeedError


class IncompleteDatasetError(ShardfeedError):
    """No valid manifest: the dataset was never finished (or is not a shardfeed dataset)."""


class CorruptShardError(ShardfeedError):
    """A shard disagrees with its manifest record (size, rows, row groups, schema or checksum)."""


class AssignmentError(ShardfeedError):
    """An assignment is missing, was modified, or was planned for a different dataset."""


class HotIndexError(ShardfeedError):
    """The hot index or cache plan is missing, modified, or made for a different dataset."""


class HotIndexMissingError(HotIndexError):
    """The dataset has no hot index (run ``shardfeed hot`` first)."""

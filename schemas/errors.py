"""Errors raised when a data contract is violated."""

from __future__ import annotations


class ShardfeedError(Exception):
    """Base class for every error shardfeed reports to users as a clean message."""


class SchemaError(ShardfeedError, ValueError):
    """A document does not match its contract; ``field`` names the offending JSON path."""

    def __init__(self, field: str, message: str, *, source: str | None = None) -> None:
        self.field = field
        self.message = message
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}field '{field}': {message}")

    def with_source(self, source: str) -> SchemaError:
        """The same error, attributed to a file."""
        return type(self)(self.field, self.message, source=source)

    def within(self, prefix: str) -> SchemaError:
        """The same error with its field path nested under ``prefix``."""
        return type(self)(
            f"{prefix}.{self.field}" if self.field else prefix, self.message, source=self.source
        )


class UnsafePathError(SchemaError):
    """A path would escape the dataset root (absolute, '..', or a symlink out)."""

"""A failing step's error is said once, by the driver.

Beam's SDK harness reports a step's failure before the runner raises it in the driver: it logs the
traceback (:data:`ERROR_LOGGERS`) and prints it on stderr. With the in-process runner's threads
that stderr is the user's terminal, and a ``multi_processing`` worker inherits it. The driver
turns the error it gets into one line (``driver._cluster_failure``), or, for an error it does not
know, raises it with the step's whole traceback; the harness's copies add nothing but noise.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import Any, TextIO

#: Beam loggers that log a failing step's traceback before the same error reaches the driver
ERROR_LOGGERS = ("apache_beam.runners.common", "apache_beam.runners.worker.sdk_worker")

TRACEBACK_HEAD = "Traceback (most recent call last)"


class _DropTracebacks(logging.Filter):
    """Drop log records that carry a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.exc_info is None and TRACEBACK_HEAD not in record.getMessage()


class StderrWithoutTracebacks:
    """A stream that passes writes on to ``stream`` except a traceback printed whole, in one
    write (as the harness prints it), and the line end ``print`` adds after it."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._dropped = False

    def write(self, text: str) -> int:
        if text.startswith(TRACEBACK_HEAD):
            self._dropped = True
            return len(text)
        if self._dropped and text == "\n":
            self._dropped = False
            return len(text)
        self._dropped = False
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def errors_once() -> Iterator[None]:
    """While a pipeline runs here, Beam's own copies of a failing step's traceback (its logs,
    its print on stderr) are dropped; the error itself still reaches the driver."""
    dropper = _DropTracebacks()
    loggers = [logging.getLogger(name) for name in ERROR_LOGGERS]
    for logger in loggers:
        logger.addFilter(dropper)
    stderr = sys.stderr
    sys.stderr = StderrWithoutTracebacks(stderr)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stderr = stderr
        for logger in loggers:
            logger.removeFilter(dropper)

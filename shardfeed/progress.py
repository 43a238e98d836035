"""One progress line on a terminal for long work: done/total, rate and ETA.

:func:`progress_text` formats the line, and every progress display uses it. :class:`ProgressLine`
draws it: under a lock (copy threads report concurrently), at most every ``interval`` seconds,
padded with spaces when it gets shorter so no old characters are left, and ended by a newline on
close. :class:`Progress` is a thread-safe counter drawn on such a line. Nothing is drawn unless
:func:`show_progress` says so: never with ``--json`` or ``--no-progress``, always with
``--progress``, otherwise only when the stream is a terminal (never in logs or pipes).
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TextIO

from shardfeed.schemas.units import format_size

__all__ = [
    "REDRAW_SECONDS",
    "Progress",
    "ProgressLine",
    "format_duration",
    "progress_text",
    "show_progress",
]

REDRAW_SECONDS = 0.2  # at most five redraws a second


def show_progress(stream: TextIO, setting: bool | None = None) -> bool:
    """Whether to draw on ``stream``: ``setting`` True forces it (``--progress``), False turns
    it off (``--json``, ``--no-progress``), None leaves it to whether ``stream`` is a terminal."""
    if setting is not None:
        return setting
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


def format_duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``: whole seconds, rounded up (an ETA is not early)."""
    s = max(0, math.ceil(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def progress_text(
    label: str,
    done: float,
    total: float | None,
    elapsed: float,
    *,
    noun: str | None = None,
    context: Sequence[str] = (),
    extra: Sequence[str] = (),
) -> str:
    """``label: [context]  done/total  [extra]  rate  ETA``.

    ``noun`` None counts bytes (a percentage and sizes), else items (``shards 3/10``);
    ``total`` None is not known yet. The rate is ``done`` over ``elapsed`` seconds, and the ETA
    the rest of ``total`` at that rate: ``ETA --`` until there is a rate (nothing done yet) and
    a total, ``ETA 0s`` once the total is done."""
    rate = done / elapsed if done > 0 and elapsed > 0 else None
    if noun is None:
        if total is None:
            count = format_size(done)
        else:
            share = min(100.0 * done / total, 100.0) if total else 100.0
            count = f"{share:5.1f}% {format_size(done)} / {format_size(total)}"
        speed = f"{format_size(rate)}/s" if rate is not None else "--/s"
    else:
        count = f"{noun} {done:,}" + (f"/{total:,}" if total is not None else "")
        speed = f"{rate:,.1f} {noun}/s" if rate is not None else f"-- {noun}/s"
    if total is not None and done >= total:
        eta = "ETA 0s"
    elif rate is not None and total is not None:
        eta = f"ETA {format_duration((total - done) / rate)}"
    else:
        eta = "ETA --"
    return f"{label}: " + "  ".join([*context, count, *extra, speed, eta])


class ProgressLine:
    """One status line redrawn in place on ``stream`` (``\\r``, the text, then spaces over what
    a longer previous line left), safe to draw from several threads."""

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        enabled: bool | None = None,
        interval: float = REDRAW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        width: int | None = None,
    ) -> None:
        """``enabled`` as :func:`show_progress`'s ``setting``; ``interval``: least seconds
        between two unforced redraws; ``width``: the terminal's columns (asked of the stream
        when None), a longer line is cut short so it never wraps."""
        self.stream = stream or sys.stderr
        self.enabled = show_progress(self.stream, enabled)
        self.interval = interval
        self.clock = clock
        self.width = width if width is not None else _columns(self.stream)
        self.lock = threading.RLock()
        self._shown = 0  # length of the line on screen
        self._drawn_at = -math.inf
        self._closed = False

    def due(self) -> bool:
        """Whether an unforced redraw would happen now (call under :attr:`lock`)."""
        return self.enabled and not self._closed and self.clock() - self._drawn_at >= self.interval

    def draw(self, text: str, *, force: bool = False) -> None:
        """Show ``text``, unless the last redraw was under ``interval`` ago (``force`` redraws
        regardless)."""
        with self.lock:
            if not (force or self.due()) or not self.enabled or self._closed:
                return
            if self.width:
                text = text[: self.width - 1]  # the cursor stays on the line
            self.stream.write("\r" + text + " " * (self._shown - len(text)))
            self.stream.flush()
            self._shown = len(text)
            self._drawn_at = self.clock()

    def close(self, text: str | None = None) -> None:
        """Draw ``text`` (the final state) if given, then end the line; later draws are
        ignored."""
        with self.lock:
            if self._closed:
                return
            if text is not None:
                self.draw(text, force=True)
            self._closed = True
            if self.enabled:
                self.stream.write("\n")
                self.stream.flush()


class Progress:
    """A thread-safe counter of work done, drawn as a :func:`progress_text` line.

    Call it with the amount just done (bytes, or items when ``noun`` names them), from any
    thread; :meth:`add_total` grows the total when it is learnt late; :meth:`close` draws the
    final state and ends the line. Usable as a context manager."""

    def __init__(
        self,
        total: int | None,
        label: str,
        *,
        noun: str | None = None,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        interval: float = REDRAW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        width: int | None = None,
    ) -> None:
        self.total = total
        self.label = label
        self.noun = noun
        self.done = 0
        self.line = ProgressLine(
            stream, enabled=enabled, interval=interval, clock=clock, width=width
        )
        self._started = clock()

    @property
    def enabled(self) -> bool:
        return self.line.enabled

    def text(self) -> str:
        elapsed = self.line.clock() - self._started
        return progress_text(self.label, self.done, self.total, elapsed, noun=self.noun)

    def __call__(self, amount: int = 1) -> None:
        with self.line.lock:
            self.done += amount
            if self.line.due():
                self.line.draw(self.text(), force=True)

    def add_total(self, amount: int) -> None:
        with self.line.lock:
            self.total = (self.total or 0) + amount

    def close(self) -> None:
        with self.line.lock:
            self.line.close(self.text() if self.line.enabled else None)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _columns(stream: TextIO) -> int | None:
    try:
        return os.get_terminal_size(stream.fileno()).columns or None
    except (AttributeError, ValueError, OSError):  # not a terminal, or no file behind it
        return None

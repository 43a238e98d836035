"""Live progress of a local conversion, read from what the pipeline writes under the work dir.

Runner-agnostic: files scanned are unit tables, shards written are sidecars (whose rows and bytes
are read once each). A daemon thread redraws one stderr line (``shardfeed.progress``: the same
format, rate and ETA as the other commands); it is off unless stderr is a terminal or the caller
forces it. The ETA counts shards written since the plan (the shard count) appeared.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

from shardfeed.formats.store_path import StorePath
from shardfeed.formats.unit_table import UNIT_SUFFIX
from shardfeed.pipelines.plan_stage import read_plan_info
from shardfeed.progress import ProgressLine, progress_text, show_progress
from shardfeed.schemas.units import format_size


class WorkDirProgress:
    def __init__(
        self,
        work: StorePath,
        total_files: int,
        *,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        interval: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``enabled`` as ``shardfeed.progress.show_progress``'s setting: None draws only
        when ``stream`` (stderr) is a terminal."""
        self.work = work
        self.total_files = total_files
        self.stream = stream or sys.stderr
        self.enabled = show_progress(self.stream, enabled)
        self.interval = interval
        self.clock = clock
        self.total_shards = 0
        self._seen: dict[str, tuple[int, int]] = {}  # sidecar -> (rows, bytes)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._out: ProgressLine | None = None
        self._planned_at: float | None = None  # when the shard count was first read

    def __enter__(self) -> WorkDirProgress:
        if self.enabled:
            self._stop = threading.Event()  # reusable: one `with` per pipeline run
            self._out = ProgressLine(self.stream, enabled=True, clock=self.clock)
            self._thread = threading.Thread(
                target=self._loop, name="shardfeed-progress", daemon=True
            )
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None and self._out is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._out.close(self.line())

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.draw()

    def line(self) -> str:
        scanned = _count(self.work / "units", UNIT_SUFFIX)
        shards_dir = self.work / "shards"
        for name in _names(shards_dir, ".json"):
            if name not in self._seen:
                try:
                    record = json.loads((shards_dir / name).read_bytes())["outcome"]["record"]
                    self._seen[name] = (record["rows"], record["bytes"])
                except (OSError, ValueError, KeyError):
                    continue  # being written; next time
        if not self.total_shards:
            planned = read_plan_info(self.work)  # written once the scan is over
            self.total_shards = planned.num_shards if planned is not None else 0
            if self.total_shards:
                self._planned_at = self.clock()
        rows = sum(r for r, _ in self._seen.values())
        nbytes = sum(b for _, b in self._seen.values())
        since_plan = 0.0 if self._planned_at is None else self.clock() - self._planned_at
        return progress_text(
            "convert",
            len(self._seen),
            self.total_shards or None,
            since_plan,
            noun="shards",
            context=[f"files {scanned}/{self.total_files}"],
            extra=[f"samples {rows:,}", format_size(nbytes)],
        )

    def draw(self) -> None:
        if self._out is not None:
            self._out.draw(self.line(), force=True)


def _names(directory: StorePath, suffix: str) -> list[str]:
    return [n for n in directory.names() if n.endswith(suffix) and not n.startswith(".")]


def _count(directory: StorePath, suffix: str) -> int:
    return len(_names(directory, suffix))

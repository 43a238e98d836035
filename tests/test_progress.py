"""The progress line: ETA from the rate, no leftovers when it shrinks, thread-safe, quiet off a
terminal and under ``--json``, on by default for the long commands on a terminal."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from staging_fixtures import dataset, tiers_toml

from shardfeed.cli._common import progress_setting
from shardfeed.cli.main import build_parser, main
from shardfeed.progress import (
    Progress,
    ProgressLine,
    format_duration,
    progress_text,
    show_progress,
)

MiB = 1 << 20


class FakeTTY(io.StringIO):
    """A terminal stand-in; each write yields the GIL between characters, as a real terminal
    write can be cut, so unlocked concurrent draws would interleave."""

    def __init__(self, slow: bool = False) -> None:
        super().__init__()
        self.slow = slow

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not self.slow:
            return super().write(text)
        for char in text:
            super().write(char)
            time.sleep(0)
        return len(text)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def screen(output: str) -> list[str]:
    """What a terminal shows after ``output``: ``\\r`` returns to the line start and later
    characters overwrite; ``\\n`` ends the line. Trailing blanks are dropped."""
    lines, line, col = [], [], 0
    for char in output:
        if char == "\r":
            col = 0
        elif char == "\n":
            lines.append("".join(line).rstrip())
            line, col = [], 0
        else:
            if col < len(line):
                line[col] = char
            else:
                line.append(char)
            col += 1
    if line:
        lines.append("".join(line).rstrip())
    return lines


# --------------------------------------------------------------------------------------------
# the line


def test_eta_appears_once_there_is_a_rate_and_is_right():
    clock, tty = Clock(), FakeTTY()
    bar = Progress(100 * MiB, "verify", stream=tty, clock=clock, interval=0)
    bar(0)  # nothing done, no time passed: no rate yet
    assert screen(tty.getvalue())[-1].endswith("ETA --")
    clock.now += 5
    bar(25 * MiB)  # 5 MiB/s, 75 MiB to go: 15 s
    shown = screen(tty.getvalue())[-1]
    assert shown == "verify:  25.0% 25.0 MiB / 100.0 MiB  5.0 MiB/s  ETA 15s"
    clock.now += 60
    bar(5 * MiB)  # 30 MiB in 65 s; 70 MiB to go at that rate: 151.67 s
    assert screen(tty.getvalue())[-1].endswith("ETA 2m32s")
    bar.close()
    assert tty.getvalue().endswith("\n")


def test_item_counts_rate_and_eta():
    text = progress_text("unstage", 4, 10, 2.0, noun="files")
    assert text == "unstage: files 4/10  2.0 files/s  ETA 3s"
    assert progress_text("convert", 3, None, 9.0, noun="shards").endswith("ETA --")
    assert progress_text("warm", 0, 10 * MiB, 3.0).endswith("--/s  ETA --")
    assert [format_duration(s) for s in (0, 14.2, 75, 3725)] == ["0s", "15s", "1m15s", "1h02m"]


def test_a_shorter_line_leaves_no_old_characters():
    tty = FakeTTY()
    line = ProgressLine(tty, interval=0)
    line.draw("stage:  99.9% 1023.9 MiB / 1.0 GiB  250.0 MiB/s  ETA 1s")
    line.draw("stage: 100.0% 1.0 GiB / 1.0 GiB  ETA 0s")
    line.draw("short")
    line.close()
    assert screen(tty.getvalue()) == ["short"]
    clock, tty = Clock(), FakeTTY()  # the same through the counter: 1023 B, then 1.0 KiB
    bar = Progress(None, "x", stream=tty, clock=clock, interval=0)
    bar(1000)
    clock.now += 1
    bar(500)
    bar.close()
    assert screen(tty.getvalue()) == [progress_text("x", 1500, None, 1.0)]


def test_redraws_are_throttled_and_the_final_state_is_drawn():
    clock, tty = Clock(), FakeTTY()
    bar = Progress(1000, "verify", noun="shards", stream=tty, clock=clock, interval=0.2)
    for _ in range(1000):
        bar(1)
        clock.now += 0.001  # 1 s in all: about five redraws
    drawn = tty.getvalue().count("\r")
    bar.close()
    assert 4 <= drawn <= 6
    assert screen(tty.getvalue())[-1].startswith("verify: shards 1,000/1,000")
    bar(1)  # after close: ignored
    bar.close()
    assert tty.getvalue().count("\n") == 1


def test_four_threads_give_the_exact_total_and_whole_lines():
    tty = FakeTTY(slow=True)
    per_thread, chunk = 100, 7
    total = 4 * per_thread * chunk
    bar = Progress(total, "stage", noun="files", stream=tty, interval=0)  # draw every call
    start = threading.Barrier(4)

    def copy_thread() -> None:
        start.wait()
        for _ in range(per_thread):
            bar(chunk)

    threads = [threading.Thread(target=copy_thread) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bar.close()
    assert bar.done == total
    pattern = re.compile(r"stage: files [\d,]+/2,800  [\d,.]+ files/s  ETA \d+(s|m\d\ds)")
    frames = [f.rstrip() for f in re.split(r"[\r\n]", tty.getvalue()) if f.strip()]
    assert len(frames) > 4 * per_thread / 2
    garbled = [f for f in frames if not pattern.fullmatch(f)]
    assert not garbled, garbled[:3]
    assert screen(tty.getvalue())[-1].startswith("stage: files 2,800/2,800")


def test_quiet_off_a_terminal_and_when_told():
    pipe = io.StringIO()
    bar = Progress(10, "verify", stream=pipe, interval=0)
    bar(5)
    bar.close()
    assert pipe.getvalue() == "" and not bar.enabled
    tty = FakeTTY()
    bar = Progress(10, "verify", stream=tty, enabled=False, interval=0)  # --json
    bar(5)
    bar.close()
    assert tty.getvalue() == ""
    assert show_progress(FakeTTY()) and not show_progress(io.StringIO())
    assert show_progress(io.StringIO(), True) and not show_progress(FakeTTY(), False)


@pytest.mark.parametrize(
    ("argv", "setting"),
    [
        (["verify", "ds"], None),
        (["verify", "ds", "--json"], False),
        (["verify", "ds", "--no-progress"], False),
        (["stage", "ds", "--tiers", "t.toml"], None),
        (["stage", "ds", "--tiers", "t.toml", "--json"], False),
        (["warm", "ds", "--tiers", "t", "--node-rank", "0", "--nodes", "1"], None),
        (["warm", "ds", "--tiers", "t", "--node-rank", "0", "--nodes", "1", "--json"], False),
        (["unstage", "ds", "--tiers", "t"], None),
        (["unstage", "ds", "--tiers", "t", "--no-progress"], False),
        (["convert", "src", "dst"], None),
        (["convert", "src", "dst", "--progress"], True),
        (["convert", "src", "dst", "--no-progress"], False),
        (["convert", "src", "dst", "--progress", "--json"], False),
        (["assign", "ds", "--nodes", "1", "--gpus-per-node", "1", "--name", "a", "--json"], False),
    ],
)
def test_the_long_commands_decide_alike(argv, setting):
    """None: drawn when stderr is a terminal (the default); False: never; True: always."""
    args, _ = build_parser().parse_known_args(argv)
    assert progress_setting(args) is setting


def test_convert_work_dir_progress_uses_the_same_line(tmp_path):
    from shardfeed.formats.store_path import StorePath
    from shardfeed.pipelines.progress import WorkDirProgress

    work = StorePath(str(tmp_path / "work"))
    tty = FakeTTY()
    with WorkDirProgress(work, 3, stream=tty, interval=0.01):
        time.sleep(0.05)
    shown = screen(tty.getvalue())
    assert shown == ["convert: files 0/3  shards 0  samples 0  0 B  -- shards/s  ETA --"]
    quiet = FakeTTY()
    with WorkDirProgress(work, 3, stream=quiet, enabled=False, interval=0.01):
        time.sleep(0.03)
    assert quiet.getvalue() == ""


# --------------------------------------------------------------------------------------------
# the commands, on a terminal by default


def terminal(monkeypatch) -> FakeTTY:
    """stderr as a terminal; set in the test itself, as pytest sets its own capture after
    fixtures run."""
    tty = FakeTTY()
    monkeypatch.setattr(sys, "stderr", tty)
    return tty


def test_verify_shows_progress_on_a_terminal_and_not_with_json(tmp_path, monkeypatch, capsys):
    src = dataset(tmp_path / "ds", n=120)
    on_a_terminal = terminal(monkeypatch)
    assert main(["verify", str(src)]) == 0
    shown = screen(on_a_terminal.getvalue())
    assert len(shown) == 1 and shown[0].startswith("verify: 100.0% ")
    assert re.search(r"/s  ETA 0s$", shown[0]), shown
    on_a_terminal.truncate(0)
    on_a_terminal.seek(0)
    assert main(["verify", "--json", str(src)]) == 0
    assert on_a_terminal.getvalue() == ""
    assert main(["verify", "--no-progress", str(src)]) == 0
    assert on_a_terminal.getvalue() == ""


def test_stage_warm_unstage_show_progress_on_a_terminal(tmp_path, monkeypatch, capsys):
    src = dataset(tmp_path / "ds", n=120, hot_shards=2)  # warm copies the hot shards
    config = tiers_toml(tmp_path, cold=False)
    on_a_terminal = terminal(monkeypatch)
    for argv, label in (
        (["stage", str(src), "--tiers", str(config)], "stage"),
        (["warm", str(src), "--tiers", str(config), "--node-rank", "0", "--nodes", "1"], "warm"),
        (["unstage", str(src), "--tiers", str(config)], "unstage"),
    ):
        on_a_terminal.truncate(0)
        on_a_terminal.seek(0)
        assert main(argv) in (0, 1), on_a_terminal.getvalue()
        shown = screen(on_a_terminal.getvalue())
        assert len(shown) == 1 and shown[0].startswith(f"{label}: 100.0% "), shown
        assert shown[0].endswith("ETA 0s"), shown
        on_a_terminal.truncate(0)
        on_a_terminal.seek(0)
        if label != "unstage":  # a second unstage has nothing left to do
            assert main([*argv, "--json"]) in (0, 1)
            assert on_a_terminal.getvalue() == "", label


def test_verify_in_a_real_pty(tmp_path):
    """The real decision: stderr a pseudo-terminal draws, a pipe does not."""
    src = dataset(tmp_path / "ds", n=120)
    code = "import sys; from shardfeed.cli.main import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "COLUMNS": "200"}
    leader, follower = os.openpty()
    chunks: list[bytes] = []

    def drain() -> None:  # read while it runs: a full pty buffer would block the child
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the child's end is closed and everything was read
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, "verify", str(src)],
            stdout=subprocess.PIPE,
            stderr=follower,
            env=env,
            timeout=120,
        )
    finally:
        os.close(follower)
        reader.join(timeout=10)
        os.close(leader)
    drawn = b"".join(chunks)
    assert proc.returncode == 0 and proc.stdout.startswith(b"OK: ")
    shown = screen(drawn.decode().replace("\r\n", "\n"))  # the tty turns \n into \r\n
    assert shown and shown[-1].startswith("verify: 100.0% ") and "ETA 0s" in shown[-1], drawn
    piped = subprocess.run(
        [sys.executable, "-c", code, "verify", str(src)], capture_output=True, timeout=120
    )
    assert piped.returncode == 0 and piped.stderr == b""


def test_progress_module_is_the_only_line_drawer():
    """One implementation: the CLI and the convert pipeline draw through shardfeed.progress."""
    root = Path(__file__).resolve().parent.parent
    for rel in ("shardfeed/cli", "pipelines"):
        for path in (root / rel).glob("*.py"):
            text = path.read_text()
            assert 'write("\\r' not in text and 'write(f"\\r' not in text, path

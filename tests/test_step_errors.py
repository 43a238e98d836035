"""A step that fails with an OS error (a full disk) ends ``convert`` with one line naming the
error and the step, whatever the in-process mode; Beam's own copies of the traceback (its logs,
its harness's print on stderr) are not shown."""

from __future__ import annotations

import io
import json

import pytest

pytest.importorskip("apache_beam")

from shardfeed.cli.main import main
from shardfeed.pipelines import convert
from shardfeed.pipelines.driver import _remote_os_error
from shardfeed.pipelines.step_errors import StderrWithoutTracebacks
from shardfeed.schemas.manifest import MANIFEST_PATH

MODES = [
    [],  # the default: a thread per core
    ["--direct_num_workers=1"],
    ["--direct_running_mode=multi_threading", "--direct_num_workers=2"],
]


@pytest.mark.parametrize("mode", MODES, ids=["default", "in_memory", "threads"])
def test_a_full_disk_while_writing_is_one_line(tmp_path, monkeypatch, capsys, mode):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text("".join(json.dumps({"text": f"d{i}"}) + "\n" for i in range(200)))

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(convert, "build_shard", full_disk)
    dst = tmp_path / "dst"
    code = main(["convert", str(src), str(dst), "--no-progress", *mode])
    err = capsys.readouterr().err
    assert code == 1
    assert err.splitlines() == [
        "shardfeed: error: OSError: [Errno 28] No space left on device in step WriteShard; "
        "nothing was published. Run the same command again once it is fixed: the shards "
        "already written are kept"
    ]
    assert not (dst / MANIFEST_PATH).exists()


def test_remote_os_errors_are_read_from_the_last_line_of_the_text():
    text = (
        "Traceback (most recent call last):\n  File 'x.py', line 1, in f\n"
        "RuntimeError: FileNotFoundError: [Errno 2] No such file or directory: '/d/x' "
        "[while running 'Convert/ScanFiles/Scan']\n"
    )
    found = _remote_os_error(RuntimeError(text))
    assert found is not None
    assert str(found).startswith(
        "FileNotFoundError: [Errno 2] No such file or directory: '/d/x' in step Scan; "
    )
    # not an OS error, or not the runner's text: left to the caller
    assert _remote_os_error(RuntimeError("KeyError: 'x' [while running 'A']")) is None
    assert _remote_os_error(RuntimeError("")) is None
    assert _remote_os_error(OSError(28, "No space left on device")) is None


def test_stderr_without_tracebacks_drops_a_printed_traceback_only():
    sink = io.StringIO()
    stream = StderrWithoutTracebacks(sink)
    print("Traceback (most recent call last):\n  File ...\nOSError: x", file=stream)
    print("progress 3/4", file=stream)
    stream.write("a line\n")
    assert sink.getvalue() == "progress 3/4\na line\n"

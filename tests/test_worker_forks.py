"""``multi_processing`` workers forked from a server that imported them first
(``pipelines/worker_forks.py``): they run with the environment and streams Beam gave their
command, end with the run, and die with their driver."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

beam = pytest.importorskip("apache_beam")


from shardfeed.pipelines import worker_fork_client, worker_forks  # noqa: E402
from shardfeed.pipelines.runners import worker_command  # noqa: E402

pytestmark = pytest.mark.skipif(not worker_forks.supported(), reason="Linux only")

WORKERS = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]
MARK = "SHARDFEED_TEST_FORK_MARK"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def _report(_: object) -> str:
    """What a worker says of itself: its parent, the mark in its environment and the script it
    runs; and a line on its stderr, to be found on its command's."""
    os.write(2, b"stderr-of-a-forked-worker\n")
    return f"{os.getppid()} {os.environ.get(MARK)} {Path(sys.argv[0]).stem}"


def _run(out: Path) -> set[str]:
    from worker_reports import reports_from_workers

    return reports_from_workers(WORKERS, _report, out)


@pytest.mark.parametrize(
    ("args", "wanted"),
    [
        (WORKERS, True),
        (["--direct_running_mode=multi_threading", "--direct_num_workers=2"], False),
        (["--direct_num_workers=2"], False),
        ([], False),
    ],
)
def test_only_multi_processing_asks_for_worker_processes(args, wanted):
    assert worker_forks.wants_worker_processes(args) is wanted


def test_the_client_speaks_the_servers_protocol():
    """The client is a standard-library script and repeats two constants; they must agree."""
    assert worker_fork_client.SERVER_ENV == worker_forks.SERVER_ENV
    assert worker_fork_client.HEADER.format == worker_forks.HEADER.format


def test_workers_are_forked_from_the_server_with_their_commands_environment(
    tmp_path, monkeypatch, capfd
):
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))  # workers import this module
    with worker_forks.serving(True, lean=True) as server:
        assert server is not None  # its process id: the parent every worker names below
        assert str(worker_forks.CLIENT) in worker_command()
        monkeypatch.setenv(MARK, "set-after-the-server-started")  # reaches workers by the client
        said = _run(tmp_path)
    assert said == {f"{server} set-after-the-server-started worker_forks"}
    assert "stderr-of-a-forked-worker" in capfd.readouterr().err
    assert worker_forks.SERVER_ENV not in os.environ
    assert not _alive(server), "the server outlived its block"
    assert str(worker_forks.CLIENT) not in worker_command()


def test_an_empty_variable_turns_forking_off(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    monkeypatch.setenv(worker_forks.SERVER_ENV, "")
    with worker_forks.serving(True, lean=True) as server:
        assert server is None
        said = _run(tmp_path)
    assert {line.split()[2] for line in said} == {"sdk_worker"}  # a new interpreter each


def _run_client(server: str) -> subprocess.CompletedProcess:
    """The worker command, as Beam's runner starts it, asking the server named ``server``."""
    env = dict(os.environ, **{worker_forks.SERVER_ENV: server})
    return subprocess.run(
        [sys.executable, "-I", "-S", str(worker_forks.CLIENT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_client_without_a_server_fails_in_one_line():
    done = _run_client("shardfeed-workers-nobody-listens")
    assert done.returncode == 1
    assert done.stderr.startswith("shardfeed: could not start a worker process:")
    assert len(done.stderr.splitlines()) == 1


def _queued(conn) -> int:
    """Bytes waiting in ``conn``'s receive queue (``FIONREAD``: all of them, on a Unix stream)."""
    import array
    import fcntl
    import termios

    count = array.array("i", [0])
    fcntl.ioctl(conn.fileno(), termios.FIONREAD, count)
    return count[0]


def test_a_worker_killed_before_reading_its_request_is_a_lost_worker():
    """A worker killed before it has read the whole request resets the connection (the unread
    bytes); its client exits as for any lost worker (seen under the full suite's load: the
    client said it could not start a worker, and exited 1)."""
    import socket
    import threading

    name = f"shardfeed-workers-test-{os.getpid()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)
    listener.listen(1)

    def die_unread() -> None:
        conn, _ = listener.accept()
        header = conn.recv(worker_forks.HEADER.size, socket.MSG_PEEK | socket.MSG_WAITALL)
        whole = worker_forks.HEADER.size + worker_forks.HEADER.unpack(header)[0]
        deadline = time.monotonic() + 30
        # the whole request has arrived (the bytes queued, as the kernel counts them) ...
        while _queued(conn) < whole and time.monotonic() < deadline:
            time.sleep(0.005)
        conn.close()  # ... and none of it was read: the kernel resets the client's side

    server = threading.Thread(target=die_unread)
    server.start()
    try:
        done = _run_client(name)
    finally:
        server.join()
        listener.close()
    assert done.returncode == worker_fork_client.WORKER_LOST, done.stderr
    assert done.stderr == ""


def test_a_killed_worker_ends_its_client_with_a_failure(tmp_path):
    """Beam's runner sees a worker's death as its command's non-zero exit (a worker whose
    harness waits for a runner that is not there, until killed)."""
    script = textwrap.dedent(
        f"""
        import os, subprocess, sys, time
        from shardfeed.pipelines import worker_forks
        with worker_forks.serving(True, lean=True) as server:
            env = dict(os.environ, CONTROL_API_SERVICE_DESCRIPTOR='url: "localhost:9"',
                       PIPELINE_OPTIONS="{{}}")
            client = subprocess.Popen(
                [sys.executable, "-I", "-S", {str(worker_forks.CLIENT)!r}], env=env
            )
            for _ in range(600):
                kids = open(f"/proc/{{server}}/task/{{server}}/children").read().split()
                if kids:
                    break
                time.sleep(0.05)
            os.kill(int(kids[0]), 9)
            print("client", client.wait(timeout=60))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"client {worker_fork_client.WORKER_LOST}"


def test_the_server_and_its_workers_die_with_a_killed_driver(tmp_path):
    script = textwrap.dedent(
        f"""
        import os, subprocess, sys, time
        from shardfeed.pipelines import worker_forks
        with worker_forks.serving(True, lean=True) as server:
            env = dict(os.environ, CONTROL_API_SERVICE_DESCRIPTOR='url: "localhost:9"',
                       PIPELINE_OPTIONS="{{}}")  # its harness waits for a runner for 60 s
            client = subprocess.Popen(
                [sys.executable, "-I", "-S", {str(worker_forks.CLIENT)!r}], env=env
            )
            print(server, flush=True)
            time.sleep(600)
        """
    )
    driver = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        server = int(driver.stdout.readline())
        children = Path(f"/proc/{server}/task/{server}/children")
        deadline = time.monotonic() + 60
        while not children.read_text().split():  # the worker it forked for the client
            assert time.monotonic() < deadline, "no worker was forked"
            time.sleep(0.05)
        (worker,) = map(int, children.read_text().split())
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
        deadline = time.monotonic() + 10
        while _alive(server) or _alive(worker):
            assert time.monotonic() < deadline, "the server or its worker outlived the driver"
            time.sleep(0.05)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)


def test_the_convert_command_forks_its_workers_only_for_multi_processing(tmp_path, monkeypatch):
    """``shardfeed convert`` serves forked workers when asked for worker processes, and the
    dataset is the one a run of new interpreters writes, byte for byte."""
    import json

    from shardfeed.cli.main import main

    src = tmp_path / "src.jsonl"
    src.write_text(
        "".join(json.dumps({"text": f"document number {i} " * 3}) + "\n" for i in range(2000))
    )
    served = []
    real = worker_forks.serving

    def recording(enabled: bool, lean: bool):
        served.append(enabled)
        return real(enabled, lean)

    monkeypatch.setattr(worker_forks, "serving", recording)
    flags = ["--no-progress", "--target-shard-size", "16KB"]
    assert main(["convert", str(src), str(tmp_path / "forked"), *flags, *WORKERS]) == 0
    monkeypatch.setenv(worker_forks.SERVER_ENV, "")  # off: a new interpreter per worker
    assert main(["convert", str(src), str(tmp_path / "new"), *flags, *WORKERS]) == 0
    monkeypatch.delenv(worker_forks.SERVER_ENV)
    assert main(["convert", str(src), str(tmp_path / "threads"), *flags]) == 0
    assert served == [True, True, False]

    def files(root: Path) -> dict[str, bytes]:
        return {
            str(p.relative_to(root)): p.read_bytes()
            for p in sorted(root.rglob("*"))
            if p.is_file() and "data" in p.parts
        }

    forked = files(tmp_path / "forked")
    assert len(forked) > 1 and forked == files(tmp_path / "new") == files(tmp_path / "threads")


@pytest.mark.parametrize("forked", [True, False])
def test_ctrl_c_during_a_two_worker_run_ends_it_in_one_line(tmp_path, forked):
    """Ctrl-C reaches the whole process group: the driver says "interrupted" once and exits
    130; the fork server, the worker commands and the workers ignore it and end with the
    driver, leaving no process behind and no manifest."""
    import json

    src = tmp_path / "src"
    src.mkdir()
    for f in range(4):
        lines = (json.dumps({"text": f"document {f}-{i} " * 20}) for i in range(20_000))
        (src / f"{f}.jsonl").write_text("\n".join(lines) + "\n")
    command = [sys.executable, "-m", "shardfeed.cli.main", "convert", str(src)]
    command += [str(tmp_path / "dst"), "--no-progress", *WORKERS]
    env = dict(os.environ) if forked else dict(os.environ, **{worker_forks.SERVER_ENV: ""})
    run = subprocess.Popen(
        command, stderr=subprocess.PIPE, text=True, start_new_session=True, env=env
    )
    try:
        deadline = time.monotonic() + 120
        while True:  # until two workers run (forked: the server and a worker it forked)
            workers = [p for p in _descendants(run.pid) if _is_worker(_cmdline(p))]
            if len(workers) >= 2:
                break
            assert run.poll() is None and time.monotonic() < deadline, "no worker started"
            time.sleep(0.05)
        time.sleep(0.5)  # into the run: the workers have bundles in hand, not only a socket
        os.killpg(run.pid, signal.SIGINT)
        _, err = run.communicate(timeout=120)
        deadline = time.monotonic() + 10
        while _group_alive(run.pid):
            assert time.monotonic() < deadline, "a process of the run outlived it"
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 130, err
    assert err.strip() == "shardfeed: error: interrupted", err
    assert not (tmp_path / "dst" / "meta" / "shardfeed" / "manifest.json").exists()
    again = subprocess.run(command, capture_output=True, text=True, timeout=300)  # resumes
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "dst" / "meta" / "shardfeed" / "manifest.json").exists()


def _descendants(pid: int) -> list[int]:
    children = []
    for task in Path(f"/proc/{pid}/task").glob("*"):  # a thread's children are listed under it
        with contextlib.suppress(OSError):
            children += [int(c) for c in (task / "children").read_text().split()]
    return [*children, *(d for c in children for d in _descendants(c))]


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _is_worker(cmdline: str) -> bool:
    return (
        "shardfeed.pipelines.worker_forks" in cmdline or "shardfeed.pipelines.sdk_worker" in cmdline
    )

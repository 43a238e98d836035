"""``multi_processing`` SDK workers forked from one process that has already imported them.

Each worker Beam starts is a new interpreter that imports Beam and shardfeed's steps: about
1.3 s before its first bundle, on a run whose work may take a few seconds. Here the driver starts
one server process at the command's start (:func:`serving`), which imports all that while the
driver imports its own, then waits. Beam's runner still starts every worker as a command; that
command (``worker_fork_client.py``, the standard library only) hands its environment and its
standard streams to the server over a Unix socket, the server forks a worker that runs Beam's
harness with them (``sdk_worker.run_harness``), and the client exits with the worker's status.

Lifetimes follow the process tree: the server and each worker it forks die with their parent
(``PR_SET_PDEATHSIG``), a worker ends when its client does, and the client when its worker does.
Linux only (abstract socket names, ``SCM_RIGHTS``); elsewhere workers start as before.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import struct
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path

from shardfeed.pipelines.beam_import import LEAN_ENV, beam_flag
from shardfeed.pipelines.worker_guard import die_with_parent

#: The environment variable naming the server's (abstract) socket; Beam's runner passes it on to each
#: worker command, and ``runners.py`` picks :data:`CLIENT` as that command while it is set
SERVER_ENV = "SHARDFEED_WORKER_FORKS"
#: The server's listening socket, inherited as this file descriptor number
LISTEN_FD_ENV = "SHARDFEED_WORKER_FORKS_FD"
#: The worker command's script: standard library only, so it starts in milliseconds
CLIENT = Path(__file__).with_name("worker_fork_client.py")
#: The driver's process id, which the server checks is still its parent
PARENT_ENV = "SHARDFEED_WORKER_FORKS_PARENT"
#: A request's header: the length of the JSON environment that follows it
HEADER = struct.Struct("!Q")
#: Most bytes of one request's environment (Beam's pipeline options are a few KB)
MAX_REQUEST_BYTES = 16 * 2**20
#: The start of a shell command that runs a program with Ctrl-C ignored from its first
#: instruction (Python then leaves SIGINT ignored, where it would raise KeyboardInterrupt and
#: print a traceback). Ctrl-C reaches the whole process group: the driver alone acts on it
#: (``convert_cmd._ctrl_c_ends_at_once``), and its worker processes end with it. ``exec``:
#: the shell is replaced, its process id stays.
WITHOUT_CTRL_C = "trap '' INT; exec"
#: Seconds the server gets to wait for its workers at the end of a run
STOP_SECONDS = 10.0


def wants_worker_processes(beam_args: Sequence[str]) -> bool:
    """Whether Beam flags ``beam_args`` ask for SDK worker processes
    (``--direct_running_mode=multi_processing``)."""
    return beam_flag(beam_args, "direct_running_mode") == "multi_processing"


def supported() -> bool:
    """Whether this platform can fork workers this way (Linux: abstract sockets, fd passing)."""
    return sys.platform == "linux" and hasattr(socket, "send_fds")


@contextlib.contextmanager
def serving(enabled: bool, lean: bool) -> Iterator[int | None]:
    """While the block runs, ``multi_processing`` workers of this process are forked from a
    server started here (``lean``: it imports Beam as a lean driver's workers do); yields the
    server's process id. Not ``enabled``, not :func:`supported`, or :data:`SERVER_ENV` already
    set (empty: the user's way to turn this off): nothing is done, and None is yielded."""
    if not enabled or not supported() or SERVER_ENV in os.environ:
        yield None
        return
    name = f"shardfeed-workers-{os.getpid()}-{secrets.token_hex(8)}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)  # an abstract name: no file to remove
    listener.listen(64)
    env = dict(os.environ, **{LISTEN_FD_ENV: str(listener.fileno()), PARENT_ENV: str(os.getpid())})
    if lean:
        env[LEAN_ENV] = "1"
    server = subprocess.Popen(
        ["/bin/sh", "-c", f'{WITHOUT_CTRL_C} "$0" -m {__name__}', sys.executable],
        env=env,
        pass_fds=(listener.fileno(),),
        stdin=subprocess.DEVNULL,
    )
    os.environ[SERVER_ENV] = name
    try:
        yield server.pid
    finally:
        os.environ.pop(SERVER_ENV, None)
        listener.close()
        server.terminate()  # it waits for its workers, which ended with the run, and exits
        try:
            server.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            server.kill()  # a worker still running dies with it
            server.wait()


def serve(listener: socket.socket, parent: int) -> None:
    """Import what workers run, then fork one worker per connection, until killed (or until
    ``parent`` ends)."""
    die_with_parent(parent)
    from shardfeed.pipelines import sdk_worker

    sdk_worker.prepare()
    import shardfeed.pipelines.driver  # noqa: F401  # the steps each worker unpickles

    # workers are waited for, so their CPU time counts in the driver's children's, as before
    signal.signal(signal.SIGCHLD, _reap_workers)
    signal.signal(signal.SIGTERM, _end_after_workers)
    sys.stdout.flush()
    sys.stderr.flush()
    import gc

    gc.freeze()  # the imported objects stay shared with every fork, not copied on collection
    me = os.getpid()
    while True:
        conn, _ = listener.accept()
        if os.fork() == 0:
            try:
                listener.close()
                _run_worker(conn, me)
            finally:
                os._exit(1)  # _run_worker exits itself; this is a failure to even start
        conn.close()


def _reap_workers(signum: int = 0, frame: object = None) -> None:
    """Wait for every forked worker that has ended."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def _end_after_workers(signum: int = 0, frame: object = None) -> None:
    """Exit once every forked worker has (the driver asks at the end of its run)."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    with contextlib.suppress(ChildProcessError):
        while True:
            os.waitpid(-1, 0)
    os._exit(0)


def _run_worker(conn: socket.socket, server: int) -> None:
    """In a forked worker: take the client's streams and environment, run the harness, and
    send the client the exit status."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # a step's own subprocesses are waited for
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    die_with_parent(server)
    environ = _receive(conn)
    os.environ.clear()
    os.environ.update(environ)
    threading.Thread(target=_end_with_client, args=(conn,), daemon=True).start()
    status = 0
    try:
        from shardfeed.pipelines import sdk_worker

        sdk_worker.run_harness(["sdk_worker"])
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:  # as an interpreter would: the traceback, then status 1
        traceback.print_exc()
        status = 1
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    with contextlib.suppress(OSError):
        conn.sendall(bytes([status & 0xFF]))
    os._exit(status)


def _receive(conn: socket.socket) -> dict[str, str]:
    """A client's request: its three standard streams (made this process's own) and its
    environment."""
    head, fds, _, _ = socket.recv_fds(conn, HEADER.size, 3)
    if len(head) != HEADER.size or len(fds) != 3:
        raise ConnectionError("worker fork request: no header or no streams")
    (length,) = HEADER.unpack(head)
    if length > MAX_REQUEST_BYTES:
        raise ConnectionError(f"worker fork request of {length} bytes")
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    chunks, remaining = [], length
    while remaining:
        chunk = conn.recv(min(remaining, 1 << 20))
        if not chunk:
            raise ConnectionError("worker fork request cut short")
        chunks.append(chunk)
        remaining -= len(chunk)
    environ = json.loads(b"".join(chunks))
    return {str(k): str(v) for k, v in environ.items()}


def _end_with_client(conn: socket.socket) -> None:
    """Exit this worker when its client is gone (the runner killed the worker command)."""
    with contextlib.suppress(OSError):
        while conn.recv(1):
            pass
    os._exit(1)


def main() -> None:
    fd = int(os.environ.pop(LISTEN_FD_ENV))
    parent = int(os.environ.pop(PARENT_ENV))
    serve(socket.socket(fileno=fd), parent)


if __name__ == "__main__":
    main()

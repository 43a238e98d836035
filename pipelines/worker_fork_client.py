"""The command Beam's runner starts for each ``multi_processing`` worker while the driver
serves forked workers (``worker_forks.py``): hand this process's environment and standard
streams to the server, wait, and exit with the forked worker's status. Run as a script with
``python -I -S``: the standard library only, started in milliseconds."""

from __future__ import annotations

import json
import os
import socket
import struct
import sys

SERVER_ENV = "SHARDFEED_WORKER_FORKS"  # worker_forks.SERVER_ENV
HEADER = struct.Struct("!Q")  # worker_forks.HEADER
#: The exit status when the worker ended without sending one (it was killed)
WORKER_LOST = 255


def main() -> int:
    request = json.dumps(dict(os.environ)).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.connect("\0" + os.environ[SERVER_ENV])  # an abstract socket name
            socket.send_fds(conn, [HEADER.pack(len(request))], [0, 1, 2])
            conn.sendall(request)
        except (KeyError, OSError) as err:
            print(f"shardfeed: could not start a worker process: {err}", file=sys.stderr)
            return 1
        try:
            status = conn.recv(1)
        except ConnectionResetError:  # the worker died before reading all of the request
            status = b""
    return status[0] if status else WORKER_LOST


if __name__ == "__main__":
    sys.exit(main())

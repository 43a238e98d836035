"""The test proxy's own helpers: finding the process behind a client's TCP port."""

from __future__ import annotations

import os
import socket
import sys

import pytest
from s3_proxy import client_pid

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/net/tcp")


def _listener() -> socket.socket:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    return server


def _client(port: int, remote: socket.socket) -> tuple[socket.socket, socket.socket]:
    """A connection from local ``port`` (0: any) to ``remote``: (client end, server end)."""
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    client.bind(("127.0.0.1", port))
    client.connect(remote.getsockname())
    accepted, _ = remote.accept()
    return client, accepted


def test_a_port_reused_after_time_wait_connections_finds_its_live_owner():
    """Earlier connections from the same local port linger in TIME_WAIT (inode 0 in
    /proc/net/tcp) beside the live one; the owner is the live socket's process, not None (the
    proxy then missed the worker it was to kill: a flaky failure under the full suite)."""
    servers = [_listener() for _ in range(20)]
    port = 0
    for server in servers[:-1]:
        client, accepted = _client(port, server)
        port = client.getsockname()[1]
        client.close()  # the client closes first: its end waits in TIME_WAIT
        accepted.close()
    client, accepted = _client(port, servers[-1])
    try:
        assert client_pid(port) == os.getpid()
    finally:
        for sock in (client, accepted, *servers):
            sock.close()

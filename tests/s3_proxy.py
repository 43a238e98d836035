"""An HTTP proxy on loopback in front of a moto S3 server that records every request.

Each request is logged with its method, key, body size and whether it came from this process (the
driver of a conversion) or another one (a Dask worker): the proxy runs here, so a connection whose
client end is one of this process's own sockets is the driver's. Tests use it to count the bytes
each side sends to the object store.
"""

from __future__ import annotations

import http.client
import http.server
import os
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

ERROR_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>%s</Code><Message>%s</Message>'
    b"<RequestId>0</RequestId></Error>"
)
#: faults answered by the proxy itself: (status, S3 error code, message)
ERRORS = {
    "slowdown": (503, b"SlowDown", b"Please reduce your request rate."),
    "internal": (500, b"InternalError", b"We encountered an internal error. Please try again."),
    "throttle": (429, b"TooManyRequests", b"Too many requests."),
}
#: every fault the proxy injects: the errors above; connections dropped before the request is
#: forwarded and after it reached the store; a body cut off midway; an answer slower than
#: SLOW_SECONDS; a CompleteMultipartUpload answered 200 with an error body
FAULTS = (*ERRORS, "drop_before", "drop_after", "truncate", "slow", "complete_200_error")
SLOW_SECONDS = 3.0

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "te", "trailer"}


@dataclass(frozen=True)
class Request:
    """One request as the proxy saw it: ``key`` is the path without the bucket."""

    method: str
    key: str
    query: str
    sent: int
    from_driver: bool


def _socket_inodes(pid: int | str) -> set[str]:
    """The inodes of a process's open sockets, from /proc (Linux)."""
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _port_inodes() -> dict[int, str]:
    """{local TCP port: socket inode} for the sockets of this network namespace."""
    out = {}
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as handle:
                rows = handle.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[9] != "0":  # a TIME_WAIT socket of an earlier connection on this port
                out.setdefault(int(fields[1].rsplit(":", 1)[1], 16), fields[9])
    return out


def _own_client_ports() -> set[int]:
    """Local TCP ports of this process's sockets."""
    own = _socket_inodes("self")
    return {port for port, inode in _port_inodes().items() if inode in own}


def client_pid(port: int) -> int | None:
    """The process whose socket has local TCP ``port`` (a client of the proxy), if found."""
    inode = _port_inodes().get(port)
    if inode is None:
        return None
    for pid in os.listdir("/proc"):
        if pid.isdigit() and inode in _socket_inodes(pid):
            return int(pid)
    return None


def s3_filesystem(host: str, **options: Any) -> Any:
    """A pyarrow client with the test credentials of the moto server (or proxy) at ``host``."""
    import pyarrow.fs as pafs

    return pafs.S3FileSystem(
        access_key="testing",
        secret_key="testing",
        region="us-east-1",
        scheme="http",
        endpoint_override=host,
        **options,
    )


def start_moto() -> tuple[Any, str, Any]:
    """A moto S3 server on loopback with a bucket named ``bucket``: ``(server, host:port,
    filesystem)``; the caller stops the server."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # not a line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    fs = s3_filesystem(f"{host}:{port}", allow_bucket_creation=True)
    fs.create_dir("bucket")
    return server, f"{host}:{port}", fs


class RecordingProxy:
    """Forwards to ``upstream`` (``host:port``); ``requests`` lists what went through.

    ``hook``, when set, sees each request and the client's port first. It returns True (or None)
    to forward the request, False to close the connection without forwarding it, or the name of
    a fault of :data:`FAULTS` to inject instead."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.requests: list[Request] = []
        self.hook: Callable[[Request, int], bool | str | None] | None = None
        self.injected: list[tuple[str, Request]] = []
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def host(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host}:{port}"

    def start(self) -> RecordingProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()

    def record(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that hung up (a timeout, a fault of ours) is no error of the proxy's."""
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


def _handler(proxy: RecordingProxy) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

        def setup(self) -> None:
            super().setup()
            self.from_driver = self.client_address[1] in _own_client_ports()
            self.upstream = http.client.HTTPConnection(proxy.upstream, timeout=60)

        def finish(self) -> None:
            super().finish()
            self.upstream.close()

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0], 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        return b"".join(chunks)
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _forward(self) -> None:
            body = self._body()
            parts = urlsplit(self.path)
            key = unquote(parts.path).lstrip("/").partition("/")[2]
            request = Request(self.command, key, parts.query, len(body), self.from_driver)
            proxy.record(request)
            action = None if proxy.hook is None else proxy.hook(request, self.client_address[1])
            if action is False:
                action = "drop_before"
            if isinstance(action, str):
                with proxy._lock:
                    proxy.injected.append((action, request))
                if action in ERRORS:
                    self._answer_error(*ERRORS[action])
                    return
                if action == "drop_before":
                    self.close_connection = True
                    return
                if action == "slow":
                    time.sleep(SLOW_SECONDS)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            headers["Content-Length"] = str(len(body))
            self.upstream.request(self.command, self.path, body=body, headers=headers)
            response = self.upstream.getresponse()
            data = response.read()
            if action == "drop_after":  # the request reached the store; its answer never comes
                self.close_connection = True
                return
            if action == "complete_200_error" and "uploadId=" in parts.query:
                data = ERROR_BODY % (b"InternalError", b"We encountered an internal error.")
            self.send_response(response.status, response.reason)
            for name, value in response.getheaders():
                if name.lower() not in HOP_BY_HOP:
                    self.send_header(name, value)
            if self.command == "HEAD":
                self.send_header("Content-Length", response.getheader("Content-Length") or "0")
            else:
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if action == "truncate" and self.command != "HEAD" and len(data) > 1:
                self.wfile.write(data[: len(data) // 2])  # the body stops midway
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if self.command != "HEAD":
                self.wfile.write(data)

        def _answer_error(self, status: int, code: bytes, message: bytes) -> None:
            body = ERROR_BODY % (code, message)
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", "0" if self.command == "HEAD" else str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

    return Handler


class Schedule:
    """Every ``period``-th request gets the next fault of ``kinds``, in turn (deterministic)."""

    def __init__(self, kinds: list[str], period: int) -> None:
        self.kinds, self.period = kinds, period
        self.seen = 0
        self.lock = threading.Lock()

    def __call__(self, request: Request, port: int) -> str | None:
        with self.lock:
            n = self.seen
            self.seen += 1
        if n % self.period:
            return None
        return self.kinds[(n // self.period) % len(self.kinds)]


class WriteSchedule(Schedule):
    """As Schedule, and every other CompleteMultipartUpload answered 200 with an error body."""

    def __init__(self, kinds: list[str], period: int) -> None:
        super().__init__(kinds, period)
        self.completes = 0

    def __call__(self, request: Request, port: int) -> str | None:
        if request.method == "POST" and "uploadId=" in request.query:
            with self.lock:
                self.completes += 1
                if self.completes % 2:
                    return "complete_200_error"
        return super().__call__(request, port)

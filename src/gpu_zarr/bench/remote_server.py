"""A loopback HTTP server over a local folder, with Range support, added latency and injected
failures: what the remote tests and ``gpu-zarr bench --remote`` read from.

Read-only (GET and HEAD only). Each request sleeps ``latency`` seconds first (a round trip);
a seeded fraction of requests fails: ``fail_503`` answers 503, ``fail_reset`` closes the
connection without an answer, ``fail_truncate`` sends the headers of the whole answer and only
half of its body. Paths under ``forbidden`` answer 403. Counters (requests, bytes sent,
the most requests in flight at once) are kept for the benchmark's report.
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = ["RangeServer"]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    def setup(self) -> None:
        super().setup()
        # as real servers do (nginx's tcp_nodelay, S3): headers and body are separate writes,
        # and Nagle's algorithm against the client's delayed ACK held small answers ~40 ms
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
        self._serve(head=True)

    def do_GET(self) -> None:  # noqa: N802
        self._serve(head=False)

    def _serve(self, head: bool) -> None:
        srv = self.server.owner
        with srv.lock:
            srv.requests += 1
            srv.in_flight += 1
            srv.max_in_flight = max(srv.max_in_flight, srv.in_flight)
            fate = srv.fate()
        try:
            if srv.latency:
                time.sleep(srv.latency)
            self._answer(srv, head, fate)
        finally:
            with srv.lock:
                srv.in_flight -= 1

    def _answer(self, srv: RangeServer, head: bool, fate: str) -> None:
        if fate == "reset":
            self.close_connection = True
            self.connection.close()
            return
        if fate == "503":
            self._plain(503, b"injected failure")
            return
        rel = self.path.split("?", 1)[0].lstrip("/")
        if any(rel.startswith(f) for f in srv.forbidden):
            self._plain(403, b"forbidden")
            return
        path = (srv.root / rel).resolve()
        if srv.root not in path.parents and path != srv.root or not path.is_file():
            self._plain(404, b"not found")
            return
        size = path.stat().st_size
        start, end, status = 0, size, 200
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            a, _, b = rng[6:].split(",")[0].partition("-")
            if a == "":
                start, end = max(0, size - int(b)), size
            else:
                start = int(a)
                end = min(size, int(b) + 1) if b else size
            if start >= size or start >= end:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
        self.send_response(status)
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Last-Modified", self.date_time_string(int(path.stat().st_mtime)))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        if head:
            return
        with open(path, "rb") as f:
            f.seek(start)
            body = f.read(end - start)
        if fate == "truncate":
            body = body[: len(body) // 2]
            self.close_connection = True
        self.wfile.write(body)
        with srv.lock:
            srv.bytes_sent += len(body)
        if fate == "truncate":
            self.wfile.flush()
            self.connection.close()

    def _plain(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024
    owner: RangeServer

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.owner.lock:
            self.owner.connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.owner.lock:
            self.owner.connections.discard(request)
        super().shutdown_request(request)


class RangeServer:
    """Serve ``root`` on 127.0.0.1 (a free port) until :meth:`close`; a context manager.

    Parameters
    ----------
    root : path
        The folder served (``http://127.0.0.1:PORT/<relative path>``).
    latency : float
        Seconds added to every request.
    fail_503, fail_reset, fail_truncate : float
        Fractions of requests that fail that way (seeded by ``seed``).
    forbidden : tuple of str
        Relative path prefixes answered with 403.
    """

    def __init__(self, root: str | os.PathLike[str], *, latency: float = 0.0, fail_503: float = 0.0,
                 fail_reset: float = 0.0, fail_truncate: float = 0.0, forbidden: tuple[str, ...] = (),
                 seed: int = 0) -> None:
        self.root = Path(root).resolve()
        self.latency = latency
        self.fail_503, self.fail_reset, self.fail_truncate = fail_503, fail_reset, fail_truncate
        self.forbidden = forbidden
        self._rng = random.Random(seed)
        self.lock = threading.Lock()
        self.connections: set[Any] = set()
        self.requests = self.bytes_sent = self.in_flight = self.max_in_flight = 0
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.owner = self
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True, name="gpu-zarr-range-server")
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fate(self) -> str:
        """This request's injected failure ("" for none); called under the lock."""
        x = self._rng.random()
        for name, p in (("503", self.fail_503), ("reset", self.fail_reset), ("truncate", self.fail_truncate)):
            if x < p:
                return name
            x -= p
        return ""

    def reset_counters(self) -> None:
        with self.lock:
            self.requests = self.bytes_sent = self.max_in_flight = 0

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        with self.lock:  # kept-alive connections too: a closed server answers nothing
            conns, self.connections = list(self.connections), set()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
                c.close()
            except OSError:
                pass
        self._thread.join(5)

    def __enter__(self) -> RangeServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

"""A loopback HTTP server over a local folder, with Range support, added latency and injected
failures: what the remote tests and ``gpu-zarr bench --remote`` read from.

Read-only: GET and HEAD are served; any other method (PUT, POST, DELETE, PATCH...) is
answered 405 and recorded, like every request, in :attr:`RangeServer.log` (method, path, the
request's headers, status, time), so tests can assert that nothing tried to write. Each request
sleeps ``latency`` seconds first (a round trip); a seeded fraction of requests fails:
``fail_503`` answers 503, ``fail_429`` answers 429 Too Many Requests, ``fail_reset`` closes the
connection without an answer, ``fail_truncate`` sends the headers of the whole answer and only
half of its body. ``stall`` seconds: every request waits that long before answering (a server
that hangs; :meth:`RangeServer.close` ends the wait). Paths under ``forbidden`` answer 403.
Counters (requests, bytes sent, the most requests in flight at once) are kept for the
benchmark's report.

:class:`ProxyServer` puts the same latency, failures and log in front of another server (the
tests' S3 server, moto's, which cannot inject them itself): GET and HEAD are forwarded as they
came (path, query, headers, so signatures stay valid), anything else is refused and recorded.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

__all__ = ["ProxyServer", "RangeServer", "ServerProcess", "main"]


#: control paths of a server run as its own process (:class:`ServerProcess`)
_STATS, _RESET = "/__gpu_zarr_stats__", "/__gpu_zarr_reset__"


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
        srv = self.server.owner
        if srv.control and self.path in (_STATS, _RESET):  # ServerProcess's counters: not logged
            if self.path == _RESET:
                srv.reset_counters()
            with srv.lock:
                body = json.dumps({"requests": srv.requests, "bytes_sent": srv.bytes_sent,
                                   "max_in_flight": srv.max_in_flight}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self._serve(head=False)

    def _refuse(self) -> None:
        """Any method but GET and HEAD: recorded, answered 405, nothing written."""
        srv = self.server.owner
        entry = self._record(srv)
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        self._plain(405, b"read-only server", entry)

    do_PUT = do_POST = do_DELETE = do_PATCH = do_OPTIONS = _refuse  # noqa: N815 - http.server's names

    def _record(self, srv: RangeServer) -> dict[str, Any]:
        entry = {"method": self.command, "path": self.path,
                 "headers": {k.lower(): v for k, v in self.headers.items()},
                 "status": None, "time": time.monotonic()}
        with srv.lock:
            srv.log.append(entry)
        return entry

    def _serve(self, head: bool) -> None:
        srv = self.server.owner
        entry = self._record(srv)
        with srv.lock:
            srv.requests += 1
            srv.in_flight += 1
            srv.max_in_flight = max(srv.max_in_flight, srv.in_flight)
            fate = srv.fate()
        try:
            if srv.latency:
                time.sleep(srv.latency)
            if srv.stall:
                srv.closing.wait(srv.stall)
            self._answer(srv, head, fate, entry)
        finally:
            with srv.lock:
                srv.in_flight -= 1
                entry["end"] = time.monotonic()

    def _answer(self, srv: RangeServer, head: bool, fate: str, entry: dict[str, Any]) -> None:
        if fate == "reset":
            self.close_connection = True
            self.connection.close()
            return
        if fate in ("503", "429"):
            self._plain(int(fate), b"injected failure", entry)
            return
        if isinstance(srv, ProxyServer):
            self._forward(srv, head, fate, entry)
            return
        rel = self.path.split("?", 1)[0].lstrip("/")
        if any(rel.startswith(f) for f in srv.forbidden):
            self._plain(403, b"forbidden", entry)
            return
        path = (srv.root / rel).resolve()
        if srv.root not in path.parents and path != srv.root or not path.is_file():
            self._plain(404, b"not found", entry)
            return
        size = path.stat().st_size
        start, end, status = 0, size, 200
        rng = self.headers.get("Range") if srv.ranges else None  # a server that answers no ranges: 200, all
        if rng and rng.startswith("bytes="):
            a, _, b = rng[6:].split(",")[0].partition("-")
            if a == "":
                start, end = max(0, size - int(b)), size
            else:
                start = int(a)
                end = min(size, int(b) + 1) if b else size
            if start >= size or start >= end:
                entry["status"] = 416
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
        entry["status"] = status
        self.send_response(status)
        self.send_header("Content-Length", str(end - start))
        if srv.ranges:
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
        self._send_body(srv, body, fate)

    def _send_body(self, srv: RangeServer, body: bytes, fate: str) -> None:
        """The body, or its first half and a closed connection when ``fate`` is "truncate"."""
        if fate == "truncate":
            body = body[: len(body) // 2]
            self.close_connection = True
        step, pause = getattr(srv, "trickle", None) or (len(body) or 1, 0.0)
        for k in range(0, len(body), step):
            if k:
                self.wfile.flush()
                time.sleep(pause)
            self.wfile.write(body[k:k + step])
        with srv.lock:
            srv.bytes_sent += len(body)
        if fate == "truncate":
            self.wfile.flush()
            self.connection.close()

    def _forward(self, srv: ProxyServer, head: bool, fate: str, entry: dict[str, Any]) -> None:
        import http.client

        up = urlsplit(srv.upstream)
        conn = http.client.HTTPConnection(up.hostname or "127.0.0.1", up.port, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "keep-alive")}
            conn.request(self.command, self.path, headers=headers)  # Host as sent: signatures hold
            resp = conn.getresponse()
            body = resp.read()
            out = [(k, v) for k, v in resp.getheaders()
                   if k.lower() not in ("connection", "keep-alive", "transfer-encoding", "content-length")]
        finally:
            conn.close()
        entry["status"] = resp.status
        self.send_response(resp.status)
        for k, v in out:
            self.send_header(k, v)
        self.send_header("Content-Length", str(resp.getheader("Content-Length") if head else len(body)))
        self.end_headers()
        if head:
            return
        self._send_body(srv, body, fate)

    def _plain(self, code: int, body: bytes, entry: dict[str, Any]) -> None:
        entry["status"] = code
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

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return  # the client went away (a reset, a timeout, the server closing): not a server fault
        super().handle_error(request, client_address)

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
    fail_503, fail_429, fail_reset, fail_truncate : float
        Fractions of requests that fail that way (seeded by ``seed``).
    stall : float
        Seconds every request waits before its answer (0: none); settable while serving.
    forbidden : tuple of str
        Relative path prefixes answered with 403.
    ranges : bool
        False: Range headers are ignored (200 and the whole object), as python's ``http.server``
        and some static hosts do.
    trickle : (int, float), optional
        Bodies are sent ``trickle[0]`` bytes at a time, ``trickle[1]`` seconds apart (a slow
        link: a reader sees a body arrive in parts).

    Attributes
    ----------
    log : list of dict
        Every request received: ``method``, ``path``, ``headers`` (names in lower case),
        ``status`` (None when the connection was reset) and ``time`` (``time.monotonic()``
        on arrival).
    """

    def __init__(self, root: str | os.PathLike[str], *, latency: float = 0.0, fail_503: float = 0.0,
                 fail_429: float = 0.0, fail_reset: float = 0.0, fail_truncate: float = 0.0, stall: float = 0.0,
                 forbidden: tuple[str, ...] = (), seed: int = 0, control: bool = False, ranges: bool = True,
                 trickle: tuple[int, float] | None = None) -> None:
        self.root = Path(root).resolve()
        self.trickle = trickle
        self.ranges = ranges
        self.control = control  # answer ServerProcess's counter requests
        self.latency = latency
        self.fail_503, self.fail_reset, self.fail_truncate = fail_503, fail_reset, fail_truncate
        self.fail_429 = fail_429
        self.stall = stall
        self.closing = threading.Event()
        self.forbidden = forbidden
        self.log: list[dict[str, Any]] = []
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
        for name, p in (("503", self.fail_503), ("429", self.fail_429), ("reset", self.fail_reset),
                        ("truncate", self.fail_truncate)):
            if x < p:
                return name
            x -= p
        return ""

    def reset_counters(self) -> None:
        with self.lock:
            self.requests = self.bytes_sent = self.max_in_flight = 0
            self.log = []

    def methods(self) -> set[str]:
        """The HTTP methods received so far."""
        with self.lock:
            return {e["method"] for e in self.log}

    def close(self) -> None:
        self.closing.set()
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


class ProxyServer(RangeServer):
    """A read-only loopback proxy in front of ``upstream`` (e.g. ``http://127.0.0.1:PORT`` of
    moto's S3 server) with :class:`RangeServer`'s latency, injected failures and request log.

    GET and HEAD are forwarded unchanged (method, path and query, headers including Host, so
    signed requests stay valid); other methods are answered 405 and recorded, never forwarded.
    Parameters as :class:`RangeServer` (``root`` aside; ``forbidden`` does not apply).
    """

    def __init__(self, upstream: str, **kwargs: Any) -> None:
        self.upstream = upstream.rstrip("/")
        super().__init__(os.getcwd(), **kwargs)

    def __enter__(self) -> ProxyServer:
        return self


class ServerProcess:
    """A :class:`RangeServer` in a process of its own, as a real server is: its Python threads
    do not compete with the client's for one interpreter (TensorStore's C++ client never
    needed the interpreter; ours and zarr-python's do). Counters as :class:`RangeServer`'s
    (``requests``, ``bytes_sent``, ``max_in_flight``, :meth:`reset_counters`), read over HTTP."""

    def __init__(self, root: str | os.PathLike[str], *, latency: float = 0.0) -> None:
        self._proc = subprocess.Popen([sys.executable, "-m", "gpu_zarr.bench.remote_server", str(root),
                                       "--latency", repr(float(latency))],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline().split()
        if len(line) != 2 or line[0] != "PORT":
            self.close()
            raise RuntimeError(f"the test server process did not start (it said {line!r})")
        self.port = int(line[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _get(self, path: str) -> dict[str, int]:
        from urllib.request import urlopen

        with urlopen(self.url + path, timeout=30) as r:
            return dict(json.loads(r.read()))

    @property
    def requests(self) -> int:
        return self._get(_STATS)["requests"]

    @property
    def bytes_sent(self) -> int:
        return self._get(_STATS)["bytes_sent"]

    @property
    def max_in_flight(self) -> int:
        return self._get(_STATS)["max_in_flight"]

    def reset_counters(self) -> None:
        self._get(_RESET)

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()  # the server stops when its stdin closes
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(5)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m gpu_zarr.bench.remote_server ROOT [--latency S]``: serve ROOT on a free
    loopback port, print ``PORT <n>``, stop when standard input closes."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m gpu_zarr.bench.remote_server", description=main.__doc__)
    p.add_argument("root")
    p.add_argument("--latency", type=float, default=0.0, help="seconds added to every request")
    a = p.parse_args(argv)
    with RangeServer(a.root, latency=a.latency, control=True) as srv:
        print(f"PORT {srv.port}", flush=True)
        sys.stdin.read()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

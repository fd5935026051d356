"""A hostile HTTP server on loopback, and reads run in a child process whose peak memory and
wall time are measured (issue 35).

:class:`HostileServer` serves a folder like any static server with Range support, except for
the requests its ``mode`` picks (``hits(path, headers)``), which it answers the way a hostile
or broken server would: a huge body, a 200 to a Range request, a body dripped a byte at a
time, a wrong Content-Range, a redirect to another scheme or host. Every request's path and
headers are logged. It is bounded in time: it stops by itself after ``lifetime`` seconds
(every handler gives up then), and bodies are generated as they are sent, so the server never
holds them.

:func:`run_child` runs a read in a fresh interpreter and returns what it printed (one JSON
line), its exit status, its wall time and its peak resident memory (``os.wait4``'s rusage of
that child): the memory a read held, whatever held it (obstore's buffers, libcurl's, ours).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SRC = str(Path(__file__).resolve().parents[1] / "src")
_PIECE = 1 << 20


class HostileServer:
    """Serve ``root`` on 127.0.0.1; requests for which ``hits(path, headers)`` is true get
    ``mode``'s answer (see the module docstring):

    - ``"big"``: 200 with ``big`` bytes, whatever was asked (Content-Length given, or not
      with ``length=False``);
    - ``"range200"``: a Range request answered 200, the whole file followed by ``big`` bytes;
    - ``"drip"``: the file's true headers, its body one byte every ``drip_s`` seconds;
    - ``"suffix_wrong"``: a suffix request answered 206 with the object's FIRST bytes
      (``Content-Range: bytes 0-<n-1>/<size>``);
    - ``"redirect"``: 302 to ``target`` + the path (``target`` may be another scheme or host);
    - ``"claim"``: an object of ``claim`` bytes, zeros then the file (a shard whose index
      points far into it), every answer consistent with that size.
    """

    def __init__(self, root: Path, mode: str = "", hits: Callable[[str, dict[str, str]], bool] | None = None, *,
                 big: int = 400 << 20, length: bool = True, drip_s: float = 0.4, target: str = "",
                 claim: int = 0, lifetime: float = 60.0) -> None:
        self.root, self.mode, self.hits = Path(root), mode, hits or (lambda p, h: False)
        self.big, self.length, self.drip_s, self.target, self.claim = big, length, drip_s, target, claim
        self.lifetime = lifetime
        self.log: list[dict[str, Any]] = []
        self.closing = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                owner._serve(self)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True, name="hostile-server")
        self._timer = threading.Timer(lifetime, self.close)
        self._timer.daemon = True

    def __enter__(self) -> HostileServer:
        self._thread.start()
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop serving (idempotent): handlers still sending give up at their next piece."""
        if self.closing.is_set():
            return
        self.closing.set()
        self._timer.cancel()
        self._httpd.shutdown()
        self._httpd.server_close()

    # -- answers -----------------------------------------------------------------------------
    def _serve(self, h: BaseHTTPRequestHandler) -> None:
        path = h.path.split("?", 1)[0]
        headers = {k.lower(): v for k, v in h.headers.items()}
        self.log.append({"path": path, "headers": headers})
        try:
            if self.mode and self.hits(path, headers):
                getattr(self, f"_{self.mode}")(h, path, headers)
            else:
                self._file(h, path, headers)
        except (BrokenPipeError, ConnectionResetError, TimeoutError, OSError):
            h.close_connection = True  # the client gave up: that is the point

    def _file_bytes(self, path: str) -> bytes | None:
        f = (self.root / path.lstrip("/")).resolve()
        if not f.is_relative_to(self.root.resolve()) or not f.is_file():
            return None
        return f.read_bytes()

    def _file(self, h: BaseHTTPRequestHandler, path: str, headers: dict[str, str], total: int | None = None) -> None:
        data = self._file_bytes(path)
        if data is None:
            h.send_response(404)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        rng = _range(headers.get("range", ""), len(data))
        if rng is None:
            h.send_response(200)
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data)
            return
        a, b = rng
        h.send_response(206)
        h.send_header("Content-Range", f"bytes {a}-{b - 1}/{total if total is not None else len(data)}")
        h.send_header("Content-Length", str(b - a))
        h.end_headers()
        h.wfile.write(data[a:b])

    def _send_generated(self, h: BaseHTTPRequestHandler, n: int, head: bytes = b"") -> None:
        """``head`` then zeros up to ``n`` bytes in all, a piece at a time (never held whole)."""
        zeros = bytes(_PIECE)
        h.wfile.write(head)
        left = n - len(head)
        while left > 0 and not self.closing.is_set():
            k = min(left, _PIECE)
            h.wfile.write(zeros[:k])
            left -= k

    def _big(self, h: BaseHTTPRequestHandler, path: str, headers: dict[str, str]) -> None:
        h.send_response(200)
        if self.length:
            h.send_header("Content-Length", str(self.big))
        else:
            h.send_header("Connection", "close")
            h.close_connection = True
        h.end_headers()
        self._send_generated(h, self.big)

    def _range200(self, h: BaseHTTPRequestHandler, path: str, headers: dict[str, str]) -> None:
        data = self._file_bytes(path)
        if data is None or "range" not in headers:
            self._file(h, path, headers)
            return
        h.send_response(200)
        h.send_header("Content-Length", str(len(data) + self.big))
        h.end_headers()
        self._send_generated(h, len(data) + self.big, data)

    def _drip(self, h: BaseHTTPRequestHandler, path: str, headers: dict[str, str]) -> None:
        data = self._file_bytes(path) or b"\0" * 4096
        h.send_response(200)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        for k in range(len(data)):
            if self.closing.wait(self.drip_s):
                return
            h.wfile.write(data[k:k + 1])
            h.wfile.flush()

    def _suffix_wrong(self, h: BaseHTTPRequestHandler, path: str, headers: dict[str, str]) -> None:
        data = self._file_bytes(path)
        m = re.fullmatch(r"bytes=-(\d+)", headers.get("range", "").strip())
        if data is None or m is None:
            self._file(h, path, headers)
            return
        n = min(int(m.group(1)), len(data))
        h.send_response(206)
        h.send_header("Content-Range", f"bytes 0-{n - 1}/{len(data)}")  # the first n bytes, not the last
        h.send_header("Content-Length", str(n))
        h.end_headers()
        h.wfile.write(data[:n])

    def _redirect(self, h: BaseHTTPRequestHandler, path: str, headers: dict[str, str]) -> None:
        h.send_response(302)
        h.send_header("Location", self.target + path)
        h.send_header("Content-Length", "0")
        h.end_headers()

    def _claim(self, h: BaseHTTPRequestHandler, path: str, headers: dict[str, str]) -> None:
        """An object of ``claim`` bytes: zeros, then the file's bytes at its end (its shard index
        where a reader looks for it); every answer consistent with that size."""
        data = self._file_bytes(path) or b""
        size = max(self.claim, len(data))
        rng = _range(headers.get("range", ""), size)
        if rng is None:  # (never held: zeros generated as sent)
            h.send_response(200)
            h.send_header("Content-Length", str(size))
            h.end_headers()
            self._send_generated(h, size - len(data))
            h.wfile.write(data)
            return
        a, b = rng
        at = size - len(data)
        tail = data[max(0, a - at):max(0, b - at)]
        h.send_response(206)
        h.send_header("Content-Range", f"bytes {a}-{b - 1}/{size}")
        h.send_header("Content-Length", str(b - a))
        h.end_headers()
        self._send_generated(h, b - a - len(tail))
        h.wfile.write(tail)


def _range(value: str, size: int) -> tuple[int, int] | None:
    """[start, end) of a single ``bytes=`` range against an object of ``size`` bytes (None: none)."""
    m = re.fullmatch(r"bytes=(\d*)-(\d*)", value.strip())
    if m is None:
        return None
    a, b = m.groups()
    if a == "":
        n = int(b)
        return max(0, size - n), size
    start = int(a)
    end = min(size, int(b) + 1) if b else size
    return start, max(start, end)


@dataclass
class Child:
    """What a read in a child process gave: its JSON line (``out``), exit status, wall time (s),
    peak resident memory (MiB) and its own measure of its memory just before the read (MiB)."""

    out: dict[str, Any]
    rc: int
    wall_s: float
    peak_mib: float
    stderr: str

    @property
    def growth_mib(self) -> float:
        """Peak memory beyond what the child held before its read (imports, the store opened)."""
        return self.peak_mib - float(self.out.get("before_mib", 0.0))


#: the child's frame: ``body`` runs after the imports; it sets ``result`` (JSON-able); an
#: exception is reported as {"error": class name, "message": text, "gpu_zarr": bool}
_FRAME = """
import json, resource, sys, time, traceback
import numpy as np, zarr
import gpu_zarr
from gpu_zarr.errors import GpuZarrError
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
out = {{}}
t = time.monotonic()
try:
{body}
except BaseException as exc:
    out.update(error=type(exc).__name__, message=str(exc), gpu_zarr=isinstance(exc, GpuZarrError),
               trace=traceback.format_exc()[-3000:])
out.update(seconds=time.monotonic() - t, before_mib=before)
print("\\n" + json.dumps(out, default=str))
"""


def run_child(body: str, *, timeout: float = 60.0, env: dict[str, str] | None = None) -> Child:
    """Run ``body`` (statements, indented by 4 here) in a fresh interpreter with this tree's
    ``src`` first on the path; killed after ``timeout`` s (rc -9 then)."""
    import tempfile

    code = _FRAME.format(body="\n".join("    " + line for line in body.strip("\n").splitlines()))
    full_env = {**os.environ, "PYTHONPATH": SRC, "GPU_ZARR_REMOTE_CACHE_MIB": "4", **(env or {})}
    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        t = time.monotonic()
        p = subprocess.Popen([sys.executable, "-c", code], stdout=fo, stderr=fe, env=full_env)
        killer = threading.Timer(timeout, p.kill)
        killer.start()
        try:
            # reaped here, not by Popen: wait4 gives this child's own rusage (its peak memory)
            _, status, usage = os.wait4(p.pid, 0)
        finally:
            killer.cancel()
        wall = time.monotonic() - t
        p.returncode = os.waitstatus_to_exitcode(status)
        fo.seek(0)
        fe.seek(0)
        out_b, err_b = fo.read(), fe.read()
    lines = [ln for ln in out_b.decode(errors="replace").splitlines() if ln.startswith("{")]
    out = json.loads(lines[-1]) if lines else {}
    return Child(out, p.returncode, wall, usage.ru_maxrss / 1024, err_b.decode(errors="replace"))


def free_port_url() -> str:
    """An http URL on loopback where nothing listens (connections are refused)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"

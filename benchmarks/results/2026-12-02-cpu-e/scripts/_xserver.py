"""The server of xproc_server.py, started and read from the client's side."""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


class XServer:
    def __init__(self, root: str, latency_s: float) -> None:
        self.p = subprocess.Popen([sys.executable, os.path.join(HERE, "xproc_server.py"), root, str(latency_s)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.p.stdout is not None
        self.port = int(self.p.stdout.readline().split()[1])

    def dump(self) -> list[dict]:
        """The requests since the last dump."""
        assert self.p.stdin is not None and self.p.stdout is not None
        fd, fn = tempfile.mkstemp()
        os.close(fd)
        self.p.stdin.write(f"dump {fn}\n")
        self.p.stdin.flush()
        self.p.stdout.readline()
        with open(fn) as f:
            log = json.load(f)
        os.unlink(fn)
        return log

    def close(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.close()
        self.p.wait()

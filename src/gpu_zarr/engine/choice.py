"""Where a read's chunks decode: on the host's native threads (then one copy to the GPU) or
in nvCOMP batches on the GPU, whichever this machine is estimated to do faster.

nvCOMP's batched decode costs about the same per call whatever the call holds, while the host
decodes a chunk per thread at a rate that depends on the codec (LZ4 several times zstd's, gzip a
fraction of it) and on the machine. So a read of a few chunks is faster on CPU threads and a
read of many on the GPU, and where the two cross moves with the codec and the CPU.
:func:`choose` estimates both times from:

- **this process's host decode rates**, per codec (:class:`DecodeRates`, owned by the
  runtime): every read decoded on CPU threads records its decoded bytes per second per
  thread (read and place included: what that executor costs). A codec not yet decoded here
  uses a seed rate (:data:`SEED_HOST_RATE`), replaced by the first measurement; measurements
  are held between a quarter and eight times the seed, so one disturbed read cannot send a
  damaged store's few chunks to nvCOMP (undefined on corrupt input) or a big read to the CPU;
- **nvCOMP's per-call latency** by codec (:data:`GPU_CALL_S`) and its rate once the call is
  busy (:data:`GPU_RATE`), and the host-device copies (:data:`COPY_RATE`).

Only reads up to ``settings`` ``small_read`` decoded bytes are weighed (0: every read
decodes on the GPU): a bigger read holds several batches of ``batch_bytes``, each full, and
a full batch is where nvCOMP's latency is spread thinnest, so every one of them goes to the
GPU; a read at most ``small_read`` fits in one batch, so this choice per read is the choice
per batch. Both estimates, the rate used and whether it was measured are in the read's
stats (``executor``) and its reason.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

__all__ = ["COPY_RATE", "GPU_CALL_S", "GPU_RATE", "SEED_HOST_RATE", "DecodeRates", "Estimate", "choose",
           "codec_key", "decode_rates"]

GiB = 1 << 30

#: decoded bytes per second one host thread reads, decodes and places, per codec, before
#: this process has measured its own (conservative: a measurement replaces it)
SEED_HOST_RATE = MappingProxyType({"zstd": 0.75 * GiB, "lz4": 2.0 * GiB, "blosclz": 2.0 * GiB, "snappy": 1.5 * GiB,
                  "zlib": 0.3 * GiB, "gzip": 0.3 * GiB, "deflate": 0.3 * GiB, "raw": 4.0 * GiB,
                  "host": 0.3 * GiB})
#: nvCOMP's time per batched call, about the same whatever it holds; the "host" chain decodes
#: on the host on either path, so the GPU adds nothing
GPU_CALL_S = MappingProxyType({"zstd": 8e-3, "lz4": 6e-3, "zlib": 8e-3, "gzip": 8e-3, "deflate": 8e-3,
                               "raw": 0.0})
#: decoded bytes per second of a busy nvCOMP call (a few hundred chunks a call)
GPU_RATE = 25.0 * GiB
#: host <-> device copies from page-locked memory
COPY_RATE = 20.0 * GiB
#: what setting up a staged GPU read costs beyond its decode (streams, staging, events)
GPU_SETUP_S = 1e-3
#: a measurement moves the rate this far towards itself (reads vary 20-30 % run to run)
_WEIGHT = 0.3
#: reads of less than this per thread say little about a rate (thread wake-up, page faults)
_MIN_SAMPLE = 256 << 10
#: a measured rate is held within these factors of its seed: one disturbed read (a cold page
#: cache, a busy machine) must not send tiny reads to the GPU or big ones to the CPU
_CLAMP = (0.25, 8.0)


def codec_key(lay: Any) -> str:
    """The name a layout's chunks are decoded by, for rates: its core codec, Blosc by its
    inner codec (``lz4``, ``zstd``, ...), a chain of the codecs' own decode "host"."""
    if lay.codec == "blosc":
        return str(lay.codec_params.get("cname", "lz4"))
    return str(lay.codec)


class DecodeRates:
    """This process's host decode rates, bytes per second per thread, by :func:`codec_key`
    (a moving average of the reads decoded on CPU threads). Safe from many threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rates: dict[str, float] = {}
        self._samples: dict[str, int] = {}

    def host_rate(self, key: str) -> tuple[float, bool]:
        """(rate, measured): the measured rate of codec ``key``, else its seed."""
        with self._lock:
            rate = self._rates.get(key)
        if rate is not None:
            return rate, True
        return SEED_HOST_RATE.get(key, SEED_HOST_RATE["host"]), False

    def record(self, key: str, decoded_bytes: int, seconds: float, threads: int) -> None:
        """One read decoded ``decoded_bytes`` of codec ``key`` on ``threads`` threads in
        ``seconds`` (reads of under 256 KiB a thread, or timed at 0, are left out)."""
        if threads < 1 or decoded_bytes < _MIN_SAMPLE * threads or seconds <= 0:
            return
        seed = SEED_HOST_RATE.get(key, SEED_HOST_RATE["host"])
        rate = min(max(decoded_bytes / seconds / threads, _CLAMP[0] * seed), _CLAMP[1] * seed)
        with self._lock:
            old = self._rates.get(key)
            self._rates[key] = rate if old is None else old + _WEIGHT * (rate - old)
            self._samples[key] = self._samples.get(key, 0) + 1

    def report(self) -> dict[str, dict[str, float]]:
        """Per codec: the measured rate (GiB/s per thread) and how many reads made it."""
        with self._lock:
            return {k: {"gib_per_s_per_thread": v / GiB, "reads": self._samples[k]} for k, v in self._rates.items()}


def decode_rates(rt: Any) -> DecodeRates:
    """The runtime's :class:`DecodeRates` (one per runtime: released by ``close()``)."""
    return rt.resource("decode-rates", DecodeRates)


@dataclass(frozen=True)
class Estimate:
    """The two estimated times of one read and the executor chosen."""

    executor: str  # "cpu" or "gpu"
    cpu_s: float
    gpu_s: float
    codec: str
    host_rate: float
    measured: bool

    def stats(self) -> dict[str, Any]:
        return {"executor": self.executor, "estimate_cpu_ms": round(self.cpu_s * 1e3, 3),
                "estimate_gpu_ms": round(self.gpu_s * 1e3, 3), "host_rate_gibps": round(self.host_rate / GiB, 3),
                "host_rate_measured": self.measured}

    def describe(self) -> str:
        """E.g. "est. 1.2 ms on CPU threads, 9.8 on the GPU (zstd 0.41 GiB/s a thread, measured)"."""
        how = "measured" if self.measured else "seed"
        return (f"est. {self.cpu_s * 1e3:.1f} ms on CPU threads, {self.gpu_s * 1e3:.1f} on the GPU "
                f"({self.codec} {self.host_rate / GiB:.2f} GiB/s a thread, {how})")


def choose(rates: DecodeRates, key: str, chunks: int, decoded: int, threads: int, *, to_device: bool,
           batch_bytes: int) -> Estimate:
    """Estimate a read of ``chunks`` chunks, ``decoded`` bytes, of codec ``key`` on ``threads``
    host threads against one on the GPU, for a result on the device (``to_device``) or in
    host memory, and choose the faster."""
    rate, measured = rates.host_rate(key)
    used = max(1, min(threads, chunks))  # one thread decodes a chunk
    copy = decoded / COPY_RATE
    cpu = decoded / (used * rate) + (copy if to_device else 0.0)
    if key in GPU_CALL_S:
        calls = max(1, math.ceil(decoded / max(1, batch_bytes)))
        # the GPU path reads the chunks on the same threads (at most the decoded bytes), uploads
        # them, decodes and, for a host result, copies back
        read = decoded / (used * SEED_HOST_RATE["raw"])
        gpu = GPU_SETUP_S + read + copy + calls * GPU_CALL_S[key] + decoded / GPU_RATE + (0.0 if to_device else copy)
    else:  # decoded by the codecs' own decode on either path (or no GPU decoder): the GPU adds copies
        gpu = cpu + GPU_SETUP_S + copy
    return Estimate("cpu" if cpu <= gpu else "gpu", cpu, gpu, key, rate, measured)

"""Why did ours-gpu store 6.7 % more bytes plain than sharded (the H200 write bench at 9a6b7c9:
ratio 2.005 plain, 2.138 sharded; TensorStore 2.066 for both)?

From the code, both layouts hand nvCOMP the same chunks (1x512x1024 uint16, C order of the grid),
in batches of the same count (``batch_bytes`` // 1 MiB units plain, // 64 MiB shards sharded),
through the same kept codec (RAW zstd, one per stream and lane thread); only the gathering
differs (one copy per chunk plain, one per shard sharded) and so the lanes' timing. On the CPU
(numcodecs) the two layouts store byte-identical chunks (tests/test_write.py). So this probe
asks nvCOMP, on the GPU, in seconds:

1. ``encode``: the first batch of each layout's plan, gathered as the writer gathers it, encoded
   by :class:`gpu_zarr.write.encode.GpuEncoder` on a fresh thread and again on the same one
   (a kept codec), then every chunk alone and all chunks in one call: the total bytes, and how
   many chunks came out a different size than the plain batch gave them. libzstd level 3
   (numcodecs, what TensorStore writes) beside them.
2. ``writes``: the bench's writes (plain then sharded, then sharded then plain, lanes 3 and
   1), each store's chunk bytes summed per chunk and the stores read back by zarr-python on
   the CPU (so a smaller store that is not the data shows as such).

Usage (GPU machine): ``python3 benchmarks/nvcomp_write_sizes.py [--size-mib 512] [--batch-mib 192]``.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np


def _encode_sizes(encoder: Any, chunks: Any, fresh_thread: bool) -> np.ndarray:
    """Encoded size of each chunk of ``chunks`` (n, *chunk) in one call, on this or a fresh thread."""
    out: list[np.ndarray] = []

    def go() -> None:
        enc = encoder.encode(chunks)
        out.append(enc.sizes.copy())
        enc.release()

    if fresh_thread:
        t = threading.Thread(target=go)
        t.start()
        t.join()
    else:
        go()
    return out[0]


def probe_encode(data: np.ndarray, chunks: tuple[int, ...], shards: tuple[int, ...], batch: int) -> None:
    import cupy
    from numcodecs import Zstd

    from gpu_zarr.engine.runtime import get_runtime
    from gpu_zarr.write.codecs import codec_spec
    from gpu_zarr.write.encode import GpuEncoder
    from gpu_zarr.write.plan import make_plan
    from gpu_zarr.write.writer import _gather

    dev = cupy.asarray(data)
    enc = GpuEncoder(codec_spec("zstd", 3, 2), get_runtime())
    got: dict[str, np.ndarray] = {}
    gathered: dict[str, Any] = {}
    for name, sh in (("plain", False), ("sharded", shards)):
        plan = make_plan(data.shape, data.dtype, chunks, sh, 3, shard_bytes=64 << 20)
        units = next(iter(plan.batches(batch)))
        gathered[name] = _gather([dev[u.region] for u in units], units, plan, 0, cupy)
        print(f"{name}: first batch {len(units)} units, {gathered[name].shape[0]} chunks")
    same = bool(cupy.array_equal(gathered["plain"], gathered["sharded"]))
    print(f"the two batches hold the same chunks in the same order: {same}")
    base = gathered["plain"]
    got["plain batch, fresh thread"] = _encode_sizes(enc, base, True)
    got["plain batch, again (kept codec)"] = _encode_sizes(enc, base, False)
    got["sharded batch, fresh thread"] = _encode_sizes(enc, gathered["sharded"], True)
    got["sharded batch, again (kept codec)"] = _encode_sizes(enc, gathered["sharded"], False)
    got["one chunk a call"] = np.array([int(_encode_sizes(enc, base[i:i + 1], False)[0])
                                        for i in range(min(64, base.shape[0]))])
    got["half the batch a call"] = _encode_sizes(enc, base[: base.shape[0] // 2], False)
    host = cupy.asnumpy(base)
    z = Zstd(level=3)
    got["libzstd level 3 (numcodecs)"] = np.array([len(z.encode(host[i])) for i in range(host.shape[0])])
    ref = got["plain batch, fresh thread"]
    for name, sizes in got.items():
        n = len(sizes)
        diff = int((sizes != ref[:n]).sum())
        print(f"  {name:36s} {n:5d} chunks {int(sizes.sum()):13d} B ({sizes.sum() / ref[:n].sum() - 1:+.2%} vs "
              f"plain batch), {diff} chunks of another size")
    enc.close()


def _chunk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in (path / "c").rglob("*") if f.is_file())


def probe_writes(data: np.ndarray, chunks: tuple[int, ...], shards: tuple[int, ...], root: Path) -> None:
    import cupy
    import zarr

    from gpu_zarr import settings
    from gpu_zarr.write.api import write_zarr

    dev = cupy.asarray(data)
    for lanes in (3, 1):
        for order in (("plain", "sharded"), ("sharded", "plain")):
            for name in order:
                p = root / f"{name}-{lanes}.zarr"
                t0 = time.perf_counter()
                with settings.set(lanes=lanes):
                    res = write_zarr(dev, p, chunks=chunks, shards=False if name == "plain" else shards,
                                     level=3, encoder="gpu", overwrite=True)
                sec = time.perf_counter() - t0
                back = zarr.open_array(str(p), mode="r")[...]
                print(f"  lanes {lanes} {name:8s} ratio {res.ratio:.4f} chunk bytes {_chunk_bytes(p):13d} "
                      f"{sec:6.2f} s, zarr reads the data back: {bool(np.array_equal(back, data))}")
                shutil.rmtree(p)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=512)
    ap.add_argument("--batch-mib", type=int, default=192, help="the encode batch of step 1 (the bench ran 192)")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    from nvidia import nvcomp

    from gpu_zarr.bench.write import _volume

    chunks, shards = (1, 512, 1024), (64, 512, 1024)
    data = _volume(args.size_mib, chunks, 0)
    print(f"nvCOMP {nvcomp.__version__}; volume {data.shape} uint16, chunks {chunks}, shards {shards}")
    print("1. encode: the same chunks in each layout's first batch")
    probe_encode(data, chunks, shards, args.batch_mib << 20)
    root = Path(args.workdir or tempfile.mkdtemp(prefix="gz-nvcomp-sizes-"))
    root.mkdir(parents=True, exist_ok=True)
    print("2. writes: the bench's two layouts, both orders, 3 lanes and 1")
    try:
        probe_writes(data, chunks, shards, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

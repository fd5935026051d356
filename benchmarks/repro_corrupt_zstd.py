"""Which GPU step faults on a zstd chunk whose compressed body has one flipped bit (fuzz case
v2-zstd-flip-body)? Run with CUDA_LAUNCH_BLOCKING=1, one process per attempt."""
import sys, traceback, tempfile, pathlib
import numpy as np, zarr, numcodecs
mode = sys.argv[1]
d = pathlib.Path(tempfile.mkdtemp())
a = zarr.create_array(d / "a.zarr", shape=(64, 64), chunks=(32, 32), dtype="<u2", zarr_format=2,
                      compressors=numcodecs.Zstd(level=3), fill_value=0)
rng = np.random.default_rng(0)
a[...] = (np.arange(64 * 64).reshape(64, 64) % 97 + rng.integers(0, 3, (64, 64))).astype("<u2")
f = d / "a.zarr" / "1.1"
b = bytearray(f.read_bytes()); b[len(b) // 2] ^= 0x10; f.write_bytes(bytes(b))
try:
    if mode == "decode_chunks":
        from gpu_zarr.engine import decode_chunks
        from gpu_zarr.engine.layout import chunk_layout
        lay = chunk_layout((32, 32), np.dtype("<u2"), "zstd", {})
        buf, off = decode_chunks(lay, [np.frombuffer(f.read_bytes(), np.uint8)], names=["1.1"], device="gpu")
        import cupy; cupy.cuda.runtime.deviceSynchronize()
    else:
        from gpu_zarr import engine
        from gpu_zarr.engine import EngineOptions
        r = engine.read(str(d / "a.zarr"), device="gpu", options=EngineOptions(reader="threads"))
        import cupy; cupy.cuda.runtime.deviceSynchronize()
    print(mode, "NO ERROR")
except Exception as e:
    print(mode, "->", type(e).__name__, str(e)[:300])
    traceback.print_exc(limit=8)

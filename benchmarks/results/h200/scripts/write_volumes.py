"""The three volumes of `bench --remote --size full`, written into WORKDIR. Usage: python write_volumes.py WORKDIR"""
import sys
from pathlib import Path

from gpu_zarr.bench.remote import _volumes, _write

w = Path(sys.argv[1])
for i, (name, spec) in enumerate(_volumes("full").items()):
    _write(w / (f"remote-full-{i}" + ("-v2" if spec["fmt"] == 2 else "")), spec)

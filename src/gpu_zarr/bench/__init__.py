"""The benchmark: ours against the peers, on your own store or on synthetic volumes.

From the command line: ``gpu-zarr bench [PATH] [options]`` (or
``python -m gpu_zarr.bench``); from Python::

    from gpu_zarr.bench import run
    res = run("image.ome.zarr", level=0)   # a BenchResult: tables + chart in a notebook
    res.data["layouts"][0]["readers"]["ours-auto"]["gib_per_s"]

Importing this package imports no GPU library, TensorStore, czarr or matplotlib: the
readers import what they need when they run.
"""

from __future__ import annotations

from gpu_zarr.bench.api import BenchResult, run

__all__ = ["BenchResult", "main", "run"]


def main(argv: list[str] | None = None) -> int:
    """``gpu-zarr bench`` (see :mod:`gpu_zarr.bench.cli`)."""
    from gpu_zarr.bench.cli import main as _main

    return _main(argv)

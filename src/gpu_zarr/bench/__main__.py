"""``python -m gpu_zarr.bench``: the same as ``gpu-zarr bench``."""

import sys

from gpu_zarr.bench.cli import main

sys.exit(main())

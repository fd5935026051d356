"""numpy-backed stand-in for cupy (tests only): runs the bench's GPU-mode bookkeeping on a CPU box."""
from types import SimpleNamespace

import numpy as _np

__version__ = "0.0-fake"

class ndarray(_np.ndarray):
    def get(self):
        return _np.asarray(self).view(_np.ndarray).copy()
ndarray.__module__ = "cupy._core.core"

def asarray(a, dtype=None):
    return _np.ascontiguousarray(_np.asarray(a, dtype=dtype)).view(ndarray)
def array_equal(a, b):
    return _np.array_equal(_np.asarray(a), _np.asarray(b))
def arange(*a, **k):
    return _np.arange(*a, **k).view(ndarray)
uint64 = _np.uint64
class _Pool:
    def free_all_blocks(self): pass
    def used_bytes(self): return 0
    def total_bytes(self): return 0
_pool = _Pool()
def get_default_memory_pool(): return _pool
def get_default_pinned_memory_pool(): return _pool
class _Dev:
    id = 0
    mem_info = (80 << 30, 80 << 30)
    def synchronize(self): pass
runtime = SimpleNamespace(
    deviceSynchronize=lambda: None, getDeviceCount=lambda: 1, memGetInfo=lambda: (80 << 30, 80 << 30),
    getDeviceProperties=lambda i: {"name": b"FakeGPU"}, runtimeGetVersion=lambda: 13000, setDevice=lambda i: None)
cuda = SimpleNamespace(runtime=runtime, Device=lambda *a: _Dev())

"""The GPU encoder's staged hand-off (:class:`gpu_zarr.write.encode.StagedFrames`) over numcodecs
frames on the host: the writer's group loop, run in CI as on the GPU (where the copy is a
device-to-host copy on the lane's stream and the staging is the runtime's pinned pool)."""

from __future__ import annotations

import contextlib

import numpy as np

from gpu_zarr.write.encode import CpuEncoder, StagedFrames


class Staging:
    """Host staging as the runtime's pinned pool lends it (ordinary memory here), counting
    leases, buffers out and copies."""

    def __init__(self):
        self.leases, self.out, self.copies = [], 0, 0

    def copy(self, src, dst):
        self.copies += 1
        np.copyto(dst, src)

    def lease(self, nbytes):
        @contextlib.contextmanager
        def lent():
            self.leases.append(nbytes)
            self.out += 1
            try:
                yield [np.empty(nbytes + 7, np.uint8)]
            finally:
                self.out -= 1
        return lent()


def staged(parts, group_bytes: int, staging: Staging, chunk_nbytes: int) -> StagedFrames:
    """``parts`` (encoded chunks of ``chunk_nbytes`` decoded bytes) packed into one buffer and
    handed on through ``staging``."""
    packed = np.frombuffer(b"".join(bytes(p) for p in parts), np.uint8).copy()
    sizes = np.array([len(p) for p in parts], np.int64)
    return StagedFrames(packed, sizes, chunk_nbytes, staging.copy, staging.lease, group_bytes)


def staged_encoder(staging: Staging, group_bytes: int) -> type:
    """The CPU encoder, its frames handed on as the GPU encoder's are."""

    class Staged(CpuEncoder):
        def encode(self, chunks):
            return staged(super().encode(chunks).parts, group_bytes, staging, int(chunks[0].nbytes))

    return Staged

"""A codec is one module: the engine's codec registry (:mod:`gpu_zarr.engine.codecs`).

The layout's recognisers, its description, its "expected ..." messages, the native host
path's codec set and the capability report all iterate the registry. The toy stage below
(bz2 through numcodecs, CPU only) is everything a new codec needs: registered, arrays
compressed with it are recognised, described, named in messages and read; unregistered,
they are refused again.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from gpu_zarr.engine import codecs, read
from gpu_zarr.engine.metadata import codec_of_chain, codec_of_v2_compressor, describe, layout_of
from gpu_zarr.engine.native.chunkwise import native_codec
from gpu_zarr.errors import UnsupportedArrayError


class ToyBz2Stage:
    """bz2 chunks, decoded one by one with numcodecs (the CPU twin only: a toy)."""

    name = "bz2"
    v2_names = ("bz2",)
    v3_chains = ("[bytes, numcodecs.bz2]",)
    native = None  # the native library has no bz2: the batched path decodes
    nvcomp = False
    decodes = True
    native_checks = False
    device_checks = False

    def recognise_v2(self, compressor: Any, dtype: np.dtype) -> dict[str, Any] | None:
        return {"level": compressor.level} if getattr(compressor, "codec_id", None) == "bz2" else None

    def recognise_v3(self, chain: Sequence[Any]) -> dict[str, Any] | None:
        if len(chain) == 1 and getattr(chain[0], "codec_name", None) == "numcodecs.bz2":
            return {"level": chain[0].codec_config.get("level")}
        return None

    def label(self, params: Mapping[str, Any]) -> str:
        return f"bz2 level {params.get('level')}"

    def prepare(self, staging: np.ndarray, batch: Any, lay: Any, names: Sequence[str]) -> Any:
        return None

    def decode(self, ops: Any, src: Any, batch: Any, prep: Any, dst: Any, dst_offsets: np.ndarray, lay: Any,
               names: Sequence[str], slot: int, wait: Any) -> None:
        from numcodecs import BZ2

        size = int(lay.inner_nbytes)
        for k, (o, n) in enumerate(zip(batch.src_offsets.tolist(), batch.src_sizes.tolist())):
            out = np.frombuffer(BZ2().decode(bytes(src[o:o + n])), np.uint8)
            assert out.nbytes == size, names[k]
            dst[int(dst_offsets[k]):int(dst_offsets[k]) + size] = out

    def scratch_bytes(self, chunks_per_batch: int, lay: Any) -> int:
        return 0


@pytest.fixture
def toy() -> Iterator[ToyBz2Stage]:
    stage = codecs.register(ToyBz2Stage())
    try:
        yield stage
    finally:
        codecs.unregister(stage.name)


def _v2(path: Any, compressor: Any) -> Any:
    import zarr

    arr = zarr.create_array(str(path), shape=(20, 13), chunks=(6, 5), dtype="<i4", zarr_format=2,
                            compressors=compressor, fill_value=0)
    arr[...] = np.arange(260, dtype="<i4").reshape(20, 13)
    return zarr.open_array(str(path), mode="r")


def _v3(path: Any, shards: Any = None) -> Any:
    import zarr
    from zarr.codecs.numcodecs import BZ2

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numcodecs' zarr3 codecs: "not part of the Zarr v3 spec"
        arr = zarr.create_array(str(path), shape=(20, 13), chunks=(6, 5) if shards is None else (3, 5),
                                shards=shards, dtype="<u2", compressors=[BZ2(level=3)], fill_value=7)
        arr[2:19, :11] = np.arange(187, dtype="<u2").reshape(17, 11)
        return zarr.open_array(str(path), mode="r")


def test_builtin_stages_are_registered():
    assert [s.name for s in codecs.stages()] == ["raw", "zstd", "blosc", "gzip", "zlib", "lz4"]
    assert {s.name: native_codec(s.name) for s in codecs.stages()} == {
        "raw": "raw", "zstd": "zstd", "blosc": "blosc", "gzip": "gzip", "zlib": "zlib", "lz4": "lz4-sized"}
    with pytest.raises(ValueError, match="already registered"):
        codecs.register(codecs.ZstdStage())
    with pytest.raises(ValueError, match="built-in"):
        codecs.unregister("zstd")


def test_a_codec_is_one_module(tmp_path, toy):
    from numcodecs import BZ2, LZMA

    v2 = _v2(tmp_path / "v2.zarr", BZ2(level=2))
    lay = layout_of(v2)
    assert (lay.codec, dict(lay.codec_params)) == ("bz2", {"level": 2})
    assert describe(lay) == "bz2 level 2 zarr v2"
    assert native_codec("bz2") is None
    np.testing.assert_array_equal(read(v2, Ellipsis, device="cpu").data, v2[...])
    np.testing.assert_array_equal(read(v2, (slice(3, 17), slice(4, 12)), device="cpu").data, v2[3:17, 4:12])

    for shards in (None, (6, 10)):
        v3 = _v3(tmp_path / f"v3{shards is not None}.zarr", shards)
        lay3 = layout_of(v3)
        assert (lay3.codec, lay3.sharded) == ("bz2", shards is not None)
        assert describe(lay3) == "bz2 level 3 zarr v3" + (", sharded" if shards else "")
        np.testing.assert_array_equal(read(v3, Ellipsis, device="cpu").data, v3[...])

    # what the engine still refuses is refused with the new codec in the list of what it reads
    with pytest.raises(UnsupportedArrayError, match=r"raw, zstd, blosc, gzip, zlib, lz4 or bz2 chunks"):
        codec_of_v2_compressor(LZMA(), np.dtype("i4"))
    from zarr.codecs import BytesCodec
    from zarr.codecs.numcodecs import LZMA as LZMA3

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lzma3 = LZMA3()
    with pytest.raises(UnsupportedArrayError, match=r"\[bytes, numcodecs\.lz4\] or \[bytes, numcodecs\.bz2\]"):
        codec_of_chain([BytesCodec(), lzma3], "array")

    # the capability report counts it among the codecs the GPU path decodes without nvCOMP
    from gpu_zarr.capabilities import Capabilities

    assert "raw, bz2 arrays only" in Capabilities(cupy=True, gpu=True).backend_status("kvikio")[1]


def test_unregistered_codec_is_decoded_by_its_own_codec(tmp_path):
    from numcodecs import BZ2

    v2 = _v2(tmp_path / "v2.zarr", BZ2(level=2))
    with pytest.raises(UnsupportedArrayError, match=r"reads raw, zstd, blosc, gzip, zlib or lz4 chunks; .*bz2") as info:
        codec_of_v2_compressor(v2.metadata.compressor, np.dtype("u2"))
    assert "zarr-gpu" in str(info.value)
    # no core stage: the layout still serves it, by the codecs' own decode
    assert layout_of(v2).codec == "host" and "bz2" in layout_of(v2).host.label
    assert layout_of(_v3(tmp_path / "v3.zarr")).codec == "host"


def test_builtin_chains_recognised_as_before():
    """Every chain and compressor the engine read before the registry, with the same parameters."""
    import numcodecs
    from zarr.codecs import BloscCodec, BytesCodec, GzipCodec, ZstdCodec
    from zarr.codecs.numcodecs import GZip as GZip3
    from zarr.codecs.numcodecs import Zlib as Zlib3

    from gpu_zarr.nvcomp_zstd import NvcompZstdCodec

    i2 = np.dtype("<i2")
    assert codec_of_v2_compressor(None, i2) == ("raw", {})
    assert codec_of_v2_compressor(numcodecs.Zstd(), i2) == ("zstd", {})
    assert codec_of_v2_compressor(numcodecs.GZip(), i2) == ("gzip", {})
    assert codec_of_v2_compressor(numcodecs.Zlib(), i2) == ("zlib", {})
    name, params = codec_of_v2_compressor(numcodecs.Blosc(cname="lz4", shuffle=2), i2)
    assert name == "blosc" and params["cname"] == "lz4" and params["shuffle"] == "bitshuffle"
    assert params["typesize"] == 2
    b = BytesCodec(endian="big")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wrapped = [GZip3(), Zlib3()]
    assert codec_of_chain([b], "array") == ("raw", "big", {})
    assert codec_of_chain([b, ZstdCodec()], "array") == ("zstd", "big", {})
    assert codec_of_chain([b, NvcompZstdCodec()], "inner") == ("zstd", "big", {})
    assert codec_of_chain([b, GzipCodec()], "array") == ("gzip", "big", {})
    assert [codec_of_chain([b, w], "array")[0] for w in wrapped] == ["gzip", "zlib"]
    name, _, params = codec_of_chain([b, BloscCodec(cname="zstd", typesize=4)], "array")
    assert name == "blosc" and params["cname"] == "zstd" and params["typesize"] == 4
    for bad in ([b, ZstdCodec(), GzipCodec()], [ZstdCodec()], []):
        with pytest.raises(UnsupportedArrayError, match="zarr-gpu"):
            codec_of_chain(bad, "array")

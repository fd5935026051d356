"""NvcompZstdCodec on CPU: metadata round trip, registration, config (GPU round trips: test_gpu.py)."""

from __future__ import annotations

import pytest
import zarr
from zarr.codecs import ZstdCodec

from gpu_zarr.nvcomp_zstd import QUALNAME, NvcompZstdCodec, gpu_zstd_config, register_nvcomp_zstd


@pytest.mark.parametrize("level,checksum", [(0, False), (3, True), (22, False), (-5, True)])
def test_dict_round_trip_matches_cpu_codec(level, checksum):
    c = NvcompZstdCodec(level=level, checksum=checksum)
    d = c.to_dict()
    assert d == ZstdCodec(level=level, checksum=checksum).to_dict()
    assert d["name"] == "zstd"
    assert NvcompZstdCodec.from_dict(d) == c
    assert ZstdCodec.from_dict(d).to_dict() == d


def test_codec_contract():
    c = NvcompZstdCodec()
    assert c.is_fixed_size is False
    with pytest.raises(NotImplementedError):
        c.compute_encoded_size(100, None)
    with pytest.raises(ValueError):
        NvcompZstdCodec(level=23)
    with pytest.raises(TypeError):
        NvcompZstdCodec(checksum="yes")
    with pytest.raises(ValueError):
        NvcompZstdCodec.from_dict({"name": "blosc", "configuration": {}})


def test_config_names_registered_class():
    cfg = gpu_zstd_config()
    assert cfg["codecs.zstd"] == QUALNAME
    assert cfg["codec_pipeline.batch_size"] > 1


def test_register_is_idempotent_and_honest():
    first = register_nvcomp_zstd()
    assert register_nvcomp_zstd() == first
    try:
        import cupy  # noqa: F401
        from nvidia import nvcomp  # noqa: F401

        have = True
    except Exception:
        have = False
    assert first == have
    if first:
        from zarr.registry import get_codec_class

        with zarr.config.set(gpu_zstd_config()):
            assert get_codec_class("zstd") is NvcompZstdCodec

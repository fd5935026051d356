"""The reader in a real napari: OME-Zarr 0.4/0.5, labels, plain arrays and groups."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from gpu_zarr.errors import NotAZarrError
from gpu_zarr.lazy import GpuLazyArray
from gpu_zarr.napari_plugin._reader import napari_get_reader

PLUGIN = "napari-gpu-zarr"
Z_PLANES = (0, 5, 11)


# -- sniffing (no GUI) -------------------------------------------------------------
def test_reader_declines_foreign_paths_without_raising(tmp_path, small_stores):
    png = tmp_path / "x.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n")
    plain_dir = tmp_path / "folder"
    plain_dir.mkdir()
    (plain_dir / "a.txt").write_text("hi")
    fake = tmp_path / "fake.zarr"
    fake.mkdir()
    for path in [png, plain_dir, plain_dir / "a.txt", fake, tmp_path / "missing.zarr",
                 [str(small_stores["0.5"]), str(small_stores["0.4"])], "", "http://[::1"]:
        assert napari_get_reader(path if isinstance(path, list) else str(path)) is None, path


def test_reader_accepts_zarr_nodes_and_paths_inside(small_stores):
    root = small_stores["0.5"]
    for p in [root, root / "zarr.json", root / "0", root / "0" / "c", root / "labels" / "blobs"]:
        assert callable(napari_get_reader(str(p))), p
    assert callable(napari_get_reader([str(small_stores["0.4"] / ".zattrs")]))


# -- OME-Zarr images -----------------------------------------------------------------
@pytest.mark.parametrize("version", ["0.4", "0.5"])
def test_open_ome_zarr(make_napari_viewer, small_stores, version):
    path = small_stores[version]
    viewer = make_napari_viewer()
    layers = viewer.open(str(path), plugin=PLUGIN)
    assert [ly.name for ly in layers] == ["nuclei", "membranes", "blobs"]
    nuclei, membranes, blobs = layers
    root = zarr.open_group(str(path), mode="r")
    window = [c["window"] for c in (root.attrs.get("ome") or root.attrs)["omero"]["channels"]]

    for c, layer in enumerate((nuclei, membranes)):
        assert layer._type_string == "image" and layer.multiscale and len(layer.data) == 3
        assert all(isinstance(d, GpuLazyArray) for d in layer.data)
        assert [d.shape for d in layer.data] == [(12, 96, 80), (12, 48, 40), (12, 24, 20)]
        np.testing.assert_allclose(layer.scale, (2.0, 0.5, 0.5))
        np.testing.assert_allclose(layer.translate, (0.0, 0.0, 0.0))
        assert tuple(layer.axis_labels) == ("z", "y", "x")
        assert [str(u) for u in layer.units] == ["micrometer"] * 3
        assert tuple(layer.contrast_limits) == (window[c]["start"], window[c]["end"])
        assert layer.visible
        assert layer.metadata["gpu_zarr"]["version"] == version
        # the pixels napari gets equal zarr's own CPU read, level by level
        for lvl, data in enumerate(layer.data):
            cpu = zarr.open_array(str(path / str(lvl)), mode="r")
            for z in Z_PLANES:
                np.testing.assert_array_equal(data[z], cpu[c, z])
    assert nuclei.colormap.name == "magenta" and membranes.colormap.name == "green"
    assert nuclei.blending == "translucent_no_depth" and membranes.blending == "additive"

    assert blobs._type_string == "labels" and not blobs.visible and blobs.multiscale
    np.testing.assert_allclose(blobs.scale, (2.0, 0.5, 0.5))
    lab_cpu = zarr.open_array(str(path / "labels" / "blobs" / "0"), mode="r")
    for z in Z_PLANES:
        np.testing.assert_array_equal(blobs.data[0][z], lab_cpu[z])
    label_colors = (root["labels/blobs"].attrs.get("ome") or root["labels/blobs"].attrs)["image-label"]["colors"]
    first = label_colors[0]
    np.testing.assert_allclose(blobs.colormap.map(first["label-value"]),
                               np.array(first["rgba"]) / 255, atol=1e-6)


@pytest.mark.parametrize("version", ["0.4", "0.5"])
def test_displayed_planes_match_zarr(make_napari_viewer, small_stores, version):
    """What napari actually slices for display, at several z, equals zarr's CPU read."""
    path = small_stores[version]
    viewer = make_napari_viewer()
    nuclei = viewer.open(str(path), plugin=PLUGIN)[0]
    for z in Z_PLANES:
        viewer.dims.set_current_step(0, z)
        level = nuclei.data_level
        cpu = zarr.open_array(str(path / str(level)), mode="r")[0, z]
        shown = np.asarray(nuclei._slice.image.raw)
        assert shown.ndim == 2 and shown.size > 0
        corner = nuclei.corner_pixels[:, 1:]  # the displayed region of (y, x) at this level
        want = cpu[corner[0, 0] : corner[1, 0] + 1, corner[0, 1] : corner[1, 1] + 1]
        np.testing.assert_array_equal(shown, want)


def test_transforms_compose_with_multiscale_level(make_napari_viewer, tmp_path):
    """Multiscale-wide coordinateTransformations compose with the per-dataset ones."""
    path = tmp_path / "t.zarr"
    g = zarr.open_group(str(path), mode="w", zarr_format=3)
    a = g.create_array("s0", shape=(4, 6, 5), dtype="uint8", chunks=(2, 3, 5))
    a[...] = np.arange(120, dtype=np.uint8).reshape(4, 6, 5)
    g.attrs["ome"] = {"version": "0.5", "multiscales": [{
        "axes": [{"name": "t", "type": "time", "unit": "second"},
                 {"name": "y", "type": "space", "unit": "nanometer"},
                 {"name": "x", "type": "space", "unit": "parsec-ish"}],
        "datasets": [{"path": "s0", "coordinateTransformations": [
            {"type": "scale", "scale": [1, 2, 3]}, {"type": "translation", "translation": [0, 1, 1]}]}],
        "coordinateTransformations": [{"type": "scale", "scale": [5, 1, 2]}],
    }]}
    viewer = make_napari_viewer()
    (layer,) = viewer.open(str(path), plugin=PLUGIN)
    assert layer.name == "t" and not layer.multiscale
    np.testing.assert_allclose(layer.scale, (5, 2, 6))
    np.testing.assert_allclose(layer.translate, (0, 1, 2))
    assert tuple(layer.axis_labels) == ("t", "y", "x")
    # unknown units fall back to napari's default instead of failing to open
    assert [str(u) for u in layer.units] == ["second", "nanometer", "pixel"]
    np.testing.assert_array_equal(layer.data[2], a[2])


def test_open_label_image_and_level_directly(make_napari_viewer, small_stores):
    path = small_stores["0.5"]
    viewer = make_napari_viewer()
    (lab,) = viewer.open(str(path / "labels" / "blobs"), plugin=PLUGIN)
    assert lab._type_string == "labels" and lab.visible
    (lvl,) = viewer.open(str(path / "1"), plugin=PLUGIN)  # one level, as a plain 4-D array
    assert lvl.data.shape == (2, 12, 48, 40) and tuple(lvl.axis_labels) == ("c", "z", "y", "x")
    np.testing.assert_array_equal(lvl.data[1, 3], zarr.open_array(str(path / "1"), mode="r")[1, 3])


# -- plain zarr ---------------------------------------------------------------------
@pytest.mark.parametrize("fmt", [2, 3])
def test_open_plain_array_and_group(make_napari_viewer, tmp_path, fmt):
    rng = np.random.default_rng(fmt)
    data = rng.normal(size=(7, 30, 20)).astype("float32")
    arr_path = tmp_path / f"plain{fmt}.zarr"
    a = zarr.create_array(str(arr_path), shape=data.shape, chunks=(2, 16, 16), dtype="float32",
                          zarr_format=fmt)
    a[...] = data
    grp_path = tmp_path / f"group{fmt}.zarr"
    g = zarr.open_group(str(grp_path), mode="w", zarr_format=fmt)
    g.create_array("b", shape=(5, 6), dtype="uint8", chunks=(2, 2))[...] = np.arange(30).reshape(5, 6)
    g.create_array("a", shape=(3, 4, 5), dtype="int16", chunks=(1, 4, 5))[...] = -np.arange(60).reshape(3, 4, 5)
    g.create_array("vector", shape=(9,), dtype="uint8", chunks=(3,))

    viewer = make_napari_viewer()
    (layer,) = viewer.open(str(arr_path), plugin=PLUGIN)
    assert layer.name == f"plain{fmt}" and isinstance(layer.data, GpuLazyArray)
    for z in (0, 3, 6):
        np.testing.assert_array_equal(layer.data[z], zarr.open_array(str(arr_path), mode="r")[z])
    layers = viewer.open(str(grp_path), plugin=PLUGIN)
    assert [ly.name for ly in layers] == [f"group{fmt}/a", f"group{fmt}/b"]  # 1-D skipped
    np.testing.assert_array_equal(np.asarray(layers[0].data), -np.arange(60).reshape(3, 4, 5))


def test_unreadable_store_gives_a_clear_error(make_napari_viewer, tmp_path):
    bad = tmp_path / "bad.zarr"
    bad.mkdir()
    (bad / "zarr.json").write_text("{not json")
    viewer = make_napari_viewer()
    with pytest.raises(Exception, match="bad.zarr") as info:
        viewer.open(str(bad), plugin=PLUGIN)
    err = info.value
    while err is not None and not isinstance(err, NotAZarrError):  # napari may wrap it
        err = err.__cause__
    assert err is not None, info.value
    assert "expected a zarr group or array" in str(err) and "JSONDecodeError" in str(err)


def test_cpu_path_is_announced_once(make_napari_viewer, small_stores, reset_cpu_notice):
    from napari.utils.notifications import notification_manager

    from gpu_zarr.capabilities import probe

    if probe().gpu:
        pytest.skip("this machine has a GPU: the CPU notice is not shown")
    seen: list[str] = []
    notification_manager.notification_ready.connect(lambda n: seen.append(n.message))
    viewer = make_napari_viewer()
    viewer.open(str(small_stores["0.5"]), plugin=PLUGIN)
    viewer.open(str(small_stores["0.4"]), plugin=PLUGIN)
    notices = [m for m in seen if "reading on the CPU" in m]
    assert len(notices) == 1, seen
    from gpu_zarr.errors import INSTALL_HINT

    assert notices[0].count(INSTALL_HINT) == 1 and notices[0].count("pip install") == 1  # the hint, once

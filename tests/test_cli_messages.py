"""Every message of issue #37's list, as a newcomer meets it: ``gpu-zarr`` on plain folders, files,
label groups, single arrays, OME roots, ``--repeat 0``, the stage line and ``bench --help``.

In process (``cli.main``) on stores zarr-python writes; no GPU needed.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import zarr

from gpu_zarr import cli
from gpu_zarr.sample import write_sample_omezarr


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    base = tmp_path_factory.mktemp("cli-messages")
    return write_sample_omezarr(base / "img.ome.zarr", version="0.5", shape=(2, 8, 64, 48), levels=2,
                                chunks=(1, 4, 32, 32), seed=3)


def _main(capsys, *argv):
    code = cli.main([*argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_info_of_a_plain_folder_says_what_it_holds_not_zarrs_exception(tmp_path, capsys):
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("x")
    code, _, err = _main(capsys, "info", str(tmp_path / "plain"))
    assert code == 2
    assert "found a folder without any of them" in err and "notes.txt" in err
    assert "GroupNotFoundError" not in err and "StorePath" not in err and "LocalStore" not in err


def test_a_text_file_is_not_told_to_pass_its_folder(tmp_path, capsys):
    (tmp_path / "readme.txt").write_text("hello")
    code, _, err = _main(capsys, "info", str(tmp_path / "readme.txt"))
    assert code == 2 and "found a file that is not zarr" in err
    assert "folder that holds it" not in err


def test_a_metadata_file_is_told_its_folder(image, capsys):
    code, _, err = _main(capsys, "read", str(image / "zarr.json"))
    assert code == 2 and f"pass the folder that holds it, {image}" in err


def test_read_of_a_labels_group_names_the_label_images_in_cli_words(image, capsys):
    code, _, err = _main(capsys, "read", str(image / "labels"))
    assert code == 2
    assert "holds blobs" in err and f"gpu-zarr read {image / 'labels' / 'blobs'}" in err
    assert "read_omezarr(" not in err and "--level 0)" not in err
    code, out, err = _main(capsys, "read", str(image / "labels" / "blobs"), "--repeat", "1")
    assert code == 0, err


def test_read_of_a_single_array_prints_no_blank_lines(tmp_path, capsys):
    z = zarr.create_array(str(tmp_path / "a.zarr"), shape=(40, 30), chunks=(16, 16), dtype="uint16")
    z[:] = np.arange(1200, dtype="uint16").reshape(40, 30)
    code, out, err = _main(capsys, "read", str(tmp_path / "a.zarr"), "--repeat", "2")
    assert code == 0, err
    assert "shape (40, 30), uint16" in out
    lines = out.splitlines()
    assert lines and all(ln.strip() for ln in lines), out


@pytest.mark.parametrize("bad", ["0", "-1", "two"])
def test_repeat_must_be_at_least_one(image, capsys, bad):
    with pytest.raises(SystemExit) as exc:
        cli.main(["read", str(image), "--repeat", bad])
    assert exc.value.code == 2
    assert "expected a whole number of reads, at least 1" in capsys.readouterr().err


def test_stages_add_up_to_the_reported_read(image, capsys):
    code, out, err = _main(capsys, "read", str(image), "--repeat", "1")
    assert code == 0, err
    read_ms = float(re.search(r"read\s+[\d.]+ MiB in ([\d.]+) ms", out).group(1))
    stages = re.search(r"stages\s+(.*)", out).group(1)
    parts, _, total = stages.rpartition(" = ")
    assert float(total.removesuffix(" ms")) == read_ms
    figures = [float(x) for x in re.findall(r"([\d.]+) ms", parts)]
    if "stages overlap" not in parts:
        assert abs(sum(figures) - read_ms) <= 0.1 * len(figures), (figures, read_ms)


def test_an_ome_root_reads_the_same_in_python_and_the_cli(image, capsys):
    from gpu_zarr.zarr_io import read_zarr

    res = read_zarr(str(image), prefer="cpu", progress=False)
    level0 = zarr.open_array(str(image / "0"), mode="r")
    assert res.data.shape == level0.shape
    np.testing.assert_array_equal(res.data, level0[...])
    code, out, err = _main(capsys, "read", str(image), "--backend", "cpu", "--repeat", "1")
    assert code == 0, err
    assert f"shape {tuple(level0.shape)}" in out


def test_bench_help_names_each_default_once_and_helps_every_option(capsys):
    from gpu_zarr.bench.cli import build_parser

    text = build_parser().format_help()
    assert "(default: )" not in text and "(default: None)" not in text
    assert not re.search(r"\(default:[^)]*\)\s*\(default:", text.replace("\n", " ")), text
    for action in build_parser()._actions:
        if action.option_strings and action.dest != "help":
            assert action.help, f"{action.option_strings} has no help"

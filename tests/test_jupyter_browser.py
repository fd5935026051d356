"""End to end in a real browser: JupyterLab, headless Chromium, the loader-widget notebook.

The test starts JupyterLab on a free localhost port (with a token, no browser of its own),
drives Debian's ``chromium`` through Playwright (``executable_path``: nothing downloads a
browser), runs ``examples/loader_widget.ipynb``, waits for the widget, clicks **Load**, and
checks that a new history row and the chart's bar appear. With ``GPU_ZARR_SCREENSHOT=<path>``
it saves a screenshot there (``docs/jupyter-widget.png`` in the README).

Without chromium, Playwright or JupyterLab the test skips with the reason, except when
``GPU_ZARR_REQUIRE_BROWSER=1`` (CI), where it fails.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "examples" / "loader_widget.ipynb"
SERVER_START_S = 90
STEP_MS = int(os.environ.get("GPU_ZARR_BROWSER_STEP_MS", "120000"))  # any single wait in the page


def _chromium() -> str | None:
    env = os.environ.get("GPU_ZARR_CHROMIUM")
    if env:
        return env if Path(env).exists() else None
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _missing() -> str | None:
    chromium = _chromium()
    if chromium is None:
        return "no chromium executable (apt-get install chromium)"
    for mod, pkg in (("playwright.sync_api", "playwright"), ("jupyterlab", "jupyterlab"),
                     ("ipywidgets", "ipywidgets")):
        try:
            __import__(mod)
        except ImportError:
            return f"{pkg} is not installed (pip install -e '.[test]')"
    return None


@pytest.fixture
def browser_ready():
    problem = _missing()
    if problem is not None:
        if os.environ.get("GPU_ZARR_REQUIRE_BROWSER") == "1":
            pytest.fail(f"browser test required (GPU_ZARR_REQUIRE_BROWSER=1) but: {problem}", pytrace=False)
        pytest.skip(f"browser test: {problem}")
    return _chromium()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_server(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"JupyterLab exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"JupyterLab did not answer within {SERVER_START_S} s:\n{log.read_text()[-3000:]}")


@contextlib.contextmanager
def _jupyterlab(workdir: Path, tmp: Path):
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ)
    env.update(
        GPU_ZARR_CACHE=str(tmp / "cache"),
        JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
        JUPYTER_CONFIG_DIR=str(tmp / "config"),
        JUPYTERLAB_SETTINGS_DIR=str(tmp / "lab-settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(tmp / "lab-workspaces"),
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
    )
    # no "official Jupyter news?" toast over the widget
    note = tmp / "lab-settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    note.parent.mkdir(parents=True, exist_ok=True)
    note.write_text('{"fetchNews": "false"}')
    log = tmp / "jupyterlab.log"
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--port-retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={workdir}",
           "--allow-root", "--LabApp.news_url=", "--LabApp.extension_manager=readonly",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        _wait_for_server(f"http://127.0.0.1:{port}/api/status?token={token}", proc, log)
        yield f"http://127.0.0.1:{port}", token, log
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)  # the server and its kernels
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_loader_widget_in_jupyterlab(browser_ready, tmp_path):
    from playwright.sync_api import sync_playwright

    workdir = tmp_path / "work"
    workdir.mkdir()
    shutil.copy(NOTEBOOK, workdir / NOTEBOOK.name)
    with _jupyterlab(workdir, tmp_path) as (base, token, log), sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=browser_ready, headless=True,
                                     args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
                                     timeout=60_000)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.set_default_timeout(STEP_MS)
            page.goto(f"{base}/lab/tree/{NOTEBOOK.name}?token={token}", wait_until="domcontentloaded")
            # the notebook is open and its kernel idle
            page.wait_for_selector(".jp-Notebook .jp-Cell", state="visible")
            # JupyterLab may still ask which kernel to use: take the proposed one (python3)
            accept = page.locator(".jp-Dialog button.jp-mod-accept")
            with contextlib.suppress(Exception):
                accept.wait_for(state="visible", timeout=5_000)
                accept.click()
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle'], "
                                   "#jp-main-statusbar :text('Idle')", state="attached")
            # Run ▸ Run All Cells
            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
            widget = page.locator(".gpu-zarr-loader")
            widget.wait_for(state="visible")
            rows = page.locator(".gpu-zarr-loader tr.gpu-zarr-run")
            rows.first.wait_for(state="visible")  # the notebook's own w.load() cell
            page.wait_for_function("document.querySelectorAll('.gpu-zarr-loader tr.gpu-zarr-run').length >= 1")
            assert page.locator(".gpu-zarr-loader .gpu-zarr-header").inner_text().startswith("GPU Zarr loader")
            n = rows.count()
            load = page.locator(".gpu-zarr-loader button.gpu-zarr-load")
            load.wait_for(state="visible")
            page.wait_for_function(
                "!document.querySelector('.gpu-zarr-loader button.gpu-zarr-load').disabled")
            load.click()
            page.wait_for_function(
                f"document.querySelectorAll('.gpu-zarr-loader tr.gpu-zarr-run').length >= {n + 1}")
            last = rows.nth(n)
            cells = last.locator("td").all_inner_texts()
            assert cells[0] == "sample-blobs-v1" and cells[1] == "0" and cells[-1].startswith("ok"), cells
            assert float(cells[6]) > 0  # GiB/s
            bar = page.locator(".gpu-zarr-loader svg.gpu-zarr-chart rect.gpu-zarr-bar")
            bar.first.wait_for(state="visible")
            served = bar.first.get_attribute("data-backend")
            assert served == cells[3], (served, cells)
            result = page.locator(".gpu-zarr-loader .gpu-zarr-result").inner_text()
            assert "GiB/s" in result
            target = os.environ.get("GPU_ZARR_SCREENSHOT")
            if target:
                widget.scroll_into_view_if_needed()
                page.wait_for_timeout(500)
                Path(target).parent.mkdir(parents=True, exist_ok=True)
                widget.screenshot(path=target)
                assert Path(target).stat().st_size > 10_000
        except Exception:
            shot = tmp_path / "failure.png"
            with contextlib.suppress(Exception):
                page.screenshot(path=str(shot), full_page=True)
            print(f"page at failure: {shot}\nJupyterLab log tail:\n{log.read_text()[-4000:]}")
            raise
        finally:
            browser.close()

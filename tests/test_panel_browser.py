"""The %gpushare panel as people see it: real JupyterLab in real headless Chromium (Debian's,
driven by Playwright) at 1280×800 with the right side panel open. The job table is one table
(its header and rows in one grid) that fits without horizontal scrolling: a running job's
name, state, GPUs, time, Logs and Cancel are in view; a long name ends in "…" and is whole on
hover. The panel's pool is a stand-in (a PoolClient with canned answers, in the kernel):
this test is about the layout, test_panel.py about the pool. A screenshot is kept in
tests/artifacts/panel/."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from urllib.error import URLError
from urllib.request import urlopen

import pytest

from browser import CHROMIUM_ARGS, chromium, need_playwright
from hubtest import free_port

ARTIFACTS = Path(__file__).parent / "artifacts" / "panel"
LONG_NAME = "resnet50-imagenet-sweep-learning-rate-0.1-batch-512-warmup-5-epochs"

# The kernel's cell: a panel on a pool that answers from canned JSON.
CELL = textwrap.dedent(f"""
    import time
    from jupyter_gpushare.client import PoolClient
    from jupyter_gpushare.notebook.panel import Panel

    class CannedPool(PoolClient):
        def quota(self):
            return {{"user": "alice", "projects": [{{"name": "vision", "quota": 2, "in_use": 2,
                                                   "pending": 1}}]}}

        def pool(self):
            return {{"capacity": 8}}

        def jobs(self, **_):
            now = time.time()
            usage = {{"sm_now": 0.93, "memory_now_bytes": 11 * 2**30, "sm_last_hour": 0.88,
                      "idle_for_s": None, "minutes": [[now // 60 * 60, 0.9, 0]]}}
            return [{{"id": "j-12", "name": {LONG_NAME!r}, "state": "running", "gpus": 2,
                      "attempt": 2, "started": now - 4000, "usage": usage}},
                    {{"id": "j-13", "name": "bert", "state": "pending", "gpus": 4,
                      "queue_position": 1, "submitted": now - 70,
                      "reason": "waiting for 4 GPUs on one node; project vision is at its "
                                "quota of 2 GPUs and 2 are borrowed by nlp"}}]

    Panel(client=CannedPool("http://127.0.0.1:9/", "t0ken"), interval=60, server=None)
""")

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    pytest.importorskip("jupyterlab", reason="SKIPPED LOUDLY: the panel's browser test needs "
                        "JupyterLab (pip install 'jupyterlab>=4.6,<5')")
    need_playwright()
    home, root = tmp_path_factory.mktemp("lab"), tmp_path_factory.mktemp("notebooks")
    kernel = home / "data" / "kernels" / "python3"
    kernel.mkdir(parents=True)
    (kernel / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3", "language": "python"}))
    (root / "panel.ipynb").write_text(json.dumps({
        "cells": [{"cell_type": "code", "metadata": {}, "source": CELL, "outputs": [],
                   "execution_count": None}],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3"}},
        "nbformat": 4, "nbformat_minor": 5}))
    (home / "config" / "labconfig").mkdir(parents=True)
    (home / "config" / "labconfig" / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
    port, token = free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTER_PATH": str(home / "data"),
           "JUPYTER_CONFIG_DIR": str(home / "config"),
           "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces")}
    for name in ("GPUSHARE_SLICE_GPUS", "JUPYTERHUB_SERVICE_URL"):
        env.pop(name, None)
    log = open(home / "lab.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--ServerApp.token={token}", f"--ServerApp.root_dir={root}", "--allow-root",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        env=env, stdout=log, stderr=log, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            with urlopen(f"{url}/api/status?token={token}", timeout=2):
                break
        except (URLError, ConnectionError, OSError):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"JupyterLab did not start; see {home / 'lab.log'}")
            time.sleep(0.3)
    yield {"url": url, "token": token}
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_the_job_table_fits_a_1280_notebook_with_the_right_side_panel_open(lab):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), headless=True,
                                    args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        try:
            page.goto(f"{lab['url']}/lab/tree/panel.ipynb?token={lab['token']}")
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
            # the right side panel (the property inspector, or gpushare's own), open
            page.locator(".jp-SideBar.jp-mod-right .lm-TabBar-tab").first.click()
            page.wait_for_selector("#jp-right-stack:visible", timeout=10_000)
            page.wait_for_selector(".jp-StatusBar-Widget:has-text('| Idle')", timeout=90_000)
            page.locator(".jp-Notebook .jp-Cell .jp-InputArea-editor").first.click()
            page.keyboard.press("Shift+Enter")
            table = page.locator(".gpushare-jobs")
            table.wait_for(timeout=60_000)
            page.wait_for_function("document.querySelector('.gpushare-jobs')"
                                   ".textContent.includes('bert')", timeout=30_000)
            page.wait_for_timeout(500)  # let the layout settle
            table.scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "panel-1280.png"))
            fit = table.evaluate("t => [t.scrollWidth, t.clientWidth]")
            assert fit[0] <= fit[1], f"the table scrolls sideways: {fit}"
            # a running job's name, state, GPUs, time and both buttons are in view
            area = page.locator(".jp-OutputArea-output").filter(has=table).bounding_box()
            right_panel = page.locator("#jp-right-stack").bounding_box()
            assert area["x"] + area["width"] <= right_panel["x"] + 1
            for what in (".gpushare-name", ".gpushare-state", ".gpushare-gpus",
                         ".gpushare-elapsed", "button:has-text('Logs')",
                         "button:has-text('Cancel')"):
                box = table.locator(what).first.bounding_box()  # j-12's
                assert box and box["width"] > 0, what
                assert area["x"] <= box["x"] and box["x"] + box["width"] <= \
                    area["x"] + area["width"] + 0.5, (what, box, area)
            # the long name is cut with an ellipsis and whole in its title
            name = table.locator(".gpushare-name .gpushare-cut").first
            assert name.get_attribute("title") == LONG_NAME
            assert name.evaluate("e => e.scrollWidth > e.clientWidth")
            assert table.locator(".gpushare-elapsed").first.inner_text() == "1h 06m"
            # header and rows are one grid: the titles stand over their cells
            titles = table.locator(".gpushare-th")
            for i in range(4):
                header = titles.nth(i).bounding_box()
                cell = table.locator(".gpushare-td").nth(i).bounding_box()
                assert abs(header["x"] - cell["x"]) < 1 and \
                    abs(header["width"] - cell["width"]) < 1
        finally:
            browser.close()

"""GPU use and culling in JupyterLab, end to end in real headless Chromium (Debian's, driven by
Playwright): alice's JupyterLab is a real notebook server started by a real hub (the
gpushare-local spawner, a ¼ build slice), her train jobs run in the real pool, and the NVML
stand-in plays their GPU use. The panel shows each running job's and the server's SM
utilization and memory now and over the last hour with a sparkline, and "idle 1m 05s" on what
is held and idle. While the tab is in the background (JupyterLab's polls stand by) the server
is idle on every count and the pool warns it; back in the tab, the status bar and the panel
say when it will be stopped, and once the hub hears of the tab's activity again the warning
goes. Screenshots are kept in tests/artifacts/labextension/.

Headless Chromium has no background tabs (every page is visible), so the test sets what a
browser sets for one: ``document.hidden`` and ``visibilityState``, which JupyterLab's and the
panel's polls read, and the ``visibilitychange`` event."""



from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

from browser import CHROMIUM_ARGS, chromium, need_playwright
from hubtest import running_hub
from jupyter_gpushare.usage.nvml_standin import write_script

GiB = 2**30
ARTIFACTS = Path(__file__).parent / "artifacts" / "labextension"
SPAWNER = "1a2b3c4d5e6f708192a3b4c5d6e7f809"
BUILD_GPU = "GPU-SIMULATED-sim-build-0-0"
ALWAYS = -10**9
CULL_AFTER = 40  # seconds idle before the warning: longer than the hub's activity records lag

POOL_CONFIG = f"""
c = get_config()
c.PoolService.projects = {{"vision": {{"quota": 2, "groups": ["vision"]}}}}
c.PoolService.cycle_interval = 0.2
c.PoolService.grace_period = 2
c.LocalBackend.simulate_gpus = True
c.LocalBackend.simulated_nodes = 1
c.LocalBackend.simulated_gpus_per_node = 4
c.LocalBackend.env_keep = ["LANG", "LC_ALL"]
c.PoolService.build_nodes = {{"sim-build-0": 1}}
c.PoolService.build_allowance = 0.25
c.GPUUsage.sample_interval = 0.5
c.GPUUsage.nvml_standin_script = "{{dir}}/standin.json"
c.GPUUsage.cull_idle_slices_after = {CULL_AFTER}
c.GPUUsage.cull_warning = 600
"""

HUB_EXTRA = f"""
c.JupyterHub.services.append({{"name": "gpushare-spawner", "api_token": "{SPAWNER}"}})
c.JupyterHub.load_roles.append({{"name": "gpushare-spawner", "services": ["gpushare-spawner"],
                                "scopes": ["access:services!service=gpushare"]}})
for role in c.JupyterHub.load_roles:  # culling: the service reads activity, stops servers
    if role["name"] == "gpushare-service":
        role["scopes"] += ["servers"]
c.JupyterHub.spawner_class = "gpushare-local"
c.LocalGPUShareSpawner.run_as_hub_user = True
c.LocalGPUShareSpawner.hub_user_home_template = "{{dir}}/home/{{username}}"
c.LocalGPUShareSpawner.build_profiles = [{{"gpus": 0.25, "default": True}}]
c.Spawner.cmd = [{str(Path(sys.executable).with_name("jupyterhub-singleuser"))!r}]
c.Spawner.args = ["--GPUShareExtension.activity_interval=2",
                  "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
# the hub hears of the server's activity every 20 s; Lab's question about news is turned off
c.Spawner.environment = {{"JUPYTERHUB_ACTIVITY_INTERVAL": "20",
                         "JUPYTER_CONFIG_DIR": "{{dir}}/jupyter-config",
                         "JUPYTERLAB_SETTINGS_DIR": "{{dir}}/lab-settings",
                         "JUPYTERLAB_WORKSPACES_DIR": "{{dir}}/lab-workspaces"}}
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
"""

JOB = ("import os, time\nprint('pid', os.getpid(), 'gpus', os.environ['CUDA_VISIBLE_DEVICES'], "
       "flush=True)\ntime.sleep(600)\n")

# What a browser does to a tab in the background, which headless Chromium never does.
BACKGROUND_TAB = """
Object.defineProperty(Document.prototype, 'hidden',
                      {configurable: true, get() { return !!window.__inBackground; }});
Object.defineProperty(Document.prototype, 'visibilityState',
                      {configurable: true, get() { return window.__inBackground ? 'hidden' : 'visible'; }});
window.__tab = (background) => {
  window.__inBackground = background;
  document.dispatchEvent(new Event('visibilitychange'));
};
"""

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def browser_path():
    pytest.importorskip("jupyterlab", reason="SKIPPED LOUDLY: the JupyterLab end-to-end test "
                        "needs JupyterLab (pip install 'jupyterlab>=4.6,<5')")
    need_playwright()
    return chromium()


@pytest.fixture(scope="module")
def hub(browser_path, tmp_path_factory):
    d = tmp_path_factory.mktemp("labusagehub")
    labconfig = d / "jupyter-config" / "labconfig"
    labconfig.mkdir(parents=True)
    (labconfig / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
    with running_hub(d, {"vision": ["alice"]}, POOL_CONFIG.replace("{dir}", str(d)), HUB_EXTRA,
                     users=["alice", "admin"]) as hub:
        yield hub
        hub.request("DELETE", f"{hub.url}/hub/api/users/alice/server", hub.token("alice"))


def job_pid(hub, job_id):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status, log = hub.api("GET", f"api/jobs/{job_id}/logs", "alice")
        if status == 200 and "pid" in log:
            words = log.split()
            return int(words[1]), words[3]
        time.sleep(0.1)
    raise TimeoutError(f"job {job_id} did not start")


def alices_slice(hub) -> dict | None:
    status, body = hub.request("GET", hub.pool_url + "api/slices", SPAWNER)
    return next((s for s in body["slices"] if s["user"] == "alice"), None)


@pytest.fixture(scope="module")
def played(hub):
    """alice's Lab server (its slice idle: 1 GiB, no kernels running), a busy job (80 %) and
    an idle one (1 %)."""
    status, body = hub.request("POST", f"{hub.url}/hub/api/users/alice/server",
                               hub.token("alice"), {})
    assert status in (201, 202), body
    deadline = time.monotonic() + 150
    while not (alices_slice(hub) or {}).get("pid"):
        assert time.monotonic() < deadline, f"no server for alice; see {hub.dir / 'hub.log'}"
        time.sleep(0.3)
    server = alices_slice(hub)["pid"]
    processes = [{"pid": server, "gpu": BUILD_GPU, "sm": [[ALWAYS, 0]], "memory": GiB}]
    write_script(hub.dir / "standin.json", {"processes": processes})
    jobs = {}
    for name, sm in (("busy", 80), ("waiting-for-data", 1)):
        status, job = hub.api("POST", "api/jobs", "alice", {"gpus": 1, "source": JOB,
                                                            "name": name})
        assert status == 201, job
        pid, gpu = job_pid(hub, job["id"])
        jobs[name] = job["id"]
        processes.append({"pid": pid, "gpu": gpu, "sm": [[ALWAYS, sm]], "memory": 6 * GiB})
    write_script(hub.dir / "standin.json", {"processes": processes})
    return {"jobs": jobs, "at": time.monotonic()}


@pytest.fixture(scope="module")
def page(hub, played, browser_path):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=browser_path, headless=True,
                                    args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 900})
        page.errors = []
        page.on("pageerror", lambda e: page.errors.append(str(e)))
        page.add_init_script(BACKGROUND_TAB)
        page.goto(hub.url + "/user/alice/lab")
        page.wait_for_selector("#username_input", timeout=30_000)
        page.fill("#username_input", "alice")
        page.fill("#password_input", "any")
        page.click("#login_submit")
        page.wait_for_selector(".jp-GpushareStatus", timeout=120_000)
        yield page
        browser.close()


def text_of(page, selector: str) -> str:
    return page.locator(selector).first.inner_text()


def test_jobs_and_the_server_show_their_gpu_use_and_idle_flags(page, played):
    page.wait_for_function(
        "document.querySelector('.jp-GpushareStatus').textContent.includes('vision')",
        timeout=30_000)
    assert text_of(page, ".jp-GpushareStatus") == "GPU ¼ · vision 2/2 · 2 running"
    page.locator(".jp-GpushareStatus").click()
    panel = page.locator("#jupyter-gpushare-panel")
    panel.wait_for(state="visible", timeout=10_000)
    busy = panel.locator(f"tbody[data-job='{played['jobs']['busy']}']")
    busy.locator(".jp-GpusharePanel-usageText").wait_for(timeout=30_000)
    page.wait_for_function(  # the job's minutes so far, and SM 80 % now
        f"document.querySelector(\"tbody[data-job='{played['jobs']['busy']}'] "
        f".jp-GpusharePanel-usageText\").textContent.startsWith('SM 80%')", timeout=30_000)
    assert re.fullmatch(r"SM 80% \(1h \d+%\), 6\.0 GiB",
                        busy.locator(".jp-GpusharePanel-usageText").inner_text())
    assert busy.locator("svg.jp-GpusharePanel-spark circle").count() >= 1  # the newest minute
    server = panel.locator(".jp-GpusharePanel-server")
    assert server.locator("h3").inner_text() == "This server: 0.25 GPU slice"
    assert server.locator(".jp-GpusharePanel-usageText").inner_text() == "SM 0% (1h 0%), 1.0 GiB"
    # held and idle: a plain flag once it has lasted a minute
    idle = panel.locator(f"tbody[data-job='{played['jobs']['waiting-for-data']}']")
    idle.locator(".jp-GpusharePanel-flag").wait_for(timeout=90_000)
    assert re.fullmatch(r"idle \d+m \d\ds", idle.locator(".jp-GpusharePanel-flag").inner_text())
    assert re.fullmatch(r"SM 1% \(1h \d+%\), 6\.0 GiB",
                        idle.locator(".jp-GpusharePanel-usageText").inner_text())
    assert busy.locator(".jp-GpusharePanel-flag").count() == 0
    assert re.fullmatch(r"idle \d+m \d\ds", server.locator(".jp-GpusharePanel-flag").inner_text())
    assert panel.locator(".jp-GpusharePanel-cull").count() == 0  # Lab is in use: not warned
    page.screenshot(path=str(ARTIFACTS / "7-gpu-use.png"))


def test_an_idle_server_is_warned_in_the_status_bar_and_panel_until_it_is_used(hub, page):
    # The side panel is closed and the tab goes to the background: JupyterLab's polls and the
    # panel's stand by, the server sees no activity.
    page.locator(".jp-SideBar.jp-mod-right .lm-TabBar-tab[data-id='jupyter-gpushare-panel']").click()
    page.locator("#jupyter-gpushare-panel").wait_for(state="hidden", timeout=10_000)
    page.evaluate("window.__tab(true)")
    deadline = time.monotonic() + CULL_AFTER + 90
    while not (alices_slice(hub) or {}).get("cull"):
        assert time.monotonic() < deadline, "alice's idle server was never warned"
        time.sleep(0.5)
    cull = alices_slice(hub)["cull"]
    assert cull["cull_at"] - cull["warned_at"] == 600
    # Back in the tab, alice opens the panel from the status bar: it asks at once.
    page.evaluate("window.__tab(false)")
    page.locator(".jp-GpushareStatus").click()
    warning = page.locator("#jupyter-gpushare-panel .jp-GpusharePanel-cull")
    warning.wait_for(timeout=15_000)
    # the clock time as the browser's locale writes it ("14:05", "2:05 PM"), with the day
    # when the stop falls on another one ("Nov 27, 12:09 AM": a run just before midnight)
    assert re.fullmatch(r"This server will be stopped at (\w{3} \d\d?, |\d\d? \w{3},? )?"
                        r"\d?\d:\d\d(\s[AP]M)? "
                        r"\(in (9m \d\ds|10m 00s)\): its slice "
                        r"has shown no GPU use and the hub no activity from it\. Use it \(run a "
                        r"cell\) to keep it\.", warning.inner_text())
    assert warning.get_attribute("role") == "alert"
    assert warning.get_attribute("title") == cull["reason"]
    status = text_of(page, ".jp-GpushareStatus")
    assert re.fullmatch(r"GPU ¼ · ⚠ idle: stops in (9m \d\ds|10m 00s) · vision 2/2 · 2 running",
                        status)
    assert "jp-mod-error" in page.locator(".jp-GpushareStatus").get_attribute("class")
    page.screenshot(path=str(ARTIFACTS / "8-culling-warning.png"))
    # The tab's own requests are activity: the hub hears of it, the pool takes the warning
    # back, and the panel and status bar say nothing more.
    warning.wait_for(state="detached", timeout=90_000)
    assert "stops in" not in text_of(page, ".jp-GpushareStatus")
    assert alices_slice(hub)["cull"] is None
    status, pool = hub.api("GET", "api/pool", "admin")
    kinds = [e["kind"] for e in pool["culling"]["events"] if e["user"] == "alice"]
    assert kinds[-2:] == ["warn", "spare"] and "cull" not in kinds
    assert page.errors == []

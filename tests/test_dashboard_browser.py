"""The admin dashboard in real headless Chromium (Debian's, driven by Playwright), on a real hub
with the real proxy, real notebook servers (the gpushare-local spawner) and real train jobs,
the NVML stand-in playing their GPU use: an admin logs in through the hub's login page and its
OAuth and sees every GPU with its holders and their use, allocation and utilization per
project as the stand-in played them (within one percentage point), the idlest job and slice,
the queue with its reason, and a culled session; the page refreshes itself. A non-admin is
refused with a page that says why; so are mistakes in the address. Screenshots are kept in
tests/artifacts/dashboard/."""

from __future__ import annotations

import re
import sys
import time
import urllib.request
from pathlib import Path
from urllib.error import HTTPError

import pytest

from browser import CHROMIUM_ARGS, chromium, need_playwright
from hubtest import running_hub
from jupyter_gpushare.usage.nvml_standin import write_script

GiB = 2**30
ARTIFACTS = Path(__file__).parent / "artifacts" / "dashboard"
SPAWNER = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
BUILD_GPU = "GPU-SIMULATED-sim-build-0-0"

POOL_CONFIG = """
c = get_config()
c.PoolService.projects = {"vision": {"quota": 2, "groups": ["vision"]},
                          "nlp": {"quota": 2, "groups": ["nlp"]}}
c.PoolService.cycle_interval = 0.2
c.PoolService.grace_period = 2
c.LocalBackend.simulate_gpus = True
c.LocalBackend.simulated_nodes = 1
c.LocalBackend.simulated_gpus_per_node = 4
c.LocalBackend.env_keep = ["LANG", "LC_ALL"]
c.PoolService.build_nodes = {"sim-build-0": 1}
c.PoolService.build_allowance = 0.25
c.GPUUsage.sample_interval = 0.5
c.GPUUsage.nvml_standin_script = "{dir}/standin.json"
c.GPUUsage.cull_idle_slices_after = 15  # longer than a server takes to start
c.GPUUsage.cull_warning = 3
"""

HUB_EXTRA = f"""
c.JupyterHub.services.append({{"name": "gpushare-spawner", "api_token": "{SPAWNER}"}})
c.JupyterHub.load_roles.append({{"name": "gpushare-spawner", "services": ["gpushare-spawner"],
                                "scopes": ["access:services!service=gpushare"]}})
# carol administers the pool without being a JupyterHub admin
c.JupyterHub.load_roles.append({{"name": "gpushare-admin", "users": ["carol"],
                                "scopes": ["custom:gpushare:admin"]}})
for role in c.JupyterHub.load_roles:  # culling: the service reads activity, stops servers
    if role["name"] == "gpushare-service":
        role["scopes"] += ["servers"]
c.JupyterHub.spawner_class = "gpushare-local"
c.LocalGPUShareSpawner.run_as_hub_user = True
c.LocalGPUShareSpawner.hub_user_home_template = "{{dir}}/home/{{username}}"
c.LocalGPUShareSpawner.build_profiles = [{{"gpus": 0.25, "default": True}}]
c.Spawner.cmd = [{str(Path(sys.executable).with_name("jupyterhub-singleuser"))!r}]
c.Spawner.args = ["--ServerApp.jpserver_extensions={{'jupyterlab': False, 'jupyter_lsp': False, "
                  "'notebook_shim': False, 'jupyter_server_terminals': False}}",
                  "--GPUShareExtension.activity_interval=0.5"]
c.Spawner.environment = {{"JUPYTERHUB_ACTIVITY_INTERVAL": "1"}}
c.Spawner.default_url = "/api"
c.Spawner.start_timeout = 90
c.Spawner.http_timeout = 90
"""

JOB = ("import os, time\nprint('pid', os.getpid(), 'gpus', os.environ['CUDA_VISIBLE_DEVICES'], "
       "flush=True)\ntime.sleep(600)\n")
ALWAYS = -10**9

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def browser_path():
    need_playwright()
    return chromium()


@pytest.fixture(scope="module")
def hub(browser_path, tmp_path_factory):
    d = tmp_path_factory.mktemp("dashhub")
    with running_hub(d, {"vision": ["alice", "carol"], "nlp": ["bob"]},
                     POOL_CONFIG.replace("{dir}", str(d)), HUB_EXTRA,
                     users=["alice", "bob", "carol", "admin"]) as hub:
        yield hub
        for user in ("alice", "carol"):
            hub.request("DELETE", f"{hub.url}/hub/api/users/{user}/server", hub.token(user))


def start_server(hub, user):
    status, body = hub.request("POST", f"{hub.url}/hub/api/users/{user}/server",
                               hub.token(user), {})
    assert status in (201, 202), body
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if running(hub, user):
            return
        time.sleep(0.3)
    raise TimeoutError(f"{user}'s server did not start; see {hub.dir / 'hub.log'}")


def running(hub, user) -> bool:
    status, model = hub.request("GET", f"{hub.url}/hub/api/users/{user}", hub.token("admin"))
    return bool(model.get("servers", {}).get("", {}).get("ready"))


def job_pid(hub, user, job_id):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status, log = hub.api("GET", f"api/jobs/{job_id}/logs", user)
        if status == 200 and "pid" in log:
            words = log.split()
            return int(words[1]), words[3].split(",")
        time.sleep(0.1)
    raise TimeoutError(f"job {job_id} did not start")


@pytest.fixture(scope="module")
def played(hub):
    """alice: a busy 2-GPU job (90 % and 70 %) and a busy ¼ slice (20 % of its GPU); bob: an
    idle job (2 %); carol: an idle slice, culled; alice's 4-GPU job waits. A whole minute of
    it is measured: the window asked for is that minute up to now."""
    sessions = []
    for user, sm, memory in (("alice", 20, 3 * GiB), ("carol", 0, GiB)):
        start_server(hub, user)
        status, body = hub.request("GET", hub.pool_url + "api/slices", SPAWNER)
        pid = next(s["pid"] for s in body["slices"] if s["user"] == user)
        sessions.append({"pid": pid, "gpu": BUILD_GPU, "sm": [[ALWAYS, sm]], "memory": memory})
        # played at once: culling would stop alice's session too before it is used
        write_script(hub.dir / "standin.json", {"processes": sessions})
    jobs = {}
    for user, gpus, name in (("alice", 2, "resnet"), ("bob", 1, "bert")):
        status, job = hub.api("POST", "api/jobs", user, {"gpus": gpus, "source": JOB,
                                                         "name": name})
        assert status == 201, job
        jobs[user] = (job["id"], *job_pid(hub, user, job["id"]))
    status, big = hub.api("POST", "api/jobs", "alice", {"gpus": 4, "source": JOB, "name": "big"})
    assert status == 201, big
    (_, busy, busy_gpus), (_, idle, [idle_gpu]) = jobs["alice"], jobs["bob"]
    write_script(hub.dir / "standin.json", {"processes": [
        {"pid": busy, "gpu": busy_gpus[0], "sm": [[ALWAYS, 90]], "memory": 20 * GiB},
        {"pid": busy, "gpu": busy_gpus[1], "sm": [[ALWAYS, 70]], "memory": 20 * GiB},
        {"pid": idle, "gpu": idle_gpu, "sm": [[ALWAYS, 2]], "memory": 30 * GiB}, *sessions]})
    minute = (int(time.time()) + 3) // 60 * 60 + 60
    time.sleep(minute + 15 - time.time())
    deadline = time.monotonic() + 60
    while running(hub, "carol") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not running(hub, "carol"), "carol's idle session was not culled"
    return {"since": minute, "until": time.time(), "jobs": jobs, "big": big["id"],
            "gpus": {"alice": busy_gpus, "bob": [idle_gpu]}}


@pytest.fixture(scope="module")
def browser(browser_path):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=browser_path, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


def log_in(browser, hub, user, path):
    """A fresh browser that asks for ``path`` and logs in on the hub's page it is sent to."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.on("console", lambda m: m.type == "error" and page.errors.append(m.text))
    page.goto(hub.url + path)
    page.wait_for_selector("#username_input", timeout=30_000)
    assert "/hub/login" in page.url, page.url
    page.fill("#username_input", user)
    page.fill("#password_input", "any")
    with page.expect_navigation(url=re.compile(r".*/services/gpushare/dashboard.*"),
                                timeout=30_000):
        page.click("#login_submit")
    return page


def tile(uuid: str) -> str:
    """The pool map's tile of a simulated GPU (``GPU-SIMULATED-<node>-<index>``)."""
    node, index = uuid.removeprefix("GPU-SIMULATED-").rsplit("-", 1)
    return f"#pool-map .gpu[data-gpu='{node}/{index}']"


def percent_of(text: str) -> float:
    return float(text.rstrip("%")) / 100


def test_an_admin_logs_in_through_the_hub_and_sees_the_pool(hub, played, browser):
    path = f"/services/gpushare/dashboard?since={played['since']}&until={played['until']:.3f}"
    page = log_in(browser, hub, "admin", path)
    page.wait_for_selector("#pool-map", timeout=30_000)
    assert page.title() == "GPU share: pool dashboard"
    # the pool map: four train GPUs and the build GPU, each with its holders now
    assert page.locator("#pool-map .gpu").count() == 5
    for uuid, sm in zip(played["gpus"]["alice"], ("90%", "70%")):
        held = page.locator(tile(uuid))
        assert "held" in held.get_attribute("class").split()
        assert f"job resnet · alice · vision · SM {sm}" in held.inner_text()
    idle = page.locator(tile(played["gpus"]["bob"][0]))
    assert "idle" in idle.get_attribute("class").split()  # held, under 5 % of it
    assert "job bert · bob · nlp · SM 2%" in idle.inner_text()
    # an admin may cancel it from its tile (test_dashboard_admin.py follows such a link)
    assert idle.get_by_role("link", name="Cancel job bert").get_attribute("href") == \
        f"/services/gpushare/dashboard/jobs/{played['jobs']['bob'][0]}/cancel"
    build = page.locator("#pool-map .gpu[data-gpu='sim-build-0/0']").inner_text()
    assert "¼ slice · alice · SM 80%" in build and "carol" not in build  # hers was culled
    assert "played by the NVML stand-in" in page.locator("#pool-map .source").inner_text()

    # allocation and utilization as played, within one percentage point
    cells = {row.locator("td").first.inner_text(): [c.inner_text() for c in
                                                    row.locator("td").all()]
             for row in page.locator("#projects table.projects tbody tr").all()}
    for project, allocation, utilization in (("vision", 0.5, 0.8), ("nlp", 0.25, 0.02)):
        row = cells[project]
        assert abs(percent_of(row[4]) - allocation) <= 0.01, row
        assert abs(percent_of(row[5]) - utilization) <= 0.01, row
    train = page.locator("#projects .figures[data-pool='train']").inner_text()
    assert re.search(r"allocation 75%, utilization (\d+)%", train), train
    assert page.locator("#projects svg.gpushare-chart").count() == 2
    assert page.locator("#projects polygon").count() == 2  # vision and nlp, stacked
    # the idlest: bob's job; of the slices only carol's (culled, maybe before this window)
    idle_jobs = page.locator("#idle table.idle-jobs tbody tr").all_inner_texts()
    assert len(idle_jobs) == 1 and idle_jobs[0].startswith("bert") and "bob" in idle_jobs[0]
    slices = page.locator("#idle table.idle-slices tbody tr").all_inner_texts()
    assert all("carol" in row and "released" in row for row in slices), slices
    # the queue, with the scheduler's reason
    [waiting] = page.locator("#queue table tbody tr").all()
    words = [c.inner_text() for c in waiting.locator("td").all()]
    assert words[0] == "1" and words[1].startswith("big") and words[2:5] == ["alice", "vision",
                                                                          "4"]
    assert words[6].strip(), words
    # the culls: carol's session warned, then stopped
    culls = page.locator("#culls table.culls").inner_text()
    assert re.search(r"stopped\s+carol", culls) and re.search(r"warned\s+carol", culls)
    assert "Stopped so far: 1." in page.locator("#culls").inner_text()
    page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)

    # it refreshes in place (its script runs under the page's Content-Security-Policy)
    before = page.locator("main").get_attribute("data-updated")
    page.locator(f"main:not([data-updated='{before}'])").wait_for(timeout=40_000)
    page.goto(hub.url + "/services/gpushare/dashboard?window=1h")  # logged in: no question
    page.wait_for_selector("#projects svg.gpushare-chart")
    assert page.locator("header nav a.on").inner_text() == "1h"
    slices = page.locator("#idle table.idle-slices tbody tr").all_inner_texts()
    assert "carol" in slices[0] and "released" in slices[0], slices  # the idlest: all idle
    page.screenshot(path=str(ARTIFACTS / "dashboard-1h.png"), full_page=True)
    # asked for no window, a pool minutes old opens on its minutes, not on six hours
    page.goto(hub.url + "/services/gpushare/dashboard")
    page.wait_for_selector("#projects svg.gpushare-chart")
    # (younger than a quarter of an hour: the window starts before the first reading, and
    # says when that was)
    words = page.locator("#projects").inner_text()
    assert re.search(r"since the pool's first reading, |\(the pool's first reading: ", words)
    assert page.locator("header nav a.on").count() == 0
    page.screenshot(path=str(ARTIFACTS / "dashboard-default.png"), full_page=True)
    assert page.errors == []


def test_a_non_admin_is_refused_with_a_page_that_says_why(hub, browser):
    page = log_in(browser, hub, "alice", "/services/gpushare/dashboard")
    page.wait_for_selector(".refusal", timeout=30_000)
    text = page.locator(".refusal").inner_text()
    assert "Not allowed (403)" in text
    assert "Only admins of the GPU pool see its dashboard" in text and "signed in as alice" in text
    assert "Traceback" not in page.content()
    page.screenshot(path=str(ARTIFACTS / "refused.png"))
    response = page.goto(hub.url + "/services/gpushare/dashboard")
    assert response.status == 403


def test_a_pool_admin_who_is_no_hub_admin_gets_in(hub, browser):
    """carol holds custom:gpushare:admin; the service's OAuth client asks for that scope."""
    page = log_in(browser, hub, "carol", "/services/gpushare/dashboard")
    page.wait_for_selector("#pool-map", timeout=30_000)
    assert "signed in as carol" in page.locator("header").inner_text()


class NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def get(url, token=None):
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"token {token}")
    try:
        with urllib.request.build_opener(NoRedirects).open(request, timeout=30) as r:
            return r.status, r.headers, r.read().decode()
    except HTTPError as e:
        return e.code, e.headers, e.read().decode()


def test_tokens_strangers_and_mistakes(hub):
    base = hub.pool_url + "dashboard"
    status, headers, body = get(base, hub.token("admin"))
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    assert "GPU share: pool dashboard" in body
    status, _, body = get(base, hub.token("bob"))
    assert status == 403 and "Only admins of the GPU pool" in body
    status, _, body = get(base, SPAWNER)  # a service that may use the pool: not a person
    assert status == 403 and "not for services" in body
    status, headers, _ = get(base)  # no login: sent to the hub's OAuth
    assert status == 302 and "/hub/api/oauth2/authorize" in headers["Location"]
    status, headers, _ = get(hub.pool_url)  # the hub's Services menu links here
    assert status == 302 and headers["Location"].endswith("/services/gpushare/dashboard")
    for query, words in (("window=2y", "Window must be one of 1h, 6h, 24h, 7d, 30d, not '2y'."),
                         ("since=yesterday", "Since must be a time like 7d"),
                         ("since=2h&until=3h", "Since must be before until."),
                         ("since=500d", "The period may be at most 400 days"),
                         ("window=6h&since=1h", "Ask for a window (window=6h) or a period"),
                         ("x=1", "Unknown parameter(s) x; the dashboard takes window, or "
                                 "since and until.")):
        status, headers, body = get(f"{base}?{query}", hub.token("admin"))
        assert status == 400 and headers["Content-Type"].startswith("text/html"), (query, body)
        assert words in body.replace("&#x27;", "'"), (query, body[-800:])
        assert "Traceback" not in body

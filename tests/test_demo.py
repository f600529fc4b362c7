"""The demo hub exactly as the README starts it (``jupyterhub -f hub_config/jupyterhub_config.py``,
only its ports, state and homes moved into this test's folders), used as a person would in
real headless Chromium: alice logs in, starts the default server, runs ``%%train --gpus 2``
and gets two GPU ids back; no process of hers runs as root; her terminal finds ``gpushare``
and ``python``, and a job submitted there runs the terminal's ``python``; the hub stops soon
and without errors. Screenshots are kept in tests/artifacts/demo/.

As root (as the demo is meant to run) the hub builds its notebook environment from the
system's python3 into a folder of this test's own, once per run (about a minute)."""

from __future__ import annotations

import json
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.error import HTTPError, URLError
from urllib.request import Request, urlopen

import pytest

from browser import CHROMIUM_ARGS, chromium, need_playwright
from hubtest import free_port, need_proxy

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(__file__).parent / "artifacts" / "demo"
AS_ROOT = os.geteuid() == 0
TRAIN_CELL = ('%%train --gpus 2\nimport os\nprint("devices", os.environ["CUDA_VISIBLE_DEVICES"],'
              ' "uid", os.getuid())')

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    need_proxy()
    need_playwright()
    browser = chromium()
    # Folders every demo account can enter (the pytest folder is root's alone).
    top = Path(tempfile.mkdtemp(prefix="gpushare-demo-test-"))
    top.chmod(0o755)
    homes = top / "homes"
    homes.mkdir(mode=0o755)
    state = tmp_path_factory.mktemp("demo-state")
    port, hub_port = free_port(), free_port()
    env = {**os.environ, "GPUSHARE_DEMO_STATE": str(state), "GPUSHARE_DEMO_PORT": str(port),
           "GPUSHARE_DEMO_HUB_PORT": str(hub_port),
           "GPUSHARE_DEMO_PROXY_API_PORT": str(free_port()),
           "GPUSHARE_SERVICE_PORT": str(free_port()),
           "GPUSHARE_DEMO_PASSWORD": secrets.token_urlsafe(9),
           "GPUSHARE_DEMO_ADMIN_PASSWORD": secrets.token_urlsafe(24),
           "GPUSHARE_DEMO_ENV": str(top / "env"), "GPUSHARE_DEMO_HOMES": str(homes)}
    log = open(state / "hub.log", "wb")
    hub = subprocess.Popen([str(Path(sys.executable).with_name("jupyterhub")), "-f",
                            "hub_config/jupyterhub_config.py"], cwd=REPO, env=env, stdout=log,
                           stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for(url + "/services/gpushare/api/openapi.json", hub, state, timeout=600)
        yield {"url": url, "password": env["GPUSHARE_DEMO_PASSWORD"],
               "admin_password": env["GPUSHARE_DEMO_ADMIN_PASSWORD"], "hub": hub, "env": env,
               "state": state, "homes": homes, "browser": browser, "hub_port": hub_port}
    finally:
        _stop(hub, port, hub_port)
        log.close()
        shutil.rmtree(top, ignore_errors=True)


@pytest.mark.parametrize("variable", ["GPUSHARE_DEMO_PORT", "GPUSHARE_SERVICE_PORT"])
def test_a_port_another_program_holds_is_said_with_the_setting_that_moves_it(tmp_path,
                                                                                variable):
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        env = {**os.environ, "GPUSHARE_DEMO_STATE": str(tmp_path / "state"),
               "GPUSHARE_DEMO_PORT": str(free_port()),
               "GPUSHARE_DEMO_HUB_PORT": str(free_port()),
               "GPUSHARE_DEMO_PROXY_API_PORT": str(free_port()),
               "GPUSHARE_SERVICE_PORT": str(free_port()), variable: str(port)}
        done = subprocess.run([str(Path(sys.executable).with_name("jupyterhub")), "-f",
                               "hub_config/jupyterhub_config.py"], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert f"gpushare demo: port {port} on 127.0.0.1 is taken by another program; stop it, " \
           f"or give the demo another port, e.g. {variable}=" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    env[variable] = "http"
    done = subprocess.run([str(Path(sys.executable).with_name("jupyterhub")), "-f",
                           "hub_config/jupyterhub_config.py"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert f"gpushare demo: {variable}='http' is not a port" in done.stderr, done.stderr


def _wait_for(url, hub, state, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if hub.poll() is not None:
            pytest.fail(f"the demo hub exited: {(state / 'hub.log').read_text()[-3000:]}")
        try:
            with urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except (URLError, OSError):
            pass
        time.sleep(0.5)
    pytest.fail(f"the demo hub did not come up: {(state / 'hub.log').read_text()[-3000:]}")


def _stop(hub, port, hub_port):
    """Stop the hub and whatever of it is left: the service and proxy run in sessions of
    their own, and servers outlive a hub that is killed."""
    if hub.poll() is None:
        hub.send_signal(signal.SIGTERM)
        try:
            hub.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(hub.pid, signal.SIGKILL)
            hub.wait()
    proxy = subprocess.run(["pgrep", "-f", f"configurable-http-proxy --ip 127.0.0.1 --port "
                                           f"{port} "], capture_output=True, text=True)
    for pid in [*_processes_of(hub_port), *(int(p) for p in proxy.stdout.split())]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _processes_of(hub_port: int, user: str | None = None) -> dict[int, int]:
    """pid -> real uid of every process of this hub (its service, servers, kernels and
    terminals: they are told its API's address), or of its JupyterHub user ``user``."""
    api = f"JUPYTERHUB_API_URL=http://127.0.0.1:{hub_port}/hub/api".encode()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        if api in environ and (user is None or f"JUPYTERHUB_USER={user}".encode() in environ):
            found[int(entry)] = int(re.search(r"^Uid:\s+(\d+)", status, re.M).group(1))
    return found


TERMINAL_JS = """async ([base, command, marker]) => {
  const xsrf = decodeURIComponent((document.cookie.split('; ')
      .find(c => c.startsWith('_xsrf=')) || '_xsrf=').slice(6));
  const made = await fetch(base + 'api/terminals', {method: 'POST',
                                                    headers: {'X-XSRFToken': xsrf}});
  const terminal = await made.json();
  return await new Promise(resolve => {
    const ws = new WebSocket(base.replace(/^http/, 'ws') + 'terminals/websocket/' + terminal.name);
    let out = '';
    ws.onopen = () => ws.send(JSON.stringify(['stdin', command + '\\r']));
    ws.onmessage = event => {
      const [kind, text] = JSON.parse(event.data);
      if (kind === 'stdout') { out += text; if (out.includes(marker)) { ws.close(); resolve(out); } }
    };
    setTimeout(() => resolve(out), 90000);
  });
}"""


def test_alice_trains_on_two_gpus_as_herself_and_her_terminal_finds_gpushare(demo):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    user = "alice" if AS_ROOT else pwd.getpwuid(os.getuid()).pw_name
    uid = pwd.getpwnam(user).pw_uid
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=demo["browser"], args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(demo["url"] + "/hub/login")
        page.fill("#username_input", "alice")
        page.fill("#password_input", demo["password"])
        page.click("#login_submit")
        page.wait_for_url(re.compile(r".*/hub/spawn.*"))
        assert page.is_checked("input[name=profile][value=quarter-gpu]")  # ¼ GPU, the default
        page.screenshot(path=str(ARTIFACTS / "spawn.png"))
        page.click("input[type=submit], button[type=submit]")
        page.wait_for_url(re.compile(r".*/user/alice/lab.*"), timeout=180_000)
        page.wait_for_selector(".jp-LauncherCard", timeout=180_000)

        # A notebook: %%train --gpus 2 answers with two GPU ids, run as alice.
        page.click(".jp-LauncherCard:has-text('Python 3') >> nth=0")
        page.wait_for_selector(".jp-Notebook .jp-Cell .cm-content", timeout=120_000)
        page.wait_for_selector(".jp-StatusBar-TextItem:has-text('| Idle')", timeout=120_000)
        page.click(".jp-Notebook .jp-Cell .cm-content")
        page.keyboard.type(TRAIN_CELL)
        page.keyboard.press("Shift+Enter")
        page.wait_for_selector("text=/devices \\S+ uid \\d+/", timeout=120_000)
        page.wait_for_selector(".jp-OutputArea >> text=/succeeded after/", timeout=60_000)
        output = page.inner_text(".jp-Notebook .jp-Cell .jp-OutputArea >> nth=0")
        page.screenshot(path=str(ARTIFACTS / "train.png"))
        devices, job_uid = re.search(r"devices (\S+) uid (\d+)", output).groups()
        assert len(set(devices.split(","))) == 2, output
        assert int(job_uid) == uid and "succeeded" in output, output

        # No process of alice's runs as root: her server, kernel and the rest are hers.
        mine = _processes_of(demo["hub_port"], "alice")
        assert mine and set(mine.values()) == {uid}, mine

        # Her terminal finds gpushare and python, and a job sent from it runs that python.
        base = demo["url"] + "/user/alice/"
        text = page.evaluate(TERMINAL_JS, [base, (
            "command -v gpushare python; gpushare submit --gpus 2 --wait -- python -c "
            "'import os, sys; print(\"ran\", sys.executable, os.environ[\"CUDA_VISIBLE_"
            "DEVICES\"])'; echo DONE-$((40+2))"), "DONE-42"])
        assert "DONE-42" in text, text
        lines = [line.strip() for line in text.splitlines()]
        gpushare = next(line for line in lines if line.endswith("/gpushare"))
        python = next(line for line in lines if line.endswith("/python"))
        assert Path(gpushare).parent == Path(python).parent, text
        ran = next(line for line in lines if line.startswith("ran "))
        assert ran.split()[1].startswith(str(Path(python).parent)) and "," in ran, text
        assert "succeeded" in text, text

        # The GPU panel shows her project with its department, and the department's bar.
        page.locator(".jp-GpushareStatus").first.click()
        page.wait_for_selector(".jp-GpusharePanel-projectName:has-text('vision · research')",
                               timeout=60_000)
        page.wait_for_selector(".jp-GpusharePanel-projectName:has-text('department research')",
                               timeout=60_000)
        page.screenshot(path=str(ARTIFACTS / "panel-departments.png"))
        browser.close()
    home = demo["homes"] / "alice"
    assert home.stat().st_uid == uid  # her server ran in the test's home for her, not /home


def test_the_admin_sees_the_pool_dashboard(demo):
    """As the README says: admin logs in, and "GPU pool" in the hub's navigation bar leads to
    the dashboard (its login through the hub's OAuth asks nothing more)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=demo["browser"], args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(demo["url"] + "/hub/login")
        page.fill("#username_input", "admin")
        page.fill("#password_input", demo["admin_password"])
        page.click("#login_submit")
        page.wait_for_load_state()
        page.goto(demo["url"] + "/hub/home")
        page.get_by_role("link", name="GPU pool").click()
        page.wait_for_selector("#pool-map", timeout=60_000)
        assert page.url.endswith("/services/gpushare/dashboard")
        nodes = page.locator("#pool-map .node h3").all_inner_texts()
        assert any("train pool" in n for n in nodes) and any("build pool" in n for n in nodes)
        assert "are warned, then stopped 2m later" in page.locator("#culls").inner_text()
        page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
        browser.close()


def _token(demo, user: str) -> str:
    """A token for ``user``, asked of the hub with the demo's password (as a script would)."""
    password = demo["admin_password"] if user == "admin" else demo["password"]
    req = Request(f"{demo['url']}/hub/api/users/{user}/tokens", method="POST",
                  data=json.dumps({"auth": {"username": user, "password": password},
                                   "note": "test_demo"}).encode(),
                  headers={"Content-Type": "application/json"})
    with urlopen(req, timeout=30) as r:
        return json.loads(r.read())["token"]


def _pool(demo, method: str, path: str, token: str, body=None):
    req = Request(f"{demo['url']}/services/gpushare/{path}", method=method,
                  data=None if body is None else json.dumps(body).encode(),
                  headers={"Authorization": f"token {token}",
                           "Content-Type": "application/json"})
    try:
        with urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_a_sibling_borrows_an_idle_quota_first_and_quota_shows_both_levels(demo):
    """The demo's departments: alice's vision and bob's nlp share research (4 GPUs), carol's
    speech is in operations. All 8 GPUs busy (vision 2, nlp 2, speech 4), bob and carol each
    ask 2 more, alice's job ends: bob's job takes her idle quota, carol's waits, though
    speech's weight (10 here) would give carol the GPUs on one level."""
    tokens = {u: _token(demo, u) for u in ("alice", "bob", "carol", "admin")}
    if AS_ROOT:  # their homes, as the spawner makes them for a server (jobs checkpoint there)
        for user in ("alice", "bob", "carol"):
            home = demo["homes"] / user
            if not home.exists():
                home.mkdir(mode=0o700)
                entry = pwd.getpwnam(user)
                os.chown(home, entry.pw_uid, entry.pw_gid)
    assert _pool(demo, "PUT", "api/projects/speech", tokens["admin"],
                 {"over_quota_weight": 10})[0] == 200
    shown = subprocess.run([str(Path(sys.executable).with_name("gpushare")), "quota"],
                           env={**os.environ, "JUPYTERHUB_API_TOKEN": tokens["bob"],
                                "GPUSHARE_URL": demo["url"] + "/services/gpushare/"},
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    lines = [line.split() for line in shown.stdout.splitlines()]
    assert lines[1][0] == "nlp" and lines[1][-1] == "research", shown.stdout
    assert lines[2][0] == "DEPARTMENT" and lines[3][0] == "research", shown.stdout
    sleep = "import time; time.sleep(600)"
    jobs = []

    def submit(user, gpus):
        status, job = _pool(demo, "POST", "api/jobs", tokens[user],
                            {"gpus": gpus, "source": sleep})
        assert status in (200, 201), job
        jobs.append((user, job["id"]))
        return job["id"]

    def state(user, job_id):
        return _pool(demo, "GET", f"api/jobs/{job_id}", tokens[user])[1]

    def until(check, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            time.sleep(0.5)
        raise AssertionError(f"not in {timeout} s: {[(u, state(u, j)) for u, j in jobs]}")

    try:
        first = [("alice", submit("alice", 2)), ("bob", submit("bob", 2)),
                 ("carol", submit("carol", 2)), ("carol", submit("carol", 2))]
        until(lambda: all(state(u, j)["state"] == "running" for u, j in first))
        carol_more, bob_more = submit("carol", 2), submit("bob", 2)
        until(lambda: state("bob", bob_more)["reason"] and state("carol", carol_more)["reason"])
        assert _pool(demo, "DELETE", f"api/jobs/{first[0][1]}", tokens["alice"])[0] == 200
        until(lambda: state("bob", bob_more)["state"] == "running")
        waiting = state("carol", carol_more)
        assert waiting["state"] == "pending", waiting
        research = _pool(demo, "GET", "api/departments/research", tokens["bob"])[1]
        assert (research["in_use"], research["projects"]) == (4, ["nlp", "vision"]), research
    finally:
        for user, job_id in jobs:
            _pool(demo, "DELETE", f"api/jobs/{job_id}", tokens[user])
        _pool(demo, "PUT", "api/projects/speech", tokens["admin"], {"over_quota_weight": 1})


def _server_ready(demo, user: str, token: str) -> bool:
    req = Request(f"{demo['url']}/hub/api/users/{user}", headers={"Authorization": f"token {token}"})
    with urlopen(req, timeout=30) as r:
        return bool(json.loads(r.read()).get("servers", {}).get("", {}).get("ready"))


def _start_server(demo, user: str, token: str) -> tuple[float, list[str]]:
    """Start ``user``'s default server through the hub's API as the spawn page does; return
    the seconds until it is ready and the progress messages the page shows meanwhile."""
    from concurrent.futures import ThreadPoolExecutor

    def post():
        req = Request(f"{demo['url']}/hub/api/users/{user}/server", method="POST", data=b"{}",
                      headers={"Authorization": f"token {token}",
                               "Content-Type": "application/json"})
        with urlopen(req, timeout=120) as r:
            return r.status

    began = time.monotonic()
    messages = []
    with ThreadPoolExecutor(1) as pool:
        started = pool.submit(post)  # the hub answers once started, or after 10 s
        req = Request(f"{demo['url']}/hub/api/users/{user}/server/progress",
                      headers={"Authorization": f"token {token}"})
        while not messages:  # the progress stream, as the spawn page follows it
            try:
                with urlopen(req, timeout=300) as r:
                    for line in r:
                        if line.startswith(b"data:"):
                            event = json.loads(line[5:])
                            messages.append(event.get("message", ""))
                            if event.get("ready") or event.get("failed"):
                                break
            except HTTPError:  # not pending yet
                time.sleep(0.1)
        assert started.result() in (201, 202)
    while not _server_ready(demo, user, token):
        assert time.monotonic() - began < 300, messages
        time.sleep(0.2)
    return time.monotonic() - began, messages


def _stop_server(demo, user: str, token: str) -> None:
    req = Request(f"{demo['url']}/hub/api/users/{user}/server", method="DELETE",
                  headers={"Authorization": f"token {token}"})
    with urlopen(req, timeout=60):
        pass
    deadline = time.monotonic() + 120
    while _pool(demo, "GET", "api/slices", token)[1].get("slices") or \
            _server_ready(demo, user, token):
        assert time.monotonic() < deadline, f"{user}'s server did not stop"
        time.sleep(0.5)


def test_a_notebook_takes_back_the_build_gpu_lent_to_a_train_job(demo):
    """One virtual pool: with the train pool full of borrowers, the build GPU (no slice on
    it) runs bob's next job; alice then starts her server: the spawn page says the GPU is
    being taken back, bob's job is preempted and requeued, and her server is up within the
    grace period (10 s here) + a cycle + the spawner's 2 s between asks + her spawn time
    without lending (measured first)."""
    tokens = {u: _token(demo, u) for u in ("alice", "bob")}
    if AS_ROOT:
        home = demo["homes"] / "bob"
        if not home.exists():
            home.mkdir(mode=0o700)
            entry = pwd.getpwnam("bob")
            os.chown(home, entry.pw_uid, entry.pw_gid)
    if _server_ready(demo, "alice", tokens["alice"]):
        _stop_server(demo, "alice", tokens["alice"])
    alone, _ = _start_server(demo, "alice", tokens["alice"])  # nothing to take back
    _stop_server(demo, "alice", tokens["alice"])
    sleep = "import time; time.sleep(600)"
    jobs = []

    def submit(gpus):
        status, job = _pool(demo, "POST", "api/jobs", tokens["bob"],
                            {"gpus": gpus, "source": sleep})
        assert status in (200, 201), job
        jobs.append(job["id"])
        return job["id"]

    def job(job_id):
        return _pool(demo, "GET", f"api/jobs/{job_id}", tokens["bob"])[1]

    def until(check, timeout=120):
        deadline = time.monotonic() + timeout
        while not check():
            assert time.monotonic() < deadline, [job(j) for j in jobs]
            time.sleep(0.5)

    try:
        for _ in range(4):
            submit(2)
        until(lambda: all(job(j)["state"] == "running" for j in jobs))
        lent = submit(1)
        until(lambda: job(lent)["state"] == "running")
        assert job(lent)["placement"] == {"sim-build-0/lent": 1}
        took, messages = _start_server(demo, "alice", tokens["alice"])
        said = [m for m in messages if "taking back gpu 0 of sim-build-0" in m.lower()]
        assert said, messages
        assert "lent to train jobs" in said[0] and "within 11 s" in said[0], said
        until(lambda: job(lent)["attempt"] == 2 and job(lent)["state"] == "pending")
        bound = 10 + 1 + 2 + alone
        print(f"alice's server: {alone:.1f} s alone, {took:.1f} s taking the GPU back "
              f"(bound {bound:.1f} s)")
        assert took <= bound + 3, (took, alone, messages)  # 3 s: a loaded machine
        [mine] = _pool(demo, "GET", "api/slices", tokens["alice"])[1]["slices"]
        assert (mine["node"], mine["gpu"]) == ("sim-build-0", 0)
    finally:
        for job_id in jobs:
            _pool(demo, "DELETE", f"api/jobs/{job_id}", tokens["bob"])


def test_the_demo_stops_soon_and_says_no_error(demo):
    hub, log = demo["hub"], demo["state"] / "hub.log"
    start = time.monotonic()
    hub.send_signal(signal.SIGTERM)
    hub.wait(60)
    took = time.monotonic() - start
    text = log.read_text()
    assert "was not released" not in text and "Traceback" not in text, text[-3000:]
    assert took < 20, f"the demo took {took:.1f} s to stop"
    # Her server shut its kernel down (not left it to notice its parent was gone).
    assert "Shutting down 1 kernel" in text and "Interrupted..." not in text, text[-3000:]
    assert not _processes_of(demo["hub_port"], "alice"), "alice's server outlived the hub"


def test_three_stops_with_a_server_and_its_panel_open_are_quick_and_quiet(demo):
    """Last (the demo above is stopped): three times, the demo is started again, alice's
    server is up with the GPU panel open and polling, and Ctrl-C (SIGINT) stops it all
    without waiting out the spawner's 10 s interrupt timeout (a server that joined a thread
    stuck on a restarting pool took 12-13 s; a quiet machine stops in 2-5 s, a loaded one a
    little more), without a traceback or the proxy's 503s (the hub stops its services before
    its servers; the servers reach the pool straight, and retry without holding a thread)."""
    from playwright.sync_api import sync_playwright

    env, url = demo["env"], demo["url"]
    took, starts = [], []
    for round in range(3):
        log_path = demo["state"] / f"hub-stop-{round}.log"
        with open(log_path, "wb") as log:
            hub = subprocess.Popen([str(Path(sys.executable).with_name("jupyterhub")), "-f",
                                    "hub_config/jupyterhub_config.py"], cwd=REPO, env=env,
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                began = time.monotonic()
                _wait_for(url + "/services/gpushare/api/openapi.json", hub, demo["state"], 300)
                starts.append(time.monotonic() - began)
                with sync_playwright() as p:
                    browser = p.chromium.launch(executable_path=demo["browser"],
                                                args=CHROMIUM_ARGS)
                    page = browser.new_page(viewport={"width": 1280, "height": 800})
                    page.goto(url + "/hub/login")
                    page.fill("#username_input", "alice")
                    page.fill("#password_input", demo["password"])
                    page.click("#login_submit")
                    page.wait_for_url(re.compile(r".*/hub/spawn.*|.*/user/alice/.*"))
                    if "/hub/spawn" in page.url:
                        page.click("input[type=submit], button[type=submit]")
                    page.wait_for_url(re.compile(r".*/user/alice/lab.*"), timeout=180_000)
                    try:
                        status = page.locator(".jp-GpushareStatus").first
                        status.wait_for(timeout=120_000)
                        # The workspace kept from before opens a notebook, whose kernel
                        # dialog would stand in the way.
                        time.sleep(2)
                        while page.locator(".jp-Dialog").count():
                            page.keyboard.press("Escape")
                            time.sleep(0.5)
                        status.click()
                    finally:
                        ARTIFACTS.mkdir(parents=True, exist_ok=True)
                        page.screenshot(path=str(ARTIFACTS / f"stop-{round}.png"))
                    page.wait_for_selector("text=/quota/i", timeout=60_000)
                    time.sleep(4)  # the panel polls
                    began = time.monotonic()
                    hub.send_signal(signal.SIGINT)
                    hub.wait(60)
                    took.append(time.monotonic() - began)
                    browser.close()
            finally:
                _stop(hub, int(url.rsplit(":", 1)[1]), demo["hub_port"])
        text = log_path.read_text(errors="replace")
        assert "Traceback" not in text, text[-3000:]
        # a start again reuses the notebook environment: nothing is reinstalled
        assert "updating jupyter-gpushare" not in text and "building the notebook" not in text
        assert not re.search(r"\b503 (GET|POST|PATCH|DELETE)", text), text[-3000:]
        assert not _processes_of(demo["hub_port"], "alice"), "alice's server outlived the hub"
    said = (f"the starts took {', '.join(f'{t:.1f}' for t in starts)} s, the stops "
            f"{', '.join(f'{t:.1f}' for t in took)} s")
    print(said)
    assert max(took) < 10, said

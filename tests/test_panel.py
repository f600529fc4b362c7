"""The %gpushare panel: what it shows, as pure functions of the pool's JSON; the real widget
against the real pool behind a real JupyterHub (its values, refreshing by itself, the cancel
and logs buttons, an unreachable pool); and the widget in a real kernel, stopping when the
front end closes it."""

import json
import queue
import re
import textwrap
import time

import pytest

from hubtest import free_port, running_hub
from jupyter_gpushare.client import PoolClient
from jupyter_gpushare.notebook.panel import (COLUMNS, Panel, bar_html, details_html, elapsed,
                                             job_rows, project_bars, server_url, slice_html,
                                             slice_use, slice_view, state_html, status_html,
                                             use_html)
from jupyter_gpushare.notebook.watchdog import BuildSlice
from jupyter_gpushare.text import clock_time

POOL_CONFIG = """
c = get_config()
c.PoolService.projects = {"vision": {"quota": 2, "groups": ["vision"]},
                          "nlp": {"quota": 1, "groups": ["nlp"], "limit": 3}}
c.PoolService.cycle_interval = 0.2
c.PoolService.grace_period = 2
c.LocalBackend.simulate_gpus = True
c.LocalBackend.simulated_nodes = 1
c.LocalBackend.simulated_gpus_per_node = 4
c.LocalBackend.env_keep = ["LANG", "LC_ALL"]
"""


# -- pure: what the panel shows ----------------------------------------------------------------

def test_elapsed_in_the_one_duration_format():
    now = 1000.0
    assert elapsed({"state": "pending", "submitted": 930}, now) == "1m 10s"
    assert elapsed({"state": "running", "submitted": 0, "started": 995}, now) == "5s"
    assert elapsed({"state": "succeeded", "started": 10, "finished": 7510}, now) == "2h 05m"
    assert elapsed({"state": "cancelled", "started": None, "finished": 70}, now) == "–"


def test_job_rows():
    jobs = [{"id": "j-2", "name": "", "state": "pending", "gpus": 4.0, "queue_position": 1,
             "reason": "waiting for 4 GPUs on one node", "attempt": 2, "submitted": 990},
            {"id": "j-1", "name": "resnet", "state": "failed", "gpus": 1.0,
             "queue_position": None, "reason": "exit code 1", "attempt": 1, "started": 0,
             "finished": 3600}]
    none = {"text": "", "idle": "", "spark": []}
    assert job_rows(jobs, 1000.0) == [
        {"id": "j-2", "name": "j-2", "state": "pending", "gpus": "4", "position": "1",
         "reason": "waiting for 4 GPUs on one node", "elapsed": "10s", "attempt": "2",
         "active": True, "ranks": 1, "use": none, "lent": ""},
        {"id": "j-1", "name": "resnet", "state": "failed", "gpus": "1", "position": "",
         "reason": "exit code 1", "elapsed": "1h", "attempt": "1", "active": False,
         "ranks": 1, "use": none, "lent": ""}]
    pending, failed = job_rows(jobs, 1000.0)
    # the queue position and a requeue's attempt go with the state, in muted words
    assert state_html(pending) == (
        '<span style="color:var(--jp-warn-color1, #b26a00)">pending</span> <span style='
        '"color:var(--jp-ui-font-color2, #616161)">#1, attempt 2</span>')
    assert state_html(failed) == \
        '<span style="color:var(--jp-error-color1, #c62828)">failed</span>'
    assert details_html(pending) == "waiting for 4 GPUs on one node"


def test_a_job_on_lent_build_gpus_says_so_and_what_may_happen():
    job = {"id": "j-3", "state": "running", "gpus": 1.0, "attempt": 1, "started": 0,
           "placement": {"build-0/lent": 1.0}, "reason": ""}
    [row] = job_rows([job], 10.0)
    said = ("on build GPUs of build-0 lent to the train pool: a notebook may take them back "
            "(the job is then requeued, to start again from its last checkpoint)")
    assert row["lent"] == said
    assert details_html(row).endswith(f">· {said}</span>")
    assert job_rows([{**job, "placement": 3}], 10.0)[0]["lent"] == ""
    assert job_rows([{**job, "placement": {"train-0": 1.0}}], 10.0)[0]["lent"] == ""
    assert job_rows([{**job, "state": "pending"}], 10.0)[0]["lent"] == ""


NOW = 1_800_000_030.0  # 30 s into a minute
USAGE = {"sm_now": 0.93, "memory_now_bytes": 11 * 2**30, "sm_last_hour": 0.88,
         "memory_peak_last_hour_bytes": 12 * 2**30, "idle_for_s": None, "idle": False,
         "at": NOW, "minutes": [[NOW // 60 * 60 - 120, 0.8, 0], [NOW // 60 * 60, 0.95, 0]]}


def test_a_running_jobs_gpu_use_now_over_the_last_hour_and_idle():
    [row] = job_rows([{"id": "j-3", "state": "running", "started": NOW - 60, "usage": USAGE}],
                     NOW)
    assert row["use"] == {"text": "SM 93% (1h 88%), 11 GiB", "idle": "",
                          "spark": [None] * 57 + [0.8, None, 0.95]}
    assert use_html(row["use"]) == (
        '<svg class="gpushare-spark" width="48" height="14" viewBox="0 0 48 14" role="img" '
        'aria-label="SM utilization, last hour"><title>SM utilization, last hour</title><line '
        'x1="0" y1="13.5" x2="48" y2="13.5" stroke="#c8c8c8" stroke-width="1"/><circle '
        'cx="45" cy="3.7" r="1" fill="#0072b2"/><circle cx="46.5" cy="2.1" r="1" '
        'fill="#0072b2"/><circle cx="46.5" cy="2.1" r="2" fill="#0072b2"/></svg> SM 93% '
        '(1h 88%), 11 GiB')
    idle = {**USAGE, "sm_now": 0.0, "idle_for_s": 1500, "minutes": []}
    [row] = job_rows([{"id": "j-4", "state": "running", "usage": idle}], NOW)
    assert row["use"] == {"text": "SM 0% (1h 88%), 11 GiB", "idle": "idle 25m",
                          "spark": [None] * 60}
    assert use_html(row["use"]).endswith(
        'SM 0% (1h 88%), 11 GiB <span style="background:var(--jp-warn-color3, #ffe0b2);'
        'color:var(--jp-warn-color0, #8a4600);border-radius:7px;padding:0 5px">idle 25m</span>')
    # a running job's details: its use, then the pool's words
    assert details_html({**row, "reason": "preempting"}).endswith(
        'idle 25m</span> <span style="color:var(--jp-ui-font-color2, #616161)">· preempting'
        '</span>')
    # a slice or job just started shows no use yet: no idle flag before five minutes of it
    for seconds, flag in ((55, ""), (299, ""), (300, "idle 5m"), (7500, "idle 2h 05m")):
        [row] = job_rows([{"id": "j-6", "state": "running",
                           "usage": {**idle, "idle_for_s": seconds}}], NOW)
        assert row["use"]["idle"] == flag, seconds
    [row] = job_rows([{"id": "j-5", "state": "running", "usage": None}], NOW)
    assert row["use"] == {"text": "not measured yet", "idle": "", "spark": []}


def test_the_slice_as_the_pool_sees_it_and_the_culling_warning():
    at = clock_time(NOW + 480)  # by the kernel's clock (test_text.py)
    assert slice_use(None, NOW) is None and slice_use({"pool": None}, NOW) is None
    cull = {"warned_at": NOW - 60, "cull_at": NOW + 480,
            "reason": "no GPU use and no activity for 31m; it will be stopped in 10m unless "
                      "used"}
    use = slice_use({"pool": {"id": "s-1", "usage": {**USAGE, "idle_for_s": 1860},
                              "cull": cull}}, NOW)
    assert use == {"text": "SM 93% (1h 88%), 11 GiB", "idle": "idle 31m",
                   "spark": [None] * 57 + [0.8, None, 0.95],
                   "warning": f"This server will be stopped at {at} (in 8m): its slice has "
                              "shown no GPU use and the hub no activity from it. Use it (run a "
                              "cell) to keep it.", "reason": cull["reason"]}
    drawn = slice_html(slice_view(BuildSlice(0.25), None), use)
    assert drawn.startswith("<div>Build slice: ¼ GPU.</div><div>GPU use: <svg ")
    assert drawn.endswith(
        '<div role="alert" title="no GPU use and no activity for 31m; it will be stopped in '
        '10m unless used" style="color:#fff;background:var(--jp-error-color1, #c62828);'
        f'padding:2px 6px;border-radius:3px">This server will be stopped at {at} (in 8m): its '
        'slice has shown no GPU use and the hub no activity from it. Use it (run a cell) to '
        'keep it.</div>')
    quiet = slice_use({"pool": {"id": "s-1", "usage": None, "cull": None}}, NOW)
    assert quiet["warning"] is None and "role=" not in slice_html(
        slice_view(BuildSlice(0.25), None), quiet)


def test_project_bars_say_guaranteed_in_use_and_borrowed():
    quota = {"projects": [
        {"name": "vision", "quota": 2.0, "in_use": 3.0, "borrowed": 1.0, "pending": 2,
         "limit": None},
        {"name": "nlp", "quota": 1.0, "in_use": 0.0, "borrowed": 0.0, "pending": 0, "limit": 3.0},
    ]}
    vision, nlp = project_bars(quota, capacity=4)
    assert vision == {"name": "vision", "quota": 2.0, "in_use": 3.0, "borrowed": 1.0,
                      "scale": 4, "text": "vision: 3 of 2 guaranteed GPUs in use, 1 borrowed "
                                          "beyond the quota, 2 waiting"}
    assert nlp["text"] == "nlp: 0 of 1 guaranteed GPUs in use (at most 3)"
    drawn = bar_html(vision)
    # within the quota 2/4, borrowed 1/4 after it, the quota's mark at 2/4
    # in use within the quota in the brand colour, as the JupyterLab panel draws it
    assert "width:50.0%;height:100%;background:var(--jp-brand-color1, #1976d2)" in drawn
    assert "left:50.0%;width:25.0%" in drawn and "left:50.0%;width:2px" in drawn
    assert project_bars({"projects": [dict(quota["projects"][0])]})[0]["scale"] == 3.0


def test_project_bars_name_the_department_and_draw_it_too():
    quota = {"projects": [{"name": "vision", "quota": 2.0, "in_use": 3.0, "borrowed": 1.0,
                           "pending": 0, "limit": None, "department": "research"}],
             "departments": [{"name": "research", "quota": 4.0, "in_use": 5.0, "borrowed": 1.0,
                              "limit": 6.0, "projects": ["nlp", "vision"], "deserved": 5.0}]}
    vision, research = project_bars(quota, capacity=8)
    assert vision["text"] == ("vision (research): 3 of 2 guaranteed GPUs in use, 1 borrowed "
                              "beyond the quota")
    assert research["name"] == "department research"
    assert research["text"] == ("department research: 5 GPUs in use by its projects (nlp, "
                                "vision), quota 4, 1 borrowed beyond the quota (at most 6)")
    # a job on a lent build GPU is in use and borrowed, and said so
    (bob,) = project_bars({"projects": [{"name": "nlp", "quota": 2.0, "in_use": 9.0,
                                         "borrowed": 7.0, "lent": 1.0, "pending": 0}]})
    assert bob["text"] == ("nlp: 9 of 2 guaranteed GPUs in use, 7 borrowed beyond the quota "
                           "(1 on lent build GPUs)")
    assert (bob["in_use"], bob["borrowed"]) == (9.0, 7.0)


def test_slice_view():
    quarter = BuildSlice(0.25, "GPU-a", "pinned")
    report = {"over": True, "used": 5 * 2**30, "limit": 4 * 2**30, "problem": None,
              "message": "This server's processes use 5.0 GiB of GPU memory, more than …"}
    assert slice_view(quarter, {"watchdog": report}) == {
        "text": "Build slice: ¼ GPU of GPU-a. This server's processes use 5.0 GiB of GPU "
                "memory, more than …", "over": True, "fraction": 1.0}
    assert slice_view(quarter, None) == {"text": "Build slice: ¼ GPU of GPU-a.",
                                         "fraction": None, "over": False}
    assert slice_view(BuildSlice(0.5), {"watchdog": None, "watchdog_off": "Watchdog off."}) == \
        {"text": "Build slice: ½ GPU. Watchdog off.", "fraction": None, "over": False}
    assert slice_view(None, None)["text"] == "No build slice: this server has no GPU of its own."
    # The demo's simulated GPU: no NVML sentence, since there is no device to read
    simulated = BuildSlice(0.25, "GPU-SIMULATED-sim-build-0-0", "pinned")
    assert slice_view(simulated, {"watchdog": None, "watchdog_off": "NVML Shared Library Not "
                                  "Found"})["text"] == (
        "Build slice: ¼ GPU of GPU-SIMULATED-sim-build-0-0. The GPU is simulated (this machine "
        "has none): no GPU memory to watch.")
    assert slice_view(None, None, "GPUSHARE_SLICE_GPUS must be …")["text"] == \
        "GPUSHARE_SLICE_GPUS must be …"


def test_status_line_and_server_address():
    assert status_html("the pool service at http://h/ cannot be reached (connection refused); "
                       "is JupyterHub running?", 5) == (
        '<span style="color:var(--jp-error-color1, #c62828)">The pool service at http://h/ '
        'cannot be reached (connection refused); is JupyterHub running? Trying again every '
        '5 s.</span>')
    assert server_url({}) is None
    assert server_url({"JUPYTERHUB_SERVICE_URL": "http://:8888/user/alice/"}) == \
        "http://127.0.0.1:8888/user/alice/gpushare/"
    assert server_url({"JUPYTERHUB_SERVICE_URL": "https://10.0.0.5:8888/user/a%40b"}) == \
        "https://10.0.0.5:8888/user/a%40b/gpushare/"


# -- the widget against a real pool -------------------------------------------------------------

@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    with running_hub(tmp_path_factory.mktemp("hub"), {"vision": ["alice"], "nlp": ["bob"]},
                     POOL_CONFIG) as hub:
        yield hub


@pytest.fixture
def alice(hub):
    return PoolClient(hub.pool_url, hub.token("alice"))


@pytest.fixture
def panel(alice, monkeypatch):
    monkeypatch.delenv("GPUSHARE_SLICE_GPUS", raising=False)
    panel = Panel(client=alice, interval=0.2, server=None)
    yield panel
    panel.close()


def submit(hub, user, **spec):
    status, job = hub.api("POST", "api/jobs", user, spec)
    assert status == 201, job
    return job


def wait_for(condition, timeout=15, what="the condition"):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen in {timeout} s"
        time.sleep(0.05)


def table(panel):
    """The job table as text: one tuple of cell values per row."""
    return [tuple(cell.value for cell in row.cells.values()) for row in panel.rows]


def test_with_no_jobs_the_panel_says_how_to_send_one(hub, monkeypatch):
    monkeypatch.delenv("GPUSHARE_SLICE_GPUS", raising=False)
    panel = Panel(client=PoolClient(hub.pool_url, hub.token("bob")), server=None)
    try:
        assert panel.refresh()
        [empty] = panel.jobs_box.children
        assert empty.value == ("No jobs yet: send one with %%train in a notebook cell, or "
                               "gpushare submit --gpus 1 -- python train.py in a terminal.")
        assert re.fullmatch(r'<span title="\d\d:\d\d:\d\d">Updated just now\.</span>',
                            panel.status.value)
    finally:
        panel.close()


def test_the_panel_shows_quota_and_jobs_and_its_buttons_act_in_the_pool(hub, panel):
    job = submit(hub, "alice", gpus=1, name="shown", source="import time\nprint('hello from "
                 "the job', flush=True)\ntime.sleep(60)")
    hub.wait_job("alice", job["id"], ("running",))
    assert panel.refresh()
    [bar] = panel.quota_box.children
    assert "vision: 1 of 2 guaranteed GPUs in use" in bar.value
    assert panel.slice_line.value == "<div>No build slice: this server has no GPU of its own.</div>"
    [row] = [r for r in panel.rows if "shown" in r.cells["name"].value]
    name, state, gpus, spent, details = row.cells.values()
    assert row.rank.layout.display == "none"  # one rank: no rank to choose
    assert (name.value, gpus.value) == ('<div class="gpushare-cut" title="shown">shown</div>', "1")
    assert "running" in state.value and re.fullmatch(r"\d+s", spent.value)
    # One table: the titles and every row's cells and buttons in one grid, so they scroll
    # as one; the last track, the buttons', never gives way.
    assert panel.jobs_box.children == (panel.table,)
    assert "gpushare-jobs" in panel.table._dom_classes
    assert [re.sub("<[^>]*>", "", h.value) for h in panel.table.children[:6]] == [
        "Job", "State", "GPUs", "Time", "Details", ""]
    assert panel.table.children[6:] == tuple(w for r in panel.rows for w in r.widgets)
    assert row.widgets[-1].children[:2] == (row.logs, row.cancel)
    assert panel.table.layout.grid_template_columns.split(" ")[-1] == "max-content"
    assert len(panel.table.children) == (len(COLUMNS) + 1) * (1 + len(panel.rows))
    # its GPU use as the NVML stand-in plays the simulated GPUs (nothing runs kernels on them)
    wait_for(lambda: panel.refresh() and "SM 0%" in details.value, what="the job's GPU use")
    assert '<svg class="gpushare-spark"' in details.value and "0 MiB" in details.value
    assert not row.cancel.disabled
    # logs: the job's output in the panel's output area
    wait_for(lambda: "hello" in hub.api("GET", f"api/jobs/{job['id']}/logs", "alice")[1])
    row.logs.click()
    [out] = panel.logs.outputs
    assert out["text"] == f"── logs of job {job['id']} ──\nhello from the job\n"
    # cancel: the pool cancels it, and the row says so
    row.cancel.click()
    hub.wait_job("alice", job["id"], ("cancelled",))
    wait_for(lambda: panel.refresh() and "cancelled" in state.value)
    assert row.cancel.disabled and "SM" not in details.value  # ended: no GPU use


def test_the_logs_of_each_rank_of_a_distributed_job(hub, panel):
    job = submit(hub, "alice", gpus=2, per_gpu=True, name="ranks",
                 source="import os\nprint('I am rank', os.environ['RANK'])\n")
    hub.wait_job("alice", job["id"], ("succeeded",))
    assert panel.refresh()
    [row] = [r for r in panel.rows if "ranks" in r.cells["name"].value]
    logs, rank = row.logs, row.rank
    assert rank.layout.display is None and rank.options == (("rank 0", 0), ("rank 1", 1))
    rank.value = 1
    logs.click()
    [out] = panel.logs.outputs
    assert out["text"] == f"── logs of job {job['id']}, rank 1 ──\nI am rank 1\n"


def test_the_panel_refreshes_by_itself_until_closed(hub, alice):
    panel = Panel(client=alice, interval=0.2, server=None)
    panel.start()
    wait_for(lambda: panel.refreshes >= 1)
    job = submit(hub, "alice", gpus=1, name="arrives-later", source="print(1)")
    wait_for(lambda: any("arrives-later" in r[0] for r in table(panel)), what="a new job shown")
    hub.wait_job("alice", job["id"], ("succeeded",))
    wait_for(lambda: any("succeeded" in r[1] for r in table(panel) if "arrives-later" in r[0]))
    panel.close()
    wait_for(lambda: not panel.running, timeout=5, what="the thread's end")
    count = panel.refreshes
    submit(hub, "alice", gpus=1, name="after-close", source="print(1)")
    time.sleep(0.6)
    assert panel.refreshes == count


def test_the_front_end_closing_the_widget_stops_it(alice):
    panel = Panel(client=alice, interval=0.2, server=None)
    panel.start()
    wait_for(lambda: panel.refreshes >= 1)
    panel.comm.handle_close({"content": {"comm_id": panel.model_id, "data": {}}})
    wait_for(lambda: not panel.running, timeout=5, what="the thread's end")
    panel.close()


def test_an_unreachable_pool_is_one_line_and_the_panel_keeps_trying(hub, alice):
    down = PoolClient(f"http://127.0.0.1:{free_port()}/services/gpushare/", "t0ken")
    panel = Panel(client=down, interval=0.1, server=None)
    try:
        assert panel.refresh() is False
        assert panel.status.value == (
            f'<span style="color:var(--jp-error-color1, #c62828)">The pool service at '
            f'{down.url} cannot be reached (connection refused); is JupyterHub running and the '
            f'URL right? Trying again every 0.1 s.</span>')
        panel.start()
        time.sleep(0.3)
        assert panel.running and panel.refreshes == 0
        panel.client = alice  # the pool is back
        wait_for(lambda: panel.refreshes >= 1, what="recovery")
        assert "Updated just now." in panel.status.value
    finally:
        panel.close()


def test_a_refused_cancel_is_said_in_the_status_line(hub, panel):
    job = submit(hub, "alice", gpus=1, source="print(1)")
    hub.wait_job("alice", job["id"], ("succeeded",))
    panel.cancel(job["id"])
    assert f"Job {job['id']} has already ended (succeeded). Trying again" in panel.status.value


# -- in a real kernel ------------------------------------------------------------------------------

def test_in_a_kernel_it_updates_the_front_end_and_stops_when_the_front_end_closes_it(hub):
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        code = textwrap.dedent(f"""
            from IPython.display import display
            from jupyter_gpushare.client import PoolClient
            from jupyter_gpushare.notebook.panel import Panel
            p = Panel(client=PoolClient({hub.pool_url!r}, {hub.token('alice')!r}),
                      interval=0.2, server=None)
            display(p)
            print(p.model_id)
        """)
        reply = kc.execute_interactive(code, timeout=60, output_hook=lambda m: None)
        assert reply["content"]["status"] == "ok"
        kc.execute("print(p.model_id)")
        panel_id = _stdout(kc).strip()
        # the refresh thread sends updates: a job submitted now reaches the front end
        submit(hub, "alice", gpus=1, name="seen-in-kernel", source="print(1)")
        _wait_for_update(kc, "seen-in-kernel")
        # the front end closes the panel's comm: the kernel stops refreshing
        msg = kc.session.msg("comm_close", {"comm_id": panel_id, "data": {}})
        kc.shell_channel.send(msg)
        kc.execute("import time; time.sleep(0.6); print(p.running)")
        assert _stdout(kc).strip() == "False"
        _drain(kc)
        time.sleep(0.6)
        assert [m for m in _drain(kc) if m["msg_type"] == "comm_msg"] == []
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def _stdout(kc, timeout=30):
    text, deadline = "", time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = kc.get_iopub_msg(timeout=1)
        except queue.Empty:
            continue
        if msg["msg_type"] == "stream":
            text += msg["content"]["text"]
        if msg["msg_type"] == "error":
            raise AssertionError("\n".join(msg["content"]["traceback"]))
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle" and text:
            return text
    raise TimeoutError("no output from the kernel")


def _wait_for_update(kc, text, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = kc.get_iopub_msg(timeout=1)
        except queue.Empty:
            continue
        if msg["msg_type"] == "comm_msg" and text in json.dumps(msg["content"]["data"]):
            return
    raise TimeoutError(f"the front end never got {text!r}")


def _drain(kc):
    msgs = []
    while True:
        try:
            msgs.append(kc.get_iopub_msg(timeout=0.2))
        except queue.Empty:
            return msgs

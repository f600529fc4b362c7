"""The admin's console over the pool's past: showback (``gpushare usage --step``), the history
(``api/history``) in the trace format, and what-if replays (``gpushare simulate --from-pool``,
``api/whatif``) that decide with the pool's own policy code.

The end-to-end part runs a real hub and pool service with a compressed "hour" of many short
jobs of two projects, some of them queueing, and checks that replaying the recorded history
under the pool's own settings gives back what happened."""

import asyncio
import csv
import io
import json
import math
import random
import re
import signal
import sys
import time
from datetime import date, timedelta
from pathlib import Path
from types import SimpleNamespace as Row

import pytest

from jupyter_gpushare.cli import main
from jupyter_gpushare.policy.model import DEFAULT_MIN_RUNTIME_S, GPU, Node, PolicyConfig, Project
from jupyter_gpushare.policy.settings import PoolSettings
from jupyter_gpushare.pool.web.api_history import history_query, whatif_request
from jupyter_gpushare.pool.whatif.runner import Busy, WhatIfRunner
from jupyter_gpushare.sim import history
from jupyter_gpushare.sim.history import (BadChange, Settings, changed_settings, check_capacity,
                                          history_entry, quota_changes, with_capacity)
from jupyter_gpushare.sim.trace import read_trace
from jupyter_gpushare.usage.showback import parse_date, periods, showback_rows
from jupyter_gpushare.validate import Invalid

# -- pure parts ------------------------------------------------------------------------------


def test_calendar_periods_cut_at_months_weeks_and_days():
    assert periods(date(2026, 10, 1), date(2026, 12, 1), "month") == [
        ("2026-10-01", "2026-11-01"), ("2026-11-01", "2026-12-01")]
    assert periods(date(2026, 12, 15), date(2027, 1, 10), "month") == [
        ("2026-12-15", "2027-01-01"), ("2027-01-01", "2027-01-10")]
    assert periods(date(2026, 11, 25), date(2026, 12, 3), "week") == [  # Wed → Mon
        ("2026-11-25", "2026-11-30"), ("2026-11-30", "2026-12-03")]
    assert len(periods(date(2026, 11, 1), date(2026, 11, 4), "day")) == 3


@pytest.mark.parametrize("text, words", [("7d", "must be a date like 2026-10-01"),
                                         ("2026-02-30", "is not a day of the calendar")])
def test_showback_needs_dates(text, words):
    with pytest.raises(ValueError, match=words):
        parse_date(text, "--since")


def test_showback_rows_carry_the_apis_seconds():
    answer = {"rows": [{"project": "vision", "allocated_gpu_seconds": 7200.5,
                        "utilized_gpu_seconds": 3600.0, "idle_gpu_seconds": 10.0,
                        "allocation": 0.5, "utilization": 0.5, "idle_ratio": 0.001}]}
    row, = showback_rows(answer, "project", ("2026-10-01", "2026-11-01"))
    assert row["allocated_gpu_seconds"] == 7200.5 and row["allocated_gpu_hours"] == 2.0001
    assert row["period_start"] == "2026-10-01" and row["project"] == "vision"


def _attempt(n, started, ended):
    return Row(attempt=n, started=started, ended=ended)


def test_a_recorded_job_as_a_trace_line():
    job = Row(id="j-1", submitted=1000.0, gpus=2 * GPU, project="vision", user="alice",
              priority=0, state="succeeded")
    # preempted after 4000 s (3 checkpoints of 1800 s... minus the grace: 2 saved), then ran 600 s
    e = history_entry(job, [_attempt(1, 1010.0, 5010.0), _attempt(2, 5100.0, 5700.0)], 0.8,
                      since=500.0, now=9999.0, grace_s=30.0)
    assert e["submit_time"] == 500.0 and e["gpus"] == 2 and e["held_s"] == 4600.0
    assert e["duration"] == 600.0 + 3600.0  # what the simulator's checkpoints would have saved
    assert e["queued_s"] == 10.0 + 90.0 and e["end_s"] == 4700.0 and e["utilization"] == 0.8
    assert history_entry(job, [], None, 0.0, 9999.0) is None  # never ran: no line


@pytest.mark.parametrize("text, ok", [("+8", "+8"), ("-4", "-4"), ("64", "64"), (None, None)])
def test_capacity_changes(text, ok):
    assert check_capacity(text) == ok


@pytest.mark.parametrize("text", ["8.5", "lots", "+", "++8"])
def test_bad_capacity_is_one_sentence(text):
    with pytest.raises(BadChange, match="capacity must be"):
        check_capacity(text)


def test_changed_settings_are_checked_as_the_pool_checks_them():
    today = Settings((Node("n0", 8), Node("n1", 8)), (Project("a", 8 * GPU), Project("b", 4 * GPU)))
    assert with_capacity(today, "+8").capacity == 24
    assert with_capacity(today, "12").capacity == 12
    with pytest.raises(BadChange, match="the quotas add up to 12 GPUs but the pool would have 8"):
        changed_settings(today, "8", {})
    with pytest.raises(BadChange, match="leaves -4 GPUs"):
        changed_settings(today, "-20", {})
    assert {p.name: p.quota for p in changed_settings(today, None, {"b": 8 * GPU}).projects} \
        == {"a": 8 * GPU, "b": 8 * GPU}
    with pytest.raises(BadChange, match="the quota of b must be a number"):
        quota_changes({"b": "four"})


def test_a_capacity_change_is_bounded_to_ten_times_todays_gpus():
    today = Settings((Node("n0", 8), Node("n1", 8)), ())
    assert changed_settings(today, "+144", {}).capacity == 160
    assert changed_settings(today, "160", {}).capacity == 160
    for change in ("+145", "161", "+999999"):
        with pytest.raises(BadChange, match=re.escape(
                "more than 10 times its 16; ask for at most +144 (or 160 in all)")):
            changed_settings(today, change, {})


def test_the_capacity_changes_set_up_is_linear_in_the_change():
    """Counted, not timed: the lines of ``sim/history.py`` that a change ten times larger runs
    (a set-up that summed the nodes again for each node it added ran a hundred times more)."""
    def lines(today, change):
        count = 0

        def trace(frame, event, arg):
            nonlocal count
            if frame.f_code.co_filename != history.__file__:
                return None
            count += event == "line"
            return trace
        before = sys.gettrace()
        sys.settrace(trace)
        try:
            with_capacity(today, change)
        finally:
            sys.settrace(before)
        return count

    today = Settings((Node("n0", 8),), ())
    assert lines(today, "+8000") < 12 * lines(today, "+800")
    big = Settings(tuple(Node(f"n{i}", 8) for i in range(1000)), ())
    assert lines(big, "-7992") < 12 * lines(Settings(big.nodes[:100], ()), "-792")
    assert with_capacity(big, "-7996").nodes == (Node("n0", 4),)


@pytest.mark.parametrize("query, words", [
    ({"limit": "0"}, "limit must be a whole number from 1 to 10000"),
    ({"limit": "\u00b2"}, "limit must be a whole number from 1 to 10000"),  # isdigit() takes it
    ({"limit": "9" * 5000}, "limit must be a whole number from 1 to 10000"),
    ({"after": "../x"}, "after must be a job id"),
    ({"format": "xml"}, "format must be json or csv"),
    ({"since": "1d", "until": "2d"}, "since must be before until"),
    ({"colour": "red"}, "unknown parameter(s) colour")])
def test_bad_history_queries_are_one_sentence(query, words):
    with pytest.raises(Invalid, match=re.escape(words)):
        history_query(query, time.time())


@pytest.mark.parametrize("body, words", [
    ([], "the body must be a JSON object"), ({"capacity": "x"}, "capacity must be +K"),
    ({"capacity": "+\u00b2"}, "capacity must be +K"),
    ({"since": 5}, "since must be a string"), ({"quotas": {"a": -1}}, "the quota of a"),
    ({"speed": 1}, "unknown field(s) speed")])
def test_bad_whatif_requests_are_one_sentence(body, words):
    with pytest.raises(Invalid, match=re.escape(words)):
        whatif_request(body, time.time())


def test_one_whatif_at_a_time():
    async def go():
        runner = WhatIfRunner()
        never = asyncio.Event()

        async def gather():
            await never.wait()

        first = runner.start({}, gather)
        with pytest.raises(Busy, match="a what-if is already running"):
            runner.start({}, gather)
        assert runner.get(first.id).json()["state"] == "replaying"
    asyncio.run(go())


def killed(worker) -> bool:
    """The worker ended by SIGKILL: -9, or 255, asyncio's return code for a child whose
    status another waitpid in the test process took first (seen once in a loaded run)."""
    return worker.returncode in (-signal.SIGKILL, 255)


class StuckWorker(WhatIfRunner):
    """A what-if whose worker says 5 % and then never ends (as one of +999999 GPUs did)."""

    def command(self):
        return [sys.executable, "-c", "import time; print('{\"progress\": 0.05}', flush=True); "
                "time.sleep(600)"]


async def _at_five_percent(run):
    deadline = time.monotonic() + 30
    while run.progress < 0.05 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert run.progress == 0.05 and run.worker.returncode is None


async def _nothing():
    return {}


async def _ended(run):
    """Its task is over (one cancelled before it began ends cancelled, without a worker)."""
    done, _ = await asyncio.wait({run.task}, timeout=30)
    assert done


def test_a_whatif_past_its_timeout_is_stopped_and_its_worker_killed():
    async def go():
        runner = StuckWorker(timeout=1.0)
        run = runner.start({}, _nothing)
        await _at_five_percent(run)
        await _ended(run)
        assert run.state == "error" and run.finished is not None
        assert run.error.startswith("the replay timed out: it ran longer than the pool's "
                                    "what-if timeout (1 s, PoolService.whatif_timeout)")
        assert killed(run.worker)
        after = runner.start({}, _nothing)  # not Busy
        runner.cancel(after.id, "admin")
        await _ended(after)
    asyncio.run(go())


def test_a_cancelled_whatif_kills_its_worker_and_the_next_may_start():
    async def go():
        runner = StuckWorker()
        assert runner.timeout == 600
        run = runner.start({}, _nothing)
        await _at_five_percent(run)
        assert runner.cancel(run.id, "admin") is run
        assert run.json()["state"] == "stopped" and run.json()["progress"] == 0.05
        assert run.error == "admin cancelled it before it finished"
        await _ended(run)
        assert killed(run.worker)
        assert runner.cancel("w-0-0", "admin") is None
        after = runner.start({}, _nothing)  # not Busy
        assert runner.cancel(after.id, "admin").state == "stopped"
        await _ended(after)
        assert runner.cancel(after.id, "admin").error == "admin cancelled it before it finished"
    asyncio.run(go())


def test_the_worker_imports_the_installed_package_whatever_the_folder_and_pythonpath(
        tmp_path, monkeypatch):
    """Python's isolated mode (-I): a jupyter_gpushare planted in the service's current folder
    or on its PYTHONPATH is not what the worker runs."""
    planted = tmp_path / "jupyter_gpushare"
    planted.mkdir()
    (planted / "__init__.py").write_text("raise SystemExit('the planted package ran')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))

    async def gather():
        return {"history": [], "pool": {"nodes": [{"name": "n0", "gpus": 4}]},
                "projects": [], "knobs": {}, "capacity": "+4", "quotas": {}}

    async def go():
        run = WhatIfRunner().start({}, gather)
        deadline = time.monotonic() + 120
        while run.finished is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return run
    run = asyncio.run(go())
    assert run.state == "done", run.error
    assert run.result["settings"]["changed"]["capacity_gpus"] == 8


@pytest.mark.parametrize("args, words", [
    (["--from-pool", "--events", "x.jsonl"], "--events is for replaying a trace file"),
    (["--from-pool", "--policy", "fifo"], "leave out --policy"),
    (["--from-pool", "--capacity", "many"], "--capacity: must be a whole number"),
    (["--trace", "t.csv", "--capacity", "+8"], "--capacity +8 is a change, for --from-pool"),
    (["--from-pool", "--quotas", "proportional"], "--quotas proportional is for trace files"),
    (["--since", "30d", "--trace", "t.csv"], "--since is for --from-pool"),
    ([], "say what to replay")])
def test_simulate_arguments_get_one_sentence(capsys, args, words):
    try:
        code = main(["simulate", *args, "--url", "http://127.0.0.1:9/", "--token", "x"])
    except SystemExit as e:  # argparse's own refusal
        code = e.code
    assert code == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and err.count("\n") == 1


# -- a real pool --------------------------------------------------------------------------------

POOL_CONFIG = """
c = get_config()
c.PoolService.projects = {"vision": {"quota": 4, "groups": ["vision"]},
                          "nlp": {"quota": 4, "groups": ["nlp"]}}
c.PoolService.grace_period = 2
c.LocalBackend.simulate_gpus = True
c.LocalBackend.simulated_nodes = 2
c.LocalBackend.simulated_gpus_per_node = 4
c.LocalBackend.env_keep = ["LANG", "LC_ALL"]
c.GPUUsage.sample_interval = 0.5
c.GPUUsage.nvml_standin_script = "{dir}/standin.json"
"""
GROUPS = {"vision": ["alice"], "nlp": ["bob"]}
JOBS = 40


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    from hubtest import running_hub
    from jupyter_gpushare.usage.nvml_standin import write_script

    d = tmp_path_factory.mktemp("historyhub")
    write_script(d / "standin.json", {"processes": []})
    with running_hub(d, GROUPS, POOL_CONFIG.replace("{dir}", str(d)),
                     users=["alice", "bob", "admin"]) as hub:
        yield hub


@pytest.fixture(scope="module")
def hour(hub):
    """A compressed hour: 40 jobs of 2 to 6 s over 30 s on 8 GPUs, more than fit at once.

    Events never come closer than the pool's decision latency wavers: a submit and an end a
    few milliseconds apart are decided in one cycle or in two as the machine's load has it
    (and two submits alike), which no replay can know (docs/explanation/known-limits.md).
    So submits come on the wall clock's half seconds, one at a time, and each job ends a
    quarter second past one (its work rounded up to it); compressed 120 times, half a second
    is a minute of a real hour."""
    rng = random.Random(23)
    plan = sorted((rng.uniform(0, 30), rng.choice(("vision", "nlp")), rng.choice((1, 1, 2, 2, 3, 4)),
                   round(rng.uniform(2, 6), 1)) for _ in range(JOBS))
    for i in range(len(plan)):  # on the half seconds, one at a time
        at = round(plan[i][0] * 2) / 2
        plan[i] = (max(at, plan[i - 1][0] + 0.5) if i else at, *plan[i][1:])
    since = time.time() - 1
    start, ids = math.ceil(time.time() * 2) / 2 + 0.5, []
    for at, project, gpus, seconds in plan:
        time.sleep(max(0.0, start + at - time.time()))
        user = "alice" if project == "vision" else "bob"
        status, job = hub.api("POST", "api/jobs", user, {
            "project": project, "gpus": gpus, "source": (
                f"import math, time; end = math.ceil((time.time() + {seconds}) * 2) / 2 + 0.25; "
                f"time.sleep(max(0.0, end - time.time()))")})
        assert status == 201, job
        ids.append((user, job["id"]))
    for user, job_id in ids:
        hub.wait_job(user, job_id, ("succeeded", "failed"), timeout=180)
    time.sleep(1.5)  # the last readings of the jobs' GPUs
    return {"since": since, "until": time.time() + 1, "ids": [i for _, i in ids]}


def test_history_is_for_admins(hub, hour):
    status, body = hub.api("GET", "api/history", "alice")
    assert status == 403 and body["error"].startswith("only admins can read the pool's history")


def test_history_pages_and_csv_are_the_trace_format(hub, hour, tmp_path):
    window = f"since={hour['since']}&until={hour['until']}"
    status, body = hub.api("GET", f"api/history?{window}", "admin")
    assert status == 200, body
    assert sorted(e["job_id"] for e in body["jobs"]) == sorted(hour["ids"])
    assert body["next"] is None and body["settings"]["grace_period_s"] == 2
    assert all(e["duration"] >= 2 and e["attempts"] == 1 for e in body["jobs"])
    seen, after = [], ""
    while True:
        status, page = hub.api("GET", f"api/history?{window}&limit=15{after}", "admin")
        seen += [e["job_id"] for e in page["jobs"]]
        if not page["next"]:
            break
        after = f"&after={page['next']}"
    assert seen == [e["job_id"] for e in body["jobs"]]
    status, text = hub.api("GET", f"api/history?{window}&format=csv", "admin")
    assert status == 200
    (tmp_path / "h.csv").write_text(text)
    jobs = read_trace(tmp_path / "h.csv")  # the simulator reads it as it is
    assert len(jobs) == JOBS and {j.project for j in jobs} == {"vision", "nlp"}


def diverging(hub, hour) -> list:
    """The jobs whose replayed start differs from the recorded one, first first: what a
    failure of the test below is about."""
    from dataclasses import replace

    from jupyter_gpushare.sim.history import decision_latency, replay, settings_from, trace_jobs

    history = hub.api("GET", f"api/history?since={hour['since']}&until={hour['until']}",
                      "admin")[1]
    settings = replace(settings_from(hub.api("GET", "api/pool", "admin")[1],
                                     hub.api("GET", "api/projects", "admin")[1]["projects"],
                                     history["settings"]),
                       cycle_delay_s=decision_latency(history["jobs"]))
    run = replay(trace_jobs(history["jobs"]), settings)
    first = min(e["submitted"] for e in history["jobs"])
    out = []
    for e in sorted(history["jobs"], key=lambda e: e["submitted"]):
        r = run.records[e["job_id"]]
        if abs(r.queued_s - e["queued_s"]) > 0.3:
            out.append(f"{e['job_id']} {e['project']} {e['gpus']} GPUs submitted "
                       f"{e['submitted'] - first:.2f}, started {e['submitted'] - first + e['first_start_s']:.2f}, "
                       f"replayed {r.finish - r.trace.duration:.2f}")
    return f"decision latency {settings.cycle_delay_s}; " + "; ".join(out[:6])


def test_replaying_the_history_gives_back_what_happened(hub, hour, capsys):
    code = main(["simulate", "--from-pool", "--since", str(hour["since"]), "--until",
                 str(hour["until"]), "--capacity", "+8", "--json", "--url", hub.pool_url,
                 "--token", hub.token("admin")])
    out, err = capsys.readouterr()
    assert code == 0, err
    r = json.loads(out)
    recorded, today = r["recorded"], r["today"]
    assert recorded["queue_p95_s"] > 1, "the workload should have queued"
    for name in ("vision", "nlp"):
        rec, rep = recorded["per_project"][name], today["per_project"][name]
        assert abs(rec["allocation"] - rep["allocation"]) <= 0.02, (name, rec, rep)
        assert rep["queue_avg_s"] == pytest.approx(rec["queue_avg_s"], rel=0.10), \
            (name, rec["queue_avg_s"], rep["queue_avg_s"], diverging(hub, hour))
    assert r["changed"]["capacity_gpus"] == 16
    assert r["changed"]["queue_avg_s"] < today["queue_avg_s"]


def _replayed(hub, run: dict, timeout: float = 60) -> dict:
    """The what-if once it has replayed (its state ``done``)."""
    deadline = time.monotonic() + timeout
    while run["state"] == "replaying" and time.monotonic() < deadline:
        time.sleep(0.3)
        status, run = hub.api("GET", f"api/whatif/{run['id']}", "admin")
    assert run["state"] == "done", run
    return run


def test_the_whatif_api_runs_in_a_worker(hub, hour):
    status, run = hub.api("POST", "api/whatif", "alice", {"since": "1h"})
    assert status == 403
    status, run = hub.api("POST", "api/whatif", "admin", {
        "since": str(hour["since"]), "until": str(hour["until"]), "capacity": "+8",
        "quotas": {"nlp": 2}})
    assert status == 202, run
    run = _replayed(hub, run)
    assert run["progress"] == 1.0 and run["result"]["jobs"] == JOBS
    assert run["result"]["settings"]["changed"]["quotas"]["nlp"] == 2
    # it decided by all of the pool's settings, as api/history sends them, and says so
    status, page = hub.api("GET", f"api/history?since={hour['since']}&limit=1", "admin")
    assert page["settings"] == PoolSettings(
        grace_period_s=2.0, policy=PolicyConfig(min_runtime_s=DEFAULT_MIN_RUNTIME_S)).to_json()
    for name in ("today", "changed"):
        assert run["result"]["settings"][name]["replayed"] == page["settings"]
        assert run["result"]["settings"][name]["not_replayed"] == []
    status, body = hub.api("GET", "api/whatif/w-0-0", "admin")
    assert status == 404 and "there is no what-if" in body["error"]


def test_a_capacity_change_beyond_ten_times_the_pool_is_refused_in_one_sentence(hub, hour):
    """As it was found: this what-if sat at 5 % until its worker was killed, and no other could
    start until the service restarted."""
    status, body = hub.api("POST", "api/whatif", "admin", {"since": "1d", "capacity": "+999999"})
    assert status == 400, body
    assert body["error"] == ("capacity +999999 would give the pool 1000007 GPUs, more than 10 "
                             "times its 8; ask for at most +72 (or 80 in all)")
    status, body = hub.api("POST", "dashboard/whatif", "admin", {"capacity": "81"})
    assert status == 400 and body["error"].endswith("ask for at most +72 (or 80 in all)"), body


def _workers(hub) -> list[int]:
    """The pool service's what-if workers still running."""
    service, = hub.service_pids()
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == service and b"whatif_worker" in cmdline:
            found.append(int(stat.parent.name))
    return found


def test_an_admin_cancels_a_whatif_and_the_next_may_start(hub, hour):
    status, body = hub.api("DELETE", "api/whatif/w-0-0", "alice")
    assert status == 403 and body["error"] == "only admins can cancel what-if replays"
    status, body = hub.api("DELETE", "api/whatif/w-0-0", "admin")
    assert status == 404 and body["error"].startswith("there is no what-if w-0-0")
    window = {"since": str(hour["since"]), "until": str(hour["until"])}
    status, run = hub.api("POST", "api/whatif", "admin", {**window, "capacity": "+8"})
    assert status == 202, run
    assert hub.api("DELETE", f"api/whatif/{run['id']}", "alice")[0] == 403
    status, run = hub.api("DELETE", f"api/whatif/{run['id']}", "admin")
    assert status == 200 and run["state"] == "stopped", run
    assert run["error"] == "admin cancelled it before it finished"
    deadline = time.monotonic() + 10
    while _workers(hub) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _workers(hub) == []
    status, audit = hub.api("GET", "api/audit", "admin")
    entry = next(e for e in audit["entries"] if e["action"] == "cancel what-if")
    assert entry["target"] == run["id"] and entry["who"] == "admin"
    assert entry["after"] == {"state": "stopped"}
    status, again = hub.api("DELETE", f"api/whatif/{run['id']}", "admin")  # as it is
    assert status == 200 and again["state"] == "stopped"
    status, run = hub.api("POST", "api/whatif", "admin", window)
    assert status == 202, run
    run = _replayed(hub, run)


def test_showback_equals_api_usage_to_the_second(hub, hour, capsys):
    today = date.today()
    since, until = today.isoformat(), (today + timedelta(days=1)).isoformat()
    code = main(["usage", "--since", since, "--until", until, "--step", "month",
                 "--format", "csv", "--url", hub.pool_url, "--token", hub.token("admin")])
    out, err = capsys.readouterr()
    assert code == 0, err
    rows = {r["project"]: r for r in csv.DictReader(io.StringIO(out))}
    status, usage = hub.api("GET", f"api/usage?since={since}&until={until}&by=project",
                            "admin")
    assert status == 200
    assert set(rows) == {r["project"] for r in usage["rows"]} == {"vision", "nlp"}, (out, usage)
    for r in usage["rows"]:
        for f in ("allocated", "utilized", "idle"):
            assert float(rows[r["project"]][f"{f}_gpu_seconds"]) == r[f"{f}_gpu_seconds"]
        assert r["allocated_gpu_seconds"] > 0


def test_the_dashboard_offers_the_windows_csv_and_a_whatif_page(hub, hour):
    status, text = hub.api("GET", "dashboard/usage.csv?window=1h", "admin")
    assert status == 200 and text.startswith("project,allocated_gpu_hours"), text
    assert hub.api("GET", "dashboard/usage.csv?window=1h", "alice")[0] == 403
    status, page = hub.api("GET", "dashboard/whatif", "admin")
    assert status == 200 and 'data-project="vision"' in page
    status, run = hub.api("POST", "dashboard/whatif", "admin", {
        "since": str(hour["since"]), "until": str(hour["until"]), "capacity": "12"})
    assert status == 202, run
    status, body = hub.api("POST", "api/whatif", "admin", {"since": "1h"})
    assert status == 409 and body["error"].startswith("a what-if is already running"), body
    deadline = time.monotonic() + 60
    while run["state"] == "replaying" and time.monotonic() < deadline:
        time.sleep(0.3)
        status, run = hub.api("GET", f"api/whatif/{run['id']}", "admin")
    assert run["state"] == "done" and run["result"]["changed"]["capacity_gpus"] == 12, run
    status, page = hub.api("GET", f"dashboard/whatif?run={run['id']}", "admin")
    assert status == 200 and "Replayed, changed settings" in page
    status, body = hub.api("POST", "dashboard/whatif", "admin", {"capacity": "lots"})
    assert status == 400 and body["error"].startswith("capacity must be +K"), body

"""The what-if replays every setting that decides, as the pool decided with it on:
``reclaim_fair_share``, departments, consolidation (moves) and lent build GPUs.

The pure part checks how a build session is read back from what the pool keeps of it
(usage rows, the slices held now, the audit trail's take-backs) and that what ``api/history``
sends of the build pool is checked. The end-to-end part runs, for each setting, a real hub
and pool service with that setting on and a short compressed workload that the setting
changes (asserted: a fair-share preemption, a department's limit, a move, a job on a lent
build GPU and a take-back), then replays the recorded history (``gpushare simulate
--from-pool``, and ``api/whatif`` in its worker process) and checks that the replay gives
back the recorded allocation and queueing within the tolerances of the replay with these
settings off (tests/test_history.py), and says it replayed the setting.

Timing: as in test_history.py's ``hour``, no two events the replay cannot order come close.
Submits and a notebook's slices are on the wall clock's half seconds, each job ends a quarter
second past one (its work rounded up to it), and the grace period is 2.125 s, so a job
stopped by a submit's cycle or an end's is killed an eighth of a second off both. A job
ignores SIGTERM, so a preempted one holds its GPUs for the whole grace period, as the
simulator's model of a job that checkpoints has it.
"""

import json
import math
import time
from dataclasses import dataclass, replace

import pytest

from jupyter_gpushare.cli import main
from jupyter_gpushare.policy.model import BUILD, GPU, Node, Project
from jupyter_gpushare.sim import history
from jupyter_gpushare.sim.history import BadChange, recorded_builds
from jupyter_gpushare.sim.engine import SimConfig, Simulator
from jupyter_gpushare.sim.replay_build import BuildSettings, RecordedBuild, Session, timed
from jupyter_gpushare.sim.slice_history import Live, Seen, TakeBack, sessions, span_of
from jupyter_gpushare.sim.trace import TraceJob, read_trace

# -- pure parts ------------------------------------------------------------------------------


def test_a_slice_is_read_back_from_its_first_and_last_minute():
    # held from 30 s into minute 0 (30 s seen there) to 12 s into minute 3
    seen = Seen("s-1", "alice", (0, 60, 30.0), (180, 60, 12.0), 500 * 132.0, 132.0)
    assert span_of(seen) == (30.0, 192.0)
    # hour rows the same way, and one seen in a single minute is put in its middle
    assert span_of(seen._replace(first=(0, 3600, 600.0))) == (3000.0, 192.0)
    assert span_of(seen._replace(first=(0, 60, 20.0), last=(0, 60, 20.0))) == (20.0, 40.0)


def test_sessions_are_asked_for_at_their_take_back_and_the_live_ones_are_exact():
    seen = [Seen("s-old", "alice", (0, 60, 30.0), (120, 60, 6.0), 250 * 96.0, 96.0),
            Seen("s-now", "bob", (60, 60, 20.0), (60, 60, 20.0), 500 * 20.0, 20.0)]
    live = [Live("s-now", "bob", 500, 95.0),  # also in the rows: the row of the store wins
            Live("s-before", "bob", 250, 90.0)]  # bob's other server, open before
    backs = [TakeBack(92.0, "bob", "b0", 1), TakeBack(100.0, "carol", "b0", 0)]
    lines, taken, left_off = sessions(seen, live, backs, since=10.0, until=200.0, now=300.0,
                                      grace_s=2.0)
    assert left_off == 0 and [e["job_id"] for e in lines] == ["s-old", "s-before", "s-now"]
    old, _, now = lines
    assert (old["submit_time"], old["duration"], old["gpus"], old["state"]) == \
        (20.0, 96.0, 0.25, "closed")
    assert old["kind"] == "build" and old["project"] == "build" and old["user"] == "alice"
    # bob's server took GPU 1 of b0 back at 92 and got its slice at 95: asked at 92
    assert (now["submitted"], now["queued_s"], now["state"], now["duration"]) == \
        (92.0, 3.0, "open", 208.0)
    assert taken == [{"at": 92.0, "user": "bob", "node": "b0", "gpu": 1, "session": "s-now"},
                     {"at": 100.0, "user": "carol", "node": "b0", "gpu": 0, "session": None}]
    lines, _, left_off = sessions(seen, live, [], 10.0, 200.0, 300.0, 2.0, limit=1)
    assert left_off == 2 and len(lines) == 1


def test_the_store_gives_the_sessions_from_its_usage_rows_slices_and_audit_trail(tmp_path):
    from jupyter_gpushare.pool.store.database import Store
    from jupyter_gpushare.pool.store.recorded_slices import read_sessions
    from jupyter_gpushare.pool.store.usage_rollups import UsageStore
    from jupyter_gpushare.usage.rollup import RowKey, Totals

    store = Store(f"sqlite:///{tmp_path / 'pool.sqlite'}")
    rows = UsageStore(store)
    key = RowKey("slice", "s-past", user="alice")
    for t, seconds in ((600, 30.0), (660, 60.0), (720, 12.0)):  # held 630 to 732
        rows.write(t, 60, {key: Totals(allocated=250 * seconds, seconds=seconds,
                                       measured=250 * seconds, utilized=25 * seconds)})
    now = store.slices.add(800.0, user="bob", server="", milli=500, node="b0", gpu=1)
    store.audit.add(795.0, "bob", "take back GPU", "GPU 1 of b0", {"job": "j-1"},
                    {"job": None, "server": "bob"}, "lending")
    lines, backs, left_off = read_sessions(store, 600.0, 900.0, 1000.0, 2.0, 0)
    assert [(e["job_id"], e["submitted"], e["duration"], e["gpus"], e["state"])
            for e in lines] == [("s-past", 630.0, 102.0, 0.25, "closed"),
                                (now.id, 795.0, 205.0, 0.5, "open")]
    assert lines[0]["utilization"] == 0.1 and left_off == 0
    assert backs == [{"at": 795.0, "user": "bob", "node": "b0", "gpu": 1, "session": now.id}]


@pytest.mark.parametrize("block, words", [
    ([], "the history's build part must be an object"),
    ({"nodes": "b0"}, "the history's build nodes must be a list"),
    ({"nodes": [{"name": "b0", "gpus": 1.5}]}, "the history's build gpus must be a whole "
                                               "number from 0, not 1.5"),
    ({"nodes": [], "reserve": -1}, "the history's build reserve must be a whole number from 0"),
    ({"nodes": [], "take_backs_per_user": 0}, "take_backs_per_user must be a whole number "
                                              "from 1"),
    ({"nodes": [], "sessions": [{"job_id": "s", "user": "u", "gpus": 2, "submitted": 0,
                                 "duration": 1, "state": "open"}]},
     "a session's gpus must be a fraction of one GPU, not 2"),
    ({"nodes": [], "sessions": [{"job_id": "s", "user": "u", "gpus": 0.5, "submitted": 0,
                                 "duration": 1, "state": "gone"}]},
     "a session's state must be open or closed"),
    ({"nodes": [], "take_backs": [{"at": 1, "gpu": 0, "user": "u"}]},
     "each take-back of the history's build part needs node"),
    ({"nodes": [], "sessions": [{}] * 10_001}, "sessions must be a list of at most 10000")])
def test_a_bad_build_part_is_one_sentence(block, words):
    with pytest.raises(BadChange, match=words.replace("(", r"\(")):
        recorded_builds(block)


def test_the_replay_lends_build_gpus_keeps_the_reserve_and_takes_one_back_for_a_slice():
    """A train node of 1 GPU, a build node of 3 with a reserve of 1: two borrowers run on lent
    GPUs; a slice that fits on the reserve goes there; one that does not takes back a lent GPU
    (the job there preempted, requeued) and the GPU is not lent again while it rests."""
    nodes = (Node("t0", 1),)
    jobs = [TraceJob(f"j{i}", 0.5 * i, 10.0, GPU, "p") for i in range(4)]
    build = BuildSettings((Node("b0", 3, pool=BUILD),), allowance=GPU, reserve=1,
                          lend_again_after_s=300.0)
    sim = Simulator(jobs, {}, SimConfig(1, grace_s=2.0), nodes=nodes,
                    projects=(Project("p", GPU),))
    replayed = RecordedBuild(sim, nodes, build, [Session("s1", "ann", 500, 3.0, None),
                                                 Session("s2", "bob", 750, 4.0, 20.0)],
                             [], True, 2.0)
    run = sim.run()
    starts = {r.trace.id: r for r in run.records.values()}
    assert replayed.take_backs == 1 and starts["j1"].preemptions == 1  # j1 held lent GPU 0
    assert starts["j3"].queued_s > 0  # the reserve was never lent: j3 waited for t0
    assert replayed.slices["s1"].gpu == 2  # on the reserve, at once
    assert "s2" not in replayed.slices  # ended at 20
    assert all(r.finish is not None for r in run.records.values())


# -- a real pool, one setting on at a time --------------------------------------------------

BASE = """
c = get_config()
c.PoolService.grace_period = 2.125
c.PoolService.min_runtime = 0
c.LocalBackend.simulate_gpus = True
c.LocalBackend.simulated_gpus_per_node = 2
c.LocalBackend.env_keep = ["LANG", "LC_ALL"]
"""
GROUPS = {"vision": ["alice"], "nlp": ["bob"], "ops": ["carol"]}
USER = {"vision": "alice", "nlp": "bob", "ops": "carol"}
# A job that ignores SIGTERM (it holds its GPUs for the grace period, then SIGKILL requeues
# it) and ends a quarter second past a half second, its work rounded up to one.
JOB = ("import math, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
       "end = math.ceil((time.time() + {seconds}) * 2) / 2 + 0.25; "
       "time.sleep(max(0.0, end - time.time()))")


@dataclass(frozen=True)
class Scenario:
    """A setting on, and a workload it changes: (at, project, GPUs, seconds) submits and
    (at, "slice", user, GPUs) notebook servers, at seconds from the start."""

    config: str
    plan: tuple
    replayed: dict  # what the replay's settings say of the setting


SCENARIOS = {
    # Both projects borrow; nlp's jobs, below their deserved share, take GPUs back from
    # vision's, above theirs (min runtime 0): two fair-share preemptions.
    "reclaim_fair_share": Scenario(
        'c.LocalBackend.simulated_nodes = 2\n'
        'c.PoolService.projects = {"vision": {"quota": 0, "groups": ["vision"]},\n'
        '                          "nlp": {"quota": 0, "groups": ["nlp"]}}\n'
        'c.PoolService.reclaim_fair_share = True\n',
        ((0.0, "vision", 1, 7), (0.5, "vision", 1, 7), (1.0, "vision", 1, 7),
         (1.5, "vision", 1, 7), (2.5, "nlp", 1, 4), (3.0, "nlp", 1, 4)),
        {"reclaim_fair_share": True}),
    # vision and nlp together may hold 2 GPUs (department ml's limit): their borrowers wait
    # while GPUs are free, which ops then takes.
    "departments": Scenario(
        'c.LocalBackend.simulated_nodes = 2\n'
        'c.PoolService.projects = {"vision": {"quota": 1, "groups": ["vision"]},\n'
        '                          "nlp": {"quota": 1, "groups": ["nlp"]},\n'
        '                          "ops": {"quota": 2, "groups": ["ops"]}}\n'
        'c.PoolService.departments = {"ml": {"quota": 2, "limit": 2,\n'
        '                                    "projects": ["vision", "nlp"]}}\n',
        ((0.0, "vision", 1, 6), (0.5, "nlp", 1, 6), (1.0, "vision", 1, 3), (1.5, "nlp", 1, 3),
         (2.0, "ops", 2, 5), (2.5, "ops", 2, 3)),
        {"departments": {"ml": 2.0}}),
    # vision's 2-GPU gang, within its quota, finds one free GPU on each node beside nlp's
    # jobs, within theirs: one of them is moved.
    "consolidate": Scenario(
        'c.LocalBackend.simulated_nodes = 2\n'
        'c.PoolService.projects = {"vision": {"quota": 2, "groups": ["vision"]},\n'
        '                          "nlp": {"quota": 2, "groups": ["nlp"]}}\n'
        'c.PoolService.consolidate = True\n',
        ((0.0, "vision", 1, 3), (0.5, "vision", 1, 3), (1.0, "nlp", 1, 3), (1.5, "nlp", 1, 3),
         (2.0, "vision", 1, 2), (2.5, "nlp", 1, 6), (3.0, "nlp", 1, 6), (6.5, "vision", 2, 3)),
        {"consolidate": True}),
    # A train node of 2 GPUs and a build node of 3 (one kept in reserve): borrowers run on
    # lent GPUs; carol's slice goes onto the reserve, dave's takes a lent GPU back.
    "lend_build_gpus": Scenario(
        'c.LocalBackend.simulated_nodes = 1\n'
        'c.PoolService.projects = {"vision": {"quota": 1, "groups": ["vision"]},\n'
        '                          "nlp": {"quota": 1, "groups": ["nlp"]}}\n'
        'c.PoolService.build_nodes = {"sim-build-0": 3}\n'
        'c.PoolService.lend_build_gpus = True\n'
        'c.PoolService.build_reserve = 1\n'
        'c.PoolService.build_allowance = 1\n'
        'c.PoolService.spawner_service = "tester"  # the test plays the hub\'s spawner\n',
        ((0.0, "vision", 1, 9), (0.5, "nlp", 1, 9), (1.0, "vision", 1, 6), (1.5, "nlp", 1, 9),
         (2.0, "vision", 1, 4), (2.5, "nlp", 1, 4), (3.0, "slice", "carol", 0.5),
         (4.0, "slice", "dave", 0.75)),
        {"lend_build_gpus": True}),
}


def _as_spawner(hub, method, path, body=None):
    return hub.request(method, hub.pool_url + path, hub.tester_token, body)


def play(hub, plan) -> dict:
    """Run ``plan`` on the wall clock's half seconds; wait for every job to end and for a
    slice that takes a lent GPU back (asked again every quarter second, as a spawner asks)."""
    since = time.time() - 1
    start, jobs, waiting = math.ceil(time.time() * 2) / 2 + 0.5, [], []
    for at, what, *rest in plan:
        time.sleep(max(0.0, start + at - time.time()))
        if what == "slice":
            user, gpus = rest
            status, body = _as_spawner(hub, "POST", "api/slices", {"user": user, "gpus": gpus})
            assert status in (201, 409), body
            if status == 409:
                waiting.append({"user": user, "gpus": gpus})
            continue
        gpus, seconds = rest
        status, job = hub.api("POST", "api/jobs", USER[what], {
            "project": what, "gpus": gpus, "source": JOB.format(seconds=seconds)})
        assert status == 201, job
        jobs.append((USER[what], job["id"]))
    for ask in waiting:
        deadline = time.monotonic() + 30
        while _as_spawner(hub, "POST", "api/slices", ask)[0] != 201:
            assert time.monotonic() < deadline, f"no slice for {ask}"
            time.sleep(0.25)
    done = [hub.wait_job(user, job_id, ("succeeded", "failed"), timeout=120)
            for user, job_id in jobs]
    return {"since": since, "until": time.time() + 1, "jobs": done}


@pytest.fixture(scope="module", params=list(SCENARIOS))
def recorded(request, tmp_path_factory):
    from hubtest import running_hub

    scenario = SCENARIOS[request.param]
    d = tmp_path_factory.mktemp(request.param)
    with running_hub(d, GROUPS, BASE + scenario.config,
                     users=["alice", "bob", "carol", "admin"]) as hub:
        yield request.param, scenario, hub, play(hub, scenario.plan)


def _history(hub, window) -> dict:
    status, body = hub.api("GET", f"api/history?since={window['since']}&until="
                                  f"{window['until']}", "admin")
    assert status == 200, body
    return body


def _replay(hub, body, drop_departments=False):
    """The replay ``what_if`` runs, by hand: its run and its settings."""
    projects = hub.api("GET", "api/projects", "admin")[1]["projects"]
    departments = hub.api("GET", "api/departments", "admin")[1]["departments"]
    if drop_departments:
        projects = [{**p, "department": None} for p in projects]
        departments = []
    builds = recorded_builds(body.get("build"))
    settings = replace(history.settings_from(hub.api("GET", "api/pool", "admin")[1], projects,
                                             body["settings"], departments, builds.settings),
                       cycle_delay_s=history.decision_latency(body["jobs"]))
    first = min(e["submitted"] for e in body["jobs"])
    found, alone = timed(list(builds.sessions), list(builds.take_backs), first)
    return history.replay(history.trace_jobs(body["jobs"]), settings, None, found, alone), \
        settings


def diverging(hub, window) -> str:
    """The jobs whose replayed queueing differs from the recorded one, first first: what a
    failure of the replay's test is about."""
    body = _history(hub, window)
    run, settings = _replay(hub, body)
    first = min(e["submitted"] for e in body["jobs"])
    out = []
    for e in sorted(body["jobs"], key=lambda e: e["submitted"]):
        r = run.records[e["job_id"]]
        if abs(r.queued_s - e["queued_s"]) > 0.1:
            out.append(f"{e['job_id']} {e['project']} {e['gpus']} GPUs submitted "
                       f"{e['submitted'] - first:.2f}, queued {e['queued_s']:.2f} "
                       f"(stops {e.get('stops')}), replayed {r.queued_s:.2f} "
                       f"({r.preemptions} preemptions)")
    return f"decision latency {settings.cycle_delay_s}; " + "; ".join(out[:6])


def test_the_setting_changed_what_the_pool_did(recorded, tmp_path):
    name, scenario, hub, window = recorded
    body = _history(hub, window)
    stops = [s for e in body["jobs"] for s in e.get("stops", [])]
    if name == "reclaim_fair_share":
        assert stops.count("fair") == 2, stops
    elif name == "consolidate":
        assert "move" in stops, stops
    elif name == "lend_build_gpus":
        assert stops == ["take back"], stops
        lent = [j for j in window["jobs"] if "sim-build-0/lent" in j["placement"]]
        assert lent, window["jobs"]
        build = body["build"]
        assert [s["user"] for s in build["sessions"]] == ["carol", "dave"], build
        assert [b["user"] for b in build["take_backs"]] == ["dave"], build
        # the CSV, a trace file, has them as kind=build lines after the jobs
        status, text = hub.api("GET", f"api/history?since={window['since']}&until="
                                      f"{window['until']}&format=csv", "admin")
        assert status == 200
        (tmp_path / "h.csv").write_text(text)
        lines = read_trace(tmp_path / "h.csv")
        assert [(j.kind, j.gpus, j.user) for j in lines if j.kind == "build"] == \
            [("build", 500, "carol"), ("build", 750, "dave")]
    else:  # without its department, vision and nlp would have borrowed the free GPUs
        ml = ("vision", "nlp")
        without, _ = _replay(hub, body, drop_departments=True)
        waited = sum(e["queued_s"] for e in body["jobs"] if e["project"] in ml)
        unlimited = sum(r.queued_s for r in without.records.values() if r.trace.project in ml)
        assert unlimited + 4 < waited, (unlimited, waited)


def _check_replay(result: dict, scenario: Scenario, hub, window) -> None:
    rec, today = result["recorded"], result["today"]
    for name, figures in rec["per_project"].items():
        rep = today["per_project"][name]
        assert abs(figures["allocation"] - rep["allocation"]) <= 0.02, (name, figures, rep)
        assert rep["queue_avg_s"] == pytest.approx(figures["queue_avg_s"], rel=0.10), \
            (name, figures["queue_avg_s"], rep["queue_avg_s"], diverging(hub, window))
    said = result["settings"]["today"]
    for key, value in scenario.replayed.items():
        assert (said["departments"] if key == "departments" else said["replayed"][key]) == \
            value, said
    assert said["not_replayed"] == [], said


def test_the_replay_gives_back_what_the_pool_did_with_the_setting_on(recorded, capsys):
    name, scenario, hub, window = recorded
    code = main(["simulate", "--from-pool", "--since", str(window["since"]), "--until",
                 str(window["until"]), "--json", "--url", hub.pool_url,
                 "--token", hub.token("admin")])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out)
    _check_replay(result, scenario, hub, window)
    if name == "lend_build_gpus":
        assert result["settings"]["today"]["build"] == {
            "gpus": 3, "reserve": 1, "sessions": 2, "take_backs": 1}
        assert result["today"]["preemptions"] == 1


def test_the_whatif_api_replays_it_alike(recorded):
    """The what-if's worker reads the history, build sessions too, from the store itself."""
    name, scenario, hub, window = recorded
    status, run = hub.api("POST", "api/whatif", "admin", {
        "since": str(window["since"]), "until": str(window["until"])})
    assert status == 202, run
    deadline = time.monotonic() + 60
    while run["state"] == "replaying" and time.monotonic() < deadline:
        time.sleep(0.2)
        status, run = hub.api("GET", f"api/whatif/{run['id']}", "admin")
    assert run["state"] == "done", run
    _check_replay(run["result"], scenario, hub, window)

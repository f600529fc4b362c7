"""Build GPUs lent to train jobs, in the service: a real store, the real local backend
(simulated GPUs) and the scheduling loop. A borrower runs on build GPUs without slices; a
notebook's slice takes one back (the job is preempted and requeued) within the grace
period; a job within quota never runs there; ``build_reserve`` GPUs are never lent; a user
who starts servers only to stop them cannot keep preempting the jobs there."""

import asyncio
import logging
import os
import time
from dataclasses import replace

import pytest
import pytest_asyncio

from jupyter_gpushare.backends import Launch
from jupyter_gpushare.backends.base import LentGPUs
from jupyter_gpushare.backends.local import LocalBackend
from jupyter_gpushare.client import PoolError
from jupyter_gpushare.dashboard.poolmap import pool_map
from jupyter_gpushare.gpus import SimulatedInventory
from jupyter_gpushare.policy import SliceRefused
from jupyter_gpushare.policy.model import GPU, PolicyConfig
from jupyter_gpushare.pool.build import build_pool as build_module
from jupyter_gpushare.pool.build.build_pool import BuildPool
from jupyter_gpushare.pool.store.database import Store
from jupyter_gpushare.pool.store.models import ProjectRow
from jupyter_gpushare.pool.train.cycles import CycleSignal
from jupyter_gpushare.pool.train.scheduler import Scheduler
from jupyter_gpushare.pool.web.views import project_json
from jupyter_gpushare.spawner.reserve import Refused, reserve
from jupyter_gpushare.text import format_pool
from hubtest import refused_at_start
from test_pool_loop import until

GRACE = 3.0
SLEEPER = "echo started $CUDA_VISIBLE_DEVICES; exec sleep 600"


class TwoGPUs(LocalBackend):
    """One simulated train node of two GPUs, run as the service's own account."""

    def detect_inventories(self):
        return [SimulatedInventory("sim-node-0", 2)]

    def _service_is_root(self):
        return False


def make_pool(tmp_path, reserve, **lending):
    store = Store(f"sqlite:///{tmp_path / 'pool.sqlite'}")
    store.quotas.add_missing_projects([ProjectRow(name="x", quota=0, groups=["x"]),
                                       ProjectRow(name="y", quota=2 * GPU, groups=["y"])])
    backend = TwoGPUs(state_dir=str(tmp_path / "state"), run_as_service_user=True)
    cycles = CycleSignal()
    build = BuildPool({"sim-build-0": 2}, 1.0, store, simulated=True, lend=True,
                      reserve_gpus=reserve, take_back_s=GRACE + 1, **lending,
                      lent=backend.lent_gpus(), cycles=cycles)
    backend.lend(build)

    def launch_for(row):
        return Launch(row.id, row.attempt, row.user, row.project, tuple(row.command),
                      dict(row.env), dict(row.placement), str(tmp_path / "ckpt" / row.id),
                      str(tmp_path))

    scheduler = Scheduler(store, backend, PolicyConfig(min_runtime_s=0), grace_s=GRACE,
                          launch_for=launch_for, log=logging.getLogger("test"), build=build,
                          cycles=cycles)
    return store, backend, build, scheduler


@pytest_asyncio.fixture
async def pool(tmp_path):
    made = make_pool(tmp_path, reserve=0)
    yield made
    kill_all(made[1])


def kill_all(backend):
    for record in backend._records():
        try:
            os.killpg(record["pgid"], 9)
        except OSError:
            pass


def submit(store, project, gpus=2):
    return store.jobs.add(time.time(), user="u", project=project, name="", gpus=gpus * GPU,
                          priority=0, command=["/bin/sh", "-c", SLEEPER], env={},
                          checkpoint_dir="")


@pytest.mark.asyncio
async def test_a_borrower_runs_on_lent_build_gpus_and_a_notebook_takes_one_back(pool):
    store, backend, build, scheduler = pool
    first, lent, waiting = (submit(store, "x") for _ in range(3))
    await until(scheduler, lambda: store.jobs.get(lent.id).state == "running")
    assert store.jobs.get(first.id).placement == {"sim-node-0": 2 * GPU}
    assert store.jobs.get(lent.id).placement == {"sim-build-0/lent": 2 * GPU}
    assert store.jobs.get(waiting.id).state == "pending"
    # x's numbers count it: 4 GPUs in use, all borrowed, 2 of them lent build GPUs
    await scheduler.tick()
    shown = project_json(store.quotas.project("x"), scheduler.explained, 1)
    assert (shown["in_use"], shown["borrowed"], shown["lent"]) == (4.0, 4.0, 2.0)
    # it runs on the build GPUs themselves
    uuids = build.uuids()
    assert backend.lent_holders() == {("sim-build-0", 0): lent.id, ("sim-build-0", 1): lent.id}
    [attempt] = [a for a in backend._running.values() if a.job_id == lent.id]
    assert attempt.devices == {"sim-build-0/lent": [uuids[("sim-build-0", 0)],
                                                    uuids[("sim-build-0", 1)]]}

    # shown where GPUs are shown: api/pool's build part, gpushare pool, the pool map
    shown = build.summary()
    assert shown["lending"] and shown["lent"] == [
        {"node": "sim-build-0", "gpu": i, "job": lent.id, "held": True, "taking_back": False}
        for i in (0, 1)]
    # others see that a job holds it, not which
    hidden = build.summary(lambda job: False)["lent"][0]
    assert hidden["job"] is None and hidden["held"]
    assert "GPU 0 of sim-build-0: lent to a train job" in format_pool({"build": build.summary(
        lambda job: False)})
    assert f"GPU 1 of sim-build-0: lent to job {lent.id}" in format_pool({"build": shown})
    tiles = pool_map({"build": shown}, {lent.id: {"name": "resnet"}}, 0.05)
    assert tiles.count("lent to job resnet") == 2

    # alice's server wants a slice: only a lent GPU has room, so it is taken back
    asked = time.monotonic()
    refused = build.reserve("alice", GPU // 4, "")
    assert isinstance(refused, SliceRefused)
    assert str(refused) == ("taking back GPU 0 of sim-build-0, which is lent to train jobs: it "
                            "is free for this server within 4 s")
    assert refused.retry_s == GRACE + 1  # the API says so in Retry-After; the spawner waits
    assert isinstance(build.reserve("alice", GPU // 4, ""), SliceRefused)  # the same GPU
    assert list(build.wanted.values())[0][0] == ("sim-build-0", 0)
    assert "GPU 0 of sim-build-0: lent to job " + lent.id + "; being taken back for a " \
        "notebook server" in format_pool({"build": build.summary()})
    await until(scheduler, lambda: store.jobs.get(lent.id).preempting, timeout=2)
    [preempt] = [e for e in store.jobs.events(lent.id) if e.kind == "preempt"]
    assert "GPU 0 of sim-build-0, lent to train jobs, is taken back" in preempt.detail
    assert store.jobs.attempts(lent.id)[0].stop == "take back"
    slice_row = None

    def placed():
        nonlocal slice_row
        got = build.reserve("alice", GPU // 4, "")
        slice_row = None if isinstance(got, SliceRefused) else got
        return slice_row is not None
    await until(scheduler, placed, timeout=GRACE + 3)
    took = time.monotonic() - asked
    assert took <= GRACE + 2, took
    assert (slice_row.node, slice_row.gpu) == ("sim-build-0", 0)
    assert not build.wanted
    # the borrower was requeued to resume from its checkpoint; one lent GPU is left, too few
    # for it, and it stays off the slice's GPU
    await until(scheduler, lambda: store.jobs.get(lent.id).state == "pending")
    assert store.jobs.get(lent.id).attempt == 2
    await scheduler.tick()
    assert store.jobs.get(lent.id).state == store.jobs.get(waiting.id).state == "pending"
    assert [n for n in scheduler.explained.nodes if n.lent] == \
        [n for n in build.lent_nodes()] and build.lent_nodes()[0].gpus == 1
    one = submit(store, "x", gpus=1)
    await until(scheduler, lambda: store.jobs.get(one.id).state == "running")
    assert store.jobs.get(one.id).placement == {"sim-build-0/lent": GPU}
    assert backend.lent_holders() == {("sim-build-0", 1): one.id}


@pytest.mark.asyncio
async def test_a_job_within_quota_takes_its_quota_back_and_never_runs_on_lent_gpus(pool):
    store, backend, build, scheduler = pool
    borrowed = [submit(store, "x") for _ in range(2)]
    await until(scheduler, lambda: all(store.jobs.get(j.id).state == "running" for j in borrowed))
    within = submit(store, "y")
    await until(scheduler, lambda: store.jobs.get(within.id).state == "running", timeout=GRACE + 5)
    assert store.jobs.get(within.id).placement == {"sim-node-0": 2 * GPU}
    # the victim was the borrower on the train pool's own GPUs; the lent one runs on
    assert store.jobs.get(borrowed[0].id).state == "pending"
    assert store.jobs.get(borrowed[1].id).state == "running"
    assert store.jobs.get(borrowed[1].id).placement == {"sim-build-0/lent": 2 * GPU}


@pytest.mark.asyncio
async def test_the_build_reserve_is_never_lent(tmp_path):
    store, backend, build, scheduler = make_pool(tmp_path, reserve=1)
    try:
        jobs = [submit(store, "x", gpus=1) for _ in range(4)]
        await until(scheduler, lambda: sum(store.jobs.get(j.id).state == "running"
                                           for j in jobs) == 3)
        await scheduler.tick()
        assert sorted(store.jobs.get(j.id).state for j in jobs) == ["pending"] + ["running"] * 3
        assert backend.lent_holders() == {("sim-build-0", 0): jobs[2].id}
        # a slice goes straight onto the reserve, nothing is taken back
        got = build.reserve("alice", GPU // 2, "")
        assert not isinstance(got, SliceRefused) and (got.node, got.gpu) == ("sim-build-0", 1)
        assert not build.wanted
    finally:
        kill_all(backend)


@pytest.mark.asyncio
async def test_a_lent_gpu_that_no_job_holds_takes_a_slice_at_once_unless_a_cycle_runs(pool):
    store, backend, build, scheduler = pool
    await scheduler.tick()
    assert [(n.name, n.gpus) for n in build.lent_nodes()] == [("sim-build-0/lent", 2)]
    async with scheduler._lock:  # a cycle between its decisions and its starts
        refused = build.reserve("alice", GPU // 4, "")
    assert isinstance(refused, SliceRefused) and "taking back GPU 0" in str(refused)
    # no cycle now: bob's slice at once, packed beside the ¼ alice waits for (GPU 0 is lent
    # no more: a GPU is not fenced whole for a smaller slice)
    got = build.reserve("bob", GPU // 4, "")
    assert not isinstance(got, SliceRefused) and (got.node, got.gpu) == ("sim-build-0", 0)
    got = build.reserve("alice", GPU // 4, "")  # and hers beside it: GPU 1 is lent again
    assert not isinstance(got, SliceRefused) and (got.node, got.gpu) == ("sim-build-0", 0)
    assert not build.wanted
    assert [(n.name, n.gpus) for n in build.lent_nodes()] == [("sim-build-0/lent", 1)]


@pytest.mark.asyncio
async def test_one_take_back_at_a_time_per_user_and_counted_against_the_allowance(pool):
    store, backend, build, scheduler = pool
    jobs = [submit(store, "x") for _ in range(2)]
    await until(scheduler, lambda: all(store.jobs.get(j.id).state == "running" for j in jobs))
    assert isinstance(build.reserve("alice", GPU // 4, "a"), SliceRefused)
    refused = build.reserve("alice", GPU // 4, "b")  # her second server waits for the first
    assert str(refused) == ("another server of alice is taking back a GPU lent to train jobs; "
                            "start this one once that one has started")
    assert [w.gpu for w in build.wanted.values()] == [("sim-build-0", 0)]
    build.allowance = 0.25  # what her first server waits for counts against her allowance
    assert "already holds" not in str(build.reserve("alice", GPU // 4, "a"))
    assert "build allowance" in str(build.reserve("alice", GPU // 4, "c"))


@pytest.mark.asyncio
async def test_a_cycle_between_deciding_and_starting_keeps_its_lent_gpus(tmp_path):
    """The reserve GPU is whichever spare GPU comes last: a slice placed while a cycle starts
    jobs must not move it under them (the jobs start on the GPUs the cycle lent)."""
    store, backend, build, scheduler = make_pool(tmp_path, reserve=1)
    build.nodes[0] = replace(build.nodes[0], gpus=3)
    build._uuids = None
    try:
        await scheduler.tick()
        assert build.lent_now("sim-build-0") == [("sim-build-0", 0), ("sim-build-0", 1)]
        async with scheduler._lock:  # a cycle has decided to start a job on both
            got = build.reserve("alice", GPU, "")
            assert not isinstance(got, SliceRefused) and got.gpu == 2  # the reserve, not theirs
            assert not build.wanted
            assert len(backend._lent_uuids("sim-build-0/lent")) == 2
    finally:
        kill_all(backend)


@pytest.mark.asyncio
async def test_jobs_on_build_gpus_are_taken_back_when_lending_is_off(pool, tmp_path):
    """Lending turned off (a restart) while a job runs on a build GPU: the job is preempted
    and requeued, and no slice lands on its GPU meanwhile."""
    store, backend, build, scheduler = pool
    jobs = [submit(store, "x") for _ in range(2)]
    await until(scheduler, lambda: all(store.jobs.get(j.id).state == "running" for j in jobs))
    build.lend = False
    refused = build.reserve("alice", GPU // 4, "")
    assert isinstance(refused, SliceRefused) and "the build pool is full" in str(refused)
    assert [(n.name, n.gpus) for n in build.lent_nodes()] == [("sim-build-0/lent", 0)]
    await until(scheduler, lambda: store.jobs.get(jobs[1].id).state == "pending", timeout=GRACE + 5)
    assert store.jobs.get(jobs[0].id).state == "running"  # on the train pool's own GPUs
    got = build.reserve("alice", GPU // 4, "")
    assert not isinstance(got, SliceRefused)


def test_build_gpus_this_machine_cannot_name_are_not_lent(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'pool.sqlite'}")
    build = BuildPool({"gpu-node-7": 2}, 1.0, store, simulated=False, lend=True, reserve_gpus=0)
    build._uuids = {}  # another machine's GPUs: no UUID here
    assert build.lendable() == [] and build.lent_nodes() == []


def test_no_slice_before_the_jobs_on_build_gpus_are_adopted(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'pool.sqlite'}")
    build = BuildPool({"sim-build-0": 1}, 1.0, store, simulated=True, lend=True, adopted=False)
    refused = build.reserve("alice", GPU // 4, "")
    assert isinstance(refused, SliceRefused) and "ask again in a moment" in str(refused)


class TakingBack:
    """Answers as the pool does while a lent GPU comes back: 409 with Retry-After, twice."""

    def __init__(self):
        self.asked = 0

    def reserve(self, user, milli, server):
        self.asked += 1
        if self.asked <= 2:
            raise PoolError(409, "taking back GPU 0 of b0, which is lent to train jobs: it is "
                                 "free for this server within 1 s", retry_after=1.0)
        return {"id": "s-1", "gpus": milli / GPU, "node": "b0", "gpu": 0, "uuid": None}


@pytest.mark.asyncio
async def test_the_spawner_waits_for_a_gpu_taken_back_beyond_its_own_wait():
    said = []
    client = TakingBack()
    held = await reserve(client, "alice", "", GPU // 4, wait_s=0.1, say=said.append,
                         interval=0.3)
    assert [h.id for h in held] == ["s-1"] and client.asked == 3
    assert said == ["Taking back GPU 0 of b0, which is lent to train jobs: it is free for this "
                    "server within 1 s: waiting up to 1 s for room."]


class NeverBack(TakingBack):
    def reserve(self, user, milli, server):
        self.asked += 1
        raise PoolError(409, "taking back GPU 0 of b0, which is lent to train jobs: it is "
                             "free for this server within 1 s", retry_after=1.0)


@pytest.mark.asyncio
async def test_the_spawner_waits_for_a_gpu_taken_back_once_not_for_ever():
    began = time.monotonic()
    with pytest.raises(Refused):
        await reserve(NeverBack(), "alice", "", GPU // 4, wait_s=0.1, say=lambda _: None,
                      interval=0.3)
    assert time.monotonic() - began < 3  # 1 s it was told, and one ask more


@pytest.mark.asyncio
async def test_a_job_on_lent_gpus_that_cannot_start_fails_as_anywhere(pool):
    """Only lent GPUs gone back to notebooks requeue a job; its own fault fails it."""
    store, backend, build, scheduler = pool
    submit(store, "x")
    broken = store.jobs.add(time.time(), user="u", project="x", name="", gpus=GPU, priority=0,
                            command=[], env={}, checkpoint_dir="")
    await until(scheduler, lambda: store.jobs.get(broken.id).state != "pending")
    assert store.jobs.get(broken.id).state == "failed" and store.jobs.get(broken.id).attempt == 1


def test_what_a_users_other_server_waits_for_counts_once_against_the_allowance(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'pool.sqlite'}")
    held = {("sim-build-0", 0): "j-1", ("sim-build-0", 1): "j-2"}
    build = BuildPool({"sim-build-0": 2}, 0.5, store, simulated=True, lend=True, reserve_gpus=0,
                      lent=LentGPUs(lambda: held))
    assert isinstance(build.reserve("alice", GPU // 4, "a"), SliceRefused)  # wants GPU 0
    del held[("sim-build-0", 0)]  # j-1 has left GPU 0
    got = build.reserve("alice", GPU // 4, "b")  # ¼ waited for + ¼ = her ½: allowed
    assert not isinstance(got, SliceRefused) and (got.node, got.gpu) == ("sim-build-0", 0)


@pytest.mark.parametrize("extra, sentence", [
    ("c.LocalBackend.share_build_gpus = True\n", "PoolService.lend_build_gpus and "
     "LocalBackend.share_build_gpus both give build GPUs to train jobs; set one of them."),
    ("c.PoolService.build_nodes = {'rack/1': 1}\n", "PoolService.build_nodes names 'rack/1': "
     "a node's name has no '/'"),
    ("c.PoolService.build_reserve = -1\n", "build_reserve"),
    ("c.PoolService.backend_class = 'kubernetes'\n"
     "c.KubernetesBackend.kubeconfig = '/nonexistent/kubeconfig'\n",
     "PoolService.lend_build_gpus on Kubernetes needs KubernetesBackend.lent_gpu_resources: "
     "what a pod asks the build nodes' device plugin for one whole GPU"),
    ("c.PoolService.backend_class = 'kubernetes'\n"
     "c.KubernetesBackend.lent_gpu_resources = {'nvidia.com/gpu': 0}\n",
     "KubernetesBackend.lent_gpu_resources['nvidia.com/gpu'] must be a whole number from 1 "
     "to 1000, not '0'."),
    ("c.PoolService.backend_class = 'kubernetes'\n"
     "c.KubernetesBackend.lent_device_limits = {'memory': 1}\n",
     "KubernetesBackend.lent_device_limits names 'memory', which is not an extended resource "
     "name"),
])
def test_the_service_does_not_start_with_bad_lending_settings(extra, sentence, tmp_path,
                                                                capsys):
    err = refused_at_start("c.PoolService.projects = {'vision': {'quota': 1}}\n"
                           "c.PoolService.build_nodes = {'sim-build-0': 1}\n"
                           "c.PoolService.lend_build_gpus = True\n"
                           "c.LocalBackend.simulate_gpus = True\n"
                           "c.LocalBackend.simulated_nodes = 1\n" + extra, tmp_path, capsys)
    assert sentence in err, err


def test_a_second_server_waits_behind_the_first_even_where_no_gpu_is_left_to_want(tmp_path):
    """Her first server wants the one build GPU back (its whole room): her second is told to
    wait for the first, not that the pool is full."""
    store = Store(f"sqlite:///{tmp_path / 'pool.sqlite'}")
    build = BuildPool({"b0": 1}, 2.0, store, simulated=True, lend=True, reserve_gpus=0,
                      lent=LentGPUs(lambda: {("b0", 0): "j-1"}))
    first = build.reserve("alice", GPU, "a")
    assert isinstance(first, SliceRefused) and "taking back GPU 0 of b0" in str(first)
    assert str(build.reserve("alice", GPU // 4, "b")) == (
        "another server of alice is taking back a GPU lent to train jobs; start this one once "
        "that one has started")


# -- take-backs cannot be abused --------------------------------------------------------------
async def run_for(scheduler, seconds):
    """The loop's cycles for ``seconds``, as the service runs them."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await scheduler.tick()
        await asyncio.sleep(0.05)


def preempted(store, jobs):
    return [e.detail for j in jobs for e in store.jobs.events(j.id) if e.kind == "preempt"]


async def bobs_jobs_on_lent_gpus(store, scheduler):
    """Four 1-GPU borrowers: two on the train node, two on the two lent build GPUs."""
    jobs = [submit(store, "x", gpus=1) for _ in range(4)]
    await until(scheduler, lambda: all(store.jobs.get(j.id).state == "running" for j in jobs))
    assert sum("sim-build-0/lent" in store.jobs.get(j.id).placement for j in jobs) == 2
    return jobs


async def start_and_stop(build, scheduler, user):
    """A server started through the hub API and stopped as soon as it is up: the spawner asks
    for its slice until it has one, and releases it when the server stops."""
    got = None

    def placed():
        nonlocal got
        got = build.reserve(user, GPU // 4, "")
        return not isinstance(got, SliceRefused)
    await until(scheduler, placed, timeout=GRACE + 5)
    build.store.slices.remove(got.id)


@pytest.mark.asyncio
async def test_abandoned_starts_do_not_preempt_the_jobs_on_lent_gpus_again_and_again(
        pool, monkeypatch):
    """The attack: mallory's server asks once for a slice where only lent GPUs have room and
    gives up; the want lapses, and she asks again a little later, again and again. Bob's jobs
    there are preempted once: the GPU taken back is not lent again for a while, so her next
    start finds it free."""
    monkeypatch.setattr(build_module, "WANT_FOR_S", 1.0)  # her spawner stops asking sooner
    store, backend, build, scheduler = pool
    jobs = await bobs_jobs_on_lent_gpus(store, scheduler)
    for _ in range(3):
        got = build.reserve("mallory", GPU // 4, "")  # one ask, then the start is cancelled
        if not isinstance(got, SliceRefused):
            store.slices.remove(got.id)
        await run_for(scheduler, 1.0 + GRACE)  # the want lapses; the loop lends what it may
    assert len(preempted(store, jobs)) == 1


@pytest.mark.asyncio
async def test_starting_and_stopping_a_server_does_not_preempt_the_jobs_on_lent_gpus_again(
        pool):
    """The same through the hub API: mallory starts a server, which takes a lent GPU back,
    stops it as soon as it is up, and starts it again. Her second and third starts find the
    GPU taken back free (it is not lent again meanwhile): bob's jobs are preempted once."""
    store, backend, build, scheduler = pool
    jobs = await bobs_jobs_on_lent_gpus(store, scheduler)
    for _ in range(3):
        await start_and_stop(build, scheduler, "mallory")
        await run_for(scheduler, 1.0)  # the loop lends what it may: bob's job would restart
    assert len(preempted(store, jobs)) == 1


@pytest.mark.asyncio
async def test_a_user_takes_back_at_most_take_backs_per_user_lent_gpus_in_the_window(
        tmp_path):
    """Even with lent GPUs lent again at once, mallory's servers take back two of them within
    the window, not a third; alice's server still takes one back; each take-back is in the
    audit trail with the user who caused it and the job, which the job's owner does not see."""
    store, backend, build, scheduler = make_pool(tmp_path, reserve=0, lend_again_after_s=0)
    try:
        jobs = await bobs_jobs_on_lent_gpus(store, scheduler)
        for _ in range(2):
            await start_and_stop(build, scheduler, "mallory")
            await until(scheduler, lambda: all(store.jobs.get(j.id).state == "running"
                                               for j in jobs), timeout=GRACE + 5)
        assert len(preempted(store, jobs)) == 2
        refused = build.reserve("mallory", GPU // 4, "")
        assert isinstance(refused, SliceRefused) and refused.retry_s is None
        assert str(refused).startswith(
            "mallory's servers have taken back 2 build GPUs from train jobs within 600 s, the "
            "most one user may: this one can start when a build GPU is free, or take one back "
            "in ")
        await run_for(scheduler, 0.5)
        assert len(preempted(store, jobs)) == 2 and not build.wanted
        # the limit is per user
        assert "taking back GPU" in str(build.reserve("alice", GPU // 4, ""))
        await until(scheduler, lambda: len(preempted(store, jobs)) == 3, timeout=2)

        taken = [e for e in reversed(store.audit.newest()) if e.action == "take back GPU"]
        assert [(e.who, e.via) for e in taken] == [("mallory", "lending")] * 2 + \
            [("alice", "lending")]
        victims = [e.before["job"] for e in taken]
        assert all(v in {j.id for j in jobs} for v in victims)
        assert taken[0].target.startswith("GPU ") and " of sim-build-0" in taken[0].target
        assert taken[0].before["project"] == "x"
        assert taken[0].after == {"job": None, "server": "mallory"}
        # the job's owner reads why, not whose server it was
        details = preempted(store, jobs)
        assert all("taken back for a notebook server" in d for d in details)
        assert not any("mallory" in d or "alice" in d for d in details)
    finally:
        kill_all(backend)


@pytest.mark.asyncio
async def test_each_gpu_of_a_job_taken_back_is_a_take_back_of_its_own(pool):
    """Two servers want the two lent GPUs of one job: the job is stopped once, and each GPU is
    counted against its own server's user, in the audit trail and in the limit, and rests."""
    store, backend, build, scheduler = pool
    first, lent = submit(store, "x"), submit(store, "x")
    await until(scheduler, lambda: store.jobs.get(lent.id).state == "running")
    assert store.jobs.get(lent.id).placement == {"sim-build-0/lent": 2 * GPU}
    for user in ("mallory", "alice"):
        assert "taking back GPU" in str(build.reserve(user, GPU, ""))
    assert sorted(w.gpu for w in build.wanted.values()) == [("sim-build-0", 0),
                                                            ("sim-build-0", 1)]
    await until(scheduler, lambda: store.jobs.get(lent.id).preempting, timeout=2)
    taken = [e for e in reversed(store.audit.newest()) if e.action == "take back GPU"]
    assert sorted((e.who, e.target, e.before["job"]) for e in taken) == [
        ("alice", "GPU 1 of sim-build-0", lent.id), ("mallory", "GPU 0 of sim-build-0", lent.id)]
    assert set(build.took) == {"mallory", "alice"}
    assert set(build.resting) == {("sim-build-0", 0), ("sim-build-0", 1)}

"""The scheduling loop with a real store and the real local backend (simulated GPUs): how an
attempt that was told to stop ended decides what becomes of its job (policy/outcome.py).

A job that exits by itself during its grace period has succeeded or failed by its exit
code and is never requeued; one that our stop ends (SIGTERM, SIGKILL, or exit 143 after a
checkpoint) is requeued. The simulator applies the same rule (tests/test_sim.py).
"""

import asyncio
import logging
import os
import time

import pytest
import pytest_asyncio

from jupyter_gpushare.backends import Launch
from jupyter_gpushare.backends.local import LocalBackend
from jupyter_gpushare.gpus import SimulatedInventory
from jupyter_gpushare.policy.model import GPU, PolicyConfig
from jupyter_gpushare.policy.outcome import FAILED, PREEMPTED, SUCCEEDED, after_stop
from jupyter_gpushare.pool.store.database import Store
from jupyter_gpushare.pool.store.models import ProjectRow
from jupyter_gpushare.pool.store.recorded_jobs import read_entries
from jupyter_gpushare.pool.train.scheduler import Scheduler


class TwoGPUs(LocalBackend):
    """One simulated node of two GPUs, run as the service's own account."""

    def detect_inventories(self):
        return [SimulatedInventory("sim-node-0", 2)]

    def _service_is_root(self):
        return False


@pytest_asyncio.fixture
async def pool(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'pool.sqlite'}")
    store.quotas.add_missing_projects([ProjectRow(name="x", quota=0, groups=["x"]),
                                       ProjectRow(name="y", quota=2 * GPU, groups=["y"])])
    backend = TwoGPUs(state_dir=str(tmp_path / "state"), run_as_service_user=True)
    yield store, backend, scheduler_for(store, backend, tmp_path)
    kill_all(backend)


def scheduler_for(store, backend, tmp_path) -> Scheduler:
    """The scheduling loop over ``store`` and ``backend``, its jobs' files in ``tmp_path``."""
    def launch_for(row):
        return Launch(row.id, row.attempt, row.user, row.project, tuple(row.command),
                      dict(row.env), dict(row.placement), str(tmp_path / "ckpt" / row.id),
                      str(tmp_path))

    return Scheduler(store, backend, PolicyConfig(), grace_s=3.0, launch_for=launch_for,
                     log=logging.getLogger("test"))


def kill_all(backend) -> None:
    for record in backend._records():
        try:
            os.killpg(record["pgid"], 9)
        except OSError:
            pass


def submit(store, project, script):
    return store.jobs.add(time.time(), user="u", project=project, name="", gpus=2 * GPU,
                          priority=0, command=["/bin/sh", "-c", script], env={},
                          checkpoint_dir="")


async def until(scheduler, check, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "the loop did not get there in time"
        await scheduler.tick()
        await asyncio.sleep(0.05)


@pytest.mark.asyncio
@pytest.mark.parametrize("script, state, attempt, exit_code", [
    # ignores SIGTERM and finishes its work (exit 0) within the grace: done, never rerun
    ("trap '' TERM; echo ready; sleep 0.6; echo finished", "succeeded", 1, 0),
    # checkpoints on SIGTERM and exits 143, as a preempted job should: requeued
    ("trap 'echo checkpoint; exit 143' TERM; echo ready; while :; do sleep 0.05; done",
     "pending", 2, None),
    # killed by the SIGTERM itself: requeued
    ("echo ready; exec sleep 60", "pending", 2, None),
    # fails by itself during the grace (its handler errs): failed, not requeued
    ("trap 'exit 3' TERM; echo ready; while :; do sleep 0.05; done", "failed", 1, 3),
], ids=["finished-in-grace", "checkpointed-143", "killed-by-sigterm", "failed-in-grace"])
async def test_a_stopped_attempt_ends_by_its_exit_status(pool, script, state, attempt,
                                                         exit_code):
    store, backend, scheduler = pool
    victim = submit(store, "x", script)  # borrows both GPUs
    await until(scheduler, lambda: b"ready" in _log(backend, victim.id))
    claimant = submit(store, "y", "true")  # y is within its quota: x's job is preempted
    await until(scheduler, lambda: store.jobs.get(victim.id).state != "running"
                or store.jobs.get(victim.id).attempt > 1)
    row = store.jobs.get(victim.id)
    assert (row.state, row.attempt, row.exit_code) == (state, attempt, exit_code), row.message
    if state == "succeeded":
        assert b"finished" in _log(backend, victim.id)
        assert "finished by itself while being preempted" in row.message
    kinds = [e.kind for e in store.jobs.events(victim.id)]
    assert kinds.count("requeue") == (attempt - 1)
    # The attempt says why the pool stopped it: y's guarantee, a kind, not a sentence
    assert store.jobs.attempts(victim.id)[0].stop == "guarantee"
    if state == "pending":  # requeued: said by its kind, promising no checkpoint it may lack
        assert row.message == ("preempted: a project claimed its guaranteed quota back; "
                               "requeued: it starts again from its last checkpoint, or from "
                               "the start if it saved none")
    history, _ = read_entries(store, 0.0, time.time() + 1, time.time(), 3.0, 0)
    assert next(e for e in history if e["job_id"] == victim.id)["stops"] == ["guarantee"]
    await until(scheduler, lambda: store.jobs.get(claimant.id).state == "succeeded")


@pytest.mark.asyncio
async def test_a_cancelled_attempt_says_it_was_cancelled(pool):
    store, backend, scheduler = pool
    job = submit(store, "x", "echo ready; exec sleep 60")
    await until(scheduler, lambda: b"ready" in _log(backend, job.id))
    was, _ = await scheduler.cancel(store.jobs.get(job.id), "an admin (root)")
    assert was == "running"
    await until(scheduler, lambda: store.jobs.get(job.id).state == "cancelled")
    assert [(a.outcome, a.stop) for a in store.jobs.attempts(job.id)] == [("cancelled", "cancel")]


@pytest.mark.asyncio
async def test_killed_at_the_end_of_the_grace_is_requeued(pool):
    store, backend, scheduler = pool
    scheduler.grace_s = 0.3
    victim = submit(store, "x", "trap '' TERM; echo ready; while :; do sleep 0.05; done")
    await until(scheduler, lambda: b"ready" in _log(backend, victim.id))
    submit(store, "y", "true")
    await until(scheduler, lambda: store.jobs.get(victim.id).attempt > 1)
    assert [a.exit_code for a in store.jobs.attempts(victim.id)][:1] == [137]
    assert [a.outcome for a in store.jobs.attempts(victim.id)][:1] == ["preempted"]
    # The policy sees it queue from its requeue, not its submit (the ordering Kueue calls
    # its eviction timestamp): the attempt's end, when the row went back to pending.
    row = store.jobs.get(victim.id)
    job = scheduler._train_job(row)
    assert job.requeued == row.pending_since == store.jobs.attempts(victim.id)[0].ended
    assert job.waiting_since > job.submit_time == row.submitted


@pytest.mark.asyncio
async def test_a_drained_node_starts_nothing_new_and_requeue_preempts_what_runs(pool):
    store, backend, scheduler = pool
    running = submit(store, "y", "trap 'echo checkpoint; exit 143' TERM; echo ready; "
                                 "while :; do sleep 0.05; done")
    await until(scheduler, lambda: b"ready" in _log(backend, running.id))
    await scheduler.drain("sim-node-0", "admin", requeue=False)
    await scheduler.tick()
    assert store.jobs.get(running.id).state == "running"  # what runs there runs on
    _, stopped, was = await scheduler.drain("sim-node-0", "admin", requeue=True)
    assert was  # drained by the line above
    assert stopped == [running.id]
    await until(scheduler, lambda: store.jobs.get(running.id).attempt == 2)
    row = store.jobs.get(running.id)
    assert row.state == "pending" and b"checkpoint" in _log(backend, running.id)
    assert "node sim-node-0 was drained by admin" in store.jobs.events(running.id)[-2].detail
    assert [a.stop for a in store.jobs.attempts(running.id)] == ["drain"]
    for _ in range(3):  # it waits, and is told why
        await scheduler.tick()
    assert store.jobs.get(running.id).state == "pending"
    assert "2 GPUs on drained node sim-node-0 take no new jobs" in \
        scheduler.explained.reasons[running.id]
    assert [n.drained for n in scheduler.explained.nodes] == [True]
    # A restart finds the node drained; undrained, the job resumes as its next attempt.
    again = Scheduler(store, backend, PolicyConfig(), grace_s=3.0,
                      launch_for=scheduler.launch_for, log=logging.getLogger("test"))
    assert list(again.drained) == ["sim-node-0"] and again.drained["sim-node-0"].by == "admin"
    await again.tick()
    assert store.jobs.get(running.id).state == "pending"
    assert (await again.undrain("sim-node-0")).by == "admin"
    await until(again, lambda: b"ready" in _log(backend, running.id, 2))
    assert store.jobs.get(running.id).attempt == 2 and store.drains.all() == {}


class TwoNodes(LocalBackend):
    """Two simulated nodes of two GPUs each, run as the service's own account."""

    def detect_inventories(self):
        return [SimulatedInventory("sim-node-0", 2), SimulatedInventory("sim-node-1", 2)]

    def _service_is_root(self):
        return False


LOOPS = "trap 'echo checkpoint; exit 143' TERM; echo ready; while :; do sleep 0.05; done"


@pytest.mark.asyncio
async def test_a_job_within_quota_moves_so_that_a_gang_within_quota_gets_a_node(tmp_path):
    """v (quota 2) runs one GPU on each node, x's borrower gone; n (quota 2) wants 2 GPUs on
    one node: 2 are free, on two nodes. One of v's jobs is moved: stopped, requeued with a
    detail that says why, started again on the other node; n's job runs; v keeps 2 GPUs."""
    store = Store(f"sqlite:///{tmp_path / 'pool.sqlite'}")
    store.quotas.add_missing_projects([ProjectRow(name="x", quota=0, groups=["x"]),
                                       ProjectRow(name="v", quota=2 * GPU, groups=["v"]),
                                       ProjectRow(name="n", quota=2 * GPU, groups=["n"])])
    backend = TwoNodes(state_dir=str(tmp_path / "state"), run_as_service_user=True)
    scheduler = scheduler_for(store, backend, tmp_path)

    def add(project, gpus, script):
        return store.jobs.add(time.time(), user="u", project=project, name="", gpus=gpus * GPU,
                              priority=0, command=["/bin/sh", "-c", script], env={},
                              checkpoint_dir="")

    def running(job):
        row = store.jobs.get(job.id)
        return row.state == "running" and b"ready" in _log(backend, job.id, row.attempt)

    try:
        a = add("v", 1, LOOPS)
        await until(scheduler, lambda: running(a))
        x = add("x", 1, "echo ready; sleep 1")  # best fit: beside a
        await until(scheduler, lambda: store.jobs.get(x.id).state == "running")
        b = add("v", 1, LOOPS)  # the first node is full: the other one
        await until(scheduler, lambda: running(b))
        await until(scheduler, lambda: store.jobs.get(x.id).state == "succeeded")
        assert {*store.jobs.get(a.id).placement} != {*store.jobs.get(b.id).placement}
        gang = add("n", 2, "echo ready; sleep 1")
        await until(scheduler, lambda: store.jobs.get(gang.id).state == "succeeded", timeout=20)
        moved = [j for j in (a, b) if store.jobs.get(j.id).attempt == 2]
        assert len(moved) == 1, [store.jobs.get(j.id).attempt for j in (a, b)]
        moved = moved[0]
        await until(scheduler, lambda: running(moved))
        preempt = next(e for e in store.jobs.events(moved.id) if e.kind == "preempt")
        assert preempt.detail.startswith(
            f"moved so that job {gang.id} of project n, within its quota, gets the nodes it "
            f"needs; it is requeued to start again on other GPUs")
        assert [(t.outcome, t.stop) for t in store.jobs.attempts(moved.id)][:1] == [
            ("preempted", "move")]
        assert b"checkpoint" in _log(backend, moved.id, 1)
        assert store.jobs.get(a.id).state == store.jobs.get(b.id).state == "running"
    finally:
        kill_all(backend)


@pytest.mark.parametrize("code, outcome", [
    (0, SUCCEEDED), (143, PREEMPTED), (137, PREEMPTED), (None, PREEMPTED), (1, FAILED),
    (2, FAILED), (130, FAILED), (255, FAILED)])
def test_the_rule(code, outcome):
    assert after_stop(code) == outcome


def _log(backend, job_id, attempt=1) -> bytes:
    path = backend.log_path(job_id, attempt)
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return b""

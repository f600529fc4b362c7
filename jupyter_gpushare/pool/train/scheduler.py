"""The scheduling loop: store + backend state → ``policy.cycle`` → decisions → backend.

Owns job state transitions; the backend only runs what it is told and reports exits.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field, replace

from ...backends.base import LOST, Backend, BackendError, Exit, Handle, LentGPUsGone
from ...policy import (TRAIN, JobState, Node, PolicyConfig, Project, Snapshot,
                       TrainJob, cycle)
from ...policy.admission import never_fits_gpus
from ...policy.decisions import PreemptKind
from ...policy.lending import build_node_of
from ...policy.outcome import FAILED, PREEMPTED, SUCCEEDED, after_attempt
from ...policy.past_use import FairShareTime, PastUse, account
from ...policy.reasons import Reason, drained_note
from ...trainjob import CANCELLED, PENDING, RUNNING
from ..admin.changes import policy_levels
from ..admin.department_specs import DepartmentSpec
from ..store.database import Store
from ..store.models import CANCEL, DRAIN, DrainRow, JobRow, ProjectRow
from .cycles import CycleSignal


@dataclass
class Explanation:
    """What the last cycle said about the pool, for the API."""

    positions: dict[str, int | None] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    deserved: dict[str, int] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=dict)
    lent: dict[str, int] = field(default_factory=dict)  # held on lent build GPUs (no quota)
    nodes: list[Node] = field(default_factory=list)
    starting: dict[str, str] = field(default_factory=dict)  # started jobs not yet running: why
    at: float = 0.0
    version: int = 0  # changes when what it says changes (not when a cycle says it again)

    def says(self) -> tuple:
        return (self.positions, self.reasons, self.deserved, self.usage, self.nodes,
                self.starting)


# A requeued job's message: why it stopped (by the stop's kind), and what happens next; the
# pool cannot know whether the job saved a checkpoint, so it does not say it did
STOPPED = {PreemptKind.GUARANTEE: "preempted: a project claimed its guaranteed quota back",
           PreemptKind.FAIR: "preempted: a project below its fair share claimed idle GPUs",
           PreemptKind.PRIORITY: "preempted for a job of higher priority in its project",
           PreemptKind.MOVE: "moved so that a gang within its quota gets the nodes it needs",
           PreemptKind.TAKE_BACK: "its lent build GPU was taken back for a notebook server",
           DRAIN: "its node was drained"}
REQUEUED = "requeued: it starts again from its last checkpoint, or from the start if it saved none"


class Scheduler:
    def __init__(self, store: Store, backend: Backend, config: PolicyConfig, grace_s: float,
                 launch_for, log: logging.Logger | None = None, idle_jobs=lambda: set(),
                 fair_share: FairShareTime | None = None, build=None,
                 cycles: CycleSignal | None = None):
        """``launch_for``: a stored job → the backend's ``Launch`` (``train/launch.py``);
        ``idle_jobs``: the ids of jobs whose GPUs sat idle (``utilization/service.py``), taken
        first when GPUs are reclaimed; ``fair_share``: fair share over time, off when None;
        ``build``: the build pool (``build.BuildPool``) whose GPUs are lent, None when none
        are; ``cycles``: when a cycle runs, shared with the build pool."""
        self.store, self.backend, self.config, self.grace_s = store, backend, config, grace_s
        self.build = build
        self.launch_for, self.idle_jobs = launch_for, idle_jobs
        self.log = log or logging.getLogger("gpushare.pool")
        # What the pool looks like before the first cycle says more (api/pool answers at once).
        self.drained: dict[str, DrainRow] = store.drains.all()  # kept here and in the store
        self.explained = Explanation(nodes=self.nodes())
        self.reserved: dict[str, tuple[str, ...]] = {}
        self.cycles = cycles or CycleSignal()
        self._wake, self._lock = self.cycles.woken, self.cycles.lock
        self.fair_share = fair_share
        self.past: PastUse | None = None  # read from the store at the first cycle
        # What the last cycle left, for fair share over time: usage and quotas (milli-GPUs)
        self._usage: dict[str, int] = {}
        self._quotas: dict[str, int] = {}
        self._accounted: float | None = None
        self._unsaved: dict[tuple[str, int], float] = {}
        self._saved_at = -math.inf  # monotonic
        self._levels_problem: str | None = None  # departments the store holds do not hold

    def train_capacity(self) -> int:
        """Milli-GPUs of the train pool now."""
        return sum(n.milli for n in self.backend.nodes() if n.pool == TRAIN)

    def never_fits(self, gpus: int, project: ProjectRow) -> Reason | None:
        """Why a job of ``gpus`` in ``project`` could never run here, by the policy's own
        rule (larger than the train pool, than the fewest nodes it must use, than its
        project's or its department's limit): a submit is refused at once with the sentence
        the job would otherwise wait with for ever."""
        sizes = tuple(sorted((n.milli for n in self.backend.nodes() if n.pool == TRAIN),
                             reverse=True))
        row = self.store.quotas.department(project.department) if project.department else None
        department = None if row is None else DepartmentSpec.of(row, ()).policy()
        return never_fits_gpus(gpus, Project(project.name, project.quota, limit=project.limit),
                               sum(sizes), sizes, department)

    def nodes(self) -> list[Node]:
        """The backend's nodes, each drained one marked so (no new job starts there)."""
        return [replace(n, drained=True) if n.name in self.drained else n
                for n in self.backend.nodes()]

    async def drain(self, node: str, by: str,
                    requeue: bool) -> tuple[DrainRow, list[str], bool]:
        """Start no new job on ``node``; with ``requeue``, stop the jobs that run there the
        way a preemption does (their grace period, then requeued to resume from their
        checkpoints elsewhere). Returns the drain, the ids of the jobs told to stop, and whether
        the node was drained already (read under the lock, as the change is made)."""
        async with self._lock:
            was = node in self.drained
            now = time.time()
            row = self.store.drains.add(node, by, now)
            self.drained[node] = row
            stopped = []
            if requeue:
                for job in self.store.jobs.active():
                    if job.state == RUNNING and node in (job.placement or {}) and \
                            not (job.preempting or job.cancel_requested):
                        job = self.store.jobs.mark(
                            job.id, now, preempting=True, stop=DRAIN,
                            detail=f"node {node} was drained by {by}; requeued to resume "
                                   f"from its checkpoint")
                        await self.backend.stop(job.id, job.attempt, self.grace_s)
                        stopped.append(job.id)
        self.wake()
        return row, stopped, was

    async def undrain(self, node: str) -> DrainRow | None:
        """New jobs may start on ``node`` again; the drain it had, or None."""
        async with self._lock:
            row = self.store.drains.remove(node)
            self.drained.pop(node, None)
        self.wake()
        return row

    def deciding(self) -> bool:
        """Whether a cycle runs now (between its decisions and the starts it asks for)."""
        return self.cycles.deciding()

    def wake(self) -> None:
        """Run a cycle soon (a job was submitted or cancelled)."""
        self.cycles.wake()

    async def run(self, interval_s: float, exit_poll_s: float = 0.1) -> None:
        """First ``reconcile`` (the API answers meanwhile), then a cycle every
        ``interval_s``, or at once when woken. Between cycles the backend is asked every
        ``exit_poll_s`` whether attempts ended (cheap), so a finished job is recorded, and
        its GPUs given out, without waiting for the next cycle."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                await self.reconcile()
                if self.build is not None:
                    self.build.jobs_adopted()
                break
            except Exception:  # the store or the platform is not there yet: try again
                self.log.exception("adopting running jobs failed; trying again")
                await asyncio.sleep(interval_s)
        while True:
            try:
                await self.tick()
            except Exception:  # keep scheduling; the store is the truth
                self.log.exception("scheduling cycle failed; trying again")
            deadline = loop.time() + interval_s
            while (left := deadline - loop.time()) > 0:
                try:
                    await asyncio.wait_for(self._wake.wait(), min(exit_poll_s, left))
                    break
                except asyncio.TimeoutError:
                    pass
                try:
                    if await self._exits_seen():
                        break
                except Exception:
                    self.log.exception("asking the backend for ended jobs failed")
            self._wake.clear()

    async def _exits_seen(self) -> bool:
        async with self._lock:
            exits = await self.backend.poll()
            self._apply_exits(exits, time.time())
        return bool(exits)

    async def reconcile(self) -> None:
        """After a restart: adopt what still runs, requeue what died (attempt + 1). Holds the
        lock, so a cancel that comes meanwhile waits for it."""
        async with self._lock:
            await self._reconcile()

    async def _reconcile(self) -> None:
        handles = []
        for row in self.store.jobs.active():
            if row.state != RUNNING:
                continue
            # A start whose handle was never stored (the service died while starting it):
            # the backend looks for it by job and attempt, else it is lost and requeued.
            handles.append(Handle(row.id, row.attempt, row.handle or {}))
        exits = await self.backend.adopt(handles)
        self._apply_exits(exits, time.time())
        for row in self.store.jobs.active():  # stops asked for before the restart, asked again
            if row.state == RUNNING and (row.preempting or row.cancel_requested):
                await self.backend.stop(row.id, row.attempt, self.grace_s)
        self.log.info("adopted %d running job(s), %d had ended", len(handles) - len(exits),
                      len(exits))

    async def tick(self) -> None:
        async with self._lock:
            now = time.time()
            self._apply_exits(await self.backend.poll(), now)
            nodes = self.nodes()
            if self.build is not None:
                await self._take_back(now)
                nodes += self.build.lent_nodes()
            rows = self.store.jobs.active()
            projects, departments, problem = policy_levels(self.store.quotas.projects(),
                                                           self.store.quotas.departments())
            if problem and problem != self._levels_problem:
                self.log.error("departments ignored until fixed: %s", problem)
            self._levels_problem = problem
            idle = self.idle_jobs()
            jobs = tuple(self._train_job(r, r.id in idle) for r in rows)
            past = self._past_use(now)
            result = cycle(Snapshot(now, tuple(nodes), projects, jobs, past_use=past,
                                    departments=departments), self.config)
            self._usage = dict(result.usage)
            self._quotas = {p.name: p.quota for p in projects}
            for p in result.preemptions:
                row = self.store.jobs.mark(p.job, now, preempting=True, detail=p.why,
                                           stop=p.kind)
                await self.backend.stop(p.job, row.attempt, self.grace_s)
            self.reserved = ({result.reservation.job: result.reservation.reserved}
                             if result.reservation else {})
            waits = result.waits
            note = _drained_note(nodes, rows)
            # Explained before the starts are recorded (their commits wait in a worker
            # thread): a job shown running is counted in its project's use at once.
            self._explain(Explanation(
                positions={w.job: w.position for w in waits},
                reasons={w.job: str(w.reason) + note for w in waits},
                deserved=dict(result.deserved), usage=dict(result.usage),
                lent=_on_lent(jobs, result.starts), nodes=nodes,
                starting=self.backend.reasons(), at=now))
            await self._start_all([(s.job, dict(s.placement)) for s in result.starts], now)
            if result.starts:  # why the jobs just started are not running yet
                self._explain(replace(self.explained, starting=self.backend.reasons()))

    async def _take_back(self, now: float) -> None:
        """Preempt the jobs on lent build GPUs that notebook servers want back: requeued
        after the grace period, as any victim. The build pool counts each against the user
        whose server wants the GPU and notes it in the audit trail; the job's detail says
        what took it back, not whose server. Each wanted GPU of a job stopped here is a
        take-back of its own (a job on two lent GPUs that two servers want: two)."""
        stopping: dict[str, str] = {}  # the jobs this pass takes back → their project
        for (node, gpu), job_id in sorted(self.build.taken_back().items()):
            if job_id in stopping:
                self.build.took_back((node, gpu), job_id, stopping[job_id], now)
                continue
            row = self.store.jobs.get(job_id)
            if row is None or row.state != RUNNING or row.preempting or row.cancel_requested:
                continue
            self.build.took_back((node, gpu), job_id, row.project, now)
            stopping[job_id] = row.project
            row = self.store.jobs.mark(
                job_id, now, preempting=True, stop=PreemptKind.TAKE_BACK,
                detail=f"GPU {gpu} of {node}, lent to train jobs, is taken back for a notebook "
                       f"server; requeued to resume from its checkpoint")
            self.log.info("Taking back GPU %d of %s from job %s", gpu, node, job_id)
            await self.backend.stop(job_id, row.attempt, self.grace_s)

    SAVE_EVERY_S = 60.0
    """Fair share over time: the borrowed GPU-time counted is written to the store this
    often (a restart forgets at most this much of it)."""

    def _past_use(self, now: float) -> dict[str, float]:
        """Fair share over time: count what each project borrowed since the last cycle (as
        that cycle left it), keep it in the store now and then, and return the decayed use
        the policy divides idle GPUs by. Empty when fair share over time is off."""
        clock = self.fair_share
        if clock is None:
            return {}
        if self.past is None:
            first = clock.bucket(now - clock.window_s)
            self.past = PastUse(clock, self.store.past_use.buckets(clock.bucket_s, first))
        # How long since the last cycle by the monotonic clock: a step of the wall clock (NTP,
        # a paused machine) neither counts as borrowing nor stops the saving.
        mono = time.monotonic()
        since, self._accounted = self._accounted, mono
        if since is not None and mono > since:
            added = account(self.past, self._usage, self._quotas, now - (mono - since), now)
            for key, amount in added.items():
                self._unsaved[key] = self._unsaved.get(key, 0.0) + amount
        if self._unsaved and mono - self._saved_at >= self.SAVE_EVERY_S:
            first = self.past.forget_before(now)
            try:
                self.store.past_use.add(clock.bucket_s, self._unsaved, first)
                self._unsaved = {}
            except Exception:  # kept for the next try; scheduling goes on
                self.log.exception("keeping the fair share's borrowed GPU-time failed")
            self._saved_at = mono
        return self.past.decayed(now)

    def _explain(self, explained: Explanation) -> None:
        """What the API shows of the last cycle; its version changes when what it says does
        (answers rendered from the last one are stale then), not when a cycle says it again."""
        explained.version = self.explained.version + (explained.says() != self.explained.says())
        self.explained = explained

    async def _start_all(self, starts: list[tuple[str, dict]], now: float) -> None:
        """Record the cycle's starts (before the backend is asked, so that a crash in between
        is found and requeued on the next start of the service), start them together (a
        backend that waits on a network, Kubernetes, creates the pods concurrently instead
        of one after the other), then record their handles: one transaction each, not one
        per job."""
        if not starts:
            return
        # The commits wait for the disk in a worker thread, not on the event loop.
        rows = await self.store.in_thread(self.store.jobs.start_many, starts, now)
        handles = await asyncio.gather(*(self._start(row) for row in rows))
        await self.store.in_thread(self.store.jobs.set_handles,
                                   {row.id: h for row, h in zip(rows, handles) if h is not None})

    async def _start(self, row: JobRow) -> dict | None:
        try:
            handle = await self.backend.start(self.launch_for(row))
        except LentGPUsGone as e:  # notebooks took its lent GPUs back first: no fault of it
            self.store.jobs.requeue(row.id, time.time(), LOST, detail=f"{e} Requeued: the build "
                                    f"GPUs lent to it went back to notebooks first.")
            return None
        except BackendError as e:
            self.store.jobs.finish(row.id, time.time(), FAILED, message=str(e))
            return None
        return dict(handle.data)

    async def cancel(self, row: JobRow, by: str = "its user") -> tuple[str, JobRow]:
        """Cancel the job: the state it was in when cancelled, and its row now. ``by``: who,
        as its reason will say ("cancelled by its user", "by an admin (bob)"), kept with the
        cancel's event until a running job has stopped."""
        async with self._lock:
            now = time.time()
            row = self.store.jobs.get(row.id)
            was = row.state
            if row.state == PENDING:
                return was, self.store.jobs.finish(row.id, now, CANCELLED,
                                                   message=f"cancelled by {by}")
            row = self.store.jobs.mark(row.id, now, cancel=True, detail=f"cancelled by {by}",
                                       stop=CANCEL)
            await self.backend.stop(row.id, row.attempt, self.grace_s)
            return was, row

    def _apply_exits(self, exits: list[Exit], now: float) -> None:
        with self.store.batch():  # one commit for all of them
            for ex in exits:
                self._apply_exit(ex, now)

    def _apply_exit(self, ex: Exit, now: float) -> None:
        row = self.store.jobs.get(ex.job_id)
        if row is None or row.state != RUNNING or row.attempt != ex.attempt:
            return  # an attempt already accounted for
        if row.cancel_requested:
            said = [e.detail for e in self.store.jobs.events(row.id) if e.kind == "cancel"]
        # What the job does now: one rule with the simulator's (policy/outcome.py).
        outcome = after_attempt(ex.state if ex.state != LOST else FAILED, ex.exit_code,
                                vanished=ex.state == LOST, stopping=row.preempting,
                                cancelling=row.cancel_requested)
        if outcome == CANCELLED:
            self.store.jobs.finish(row.id, now, CANCELLED, ex.exit_code,
                                   said[-1] if said and said[-1] else CANCELLED)
        elif outcome == PREEMPTED:  # our stop ended it: requeued to resume
            drained = sorted(n for n in row.placement or {} if n in self.drained)
            attempt = next((a for a in self.store.jobs.attempts(row.id)
                            if a.attempt == row.attempt), None)
            stop = attempt.stop if attempt is not None else None
            why = f"node {', '.join(drained)} was drained" if stop == DRAIN and drained \
                else STOPPED.get(stop, PREEMPTED)
            self.store.jobs.requeue(row.id, now, PREEMPTED, f"{why}; {REQUEUED}",
                                    ex.exit_code)
        elif outcome == PENDING:  # vanished while nothing stopped it: run again
            self.store.jobs.requeue(row.id, now, LOST, ex.reason or "its process vanished")
        elif row.preempting:  # ended by itself during its grace period: never run again
            if outcome == SUCCEEDED:
                self.store.jobs.finish(row.id, now, SUCCEEDED, 0,
                                       "finished by itself while being preempted")
            else:
                self.store.jobs.finish(row.id, now, FAILED, ex.exit_code,
                                       f"exited with code {ex.exit_code} while being preempted "
                                       f"(a stopped job exits 143 to be resumed)")
        else:
            self.store.jobs.finish(row.id, now, outcome, ex.exit_code, ex.reason)

    def _train_job(self, row: JobRow, idle: bool = False) -> TrainJob:
        running = row.state == RUNNING
        return TrainJob(row.id, row.project, row.gpus, user=row.user, priority=row.priority,
                        submit_time=row.submitted,
                        state=JobState.RUNNING if running else JobState.PENDING,
                        attempt=row.attempt, placement=row.placement if running else {},
                        start_time=row.started if running else None,
                        preempting=row.preempting or row.cancel_requested,
                        reserved=self.reserved.get(row.id, ()), idle=idle and running,
                        requeued=row.pending_since if row.attempt > 1 else None)


def _on_lent(jobs, starts) -> dict[str, int]:
    """Milli-GPUs each project holds on lent build GPUs after a cycle: its running jobs' and
    those just started there. The policy counts them toward no quota (they are not in its
    usage), but people see them in use."""
    project = {j.id: j.project for j in jobs}
    out: dict[str, int] = {}
    held = [(j.project, j.placement) for j in jobs if j.state == JobState.RUNNING]
    for project_name, placement in held + [(project[s.job], s.placement) for s in starts]:
        lent = sum(m for n, m in (placement or {}).items() if build_node_of(n))
        if lent:
            out[project_name] = out.get(project_name, 0) + lent
    return out


def _drained_note(nodes: list[Node], rows: list[JobRow]) -> str:
    """What a waiting job is told of drained nodes while GPUs there sit idle ("" if none)."""
    drained = {n.name: n.milli for n in nodes if n.drained}
    if not drained:
        return ""
    for row in rows:
        if row.state == RUNNING:
            for name, milli in (row.placement or {}).items():
                if name in drained:
                    drained[name] -= milli
    idle = sum(max(0, m) for m in drained.values())
    return drained_note(sorted(drained), idle) if idle else ""

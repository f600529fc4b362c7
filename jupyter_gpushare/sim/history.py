"""The pool's recorded train jobs as a trace, and what they would have done under other
settings: the pure half of ``api/history`` and ``gpushare simulate --from-pool``.

What flows in: job rows with their attempts (and, where the usage store has it, the measured
utilization of each job), the pool's projects, nodes and scheduling knobs.
The steps:
  1. ``history_entry``: one recorded job as a trace line (docs/reference/trace-format.md):
     submit time, run time as measured from its attempts, GPUs, project, user, priority,
     and what was recorded of it (queueing, utilization);
  2. ``trace_jobs``: those lines as the simulator's ``TraceJob``, times from the first submit;
  3. ``replay``: the jobs run by the simulator (the pool's own policy code) on given nodes and
     projects, and where the pool lends build GPUs, its recorded notebook sessions on its
     build pool (``replay_build.py``), so that jobs run on lent GPUs and are taken back as
     they were; ``recorded``: the same figures from what really happened;
  4. ``compare``: recorded, today's settings and the changed ones, side by side.
What flows out: JSON-able dicts. No I/O, no clocks.

A job's run time is the sum of its attempts' run times: what it held the GPUs for. A job
preempted and requeued is therefore replayed as one run of that length (its lost work is in
it). Jobs still pending have no run time yet and are left out; running ones count up to
``now``. Build sessions are the trace format's ``kind=build`` lines (``slice_history.py``
makes them from what the pool keeps of its slices), sent apart from the train jobs in
``api/history``'s ``build`` part, with the build pool's nodes and lending options.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import NamedTuple

from ..policy.model import GPU, Department, Node, PolicyConfig, Project, two_levels
from ..policy.past_use import FairShareTime
from ..policy.settings import DEFAULT_GRACE_S, PoolSettings
from .engine import SimConfig, Simulator
from .metrics import percentile
from .replay_build import BadBuild, BuildSettings, RecordedBuild, Session, TakenBack, \
    build_from, timed
from .slice_history import MAX_SESSIONS
from .trace import TraceJob

COLUMNS = ("job_id", "submit_time", "duration", "gpus", "project", "user", "priority", "kind",
           "submitted", "held_s", "queued_s", "first_start_s", "end_s", "attempts", "state",
           "utilization")


def history_entry(job, attempts, utilization: float | None, since: float, now: float,
                  grace_s: float = DEFAULT_GRACE_S,
                  checkpoint_interval_s: float = 1800.0) -> dict | None:
    """A recorded job (``job``: a JobRow; ``attempts``: its AttemptRows) as one trace line, or
    None when it never ran. ``submit_time`` is seconds from ``since``.

    ``held_s`` is how long it held its GPUs, all attempts together: the recorded allocation.
    ``duration``, the work the replay gives it, is its last attempt's run time plus what each
    earlier, preempted attempt saved under the simulator's own model of checkpoints (one every
    ``checkpoint_interval_s`` of run time, none in the grace period): a job replayed with the
    same preemptions then holds its GPUs exactly as long as it did."""
    ordered = sorted(attempts, key=lambda a: a.attempt)
    runs = [((a.ended if a.ended is not None else now) - a.started) for a in ordered]
    held = sum(runs)
    if held <= 0 or runs[-1] <= 0:
        return None
    saved = 0.0
    for ran in runs[:-1]:
        if checkpoint_interval_s > 0:
            saved += max(0.0, (ran - grace_s) // checkpoint_interval_s * checkpoint_interval_s)
    last = max((a.ended if a.ended is not None else now) for a in ordered)
    return {"job_id": job.id, "submit_time": round(job.submitted - since, 3),
            "duration": round(runs[-1] + saved, 3), "gpus": job.gpus // GPU,
            "project": job.project, "user": job.user, "priority": job.priority, "kind": "train",
            "submitted": job.submitted, "held_s": round(held, 3),
            "queued_s": round(_queued(job, ordered), 3),
            "first_start_s": round(ordered[0].started - job.submitted, 3),
            "end_s": round(last - job.submitted, 3), "attempts": len(ordered),
            "state": job.state, "utilization": None if utilization is None
            else round(utilization, 4)}


def _queued(job, attempts) -> float:
    """Seconds it waited: before its first attempt, and between an attempt's end and the next."""
    ordered = sorted(attempts, key=lambda a: a.attempt)
    waited, ready = 0.0, job.submitted
    for a in ordered:
        waited += max(0.0, a.started - ready)
        ready = a.ended if a.ended is not None else a.started
    return waited


def trace_jobs(entries: list[dict]) -> list[TraceJob]:
    """History entries (train jobs; build lines are left out) as the simulator's jobs, times
    from the first submit."""
    entries = [e for e in entries if e.get("kind", "train") == "train"]
    if not entries:
        return []
    first = min(e["submitted"] for e in entries)
    return [TraceJob(e["job_id"], e["submitted"] - first, e["duration"], e["gpus"] * GPU,
                     e["project"], e.get("user") or "", int(e.get("priority") or 0))
            for e in sorted(entries, key=lambda e: (e["submitted"], e["job_id"]))]


@dataclass(frozen=True)
class Settings:
    """What a replay runs under: the train pool's nodes, its projects and departments, and
    what decides (the pool's ``PoolSettings``, as ``api/history`` sends them)."""

    nodes: tuple[Node, ...]
    projects: tuple[Project, ...]
    cycle_interval_s: float = 0.0
    grace_s: float = DEFAULT_GRACE_S
    cycle_delay_s: float = 0.0  # the pool's decision latency (``decision_latency``)
    policy_config: PolicyConfig = field(default_factory=PolicyConfig)
    fair_share: FairShareTime | None = None
    departments: tuple[tuple[Department, tuple[str, ...]], ...] = ()
    """Each department with its projects' names."""
    decides: PoolSettings = field(default_factory=PoolSettings)
    """What the pool said decides (``api/history``'s settings), reported with the replay."""
    build: BuildSettings | None = None
    """The build pool and its lending options (``api/history``'s ``build``); None: the
    history gave none (a pool without build nodes, or one older than lending's replay)."""

    @property
    def capacity(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @property
    def lends(self) -> bool:
        """Whether the replay lends build GPUs: the pool does, and the history says how."""
        return self.decides.lend_build_gpus and self.build is not None


class Builds(NamedTuple):
    """``api/history``'s build part, checked: the build pool, its sessions (``kind=build``
    lines) and its take-backs."""

    settings: BuildSettings | None = None
    sessions: tuple[dict, ...] = ()
    take_backs: tuple[dict, ...] = ()


def recorded_builds(block) -> Builds:
    """``api/history``'s ``build`` part (None: the history has none), checked
    (``BadChange`` with one sentence)."""
    if block is None:
        return Builds()
    try:
        settings, sessions, backs = build_from(block)
    except BadBuild as e:
        raise BadChange(str(e)) from None
    return Builds(settings, tuple(sessions), tuple(backs))


def settings_from(pool: dict, projects: list[dict], knobs: dict,
                  departments: list[dict] | None = None,
                  build: BuildSettings | None = None) -> Settings:
    """Settings from the API's answers: ``api/pool`` (its train nodes), ``api/projects``,
    ``api/departments`` and the settings ``api/history`` gives (``PoolSettings``: the
    policy's knobs, the grace period, fair share over time; and its build pool, ``build``
    as ``recorded_builds`` gives it)."""
    try:
        decides = PoolSettings.from_json(knobs)
    except ValueError as e:
        raise BadChange(str(e)) from None
    nodes = tuple(Node(n["name"], int(n["gpus"])) for n in pool.get("nodes", [])
                  if n.get("pool", "train") == "train" and n.get("gpus"))
    projs = tuple(Project(p["name"], quota=round(p["quota"] * GPU),
                          over_quota_weight=int(p.get("over_quota_weight", 1)),
                          limit=None if p.get("limit") is None else round(p["limit"] * GPU),
                          priority=int(p.get("priority", 0)),
                          department=p.get("department") or "")
                  for p in projects)
    levels = tuple((Department(d["name"], quota=round(d["quota"] * GPU),
                               over_quota_weight=int(d.get("over_quota_weight", 1)),
                               limit=None if d.get("limit") is None
                               else round(d["limit"] * GPU)),
                    tuple(d.get("projects") or ()))
                   for d in departments or ())
    # The pool runs a cycle at once on every submit and every exit it sees (within 0.1 s),
    # as the simulator does with no cycle interval: its knob only spaces idle cycles.
    return Settings(nodes, projs, grace_s=decides.grace_period_s,
                    policy_config=decides.policy, fair_share=decides.fair_share,
                    departments=levels, decides=decides, build=build)


def with_capacity(settings: Settings, change: str) -> Settings:
    """``+K`` (K more GPUs), ``-K`` or ``N`` (N GPUs in all), in nodes of the pool's usual size:
    a change removes GPUs from the last nodes and adds new nodes after them. One pass, with a
    running total: its work grows with the nodes it gives, not with their square."""
    size = max((n.gpus for n in settings.nodes), default=8)
    target = settings.capacity + int(change) if change[:1] in "+-" else int(change)
    nodes, total = [], 0
    for n in settings.nodes:  # keep from the front what fits
        if total >= target:
            break
        keep = min(n.gpus, target - total)
        nodes.append(n if keep == n.gpus else Node(n.name, keep))
        total += keep
    added = 0
    while total < target:
        added += 1
        gpus = min(size, target - total)
        nodes.append(Node(f"whatif-{added}", gpus))
        total += gpus
    return replace(settings, nodes=tuple(nodes))


def with_quotas(settings: Settings, quotas: dict[str, int]) -> Settings:
    """Projects with the quotas of ``quotas`` (milli-GPUs); a project not named keeps its own,
    one not in the pool is added with default knobs."""
    known = {p.name: p for p in settings.projects}
    out = []
    for name in sorted(set(known) | set(quotas)):
        p = known.get(name) or Project(name)
        q = quotas.get(name, p.quota)
        limit = p.limit if p.limit is None or p.limit >= q else q
        out.append(Project(name, quota=q, over_quota_weight=p.over_quota_weight, limit=limit,
                           priority=p.priority, department=p.department))
    return replace(settings, projects=tuple(out))


def replay(jobs: list[TraceJob], settings: Settings, on_progress=None,
           sessions: list[Session] = (), alone: list[TakenBack] = ()):
    """The simulator's run of ``jobs`` under ``settings`` (``engine.SimRun``); where the
    settings lend build GPUs, with the build sessions ``sessions`` and the take-backs
    ``alone`` that no session followed (``replay_build.timed``) on the build pool."""
    config = SimConfig(capacity_gpus=settings.capacity, grace_s=settings.grace_s,
                       cycle_interval_s=settings.cycle_interval_s,
                       cycle_delay_s=settings.cycle_delay_s,
                       policy_config=settings.policy_config, fair_share=settings.fair_share)
    fit = [j for j in jobs if j.gpus <= settings.capacity * GPU]
    sim = Simulator(fit, {}, config, nodes=settings.nodes, projects=settings.projects,
                    on_progress=on_progress, departments=dict(settings.departments))
    if settings.lends:
        RecordedBuild(sim, settings.nodes, settings.build, list(sessions), list(alone),
                      True, settings.grace_s)
    return sim.run()


def _figures(per_job: list[tuple[str, float, float, float, float | None]], capacity: int,
             span: float, guarantee: list[float], jobs: int) -> dict:
    """``per_job``: (project, allocated GPU-s, queued s, end, utilization or None)."""
    def block(rows):
        alloc = sum(r[1] for r in rows)
        known = [r for r in rows if r[4] is not None]
        known_alloc = sum(r[1] for r in known)
        used = sum(r[1] * r[4] for r in known)
        queued = [r[2] for r in rows]
        return {"jobs": len(rows), "gpu_hours": round(alloc / 3600, 3),
                "allocation": round(alloc / (capacity * span), 4) if span and capacity else 0.0,
                "utilization": round(used / known_alloc, 4) if known_alloc else None,
                "utilization_known": round(known_alloc / alloc, 4) if alloc else None,
                "queue_avg_s": round(sum(queued) / len(queued), 2) if queued else 0.0,
                "queue_p50_s": round(percentile(queued, 50), 1),
                "queue_p95_s": round(percentile(queued, 95), 1)}

    out = block(per_job)
    out.update(capacity_gpus=capacity, jobs_total=jobs,
               guarantee_wait_p50_s=round(percentile(guarantee, 50), 1),
               guarantee_wait_p95_s=round(percentile(guarantee, 95), 1),
               guarantee_waits=len(guarantee),
               per_project={p: block([r for r in per_job if r[0] == p])
                            for p in sorted({r[0] for r in per_job})})
    return out


def recorded(entries: list[dict], capacity: int, span: float) -> dict:
    """What happened, in the figures of a replay."""
    rows = [(e["project"], e["held_s"] * e["gpus"], e["queued_s"], 0.0, e.get("utilization"))
            for e in entries]
    return _figures(rows, capacity, span, [], len(entries))


def replayed(run, entries: list[dict], span: float) -> dict:
    util = {e["job_id"]: e.get("utilization") for e in entries}
    rows = [(r.trace.project, r.allocated_gpu_s, r.queued_s, r.finish or 0.0,
             util.get(r.trace.id)) for r in run.records.values() if r.finish is not None]
    out = _figures(rows, run.config.capacity_gpus, span, list(run.guarantee_wait_s), len(entries))
    out["preemptions"] = sum(r.preemptions for r in run.records.values())
    out["unfinished"] = sum(1 for r in run.records.values() if r.finish is None)
    return out


def span_of(entries: list[dict], *runs) -> float:
    """The window the figures share: from the first submit to the last end, recorded or
    replayed."""
    if not entries:
        return 0.0
    first = min(e["submitted"] for e in entries)
    ends = [e["submitted"] - first + e["end_s"] for e in entries]
    for run in runs:
        ends += [r.finish for r in run.records.values() if r.finish is not None]
    return max(ends, default=0.0)


def compare(entries: list[dict], today: Settings, changed: Settings | None,
            on_progress=None, builds: Builds = Builds()) -> dict:
    """Recorded, replayed under today's settings and under the changed ones (with the build
    sessions of ``builds`` where they lend build GPUs); ``on_progress`` hears the share done
    (0 to 1) now and then."""
    jobs = trace_jobs(entries)
    first = min((e["submitted"] for e in entries), default=0.0)
    sessions, alone = timed(list(builds.sessions), list(builds.take_backs), first)
    parts = 2 if changed is not None else 1
    tell = (lambda i: (lambda x: on_progress((i + x) / parts))) if on_progress else \
        (lambda i: None)
    runs = [replay(jobs, today, tell(0), sessions, alone)]
    if changed is not None:
        runs.append(replay(jobs, changed, tell(1), sessions, alone))
    span = span_of(entries, *runs)
    out = {"jobs": len(entries), "span_s": round(span, 1),
           "recorded": recorded(entries, today.capacity, span),
           "today": replayed(runs[0], entries, span)}
    if changed is not None:
        out["changed"] = replayed(runs[1], entries, span)
    out["settings"] = {name: _describe(s, builds) for name, s in
                       (("today", today), ("changed", changed)) if s is not None}
    return out


def _describe(s: Settings, builds: Builds) -> dict:
    """What a replay ran under, and what of the pool's settings it could not replay."""
    out = {"capacity_gpus": s.capacity, "nodes": len(s.nodes),
           "decision_latency_s": round(s.cycle_delay_s, 4),
           "quotas": {p.name: p.quota / GPU for p in s.projects},
           "departments": {d.name: d.quota / GPU for d, _ in s.departments},
           "replayed": s.decides.to_json(), "not_replayed": []}
    if s.lends:
        out["build"] = {"gpus": s.build.gpus, "reserve": s.build.reserve,
                        "sessions": len(builds.sessions),
                        "take_backs": len(builds.take_backs)}
        if s.build.sessions_left_off:
            out["not_replayed"] = [
                f"lend_build_gpus: {s.build.sessions_left_off} build sessions beyond the "
                f"history's first {MAX_SESSIONS} were left off, so build GPUs were lent "
                f"while they held slices; replay a shorter window"]
    elif s.decides.lend_build_gpus:
        out["not_replayed"] = NOT_REPLAYED
    return out


NOT_REPLAYED = ["lend_build_gpus: the history gives no build pool (a pool older than the "
                "replay of lending), so the replay lends no build GPUs; jobs that ran on "
                "lent ones are replayed on the train pool"]


# -- the changes a what-if asks for ---------------------------------------------------------

MAX_GROWTH = 10  # a what-if's pool has at most this many times today's train GPUs


class BadChange(ValueError):
    """A capacity or quota change that cannot be replayed, in one sentence."""


def check_capacity(text) -> str | None:
    """``+K``, ``-K`` or ``N`` GPUs (a string), or None for no change."""
    if text is None or text == "":
        return None
    text = str(text).strip()
    digits = text[1:] if text[:1] in "+-" else text
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 6:
        raise BadChange(f"capacity must be +K (K more GPUs), -K or N (N GPUs in all), like +8 "
                        f"or 64, not {text[:40]!r}")
    return text


def capacity_target(today: int, change: str) -> int:
    """The GPUs a pool of ``today`` train GPUs has after ``change`` (as ``check_capacity``
    gives it), checked: at least 1 and at most ``MAX_GROWTH`` times today's. The bound keeps
    a replay's nodes, and its cost, within a sane multiple of the pool it is about."""
    if today < 1:
        raise BadChange("the pool has no train GPUs to replay on")
    target = today + int(change) if change[:1] in "+-" else int(change)
    if target < 1:
        raise BadChange(f"capacity {change} leaves {target} GPUs; the pool needs at least 1")
    most = MAX_GROWTH * today
    if target > most:
        raise BadChange(f"capacity {change} would give the pool {target} GPUs, more than "
                        f"{MAX_GROWTH} times its {today}; ask for at most +{most - today} "
                        f"(or {most} in all)")
    return target


def changed_settings(today: Settings, capacity: str | None, quotas: dict[str, int]) -> Settings:
    """Today's settings with the capacity and quotas changed, checked as the pool checks them:
    a pool of at least one GPU and at most ``MAX_GROWTH`` times today's, quotas that fit
    within it."""
    out = today
    if capacity is not None:
        capacity_target(today.capacity, capacity)
        out = with_capacity(out, capacity)
    if quotas:
        out = with_quotas(out, quotas)
    total = sum(p.quota for p in out.projects)
    if total > out.capacity * GPU:
        raise BadChange(f"the quotas add up to {total / GPU:g} GPUs but the pool would have "
                        f"{out.capacity}; lower them or add capacity")
    problem = two_levels(out.projects, [d for d, _ in out.departments]) \
        if out.departments else None
    if problem:
        raise BadChange(problem)
    return out


def quota_changes(value) -> dict[str, int]:
    """``{"project": GPUs, ...}`` (a JSON object) as milli-GPUs."""
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > 1000:
        raise BadChange("quotas must be an object of project names and GPUs, like "
                        "{\"vision\": 4}")
    out = {}
    for name, gpus in value.items():
        if not isinstance(name, str) or not 0 < len(name) <= 100:
            raise BadChange("each quota must name a project of 1 to 100 characters")
        if isinstance(gpus, bool) or not isinstance(gpus, (int, float)) or not \
                0 <= gpus <= 1_000_000:
            raise BadChange(f"the quota of {name[:40]} must be a number of GPUs from 0, not "
                            f"{str(gpus)[:40]}")
        out[name] = round(gpus * GPU)
    return out


def decision_latency(entries: list[dict]) -> float:
    """The pool's measured seconds from a change to the start it brings: the median wait of
    the jobs that started at once (within a second of their submit)."""
    quick = [e["first_start_s"] for e in entries if 0 <= e["first_start_s"] < 1.0]
    return percentile(quick, 50) if quick else 0.0


def what_if(pool: dict, projects: list[dict], knobs: dict, entries: list[dict],
            capacity: str | None, quotas: dict[str, int], on_progress=None,
            departments: list[dict] | None = None, build: dict | None = None) -> dict:
    """The whole what-if from the API's answers: today's settings, the changed ones, both
    replays side by side (``compare``). ``build``: ``api/history``'s build part."""
    builds = recorded_builds(build)
    today = replace(settings_from(pool, projects, knobs, departments, builds.settings),
                    cycle_delay_s=decision_latency(entries))
    if today.capacity < 1:
        raise BadChange("the pool has no train GPUs to replay on")
    changed = changed_settings(today, capacity, quotas) if (capacity or quotas) else None
    return compare(entries, today, changed, on_progress, builds)

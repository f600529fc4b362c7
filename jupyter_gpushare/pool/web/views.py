"""What the API shows of a job, a project and a build slice: plain data from a stored row and
what the scheduler and the meter say of it (paths and shapes: web/openapi.py).

A job's answer depends on its row and on ``JobSays``, and on nothing else: the job lists keep
each job's JSON while both are unchanged (``web/job_lists.py``), so whatever a new field needs
beyond the row goes into ``JobSays``, and the cache sees it change."""

from __future__ import annotations

from typing import NamedTuple

from ...backends.ranks import world_size
from ...policy.model import GPU
from ...trainjob import ACTIVE, FAILED, PENDING, RUNNING
from ..store.models import DepartmentRow, JobRow, ProjectRow, SliceRow
from ..train.scheduler import Explanation


class JobSays(NamedTuple):
    """What the last cycle and the usage meter say of a job: all a job's answer takes beyond
    its row."""

    queue_position: int | None
    reason: str
    usage: dict | None


def job_says(row: JobRow, explained: Explanation, meter) -> JobSays:
    return JobSays(explained.positions.get(row.id) if row.state == PENDING else None,
                   why_text(row, explained),
                   meter.holder_now("job", f"{row.id}/{row.attempt}")
                   if row.state == RUNNING else None)


def job_json(row: JobRow, says: JobSays, full: bool) -> dict:
    """A job as its owner and admins see it (``full``: with its command, environment,
    working folder and request id), or as other members of its project do."""
    out = {
        "id": row.id, "name": row.name, "user": row.user, "project": row.project,
        "gpus": row.gpus / GPU, "priority": row.priority, "state": row.state,
        "attempt": row.attempt, "submitted": row.submitted, "started": row.started,
        "finished": row.finished, "exit_code": row.exit_code,
        "placement": {n: m / GPU for n, m in (row.placement or {}).items()},
        "preempting": bool(row.preempting),
        "per_gpu": bool(row.per_gpu),
        "ranks": world_size(row.placement, row.per_gpu) if row.placement else None,
        "queue_position": says.queue_position,
        "reason": says.reason if full or row.state != FAILED else shared_failure(row),
        "usage": says.usage,
        # Why this is not the first attempt ("preempted; requeued to resume ..."), for
        # front ends that follow a job across attempts.
        "requeued": (row.message or None) if row.attempt > 1 and row.state in
        ACTIVE else None,
    }
    if full:
        out["command"] = row.command
        out["env"] = row.env
        out["workdir"] = row.workdir
        out["request_id"] = row.request_id
    return out


def shared_failure(row: JobRow) -> str:
    """Why a job failed, as its project's other members see it: the full reason can quote its
    command line and working folder ("cannot run /opt/deploy --key=...: No such file"),
    which only its owner and admins see."""
    code = f" with exit code {row.exit_code}" if row.exit_code is not None else ""
    return f"failed{code}; its owner and admins can see why"


def why_text(row: JobRow, explained: Explanation) -> str:
    if row.state == PENDING:
        return explained.reasons.get(row.id, "waiting for the next scheduling cycle")
    if row.state == RUNNING:
        if row.cancel_requested:
            return "stopping: cancelled"
        if row.preempting:
            return "stopping: preempted, it will be requeued"
        return explained.starting.get(row.id, "")  # e.g. Kubernetes has not placed its pod yet
    return row.message or ""


def project_json(p: ProjectRow, explained: Explanation, pending: int) -> dict:
    """A project as the API shows it. ``in_use`` is every GPU its jobs hold, on lent build
    GPUs too (``lent``, part of ``borrowed``: only jobs beyond their quota run there)."""
    used, lent = explained.usage.get(p.name, 0), explained.lent.get(p.name, 0)
    return {"name": p.name, "quota": p.quota / GPU, "over_quota_weight": p.over_quota_weight,
            "limit": None if p.limit is None else p.limit / GPU, "priority": p.priority,
            "job_priority_min": p.job_priority_min, "job_priority_max": p.job_priority_max,
            "groups": list(p.groups or ()), "in_use": (used + lent) / GPU,
            "borrowed": (max(0, used - p.quota) + lent) / GPU, "lent": lent / GPU,
            "deserved": explained.deserved.get(p.name, 0) / GPU, "pending": pending,
            "department": p.department or None}


def department_json(d: DepartmentRow, members: list[str], explained: Explanation) -> dict:
    """A department as the API shows it: what admins set, and what its projects use and
    deserve together now."""
    used = sum(explained.usage.get(m, 0) for m in members)
    lent = sum(explained.lent.get(m, 0) for m in members)
    return {"name": d.name, "quota": d.quota / GPU, "over_quota_weight": d.over_quota_weight,
            "limit": None if d.limit is None else d.limit / GPU, "projects": list(members),
            "in_use": (used + lent) / GPU, "borrowed": (max(0, used - d.quota) + lent) / GPU,
            "lent": lent / GPU,
            "deserved": sum(explained.deserved.get(m, 0) for m in members) / GPU}


def slice_json(row: SliceRow, uuid: str | None, usage: dict | None, cull: dict | None) -> dict:
    """A slice as the API shows it; ``uuid`` names its GPU where the pool's machine can
    (pinned slices need it), else null."""
    return {"id": row.id, "user": row.user, "server": row.server, "gpus": row.milli / GPU,
            "node": row.node, "gpu": row.gpu, "uuid": uuid, "created": row.created,
            "pid": row.pid, "usage": usage, "cull": cull}

"""Projects as admins set them: one ``ProjectSpec``, one set of rules, whether the project
comes from the configuration (``PoolService.projects``) or the API (``PUT api/projects``).

A project is a queue of the train pool: ``quota`` GPUs guaranteed, ``limit`` at most (or
none), ``over_quota_weight`` for its share of borrowed GPUs, ``priority`` against other
projects, members from JupyterHub ``groups``, and the range of priorities its members may give
their jobs. Every problem is one sentence that says what to do (``Invalid``)."""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field, replace

from ... import trainjob
from ...policy.model import GPU
from ...validate import Invalid, _gpus_amount, _int, _unknown
from ..store.models import ProjectRow

FIELDS = {"quota", "over_quota_weight", "limit", "priority", "groups", "job_priority_min",
          "job_priority_max"}
MAX_GROUPS = 64  # member groups of one project
JOB_PRIORITY = trainjob.PRIORITY  # what a project's job priority range may span
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}\Z")


@dataclass(frozen=True)
class ProjectSpec:
    """Amounts in milli-GPUs, as the store keeps them."""

    name: str
    quota: int = 0
    groups: tuple[str, ...] = field(default=())  # () means the group named like the project
    over_quota_weight: int = 1
    limit: int | None = None
    priority: int = 0
    job_priority_min: int = -100
    job_priority_max: int = 0

    def row(self, updated: float | None = None) -> ProjectRow:
        fields = asdict(self)
        fields["groups"] = list(self.groups or (self.name,))
        return ProjectRow(**fields, updated=time.time() if updated is None else updated)

    @classmethod
    def of(cls, row: ProjectRow) -> "ProjectSpec":
        return cls(row.name, row.quota, tuple(row.groups or ()), row.over_quota_weight,
                   row.limit, row.priority, row.job_priority_min, row.job_priority_max)


def project_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        shown = name[:100] if isinstance(name, str) else name
        raise Invalid(f"project name {shown!r} must be 1-100 letters, digits, '.', '_' or '-'")
    return name


def quota_changes(body, fields) -> dict:
    """The body of a project's or a department's change checked as a JSON object of
    ``fields``, and its quota, limit and weight (GPUs in, milli-GPUs out); the caller checks
    its other fields."""
    if not isinstance(body, dict) or not body:
        raise Invalid("the body must be a JSON object with one or more of "
                      + ", ".join(sorted(fields)))
    _unknown(body, fields)
    out = {}
    if "quota" in body:
        out["quota"] = _gpus_amount(body["quota"], "quota")
    if "limit" in body:
        out["limit"] = None if body["limit"] is None else _gpus_amount(body["limit"], "limit")
    if "over_quota_weight" in body:
        out["over_quota_weight"] = _int(body["over_quota_weight"], "over_quota_weight", 0, 1000)
    return out


def changes(body, current: ProjectSpec | None) -> dict:
    """The checked changes a body asks of a project (GPUs in it, milli-GPUs out): the fields
    of ``PUT api/projects/{name}``, or of a project in ``PoolService.projects``. ``current``:
    the project as it is, or None for a new one; the result must hold with it."""
    out = quota_changes(body, FIELDS)
    if "priority" in body:
        out["priority"] = _int(body["priority"], "priority", -1000, 1000)
    if "groups" in body:
        groups = body["groups"]
        if not isinstance(groups, list) or not all(isinstance(g, str) and g for g in groups):
            raise Invalid("groups must be a list of JupyterHub group names")
        if len(groups) > MAX_GROUPS or any(len(g) > 255 for g in groups):
            raise Invalid(f"a project takes at most {MAX_GROUPS} groups, each name of at most "
                          f"255 characters; give fewer or shorter names")
        out["groups"] = sorted(set(groups))
    for end in ("job_priority_min", "job_priority_max"):
        if end in body:
            out[end] = _int(body[end], end, *JOB_PRIORITY)
    merged = replace(current or ProjectSpec(""), **out)
    if merged.job_priority_min > merged.job_priority_max:
        raise Invalid(f"job_priority_min ({merged.job_priority_min}) may not be above "
                      f"job_priority_max ({merged.job_priority_max})")
    if merged.limit is not None and merged.limit < merged.quota:
        raise Invalid(f"limit ({merged.limit / GPU:g} GPUs) may not be below the quota "
                      f"({merged.quota / GPU:g} GPUs); raise the limit or lower the quota")
    return out


def configured(projects: dict) -> dict[str, ProjectSpec]:
    """``PoolService.projects`` checked by the same rules as the API; ``Invalid`` naming the
    project otherwise."""
    out = {}
    for name, value in projects.items():
        try:
            project_name(name)
            if not isinstance(value, dict):
                raise Invalid(f"must be a dict like {{'quota': 2, 'groups': ['{name}']}}")
            out[name] = replace(ProjectSpec(name), **changes(value, None)) if value else \
                ProjectSpec(name)
        except Invalid as e:
            raise Invalid(f"PoolService.projects[{name!r}]: {e}") from None
    return out

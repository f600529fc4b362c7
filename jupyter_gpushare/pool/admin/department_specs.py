"""Departments as admins set them: one ``DepartmentSpec`` and one set of rules, whether the
department comes from the configuration (``PoolService.departments``) or the API
(``PUT api/departments/{name}``).

A department is a second level of quotas over projects (``policy/departments.py``):
``quota`` GPUs guaranteed to its ``projects`` together, ``limit`` on what they hold together
(or none), ``over_quota_weight`` for its share of idle GPUs. A project belongs to at most one
department. Every problem is one sentence that says what to do (``Invalid``)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...policy.model import GPU, Department
from ...validate import Invalid
from ..store.models import DepartmentRow
from .project_specs import project_name, quota_changes

FIELDS = {"quota", "over_quota_weight", "limit", "projects"}
MAX_MEMBERS = 1000  # projects of one department
MAX_DEPARTMENTS = 1000  # departments of one pool


@dataclass(frozen=True)
class DepartmentSpec:
    """Amounts in milli-GPUs, as the store keeps them."""

    name: str
    quota: int = 0
    over_quota_weight: int = 1
    limit: int | None = None
    projects: tuple[str, ...] = ()

    def policy(self) -> Department:
        return Department(self.name, self.quota, self.over_quota_weight, self.limit)

    @classmethod
    def of(cls, row: DepartmentRow, members) -> "DepartmentSpec":
        return cls(row.name, row.quota, row.over_quota_weight, row.limit, tuple(members))


def department_name(name: str) -> str:
    try:
        return project_name(name)
    except Invalid:
        shown = name[:100] if isinstance(name, str) else name
        raise Invalid(f"department name {shown!r} must be 1-100 letters, digits, '.', '_' or "
                      f"'-'") from None


def changes(body, current: DepartmentSpec | None) -> dict:
    """The checked changes a body asks of a department (GPUs in it, milli-GPUs out): the
    fields of ``PUT api/departments/{name}``, or of a department in
    ``PoolService.departments``; the result must hold with ``current`` (None: a new one)."""
    out = quota_changes(body, FIELDS)
    if "projects" in body:
        projects = body["projects"]
        if not isinstance(projects, list) or not all(isinstance(p, str) for p in projects):
            raise Invalid("projects must be a list of project names")
        if len(projects) > MAX_MEMBERS:
            raise Invalid(f"a department takes at most {MAX_MEMBERS} projects; give fewer")
        out["projects"] = tuple(sorted({project_name(p) for p in projects}))
    merged = replace(current or DepartmentSpec(""), **out)
    if merged.limit is not None and merged.limit < merged.quota:
        raise Invalid(f"limit ({merged.limit / GPU:g} GPUs) may not be below the quota "
                      f"({merged.quota / GPU:g} GPUs); raise the limit or lower the quota")
    return out


def configured(departments: dict) -> dict[str, DepartmentSpec]:
    """``PoolService.departments`` checked by the same rules as the API, and no project in two
    departments; ``Invalid`` naming the department otherwise."""
    out, home = {}, {}
    for name, value in departments.items():
        try:
            department_name(name)
            if not isinstance(value, dict):
                raise Invalid("must be a dict like {'quota': 8, 'projects': ['vision']}")
            spec = replace(DepartmentSpec(name), **changes(value, None)) if value else \
                DepartmentSpec(name)
        except Invalid as e:
            raise Invalid(f"PoolService.departments[{name!r}]: {e}") from None
        for project in spec.projects:
            if project in home:
                raise Invalid(f"PoolService.departments: project {project} is in both "
                              f"{home[project]} and {name}; a project belongs to at most one "
                              f"department")
            home[project] = name
        out[name] = spec
    return out

"""What pool admins change, whatever asks for it: the REST API (``web/api_jobs.py``,
``web/api_admin.py``) and the dashboard's forms (``web/dashboard_pages.py``) call these, so that
both check the same rules, say the same sentences (``Invalid``, with the HTTP status to answer) and
leave the same entry in the audit trail: who changed what, when, through which door (``via``),
before and after."""

from __future__ import annotations

import time
from dataclasses import replace

from ...policy.departments import guaranteed, two_levels
from ...policy.model import GPU, TRAIN, Project
from ...policy.quotas import overbooking
from ...trainjob import ACTIVE, RUNNING
from ...validate import Invalid
from ..store.models import DrainRow, JobRow, ProjectRow
from . import department_specs as D
from .project_specs import ProjectSpec, changes, project_name

# The doors a change comes through ("lending": a notebook server took back a lent build GPU)
VIA = ("api", "dashboard", "cli", "config", "culling", "lending")
CONFIGURATION = "configuration"  # who changes projects through PoolService.projects
CULLING = "gpushare (culling)"  # who stops idle notebook servers


def record(store, who: str, action: str, target: str, before: dict | None,
           after: dict | None, via: str, address: str = "") -> None:
    """One entry of the audit trail."""
    if via not in VIA:
        raise ValueError(f"via must be one of {', '.join(VIA)}, not {via!r}")
    store.audit.add(time.time(), who, action, target, before, after, via, address)


def _shown(spec: ProjectSpec, keys) -> dict:
    """A project's fields as admins set them: GPUs, not milli-GPUs."""
    out = {}
    for key in sorted(keys):
        value = getattr(spec, key)
        if key in ("quota", "limit") and value is not None:
            value = value / GPU
        out[key] = list(value) if isinstance(value, tuple) else value
    return out


def project_changes(store, scheduler, name: str, body) -> tuple[ProjectSpec | None, dict]:
    """The project as it is (None: a new one) and the checked fields ``body`` changes;
    a quota that would overbook the train pool is refused (409) before anything is stored."""
    project_name(name)
    row = store.quotas.project(name)
    current = None if row is None else ProjectSpec.of(row)
    fields = changes(body, current)
    if "quota" in fields:
        projects = [Project(p.name, fields["quota"] if p.name == name else p.quota,
                            department=p.department or "") for p in store.quotas.projects()]
        if current is None:
            projects.append(Project(name, fields["quota"]))
        check_levels(projects, stored_levels(store), scheduler.train_capacity(),
                     "lower another project's quota first")
    return current, fields


def stored_levels(store, but: str | None = None) -> list:
    """The store's departments as the policy takes them, but ``but``; one that is not valid
    (edited by hand) is refused (409) with what to do."""
    out = []
    for d in store.quotas.departments():
        if d.name == but:
            continue
        try:
            out.append(D.DepartmentSpec.of(d, ()).policy())
        except ValueError as e:
            raise Invalid(f"the store holds a department that is not valid ({e}); fix it first "
                          f"with PUT api/departments/{d.name}", 409) from None
    return out


def levels_problem(projects, departments, capacity: int | None = None
                   ) -> tuple[str, bool] | None:
    """The one check of projects and departments together, wherever they come from (the
    configuration at start, an admin's change, the store each cycle): the problem, and
    whether it is the train pool's ``capacity`` they overbook (None: they make two levels
    within it; capacity None: not checked)."""
    problem = two_levels(projects, departments)
    if problem:
        return problem, False
    if capacity is not None:
        problem = overbooking(guaranteed(projects, departments), capacity)
        if problem:
            return problem, True
    return None


def check_levels(projects, departments, capacity: int, then: str) -> None:
    """Refuse (409) quotas that do not make two levels, or that overbook the train pool."""
    found = levels_problem(projects, departments, capacity)
    if found:
        problem, overbooked = found
        raise Invalid(f"{problem}: {then}" if overbooked else problem, 409)


def policy_levels(project_rows, department_rows) -> tuple[tuple, tuple, str | None]:
    """The store's projects and departments as the policy takes them, each cycle. The API
    refuses departments that do not make two levels, but a store edited by hand may hold
    them: then the departments are left out, with the problem to log."""
    departments, problem = [], None
    for row in department_rows:
        try:
            departments.append(D.DepartmentSpec.of(row, ()).policy())
        except ValueError as e:
            problem = str(e)
    named = {d.name for d in departments}
    projects = tuple(Project(p.name, p.quota, p.over_quota_weight, p.limit, p.priority,
                             p.department if p.department in named else "")
                     for p in project_rows)
    if problem is None and departments:
        found = levels_problem(projects, departments)
        problem = found and found[0]
    if problem:
        return tuple(replace(p, department="") for p in projects), (), problem
    return projects, tuple(departments), None


def change_project(store, scheduler, name: str, body, who: str, via: str,
                   address: str = "") -> ProjectRow:
    """Create or change project ``name`` as ``body`` asks (``PUT api/projects/{name}``), by
    ``who`` through ``via`` (from ``address``), noted in the audit trail."""
    current, fields = project_changes(store, scheduler, name, body)
    if current:
        row = store.quotas.update_project(name, fields, time.time())
        after = ProjectSpec.of(row)
        changed = {k for k in fields if getattr(current, k) != getattr(after, k)}
        if changed:
            record(store, who, "change project", name, _shown(current, changed),
                   _shown(after, changed), via, address)
    else:
        store.quotas.add_missing_projects([ProjectSpec(name, **fields).row()])
        row = store.quotas.project(name)
        record(store, who, "create project", name, None, _project(row), via, address)
    scheduler.wake()
    return row


def _project(row: ProjectRow) -> dict:
    spec = ProjectSpec.of(row)
    return _shown(spec, [k for k in vars(spec) if k != "name"])


def department_changes(store, scheduler, name: str, body
                       ) -> tuple[D.DepartmentSpec | None, dict]:
    """The department as it is (None: a new one) and the checked fields ``body`` changes;
    projects that do not exist or belong to another department, and quotas that do not make
    two levels or overbook the pool, are refused (409) before anything is stored."""
    D.department_name(name)
    row = store.quotas.department(name)
    current = None if row is None else D.DepartmentSpec.of(row, store.quotas.members(name))
    fields = D.changes(body, current)
    if current is None and len(store.quotas.departments()) >= D.MAX_DEPARTMENTS:
        raise Invalid(f"the pool has {D.MAX_DEPARTMENTS} departments, the most it takes; "
                      f"remove one first", 409)
    after = replace(current or D.DepartmentSpec(name), **fields)
    if current is not None and not {"quota", "projects"} & set(fields):
        return current, fields  # a limit or a weight: no guarantee changes
    known = {p.name: p for p in store.quotas.projects()}
    for project in after.projects:
        if project not in known:
            raise Invalid(f"project {project} does not exist; create it first "
                          f"(PUT api/projects/{project})", 409)
        home = known[project].department
        if home and home != name:
            raise Invalid(f"project {project} belongs to department {home}; take it out of "
                          f"{home} first (a project belongs to at most one department)", 409)
    members = set(after.projects)
    projects = [Project(p.name, p.quota, department=name if p.name in members else
                        ("" if p.department == name else p.department or ""))
                for p in known.values()]
    departments = stored_levels(store, but=name) + [after.policy()]
    check_levels(projects, departments, scheduler.train_capacity(),
                 "lower another department's or project's quota first")
    return current, fields


def change_department(store, scheduler, name: str, body, who: str, via: str,
                      address: str = "") -> D.DepartmentSpec:
    """Create or change department ``name`` as ``body`` asks (``PUT api/departments/{name}``),
    noted in the audit trail."""
    current, fields = department_changes(store, scheduler, name, body)
    members = list(fields.pop("projects")) if "projects" in fields else None
    row = store.quotas.put_department(name, fields, members, time.time())
    after = D.DepartmentSpec.of(row, store.quotas.members(name))
    if current is None:
        record(store, who, "create department", name, None, _department(after), via, address)
    else:
        changed = {k for k in D.FIELDS if getattr(current, k) != getattr(after, k)}
        if changed:
            record(store, who, "change department", name, _department(current, changed),
                   _department(after, changed), via, address)
    scheduler.wake()
    return after


def delete_department(store, scheduler, name: str, who: str, via: str,
                      address: str = "") -> D.DepartmentSpec:
    """Remove department ``name`` (``DELETE api/departments/{name}``): its projects keep their
    quotas, on one level; 404 if there is none."""
    D.department_name(name)
    row = store.quotas.department(name)
    if row is None:
        raise Invalid(f"there is no department {name}", 404)
    before = D.DepartmentSpec.of(row, store.quotas.members(name))
    store.quotas.delete_department(name)
    record(store, who, "delete department", name, _department(before), None, via, address)
    scheduler.wake()
    return before


def _department(spec: D.DepartmentSpec, keys=None) -> dict:
    """A department's fields as admins set them: GPUs, not milli-GPUs."""
    out = {}
    for key in sorted(keys or D.FIELDS):
        value = getattr(spec, key)
        if key in ("quota", "limit") and value is not None:
            value = value / GPU
        out[key] = list(value) if isinstance(value, tuple) else value
    return out


def configured_departments(store, departments) -> list[str]:
    """Create the departments of ``PoolService.departments`` the store does not have yet,
    with their projects (those it has keep what admins set since)."""
    created = []
    for spec in departments:
        if store.quotas.department(spec.name) is None:
            fields = {"quota": spec.quota, "limit": spec.limit,
                      "over_quota_weight": spec.over_quota_weight}
            store.quotas.put_department(spec.name, fields, list(spec.projects), time.time())
            record(store, CONFIGURATION, "create department", spec.name, None,
                   _department(spec), "config")
            created.append(spec.name)
    return created


def configured_projects(store, projects) -> list[str]:
    """Create the projects of ``PoolService.projects`` the store does not have yet (those it
    has keep what admins set since), each noted as the configuration's doing."""
    created = store.quotas.add_missing_projects(p.row() for p in projects)
    for name in created:
        record(store, CONFIGURATION, "create project", name, None,
               _project(store.quotas.project(name)), "config")
    return created


async def cancel_job(store, scheduler, row: JobRow, who: str, owner: bool, via: str,
                     address: str = "") -> JobRow:
    """Cancel a job (``DELETE api/jobs/{id}``); an admin's cancel of someone else's job
    (``owner`` False) is noted in the audit trail."""
    cancellable(row)
    was, done = await scheduler.cancel(row, "its user" if owner else f"an admin ({who})")
    if not owner:  # a running job stops within its grace period: "stopping" until then
        before = {"state": was, "user": row.user, "project": row.project}
        after = done.state if done.state != RUNNING else "stopping (cancelled)"
        record(store, who, "cancel job", row.id, before, {"state": after}, via, address)
    return done


def drain_body(body) -> tuple[bool, bool]:
    """``{"drained": true|false, "requeue": false}`` checked: (drained, requeue)."""
    if not isinstance(body, dict) or "drained" not in body:
        raise Invalid('the body must be a JSON object like {"drained": true}, with "requeue": '
                      'true to requeue the jobs that run there now')
    unknown = sorted(set(body) - {"drained", "requeue"})
    if unknown:
        raise Invalid(f"unknown field(s) {', '.join(unknown)}; the fields are drained and "
                      f"requeue")
    drained, requeue = body["drained"], body.get("requeue", False)
    if not isinstance(drained, bool):
        raise Invalid(f"drained must be true or false, not {drained!r}")
    if not isinstance(requeue, bool):
        raise Invalid(f"requeue must be true or false, not {requeue!r}")
    if requeue and not drained:
        raise Invalid("requeue goes with drained: true (it stops the jobs on a node being "
                      "drained); leave it out to undrain")
    return drained, requeue


def _drain_json(row: DrainRow | None) -> dict:
    return {"drained": False} if row is None else \
        {"drained": True, "by": row.by, "since": row.since}


async def set_drained(store, scheduler, node: str, body, who: str, via: str,
                      address: str = "") -> dict:
    """Drain or undrain train node ``node`` as ``body`` asks (``PUT api/nodes/{node}``),
    noted in the audit trail; the node as ``api/pool`` shows its drain, and the jobs told to
    stop (with ``requeue``)."""
    drained, requeue = drain_body(body)
    train = {n.name for n in scheduler.backend.nodes() if n.pool == TRAIN}
    if node not in train and (drained or node not in scheduler.drained):
        # a node drained before it left the pool may still be undrained
        raise Invalid(f"there is no train node {node!r}; gpushare pool lists them", 404)
    stopped: list[str] = []
    if drained:
        row, stopped, was = await scheduler.drain(node, who, requeue)
    else:
        row = None
        was = await scheduler.undrain(node) is not None
    if was != drained or stopped:
        after = {"drained": drained, **({"requeued": stopped} if requeue else {})}
        record(store, who, "drain node" if drained else "undrain node", node,
               {"drained": was}, after, via, address)
    return {"name": node, **_drain_json(row), "requeued": stopped}


def cancellable(row: JobRow) -> None:
    """Refuses (409) a job that has ended: there is nothing left to cancel."""
    if row.state not in ACTIVE:
        raise Invalid(f"job {row.id} has already ended ({row.state})", 409)

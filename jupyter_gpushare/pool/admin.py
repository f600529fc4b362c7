"""What pool admins change, whatever asks for it: the REST API (``api.py``) and the dashboard's
forms (``dashboard.py``) call these, so that both check the same rules and say the same
sentences (``Invalid``, with the HTTP status to answer)."""

from __future__ import annotations

import time

from ..policy.quotas import overbooking
from ..trainjob import ACTIVE
from .models import JobRow, ProjectRow
from .projects import ProjectSpec, changes, project_name
from .validate import Invalid


def project_changes(store, scheduler, name: str, body) -> tuple[ProjectSpec | None, dict]:
    """The project as it is (None: a new one) and the checked fields ``body`` changes;
    a quota that would overbook the train pool is refused (409) before anything is stored."""
    project_name(name)
    row = store.project(name)
    current = None if row is None else ProjectSpec.of(row)
    fields = changes(body, current)
    if "quota" in fields:
        quotas = [p.quota for p in store.projects() if p.name != name]
        problem = overbooking([*quotas, fields["quota"]], scheduler.train_capacity())
        if problem:
            raise Invalid(f"{problem}: lower another project's quota first", 409)
    return current, fields


def change_project(store, scheduler, name: str, body) -> ProjectRow:
    """Create or change project ``name`` as ``body`` asks (``PUT api/projects/{name}``)."""
    current, fields = project_changes(store, scheduler, name, body)
    if current:
        row = store.update_project(name, fields, time.time())
    else:
        store.add_missing_projects([ProjectSpec(name, **fields).row()])
        row = store.project(name)
    scheduler.wake()
    return row


async def cancel_job(scheduler, row: JobRow) -> JobRow:
    """Cancel a job that has not ended (``DELETE api/jobs/{id}``, the dashboard's cancel);
    whoever asks must own it or be an admin (the caller checks); an ended job: 409."""
    cancellable(row)
    return await scheduler.cancel(row)


def cancellable(row: JobRow) -> None:
    """Refuses (409) a job that has ended: there is nothing left to cancel."""
    if row.state not in ACTIVE:
        raise Invalid(f"job {row.id} has already ended ({row.state})", 409)

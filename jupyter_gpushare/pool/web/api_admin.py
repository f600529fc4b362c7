"""REST handlers of the admins' console: ``GET api/audit`` (the audit trail), ``PUT
api/nodes/{node}`` (drain a train node), admins only, and departments (``GET
api/departments``, anyone; ``PUT``/``DELETE api/departments/{name}``, admins) (paths and
shapes: web/openapi.py). What they change goes through ``admin/changes.py``, as the dashboard's
forms do."""

from __future__ import annotations

import time

from ...policy.model import GPU
from ...validate import Invalid, digits
from ..admin.changes import change_department, delete_department, set_drained
from ..admin.department_specs import DepartmentSpec, department_name
from ..store.models import AuditRow
from .api_usage import parse_time
from .handlers import ServiceHandler
from .views import department_json

MAX_ENTRIES = 1000


def audit_json(row: AuditRow) -> dict:
    return {"id": row.id, "at": row.at, "who": row.who, "action": row.action,
            "target": row.target, "before": row.before, "after": row.after, "via": row.via,
            "address": row.address or None}


def audit_query(args: dict[str, str], now: float) -> dict:
    """The checked query of ``GET api/audit`` (``Invalid`` with one sentence otherwise)."""
    unknown = sorted(set(args) - {"since", "limit", "before"})
    if unknown:
        raise Invalid(f"unknown parameter(s) {', '.join(unknown)}; the parameters are since, "
                      f"limit and before")
    since = parse_time(args["since"], now, "since") if args.get("since") else None
    limit = args.get("limit", "100")
    if not digits(limit, 4) or not 1 <= int(limit) <= MAX_ENTRIES:
        raise Invalid(f"limit must be a whole number from 1 to {MAX_ENTRIES}, not "
                      f"{limit[:40]!r}")
    before = args.get("before")
    if before is not None and not digits(before, 18):
        raise Invalid(f"before must be an entry's id (the next of the last answer), not "
                      f"{before[:40]!r}")
    return {"since": since, "limit": int(limit),
            "before_id": None if before is None else int(before)}


def audit_listing(store, since: float | None, before_id: int | None, limit: int) -> dict:
    """``GET api/audit``'s answer (the dashboard shows the same): the newest ``limit``
    entries from ``since`` on, older than entry ``before_id``, and ``next``, the id to ask
    ``before`` for the page after them (None on the last page)."""
    rows = store.audit.newest(since, before_id, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    return {"entries": [audit_json(r) for r in rows], "next": rows[-1].id if more else None}


class AuditHandler(ServiceHandler):
    def get(self):
        if not self.who.admin:
            self.fail(403, "only admins can read the audit trail")
        args = {k: self.get_argument(k) for k in self.request.query_arguments}
        try:
            q = audit_query(args, time.time())
        except Invalid as e:
            self.fail(e.status, str(e))
        self.reply(audit_listing(self.store, **q))


class NodeHandler(ServiceHandler):
    async def put(self, node):
        if not self.who.admin:
            self.fail(403, "only admins can drain or undrain nodes")
        try:
            answer = await set_drained(self.store, self.scheduler, node, self.body(),
                                       self.who.name, self.via(), self.client_address())
        except Invalid as e:
            self.fail(e.status, str(e))
        self.reply(answer)


class DepartmentsHandler(ServiceHandler):
    def get(self):
        store, explained = self.store, self.scheduler.explained
        self.reply({"departments": [department_json(d, store.quotas.members(d.name), explained)
                                    for d in store.quotas.departments()]})


class DepartmentHandler(ServiceHandler):
    def get(self, name):
        row = self._row(name)
        self.reply(department_json(row, self.store.quotas.members(row.name),
                                   self.scheduler.explained))

    def put(self, name):
        if not self.who.admin:
            self.fail(403, "only admins can change departments")
        try:
            spec = change_department(self.store, self.scheduler, name, self.body(),
                                     self.who.name, self.via(), self.client_address())
        except Invalid as e:
            self.fail(e.status, str(e))
        self._reply(spec)

    def delete(self, name):
        if not self.who.admin:
            self.fail(403, "only admins can remove departments")
        try:
            spec = delete_department(self.store, self.scheduler, name, self.who.name,
                                     self.via(), self.client_address())
        except Invalid as e:
            self.fail(e.status, str(e))
        self._reply(spec)

    def _row(self, name: str):
        try:
            row = self.store.quotas.department(department_name(name))
        except Invalid:
            row = None
        if row is None:
            self.fail(404, f"there is no department {name[:100]}")
        return row

    def _reply(self, spec: DepartmentSpec):
        row = self.store.quotas.department(spec.name)
        if row is None:  # removed: what it was
            self.reply({"name": spec.name, "quota": spec.quota / GPU,
                        "over_quota_weight": spec.over_quota_weight,
                        "limit": None if spec.limit is None else spec.limit / GPU,
                        "projects": list(spec.projects), "in_use": 0, "borrowed": 0,
                        "deserved": 0})
            return
        self.reply(department_json(row, list(spec.projects), self.scheduler.explained))


def routes(prefix: str) -> list:
    p = prefix.rstrip("/")
    return [(rf"{p}/api/audit", AuditHandler), (rf"{p}/api/nodes/([^/]+)", NodeHandler),
            (rf"{p}/api/departments", DepartmentsHandler),
            (rf"{p}/api/departments/([^/]+)", DepartmentHandler)]

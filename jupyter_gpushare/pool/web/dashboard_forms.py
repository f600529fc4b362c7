"""The admin's forms in the dashboard: create or change a project (a preview first, then save),
change a department's numbers (likewise) and cancel a job, for pool admins signed in through the hub's OAuth, as
``web/dashboard_pages.py``'s page is.

Routes under the service's prefix:
  ``dashboard/project`` (``?name=vision`` to change one; none: a new one): the form; a post
  with ``step=preview`` says what saving would do, ``step=save`` stores it, ``step=edit``
  shows the form again with the values posted;
  ``dashboard/department?name=research``: its quota, limit and weight, as the project's;
  ``dashboard/jobs/{id}/cancel``: asks first; a post cancels;
  ``dashboard/nodes/{node}/drain``: asks first (to drain, with a box to requeue what runs
  there; to undrain a drained node); a post (``drained=1|0``, ``requeue=1``) does it.

Every post must carry the page's XSRF token (``_xsrf``, checked as JupyterHub checks its own:
tied to the login cookie), or it is refused (403) before anything else; a request with a
token in its Authorization header needs none, as for the REST API. The rules and sentences
are the API's: a project's changes go through ``admin/changes.py`` (as ``PUT
api/projects/{name}``), a department's too (as ``PUT api/departments/{name}``), a cancel through ``admin.cancel_job`` (as ``DELETE api/jobs/{id}``), a
drain through ``admin.set_drained`` (as ``PUT api/nodes/{node}``). A refused change shows the form
again with the sentence and the values as typed; nothing is stored.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from tornado import web

from ...dashboard import drain, forms
from ...dashboard.page import form_page
from ...policy.model import GPU, TRAIN
from ...trainjob import RUNNING
from ...validate import Invalid
from ..admin.changes import (cancel_job, cancellable, change_department, change_project,
                              department_changes, project_changes, set_drained)
from ..admin.department_specs import DepartmentSpec
from ..admin.project_specs import ProjectSpec, project_name
from ..hub import HubError
from .api_jobs import pool_json
from .views import department_json
from .dashboard_pages import DashboardHandler, service_zone

log = logging.getLogger("gpushare.pool")


def sentence(text: str) -> str:
    """The API's words as a sentence of a page: ``Quota must be … .``"""
    text = str(text)
    return f"{text[:1].upper()}{text[1:]}" + ("" if text.endswith((".", "?", "!")) else ".")


class AdminFormHandler(DashboardHandler):
    """A page of the admin's forms: its forms post to the service itself."""

    form_action = "'self'"

    def check_form(self) -> None:
        """The post's XSRF token against the login cookie's (JupyterHub's check, which a
        request authenticated by a token skips), before anything else is read."""
        try:
            self.check_xsrf_cookie()
        except web.HTTPError:
            self.fail(403, "This form came without the dashboard's XSRF token, or with one "
                           "of another login: open the dashboard again and send the form "
                           "from it.")

    def show(self, page: tuple[str, str], status: int = 200) -> None:
        self.set_status(status)
        self.finish(form_page(page))


class ProjectFormHandler(AdminFormHandler):
    @web.authenticated
    async def get(self):
        await self.admin_only()
        name = self.get_argument("name", "")
        if not name:
            return await self.show_form("", forms.form_values(None), [], new=True)
        row = self.project_row(name)
        if row is None:
            self.fail(404, sentence(f"there is no project {name!r}; create it from the "
                                    f"dashboard's list of projects"))
        await self.show_form(name, forms.form_values(self.project_json(row)),
                             list(row.groups or ()), new=False)

    async def show_form(self, name: str, values: dict, groups: list[str], new: bool,
                        problem: str = "", status: int = 200) -> None:
        self.show(forms.project_form(self.base, self.who.name, self.xsrf, name, values, groups,
                                     await self.hub_groups(), problem, new), status)

    async def post(self):
        self.check_form()
        await self.admin_only()
        arg = self.get_body_argument
        name, new = arg("name", "").strip(), bool(arg("new", ""))
        values = {k: arg(k, "") for k in forms.NUMBERS}
        groups = forms.chosen_groups(self.get_body_arguments("groups"), arg("other_groups", ""))
        step = arg("step", "preview")
        if step == "edit":
            return await self.show_form(name, values, groups, new)
        try:
            body = forms.body_of(values, groups, new)
            change = self.change(name, new, body)
            if step != "save":
                return self.show(forms.preview_page(self.base, self.who.name, self.xsrf,
                                                    change, values, groups, new))
            row = change_project(self.store, self.scheduler, name, body, self.who.name,
                                 "dashboard", self.client_address())
        except Invalid as e:  # the form again, as typed, with the sentence; nothing stored
            return await self.show_form(name, values, groups, new, sentence(e), e.status)
        log.info("%s changed project %s in the dashboard: %s", self.who.name, name,
                      forms.change_words(change))
        self.show(forms.saved_page(self.base, self.who.name, change, self.project_json(row)))

    def change(self, name: str, new: bool, body: dict) -> forms.Change:
        """What saving ``body`` would do, checked by the API's rules (nothing is stored)."""
        project_name(name)
        exists = self.store.quotas.project(name) is not None
        if new and exists:
            raise Invalid(f"there is already a project {name}; change it from the "
                          f"dashboard's list of projects", 409)
        if not new and not exists:
            raise Invalid(f"there is no project {name!r}; create it from the dashboard's "
                          f"list of projects", 404)
        current, fields = project_changes(self.store, self.scheduler, name, body)
        after = replace(current or ProjectSpec(name), **fields)
        if current is None and not after.groups:
            after = replace(after, groups=(name,))  # as a new project is stored
        others = sum(p.quota for p in self.store.quotas.projects() if p.name != name)
        return forms.Change(name, None if current is None else _gpus(current), _gpus(after),
                            (others + after.quota) / GPU,
                            self.scheduler.train_capacity() / GPU)

    async def hub_groups(self) -> list[str] | None:
        """The hub's groups to offer, or None (the service's role needs list:groups)."""
        hub = self.directory.hub
        if not hub:
            return None
        try:
            answer = await hub.get("groups")
        except HubError as e:
            log.warning("the project form offers no groups (the service's role needs "
                        "list:groups): %s", e)
            return None
        items = answer.get("items", []) if isinstance(answer, dict) else answer
        return sorted(g["name"] for g in items if isinstance(g, dict) and g.get("name"))


def _gpus(spec: ProjectSpec) -> dict:
    """A project's settings in GPUs, as the API shows them."""
    return {"quota": spec.quota / GPU,
            "limit": None if spec.limit is None else spec.limit / GPU,
            "over_quota_weight": spec.over_quota_weight, "priority": spec.priority,
            "job_priority_min": spec.job_priority_min, "job_priority_max": spec.job_priority_max,
            "groups": sorted(spec.groups)}


class DepartmentFormHandler(AdminFormHandler):
    """A department's quota, limit and weight: the form, a preview, then save."""

    @web.authenticated
    async def get(self):
        await self.admin_only()
        name = self.get_argument("name", "")
        department = self.department(name)
        self.show(forms.department_form(self.base, self.who.name, self.xsrf, name,
                                        forms.department_values(department),
                                        department["projects"]))

    def department(self, name: str) -> dict:
        row = self.store.quotas.department(name) if name else None
        if row is None:
            self.fail(404, sentence(f"there is no department {name!r}; departments are made "
                                    f"through PUT api/departments/{{name}}"))
        return department_json(row, self.store.quotas.members(name), self.scheduler.explained)

    async def post(self):
        self.check_form()
        await self.admin_only()
        name = self.get_body_argument("name", "").strip()
        values = {k: self.get_body_argument(k, "") for k in forms.DEPARTMENT_NUMBERS}
        department = self.department(name)
        step = self.get_body_argument("step", "preview")

        def again(problem: str = "", status: int = 200):
            self.show(forms.department_form(self.base, self.who.name, self.xsrf, name, values,
                                            department["projects"], problem), status)
        if step == "edit":
            return again()
        try:
            body = forms.department_body(values)
            current, fields = department_changes(self.store, self.scheduler, name, body)
            words = forms.department_words(name, _department_gpus(current),
                                           _department_gpus(replace(current, **fields)))
            if step != "save":
                return self.show(forms.department_preview(self.base, self.who.name, self.xsrf,
                                                          name, words, values))
            change_department(self.store, self.scheduler, name, body, self.who.name,
                              "dashboard", self.client_address())
        except Invalid as e:  # the form again, as typed, with the sentence; nothing stored
            return again(sentence(e), e.status)
        log.info("%s changed department %s in the dashboard: %s", self.who.name, name, words)
        self.show(forms.department_saved(self.base, self.who.name, words,
                                         self.department(name)))


def _department_gpus(spec: DepartmentSpec) -> dict:
    return {"quota": spec.quota / GPU, "over_quota_weight": spec.over_quota_weight,
            "limit": None if spec.limit is None else spec.limit / GPU}


class CancelJobHandler(AdminFormHandler):
    @web.authenticated
    async def get(self, job_id):
        await self.admin_only()
        row = self.own_job(job_id)
        job = self.job_json(row, False)
        try:
            cancellable(row)
        except Invalid as e:
            return self.show(forms.cancel_page(self.base, self.who.name, self.xsrf, job,
                                               sentence(e)), e.status)
        self.show(forms.cancel_page(self.base, self.who.name, self.xsrf, job))

    async def post(self, job_id):
        self.check_form()
        await self.admin_only()
        row = self.own_job(job_id)
        try:
            row = await cancel_job(self.store, self.scheduler, row, self.who.name,
                                   self.who.is_user(row.user), "dashboard",
                                   self.client_address())
        except Invalid as e:
            return self.show(forms.cancel_page(self.base, self.who.name, self.xsrf,
                                               self.job_json(row, False), sentence(e)),
                             e.status)
        log.info("%s cancelled job %s in the dashboard", self.who.name, row.id)
        self.show(forms.cancelled_page(self.base, self.who.name, self.job_json(row, False)))


class DrainNodeHandler(AdminFormHandler):
    @web.authenticated
    async def get(self, node):
        await self.admin_only()
        self.show_page(node)

    async def post(self, node):
        self.check_form()
        await self.admin_only()
        value = self.get_body_argument("drained", "")
        body = {"drained": value == "1"}
        if self.get_body_argument("requeue", ""):
            body["requeue"] = True
        try:
            if value not in ("0", "1"):  # never an undrain by a missing or odd field
                raise Invalid("the form's drained field must be 1 (drain) or 0 (undrain); "
                              "use the dashboard's drain and undrain links")
            answer = await set_drained(self.store, self.scheduler, node, body, self.who.name,
                                       "dashboard", self.client_address())
        except Invalid as e:  # the page again, as the node is now, with the sentence
            return self.show_page(node, sentence(e), e.status)
        log.info("%s %s node %s in the dashboard (requeued: %s)", self.who.name,
                 "drained" if answer["drained"] else "undrained", node,
                 ", ".join(answer["requeued"]) or "none")
        self.show(drain.drain_done_page(self.base, self.who.name, answer))

    def show_page(self, node: str, problem: str = "", status: int = 200) -> None:
        pool = pool_json(self)
        found = next((n for n in pool["nodes"] if n["name"] == node and n["pool"] == TRAIN),
                     None)
        if found is None:
            self.fail(404, sentence(f"there is no train node {node!r}; the pool map on the "
                                    f"dashboard shows them"))
        jobs = [self.job_json(r, False) for r in self.store.jobs.active()
                if r.state == RUNNING and node in (r.placement or {})]
        offset, _ = service_zone(time.time())
        self.show(drain.drain_page(self.base, self.who.name, self.xsrf, found, jobs, offset,
                                   problem), status)


def routes(prefix: str) -> list:
    p = prefix.rstrip("/")
    base = {"base": p + "/"}
    return [(rf"{p}/dashboard/project", ProjectFormHandler, base),
            (rf"{p}/dashboard/department", DepartmentFormHandler, base),
            (rf"{p}/dashboard/jobs/([A-Za-z0-9._-]{{1,64}})/cancel", CancelJobHandler, base),
            (rf"{p}/dashboard/nodes/([^/]{{1,255}})/drain", DrainNodeHandler, base)]

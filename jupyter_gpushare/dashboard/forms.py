"""The admin's forms: a project's settings (create, edit, preview, saved), a department's
(edit, preview, saved) and a job's cancel (confirm, done), and the dashboard's tables of
project and department settings that link to them. Pure:
plain dicts in (projects and jobs as the API shows them, GPU amounts in GPUs), HTML out.

The checks are not here: ``pool/web/dashboard_forms.py`` turns a posted form into the API's body
(``body_of``) and has ``pool/admin/changes.py`` check it, so that a form says the API's sentences.
Every form posts the page's XSRF token (``_xsrf``); none needs a script.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

from ..trainjob import CANCELLED, RUNNING
from .markup import frame, hidden, table

# The fields of PUT api/projects/{name}, as the form asks for them: (name, label, help).
FIELDS = (
    ("quota", "Quota (GPUs)", "Guaranteed GPUs: 0 or more; the project may borrow beyond it."),
    ("limit", "Limit (GPUs)", "The most GPUs it may hold, borrowing included; empty: no limit."),
    ("over_quota_weight", "Over-quota weight",
     "Its share of idle GPUs beyond the quotas, 0 to 1000."),
    ("priority", "Priority", "Projects of higher priority get idle GPUs first, -1000 to 1000."),
    ("job_priority_min", "Lowest job priority",
     "The range of priorities members may give their jobs, -100 to 100."),
    ("job_priority_max", "Highest job priority", ""),
)
NUMBERS = [name for name, _, _ in FIELDS]
# The numbers of PUT api/departments/{name} (its projects are changed through the API)
DEPARTMENT_FIELDS = (
    ("quota", "Quota (GPUs)", "Its projects' first claim on idle GPUs beyond their own "
     "quotas, which must fit in it."),
    ("limit", "Limit (GPUs)", "The most GPUs its projects may hold together; empty: no limit."),
    ("over_quota_weight", "Over-quota weight",
     "Its share of idle GPUs beyond the departments' quotas, 0 to 1000."),
)
DEPARTMENT_NUMBERS = [name for name, _, _ in DEPARTMENT_FIELDS]
DEFAULTS = {"quota": "0", "limit": "", "over_quota_weight": "1", "priority": "0",
            "job_priority_min": "-100", "job_priority_max": "0"}

FORM_STYLE = """
form.edit{max-width:720px}
.field{display:grid;grid-template-columns:200px 160px 1fr;gap:4px 12px;align-items:baseline;
  margin:8px 0}
.field label{font-weight:600}.field .help{color:var(--muted);font-size:12px}
input[type=text],input[type=number]{font:inherit;padding:3px 6px;border:1px solid #9e9e9e;
  border-radius:3px;width:100%}
input:focus,button:focus,a:focus{outline:2px solid var(--accent);outline-offset:1px}
fieldset{border:1px solid var(--line);border-radius:4px;margin:10px 0;padding:6px 12px}
legend{font-weight:600}.groups label{display:inline-block;margin:2px 14px 2px 0}
.actions{margin:14px 0 4px;display:flex;gap:12px;align-items:center}
button{font:inherit;padding:4px 14px;border-radius:3px;border:1px solid var(--accent);
  background:var(--accent);color:#fff;cursor:pointer}
button.quiet{background:#fff;color:var(--accent)}button.danger{background:var(--bad);
  border-color:var(--bad)}
.problem{border-left:4px solid var(--bad);background:#ffebee;padding:6px 10px}
.done{border-left:4px solid #2e7d32;background:#e8f5e9;padding:6px 10px}
.preview{border-left:4px solid var(--accent);background:#e3f2fd;padding:6px 10px}
a{color:var(--accent)}a.cancel{font-size:12px}
dl.job{display:grid;grid-template-columns:90px 1fr;gap:2px 12px;margin:6px 0}
dl.job dt{font-weight:600}dl.job dd{margin:0}
"""


@dataclass(frozen=True)
class Change:
    """A project's settings before and after, in GPUs (``before`` None: a new project), and
    what the train pool's quotas then promise."""

    name: str
    before: dict | None
    after: dict
    promised: float  # GPUs, the sum of the quotas after the change
    capacity: float  # GPUs of the train pool


def change_words(c: Change) -> str:
    """``vision: quota 4 → 6; the pool is then 10 of 12 GPUs promised``."""
    pool = f"the pool is then {c.promised:g} of {c.capacity:g} GPUs promised"
    if c.before is None:
        return f"new project {c.name}: {settings_words(c.after)}; {pool}"
    changed = [f"{_label(k)} {_shown(k, c.before.get(k))} → {_shown(k, c.after.get(k))}"
               for k in (*NUMBERS, "groups") if _same(c.before.get(k)) != _same(c.after.get(k))]
    if not changed:
        return f"{c.name}: nothing changes; {pool}"
    return f"{c.name}: {', '.join(changed)}; {pool}"


def _same(value):
    return sorted(value) if isinstance(value, (list, tuple)) else value


def settings_words(p: dict) -> str:
    return ", ".join(f"{_label(k)} {_shown(k, p.get(k))}" for k in (*NUMBERS, "groups"))


def _label(key: str) -> str:
    return {"over_quota_weight": "weight", "job_priority_min": "lowest job priority",
            "job_priority_max": "highest job priority"}.get(key, key)


def _shown(key: str, value) -> str:
    if key == "groups":
        return ", ".join(value) if value else "none"
    if value is None:
        return "none" if key == "limit" else "–"
    return f"{value:g}" if isinstance(value, (int, float)) else str(value)


def form_values(project: dict | None) -> dict[str, str]:
    """The form's text for a project as the API shows it (None: a new project's defaults)."""
    if project is None:
        return dict(DEFAULTS)
    return {k: "" if project.get(k) is None else f"{project[k]:g}" for k in NUMBERS}


def body_of(values: dict[str, str], groups: list[str], new: bool) -> dict:
    """The body of ``PUT api/projects/{name}`` that a posted form asks for. Numbers become
    numbers; anything else is passed on as typed, for the API's checks to name it. An empty
    limit is no limit. No group chosen: a new project takes the group named like it."""
    body = _numbers(values, NUMBERS)
    if groups or not new:
        body["groups"] = sorted(set(groups))
    return body


def department_body(values: dict[str, str]) -> dict:
    """The body of ``PUT api/departments/{name}`` that the department's form asks for."""
    return _numbers(values, DEPARTMENT_NUMBERS)


def _numbers(values: dict[str, str], keys) -> dict:
    body: dict = {}
    for key in keys:
        text = (values.get(key) or "").strip()
        body[key] = None if key == "limit" and not text else _number(text)
    return body


def department_values(department: dict) -> dict[str, str]:
    """The form's text for a department as the API shows it."""
    return {k: "" if department.get(k) is None else f"{department[k]:g}"
            for k in DEPARTMENT_NUMBERS}


def department_words(name: str, before: dict, after: dict) -> str:
    """``department research: quota 4 → 6``, in GPUs."""
    changed = [f"{_label(k)} {_shown(k, before.get(k))} → {_shown(k, after.get(k))}"
               for k in DEPARTMENT_NUMBERS if before.get(k) != after.get(k)]
    return f"department {name}: {', '.join(changed) if changed else 'nothing changes'}"


def _number(text: str):
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return text
    return value if value == value and abs(value) != float("inf") else text


def chosen_groups(checked: list[str], other: str) -> list[str]:
    """The groups ticked, and those typed (separated by commas or spaces)."""
    typed = [g for g in other.replace(",", " ").split() if g]
    return sorted({g.strip() for g in checked if g.strip()} | set(typed))


# -- the pages -----------------------------------------------------------------------------
def project_form(base: str, user: str, xsrf: str, name: str | None, values: dict[str, str],
                 groups: list[str], hub_groups: list[str] | None, problem: str = "",
                 new: bool = False) -> tuple[str, str]:
    """The form for project ``name`` (``new``: one to create, its name a field), filled with
    ``values`` (the form's text) and ``groups`` ticked; ``hub_groups``: the hub's groups to
    offer (None: the hub did not say); ``problem``: the sentence why the last post was
    refused. Returns the page's title and body."""
    title = "new project" if new else f"project {name}"
    heading = "Create a project" if new else f"Change project {escape(name or '')}"
    parts = [f"<section><h2>{heading}</h2>"]
    if problem:
        parts.append(f'<p class="problem" role="alert" id="problem">{escape(problem)}</p>')
    parts.append(f'<form class="edit" method="post" action="{escape(base)}dashboard/project">'
                 + hidden("_xsrf", xsrf) + hidden("new", "1" if new else ""))
    if new:
        parts.append('<div class="field"><label for="f-name">Name</label>'
                     f'<input type="text" id="f-name" name="name" value="{escape(name or "")}" '
                     'required maxlength="100" autofocus><span class="help">Letters, digits, '
                     "'.', '_' or '-'.</span></div>")
    else:
        parts.append(hidden("name", name or ""))
    parts.append(_inputs(FIELDS, values, focus=not new))
    offered = sorted(set(hub_groups or ()) | set(groups))
    boxes = "".join(f'<label><input type="checkbox" name="groups" value="{escape(g)}"'
                    f'{" checked" if g in groups else ""}> {escape(g)}</label>' for g in offered)
    note = "" if hub_groups is not None else \
        '<p class="muted">JupyterHub did not list its groups now; type them below.</p>'
    parts.append('<fieldset class="groups"><legend>Member groups (JupyterHub groups)</legend>'
                 f'{note}{boxes or "<p class=empty>The hub has no groups.</p>"}'
                 '<div class="field"><label for="f-other">Other groups</label>'
                 '<input type="text" id="f-other" name="other_groups" value="" '
                 'aria-describedby="h-other"><span class="help" id="h-other">Names separated '
                 'by commas; none chosen: a new project takes the group named like it.'
                 '</span></div></fieldset>')
    parts.append('<div class="actions"><button type="submit" name="step" value="preview">'
                 'Preview the change</button>'
                 f'<a href="{escape(base)}dashboard">Back without saving</a></div></form>'
                 '</section>')
    return f"GPU share: {title}", frame(base, title, "".join(parts), user)


def _inputs(fields, values: dict[str, str], focus: bool) -> str:
    """Labelled text fields for numbers, each with its help; ``focus``: the first has it."""
    out = []
    for key, label, help_text in fields:
        kind = 'type="text" inputmode="decimal"' if key in ("quota", "limit") else \
            'type="text" inputmode="numeric"'
        first = " autofocus" if key == "quota" and focus else ""
        out.append(f'<div class="field"><label for="f-{key}">{escape(label)}</label>'
                   f'<input {kind} id="f-{key}" name="{key}" '
                   f'value="{escape(values.get(key, ""))}"{first}'
                   f' aria-describedby="h-{key}">'
                   f'<span class="help" id="h-{key}">{escape(help_text)}</span></div>')
    return "".join(out)


def department_form(base: str, user: str, xsrf: str, name: str, values: dict[str, str],
                    projects: list[str], problem: str = "") -> tuple[str, str]:
    """The form for department ``name``'s numbers, filled with ``values`` (the form's text);
    ``problem``: why the last post was refused. Returns the page's title and body."""
    parts = [f"<section><h2>Change department {escape(name)}</h2>"]
    if problem:
        parts.append(f'<p class="problem" role="alert" id="problem">{escape(problem)}</p>')
    members = ", ".join(projects) or "none"
    parts.append(f'<p class="muted">Its projects: {escape(members)} (changed through '
                 f'PUT api/departments/{escape(name)}).</p>'
                 f'<form class="edit" method="post" action="{escape(base)}dashboard/department">'
                 + hidden("_xsrf", xsrf) + hidden("name", name)
                 + _inputs(DEPARTMENT_FIELDS, values, focus=True)
                 + '<div class="actions"><button type="submit" name="step" value="preview">'
                 'Preview the change</button>'
                 f'<a href="{escape(base)}dashboard">Back without saving</a></div></form>'
                 '</section>')
    return (f"GPU share: department {name}",
            frame(base, f"department {name}", "".join(parts), user))


def department_preview(base: str, user: str, xsrf: str, name: str, words: str,
                       values: dict[str, str]) -> tuple[str, str]:
    """What saving would do, with Save and Change again (the same values)."""
    keep = "".join(hidden(k, v) for k, v in values.items()) + hidden("name", name) + \
        hidden("_xsrf", xsrf)
    body = (f'<section><h2>Preview</h2><p class="preview" id="preview" role="status">'
            f'{escape(words)}</p><p class="muted">Nothing is stored until you save; the pool '
            f'checks everything again then.</p>'
            f'<form method="post" action="{escape(base)}dashboard/department">{keep}'
            f'<div class="actions"><button type="submit" name="step" value="save" autofocus>'
            f'Save</button><button type="submit" class="quiet" name="step" value="edit">'
            f'Change again</button><a href="{escape(base)}dashboard">Back without saving</a>'
            f'</div></form></section>')
    return (f"GPU share: preview of department {name}",
            frame(base, f"department {name}", body, user))


def department_saved(base: str, user: str, words: str, department: dict) -> tuple[str, str]:
    """The change saved, and the department as the API shows it now."""
    body = (f'<section><h2>Saved</h2><p class="done" id="saved" role="status">Saved. '
            f'{escape(words)}.</p>' + departments_table(base, [department], change=False)
            + f'<p><a href="{escape(base)}dashboard">Back to the pool dashboard</a></p>'
              f'</section>')
    return (f"GPU share: department {department['name']} saved",
            frame(base, f"department {department['name']}", body, user))


def preview_page(base: str, user: str, xsrf: str, change: Change, values: dict[str, str],
                 groups: list[str], new: bool) -> tuple[str, str]:
    """What saving would do, in words, with Save and Change again (the same values)."""
    keep = "".join(hidden(k, v) for k, v in values.items()) + \
        "".join(hidden("groups", g) for g in groups) + hidden("name", change.name) + \
        hidden("new", "1" if new else "") + hidden("_xsrf", xsrf)
    body = (f'<section><h2>Preview</h2><p class="preview" id="preview" role="status">'
            f'{escape(change_words(change))}</p><p class="muted">Nothing is stored until you '
            f'save; the pool checks everything again then.</p>'
            f'<form method="post" action="{escape(base)}dashboard/project">{keep}'
            f'<div class="actions"><button type="submit" name="step" value="save" autofocus>'
            f'Save</button><button type="submit" class="quiet" name="step" value="edit">'
            f'Change again</button><a href="{escape(base)}dashboard">Back without saving</a>'
            f'</div>'
            f'</form></section>')
    return f"GPU share: preview of {change.name}", frame(base, f"project {change.name}", body,
                                                            user)


def saved_page(base: str, user: str, change: Change, project: dict) -> tuple[str, str]:
    """The change saved, and the project's figures as the API shows them now."""
    cells = [[escape(project["name"]), f'{project["quota"]:g}', _shown("limit", project["limit"]),
              f'{project["over_quota_weight"]:g}', f'{project["priority"]:g}',
              f'{project["job_priority_min"]} to {project["job_priority_max"]}',
              escape(_shown("groups", project["groups"])), f'{project["in_use"]:g}',
              f'{project["deserved"]:g}', str(project["pending"])]]
    body = (f'<section><h2>Saved</h2><p class="done" id="saved" role="status">Saved. '
            f'{escape(change_words(change))}.</p>'
            + table(["Project", "Quota", "Limit", "Weight", "Priority", "Job priorities",
                     "Groups", "In use now", "Deserved", "Waiting jobs"], cells,
                    numeric={1, 3, 4, 7, 8, 9}, empty="", cls="saved")
            + f'<p><a href="{escape(base)}dashboard">Back to the pool dashboard</a> · '
              f'<a href="{escape(base)}dashboard/project?name={escape(project["name"])}">'
              f'Change it again</a></p></section>')
    return f"GPU share: {project['name']} saved", frame(base, f"project {project['name']}",
                                                           body, user)


def settings_table(base: str, projects: list[dict]) -> str:
    """The dashboard's table of every project's settings, each with its Change link."""
    cells = [[f'<b>{escape(p["name"])}</b>', f'{p["quota"]:g}', _shown("limit", p.get("limit")),
              f'{p.get("over_quota_weight", 1):g}', f'{p.get("priority", 0):g}',
              f'{p.get("job_priority_min", -100)} to {p.get("job_priority_max", 0)}',
              escape(_shown("groups", p.get("groups") or [])),
              escape(p.get("department") or "–"),
              f'<a href="{escape(base)}dashboard/project?name={escape(p["name"])}" '
              f'aria-label="Change project {escape(p["name"])}">Change…</a>']
             for p in sorted(projects, key=lambda p: p["name"])]
    return (table(["Project", "Quota", "Limit", "Weight", "Priority", "Job priorities",
                   "Groups", "Department", ""], cells, numeric={1, 2, 3, 4},
                  empty="No projects yet.", cls="settings")
            + f'<p><a href="{escape(base)}dashboard/project" id="new-project">Create a '
              f'project…</a></p>')


def departments_table(base: str, departments: list[dict], change: bool = True) -> str:
    """The departments over the projects: quota, limit, weight, projects and what they hold
    together now, each with its Change link (``change``) to the department's form."""
    if not departments:
        return ""
    cells = [[f'<b>{escape(d["name"])}</b>', f'{d["quota"]:g}', _shown("limit", d.get("limit")),
              f'{d.get("over_quota_weight", 1):g}', f'{d.get("in_use", 0):g}',
              f'{d.get("deserved", 0):g}', escape(", ".join(d.get("projects") or []) or "–")]
             + ([f'<a href="{escape(base)}dashboard/department?name={escape(d["name"])}" '
                 f'aria-label="Change department {escape(d["name"])}">Change…</a>']
                if change else [])
             for d in departments]
    return ('<h3>Departments</h3>'
            + table(["Department", "Quota", "Limit", "Weight", "In use now", "Deserved",
                     "Projects"] + ([""] if change else []), cells, numeric={1, 2, 3, 4, 5},
                    empty="No departments.", cls="departments"))


def cancel_link(base: str, job: dict) -> str:
    return (f'<a class="cancel" href="{escape(base)}dashboard/jobs/{escape(job["id"])}/cancel" '
            f'aria-label="Cancel job {escape(job.get("name") or job["id"])}">cancel…</a>')


def _job_lines(job: dict) -> str:
    return (f'<dl class="job"><dt>Job</dt><dd><b>{escape(job.get("name") or job["id"])}</b> '
            f'<span class="muted">{escape(job["id"])}</span></dd>'
            f'<dt>User</dt><dd>{escape(job.get("user") or "?")}</dd>'
            f'<dt>Project</dt><dd>{escape(job.get("project") or "?")}</dd>'
            f'<dt>GPUs</dt><dd>{job.get("gpus", 0):g}</dd>'
            f'<dt>State</dt><dd id="state">{escape(job.get("state") or "?")}</dd></dl>')


def cancel_page(base: str, user: str, xsrf: str, job: dict, problem: str = "") -> tuple[str, str]:
    """Asks before cancelling ``job``; ``problem``: why it cannot be (it has ended)."""
    if problem:
        ask = f'<p class="problem" role="alert" id="problem">{escape(problem)}</p>'
    else:
        what = ("It gets SIGTERM, then SIGKILL after the grace period; its user sees it as "
                "cancelled." if job.get("state") == RUNNING else
                "It has not started; it leaves the queue.")
        ask = (f'<p>Cancel this job? {what}</p>'
               f'<form method="post" action="{escape(base)}dashboard/jobs/'
               f'{escape(job["id"])}/cancel">{hidden("_xsrf", xsrf)}'
               f'<div class="actions"><button type="submit" class="danger" autofocus>'
               f'Cancel the job</button><a href="{escape(base)}dashboard">Keep it</a></div>'
               f'</form>')
    body = f'<section><h2>Cancel a job</h2>{_job_lines(job)}{ask}</section>'
    return f"GPU share: cancel {job['id']}", frame(base, "cancel a job", body, user)


def cancelled_page(base: str, user: str, job: dict) -> tuple[str, str]:
    words = ("It is cancelled." if job.get("state") == CANCELLED else
             "It is being stopped: it gets its grace period, then shows as cancelled.")
    body = (f'<section><h2>Cancelled</h2><p class="done" id="cancelled" role="status">Job '
            f'{escape(job.get("name") or job["id"])} ({escape(job["id"])}) of '
            f'{escape(job.get("user") or "?")}: {words}</p>{_job_lines(job)}'
            f'<p><a href="{escape(base)}dashboard">Back to the pool dashboard</a></p></section>')
    return f"GPU share: {job['id']} cancelled", frame(base, "cancel a job", body, user)

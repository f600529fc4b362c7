"""The quota-and-queue panel (``%gpushare``): an ipywidgets box that keeps itself up to date.

What it shows comes from pure functions of the pool's JSON (:func:`slice_view`,
:func:`slice_use`, :func:`project_bars`, :func:`job_rows`), tested without widgets;
:class:`Panel` only puts them into widgets. GPU use (SM utilization and memory now, the last
hour as a sparkline, "idle 25m") is in the words of ``text``, as ``gpushare jobs``
prints it. The jobs are one table (a CSS grid: its header and rows scroll as one) whose wide
cells give way first, so that a job's name, state, GPUs, time and buttons stay in view in a
narrow notebook; colours and sizes are JupyterLab's theme variables, so dark themes and the
user's font size apply. Once shown it refreshes every ``interval`` seconds in a background thread
(the pool calls block, the kernel must not), until it is closed: ``.close()``, or the front
end closing its comm. A pool that cannot be reached is one line at the top, and the panel
keeps trying.
"""

from __future__ import annotations

import copy

import html
import os
import threading
import time
import urllib.parse

import ipywidgets as widgets

from ..charts import minute_values, sparkline
from ..client import ClientError, PoolClient
from ..gpus import SIMULATED_UUID
from ..policy.lending import LENT_SUFFIX
from ..text import clock_time, duration, idle_text, memory_cell, no_jobs, sm_cell, when
from ..trainjob import ACTIVE, CANCELLED, FAILED, PENDING, RUNNING, SUCCEEDED
from .watchdog import BuildSlice

LOG_TAIL = 64 * 1024  # characters of a job's log shown in the panel


def _theme(name: str, fallback: str) -> str:
    """A JupyterLab theme variable, with the light theme's value where there is none (the
    classic notebook, VS Code)."""
    return f"var(--jp-{name}, {fallback})"


ERROR, MUTED = _theme("error-color1", "#c62828"), _theme("ui-font-color2", "#616161")
TRACK = _theme("layout-color3", "#e0e0e0")  # the empty part of a bar
GOOD = _theme("success-color1", "#43a047")
USED = _theme("brand-color1", "#1976d2")  # GPUs in use within the quota, as the Lab panel
_STATE_COLOURS = {PENDING: _theme("warn-color1", "#b26a00"),
                  RUNNING: _theme("brand-color1", "#1565c0"),
                  SUCCEEDED: _theme("success-color1", "#2e7d32"), FAILED: ERROR,
                  CANCELLED: MUTED}
# The job table: key, title, the title's tooltip, and its CSS grid track. The name gives way
# down to 6em and the details to 8em before the table scrolls; the rest keep their size.
COLUMNS = (("name", "Job", "", "minmax(6em, 14em)"),
           ("state", "State", "with the place in the queue, and the attempt after a requeue",
            "max-content"),
           ("gpus", "GPUs", "", "max-content"),
           ("elapsed", "Time", "waiting while pending, running, or how long it ran",
            "max-content"),
           ("details", "Details", "a running job's GPU use (SM utilization now and over the "
            "last hour, memory); otherwise why it waits or how it ended", "minmax(8em, 1fr)"))
TEMPLATE = " ".join(track for *_, track in COLUMNS) + " max-content"  # + the buttons
SPARK = {"width": 48, "height": 14}
# The table's looks, in JupyterLab's variables: a <style> in the panel's title, for
# .gpushare-jobs only.
STYLE = """<style>
.gpushare-jobs { font-size: var(--jp-ui-font-size1); color: var(--jp-ui-font-color1);
  border: 1px solid var(--jp-border-color2); background: var(--jp-layout-color1); }
.gpushare-jobs > .jupyter-widgets { margin: 0; min-width: 0; padding: 0 6px;
  border-bottom: 1px solid var(--jp-border-color2); }
.gpushare-jobs .widget-html-content, .gpushare-jobs .jupyter-widget-html-content,
.gpushare-jobs .gpushare-cut {
  min-width: 0; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.gpushare-jobs > .gpushare-th { font-weight: 600; background: var(--jp-layout-color2);
  border-bottom-color: var(--jp-border-color1); }
.gpushare-jobs .jupyter-button { height: calc(var(--jp-widgets-inline-height) - 4px);
  padding: 0 8px; margin: 2px; font-size: var(--jp-ui-font-size1); }
</style>"""


# -- what to show: pure functions of the pool's answers ----------------------------------------

def gpu_count(value) -> str:
    """GPUs as the API gives them (a number of GPUs, not milli-GPUs), or ? for none."""
    return f"{value:g}" if isinstance(value, (int, float)) else "?"


def elapsed(job: dict, now: float) -> str:
    """Waiting time while pending, run time while running, how long it ran once ended."""
    state, started, finished = job.get("state"), job.get("started"), job.get("finished")
    if state == PENDING:
        submitted = job.get("submitted")
        return duration(now - submitted) if submitted is not None else "–"
    if state == RUNNING:
        return duration(now - started) if started is not None else "–"
    return duration(finished - started) if started is not None and finished is not None \
        else "–"


def gpu_use(usage: dict | None, now: float) -> dict:
    """A job's or slice's GPU use (the API's ``usage``): ``text`` "SM 93% (1h 88%), 11 GiB",
    ``idle`` "idle 25m" (or empty), ``spark`` the last hour minute by minute (0–1)."""
    if not usage:
        return {"text": "not measured yet", "idle": "", "spark": []}
    return {"text": f"SM {sm_cell(usage)}, {memory_cell(usage)}",
            "idle": idle_text(usage.get("idle_for_s")),
            "spark": minute_values(usage.get("minutes"), now)}


def lent_text(job: dict) -> str:
    """Where a running job on build GPUs lent to the train pool runs, and what may happen to
    it there; "" for any other job."""
    placement = job.get("placement")
    nodes = sorted(name[:-len(LENT_SUFFIX)] for name in
                   (placement if isinstance(placement, dict) else {})
                   if isinstance(name, str) and len(name) > len(LENT_SUFFIX)
                   and name.endswith(LENT_SUFFIX))
    if job.get("state") != RUNNING or not nodes:
        return ""
    return (f"on build GPUs of {', '.join(nodes)} lent to the train pool: a notebook may take "
            f"them back (the job is then requeued, to start again from its last checkpoint)")


def job_rows(jobs: list[dict], now: float) -> list[dict]:
    """One row per job, as the table shows it; ``active`` says whether it can be cancelled;
    ``use`` is a running job's GPU use."""
    rows = []
    for job in jobs:
        position = job.get("queue_position")
        running = job.get("state") == RUNNING
        rows.append({"id": job["id"], "name": job.get("name") or job["id"],
                     "state": job.get("state", "?"), "gpus": gpu_count(job.get("gpus")),
                     "position": "" if position is None else str(position),
                     "reason": job.get("reason") or "", "elapsed": elapsed(job, now),
                     "attempt": str(job.get("attempt") or 1),
                     "active": job.get("state") in ACTIVE, "ranks": job.get("ranks") or 1,
                     "lent": lent_text(job),
                     "use": gpu_use(job.get("usage"), now) if running else
                     {"text": "", "idle": "", "spark": []}})
    return rows


def use_html(use: dict) -> str:
    """A sparkline of the last hour, the words, and the idle flag."""
    spark = sparkline(use["spark"], title="SM utilization, last hour", **SPARK) \
        if use["spark"] else ""
    flag = (f' <span style="background:{_theme("warn-color3", "#ffe0b2")};'
            f'color:{_theme("warn-color0", "#8a4600")};border-radius:7px;padding:0 5px">'
            f'{html.escape(use["idle"])}</span>') if use["idle"] else ""
    return f'{spark} {html.escape(use["text"])}{flag}'.strip()


def state_html(row: dict) -> str:
    """A row's state in its colour, with its place in the queue and its attempt after a
    requeue: ``pending #3``, ``running attempt 2``."""
    notes = ([f"#{row['position']}"] if row["position"] else []) + (
        [f"attempt {row['attempt']}"] if row["attempt"] != "1" else [])
    colour = _STATE_COLOURS.get(row["state"], "inherit")
    out = f'<span style="color:{colour}">{html.escape(row["state"])}</span>'
    return out + (f' <span style="color:{MUTED}">{html.escape(", ".join(notes))}</span>'
                  if notes else "")


def details_html(row: dict) -> str:
    """A running job's GPU use, then the pool's reason (why it waits, how it ended), then
    whether it runs on lent build GPUs."""
    reason = html.escape(row["reason"])
    lent = html.escape(row.get("lent") or "")
    if not row["use"]["text"]:
        out = reason
    else:
        out = use_html(row["use"]) + (f' <span style="color:{MUTED}">· {reason}</span>'
                                      if reason else "")
    if not lent:
        return out
    return (out + " " if out else "") + f'<span style="color:{MUTED}">· {lent}</span>'


def project_bars(quota: dict, capacity: float | None = None) -> list[dict]:
    """One bar per project of ``GET api/quota``, then per department of those projects:
    the quota (guaranteed for a project; for a department, its projects' first claim on idle
    GPUs), GPUs in use, the part of them beyond the quota, and the scale to draw them on (the
    train pool's ``capacity`` when known)."""
    bars = []
    departments = [{**d, "name": f"department {d['name']}",
                    "by": f"its projects ({', '.join(d['projects'])})" if d.get("projects")
                    else "no project"}
                   for d in quota.get("departments") or []]
    for p in [*quota.get("projects", []), *departments]:
        guaranteed, in_use = p.get("quota", 0), p.get("in_use", 0)
        borrowed = p.get("borrowed", max(0, in_use - guaranteed))
        scale = max(capacity or 0, guaranteed, in_use, p.get("limit") or 0, 1)
        name = f"{p['name']} ({p['department']})" if p.get("department") else p["name"]
        if p.get("by"):  # a department: only its projects' quotas are guaranteed
            text = f"{name}: {in_use:g} GPUs in use by {p['by']}, quota {guaranteed:g}"
        else:
            text = f"{name}: {in_use:g} of {guaranteed:g} guaranteed GPUs in use"
        if borrowed:
            text += f", {borrowed:g} borrowed beyond the quota"
            if p.get("lent"):
                text += f" ({p['lent']:g} on lent build GPUs)"
        if p.get("pending"):
            text += f", {p['pending']} waiting"
        if p.get("limit") is not None:
            text += f" (at most {p['limit']:g})"
        bars.append({"name": p["name"], "quota": guaranteed, "in_use": in_use,
                     "borrowed": borrowed, "scale": scale, "text": text})
    return bars


def slice_view(build_slice: BuildSlice | None, answer: dict | None,
               problem: str | None = None) -> dict:
    """The build-slice line: from the environment the spawner set (``build_slice``, or the
    ``problem`` reading it) and the server extension's ``api/slice`` (``answer``, None when
    it could not be asked). ``fraction`` is the slice's memory in use, when the watchdog
    measured it."""
    if problem:
        return {"text": problem, "fraction": None, "over": False}
    if build_slice is None:
        return {"text": "No build slice: this server has no GPU of its own.", "fraction": None,
                "over": False}
    where = f" of {build_slice.uuid}" if build_slice.uuid and "," not in build_slice.uuid else ""
    text = f"Build slice: {build_slice.label}{where}."
    report = (answer or {}).get("watchdog")
    if report and not report.get("problem") and report.get("limit"):
        return {"text": f"{text} {report['message']}", "over": bool(report["over"]),
                "fraction": min(1.0, report["used"] / report["limit"])}
    if (build_slice.uuid or "").startswith(SIMULATED_UUID):  # and no stand-in plays it
        return {"text": f"{text} The GPU is simulated (this machine has none): no GPU memory "
                        f"to watch.", "fraction": None, "over": False}
    off = (answer or {}).get("watchdog_off") or (report or {}).get("message")
    return {"text": f"{text} {off}" if off else text, "fraction": None, "over": False}


def slice_use(answer: dict | None, now: float) -> dict | None:
    """This server's slice as the pool sees it (the server extension's ``api/slice``,
    ``pool``): its GPU use, and the culling ``warning`` in one sentence while it is warned.
    None when the pool holds no slice for this server."""
    record = (answer or {}).get("pool")
    if not record:
        return None
    use = gpu_use(record.get("usage"), now)
    cull, warning = record.get("cull"), None
    if cull and cull.get("cull_at"):
        left = max(0.0, cull["cull_at"] - now)
        at = clock_time(cull["cull_at"])
        warning = (f"This server will be stopped at {at} (in {duration(left)}): its slice has "
                   f"shown no GPU use and the hub no activity from it. Use it (run a cell) to "
                   f"keep it.")
    return {**use, "warning": warning, "reason": (cull or {}).get("reason") or ""}


def bar_html(bar: dict) -> str:
    """A project's bar: in use within the quota, borrowed beyond it, and a mark at the quota."""
    scale = bar["scale"]
    within = 100 * min(bar["in_use"], bar["quota"]) / scale
    borrowed = 100 * bar["borrowed"] / scale
    mark = 100 * bar["quota"] / scale
    return (f'<div title="{html.escape(bar["text"])}">{html.escape(bar["text"])}</div>'
            f'<div style="position:relative;height:10px;background:{TRACK};border-radius:2px">'
            f'<div style="position:absolute;left:0;width:{within:.1f}%;height:100%;'
            f'background:{USED}"></div>'
            f'<div style="position:absolute;left:{within:.1f}%;width:{borrowed:.1f}%;'
            f'height:100%;background:{_theme("warn-color1", "#fb8c00")}"></div>'
            f'<div style="position:absolute;left:{mark:.1f}%;width:2px;height:100%;'
            f'background:{_theme("ui-font-color0", "#212121")}" title="guaranteed"></div>'
            f'</div>')


def slice_html(view: dict, use: dict | None = None) -> str:
    """The slice line (``slice_view``), its GPU use and the culling warning (``slice_use``)."""
    colour = ERROR if view["over"] else GOOD
    bar = "" if view["fraction"] is None else (
        f'<div style="height:10px;background:{TRACK};border-radius:2px">'
        f'<div style="width:{100 * view["fraction"]:.1f}%;height:100%;background:{colour}">'
        f'</div></div>')
    style = f' style="color:{ERROR}"' if view["over"] else ""
    out = f"<div{style}>{html.escape(view['text'])}</div>{bar}"
    if use:
        out += f"<div>GPU use: {use_html(use)}</div>"
        if use["warning"]:
            out += (f'<div role="alert" title="{html.escape(use["reason"])}" style="color:#fff;'
                    f'background:{ERROR};padding:2px 6px;border-radius:3px">'
                    f'{html.escape(use["warning"])}</div>')
    return out


def status_html(sentence: str, interval: float) -> str:
    """The one line for a pool that cannot be reached (or refuses): its sentence, and that the
    panel keeps trying."""
    sentence = sentence[:1].upper() + sentence[1:]
    if not sentence.endswith((".", "?", "!")):
        sentence += "."
    return (f'<span style="color:{ERROR}">{html.escape(sentence)} Trying again every '
            f'{interval:g} s.</span>')


def server_url(env=None) -> str | None:
    """This notebook server's own address (its extension serves ``api/slice``), from what
    JupyterHub tells it; None outside JupyterHub."""
    env = os.environ if env is None else env
    url = env.get("JUPYTERHUB_SERVICE_URL")
    if not url:
        return None
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if host in ("", "0.0.0.0", "::"):  # it listens everywhere: ask it on this machine
        host = "127.0.0.1"
    netloc = f"[{host}]" if ":" in host else host
    if parts.port:
        netloc += f":{parts.port}"
    path = parts.path if parts.path.endswith("/") else parts.path + "/"
    return urllib.parse.urlunsplit((parts.scheme, netloc, path + "gpushare/", "", ""))


# -- the widget ---------------------------------------------------------------------------------

def _cut(inner: str, title: str) -> str:
    """A cell's HTML, cut with an ellipsis where it is too long, ``title`` on hover (an HTML
    widget's own tooltip goes to its hidden label)."""
    return f'<div class="gpushare-cut" title="{html.escape(title)}">{inner}</div>'


def _classed(widget, *classes):
    for name in classes:
        widget.add_class(name)
    return widget


class _JobRow:
    """The widgets of one table row, kept across refreshes so that only values change: a cell
    per column (``cells``) and the buttons; ``widgets`` in the table's order."""

    def __init__(self, panel: "Panel", job_id: str):
        self.cells = {key: _classed(widgets.HTML(), "gpushare-td", f"gpushare-{key}")
                      for key, *_ in COLUMNS}
        compact = {"width": "auto", "flex": "0 0 auto"}
        self.logs = widgets.Button(description="Logs", tooltip=f"show the logs of job {job_id}",
                                   layout=widgets.Layout(**compact))
        self.cancel = widgets.Button(description="Cancel", tooltip=f"cancel job {job_id}",
                                     layout=widgets.Layout(**compact))
        # Whose log the Logs button shows, for a job with several ranks (hidden otherwise).
        self.rank = widgets.Dropdown(options=[("rank 0", 0)], value=0,
                                     tooltip=f"the rank of job {job_id} whose log to show",
                                     layout=widgets.Layout(width="6.5em", flex="0 0 auto",
                                                           display="none"))
        self.cancel.on_click(lambda _: panel.cancel(job_id))
        self.logs.on_click(lambda _: panel.show_logs(job_id, self.rank.value))
        self.actions = _classed(widgets.HBox([self.logs, self.cancel, self.rank]),
                                "gpushare-td", "gpushare-actions")
        self.widgets = (*self.cells.values(), self.actions)

    def update(self, row: dict) -> None:
        cells = self.cells
        # A long name or reason is cut short with an ellipsis, and whole on hover.
        cells["name"].value = _cut(html.escape(row["name"]), row["name"])
        cells["state"].value = state_html(row)
        cells["gpus"].value = html.escape(row["gpus"])
        cells["elapsed"].value = html.escape(row["elapsed"])
        cells["details"].value = _cut(details_html(row), "; ".join(
            x for x in (row["use"]["text"], row["use"]["idle"], row["reason"],
                        row.get("lent")) if x))
        self.cancel.disabled = not row["active"]
        if len(self.rank.options) != row["ranks"]:
            self.rank.options = [(f"rank {r}", r) for r in range(row["ranks"])]
            self.rank.value = 0
        self.rank.layout.display = None if row["ranks"] > 1 else "none"

    def close(self) -> None:
        for widget in (*self.widgets, self.cancel, self.logs, self.rank):
            widget.close()


class Panel(widgets.VBox):
    """Your build slice, your projects' quota bars and your jobs, with cancel and logs buttons.

    ``client`` talks to the pool (default: ``PoolClient`` from the environment, with a 10 s
    timeout); ``server`` to this notebook server's extension for the slice watchdog's report
    (default: from ``JUPYTERHUB_SERVICE_URL``; None to leave it out). Refreshes every
    ``interval`` seconds once displayed (or after :meth:`start`) until :meth:`close`.
    """

    @property
    def client(self) -> PoolClient:
        return self._client

    @client.setter
    def client(self, value: PoolClient) -> None:
        # The panel polls and says when the pool is away: its calls are not retried inside.
        self._client = copy.copy(value)
        self._client.retry_s = 0

    def __init__(self, client: PoolClient | None = None, interval: float = 5.0, *,
                 server: PoolClient | None | bool = True, max_jobs: int = 20, **kwargs):
        if not interval > 0:
            raise ValueError(f"interval must be a number of seconds above 0, not {interval!r}")
        self.client = client or PoolClient(timeout=10.0)
        if server is True:
            url = server_url()
            server = PoolClient(url, timeout=5.0, retry_s=0) if url else None
        self.server = server or None
        self.interval = interval
        self.max_jobs = max_jobs
        self.status = widgets.HTML("Asking the pool…")
        self.slice_line = widgets.HTML()
        self.quota_box = widgets.VBox()
        self.header = tuple(_classed(widgets.HTML(_cut(html.escape(title), tip or title)),
                                     "gpushare-th") for _, title, tip, _ in COLUMNS) + (
            _classed(widgets.HTML(), "gpushare-th"),)  # over the buttons
        # One grid, header and rows, so that they scroll as one when it is too narrow.
        self.table = _classed(widgets.GridBox(self.header, layout=widgets.Layout(
            grid_template_columns=TEMPLATE, width="100%", overflow="auto")), "gpushare-jobs")
        self.jobs_box = widgets.VBox([self.table])
        self.logs = widgets.Output(layout=widgets.Layout(max_height="20em", overflow="auto"))
        self._no_projects = widgets.HTML("You are in no project.")
        sentence = no_jobs()
        self._no_jobs = widgets.HTML(html.escape(sentence[:1].upper() + sentence[1:] + "."))
        self._parts = [self.status, self.slice_line, self.quota_box, *self.header, self.table,
                       self.jobs_box, self.logs, self._no_projects, self._no_jobs]
        self._rows: dict[str, _JobRow] = {}
        self._shown: list[str] = []  # the ids of the rows, in the table's order
        self._bars: list[widgets.HTML] = []
        self._capacity: tuple[float, float | None] = (0.0, None)  # (when asked, GPUs)
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.refreshes = 0  # successful ones, for people and tests
        super().__init__([widgets.HTML(f"{STYLE}<b>GPU share</b>"), self.status, self.slice_line,
                          self.quota_box, self.jobs_box, self.logs], **kwargs)
        self._parts.append(self.children[0])

    # -- life cycle --

    def start(self) -> None:
        """Refresh now and then every ``interval`` seconds, in a background thread."""
        with self._lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="gpushare-panel",
                                                daemon=True)
                self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def close(self) -> None:
        """Stop refreshing and close the widgets."""
        self._stop.set()
        with self._lock:
            for row in self._rows.values():
                row.close()
            self._rows.clear()
            for widget in self._parts + self._bars:
                widget.close()
        super().close()

    def _repr_mimebundle_(self, **kwargs):
        self.start()  # shown: keep it current
        return super()._repr_mimebundle_(**kwargs)

    def _comm_closed(self, msg) -> None:
        # The front end closed the widget (its output was cleared, the notebook closed).
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self.interval)

    def open(self):
        super().open()
        if self.comm is not None:
            self.comm.on_close(self._comm_closed)

    # -- reading the pool --

    def refresh(self) -> bool:
        """Ask the pool and redraw; False (and the reason in the status line) when it could
        not be asked."""
        with self._lock:
            if self._stop.is_set():
                return False
            self._show_slice()
            try:
                quota = self.client.quota()
                jobs = self.client.jobs(limit=self.max_jobs)
                capacity = self._pool_capacity()
            except ClientError as e:
                self.status.value = status_html(str(e), self.interval)
                return False
            self._show_bars(project_bars(quota, capacity))
            now = time.time()
            self._show_jobs(job_rows(jobs, now))
            self.status.value = (f'<span title="{time.strftime("%H:%M:%S")}">Updated '
                                 f'{when(now, now)}.</span>')
            self.refreshes += 1
            return True

    def _pool_capacity(self) -> float | None:
        # The pool's size changes rarely: asked once a minute.
        asked, capacity = self._capacity
        if time.monotonic() - asked > 60 or capacity is None:
            capacity = self.client.pool().get("capacity")
            self._capacity = (time.monotonic(), capacity)
        return capacity

    def _show_slice(self) -> None:
        try:
            build_slice, problem = BuildSlice.from_environment(), None
        except ValueError as e:
            build_slice, problem = None, str(e)
        answer = None
        if build_slice is not None and self.server is not None:
            try:
                answer = self.server.slice()
            except ClientError:
                answer = None  # the line still says what the slice is
        self.slice_line.value = slice_html(slice_view(build_slice, answer, problem),
                                           slice_use(answer, time.time()))

    def _show_bars(self, bars: list[dict]) -> None:
        while len(self._bars) < len(bars):
            self._bars.append(widgets.HTML())
        for widget, bar in zip(self._bars, bars):
            widget.value = bar_html(bar)
        shown = tuple(self._bars[:len(bars)]) or (self._no_projects,)
        if len(shown) != len(self.quota_box.children) or any(
                a is not b for a, b in zip(shown, self.quota_box.children)):
            self.quota_box.children = shown

    def _show_jobs(self, rows: list[dict]) -> None:
        for gone in set(self._rows) - {r["id"] for r in rows}:
            self._rows.pop(gone).close()
        for row in rows:
            if row["id"] not in self._rows:
                self._rows[row["id"]] = _JobRow(self, row["id"])
            self._rows[row["id"]].update(row)
        self._shown = [r["id"] for r in rows]
        cells = self.header + tuple(w for r in rows for w in self._rows[r["id"]].widgets)
        if tuple(map(id, cells)) != tuple(map(id, self.table.children)):
            self.table.children = cells
        shown = (self.table,) if rows else (self._no_jobs,)
        if shown[0] is not self.jobs_box.children[0]:
            self.jobs_box.children = shown

    @property
    def rows(self) -> list[_JobRow]:
        """The job table's rows as shown, top to bottom."""
        with self._lock:
            return [self._rows[job_id] for job_id in self._shown]

    # -- the buttons --

    def cancel(self, job_id: str) -> None:
        try:
            self.client.cancel(job_id)
        except ClientError as e:
            self.status.value = status_html(str(e), self.interval)
            return
        self.refresh()

    def show_logs(self, job_id: str, rank: int = 0) -> None:
        """The end of the log of one rank of the job (its current attempt) in the panel's
        output area."""
        try:
            text = "".join(self.client.logs(job_id, rank=rank))
        except ClientError as e:
            text = f"{str(e)[:1].upper()}{str(e)[1:]}\n"
        else:
            cut = len(text) > LOG_TAIL
            text = (f"[… the first {len(text) - LOG_TAIL} characters left out]\n" if cut
                    else "") + text[-LOG_TAIL:]
        self.logs.outputs = ({"output_type": "stream", "name": "stdout",
                              "text": f"── logs of job {job_id}{f', rank {rank}' if rank else ''} "
                                      f"──\n{text or '(no output yet)'}"},)

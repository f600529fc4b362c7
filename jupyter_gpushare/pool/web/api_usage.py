"""REST handlers of GPU utilization: ``GET api/usage``, ``POST api/samples`` (node agents), and
the GPU part of ``api/pool`` (paths and shapes: web/openapi.py).

Who reads what: admins every row; a user their own rows (jobs, slices, themselves) and their
projects' (project rows and those projects' jobs); GPUs (``by=gpu``) only admins. Readings
are posted only by node agents (``c.GPUUsage.agent_service``, ``agent_nodes``), each for the
node it proves it is on (``utilization/node_agents.py``).
"""

from __future__ import annotations

import math
import re
import time
from datetime import datetime

from ...policy.model import GPU
from ...trainjob import RUNNING
from ...usage import showback
from ...usage.attribution import Holding, attribute
from ...usage.report import BY, SORTS
from ...usage.rollup import DAY
from ...usage.sampler import GPUReading, MachineReading, ProcessReading
from ...validate import Invalid, digits
from ..store.usage_rollups import Scope
from ..utilization.node_agents import HEADER, NotProven, Unverifiable
from ..utilization.service import job_owner, slice_owner
from .handlers import ServiceHandler

NO_DEPARTMENT = "(no department)"  # no department's name can have a space or parentheses

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])\Z", re.ASCII)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": DAY, "w": 7 * DAY}
MAX_WINDOW = 400 * DAY
MAX_POINTS = 10_000


# -- api/usage ----------------------------------------------------------------------------

def parse_time(text: str, now: float, name: str) -> float:
    """``now``, a duration back from now (``7d``, ``12h``, ``30m``), epoch seconds, or an ISO
    8601 time (the service's local time unless it names a zone)."""
    text = text.strip()
    if text == "now":
        return now
    found = _DURATION.match(text)
    if found:
        return now - float(found.group(1)) * _UNITS[found.group(2)]
    try:
        value = float(text)
    except ValueError:
        try:
            when = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise Invalid(f"{name} must be a time like 7d (7 days ago), 12h, 30m, now, epoch "
                          f"seconds, a date 2026-10-01 or 2026-11-20T09:00, not "
                          f"{text[:40]!r}") from None
        try:
            if when.tzinfo is None:
                when = when.replace(tzinfo=datetime.now().astimezone().tzinfo).astimezone()
            return when.timestamp()
        except (OverflowError, OSError, ValueError):
            raise Invalid(f"{name} {text[:40]!r} is out of range; give a time between 1970 "
                          f"and 9999") from None
    if not math.isfinite(value) or value < 0:
        raise Invalid(f"{name} must be epoch seconds of 0 or more, not {text[:40]!r}")
    return value


def parse_window(args: dict, now: float, since: str) -> tuple[float, float]:
    """The query's ``since`` (default ``since``) and ``until`` (default now), checked: in
    order, and at most MAX_WINDOW apart."""
    until = parse_time(args.get("until", "now"), now, "until")
    start = parse_time(args.get("since", since), now, "since")
    if start >= until:
        raise Invalid("since must be before until")
    if until - start > MAX_WINDOW:
        raise Invalid(f"the window may be at most {MAX_WINDOW // DAY} days; ask for less")
    return start, until


def parse_step(text: str) -> int:
    found = _DURATION.match(text.strip()) if not digits(text.strip()) else None
    seconds = int(text) if digits(text.strip()) else \
        (float(found.group(1)) * _UNITS[found.group(2)] if found else None)
    if seconds is None or seconds < 60 or seconds % 60:
        raise Invalid(f"step must be whole minutes of at least 1m, like 1m, 1h or 1d (or "
                      f"seconds: 3600), not {text[:40]!r}")
    return int(seconds)


def usage_query(args: dict[str, str], now: float) -> dict:
    """The checked query of ``GET api/usage`` (``Invalid`` with one sentence otherwise)."""
    unknown = sorted(set(args) - {"since", "until", "by", "step", "sort", "limit", "format"})
    if unknown:
        raise Invalid(f"unknown parameter(s) {', '.join(unknown)}; the parameters are since, "
                      f"until, by, step, sort, limit and format")
    fmt = args.get("format", "json")
    if fmt not in ("json", "csv"):
        raise Invalid(f"format must be json or csv, not {fmt[:40]!r}")
    since, until = parse_window(args, now, "7d")
    by = args.get("by", "project")
    if by not in BY:
        raise Invalid(f"by must be one of {', '.join(BY)}, not {by[:40]!r}")
    step = parse_step(args["step"]) if args.get("step") else None
    if step and (until - since) / step > MAX_POINTS:
        raise Invalid(f"a step of {step} s gives more than {MAX_POINTS} points in this window; "
                      f"choose a larger step")
    sort = args.get("sort", "allocated")
    if sort not in SORTS:
        raise Invalid(f"sort must be one of {', '.join(SORTS)}, not {sort[:40]!r}")
    limit = args.get("limit", "100")
    if not digits(limit, 4) or not 1 <= int(limit) <= 1000:
        raise Invalid(f"limit must be a whole number from 1 to 1000, not {limit[:40]!r}")
    return {"since": since, "until": until, "by": by, "step": step, "sort": sort,
            "limit": int(limit), "format": fmt}


class UsageHandler(ServiceHandler):
    async def get(self):
        if self.who.kind != "user":
            self.fail(403, "GPU usage is read by users and admins, not by services")
        args = {k: self.get_argument(k) for k in self.request.query_arguments}
        try:
            q = usage_query(args, time.time())
        except Invalid as e:
            self.fail(e.status, str(e))
        if q["by"] == "gpu" and not self.who.admin:
            self.fail(403, "only admins can read usage by GPU; by=project, department, user, "
                           "job or slice shows yours")
        scope = Scope() if self.who.admin else \
            Scope(self.who.name, frozenset(p.name for p in self.my_projects()))
        fold = None
        if q["by"] == "department":  # each project's rows into its department's, as it is now
            home = {p.name: p.department or NO_DEPARTMENT for p in self.store.quotas.projects()}
            fold = lambda key: (home.get(key[0], NO_DEPARTMENT),)  # noqa: E731
        answer = await self.usage.meter.query(q["since"], q["until"], BY[q["by"]], scope,
                                              q["step"], q["sort"], q["limit"], fold)
        if q["format"] == "csv":
            send_csv(self, showback.to_csv(showback.showback_rows(answer, q["by"])), "usage.csv")
            return
        answer.update(by=q["by"], sort=q["sort"], definitions=DEFINITIONS,
                      idle_threshold=self.usage.idle_threshold / 100)
        self.reply(answer)


def send_csv(handler, text: str, filename: str) -> None:
    handler.set_header("Content-Type", "text/csv; charset=utf-8")
    handler.set_header("Content-Disposition", f'attachment; filename="{filename}"')
    handler.finish(text)


DEFINITIONS = {
    "allocation": "GPU-seconds held ÷ (GPUs of the pool drawn on × window): the train pool for "
                  "projects and jobs, the build pool for slices, both for users, the GPU itself "
                  "for GPUs",
    "utilization": "utilized GPU-seconds ÷ allocated GPU-seconds (while measurable); a GPU-second "
                   "is utilized in proportion to its SM utilization, so a slice's utilization "
                   "is its share of the GPU ÷ its fraction",
    "idle_ratio": "GPU-seconds held while the holder's SM utilization stayed below "
                  "idle_threshold ÷ allocated GPU-seconds",
}


# -- api/pool's GPUs ------------------------------------------------------------------------

def pool_gpus(handler) -> dict:
    """The pool map: every GPU read, who holds it, its utilization and memory now; and what
    could not be read, in sentences. Non-admins see other people's holdings without names."""
    usage, who = handler.usage, handler.who
    mine = {p.name for p in handler.my_projects()} if not who.admin else set()
    gpus = []
    for at, use in usage.meter.gpus_now():
        holders = []
        for h in use.holders:
            o = h.owner
            entry = {"kind": o.kind, "gpus": h.milli / GPU,
                     "sm": None if h.sm is None else round(h.sm / 100, 4),
                     "memory_bytes": h.memory,
                     "idle_for_s": _round(usage.meter.idle_for(o.kind, o.key))}
            if o.kind == "job":
                entry["project"] = o.project
            if who.admin or o.user == who.name or (o.project and o.project in mine):
                entry.update(user=o.user, **({"job": o.job, "attempt": int(o.key.split("/")[1])}
                                             if o.kind == "job" else {"slice": o.key}))
            holders.append(entry)
        gpus.append({"node": use.node, "index": use.index, "uuid": use.uuid, "pool": use.pool,
                     "name": use.name, "lost": use.lost,
                     "utilization": None if use.utilization is None else
                     round(use.utilization / 100, 4),
                     "memory_used_bytes": use.memory_used, "memory_total_bytes": use.memory_total,
                     "held": use.held / GPU, "holders": holders,
                     "outside": {"processes": use.outside.processes,
                                 "memory_bytes": use.outside.memory},
                     "at": at})
    out = {"gpus": gpus, "usage_notes": usage.meter.notes(), "usage_source": usage.source}
    if usage.culler is not None:
        events = list(usage.culler.events)[-50:]
        out["culling"] = {"after": usage.cull_idle_slices_after, "warning": usage.cull_warning,
                          "culled": usage.culler.culled,
                          "events": events if who.admin else
                          [e for e in events if e["user"] == who.name]}
    return out


def _round(value):
    return None if value is None else round(value)


# -- api/samples (node agents) --------------------------------------------------------------

MAX_GPUS, MAX_PROCESSES, MAX_MIG = 64, 512, 16


def _number(value, what: str, nullable: bool = True, most: float | None = None):
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or value < 0 or (most is not None and value > most):
        raise Invalid(f"{what} must be a number from 0{f' to {most:g}' if most else ''}"
                      f"{' or null' if nullable else ''}")
    return value


def _text(value, what: str, default: str = "") -> str:
    if value is None:
        return default
    if not isinstance(value, str) or len(value) > 255:
        raise Invalid(f"{what} must be a string of at most 255 characters")
    return value


def _claim(value, what: str):
    """A process's or GPU's owner as the agent names it: {"job", "attempt"} or {"slice"}."""
    if value is None:
        return None
    if not isinstance(value, dict) or not (set(value) <= {"job", "attempt", "slice"}):
        raise Invalid(f"{what} must be null, {{\"job\": id, \"attempt\": n}} or "
                      f"{{\"slice\": id}}")
    if "slice" in value:
        return ("slice", _text(value["slice"], f"{what}.slice"))
    attempt = value.get("attempt")
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise Invalid(f"{what}.attempt must be a whole number of 1 or more")
    return ("job", _text(value.get("job"), f"{what}.job"), attempt)


def _processes(items, what: str, claims: dict) -> tuple[ProcessReading, ...]:
    if not isinstance(items, list) or len(items) > MAX_PROCESSES:
        raise Invalid(f"{what} must be a list of at most {MAX_PROCESSES} processes")
    out = []
    for i, p in enumerate(items):
        if not isinstance(p, dict):
            raise Invalid(f"{what}[{i}] must be an object with pid, memory, sm and owner")
        pid = p.get("pid")
        if isinstance(pid, bool) or not isinstance(pid, int) or pid < 0:
            raise Invalid(f"{what}[{i}].pid must be a whole number")
        owner = _claim(p.get("owner"), f"{what}[{i}].owner")
        if owner:
            claims[pid] = owner
        out.append(ProcessReading(pid, _number(p.get("memory"), f"{what}[{i}].memory"),
                                  _number(p.get("sm"), f"{what}[{i}].sm", most=100)))
    return tuple(out)


def parse_samples(body, now: float):
    """A node agent's reading: ``(MachineReading, process claims, GPU claims)``."""
    if not isinstance(body, dict):
        raise Invalid("the body must be a JSON object with node and gpus")
    extra = sorted(set(body) - {"node", "at", "gpus", "problem"})
    if extra:
        raise Invalid(f"unknown field(s) {', '.join(extra)}; the fields are node, at, gpus and "
                      f"problem")
    node = _text(body.get("node"), "node")
    if not node:
        raise Invalid("node must name the machine the reading is from")
    at = _number(body.get("at", now), "at", nullable=False)
    if abs(at - now) > 300:
        raise Invalid("at is more than 5 minutes away from the pool's clock; send readings as "
                      "they are taken, and keep the node's clock in time (NTP)")
    items = body.get("gpus")
    if not isinstance(items, list) or len(items) > MAX_GPUS:
        raise Invalid(f"gpus must be a list of at most {MAX_GPUS} GPUs")
    proc_claims: dict[int, tuple] = {}
    gpu_claims: dict[str, list] = {}
    gpus = []
    for i, g in enumerate(items):
        if not isinstance(g, dict):
            raise Invalid(f"gpus[{i}] must be an object")
        uuid = _text(g.get("uuid"), f"gpus[{i}].uuid")
        if not uuid:
            raise Invalid(f"gpus[{i}].uuid must be the GPU's UUID")
        mig = g.get("mig") or []
        if not isinstance(mig, list) or len(mig) > MAX_MIG:
            raise Invalid(f"gpus[{i}].mig must be a list of at most {MAX_MIG} instances")
        held = g.get("held_by") or []
        if not isinstance(held, list) or len(held) > 64:
            raise Invalid(f"gpus[{i}].held_by must be a list of at most 64 owners")
        gpu_claims[uuid] = [_claim(h, f"gpus[{i}].held_by[{k}]") for k, h in enumerate(held)]
        instances = tuple(GPUReading(
            k, _text(m.get("uuid"), f"gpus[{i}].mig[{k}].uuid"), _text(m.get("name"), "name"),
            int(_number(m.get("memory_total", 0), "memory_total", nullable=False)),
            _number(m.get("memory_used"), "memory_used"), None,
            _processes(m.get("processes", []), f"gpus[{i}].mig[{k}].processes", proc_claims))
            for k, m in enumerate(mig) if isinstance(m, dict))
        index = g.get("index", i)
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise Invalid(f"gpus[{i}].index must be a whole number")
        gpus.append(GPUReading(
            index, uuid, _text(g.get("name"), f"gpus[{i}].name"),
            int(_number(g.get("memory_total", 0), f"gpus[{i}].memory_total", nullable=False)),
            _number(g.get("memory_used"), f"gpus[{i}].memory_used"),
            _number(g.get("utilization"), f"gpus[{i}].utilization", most=100),
            _processes(g.get("processes", []), f"gpus[{i}].processes", proc_claims),
            instances, _text(g.get("note"), f"gpus[{i}].note"), bool(g.get("lost", False))))
    reading = MachineReading(node, float(at), tuple(gpus),
                             _text(body.get("problem"), "problem"))
    return reading, proc_claims, gpu_claims


class SamplesHandler(ServiceHandler):
    async def post(self):
        agents = self.usage.agents
        if self.who.kind != "service" or not agents.is_agent(self.who.name):
            self.fail(403, f"GPU readings are posted only by the gpushare node agents (the "
                           f"JupyterHub service {agents.shared!r} or one of "
                           f"c.GPUUsage.agent_nodes)")
        try:
            reading, proc_claims, gpu_claims = parse_samples(self.body(), time.time())
        except Invalid as e:
            self.fail(e.status, str(e))
        try:
            await agents.check(self.who.name, reading.node, self.request.headers.get(HEADER))
        except NotProven as e:
            self.fail(403, str(e))
        except Unverifiable as e:
            self.fail(503, str(e))
        owners, holdings, pools = self._resolve(reading.node, proc_claims, gpu_claims)
        self.usage.meter.ingest(reading.node, reading.at,
                                attribute(reading, holdings, owners, pools), reading.problem)
        self.reply({"gpus": len(reading.gpus), "attributed": len(owners)}, 202)

    def _resolve(self, node: str, proc_claims: dict, gpu_claims: dict):
        """The agent's claims, believed only where the pool agrees: a job attempt running on
        that node, a slice on that node."""
        store = self.store
        jobs = {r.id: r for r in store.jobs.active() if r.state == RUNNING and node in
                (r.placement or {})}
        slices = {s.id: s for s in store.slices.all() if s.node == node}

        def owner(claim):
            if claim is None:
                return None
            if claim[0] == "job":
                row = jobs.get(claim[1])
                if row is None or row.attempt != claim[2]:
                    return None
                return job_owner(row.id, row.attempt, row.user, row.project), GPU
            s = slices.get(claim[1])
            return None if s is None else (slice_owner(s.id, s.user), s.milli)

        owners = {pid: o[0] for pid, c in proc_claims.items() if (o := owner(c))}
        # No more GPUs of this node than the pool gave: a job's placement there, one GPU
        # per slice (in the reading's order; a claim beyond that is not believed).
        room = {("job", r.id): (r.placement or {}).get(node, 0) // GPU for r in jobs.values()}
        holdings = {}
        for uuid, claims in gpu_claims.items():
            holdings[uuid] = []
            for c in claims:
                o = owner(c)
                key = (c[0], c[1]) if c else None
                if o is None or room.get(key, 1) <= 0:
                    continue
                room[key] = room.get(key, 1) - 1
                holdings[uuid].append(Holding(*o))
        pool = "build" if node in self.build.names else "train"
        return owners, holdings, {uuid: pool for uuid in gpu_claims}


# -- api/activity (the notebook server extension) ----------------------------------------

class ActivityHandler(ServiceHandler):
    """A notebook server says how many of its kernels are busy (``notebook/activity.py``):
    culling never stops a server whose kernels are busy. Only about the caller's own servers
    that hold a build slice (404 for any other), so invented names keep nothing."""

    def post(self):
        if self.who.kind != "user":
            self.fail(403, "kernel activity is reported by users' notebook servers")
        body = self.body()
        try:
            if not isinstance(body, dict) or set(body) - {"server", "kernels", "busy"}:
                raise Invalid("the body must be {\"server\": name, \"kernels\": n, "
                              "\"busy\": n}")
            server = _text(body.get("server"), "server")
            kernels, busy = body.get("kernels"), body.get("busy")
            for name, value in (("kernels", kernels), ("busy", busy)):
                if isinstance(value, bool) or not isinstance(value, int) or \
                        not 0 <= value <= 10_000:
                    raise Invalid(f"{name} must be a whole number from 0 to 10000")
            if busy > kernels:
                raise Invalid("busy must be at most kernels")
        except Invalid as e:
            self.fail(e.status, str(e))
        culler = self.usage.culler
        noted = culler.kernels_said(self.who.name, server, kernels, busy) if culler is not None \
            else self.store.slices.holds(self.who.name, server)
        if not noted:
            which = f"server {server!r}" if server else "default server"
            self.fail(404, f"your {which} holds no build slice; kernel activity is "
                           "taken only from servers that hold one")
        self.set_status(204)
        self.finish()


def routes(prefix: str) -> list:
    p = prefix.rstrip("/")
    return [(rf"{p}/api/usage", UsageHandler), (rf"{p}/api/samples", SamplesHandler),
            (rf"{p}/api/activity", ActivityHandler)]

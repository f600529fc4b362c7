"""Trace, quota and department files: reading, checking and deriving quotas.

Trace CSV (docs/reference/trace-format.md): ``job_id,submit_time,duration,gpus,project`` and
optionally ``user,priority,kind,util`` (``util``: the job's GPU utilization in percent,
0 to 100); ``.gz`` files are read transparently. Quotas are
``project,quota``, departments ``department,quota,limit,projects``. Every problem is
reported as a ``TraceError`` naming the file, the line and what to fix.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator, Mapping

from ..policy.departments import guaranteed, two_levels
from ..policy.model import GPU, Department, Project, gpus_text
from ..policy.quotas import overbooking

REQUIRED = ("job_id", "submit_time", "duration", "gpus", "project")
OPTIONAL = ("user", "priority", "kind", "util")
DEPARTMENT_COLUMNS = ("department", "quota", "limit", "projects")
MAX_DEPARTMENTS = 1000  # far beyond any university's faculties; a bigger file is a mistake
MAX_NAME = 100  # characters in a department's name, as in a project's (pool/admin/project_specs.py)


class TraceError(ValueError):
    """A trace or quota file that cannot be used, said in one sentence."""

    def __init__(self, path, line: int | None, message: str):
        where = f"{path}" if line is None else f"{path}, line {line}"
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True, slots=True)
class TraceJob:
    id: str
    submit_time: float
    duration: float
    gpus: int  # milli-GPUs
    project: str
    user: str = ""
    priority: int = 0
    kind: str = "train"
    line: int = 0  # where it stands in its file, for messages
    util: float | None = None  # GPU utilization while it runs (0..1); None: not given


def _open_text(path: Path):
    try:
        raw = path.open("rb")
    except OSError as e:
        raise TraceError(path, None, f"cannot be read ({e.strerror}); check the path") from None
    with raw:
        data = raw.read()
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise TraceError(path, None, f"is not a valid gzip file ({e})") from None
    try:
        return io.StringIO(data.decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise TraceError(path, None, "is not UTF-8 text; save it as a UTF-8 CSV") from None


def _rows(path: Path, reader: csv.DictReader) -> Iterator[dict]:
    """The rows of ``reader``; what the csv module cannot read (a field beyond its limit of
    128 KiB, most often after an unclosed quote) as a ``TraceError`` too."""
    try:
        yield from reader
    except csv.Error as e:  # line_num counts the records read whole: this one begins after
        raise TraceError(path, reader.line_num + 1, f"cannot be read as CSV ({e}); check the "
                                                    f"quoting from there") from None


def _number(path, line, name, text, *, integer=False):
    try:
        value = int(text) if integer else float(text)
    except (TypeError, ValueError):
        kind = "a whole number" if integer else "a number"
        raise TraceError(path, line, f"{name} must be {kind}, not {text!r}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise TraceError(path, line, f"{name} must be a finite number, not {text!r}")
    return value


def read_trace(path: str | Path) -> list[TraceJob]:
    """All jobs of a trace file, in file order, checked line by line."""
    path = Path(path)
    reader = csv.DictReader(_open_text(path))
    header = reader.fieldnames or []
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise TraceError(path, 1, f"the header lacks column(s) {', '.join(missing)}; it needs "
                                  f"{','.join(REQUIRED)}")
    jobs, seen = [], set()
    for row in _rows(path, reader):
        line = reader.line_num
        if None in row or any(row.get(c) is None for c in REQUIRED):
            raise TraceError(path, line, f"has {len(row) - (None in row) + len(row.get(None) or [])}"
                                         f" fields but the header has {len(header)}")
        job_id = row["job_id"].strip()
        if not job_id:
            raise TraceError(path, line, "job_id is empty")
        if job_id in seen:
            raise TraceError(path, line, f"job_id {job_id!r} appears twice; ids must be unique")
        seen.add(job_id)
        submit = _number(path, line, "submit_time", row["submit_time"])
        duration = _number(path, line, "duration", row["duration"])
        if submit < 0:
            raise TraceError(path, line, f"submit_time must be 0 or more, not {submit:g}")
        if duration <= 0:
            raise TraceError(path, line, f"duration must be more than 0 seconds, not {duration:g}")
        kind = (row.get("kind") or "train").strip() or "train"
        if kind not in ("train", "build"):
            raise TraceError(path, line, f"kind must be train or build, not {kind!r}")
        gpus = _number(path, line, "gpus", row["gpus"])
        if gpus <= 0:
            raise TraceError(path, line, f"gpus must be positive, not {row['gpus']!r}")
        if kind == "train" and gpus != int(gpus):
            raise TraceError(path, line, f"gpus must be a whole number for a train job, not "
                                         f"{row['gpus']!r} (fractions are for kind=build)")
        if kind == "build" and gpus > 1:
            raise TraceError(path, line, f"a build slice is at most 1 GPU, not {row['gpus']!r}")
        project = row["project"].strip()
        if not project:
            raise TraceError(path, line, "project is empty")
        priority = row.get("priority")
        priority = _number(path, line, "priority", priority, integer=True) if priority else 0
        util = (row.get("util") or "").strip() or None
        if util is not None:
            util = _number(path, line, "util", util)
            if not 0 <= util <= 100:
                raise TraceError(path, line, f"util is the job's GPU utilization in percent, "
                                             f"from 0 to 100, not {util:g}")
            util /= 100
        jobs.append(TraceJob(job_id, submit, duration, round(gpus * GPU), project,
                             (row.get("user") or "").strip(), priority, kind, line,
                             util))
    if not jobs:
        raise TraceError(path, None, "has no jobs")
    return jobs


def read_quotas(path: str | Path) -> dict[str, int]:
    """A ``project,quota`` CSV (GPUs) as milli-GPUs per project."""
    path = Path(path)
    reader = csv.DictReader(_open_text(path))
    if not reader.fieldnames or not {"project", "quota"} <= set(reader.fieldnames):
        raise TraceError(path, 1, "the header must be project,quota")
    quotas = {}
    for row in _rows(path, reader):
        line = reader.line_num
        name = (row.get("project") or "").strip()
        if not name:
            raise TraceError(path, line, "project is empty")
        if name in quotas:
            raise TraceError(path, line, f"project {name!r} appears twice")
        quota = _number(path, line, "quota", row.get("quota"))
        if quota < 0:
            raise TraceError(path, line, f"quota must be 0 or more GPUs, not {quota:g}")
        quotas[name] = round(quota * GPU)
    return quotas


def read_departments(path: str | Path) -> dict[Department, tuple[str, ...]]:
    """A ``department,quota,limit,projects`` CSV (GPUs; ``limit`` may be empty for none,
    ``projects`` space-separated; an ``over_quota_weight`` column is optional): each
    department and its projects, in file order. Whether the projects' quotas fit in their
    departments, and the departments in the pool, ``departments_problem`` says once the
    quotas are known."""
    path = Path(path)
    reader = csv.DictReader(_open_text(path))
    header = reader.fieldnames or []
    missing = [c for c in DEPARTMENT_COLUMNS if c not in header]
    if missing:
        raise TraceError(path, 1, f"the header lacks column(s) {', '.join(missing)}; it needs "
                                  f"{','.join(DEPARTMENT_COLUMNS)}")
    out: dict[Department, tuple[str, ...]] = {}
    names: set[str] = set()
    member_of: dict[str, str] = {}
    for row in _rows(path, reader):
        line = reader.line_num
        if len(names) == MAX_DEPARTMENTS:
            raise TraceError(path, line, f"has more than {MAX_DEPARTMENTS} departments; give "
                                         f"at most {MAX_DEPARTMENTS}")
        if None in row or any(row.get(c) is None for c in DEPARTMENT_COLUMNS):
            raise TraceError(path, line, f"does not have the header's {len(header)} fields")
        name = row["department"].strip()
        if not name:
            raise TraceError(path, line, "department is empty")
        if len(name) > MAX_NAME:
            raise TraceError(path, line, f"department name is {len(name)} characters long; "
                                         f"give at most {MAX_NAME}")
        if name in names:
            raise TraceError(path, line, f"department {name!r} appears twice; give each "
                                         f"department once")
        names.add(name)
        quota = _number(path, line, "quota", row["quota"])
        if quota < 0:
            raise TraceError(path, line, f"quota must be 0 or more GPUs, not {quota:g}")
        limit = row["limit"].strip()
        limit = _number(path, line, "limit", limit) if limit else None
        if limit is not None and limit < quota:
            raise TraceError(path, line, f"limit ({limit:g} GPUs) is below the quota "
                                         f"({quota:g} GPUs); raise the limit, or leave it "
                                         f"empty for none")
        weight = (row.get("over_quota_weight") or "").strip()
        weight = _number(path, line, "over_quota_weight", weight, integer=True) if weight else 1
        if weight < 0:
            raise TraceError(path, line, f"over_quota_weight must be 0 or more, not {weight}")
        projects = tuple(row["projects"].split())
        for project in projects:
            if project in member_of:
                where = "twice" if member_of[project] == name else \
                    f"in department {member_of[project]!r} too"
                raise TraceError(path, line, f"project {project!r} is named {where}; a "
                                             f"project belongs to one department")
            member_of[project] = name
        out[Department(name, round(quota * GPU), weight,
                       None if limit is None else round(limit * GPU))] = projects
    if not out:
        raise TraceError(path, None, "has no departments")
    return out


def hold_projects(departments: Mapping[Department, tuple[str, ...]], quotas: Mapping[str, int]
                  ) -> tuple[dict[Department, tuple[str, ...]], list[str]]:
    """The departments with each quota raised to its projects' quotas where those add up to
    more (a limit below that raised with it), and one sentence per department raised: after
    the projects' quotas were scaled or derived (``apportion``), each department still holds
    its projects. The departments' own quotas are never scaled."""
    out, said = {}, []
    for dept, projects in departments.items():
        held = sum(quotas.get(p, 0) for p in projects)
        if held > dept.quota:
            also = ""
            if dept.limit is not None and dept.limit < held:
                also = f" (and its limit from {gpus_text(dept.limit)})"
            said.append(f"raised department {dept.name}'s quota from {gpus_text(dept.quota)} to "
                        f"{gpus_text(held)}{also}, what its projects' quotas add up to once "
                        f"apportioned to the capacity")
            dept = replace(dept, quota=held,
                           limit=None if dept.limit is None else max(dept.limit, held))
        out[dept] = projects
    return out, said


def departments_problem(departments: Mapping[Department, tuple[str, ...]],
                        quotas: Mapping[str, int], capacity: int) -> str | None:
    """Why ``departments`` over the projects' ``quotas`` (milli-GPUs) cannot be guaranteed on
    ``capacity`` milli-GPUs, in the pool's own words (``policy.departments``,
    ``policy.quotas``); None when they can."""
    member_of = {p: d.name for d, names in departments.items() for p in names}
    projects = [Project(name, quotas.get(name, 0), department=member_of.get(name, ""))
                for name in sorted(set(quotas) | set(member_of))]
    if problem := two_levels(projects, departments):
        return problem
    if problem := overbooking(guaranteed(projects, departments), capacity):
        return (f"{problem} (each department's quota counts whole, beside the quotas of the "
                f"projects outside departments): lower the departments' quotas or raise the "
                f"capacity")
    return None


def departments_over(quotas: Mapping[str, int], count: int, spare: int = 0
                     ) -> dict[Department, tuple[str, ...]]:
    """``count`` departments over the projects of ``quotas`` (milli-GPUs), dealt round-robin
    by name: each department's quota holds its projects' quotas and an even part of ``spare``
    milli-GPUs that no project's quota holds (the benchmarks' department level)."""
    names = sorted(quotas)
    groups = [tuple(names[k::count]) for k in range(count)]
    return {Department(f"dept-{k:03d}", sum(quotas[p] for p in group) + spare // count): group
            for k, group in enumerate(groups) if group}


def apportion(weights: dict[str, float], total_gpus: int) -> dict[str, int]:
    """Whole GPUs (as milli) in proportion to ``weights``, summing to ``total_gpus`` exactly
    (largest remainder; ties by name)."""
    wsum = sum(weights.values())
    if wsum <= 0:
        return dict.fromkeys(weights, 0)
    exact = {p: w * total_gpus / wsum for p, w in weights.items()}
    whole = {p: math.floor(x) for p, x in exact.items()}
    spare = total_gpus - sum(whole.values())
    for p in sorted(exact, key=lambda p: (-(exact[p] - whole[p]), p))[:spare]:
        whole[p] += 1
    return {p: n * GPU for p, n in whole.items()}


def proportional_quotas(jobs: list[TraceJob], capacity_gpus: int) -> dict[str, int]:
    """Quotas in proportion to each project's GPU-hours in the trace."""
    hours: dict[str, float] = {}
    for j in jobs:
        hours[j.project] = hours.get(j.project, 0.0) + j.gpus * j.duration
    return apportion(hours, capacity_gpus)

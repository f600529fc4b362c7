"""Trace and quota files: reading, checking and deriving quotas.

Trace CSV (docs/reference/trace-format.md): ``job_id,submit_time,duration,gpus,project`` and
optionally ``user,priority,kind``; ``.gz`` files are read transparently. Every problem is
reported as a ``TraceError`` naming the file, the line and what to fix.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
from dataclasses import dataclass
from pathlib import Path

from ..policy.model import GPU

REQUIRED = ("job_id", "submit_time", "duration", "gpus", "project")
OPTIONAL = ("user", "priority", "kind")


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
    for row in reader:
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
        jobs.append(TraceJob(job_id, submit, duration, round(gpus * GPU), project,
                             (row.get("user") or "").strip(), priority, kind, line))
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
    for row in reader:
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

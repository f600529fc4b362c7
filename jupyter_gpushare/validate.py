"""Checking what users send. Each problem is one sentence that says what to do."""

from __future__ import annotations

from . import trainjob
from .policy.model import GPU

JOB_FIELDS = trainjob.FIELDS
MAX_GPUS = 1_000_000


def digits(text, most: int = 18) -> bool:
    """Whether ``text`` is 1 to ``most`` ASCII digits (``str.isdigit`` also takes '²', which
    ``int`` refuses)."""
    return isinstance(text, str) and 0 < len(text) <= most and text.isascii() and text.isdigit()


class Invalid(ValueError):
    """Bad input: ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def _unknown(body: dict, allowed: set[str]) -> None:
    extra = sorted(set(body) - allowed)
    if extra:
        raise Invalid(f"unknown field(s) {', '.join(extra)}; the fields are "
                      f"{', '.join(sorted(allowed))}")


def _int(value, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise Invalid(f"{name} must be a whole number, not {value!r}")
    if not low <= value <= high:
        raise Invalid(f"{name} must be between {low} and {high}, not {value}")
    return value


def _gpus_amount(value, name: str) -> int:
    """A GPU amount in GPUs (as people write it) to milli-GPUs."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Invalid(f"{name} must be a number of GPUs, not {value!r}")
    if value < 0 or value != value or value in (float("inf"),):
        raise Invalid(f"{name} must be 0 or more GPUs, not {value!r}")
    if value > MAX_GPUS:  # beyond any pool, and beyond what the store's integers hold
        raise Invalid(f"{name} must be at most {MAX_GPUS:,} GPUs, not {value!r}")
    milli = round(value * GPU)
    if abs(milli - value * GPU) > 1e-6:
        raise Invalid(f"{name} has more than three decimals ({value!r}); GPUs are counted "
                      f"in thousandths")
    return milli


MAX_JOB_SIZE = 256 * 1024


def job_spec(body, max_size: int = MAX_JOB_SIZE) -> dict:
    """The checked job fields (GPUs in milli), without the project, which needs the user.
    Command, source, env and workdir may take ``max_size`` bytes together (413 beyond)."""
    if not isinstance(body, dict):
        raise Invalid("the body must be a JSON object with at least gpus and command or source")
    _unknown(body, JOB_FIELDS)
    command, source = body.get("command"), body.get("source")
    name, priority, env = body.get("name", ""), body.get("priority", 0), body.get("env", {})
    workdir = body.get("workdir")
    try:
        gpus = trainjob.check_gpus(body.get("gpus", 1))
        trainjob.check_program(command, source)
        trainjob.check_name(name)
        trainjob.check_priority(priority)
        if not isinstance(env, dict):
            raise Invalid("env must be an object of NAME: value strings")
        for key, value in env.items():
            trainjob.check_env_variable(key, value)
        if workdir is not None:
            trainjob.check_workdir(workdir)
    except trainjob.BadField as e:
        hint = "; leave it out to run in your home directory" if e.field == "workdir" else ""
        raise Invalid(f"{e}{hint}") from None
    per_gpu = body.get("per_gpu", False)
    if not isinstance(per_gpu, bool):
        raise Invalid(f"per_gpu must be true (one rank per GPU) or false (one rank per node, "
                      f"the default), not {per_gpu!r}")
    size = sum(len(a.encode("utf-8", "surrogatepass")) for a in [
        *(command or ()), source or "", workdir or "", *env, *env.values()])
    if size > max_size:
        raise Invalid(f"the job's command, source, env and workdir take {size // 1024} KiB "
                      f"together, more than the {max_size // 1024} KiB allowed; put large code "
                      f"or data in a file", 413)
    key = body.get("request_id")
    return {"gpus": gpus * GPU, "command": command, "source": source, "name": name,
            "priority": priority, "env": dict(env), "project": body.get("project"),
            "workdir": workdir, "request_id": None if key is None else request_id(key),
            "per_gpu": per_gpu}


def request_id(value) -> str:
    """A client-chosen key that makes a retried submit return the job the first try made
    (the ``Idempotency-Key`` header or the ``request_id`` field), e.g. a UUID."""
    try:
        return trainjob.check_request_id(value)
    except trainjob.BadField as e:
        raise Invalid(str(e)) from None

"""What a train job is, in the words both sides of the REST API share: its states, the rules
its fields follow and the environment names the pool keeps for itself.

The client checks a spec with these rules before sending it and the service checks it again
when it arrives (``validate.py``), with the same sentences; the backends set the names
reserved here and the front ends read the states. Every state and reserved name is written
here alone (``tests/test_trainjob.py`` looks for strays). Standard library only, and
nothing from the package: the CLI, a notebook kernel and a job's own process import it.
"""

from __future__ import annotations

import re

# -- states ------------------------------------------------------------------------------------

PENDING = "pending"  # waiting for its GPUs: the first time, or again after a preemption
RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
CANCELLED = "cancelled"
ACTIVE = (PENDING, RUNNING)  # may still change, and can be cancelled
FINAL = (SUCCEEDED, FAILED, CANCELLED)  # never change again
STATES = ACTIVE + FINAL  # in the order the API documents them

PREEMPTED = "preempted"
"""How an attempt ends when its job goes back to pending; an attempt's outcome, never a job's
state (an attempt otherwise ends as its job does: succeeded, failed or cancelled)."""

# -- the environment the pool sets ---------------------------------------------------------------

RESERVED_PREFIXES = ("GPUSHARE_", "JUPYTERHUB_")  # the pool's own variables and the hub's

CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"  # which GPUs the job sees, by UUID
CUDA_DEVICE_ORDER = "CUDA_DEVICE_ORDER"
NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
DEVICE_VARIABLES = (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER, NVIDIA_VISIBLE_DEVICES)

# Each rank's: torch.distributed's env:// and torchrun's, jax.distributed.initialize's, and the
# PET_ options torchrun reads (backends/ranks.py says what each holds).
MASTER_ADDR, MASTER_PORT = "MASTER_ADDR", "MASTER_PORT"
WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE = (
    "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
NODE_RANK, GROUP_RANK, GROUP_WORLD_SIZE = "NODE_RANK", "GROUP_RANK", "GROUP_WORLD_SIZE"
JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID, JAX_LOCAL_DEVICE_IDS = (
    "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "JAX_LOCAL_DEVICE_IDS")
PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE, PET_MASTER_ADDR, PET_MASTER_PORT = (
    "PET_NNODES", "PET_NODE_RANK", "PET_NPROC_PER_NODE", "PET_MASTER_ADDR", "PET_MASTER_PORT")
RANK_VARIABLES = (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE,
                  NODE_RANK, GROUP_RANK, GROUP_WORLD_SIZE, JAX_COORDINATOR_ADDRESS,
                  JAX_NUM_PROCESSES, JAX_PROCESS_ID, JAX_LOCAL_DEVICE_IDS, PET_NNODES,
                  PET_NODE_RANK, PET_NPROC_PER_NODE, PET_MASTER_ADDR, PET_MASTER_PORT)
"""Variables the backends set for each rank: a job's own ``env`` may not set them."""

# -- the fields of a job spec --------------------------------------------------------------------

FIELDS = frozenset({"project", "gpus", "command", "source", "name", "priority", "env",
                    "workdir", "request_id", "per_gpu"})
PRIORITY = (-100, 100)  # a job's priority; a project's job priority range lies within it
MAX_NAME = 100  # characters
MAX_ARGUMENTS = 10_000
MAX_ENV_VALUE = 32_768  # characters of one variable's value
MAX_WORKDIR = 4096  # characters
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")  # \Z: "$" would let a final newline in
REQUEST_ID_PATTERN = "[A-Za-z0-9._:-]{1,64}"  # a UUID fits
REQUEST_ID = re.compile(REQUEST_ID_PATTERN + r"\Z")


class BadField(ValueError):
    """A job spec field that breaks its rule: ``field`` and ``problem``, the sentence without
    the field's name, so that a front end can name its own option (``--gpus: must be 1 or
    more, not 0``); ``str()`` is the whole sentence."""

    def __init__(self, field: str, problem: str, *, message: str | None = None):
        self.field, self.problem = field, problem
        super().__init__(message or f"{field} {problem}")


# Each check takes the value as JSON has it (a front end converts its text first) and returns
# it; ``shown`` is how to write a bad value in the sentence (default: its repr).

def check_gpus(value, shown: str | None = None) -> int:
    """A train job's GPUs: a whole number, 1 or more (fractions are for build slices)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadField("gpus", f"must be a whole number of GPUs (1 or more), not "
                       f"{shown or repr(value)}")
    if value < 1:
        raise BadField("gpus", f"must be 1 or more, not {value}; a train job needs at least "
                       f"one GPU")
    return value


def check_priority(value, shown: str | None = None) -> int:
    """A job's priority within its project."""
    low, high = PRIORITY
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadField("priority", f"must be a whole number, not {shown or repr(value)}")
    if not low <= value <= high:
        raise BadField("priority", f"must be between {low} and {high}, not {value}")
    return value


def check_name(value) -> str:
    if not isinstance(value, str) or len(value) > MAX_NAME:
        raise BadField("name", f"must be a string of at most {MAX_NAME} characters")
    return value


def check_program(command, source) -> None:
    """Exactly one of ``command`` (a list of words) and ``source`` (Python code)."""
    if (command is None) == (source is None):
        raise BadField("command", "", message="give either command (a list of strings) or "
                       "source (Python code), not both and not neither")
    if command is not None:
        check_command(command)
    else:
        check_source(source)


def check_command(command) -> list:
    if not isinstance(command, list) or not command or \
            not all(isinstance(word, str) for word in command):
        raise BadField("command", 'must be a non-empty list of strings, e.g. '
                       '["python", "train.py"]')
    if len(command) > MAX_ARGUMENTS or not command[0]:
        raise BadField("command", f"must start with the program to run and have at most "
                       f"{MAX_ARGUMENTS:,} arguments")
    if any("\0" in word for word in command):
        raise BadField("command", "may not contain NUL characters")
    return command


def check_source(source) -> str:
    if not isinstance(source, str) or not source.strip():
        raise BadField("source", "must be Python code as a non-empty string")
    return source


def check_env_variable(name, value) -> None:
    """One variable of a job's ``env``: a valid name the pool does not set itself, and a
    string value."""
    if not isinstance(name, str) or not ENV_NAME.match(name):
        raise BadField("env", f"name {name!r} is not a valid variable name")
    if name.startswith(RESERVED_PREFIXES + DEVICE_VARIABLES):
        raise BadField("env", f"may not set {name}: the pool sets it for each attempt")
    if name in RANK_VARIABLES:
        raise BadField("env", f"may not set {name}: the pool sets it for each rank")
    if not isinstance(value, str) or "\0" in value or len(value) > MAX_ENV_VALUE:
        raise BadField("env", f"{name} must be a string of at most {MAX_ENV_VALUE // 1024} KiB "
                       f"without NUL")


def check_workdir(value) -> str:
    """Where the job runs: an absolute path (the pool's machine knows no other directory)."""
    if not isinstance(value, str) or not value.startswith("/") or "\0" in value \
            or len(value) > MAX_WORKDIR:
        raise BadField("workdir", f"must be an absolute path like /home/you/project, not "
                       f"{value!r}")
    return value


def check_request_id(value) -> str:
    """A client-chosen key that makes a retried submit return the job the first try made
    (the ``Idempotency-Key`` header or the ``request_id`` field), e.g. a UUID."""
    if not isinstance(value, str) or not REQUEST_ID.match(value):
        raise BadField("request_id", f"(or the Idempotency-Key header) must be 1 to 64 "
                       f"letters, digits, '.', '_', ':' or '-', such as a UUID, not {value!r}")
    return value


NO_PROJECT = ("you are in no project of the train pool; ask an admin to add you to a project's "
              "JupyterHub group")


def default_project(mine: list[str]) -> str:
    """The project of a job that names none: the user's only one. Otherwise ``BadField``,
    whose problem says the user is in none (``NO_PROJECT``) or lists theirs; a front end adds
    how to name one in its own words (``--project NAME``, or the field)."""
    if len(mine) == 1:
        return mine[0]
    if not mine:
        raise BadField("project", NO_PROJECT, message=NO_PROJECT)
    several = f"you are in several projects ({', '.join(sorted(mine))})"
    raise BadField("project", several, message=several)

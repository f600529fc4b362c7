"""The job vocabulary (``trainjob.py``) is written once: every job state and reserved environment
name of the package comes from it, and the client and the service check a spec by the same
rules with the same sentences."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_gpushare import trainjob
from jupyter_gpushare.backends import launcher, ranks
from jupyter_gpushare.client import InvalidInput, job_spec as client_spec
from jupyter_gpushare.policy.model import JobState
from jupyter_gpushare.pool.web.openapi import SPEC
from jupyter_gpushare.validate import Invalid, job_spec as server_spec

PACKAGE = Path(trainjob.__file__).parent

# Being moved: the lead restructures the service's wiring in these files and replaces their
# literals with trainjob's names after this lands. Empty this list then.
# Standard library only, each a file that runs on its own: the launcher as a job pod's source
# (python3 -c, the package may be absent there) and the cell runner (tests run it as a copy);
# test_the_standalone_files_use_the_vocabularys_names keeps their names in the vocabulary.
STANDALONE = {"backends/launcher.py", "notebook/runner.py"}
NOT_A_JOB_STATE = "# not a job state"  # a line that says so: another system's word

STATE_WORDS = set(trainjob.STATES) | {trainjob.PREEMPTED}
RESERVED_NAMES = (set(trainjob.RANK_VARIABLES) | set(trainjob.DEVICE_VARIABLES)
                  | set(trainjob.RESERVED_PREFIXES))


def _files(exempt: set[str]):
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name != "trainjob.py" and name not in exempt:
            yield name, path.read_text(encoding="utf-8")


def _parents(tree) -> dict:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _docstrings(tree) -> set:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                and node.body and isinstance(node.body[0], ast.Expr):
            out.add(node.body[0].value)
        # an attribute's docstring: a bare string after an assignment
        body = getattr(node, "body", None)
        body = body if isinstance(body, list) else []
        for a, b in zip(body[:-1], body[1:]):
            if isinstance(a, (ast.Assign, ast.AnnAssign)) and isinstance(b, ast.Expr):
                out.add(b.value)
    return out


def _strings(source: str):
    """Each string literal of code (not docstrings, not inside f-strings) with its parent and
    the tree's parents."""
    tree = ast.parse(source)
    parents, docs = _parents(tree), _docstrings(tree)
    lines = source.splitlines()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or node in docs:
            continue
        if NOT_A_JOB_STATE in lines[node.lineno - 1]:
            continue
        up, inside_fstring = parents.get(node), False
        while up is not None:
            inside_fstring |= isinstance(up, ast.JoinedStr)
            up = parents.get(up)
        if not inside_fstring:
            yield node, parents.get(node), parents


def _field_name(node, parent, parents) -> bool:
    """A literal used as a field's name: a key of a dict, an index, ``.get``'s key, or an
    element of an OpenAPI schema's ``required`` list (the projects' ``pending`` count)."""
    if isinstance(parent, ast.Dict) and any(node is k for k in parent.keys):
        return True
    if isinstance(parent, ast.Subscript) and parent.slice is node:
        return True
    if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Attribute) \
            and parent.func.attr == "get" and parent.args[:1] == [node]:
        return True
    if not isinstance(parent, ast.List):
        return False
    holder = parents.get(parent)
    return isinstance(holder, ast.Dict) and any(
        isinstance(k, ast.Constant) and k.value == "required" and v is parent
        for k, v in zip(holder.keys, holder.values))


def _stray_states(source: str):
    for node, parent, parents in _strings(source):
        if node.value in STATE_WORDS and not _field_name(node, parent, parents):
            yield node.lineno, repr(node.value)


def _stray_names(source: str):
    for node, _, _ in _strings(source):
        if node.value in RESERVED_NAMES:
            yield node.lineno, repr(node.value)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.keyword) and node.arg in RESERVED_NAMES:
            yield node.lineno, f"{node.arg}="


def test_job_states_are_written_once():
    stray = [f"{name}:{line}: {what}" for name, source in
             _files(set()) for line, what in _stray_states(source)]
    assert not stray, "job states written outside trainjob.py (import them from there):\n" + \
        "\n".join(stray)


def test_reserved_names_are_written_once():
    stray = [f"{name}:{line}: {what}" for name, source in
             _files(STANDALONE)
             for line, what in _stray_names(source)]
    assert not stray, "reserved names written outside trainjob.py (import them from there):\n" \
        + "\n".join(stray)


def test_the_search_finds_what_it_looks_for():
    source = ('"""running"""\n'
              'if state == "pending": x = {"pending": 1}["pending"]; p.get("running")\n'
              'env.update(RANK="0"); os.environ.get("CUDA_VISIBLE_DEVICES")\n'
              'header = f"{\'preempted\':>11}"\n'
              'started = {"running"}  # not a job state: a container\'s\n'
              'schema = {"required": ["id", "pending"], "enum": ["failed"]}\n')
    assert list(_stray_states(source)) == [(2, "'pending'"), (6, "'failed'")]
    assert list(_stray_names(source)) == [(3, "'CUDA_VISIBLE_DEVICES'"), (3, "RANK=")]


@pytest.mark.parametrize("module", ["jupyter_gpushare.trainjob", "jupyter_gpushare.client"])
def test_the_vocabulary_loads_alone(module):
    """The CLI, a kernel and a job's process import it: nothing of the service comes along."""
    code = (f"import sys, {module}; print(' '.join(sorted(m for m in sys.modules "
            f"if m.split('.')[0] in ('jupyter_gpushare', 'tornado', 'sqlalchemy', 'traitlets'))))")
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True).stdout.split())
    # (the package's version comes along: written by the build from git's tags)
    assert loaded == {"jupyter_gpushare", "jupyter_gpushare._version",
                      "jupyter_gpushare.trainjob", module}


def test_the_states():
    assert trainjob.STATES == trainjob.ACTIVE + trainjob.FINAL
    assert not set(trainjob.ACTIVE) & set(trainjob.FINAL)
    assert trainjob.PREEMPTED not in trainjob.STATES  # an attempt's outcome, not a job's state
    assert {s.value for s in JobState} == STATE_WORDS
    assert {s.value for s in JobState if s.finished} == set(trainjob.FINAL)


def _enums(tree, path=()):
    if isinstance(tree, dict):
        if "enum" in tree:
            yield path, tree["enum"]
        for key, value in tree.items():
            yield from _enums(value, path + (key,))
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            yield from _enums(value, path + (i,))


def test_the_openapi_states_are_the_vocabulary():
    states = [enum for path, enum in _enums(SPEC) if set(enum) & STATE_WORDS]
    assert len(states) == 2  # a job's state, and GET api/jobs?state=
    assert all(enum == list(trainjob.STATES) for enum in states)
    job_spec = SPEC["components"]["schemas"]["JobSpec"]["properties"]
    assert (job_spec["priority"]["minimum"], job_spec["priority"]["maximum"]) == trainjob.PRIORITY
    assert job_spec["name"]["maxLength"] == trainjob.MAX_NAME
    assert set(job_spec) == trainjob.FIELDS


def test_every_rank_variable_is_reserved():
    for per_gpu in (False, True):
        lay = ranks.layout({"a": 4000, "b": 2000}, per_gpu=per_gpu)
        for rank in lay.ranks:
            for name in ranks.rank_env(lay, rank, "10.0.0.1", 29500):
                assert name in trainjob.RANK_VARIABLES or \
                    name.startswith(trainjob.RESERVED_PREFIXES), name


def test_the_standalone_files_use_the_vocabularys_names():
    names = launcher.process_env({trainjob.RANK: "4"}, 1)
    assert names[trainjob.RANK] == "5"
    assert all(n in trainjob.RANK_VARIABLES or n.startswith(trainjob.RESERVED_PREFIXES)
               for n in names), names
    for name in STANDALONE:
        source = (PACKAGE / name).read_text(encoding="utf-8")
        assert "from .." not in source and "import jupyter_gpushare" not in source, name
        written = {n.value for n, _, _ in _strings(source)} | {
            k.arg for k in ast.walk(ast.parse(source)) if isinstance(k, ast.keyword)}
        assert written & RESERVED_NAMES <= set(trainjob.RANK_VARIABLES), name


# -- the client and the service check a spec alike ---------------------------------------------

BAD = [  # (spec fields, the sentence both sides say)
    ({"gpus": 0}, "gpus must be 1 or more, not 0; a train job needs at least one GPU"),
    ({"gpus": 1.5}, "gpus must be a whole number of GPUs (1 or more), not 1.5"),
    ({"gpus": True}, "gpus must be a whole number of GPUs (1 or more), not True"),
    ({"priority": 101}, "priority must be between -100 and 100, not 101"),
    ({"priority": "high"}, "priority must be a whole number, not 'high'"),
    ({"name": "n" * 101}, "name must be a string of at most 100 characters"),
    ({"env": {"GPUSHARE_JOB_ID": "x"}},
     "env may not set GPUSHARE_JOB_ID: the pool sets it for each attempt"),
    ({"env": {"JUPYTERHUB_API_TOKEN": "x"}},
     "env may not set JUPYTERHUB_API_TOKEN: the pool sets it for each attempt"),
    ({"env": {"CUDA_VISIBLE_DEVICES": "0"}},
     "env may not set CUDA_VISIBLE_DEVICES: the pool sets it for each attempt"),
    ({"env": {"WORLD_SIZE": "2"}}, "env may not set WORLD_SIZE: the pool sets it for each rank"),
    ({"env": {"1X": "2"}}, "env name '1X' is not a valid variable name"),
    ({"env": {"BIG": "x" * 32_769}}, "env BIG must be a string of at most 32 KiB without NUL"),
    ({"command": []}, 'command must be a non-empty list of strings, e.g. ["python", "train.py"]'),
    ({"command": ["python", "a\0"]}, "command may not contain NUL characters"),
    ({"command": None, "source": " "}, "source must be Python code as a non-empty string"),
    ({"source": "print(1)"}, "give either command (a list of strings) or source (Python code), "
                             "not both and not neither"),
    ({"workdir": "project"}, "workdir must be an absolute path like /home/you/project, not "
                             "'project'"),
]


@pytest.mark.parametrize("fields, sentence", BAD)
def test_client_and_service_refuse_alike(fields, sentence):
    spec = {"command": ["python", "train.py"], **fields}
    with pytest.raises(Invalid) as server:
        server_spec(spec)
    arguments = {k: v for k, v in spec.items() if k != "command"}
    with pytest.raises(InvalidInput) as client:
        client_spec(spec["command"], **arguments)
    hint = "; leave it out to run in your home directory" if "workdir" in fields else ""
    assert str(client.value) == sentence
    assert str(server.value) == sentence + hint

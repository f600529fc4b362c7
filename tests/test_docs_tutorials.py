"""The tutorials (docs/tutorials/*.md) show the commands the tests run, or commands checked
here against the code that runs them, so that a reader who copies one gets what the page says.

- The demo's set-up command is ``.ci/run``'s with the demo's extra instead of the tests', and
  it ends with ``jupyterhub -f hub_config/jupyterhub_config.py``, which ``tests/test_demo.py``
  starts; its ``%%train`` cell and terminal command are the ones that test runs.
- Every ``%%train`` and ``%train`` line parses with the magics' own parser, every cell body is
  Python, every ``gpushare …`` line parses with the command's own parser, and every Python
  block compiles.
- Every ``GPUSHARE_…`` variable a tutorial names exists in the code, and every rank variable
  is one the backends set.
- The ``--with``/``--out`` cell of "Your first %%train", run by the job runner, gives back what
  the page shows.

No hub is needed: each check takes well under a second. A failure names the page, the line and
the block.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from jupyter_gpushare import trainjob
from jupyter_gpushare.backends import ranks
from jupyter_gpushare.cli import build_parser as cli_parser
from jupyter_gpushare.notebook import runner
from jupyter_gpushare.notebook.magics import TrainError, parse

REPO = Path(__file__).resolve().parents[1]
TUTORIALS = REPO / "docs" / "tutorials"
PAGES = ("demo.md", "first-train.md", "distributed.md")
DEMO_START = ".venv/bin/jupyterhub -f hub_config/jupyterhub_config.py"
_FENCE = re.compile(r"(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)")


@dataclass(frozen=True)
class Block:
    """A fenced code block of a page: where it starts (the fence's line), its info string
    (``bash``, ``ipython``…) and its text, dedented."""

    page: str
    line: int
    info: str
    text: str

    def __str__(self):
        first = self.text.splitlines()[0] if self.text.strip() else ""
        return f"docs/tutorials/{self.page}, line {self.line} ({self.info or 'no language'}: " \
               f"{first[:60]!r})"

    @property
    def lines(self) -> list[str]:
        return self.text.splitlines()


def read_blocks(page: str) -> list[Block]:
    found, lines = [], (TUTORIALS / page).read_text().splitlines()
    i = 0
    while i < len(lines):
        start = _FENCE.fullmatch(lines[i])
        if not start:
            i += 1
            continue
        indent, fence = len(start["indent"]), start["fence"]
        body, j = [], i + 1
        while j < len(lines) and not re.fullmatch(rf"[ \t]*{re.escape(fence[0])}{{{len(fence)},}}"
                                                  r"[ \t]*", lines[j]):
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        assert j < len(lines), f"docs/tutorials/{page}, line {i + 1}: a code block is not closed"
        found.append(Block(page, i + 1, start["info"].strip(), "\n".join(body)))
        i = j + 1
    return found


BLOCKS = {page: read_blocks(page) for page in PAGES}
ALL = [block for page in PAGES for block in BLOCKS[page]]


def blocks_where(test) -> list[Block]:
    return [block for block in ALL if test(block)]


def _ids(items):
    return [str(item if isinstance(item, Block) else item[0]) for item in items]


def _source(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _constant(module: ast.Module, name: str):
    """The literal value assigned to ``name`` at the top of a module (read, not imported: the
    demo's test module needs a browser to import)."""
    for node in module.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name
                                                for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"no {name} = ... in the module")


def _steps(command: str) -> list[str]:
    return [step.strip() for step in command.split(" && ")]


# -- the demo --------------------------------------------------------------------------------

def test_every_tutorial_has_its_code_blocks():
    for page in PAGES:
        assert BLOCKS[page], f"docs/tutorials/{page} shows no code block; is it written?"


def test_the_demo_set_up_is_the_ci_command_with_the_demo_extra():
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines()
          if line.startswith("python3 -m venv")]
    assert len(ci) == 1, ".ci/run should hold one set-up command starting with python3 -m venv"
    ci_steps = _steps(ci[0])
    assert ci_steps[-1] == ".venv/bin/python -m pytest", ci_steps
    expected = [step.replace("'.[test]'", "'.[demo]'") for step in ci_steps[:-1]]
    assert expected != ci_steps[:-1], ".ci/run no longer installs '.[test]': update this test"
    shown = blocks_where(lambda b: b.page == "demo.md" and b.text.startswith("python3 -m venv"))
    assert len(shown) == 1, "demo.md should show the set-up command exactly once"
    demo_steps = _steps(shown[0].text)
    assert demo_steps[-1] == DEMO_START, \
        f"{shown[0]}: the command should end with {DEMO_START!r}, as the demo's test starts it"
    assert demo_steps[:-1] == expected, \
        f"{shown[0]}: the set-up should be .ci/run's with '.[demo]': {' && '.join(expected)}"
    assert re.search(r"^demo = \[", (REPO / "pyproject.toml").read_text(), re.M), \
        "pyproject.toml has no 'demo' extra, which demo.md installs"


def test_the_second_run_is_the_last_step_alone():
    again = blocks_where(lambda b: b.page == "demo.md" and b.text.strip() == DEMO_START)
    assert again, f"demo.md should show {DEMO_START!r} alone, for a second run"


def test_the_demo_test_starts_the_hub_as_the_tutorial_does():
    """tests/test_demo.py runs ``<venv>/jupyterhub -f hub_config/jupyterhub_config.py``."""
    module = _source(REPO / "tests" / "test_demo.py")
    commands = [node for node in ast.walk(module) if isinstance(node, ast.List)
                and len(node.elts) == 3
                and [getattr(e, "value", None) for e in node.elts[1:]]
                == ["-f", "hub_config/jupyterhub_config.py"]]
    assert commands, "tests/test_demo.py no longer starts jupyterhub -f " \
                     "hub_config/jupyterhub_config.py; the demo tutorial says it does"
    assert "jupyterhub" in ast.unparse(commands[0].elts[0])


def test_the_tutorials_first_cell_is_the_one_the_demo_test_runs():
    cell = _constant(_source(REPO / "tests" / "test_demo.py"), "TRAIN_CELL")
    for page in ("demo.md", "first-train.md"):
        first = next((b for b in BLOCKS[page] if b.text.startswith("%%train")), None)
        assert first is not None, f"docs/tutorials/{page} shows no %%train cell"
        assert first.text == cell, \
            f"{first}: the first %%train cell should be tests/test_demo.py's TRAIN_CELL:\n{cell}"


def test_the_demo_terminal_command_is_the_one_the_demo_test_runs():
    module = _source(REPO / "tests" / "test_demo.py")
    texts = [node.value for node in ast.walk(module)
             if isinstance(node, ast.Constant) and isinstance(node.value, str)
             and "gpushare submit" in node.value]
    assert len(texts) == 1, "tests/test_demo.py should send one gpushare submit from a terminal"
    start = texts[0].index("gpushare submit")
    command = texts[0][start:texts[0].index("; echo", start)]
    shown = [line for b in BLOCKS["demo.md"] for line in b.lines]
    assert command in shown, f"demo.md should show the demo test's terminal command:\n{command}"


# -- the magics ------------------------------------------------------------------------------

_SCRIPT_LINE = re.compile(r"(?:^|=\s*)%train(?:\s+(?P<options>.*))?$")


def _magic_lines():
    found = []
    for block in ALL:
        if block.text.startswith("%%train"):
            found.append((block, block.lines[0][len("%%train"):], False))
        for line in block.lines:
            match = _SCRIPT_LINE.search(line.strip())
            if match:
                found.append((block, match["options"] or "", True))
    return found


MAGICS = _magic_lines()


def test_the_tutorials_show_both_magics():
    assert any(not script for _, _, script in MAGICS) and any(script for _, _, script in MAGICS)


@pytest.mark.parametrize("block,options,script", MAGICS, ids=[
    f"{b.page}:{b.line}:{'%train' if s else '%%train'}{o}" for b, o, s in MAGICS])
def test_every_magic_line_parses(block, options, script):
    magic = "%train" if script else "%%train"
    try:
        args = parse(options, script=script)
    except TrainError as e:
        pytest.fail(f"{block}: {magic}{options} is refused by the magic: {e}")
    assert args is not None, f"{block}: {magic}{options} only prints the help"
    if script:
        written = [b for b in BLOCKS[block.page]
                   if b.lines and b.lines[0].split() == ["%%writefile", args.script]]
        shown = args.script in (TUTORIALS / block.page).read_text().split("`")
        assert written or shown, f"{block}: the page never says what {args.script} holds"
    else:
        body = "\n".join(block.lines[1:])
        try:
            compile(body, str(block), "exec")
        except SyntaxError as e:
            pytest.fail(f"{block}: the cell is not Python (line {e.lineno}: {e.msg}); a train "
                        f"job runs plain Python")


def _python_blocks():
    found = []
    for block in ALL:
        if block.info == "python":
            found.append((block, block.text))
        elif block.lines and block.lines[0].startswith("%%writefile") \
                and block.lines[0].endswith(".py"):
            found.append((block, "\n".join(block.lines[1:])))
    return found


PYTHON = _python_blocks()


@pytest.mark.parametrize("block,code", PYTHON, ids=_ids(PYTHON))
def test_every_python_block_compiles(block, code):
    try:
        compile(code, str(block), "exec")
    except SyntaxError as e:
        pytest.fail(f"{block}: not Python (line {e.lineno}: {e.msg})")


# -- the gpushare command --------------------------------------------------------------------

def _commands():
    found = []
    for block in ALL:
        if block.info not in ("bash", "console", "shell", "sh"):
            continue
        for line in block.lines:
            words = line.strip().removeprefix("$ ")
            if words.startswith(("gpushare ", ".venv/bin/gpushare ")):
                found.append((block, words))
    return found


COMMANDS = _commands()


def test_the_tutorials_show_gpushare_commands():
    assert COMMANDS


@pytest.mark.parametrize("block,command", COMMANDS,
                         ids=[f"{b.page}:{b.line}:{c[:50]}" for b, c in COMMANDS])
def test_every_gpushare_command_parses(block, command, capsys):
    try:
        words = shlex.split(command)
    except ValueError as e:
        pytest.fail(f"{block}: {command!r} cannot be read by a shell ({e})")
    try:
        args = cli_parser().parse_args(words[1:])
    except SystemExit:
        pytest.fail(f"{block}: {command!r} is refused by gpushare: {capsys.readouterr().err}")
    if args.command == "submit":
        assert args.cmd and args.cmd[-1] != "--", f"{block}: {command!r} runs no command"


# -- environment variables -------------------------------------------------------------------

def _rank_variables() -> set[str]:
    names = set(trainjob.RANK_VARIABLES)
    for per_gpu in (False, True):
        lay = ranks.layout({"a": 4000, "b": 4000}, per_gpu=per_gpu)
        for rank in lay.ranks:
            names |= set(ranks.rank_env(lay, rank, "127.0.0.1", 29500))
    return names


def _gpushare_variables() -> set[str]:
    names = set()
    for folder in ("jupyter_gpushare", "hub_config"):
        for path in (REPO / folder).rglob("*.py"):
            names |= set(re.findall(r"\bGPUSHARE_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    return names


RANK_VARIABLES = _rank_variables()
_RANK_LIKE = re.compile(r"\b(?:PET|JAX)_[A-Z0-9_]+\b|\b(?:MASTER_ADDR|MASTER_PORT|WORLD_SIZE|"
                        r"LOCAL_RANK|LOCAL_WORLD_SIZE|NODE_RANK|GROUP_RANK|GROUP_WORLD_SIZE)\b")


@pytest.mark.parametrize("page", PAGES)
def test_every_variable_named_exists(page):
    text = (TUTORIALS / page).read_text()
    known = _gpushare_variables()
    for name in sorted(set(re.findall(r"\bGPUSHARE_[A-Z0-9_]*[A-Z0-9]\b", text))):
        line = text[:text.index(name)].count("\n") + 1
        assert name in known, f"docs/tutorials/{page}, line {line}: {name} is not in the code"
    for name in sorted(set(_RANK_LIKE.findall(text))):
        line = text[:text.index(name)].count("\n") + 1
        assert name in RANK_VARIABLES, \
            f"docs/tutorials/{page}, line {line}: {name} is not a variable the backends set " \
            f"for a rank (backends/ranks.py)"


_READ = re.compile(r"""os\.environ\[["']([A-Za-z_][A-Za-z0-9_]*)["']\]"""
                   r"|\$\{?([A-Za-z_][A-Za-z0-9_]*)")


@pytest.mark.parametrize("page", PAGES)
def test_every_variable_a_job_reads_is_one_it_gets(page):
    """``os.environ["X"]`` and ``$X`` in the tutorials' code: what a job's process is given."""
    local = (REPO / "jupyter_gpushare" / "backends" / "local.py").read_text()
    given = RANK_VARIABLES | {"PATH", "HOME", "USER"} | {
        name for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "GPUSHARE_JOB_ID",
                          "GPUSHARE_ATTEMPT", "GPUSHARE_CHECKPOINT_DIR") if name in local}
    for block in BLOCKS[page]:
        for match in _READ.finditer(block.text):
            name = match[1] or match[2]
            assert name in given, f"{block}: a job reads {name}, which it is not given " \
                                  f"(backends/local.py, backends/ranks.py)"


# -- what a cell gives back ------------------------------------------------------------------

def test_the_with_out_cell_gives_back_what_the_tutorial_shows(tmp_path):
    """Run by the job runner, as the pool would (without a pool): the model the page shows."""
    page = "first-train.md"
    cell = next((b for b in BLOCKS[page]
                 if b.text.startswith("%%train") and "--with data" in b.lines[0]), None)
    assert cell is not None, f"docs/tutorials/{page} shows no %%train --with data cell"
    setup = next((b for b in BLOCKS[page] if b.info == "python"
                  and b.text.startswith("data = ")), None)
    assert setup is not None, f"docs/tutorials/{page} never makes the cell's data"
    args = parse(cell.lines[0][len("%%train"):], script=False)
    namespace: dict = {}
    exec(compile(setup.text, str(setup), "exec"), namespace)
    folder = runner.pack(str(tmp_path), "\n".join(cell.lines[1:]),
                         {name: namespace[name] for name in args.with_vars}, args.out)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"}
    ran = subprocess.run(runner.command(folder), cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=60)
    assert ran.returncode == 0, f"{cell}: the job failed:\n{ran.stdout}{ran.stderr}"
    values, problems = runner.unpack(folder)
    assert not problems, f"{cell}: {problems}"
    text = (TUTORIALS / page).read_text()
    for name in args.out:
        assert repr(values[name]) in text, \
            f"{cell}: the job gives {name} = {values[name]!r}, which the page does not show"
    assert "fitted on GPU-a,GPU-b" in ran.stdout

"""``%%train``, ``%train``, ``%gpushare`` and the Python API in REAL kernels against a REAL
JupyterHub, proxy and pool service (local backend, 4 simulated GPUs).

The kernels get a user's token and the service's address in their environment, as a
single-user server's kernels do. Jobs run as the service's user (``run_as_service_user``, see
``kernels.ServiceUserBackend``); the last tests use a hub whose root service runs each job as
its user, as production does, where that user cannot run this machine's Python."""

import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from hubtest import Hub, free_port, need_proxy, system_users
from kernels import Kernel

from jupyter_gpushare.notebook import runner
from jupyter_gpushare.text import status_line
from jupyter_gpushare.notebook.magics import TrainError, build_parser, parse

TESTS = Path(__file__).resolve().parent
JOB_ID = re.compile(r"\bj-[0-9a-f]{8}\b")

POOL_CONFIG = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
c = get_config()
c.PoolService.backend_class = "kernels.ServiceUserBackend"
c.LocalBackend.run_as_service_user = True
c.LocalBackend.gang_network = "host"  # a service that is not root: jobs run as its own user
c.LocalBackend.simulate_gpus = True
c.LocalBackend.simulated_nodes = 1
c.LocalBackend.simulated_gpus_per_node = 4
c.PoolService.projects = {{"vision": {{"quota": 2, "groups": ["vision"]}},
                          "nlp": {{"quota": 2, "groups": ["nlp"]}}}}
c.PoolService.grace_period = 3
c.PoolService.min_runtime = 0  # preempt at once: these tests watch preemption
"""
# carol is in two projects, dave in none.
GROUPS = {"vision": ["alice", "carol"], "nlp": ["bob", "carol"], "others": ["dave"]}


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    need_proxy()
    hub = Hub(tmp_path_factory.mktemp("hub"), GROUPS, POOL_CONFIG).start()
    yield hub
    hub.stop()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("notebook")


@pytest.fixture(scope="module")
def kernel(hub, workdir):
    kernel = Kernel(str(workdir), {"JUPYTERHUB_API_TOKEN": hub.token("alice"),
                                   "GPUSHARE_URL": hub.pool_url})
    cell = kernel.run("%load_ext jupyter_gpushare")
    assert cell.status == "ok", cell.text
    yield kernel
    kernel.stop()


def job_count(hub) -> int:
    status, body = hub.api("GET", "api/jobs?all=1&limit=1000", "admin")
    assert status == 200, body
    return len(body["jobs"])


def cell_folders(workdir) -> set:
    cells = workdir / ".gpushare" / "cells"
    return set(cells.iterdir()) if cells.exists() else set()


def only_job_id(cell) -> str:
    ids = set(JOB_ID.findall(cell.text))
    assert len(ids) == 1, cell.text
    return ids.pop()


# -- running cells ---------------------------------------------------------------------------

def test_a_cell_runs_on_two_gpus_and_its_output_streams_into_the_cell(hub, kernel, workdir):
    cell = kernel.run(
        "%%train --gpus 2 --name hello\n"
        "import os, sys, time\n"
        "print('hello from the pool', flush=True)\n"
        "time.sleep(1.5)\n"
        "print('devices', os.environ['CUDA_VISIBLE_DEVICES'])\n"
        "print('cwd', os.getcwd())\n"
        "print('python', sys.executable)\n")
    assert cell.status == "ok", cell.text
    assert "hello from the pool" in cell.stdout and not cell.errors
    devices = cell.stdout.split("devices ")[1].split()[0].split(",")
    assert len(devices) == 2 and len(set(devices)) == 2
    assert f"cwd {workdir}" in cell.stdout  # the notebook's working directory
    kernel_python = kernel.run("import sys; print(sys.executable)").stdout.strip()
    assert f"python {kernel_python}" in cell.stdout  # and its Python
    # The first line came while the job still ran (streamed), not at its end.
    streams = [m for m in cell.messages if m["msg_type"] == "stream"]
    assert "hello from the pool" in streams[0]["content"]["text"]
    assert "devices" not in streams[0]["content"]["text"]
    # One live status line, updated in place, that ends with the final state.
    assert len(cell.displays) == 1
    final = next(iter(cell.displays.values()))
    job_id = only_job_id(cell)
    assert re.fullmatch(rf"{job_id} \(hello\) succeeded after \d+s", final), final
    updates = [m for m in cell.messages if m["msg_type"] == "update_display_data"]
    assert any("running on 2 GPUs" in m["content"]["data"]["text/plain"] for m in updates)
    status, job = hub.api("GET", f"api/jobs/{job_id}", "alice")
    assert job["state"] == "succeeded" and job["workdir"] == str(workdir)
    assert not list((workdir / ".gpushare" / "cells").iterdir())  # the job's files are gone


def test_with_and_out_carry_variables_there_and_back(kernel):
    assert kernel.run("x = 20\ndata = {'a': [1, 2]}\ny = 'before'").status == "ok"
    cell = kernel.run("%%train --with x,data --out y,z\n"
                      "y = x * 2 + len(data['a'])\n"
                      "z = [y, str(type(data))]\n")
    assert cell.status == "ok", cell.text
    assert "y, z back in the notebook" in next(iter(cell.displays.values()))
    back = kernel.run("print(y, z)")
    assert back.stdout.strip() == "42 [42, \"<class 'dict'>\"]"


def test_a_value_of_a_class_defined_in_the_notebook_cannot_travel_and_the_cell_says_why(kernel):
    assert kernel.run("class Config:\n    lr = 0.1\ncfg = Config()").status == "ok"
    cell = kernel.run("%%train --with cfg\nprint(cfg.lr)\n")
    assert cell.status == "error" and "Traceback" not in cell.text
    assert re.search(r"job j-\w+ failed with exit code 2: --with cfg cannot be loaded in the "
                     r"job \(AttributeError: .*define them in the cell or in a module; its "
                     r"output is above", cell.error_line), cell.error_line


def test_an_out_variable_the_cell_did_not_define_fails_the_cell_in_one_sentence(kernel):
    cell = kernel.run("%%train --out nope\na = 1\n")
    assert cell.status == "error" and "Traceback" not in cell.text
    assert re.search(r"job j-\w+ failed with exit code 3: --out nope: the cell did not define "
                     r"nope; its output is above", cell.error_line), cell.error_line


def test_a_failing_cell_fails_with_its_exit_code_and_the_users_traceback(kernel):
    cell = kernel.run("%%train\nprint('about to fail')\nraise ValueError('bad data')\n")
    assert cell.status == "error"
    assert "about to fail" in cell.stdout and "ValueError: bad data" in cell.stdout
    assert "runner.py" not in cell.stdout  # the traceback is the user's code only
    assert "failed with exit code 1; its output is above" in cell.error_line


def test_interrupting_the_kernel_cancels_the_job_and_stops_the_next_cells(hub, kernel):
    first = kernel.send("%%train\nimport time\nprint('started', flush=True)\ntime.sleep(60)\n")
    second = kernel.send("print('the next cell ran')")
    kernel.collect(first, until=lambda c: "started" in c.stdout)
    kernel.km.interrupt_kernel()
    cell = kernel.collect(first)
    assert cell.status == "error" and "Traceback" not in cell.text
    job_id = only_job_id(cell)
    assert cell.error_line.endswith(f"interrupted: job {job_id} was cancelled in the pool")
    assert hub.wait_job("alice", job_id, ("cancelled", "succeeded", "failed"),
                        timeout=20)["state"] == "cancelled"
    after = kernel.collect(second)
    assert after.status == "aborted" and "the next cell ran" not in after.stdout


def test_a_preempted_cell_says_so_and_streams_its_next_attempt(hub, kernel):
    sent = kernel.send(
        "%%train --gpus 4\n"  # vision's quota is 2: it borrows nlp's 2 GPUs
        "import os, time\n"
        "print('attempt', os.environ['GPUSHARE_ATTEMPT'], flush=True)\n"
        "if os.environ['GPUSHARE_ATTEMPT'] == '1':\n"
        "    time.sleep(60)\n")
    kernel.collect(sent, until=lambda c: "attempt 1" in c.stdout)
    status, nlp = hub.api("POST", "api/jobs", "bob",
                          {"gpus": 2, "source": "import time; time.sleep(2)"})
    assert status == 201, nlp
    cell = kernel.collect(sent)
    assert cell.status == "ok", cell.text
    assert "attempt 2" in cell.stdout  # the output goes on with the next attempt
    lines = [m["content"]["data"]["text/plain"] for m in cell.messages
             if m["msg_type"] == "update_display_data"]
    assert any("preempted, requeued (attempt 2)" in line for line in lines), lines
    assert "succeeded" in lines[-1] and hub.wait_job("bob", nlp["id"], ("succeeded",))


def test_no_wait_returns_a_handle_that_waits_logs_and_brings_back_results(hub, kernel):
    cell = kernel.run("%%train --no-wait --out answer --name later\n"
                      "import time; time.sleep(0.5)\nanswer = 6 * 7\nprint('bye')\n")
    assert cell.status == "ok" and cell.result.startswith("<Job j-"), cell.text
    # its state as of the cell's run, said so: a saved output never claims it is still pending
    assert re.search(r" (pending|running) at \d\d:\d\d: 1 GPU, project \w+; job.state asks "
                     r"again>'?$", cell.result), cell.result
    cell = kernel.run("job = _\n"
                      "seen = []\n"
                      "info = job.wait(timeout=30, on_update=lambda i: seen.append(i['state']))\n"
                      "print(info['state'], job.state, seen[-1])\n"
                      "print(repr(''.join(job.logs())))\n"
                      "print(job.result())\n")
    assert cell.status == "ok", cell.text
    lines = cell.stdout.splitlines()
    assert lines == ["succeeded succeeded succeeded", "'bye\\n'", "{'answer': 42}"]


def test_the_python_api_follows_output_across_the_wait(kernel):
    cell = kernel.run("import jupyter_gpushare\n"
                      "job = jupyter_gpushare.submit(source='for i in range(3): print(i)', "
                      "gpus=1, name='api')\n"
                      "print(repr(''.join(job.logs(follow=True))), job.state)\n"
                      "try:\n"
                      "    jupyter_gpushare.submit(['true'], with_vars={'a': 1})\n"
                      "except ValueError as e:\n"
                      "    print('refused:', e)\n")
    assert cell.status == "ok", cell.text
    assert "'0\\n1\\n2\\n' succeeded" in cell.stdout
    assert "refused: with_vars and out work with source" in cell.stdout


def test_a_script_runs_with_its_arguments(kernel, workdir):
    (workdir / "train_script.py").write_text(
        "import os, sys\nprint('args', sys.argv[1:])\nprint('cwd', os.getcwd())\n")
    cell = kernel.run("%train --gpus 1 train_script.py --lr 0.1 'two words'")
    assert cell.status == "ok", cell.text
    assert "args ['--lr', '0.1', 'two words']" in cell.stdout
    assert f"cwd {workdir}" in cell.stdout
    assert "(train_script.py) succeeded" in next(iter(cell.displays.values()))


def test_quick_actions(hub, kernel):
    cell = kernel.run("%%train --no-wait --name sleeper\nimport time\nprint('zzz', flush=True)\n"
                      "time.sleep(60)\n")
    job_id = only_job_id(cell)
    hub.wait_job("alice", job_id, ("running",))
    listed = kernel.run("%gpushare jobs")
    assert listed.status == "ok" and job_id in listed.stdout and "sleeper" in listed.stdout
    deadline = time.monotonic() + 20
    while "zzz" not in kernel.run(f"%gpushare logs {job_id}").stdout:
        assert time.monotonic() < deadline
    cancelled = kernel.run(f"%gpushare cancel {job_id}")
    assert cancelled.status == "ok" and f"job {job_id}" in cancelled.stdout
    assert hub.wait_job("alice", job_id, ("cancelled",), timeout=20)
    panel = kernel.run("%gpushare")
    assert panel.status == "ok" and "Traceback" not in panel.text, panel.text
    assert panel.displays or "panel is not installed" in panel.stdout


# -- bad input: one sentence, no traceback, nothing submitted --------------------------------

BAD = [
    ("%%train --gpus 0\nprint(1)", "--gpus: must be 1 or more, not 0"),
    ("%%train --gpus abc\nprint(1)", "--gpus: must be a whole number of GPUs (1 or more), not 'abc'"),
    ("%%train --gpus\nprint(1)", "--gpus needs a value"),
    ("%%train --gpus 64\nprint(1)", "the job asks for 64 GPUs but the train pool has only 4"),
    ("%%train --bogus\nprint(1)", "unknown option --bogus; use %%train [--gpus N]"),
    ("%%train --project nope\nprint(1)", "there is no project 'nope'; yours: vision"),
    ("%%train --project nlp\nprint(1)", "you are not a member of project nlp"),
    ("%%train --priority 1000\nprint(1)", "--priority: must be between -100 and 100"),
    ("%%train --env NOEQUALS\nprint(1)", "--env: entries must be NAME=VALUE"),
    ("%%train --env CUDA_VISIBLE_DEVICES=0\nprint(1)", "--env: may not set CUDA_VISIBLE_DEVICES"),
    ("%%train --with undefined_thing\nprint(1)", "--with undefined_thing: the notebook has no "
                                                "variable undefined_thing"),
    ("import threading; lock = threading.Lock()\n"
     "get_ipython().run_cell_magic('train', '--with lock', 'print(lock)')",
     "--with lock: cannot be sent to the job, it cannot be pickled (TypeError"),
    ("%%train --out 1x\nprint(1)", "--out: give variable names separated by commas"),
    ("%%train\n", "UsageError: %%train is a cell magic, but the cell body is empty"),
    ("%%train\n   \n", "the cell is empty"),
    ("%%train\n%ls\n", "the code has a syntax error on line 1"),
    ("%%train --name 'unclosed\nprint(1)", "the options cannot be read (no closing quotation)"),
    ("%train", "give the script to run: %train"),
    ("%train missing_script.py", "there is no script missing_script.py in"),
    ("%train --with x script.py", "unknown option --with"),
    ("%gpushare frobnicate", "unknown command %gpushare frobnicate"),
    ("%gpushare cancel j-00000000", "there is no job j-00000000"),
]


@pytest.mark.parametrize("code, words", BAD, ids=[
    "gpus-zero", "gpus-abc", "gpus-no-value", "gpus-beyond-pool", "unknown-option",
    "unknown-project", "not-member", "priority", "env-no-equals", "env-reserved",
    "with-undefined", "with-unpicklable", "out-not-a-name", "no-cell", "empty-cell", "magic-in-cell",
    "bad-quoting", "no-script", "missing-script", "script-with", "gpushare-unknown",
    "cancel-unknown-job"])
def test_bad_input_prints_one_sentence_and_submits_nothing(hub, kernel, workdir, code, words):
    before, folders = job_count(hub), cell_folders(workdir)
    cell = kernel.run(code)
    assert cell.status == "error" and "Traceback" not in cell.text, cell.text
    said = cell.stderr.strip() if cell.stderr else cell.error_line  # IPython's UsageError
    assert words in said and "\n" not in said, said
    assert not cell.stdout.strip() and not cell.displays
    assert job_count(hub) == before and cell_folders(workdir) == folders  # nothing left


@pytest.mark.parametrize("setup, words", [
    ("os.environ['JUPYTERHUB_API_TOKEN'] = {carol!r}",
     "you are in several projects (nlp, vision); choose one with --project NAME"),
    ("os.environ['JUPYTERHUB_API_TOKEN'] = {dave!r}", "you are in no project of the train pool"),
    ("del os.environ['JUPYTERHUB_API_TOKEN']", "this kernel has no JupyterHub token"),
    ("os.environ['JUPYTERHUB_API_TOKEN'] = 'not-a-token'",
     "this needs a JupyterHub token that may use the gpushare service"),
    ("del os.environ['GPUSHARE_URL']", "this kernel does not know the pool service's address"),
    ("os.environ['GPUSHARE_URL'] = 'http://127.0.0.1:{closed}/services/gpushare/'; "
     "os.environ['GPUSHARE_RETRY'] = '1'",
     "cannot be reached (connection refused)"),
], ids=["several-projects", "no-project", "no-token", "bad-token", "no-url", "pool-down"])
def test_who_and_where_problems_print_one_sentence(hub, kernel, setup, words):
    before = job_count(hub)
    code = setup.format(carol=hub.token("carol"), dave=hub.token("dave"), closed=free_port())
    assert kernel.run("import os\nsaved = dict(os.environ)\n" + code).status == "ok"
    try:
        cell = kernel.run("%%train\nprint(1)")
    finally:
        kernel.run("os.environ.clear(); os.environ.update(saved)")
    assert cell.status == "error" and "Traceback" not in cell.text, cell.text
    assert words in cell.error_line, cell.error_line
    assert job_count(hub) == before
    if "GPUSHARE_RETRY" in setup:  # tried again for a second, saying so once
        assert cell.text.count("not answering (it may be restarting); trying again for up "
                               "to 1 s") == 1, cell.text


def test_the_pool_refuses_a_relative_workdir(hub):
    status, answer = hub.api("POST", "api/jobs", "alice",
                             {"gpus": 1, "command": ["true"], "workdir": "notebooks/x"})
    assert status == 400 and "workdir must be an absolute path" in answer["error"]


# -- parsing, without a kernel ----------------------------------------------------------------

def test_parsing_the_options():
    args = parse("--gpus 2 --project p --name n --priority -3 --env A=1 --env B=x=y "
                 "--with a,b --with c --out d --no-wait", script=False)
    assert (args.gpus, args.project, args.name, args.priority) == (2, "p", "n", -3)
    assert args.env == [{"A": "1"}, {"B": "x=y"}] and args.no_wait
    assert args.with_vars == ["a", "b", "c"] and args.out == ["d"]
    args = parse("--gpus 4 train.py --gpus 1 --no-wait", script=True)
    assert (args.gpus, args.script, args.args, args.no_wait) == (4, "train.py",
                                                                 ["--gpus", "1", "--no-wait"],
                                                                 False)
    assert parse("--help", script=False) is None
    with pytest.raises(TrainError, match="--gpus: must be 1 or more, not -1"):
        parse("--gpus -1", script=False)
    with pytest.raises(TrainError, match="unknown option --gpu 2"):
        parse("--gpu 2", script=False)


# -- jobs as their users, as a root service runs them ----------------------------------------

ROOT_POOL_CONFIG = """
c = get_config()
c.PoolService.projects = {"vision": {"quota": 2, "groups": ["vision"]}}
c.LocalBackend.simulate_gpus = True
c.LocalBackend.simulated_nodes = 1
c.LocalBackend.simulated_gpus_per_node = 2
c.LocalBackend.env_keep = ["LANG", "LC_ALL"]
"""


@pytest.fixture(scope="module")
def root_hub(tmp_path_factory):
    need_proxy()
    system_users(["alice"])
    directory = tmp_path_factory.mktemp("roothub")
    directory.chmod(0o755)
    hub = Hub(directory, {"vision": ["alice"]}, ROOT_POOL_CONFIG).start()
    yield hub
    hub.stop()


def test_a_job_that_cannot_run_the_notebooks_python_says_so_in_one_sentence(root_hub, workdir):
    """The demo hub's fallback: notebook servers as the hub's user, jobs as their users. Here
    alice cannot enter a root-only directory, nor run a Python under /root."""
    python = os.path.realpath(os.sys.executable)
    if all(os.stat(p).st_mode & 0o001 for p in [python, *Path(python).parents]):
        pytest.skip("other accounts can run this Python, so the job would simply run")
    open_dir = tempfile.mkdtemp(prefix="gpushare-open-")
    os.chmod(open_dir, 0o755)
    env = {"JUPYTERHUB_API_TOKEN": root_hub.token("alice"), "GPUSHARE_URL": root_hub.pool_url}
    for cwd, words in [(str(workdir), f"cannot enter the working directory {workdir}: "
                                      f"Permission denied"),
                       (open_dir, f"cannot run {os.sys.executable}: Permission denied")]:
        kernel = Kernel(cwd, env)
        try:
            assert kernel.run("%load_ext jupyter_gpushare").status == "ok"
            cell = kernel.run("%%train\nprint('never')")
        finally:
            kernel.stop()
        assert cell.status == "error" and "Traceback" not in cell.text, cell.text
        assert "failed with exit code 126: " + words in cell.error_line, cell.error_line


def test_the_status_line():
    job = {"id": "j-1", "name": "", "gpus": 2, "attempt": 1, "state": "pending",
           "queue_position": 3, "reason": "waiting for 2 GPUs"}
    assert status_line(job) == "j-1 queued: position 3 — waiting for 2 GPUs"
    assert status_line({**job, "attempt": 2, "name": "big"}) == \
        "j-1 (big) preempted, requeued (attempt 2): position 3 — waiting for 2 GPUs"
    running = {**job, "state": "running", "started": 100.0, "reason": ""}
    assert status_line(running, now=112.5) == "j-1 running on 2 GPUs · 12s elapsed"
    assert status_line({**running, "gpus": 1}, now=100 + 3725) == \
        "j-1 running on 1 GPU · 1h 02m elapsed"
    ended = {**running, "finished": 103.2}
    assert status_line({**ended, "state": "failed", "exit_code": 1}) == \
        "j-1 failed (exit code 1) after 3s"
    assert status_line({**ended, "state": "succeeded"}) == "j-1 succeeded after 3s"


def test_the_runner_without_a_pool(tmp_path):
    """The folder format both ways, with the job's process run by hand."""
    folder = runner.pack(str(tmp_path), "import os\nb = a + 1\nprint(os.getcwd())\n",
                         {"a": 41}, ["b"])
    assert os.stat(folder).st_mode & 0o777 == 0o700
    done = subprocess.run(runner.command(folder), cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == str(tmp_path), done.stderr
    assert runner.unpack(folder) == ({"b": 42}, [])
    folder = runner.pack(str(tmp_path), "import threading\nb = threading.Lock()\n", {},
                         ["b", "c"])
    done = subprocess.run(runner.command(folder), cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == runner.EXIT_OUTPUT
    values, problems = runner.unpack(folder)
    assert values == {} and problems == [
        "--out b: cannot be pickled (TypeError: cannot pickle '_thread.lock' object)",
        "--out c: the cell did not define c"]
    with pytest.raises(runner.PackError, match="--with f: cannot be sent"):
        runner.pack(str(tmp_path), "f()", {"f": lambda: 1})


# -- distributed cells ---------------------------------------------------------------------

ALLREDUCE_CELL = (f"import sys; sys.path.insert(0, {str(TESTS)!r})\n"
                  "import allreduce, os\n"
                  "allreduce.main([])\n"
                  "rank = int(os.environ['RANK'])\n")


def test_a_per_gpu_cell_runs_a_rank_per_gpu_and_shows_rank_0_or_every_rank(hub, kernel):
    cell = kernel.run("%%train --gpus 2 --per-gpu --out rank\n" + ALLREDUCE_CELL)
    assert cell.status == "ok", cell.text
    lines = [line for line in cell.stdout.splitlines() if line.strip()]
    assert lines and all(line.startswith("[rank 0] ") for line in lines), cell.stdout
    assert '"sum": [3, 3, 3, 3]' in cell.stdout and "[rank 0] rank 0 done" in lines
    assert kernel.run("print(rank)").stdout.strip() == "0"  # --out comes from rank 0
    job_id = only_job_id(cell)
    status, job = hub.api("GET", f"api/jobs/{job_id}", "alice")
    assert (job["per_gpu"], job["ranks"]) == (True, 2)
    rank1 = kernel.run(f"%gpushare logs {job_id} 1")
    assert rank1.stdout.splitlines()[-1] == "rank 1 done"

    cell = kernel.run("%%train --gpus 2 --per-gpu --all-ranks\n" + ALLREDUCE_CELL)
    assert cell.status == "ok", cell.text
    lines = cell.stdout.splitlines()
    for rank in (0, 1):
        mine = [line for line in lines if line.startswith(f"[rank {rank}] ")]
        assert f"[rank {rank}] rank {rank} done" in mine and len(mine) == 2, cell.stdout
    assert len(lines) == 4  # whole lines, each with its rank, none mixed


def test_the_magics_usage_lines_format():
    """``%train --help`` and ``%%train --help`` print their own usage (argparse formats it with
    "%": a bare "%train" in it raised ValueError), as the docs' generated reference does."""
    for script, prog in ((False, "%%train"), (True, "%train")):
        usage = build_parser(script).format_usage()
        assert usage.startswith(f"usage: {prog} ["), usage

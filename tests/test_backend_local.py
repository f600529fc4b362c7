"""The local backend with real processes: devices, environment, logs, exits, stop, restart,
identity. Where the tests run as root (as the service does with real system users), jobs run
as a throw-away system user created for this module."""

import asyncio
import json
import logging
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from jupyter_gpushare.backends import BackendError, Handle, Launch
from jupyter_gpushare.backends.base import Exit
from jupyter_gpushare.backends.local import SIMULATED_LABEL, LocalBackend
from jupyter_gpushare.backends.shim import members
from jupyter_gpushare.gpus import SimulatedInventory, detect
from jupyter_gpushare.policy.model import GPU
from jupyter_gpushare.pool.app import PoolService

IS_ROOT = os.geteuid() == 0
# A gang's private network needs a root service on a machine that lets it make namespaces
# (a container may not); elsewhere gangs meet on the host's loopback, as an admin would set.
PRIVATE_GANGS = IS_ROOT and subprocess.run(
    [sys.executable, "-c", "from jupyter_gpushare.backends import netns; netns.make()"],
    capture_output=True).returncode == 0
root_only = pytest.mark.skipif(
    not IS_ROOT, reason="jobs switch to their user only when the service runs as root")

# A Python every job account can run (the tests' own may live under /root), and the
# pure-Python all-reduce of tests/allreduce.py.
PY = "/usr/bin/python3" if IS_ROOT and os.path.exists("/usr/bin/python3") else sys.executable
ALLREDUCE = str(Path(__file__).with_name("allreduce.py"))

# Job scripts (/bin/sh): say "ready" once running, then wait for a file, or for a signal.
WAIT_FOR_GO = "echo ready; while [ ! -e $GPUSHARE_CHECKPOINT_DIR/go ]; do sleep 0.02; done; "
LOOP = "echo ready; while :; do sleep 0.05; done"


class SimulatedBackend(LocalBackend):
    """Simulated nodes even where NVML finds GPUs, so that every machine sees the same pool."""

    def detect_inventories(self):
        return [SimulatedInventory(f"sim-node-{i}", self.simulated_gpus_per_node)
                for i in range(self.simulated_nodes)]


class NonRootBackend(SimulatedBackend):
    """A service that is not root, whoever runs the tests."""

    def _service_is_root(self):
        return False


@pytest.fixture(scope="module")
def job_user():
    """(name, home) of the account jobs run as: a fresh system user when root, else ourselves."""
    if not IS_ROOT:
        yield pwd.getpwuid(os.getuid()).pw_name, None
        return
    if not shutil.which("useradd") or not shutil.which("userdel"):
        pytest.skip("running as root, but useradd/userdel are missing to create a job user")
    name = f"gpushare-t{os.getpid()}"
    home = f"/tmp/{name}-home"
    subprocess.run(["useradd", "--system", "--create-home", "--home-dir", home,
                    "--shell", "/bin/sh", "--user-group", name], check=True, capture_output=True)
    try:
        yield name, home
    finally:
        subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
        subprocess.run(["userdel", "--remove", name], capture_output=True)


@pytest.fixture
def scratch(job_user, tmp_path):
    """A directory the job user may write: checkpoints live there."""
    if job_user[1] is None:
        return tmp_path / "scratch"
    return Path(job_user[1]) / uuid.uuid4().hex[:8]


@pytest.fixture
def make_backend(tmp_path):
    """Backends on one state_dir (two of them: a restarted service); their jobs die after."""
    made = []

    def make(cls=SimulatedBackend, **kw):
        kw.setdefault("state_dir", str(tmp_path / "state"))
        kw.setdefault("run_as_service_user", not IS_ROOT)
        kw.setdefault("gang_network", "private" if PRIVATE_GANGS else "host")
        made.append(cls(**kw))
        return made[-1]

    yield make
    for backend in made:
        for record in backend._records():
            try:
                os.killpg(record["pgid"], signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for proc in [*(g.proc for r in backend._running.values() for g in r.groups),
                     *backend._unreaped]:
            if proc is not None:
                proc.wait()


@pytest.fixture
def backend(make_backend):
    return make_backend()


@pytest.fixture
def launch(job_user, scratch):
    def make(job_id, script, attempt=1, placement=None, **kw):
        kw.setdefault("user", job_user[0])
        return Launch(job_id, attempt, project="p", command=("/bin/sh", "-c", script),
                      env=kw.pop("env", {}), placement=placement or {"sim-node-0": GPU},
                      checkpoint_dir=str(scratch / "ckpt" / job_id), **kw)
    return make


async def ended(backend, count=1, timeout=10.0):
    """Poll until ``count`` attempts have ended; each is reported once."""
    exits, deadline = [], time.monotonic() + timeout
    while len(exits) < count:
        assert time.monotonic() < deadline, f"{len(exits)} of {count} jobs ended in {timeout} s"
        exits += await backend.poll()
        await asyncio.sleep(0.02)
    assert await backend.poll() == []
    return sorted(exits, key=lambda e: (e.job_id, e.attempt))


async def log_of(backend, job_id, attempt=1, until=None, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        text = (await backend.read_log(job_id, attempt)).decode()
        if until is None or until in text:
            return text
        assert time.monotonic() < deadline, f"{until!r} not in the log of {job_id}: {text!r}"
        await asyncio.sleep(0.02)


async def go(backend, launch, job_id):
    """Let a WAIT_FOR_GO job finish (once it runs, its checkpoint directory exists)."""
    await log_of(backend, job_id, until="ready")
    (Path(launch(job_id, "").checkpoint_dir) / "go").touch()


def env_of(log):
    return dict(line.split("=", 1) for line in log.splitlines() if "=" in line)


async def groups_gone(pgids, timeout=10.0) -> bool:
    """Whether every group is gone within ``timeout``: an attempt's end is recorded once its
    ranks are gone (the shim waits for them), and the shim itself exits a moment after
    recording it, longer on a loaded machine."""
    deadline = time.monotonic() + timeout
    while not all(group_gone(p) for p in pgids):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def group_gone(pgid):
    """No live process left in the group (zombies waiting for a reaper do not count)."""
    try:
        os.waitpid(pgid, os.WNOHANG)  # reap the shim where this process started it
    except ChildProcessError:
        pass
    found = members(pgid)
    if found is not None:
        return not found
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


# --- nodes ---

def test_simulated_nodes_are_labelled(backend):
    nodes = backend.nodes()
    assert [(n.name, n.gpus) for n in nodes] == [("sim-node-0", 4), ("sim-node-1", 4)]
    assert all(n.labels[SIMULATED_LABEL] == "true" for n in nodes)


def test_nodes_come_from_detection(make_backend):
    backend = make_backend(LocalBackend, simulate_gpus=True, simulated_nodes=3,
                           simulated_gpus_per_node=2)
    nodes = [(n.name, n.gpus) for n in backend.nodes()]
    found = detect(3, 2)
    if found[0].source == "nvml":  # a machine with GPUs: one node, this host
        assert nodes == [(found[0].node, len(found[0].gpus()))]
    else:
        assert nodes == [(f"sim-node-{i}", 2) for i in range(3)]


def test_no_gpu_is_an_error_unless_the_stand_in_is_chosen(make_backend, tmp_path, capsys):
    """A GPU server whose driver is missing must not quietly run jobs without GPUs: by
    default finding no GPU stops the service at start with one sentence."""
    if detect(1, 1)[0].source == "nvml":
        pytest.skip("this machine has a GPU: NVML finds it")
    with pytest.raises(BackendError) as refused:
        make_backend(LocalBackend).nodes()
    assert str(refused.value).startswith("NVML finds no GPU on this machine (")
    assert str(refused.value).endswith("fix the NVIDIA driver, or set "
                                       "c.LocalBackend.simulate_gpus = True for a labelled "
                                       "simulated pool (a demo, a laptop, CI).")
    config = tmp_path / "gpushare_config.py"
    config.write_text("c.PoolService.projects = {'vision': {'quota': 1}}\n")
    service = PoolService()
    with pytest.raises(SystemExit) as stopped:
        service.initialize([f"--PoolService.config_file={config}",
                            f"--PoolService.state_dir={tmp_path / 'state'}"])
    assert stopped.value.code == 2
    assert "c.LocalBackend.simulate_gpus = True" in capsys.readouterr().err


@pytest.mark.parametrize("build_nodes, share, expected", [
    # one server: GPU 0 serves the notebooks' slices, the train pool has the others
    ({"sim-node-0": 1}, False, {"sim-node-0": [1, 2, 3], "sim-node-1": [0, 1, 2, 3]}),
    ({"sim-node-0": 1}, True, {"sim-node-0": [0, 1, 2, 3], "sim-node-1": [0, 1, 2, 3]}),
    # a build node that is not one of the train pool's takes nothing from it
    ({"sim-build-0": 1}, False, {"sim-node-0": [0, 1, 2, 3], "sim-node-1": [0, 1, 2, 3]}),
    # every GPU of a node in the build pool: the node has none left for train jobs
    ({"sim-node-1": 4}, False, {"sim-node-0": [0, 1, 2, 3]}),
])
def test_build_gpus_are_left_out_of_the_train_pool(make_backend, build_nodes, share, expected,
                                                   caplog):
    service = PoolService(build_nodes=build_nodes)
    backend = make_backend(parent=service, share_build_gpus=share,
                           log=logging.getLogger("gpushare-test-backend"))
    assert {n.name: n.gpus for n in backend.nodes()} == {k: len(v) for k, v in expected.items()}
    assert {node: [int(g.uuid.rsplit("-", 1)[1]) for g in found]
            for node, found in backend.local_gpus().items()} == expected
    if expected.keys() != {"sim-node-0", "sim-node-1"}:
        assert "All 4 GPUs of sim-node-1 are in the build pool" in caplog.text


# --- start: devices, environment ---

@pytest.mark.asyncio
async def test_job_sees_its_gpus_and_variables_but_no_token(backend, launch, monkeypatch):
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "hub-secret-123")
    backend.env_keep = [*backend.env_keep, "JUPYTERHUB_API_TOKEN"]
    env = {"GREETING": "hello", "HF_TOKEN": "x", "COPY": "hub-secret-123",
           "CUDA_VISIBLE_DEVICES": "all"}
    handle = await backend.start(launch("j1", "env", placement={"sim-node-1": 2 * GPU}, env=env))
    await ended(backend)
    log = await log_of(backend, "j1")
    env = env_of(log)
    uuids = ["GPU-SIMULATED-sim-node-1-0", "GPU-SIMULATED-sim-node-1-1"]
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(uuids)
    assert handle.data["devices"] == {"sim-node-1": uuids}
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert (env["GPUSHARE_JOB_ID"], env["GPUSHARE_ATTEMPT"]) == ("j1", "1")
    assert env["GREETING"] == "hello"
    assert os.path.isdir(env["GPUSHARE_CHECKPOINT_DIR"])
    assert not [k for k in env if "TOKEN" in k] and "hub-secret-123" not in log


@pytest.mark.asyncio
async def test_gangs_get_disjoint_free_devices(backend, launch):
    hold = WAIT_FOR_GO + "echo $CUDA_VISIBLE_DEVICES"
    await backend.start(launch("a", hold, placement={"sim-node-0": 3 * GPU}))
    b = await backend.start(launch("b", hold, placement={"sim-node-0": GPU, "sim-node-1": GPU}))
    assert b.data["devices"] == {"sim-node-0": ["GPU-SIMULATED-sim-node-0-3"],
                                 "sim-node-1": ["GPU-SIMULATED-sim-node-1-0"]}
    with pytest.raises(BackendError, match="only 0 GPUs free"):
        await backend.start(launch("c", "true"))
    with pytest.raises(BackendError, match="not part of"):
        await backend.start(launch("c", "true", placement={"elsewhere": GPU}))
    with pytest.raises(BackendError, match="whole GPUs"):
        await backend.start(launch("c", "true", placement={"sim-node-1": 500}))
    assert not os.path.exists(backend.log_path("c", 1))  # nothing of a refused job runs
    await go(backend, launch, "a")
    await go(backend, launch, "b")
    await ended(backend, 2)
    # a rank per node, each seeing its own node's devices
    assert (await log_of(backend, "b")).split()[-1] == "GPU-SIMULATED-sim-node-0-3"
    assert (await backend.read_log("b", 1, rank=1)).split()[-1] == b"GPU-SIMULATED-sim-node-1-0"
    c = await backend.start(launch("c", "true"))  # the devices are free again
    assert c.data["devices"] == {"sim-node-0": ["GPU-SIMULATED-sim-node-0-0"]}
    await ended(backend)


# --- exits and logs ---

@pytest.mark.asyncio
async def test_exit_codes_and_logs(backend, launch):
    await backend.start(launch("ok", "echo to-stdout; echo to-stderr >&2"))
    await backend.start(launch("bad", "exit 3"))
    await backend.start(launch("sig", "kill -USR1 $$"))
    await backend.start(launch("nocmd", "no-such-command-xyz"))
    exits = {e.job_id: e for e in await ended(backend, 4)}
    assert (exits["ok"].state, exits["ok"].exit_code) == ("succeeded", 0)
    assert (exits["bad"].state, exits["bad"].exit_code) == ("failed", 3)
    assert exits["sig"].state == "failed" and "SIGUSR1" in exits["sig"].reason
    assert (exits["nocmd"].state, exits["nocmd"].exit_code) == ("failed", 127)
    log = await log_of(backend, "ok")
    assert log == "to-stdout\nto-stderr\n"
    assert await backend.read_log("ok", 1, offset=len("to-stdout\n")) == b"to-stderr\n"
    assert await backend.read_log("ok", 1, offset=len(log)) == b""
    assert "no-such-command-xyz" in await log_of(backend, "nocmd")
    await backend.stop("ok", 1, grace_s=0)  # already ended: nothing happens
    assert await backend.poll() == []


@pytest.mark.asyncio
async def test_checkpoint_dir_is_kept_across_attempts(backend, launch):
    ckpt = "$GPUSHARE_CHECKPOINT_DIR/state"
    await backend.start(launch("r", f"echo from attempt $GPUSHARE_ATTEMPT > {ckpt}"))
    await ended(backend)
    await backend.start(launch("r", f"cat {ckpt}; echo now $GPUSHARE_ATTEMPT", attempt=2))
    await ended(backend)
    assert await log_of(backend, "r", 2) == "from attempt 1\nnow 2\n"
    assert await log_of(backend, "r", 1) == ""


# --- stop ---

@pytest.mark.asyncio
async def test_stop_sends_sigterm_first(backend, launch):
    await backend.start(launch("t", "trap 'echo got TERM; exit 7' TERM; " + LOOP))
    await log_of(backend, "t", until="ready")
    began = time.monotonic()
    await backend.stop("t", 1, grace_s=5)
    assert time.monotonic() - began < 0.5  # stop returns at once
    [exit] = await ended(backend)
    assert (exit.state, exit.exit_code) == ("failed", 7)
    assert "got TERM" in await log_of(backend, "t")
    assert time.monotonic() - began < 3  # ended by the TERM, not by the kill after the grace


@pytest.mark.asyncio
async def test_stop_kills_after_the_grace(backend, launch):
    await backend.start(launch("k", "trap '' TERM; " + LOOP))
    await log_of(backend, "k", until="ready")
    began = time.monotonic()
    await backend.stop("k", 1, grace_s=0.3)
    [exit] = await ended(backend)
    assert time.monotonic() - began >= 0.3
    assert (exit.state, exit.exit_code) == ("failed", 128 + signal.SIGKILL)
    assert "SIGKILL" in exit.reason


# --- restart ---

@pytest.mark.asyncio
async def test_restart_adopts_a_running_job(make_backend, launch):
    before = make_backend()
    handle = await before.start(launch("live", WAIT_FOR_GO + "exit 4",
                                       placement={"sim-node-0": 3 * GPU}))
    after = make_backend()  # the restarted service
    assert await after.adopt([handle]) == []
    assert await after.poll() == []
    with pytest.raises(BackendError, match="only 1 GPU free"):  # the adopted job keeps its GPUs
        await after.start(launch("other", "true", placement={"sim-node-0": 2 * GPU}))
    await go(after, launch, "live")
    [exit] = await ended(after)
    assert (exit.job_id, exit.state, exit.exit_code) == ("live", "failed", 4)


@pytest.mark.asyncio
async def test_restart_reports_jobs_that_ended_meanwhile(make_backend, launch):
    before = make_backend()
    done = await before.start(launch("done", "exit 0"))
    vanished = await before.start(launch("vanished", "sleep 30"))
    deadline = time.monotonic() + 10
    while not os.path.exists(done.data["groups"][0]["exit"]):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    pgid = vanished.data["groups"][0]["pgid"]
    os.killpg(pgid, signal.SIGKILL)  # shim and job die without a trace
    while not group_gone(pgid):
        await asyncio.sleep(0.02)
    after = make_backend()
    exits = sorted(await after.adopt([done, vanished]), key=lambda e: e.job_id)
    assert [(e.job_id, e.state) for e in exits] == [("done", "succeeded"), ("vanished", "lost")]
    assert await after.poll() == []


@pytest.mark.asyncio
async def test_restart_finds_an_attempt_whose_handle_was_never_stored(make_backend, launch):
    # The service died between starting it and storing its handle: adopt() gets an empty
    # handle, finds the attempt by job and attempt, and it runs (and ends) once.
    before = make_backend()
    await before.start(launch("unsaved", WAIT_FOR_GO + "exit 5",
                              placement={"sim-node-0": 3 * GPU}))
    after = make_backend()
    assert await after.adopt([Handle("unsaved", 1, {}), Handle("never", 1, {})]) == [
        Exit("never", 1, "lost", reason="its record does not say where it ran")]
    with pytest.raises(BackendError, match="only 1 GPU free"):  # it keeps its devices
        await after.start(launch("other", "true", placement={"sim-node-0": 2 * GPU}))
    await go(after, launch, "unsaved")
    [exit] = await ended(after)
    assert (exit.job_id, exit.state, exit.exit_code) == ("unsaved", "failed", 5)


class _Killed(Exception):
    """The service is killed (SIGKILL) here."""


class KilledBeforeHandingOverTheJob(SimulatedBackend):
    """A service killed after it recorded the shim, before it gave the shim its job: the
    service's end of the pipe closes, as a dead process's does."""

    shims: list = []

    @classmethod
    def _hand_over(cls, proc, spec):
        proc.stdin.close()
        cls.shims.append(proc)
        raise _Killed


@pytest.mark.asyncio
async def test_a_service_killed_before_handing_over_the_job_leaves_nothing_running(
        make_backend, launch, scratch):
    # Found at the restart by its record, it ran nothing: lost (the service requeues it),
    # never an attempt that runs unrecorded while its next attempt runs too.
    with pytest.raises(_Killed):
        await make_backend(KilledBeforeHandingOverTheJob).start(
            launch("cut", "echo ran > $GPUSHARE_CHECKPOINT_DIR/ran"))
    [shim] = KilledBeforeHandingOverTheJob.shims
    assert shim.wait(10) == 0
    after = make_backend()
    exits = await after.adopt([Handle("cut", 1, {})]) or await ended(after)
    assert [(e.job_id, e.state) for e in exits] == [("cut", "lost")]
    assert not (scratch / "ckpt" / "cut").exists()  # the shim never even made its folder
    log = (await after.read_log("cut", 1)).decode()
    assert "stopped before it handed this attempt its job; nothing ran" in log


@pytest.mark.asyncio
async def test_restart_stops_a_job_no_handle_names(make_backend, launch):
    before = make_backend()
    stray = await before.start(launch("stray", "trap 'echo stopped; exit 0' TERM; " + LOOP))
    await log_of(before, "stray", until="ready")
    after = make_backend()
    assert await after.adopt([]) == []
    deadline = time.monotonic() + 5
    while not group_gone(stray.data["groups"][0]["pgid"]):
        assert time.monotonic() < deadline, "the unknown job still runs"
        await asyncio.sleep(0.02)
    assert "stopped" in await log_of(after, "stray")


# --- identity ---

@root_only
@pytest.mark.asyncio
async def test_root_service_runs_the_job_as_its_user_at_home(backend, launch, job_user):
    name, home = job_user
    owner = "ls -ld $GPUSHARE_CHECKPOINT_DIR | awk '{print $3}'"
    await backend.start(launch("who", f"id -u; id -g; pwd; {owner}"))
    [exit] = await ended(backend)
    assert exit.state == "succeeded"
    account = pwd.getpwnam(name)
    assert (await log_of(backend, "who")).split() == [
        str(account.pw_uid), str(account.pw_gid), home, name]


@root_only
@pytest.mark.asyncio
async def test_working_directory_is_entered_with_the_users_rights(backend, launch):
    await backend.start(launch("peek", "ls", workdir="/root"))
    [exit] = await ended(backend)
    assert (exit.state, exit.exit_code) == ("failed", 126)
    assert "cannot enter the working directory /root" in await log_of(backend, "peek")
    assert exit.reason == "cannot enter the working directory /root: Permission denied"


@root_only
@pytest.mark.asyncio
@pytest.mark.parametrize("user, message", [("root", "never run as root"),
                                           ("no-such-user-xyz", "has no account")])
async def test_root_service_refuses_root_and_unknown_users(backend, launch, user, message):
    with pytest.raises(BackendError, match=message):
        await backend.start(launch("x", "true", user=user))
    assert not os.path.exists(backend.log_path("x", 1))


@pytest.mark.asyncio
async def test_non_root_service_refuses_jobs_unless_allowed(make_backend, launch):
    backend = make_backend(NonRootBackend, run_as_service_user=False)
    with pytest.raises(BackendError, match="run_as_service_user"):
        await backend.start(launch("x", "true"))


def test_jobs_run_as_the_service_user_keep_checkpoints_in_its_home(make_backend, tmp_path):
    # alice may have an account here whose home the service's user cannot write (the demo
    # was once run as root): her job, run as the service's user, checkpoints in its home.
    from jupyter_gpushare.pool.train.launch import Launcher

    own = pwd.getpwuid(os.getuid()).pw_dir
    backend = make_backend(NonRootBackend, run_as_service_user=True)
    launcher = Launcher(backend, "{home}/.gpushare/checkpoints/{job_id}", str(tmp_path))
    for user in ("nobody", "root", "no-such-user-xyz"):
        assert launcher.home_of(user) == own
    if IS_ROOT:  # a root service: the user's own account's home
        real = make_backend(run_as_service_user=True)
        assert Launcher(real, "{home}", str(tmp_path)).home_of("nobody") == \
            pwd.getpwnam("nobody").pw_dir


@pytest.mark.asyncio
async def test_a_command_that_cannot_run_says_why_in_its_exit(backend, launch):
    # The sentence travels with the exit, so `--wait` and the cell can show it, not a code.
    await backend.start(replace(launch("nope", ""), command=("no-such-program-xyz", "-v"),
                                env={"PATH": "/usr/bin:/bin"}))
    [exit] = await ended(backend)
    assert (exit.state, exit.exit_code) == ("failed", 127)
    assert exit.reason == "cannot run no-such-program-xyz: No such file or directory"


@pytest.mark.asyncio
async def test_the_program_is_found_on_the_jobs_own_path(backend, launch, job_user, scratch):
    # A job runs the `python` of the terminal that submitted it: its spec's PATH is searched.
    tools = scratch / "bin"
    tools.mkdir(parents=True)
    (tools / "hello-xyz").write_text("#!/bin/sh\necho hello from $0\n")
    (tools / "hello-xyz").chmod(0o755)
    if job_user[1] is not None:
        shutil.chown(scratch, job_user[0])
    await backend.start(replace(launch("path", ""), command=("hello-xyz",),
                                env={"PATH": f"{tools}:/usr/bin:/bin"}))
    [exit] = await ended(backend)
    assert exit.state == "succeeded", exit
    assert await log_of(backend, "path") == f"hello from {tools}/hello-xyz\n"


@pytest.mark.asyncio
async def test_unsafe_job_ids_are_refused(backend, launch):
    with pytest.raises(BackendError, match="Job id"):
        await backend.start(launch("../escape", "true"))
    assert backend.log_path("../escape", 1) is None


# --- gangs: ranks, rendezvous, one life ---

def reports(log: str) -> list[dict]:
    return [json.loads(line.split(" ", 1)[1]) for line in log.splitlines()
            if line.startswith("RANK-REPORT ")]


async def rank_logs(backend, job_id, world, until="done", attempt=1):
    return [await log_of_rank(backend, job_id, r, until, attempt) for r in range(world)]


async def log_of_rank(backend, job_id, rank, until, attempt=1, timeout=20.0):
    deadline = time.monotonic() + timeout
    while True:
        text = (await backend.read_log(job_id, attempt, rank=rank)).decode()
        if until in text:
            return text
        assert time.monotonic() < deadline, f"{until!r} not in rank {rank}'s log: {text!r}"
        await asyncio.sleep(0.02)


def allreduce(launch, job_id, *args, placement, per_gpu=False, attempt=1):
    made = launch(job_id, "", placement=placement, per_gpu=per_gpu, attempt=attempt)
    return Launch(**{**made.__dict__, "command": (PY, ALLREDUCE, *args)})


@pytest.mark.asyncio
async def test_a_two_node_gang_meets_at_rank_0_and_all_reduces(backend, launch):
    placement = {"sim-node-0": 2 * GPU, "sim-node-1": 3 * GPU}
    handle = await backend.start(allreduce(launch, "ar", placement=placement))
    groups = handle.data["groups"]
    assert [(g["node"], g["ranks"]) for g in groups] == [("sim-node-0", [0]), ("sim-node-1", [1])]
    assert groups[0]["pgid"] != groups[1]["pgid"]  # one process group per node
    [exit] = await ended(backend)
    assert (exit.state, exit.exit_code) == ("succeeded", 0)
    logs = await rank_logs(backend, "ar", 2)
    [r0], [r1] = (reports(log) for log in logs)
    assert r0["sum"] == r1["sum"] == [3, 3, 3, 3]  # (0 + 1) + (1 + 1): the data travelled
    port = handle.data["master"].rsplit(":", 1)[1]
    assert r0["env"] == {
        "WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
        "NODE_RANK": "0", "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
        "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "JAX_NUM_PROCESSES": "2",
        "JAX_PROCESS_ID": "0", "PET_NNODES": "2", "PET_NODE_RANK": "0",
        "PET_NPROC_PER_NODE": "2", "GPUSHARE_NODE_GPUS": "2",
        "CUDA_VISIBLE_DEVICES": "GPU-SIMULATED-sim-node-0-0,GPU-SIMULATED-sim-node-0-1"}
    assert (r1["env"]["RANK"], r1["env"]["NODE_RANK"], r1["env"]["PET_NPROC_PER_NODE"]) == \
        ("1", "1", "3")
    assert r1["env"]["CUDA_VISIBLE_DEVICES"].count("sim-node-1") == 3
    assert "rank 1 done" in logs[1] and "rank 1" not in logs[0]  # each rank its own log


@pytest.mark.asyncio
async def test_per_gpu_ranks_are_one_process_per_gpu(backend, launch):
    placement = {"sim-node-0": 1 * GPU, "sim-node-1": 2 * GPU}
    handle = await backend.start(allreduce(launch, "pg", placement=placement, per_gpu=True))
    assert [g["ranks"] for g in handle.data["groups"]] == [[0], [1, 2]]
    [exit] = await ended(backend)
    assert exit.state == "succeeded"
    found = [reports(log)[0] for log in await rank_logs(backend, "pg", 3)]
    assert all(r["sum"] == [6, 6, 6, 6] for r in found)
    seen = [(r["env"]["RANK"], r["env"]["LOCAL_RANK"], r["env"]["LOCAL_WORLD_SIZE"],
             r["env"]["NODE_RANK"], r["env"]["JAX_PROCESS_ID"], r["env"]["PET_NNODES"])
            for r in found]
    assert seen == [("0", "0", "1", "0", "0", None), ("1", "0", "2", "1", "1", None),
                    ("2", "1", "2", "1", "2", None)]
    # the ranks of a node see all its GPUs and choose theirs by LOCAL_RANK
    assert found[1]["env"]["CUDA_VISIBLE_DEVICES"] == found[2]["env"]["CUDA_VISIBLE_DEVICES"]


@pytest.mark.asyncio
@pytest.mark.parametrize("per_gpu, failing", [(False, 1), (True, 2)])
async def test_a_failing_rank_stops_the_gang(make_backend, launch, per_gpu, failing):
    backend = make_backend(grace_period=5)
    placement = {"sim-node-0": GPU, "sim-node-1": 2 * GPU}
    handle = await backend.start(allreduce(launch, "f", "--fail-rank", str(failing), "--code",
                                           "7", placement=placement, per_gpu=per_gpu))
    began = time.monotonic()
    [exit] = await ended(backend)
    assert time.monotonic() - began < 10  # the others did not sleep their 120 s
    assert (exit.state, exit.exit_code) == ("failed", 7)
    assert exit.reason == f"rank {failing}: exited with code 7"
    world = 3 if per_gpu else 2
    for rank in range(world):
        if rank != failing:
            assert f"rank {rank} stopped" in await log_of_rank(backend, "f", rank, "stopped")
    assert await groups_gone([g["pgid"] for g in handle.data["groups"]])


@pytest.mark.asyncio
async def test_cancel_stops_every_rank_within_the_grace(backend, launch, scratch):
    hold = str(scratch / "never")
    placement = {"sim-node-0": GPU, "sim-node-1": GPU}
    handle = await backend.start(allreduce(launch, "c", "--hold", hold, placement=placement,
                                           per_gpu=False))
    await rank_logs(backend, "c", 2, until="RANK-REPORT")
    began = time.monotonic()
    await backend.stop("c", 1, grace_s=5)
    [exit] = await ended(backend)
    assert time.monotonic() - began < 5
    assert exit.state == "failed" and exit.exit_code == 143
    for rank in range(2):
        assert f"rank {rank} got SIGTERM" in await log_of_rank(backend, "c", rank, "SIGTERM")
    assert await groups_gone([g["pgid"] for g in handle.data["groups"]])


@pytest.mark.asyncio
async def test_restart_adopts_every_rank_of_a_gang(make_backend, launch, scratch):
    hold = scratch / "go-on"
    before = make_backend()
    placement = {"sim-node-0": 2 * GPU, "sim-node-1": 2 * GPU}
    handle = await before.start(allreduce(launch, "ad", "--hold", str(hold),
                                          placement=placement, per_gpu=True))
    after = make_backend()  # the restarted service
    assert await after.adopt([handle]) == []
    await rank_logs(after, "ad", 4, until="RANK-REPORT")
    with pytest.raises(BackendError, match="only 2 GPUs free"):  # every rank keeps its GPUs
        await after.start(launch("other", "true", placement={"sim-node-1": 3 * GPU}))
    # A rank of the adopted gang dies: the restarted service stops the others.
    victim = json.loads(reports(await log_of_rank(after, "ad", 3, "RANK-REPORT"))[0]
                        ["env"]["RANK"])
    assert victim == 3
    pids = [p for p in members(handle.data["groups"][1]["pgid"])
            if p != handle.data["groups"][1]["pgid"]]
    for pid in pids:  # the node's two ranks (the shim is the group's leader)
        with open(f"/proc/{pid}/environ", "rb") as f:
            if b"LOCAL_RANK=1" in f.read().split(b"\0"):
                os.kill(pid, signal.SIGKILL)
    [exit] = await ended(after)
    assert exit.state == "failed" and exit.reason == "rank 3: killed by SIGKILL"
    assert exit.exit_code == 128 + signal.SIGKILL
    assert await groups_gone([g["pgid"] for g in handle.data["groups"]])
    for rank in range(3):
        assert f"rank {rank} got SIGTERM" in await log_of_rank(after, "ad", rank, "SIGTERM")


@pytest.mark.asyncio
async def test_a_gang_whose_handle_was_never_stored_is_found_by_its_records(make_backend,
                                                                            launch, scratch):
    hold = scratch / "go-on"
    before = make_backend()
    placement = {"sim-node-0": GPU, "sim-node-1": GPU}
    await before.start(allreduce(launch, "rec", "--hold", str(hold), placement=placement))
    half = await before.start(allreduce(launch, "half", "--hold", str(hold),
                                        placement=placement))
    await rank_logs(before, "rec", 2, until="RANK-REPORT")
    # "half" died with the service between starting its first and its second node's ranks
    os.unlink(half.data["groups"][1]["exit"][:-len(".exit")] + ".pid")
    os.killpg(half.data["groups"][1]["pgid"], signal.SIGKILL)
    after = make_backend()  # the service died before it stored either handle
    assert await after.adopt([Handle("rec", 1, {}), Handle("half", 1, {})]) == []
    [exit] = await ended(after)
    assert (exit.job_id, exit.state, exit.reason) == (
        "half", "lost", "the service stopped while starting its ranks")
    assert await groups_gone([half.data["groups"][0]["pgid"]])
    hold.touch()
    [exit] = await ended(after)
    assert (exit.job_id, exit.state) == ("rec", "succeeded")  # every rank of it was adopted
    for rank in range(2):
        assert f"rank {rank} done" in await log_of_rank(after, "rec", rank, "done")


# -- a gang's rendezvous, as another local account would try it ------------------------------

# Run as "nobody": take the rendezvous port before rank 0 listens and hear the other ranks
# ("bind"), or connect to rank 0 as if one of the ranks, with a vector of its own ("connect").
ATTACKER = r"""
import json, socket, sys, time
mode, port, until = sys.argv[1], int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
if mode == "bind":
    while True:
        try:
            server = socket.create_server(("127.0.0.1", port))
            break
        except OSError:
            if time.monotonic() > until:
                sys.exit("never bound")
            time.sleep(0.005)
    print("bound", flush=True)
    server.settimeout(max(0.1, until - time.monotonic()))
    try:
        peer, _ = server.accept()
        print("heard a rank:", peer.recv(1000), flush=True)
    except OSError:
        pass
else:
    while time.monotonic() < until:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=1)
        except OSError:
            time.sleep(0.005)
            continue
        data = json.dumps([1000] * 4).encode()
        sock.sendall(len(data).to_bytes(4, "big") + data)
        print("joined the gang", flush=True)
        break
"""


def attacker(mode, port, seconds):
    nobody = pwd.getpwnam("nobody")
    return subprocess.Popen([PY, "-c", ATTACKER, mode, str(port), str(seconds)], cwd="/",
                            user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@root_only
@pytest.mark.skipif(not PRIVATE_GANGS, reason="this machine makes no network namespaces")
@pytest.mark.asyncio
@pytest.mark.parametrize("network", ["private", "host"])
@pytest.mark.parametrize("mode, late", [("bind", 0), ("connect", 1)])
async def test_another_account_cannot_take_or_join_a_gangs_rendezvous(make_backend, launch,
                                                                      network, mode, late):
    """Rank ``late`` comes 2 s late: the attacker has the port from the start (more than a
    real one would know) and all that time. "host" shows the attack is real."""
    backend = make_backend(gang_network=network, grace_period=1)
    placement = {"sim-node-0": GPU, "sim-node-1": GPU}
    handle = await backend.start(allreduce(launch, f"{mode}-{network}", "--late-rank",
                                           str(late), "2", placement=placement))
    port = int(handle.data["master"].rsplit(":", 1)[1])
    other = attacker(mode, port, 4)
    said, _ = other.communicate(timeout=30)
    if network == "host":  # the machine's loopback is every account's
        assert "heard a rank" in said or "joined the gang" in said, said
        await backend.stop(f"{mode}-{network}", 1, grace_s=1)
        await ended(backend, timeout=20)
        return
    assert "heard a rank" not in said and "joined the gang" not in said, said
    [exit] = await ended(backend, timeout=20)
    assert (exit.state, exit.exit_code) == ("succeeded", 0), exit
    sums = [reports(log)[0]["sum"] for log in await rank_logs(backend, f"{mode}-{network}", 2)]
    assert sums == [[3, 3, 3, 3]] * 2  # only the gang's own data


@pytest.mark.asyncio
async def test_a_service_that_cannot_make_a_gangs_network_refuses_gangs(make_backend, launch):
    backend = make_backend(NonRootBackend, run_as_service_user=True, gang_network="private")
    with pytest.raises(BackendError, match='LocalBackend.gang_network = "host"'):
        await backend.start(launch("g", "true", placement={"sim-node-0": GPU,
                                                           "sim-node-1": GPU}))
    await backend.start(launch("one", "true"))  # one rank meets no one: it runs
    [exit] = await ended(backend)
    assert exit.state == "succeeded"

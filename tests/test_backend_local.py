"""The local backend with real processes: devices, environment, logs, exits, stop, restart,
identity. Where the tests run as root (as the service does with real system users), jobs run
as a throw-away system user created for this module."""

import asyncio
import os
import pwd
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from jupyter_gpushare.backends import BackendError, Launch
from jupyter_gpushare.backends.local import SIMULATED_LABEL, LocalBackend
from jupyter_gpushare.backends.shim import members
from jupyter_gpushare.gpus import SimulatedInventory, detect
from jupyter_gpushare.policy.model import GPU

IS_ROOT = os.geteuid() == 0
root_only = pytest.mark.skipif(
    not IS_ROOT, reason="jobs switch to their user only when the service runs as root")

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
        made.append(cls(**kw))
        return made[-1]

    yield make
    for backend in made:
        for record in backend._records():
            try:
                os.killpg(record["pgid"], signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for proc in [*(r.proc for r in backend._running.values()), *backend._unreaped]:
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
    backend = make_backend(LocalBackend, simulated_nodes=3, simulated_gpus_per_node=2)
    nodes = [(n.name, n.gpus) for n in backend.nodes()]
    found = detect(3, 2)
    if found[0].source == "nvml":  # a machine with GPUs: one node, this host
        assert nodes == [(found[0].node, len(found[0].gpus()))]
    else:
        assert nodes == [(f"sim-node-{i}", 2) for i in range(3)]


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
    assert (await log_of(backend, "b")).split()[-1] == \
        "GPU-SIMULATED-sim-node-0-3,GPU-SIMULATED-sim-node-1-0"
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
    while not os.path.exists(done.data["exit"]):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    os.killpg(vanished.data["pgid"], signal.SIGKILL)  # shim and job die without a trace
    while not group_gone(vanished.data["pgid"]):
        await asyncio.sleep(0.02)
    after = make_backend()
    exits = sorted(await after.adopt([done, vanished]), key=lambda e: e.job_id)
    assert [(e.job_id, e.state) for e in exits] == [("done", "succeeded"), ("vanished", "lost")]
    assert await after.poll() == []


@pytest.mark.asyncio
async def test_restart_stops_a_job_no_handle_names(make_backend, launch):
    before = make_backend()
    stray = await before.start(launch("stray", "trap 'echo stopped; exit 0' TERM; " + LOOP))
    await log_of(before, "stray", until="ready")
    after = make_backend()
    assert await after.adopt([]) == []
    deadline = time.monotonic() + 5
    while not group_gone(stray.data["pgid"]):
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

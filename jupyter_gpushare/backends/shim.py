"""Runs one attempt of a local train job and records how it ended.

    python -I shim.py EXITFILE -- ARGV...
    stdin: {"user", "uid", "gid", "cwd", "checkpoint_dir", "env", "log_limit",
            "ranks": [{"rank", "env", "log"}, ...], "grace_s", "network"} and a newline

One shim runs the ranks of one node of a gang: one, or one per GPU. Each rank is ARGV with
``env`` and the rank's own variables, its output relayed into its own ``log``. When one rank
fails the others get SIGTERM, then SIGKILL after ``grace_s`` (``launcher.Supervisor``).
EXITFILE gets ``{"returncode", "rank", "reason"}`` of the first rank that failed
(``reason``: why its command could not be run at all), or a returncode of 0.

A gang's private network (``netns.py``) is made or joined before any rank starts: ``network``
is ``{"new": true}`` for the gang's first node, ``{"join": pid, "start": ticks}`` (the first
node's shim) for the others, and null where the ranks meet on the host's network.

The local backend starts this shim in a new session, so the shim's pid names the job's
process group, and the job outlives a restart of the service: the end is written to EXITFILE
(atomically) instead of being known only to the process that started it.

Why it looks like this:
- Where the service is root, so is the shim (the user cannot kill it or forge its exit
  file); only the forked child switches to the user. So the shim runs by path with ``-I``
  and a clean environment, reads the job's identity, directory and environment from stdin,
  and imports nothing but the standard library (and ``logfile.py``, ``launcher.py`` and
  ``netns.py`` beside it).
- The service writes its record of the shim before it hands the shim its job, so that a
  service that dies in between leaves no job running unrecorded: a shim whose job description
  does not come whole (no final newline: the service died while writing it, or before) runs
  nothing and records no exit, and the service, finding its record and no exit, requeues the
  attempt (backends/local.py, docs/explanation/reliability.md).
- Each rank's output comes to the shim through a pipe and goes to its log through
  ``logfile.CappedLog``, so a job printing without end keeps only ``log_limit`` bytes.
- The stop signal goes to the whole process group. The shim catches it (does nothing) so
  that it lives to record the exit; the child gets default dispositions back before exec.
- When the command ends, what it left behind in the group is killed: a finished job must not
  hold GPUs.
"""

import glob  # noqa: F401  for logfile, from the standard library before its folder is on the path
import json
import os
import re  # noqa: F401  (the same)
import select
import signal
import sys
import time
import warnings  # noqa: F401  os.get_exec_path imports it lazily; after setuid the stdlib may be unreadable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ours, root's
import launcher  # noqa: E402
import logfile  # noqa: E402
import netns  # noqa: E402

sys.path.pop(0)
KILL_WAIT_S = 5.0  # how long the shim waits for the group's killed processes to be gone
STRAGGLERS_S = 2.0  # how long output is still read from processes that left the job's group

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
MAX_REASON = 1000  # bytes of the sentence on why the command could not be run


def proc_stat(pid):
    """``(state, pgrp, start time in clock ticks)`` of a process, from /proc; None when it
    does not exist or there is no /proc. The start time tells a pid from a reused one."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2:].split()
    return fields[0].decode(), int(fields[2]), int(fields[19])


def members(pgid):
    """The live (not zombie) pids in process group ``pgid``; None when there is no /proc.
    Zombies do not count: they wait for a reaper that may be slow or absent."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    found = []
    for name in names:
        if name.isdigit():
            stat = proc_stat(name)
            if stat and stat[1] == pgid and stat[0] != "Z":
                found.append(int(name))
    return found


def signal_members(pgid, sig, spare=None):
    """Send ``sig`` to every live process in group ``pgid`` except ``spare``. Returns False
    when there is no /proc to list them."""
    found = members(pgid)
    for pid in found or ():
        if pid != spare:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
    return found is not None


def kill_members(pgid, spare, wait_s=KILL_WAIT_S):
    """SIGKILL every other member of the group, and wait (at most ``wait_s``) until none is
    alive: the exit is recorded only then, so an attempt that has ended has no process left
    that could still hold its GPUs or write its files when the next one starts (a killed
    process takes a moment to die, longer on a loaded machine)."""
    deadline = time.monotonic() + wait_s
    while signal_members(pgid, signal.SIGKILL, spare=spare):
        if not [p for p in members(pgid) or () if p != spare] or time.monotonic() > deadline:
            return
        time.sleep(0.01)


def _run_child(argv, spec, said):
    """In the forked child: become the user, enter the directory, exec. Never returns. What
    stops it is written to the log and to ``said`` (closed by a successful exec), so the exit
    record carries the sentence, not only a code."""
    step = "reset signals"
    try:
        for sig in signal.Signals:
            if sig not in (signal.SIGKILL, signal.SIGSTOP):
                try:
                    signal.signal(sig, signal.SIG_DFL)
                except (OSError, ValueError):
                    pass
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        if spec.get("uid") is not None:
            step = f"switch to user {spec['user']}"
            os.initgroups(spec["user"], spec["gid"])
            os.setgid(spec["gid"])
            os.setuid(spec["uid"])
        if spec.get("checkpoint_dir"):
            # Created with the user's rights: as root it would follow the user's symlinks.
            step = f"create the checkpoint directory {spec['checkpoint_dir']}"
            os.makedirs(spec["checkpoint_dir"], mode=0o700, exist_ok=True)
        step = f"enter the working directory {spec['cwd']}"
        os.chdir(spec["cwd"])
        step = f"run {argv[0]}"
        os.execvpe(argv[0], argv, spec["env"])
    except BaseException as exc:
        reason = getattr(exc, "strerror", None) or exc
        sentence = f"cannot {step}: {reason}"
        os.write(2, f"gpushare: {sentence}\n".encode())
        try:
            os.write(said, sentence.encode()[:MAX_REASON])
        except OSError:
            pass
        os._exit(127 if isinstance(exc, FileNotFoundError) and step.startswith("run") else 126)


def _write_exit(path, returncode, reason="", rank=None):
    tmp = f"{path}.tmp"
    record = {"returncode": returncode, "rank": rank}
    if reason:
        record["reason"] = reason
    with open(tmp, "w") as f:
        json.dump(record, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(args):
    if len(args) < 3 or args[1] != "--":
        sys.exit("usage: python -I shim.py EXITFILE -- ARGV...")
    exit_path, argv = args[0], args[2:]
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda signum, frame: None)
    raw = sys.stdin.read()
    if not raw.endswith("\n"):
        print("gpushare: the pool service stopped before it handed this attempt its job; "
              "nothing ran, and the service requeues it", file=sys.stderr, flush=True)
        return
    try:
        spec = json.loads(raw)
    except ValueError as exc:
        print(f"gpushare: the job description is unreadable: {exc}", file=sys.stderr, flush=True)
        _write_exit(exit_path, 126)
        return
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stderr.flush()
    if spec.get("network"):  # before any rank runs: none of them ever sees the host's network
        net = spec["network"]
        try:
            if net.get("join"):
                netns.join(int(net["join"]), net.get("start"), proc_stat)
            else:
                netns.make()
        except OSError as exc:
            sentence = (f"cannot give the gang its private network: {exc.strerror or exc} "
                        "(an administrator may change LocalBackend.gang_network)")
            print(f"gpushare: {sentence}", file=sys.stderr, flush=True)
            _write_exit(exit_path, 126, sentence)
            return
    # An older service's spec: one rank, logged to "log".
    ranks = spec.get("ranks") or [{"rank": None, "env": {}, "log": spec.get("log")}]
    children, heard, logs = {}, {}, {}
    for i, rank in enumerate(ranks):
        log = None
        if rank.get("log"):  # the first one may hold the service's start-up message: kept
            log = logfile.CappedLog(rank["log"], int(spec["log_limit"]), fresh=i > 0)
            out, into = os.pipe()
        hear, said = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:
            os.close(hear)
            if log is not None:
                os.dup2(into, 1)
                os.dup2(into, 2)
                os.close(into)
                os.close(out)
            _run_child(argv, {**spec, "env": {**spec["env"], **rank["env"]}}, said)
        os.close(said)
        if log is not None:
            os.close(into)
            logs[out] = log
        children[pid], heard[pid] = rank["rank"], hear
    reasons = {pid: _read_all(fd) for pid, fd in heard.items()}  # each until its exec
    gang = launcher.Supervisor(children, float(spec.get("grace_s", 10)))
    _relay(logs, gang)
    gang.wait()  # the ranks whose output ended before they did
    status, rank = gang.result
    kill_members(os.getpgid(0), spare=os.getpid())
    failed = next((pid for pid, r in children.items() if r == rank), None) if status else None
    _write_exit(exit_path, os.waitstatus_to_exitcode(status), reasons.get(failed, ""),
                rank if status else None)


def _read_all(fd):
    """What the child wrote before its exec (nothing when the exec succeeded)."""
    data = b""
    with os.fdopen(fd, "rb") as f:
        while len(data) < MAX_REASON:
            try:
                chunk = f.read(MAX_REASON - len(data))
            except InterruptedError:
                continue
            if not chunk:
                break
            data += chunk
    return data.decode("utf-8", "replace")


def _relay(logs, gang):
    """Copy each rank's output to its log until every process that holds a pipe is gone,
    reaping the ranks as they end (``gang`` stops the others when one fails). Once every
    rank has ended, the rest of the group is killed, and output of processes outside it is
    read for STRAGGLERS_S more."""
    until = None
    while logs:
        ready, _, _ = select.select(list(logs), [], [], 0.2)
        for out in ready:
            data = os.read(out, 1 << 16)
            if data:
                logs[out].write(data)
            else:
                os.close(out)
                logs.pop(out).close()
        if not gang.done:
            gang.reap()
            if gang.done:
                signal_members(os.getpgid(0), signal.SIGKILL, spare=os.getpid())
                until = time.monotonic() + STRAGGLERS_S
        elif until is None:
            until = time.monotonic() + STRAGGLERS_S
        elif time.monotonic() > until:
            break
    for out, log in logs.items():
        os.close(out)
        log.close()


if __name__ == "__main__":
    main(sys.argv[1:])

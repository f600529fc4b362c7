"""Runs one node's ranks of a distributed train job as one gang, and both sides of the
rank-prefixed log format. Standard library only: the local backend's shim loads it by path,
and a Kubernetes job pod runs it as ``python3 -c SOURCE`` (no jupyter-gpushare needed in the
image).

    python3 -c SOURCE [--grace S] -- ARGV...

In a per-GPU job a pod holds all the ranks of its node. The pod's environment is that of the
node's first rank; this runs ``LOCAL_WORLD_SIZE`` copies of ARGV, each with its own ``RANK``,
``LOCAL_RANK`` (``process_env``), and:

- prefixes every line a rank prints with ``[rank N] `` on its own stdout (the pod's log), so
  that each rank's output can be told apart again (``Splitter``);
- passes SIGTERM (and SIGINT) on to the ranks: the container runtime signals only this process;
- stops the gang when one rank fails: SIGTERM to the others, SIGKILL after the grace period,
  and exits with the first failure's status (128 + the signal number for a signal).
"""

import os
import re
import signal
import sys
import threading
import time

PREFIX = "[rank {}] "
_PREFIXED = re.compile(rb"\[rank (\d+)\] ")


def process_env(node_env, local_rank):
    """The variables that differ between the ranks of one node, from the node's first rank's
    (``local_rank`` 0) environment."""
    rank = str(int(node_env["RANK"]) + local_rank)
    return {"RANK": rank, "LOCAL_RANK": str(local_rank), "GPUSHARE_RANK": rank,
            "JAX_PROCESS_ID": rank, "JAX_LOCAL_DEVICE_IDS": str(local_rank)}


def exit_code(status):
    """A wait status as a shell would report it: 128 + the signal number for a signal."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


class Supervisor:
    """The ranks of one node (``children``: pid -> rank) as one gang: when one fails (or is
    killed), the others get SIGTERM, then SIGKILL after ``grace_s``. ``result`` is the wait
    status and rank of the first failure, or ``(0, None)`` when every rank succeeded. Other
    children (a container's PID 1 reaps orphans) are reaped and ignored."""

    def __init__(self, children, grace_s, wait=os.waitpid):
        self.left = dict(children)
        self.grace_s = max(float(grace_s), 0.0)
        self.failure = None
        self.kill_at = None
        self._wait = wait

    @property
    def done(self):
        return not self.left

    @property
    def result(self):
        return self.failure or (0, None)

    def ended(self, pid, status):
        rank = self.left.pop(pid, None)
        if rank is not None and status != 0 and self.failure is None:
            self.failure = (status, rank)
            _signal(self.left, signal.SIGTERM)
            self.kill_at = time.monotonic() + self.grace_s

    def _kill_when_due(self):
        if self.kill_at is not None and time.monotonic() >= self.kill_at:
            _signal(self.left, signal.SIGKILL)
            self.kill_at = float("inf")

    def reap(self):
        """Take note of the ranks that have ended, without waiting."""
        while self.left:
            try:
                pid, status = self._wait(-1, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: nothing more to learn
                self.left.clear()
                break
            if pid == 0:
                break
            self.ended(pid, status)
        self._kill_when_due()

    def wait(self):
        """Until every rank has ended."""
        while self.left:
            if self.kill_at is None:
                try:
                    pid, status = self._wait(-1, 0)
                except ChildProcessError:
                    self.left.clear()
                    break
                self.ended(pid, status)
            else:
                self.reap()
                if self.left:
                    time.sleep(0.05)
        return self.result


def supervise(children, grace_s, wait=os.waitpid):
    """Wait for a node's ranks as one gang (``Supervisor``); its ``result``."""
    return Supervisor(children, grace_s, wait).wait()


def _signal(children, sig):
    for pid in children:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


class Splitter:
    """Tells apart the ranks' lines of output prefixed by ``PREFIX``, as it streams in:
    ``feed(data)`` returns ``[(rank, bytes)]`` for the whole lines it completes, without
    their prefix. Lines without a prefix (this launcher's own) belong to ``default_rank``."""

    def __init__(self, default_rank):
        self.default_rank, self.rest = default_rank, b""

    def feed(self, data):
        *lines, self.rest = (self.rest + data).split(b"\n")
        return [self._owner(line + b"\n") for line in lines]

    def end(self):
        """The unfinished last line, if any (the stream ended)."""
        rest, self.rest = self.rest, b""
        return [self._owner(rest + b"\n")] if rest else []

    def _owner(self, line):
        m = _PREFIXED.match(line)
        return (int(m.group(1)), line[m.end():]) if m else (self.default_rank, line)


def _pump(pipe, rank, lock):
    """Copy a rank's output to stdout, a whole line at a time, each with its prefix."""
    prefix = PREFIX.format(rank).encode()
    rest = b""
    out = sys.stdout.buffer
    while True:
        data = os.read(pipe, 65536)
        if not data:
            break
        lines = (rest + data).split(b"\n")
        rest = lines.pop()
        if lines:
            with lock:
                out.write(b"".join(prefix + line + b"\n" for line in lines))
                out.flush()
    if rest:
        with lock:
            out.write(prefix + rest + b"\n")
            out.flush()
    os.close(pipe)


def _start(argv, env, rank, lock, pumps):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            os.dup2(write, 1)
            os.dup2(write, 2)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            os.execvpe(argv[0], argv, env)
        except BaseException as exc:
            os.write(2, f"gpushare: cannot run {argv[0]}: "
                        f"{getattr(exc, 'strerror', None) or exc}\n".encode())
        os._exit(127)
    os.close(write)
    pump = threading.Thread(target=_pump, args=(read, rank, lock), daemon=True)
    pump.start()
    pumps.append(pump)
    return pid


def main(args):
    grace = 10.0
    if args[:1] == ["--grace"]:
        grace, args = float(args[1]), args[2:]
    if args[:1] != ["--"] or len(args) < 2:
        sys.exit("usage: python3 -c SOURCE [--grace S] -- ARGV...")
    argv = args[1:]
    count = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    children, lock, pumps = {}, threading.Lock(), []
    stopping = []

    def forward(signum, frame):
        stopping.append(signum)
        _signal(children, signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    for local in range(count):
        env = {**os.environ, **process_env(os.environ, local)}
        children[_start(argv, env, int(env["RANK"]), lock, pumps)] = int(env["RANK"])
        if stopping:  # a stop came while the ranks were starting
            _signal(children, stopping[0])
    status, rank = supervise(children, grace)
    for pump in pumps:
        pump.join(timeout=2)
    code = exit_code(status)
    if rank is not None and not stopping:
        with lock:
            sys.stdout.write(f"gpushare: rank {rank} exited with code {code}; "
                             f"the other ranks were stopped\n")
            sys.stdout.flush()
    sys.exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])

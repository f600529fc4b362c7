"""The Python API of the train pool in a notebook: ``submit(...)`` returns a :class:`Job`.

    job = jupyter_gpushare.submit(source="import torch; ...", gpus=2, out=["model"])
    job.wait(); model = job.result()["model"]

The magics and the panel are thin layers over this module; all HTTP goes through
:class:`~jupyter_gpushare.client.PoolClient`. Python code (``source``) runs as a job in the
kernel's working directory with the kernel's own Python (see ``runner.py``), so the job sees
the notebook's files and packages.
"""

from __future__ import annotations

import os
import queue
import shutil
import sys
import threading
import time
from typing import Callable, Iterator

from ..client import ClientError, InvalidInput, PoolClient, PoolUnreachable, job_spec
from ..text import clock_time, gpu_count
from ..trainjob import ACTIVE, CANCELLED, FINAL, PENDING, SUCCEEDED
from . import runner

RETRY_MAX_S = 5.0  # longest pause between tries while the pool service cannot be reached


def notebook_client() -> PoolClient:
    """The client of a kernel: settings from the environment; while the pool service is
    restarting it keeps trying and says so once in the cell (stderr)."""
    return PoolClient(on_retry=lambda sentence: print(f"gpushare: {sentence}", file=sys.stderr,
                                                      flush=True))


class JobError(ClientError):
    """A job did not give what was asked (it failed, was cancelled, has no result yet)."""


class JobTimeout(JobError, TimeoutError):
    """``Job.wait(timeout=...)`` ran out of time; the job goes on."""


def submit(command=None, *, source: str | None = None, gpus=1, project: str | None = None,
           name: str | None = None, priority=None, env=None, workdir: str | None = None,
           with_vars: dict | None = None, out=None, per_gpu: bool = False,
           client: PoolClient | None = None, request_id: str | None = None) -> "Job":
    """Submit a train job and return its :class:`Job` at once.

    ``command`` (a list of words) runs as given; ``source`` (Python code) runs in a fresh
    process of this kernel's Python. ``with_vars`` ({name: value}, picklable) are defined
    before ``source`` runs; ``out`` names variables that :meth:`Job.result` brings back (from
    rank 0 of a distributed job). A job on several nodes runs one rank per node, or one per
    GPU with ``per_gpu``; each rank gets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``...
    ``workdir`` (absolute) defaults to the current directory; ``project`` to your only one.
    The job gets this kernel's ``PATH`` unless ``env`` gives one.
    Bad values raise :class:`~jupyter_gpushare.client.InvalidInput`, and the pool's refusals
    :class:`~jupyter_gpushare.client.ClientError`, each with one sentence; nothing is submitted.
    The submit goes through a restart of the pool service and never makes two jobs; give
    ``request_id`` (e.g. a UUID) to submit again safely from elsewhere.
    """
    client = client or notebook_client()
    workdir = os.getcwd() if workdir is None else workdir
    out = _names(out, "out")
    if (with_vars or out) and source is None:
        raise InvalidInput("with_vars", "", message="with_vars and out work with source (Python "
                           "code); a command gets its inputs from its arguments and files")
    if with_vars is not None and not isinstance(with_vars, dict):
        raise InvalidInput("with_vars", "must be a dict of {name: value}")
    for key in with_vars or {}:
        _names([key], "with_vars")
    if source is not None and (not isinstance(source, str) or not source.strip()):
        raise InvalidInput("source", "must be Python code as a non-empty string")
    if source is not None:
        try:
            compile(source, "<cell>", "exec")
        except SyntaxError as e:
            raise InvalidInput("source", "", message=f"the code has a syntax error on line "
                               f"{e.lineno}: {e.msg}; a train job runs plain Python (no "
                               f"%magics or !commands)") from None
    # Checked in full before any file is written: bad input leaves nothing behind.
    spec = job_spec(["python"] if source is not None else command, source=None, gpus=gpus,
                    project=project, name=name, priority=priority, env=env, workdir=workdir,
                    per_gpu=per_gpu, path=os.environ.get("PATH"))
    folder = None
    if source is not None:
        try:
            folder = runner.pack(workdir, source, with_vars, out)
        except runner.PackError as e:
            raise InvalidInput("with_vars", "", message=str(e)) from None
        except runner.UnsafeFolder as e:
            raise ClientError(str(e)) from None
        except OSError as e:
            raise ClientError(f"cannot write the job's files under {workdir}/{runner.CELLS} "
                              f"({e.strerror}); run from a directory you can write") from None
        spec["command"] = runner.command(folder)
    try:
        info = client.submit(spec, request_id=request_id)
    except BaseException:
        _remove(folder)
        raise
    return Job(info, client, folder=folder, out=out)


class Job:
    """A train job in the pool. ``id`` is fixed; :attr:`state` and :meth:`info` ask the pool."""

    def __init__(self, info: dict, client: PoolClient | None = None, *,
                 folder: str | None = None, out=()):
        self.id = info["id"]
        self.client = client or notebook_client()
        self._info, self._asked = info, time.time()
        self._folder = folder  # the runner's files, removed once nothing more is needed
        self._out = tuple(out)
        self._problems: list[str] = []
        self._result: dict | None = None
        self._lock = threading.Lock()

    @classmethod
    def get(cls, job_id: str, client: PoolClient | None = None) -> "Job":
        """A handle on an existing job of yours (no ``result()`` values: those belong to the
        kernel that submitted it)."""
        client = client or notebook_client()
        return cls(client.job(job_id), client)

    def __repr__(self):
        # A cell's output outlives the moment: the state is said as of when it was asked
        # (a --no-wait cell would otherwise read "pending" for ever)
        info = self._info
        return (f"<Job {self.id} {info.get('state')} at {clock_time(self._asked)}: "
                f"{gpu_count(info.get('gpus'))}, project {info.get('project')}; job.state "
                f"asks again>")

    @property
    def state(self) -> str:
        """The state now (pending, running, succeeded, failed or cancelled), as the pool says."""
        return self.info()["state"]

    def info(self) -> dict:
        """The job as the pool describes it now (its JSON: state, attempt, queue_position,
        reason, exit_code, ...)."""
        self._info, self._asked = self.client.job(self.id), time.time()
        if self._info["state"] in FINAL:
            self._finished()
        return self._info

    def cancel(self) -> dict:
        """Cancel the job: a pending job ends at once, a running one gets SIGTERM (then
        SIGKILL after the pool's grace period)."""
        self._info, self._asked = self.client.cancel(self.id), time.time()
        if self._info["state"] in FINAL:
            self._finished()
        return self._info

    def wait(self, timeout: float | None = None,
             on_update: Callable[[dict], None] | None = None) -> dict:
        """Wait until the job ends; return its final :meth:`info`. ``on_update(info)`` is
        called whenever its state, attempt, queue position or reason changes. Raises
        :class:`JobTimeout` after ``timeout`` seconds (the job goes on)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        seen, pause = None, 0.2
        while True:
            try:
                info = self.info()
            except PoolUnreachable:
                info = self._info  # a restarting service: look again, until the deadline
            key = tuple(info.get(k) for k in ("state", "attempt", "queue_position", "reason"))
            if on_update is not None and key != seen:
                on_update(info)
            seen = key
            if info["state"] in FINAL:
                return info
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise JobTimeout(f"job {self.id} is still {info['state']} after {timeout:g} s; "
                                 f"it goes on (job.cancel() stops it)")
            time.sleep(pause if left is None else min(pause, left))
            pause = min(pause * 1.5, 2.0)

    def logs(self, follow: bool = False, attempt: int | None = None, rank: int | None = None,
             all_ranks: bool = False) -> Iterator[str]:
        """The job's output as text chunks. Without ``follow``: what rank ``rank`` (default 0)
        of the attempt (default: the current one) printed so far. With ``follow``: as it is
        printed, through later attempts if the job is preempted and requeued, until the job
        ends; a job with several ranks gives rank 0's lines (every rank's with ``all_ranks``)
        as whole lines, each after ``[rank N]`` and a space, unless ``rank`` names one."""
        if not follow or attempt is not None:
            return self.client.logs(self.id, follow=follow, attempt=attempt, rank=rank)
        return self._follow(rank=rank, all_ranks=all_ranks)

    def result(self) -> dict:
        """The ``out`` variables of a job that succeeded, as ``{name: value}``. Raises
        :class:`JobError` with one sentence while it runs, if it failed or was cancelled, or if
        a value could not be sent back."""
        if self._result is not None:
            return dict(self._result)
        info = self._info if self._info["state"] in FINAL else self.info()
        if info["state"] in ACTIVE:
            raise JobError(f"job {self.id} is still {info['state']}; wait for it first "
                           f"(job.wait())")
        if info["state"] != SUCCEEDED:
            raise JobError(self.failure())
        if not self._out:
            return {}
        if self._folder is None or not os.path.isdir(self._folder):
            raise JobError(f"the values of job {self.id} are gone: they are read once, by "
                           f"the kernel that submitted it")
        values, problems = runner.unpack(self._folder)
        if problems:
            raise JobError(f"job {self.id} succeeded but " + "; ".join(problems))
        self._result = values
        _remove(self._folder)
        return dict(values)

    def failure(self) -> str | None:
        """One sentence on why the job did not succeed, or None if it did (or has not ended)."""
        info = self._info
        state, code = info.get("state"), info.get("exit_code")
        if state in ACTIVE or state == SUCCEEDED:
            return None
        if state == CANCELLED:
            return f"job {self.id} was cancelled" + (f" ({info['reason']})"
                                                     if info.get("reason") else "")
        if code is None:
            return f"job {self.id} failed: {info.get('reason') or 'the pool gave no reason'}"
        said = f"job {self.id} failed with exit code {code}"
        why = self._problems or self._own_words()
        reason = info.get("reason") or ""
        if why:
            return f"{said}: {'; '.join(why)}"
        if reason and reason != f"exited with code {code}":
            return f"{said}: {reason}"
        return said

    # -- following -----------------------------------------------------------------------

    def watch(self, on_output: Callable[[str], None],
              on_update: Callable[[dict, str | None], None] | None = None,
              every: float = 1.0, all_ranks: bool = False) -> dict:
        """Follow the output (``on_output(text)``, as :meth:`logs` follows it) and the state
        (``on_update(info, problem)`` about every ``every`` seconds, ``problem`` a sentence
        while the pool cannot be reached) until the job ends; return its final info.
        Callbacks run in this thread; the output is read by a helper thread, so a
        KeyboardInterrupt lands here."""
        chunks: queue.Queue = queue.Queue()

        def follow():
            try:
                for text in self._follow(all_ranks=all_ranks):
                    chunks.put(("out", text))
                chunks.put(("end", None))
            except BaseException as e:  # handed to the caller's thread
                chunks.put(("error", e))

        threading.Thread(target=follow, name=f"gpushare-logs-{self.id}", daemon=True).start()
        next_look = 0.0
        while True:
            now = time.monotonic()
            if now >= next_look and on_update is not None:
                try:
                    on_update(self.info(), None)
                except PoolUnreachable as e:
                    on_update(self._info, str(e))
                next_look = now + every
            try:
                kind, value = chunks.get(timeout=max(0.0, next_look - time.monotonic())
                                         if on_update is not None else 0.5)
            except queue.Empty:
                continue
            if kind == "out":
                on_output(value)
            elif kind == "error":
                raise value
            else:
                if on_update is not None:
                    on_update(self._info, None)
                return self._info

    def _follow(self, rank: int | None = None, all_ranks: bool = False) -> Iterator[str]:
        written: dict[tuple, int] = {}  # (attempt, rank) -> characters already given
        lines: dict[tuple, RankLines] = {}  # (attempt, rank) -> its partial line
        info, pause = self._retrying(self.info), 0.2
        while True:
            attempt, broke = info["attempt"], False
            if all_ranks and info["state"] == PENDING:
                time.sleep(pause)  # its ranks are known once it is placed
                pause = min(pause * 1.5, 2.0)
                info = self._retrying(self.info)
                continue
            try:
                if all_ranks and (info.get("ranks") or 1) > 1:
                    yield from self._all_ranks(attempt, info["ranks"], written, lines)
                else:
                    yield from self._one_rank(attempt, rank, info, written, lines)
            except PoolUnreachable:  # a restarting service: try again, skip what was given
                broke = True
                time.sleep(pause)
                pause = min(pause * 2, RETRY_MAX_S)
            info = self._retrying(self.info)
            if not broke and (info["attempt"] != attempt or info["state"] in FINAL):
                for key in sorted(k for k in lines if k[0] == attempt):
                    if text := lines[key].end():  # the attempt is over: its last lines
                        yield text
            if broke or info["attempt"] != attempt:
                continue  # the same attempt again, or the next one after a requeue
            if info["state"] in FINAL:
                return
            time.sleep(0.2)  # closed early while it still runs: open it again

    def _one_rank(self, attempt, rank, info, written, lines) -> Iterator[str]:
        """One rank's output of the attempt; rank 0's, prefixed, when the job has several
        ranks and no rank was asked for (learnt when its first output comes)."""
        key = (attempt, rank or 0)
        chunks = _skip(self.client.logs(self.id, follow=True, attempt=attempt, rank=rank),
                       written, key)
        for text in chunks:
            if key not in lines:
                if info.get("ranks") is None or info["attempt"] != attempt:
                    info = self._retrying(self.info)
                several = rank is None and (info.get("ranks") or 1) > 1
                lines[key] = RankLines(0 if several else None)
            if text := lines[key].feed(text):
                yield text

    def _all_ranks(self, attempt, count, written, lines) -> Iterator[str]:
        """Every rank's output of the attempt, read side by side, as prefixed whole lines."""
        merged: queue.Queue = queue.Queue()

        def read(rank):
            key = (attempt, rank)
            try:
                for text in _skip(self.client.logs(self.id, follow=True, attempt=attempt,
                                                   rank=rank), written, key):
                    merged.put((key, text))
                merged.put((key, None))
            except BaseException as e:
                merged.put((key, e))

        for rank in range(count):
            lines.setdefault((attempt, rank), RankLines(rank))
            threading.Thread(target=read, args=(rank,), daemon=True,
                             name=f"gpushare-logs-{self.id}-{rank}").start()
        open_, error = count, None
        while open_:
            key, item = merged.get()
            if isinstance(item, str):
                if text := lines[key].feed(item):
                    yield text
                continue
            open_ -= 1
            if isinstance(item, BaseException) and error is None:
                error = item
        if error is not None:
            raise error

    def _retrying(self, call):
        pause = 0.2
        while True:
            try:
                return call()
            except PoolUnreachable:
                time.sleep(pause)
                pause = min(pause * 2, RETRY_MAX_S)

    # -- the runner's files --------------------------------------------------------------

    def _finished(self) -> None:
        """The job has ended: read which ``out`` values the runner could not send back (if
        that is why it failed) and drop the files unless ``result()`` has yet to read them.
        Both the caller's thread and the output thread of ``watch()`` may get here."""
        with self._lock:
            if self._folder is None or not os.path.isdir(self._folder):
                return
            if self._info.get("exit_code") == runner.EXIT_OUTPUT and \
                    os.path.exists(os.path.join(self._folder, runner.RESULT)):
                self._problems = runner.unpack(self._folder)[1]
            if not (self._info["state"] == SUCCEEDED and self._out):
                _remove(self._folder)

    def _own_words(self) -> list[str]:
        """The last line the pool's shim or the runner wrote about the job ("gpushare: cannot
        run ...: Permission denied"): why it could not start, in the job's log."""
        try:
            text = "".join(self.client.logs(self.id, attempt=self._info.get("attempt")))
        except ClientError:
            return []
        lines = [line[len("gpushare: "):] for line in text.splitlines()
                 if line.startswith("gpushare: ")]
        return lines[-1:]


def _names(names, field: str) -> tuple[str, ...]:
    if names is None:
        return ()
    if isinstance(names, str):
        names = [names]
    out = []
    for name in names:
        if not isinstance(name, str) or not name.isidentifier():
            raise InvalidInput(field, f"must name Python variables, and {name!r} is not a "
                               f"variable name")
        out.append(name)
    return tuple(out)


def _skip(chunks, written: dict, key) -> Iterator[str]:
    """The chunks beyond what was already given of this output (``key``: attempt, rank)."""
    done, seen = written.get(key, 0), 0
    for text in chunks:
        start = max(0, done - seen)
        seen += len(text)
        if start < len(text):
            written[key] = seen
            yield text[start:]


class RankLines:
    """One rank's output as whole lines, each after ``[rank N] `` (the pods' launcher writes
    the same); ``rank`` None passes the text through as it comes."""

    def __init__(self, rank: int | None):
        self.prefix = None if rank is None else f"[rank {rank}] "
        self.rest = ""

    def feed(self, text: str) -> str:
        if self.prefix is None:
            return text
        *done, self.rest = (self.rest + text).split("\n")
        return "".join(f"{self.prefix}{line}\n" for line in done)

    def end(self) -> str:
        """The unfinished last line, ended (the stream closed)."""
        rest, self.rest = self.rest, ""
        return f"{self.prefix}{rest}\n" if self.prefix is not None and rest else ""


def _remove(folder: str | None) -> None:
    if folder:
        shutil.rmtree(folder, ignore_errors=True)

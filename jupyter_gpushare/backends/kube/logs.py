"""The logs and exit records of job pods, kept in ``state_dir`` so that they outlive the pods.

Each pod's log is followed from the API into the capped logs of its ranks while it runs
(``logfile.CappedLog``: at most ``log_limit`` bytes each, the beginning and the latest
output), and read from there. Per attempt, ``state_dir/<job>/`` holds one log per rank
(``ranks.log_name``: ``<attempt>.log`` is rank 0's) and ``<attempt>.exit``, how the attempt
ended, written before its pods are deleted. A per-GPU pod's log holds all its ranks' lines,
each after ``[rank N] `` (``launcher.Splitter`` sends each to its rank's log). A follow that
breaks (the API server restarts, a read timeout) starts again from the beginning of the pod's
log, which rewrites the same bytes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import Callable

from .. import launcher, logfile
from ..base import Exit
from ..ranks import log_name
from .api import KubeAPI, KubeError
from .gang import PodRanks
from .objects import label_value

FOLLOW_READ_TIMEOUT_S = 600  # a silent job's log is followed anew after this
WATCH_LAG_S = 5.0  # after a stream's end, how long the watch may take to show the container's


async def _done_within(done: Callable[[], bool | None], seconds: float) -> bool | None:
    """``done()`` once it is not None, asked every 0.1 s for ``seconds`` at most."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while (ended := done()) is None and loop.time() < deadline:
        await asyncio.sleep(0.1)
    return ended


class PodLogs:
    def __init__(self, state_dir: str, namespace: str, log_limit: int, log: logging.Logger):
        self.state_dir, self.namespace, self.log_limit = state_dir, namespace, log_limit
        self.log = log
        self.api: KubeAPI | None = None  # set once the backend is connected

    # -- files ----------------------------------------------------------------------------

    def path(self, key, kind: str) -> str:
        job_id, attempt = key
        return os.path.join(self.state_dir, label_value(job_id), f"{int(attempt)}.{kind}")

    def rank_path(self, key, rank: int) -> str:
        job_id, attempt = key
        return os.path.join(self.state_dir, label_value(job_id), log_name(attempt, rank))

    def record_exit(self, key, exit: Exit) -> None:
        path = self.path(key, "exit")
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"state": exit.state, "exit_code": exit.exit_code,
                       "reason": exit.reason}, f)
        os.replace(tmp, path)

    def read_exit(self, key) -> Exit | None:
        try:
            with open(self.path(key, "exit")) as f:
                record = json.load(f)
            return Exit(*key, record["state"], record.get("exit_code"), record.get("reason", ""))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def read(self, key, rank: int, offset: int, size: int) -> tuple[int, bytes]:
        return logfile.read(self.rank_path(key, rank), offset, size)

    def _sink(self, key, pod: PodRanks) -> "_Sink":
        os.makedirs(os.path.dirname(self.rank_path(key, 0)), mode=0o700, exist_ok=True)
        return _Sink({r: logfile.CappedLog(self.rank_path(key, r), self.log_limit)
                      for r in range(pod.first, pod.last + 1)},
                     launcher.Splitter(pod.first) if pod.prefixed else None)

    # -- from the API ---------------------------------------------------------------------

    async def follow(self, key, pod: PodRanks, done: Callable[[], bool | None],
                     started: asyncio.Event | None = None) -> bool:
        """The pod's log into its ranks' capped logs while it runs; True once its container
        has ended and the log is whole. ``done()`` says whether the container has ended
        (True), the pod is gone (False) or it is still to be followed (None). ``started``
        is set once the watch shows a container started or the pod gone: only then is the
        log asked for (a pending pod's log is refused, and asking again costs the API server
        a request each time). After a broken stream it asks again (from the beginning)."""
        if started is not None:
            await started.wait()
        pause = 0.2
        while True:
            whole = False  # this stream ran to its end: nothing missed, even if it was empty
            try:
                response = await self.api.streams.read_namespaced_pod_log(
                    pod.name, self.namespace, follow=True, _preload_content=False,
                    _request_timeout=(10, FOLLOW_READ_TIMEOUT_S))
                try:
                    if response.status == 200:
                        sink = None  # opened at the first byte: an empty answer (the
                        try:         # container's log already gone) wipes nothing kept
                            async for chunk in response.content.iter_any():
                                if chunk and sink is None:
                                    sink = self._sink(key, pod)
                                if chunk:
                                    sink.write(chunk)
                        finally:
                            if sink is not None:
                                sink.close()
                        whole, pause = True, 0.2
                finally:
                    response.release()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the log is kept as far as it came; ask again
                self.log.debug("Following the log of %s broke off: %s", pod.name, e)
            # A whole stream ends when the container does, and the watch shows that a moment
            # later: wait for it rather than read the whole log again.
            ended = await _done_within(done, WATCH_LAG_S if whole else 0)
            if ended is not None:
                # A silent job's whole log is empty: no need to read it again (archive).
                return ended and (whole or os.path.exists(self.rank_path(key, pod.first)))
            await asyncio.sleep(pause)
            pause = min(pause * 2, 5.0)

    async def archive(self, key, pod: PodRanks) -> None:
        """The pod's whole log into its ranks' capped logs (anew: a follower may have left
        part of it), streamed, never in memory whole. Until its first byte, what was kept
        before stays: a pod whose log is already gone leaves what was followed, and a note."""
        sink = None
        try:
            response = await self.api.streams.read_namespaced_pod_log(
                pod.name, self.namespace, _preload_content=False, _request_timeout=(10, 60))
            try:
                if response.status != 200:
                    raise KubeError(response.status, "", (await response.text())[:300])
                async for chunk in response.content.iter_any():
                    if chunk and sink is None:
                        sink = self._sink(key, pod)
                    if chunk:
                        sink.write(chunk)
            finally:
                response.release()
        except Exception as e:  # kept as far as it came, and said so
            note = (f"\n[gpushare: the log could not be read from Kubernetes: "
                    f"{str(e).splitlines()[0] if str(e) else type(e).__name__}]\n").encode()
            if sink is not None:
                sink.note(note)
            else:
                os.makedirs(os.path.dirname(self.rank_path(key, 0)), mode=0o700, exist_ok=True)
                for rank in range(pod.first, pod.last + 1):
                    logfile.append(self.rank_path(key, rank), note)
        finally:
            if sink is not None:
                sink.close()


class _Sink:
    """Where a pod's log goes: its rank's capped log, or, from a per-GPU pod, each line to
    the capped log of the rank that printed it."""

    def __init__(self, logs: dict[int, logfile.CappedLog], splitter: launcher.Splitter | None):
        self.logs, self.splitter = logs, splitter
        self.first = min(logs)

    def write(self, data: bytes) -> None:
        if self.splitter is None:
            self.logs[self.first].write(data)
            return
        for rank, line in self.splitter.feed(data):
            self.logs.get(rank, self.logs[self.first]).write(line)

    def note(self, data: bytes) -> None:
        """Something every rank of the pod should read."""
        for log in self.logs.values():
            log.write(data)

    def close(self) -> None:
        if self.splitter is not None:
            for rank, line in self.splitter.end():
                self.logs.get(rank, self.logs[self.first]).write(line)
        for log in self.logs.values():
            log.close()

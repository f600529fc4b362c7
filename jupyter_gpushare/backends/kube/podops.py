"""What the backend writes to Kubernetes: a gang's pods (all of them or none left), its
rendezvous Service and NetworkPolicy, and deletions that are tried again until the pods are
gone. Refusals become one sentence for the job's user."""

from __future__ import annotations

import asyncio
import logging
import time

from ..base import BackendError, Launch
from . import objects as k8s
from .api import KubeAPI, KubeError

DELETE_RETRY_S = 5.0


class PodOps:
    def __init__(self, api: KubeAPI, namespace: str, retry_timeout_s: float,
                 log: logging.Logger):
        self.api, self.namespace, self.retry_timeout_s, self.log = \
            api, namespace, retry_timeout_s, log
        self.doomed: dict[str, tuple[int | None, float]] = {}  # pod -> (grace, last try)
        self.tasks: set[asyncio.Task] = set()

    def spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    # -- creating -------------------------------------------------------------------------

    async def create_all(self, pods: list[dict], answers: bool = False) -> list[dict | None]:
        """Create the pods together; when one is refused, delete the others and say why.
        With ``answers``, the pods as created (their uids); else None for each (a pod's JSON
        is decoded only where it is read)."""
        results = await asyncio.gather(*(self._create(p, answers) for p in pods),
                                       return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            created = [p["metadata"]["name"] for p, r in zip(pods, results)
                       if not isinstance(r, BaseException)]
            await asyncio.gather(*(self.delete(name, 0) for name in created))
            if not isinstance(failed[0], KubeError):
                raise failed[0]
            raise BackendError(self.sentence(failed[0])) from None
        return results

    async def create_gang(self, launch: Launch, settings: k8s.PodSettings, port: int,
                          first: dict, rest: list[dict]) -> None:
        """Rank 0's pod, then the rendezvous Service and NetworkPolicy it owns, then the
        other ranks: all of them, or nothing left."""
        created = (await self.create_all([first], answers=True))[0]
        name = k8s.rendezvous_name(launch.job_id, launch.attempt)
        objects = [
            (f"create service {name}", self.api.core.create_namespaced_service,
             k8s.rendezvous_service(launch, settings, created, port)),
            (f"create network policy {name}",
             self.api.networking.create_namespaced_network_policy,
             k8s.gang_network_policy(launch, settings, created))]
        results = await asyncio.gather(*(self._create_object(what, call, body)
                                         for what, call, body in objects),
                                       return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        try:
            if failed:
                if not isinstance(failed[0], KubeError):
                    raise failed[0]
                raise BackendError(self.sentence(failed[0], "services and network policies"))
            if rest:
                await self.create_all(rest)
        except BaseException:
            await asyncio.gather(self.delete(first["metadata"]["name"], 0),
                                 self.delete_rendezvous(name))
            raise

    async def _create(self, pod: dict, answer: bool) -> dict | None:
        name = pod["metadata"]["name"]
        send = self.api.json if answer else self.api.raw
        try:
            created = await send(f"create pod {name}", self.api.core.create_namespaced_pod,
                                 self.namespace, pod)
            return created if answer else None
        except KubeError as e:
            if e.status != 409:
                raise
            # Ours already (an answer lost on the way, then the retry): the same attempt.
            existing = await self.api.json(f"read pod {name}", self.api.core.read_namespaced_pod,
                                           name, self.namespace)
            labels = existing["metadata"].get("labels") or {}
            mine = pod["metadata"]["labels"]
            if (labels.get(k8s.JOB), labels.get(k8s.ATTEMPT)) != (mine[k8s.JOB], mine[k8s.ATTEMPT]):
                raise
            return existing if answer else None

    async def _create_object(self, what: str, call, body: dict) -> None:
        try:
            await self.api.raw(what, call, self.namespace, body)
        except KubeError as e:
            if e.status != 409:  # ours already: an answer lost on the way, then the retry
                raise

    def sentence(self, e: KubeError, what: str = "pods") -> str:
        said = e.message.split(": ", 1)[-1].rstrip(".")
        if e.status in (401, 403):
            return (f"The pool service may not create {what} in namespace {self.namespace} "
                    f"(Kubernetes said: {said}); an administrator must grant it the rules of "
                    f"hub_config/kubernetes-rbac.yaml.")
        if e.status in (400, 422):
            return f"Kubernetes refused the job's {what.rstrip('s')}: {said}."
        if e.status == 409:
            return f"A pod of this job's name already exists and is not the job's: {said}."
        return (f"The Kubernetes API did not accept the job's {what} within "
                f"{self.retry_timeout_s:g} s ({said}); the job can be submitted again.")

    # -- deleting -------------------------------------------------------------------------

    def doom(self, name: str, grace: int | None) -> None:
        """Delete the pod (again, by ``retry_deletions``, until it is gone)."""
        self.doomed[name] = (grace, time.monotonic())
        self.spawn(self.delete(name, grace))

    async def delete(self, name: str, grace: int | None) -> None:
        kwargs = {} if grace is None else {"grace_period_seconds": grace}
        try:  # the answer (the pod, deleting) is not read: the watch shows it
            await self.api.raw(f"delete pod {name}", self.api.core.delete_namespaced_pod,
                               name, self.namespace, **kwargs)
        except KubeError as e:
            if e.status == 404:
                self.doomed.pop(name, None)
            else:
                self.log.warning("Could not delete pod %s (%s); trying again", name, e)

    async def delete_rendezvous(self, name: str) -> None:
        """A gang's Service and NetworkPolicy (the garbage collector would, with rank 0)."""
        for what, call in (("service", self.api.core.delete_namespaced_service),
                           ("network policy",
                            self.api.networking.delete_namespaced_network_policy)):
            try:
                await self.api.raw(f"delete {what} {name}", call, name, self.namespace,
                                   retry_s=5)
            except KubeError as e:
                if e.status != 404:
                    self.log.warning("Could not delete %s %s (%s); it goes with pod %s-0",
                                     what, name, e, name)

    def retry_deletions(self, pods) -> None:
        """Forget the doomed pods the reflector ``pods`` no longer lists; delete again those
        that the API server has not started deleting."""
        now = time.monotonic()
        for name, (grace, tried) in list(self.doomed.items()):
            pod = pods.objects.get(name)
            if pod is None and pods.listed_at > tried:
                del self.doomed[name]
            elif pod is not None and not pod["metadata"].get("deletionTimestamp") \
                    and now - tried > DELETE_RETRY_S:
                self.doom(name, grace)

    async def shutdown(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

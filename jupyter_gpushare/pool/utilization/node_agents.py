"""Which node a GPU reading speaks for (``POST api/samples``): proven by the agent, never
taken from the body. A reading moves idle-first reclaim and the culling of notebooks, so
one node must not be able to report another node's GPUs idle.

Every node agent is a JupyterHub service (its token is the request's identity,
``web/identity.py``). Which node it is on, it proves in one of two ways:

- **A service per node** (``c.GPUUsage.agent_nodes = {service: node}``): the token is the
  proof, and its readings are for that node only. For machines without Kubernetes.
- **The shared service of the DaemonSet** (``c.GPUUsage.agent_service``): its one token is in
  the agent pod on every GPU node, so it proves only that a reading comes from some agent.
  Each reading also carries the agent pod's own service-account token (header
  ``Gpushare-Node-Token``), which the kubelet projects into that pod alone, for the audience
  ``gpushare`` and bound to the pod. The pool asks Kubernetes whose it is (a TokenReview for
  that audience: the agent's service account, which pod), reads that pod (the same uid, not
  being deleted) and takes its ``spec.nodeName``. Root on one node can read the tokens of
  that node's pods only. An answer is kept ``ttl_s`` by the token's hash: a token whose pod
  is gone is refused at most that long after.

``NotProven`` (HTTP 403) and ``Unverifiable`` (503: Kubernetes did not answer) carry one
sentence. ``pod_of_review`` and ``node_of_pod`` decide; ``PodTokens`` asks.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections import OrderedDict

AUDIENCE = "gpushare"
HEADER = "Gpushare-Node-Token"
POD_NAME = "authentication.kubernetes.io/pod-name"
POD_UID = "authentication.kubernetes.io/pod-uid"
MOUNT = "mount it as hub_config/kubernetes-agent.yaml does"


class NotProven(Exception):
    """The reading does not come from the node it names; one sentence (HTTP 403)."""


class Unverifiable(Exception):
    """Kubernetes could not be asked now; one sentence (HTTP 503)."""


def review_body(token: str) -> dict:
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": token, "audiences": [AUDIENCE]}}


def pod_of_review(status: dict, namespace: str, account: str) -> tuple[str, str]:
    """The agent pod (name, uid) that a TokenReview's ``status`` says the token is bound to;
    ``NotProven`` unless Kubernetes accepted it for ``AUDIENCE`` as the agent's account's."""
    if not status.get("authenticated") or AUDIENCE not in (status.get("audiences") or ()):
        raise NotProven(f"Kubernetes does not accept the agent's pod token for the audience "
                        f"{AUDIENCE!r}; {MOUNT}")
    user = status.get("user") or {}
    expected = f"system:serviceaccount:{namespace}:{account}"
    if user.get("username") != expected:
        raise NotProven(f"the pod token is {user.get('username')!r}'s, not the agent's "
                        f"service account {namespace}/{account}'s")
    extra = user.get("extra") or {}
    names, uids = extra.get(POD_NAME) or [], extra.get(POD_UID) or []
    if len(names) != 1 or len(uids) != 1:
        raise NotProven(f"the agent's token is not bound to a pod (a service-account secret's "
                        f"token?); {MOUNT}")
    return names[0], uids[0]


def node_of_pod(pod: dict | None, name: str, uid: str) -> str:
    """The node the agent pod ``name`` (with ``uid``) runs on; ``NotProven`` when that pod is
    gone, being deleted, another pod of the same name, or not on a node."""
    meta = (pod or {}).get("metadata") or {}
    if pod is None or meta.get("uid") != uid or meta.get("deletionTimestamp"):
        raise NotProven(f"the agent's pod {name} no longer exists")
    node = (pod.get("spec") or {}).get("nodeName")
    if not node:
        raise NotProven(f"the agent's pod {name} is not on a node yet")
    return node


class PodTokens:
    """An agent pod's token → the node its pod runs on, asked of Kubernetes (``kube``: an
    async callable giving a ``KubeAPI``) and kept ``ttl_s``, refusals too. Needs the RBAC of
    hub_config/kubernetes-rbac.yaml: create tokenreviews, get pods in ``namespace``.

    Bounded, since the shared agent token is on every GPU node: a token longer than
    ``MAX_TOKEN`` or not shaped like a JWT is refused without asking; one question per token
    at a time, ``concurrent`` at once, at most ``waiting`` waiting."""

    MAX_TOKEN = 8192

    def __init__(self, kube, namespace: str, account: str, ttl_s: float = 60.0,
                 size: int = 4096, concurrent: int = 4, waiting: int = 64):
        self.kube, self.namespace, self.account = kube, namespace, account
        self.ttl_s, self.size, self.waiting = ttl_s, size, waiting
        self._known: OrderedDict[str, tuple[float, str | NotProven]] = OrderedDict()
        self._asking: dict[str, asyncio.Future] = {}
        self._concurrent = concurrent
        self._slots: asyncio.Semaphore | None = None

    async def node(self, token: str) -> str:
        if len(token) > self.MAX_TOKEN or not _JWT.fullmatch(token):
            raise NotProven(f"the agent's pod token is not a service-account token; {MOUNT}")
        key = hashlib.sha256(token.encode("utf-8", "replace")).hexdigest()
        hit = self._known.get(key)
        if hit is not None and time.monotonic() - hit[0] < self.ttl_s:
            if isinstance(hit[1], NotProven):
                raise NotProven(str(hit[1]))
            return hit[1]
        pending = self._asking.get(key)
        if pending is None:
            if len(self._asking) >= self.waiting:
                raise Unverifiable("Kubernetes is being asked about too many agent tokens at "
                                   "once; the reading is dropped, and the agent sends the "
                                   "next one")
            pending = self._asking[key] = asyncio.ensure_future(self._settle(key, token))
            pending.add_done_callback(lambda _: self._asking.pop(key, None))
        return await asyncio.shield(pending)

    async def _settle(self, key: str, token: str) -> str:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._concurrent)
        async with self._slots:
            try:
                node = await self._ask(token)
            except NotProven as e:
                node = e
        self._known[key] = (time.monotonic(), node)
        self._known.move_to_end(key)
        while len(self._known) > self.size:
            self._known.popitem(last=False)
        if isinstance(node, NotProven):
            raise NotProven(str(node))
        return node

    async def _ask(self, token: str) -> str:
        from kubernetes_asyncio import client

        from ...backends.kube.api import KubeError
        try:
            api = await self.kube()
        except Exception as e:  # the cluster's configuration could not be loaded
            raise Unverifiable(f"the pool cannot reach Kubernetes to check the agent's pod "
                               f"({type(e).__name__}: {e}); the reading is dropped") from None
        try:
            review = await api.json("review the agent's pod token",
                                    client.AuthenticationV1Api(api.client).create_token_review,
                                    review_body(token))
            name, uid = pod_of_review(review.get("status") or {}, self.namespace, self.account)
            try:
                pod = await api.json(f"read the agent's pod {name}",
                                     api.core.read_namespaced_pod, name, self.namespace)
            except KubeError as e:
                if e.status != 404:
                    raise
                pod = None
        except KubeError as e:
            raise Unverifiable(f"Kubernetes cannot say which node the agent is on now ({e}); "
                               f"the reading is dropped") from None
        return node_of_pod(pod, name, uid)


_JWT = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")


class AgentNodes:
    """Which services are node agents, and the node each reading of theirs may be for."""

    def __init__(self, shared: str, per_node: dict[str, str], pod_tokens: PodTokens | None):
        self.shared, self.per_node, self.pod_tokens = shared, dict(per_node), pod_tokens

    def is_agent(self, service: str) -> bool:
        return service in self.per_node or service == self.shared

    async def check(self, service: str, node: str, node_token: str | None) -> None:
        """``NotProven`` unless the agent ``service`` has shown that it is on ``node``."""
        if service in self.per_node:
            if self.per_node[service] != node:
                raise NotProven(f"the agent service {service!r} speaks only for node "
                                f"{self.per_node[service]}, not for {node}")
            return
        if self.pod_tokens is None:
            raise NotProven(f"a reading of the shared agent service {service!r} does not prove "
                            f"which node it is from, and without Kubernetes nothing can vouch "
                            f"for its pod; give each node's agent a JupyterHub service of its "
                            f"own (c.GPUUsage.agent_nodes)")
        if not node_token:
            raise NotProven(f"a reading of the shared agent service {service!r} must carry its "
                            f"pod's service-account token (header {HEADER}, audience "
                            f"{AUDIENCE!r}) to prove which node it is from; {MOUNT}")
        found = await self.pod_tokens.node(node_token)
        if found != node:
            raise NotProven(f"this agent's pod runs on node {found}, not on {node}")

"""The Kubernetes API as the backend uses it: kubernetes_asyncio (the client KubeSpawner
uses) for configuration and requests, plain JSON dicts in and out (no model classes), and
every call retried while the failure may pass (connection errors, 429, 5xx), within a time
budget.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time

import aiohttp
from kubernetes_asyncio import client, config

RETRIED = {429, 500, 502, 503, 504}
REFUSED = {401, 403}
REFUSED_RETRY_S = 5.0
"""An API server that has just started may refuse (401, 403) until its caches of tokens and
RBAC rules are filled (seconds on a busy machine): refusals are tried again this long,
from the first one, before they count."""
NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class KubeError(Exception):
    """An error answer of the API server (``status`` 0: no answer at all)."""

    def __init__(self, status: int, reason: str = "", message: str = ""):
        self.status, self.reason, self.message = status, reason, message
        super().__init__(f"{status} {reason}: {message}" if status else message)


async def raise_for_status(response, what: str) -> None:
    """Raise ``KubeError`` for an error answer (its Status object's reason and message)."""
    if 200 <= response.status < 300:
        return
    text = (await response.read()).decode(errors="replace")
    try:
        status = json.loads(text)
        reason, message = status.get("reason", ""), status.get("message", text)
    except ValueError:
        reason, message = response.reason or "", text.strip()[:300]
    error = KubeError(response.status, reason, f"{what}: {message}")
    error.retry_after = response.headers.get("Retry-After")
    raise error


REQUEST_CONNECTIONS = 64
"""Connections for requests (create, delete, list): a cycle's hundreds of pod creations go
through these, a bounded number at a time, never queued behind streams."""
STREAM_CONNECTIONS = 2048
"""Connections for streams that last (watches; each running pod's followed log): one each."""


async def make_client(kubeconfig: str, context: str = "",
                      connections: int = REQUEST_CONNECTIONS) -> client.ApiClient:
    """An API client from ``kubeconfig`` (a path), or from the pod's service account inside
    a cluster, or from the default kubeconfig (``$KUBECONFIG``, ``~/.kube/config``), with at
    most ``connections`` open at once."""
    configuration = client.Configuration()
    if kubeconfig:
        await config.load_kube_config(config_file=kubeconfig, context=context or None,
                                      client_configuration=configuration)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)
    else:
        await config.load_kube_config(context=context or None, client_configuration=configuration)
    configuration.connection_pool_maxsize = connections
    api_client = PlainApiClient(configuration)
    _skip_env_lookups(api_client, configuration)
    return api_client


class PlainApiClient(client.ApiClient):
    """kubernetes_asyncio's client, sending what it is given as it is. Its serializer walks
    every value of a request (a pod's manifest: a few hundred) to turn model classes and
    dates into JSON; the backend passes plain JSON only (dicts, lists, strings, numbers),
    and the walk was a third of a pod creation's CPU."""

    def sanitize_for_serialization(self, obj):
        return obj


def _skip_env_lookups(api_client: client.ApiClient, configuration) -> None:
    """kubernetes_asyncio's session trusts the environment: before every request it looks
    for a proxy variable and a ~/.netrc entry, each in a thread of the executor (two thread
    hand-offs per request, a few hundred a second at scale). Where no proxy variable applies
    to the API server, a session that does not look (a kubeconfig's proxy-url is passed with
    each request all the same, and credentials come from the kubeconfig, not ~/.netrc)."""
    from aiohttp.helpers import get_env_proxy_for_url
    from yarl import URL
    try:
        get_env_proxy_for_url(URL(configuration.host))
        return  # a proxy applies: keep looking, as before
    except LookupError:
        pass
    rest = api_client.rest_client
    old = rest.pool_manager
    connector = old.connector
    old.detach()  # the connector goes on, in the new session
    rest.pool_manager = aiohttp.ClientSession(connector=connector, trust_env=False,
                                              read_bufsize=2**21)


def default_namespace() -> str:
    """The namespace the service runs in (its service account says), else ``default``."""
    try:
        with open(NAMESPACE_FILE) as f:
            return f.read().strip() or "default"
    except OSError:
        return "default"


class KubeAPI:
    """``await api.json("create pod x", api.core.create_namespaced_pod, ns, body)``."""

    def __init__(self, api_client: client.ApiClient, retry_s: float,
                 log: logging.Logger | None = None, timeout_s: float = 30,
                 stream_client: client.ApiClient | None = None):
        self.client = api_client
        self.core = client.CoreV1Api(api_client)
        # Watches and followed logs on connections of their own (``STREAM_CONNECTIONS``).
        self.stream_client = stream_client
        self.streams = client.CoreV1Api(stream_client or api_client)
        self.networking = client.NetworkingV1Api(api_client)
        self.retry_s = retry_s
        self.timeout_s = timeout_s
        self.log = log or logging.getLogger("gpushare.kube")
        self.retries = 0  # how many requests were sent again, for tests and the log

    async def close(self) -> None:
        await self.client.close()
        if self.stream_client is not None:
            await self.stream_client.close()

    async def raw(self, what: str, method, *args, retry_s: float | None = None,
                  **kwargs) -> bytes:
        """The answer's body, after retries for ``retry_s`` seconds at most (default: the
        API's ``retry_s``); ``KubeError`` when it stays an error."""
        deadline = time.monotonic() + (self.retry_s if retry_s is None else retry_s)
        refused_since = None
        kwargs.setdefault("_request_timeout", self.timeout_s)
        delay = 0.1
        while True:
            try:
                response = await method(*args, _preload_content=False, **kwargs)
                try:
                    await raise_for_status(response, what)
                    return await response.read()
                finally:
                    response.release()
            except KubeError as e:
                if e.status in REFUSED:
                    refused_since = refused_since or time.monotonic()
                refused_long = refused_since is not None and \
                    time.monotonic() + delay > refused_since + REFUSED_RETRY_S
                if e.status not in RETRIED | REFUSED or refused_long:
                    raise
                error, wait = e, _retry_after(e, delay)
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                error, wait = KubeError(0, "", f"{what}: the Kubernetes API did not answer "
                                        f"({type(e).__name__}: {e})"), delay
            if time.monotonic() + wait > deadline:
                raise error
            self.retries += 1
            self.log.debug("%s failed (%s); again in %.2f s", what, error, wait)
            await asyncio.sleep(wait)
            delay = min(delay * 2, 2.0)

    async def json(self, what: str, method, *args, retry_s: float | None = None, **kwargs):
        body = await self.raw(what, method, *args, retry_s=retry_s, **kwargs)
        return json.loads(body) if body else None


def _retry_after(error: KubeError, delay: float) -> float:
    try:
        return min(max(float(getattr(error, "retry_after", None) or 0), delay), 10.0)
    except ValueError:
        return delay * (1 + random.random())

"""A small JSON client for the Kubernetes REST API, used by the control-plane harness and the
kubelet simulator.

Why not the `kubernetes` package here: its models validate with pydantic and cost a
deserialisation per watch event; a kubelet only needs dicts, and the same paths a real kubelet
uses. Tests still read objects through the official clients (that is what proves the statuses the
simulator writes are valid)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from urllib.parse import urlencode

import urllib3

urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)


class KubeError(Exception):
    """An error status from the API server (``status`` is the HTTP code, ``body`` the Status)."""

    def __init__(self, status: int, body):
        self.status = status
        self.body = body
        message = body.get("message") if isinstance(body, dict) else body
        super().__init__(f"{status}: {message}")


class KubeREST:
    """``KubeREST("https://127.0.0.1:6443", token)``; paths are API paths ("/api/v1/nodes")."""

    def __init__(self, server: str, token: str, timeout: float = 30, connections: int = 16):
        self.server = server.rstrip("/")
        # Loopback with the apiserver's self-signed certificate: no verification, as the
        # harness's kubeconfig does (insecure-skip-tls-verify). ``connections`` kept open:
        # as many as threads send requests at once, or each extra one costs a TLS handshake.
        self.http = urllib3.PoolManager(cert_reqs="CERT_NONE", maxsize=connections,
                                        retries=False)
        self.headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        self.timeout = timeout

    def request(self, method: str, path: str, body=None, *, query: dict | None = None,
                content_type: str = "application/json", timeout: float | None = None):
        url = self.server + path + (f"?{urlencode(query)}" if query else "")
        headers = dict(self.headers)
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode()
        r = self.http.request(method, url, body=data, headers=headers,
                              timeout=timeout or self.timeout)
        text = r.data.decode() if r.data else ""
        try:
            decoded = json.loads(text) if text else None
        except ValueError:
            decoded = text
        if r.status >= 400:
            raise KubeError(r.status, decoded)
        return decoded

    def get(self, path: str, **query):
        return self.request("GET", path, query=query or None)

    def post(self, path: str, body):
        return self.request("POST", path, body)

    def put(self, path: str, body):
        return self.request("PUT", path, body)

    def patch(self, path: str, body, *, strategic: bool = True):
        kind = "strategic-merge-patch" if strategic else "merge-patch"
        return self.request("PATCH", path, body, content_type=f"application/{kind}+json")

    def delete(self, path: str, body=None):
        return self.request("DELETE", path, body)

    def text(self, path: str, **query) -> str:
        """A plain-text subresource such as ``pods/NAME/log``."""
        r = self.http.request("GET", self.server + path + (f"?{urlencode(query)}" if query else ""),
                              headers=self.headers, timeout=self.timeout)
        if r.status >= 400:
            raise KubeError(r.status, r.data.decode(errors="replace"))
        return r.data.decode(errors="replace")

    def watch(self, path: str, resource_version: str, *, timeout_seconds: int = 300,
              **query) -> Iterator[dict]:
        """Yields watch events (``{"type", "object"}``) from ``resource_version`` until the server
        ends the stream; raises KubeError on an ERROR event (410 Gone: list again)."""
        query.update(watch="true", resourceVersion=resource_version,
                     timeoutSeconds=timeout_seconds, allowWatchBookmarks="true")
        url = f"{self.server}{path}?{urlencode(query)}"
        r = self.http.request("GET", url, headers=self.headers, preload_content=False,
                              timeout=urllib3.Timeout(connect=5, read=timeout_seconds + 30))
        try:
            if r.status >= 400:
                raise KubeError(r.status, r.data.decode(errors="replace"))
            buffer = b""
            for chunk in r.stream(4096, decode_content=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if event["type"] == "ERROR":
                        status = event["object"]
                        raise KubeError(status.get("code", 500), status)
                    yield event
        finally:
            r.release_conn()

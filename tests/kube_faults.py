"""A small, honest fault injector for Kubernetes API tests: a plain-HTTP proxy in front of the
real API server that forwards every request (watches and log streams as they come), and on
demand answers chosen requests with an error status, answers everything with 503 while
paused, or cuts the open streams (a dropped watch).

    with FaultProxy(cluster.url) as proxy:
        proxy.kubeconfig(token, path)            # clients talk to the proxy
        proxy.fail(500, times=3, method="POST")  # the next 3 POSTs get a 500
        proxy.drop_streams()                     # every open watch breaks now
        proxy.expire_watches(1)                  # the next watch: 410, list again
        proxy.delay(3, path_contains="/log")     # log requests go on 3 s late
        proxy.asked                              # (method, path) of every request so far

The API server answers a watch from a resourceVersion it no longer keeps with a 200 whose
one line is an ERROR event carrying a 410 Status; ``expire_watches`` answers exactly so (the
real one needs minutes of history to pass before it forgets a version).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import urllib3

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host",
              "accept-encoding", "te", "trailer", "upgrade", "proxy-connection"}
REASONS = {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable",
           422: "Invalid", 403: "Forbidden"}


@dataclass
class _Rule:
    status: int
    times: int
    method: str | None
    path_contains: str | None
    body_contains: bytes | None

    def matches(self, method: str, path: str, body: bytes) -> bool:
        return ((self.method is None or method == self.method)
                and (self.path_contains is None or self.path_contains in path)
                and (self.body_contains is None or self.body_contains in body))


@dataclass
class _Delay:
    seconds: float
    times: int
    method: str | None
    path_contains: str | None

    def matches(self, method: str, path: str) -> bool:
        return ((self.method is None or method == self.method)
                and (self.path_contains is None or self.path_contains in path))


class FaultProxy:
    def __init__(self, upstream: str):
        self.upstream = upstream.rstrip("/")
        self.http = urllib3.PoolManager(cert_reqs="CERT_NONE", maxsize=64, retries=False)
        self.rules: list[_Rule] = []
        self.paused = False
        self.expiring = 0        # watches still to be answered with 410 Gone
        self.delays: list[_Delay] = []
        self.asked: list[tuple[str, str]] = []  # (method, path?query) as they came
        self.injected = 0        # error answers given instead of forwarding
        self.forwarded = 0
        self.lock = threading.Lock()
        self._streams: set = set()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.server.proxy = self
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> "FaultProxy":
        threading.Thread(target=self.server.serve_forever, name="fault-proxy",
                         daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.drop_streams()
        self.server.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def kubeconfig(self, token: str, path: Path) -> Path:
        path.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: proxy\n  cluster:\n    server: {self.url}\n"
            f"users:\n- name: u\n  user:\n    token: {token}\n"
            "contexts:\n- name: proxy\n  context:\n    cluster: proxy\n    user: u\n"
            "current-context: proxy\n")
        return path

    def fail(self, status: int, times: int = 1, *, method: str | None = None,
             path_contains: str | None = None, body_contains: str | None = None) -> None:
        """Answer the next ``times`` matching requests with ``status`` (a Status object)."""
        with self.lock:
            self.rules.append(_Rule(status, times, method, path_contains,
                                    body_contains.encode() if body_contains else None))

    def delay(self, seconds: float, times: int = 1_000_000, *, method: str | None = None,
              path_contains: str | None = None) -> None:
        """Forward the next ``times`` matching requests ``seconds`` late (a slow answer)."""
        with self.lock:
            self.delays.append(_Delay(seconds, times, method, path_contains))

    def expire_watches(self, times: int = 1) -> None:
        with self.lock:
            self.expiring += times

    def open_streams(self, kind: str | None = None) -> int:
        """Open streaming answers: ``watch``es, followed ``log``s, or all."""
        with self.lock:
            return sum(1 for s in self._streams if kind in (None, s[2]))

    def drop_streams(self, kind: str | None = None) -> int:
        """Cut every open streaming answer (of ``kind``: ``watch`` or ``log``; all without),
        as a broken connection would; returns how many."""
        with self.lock:
            streams = {s for s in self._streams if kind in (None, s[2])}
            self._streams -= streams
        # Shut the sockets down, both ways; the threads reading them close them (closing
        # a TLS socket another thread reads from would block).
        for client, upstream, _ in streams:
            for sock in (client, upstream):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        return len(streams)

    def _late(self, method: str, path: str) -> float:
        with self.lock:
            for rule in self.delays:
                if rule.times > 0 and rule.matches(method, path):
                    rule.times -= 1
                    return rule.seconds
        return 0.0

    def _fault(self, method: str, path: str, body: bytes) -> int | None:
        with self.lock:
            self.asked.append((method, path))
            if self.paused:
                self.injected += 1
                return 503
            if self.expiring and "watch=true" in path.lower():
                self.expiring -= 1
                self.injected += 1
                return 410
            for rule in self.rules:
                if rule.times > 0 and rule.matches(method, path, body):
                    rule.times -= 1
                    self.injected += 1
                    return rule.status
            self.forwarded += 1
        return None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        self._proxy()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    def _proxy(self):
        proxy: FaultProxy = self.server.proxy
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        status = proxy._fault(self.command, self.path, body)
        if status == 410 and "watch=true" in self.path.lower():
            event = {"type": "ERROR", "object": {
                "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410,
                "reason": "Expired", "message": "too old resource version (fault proxy)"}}
            payload = json.dumps(event).encode() + b"\n"
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        if status is not None:
            payload = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                  "reason": REASONS.get(status, "Unknown"), "code": status,
                                  "message": "injected by the test's fault proxy"}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            if status == 429:
                self.send_header("Retry-After", "0")
            self.end_headers()
            self.wfile.write(payload)
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        late = proxy._late(self.command, self.path)
        if late:
            time.sleep(late)
        try:
            upstream = proxy.http.request(
                self.command, proxy.upstream + self.path, body=body or None, headers=headers,
                preload_content=False, redirect=False, decode_content=False,
                timeout=urllib3.Timeout(connect=5, read=None))
        except urllib3.exceptions.HTTPError:
            self.close_connection = True
            self.send_error(502)
            return
        query = self.path.lower()
        streaming = "watch=true" in query or "follow=true" in query
        self.send_response(upstream.status)
        for k, v in upstream.headers.items():
            if k.lower() not in HOP_BY_HOP:
                self.send_header(k, v)
        if not streaming:
            data = upstream.read()
            upstream.release_conn()
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        entry = (self.connection, upstream.connection.sock,
                 "watch" if "watch=true" in query else "log")
        with proxy.lock:
            proxy._streams.add(entry)
        try:
            for chunk in upstream.stream(65536, decode_content=False):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            upstream.release_conn()
        except (OSError, urllib3.exceptions.HTTPError, ValueError, AttributeError):
            self.close_connection = True
            upstream.close()  # a cut stream's connection is not used again
        finally:
            with proxy.lock:
                proxy._streams.discard(entry)

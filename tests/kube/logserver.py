"""The kubelet's HTTPS endpoint, as far as the API server needs it for pod logs:
``GET /containerLogs/{namespace}/{pod}/{container}?follow=&tailLines=&limitBytes=&previous=``.
Every simulated node reports this one server (127.0.0.1, one port) as its kubelet endpoint, so
``kubectl logs`` and ``read_namespaced_pod_log`` go API server → here, over TLS the API server
verifies (--kubelet-certificate-authority)."""

from __future__ import annotations

import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit


def _tail(data: bytes, lines: int) -> bytes:
    if lines <= 0:
        return b""
    parts = data.splitlines(keepends=True)
    return b"".join(parts[-lines:])


class _Server(ThreadingHTTPServer):
    request_queue_size = 1024  # as a Go server's (somaxconn), not socketserver's 5


class LogServer:
    """``find(namespace, pod, container, previous)`` returns ``(path, is_running)`` or None."""

    def __init__(self, cert: Path, key: Path, find):
        self.find = find
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):      # quiet: tests read logs, not access lines
                pass

            def do_GET(self):
                server.handle(self)

        self.httpd = _Server(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(cert), str(key))
        # The handshake in each connection's own thread, not in the one that accepts: with
        # hundreds of followed logs a second, accepting behind handshakes overflowed the
        # queue of waiting connections, and the API server's were dropped and retried a
        # second later (a real kubelet, in Go, handshakes in each connection's goroutine).
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True,
                                            do_handshake_on_connect=False)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="kubelet-logs",
                                       daemon=True)

    def start(self):
        self.thread.start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def handle(self, req: BaseHTTPRequestHandler):
        url = urlsplit(req.path)
        parts = [unquote(p) for p in url.path.split("/") if p]
        if len(parts) != 4 or parts[0] != "containerLogs":
            return self._error(req, 404, f"the kubelet simulator serves only containerLogs, not {url.path}")
        q = {k: v[-1] for k, v in parse_qs(url.query).items()}
        previous = q.get("previous") == "true"
        found = self.find(parts[1], parts[2], parts[3], previous)
        if found is None:
            return self._error(req, 404, f"container {parts[3]} of pod {parts[1]}/{parts[2]} "
                                         "is not on this node" + (" (no previous run)" if previous else ""))
        path, running = found
        try:
            data = path.read_bytes()
        except OSError:
            data = b""
        if "tailLines" in q:
            data = _tail(data, int(q["tailLines"]))
        limit = int(q["limitBytes"]) if "limitBytes" in q else None
        if limit is not None:
            data = data[:limit]
        try:
            req.send_response(200)
            req.send_header("Content-Type", "text/plain")
            req.end_headers()             # HTTP/1.0: the body ends when the connection closes
            req.wfile.write(data)
            if q.get("follow") == "true" and not previous:
                self._follow(req, parts, path, path.stat().st_size if path.exists() else 0,
                             running, limit - len(data) if limit is not None else None)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            pass                          # the API server hung up (its client went away)

    def _follow(self, req, parts, path: Path, offset: int, running: bool, budget):
        while running and (budget is None or budget > 0):
            time.sleep(0.2)
            found = self.find(parts[1], parts[2], parts[3], False)
            running = bool(found and found[1])
            with open(path, "rb") as f:
                f.seek(offset)
                chunk = f.read() if budget is None else f.read(budget)
            if chunk:
                offset += len(chunk)
                budget = None if budget is None else budget - len(chunk)
                req.wfile.write(chunk)
                req.wfile.flush()

    @staticmethod
    def _error(req, code: int, message: str):
        body = message.encode()
        req.send_response(code)
        req.send_header("Content-Type", "text/plain")
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)

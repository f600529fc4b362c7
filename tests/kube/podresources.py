"""The kubelet's pod-resources API as the simulator serves it: which devices each container
got, over gRPC on a unix socket per node (``PodResourcesLister.List``, v1 and v1alpha1), as
a real kubelet serves ``/var/lib/kubelet/pod-resources/kubelet.sock``.

``encode_list`` writes a ``ListPodResourcesResponse`` in protobuf's wire format (the field
numbers of k8s.io/kubelet/pkg/apis/podresources/v1; tests/test_agent.py checks it against the
protobuf library itself); ``PodResourcesServer`` answers with what ``pods()`` returns."""

from __future__ import annotations

import os
from concurrent import futures
from pathlib import Path
from typing import Callable

# The simulator forks containers while its gRPC servers run; their exec follows at once, so
# gRPC's fork handlers (and their warning on every fork) are not needed.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

Pods = list[tuple[str, str, list[tuple[str, dict[str, list[str]]]]]]
"""``[(namespace, name, [(container, {resource: [device ids]})])]``"""


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _text(number: int, text: str) -> bytes:
    return _field(number, text.encode()) if text else b""


def encode_list(pods: Pods) -> bytes:
    out = b""
    for namespace, name, containers in pods:
        pod = _text(1, name) + _text(2, namespace)
        for container, devices in containers:
            body = _text(1, container)
            for resource, ids in devices.items():
                body += _field(2, _text(1, resource) + b"".join(_field(2, i.encode())
                                                                 for i in ids))
            pod += _field(3, body)
        out += _field(1, pod)
    return out


class PodResourcesServer:
    """One node's socket at ``path``; ``pods()`` gives the answer (a ``Pods`` list)."""

    def __init__(self, path: Path, pods: Callable[[], Pods]):
        import grpc

        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))

        def answer(request: bytes, context) -> bytes:
            return encode_list(pods())

        handler = grpc.unary_unary_rpc_method_handler(answer)  # raw bytes both ways
        for package in ("v1", "v1alpha1"):
            self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
                f"{package}.PodResourcesLister", {"List": handler}),))
        self.server.add_insecure_port(f"unix://{self.path}")
        self.server.start()

    def stop(self):
        self.server.stop(0)
        self.path.unlink(missing_ok=True)

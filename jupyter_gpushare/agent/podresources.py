"""Which devices the kubelet gave each container of this node: its pod-resources API.

The kubelet serves ``PodResourcesLister.List`` (gRPC) on a unix socket,
``/var/lib/kubelet/pod-resources/kubelet.sock``: for every pod on the node, its containers and
the device IDs each got from each device plugin. NVIDIA's device plugin names a GPU by its
UUID (``GPU-…``), a time-sliced replica by the UUID and a replica number (``GPU-…::2``), a
MIG instance by its MIG UUID. This is how the agent knows which GPU a pod *holds*, even while
no process of it runs there (an idle job holds its GPUs all the same).

The messages are four small protobuf types (``k8s.io/kubelet/pkg/apis/podresources/v1``,
the same field numbers in ``v1alpha1``)::

    ListPodResourcesResponse { repeated PodResources pod_resources = 1; }
    PodResources             { string name = 1; string namespace = 2;
                               repeated ContainerResources containers = 3; }
    ContainerResources       { string name = 1; repeated ContainerDevices devices = 2; }
    ContainerDevices         { string resource_name = 1; repeated string device_ids = 2; }

``decode_list`` reads them (pure; fields it does not know, like ``cpu_ids`` or ``memory``, are
skipped as protobuf says), so the agent needs grpcio but no generated code. ``PodResources``
asks the socket (grpcio, imported when first used).
"""

from __future__ import annotations

from dataclasses import dataclass

METHODS = ("/v1.PodResourcesLister/List", "/v1alpha1.PodResourcesLister/List")
DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
MAX_MESSAGE = 16 * 2**20


@dataclass(frozen=True, slots=True)
class PodDevices:
    """One pod's devices: ``devices`` maps a resource name (``nvidia.com/gpu``) to the device
    IDs of all its containers."""

    namespace: str
    name: str
    devices: dict[str, tuple[str, ...]]


class PodResourcesError(Exception):
    """The socket cannot be asked, or its answer cannot be read: one sentence."""


# -- protobuf wire format (what these messages use: varints and length-delimited fields) ----

def _varint(data: bytes, i: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if i >= len(data) or shift > 63:
            raise PodResourcesError("The kubelet's pod-resources answer is cut short")
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i
        shift += 7


def _fields(data: bytes):
    """``(field number, value)`` for each field: bytes for length-delimited fields, an int for
    varints; 32- and 64-bit fields are skipped."""
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
            yield number, value
        elif wire == 2:
            length, i = _varint(data, i)
            if i + length > len(data):
                raise PodResourcesError("The kubelet's pod-resources answer is cut short")
            yield number, data[i:i + length]
            i += length
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise PodResourcesError(f"The kubelet's pod-resources answer has a field of wire "
                                    f"type {wire}, which these messages never use")


def _text(value) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else ""


def decode_list(data: bytes) -> list[PodDevices]:
    """A ``ListPodResourcesResponse`` (its bytes) as one ``PodDevices`` per pod."""
    pods = []
    for number, pod in _fields(data):
        if number != 1 or not isinstance(pod, bytes):
            continue
        name = namespace = ""
        devices: dict[str, list[str]] = {}
        for field, value in _fields(pod):
            if field == 1:
                name = _text(value)
            elif field == 2:
                namespace = _text(value)
            elif field == 3 and isinstance(value, bytes):
                for cfield, cvalue in _fields(value):
                    if cfield != 2 or not isinstance(cvalue, bytes):
                        continue
                    resource, ids = "", []
                    for dfield, dvalue in _fields(cvalue):
                        if dfield == 1:
                            resource = _text(dvalue)
                        elif dfield == 2:
                            ids.append(_text(dvalue))
                    devices.setdefault(resource, []).extend(ids)
        pods.append(PodDevices(namespace, name, {r: tuple(ids) for r, ids in devices.items()}))
    return pods


# -- the socket -----------------------------------------------------------------------------

class PodResources:
    """The kubelet's pod-resources socket at ``path``. ``list()`` blocks (call it in a worker
    thread) and raises ``PodResourcesError`` with a sentence."""

    def __init__(self, path: str = DEFAULT_SOCKET, timeout: float = 10.0):
        self.path, self.timeout = path, timeout
        self._channel = None
        self._method = None

    def list(self) -> list[PodDevices]:
        try:
            import grpc
        except ImportError:
            raise PodResourcesError(
                "The grpcio package is not installed, so the kubelet cannot be asked which "
                "GPUs each pod holds; install jupyter-gpushare[agent]") from None
        if self._channel is None:
            self._channel = grpc.insecure_channel(
                f"unix://{self.path}", options=[("grpc.max_receive_message_length", MAX_MESSAGE)])
        methods = [self._method] if self._method else list(METHODS)
        for i, method in enumerate(methods):
            call = self._channel.unary_unary(method)  # bytes in, bytes out: no generated code
            try:
                answer = call(b"", timeout=self.timeout)
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                if code == grpc.StatusCode.UNIMPLEMENTED and i + 1 < len(methods):
                    continue  # a kubelet older than 1.20 has only v1alpha1
                self.close()
                raise PodResourcesError(
                    f"The kubelet's pod-resources socket {self.path} did not answer "
                    f"({_code(exc)}); mount /var/lib/kubelet/pod-resources into the agent "
                    f"and run it as root") from None
            self._method = method
            return decode_list(answer)
        raise PodResourcesError(f"The kubelet at {self.path} serves no pod-resources List")

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None


def _code(exc) -> str:
    try:
        details = exc.details() or ""
        return f"{exc.code().name}: {details}"[:200] if details else exc.code().name
    except Exception:  # noqa: BLE001 - a sentence, whatever the error looks like
        return type(exc).__name__

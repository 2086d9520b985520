"""Which pod holds which GPU: the kubelet pod-resources API (gRPC v1 ``List`` on a unix socket).

The kubelet serves it on ``/var/lib/kubelet/pod-resources/kubelet.sock``; the exporter mounts
that folder read-only. GPU resources are ``nvidia.com/gpu`` and its variants
(``nvidia.com/gpu.shared`` for time-sliced GPUs, whose device ids carry a ``::<replica>``
suffix) and the MIG resources ``nvidia.com/mig-<profile>`` (device ids are MIG UUIDs). For
whole GPUs the device ids are GPU UUIDs, as NVML reports them.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # gRPC itself is loaded only when the kubelet socket is used
    import grpc

log = logging.getLogger(__name__)

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
# A hostile or broken kubelet answer never grows memory without bound.
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
MAX_ASSIGNMENTS = 4096


class PodResourcesUnavailable(Exception):
    """No pod-resources socket on this node (not a Kubernetes node, or not mounted)."""


class PodResourcesError(Exception):
    """The socket exists but the List call failed (kubelet restarting, permissions, ...)."""


@dataclass(frozen=True)
class GpuAssignment:
    """One GPU (or MIG instance) assigned to one container."""

    device_id: str  # GPU UUID (time-slicing replica suffix removed) or MIG UUID
    resource: str
    namespace: str
    pod: str
    container: str


def is_gpu_resource(resource_name: str) -> bool:
    return (
        resource_name == GPU_RESOURCE
        or resource_name.startswith(GPU_RESOURCE + ".")
        or resource_name.startswith(MIG_RESOURCE_PREFIX)
    )


def gpu_device_id(device_id: str) -> str:
    """``GPU-1234::3`` (a time-sliced replica) → ``GPU-1234``; other ids unchanged."""
    return device_id.split("::", 1)[0]


def assignments_from_response(response: object) -> list[GpuAssignment]:
    """GPU assignments in a ``ListPodResourcesResponse``, sorted, duplicates removed."""
    found: set[GpuAssignment] = set()
    for pod in getattr(response, "pod_resources", ()):
        for container in pod.containers:
            for devices in container.devices:
                if not is_gpu_resource(devices.resource_name):
                    continue
                for device_id in devices.device_ids:
                    if len(found) >= MAX_ASSIGNMENTS:
                        log.warning("pod-resources answer has over %d GPU assignments; rest ignored", MAX_ASSIGNMENTS)
                        return sorted(found, key=_order)
                    found.add(
                        GpuAssignment(
                            device_id=gpu_device_id(device_id),
                            resource=devices.resource_name,
                            namespace=pod.namespace,
                            pod=pod.name,
                            container=container.name,
                        )
                    )
    return sorted(found, key=_order)


def _order(a: GpuAssignment) -> tuple[str, str, str, str]:
    return (a.device_id, a.namespace, a.pod, a.container)


class PodResourcesClient:
    """A long-lived channel to the kubelet socket; ``list_gpus`` is safe from any thread."""

    def __init__(self, socket_path: Path = DEFAULT_SOCKET, timeout_seconds: float = 3.0) -> None:
        self._socket = socket_path
        self._timeout = timeout_seconds
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._stub: object | None = None

    @property
    def socket_path(self) -> Path:
        return self._socket

    def _connect(self) -> object:
        import grpc

        from exporter.sources.podresources_v1 import api_pb2_grpc

        if self._stub is None:
            self._channel = grpc.insecure_channel(
                f"unix://{self._socket}",
                options=[("grpc.max_receive_message_length", MAX_RESPONSE_BYTES)],
            )
            self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
        return self._stub

    def list_gpus(self) -> list[GpuAssignment]:
        """Every GPU assignment on the node; raises PodResourcesUnavailable / PodResourcesError.

        gRPC is loaded only once the socket exists: a node without one pays nothing for asking."""
        if not self._socket.exists():
            self.close()
            raise PodResourcesUnavailable(f"no kubelet pod-resources socket at {self._socket}")
        import grpc

        from exporter.sources.podresources_v1 import api_pb2

        with self._lock:
            stub = self._connect()
            try:
                response = stub.List(api_pb2.ListPodResourcesRequest(), timeout=self._timeout)  # type: ignore[attr-defined]
            except grpc.RpcError as exc:
                self._close_locked()  # a restarted kubelet makes a new socket: reconnect next time
                code = exc.code() if hasattr(exc, "code") else None
                details = exc.details() if hasattr(exc, "details") else str(exc)
                raise PodResourcesError(f"pod-resources List on {self._socket} failed: {code}: {details}") from exc
        return assignments_from_response(response)

    def _close_locked(self) -> None:
        channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            channel.close()

    def close(self) -> None:
        with self._lock:
            self._close_locked()


def gpus_held_by_pods(socket_path: Path = DEFAULT_SOCKET, timeout_seconds: float = 3.0) -> set[str] | None:
    """Device ids (GPU or MIG UUIDs) that pods hold; None when the API cannot be asked.

    For the probe scheduler: a GPU in this set belongs to a workload and must not be probed.
    None (no socket, or the call failed) means "unknown", which a careful caller treats as busy.
    """
    client = PodResourcesClient(socket_path, timeout_seconds)
    try:
        return {a.device_id for a in client.list_gpus()}
    except (PodResourcesUnavailable, PodResourcesError) as exc:
        log.info("cannot tell which GPUs pods hold: %s", exc)
        return None
    finally:
        client.close()

"""Which pod holds which device: the kubelet pod-resources API (gRPC v1 ``List`` on a unix socket).

The kubelet serves it on ``/var/lib/kubelet/pod-resources/kubelet.sock``; the exporter mounts
that folder read-only. One ``List`` answers for both ways devices reach containers:

- device plugins (``ContainerDevices``): GPU resources are ``nvidia.com/gpu`` and its variants
  (``nvidia.com/gpu.shared`` for time-sliced GPUs, whose device ids carry a ``::<replica>``
  suffix) and the MIG resources ``nvidia.com/mig-<profile>`` (device ids are MIG UUIDs); for
  whole GPUs the device ids are GPU UUIDs, as NVML reports them. Every other resource (SR-IOV
  VFs, ``nvidia.com/hostdev``, RDMA shared devices, ...) is kept as a ``DeviceAssignment``;
- Dynamic Resource Allocation (``DynamicResource``, Kubernetes 1.34+): each allocated device of
  a claim as driver / pool / device name (and its CDI device names). Devices of NVIDIA's GPU
  driver (``gpu.nvidia.com``, named ``gpu-<minor>``) count as GPUs; the rest are kept as
  ``DynamicAssignment``.

Whether a device is an RDMA NIC, and which, is the topology's to say (its PCI address or
name), not this module's.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # gRPC itself is loaded only when the kubelet socket is used
    import grpc

log = logging.getLogger(__name__)

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
# DRA drivers whose devices are GPUs (NVIDIA's k8s-dra-driver-gpu names them gpu-<minor>).
DRA_GPU_DRIVERS = frozenset({"gpu.nvidia.com"})
# Where an assignment comes from (the ``source`` label).
SOURCE_DEVICE_PLUGIN = "device_plugin"
SOURCE_DRA = "dra"
# A hostile or broken kubelet answer never grows memory without bound.
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
MAX_ASSIGNMENTS = 4096
MAX_NAME_CHARS = 253


class PodResourcesUnavailable(Exception):
    """No pod-resources socket on this node (not a Kubernetes node, or not mounted)."""


class PodResourcesError(Exception):
    """The socket exists but the List call failed (kubelet restarting, permissions, ...)."""


@dataclass(frozen=True)
class GpuAssignment:
    """One GPU (or MIG instance) assigned to one container."""

    # GPU UUID (time-slicing replica suffix removed) or MIG UUID; for a DRA GPU its device name
    # (gpu-<minor>), which the collector turns into the UUID through NVML
    device_id: str
    resource: str  # the extended resource, or the DRA driver
    namespace: str
    pod: str
    container: str
    source: str = SOURCE_DEVICE_PLUGIN


@dataclass(frozen=True)
class DeviceAssignment:
    """One device of a device plugin's resource other than a GPU (an SR-IOV VF, a host device, ...)."""

    resource: str
    device_id: str  # what the plugin calls it: a PCI address for SR-IOV, an index for RDMA shared devices
    namespace: str
    pod: str
    container: str


@dataclass(frozen=True)
class DynamicAssignment:
    """One device a DRA claim gave a container (other than a GPU)."""

    driver: str
    pool: str
    device: str
    cdi_devices: tuple[str, ...]
    claim: str  # <claim namespace>/<claim name>
    namespace: str
    pod: str
    container: str


@dataclass(frozen=True)
class PodResourcesListing:
    """One ``List`` answer, sorted, duplicates removed."""

    gpus: tuple[GpuAssignment, ...] = ()
    devices: tuple[DeviceAssignment, ...] = ()
    dynamic: tuple[DynamicAssignment, ...] = ()
    truncated: bool = False  # over MAX_ASSIGNMENTS: the rest was ignored


def is_gpu_resource(resource_name: str) -> bool:
    return (
        resource_name == GPU_RESOURCE
        or resource_name.startswith(GPU_RESOURCE + ".")
        or resource_name.startswith(MIG_RESOURCE_PREFIX)
    )


def gpu_device_id(device_id: str) -> str:
    """``GPU-1234::3`` (a time-sliced replica) → ``GPU-1234``; other ids unchanged."""
    return device_id.split("::", 1)[0]


@dataclass
class _Collected:
    gpus: set[GpuAssignment] = field(default_factory=set)
    devices: set[DeviceAssignment] = field(default_factory=set)
    dynamic: set[DynamicAssignment] = field(default_factory=set)

    def full(self) -> bool:
        return len(self.gpus) + len(self.devices) + len(self.dynamic) >= MAX_ASSIGNMENTS


def _name(value: object) -> str:
    return str(value)[:MAX_NAME_CHARS]


def listing_from_response(response: object) -> PodResourcesListing:
    """Every assignment in a ``ListPodResourcesResponse`` (device plugins and DRA)."""
    found = _Collected()
    truncated = False
    for pod in getattr(response, "pod_resources", ()):
        for container in pod.containers:
            where = (_name(pod.namespace), _name(pod.name), _name(container.name))
            if not _add_devices(found, container, where) or not _add_dynamic(found, container, where):
                truncated = True
                break
        if truncated:
            log.warning("pod-resources answer has over %d assignments; rest ignored", MAX_ASSIGNMENTS)
            break
    return PodResourcesListing(
        gpus=tuple(sorted(found.gpus, key=_order)),
        devices=tuple(sorted(found.devices, key=lambda d: (d.namespace, d.pod, d.container, d.resource, d.device_id))),
        dynamic=tuple(sorted(found.dynamic, key=lambda d: (d.namespace, d.pod, d.container, d.driver, d.device))),
        truncated=truncated,
    )


def _add_devices(found: _Collected, container: object, where: tuple[str, str, str]) -> bool:
    namespace, pod, name = where
    for devices in getattr(container, "devices", ()):
        resource = _name(devices.resource_name)
        for device_id in devices.device_ids:
            if found.full():
                return False
            if is_gpu_resource(resource):
                found.gpus.add(GpuAssignment(gpu_device_id(_name(device_id)), resource, namespace, pod, name))
            else:
                found.devices.add(DeviceAssignment(resource, _name(device_id), namespace, pod, name))
    return True


def _add_dynamic(found: _Collected, container: object, where: tuple[str, str, str]) -> bool:
    namespace, pod, name = where
    for claim in getattr(container, "dynamic_resources", ()):
        claim_name = f"{_name(claim.claim_namespace)}/{_name(claim.claim_name)}"
        for resource in claim.claim_resources:
            if found.full():
                return False
            driver, device = _name(resource.driver_name), _name(resource.device_name)
            if not device:
                continue  # a DRA resource that is not a device (the API leaves device_name empty)
            if driver in DRA_GPU_DRIVERS:
                found.gpus.add(GpuAssignment(device, driver, namespace, pod, name, SOURCE_DRA))
                continue
            cdi = tuple(_name(c.name) for c in list(resource.cdi_devices)[:8])
            found.dynamic.add(
                DynamicAssignment(driver, _name(resource.pool_name), device, cdi, claim_name, namespace, pod, name)
            )
    return True


def _order(a: GpuAssignment) -> tuple[str, str, str, str, str]:
    return (a.device_id, a.namespace, a.pod, a.container, a.source)


class PodResourcesClient:
    """A long-lived channel to the kubelet socket; ``listing`` and ``list_gpus`` are safe from any thread."""

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
        """Every GPU assignment on the node; raises PodResourcesUnavailable / PodResourcesError."""
        return list(self.listing().gpus)

    def listing(self) -> PodResourcesListing:
        """Every assignment on the node; raises PodResourcesUnavailable / PodResourcesError.

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
        return listing_from_response(response)

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

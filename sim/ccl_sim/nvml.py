"""Simulated NVML for ``python -m ccl_sim serve``: 8 H200-class GPUs with 18 NVLinks each.

``SimNvml`` is both a ``SimPart`` (its counters advance with the simulated job) and an
``NvmlBackend`` (the NVML and pod-resources collectors read it in place of pynvml). The GPUs
are held by one simulated training pod by default; ``release`` makes them idle (no traffic,
no compute processes, no pod-resources assignment) and ``assign`` hands them to a pod again,
so the probe scheduler can be tried on "GPUs busy" and "GPUs idle".

``SimPodResources`` serves the kubelet pod-resources API for real: a gRPC server on
``<simroot>/pod-resources/kubelet.sock`` answering ``List`` from ``SimNvml``'s assignments; a
container holding GPUs also holds the devices ``nic_devices`` gives it (the training pod: the
eight compute NICs through ``nvidia.com/hostdev``, by PCI address, as the SR-IOV/host-device
plugin names them).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterable
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from ccl_sim.clock import SimClock
from ccl_sim.paths import simulated_paths
from exporter.sources.nvml import (
    GpuIdentity,
    GpuProcess,
    GpuReading,
    NvLinkReading,
    NvLinkRemote,
    NvmlReading,
)
from exporter.sources.podresources import GPU_RESOURCE, GpuAssignment
from exporter.sources.podresources_v1 import api_pb2, api_pb2_grpc

GPU_NAME = "NVIDIA H200"
LINK_SPEED_BYTES_PER_SECOND = 26_562_000_000  # NVLink4: 26.562 GB/s per direction per link
GPU_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
NVSWITCH_BUSES = (0x05, 0x06, 0x07, 0x08)
CRC_DATA_LINKS = 12  # NVML has per-link CRC data field ids for links 0-11 only

# The simulated training pod that holds every GPU at start.
TRAINING_NAMESPACE = "ml-training"
TRAINING_POD = "llama-70b-worker-0"
TRAINING_CONTAINER = "trainer"


@dataclass(frozen=True)
class PodSlot:
    namespace: str
    pod: str
    container: str


@dataclass
class _SimLink:
    transmit_bytes: int = 0
    receive_bytes: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    active: bool = True


def _bus_id(bus: int) -> str:
    return f"00000000:{bus:02X}:00.0"


def sim_gpu_uuid(index: int) -> str:
    return f"GPU-5e1a0000-0000-4000-8000-{index:012d}"


class SimNvml:
    def __init__(self, rng: random.Random, gpu_count: int = 8, link_count: int = 18) -> None:
        self._rng = rng
        self._lock = threading.Lock()
        self._gpus = [
            GpuIdentity(
                i, sim_gpu_uuid(i), GPU_NAME, _bus_id(GPU_BUSES[i % len(GPU_BUSES)] + 0x100 * (i // 8)), minor=i
            )
            for i in range(gpu_count)
        ]
        self._links = {
            (g, link): _SimLink(errors=dict.fromkeys(self._error_kinds(link), 0))
            for g in range(gpu_count)
            for link in range(link_count)
        }
        self._link_count = link_count
        training = PodSlot(TRAINING_NAMESPACE, TRAINING_POD, TRAINING_CONTAINER)
        self._holders: dict[str, PodSlot] = {gpu.uuid: training for gpu in self._gpus}

    @staticmethod
    def _error_kinds(link: int) -> tuple[str, ...]:
        if link < CRC_DATA_LINKS:
            return ("crc_flit", "crc_data", "replay", "recovery")
        return ("crc_flit", "replay", "recovery")

    # SimPart
    def setup(self, root: Path) -> None:
        """Nothing on disk: NVML is a library, not a file tree."""

    def advance(self, clock: SimClock) -> None:
        with self._lock:
            for (g, _link), state in self._links.items():
                if not state.active or self._gpus[g].uuid not in self._holders:
                    continue
                load = clock.job_activity * self._rng.uniform(0.8, 0.95)
                sent = int(LINK_SPEED_BYTES_PER_SECOND * load * clock.step_seconds) // 1024 * 1024
                state.transmit_bytes += sent
                state.receive_bytes += int(sent * self._rng.uniform(0.98, 1.0)) // 1024 * 1024
                if self._rng.random() < 0.0005 * clock.step_seconds:
                    state.errors["replay"] += 1
                if self._rng.random() < 0.0001 * clock.step_seconds:
                    state.errors["crc_flit"] += 1

    # NvmlBackend
    def read(self) -> NvmlReading:
        with self._lock:
            return NvmlReading(gpus=[self._reading(gpu) for gpu in self._gpus])

    def _reading(self, gpu: GpuIdentity) -> GpuReading:
        links = []
        for link in range(self._link_count):
            state = self._links[(gpu.index, link)]
            links.append(
                NvLinkReading(
                    link=link,
                    active=state.active,
                    speed_bytes_per_second=LINK_SPEED_BYTES_PER_SECOND if state.active else 0,
                    transmit_bytes=state.transmit_bytes,
                    receive_bytes=state.receive_bytes,
                    errors=dict(state.errors),
                    remote=NvLinkRemote("nvswitch", _bus_id(NVSWITCH_BUSES[link % len(NVSWITCH_BUSES)]))
                    if state.active
                    else None,
                )
            )
        return GpuReading(gpu, tuple(links))

    def gpus(self) -> list[GpuIdentity]:
        return list(self._gpus)

    def compute_processes(self) -> dict[str, list[GpuProcess]]:
        with self._lock:
            return {
                gpu.uuid: [GpuProcess(pid=31000 + gpu.index, used_memory_bytes=120 << 30)]
                if gpu.uuid in self._holders
                else []
                for gpu in self._gpus
            }

    def close(self) -> None:
        """Nothing to release."""

    # Controls for demos and tests.
    def set_link_active(self, gpu: int, link: int, active: bool) -> None:
        with self._lock:
            self._links[(gpu, link)].active = active

    def assign(self, namespace: str, pod: str, container: str, uuids: Iterable[str] | None = None) -> None:
        """Hand GPUs (default: all) to a pod's container."""
        slot = PodSlot(namespace, pod, container)
        with self._lock:
            for uuid in self._select(uuids):
                self._holders[uuid] = slot

    def release(self, uuids: Iterable[str] | None = None) -> None:
        """Free GPUs (default: all): no pod holds them, nothing runs on them."""
        with self._lock:
            for uuid in self._select(uuids):
                self._holders.pop(uuid, None)

    def _select(self, uuids: Iterable[str] | None) -> list[str]:
        known = [gpu.uuid for gpu in self._gpus]
        if uuids is None:
            return known
        wanted = set(uuids)
        unknown = wanted - set(known)
        if unknown:
            raise KeyError(f"no simulated GPU {sorted(unknown)}")
        return [u for u in known if u in wanted]

    def assignments(self) -> list[GpuAssignment]:
        with self._lock:
            return [
                GpuAssignment(uuid, GPU_RESOURCE, slot.namespace, slot.pod, slot.container)
                for uuid, slot in self._holders.items()
            ]


HOSTDEV_RESOURCE = "nvidia.com/hostdev"


def rail_nics() -> list[tuple[str, str]]:
    """(RDMA device, PCI address) of the compute NIC beside each GPU: mlx5_i at the bus after GPU
    i's, below the same PCIe switch (``ccl_sim.topology`` lays the tree out)."""
    return [(f"mlx5_{i}", f"0000:{bus + 1:02x}:00.0") for i, bus in enumerate(GPU_BUSES)]


def training_nic_devices() -> dict[tuple[str, str, str], dict[str, list[str]]]:
    """The training pod's compute NICs, by PCI address."""
    addresses = [address for _, address in rail_nics()]
    return {(TRAINING_NAMESPACE, TRAINING_POD, TRAINING_CONTAINER): {HOSTDEV_RESOURCE: addresses}}


class SimPodResources:
    """The kubelet pod-resources API of the simulated node, over a real unix-socket gRPC server."""

    def __init__(
        self, nvml: SimNvml, nic_devices: dict[tuple[str, str, str], dict[str, list[str]]] | None = None
    ) -> None:
        self._nvml = nvml
        self.nic_devices = training_nic_devices() if nic_devices is None else nic_devices
        self._server: grpc.Server | None = None
        self.socket_path: Path | None = None

    def setup(self, root: Path) -> None:
        self.socket_path = simulated_paths(root).pod_resources
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="sim-podresources"))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(_SimLister(self._nvml, self.nic_devices), server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        server.start()
        self._server = server

    def advance(self, clock: SimClock) -> None:
        """The answer is computed per request from the simulated NVML's assignments."""

    def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace=None).wait(5)


class _SimLister(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, nvml: SimNvml, nic_devices: dict[tuple[str, str, str], dict[str, list[str]]]) -> None:
        self._nvml = nvml
        self._nic_devices = nic_devices

    def List(  # noqa: N802 - the gRPC method's name
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListPodResourcesResponse:
        by_container: dict[tuple[str, str, str], list[str]] = {}
        for a in self._nvml.assignments():
            by_container.setdefault((a.namespace, a.pod, a.container), []).append(a.device_id)
        pods: dict[tuple[str, str], list[api_pb2.ContainerResources]] = {}
        for (namespace, pod, container), uuids in sorted(by_container.items()):
            devices = [api_pb2.ContainerDevices(resource_name=GPU_RESOURCE, device_ids=uuids)]
            for resource, ids in self._nic_devices.get((namespace, pod, container), {}).items():
                devices.append(api_pb2.ContainerDevices(resource_name=resource, device_ids=ids))
            pods.setdefault((namespace, pod), []).append(api_pb2.ContainerResources(name=container, devices=devices))
        return api_pb2.ListPodResourcesResponse(
            pod_resources=[
                api_pb2.PodResources(name=pod, namespace=namespace, containers=containers)
                for (namespace, pod), containers in pods.items()
            ]
        )

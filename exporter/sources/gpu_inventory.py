"""How many GPUs this node has and which pod holds how many: what a log cannot say about placement.

A communicator with more ranks than the GPUs of one node (or than the GPUs the job's pods hold on
this node) spans nodes: NCCL refuses two ranks of one communicator on one GPU. The NCCL
collector uses this to answer "which nodes" where the log leaves it open.

``GpuInventorySource.read`` combines NVML (the node's GPU count) and the kubelet pod-resources API
(GPUs per pod), keeps the answer ``max_age_seconds`` (the pod-resources call is a gRPC round
trip) and never raises: what cannot be read is None or empty, never a guess.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from exporter.sources.nvml import NvmlBackend
from exporter.sources.podresources import MIG_RESOURCE_PREFIX, PodResourcesClient, gpu_device_id

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuInventory:
    total: int | None = None  # GPUs on this node (NVML); None when NVML cannot be read
    by_pod: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (namespace, pod) -> distinct GPUs held

    def held(self, pods: list[tuple[str, str]]) -> int:
        """Distinct GPUs the given pods hold on this node (0 when pod-resources says nothing of them)."""
        return sum(self.by_pod.get(pod, 0) for pod in pods)


class GpuInventorySource:
    def __init__(
        self,
        nvml: NvmlBackend | None,
        pod_resources: PodResourcesClient | None,
        *,
        max_age_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml = nvml
        self._pod_resources = pod_resources
        self._max_age = max_age_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._cached: tuple[float, GpuInventory] | None = None
        self._failing: set[str] = set()  # sources whose failure was already logged

    def read(self) -> GpuInventory:
        now = self._clock()
        with self._lock:
            if self._cached is not None and now - self._cached[0] < self._max_age:
                return self._cached[1]
            by_pod, mig = self._count_by_pod()
            # MIG instances are devices of their own: the node's GPU count no longer bounds ranks.
            inventory = GpuInventory(None if mig else self._count_gpus(), by_pod)
            self._cached = (now, inventory)
            return inventory

    def _failed(self, what: str, exc: BaseException) -> None:
        if what not in self._failing:
            self._failing.add(what)
            log.info("GPU inventory: %s not readable (%s); communicator sizes are not compared with it", what, exc)

    def _count_gpus(self) -> int | None:
        if self._nvml is None:
            return None
        try:
            count = len(self._nvml.gpus())
        except Exception as exc:  # noqa: BLE001 - NVML errors of any kind: unknown, not zero
            self._failed("NVML", exc)
            return None
        self._failing.discard("NVML")
        return count or None

    def _count_by_pod(self) -> tuple[dict[tuple[str, str], int], bool]:
        """Distinct GPUs per pod, and whether any pod holds a MIG instance."""
        if self._pod_resources is None:
            return {}, False
        try:
            assignments = self._pod_resources.list_gpus()
        except Exception as exc:  # noqa: BLE001 - socket absent, kubelet restarting: nothing known
            self._failed("pod-resources", exc)
            return {}, False
        self._failing.discard("pod-resources")
        devices: dict[tuple[str, str], set[str]] = {}
        for a in assignments:
            devices.setdefault((a.namespace, a.pod), set()).add(gpu_device_id(a.device_id))
        mig = any(a.resource.startswith(MIG_RESOURCE_PREFIX) for a in assignments)
        return {pod: len(ids) for pod, ids in devices.items()}, mig

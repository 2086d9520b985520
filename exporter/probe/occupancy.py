"""Is anything using this node's GPUs? The scheduler's occupancy checks.

* ``PodResourcesOccupancy``: the kubelet's pod-resources API assigns a GPU to a pod (reason
  ``gpu_held_by_pod``), even one that has not started computing yet. No socket, or a failed
  call, raises: the scheduler cannot tell, so it does not probe.
* ``NvmlOccupancy``: NVML lists compute processes on a GPU (reason ``gpu_compute_process``).
  A node where NVML is absent has no GPUs NVML can see: nothing to be busy.

Each check answers ``busy_reason() -> str | None`` (``exporter.probe.schedule.GpuOccupancy``);
an exception means "cannot tell" and the scheduler skips the probe (``occupancy_unknown``).
Both ask through the node's shared NVML handle and pod-resources client
(``exporter.resources.NodeResources``), which they do not own.
"""

from __future__ import annotations

from exporter.sources.nvml import NvmlBackend, busy_gpus
from exporter.sources.podresources import PodResourcesClient

MAX_NAMED = 4


class PodResourcesOccupancy:
    reason = "gpu_held_by_pod"

    def __init__(self, client: PodResourcesClient) -> None:
        self._client = client

    def busy_reason(self) -> str | None:
        assignments = self._client.list_gpus()  # raises when the kubelet cannot be asked
        if not assignments:
            return None
        pods = sorted({f"{a.namespace}/{a.pod}" for a in assignments})
        shown = ", ".join(pods[:MAX_NAMED]) + (f" and {len(pods) - MAX_NAMED} more" if len(pods) > MAX_NAMED else "")
        return f"{len(assignments)} GPU(s) assigned to pod(s) {shown}"


class NvmlOccupancy:
    reason = "gpu_compute_process"

    def __init__(self, backend: NvmlBackend) -> None:
        self._backend = backend

    def busy_reason(self) -> str | None:
        busy = busy_gpus(self._backend)
        if not busy:
            return None
        named = [
            f"{uuid} (pids {', '.join(str(p.pid) for p in procs[:MAX_NAMED])})"
            for uuid, procs in sorted(busy.items())[:MAX_NAMED]
        ]
        return f"{len(busy)} GPU(s) run compute processes: {'; '.join(named)}"

"""Is anything using this node's GPUs? The scheduler's occupancy checks.

* ``NvmlOccupancy``: NVML lists compute processes on a GPU (reason ``gpu_compute_process``).
  A node where NVML is absent has no GPUs NVML can see: nothing to be busy.

Each check answers ``busy_reason() -> str | None`` (``exporter.probe.schedule.GpuOccupancy``);
an exception means "cannot tell" and the scheduler skips the probe (``occupancy_unknown``).
"""

from __future__ import annotations

from exporter.config import ServeConfig
from exporter.probe.schedule import GpuOccupancy
from exporter.sources.nvml import NvmlBackend, busy_gpus, nvml_backend

MAX_NAMED = 4


class NvmlOccupancy:
    reason = "gpu_compute_process"

    def __init__(self, backend: NvmlBackend, owned: bool = True) -> None:
        self._backend = backend
        self._owned = owned  # the simulated node's backend is shared with the nvml collector

    def busy_reason(self) -> str | None:
        busy = busy_gpus(self._backend)
        if not busy:
            return None
        named = [f"{uuid} (pids {', '.join(str(p.pid) for p in procs[:MAX_NAMED])})"
                 for uuid, procs in sorted(busy.items())[:MAX_NAMED]]
        return f"{len(busy)} GPU(s) run compute processes: {'; '.join(named)}"

    def close(self) -> None:
        if self._owned:
            self._backend.close()


def default_checks(config: ServeConfig) -> list[GpuOccupancy]:
    return [NvmlOccupancy(nvml_backend(config.extra), owned=config.extra.get("simulated_node") is None)]

"""A simulated GPU node: a folder tree that the exporter's sources read like the real thing."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ccl_sim.clock import SimClock, job_activity
from ccl_sim.paths import simulated_paths
from exporter.resources import HostPaths

if TYPE_CHECKING:
    from ccl_sim.kube import SimKube
    from ccl_sim.kubelet import SimKubeletStats
    from ccl_sim.nvml import SimNvml
    from exporter.sources.kube import PodMetadataSource


class SimPart(Protocol):
    """One simulated subsystem: lays out its files once, then advances them on each tick."""

    def setup(self, root: Path) -> None: ...

    def advance(self, clock: SimClock) -> None: ...


@dataclass
class SimulatedNode:
    root: Path
    parts: list[SimPart] = field(default_factory=list)
    seed: int = 7
    elapsed_seconds: float = 0.0
    nvml: SimNvml | None = None  # the simulated GPUs the NVML collectors read
    pod_metadata: PodMetadataSource | None = None  # its pods and their jobs (no API server here)
    kube: SimKube | None = None  # what the lifecycle hooks write to (the API server's stand-in)
    kubelet: SimKubeletStats | None = None  # the kubelet's Summary API: pods' network bytes

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    @property
    def paths(self) -> HostPaths:
        return simulated_paths(self.root)

    @property
    def sysfs(self) -> Path:
        return self.paths.sysfs

    def setup(self) -> None:
        for part in self.parts:
            part.setup(self.root)

    def advance(self, step_seconds: float) -> None:
        self.elapsed_seconds += step_seconds
        clock = SimClock(self.elapsed_seconds, step_seconds, job_activity(self.elapsed_seconds))
        for part in self.parts:
            part.advance(clock)

    def close(self) -> None:
        """Stop what parts started (servers); parts without ``close`` have nothing to stop."""
        for part in self.parts:
            close = getattr(part, "close", None)
            if callable(close):
                close()


@dataclass
class SimJobEnd:
    """The simulated training pod ends after ``after_seconds``: its GPUs become idle (no pod,
    no compute process), which is when idle-time probes may run."""

    nvml: SimNvml
    after_seconds: float
    ended: bool = False

    def setup(self, root: Path) -> None:
        """Nothing to lay out."""

    def advance(self, clock: SimClock) -> None:
        if not self.ended and clock.elapsed_seconds >= self.after_seconds:
            self.nvml.release()
            self.ended = True


def default_node(root: Path, seed: int = 7, job_ends_after_seconds: float = 0.0) -> SimulatedNode:
    """The node ``python -m ccl_sim serve`` runs: 8 NDR InfiniBand ports and 2 RoCE ports, 8 GPUs
    with 18 NVLinks each on an HGX-like PCI tree (each GPU beside one compute NIC, two sockets),
    held by one training pod that the pod-resources socket reports with its NICs, and
    training pods whose logs carry NCCL output (one of them fell back to TCP, one crossed its
    rails) and whose NCCL Inspector writes per-collective timings, a kubelet Summary API with
    each pod's network bytes, and probe / pre-flight result files (one pod failed its
    pre-flight)."""
    from ccl_sim.inspector import SimInspector
    from ccl_sim.kube import SimKube
    from ccl_sim.kubelet import SimKubeletStats
    from ccl_sim.nvml import SimNvml, SimPodResources
    from ccl_sim.podlogs import SimPodLogs
    from ccl_sim.probe import SimProbeResults
    from ccl_sim.rdma import SimRdma
    from ccl_sim.topology import SimTopology

    node = SimulatedNode(root=root, seed=seed)
    node.parts.append(SimRdma(rng=node.rng))
    node.parts.append(SimTopology())
    node.nvml = SimNvml(rng=node.rng)
    node.parts.append(node.nvml)
    node.parts.append(SimPodResources(node.nvml))
    pod_logs = SimPodLogs(rng=node.rng)
    node.parts.append(pod_logs)
    node.pod_metadata = pod_logs
    node.parts.append(SimInspector(pod_logs, rng=node.rng))
    node.kube = SimKube()
    node.kubelet = SimKubeletStats(node.nvml, pod_logs)
    node.parts.append(node.kubelet)
    node.parts.append(SimProbeResults())
    if job_ends_after_seconds > 0:
        node.parts.append(SimJobEnd(node.nvml, job_ends_after_seconds))
    return node

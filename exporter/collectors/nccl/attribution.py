"""Who a log stream's pod is: its training job (from the node's pod list) and the GPUs that job
holds on this node, which settle the placement a log leaves open (a communicator larger than
what the job holds here spans nodes). Also the node's pods with a GPU and no NCCL output, and
the pods that declare the network they run on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from exporter.collectors.nccl.families import ExpectedNetwork, PodReport
from exporter.nccl.networks import expected_network_class
from exporter.sources.gpu_inventory import GpuInventory, GpuInventorySource
from exporter.sources.kube import PodMetadata, PodMetadataSource


@dataclass(frozen=True)
class PodAttribution:
    """What the node knows of one pod, for its verdict and its labels."""

    meta: PodMetadata | None  # None when the pod list does not hold it
    node_gpus: int | None  # GPUs on this node (NVML), None when unknown
    job_gpus_here: int | None  # GPUs the pod's job holds on this node, None when that cannot be counted for sure

    @property
    def job_name(self) -> str:
        return self.meta.job_name if self.meta else ""

    @property
    def job_kind(self) -> str:
        return self.meta.job_kind if self.meta else ""

    @property
    def host_network(self) -> bool:
        return self.meta is not None and self.meta.host_network is True


class PodAttributor:
    """See the module docstring. ``read_gpus`` once per snapshot, then ``attribute`` each pod."""

    def __init__(self, metadata: PodMetadataSource, gpu_inventory: GpuInventorySource | None) -> None:
        self.metadata = metadata
        self._gpu_inventory = gpu_inventory

    def read_gpus(self) -> GpuInventory:
        return self._gpu_inventory.read() if self._gpu_inventory is not None else GpuInventory()

    def attribute(self, namespace: str, pod: str, gpus: GpuInventory) -> PodAttribution:
        meta = self.metadata.lookup(namespace, pod)
        return PodAttribution(meta, gpus.total, self._job_gpus_here(namespace, pod, meta, gpus))

    def _job_gpus_here(self, namespace: str, pod: str, meta: PodMetadata | None, gpus: GpuInventory) -> int | None:
        """GPUs the pod's training job holds on this node (its pods' pod-resources GPUs). None when
        that cannot be counted for sure: the pod holds no GPU the kubelet knows of, or its job or the
        node's complete pod list is unknown (another pod of the same job here would be missed, and a
        communicator shared with it taken for one that spans nodes)."""
        if gpus.by_pod.get((namespace, pod), 0) == 0:
            return None
        if meta is None or not meta.job_name or not self.metadata.is_authoritative():
            return None
        job_pods = [(namespace, pod)]
        for other_namespace, name in gpus.by_pod:
            if other_namespace != namespace or name == pod:
                continue
            other = self.metadata.lookup(other_namespace, name)
            if other is not None and other.job_name == meta.job_name:
                job_pods.append((other_namespace, name))
        return gpus.held(job_pods)

    def silent_gpu_pods(self, gpus: GpuInventory, has_streams: Callable[[str, str], bool]) -> list[PodReport]:
        """GPU pods of this node whose logs show no NCCL output at all: "cannot tell", said out loud."""
        reports = []
        for namespace, name in sorted(gpus.by_pod):
            if has_streams(namespace, name):
                continue
            meta = self.metadata.lookup(namespace, name)
            reports.append(PodReport(namespace, name, meta.job_name if meta else "", meta.job_kind if meta else ""))
        return reports

    def expectations(self) -> tuple[ExpectedNetwork, ...]:
        """Pods of the node that declare the network they run on (its class for the rules)."""
        return tuple(
            ExpectedNetwork(
                p.namespace,
                p.name,
                p.job_name,
                p.job_kind,
                p.expected_network,
                expected_network_class(p.expected_network) or "",
            )
            for p in self.metadata.pods()
            if p.expected_network
        )

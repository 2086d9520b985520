"""Topology collector: ``ccl_topology_*`` — where GPUs and RDMA NICs sit, and how far apart.

The GPU x NIC matrix in ``nvidia-smi topo -m`` classes (PIX, PXB, PHB, NODE, SYS; not NCCL's path
types, see ``exporter.sources.topology``), each GPU's nearest NIC(s), each device's PCI placement
(NUMA node, host bridge, PCIe switches, path), the RDMA devices without one; and
the node's summary of them (``ccl_topology_node_*``: placed GPUs, GPUs with a NIC beside them and
those NICs), so that rules over a fleet read one series per node instead of every GPU's.
Read from sysfs by ``exporter.sources.topology`` once and again only when the node changes, never
per scrape. A pair whose class sysfs does not tell is left out, never guessed; a device whose
placement cannot be read marks the scrape partial and drops only its own series.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from exporter.collectors.base import CollectorSpec, CollectorUnavailable, PartialCollection
from exporter.resources import NodeResources
from exporter.sources.topology import LOCAL_AFFINITIES, PciPlacement, Topology, TopologySource

PLACEMENT_LABELS = ["pci_address", "numa_node", "host_bridge", "pci_switches", "pci_path"]


def _numa(place: PciPlacement | None) -> str:
    return "" if place is None or place.numa_node is None else str(place.numa_node)


def _placement_values(place: PciPlacement) -> list[str]:
    switches = "unknown" if place.switches is None else ",".join(place.switches)
    return [place.address, _numa(place), place.host_bridge, switches, "/".join(place.path)]


class TopologyCollector:
    name = "topology"

    def __init__(self, source: TopologySource) -> None:
        self._source = source

    def collect(self) -> Iterable[Metric]:
        topology = self._source.read()
        if not topology.gpus and not topology.nics:
            reason = "; ".join(topology.problems[:3]) or "no GPU (NVML) and no RDMA device (sysfs class/infiniband)"
            raise CollectorUnavailable(reason)
        yield from self.families(topology)
        yield from self.node_families(topology)
        if topology.problems:
            raise PartialCollection("; ".join(topology.problems[:5]))

    @staticmethod
    def families(topology: Topology) -> list[Metric]:
        pairs = GaugeMetricFamily(
            "ccl_topology_gpu_nic_info",
            "A GPU and an RDMA NIC of this node and the class of the PCIe path between them, as nvidia-smi "
            "topo -m names it (not NCCL's path types, which have no NODE): PIX (one PCIe switch), PXB (several "
            "switches), PHB (the host bridge), NODE (host bridges of one NUMA node), SYS (across NUMA nodes); "
            "always 1. numa_node is the NIC's, gpu_numa_node the GPU's. Pairs sysfs does not tell are absent.",
            labels=["gpu", "uuid", "device", "affinity", "numa_node", "gpu_numa_node"],
        )
        nearest = GaugeMetricFamily(
            "ccl_topology_gpu_nearest_nic_info",
            "The RDMA NIC(s) nearest to a GPU and their class (nvidia-smi's, as ccl_topology_gpu_nic_info); "
            "always 1. Absent for a GPU when a NIC of unknown class to it might be nearer (one on its own host "
            "bridge, or nothing nearer than NODE known); NICs without a PCI placement are not in the way.",
            labels=["gpu", "uuid", "device", "affinity"],
        )
        gpu_pci = GaugeMetricFamily(
            "ccl_topology_gpu_pci_info",
            "Where a GPU sits on the PCI tree (sysfs); always 1. pci_switches: the upstream ports of the PCIe "
            "switches above it, nearest first (empty: none; unknown: a bridge's class does not say), "
            "pci_path: the PCI functions from the root port down to the GPU.",
            labels=["gpu", "uuid"] + PLACEMENT_LABELS,
        )
        nic_pci = GaugeMetricFamily(
            "ccl_topology_nic_pci_info",
            "Where an RDMA NIC sits on the PCI tree (sysfs); always 1. Labels as on ccl_topology_gpu_pci_info.",
            labels=["device"] + PLACEMENT_LABELS,
        )
        unplaced = GaugeMetricFamily(
            "ccl_topology_nic_unplaced_info",
            "An RDMA device sysfs gives no PCI placement, left out of the GPU x NIC matrix; always 1. reason: "
            "not_pci (a software device such as soft-RoCE rxe0 or siw0, under /sys/devices/virtual), "
            "unreadable (its device link missing or broken; also in the collector's partial-scrape message).",
            labels=["device", "reason"],
        )
        for nic in topology.unplaced_nics:
            unplaced.add_metric([nic.device, nic.unplaced or ""], 1.0)
        gpu_numa = {gpu.index: _numa(gpu.placement) for gpu in topology.gpus}
        nic_numa = {nic.device: _numa(nic.placement) for nic in topology.nics}
        for gpu in topology.gpus:
            index = str(gpu.index)
            if gpu.placement is not None:
                gpu_pci.add_metric([index, gpu.uuid] + _placement_values(gpu.placement), 1.0)
            for nic in topology.physical_nics:
                cls = topology.affinity(gpu.index, nic.device)
                if cls is not None:
                    pairs.add_metric([index, gpu.uuid, nic.device, cls, nic_numa[nic.device], gpu_numa[gpu.index]], 1.0)
            best = topology.nearest(gpu.index)
            if best is not None:
                cls, devices = best
                for device in devices:
                    nearest.add_metric([index, gpu.uuid, device, cls], 1.0)
        for nic in topology.physical_nics:
            if nic.placement is not None:
                nic_pci.add_metric([nic.device] + _placement_values(nic.placement), 1.0)
        return [pairs, nearest, gpu_pci, nic_pci, unplaced]

    @staticmethod
    def node_families(topology: Topology) -> list[Metric]:
        """The node's counts, as the series above would give them: GPUs on ccl_topology_gpu_pci_info,
        and GPUs and distinct NICs on ccl_topology_gpu_nearest_nic_info{affinity=~"PIX|PXB"}."""
        local_gpus: set[int] = set()
        local_nics: set[str] = set()
        for gpu in topology.gpus:
            best = topology.nearest(gpu.index)
            if best is not None and best[0] in LOCAL_AFFINITIES:
                local_gpus.add(gpu.index)
                local_nics.update(best[1])
        placed = sum(1 for gpu in topology.gpus if gpu.placement is not None)
        return [
            GaugeMetricFamily(
                "ccl_topology_node_gpus",
                "GPUs of this node whose PCI placement sysfs tells (the GPUs of ccl_topology_gpu_pci_info).",
                value=float(placed),
            ),
            GaugeMetricFamily(
                "ccl_topology_node_gpus_with_local_nic",
                "GPUs of this node whose nearest RDMA NIC is under their own PCIe switch (PIX or PXB: NCCL's "
                "default GPUDirect RDMA reach).",
                value=float(len(local_gpus)),
            ),
            GaugeMetricFamily(
                "ccl_topology_node_local_nics",
                "Distinct RDMA NICs of this node that are the nearest (PIX or PXB) NIC of at least one GPU. A "
                "node is rail-optimised when every GPU has a local NIC and there are as many local NICs.",
                value=float(len(local_nics)),
            ),
        ]


def build_collector(settings: None, resources: NodeResources) -> TopologyCollector:
    return TopologyCollector(resources.topology)


SPEC = CollectorSpec(
    name="topology",
    help="GPU x RDMA NIC affinity (nvidia-smi topo classes) and PCI placement from sysfs and NVML",
    default_enabled=True,
    factory=build_collector,
)

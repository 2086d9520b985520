"""Which NIC each of a pod's GPUs sends its NCCL traffic through, joined with the node's topology."""

from __future__ import annotations

from collections.abc import Iterable

from exporter.collectors.nccl.families import NicAffinityRow
from exporter.nccl.nics import NicUse
from exporter.sources.topology import Topology, nccl_bus_id_address

MAX_HOSTNAME_CHARS = 63  # a pod's hostname is its name cut to 63 characters


def pod_nic_affinity(
    pod: str, uses: Iterable[NicUse], host_network: bool, topology: Topology | None
) -> tuple[NicAffinityRow, ...]:
    """(gpu, device, affinity, gdr, nearest) of the NICs the pod's NCCL sends through, its GPUs found
    on this node by PCI address and their NICs among this node's RDMA devices (so a log cannot invent
    label values); affinity "" where the topology does not tell; nearest the class of the GPU's
    nearest NIC (``Topology.nearest``), "" where it is unknown. Only the pod's own processes count (their
    host is the pod's hostname, unless it runs on the host network): an MPI launcher's log holds
    every node's lines, whose busIds name other nodes' GPUs."""
    if topology is None:
        return ()
    own_host = pod.split(".", 1)[0][:MAX_HOSTNAME_CHARS]
    gdr: dict[tuple[str, str, str], set[str]] = {}
    for use in uses:
        if (use.host != own_host and not host_network) or not topology.has_nic(use.device):
            continue  # another node's process, or a device name this node has no NIC of
        address = nccl_bus_id_address(use.gpu_bus_id)
        gpu = topology.gpu_at(address) if address else None
        if gpu is None:
            continue  # a GPU of another node (a log with every node's ranks), or unknown
        cls = topology.affinity(gpu.index, use.device) or ""
        gdr.setdefault((str(gpu.index), use.device, cls), set()).add(use.gdr)
    return tuple(
        NicAffinityRow(
            gpu, device, cls, flags.pop() if len(flags) == 1 else "mixed", _nearest_class(topology, int(gpu))
        )
        for (gpu, device, cls), flags in sorted(gdr.items())
    )


def _nearest_class(topology: Topology, gpu: int) -> str:
    nearest = topology.nearest(gpu)
    return "" if nearest is None else nearest[0]

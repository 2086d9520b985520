"""Our GPU x NIC classes (nvidia-smi's) beside NCCL's own path types, on the same sysfs trees.

``nccl_path_type`` below is a model of how NCCL v2.30.7-1 types the path between a GPU and a NIC,
written from its source: ``src/graph/xml.cc`` ``ncclTopoGetXmlFromSys`` (climb the device's sysfs
path two components at a time, each BDF reached a PCI switch node, until a component that is no
BDF: a CPU node keyed by the ``numa_node`` string, so ``-1`` is a CPU of its own) and
``ncclTopoFillNet`` (a NIC whose path is not a PCI device hangs on the first CPU);
``src/graph/topo.cc`` ``ncclTopoConnectCpus`` (every CPU pair linked ``LINK_SYS``);
``src/graph/paths.cc`` (a path's type is the worst hop: a PCI link is PIX, PCI to PCI is PXB, a
hop through a CPU is PHB, CPU to CPU is SYS). The Broadcom Gen4/Gen5 flattening of
``ncclTopoFlattenBcmSwitches`` needs the switches' PCI ids, which these trees do not carry.

What the test holds: where both say something, PIX and PXB mean the same in both, so the GPUDirect
reach and the crossed-rail rule (PIX/PXB against the rest) agree with what NCCL itself sees; PHB
and NODE are NCCL's PHB, SYS is SYS; where we say nothing (an unknown NUMA node across host bridges,
a software RDMA device) NCCL guesses PHB or SYS, never PIX or PXB.
"""

from __future__ import annotations

import os
from pathlib import Path

from ccl_sim.topology import GPU_CLASS, INFINIBAND_CLASS, PciFunction, PciTreeWriter
from exporter.sources.nvml import GpuIdentity
from exporter.sources.topology import PciPlacement, build_topology

NCCL_ORDER = ("PIX", "PXB", "PHB", "SYS")


def _ancestors(place: PciPlacement, numa_of: dict[str, str]) -> list[str]:
    """NCCL's nodes above a device, nearest first: switch BDFs, then ``cpu:<numa_node as read>``."""
    parts = [place.host_bridge, *place.path]
    index = len(parts) - 1
    found: list[str] = []
    top = parts[index]
    while index - 2 >= 1:
        index -= 2
        found.append(parts[index])
        top = parts[index]
    return [*found, f"cpu:{numa_of[top]}"]


def nccl_path_type(gpu: PciPlacement, nic: PciPlacement | None, numa_of: dict[str, str], first_cpu: str) -> str:
    """NCCL's type of the GPU-NIC path (see the module doc); ``nic`` None: a NIC with no PCI device."""
    up_gpu = _ancestors(gpu, numa_of)
    up_nic = [first_cpu] if nic is None else _ancestors(nic, numa_of)
    common = next((node for node in up_gpu if node in up_nic), None)
    if common is None:
        return "SYS"  # two CPUs: LINK_SYS
    if common.startswith("cpu:"):
        return "PHB"
    # below one switch: PIX when it is the nearest switch of both, PXB when a switch-to-switch hop is in the way
    return "PIX" if up_gpu.index(common) == 0 and up_nic.index(common) == 0 else "PXB"


def _chain(tree: PciTreeWriter, bridge: str, addresses: list[str], cls: str, numa: int) -> Path:
    return tree.add(bridge, [PciFunction(a) for a in addresses[:-1]] + [PciFunction(addresses[-1], cls)], numa)


def _node(sysfs: Path) -> None:
    """Two sockets; socket 0 has two host bridges; a GPU with a NIC under its switch, under the switch
    above it, on its root complex, across host bridges of its NUMA node, across sockets, a NIC whose
    numa_node is -1 on a host bridge of its own, and a soft-RoCE device."""
    tree = PciTreeWriter(sysfs)
    up, down = ["0000:10:01.0", "0000:11:00.0"], ["0000:12:00.0", "0000:13:00.0"]  # switch A, then switch B below it
    _chain(tree, "pci0000:10", up + down + ["0000:14:00.0", "0000:15:00.0"], GPU_CLASS, 0)
    tree.link_rdma(
        "nic_pix", _chain(tree, "pci0000:10", up + down + ["0000:14:01.0", "0000:16:00.0"], INFINIBAND_CLASS, 0)
    )
    tree.link_rdma("nic_pxb", _chain(tree, "pci0000:10", up + ["0000:12:01.0", "0000:17:00.0"], INFINIBAND_CLASS, 0))
    tree.link_rdma("nic_phb", _chain(tree, "pci0000:10", ["0000:10:02.0", "0000:18:00.0"], INFINIBAND_CLASS, 0))
    tree.link_rdma("nic_node", _chain(tree, "pci0000:30", ["0000:30:01.0", "0000:31:00.0"], INFINIBAND_CLASS, 0))
    tree.link_rdma("nic_sys", _chain(tree, "pci0000:80", ["0000:80:01.0", "0000:81:00.0"], INFINIBAND_CLASS, 1))
    tree.link_rdma("nic_nonuma", _chain(tree, "pci0000:a0", ["0000:a0:01.0", "0000:a1:00.0"], INFINIBAND_CLASS, -1))
    (sysfs / "devices" / "virtual" / "infiniband" / "rxe0").mkdir(parents=True)
    os.symlink("../../devices/virtual/infiniband/rxe0", sysfs / "class" / "infiniband" / "rxe0")


def test_pix_and_pxb_mean_the_same_to_nccl_and_the_rest_never_becomes_local(tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    _node(sysfs)
    topology = build_topology(sysfs, [GpuIdentity(0, "GPU-0", "NVIDIA H200", "00000000:15:00.0")])
    devices = os.path.realpath(sysfs / "devices")
    numa_of = {}
    for root, _, files in os.walk(devices):
        if "numa_node" in files:
            numa_of[os.path.basename(root)] = Path(root, "numa_node").read_text().strip()
    gpu = topology.gpus[0].placement
    assert gpu is not None
    ours = {nic.device: topology.affinity(0, nic.device) for nic in topology.nics}
    nccl = {nic.device: nccl_path_type(gpu, nic.placement, numa_of, first_cpu="cpu:0") for nic in topology.nics}
    assert ours == {"nic_pix": "PIX", "nic_pxb": "PXB", "nic_phb": "PHB", "nic_node": "NODE", "nic_sys": "SYS",
                    "nic_nonuma": None, "rxe0": None}  # fmt: skip
    assert nccl == {"nic_pix": "PIX", "nic_pxb": "PXB", "nic_phb": "PHB", "nic_node": "PHB", "nic_sys": "SYS",
                    "nic_nonuma": "SYS", "rxe0": "PHB"}  # fmt: skip
    local = ("PIX", "PXB")
    for device, cls in ours.items():
        if cls is not None:
            assert (cls in local) == (nccl[device] in local), device
            assert NCCL_ORDER.index(nccl[device]) == NCCL_ORDER.index({"NODE": "PHB"}.get(cls, cls)), device
        else:
            assert nccl[device] not in local, f"{device}: unknown to us, never local to NCCL"
    # the NIC of unknown NUMA node and the software device do not take the GPU's nearest NIC away
    assert topology.nearest(0) == ("PIX", ("nic_pix",))
    assert {nic.device: nic.unplaced for nic in topology.unplaced_nics} == {"rxe0": "not_pci"}
    assert topology.problems == ()

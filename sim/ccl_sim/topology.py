"""The simulated node's PCI tree: an HGX H100/H200-like layout written as real sysfs writes it.

Two sockets (NUMA 0 and 1), four GPU/NIC pairs on each. Every pair has a host bridge of its own
with one PCIe switch below its root port; the switch's downstream ports hold one GPU and one
compute NIC (``mlx5_<i>`` next to GPU ``i``: ``PIX``). Across pairs of one socket the path
crosses host bridges (``NODE``), across sockets the CPU interconnect (``SYS``). Two more NICs
(``mlx5_8``, ``mlx5_9``, the RoCE ports) sit on root ports of their own, one per socket.

``PciTreeWriter`` lays out any such tree the way the kernel shows it: folders
``devices/pci<dddd:bb>/<bdf>/.../<bdf>`` with ``class`` and ``numa_node`` files,
``bus/pci/devices/<bdf>`` symlinks into them, and ``class/infiniband/<dev>/device`` symlinks.
The tests build their own trees (broken and partial ones too) with it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ccl_sim.nvml import GPU_BUSES, rail_nics
from ccl_sim.paths import simulated_paths
from ccl_sim.rdma import write_attribute

BRIDGE = "0x060400"  # PCI-to-PCI bridge: root ports, switch upstream and downstream ports
GPU_CLASS = "0x030200"  # 3D controller
INFINIBAND_CLASS = "0x020700"
ETHERNET_CLASS = "0x020000"


@dataclass(frozen=True)
class PciFunction:
    address: str  # sysfs BDF
    cls: str = BRIDGE


class PciTreeWriter:
    """Writes PCI functions, their sysfs links and RDMA class links under ``sysfs``."""

    def __init__(self, sysfs: Path) -> None:
        self.sysfs = sysfs

    def add(self, host_bridge: str, chain: Sequence[PciFunction], numa_node: int | None) -> Path:
        """Functions from the root port (first) down to a device (last), each with its ``class``, a
        ``numa_node`` (none written when None) and a ``bus/pci/devices`` link. Returns the device's folder."""
        folder = self.sysfs / "devices" / host_bridge
        bus_dir = self.sysfs / "bus" / "pci" / "devices"
        bus_dir.mkdir(parents=True, exist_ok=True)
        for function in chain:
            folder = folder / function.address
            folder.mkdir(parents=True, exist_ok=True)
            write_attribute(folder / "class", function.cls)
            if numa_node is not None:
                write_attribute(folder / "numa_node", numa_node)
            link = bus_dir / function.address
            if not link.is_symlink():
                os.symlink(os.path.relpath(folder, bus_dir), link)
        return folder

    def link_rdma(self, device: str, device_folder: Path) -> None:
        """``class/infiniband/<device>/device`` pointing at the PCI function that carries it."""
        class_dir = self.sysfs / "class" / "infiniband" / device
        class_dir.mkdir(parents=True, exist_ok=True)
        link = class_dir / "device"
        if link.is_symlink():
            link.unlink()
        os.symlink(os.path.relpath(device_folder, class_dir), link)


def _bdf(bus: int, device: int = 0, function: int = 0) -> str:
    return f"0000:{bus:02x}:{device:02x}.{function}"


@dataclass(frozen=True)
class SimPair:
    """One GPU and the compute NIC beside it under one PCIe switch."""

    gpu_bus: int
    nic: str
    nic_address: str  # on the bus after the GPU's
    numa_node: int

    @property
    def host_bridge(self) -> str:
        return f"pci0000:{self.gpu_bus - 3:02x}"

    def _switch(self) -> list[PciFunction]:
        return [PciFunction(_bdf(self.gpu_bus - 3, 1)), PciFunction(_bdf(self.gpu_bus - 2))]

    @property
    def gpu_chain(self) -> list[PciFunction]:
        return self._switch() + [PciFunction(_bdf(self.gpu_bus - 1, 0)), PciFunction(_bdf(self.gpu_bus), GPU_CLASS)]

    @property
    def nic_chain(self) -> list[PciFunction]:
        return self._switch() + [
            PciFunction(_bdf(self.gpu_bus - 1, 1)),
            PciFunction(self.nic_address, INFINIBAND_CLASS),
        ]


def hgx_pairs() -> list[SimPair]:
    """GPU i beside mlx5_i; GPUs 0-3 on socket 0, 4-7 on socket 1 (the simulated NVML's bus ids)."""
    return [
        SimPair(bus, nic, address, 0 if i < len(GPU_BUSES) // 2 else 1)
        for i, (bus, (nic, address)) in enumerate(zip(GPU_BUSES, rail_nics(), strict=True))
    ]


# The two NICs that pair with no GPU: (device, host bridge bus, numa node).
OTHER_NICS = (("mlx5_8", 0x00, 0), ("mlx5_9", 0x80, 1))


@dataclass
class SimTopology:
    """The simulated node's PCI tree (a ``SimPart``); ``nic_addresses`` maps each NIC to its PCI address."""

    pairs: list[SimPair] = field(default_factory=hgx_pairs)
    nic_addresses: dict[str, str] = field(default_factory=dict)

    def setup(self, root: Path) -> None:
        tree = PciTreeWriter(simulated_paths(root).sysfs)
        for pair in self.pairs:
            tree.add(pair.host_bridge, pair.gpu_chain, pair.numa_node)
            tree.link_rdma(pair.nic, tree.add(pair.host_bridge, pair.nic_chain, pair.numa_node))
            self.nic_addresses[pair.nic] = pair.nic_address
        for device, bus, numa in OTHER_NICS:
            chain = [PciFunction(_bdf(bus, 1)), PciFunction(_bdf(bus + 1), ETHERNET_CLASS)]
            tree.link_rdma(device, tree.add(f"pci0000:{bus:02x}", chain, numa))
            self.nic_addresses[device] = _bdf(bus + 1)

    def advance(self, clock: object) -> None:
        """The PCI tree does not change while the node runs."""

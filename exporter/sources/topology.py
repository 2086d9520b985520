"""Where the node's GPUs and RDMA NICs sit on the PCI tree, and how far each GPU is from each NIC.

Read from sysfs the way NCCL reads it (``src/os/linux.cc``, ``src/graph/xml.cc``): a device's
place is the real path its sysfs link resolves to, ``/sys/bus/pci/devices/<dddd:bb:dd.f>`` ->
``/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0``. The first
component is the host bridge (root complex), every later one a PCI function. GPUs are found by
the PCI bus id NVML reports, RDMA NICs through ``/sys/class/infiniband/<dev>/device``. Each
device's ``numa_node`` file gives its NUMA node (``-1``, "no affinity", is read as unknown).

PCIe switches, as NCCL groups them: climbing from a device two components at a time, each
component reached is a switch's upstream port, until the host bridge is reached (between two
switches stand the downstream port of one and the root port or upstream port of the next).
Every bridge on the way must say, in its ``class`` file, that it is a PCI bridge (``0x0604xx``);
when one does not (unreadable, or something else), the device's switches are unknown.

The class of a GPU/NIC pair, in ``nvidia-smi topo -m`` terms (NVML's topology levels):

- ``PIX``: both below one PCIe switch (the same upstream port is the nearest of each);
- ``PXB``: below a common switch through more than one switch;
- ``PHB``: no common switch, but the same host bridge;
- ``NODE``: different host bridges of one NUMA node;
- ``SYS``: different NUMA nodes (the path crosses the CPU interconnect).

What sysfs does not say stays unknown (``None``), never guessed: a GPU whose PCI link is
missing or broken has no class to any NIC; two devices on different host bridges without a
known NUMA node have none; a missing bridge class leaves the switch-dependent classes out.
Problems are listed in ``Topology.problems``.

An RDMA device with no PCI placement at all is left out of the GPU x NIC matrix, named in
``NicTopology.unplaced``: a software device (soft-RoCE ``rxe0``, ``siw0``: its class entry
resolves under ``/sys/devices/virtual``), which is no problem, or one whose link is missing or
broken, which is. Neither keeps the other GPUs and NICs from their nearest NIC (``nearest``).

These are nvidia-smi's classes, not NCCL's path types (``src/graph/topo.cc``, ``paths.cc``),
which differ in places: NCCL has no NODE (a CPU node per NUMA node, so two host bridges of one
NUMA node are PHB), merges the two levels of a Broadcom Gen4/Gen5 PEX switch into one (PXB here
can be PIX there), takes ``numa_node`` -1 as a CPU of its own (SYS to every device with a NUMA
node) and hangs a NIC without a PCI device on the first CPU. The split that matters for
GPUDirect RDMA and for a crossed rail, PIX or PXB against everything further, is the same in both
(docs/topology.md, "nvidia-smi's classes and NCCL's").

``TopologySource`` reads all this once and again only when the node changes: on each ``read``
it compares a cheap fingerprint (the RDMA class folder's entries and their links, the GPU list
NVML discovered) at most every ``check_seconds``, and walks sysfs only when it differs.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from exporter.sources.nvml import GpuIdentity, NvmlBackend, NvmlUnavailable
from exporter.sources.sysfs import AttributeReader, list_dir, read_attribute

log = logging.getLogger(__name__)

# nvidia-smi's classes for a PCIe path, nearest first.
AFFINITIES = ("PIX", "PXB", "PHB", "NODE", "SYS")
LOCAL_AFFINITIES = ("PIX", "PXB")  # NCCL's default GPUDirect RDMA reach (NCCL_NET_GDR_LEVEL=PXB)
BRIDGE_CLASS_PREFIX = "0x0604"  # PCI-to-PCI bridge (root ports, switch ports), any prog-if
MAX_DEVICES = 256  # GPUs, and entries of /sys/class/infiniband, read at most
MAX_PATH_COMPONENTS = 32  # a PCI path deeper than this is not a real one
MAX_PCI_FUNCTIONS = 8192  # entries of /sys/bus/pci/devices looked at for SR-IOV VFs

_BDF_RE = re.compile(r"^([0-9a-f]{4}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$")
_HOST_BRIDGE_RE = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
_NVML_BUS_ID_RE = re.compile(r"^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_PCI_IN_NAME_RE = re.compile(r"([0-9a-f]{4})[-_:]([0-9a-f]{2})[-_:]([0-9a-f]{2})[-_.]([0-7])(?![0-9a-f])")


def sysfs_address(pci_bus_id: str) -> str | None:
    """NVML's ``00000000:18:00.0`` (or sysfs's ``0000:18:00.0``) as sysfs names it; None if malformed."""
    m = _NVML_BUS_ID_RE.match(pci_bus_id.strip())
    if m is None:
        return None
    domain = int(m.group(1), 16)
    if domain > 0xFFFF:
        return None
    return f"{domain:04x}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"


def nccl_bus_id_address(bus_id: str) -> str | None:
    """NCCL's busId as its log prints it (``%lx`` of the hex digits of ``0000:18:00.0``: ``18000``)
    as sysfs names the device; None when it is not a hex number."""
    try:
        value = int(bus_id, 16)
    except ValueError:
        return None
    if value < 0 or value >> 20 > 0xFFFF:
        return None
    return f"{value >> 20:04x}:{(value >> 12) & 0xFF:02x}:{(value >> 4) & 0xFF:02x}.{value & 0xF:x}"


def pci_address_in(name: str) -> str | None:
    """A PCI address spelled inside a device name (``0000:19:00.0``, ``pci-0000-19-00-0``), or None."""
    m = _PCI_IN_NAME_RE.search(name.lower())
    if m is None or int(m.group(4)) > 7:
        return None
    return f"{m.group(1)}:{m.group(2)}:{m.group(3)}.{m.group(4)}"


@dataclass(frozen=True)
class PciPlacement:
    """One device's place on the PCI tree."""

    address: str  # sysfs BDF, 0000:18:00.0
    host_bridge: str  # pci0000:15
    path: tuple[str, ...]  # the functions from the root port down to the device itself
    numa_node: int | None
    switches: tuple[str, ...] | None  # upstream ports, nearest first; None: a bridge's class does not say

    @property
    def nearest_switch(self) -> str | None:
        return self.switches[0] if self.switches else None


def affinity(a: PciPlacement, b: PciPlacement) -> str | None:
    """The nvidia-smi class of the path between two devices; None when sysfs does not say."""
    if a.host_bridge != b.host_bridge:
        if a.numa_node is None or b.numa_node is None:
            return None
        return "NODE" if a.numa_node == b.numa_node else "SYS"
    if a.switches is None or b.switches is None:
        return None
    for i, switch in enumerate(a.switches):
        if switch in b.switches:
            return "PIX" if i == 0 and b.switches.index(switch) == 0 else "PXB"
    return "PHB"


def placement(sysfs: Path, link: Path, reader: AttributeReader = read_attribute) -> PciPlacement | str:
    """The placement of the device ``link`` (a sysfs symlink) resolves to, or why there is none."""
    devices = os.path.realpath(sysfs / "devices")
    shown = os.path.relpath(link, sysfs)
    try:
        real = os.path.realpath(link, strict=True)
    except (OSError, RuntimeError) as exc:  # missing, dangling, a loop
        return f"{shown}: no PCI device ({exc.__class__.__name__})"
    if not real.startswith(devices + os.sep):
        return f"{shown}: resolves outside the sysfs devices folder"
    parts = real[len(devices) + 1 :].split(os.sep)
    if len(parts) < 2 or len(parts) > MAX_PATH_COMPONENTS or not _HOST_BRIDGE_RE.match(parts[0]):
        return f"{shown}: devices/{'/'.join(parts[:4])} is not below a PCI host bridge"
    functions = tuple(parts[1:])
    if not all(_BDF_RE.match(p) for p in functions):
        return f"{shown}: devices/{'/'.join(parts)} is not a chain of PCI functions"
    numa = _numa_node(reader(os.path.join(real, "numa_node")))
    return PciPlacement(
        address=functions[-1],
        host_bridge=parts[0],
        path=functions,
        numa_node=numa,
        switches=_switches(devices, parts, reader),
    )


def _numa_node(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        value = int(text.strip())
    except ValueError:
        return None
    return value if value >= 0 else None


def _switches(devices: str, parts: list[str], reader: AttributeReader) -> tuple[str, ...] | None:
    """Upstream ports above the device, nearest first (NCCL's climb two components at a time); None
    when a bridge on the way does not say it is one."""
    for depth in range(1, len(parts) - 1):  # every function between the host bridge and the device
        cls = reader(os.path.join(devices, *parts[: depth + 1], "class"))
        if cls is None or not cls.lower().startswith(BRIDGE_CLASS_PREFIX):
            return None
    last = len(parts) - 1
    return tuple(parts[i] for i in range(last - 2, 0, -2))


@dataclass(frozen=True)
class GpuTopology:
    index: int
    uuid: str
    pci_bus_id: str  # as NVML reports it
    placement: PciPlacement | None


# Why an RDMA device has no PCI placement (NicTopology.unplaced).
UNPLACED_NOT_PCI = "not_pci"  # a software device (rxe, siw) under /sys/devices/virtual: no PCI function
UNPLACED_UNREADABLE = "unreadable"  # its link is missing, broken or leads to no PCI function: a problem


@dataclass(frozen=True)
class NicTopology:
    device: str  # the RDMA device, mlx5_0
    placement: PciPlacement | None
    virtual_function: bool = False  # an SR-IOV VF (its function has a physfn link): not in the matrix
    unplaced: str | None = None  # UNPLACED_*: why there is no placement (None when there is one)


@dataclass(frozen=True)
class Topology:
    """The node's GPUs and RDMA NICs with their placements; see the module docstring."""

    gpus: tuple[GpuTopology, ...] = ()
    nics: tuple[NicTopology, ...] = ()
    problems: tuple[str, ...] = ()
    # (gpu index, device) -> class, for the pairs sysfs says something of
    classes: dict[tuple[int, str], str] = field(default_factory=dict)
    # SR-IOV VF PCI address -> its PF's, for the PFs that carry an RDMA device (the VF's physfn link)
    vf_parents: dict[str, str] = field(default_factory=dict)

    def affinity(self, gpu: int, device: str) -> str | None:
        return self.classes.get((gpu, device))

    @property
    def physical_nics(self) -> tuple[NicTopology, ...]:
        """The NICs of the GPU x NIC matrix: physical functions with a PCI placement (a VF sits where
        its PF does; a device without a placement is in ``unplaced_nics``)."""
        return tuple(nic for nic in self.nics if not nic.virtual_function and nic.placement is not None)

    @property
    def unplaced_nics(self) -> tuple[NicTopology, ...]:
        """RDMA devices sysfs gives no PCI placement: software devices and broken links."""
        return tuple(nic for nic in self.nics if nic.placement is None)

    def nearest(self, gpu: int) -> tuple[str, tuple[str, ...]] | None:
        """The nearest class from GPU ``gpu`` to any physical NIC and the NICs at it.

        A NIC whose class to the GPU is unknown is passed over when it cannot be nearer than the
        nearest known one: on another host bridge it is NODE at best (its NUMA node unknown), so a
        known PIX, PXB or PHB stands. Otherwise (an unknown NIC on the GPU's own host bridge, or
        nothing better than NODE known) the answer is None: one unknown NIC might be nearer. NICs
        without a placement (``unplaced_nics``) are not in the matrix and never in the way."""
        place = next((g.placement for g in self.gpus if g.index == gpu), None)
        if place is None:
            return None
        nics = self.physical_nics
        found = [self.classes.get((gpu, nic.device)) for nic in nics]
        known = [cls for cls in found if cls is not None]
        if not known:
            return None
        best = min(known, key=AFFINITIES.index)
        unknown = [nic for nic, cls in zip(nics, found, strict=True) if cls is None]
        beyond_reach = AFFINITIES.index(best) < AFFINITIES.index("NODE") and all(
            nic.placement is not None and nic.placement.host_bridge != place.host_bridge for nic in unknown
        )
        if unknown and not beyond_reach:
            return None
        return best, tuple(nic.device for nic, cls in zip(nics, found, strict=True) if cls == best)

    def gpu_at(self, address: str) -> GpuTopology | None:
        """The GPU at sysfs PCI address ``address``."""
        for gpu in self.gpus:
            if gpu.placement is not None and gpu.placement.address == address:
                return gpu
            if sysfs_address(gpu.pci_bus_id) == address:
                return gpu
        return None

    def nics_at(self, address: str) -> tuple[str, ...]:
        """The RDMA devices of the PCI function at ``address`` (a PF or a VF)."""
        return tuple(n.device for n in self.nics if n.placement is not None and n.placement.address == address)

    def physical_function_of(self, address: str) -> str | None:
        """The PF of the SR-IOV VF at ``address`` when that PF carries an RDMA device (None otherwise).

        In the RDMA subsystem's exclusive network-namespace mode (``rdma system set netns
        exclusive``) a VF's RDMA device moves into the pod's network namespace with its netdev and is
        gone from the host's ``/sys/class/infiniband``; its PCI function, and the ``physfn`` link to
        its PF, stay."""
        return self.vf_parents.get(address)

    def has_nic(self, device: str) -> bool:
        return any(n.device == device for n in self.nics)


def build_topology(
    sysfs: Path, gpus: Iterable[GpuIdentity], reader: AttributeReader = read_attribute, problems: Iterable[str] = ()
) -> Topology:
    """Walk sysfs for ``gpus`` (from NVML) and every RDMA device under ``<sysfs>/class/infiniband``."""
    found_problems = list(problems)
    gpu_records = []
    for gpu in list(gpus)[:MAX_DEVICES]:
        address = sysfs_address(gpu.pci_bus_id)
        place: PciPlacement | str | None
        if address is None:
            place = f"GPU {gpu.index}: PCI bus id {gpu.pci_bus_id!r} is not dddd:bb:dd.f"
        else:
            place = placement(sysfs, sysfs / "bus" / "pci" / "devices" / address, reader)
        if isinstance(place, str):
            found_problems.append(f"GPU {gpu.index}: {place}")
            place = None
        gpu_records.append(GpuTopology(gpu.index, gpu.uuid, gpu.pci_bus_id, place))
    nic_records = []
    class_dir = sysfs / "class" / "infiniband"
    for device in list_dir(class_dir)[:MAX_DEVICES]:
        place = _nic_placement(sysfs, class_dir / device, reader)
        if isinstance(place, str):
            if _is_software_device(sysfs, class_dir / device):
                nic_records.append(NicTopology(device, None, unplaced=UNPLACED_NOT_PCI))
            else:
                found_problems.append(f"{device}: {place}")
                nic_records.append(NicTopology(device, None, unplaced=UNPLACED_UNREADABLE))
            continue
        function = os.path.join(os.path.realpath(sysfs / "devices"), place.host_bridge, *place.path)
        nic_records.append(NicTopology(device, place, os.path.lexists(os.path.join(function, "physfn"))))
    pf_addresses = {n.placement.address for n in nic_records if n.placement is not None and not n.virtual_function}
    classes: dict[tuple[int, str], str] = {}
    for gpu_record in gpu_records:
        for nic in nic_records:
            if gpu_record.placement is None or nic.placement is None:
                continue
            cls = affinity(gpu_record.placement, nic.placement)
            if cls is not None:
                classes[(gpu_record.index, nic.device)] = cls
    vf_parents = _virtual_function_parents(sysfs, pf_addresses)
    return Topology(tuple(gpu_records), tuple(nic_records), tuple(found_problems), classes, vf_parents)


def _virtual_function_parents(sysfs: Path, pf_addresses: set[str]) -> dict[str, str]:
    """VF address -> PF address for every SR-IOV VF of ``pf_addresses``, from each VF's ``physfn``
    link (``/sys/bus/pci/devices/<vf>/physfn -> ../<pf>``, the kernel's drivers/pci/iov.c)."""
    if not pf_addresses:
        return {}
    bus = sysfs / "bus" / "pci" / "devices"
    parents: dict[str, str] = {}
    for address in list_dir(bus)[:MAX_PCI_FUNCTIONS]:
        if not _BDF_RE.match(address):
            continue
        try:
            target = os.readlink(bus / address / "physfn")
        except OSError:
            continue  # not a VF (no physfn link)
        parent = os.path.basename(target.rstrip("/"))
        if parent in pf_addresses:
            parents[address] = parent
    return parents


def _is_software_device(sysfs: Path, entry: Path) -> bool:
    """Whether an RDMA class entry is a device the kernel made without hardware (soft-RoCE ``rxe``,
    ``siw``): it resolves under ``devices/virtual`` and has no ``device`` link to a bus device."""
    try:
        real = os.path.realpath(entry, strict=True)
    except (OSError, RuntimeError):
        return False
    virtual = os.path.join(os.path.realpath(sysfs / "devices"), "virtual") + os.sep
    return real.startswith(virtual) and not os.path.lexists(entry / "device")


def _nic_placement(sysfs: Path, entry: Path, reader: AttributeReader) -> PciPlacement | str:
    """An RDMA device's PCI function: its ``device`` link (as NCCL reads it), else the function its
    class entry lives under (``devices/.../<bdf>/infiniband/<dev>``, for trees without the link)."""
    place = placement(sysfs, entry / "device", reader)
    if not isinstance(place, str):
        return place
    try:
        real = Path(os.path.realpath(entry, strict=True))
    except (OSError, RuntimeError):
        return place
    if real.parent.name != "infiniband" or real.name != entry.name:
        return place
    return placement(sysfs, entry / ".." / "..", reader)


Fingerprint = tuple[tuple[tuple[str, str], ...], tuple[tuple[int, str, str], ...]]


class TopologySource:
    """The node's topology, walked again only when the node changes; ``read`` never raises."""

    def __init__(
        self,
        sysfs: Path,
        nvml: NvmlBackend | None,
        *,
        check_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        reader: AttributeReader = read_attribute,
    ) -> None:
        self._sysfs = sysfs
        self._nvml = nvml
        self._check_seconds = check_seconds
        self._clock = clock
        self._reader = reader
        self._lock = threading.Lock()
        self._cached: tuple[Fingerprint, Topology] | None = None
        self._checked_at: float | None = None
        self.walks = 0  # how often sysfs was walked (a test and the docs tell it apart from checks)

    def _gpus(self) -> tuple[list[GpuIdentity], list[str]]:
        if self._nvml is None:
            return [], []
        try:
            return self._nvml.gpus(), []
        except NvmlUnavailable as exc:
            return [], [f"NVML: {exc}"]
        except Exception as exc:  # noqa: BLE001 - NVML errors of any kind: no GPUs known, said so
            return [], [f"NVML: {exc}"]

    def _fingerprint(self, gpus: list[GpuIdentity]) -> Fingerprint:
        class_dir = self._sysfs / "class" / "infiniband"
        nics = []
        for device in list_dir(class_dir)[:MAX_DEVICES]:
            nics.append((device, _link_text(class_dir / device) + "|" + _link_text(class_dir / device / "device")))
        return tuple(nics), tuple((g.index, g.uuid, g.pci_bus_id) for g in gpus[:MAX_DEVICES])

    def read(self) -> Topology:
        with self._lock:
            now = self._clock()
            if (
                self._cached is not None
                and self._checked_at is not None
                and now - self._checked_at < self._check_seconds
            ):
                return self._cached[1]
            self._checked_at = now
            gpus, problems = self._gpus()
            fingerprint = self._fingerprint(gpus)
            if self._cached is not None and self._cached[0] == fingerprint:
                return self._cached[1]
            topology = build_topology(self._sysfs, gpus, self._reader, problems)
            self.walks += 1
            if self._cached is not None:
                log.info("node topology changed: %d GPUs, %d RDMA devices", len(topology.gpus), len(topology.nics))
            self._cached = (fingerprint, topology)
            return topology


def _link_text(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""

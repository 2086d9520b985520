"""Which RDMA NICs each pod was given, from what the kubelet and Multus say of it.

Three ways a NIC reaches a pod, each named in the ``source`` of a binding:

- ``device_plugin``: a device plugin's resource (``RdmaResources``: names or prefixes, by default
  SR-IOV's ``intel.com/``, ``openshift.io/``, NVIDIA's ``nvidia.com/hostdev`` and
  ``nvidia.com/mlnxnics``, and ``rdma/``). SR-IOV and host-device plugins name a device by its PCI
  address; the RDMA shared device plugin hands out numbered shares of a pool of HCAs
  (``rdma/hca_shared_devices_a`` ids ``0``, ``1``, ...), whose HCAs only its own configuration
  says, so a pool is named here (``pools``) or its pods get no binding;
- ``dra``: a DRA claim's device (any driver but a GPU one) whose name or CDI device name spells a
  PCI address (``pci-0000-19-00-0``) or is an RDMA device's name;
- ``multus``: the pod's ``network-status`` annotation, ``device-info.pci`` (``rdma-device``, else
  ``pci-address``).

A device becomes an RDMA NIC only through the node's topology: a PCI function that carries an
RDMA device (a PF or an SR-IOV VF), or an RDMA device present under ``/sys/class/infiniband``.
In the RDMA subsystem's exclusive network-namespace mode a VF's RDMA device moves into the pod's
network namespace and is gone from the host: a VF address that carries no RDMA device on the host
resolves to its PF's (the VF's ``physfn`` link, or Multus's ``device-info.pci.pf-pci-address``),
the NIC whose port the pod's traffic leaves through. What does not resolve is counted, never
guessed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from exporter.sources.kube import PodMetadata
from exporter.sources.podresources import SOURCE_DEVICE_PLUGIN, SOURCE_DRA, PodResourcesListing
from exporter.sources.topology import Topology, pci_address_in

SOURCE_MULTUS = "multus"
DEFAULT_RDMA_RESOURCES = ("rdma/", "nvidia.com/hostdev", "nvidia.com/mlnxnics", "openshift.io/", "intel.com/")
MAX_BINDINGS = 4096


@dataclass(frozen=True)
class RdmaResources:
    """Which device-plugin resources carry RDMA NICs: exact names, or prefixes ending in ``/``; and
    the HCAs of shared-device pools (resource -> RDMA devices)."""

    names: tuple[str, ...] = DEFAULT_RDMA_RESOURCES
    pools: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def matches(self, resource: str) -> bool:
        return resource in self.pools or any(
            resource.startswith(name) if name.endswith("/") else resource == name for name in self.names
        )


def parse_pools(text: str) -> dict[str, tuple[str, ...]]:
    """``rdma/hca_shared_devices_a=mlx5_0+mlx5_1,rdma/other=mlx5_2`` -> {resource: devices}; raises ValueError."""
    pools: dict[str, tuple[str, ...]] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        resource, sep, devices = item.partition("=")
        names = tuple(filter(None, (d.strip() for d in devices.split("+"))))
        if not sep or not resource.strip() or not names:
            raise ValueError(f"{item!r} is not RESOURCE=device[+device...]")
        pools[resource.strip()] = names
    return pools


@dataclass(frozen=True)
class RdmaBinding:
    namespace: str
    pod: str
    device: str  # the RDMA device, mlx5_3
    source: str  # device_plugin, dra or multus
    resource: str  # the resource, DRA driver or Multus network that brought it


def resolve(topology: Topology, *names: str) -> tuple[str, ...]:
    """The RDMA devices a device's names point at: an RDMA device's own name, else the RDMA devices of
    the PCI function an address in a name spells, else, for an SR-IOV VF whose RDMA device is not on
    the host (exclusive netns mode), those of its PF."""
    for name in names:
        if topology.has_nic(name):
            return (name,)
    addresses = [address for address in map(pci_address_in, names) if address is not None]
    for address in addresses:
        found = topology.nics_at(address)
        if found:
            return found
    for address in addresses:
        parent = topology.physical_function_of(address)
        found = topology.nics_at(parent) if parent else ()
        if found:
            return found
    return ()


def rdma_bindings(
    listing: PodResourcesListing | None,
    pods: Iterable[PodMetadata],
    topology: Topology,
    resources: RdmaResources,
) -> tuple[list[RdmaBinding], int]:
    """Every pod's RDMA NICs (sorted, one per pod/device/source/resource), and how many devices of RDMA
    resources named no RDMA NIC of this node (a DRA or Multus device that is none is simply not one)."""
    found: set[RdmaBinding] = set()
    unresolved = 0

    def add(namespace: str, pod: str, devices: tuple[str, ...], source: str, resource: str) -> None:
        nonlocal unresolved
        if not devices and source == SOURCE_DEVICE_PLUGIN:
            unresolved += 1  # an RDMA resource's device that names no RDMA NIC here
        for device in devices:
            if len(found) < MAX_BINDINGS:
                found.add(RdmaBinding(namespace, pod, device, source, resource))

    if listing is not None:
        for d in listing.devices:
            if not resources.matches(d.resource):
                continue
            pool = resources.pools.get(d.resource)
            devices = tuple(n for n in pool if topology.has_nic(n)) if pool else resolve(topology, d.device_id)
            add(d.namespace, d.pod, devices, SOURCE_DEVICE_PLUGIN, d.resource)
        for dyn in listing.dynamic:
            add(dyn.namespace, dyn.pod, resolve(topology, dyn.device, *dyn.cdi_devices), SOURCE_DRA, dyn.driver)
    for pod in pods:
        for attached in pod.attached_devices:
            names = tuple(n for n in (attached.rdma_device, attached.pci_address, attached.pf_pci_address) if n)
            add(pod.namespace, pod.name, resolve(topology, *names), SOURCE_MULTUS, attached.network)
    return sorted(found, key=lambda b: (b.namespace, b.pod, b.device, b.source, b.resource)), unresolved

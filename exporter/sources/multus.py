"""Which networks Multus attached to a pod: the ``k8s.v1.cni.cncf.io/network-status`` annotation.

Multus writes, on every pod it wires, a JSON list with one object per attachment: ``name`` (the
NetworkAttachmentDefinition, ``<namespace>/<name>``), ``interface`` (in the pod), ``ips``,
``mac``, ``default`` and, for device-backed networks (SR-IOV, host-device, RDMA), a
``device-info`` object (k8snetworkplumbingwg device-info spec, ``pkg/apis/k8s.cni.cncf.io/v1``
``DeviceInfo``): ``{"type": "pci", "version": "1.1.0", "pci": {"pci-address": ..., "rdma-device":
..., "pf-pci-address": ...}}`` (``PciDevice`` there: ``pf-pci-address`` is the VF's PF, given
since device-info 1.1.0 by the SR-IOV network device plugin). Older Multus wrote the same list
under ``networks-status``.

``attached_devices`` keeps, per attachment, what names a host device: the PCI address, the RDMA
device and the PF's PCI address. An annotation that is not such a list is ignored (never an error); the text read and
the attachments kept are bounded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

NETWORK_STATUS_ANNOTATION = "k8s.v1.cni.cncf.io/network-status"
OLD_NETWORK_STATUS_ANNOTATION = "k8s.v1.cni.cncf.io/networks-status"
MAX_ANNOTATION_CHARS = 64 * 1024
MAX_ATTACHMENTS = 64
MAX_VALUE_CHARS = 253


@dataclass(frozen=True)
class AttachedDevice:
    """A host device Multus attached to a pod (an attachment with ``device-info.pci``)."""

    network: str  # the NetworkAttachmentDefinition, as Multus names it
    interface: str  # the interface inside the pod ("" when not given)
    pci_address: str | None
    rdma_device: str | None
    pf_pci_address: str | None = None  # the PF of an SR-IOV VF


def _text(value: Any) -> str | None:
    return value[:MAX_VALUE_CHARS] if isinstance(value, str) and value else None


def attached_devices(annotations: Mapping[str, Any] | None) -> tuple[AttachedDevice, ...]:
    """The device-backed attachments of a pod's network-status annotation (the new name wins)."""
    if not annotations:
        return ()
    raw = annotations.get(NETWORK_STATUS_ANNOTATION) or annotations.get(OLD_NETWORK_STATUS_ANNOTATION)
    if not isinstance(raw, str) or len(raw) > MAX_ANNOTATION_CHARS:
        return ()
    try:
        entries = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser recurses
        return ()
    if not isinstance(entries, list):
        return ()
    found: list[AttachedDevice] = []
    for entry in entries[:MAX_ATTACHMENTS]:
        if not isinstance(entry, dict):
            continue
        info = entry.get("device-info")
        pci = info.get("pci") if isinstance(info, dict) else None
        if not isinstance(pci, dict):
            continue
        address, rdma = _text(pci.get("pci-address")), _text(pci.get("rdma-device"))
        if address is None and rdma is None:
            continue
        found.append(
            AttachedDevice(
                _text(entry.get("name")) or "",
                _text(entry.get("interface")) or "",
                address,
                rdma,
                _text(pci.get("pf-pci-address")),
            )
        )
    return tuple(found)

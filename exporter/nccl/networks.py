"""Which NCCL network names carry RDMA and which carry TCP.

NCCL prints the network as ``Using network <name>`` and in every channel line
``via NET/<name>/<dev>``. Whether that network is RDMA is decided by this table, never by
"is it Socket": Google's plugins carry TCP payloads under other names, and aws-ofi-nccl carries
whatever its libfabric provider carries (``NET/OFI Selected provider is tcp;ofi_rxm`` is TCP
whatever the network is called).
"""

from __future__ import annotations

from typing import NamedTuple

RDMA = "rdma"
TCP = "tcp"


class Selection(NamedTuple):
    """The network a process or communicator uses: its name as NCCL printed it (None when the lines
    that show the choice do not name it, e.g. aws-ofi-nccl known only by its provider line), the
    line that says so, and its class (``"rdma"``, ``"tcp"`` or None)."""

    name: str | None
    line: str | None
    cls: str | None


NO_SELECTION = Selection(None, None, None)

# (how the name is matched, the lower-cased pattern, class). First match wins.
_TABLE: tuple[tuple[str, str, str], ...] = (
    ("exact", "ib", RDMA),  # NCCL's verbs transport: InfiniBand and RoCE
    ("prefix", "ibext", RDMA),  # nccl-rdma-sharp-plugins (HPC-X): IBext, IBext_v8 ...
    ("prefix", "ucx", RDMA),  # the same plugin's UCX / UCX-RMA transports
    # The same plugin by the name it loads under ("NCCL RDMA Plugin v10"), which 2.29's "Assigned NET
    # plugin" line prints: its init swaps in IBext or UCX (p2p_plugin.c), both RDMA, and NCCL's own
    # RAS code lists it among the verbs plugins (ras/diagnostics).
    ("prefix", "nccl rdma plugin", RDMA),
    ("exact", "sharp", RDMA),  # its CollNet side
    ("contains", "libfabric", RDMA),  # aws-ofi-nccl: "AWS Libfabric", "Libfabric" (EFA, cxi)
    ("exact", "ofi", RDMA),  # aws-ofi-nccl when NCCL_NET=OFI
    ("exact", "socket", TCP),  # NCCL's internal TCP transport (also over IPoIB)
    ("prefix", "gpudirecttcpx", TCP),  # GCP A3 High TCPX plugin
    ("prefix", "fastrak", TCP),  # GCP A3 Mega TCPXO plugin (TCP-like datapath)
    ("prefix", "fastsocket", TCP),  # GCP NCCL Fast Socket plugin
)


# libfabric providers (fi_provider(7)) by the first component of aws-ofi-nccl's provider string
# ("tcp;ofi_rxm": tcp under the RxM utility provider). shm and others say nothing about the fabric.
_PROVIDER_TABLE: tuple[tuple[str, str], ...] = (
    ("tcp", TCP),
    ("sockets", TCP),
    ("udp", TCP),
    ("efa", RDMA),  # AWS Elastic Fabric Adapter (efa, efa-direct)
    ("verbs", RDMA),  # InfiniBand / RoCE through libfabric
    ("psm", RDMA),  # Intel/Cornelis Omni-Path (psm2, psm3)
    ("cxi", RDMA),  # HPE Slingshot
    ("opx", RDMA),  # Cornelis Omni-Path Express
)


def provider_class(provider: str | None) -> str | None:
    """``"rdma"``, ``"tcp"`` or None for an aws-ofi-nccl libfabric provider string."""
    if not provider:
        return None
    core = provider.strip().lower().split(";", 1)[0]
    for prefix, cls in _PROVIDER_TABLE:
        if core.startswith(prefix):
            return cls
    return None


def is_libfabric(name: str | None) -> bool:
    """A network name aws-ofi-nccl registers: ``AWS Libfabric``, ``Libfabric`` or ``OFI``."""
    key = (name or "").strip().lower()
    return "libfabric" in key or key == "ofi"


def network_class(name: str | None, provider: str | None = None) -> str | None:
    """``"rdma"``, ``"tcp"`` or None (no name, or a name this table does not know).

    ``provider`` is aws-ofi-nccl's selected libfabric provider, when the log shows it: it decides
    for an aws-ofi-nccl network (or no name at all), whatever the network is called.
    """
    if provider and (not name or is_libfabric(name)):
        by_provider = provider_class(provider)
        if by_provider is not None:
            return by_provider
    if not name:
        return None
    key = name.strip().lower()
    for how, pattern, cls in _TABLE:
        if (
            (how == "exact" and key == pattern)
            or (how == "prefix" and key.startswith(pattern))
            or (how == "contains" and pattern in key)
        ):
            return cls
    return None


# What people write in the ccl-health.io/expected-network label besides NCCL's own names.
_EXPECTED_ALIASES = {
    "tcp": TCP,
    "socket": TCP,
    "sockets": TCP,
    "ethernet": TCP,
    "rdma": RDMA,
    "infiniband": RDMA,
    "roce": RDMA,
    "efa": RDMA,
}


def expected_network_class(value: str | None) -> str | None:
    """The class of a declared expected network (``socket``, ``tcp``, ``IB``, ``rdma``, ``FastSocket``, ...)."""
    key = (value or "").strip().lower()
    return _EXPECTED_ALIASES.get(key) or network_class(value)


def transport_of_network(name: str) -> str:
    """The ``transport`` label of a ``via NET/<name>`` connection: net_ib, net_socket or net_plugin."""
    if name == "IB":
        return "net_ib"
    if name == "Socket":
        return "net_socket"
    return "net_plugin"

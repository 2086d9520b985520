"""Which NCCL network names carry RDMA and which carry TCP.

NCCL prints the network as ``Using network <name>`` and in every channel line
``via NET/<name>/<dev>``. Whether that network is RDMA is decided by this table, never by
"is it Socket": Google's plugins carry TCP payloads under other names.
"""

from __future__ import annotations

RDMA = "rdma"
TCP = "tcp"

# (how the name is matched, the lower-cased pattern, class). First match wins.
_TABLE: tuple[tuple[str, str, str], ...] = (
    ("exact", "ib", RDMA),                 # NCCL's verbs transport: InfiniBand and RoCE
    ("prefix", "ibext", RDMA),             # nccl-rdma-sharp-plugins (HPC-X): IBext, IBext_v8 ...
    ("prefix", "ucx", RDMA),               # the same plugin's UCX / UCX-RMA transports
    ("exact", "sharp", RDMA),              # its CollNet side
    ("contains", "libfabric", RDMA),       # aws-ofi-nccl: "AWS Libfabric", "Libfabric" (EFA, cxi)
    ("exact", "ofi", RDMA),                # aws-ofi-nccl when NCCL_NET=OFI
    ("exact", "socket", TCP),              # NCCL's internal TCP transport (also over IPoIB)
    ("prefix", "gpudirecttcpx", TCP),      # GCP A3 High TCPX plugin
    ("prefix", "fastrak", TCP),            # GCP A3 Mega TCPXO plugin (TCP-like datapath)
    ("prefix", "fastsocket", TCP),         # GCP NCCL Fast Socket plugin
)


def network_class(name: str | None) -> str | None:
    """``"rdma"``, ``"tcp"`` or None (no name, or a name this table does not know)."""
    if not name:
        return None
    key = name.strip().lower()
    for how, pattern, cls in _TABLE:
        if (how == "exact" and key == pattern) or (how == "prefix" and key.startswith(pattern)) or (
            how == "contains" and pattern in key
        ):
            return cls
    return None


def transport_of_network(name: str) -> str:
    """The ``transport`` label of a ``via NET/<name>`` connection: net_ib, net_socket or net_plugin."""
    if name == "IB":
        return "net_ib"
    if name == "Socket":
        return "net_socket"
    return "net_plugin"

"""What the analyzer concludes, as data: the verdict of one log stream, its communicators and its
warnings, and ``to_json``, the object ``ccl-exporter analyze --json`` prints. No reasoning here:
:mod:`summaries` and :mod:`decision` fill these in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The scope a connection is counted under (CommunicatorSummary.transports).
INTER, INTRA, UNKNOWN = "inter_node", "intra_node", "unknown"


@dataclass(frozen=True)
class NcclWarning:
    """A warning line kept as a sample, and its category."""

    category: str
    line: str


@dataclass(frozen=True)
class CommunicatorSummary:
    """One communicator. ``comm_id`` is NCCL's commId (2.16.2+), ``nranks:<N>`` for older
    logs (ranks grouped by communicator size) or ``unattributed`` for connection lines whose
    communicator the log never named."""

    comm_id: str
    nranks: int | None
    nnodes: int | None
    network: str | None
    nccl_version: str | None
    transports: dict[tuple[str, str, str], int]  # (transport, scope, gdr "1"/"0"/"") -> connections
    gdr: bool | str | None
    inter_node_tcp: bool | None
    # "rdma", "tcp" or None: the network's class by the table, or by aws-ofi-nccl's provider
    network_class: str | None = None
    # An inter-node connection runs on an RDMA-class network without GPUDirect RDMA (NET/IB, or a
    # net plugin or CollNet when the network is RDMA-class): ccl_nccl_gdr_disabled. Not in to_json.
    gdr_disabled: bool = False
    gdr_disabled_line: str | None = None  # the line that shows it (cited as reasons cite lines). Not in to_json.

    def to_json(self) -> dict[str, Any]:
        return {
            "comm_id": self.comm_id,
            "nranks": self.nranks,
            "nnodes": self.nnodes,
            "network": self.network,
            "network_class": self.network_class,
            "nccl_version": self.nccl_version,
            "gdr": self.gdr,
            "inter_node_tcp": self.inter_node_tcp,
            "transports": {transport_key(k): v for k, v in sorted(self.transports.items())},
        }


def transport_key(key: tuple[str, str, str]) -> str:
    """``net_ib/inter_node/gdr``, ``net_socket/inter_node/no_gdr``, ``p2p/intra_node``."""
    transport, scope, gdr = key
    suffix = {"1": "/gdr", "0": "/no_gdr"}.get(gdr, "")
    return f"{transport}/{scope}{suffix}"


@dataclass(frozen=True)
class Verdict:
    verdict: str  # "rdma" | "tcp_fallback" | "single_node" | "unknown"
    inter_node_tcp: bool | None
    network: str | None
    gdr: bool | str | None
    nccl_version: str | None
    nodes: int | None
    nranks: int | None
    communicators: tuple[CommunicatorSummary, ...]
    warnings: tuple[NcclWarning, ...]
    reasons: tuple[str, ...]

    @classmethod
    def unknown(cls, reasons: tuple[str, ...] = ()) -> Verdict:
        return cls("unknown", None, None, None, None, None, None, (), (), reasons)

    def to_json(self) -> dict[str, Any]:
        """Exactly the object ``ccl-exporter analyze --json`` prints."""
        return {
            "verdict": self.verdict,
            "inter_node_tcp": self.inter_node_tcp,
            "network": self.network,
            "gdr": self.gdr,
            "nccl_version": self.nccl_version,
            "nodes": self.nodes,
            "nranks": self.nranks,
            "communicators": [c.to_json() for c in self.communicators],
            "warnings": [{"category": w.category, "line": w.line} for w in self.warnings],
            "reasons": list(self.reasons),
        }

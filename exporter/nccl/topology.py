"""What one log stream shows of a job's layout, for a picture: its nodes (hosts) with the
processes, ranks and GPUs each runs, and its inter-node connections grouped into edges by the
transport they run on. Pure: read from the analyzer's state, nothing else.

An edge joins two nodes the log names, or a node and ``OUTSIDE``: the peer of a connection
whose other end the log does not show (one pod's log shows only its own node's ranks). Its
``transport`` is ``tcp`` (a TCP-class network: Socket, FastSocket, ...), ``rdma_no_gdr`` (an RDMA
network without GPUDirect: staged through host memory), ``rdma``, ``nvlink`` (MNNVL across
nodes) or ``unknown`` (a network the table does not class).
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.nccl.facts import UNATTRIBUTED, Connection, Process, connection_class
from exporter.nccl.networks import RDMA, TCP
from exporter.nccl.state import StreamState
from exporter.nccl.summaries import attribute_connections

OUTSIDE = -1  # the node index of peers the log does not show
TCP_EDGE, RDMA_NO_GDR_EDGE, RDMA_EDGE, NVLINK_EDGE, UNKNOWN_EDGE = "tcp", "rdma_no_gdr", "rdma", "nvlink", "unknown"
TRANSPORTS = (TCP_EDGE, RDMA_NO_GDR_EDGE, RDMA_EDGE, NVLINK_EDGE, UNKNOWN_EDGE)
_INTER_NODE_KINDS = ("net", "collnet")


@dataclass(frozen=True)
class RankView:
    communicator: str  # commId, or the parser's key for older logs
    rank: int
    gpu: str | None  # as the init or channel lines name it (busId, NVML index)


@dataclass(frozen=True)
class ProcessView:
    label: str  # host:pid
    network: str | None  # the network the process selected, as NCCL printed it
    ranks: tuple[RankView, ...]


@dataclass(frozen=True)
class NodeView:
    host: str
    address: str  # the address that tells nodes with one hostname apart ("" when none shows)
    processes: tuple[ProcessView, ...]


@dataclass(frozen=True)
class EdgeView:
    a: int  # node index (a < b, or b == OUTSIDE)
    b: int
    transport: str  # one of TRANSPORTS
    network: str  # as NCCL printed it ("" when unnamed)
    connections: int  # distinct connection lines
    communicators: tuple[str, ...]
    line: str  # one of them, cited


@dataclass(frozen=True)
class Topology:
    nodes: tuple[NodeView, ...]
    edges: tuple[EdgeView, ...]
    nodes_not_shown: int = 0  # beyond max_nodes
    edges_not_shown: int = 0  # beyond max_edges


def edge_transport(connection: Connection) -> str:
    event = connection.event
    if event.mnnvl:
        return NVLINK_EDGE
    cls = connection_class(connection)
    if cls == TCP:
        return TCP_EDGE
    if cls == RDMA:
        return RDMA_EDGE if event.gdr else RDMA_NO_GDR_EDGE
    return UNKNOWN_EDGE


def _label(key: str, comm_id: str | None) -> str:
    return comm_id or key


def topology(state: StreamState, max_nodes: int = 64, max_edges: int = 256) -> Topology:
    """The layout the state shows, at most ``max_nodes`` nodes and ``max_edges`` edges (the rest
    counted)."""
    processes, nodes_of = state.process_nodes()
    keys = sorted({nodes_of[id(p)] for p in processes if id(p) in nodes_of})
    index = {key: i for i, key in enumerate(keys[:max_nodes])}

    # Connection lines by communicator, as the verdict attributes them; rank -> process per
    # communicator: its init lines, then the ranks its connection lines are logged by.
    buckets = attribute_connections(state)
    rank_processes: dict[str, dict[int, Process]] = {}
    for key in [*state.communicators, *buckets]:
        comm = state.communicators.get(key)
        known = rank_processes.setdefault(key, dict(comm.rank_process) if comm is not None else {})
        for connection in buckets.get(key, ()):
            if connection.process.key is not None and connection.event.kind != "collnet":
                known.setdefault(connection.event.logging_rank, connection.process)
    ranks: dict[int, list[RankView]] = {}  # id(process) -> its ranks
    for key, known in rank_processes.items():
        comm = state.communicators.get(key)
        label = "" if key == UNATTRIBUTED else _label(key, comm.comm_id if comm is not None else None)
        for rank, process in sorted(known.items()):
            gpu = comm.rank_gpu.get(rank) if comm is not None else None
            ranks.setdefault(id(process), []).append(RankView(label, rank, gpu))
    for rank, process in sorted(state.loose_ranks.items()):
        ranks.setdefault(id(process), []).append(RankView("", rank, None))

    members: dict[int, list[ProcessView]] = {i: [] for i in index.values()}
    for process in sorted(processes, key=lambda p: p.label()):
        node = index.get(nodes_of.get(id(process), ("", "")))
        if node is not None:
            shown = process.selected_network()
            members[node].append(ProcessView(process.label(), shown.name, tuple(ranks.get(id(process), ()))))
    nodes = tuple(NodeView(key[0], key[1], tuple(members[i])) for key, i in index.items())

    def node_of(process: Process | None) -> int | None:
        if process is None:
            return None
        key = nodes_of.get(id(process))
        return None if key is None else index.get(key)

    grouped: dict[tuple[int, int, str, str], list[tuple[str, Connection]]] = {}
    for key, connections in buckets.items():
        owner = rank_processes.get(key, {})
        for connection in connections:
            event = connection.event
            if event.kind not in _INTER_NODE_KINDS and not event.mnnvl:
                continue
            peer_rank = event.src if event.logging_rank == event.dst else event.dst
            here, peer = node_of(connection.process), node_of(owner.get(peer_rank))
            if here is None or peer == here:
                continue  # a process on no known node, or a network connection inside one node
            a, b = (here, OUTSIDE) if peer is None else (min(here, peer), max(here, peer))
            grouped.setdefault((a, b, edge_transport(connection), event.network or ""), []).append((key, connection))
    edges = []
    for (a, b, transport, network), found in sorted(grouped.items(), key=lambda item: (item[0], -len(item[1]))):
        named = {key for key, _ in found if key in state.communicators}
        comms = sorted(_label(key, state.communicators[key].comm_id) for key in named)
        edges.append(EdgeView(a, b, transport, network, len(found), tuple(comms), found[0][1].cited))
    return Topology(
        nodes=nodes,
        edges=tuple(edges[:max_edges]),
        nodes_not_shown=max(0, len(keys) - max_nodes),
        edges_not_shown=max(0, len(edges) - max_edges),
    )

"""Which ranks of one communicator share a node, and so the scope of each of its connections.

Scope (inter-node or intra-node) of a connection is decided from evidence, never from "it
says NET": per communicator, ranks are grouped into nodes by

* the logging process's node (hostname, told apart by the bootstrap/OOB address when one
  hostname shows several addresses),
* P2P and SHM connections (always inside one node; ``P2P/MNNVL`` excepted),
* two different ranks on the same GPU (same busId or NVML index in channel lines) — they
  cannot share a node,
* ``nNodes`` (2.20+): one node means every connection is intra-node.

When hostnames contradict the GPU evidence (hostnames are not unique across nodes), they
are ignored. Whatever cannot be decided stays ``unknown``/None.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from exporter.nccl.events import ConnectionEvent
from exporter.nccl.facts import (
    UNATTRIBUTED,
    Communicator,
    Connection,
    NodeKey,
    Process,
    host_node_key,
    loopback_hosts,
    only_loopback,
)
from exporter.nccl.state import StreamState
from exporter.nccl.verdict import INTER, INTRA, UNKNOWN


@dataclass(frozen=True)
class Span:
    """Where one communicator's ranks run, as far as the log shows."""

    processes: list[Process]  # the processes logging its ranks and connection lines
    scope: Callable[[ConnectionEvent], str]  # a connection line's scope: INTER, INTRA or UNKNOWN
    nranks: int | None
    nodes: int | None  # how many nodes, when the log shows exactly
    single: bool  # on one node
    multi: bool | None  # on several nodes (None: the log does not show)
    multi_why: str | None  # what shows several nodes, for a reason
    single_why: str | None  # what shows one node, for a reason


def place(
    state: StreamState, key: str, comm: Communicator | None, conns: list[Connection], nodes_of: dict[int, NodeKey]
) -> Span:
    """Where communicator ``key``'s ranks run, from the processes logging them, its connection lines
    and its GPUs (``nodes_of``: id(process) -> node key)."""
    rank_process, mixed = _rank_processes(comm, conns)
    if mixed:
        return _place_mixed(comm, conns, rank_process, nodes_of)
    nranks = comm.nranks if comm is not None else None
    if takes_loose_ranks(state, key):
        for rank, process in state.loose_ranks.items():
            rank_process.setdefault(rank, process)
        nranks = nranks or state.loose_nranks
    host_links = [(r, nodes_of[id(p)]) for r, p in rank_process.items() if id(p) in nodes_of]
    nranks = _add_test_table(state, key, comm, nranks, rank_process, host_links)
    groups, hosts_trusted = _group_ranks(host_links, _same_node_links(conns), comm, conns)
    processes = _distinct(list(rank_process.values()) + [c.process for c in conns])
    return _span(comm, nranks, groups, hosts_trusted, processes, state.limits.max_ranks)


def takes_loose_ranks(state: StreamState, key: str) -> bool:
    """Ranks logged outside any known communicator belong to this one: the log names no other."""
    if not state.loose_ranks or state.loose_mixed:
        return False
    named = [k for k in state.communicators if k != UNATTRIBUTED]
    return (named == [key]) or (not named and key == UNATTRIBUTED)


# ---------------------------------------------------------------------------------------------
# Evidence


def _rank_processes(comm: Communicator | None, conns: list[Connection]) -> tuple[dict[int, Process], bool]:
    """Rank -> the process logging it (init lines, then connection lines), and whether one rank shows
    two processes: lines of several communicators under one key."""
    rank_process: dict[int, Process] = dict(comm.rank_process) if comm is not None else {}
    mixed = comm.mixed if comm is not None else False
    for c in conns:
        if c.process.key is not None and c.event.kind != "collnet":
            known = rank_process.setdefault(c.event.logging_rank, c.process)
            mixed |= known.key != c.process.key
    return rank_process, mixed


def _add_test_table(
    state: StreamState,
    key: str,
    comm: Communicator | None,
    nranks: int | None,
    rank_process: dict[int, Process],
    host_links: list[tuple[int, NodeKey]],
) -> int | None:
    """Adds the ranks nccl-tests' device table places, when the table is this communicator's; returns
    the communicator's size, which the table gives when it lists every rank."""
    table = state.test_ranks if not state.test_runs_mixed else {}
    if not table or not (key == UNATTRIBUTED or (comm is not None and comm.nranks == len(table))):
        return nranks
    if nranks is None and sorted(table) == list(range(len(table))):
        nranks = len(table)  # the nccl-tests device table lists every rank of the run
    all_processes, _ = state.process_nodes()
    for rank, (host, pid) in table.items():
        node = host_node_key(host, all_processes)
        if node is not None:
            host_links.append((rank, node))
        process = state.processes.get((host, pid))
        if process is not None:
            rank_process.setdefault(rank, process)
    return nranks


def _same_node_links(conns: list[Connection]) -> list[tuple[int, int]]:
    """Pairs of ranks a P2P (not MNNVL) or SHM connection joins: always inside one node."""
    return [
        (c.event.src, c.event.dst)
        for c in conns
        if (c.event.kind == "shm" or (c.event.kind == "p2p" and not c.event.mnnvl))
    ]


def _gpu_ids(comm: Communicator | None, conns: list[Connection]) -> tuple[dict[int, str], bool]:
    """Rank -> its GPU id (init lines, then channel lines), and whether they are usable: False when a
    rank shows two GPUs (lines of several communicators mixed)."""
    rank_ids: dict[int, str] = dict(comm.rank_gpu) if comm is not None else {}
    usable = True
    for c in conns:
        e = c.event
        if e.kind == "collnet" or not e.ids_are_devices:
            continue
        for rank, gpu in ((e.src, e.src_id), (e.dst, e.dst_id)):
            if gpu is not None and rank_ids.setdefault(rank, gpu.lower()) != gpu.lower():
                usable = False
    return rank_ids, usable


# ---------------------------------------------------------------------------------------------
# Grouping ranks into nodes


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[object, object] = {}

    def find(self, x: object) -> object:
        parent = self.parent
        parent.setdefault(x, x)
        root = x
        while parent[root] != root:
            root = parent[root]
        while parent[x] != root:
            parent[x], x = root, parent[x]
        return root

    def union(self, a: object, b: object) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb


@dataclass
class _RankGroups:
    """Ranks grouped into nodes, which groups are known nodes, and which GPUs each group holds."""

    uf: _UnionFind
    comp_nodes: dict[object, set[object]]  # group -> node keys of the processes logging its ranks
    comp_ids: dict[object, set[str]]  # group -> GPU ids of its ranks
    id_comps: dict[str, set[object]]  # GPU id -> groups with a rank on it

    def comp(self, rank: int) -> object:
        return self.uf.find(("r", rank))

    def distinct(self, ca: object, cb: object) -> bool:
        """Two groups are on different nodes: different node keys, or a GPU id in both."""
        na, nb = self.comp_nodes.get(ca), self.comp_nodes.get(cb)
        if na and nb and na.isdisjoint(nb):
            return True
        ia, ib = self.comp_ids.get(ca), self.comp_ids.get(cb)
        return bool(ia and ib and not ia.isdisjoint(ib))

    def scope(self, a: int, b: int, single: bool) -> str:
        """The scope of a connection from rank ``a`` to rank ``b`` (``single``: all ranks on one node)."""
        if a == b:
            return UNKNOWN
        ca, cb = self.comp(a), self.comp(b)
        if ca == cb:
            return INTRA
        if self.distinct(ca, cb):
            return INTER
        return INTRA if single else UNKNOWN

    def shows_several_nodes(self) -> bool:
        """Two groups are known nodes, or one GPU id is held in two groups."""
        return len([c for c, nodes in self.comp_nodes.items() if nodes]) > 1 or any(
            len(comps) > 1 for comps in self.id_comps.values()
        )


def _group(
    host_links: list[tuple[int, NodeKey]],
    same_links: list[tuple[int, int]],
    rank_ids: dict[int, str],
    use_hosts: bool,
    use_ids: bool,
) -> tuple[_RankGroups, bool]:
    """The groups the chosen evidence makes, and whether it contradicts itself (two ranks of one
    group on one GPU)."""
    uf = _UnionFind()
    for a, b in same_links:
        uf.union(("r", a), ("r", b))
    if use_hosts:
        for rank, node in host_links:
            uf.union(("r", rank), ("n", node))
    comp_nodes: dict[object, set[object]] = {}
    if use_hosts:
        for _, node in host_links:
            comp_nodes.setdefault(uf.find(("n", node)), set()).add(node)
    comp_ids: dict[object, set[str]] = {}
    id_comps: dict[str, set[object]] = {}
    contradiction = False
    if use_ids:
        seen: dict[tuple[object, str], int] = {}
        for rank, gpu in rank_ids.items():
            c = uf.find(("r", rank))
            other = seen.setdefault((c, gpu), rank)
            if other != rank:
                contradiction = True  # two ranks on one GPU inside one node: impossible
            comp_ids.setdefault(c, set()).add(gpu)
            id_comps.setdefault(gpu, set()).add(c)
    return _RankGroups(uf, comp_nodes, comp_ids, id_comps), contradiction


def _group_ranks(
    host_links: list[tuple[int, NodeKey]],
    same_links: list[tuple[int, int]],
    comm: Communicator | None,
    conns: list[Connection],
) -> tuple[_RankGroups, bool]:
    """The groups all evidence makes, and whether hostnames count: they are dropped when they
    contradict the GPU ids; GPU ids are dropped instead when they contradict each other anyway."""
    rank_ids, ids_usable = _gpu_ids(comm, conns)
    groups, contradiction = _group(host_links, same_links, rank_ids, True, ids_usable)
    if not contradiction:
        return groups, True
    groups, contradiction = _group(host_links, same_links, rank_ids, False, ids_usable)
    if not contradiction:
        return groups, False
    groups, _ = _group(host_links, same_links, rank_ids, True, False)
    return groups, True


# ---------------------------------------------------------------------------------------------
# Nodes


def _span(
    comm: Communicator | None,
    nranks: int | None,
    groups: _RankGroups,
    hosts_trusted: bool,
    processes: list[Process],
    max_ranks: int,
) -> Span:
    """How many nodes the groups make, whether one or several, and each connection's scope."""
    nodes, single_why = _node_count(comm, nranks, groups, hosts_trusted, max_ranks)
    single = nodes == 1 or nranks == 1
    if nranks == 1 and nodes is None:
        single_why = "it has one rank"
    multi = _several_nodes(nodes, single, groups)
    if multi is None and only_loopback(processes):
        # NCCL's sockets (bootstrap, NET/Socket) can reach no other node: one node, whatever else.
        single, multi, nodes = True, False, 1
        single_why = "its processes use loopback interfaces only (" + loopback_hosts(processes) + ")"
    return Span(
        processes,
        lambda e: groups.scope(e.src, e.dst, single),
        nranks,
        nodes,
        single,
        multi,
        "ranks placed on different nodes",
        single_why,
    )


def _node_count(
    comm: Communicator | None, nranks: int | None, groups: _RankGroups, hosts_trusted: bool, max_ranks: int
) -> tuple[int | None, str | None]:
    """The number of nodes (and what shows it): the ``nNodes`` line, else the groups of all ranks
    when each is a known node (hostnames trusted)."""
    if comm is not None and comm.nnodes is not None:
        return comm.nnodes, None
    if not hosts_trusted or not nranks or nranks > max_ranks:
        return None, None
    comps = {groups.comp(r) for r in range(nranks)}
    if all(groups.comp_nodes.get(c) for c in comps):
        return len(comps), "every rank logged from one node"
    return None, None


def _several_nodes(nodes: int | None, single: bool, groups: _RankGroups) -> bool | None:
    """True when the ranks are shown on several nodes, False when on one, None when not shown."""
    if (nodes or 0) > 1:
        return True
    if single:
        return False
    return True if groups.shows_several_nodes() else None


def _place_mixed(
    comm: Communicator | None, conns: list[Connection], rank_process: dict[int, Process], nodes_of: dict[int, NodeKey]
) -> Span:
    """Connection lines of several communicators under one key: rank numbers do not name one GPU,
    so only evidence inside each line counts (two ranks on the same GPU id are on two nodes; P2P and
    SHM stay in one node), plus whether the processes logging them sit on several nodes."""
    nnodes = comm.nnodes if comm is not None else None
    single = nnodes == 1 or (comm is not None and comm.nranks == 1)

    def scope(e: ConnectionEvent) -> str:
        if e.src != e.dst and e.ids_are_devices and e.src_id is not None and e.src_id == e.dst_id:
            return INTER
        return INTRA if single else UNKNOWN

    processes = _distinct(list(rank_process.values()) + [c.process for c in conns])
    hosts = {nodes_of[id(p)] for p in processes if id(p) in nodes_of}
    has_net = any(c.event.kind == "net" for c in conns)
    multi: bool | None = True if ((nnodes or 0) > 1 or (len(hosts) > 1 and has_net)) else (False if single else None)
    return Span(
        processes,
        scope,
        comm.nranks if comm is not None else None,
        nnodes,
        single,
        multi,
        "ranks logged from several nodes" if len(hosts) > 1 else None,
        None,
    )


def _distinct(processes: Iterable[Process]) -> list[Process]:
    """Each process once, in first-seen order."""
    return list({id(p): p for p in processes}.values())

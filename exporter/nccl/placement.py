"""Which ranks of one communicator share a node, and so the scope of each of its connections.

Placement follows NCCL's own rules (the source files are named in ``tests/fixtures/nccl/CORPUS.md``),
weighed as evidence (:mod:`evidence`), strongest first, each piece citing the line that shows it:

* certain: a process runs on one host, so the ranks one process logs share a node; P2P (not
  MNNVL) and SHM connect only ranks with one host hash (``transport/p2p.cc``, ``shm.cc``);
* strong: NCCL's host hash is made from the hostname (``getHostHash``, ``misc/utils.cc``), or from
  ``NCCL_HOSTID`` when set: different hostnames are different nodes; one hostname with one
  bootstrap (or NET/IB OOB) address is one node, with two addresses two nodes;
* medium: two ranks on one GPU (busId, NVML index, the bus id of nccl-tests' device table) are on
  two nodes (``init.cc`` refuses a duplicate GPU inside a host hash); before 2.14 a NET connection
  joins two host hashes unless SHM is disabled (``shm.cc`` connects any two ranks of one host
  hash; 2.14 added ``ncclTopoCheckNet``, which may route inside a node through the NIC);
* weak: one hostname without an address (hostnames are not unique across machines).

So a shared busId never outweighs the hostname and address both ranks print, and an identical
hostname never outweighs a shared busId. ``nNodes`` (2.20+) counts the nodes outright.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from exporter.nccl.events import ConnectionEvent
from exporter.nccl.evidence import CERTAIN, MEDIUM, STRONG, WEAK, EvidenceGraph, Link, Separation
from exporter.nccl.facts import (
    HOST_ID,
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

# The rules, in the words the reasons use.
ONE_PROCESS = "one process logs both ranks"
INTRA_TRANSPORT = "a P2P/SHM connection joins them"
SAME_HOST = "same hostname and address"
SAME_HOSTNAME = "same hostname"
DIFFERENT_HOSTS = "different hostnames or addresses"
ONE_GPU = "two ranks on one GPU"
NET_BEFORE_2_14 = "a NET connection before NCCL 2.14"


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
    table_nodes: list[tuple[int, NodeKey]] = []
    test_table = _table_applies(state, key, comm)
    if test_table:
        nranks = _add_test_table(state, nranks, rank_process, table_nodes)
    _add_initialising_process(state, key, nranks, rank_process)
    processes = _distinct(list(rank_process.values()) + [c.process for c in conns])
    graph = EvidenceGraph()
    links, separations = _evidence(state, comm, conns, rank_process, table_nodes, nodes_of)
    if test_table:  # its bus ids, as an init line's
        separations.extend(_one_gpu_separations(state.test_gpus, lambda ranks: " (nccl-tests device table)"))
    graph.weigh(links, separations)
    return _span(comm, nranks, graph, rank_process, processes, state.limits.max_ranks)


def takes_loose_ranks(state: StreamState, key: str) -> bool:
    """Ranks logged outside any known communicator belong to this one: the log names no other."""
    if not state.loose_ranks or state.loose_mixed:
        return False
    named = [k for k in state.communicators if k != UNATTRIBUTED]
    return (named == [key]) or (not named and key == UNATTRIBUTED)


# ---------------------------------------------------------------------------------------------
# Who logs which rank


def _rank_processes(comm: Communicator | None, conns: list[Connection]) -> tuple[dict[int, Process], bool]:
    """Rank -> the process logging it (init lines, then connection lines), and whether one rank shows
    two processes: lines of several communicators under one key."""
    rank_process: dict[int, Process] = dict(comm.rank_process) if comm is not None else {}
    mixed = comm.mixed if comm is not None else False
    for c in conns:
        if c.process.key is not None and c.event.kind != "collnet" and c.event.logging_rank_known:
            known = rank_process.setdefault(c.event.logging_rank, c.process)
            mixed |= known.key != c.process.key
    return rank_process, mixed


def _add_test_table(
    state: StreamState, nranks: int | None, rank_process: dict[int, Process], table_nodes: list[tuple[int, NodeKey]]
) -> int | None:
    """Adds the ranks nccl-tests' device table places (the table is this communicator's); returns the
    communicator's size, which the table gives when it lists every rank."""
    table = state.test_ranks
    if nranks is None and sorted(table) == list(range(len(table))):
        nranks = len(table)  # the nccl-tests device table lists every rank of the run
    all_processes, _ = state.process_nodes()
    for rank, (host, pid) in table.items():
        node = host_node_key(host, all_processes)
        if node is not None:
            table_nodes.append((rank, node))
        process = state.processes.get((host, pid))
        if process is not None:
            rank_process.setdefault(rank, process)
    return nranks


def _table_applies(state: StreamState, key: str, comm: Communicator | None) -> bool:
    """nccl-tests' device table (of one run) is communicator ``key``'s: the log names none, or it has
    as many ranks as the table."""
    table = state.test_ranks if not state.test_runs_mixed else {}
    return bool(table) and (key == UNATTRIBUTED or (comm is not None and comm.nranks == len(table)))


def _add_initialising_process(
    state: StreamState, key: str, nranks: int | None, rank_process: dict[int, Process]
) -> None:
    """One process that printed "Using network" from as many GPUs as the communicator has ranks
    initialised every rank of it, when the log names no other communicator (NCCL prints that line
    once per rank it initialises: a single-process job driving every GPU, ncclCommInitAll or a
    group of ncclCommInitRank)."""
    if not nranks or not (key == UNATTRIBUTED or [k for k in state.communicators if k != UNATTRIBUTED] == [key]):
        return
    drivers = [p for p in state.processes.values() if len(p.init_devices) == nranks]
    if len(drivers) != 1 or any(p is not drivers[0] for p in rank_process.values()):
        return
    for rank in range(min(nranks, state.limits.max_ranks)):
        rank_process.setdefault(rank, drivers[0])


# ---------------------------------------------------------------------------------------------
# Evidence


def _evidence(
    state: StreamState,
    comm: Communicator | None,
    conns: list[Connection],
    rank_process: dict[int, Process],
    table_nodes: list[tuple[int, NodeKey]],
    nodes_of: dict[int, NodeKey],
) -> tuple[list[Link], list[Separation]]:
    """Every link and separation the communicator's lines show."""
    links: list[Link] = []
    separations: list[Separation] = []
    for rank, process in rank_process.items():
        links.append(Link(("r", rank), ("p", id(process)), CERTAIN, ONE_PROCESS, process.label()))
    for c in conns:
        e = c.event
        if e.src != e.dst and (e.kind == "shm" or (e.kind == "p2p" and not e.mnnvl)):
            links.append(Link(("r", e.src), ("r", e.dst), CERTAIN, INTRA_TRANSPORT, c.cited))
    # Node identities: each process's (hostname, address), or the node nccl-tests' table names.
    nodes: dict[NodeKey, str] = {}
    for process in _distinct(list(rank_process.values()) + [c.process for c in conns]):
        node = nodes_of.get(id(process))
        if node is not None:
            nodes.setdefault(node, process.label())
            # Its own address (or NCCL_HOSTID), not one inferred from other processes of its hostname.
            shown = node[1] in (process.address, process.oob_address) or node[1].startswith(HOST_ID)
            links.append(_node_link(("p", id(process)), node if shown else (node[0], ""), process.label(), node))
    for rank, node in table_nodes:
        nodes.setdefault(node, f"{node[0]} (nccl-tests device table)")
        links.append(_node_link(("r", rank), node, f"rank {rank} on {node[0]} (nccl-tests device table)"))
    if len(nodes) > 1:
        hosts = ", ".join(sorted({_node_label(n) for n in nodes})[:4])
        separations.append(Separation(tuple(("n", n) for n in nodes), STRONG, DIFFERENT_HOSTS, hosts))
    separations.extend(_same_gpu(comm, conns))
    separations.extend(_net_before_2_14(state, conns, rank_process, nodes_of))
    return links, separations


def _node_link(atom: tuple[str, object], shown: NodeKey, label: str, node: NodeKey | None = None) -> Link:
    """``atom`` runs on ``node``: strong when the address ``shown`` is its own, weak on a hostname alone
    (the address then inferred from other processes of that hostname)."""
    node = node or shown
    if shown[1]:
        return Link(atom, ("n", node), STRONG, SAME_HOST, f"{label} ({shown[1]})")
    return Link(atom, ("n", node), WEAK, SAME_HOSTNAME, label)


def _node_label(node: NodeKey) -> str:
    return f"{node[0]} ({node[1]})" if node[1] else node[0]


def _same_gpu(comm: Communicator | None, conns: list[Connection]) -> list[Separation]:
    """Ranks that name one GPU id are on different nodes (init lines, then channel lines); none when a
    rank shows two GPUs (lines of several communicators under one key)."""
    rank_ids: dict[int, str] = dict(comm.rank_gpu) if comm is not None else {}
    lines: dict[int, str] = {}
    for c in conns:
        e = c.event
        if e.kind == "collnet" or not e.ids_are_devices:
            continue
        for rank, gpu in ((e.src, e.src_id), (e.dst, e.dst_id)):
            if gpu is None:
                continue
            if rank_ids.setdefault(rank, gpu.lower()) != gpu.lower():
                return []
            lines.setdefault(rank, c.cited)

    def cited(ranks: list[int]) -> str:
        line = next((lines[r] for r in ranks if r in lines), None)
        return f': "{line}"' if line else ""

    return _one_gpu_separations(rank_ids, cited)


def _one_gpu_separations(rank_gpu: dict[int, str], cited: Callable[[list[int]], str]) -> list[Separation]:
    """Ranks on one GPU id are on different nodes (NCCL refuses a duplicate GPU inside a host hash),
    each group said with what ``cited`` adds for its ranks."""
    by_gpu: dict[str, list[int]] = {}
    for rank, gpu in rank_gpu.items():
        by_gpu.setdefault(gpu, []).append(rank)
    return [
        Separation(
            tuple(("r", r) for r in ranks),
            MEDIUM,
            ONE_GPU,
            f"ranks {', '.join(str(r) for r in sorted(ranks)[:4])} on GPU {gpu}{cited(ranks)}",
        )
        for gpu, ranks in by_gpu.items()
        if len(ranks) > 1
    ]


def _net_before_2_14(
    state: StreamState, conns: list[Connection], rank_process: dict[int, Process], nodes_of: dict[int, NodeKey]
) -> list[Separation]:
    """Before NCCL 2.14 two ranks of one host hash always connect over P2P or SHM, so a NET connection
    joins two nodes, unless SHM is disabled. Skipped where both ends are logged by processes of one
    hostname: that hostname may be two machines, or SHM may be disabled off the excerpt; the log
    then cannot tell."""
    if state.shm_disabled:
        return []
    log_side = version_side(state.versions)
    separations = []
    for c in conns:
        e = c.event
        if e.kind != "net" or e.src == e.dst:
            continue
        side = version_side([c.process.version] if c.process.version else []) or log_side
        if not (side == "before" if side else e.format_before_2_14):
            continue
        ends = [rank_process.get(e.src), rank_process.get(e.dst)]
        hosts = {nodes_of[id(p)][0] for p in ends if p is not None and id(p) in nodes_of}
        if None not in ends and len(hosts) == 1:
            continue
        separations.append(Separation((("r", e.src), ("r", e.dst)), MEDIUM, NET_BEFORE_2_14, c.cited))
    return separations


def version_side(versions: Iterable[str]) -> str | None:
    """Which side of 2.14 the versions given are on: "before" (all older), "since" (all 2.14 or newer),
    None when none is given, they straddle it, or one does not parse."""
    sides = set()
    for version in versions:
        parts = version.split(".")
        try:
            sides.add("before" if (int(parts[0]), int(parts[1])) < (2, 14) else "since")
        except (ValueError, IndexError):
            return None
    return sides.pop() if len(sides) == 1 else None


# ---------------------------------------------------------------------------------------------
# Nodes


def _span(
    comm: Communicator | None,
    nranks: int | None,
    graph: EvidenceGraph,
    rank_process: dict[int, Process],
    processes: list[Process],
    max_ranks: int,
) -> Span:
    """How many nodes the evidence makes, whether one or several, and each connection's scope."""
    nnodes = comm.nnodes if comm is not None else None
    nodes, single_why = _node_count(nnodes, nranks, graph, rank_process, max_ranks)
    single = nodes == 1 or nranks == 1
    if nranks == 1 and nodes is None:
        single_why = "it has one rank"
    multi: bool | None = True if (nodes or 0) > 1 else (False if single else None)
    multi_why = None
    if multi is None:
        ranks = list(rank_process) + (list(range(nranks)) if nranks and nranks <= max_ranks else [])
        separation = graph.separation_between(("r", r) for r in ranks)
        if separation is not None:
            multi, multi_why = True, _cited(separation.rule, separation.line)
    elif multi and nnodes is None:
        multi_why = "ranks placed on different nodes"
    if multi is None and only_loopback(processes):
        # NCCL's sockets (bootstrap, NET/Socket) can reach no other node: one node, whatever else.
        single, multi, nodes = True, False, 1
        single_why = "its processes use loopback interfaces only (" + loopback_hosts(processes) + ")"

    def scope(e: ConnectionEvent) -> str:
        if e.src == e.dst:
            return UNKNOWN
        a, b = ("r", e.src), ("r", e.dst)
        if graph.same(a, b):
            return INTRA
        if graph.apart(a, b) is not None:
            return INTER
        return INTRA if single else UNKNOWN

    return Span(processes, scope, nranks, nodes, single, multi, multi_why, single_why)


def _node_count(
    nnodes: int | None, nranks: int | None, graph: EvidenceGraph, rank_process: dict[int, Process], max_ranks: int
) -> tuple[int | None, str | None]:
    """The number of nodes (and what shows one node): the ``nNodes`` line, else one group holding every
    rank, else the groups of all ranks when each holds a node identity (distinct identities are
    distinct nodes)."""
    if nnodes is not None:
        return nnodes, None
    if not nranks or nranks > max_ranks:
        return None, None
    roots = {graph.find(("r", r)) for r in range(nranks)}
    if len(roots) == 1:
        owners = {id(p): p for r, p in rank_process.items() if r < nranks}
        if len(owners) == 1 and all(r in rank_process for r in range(nranks)):
            return 1, f"one process ({next(iter(owners.values())).label()}) runs every rank"
        hosts = sorted({p.label().rsplit(":", 1)[0] for p in owners.values()})
        return 1, "every rank logged from one node" + (f" ({', '.join(hosts[:2])})" if hosts else "")
    if roots <= graph.roots_with("n"):
        return len(roots), None
    return None, None


def _cited(rule: str, line: str | None) -> str:
    return f"{rule}: {line}" if line else rule


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

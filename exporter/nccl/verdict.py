"""From a stream's processes, communicators and connections to a verdict with reasons.

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

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from exporter.nccl.grammar import ConnectionEvent
from exporter.nccl.networks import NO_SELECTION, RDMA, TCP, Selection, network_class, transport_of_network

if TYPE_CHECKING:  # pragma: no cover
    from exporter.nccl.model import Communicator, Connection, LogAnalyzer, Process

UNATTRIBUTED = "unattributed"
INTER, INTRA, UNKNOWN = "inter_node", "intra_node", "unknown"


@dataclass(frozen=True)
class NcclWarning:
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


# ---------------------------------------------------------------------------------------------


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
class _Placement:
    """Which ranks of one communicator share a node, and which cannot."""

    uf: _UnionFind
    comp_nodes: dict[object, set[object]]
    comp_ids: dict[object, set[str]]
    id_comps: dict[str, set[object]]

    def comp(self, rank: int) -> object:
        return self.uf.find(("r", rank))

    def distinct(self, ca: object, cb: object) -> bool:
        na, nb = self.comp_nodes.get(ca), self.comp_nodes.get(cb)
        if na and nb and na.isdisjoint(nb):
            return True
        ia, ib = self.comp_ids.get(ca), self.comp_ids.get(cb)
        return bool(ia and ib and not ia.isdisjoint(ib))


def _place(host_links: list[tuple[int, object]], same_links: list[tuple[int, int]],
           rank_ids: dict[int, str], use_hosts: bool, use_ids: bool) -> tuple[_Placement, bool]:
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
    return _Placement(uf, comp_nodes, comp_ids, id_comps), contradiction


@dataclass
class _CommFacts:
    summary: CommunicatorSummary
    reasons: list[str] = field(default_factory=list)
    multi_node: bool | None = None


def _addresses(processes: list[Process]) -> dict[int, str | None]:
    """id(process) -> the address that identifies its node: the bootstrap address, or NET/IB's OOB
    address on hosts where no process printed a bootstrap line (never a mix of both)."""
    with_bootstrap = {p.host for p in processes if p.address}
    return {id(p): (p.address if p.host in with_bootstrap else p.oob_address) for p in processes}


def node_keys(processes: Iterable[Process]) -> dict[int, object]:
    """id(process) -> node key. A hostname seen with several addresses is several nodes."""
    processes = list(processes)
    # Interleaved writers glue the tail of one record to the next one's hostname
    # ("[1] NCCg183:161260:..."): a host that ends with the host of another process with the
    # same pid is that process's host.
    by_pid: dict[int, set[str]] = {}
    for p in processes:
        if p.key is not None:
            by_pid.setdefault(p.key[1], set()).add(p.key[0])
    canonical: dict[int, str] = {}
    for p in processes:
        if p.key is not None and len(by_pid[p.key[1]]) > 1:
            shorter = [h for h in by_pid[p.key[1]] if h != p.key[0] and p.key[0].endswith(h)]
            if shorter:
                canonical[id(p)] = min(shorter, key=len)
    address = _addresses(processes)
    addresses: dict[str, set[str]] = {}
    for p in processes:
        if p.host is not None and address[id(p)]:
            addresses.setdefault(p.host, set()).add(address[id(p)])  # type: ignore[arg-type]
    keys: dict[int, object] = {}
    for p in processes:
        if p.host is None:
            continue
        host = canonical.get(id(p), p.host)
        if address[id(p)]:
            keys[id(p)] = (host, address[id(p)])
            continue
        known = addresses.get(host, set())
        if len(known) == 1:
            keys[id(p)] = (host, next(iter(known)))
        elif not known:
            keys[id(p)] = (host, "")
    return keys


def host_node_key(host: str, processes: Iterable[Process]) -> object | None:
    """The node key ``node_keys`` gives processes of ``host``; None when that host name is ambiguous."""
    processes = list(processes)
    address = _addresses(processes)
    addresses = {address[id(p)] for p in processes if p.host == host and address[id(p)]}
    if len(addresses) > 1:
        return None
    return (host, next(iter(addresses))) if addresses else (host, "")


def provider_of(processes: Iterable[Process]) -> str | None:
    """aws-ofi-nccl's libfabric provider as these processes show it (a TCP-class one first)."""
    providers = [p.ofi_provider for p in processes if p.ofi_provider]
    tcp = [p for p in providers if network_class(None, p) == TCP]
    return (tcp or providers or [None])[0]


def connection_class(connection: Connection) -> str | None:
    return network_class(connection.event.network, connection.process.ofi_provider)


def _comm_network(comm: Communicator | None, conns: list[Connection], processes: list[Process]) -> Selection:
    """The communicator's network (name, the line that shows it, class): its connection lines first,
    then its init's ``Using network``, then what each process's own lines show it selected."""
    net_lines = [c for c in conns if c.event.kind == "net" and c.event.network]
    if net_lines:
        tcp = [c for c in net_lines if connection_class(c) == TCP]
        if tcp:
            chosen = tcp[0]
        else:
            name = Counter(c.event.network for c in net_lines).most_common(1)[0][0]
            chosen = next(c for c in net_lines if c.event.network == name)
        return Selection(chosen.event.network, chosen.cited, connection_class(chosen))
    selected = [sel for sel in (p.selected_network() for p in processes) if sel.name or sel.cls]
    if comm is not None and comm.network:
        selected.insert(0, Selection(comm.network, comm.network_line, network_class(comm.network, provider_of(processes))))
    if not selected:
        return NO_SELECTION
    # Ranks that disagree (one node on IB, another on Socket) are judged by the TCP one.
    tcp = [sel for sel in selected if sel.cls == TCP]
    return tcp[0] if tcp else selected[0]


def _analyze(analyzer: LogAnalyzer, key: str, comm: Communicator | None, conns: list[Connection],
             nodes_of: dict[int, object], version: str | None) -> _CommFacts:
    rank_process: dict[int, Process] = dict(comm.rank_process) if comm is not None else {}
    mixed = comm.mixed if comm is not None else False
    for c in conns:
        if c.process.key is not None and c.event.kind != "collnet":
            known = rank_process.setdefault(c.event.logging_rank, c.process)
            mixed |= known.key != c.process.key
    if mixed:
        return _analyze_mixed(analyzer, key, comm, conns, rank_process, nodes_of, version)
    nranks = comm.nranks if comm is not None else None
    if _takes_loose_ranks(analyzer, key):
        for rank, process in analyzer.loose_ranks.items():
            rank_process.setdefault(rank, process)
        nranks = nranks or analyzer.loose_nranks
    host_links = [(r, nodes_of[id(p)]) for r, p in rank_process.items() if id(p) in nodes_of]
    table = analyzer.test_ranks if not analyzer.test_runs_mixed else {}
    if table and (key == UNATTRIBUTED or (comm is not None and comm.nranks == len(table))):
        if nranks is None and sorted(table) == list(range(len(table))):
            nranks = len(table)  # the nccl-tests device table lists every rank of the run
        all_processes, _ = analyzer.process_nodes()
        for rank, (host, pid) in table.items():
            node = host_node_key(host, all_processes)
            if node is not None:
                host_links.append((rank, node))
            process = analyzer.processes.get((host, pid))
            if process is not None:
                rank_process.setdefault(rank, process)
    same_links = [(c.event.src, c.event.dst) for c in conns
                  if (c.event.kind == "shm" or (c.event.kind == "p2p" and not c.event.mnnvl))]
    rank_ids: dict[int, str] = dict(comm.rank_gpu) if comm is not None else {}
    ids_usable = True
    for c in conns:
        e = c.event
        if e.kind == "collnet" or not e.ids_are_devices:
            continue
        for rank, gpu in ((e.src, e.src_id), (e.dst, e.dst_id)):
            if gpu is None:
                continue
            if rank_ids.setdefault(rank, gpu.lower()) != gpu.lower():
                ids_usable = False  # one rank on two GPUs: lines of several communicators mixed
    placement, contradiction = _place(host_links, same_links, rank_ids, True, ids_usable)
    hosts_trusted = True
    if contradiction:
        hosts_trusted = False
        placement, contradiction = _place(host_links, same_links, rank_ids, False, ids_usable)
        if contradiction:
            hosts_trusted = True
            placement, _ = _place(host_links, same_links, rank_ids, True, False)

    nnodes = comm.nnodes if comm is not None else None
    exact_nodes = nnodes
    single_why: str | None = None
    if exact_nodes is None and hosts_trusted and nranks and nranks <= analyzer.limits.max_ranks:
        comps = {placement.comp(r) for r in range(nranks)}
        if all(placement.comp_nodes.get(c) for c in comps):
            exact_nodes = len(comps)
            single_why = "every rank logged from one node"
    single = exact_nodes == 1 or nranks == 1
    if nranks == 1 and exact_nodes is None:
        single_why = "it has one rank"
    multi: bool | None = None
    if (exact_nodes or 0) > 1:
        multi = True
    elif single:
        multi = False
    elif len([c for c, nodes in placement.comp_nodes.items() if nodes]) > 1 or any(
        len(comps) > 1 for comps in placement.id_comps.values()
    ):
        multi = True
    processes = list({id(p): p for p in list(rank_process.values()) + [c.process for c in conns]}.values())
    if multi is None and _only_loopback(processes):
        # NCCL's sockets (bootstrap, NET/Socket) can reach no other node: one node, whatever else.
        single, multi, exact_nodes = True, False, 1
        single_why = "its processes use loopback interfaces only (" + _loopback_line(processes) + ")"

    def scope(a: int, b: int) -> str:
        if a == b:
            return UNKNOWN
        ca, cb = placement.comp(a), placement.comp(b)
        if ca == cb:
            return INTRA
        if placement.distinct(ca, cb):
            return INTER
        return INTRA if single else UNKNOWN

    return _summarize(analyzer, key, comm, conns, processes, lambda e: scope(e.src, e.dst), multi, single,
                      exact_nodes, "ranks placed on different nodes", version, nranks, single_why)


def _takes_loose_ranks(analyzer: LogAnalyzer, key: str) -> bool:
    """Ranks logged outside any known communicator belong to this one: the log names no other."""
    if not analyzer.loose_ranks or analyzer.loose_mixed:
        return False
    named = [k for k in analyzer.communicators if k != UNATTRIBUTED]
    return (named == [key]) or (not named and key == UNATTRIBUTED)


def _only_loopback(processes: Iterable[Process]) -> bool:
    shown = [p.loopback for p in processes if p.loopback is not None]
    return bool(shown) and all(shown)


def _loopback_line(processes: Iterable[Process]) -> str:
    hosts = sorted({p.label() for p in processes if p.loopback})
    return ", ".join(hosts[:4]) + (" ..." if len(hosts) > 4 else "")


def _summarize(analyzer: LogAnalyzer, key: str, comm: Communicator | None, conns: list[Connection],
               processes: list[Process], scope: Callable[[ConnectionEvent], str], multi: bool | None,
               single: bool, exact_nodes: int | None, multi_why: str | None, version: str | None,
               nranks: int | None, single_why: str | None = None) -> _CommFacts:
    """Count transports by scope and decide one communicator's network, GDR and inter-node TCP."""
    transports: Counter[tuple[str, str, str]] = Counter()
    reasons: list[str] = []
    tcp_inter: Connection | None = None
    rdma_gdr: set[bool] = set()
    for c in conns:
        e = c.event
        if e.kind == "net":
            s = scope(e)
            transports[(transport_of_network(e.network or ""), s, "1" if e.gdr else "0")] += 1
            cls = connection_class(c)
            if cls == TCP and s == INTER and tcp_inter is None:
                tcp_inter = c
            if cls == RDMA:
                rdma_gdr.add(e.gdr)
        elif e.kind == "collnet":
            transports[("collnet", INTER if multi else UNKNOWN, "1" if e.gdr else "0")] += 1
            rdma_gdr.add(e.gdr)
        elif e.kind == "p2p":
            transports[("p2p", INTER if e.mnnvl else INTRA, "")] += 1
        else:
            transports[("shm", INTRA, "")] += 1
    if comm is not None and comm.nvls_channels:
        transports[("nvls", UNKNOWN if comm.mnnvl else INTRA, "")] += sum(comm.nvls_channels.values())
    if tcp_inter is not None:
        multi = True

    network, network_line, cls = _comm_network(comm, conns, processes)
    label = key if key != UNATTRIBUTED else "(communicator not named in the log)"

    inter_node_tcp: bool | None
    if tcp_inter is not None:
        inter_node_tcp = True
        reasons.append(f"communicator {label}: inter-node connection over TCP-class network {shown_network(network, cls)}: "
                       f"\"{tcp_inter.cited}\"")
    elif multi and cls == TCP and not (comm is not None and comm.mnnvl):
        inter_node_tcp = True
        evidence = comm.nnodes_line if comm is not None and comm.nnodes_line else None
        why = f"\"{evidence}\"" if evidence else (multi_why or "several nodes")
        reasons.append(f"communicator {label} spans {exact_nodes or 'several'} nodes ({why}) and uses "
                       f"TCP-class network {shown_network(network, cls)}" + (f": \"{network_line}\"" if network_line else ""))
    elif single:
        inter_node_tcp = False
        reasons.append(f"communicator {label} is on a single node"
                       + (f": \"{comm.nnodes_line}\"" if comm is not None and comm.nnodes_line and exact_nodes == 1 else
                          f" ({single_why or 'every rank logged from one node'})"))
    elif cls == RDMA:
        inter_node_tcp = False
        reasons.append(f"communicator {label} uses RDMA network {shown_network(network, cls)}"
                       + (f": \"{network_line}\"" if network_line else ""))
    else:
        inter_node_tcp = None
        if network is not None and cls is None:
            reasons.append(f"communicator {label}: network {network} is not in the RDMA/TCP table")
        elif cls == TCP:
            reasons.append(f"communicator {label} uses TCP-class network {shown_network(network, cls)} but the log does not show "
                           "whether its traffic crosses nodes")

    gdr: bool | str | None = None
    if rdma_gdr:
        gdr = "mixed" if len(rdma_gdr) > 1 else next(iter(rdma_gdr))
    elif cls == RDMA:
        flags = set()
        for p in processes:
            flags.update(p.gdr_hca)
        if flags:
            gdr = "mixed" if len(flags) > 1 else next(iter(flags))

    versions = Counter(p.version for p in processes if p.version)
    summary = CommunicatorSummary(
        comm_id=key,
        nranks=nranks,
        nnodes=exact_nodes,
        network=network,
        nccl_version=versions.most_common(1)[0][0] if versions else version,
        transports=dict(transports),
        gdr=gdr,
        inter_node_tcp=inter_node_tcp,
        network_class=cls,
    )
    return _CommFacts(summary, reasons, multi)



def _analyze_mixed(analyzer: LogAnalyzer, key: str, comm: Communicator | None, conns: list[Connection],
                   rank_process: dict[int, Process], nodes_of: dict[int, object], version: str | None) -> _CommFacts:
    """Connection lines of several communicators under one key: rank numbers do not name one GPU,
    so only evidence inside each line counts (two ranks on the same GPU id are on two nodes; P2P and
    SHM stay in one node), plus whether the processes logging them sit on several nodes."""
    nnodes = comm.nnodes if comm is not None else None
    single = nnodes == 1 or (comm is not None and comm.nranks == 1)

    def scope(e: ConnectionEvent) -> str:
        if e.src != e.dst and e.ids_are_devices and e.src_id is not None and e.src_id == e.dst_id:
            return INTER
        return INTRA if single else UNKNOWN

    processes = list({id(p): p for p in list(rank_process.values()) + [c.process for c in conns]}.values())
    hosts = {nodes_of[id(p)] for p in processes if id(p) in nodes_of}
    has_net = any(c.event.kind == "net" for c in conns)
    multi: bool | None = True if ((nnodes or 0) > 1 or (len(hosts) > 1 and has_net)) else (False if single else None)
    return _summarize(analyzer, key, comm, conns, processes, scope, multi, single, nnodes,
                      "ranks logged from several nodes" if len(hosts) > 1 else None, version,
                      comm.nranks if comm is not None else None)


def _only_communicator(analyzer: LogAnalyzer, process: Process) -> str:
    """Where a connection line logged outside any init context goes: the process's communicator
    when it only ever initialised one (the line may come from another thread than the init
    line), else the unattributed bucket."""
    keys = {k for k in process.pointers.values() if k in analyzer.communicators}
    return keys.pop() if len(keys) == 1 else UNATTRIBUTED


def _adopt_strays(analyzer: LogAnalyzer, buckets: dict[str, list[Connection]], nodes_of: dict[int, object]) -> None:
    """Give the log's only communicator the unattributed connection lines of processes that
    never logged an init line, when they can only be its own: logged on a node where its ranks
    are, naming ranks inside its size, never a rank another process holds. Placement then adds no
    node it did not have, so adopting a line cannot make a connection inter-node by itself."""
    strays = buckets.get(UNATTRIBUTED)
    named = [k for k in analyzer.communicators if k != UNATTRIBUTED]
    if not strays or len(named) != 1:
        return
    comm = analyzer.communicators[named[0]]
    if comm.mixed or not comm.nranks or not comm.rank_process:
        return
    comm_nodes = {nodes_of.get(id(p)) for p in comm.rank_process.values()} - {None}
    by_process: dict[int, list[Connection]] = {}
    for c in strays:
        by_process.setdefault(id(c.process), []).append(c)
    adopted: list[Connection] = []
    for conns in by_process.values():
        process = conns[0].process
        if process.named_comm or nodes_of.get(id(process)) not in comm_nodes:
            continue
        fits = all(
            c.event.kind != "collnet" and c.event.src < comm.nranks and c.event.dst < comm.nranks
            and comm.rank_process.get(c.event.logging_rank, process) is process
            for c in conns
        )
        if fits:
            adopted.extend(conns)
    if not adopted:
        return
    taken = {id(c) for c in adopted}
    buckets.setdefault(named[0], []).extend(adopted)
    rest = [c for c in strays if id(c) not in taken]
    if rest:
        buckets[UNATTRIBUTED] = rest
    else:
        del buckets[UNATTRIBUTED]


def _facts(analyzer: LogAnalyzer, only: str | None = None) -> list[_CommFacts]:
    buckets: dict[str, list[Connection]] = {}
    if only is not None:
        comm = analyzer.communicators.get(only)
        found = (analyzer.connections.get(k) for k in (comm.connections if comm is not None else ()))
        buckets[only] = [c for c in found if c is not None]
        keys = [only]
    _, nodes_of = analyzer.process_nodes()
    if only is None:
        for c in analyzer.connections.values():
            buckets.setdefault(c.comm or _only_communicator(analyzer, c.process), []).append(c)
        _adopt_strays(analyzer, buckets, nodes_of)
        keys = [k for k in analyzer.communicators if k != UNATTRIBUTED or k in buckets]
        keys += [k for k in buckets if k not in analyzer.communicators]
        if not keys and (_takes_loose_ranks(analyzer, UNATTRIBUTED) or (analyzer.test_ranks and not analyzer.test_runs_mixed)):
            keys = [UNATTRIBUTED]  # no communicator named, but lines that place ranks (Trees, ring listings, nccl-tests table)
    version = analyzer.versions.most_common(1)[0][0] if analyzer.versions else None
    return [_analyze(analyzer, k, analyzer.communicators.get(k), buckets.get(k, []), nodes_of, version)
            for k in keys]


def summarize_communicators(analyzer: LogAnalyzer, only: str | None = None) -> list[tuple[CommunicatorSummary, list[str]]]:
    return [(f.summary, f.reasons) for f in _facts(analyzer, only)]


def _log_network_classes(analyzer: LogAnalyzer, facts: list[_CommFacts], selected: list[Selection]) -> set[str | None]:
    """The classes of every network the log names: connection lines, selections, communicators."""
    classes = {connection_class(c) for c in analyzer.connections.values() if c.event.network}
    classes |= {f.summary.network_class for f in facts if f.summary.network or f.summary.network_class}
    classes |= {sel.cls for sel in selected}
    return classes


def _one_job(analyzer: LogAnalyzer, facts: list[_CommFacts]) -> bool:
    """The log's processes are ranks of one communicator: the nccl-tests device table lists them, or
    the log shows one communicator size of two or more (init lines, a ring listing, 2.3 rank lines).
    Without such a tie, processes on two hosts that each chose a TCP network may be two jobs."""
    if analyzer.test_ranks and not analyzer.test_runs_mixed:
        return True
    sizes = {f.summary.nranks for f in facts if f.summary.nranks} | (
        {analyzer.loose_nranks} if analyzer.loose_nranks else set())
    return len(sizes) == 1 and next(iter(sizes)) >= 2


def shown_network(name: str | None, cls: str | None) -> str:
    """A network as a reason names it (aws-ofi-nccl known by its provider line has no name)."""
    return name or ("(aws-ofi-nccl)" if cls else "(unnamed)")


def decide(analyzer: LogAnalyzer) -> Verdict:
    facts = _facts(analyzer)
    retired = analyzer.retired
    reasons: list[str] = []
    processes, nodes_of = analyzer.process_nodes()
    version = analyzer.versions.most_common(1)[0][0] if analyzer.versions else None
    selected = [sel for sel in (p.selected_network() for p in processes) if sel.name or sel.cls]

    values = [f.summary.inter_node_tcp for f in facts]
    inter_node_tcp: bool | None
    deciding: list[_CommFacts] = []
    log_single = False
    if True in values or retired.inter_node_tcp:
        inter_node_tcp = True
        deciding = [f for f in facts if f.summary.inter_node_tcp is True]
        for f in deciding:
            reasons.extend(f.reasons[:1])
        if retired.inter_node_tcp:
            reasons.extend(retired.reasons[:1])
    else:
        tcp_selected = [sel for sel in selected if sel.cls == TCP]
        distinct_hosts = {nodes_of[id(p)] for p in processes if id(p) in nodes_of}
        table_nodes = {host_node_key(h, processes) for h, _ in analyzer.test_ranks.values()}
        distinct_hosts |= {n for n in table_nodes if n is not None}
        undecided = all(v is None for v in values)
        if undecided and tcp_selected and len(distinct_hosts) > 1 and _one_job(analyzer, facts):
            inter_node_tcp = True
            hosts = ", ".join(sorted({str(h) for h, _ in distinct_hosts})[:4])
            first = tcp_selected[0]
            reasons.append(f"the job spans several nodes ({hosts}) and selected TCP-class network "
                           f"{shown_network(first.name, first.cls)}: \"{first.line}\"")
        elif (not facts or undecided) and _only_loopback(processes) and not retired.inter_node_tcp:
            inter_node_tcp, log_single = False, True
            reasons.append("every process uses loopback interfaces only (" + _loopback_line(processes)
                           + "): NCCL cannot reach another node")
        elif not facts or undecided:
            classes = {sel.cls for sel in selected}
            if selected and classes == {RDMA} and not retired.inter_node_tcp:
                inter_node_tcp = False
                first = selected[0]
                reasons.append(f"every process uses RDMA network {shown_network(first.name, first.cls)}: \"{first.line}\"")
            else:
                inter_node_tcp = None
                reasons.extend(r for f in facts for r in f.reasons[:1])
        else:
            # A communicator with no network of its own is open unless every network the log
            # names (connection lines, selections) is RDMA-class: a process uses one network.
            rdma_only = _log_network_classes(analyzer, facts, selected) == {RDMA}
            open_tcp = [f for f in facts if f.summary.inter_node_tcp is None and f.summary.transports
                        and (f.summary.network_class == TCP
                             or (f.summary.network_class is None
                                 and (f.summary.network is not None or not rdma_only)))]
            inter_node_tcp = None if open_tcp else False
            deciding = [f for f in facts if f.summary.inter_node_tcp is False]
            for f in (open_tcp or deciding)[:3]:
                reasons.extend(f.reasons[:1])

    named = [f.summary for f in (deciding or facts) if f.summary.network or f.summary.network_class]
    if named:
        top = Counter(c.network for c in named).most_common(1)[0][0]
        network: str | None = top
        network_cls = next(c.network_class for c in named if c.network == top)
    else:
        top_selection = Counter(selected).most_common(1)[0][0] if selected else NO_SELECTION
        network, network_cls = top_selection.name, top_selection.cls

    gdrs = {f.summary.gdr for f in facts if f.summary.gdr is not None}
    gdr: bool | str | None = None
    if gdrs:
        gdr = "mixed" if ("mixed" in gdrs or len(gdrs) > 1) else next(iter(gdrs))

    node_counts = [f.summary.nnodes for f in facts if f.summary.nnodes]
    nodes = max(node_counts) if node_counts else (1 if log_single else None)
    rank_counts = [f.summary.nranks for f in facts if f.summary.nranks]
    nranks = max(rank_counts) if rank_counts else None

    all_single = log_single or (bool(facts) and all(f.multi_node is False for f in facts) and not retired.inter_node_tcp)
    if inter_node_tcp is True:
        verdict = "tcp_fallback"
    elif all_single:
        verdict = "single_node"
        if not reasons:
            reasons.extend(r for f in facts for r in f.reasons[:1])
    elif inter_node_tcp is False and (network_cls == RDMA or retired.inter_node_rdma):
        verdict = "rdma"
    else:
        verdict = "unknown"
    if not reasons:
        reasons.append("the log shows no NCCL network selection, communicator or connection line"
                       if not facts and not processes else
                       "the log does not show enough to tell which network carries inter-node traffic")
    if retired.count:
        reasons.append(f"{retired.count} older communicators were evicted by the communicator cap")
    return Verdict(
        verdict=verdict,
        inter_node_tcp=inter_node_tcp,
        network=network,
        gdr=gdr,
        nccl_version=version,
        nodes=nodes,
        nranks=nranks,
        communicators=tuple(f.summary for f in facts),
        warnings=tuple(analyzer.warnings),
        reasons=tuple(dict.fromkeys(reasons)),
    )


def with_node_context(verdict: Verdict, gpus_on_node: int | None, gpus_held_here: int | None) -> Verdict:
    """The verdict once what the node knows and the log does not is added.

    A communicator with more ranks than this node has GPUs, or than the job's pods hold here, spans
    nodes: NCCL never puts two ranks of one communicator on one GPU. Only communicators the log left
    open (``inter_node_tcp`` None on a TCP-class network) are decided this way; a log that already
    decides keeps its answer.
    """
    if verdict.verdict != "unknown":
        return verdict
    bounds = [(n, what) for n, what in ((gpus_held_here, "the job's pods hold here"), (gpus_on_node, "this node has"))
              if n]
    if not bounds:
        return verdict
    bound, what = min(bounds)
    decided: list[CommunicatorSummary] = []
    communicators = []
    for c in verdict.communicators:
        if c.inter_node_tcp is None and c.network_class == TCP and c.nranks and c.nranks > bound:
            c = replace(c, inter_node_tcp=True)
            decided.append(c)
        communicators.append(c)
    if not decided:
        return verdict
    first = decided[0]
    reason = (f"communicator {first.comm_id} has {first.nranks} ranks but {what} {bound} GPUs: it spans nodes, "
              f"on TCP-class network {shown_network(first.network, first.network_class)}")
    return replace(verdict, verdict="tcp_fallback", inter_node_tcp=True, communicators=tuple(communicators),
                   reasons=(reason, *verdict.reasons))

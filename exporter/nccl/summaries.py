"""Per communicator: which connection lines are its own, and its summary — transports by scope,
network, GPUDirect RDMA, and whether its inter-node traffic runs on TCP — with the reason why.

Where its ranks run comes from :mod:`placement`; the log's verdict over all communicators is
made by :mod:`decision`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import NamedTuple

from exporter.nccl.events import ConnectionEvent
from exporter.nccl.facts import UNATTRIBUTED, Communicator, Connection, NodeKey, Process, class_of, connection_class
from exporter.nccl.networks import NO_SELECTION, RDMA, TCP, Selection, network_class, transport_of_network
from exporter.nccl.placement import Span, place, takes_loose_ranks
from exporter.nccl.state import StreamState
from exporter.nccl.verdict import INTER, INTRA, UNKNOWN, CommunicatorSummary


@dataclass
class CommFacts:
    """One communicator's summary, the reasons for its conclusion (the first one decides), whether it
    spans several nodes (None: the log does not show), and the processes that log it."""

    summary: CommunicatorSummary
    reasons: list[str] = field(default_factory=list)
    multi_node: bool | None = None
    processes: tuple[Process, ...] = ()  # the processes logging its ranks and connection lines


def summarize_all(state: StreamState) -> list[CommFacts]:
    """Every communicator the log shows (and the connection lines it attributes to none), summarized."""
    _, nodes_of = state.process_nodes()
    buckets = _attribute(state, nodes_of)
    version = log_version(state)
    keys = _summarized_keys(state, buckets)
    return [_summarize(state, key, buckets.get(key, []), nodes_of, version) for key in keys]


def summarize_evicted(state: StreamState, key: str) -> tuple[CommunicatorSummary, list[str]]:
    """Communicator ``key`` from its own connection lines alone: what it showed, before a cap evicts it."""
    comm = state.communicators.get(key)
    found = (state.connections.get(k) for k in (comm.connections if comm is not None else ()))
    conns = [c for c in found if c is not None]
    _, nodes_of = state.process_nodes()
    facts = _summarize(state, key, conns, nodes_of, log_version(state))
    return facts.summary, facts.reasons


def log_version(state: StreamState) -> str | None:
    """The NCCL version the log prints most often."""
    return state.versions.most_common(1)[0][0] if state.versions else None


def shown_network(name: str | None, cls: str | None) -> str:
    """A network as a reason names it (aws-ofi-nccl known by its provider line has no name)."""
    return name or ("(aws-ofi-nccl)" if cls else "(unnamed)")


# ---------------------------------------------------------------------------------------------
# Which connection lines are whose


def attribute_connections(state: StreamState) -> dict[str, list[Connection]]:
    """Connection lines by the communicator they belong to, as the verdict attributes them."""
    return _attribute(state, state.process_nodes()[1])


def _attribute(state: StreamState, nodes_of: dict[int, NodeKey]) -> dict[str, list[Connection]]:
    """Connection lines by the communicator they belong to (UNATTRIBUTED: one the log never names)."""
    buckets: dict[str, list[Connection]] = {}
    for c in state.connections.values():
        buckets.setdefault(c.comm or _only_communicator(state, c.process), []).append(c)
    _adopt_strays(state, buckets, nodes_of)
    return buckets


def _summarized_keys(state: StreamState, buckets: dict[str, list[Connection]]) -> list[str]:
    """The communicators to summarize: those the log names, in order, then the connection lines' own."""
    keys = [k for k in state.communicators if k != UNATTRIBUTED or k in buckets]
    keys += [k for k in buckets if k not in state.communicators]
    if not keys and (takes_loose_ranks(state, UNATTRIBUTED) or (state.test_ranks and not state.test_runs_mixed)):
        # no communicator named, but lines that place ranks (Trees, ring listings, nccl-tests table)
        keys = [UNATTRIBUTED]
    return keys


def _only_communicator(state: StreamState, process: Process) -> str:
    """Where a connection line logged outside any init context goes: the process's communicator
    when it only ever initialised one (the line may come from another thread than the init
    line), else the unattributed bucket."""
    keys = {k for k in process.pointers.values() if k in state.communicators}
    return keys.pop() if len(keys) == 1 else UNATTRIBUTED


def _adopt_strays(state: StreamState, buckets: dict[str, list[Connection]], nodes_of: dict[int, NodeKey]) -> None:
    """Give the log's only communicator the unattributed connection lines of processes that
    never logged an init line, when they can only be its own: logged on a node where its ranks
    are, naming ranks inside its size, never a rank another process holds. Placement then adds no
    node it did not have, so adopting a line cannot make a connection inter-node by itself."""
    strays = buckets.get(UNATTRIBUTED)
    named = [k for k in state.communicators if k != UNATTRIBUTED]
    if not strays or len(named) != 1:
        return
    comm = state.communicators[named[0]]
    if comm.mixed or not comm.nranks or not comm.rank_process:
        return
    comm_nodes = {nodes_of.get(id(p)) for p in comm.rank_process.values()} - {None}
    by_process: dict[int, list[Connection]] = {}
    for c in strays:
        by_process.setdefault(id(c.process), []).append(c)
    adopted: list[Connection] = []
    for conns in by_process.values():
        process = conns[0].process
        on_its_nodes = nodes_of.get(id(process)) in comm_nodes
        if not process.named_comm and on_its_nodes and _fits(comm.nranks, comm.rank_process, process, conns):
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


def _fits(nranks: int, rank_process: dict[int, Process], process: Process, conns: list[Connection]) -> bool:
    """``process``'s lines can only be the communicator's: ranks inside its size, none another process holds."""
    return all(
        c.event.kind != "collnet"
        and c.event.src < nranks
        and c.event.dst < nranks
        and rank_process.get(c.event.logging_rank, process) is process
        for c in conns
    )


# ---------------------------------------------------------------------------------------------
# One communicator


def _summarize(
    state: StreamState, key: str, conns: list[Connection], nodes_of: dict[int, NodeKey], version: str | None
) -> CommFacts:
    """One communicator: where its ranks run (placement), then what its connection lines show."""
    comm = state.communicators.get(key)
    return _conclude(key, comm, conns, place(state, key, comm, conns, nodes_of), version, state.rdma_by_gdr)


def _conclude(
    key: str,
    comm: Communicator | None,
    conns: list[Connection],
    span: Span,
    version: str | None,
    rdma_by_gdr: AbstractSet[str],
) -> CommFacts:
    """Count the connection lines, name the network, then judge the inter-node traffic."""
    tally = _tally(comm, conns, span)
    multi = True if tally.tcp_inter is not None else span.multi
    network = _comm_network(comm, conns, span.processes, rdma_by_gdr)
    inter_node_tcp, reason = _judge(key, comm, span, multi, tally.tcp_inter, network)
    no_gdr = _without_gdr(tally.no_gdr_inter, network.cls)
    summary = CommunicatorSummary(
        comm_id=key,
        nranks=span.nranks,
        nnodes=span.nodes,
        network=network.name,
        nccl_version=_version(span.processes, version),
        transports=dict(tally.transports),
        gdr=_gdr(tally.rdma_gdr, network.cls, span.processes),
        inter_node_tcp=inter_node_tcp,
        network_class=network.cls,
        gdr_disabled=no_gdr is not None,
        gdr_disabled_line=no_gdr.cited if no_gdr is not None else None,
    )
    return CommFacts(summary, [reason] if reason else [], multi, tuple(span.processes))


class _Tally(NamedTuple):
    """What one communicator's connection lines add up to."""

    transports: Counter[tuple[str, str, str]]  # (transport, scope, gdr "1"/"0"/"") -> connection lines
    tcp_inter: Connection | None  # the first inter-node line on a TCP-class network
    rdma_gdr: set[bool]  # /GDRDMA shown or not, on lines of RDMA-class networks and CollNet
    no_gdr_inter: dict[str, Connection]  # transport -> its first inter-node line without GPUDirect RDMA


def _tally(comm: Communicator | None, conns: list[Connection], span: Span) -> _Tally:
    """Count the connection lines (and NVLS channels) by transport, scope and GDR; keep the first
    inter-node line on a TCP-class network and the GDR flags of RDMA lines."""
    transports: Counter[tuple[str, str, str]] = Counter()
    tcp_inter: Connection | None = None
    rdma_gdr: set[bool] = set()
    no_gdr_inter: dict[str, Connection] = {}
    for c in conns:
        counted = _counted_as(c.event, span)
        transports[counted] += 1
        if counted[1] == INTER and counted[2] == "0":
            no_gdr_inter.setdefault(counted[0], c)
        if c.event.kind == "collnet":
            rdma_gdr.add(c.event.gdr)
        elif c.event.kind == "net":
            cls = connection_class(c)
            if cls == TCP and counted[1] == INTER and tcp_inter is None:
                tcp_inter = c
            if cls == RDMA:
                rdma_gdr.add(c.event.gdr)
    if comm is not None and comm.nvls_channels:
        transports[("nvls", UNKNOWN if comm.mnnvl else INTRA, "")] += sum(comm.nvls_channels.values())
    return _Tally(transports, tcp_inter, rdma_gdr, no_gdr_inter)


def _counted_as(event: ConnectionEvent, span: Span) -> tuple[str, str, str]:
    """The (transport, scope, gdr) a connection line is counted under."""
    gdr = "1" if event.gdr else "0"
    if event.kind == "net":
        return (transport_of_network(event.network or ""), span.scope(event), gdr)
    if event.kind == "collnet":
        return ("collnet", INTER if span.multi else UNKNOWN, gdr)
    if event.kind == "p2p":
        return ("p2p", INTER if event.mnnvl else INTRA, "")
    return ("shm", INTRA, "")


def provider_of(processes: Iterable[Process]) -> str | None:
    """aws-ofi-nccl's libfabric provider as these processes show it (a TCP-class one first)."""
    providers = [p.ofi_provider for p in processes if p.ofi_provider]
    tcp = [p for p in providers if network_class(None, p) == TCP]
    if tcp:
        return tcp[0]
    return providers[0] if providers else None


def _comm_network(
    comm: Communicator | None, conns: list[Connection], processes: list[Process], rdma_by_gdr: AbstractSet[str]
) -> Selection:
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
        comm_class = class_of(comm.network, provider_of(processes), rdma_by_gdr)
        selected.insert(0, Selection(comm.network, comm.network_line, comm_class))
    if not selected:
        return NO_SELECTION
    # Ranks that disagree (one node on IB, another on Socket) are judged by the TCP one.
    tcp_selected = [sel for sel in selected if sel.cls == TCP]
    return tcp_selected[0] if tcp_selected else selected[0]


def _judge(
    key: str,
    comm: Communicator | None,
    span: Span,
    multi: bool | None,
    tcp_inter: Connection | None,
    network: Selection,
) -> tuple[bool | None, str | None]:
    """Whether the communicator's inter-node traffic runs on TCP (None: the log does not show), and why."""
    label = key if key != UNATTRIBUTED else "(communicator not named in the log)"
    shown = shown_network(network.name, network.cls)
    if tcp_inter is not None:
        return True, (
            f'communicator {label}: inter-node connection over TCP-class network {shown}: "{tcp_inter.cited}"'
        )
    if multi and network.cls == TCP and not (comm is not None and comm.mnnvl):
        nnodes_line = comm.nnodes_line if comm is not None else None
        why = f'"{nnodes_line}"' if nnodes_line else (span.multi_why or "several nodes")
        return True, (
            f"communicator {label} spans {span.nodes or 'several'} nodes ({why}) and uses "
            f"TCP-class network {shown}" + _quoted(network.line)
        )
    if span.single:
        if comm is not None and comm.nnodes_line and span.nodes == 1:
            return False, f'communicator {label} is on a single node: "{comm.nnodes_line}"'
        why = span.single_why or "every rank logged from one node"
        return False, f"communicator {label} is on a single node ({why})"
    if network.cls == RDMA:
        return False, f"communicator {label} uses RDMA network {shown}" + _quoted(network.line)
    if network.name is not None and network.cls is None:
        return None, f"communicator {label}: network {network.name} is not in the RDMA/TCP table"
    if network.cls == TCP:
        return None, (
            f"communicator {label} uses TCP-class network {shown} but the log does not show "
            "whether its traffic crosses nodes"
        )
    return None, None


def _quoted(line: str | None) -> str:
    """``: "<line>"`` after a reason, when there is a line to quote."""
    return f': "{line}"' if line else ""


def _gdr(rdma_gdr: set[bool], cls: str | None, processes: list[Process]) -> bool | str | None:
    """GPUDirect RDMA as the RDMA lines show it (``/GDRDMA``), else, on an RDMA-class network, as the
    processes' ``GPU Direct RDMA Enabled/Disabled`` lines do; "mixed" when both values show."""
    flags = rdma_gdr or ({flag for p in processes for flag in p.gdr_hca} if cls == RDMA else set())
    if not flags:
        return None
    return "mixed" if len(flags) > 1 else next(iter(flags))


def _without_gdr(no_gdr_inter: dict[str, Connection], cls: str | None) -> Connection | None:
    """The line that shows an inter-node connection on an RDMA-class network without GPUDirect RDMA
    (a NET/IB line, or a net plugin or CollNet line when the communicator's network is RDMA-class);
    None when there is none."""
    for transport, connection in no_gdr_inter.items():
        if transport == "net_ib" or (cls == RDMA and transport in ("net_plugin", "collnet")):
            return connection
    return None


def _version(processes: list[Process], log_version: str | None) -> str | None:
    """The NCCL version the communicator's processes print most often, else the log's."""
    versions = Counter(p.version for p in processes if p.version)
    return versions.most_common(1)[0][0] if versions else log_version

"""The verdict of one log stream from its communicators' summaries: does inter-node traffic fall
back to TCP, on which network, with GPUDirect RDMA or not, and why; plus what the node knows and
the log does not (:func:`with_node_context`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import NamedTuple

from exporter.nccl.facts import NodeKey, Process, connection_class, host_node_key, loopback_hosts, only_loopback
from exporter.nccl.launcher import names_host
from exporter.nccl.networks import NO_SELECTION, RDMA, TCP, Selection
from exporter.nccl.placement import version_side
from exporter.nccl.state import StreamState
from exporter.nccl.summaries import CommFacts, log_version, shown_network, summarize_all
from exporter.nccl.verdict import CommunicatorSummary, Verdict


class _Judgement(NamedTuple):
    """Whether inter-node traffic runs on TCP (None: the log does not show), and what says so."""

    inter_node_tcp: bool | None
    deciding: list[CommFacts]  # the communicators that decide it (the log's network is theirs)
    reasons: list[str]
    single_node: bool = False  # every process uses loopback interfaces: the log is on one node


def decide(state: StreamState) -> Verdict:
    """The stream's verdict (tcp_fallback, rdma, single_node or unknown) and the reasons for it."""
    facts = summarize_all(state)
    processes, nodes_of = state.process_nodes()
    selected = [sel for sel in (p.selected_network() for p in processes) if sel.name or sel.cls]
    judged = _judge(state, facts, selected, processes, nodes_of)
    network, network_cls = _log_network(judged.deciding or facts, selected)
    verdict = _name(state, facts, judged, network_cls)
    node_counts = [f.summary.nnodes for f in facts if f.summary.nnodes]
    rank_counts = [f.summary.nranks for f in facts if f.summary.nranks]
    return Verdict(
        verdict=verdict,
        inter_node_tcp=judged.inter_node_tcp,
        network=network,
        gdr=_log_gdr(facts),
        nccl_version=log_version(state),
        nodes=max(node_counts) if node_counts else (1 if judged.single_node else None),
        nranks=max(rank_counts) if rank_counts else None,
        communicators=tuple(f.summary for f in facts),
        warnings=tuple(state.warnings),
        reasons=_reasons(state, facts, judged, verdict, processes),
    )


# ---------------------------------------------------------------------------------------------
# Does inter-node traffic run on TCP?


def _judge(
    state: StreamState,
    facts: list[CommFacts],
    selected: list[Selection],
    processes: list[Process],
    nodes_of: dict[int, NodeKey],
) -> _Judgement:
    """Whether inter-node traffic runs on TCP: a communicator (or an evicted one) that shows it
    decides; else communicators on an RDMA network; else the job as a whole (its nodes and what
    its processes selected), the communicators that stay on one node, and the processes' own lines."""
    if state.retired.inter_node_tcp or any(f.summary.inter_node_tcp is True for f in facts):
        return _fallback_shown(state, facts)
    if any(f.summary.inter_node_tcp is False and f.multi_node is not False for f in facts):
        return _judged_by_communicators(state, facts, selected)
    return _judged_as_a_job(state, facts, selected, processes, nodes_of)


def _fallback_shown(state: StreamState, facts: list[CommFacts]) -> _Judgement:
    """TCP carries inter-node traffic: the communicators (and evicted ones) that show it say why."""
    deciding = [f for f in facts if f.summary.inter_node_tcp is True]
    reasons = [r for f in deciding for r in f.reasons[:1]]
    if state.retired.inter_node_tcp:
        reasons.extend(state.retired.reasons[:1])
    return _Judgement(True, deciding, reasons)


def _judged_by_communicators(state: StreamState, facts: list[CommFacts], selected: list[Selection]) -> _Judgement:
    """No communicator shows TCP between nodes: no fallback (False), unless one the log leaves open
    may run on TCP (None)."""
    rdma_only = _log_network_classes(state, facts, selected) == {RDMA}
    open_tcp = [f for f in facts if _open_on_tcp(f.summary, rdma_only)]
    deciding = [f for f in facts if f.summary.inter_node_tcp is False]
    reasons = [r for f in (open_tcp or deciding)[:3] for r in f.reasons[:1]]
    return _Judgement(None if open_tcp else False, deciding, reasons)


def _open_on_tcp(summary: CommunicatorSummary, rdma_only: bool) -> bool:
    """A communicator with connections that the log leaves open and that may run on TCP: its network
    is TCP-class or not in the table, or it has none of its own and not every network the log names
    is RDMA-class (a process uses one network)."""
    if summary.inter_node_tcp is not None or not summary.transports:
        return False
    if summary.network_class == TCP:
        return True
    return summary.network_class is None and (summary.network is not None or not rdma_only)


def _judged_as_a_job(
    state: StreamState,
    facts: list[CommFacts],
    selected: list[Selection],
    processes: list[Process],
    nodes_of: dict[int, NodeKey],
) -> _Judgement:
    """No communicator shows inter-node traffic: the log's processes are one job (one launch), so when
    they run on several nodes, a process that selected a TCP-class network (and is not shown to stay
    in communicators on one node) can reach the others only over TCP. Else: every communicator on
    one node, loopback interfaces only, or RDMA selected by every process decide; else the log does
    not tell."""
    # A process whose every communicator is shown on one node has no link to another node; one whose
    # every communicator has a single rank has no peer at all, so it tells nothing of the job's nodes.
    confined = {id(p) for f in facts if f.multi_node is False for p in f.processes}
    confined -= {id(p) for f in facts if f.multi_node is not False for p in f.processes}
    alone = {id(p) for f in facts if f.summary.nranks == 1 for p in f.processes}
    alone -= {id(p) for f in facts if f.summary.nranks != 1 for p in f.processes}
    tcp_processes = [p for p in processes if id(p) not in confined and p.selected_network().cls == TCP]
    hosts = _job_hosts(state, [p for p in processes if id(p) not in alone], nodes_of)
    several = (len(hosts) > 1 and _one_job(state, facts)) or any(f.multi_node for f in facts)
    if several and tcp_processes:
        first = tcp_processes[0].selected_network()
        where = ", ".join(hosts[:4]) if len(hosts) > 1 else "several nodes"
        return _Judgement(
            True,
            [],
            [
                f"the job runs on {where} and selected TCP-class network {shown_network(first.name, first.cls)}, "
                f'the only network its links between nodes can use: "{first.line}"'
            ],
        )
    crossing = next((line for line in (_net_traffic_before_2_14(state, p) for p in tcp_processes) if line), None)
    if crossing is not None:
        first = tcp_processes[0].selected_network()
        return _Judgement(
            True,
            [],
            [
                "before NCCL 2.14 a process sends over its network only to other nodes, and this one sends over "
                f'TCP-class network {shown_network(first.name, first.cls)}: "{crossing}"'
            ],
        )
    if facts and not several and all(f.multi_node is False for f in facts):
        return _Judgement(False, [], [r for f in facts for r in f.reasons[:1]], single_node=True)
    if only_loopback(processes):
        return _Judgement(
            False,
            [],
            [
                "every process uses loopback interfaces only ("
                + loopback_hosts(processes)
                + "): NCCL cannot reach another node"
            ],
            single_node=True,
        )
    if selected and {sel.cls for sel in selected} == {RDMA}:
        first = selected[0]
        return _Judgement(
            False, [], [f'every process uses RDMA network {shown_network(first.name, first.cls)}: "{first.line}"']
        )
    return _Judgement(None, [], [r for f in facts for r in f.reasons[:1]])


def _net_traffic_before_2_14(state: StreamState, process: Process) -> str | None:
    """The line showing ``process`` move data over its network, when NCCL older than 2.14 wrote it and
    SHM is not disabled: then that traffic crosses nodes (two ranks of one host connect over P2P or
    SHM before 2.14). None otherwise."""
    versions = [process.version] if process.version else list(state.versions)
    if state.shm_disabled or version_side(versions) != "before":
        return None
    if process.socket_datapath_line:
        return process.socket_datapath_line
    return next((c.cited for c in state.connections.values() if c.process is process and c.event.kind == "net"), None)


def _log_network_classes(state: StreamState, facts: list[CommFacts], selected: list[Selection]) -> set[str | None]:
    """The classes of every network the log names: connection lines, selections, communicators."""
    classes = {connection_class(c) for c in state.connections.values() if c.event.network}
    classes |= {f.summary.network_class for f in facts if f.summary.network or f.summary.network_class}
    classes |= {sel.cls for sel in selected}
    return classes


def _job_hosts(state: StreamState, processes: list[Process], nodes_of: dict[int, NodeKey]) -> list[str]:
    """The nodes the job's processes run on, as reasons name them: the processes' own (hostname and
    address), those nccl-tests' device table names, and hosts a launcher shows running a rank."""
    nodes = {nodes_of[id(p)] for p in processes if id(p) in nodes_of}
    nodes |= {n for n in (host_node_key(h, processes) for h, _ in state.test_ranks.values()) if n is not None}
    if state.launcher_names_hosts:
        for word in state.rank_hosts:
            if not any(names_host(word, host) for host, _ in nodes):
                nodes.add((word, ""))
    return sorted(f"{host} ({address})" if address else host for host, address in nodes)


def _one_job(state: StreamState, facts: list[CommFacts]) -> bool:
    """The log's processes are ranks of one job: one launch (a log holds one run, unless Open MPI's tags
    show several job ids or nccl-tests' device tables several runs); across several launches, only
    when the log ties them (one nccl-tests table lists them, or one communicator size of two or more
    shows)."""
    if len(state.launcher_jobs) <= 1 and not state.test_runs_mixed:
        return True
    if state.test_ranks and not state.test_runs_mixed:
        return True
    sizes = {f.summary.nranks for f in facts if f.summary.nranks} | (
        {state.loose_nranks} if state.loose_nranks else set()
    )
    return len(sizes) == 1 and next(iter(sizes)) >= 2


# ---------------------------------------------------------------------------------------------
# The rest of the verdict


def _name(state: StreamState, facts: list[CommFacts], judged: _Judgement, network_cls: str | None) -> str:
    """tcp_fallback, else single_node (every communicator on one node), else rdma, else unknown."""
    if judged.inter_node_tcp is True:
        return "tcp_fallback"
    if judged.single_node:
        return "single_node"
    if judged.inter_node_tcp is False and (network_cls == RDMA or state.retired.inter_node_rdma):
        return "rdma"
    return "unknown"


def _log_network(facts: list[CommFacts], selected: list[Selection]) -> tuple[str | None, str | None]:
    """The log's network and its class: the one these communicators name most, else the selection
    the processes show most."""
    named = [f.summary for f in facts if f.summary.network or f.summary.network_class]
    if named:
        top = Counter(c.network for c in named).most_common(1)[0][0]
        return top, next(c.network_class for c in named if c.network == top)
    top_selection = Counter(selected).most_common(1)[0][0] if selected else NO_SELECTION
    return top_selection.name, top_selection.cls


def _log_gdr(facts: list[CommFacts]) -> bool | str | None:
    """GPUDirect RDMA over all communicators: their one value, or "mixed"."""
    gdrs = {f.summary.gdr for f in facts if f.summary.gdr is not None}
    if not gdrs:
        return None
    return "mixed" if ("mixed" in gdrs or len(gdrs) > 1) else next(iter(gdrs))


def _reasons(
    state: StreamState, facts: list[CommFacts], judged: _Judgement, verdict: str, processes: list[Process]
) -> tuple[str, ...]:
    """The judgement's reasons (on a single node without any, the communicators'), else why the log
    does not tell; then how many communicators were evicted."""
    reasons = list(judged.reasons)
    if not reasons and verdict == "single_node":
        reasons = [r for f in facts for r in f.reasons[:1]]
    if not reasons:
        reasons.append(
            "the log shows no NCCL network selection, communicator or connection line"
            if not facts and not processes
            else "the log does not show enough to tell which network carries inter-node traffic"
        )
    if state.retired.count:
        reasons.append(f"{state.retired.count} older communicators were evicted by the communicator cap")
    return tuple(dict.fromkeys(reasons))


# ---------------------------------------------------------------------------------------------
# What the node adds


def with_node_context(verdict: Verdict, gpus_on_node: int | None, gpus_held_here: int | None) -> Verdict:
    """The verdict once what the node knows and the log does not is added.

    A communicator with more ranks than this node has GPUs, or than the job's pods hold here, spans
    nodes: NCCL never puts two ranks of one communicator on one GPU. Only communicators the log left
    open (``inter_node_tcp`` None on a TCP-class network) are decided this way; a log that already
    decides keeps its answer.
    """
    if verdict.verdict != "unknown":
        return verdict
    bounds = [
        (n, what) for n, what in ((gpus_held_here, "the job's pods hold here"), (gpus_on_node, "this node has")) if n
    ]
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
    reason = (
        f"communicator {first.comm_id} has {first.nranks} ranks but {what} {bound} GPUs: it spans nodes, "
        f"on TCP-class network {shown_network(first.network, first.network_class)}"
    )
    return replace(
        verdict,
        verdict="tcp_fallback",
        inter_node_tcp=True,
        communicators=tuple(communicators),
        reasons=(reason, *verdict.reasons),
    )

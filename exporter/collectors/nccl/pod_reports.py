"""How a pod's streams combine into one ``PodReport``: each stream's verdict judged with what the
node knows (its GPU count, the GPUs the pod's job holds here), then one verdict for the pod, its
communicators and connections as series rows, its warnings and the NICs its GPUs send through.
Also what the lifecycle hooks take from a snapshot (``pod_fabrics``)."""

from __future__ import annotations

from exporter.collectors.nccl.attribution import PodAttribution
from exporter.collectors.nccl.families import CommunicatorRow, ConnectionRow, PodReport, Snapshot
from exporter.collectors.nccl.nic_affinity import pod_nic_affinity
from exporter.collectors.nccl.streams import PodStreams, add_counts
from exporter.fabric_verdicts import PodFabric
from exporter.nccl.decision import with_node_context
from exporter.sources.topology import Topology

GDR_LABELS = {"1": "true", "0": "false"}  # the parser's transport-key gdr field → label
# How a pod's streams combine into one ccl_nccl_verdict state: any fallback decides; then RDMA
# (a process uses one network for all its communicators); "cannot tell" outranks "one node",
# which a later communicator may contradict.
VERDICT_PRIORITY = ("tcp_fallback", "rdma", "unknown", "single_node")


def _label(value: object) -> str:
    if value is None:
        return ""
    if value is True:
        return "true"
    if value is False:
        return "false"
    return str(value)


def pod_report(pod: PodStreams, attribution: PodAttribution, topology: Topology | None) -> PodReport:
    """One pod's report from its streams' analyzers, judged against this node."""
    communicators: set[CommunicatorRow] = set()
    connections: dict[tuple[str, str, str, str], int] = {}
    has_nccl = inter_node_tcp = gdr_disabled = False
    warnings = dict(pod.retired_warnings)
    verdicts: set[str] = set()
    reasons: dict[str, str] = {}  # verdict -> the first reason of a stream that reached it
    gdr_reason = ""
    for stream in pod.streams.values():
        verdict = with_node_context(stream.current_verdict(), attribution.node_gpus, attribution.job_gpus_here)
        warnings = add_counts(warnings, stream.warnings())
        if verdict.verdict != "unknown" or verdict.communicators or verdict.network:
            has_nccl = True
            verdicts.add(verdict.verdict)
            if verdict.reasons:
                reasons.setdefault(verdict.verdict, verdict.reasons[0])
        inter_node_tcp = inter_node_tcp or verdict.inter_node_tcp is True
        for comm in verdict.communicators:
            comm_id = _label(comm.comm_id)
            communicators.add(
                CommunicatorRow(
                    comm_id,
                    _label(comm.nranks),
                    _label(comm.nnodes),
                    _label(comm.network),
                    _label(comm.network_class),
                    _label(comm.nccl_version),
                )
            )
            for (transport, scope, gdr), count in comm.transports.items():
                slot = (comm_id, _label(transport), _label(scope) or "unknown", GDR_LABELS.get(gdr, "unknown"))
                connections[slot] = connections.get(slot, 0) + int(count)
            gdr_disabled = gdr_disabled or comm.gdr_disabled
            if comm.gdr_disabled and not gdr_reason:
                gdr_reason = (
                    f"communicator {comm.comm_id} connects nodes over {comm.network or 'RDMA'} without "
                    f'GPUDirect RDMA: "{comm.gdr_disabled_line or ""}"'
                )
    pod_verdict = next((v for v in VERDICT_PRIORITY if v in verdicts), "unknown")
    return PodReport(
        namespace=pod.namespace,
        pod=pod.pod,
        job_name=attribution.job_name,
        job_kind=attribution.job_kind,
        communicators=tuple(sorted(communicators)),
        connections=tuple(sorted(ConnectionRow(*slot, count) for slot, count in connections.items())),
        has_nccl=has_nccl,
        inter_node_tcp=inter_node_tcp,
        gdr_disabled=gdr_disabled,
        warnings=tuple(sorted(warnings.items())),
        verdict=pod_verdict,
        reason=reasons.get(pod_verdict, ""),
        gdr_reason=gdr_reason,
        nic_affinity=pod_nic_affinity(
            pod.pod,
            (use for stream in pod.streams.values() for use in stream.nics),
            attribution.host_network,
            topology,
        ),
    )


def pod_fabrics(snapshot: Snapshot) -> tuple[PodFabric, ...]:
    """What the lifecycle hooks act on: each pod with NCCL output, its verdict and the line that decided it."""
    return tuple(
        PodFabric(
            namespace=report.namespace,
            pod=report.pod,
            verdict=report.verdict,
            node_rdma_active=snapshot.node_has_active_rdma,
            gdr_disabled=report.gdr_disabled,
            reason=report.reason,
            gdr_reason=report.gdr_reason,
        )
        for report in snapshot.pods
        if report.has_nccl
    )

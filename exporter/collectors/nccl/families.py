"""The ``ccl_nccl_*`` families: what the NCCL collector publishes for each pod (an immutable
snapshot, safe to read from any thread) and how one snapshot becomes metric families at scrape
time, within the collector's series caps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

# ccl_nccl_verdict states, one series each (kube-state-metrics' phase convention).
VERDICTS = ("rdma", "single_node", "tcp_fallback", "unknown")


@dataclass(frozen=True)
class NcclLimits:
    """Caps of the collector itself (the parser's caps are ``exporter.nccl.Limits``)."""

    max_communicator_series_per_pod: int = 256
    max_communicator_series: int = 4096
    max_warning_categories: int = 64
    # Every stream's analyzer together (their own estimate, LogAnalyzer.approx_bytes). Over it, the
    # largest give back memory (parsed-line caches, then their oldest communicators, whose
    # conclusions are kept) down to 80 % of it, counted as ccl_nccl_dropped_total{reason="parser_budget"}.
    parser_memory_budget_bytes: int = 64 * 1024 * 1024


class CommunicatorRow(NamedTuple):
    """One ``ccl_nccl_communicator_info`` series of a pod: its label values ("" where the log did not say)."""

    comm_id: str
    nranks: str
    nnodes: str
    network: str
    network_class: str
    nccl_version: str


class ConnectionRow(NamedTuple):
    """One ``ccl_nccl_connections`` series of a pod: a communicator's channel connections of one kind."""

    comm_id: str
    transport: str
    scope: str  # inter_node, intra_node or unknown
    gdr: str  # true, false or unknown
    channel_connections: int


class NicAffinityRow(NamedTuple):
    """One ``ccl_nccl_nic_affinity`` series: the NIC one of the pod's GPUs sends NCCL traffic through."""

    gpu: str
    device: str
    affinity: str  # class of the GPU-NIC PCIe path, "" when the topology does not tell
    gdr: str  # true, false or mixed
    nearest_affinity: str  # class of the GPU's nearest NIC, "" when unknown


class ExpectedNetwork(NamedTuple):
    """One ``ccl_pod_expected_network_info`` series: a pod of the node that declares its network."""

    namespace: str
    pod: str
    job_name: str
    job_kind: str
    expected_network: str
    network_class: str  # rdma or tcp, "" when the name is not known


@dataclass(frozen=True)
class PodReport:
    """What the collector exposes for one pod: a snapshot, safe to read from any thread. A pod
    with only its names and job is a GPU pod whose logs show no NCCL output."""

    namespace: str
    pod: str
    job_name: str
    job_kind: str
    communicators: tuple[CommunicatorRow, ...] = ()
    connections: tuple[ConnectionRow, ...] = ()
    has_nccl: bool = False
    inter_node_tcp: bool = False
    gdr_disabled: bool = False
    warnings: tuple[tuple[str, int], ...] = ()  # (category, count)
    verdict: str = "unknown"  # one of VERDICTS, with what the node knows (GPU counts) added
    # the NIC each of the pod's GPUs sends NCCL traffic through, and the class of the GPU's nearest NIC
    nic_affinity: tuple[NicAffinityRow, ...] = ()
    reason: str = ""  # why that verdict, quoting the deciding line (the first reason of a stream that decided it)
    gdr_reason: str = ""  # the line that shows an inter-node RDMA connection without GPUDirect RDMA


@dataclass(frozen=True)
class Snapshot:
    pods: tuple[PodReport, ...] = ()
    node_has_active_rdma: bool | None = None
    dropped: tuple[tuple[str, int], ...] = ()
    tail_bytes: tuple[tuple[str, int], ...] = ()
    tail_lines: tuple[tuple[str, int], ...] = ()
    tail_files: tuple[tuple[str, int], ...] = ()
    tail_skipped: tuple[tuple[str, int], ...] = ()
    streams: int = 0
    analyzers: int = 0
    backlog_bytes: int = 0
    unattributed_files: int = 0
    metadata_available: bool = False
    state_save_errors: int = 0
    parser_bytes: int = 0
    expectations: tuple[ExpectedNetwork, ...] = ()  # pods that declare their network


def nccl_families(snap: Snapshot, limits: NcclLimits) -> list[Metric]:
    """The ``ccl_nccl_*`` families of one snapshot, within the series caps of ``limits``."""
    pod_labels = ["namespace", "pod", "job_name", "job_kind"]
    info = GaugeMetricFamily(
        "ccl_nccl_communicator_info",
        "An NCCL communicator seen in the pod's logs; always 1. network as NCCL printed it "
        "(IB, Socket, IBext_v8, AWS Libfabric, ...), empty when the log did not say; network_class "
        "rdma or tcp (by name, or by aws-ofi-nccl's libfabric provider), empty when unknown.",
        labels=pod_labels + ["comm_id", "nranks", "nnodes", "network", "network_class", "nccl_version"],
    )
    verdict_family = GaugeMetricFamily(
        "ccl_nccl_verdict",
        "The pod's NCCL transport verdict, one series per state (rdma, single_node, tcp_fallback, "
        "unknown): 1 for the current one. unknown = its logs (and this node's GPU count) do not show "
        "which network carries inter-node traffic, also for GPU pods that print no NCCL logs.",
        labels=pod_labels + ["verdict"],
    )
    expected = GaugeMetricFamily(
        "ccl_pod_expected_network_info",
        "A pod on this node that declares the network it runs on (label ccl-health.io/expected-network "
        "on the pod or its namespace); always 1. network_class tcp means TCP on purpose: not a fallback.",
        labels=pod_labels + ["expected_network", "network_class"],
    )
    for expectation in snap.expectations:
        expected.add_metric(list(expectation), 1.0)
    connections = GaugeMetricFamily(
        "ccl_nccl_connections",
        "Channel connections of a communicator by transport (net_ib, net_socket, net_plugin, "
        "p2p, shm, nvls, collnet), scope (inter_node, intra_node, unknown) and gdr (true, false, unknown).",
        labels=["namespace", "pod", "job_name", "comm_id", "transport", "scope", "gdr"],
    )
    fallback = GaugeMetricFamily(
        "ccl_nccl_tcp_fallback",
        "1 when the pod's inter-node NCCL traffic runs over a TCP-class network while this "
        "node has an ACTIVE RDMA port; 0 otherwise (also on nodes without RDMA).",
        labels=pod_labels,
    )
    gdr = GaugeMetricFamily(
        "ccl_nccl_gdr_disabled",
        "1 when inter-node NCCL connections run on RDMA without GPUDirect RDMA (staged through host memory).",
        labels=pod_labels,
    )
    warnings = CounterMetricFamily(
        "ccl_nccl_warnings_total",
        "NCCL warnings in the pod's logs by category.",
        labels=["namespace", "pod", "job_name", "category"],
    )
    series_dropped = GaugeMetricFamily(
        "ccl_nccl_series_dropped",
        "Series not exposed in this scrape because of the per-pod or per-node caps.",
        labels=["metric"],
    )
    nic_affinity = GaugeMetricFamily(
        "ccl_nccl_nic_affinity",
        "The RDMA NIC (device) a GPU's NCCL network traffic leaves through, from the pod's NET channel lines, "
        "and the class of their PCIe path (PIX, PXB, PHB, NODE, SYS as nvidia-smi topo -m, not NCCL's own path "
        "types, which put NODE under PHB; PIX/PXB against the rest splits the same in both; empty when sysfs "
        "does not tell); always 1. gdr: true when those channels use GPUDirect RDMA, false when none does, "
        "mixed. nearest_affinity: the class of the GPU's nearest NIC (ccl_topology_gpu_nearest_nic_info), "
        "empty when unknown; affinity above it means the traffic skips a nearer NIC.",
        labels=["namespace", "pod", "job_name", "gpu", "device", "affinity", "gdr", "nearest_affinity"],
    )
    per_pod_cap = limits.max_communicator_series_per_pod
    budget = limits.max_communicator_series
    info_dropped = conn_dropped = warn_dropped = 0
    flag_fallback = snap.node_has_active_rdma is True
    for report in snap.pods:
        head = [report.namespace, report.pod, report.job_name, report.job_kind]
        for state in VERDICTS:
            verdict_family.add_metric(head + [state], 1.0 if report.verdict == state else 0.0)
        if not report.has_nccl and not report.warnings:
            continue
        if report.has_nccl:
            fallback.add_metric(head, 1.0 if (report.inter_node_tcp and flag_fallback) else 0.0)
            gdr.add_metric(head, 1.0 if report.gdr_disabled else 0.0)
        for nic in report.nic_affinity:
            nic_affinity.add_metric([report.namespace, report.pod, report.job_name, *nic], 1.0)
        allowed = min(per_pod_cap, max(budget, 0))
        shown = report.communicators[:allowed]
        info_dropped += len(report.communicators) - len(shown)
        budget -= len(shown)
        shown_ids = {comm.comm_id for comm in shown}
        for comm in shown:
            info.add_metric(head + list(comm), 1.0)
        for conn in report.connections:
            if conn.comm_id not in shown_ids:
                conn_dropped += 1
                continue
            connections.add_metric(
                [report.namespace, report.pod, report.job_name, conn.comm_id, conn.transport, conn.scope, conn.gdr],
                float(conn.channel_connections),
            )
        for index, (category, count) in enumerate(report.warnings):
            if index >= limits.max_warning_categories:
                warn_dropped += 1
                continue
            warnings.add_metric([report.namespace, report.pod, report.job_name, category], float(count))
    for metric, count in (
        ("ccl_nccl_communicator_info", info_dropped),
        ("ccl_nccl_connections", conn_dropped),
        ("ccl_nccl_warnings_total", warn_dropped),
    ):
        series_dropped.add_metric([metric], float(count))

    by_one_label = [
        (
            CounterMetricFamily,
            "ccl_nccl_dropped_total",
            "Input the NCCL pipeline dropped or cut to stay bounded, by reason: parser_* (parser "
            "caps: communicators, processes, ...; parser_budget: the node-wide parser memory budget), "
            "tail_long_line, tail_stream_evicted, tail_malformed_cri, tail_truncated, tail_replaced, "
            "tail_gz_cap, tail_gz_corrupt, tail_state_invalid, tail_pod_not_on_node, tail_pod_uid_mismatch, "
            "tail_pod_uid_missing, tail_pod_list_unavailable, tail_symlink, tail_folder_cap.",
            "reason",
            snap.dropped,
        ),
        (
            CounterMetricFamily,
            "ccl_nccl_log_read_bytes_total",
            "Bytes read from pod logs and NCCL debug files.",
            "source",
            snap.tail_bytes,
        ),
        (
            CounterMetricFamily,
            "ccl_nccl_log_lines_total",
            "Lines containing NCCL handed to the parser.",
            "source",
            snap.tail_lines,
        ),
        (
            CounterMetricFamily,
            "ccl_nccl_log_skipped_bytes_total",
            "Bytes not parsed, by reason: initial_cap (busy log found at start), long_line, "
            "stream_evicted, vanished (file deleted before it was read to its end), pod_not_on_node "
            "(files of a pod that left the node), gz_cap and gz_corrupt (rest of a .gz resumed after a "
            "restart: past the decompression cap, or corrupt; compressed bytes).",
            "reason",
            snap.tail_skipped,
        ),
        (GaugeMetricFamily, "ccl_nccl_log_files", "Log files being tailed.", "source", snap.tail_files),
    ]
    rdma_active = None if snap.node_has_active_rdma is None else int(snap.node_has_active_rdma)
    gauges = [
        ("ccl_nccl_log_streams", "Log streams (container runs and debug files) being tailed.", snap.streams),
        ("ccl_nccl_log_backlog_bytes", "Bytes written to tailed files and not yet read.", snap.backlog_bytes),
        (
            "ccl_nccl_parser_memory_bytes",
            "Memory the NCCL log analyzers of all streams hold (their own estimate), kept within "
            "--collector.nccl.parser-memory-budget.",
            snap.parser_bytes,
        ),
        (
            "ccl_nccl_log_unattributed_files",
            "Entries under the NCCL debug-file folder outside a <namespace>_<pod>_<uid> folder (not read).",
            snap.unattributed_files,
        ),
        (
            "ccl_nccl_pod_metadata_available",
            "1 when pods are attributed to jobs from a complete list of the node's pods (the Kubernetes API's).",
            1 if snap.metadata_available else 0,
        ),
        (
            "ccl_nccl_node_rdma_active",
            "1 when this node has an ACTIVE RDMA port (what TCP fallback is judged against); "
            "absent when it could not be read.",
            rdma_active,
        ),
    ]
    out: list[Metric] = [info, verdict_family, connections, fallback, gdr, warnings, series_dropped, expected]
    out.append(nic_affinity)
    for family_type, metric_name, help_text, label, pairs in by_one_label:
        labelled = family_type(metric_name, help_text, labels=[label])
        for label_value, count in pairs:
            labelled.add_metric([label_value], float(count))
        out.append(labelled)
    for metric_name, help_text, gauge_value in gauges:
        family = GaugeMetricFamily(metric_name, help_text)
        if gauge_value is not None:
            family.add_metric([], float(gauge_value))
        out.append(family)
    save_errors = CounterMetricFamily(
        "ccl_nccl_state_save_errors_total", "Failed writes of the tail-offset state file."
    )
    save_errors.add_metric([], float(snap.state_save_errors))
    out.append(save_errors)
    return out

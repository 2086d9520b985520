"""Our shipped alert rules, end to end: real exporter processes on simulated nodes, a real
Prometheus evaluating ``alerts/ccl-health-rules.yaml`` (every duration divided by 60, see
``compress_time``; expressions, labels and thresholds unchanged), a real Alertmanager
delivering to a webhook receiver in the test.

Not real here: the GPUs, NICs and pods (the simulated node writes the files the exporter
reads), and kube-state-metrics (a static stand-in serves ``kube_node_status_capacity``).
"""

from __future__ import annotations

import time
from typing import Any

from ccl_sim.nvml import TRAINING_NAMESPACE, TRAINING_POD
from devtools.stack import Intervals, SimulatedExporter, make_healthy


def test_exporter_killed_raises_absent_and_names_the_node(start_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster = start_cluster(nodes=2, intervals=Intervals())
    victim = cluster.node("gpu-node-02")
    victim.kill()
    got = cluster.receiver.wait_alert("CclExporterAbsent", "firing", timeout=60, match={"node": "gpu-node-02"})
    assert got is not None, cluster.prometheus.alerts()
    _, alert = got
    assert alert["labels"]["severity"] == "warning"
    assert "gpu-node-02" in alert["annotations"]["description"]
    assert not any(
        a["labels"].get("node") == "gpu-node-01"
        for a in cluster.prometheus.alerts()
        if a["labels"]["alertname"] == "CclExporterAbsent"
    ), "the node whose exporter runs is not reported absent"


def _alerts_named(cluster, alertname: str) -> list[dict]:  # type: ignore[no-untyped-def, type-arg]
    return [a for a in cluster.prometheus.alerts() if a["labels"]["alertname"] == alertname]


def test_rdma_port_down_fires_for_that_port_and_resolves_when_it_is_back(start_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster = start_cluster(nodes=2, intervals=Intervals())

    # The rule only pages for ports in service (the most ACTIVE at once in the 7-day look-back the
    # hourly group records, read over its last two values: hours are minutes here): let one record
    # the node's ACTIVE ports.
    def in_service() -> bool:
        seen = cluster.prometheus.values('max_over_time(node:ccl_rdma_ports_active:max7d{node="gpu-node-01"}[2m])')
        now = cluster.prometheus.values('node:ccl_rdma_ports_active:count{node="gpu-node-01"}')
        return bool(seen) and seen == now and seen[0] > 0

    # Two groups of a (compressed) hour each lie between the first scrape and that record: the
    # hour's maximum, then the 7-day maximum of those. Prometheus starts each group at an offset
    # hashed from its name and file (a temporary path here), so the second may first run just
    # before the first records anything: up to two intervals and the first scrape (90 s was too
    # short once in a run of the whole suite).
    hour = 60.0
    cluster.prometheus.wait_until(in_service, timeout=2 * hour + 60, what="the node's ports ACTIVE in the roll-up")
    node = cluster.node("gpu-node-01")
    node.act("rdma-port-down", device="mlx5_2")
    got = cluster.receiver.wait_alert("CclRdmaPortDown", "firing", timeout=60, match={"node": "gpu-node-01"})
    assert got is not None, cluster.prometheus.alerts()
    _, alert = got
    assert "device" not in alert["labels"] and alert["labels"]["severity"] == "critical"
    description = " ".join(alert["annotations"]["description"].split())
    assert description.startswith("1 in-service RDMA port(s) of node gpu-node-01"), description
    assert "mlx5_2/1 (state 1" in description, description
    assert [a["labels"]["node"] for a in _alerts_named(cluster, "CclRdmaPortDown")] == ["gpu-node-01"]

    node.act("rdma-port-up", device="mlx5_2")
    assert cluster.receiver.wait_alert("CclRdmaPortDown", "resolved", timeout=60, match={"node": "gpu-node-01"})


def job_without_nccl_logs_on_idle_rdma(exporters: list[SimulatedExporter]) -> None:
    """The training job keeps its GPUs on both nodes but logs no NCCL INFO (NCCL_DEBUG unset: no log
    to read), and the nodes' RDMA ports carry nothing."""
    make_healthy(exporters)
    for exporter in exporters:
        exporter.act("rdma-traffic-stop")
        exporter.act("nccl-job-stop", namespace=TRAINING_NAMESPACE, pod=TRAINING_POD)


def pod_traffic(cluster: Any, transmit_bytes_per_second: float, receive_bytes_per_second: float) -> None:
    """The training pod on every node moves these bytes/s on its own interface (each simulated
    node's kubelet Summary API, which its exporter reads)."""
    for exporter in cluster.exporters:
        exporter.act(
            "pod-traffic",
            namespace=TRAINING_NAMESPACE,
            pod=TRAINING_POD,
            transmit_bytes_per_second=transmit_bytes_per_second,
            receive_bytes_per_second=receive_bytes_per_second,
        )


def test_counters_only_suspected_fallback(start_cluster) -> None:  # type: ignore[no-untyped-def]
    """A job whose pods log no NCCL INFO, on two nodes, with 2 GB/s each way on the pod network
    (the kubelet's Summary API, read by the exporter) while the RDMA ports are idle: inferred
    from counters."""
    cluster = start_cluster(nodes=2, intervals=Intervals(), before_scrape=job_without_nccl_logs_on_idle_rdma)
    pod_traffic(cluster, 2e9, 2e9)
    got = cluster.receiver.wait_alert("CclSuspectedTcpFallback", "firing", timeout=60, match={"node": "gpu-node-02"})
    assert got is not None, cluster.prometheus.alerts()
    _, alert = got
    assert alert["labels"]["namespace"] == TRAINING_NAMESPACE
    assert alert["labels"]["pod"] == TRAINING_POD
    assert alert["labels"]["evidence"] == "pod_network"
    assert alert["labels"]["job_name"] == "llama-70b", "the job across both nodes"
    assert not _alerts_named(cluster, "CclNcclTcpFallback"), "no NCCL log says so: only the suspicion"


def test_data_loading_over_the_pod_network_is_not_taken_for_a_fallback(start_cluster) -> None:  # type: ignore[no-untyped-def]
    """The look-alike of the counters-only suspicion: the same job without NCCL logs and idle RDMA,
    reading its dataset over the pod network (2 GB/s in, 50 MB/s out): gradients go both ways,
    a dataset one way. After longer than the compressed window and ``for:``, nothing fires."""
    cluster = start_cluster(nodes=2, intervals=Intervals(), before_scrape=job_without_nccl_logs_on_idle_rdma)
    pod_traffic(cluster, 5e7, 2e9)
    time.sleep(20)
    rate = cluster.prometheus.values(
        f'namespace_pod:ccl_gpu_pod_network_receive_bytes:rate5m{{namespace="{TRAINING_NAMESPACE}",pod="{TRAINING_POD}"}}'
    )
    assert rate and rate[0] > 1e9, "the traffic was seen (not vacuously quiet)"
    assert not _alerts_named(cluster, "CclSuspectedTcpFallback"), cluster.prometheus.alerts()
    assert "CclSuspectedTcpFallback" not in cluster.receiver.alertnames("firing")


def test_healthy_multi_node_job_fires_nothing(start_cluster) -> None:  # type: ignore[no-untyped-def]
    """Two nodes of one job on RDMA with NVLink busy: after longer than the longest compressed
    ``for:`` of the fabric alerts (15 s), nothing is firing and nothing was delivered."""
    cluster = start_cluster(nodes=2, intervals=Intervals())
    time.sleep(20)
    firing = {a["labels"]["alertname"] for a in cluster.prometheus.alerts() if a["state"] == "firing"}
    assert firing == set(), cluster.prometheus.alerts()
    assert cluster.receiver.alertnames("firing") == set()
    # The rules did evaluate the healthy fleet (not vacuously quiet): the job and its traffic are visible.
    assert cluster.prometheus.values('namespace_job_name:ccl_gpu_pod_nodes:count{job_name="llama-70b"}') == [2.0]
    assert all(v > 1e9 for v in cluster.prometheus.values("node:ccl_rdma_transmit_bytes:rate5m"))


def test_tcp_fallback_fires_with_the_job_named_and_resolves_when_the_job_is_gone(start_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster = start_cluster(nodes=2, intervals=Intervals())
    node = cluster.node("gpu-node-01")
    written = node.act("nccl-job-restart", namespace=TRAINING_NAMESPACE, pod=TRAINING_POD, network="Socket")["at"]
    want = {"namespace": TRAINING_NAMESPACE, "pod": TRAINING_POD, "job_name": "llama-70b", "node": "gpu-node-01"}
    got = cluster.receiver.wait_alert("CclNcclTcpFallback", "firing", timeout=60, match=want)
    assert got is not None, cluster.prometheus.alerts()
    notification, alert = got
    assert alert["labels"]["severity"] == "critical" and alert["labels"]["job_kind"] == "PyTorchJob"
    # 1 s scrape, evaluation (the rule's own 15 s group, compressed) and group_wait; for: 0s.
    assert notification.received_at - written < 10, "paged within a few intervals of the log line"
    assert [a["labels"]["node"] for a in _alerts_named(cluster, "CclNcclTcpFallback")] == ["gpu-node-01"]

    node.act("nccl-job-stop", namespace=TRAINING_NAMESPACE, pod=TRAINING_POD)
    assert cluster.receiver.wait_alert("CclNcclTcpFallback", "resolved", timeout=60, match=want)


def probe_history(node: str, peak: float, minutes: int, now: float) -> str:
    """The node's hourly probe peaks (compressed: one a minute) for ``minutes``, and the daily
    medians the daily group recorded from them (compressed: one every 24 minutes; the compressed
    rules' baseline reads 7 days -> 168 minutes of those)."""
    labels = f'{{node="{node}",collective="all_reduce",scope="inter_node",source="job"}}'
    hourly, daily = (
        "node:ccl_probe_bus_bandwidth_bytes_per_second:max1h",
        "node:ccl_probe_bus_bandwidth_bytes_per_second:median1d",
    )
    lines = [f"# TYPE {hourly} gauge"]
    lines += [f"{hourly}{labels} {peak:.6e} {int(now) - 60 * i}" for i in range(minutes, 1, -1)]
    lines += [f"# TYPE {daily} gauge"]
    lines += [f"{daily}{labels} {peak:.6e} {int(now) - 60 * i}" for i in range(minutes - 24, 1, -24)]
    return "\n".join(lines) + "\n# EOF\n"


def test_probe_below_its_baseline_fires_for_that_node(start_cluster) -> None:  # type: ignore[no-untyped-def]
    """Three hours of probe history at ~350 GB/s (backfilled: the real rule wants a 7-day median),
    then a probe Job result peaking at 150 GB/s: 43 % of the baseline, under the 80 % threshold,
    above the 20 GB/s floor."""
    cluster = start_cluster(
        nodes=2, intervals=Intervals(), backfill=probe_history("gpu-node-01", 350e9, 180, time.time())
    )
    prometheus = cluster.prometheus
    baseline = prometheus.wait_until(
        lambda: prometheus.values(
            'node:ccl_probe_bus_bandwidth_bytes_per_second:median7d{node="gpu-node-01",source="job"}'
        ),
        timeout=90,
        what="the probe baseline (an hourly group: up to a compressed hour)",
    )
    assert baseline[0] > 300e9
    cluster.node("gpu-node-01").act("probe-result", busbw_gbps=150)
    want = {"node": "gpu-node-01", "collective": "all_reduce", "scope": "inter_node", "source": "job"}
    got = cluster.receiver.wait_alert("CclProbeBusBandwidthBelowBaseline", "firing", timeout=60, match=want)
    assert got is not None, prometheus.alerts()
    _, alert = got
    assert alert["labels"]["severity"] == "warning"
    assert not _alerts_named(cluster, "CclProbeBusBandwidthBelowFloor"), "150 GB/s is above the floor"
    assert [a["labels"]["node"] for a in _alerts_named(cluster, "CclProbeBusBandwidthBelowBaseline")] == ["gpu-node-01"]


def test_tcp_fallback_the_log_cannot_place_pages_from_the_jobs_nodes(start_cluster) -> None:  # type: ignore[no-untyped-def]
    """The pod's container restarts on NCCL 2.18 over Socket, and its log leaves the placement open
    (no nNodes line; a communicator of 8 ranks, only this node's 4 in the log, on a node with 8 GPUs
    that the pod holds): the exporter says "cannot tell", and the job's GPU pods on two RDMA nodes
    decide it in the rules."""
    cluster = start_cluster(nodes=2, intervals=Intervals())
    node = cluster.node("gpu-node-01")
    node.act("nccl-job-restart", namespace=TRAINING_NAMESPACE, pod=TRAINING_POD, network="Socket", placement="open")
    want = {
        "namespace": TRAINING_NAMESPACE,
        "pod": TRAINING_POD,
        "job_name": "llama-70b",
        "node": "gpu-node-01",
        "evidence": "placement",
    }
    got = cluster.receiver.wait_alert("CclNcclTcpFallback", "firing", timeout=60, match=want)
    assert got is not None, cluster.prometheus.alerts()
    _, alert = got
    assert alert["labels"]["severity"] == "critical"
    assert "Evidence: placement" in " ".join(alert["annotations"]["description"].split())
    selector = f'node="gpu-node-01",namespace="{TRAINING_NAMESPACE}",pod="{TRAINING_POD}"'
    assert cluster.prometheus.values(f'ccl_nccl_verdict{{{selector},verdict="unknown"}}') == [1.0]
    assert cluster.prometheus.values(f"ccl_nccl_tcp_fallback{{{selector}}}") == [0.0], "the log alone cannot tell"
    assert [a["labels"]["node"] for a in _alerts_named(cluster, "CclNcclTcpFallback")] == ["gpu-node-01"]


def test_crossed_rails_raise_the_affinity_warning_for_that_pod_only(start_cluster) -> None:  # type: ignore[no-untyped-def]
    """A pod whose GPUs send through the other socket's NICs (the simulator's crossed rails) on one node
    of a healthy two-node fleet: CclNcclNicAffinityCrossed fires for its GPUs, naming the NIC beside
    each; the training pod bound rail by rail (every GPU on its PIX NIC) stays silent."""
    cluster = start_cluster(nodes=2, intervals=Intervals())
    node = cluster.node("gpu-node-01")
    node.act(
        "nccl-job-start", namespace="nlp", pod="gpt-neox-worker-0", job_name="gpt-neox", network="IB", rails="crossed"
    )
    want = {"namespace": "nlp", "pod": "gpt-neox-worker-0", "job_name": "gpt-neox", "node": "gpu-node-01"}
    got = cluster.receiver.wait_alert("CclNcclNicAffinityCrossed", "firing", timeout=90, match=want)
    assert got is not None, cluster.prometheus.alerts()
    _, alert = got
    labels = alert["labels"]
    assert labels["severity"] == "warning" and labels["affinity"] == "SYS" and labels["gdr"] == "true"
    nearest = f"mlx5_{labels['gpu']} (PIX)"
    assert nearest in alert["annotations"]["description"], alert["annotations"]["description"]
    assert labels["device"] != f"mlx5_{labels['gpu']}"
    firing = _alerts_named(cluster, "CclNcclNicAffinityCrossed")
    assert {(a["labels"]["node"], a["labels"]["pod"]) for a in firing} == {("gpu-node-01", "gpt-neox-worker-0")}
    bound = cluster.prometheus.values(f'ccl_nccl_nic_affinity{{pod="{TRAINING_POD}",affinity="PIX"}}')
    assert len(bound) == 4, "the bound pod's GPUs 0 and 7 on their PIX NICs, on both nodes (not vacuously quiet)"

"""Our shipped alert rules, end to end: real exporter processes on simulated nodes, a real
Prometheus evaluating ``alerts/ccl-health-rules.yaml`` (every duration divided by 60, see
``compress_time``; expressions, labels and thresholds unchanged), a real Alertmanager
delivering to a webhook receiver in the test.

Not real here: the GPUs, NICs and pods (the simulated node writes the files the exporter
reads), and kube-state-metrics (a static stand-in serves ``kube_node_status_capacity``).
"""

from __future__ import annotations

from exporter.sim.stack import Intervals


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
        a["labels"].get("node") == "gpu-node-01" for a in cluster.prometheus.alerts()
        if a["labels"]["alertname"] == "CclExporterAbsent"
    ), "the node whose exporter runs is not reported absent"

"""The harness itself: exporter -> Prometheus -> Alertmanager -> webhook, with a rule of the test's own.

This proves the plumbing (target labels, honor_labels, delivery, resolution, clean shutdown)
independently of our shipped rules, which ``test_alerts.py`` exercises.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from devtools.stack import SCRAPE_JOB, Intervals

PORT_DOWN_RULE = """
groups:
  - name: harness
    interval: 1s
    rules:
      - alert: HarnessPortDown
        expr: ccl_rdma_port_state_id != 4
        for: 2s
        labels: {severity: warning}
        annotations: {summary: "{{ $labels.device }} down on {{ $labels.node }}"}
"""


def test_alert_reaches_receiver_with_target_labels_and_resolves(start_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    rules = tmp_path / "harness-rules.yaml"
    rules.write_text(PORT_DOWN_RULE)
    cluster = start_cluster(nodes=2, intervals=Intervals(), rule_files=[rules])
    node = cluster.node("gpu-node-02")
    assert cluster.prometheus.firing_alertnames() == set()

    changed = node.act("rdma-port-down", device="mlx5_5")["at"]
    firing = cluster.prometheus.wait_alert("HarnessPortDown", "firing", timeout=30, match={"node": "gpu-node-02"})
    got = cluster.receiver.wait_alert("HarnessPortDown", "firing", timeout=30, match={"node": "gpu-node-02"})
    assert got is not None, cluster.alertmanager.log_tail()
    notification, alert = got
    assert alert["labels"]["device"] == "mlx5_5"
    assert alert["labels"]["job"] == SCRAPE_JOB
    assert alert["annotations"]["summary"] == "mlx5_5 down on gpu-node-02"
    assert notification.received_at - changed < 20
    assert [a["labels"]["node"] for a in cluster.prometheus.alerts()] == ["gpu-node-02"], "the healthy node stays quiet"
    assert firing["labels"]["device"] == "mlx5_5"

    node.act("rdma-port-up", device="mlx5_5")
    assert cluster.receiver.wait_alert("HarnessPortDown", "resolved", timeout=30, match={"device": "mlx5_5"})


def test_stopping_the_cluster_waits_for_every_process(tmp_path: Path) -> None:
    from tests.e2e.harness import cluster

    with cluster(tmp_path, nodes=1, intervals=Intervals(), rule_files=[]) as running:
        pids = [p.pid for p in running.stack.processes()] + [e.pid for e in running.exporters]
        assert all(pids)
    time.sleep(0.1)
    for pid in pids:
        assert pid is not None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        # a zombie not yet reaped would still be signalable; Popen.wait() reaps, so this is a live process
        raise AssertionError(f"process {pid} still running after the cluster stopped")


def test_history_backfilled_before_start_is_queryable(tmp_path: Path) -> None:
    """Alerts with multi-day look-backs (probe baselines) need history a test cannot wait for."""
    from devtools.stack import Stack
    from tests.e2e.harness import require_stack

    prometheus_binary, _ = require_stack()
    now = int(time.time())
    lines = ["# TYPE history_probe gauge"]
    lines += [f'history_probe{{node="gpu-node-01"}} {100 + i} {now - 3 * 3600 + 60 * i}' for i in range(170)]
    stack = Stack(
        tmp_path,
        [],
        rule_files=[],
        alerting=False,
        prometheus_binary=prometheus_binary,
        backfill="\n".join(lines) + "\n# EOF\n",
    )
    with stack:
        assert stack.prometheus is not None
        assert stack.prometheus.values('count_over_time(history_probe{node="gpu-node-01"}[4h])') == [170.0]
        assert stack.prometheus.values("max_over_time(history_probe[4h])") == [269.0]

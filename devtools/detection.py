"""One measured detection: a healthy training pod on a simulated node restarts and its NCCL comes
back on ``Socket``; how long until ``CclNcclTcpFallback`` reaches the webhook receiver, hop by hop,
and until a reference rule without ``for:`` does (the floor the pipeline itself sets).

Real processes end to end: two simulated nodes (``python -m ccl_sim serve``), Prometheus with the
shipped rules, Alertmanager, a webhook receiver. Shared by ``bench/detection_latency.py`` (which
reports it) and ``tests/e2e/test_detection.py`` (which holds the headline promise to it).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from ccl_sim.nvml import TRAINING_NAMESPACE, TRAINING_POD
from devtools.stack import (
    ALERTMANAGER_NAMES,
    PROMETHEUS_NAMES,
    Intervals,
    ScrapeTarget,
    Stack,
    StaticMetricsServer,
    find_binary,
    find_rule_files,
    gpu_node_capacity_metrics,
    make_healthy,
    start_exporters,
    stop_all,
)
from devtools.timeline import Timeline, exporter_has, follow, tcp_fallback_watch

REFERENCE_ALERT = "ReferenceTcpFallbackNoHold"
REFERENCE_RULES = {
    "groups": [
        {
            "name": "detection-latency-reference",
            "rules": [
                {
                    "alert": REFERENCE_ALERT,
                    "expr": "max by (namespace, pod, job_name, job_kind, node) (ccl_nccl_tcp_fallback == 1)",
                }
            ],
        }
    ]
}


@dataclass
class Run:
    ours: Timeline
    reference_notified: float | None
    hold_seconds: float
    labels_ok: bool
    alert_group_interval_seconds: float


def measure_once(intervals: Intervals, workdir: Path, timeout: float = 400.0) -> Run:
    for names in (PROMETHEUS_NAMES, ALERTMANAGER_NAMES):
        if find_binary(names) is None:
            raise FileNotFoundError(f"{names[0]} is not installed (apt-get install prometheus prometheus-alertmanager)")
    rules = find_rule_files()
    if not rules:
        raise FileNotFoundError("alerts/ccl-health-rules.yaml not found (run from a source checkout)")
    reference = workdir / "reference-rules.yml"
    workdir.mkdir(parents=True, exist_ok=True)
    reference.write_text(json.dumps(REFERENCE_RULES))
    exporters = start_exporters(2, extra_args=["--collector.nccl.grace-period=30"])
    kube_state_metrics = StaticMetricsServer(gpu_node_capacity_metrics(e.node for e in exporters))
    try:
        make_healthy(exporters)
        stack = Stack(
            workdir,
            [e.target for e in exporters],
            rule_files=[*rules, reference],
            intervals=intervals,
            other_jobs={"kube-state-metrics": [ScrapeTarget(kube_state_metrics.address)]},
        )
        with stack:
            assert stack.prometheus is not None and stack.receiver is not None
            stack.prometheus.wait_targets_up(2, timeout=120)
            time.sleep(intervals.scrape_seconds)  # at least one healthy scrape first
            node = exporters[0]
            watch = tcp_fallback_watch(TRAINING_NAMESPACE, TRAINING_POD, node.node)
            if exporter_has(node, watch):
                raise RuntimeError("the pod already reports a TCP fallback before the restart: nothing to time")
            written = node.act("nccl-job-restart", namespace=TRAINING_NAMESPACE, pod=TRAINING_POD, network="Socket")[
                "at"
            ]
            ours = follow(written, watch, node, stack.prometheus, stack.receiver, timeout)
            # The reference rule sits in a group at the global evaluation interval: give it time.
            got = stack.receiver.wait_alert(
                REFERENCE_ALERT,
                "firing",
                match=watch.alert_labels,
                timeout=intervals.scrape_seconds + intervals.evaluation_seconds + intervals.group_wait_seconds + 30,
            )
            found = next(
                (
                    (g, r)
                    for g in stack.prometheus.rule_groups()
                    for r in g["rules"]
                    if r.get("name") == watch.alertname
                ),
                None,
            )
            if found is None:
                raise RuntimeError(f"Prometheus has no rule {watch.alertname}: is {rules} the shipped rules file?")
            group, rule = found
            hold = float(rule.get("duration", 0))
            group_interval = float(group.get("interval", intervals.evaluation_seconds))
            want = {"namespace": TRAINING_NAMESPACE, "pod": TRAINING_POD, "job_name": "llama-70b", "node": node.node}
            labels_ok = all(ours.notification_labels.get(k) == v for k, v in want.items())
            return Run(ours, got[0].received_at if got else None, hold, labels_ok, group_interval)
    finally:
        stop_all(exporters)
        kube_state_metrics.stop()

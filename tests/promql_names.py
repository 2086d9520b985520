"""Which metric names PromQL expressions use, and which names the project knows.

Known names come from one place: the metric reference, ``docs/metrics.md`` (every backticked
``ccl_*`` name there), plus the recording rules defined in ``alerts/ccl-health-rules.yaml``,
plus the few outside metrics listed in ``EXTERNAL_METRICS``.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
RULES_FILE = REPO / "alerts" / "ccl-health-rules.yaml"
METRICS_DOC = REPO / "docs" / "metrics.md"

# Metrics from outside the exporter that rules may use, each for one reason:
EXTERNAL_METRICS = {
    "up": "Prometheus' own scrape health, for CclExporterAbsent",
    "kube_node_status_capacity": "kube-state-metrics: which nodes have GPUs, for CclExporterAbsent",
    "container_network_transmit_bytes_total": "kubelet's cAdvisor: a pod's network bytes, for CclSuspectedTcpFallback",
    "container_network_receive_bytes_total": "kubelet's cAdvisor: a pod's network bytes, for CclSuspectedTcpFallback",
    # node_exporter's InfiniBand collector, where our RDMA collector is off (docs/coexistence.md).
    "node_infiniband_info": "node_exporter: the node has RDMA devices, for CclNcclTcpFallback",
    "node_infiniband_state_id": "node_exporter: port states, for the RDMA port counts",
    "node_infiniband_port_data_transmitted_bytes_total": "node_exporter: port bytes, for node RDMA throughput",
    "node_infiniband_port_data_received_bytes_total": "node_exporter: port bytes, for node RDMA throughput",
}

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_CCL_NAME = re.compile(r"(?<![\w:$])(ccl_[a-z0-9_]+)(?![\w:])")
_RECORDED_NAME = re.compile(r"(?<![\w:$])([a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z0-9_:]+)")
_SELECTOR = re.compile(r"(?<![\w:$])([a-zA-Z_][a-zA-Z0-9_:]*)\s*\{")


def _without_strings(expr: str) -> str:
    return _STRING.sub('""', expr)


def referenced_names(expr: str) -> set[str]:
    """Metric and recording-rule names an expression reads (label values are ignored)."""
    text = _without_strings(expr)
    names = set(_CCL_NAME.findall(text)) | set(_RECORDED_NAME.findall(text))
    names |= {name for name in _SELECTOR.findall(text) if name not in ("by", "without", "on", "ignoring")}
    return names


def documented_metric_names() -> set[str]:
    return set(re.findall(r"`(ccl_[a-z0-9_]+)`", METRICS_DOC.read_text()))


def rules() -> list[dict]:  # type: ignore[type-arg]
    doc = yaml.safe_load(RULES_FILE.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def recording_rule_names() -> set[str]:
    return {rule["record"] for rule in rules() if "record" in rule}


def unknown_names(expr: str) -> set[str]:
    known = documented_metric_names() | recording_rule_names() | set(EXTERNAL_METRICS)
    return referenced_names(expr) - known

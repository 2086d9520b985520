"""End-to-end harness: real simulated exporters scraped by a real Prometheus loading our rules,
alerts delivered by a real Alertmanager to a webhook receiver in the test process.

The processes and configs come from ``devtools.stack`` (the same code ``make demo`` and
``bench/fleet.py`` run); this module adds what only tests need: tool checks that skip
locally and fail in CI, and a ``Cluster`` that owns every process it starts.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from devtools.stack import (
    Alertmanager,
    Intervals,
    Prometheus,
    ScrapeTarget,
    SimulatedExporter,
    Stack,
    StaticMetricsServer,
    WebhookReceiver,
    duration_seconds,
    find_rule_files,
    gpu_node_capacity_metrics,
    make_healthy,
    pod_monitor_metric_relabelings,
    start_exporters,
    stop_all,
)
from tests.conftest import REPO, require_tool

RULES = REPO / "alerts" / "ccl-health-rules.yaml"
# Series of a pod whose logs are gone stay 300 s by default; tests want resolution in seconds.
EXPORTER_ARGS = ("--collector.nccl.grace-period=2",)
# Series other than the NCCL Inspector's counters that carry a node partition: there must be none.
PARTITIONED_OTHERS = 'count({ccl_rule_partition!="", __name__!~"ccl_nccl_collective_.+_total"})'


def rule_partitions() -> set[str]:
    """The values the PodMonitor's hashmod relabeling gives ``ccl_rule_partition``."""
    (hashmod,) = [step for step in pod_monitor_metric_relabelings() if step["action"] == "hashmod"]
    return {str(partition) for partition in range(hashmod["modulus"])}


_DURATION = r"(?:\d+(?:ms|[smhdwy]))+"


def _format(seconds: float) -> str:
    """Milliseconds, at least 1 ms, except that zero stays zero (``for: 0s`` fires on first sight)."""
    return "0s" if seconds == 0 else f"{max(1, round(seconds * 1000))}ms"


def compress_time(rules_text: str, factor: float, shortest_interval: float = 1.0) -> str:
    """Our rule file with every duration divided by ``factor``: ``for:`` clauses, range windows
    ``[5m]``, subqueries ``[7d:10m]``, ``offset``s and the ``interval:`` of rule groups that set their own
    (never shorter than ``shortest_interval``, the test Prometheus's evaluation interval). With
    factor 60 an alert that needs 15 minutes in production needs 15 seconds here, while every
    expression, label and threshold stays the shipped one. Used with 1 s scrape and evaluation
    intervals."""

    def window(match: re.Match[str]) -> str:
        range_part, colon, step = match.group(1), match.group(2), match.group(3)
        out = _format(duration_seconds(range_part) / factor)
        if colon:
            out += ":" + (_format(duration_seconds(step) / factor) if step else "")
        return f"[{out}]"

    def clause(match: re.Match[str]) -> str:
        seconds = duration_seconds(match.group(3)) / factor
        if match.group(2) == "interval":
            seconds = max(shortest_interval, seconds)
        return match.group(1) + _format(seconds)

    text = re.sub(rf"\[({_DURATION})(:({_DURATION})?)?\]", window, rules_text)
    text = re.sub(
        rf"\boffset ({_DURATION})\b", lambda m: "offset " + _format(duration_seconds(m.group(1)) / factor), text
    )
    return re.sub(rf"(?m)^(\s+(for|interval):\s*)({_DURATION})\s*$", clause, text)


def compressed_rules(workdir: Path, factor: float = 60.0, shortest_interval: float = 1.0) -> list[Path]:
    """Both shipped rule files, time-compressed: [node-level rules, global rules]."""
    rules = find_rule_files(REPO)
    assert rules, f"{RULES} is missing"
    workdir.mkdir(parents=True, exist_ok=True)
    out = []
    for path in rules:
        compressed = workdir / f"{path.stem}-compressed-x{factor:g}.yaml"
        compressed.write_text(compress_time(path.read_text(), factor, shortest_interval))
        out.append(compressed)
    return out


def require_stack() -> tuple[str, str]:
    return require_tool("prometheus"), require_tool("prometheus-alertmanager")


@dataclass
class Cluster:
    """N simulated nodes + the monitoring stack; stopped (all PIDs waited for) on exit."""

    exporters: list[SimulatedExporter]
    stack: Stack
    kube_state_metrics: StaticMetricsServer | None = None
    started_at: float = field(default_factory=time.time)

    @property
    def prometheus(self) -> Prometheus:
        assert self.stack.prometheus is not None
        return self.stack.prometheus

    @property
    def alertmanager(self) -> Alertmanager:
        assert self.stack.alertmanager is not None
        return self.stack.alertmanager

    @property
    def receiver(self) -> WebhookReceiver:
        assert self.stack.receiver is not None
        return self.stack.receiver

    def node(self, name: str) -> SimulatedExporter:
        return next(e for e in self.exporters if e.node == name)


@contextmanager
def cluster(
    workdir: Path,
    nodes: int = 2,
    intervals: Intervals | None = None,
    rule_files: Sequence[Path] | None = None,
    exporter_args: Sequence[str] = EXPORTER_ARGS,
    before_scrape: Callable[[list[SimulatedExporter]], None] | None = make_healthy,
    backfill: str = "",
) -> Iterator[Cluster]:
    """``rule_files`` None: our shipped rules, time-compressed 60x (``compress_time``).
    ``before_scrape`` runs on the started exporters before Prometheus starts (sets the scene;
    by default removes the simulator's built-in TCP-fallback pod so the fleet starts healthy).
    ``backfill``: OpenMetrics history written into the TSDB first (see ``Prometheus.backfill``)."""
    prometheus_binary, alertmanager_binary = require_stack()
    intervals = intervals or Intervals()
    if rule_files is None:
        rule_files = compressed_rules(workdir, shortest_interval=intervals.evaluation_seconds)
    exporters = start_exporters(nodes, extra_args=exporter_args)
    kube_state_metrics = None
    try:
        if before_scrape is not None:
            before_scrape(exporters)
        # kube-state-metrics is not run here: a static stand-in serves the GPU capacity of each node.
        kube_state_metrics = StaticMetricsServer(gpu_node_capacity_metrics(e.node for e in exporters))
        stack = Stack(
            workdir,
            [e.target for e in exporters],
            rule_files=rule_files,
            intervals=intervals,
            other_jobs={"kube-state-metrics": [ScrapeTarget(kube_state_metrics.address)]},
            prometheus_binary=prometheus_binary,
            alertmanager_binary=alertmanager_binary,
            backfill=backfill,
        )
        with stack:
            result = Cluster(exporters, stack, kube_state_metrics=kube_state_metrics)
            result.prometheus.wait_targets_up(nodes, timeout=60.0)
            yield result
    finally:
        stop_all(exporters)
        if kube_state_metrics is not None:
            kube_state_metrics.stop()

"""End-to-end harness: real simulated exporters scraped by a real Prometheus loading our rules,
alerts delivered by a real Alertmanager to a webhook receiver in the test process.

The processes and configs come from ``exporter.sim.stack`` (the same code ``make demo`` and
``bench/fleet.py`` run); this module adds what only tests need: tool checks that skip
locally and fail in CI, and a ``Cluster`` that owns every process it starts.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from exporter.sim.stack import (
    Alertmanager,
    Intervals,
    Prometheus,
    SimulatedExporter,
    Stack,
    WebhookReceiver,
    find_rules_file,
    start_exporters,
    stop_all,
)
from tests.conftest import REPO, require_tool

RULES = REPO / "alerts" / "ccl-health-rules.yaml"


def require_stack() -> tuple[str, str]:
    return require_tool("prometheus"), require_tool("prometheus-alertmanager")


@dataclass
class Cluster:
    """N simulated nodes + the monitoring stack; stopped (all PIDs waited for) on exit."""

    exporters: list[SimulatedExporter]
    stack: Stack
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
    exporter_args: Sequence[str] = (),
) -> Iterator[Cluster]:
    prometheus_binary, alertmanager_binary = require_stack()
    if rule_files is None:
        rules = find_rules_file(REPO)
        assert rules is not None, f"{RULES} is missing"
        rule_files = [rules]
    exporters = start_exporters(nodes, extra_args=exporter_args)
    try:
        stack = Stack(
            workdir, [e.target for e in exporters], rule_files=rule_files, intervals=intervals or Intervals(),
            prometheus_binary=prometheus_binary, alertmanager_binary=alertmanager_binary,
        )
        with stack:
            result = Cluster(exporters, stack)
            result.prometheus.wait_targets_up(nodes, timeout=60.0)
            yield result
    finally:
        stop_all(exporters)

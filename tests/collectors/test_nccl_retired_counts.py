"""Counters of streams the collector no longer holds keep their series: a pod whose analyzer hit
the parser's caps leaves the node, and ``ccl_nccl_dropped_total{reason="parser_..."}`` neither
goes down (a counter reset to Prometheus) nor reappears under another reason."""

from __future__ import annotations

from pathlib import Path

from devtools.hostile_lines import communicator_flood
from exporter.collectors.nccl import EXPORTER_PARSER_LIMITS, NcclCollector, NcclSettings
from exporter.sources.podlogs import PodLogTailer
from tests.clocks import ManualClock
from tests.collectors.test_nccl_collector import START, samples
from tests.collectors.test_nccl_verdicts import NS, write_pod_log

GRACE = 60.0


def dropped_by_reason(collector: NcclCollector) -> dict[str, float]:
    """Every reason but the tailer's (``tail_*``)."""
    reasons = {
        dict(labels)["reason"]: count
        for (name, labels), count in samples(collector).items()
        if name == "ccl_nccl_dropped_total"
    }
    return {reason: count for reason, count in reasons.items() if not reason.startswith("tail_")}


def test_parser_overflow_of_a_pod_that_left_keeps_its_reason(tmp_path: Path) -> None:
    pods = tmp_path / "pods"
    flood = EXPORTER_PARSER_LIMITS.max_communicators + 8
    write_pod_log(pods, "overflowing-0", list(communicator_flood("overflowing-0", flood, 2)))
    clock = ManualClock(START)
    tailer = PodLogTailer(pods, tmp_path / "nccl", tmp_path / "state")
    collector = NcclCollector(tailer, tmp_path / "sys", clock=clock, settings=NcclSettings(grace_seconds=GRACE))
    collector.step()
    held = dropped_by_reason(collector)
    assert held.get("parser_communicators", 0) >= 1, held

    for log in pods.rglob("*.log"):
        log.unlink()
    for _ in range(3):  # files gone; then the stream past the grace period; then its pod
        clock.now += GRACE + 1
        collector.step()
    assert not collector.streams.holds_pod(NS, "overflowing-0")
    assert dropped_by_reason(collector) == held

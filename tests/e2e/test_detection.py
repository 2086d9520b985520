"""The headline promise with the shipped settings: CclNcclTcpFallback reaches the receiver,
with namespace, pod, job_name and node, in under 60 s of NCCL's fallback lines.

Shipped settings are ``Intervals.shipped()`` (the PodMonitor's scrape interval, the Prometheus
Operator's default evaluation interval, Alertmanager's default group_wait) and the rule's own
``for:``. When those alone already add up to 60 s or more, the promise cannot hold whatever
the exporter does; the test then says so (xfail, with the numbers) instead of spending minutes
proving arithmetic. ``python -m bench.detection_latency`` measures the full chain either way.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from devtools.detection import measure_once
from devtools.stack import Intervals, duration_seconds, find_rule_files
from tests.conftest import REPO
from tests.e2e.harness import require_stack

PROMISE_SECONDS = 60.0


def shipped_hold_seconds() -> float:
    rules = find_rule_files(REPO)
    assert rules
    for group in (group for path in rules for group in yaml.safe_load(path.read_text())["groups"]):
        for rule in group["rules"]:
            if rule.get("alert") == "CclNcclTcpFallback":
                return duration_seconds(str(rule.get("for", "0s")))
    raise AssertionError("CclNcclTcpFallback is not in the shipped rules")


def test_tcp_fallback_reaches_the_receiver_within_60s_with_shipped_intervals(tmp_path: Path) -> None:
    require_stack()
    intervals = Intervals.shipped(REPO)
    hold = shipped_hold_seconds()
    floor = hold + intervals.group_wait_seconds
    if floor >= PROMISE_SECONDS:
        pytest.xfail(
            f"unreachable as shipped: CclNcclTcpFallback for: {hold:g} s + Alertmanager group_wait "
            f"{intervals.group_wait_seconds:g} s = {floor:g} s before any scrape ({intervals.scrape_seconds:g} s) or "
            f"evaluation ({intervals.evaluation_seconds:g} s) delay; see python -m bench.detection_latency"
        )
    run = measure_once(intervals, tmp_path, timeout=PROMISE_SECONDS + 60)
    assert run.labels_ok, run.ours.notification_labels
    assert run.ours.notified_at is not None, run.ours.render()
    assert run.ours.notified_at - run.ours.written_at < PROMISE_SECONDS, run.ours.render()

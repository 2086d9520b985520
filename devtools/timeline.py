"""Follow one change on a simulated node through the whole chain and time each hop.

change written (e.g. NCCL's init lines land in the pod log) → the exporter's /metrics shows
the metric → Prometheus has the alert pending (its ``activeAt``) → firing → Alertmanager's
notification reaches the webhook receiver. ``make demo`` prints this timeline; the e2e tests
assert on it; ``bench/detection_latency.py`` reports it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from devtools.stack import Prometheus, SimulatedExporter, WebhookReceiver, alert_matches


@dataclass(frozen=True)
class Watch:
    """What to look for: a sample on the exporter, and the alert it should raise."""

    metric: str
    metric_labels: Mapping[str, str]
    metric_value: float
    alertname: str
    alert_labels: Mapping[str, str]  # labels the alert (and notification) must carry


def tcp_fallback_watch(namespace: str, pod: str, node: str) -> Watch:
    """The headline chain: a pod's NCCL falls back to TCP → ``ccl_nccl_tcp_fallback`` 1 → CclNcclTcpFallback."""
    return Watch(
        metric="ccl_nccl_tcp_fallback",
        metric_labels={"namespace": namespace, "pod": pod},
        metric_value=1.0,
        alertname="CclNcclTcpFallback",
        alert_labels={"namespace": namespace, "pod": pod, "node": node},
    )


@dataclass
class Timeline:
    written_at: float
    metric_at: float | None = None
    pending_at: float | None = None  # the alert's activeAt: the evaluation that first matched
    firing_at: float | None = None  # first poll that saw it firing
    notified_at: float | None = None
    notification_labels: dict[str, str] = field(default_factory=dict)

    def seconds(self, at: float | None) -> float | None:
        return None if at is None else at - self.written_at

    @property
    def complete(self) -> bool:
        return None not in (self.metric_at, self.pending_at, self.firing_at, self.notified_at)

    def rows(self, written: str = "change written") -> list[tuple[str, float | None]]:
        return [
            (written, 0.0),
            ("metric set on the exporter's /metrics", self.seconds(self.metric_at)),
            ("alert pending in Prometheus (activeAt)", self.seconds(self.pending_at)),
            ("alert firing in Prometheus", self.seconds(self.firing_at)),
            ("notification received by the webhook", self.seconds(self.notified_at)),
        ]

    def render(self, written: str = "change written", show_labels: tuple[str, ...] = ()) -> str:
        lines = []
        for event, offset in self.rows(written):
            lines.append(f"  {'not seen' if offset is None else f'+{offset:6.1f} s':>10}  {event}")
        if self.notification_labels:
            shown = {k: v for k, v in self.notification_labels.items() if not show_labels or k in show_labels}
            lines.append("              with " + ", ".join(f"{k}={v}" for k, v in sorted(shown.items())))
        return "\n".join(lines)


_RFC3339 = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$")


def parse_timestamp(text: str) -> float:
    """Prometheus' RFC 3339 times (up to nanoseconds, ``Z`` or an offset) as seconds since the epoch."""
    match = _RFC3339.match(text.strip())
    if match is None:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    whole, fraction, zone = match.groups()
    zone = "+00:00" if zone == "Z" else zone
    return datetime.fromisoformat(whole + zone).timestamp() + float("0." + (fraction or "0"))


def exporter_has(exporter: SimulatedExporter, watch: Watch) -> bool:
    for family in text_string_to_metric_families(exporter.metrics()):
        for sample in family.samples:
            if (
                sample.name == watch.metric
                and sample.value == watch.metric_value
                and all(sample.labels.get(k) == v for k, v in watch.metric_labels.items())
            ):
                return True
    return False


def follow(
    written_at: float,
    watch: Watch,
    exporter: SimulatedExporter,
    prometheus: Prometheus,
    receiver: WebhookReceiver | None,
    timeout: float,
    poll_seconds: float = 0.2,
    on_event: Any = None,
) -> Timeline:
    """Poll every hop until the notification arrives (or ``timeout``); ``on_event(name, timeline)`` as each is seen."""
    timeline = Timeline(written_at)
    deadline = time.monotonic() + timeout

    def seen(name: str) -> None:
        if on_event is not None:
            on_event(name, timeline)

    while time.monotonic() < deadline:
        now = time.time()
        if timeline.metric_at is None:
            try:
                if exporter_has(exporter, watch):
                    timeline.metric_at = now
                    seen("metric")
            except OSError:
                pass
        if timeline.firing_at is None:
            try:
                alerts = prometheus.alerts()
            except (OSError, RuntimeError):
                alerts = []
            for alert in alerts:
                if not alert_matches(alert.get("labels", {}), watch.alertname, watch.alert_labels):
                    continue
                if timeline.pending_at is None and alert.get("activeAt"):
                    timeline.pending_at = parse_timestamp(alert["activeAt"])
                    seen("pending")
                if alert.get("state") == "firing":
                    timeline.firing_at = now
                    seen("firing")
                break
        if receiver is None:
            if timeline.firing_at is not None:
                break
        elif timeline.notified_at is None:
            got = receiver.wait_for(
                lambda n: any(
                    a.get("status") == "firing"
                    and alert_matches(a.get("labels", {}), watch.alertname, watch.alert_labels)
                    for a in n.alerts
                ),
                timeout=0,
            )
            if got is not None:
                timeline.notified_at = got.received_at
                alert = next(
                    a for a in got.alerts if alert_matches(a.get("labels", {}), watch.alertname, watch.alert_labels)
                )
                timeline.notification_labels = dict(alert.get("labels", {}))
                seen("notified")
                break
        time.sleep(poll_seconds)
    return timeline

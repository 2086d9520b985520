"""Lifecycle hooks (``ccl_lifecycle_*``): the pod condition ``ccl-health.io/fabric-ready``, pod
Events and the node condition ``CclFabricDegraded``, written to the API server as verdicts change.

Off by default (``--collector.lifecycle``); which hooks run is ``--collector.lifecycle.hooks``
(``readiness`` and ``events`` unless told otherwise; ``node-condition`` is its own opt-in). The
work is ``exporter.lifecycle.LifecycleController``, stepped in a worker thread by ``run``;
``collect`` exposes its own counters: writes by kind and result, the feed's dropped views and the
delay from a verdict to its write. Needs the RBAC of ``manifests/overlays/lifecycle``.
"""

from __future__ import annotations

import argparse
import asyncio
import re
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from exporter.collectors.base import CollectorSpec
from exporter.flags import Flag
from exporter.lifecycle.controller import DELAY_BUCKETS, Clocks, LifecycleController, LifecycleSettings
from exporter.lifecycle.writes import LifecycleApi
from exporter.resources import NodeResources

HOOKS = ("readiness", "events", "node-condition")
DEFAULT_HOOKS = "readiness,events"
TICK_SECONDS = 0.25  # the longest a step waits for a new verdict before looking at the files again


class LifecycleCollector:
    """See the module docstring."""

    name = "lifecycle"

    def __init__(self, controller: LifecycleController, tick_seconds: float = TICK_SECONDS) -> None:
        self.controller = controller
        self.tick_seconds = tick_seconds

    async def run(self) -> None:
        while True:
            await asyncio.to_thread(self.controller.step, self.tick_seconds)
            await asyncio.sleep(0)  # let cancellation in between steps

    def collect(self) -> Iterable[Metric]:
        controller = self.controller
        writes = CounterMetricFamily(
            "ccl_lifecycle_api_writes",
            "Writes to the Kubernetes API by kind (pod_condition, pod_event, node_condition) and result "
            "(ok; exists: the Event was already there; error: failed, retried with backoff).",
            labels=["kind", "result"],
        )
        for (kind, result), count in sorted(controller.writes.items()):
            writes.add_metric([kind, result], float(count))
        dropped = CounterMetricFamily(
            "ccl_lifecycle_verdict_updates_dropped",
            "Verdict updates dropped because the writer fell behind (the API was slow or down); the "
            "newest update always stays.",
        )
        dropped.add_metric([], float(controller.feed.dropped))
        delay = HistogramMetricFamily(
            "ccl_lifecycle_write_delay_seconds",
            "Seconds from a verdict change in the NCCL collector to the pod condition or Event written.",
        )
        histogram = controller.delays
        buckets = [(f"{bound:g}", float(count)) for bound, count in zip(DELAY_BUCKETS, histogram.counts, strict=True)]
        delay.add_metric([], buckets + [("+Inf", float(histogram.total))], histogram.sum)
        api = GaugeMetricFamily(
            "ccl_lifecycle_api_access", "1 when the lifecycle hooks have API access (0: not in a cluster, no token)."
        )
        api.add_metric([], 0.0 if controller.status == "no API access" else 1.0)
        return [writes, dropped, delay, api]


@dataclass(frozen=True)
class LifecycleCollectorSettings:
    controller: LifecycleSettings


LIFECYCLE_FLAGS = (
    Flag(
        "--collector.lifecycle.hooks",
        DEFAULT_HOOKS,
        "comma-separated hooks to run: readiness (the ccl-health.io/fabric-ready condition of pods with that "
        "readiness gate), events (Warning Events on pods whose NCCL fell back), node-condition (CclFabricDegraded)",
        dest="lifecycle_hooks",
    ),
    Flag(
        "--collector.lifecycle.readiness-timeout",
        "4m",
        "a pod with the readiness gate whose NCCL transport and pre-flight are still unknown this long after "
        "its start gets ccl-health.io/fabric-ready=True, reason NoVerdictInTime (the gate fails open; a fallback "
        "seen later still turns it False); a duration like 90s, 4m or 1h, or seconds; 0 = wait forever (fail "
        "closed). Keep it below Kueue's waitForPodsReady.timeout",
        dest="lifecycle_readiness_timeout",
    ),
    Flag(
        "--collector.lifecycle.node-interval",
        2.0,
        "seconds between evaluations of the node condition",
        dest="lifecycle_node_interval",
        type=float,
    ),
    Flag(
        "--collector.lifecycle.min-port-rate",
        0.0,
        "node condition: an ACTIVE RDMA port below this rate (Gb/s) is degraded; 0 = only below the rate it had",
        dest="lifecycle_min_port_rate",
        type=float,
    ),
    Flag(
        "--collector.lifecycle.probe-floor",
        0.0,
        "node condition: the latest probe's best bus bandwidth (GB/s) below this is degraded; 0 = only failures",
        dest="lifecycle_probe_floor",
        type=float,
    ),
)


_DURATION = re.compile(r"(?:([0-9]{1,9})h)?(?:([0-9]{1,9})m(?!s))?(?:([0-9]{1,9})s)?(?:([0-9]{1,9})ms)?")
_SECONDS = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,9})?")
MAX_DURATION_SECONDS = 366 * 86400.0


def parse_duration_seconds(text: str) -> float:
    """``90s``, ``4m``, ``1h30m``, ``500ms`` (Prometheus' units up to hours) or plain seconds → seconds."""
    cleaned = text.strip()
    if _SECONDS.fullmatch(cleaned):
        seconds = float(cleaned)
    else:
        match = _DURATION.fullmatch(cleaned)
        if match is None or not any(match.groups()):
            raise ValueError(f"{text!r} is not a duration like 90s, 4m or 1h30m, or a number of seconds")
        hours, minutes, whole, millis = (int(g or 0) for g in match.groups())
        seconds = hours * 3600.0 + minutes * 60.0 + whole + millis / 1000
    if seconds > MAX_DURATION_SECONDS:
        raise ValueError(f"{text!r} is longer than 366 days")
    return seconds


def settings_from_args(args: argparse.Namespace) -> LifecycleCollectorSettings:
    hooks = [h.strip() for h in str(args.lifecycle_hooks).split(",") if h.strip()]
    unknown = sorted(set(hooks) - set(HOOKS))
    if unknown:
        raise SystemExit(
            f"ccl-exporter: --collector.lifecycle.hooks: unknown {', '.join(unknown)} (have {', '.join(HOOKS)})"
        )
    if float(args.lifecycle_node_interval) <= 0:
        raise SystemExit("ccl-exporter: --collector.lifecycle.node-interval must be positive")
    if float(args.lifecycle_min_port_rate) < 0 or float(args.lifecycle_probe_floor) < 0:
        raise SystemExit("ccl-exporter: --collector.lifecycle.min-port-rate and probe-floor must not be negative")
    try:
        readiness_timeout = parse_duration_seconds(str(args.lifecycle_readiness_timeout))
    except ValueError as exc:
        raise SystemExit(f"ccl-exporter: --collector.lifecycle.readiness-timeout: {exc}") from exc
    return LifecycleCollectorSettings(
        LifecycleSettings(
            readiness="readiness" in hooks,
            events="events" in hooks,
            node_condition="node-condition" in hooks,
            node_interval_seconds=float(args.lifecycle_node_interval),
            min_port_rate_gbps=float(args.lifecycle_min_port_rate),
            probe_floor_gbs=float(args.lifecycle_probe_floor),
            readiness_timeout_seconds=readiness_timeout,
        )
    )


def build(settings: LifecycleCollectorSettings, resources: NodeResources) -> LifecycleCollector:
    controller = LifecycleController(
        settings.controller,
        resources.verdict_feed,
        resources.pod_metadata,
        LifecycleApi(resources.kube_api),
        node_name=resources.node_name,
        sysfs=resources.paths.sysfs,
        probe_results=resources.paths.probe_results,
        clocks=Clocks(wall=resources.clock),
    )
    return LifecycleCollector(controller)


SPEC = CollectorSpec(
    name="lifecycle",
    help="lifecycle hooks: pod readiness condition ccl-health.io/fabric-ready, pod Events, node condition "
    "CclFabricDegraded (writes to the Kubernetes API)",
    default_enabled=False,
    factory=build,
    flags=LIFECYCLE_FLAGS,
    flag_group="lifecycle hooks (collector lifecycle)",
    settings=settings_from_args,
)

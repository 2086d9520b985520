"""``make demo``: a simulated GPU node, and -- when Prometheus and Alertmanager are installed --
the whole alerting chain watching one training job fall back from InfiniBand to TCP.

1. ``python -m ccl_sim serve`` (``ccl-exporter serve`` on a simulated node) on 127.0.0.1:19400
   (8 GPUs, 8 IB + 2 RoCE ports, training pods with NCCL logs). The simulator's built-in
   TCP-fallback pod is removed first, so the node starts without a fallback. The demo prints
   which NIC each training pod's GPUs send through: the training pod rail by rail (``PIX``),
   the simulator's crossed-rail pod on the other socket's NICs (``SYS``).
2. With ``prometheus`` and ``prometheus-alertmanager`` on the PATH (Debian/Ubuntu:
   ``apt-get install prometheus prometheus-alertmanager``): both start on 127.0.0.1 with our
   rules (``alerts/ccl-health-rules.yaml``, unchanged), scraping every 2 s, and a webhook
   receiver in this process records what Alertmanager sends.
3. The training pod ``ml-training/llama-70b-worker-0`` restarts and NCCL comes back on
   ``Socket``: the timeline shows the NCCL lines written, the pod's readiness condition
   ``ccl-health.io/fabric-ready=False`` written by the lifecycle hooks to the simulated API
   (within a second, no Prometheus involved), the metric on /metrics, the alert
   pending and firing in Prometheus (after the rule's ``for:``) and the notification
   received, with namespace, pod, job_name and node.

Without the two binaries it still serves the simulated node and says what it skipped.
Ctrl-C stops everything it started.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from types import FrameType
from typing import Any

from devtools.stack import (
    ALERTMANAGER_NAMES,
    PROMETHEUS_NAMES,
    Intervals,
    ScrapeTarget,
    SimulatedExporter,
    Stack,
    StaticMetricsServer,
    builtin_fallback_pods,
    find_binary,
    find_rule_files,
    gpu_node_capacity_metrics,
    port_if_free,
)
from devtools.timeline import Timeline, follow, tcp_fallback_watch
from exporter.commands.serve import DEFAULT_PORT

NODE = "demo-node"
FALLBACK_NAMESPACE = "ml-training"
FALLBACK_POD = "llama-70b-worker-0"
# Faster than production (15-30 s) so the demo moves; the rules and their for: are the shipped ones.
DEMO_INTERVALS = Intervals(
    scrape_seconds=2.0,
    evaluation_seconds=2.0,
    group_wait_seconds=1.0,
    group_interval_seconds=10.0,
    repeat_interval_seconds=3600.0,
)
# The lifecycle hooks write to the simulated node's API: the fallback pod's readiness condition
# shows up without Prometheus (POST /-/sim/kube-status shows what was written).
DEMO_FLAGS = (
    "--collector.nccl.grace-period=30",
    "--collector.lifecycle",
    "--collector.lifecycle.hooks=readiness,events,node-condition",
)
FABRIC_READY = "ccl-health.io/fabric-ready"
EVENT_TEXT = {
    "metric": "ccl_nccl_tcp_fallback = 1 on the exporter's /metrics",
    "pending": "alert CclNcclTcpFallback pending in Prometheus (the rule matched; its for: starts)",
    "firing": "alert CclNcclTcpFallback firing in Prometheus",
    "notified": "notification received by the webhook receiver",
}


def say(text: str = "") -> None:
    print(text, flush=True)


def _stop_on_sigterm() -> None:
    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def _wait_forever() -> None:
    while True:
        time.sleep(3600)


def missing_parts() -> list[str]:
    missing = []
    if find_binary(PROMETHEUS_NAMES) is None:
        missing.append("prometheus")
    if find_binary(ALERTMANAGER_NAMES) is None:
        missing.append("prometheus-alertmanager")
    return missing


def fabric_ready(exporter: SimulatedExporter, namespace: str, pod: str) -> dict[str, Any] | None:
    """The pod's ``ccl-health.io/fabric-ready`` condition as the lifecycle hooks wrote it (simulated API)."""
    written = exporter.act("kube-status")["pods"].get(f"{namespace}/{pod}", [])
    return next((c for c in written if c.get("type") == FABRIC_READY), None)


def wait_fabric_ready(
    exporter: SimulatedExporter, namespace: str, pod: str, status: str, timeout: float
) -> tuple[float, dict[str, Any]] | None:
    """(wall time first seen, the condition) once it has ``status``; None after ``timeout`` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        condition = fabric_ready(exporter, namespace, pod)
        if condition is not None and condition.get("status") == status:
            return time.time(), condition
        time.sleep(0.1)
    return None


def run_chain(
    exporter: SimulatedExporter, rules: list[Path], workdir: Path, timeout: float, stops: ExitStack
) -> Timeline:
    """Start the stack (its stops registered on ``stops``), make the job fall back, print the timeline."""
    kube_state_metrics = StaticMetricsServer(gpu_node_capacity_metrics([NODE]))
    stops.callback(kube_state_metrics.stop)
    stack = Stack(
        workdir,
        [exporter.target],
        rule_files=rules,
        intervals=DEMO_INTERVALS,
        other_jobs={"kube-state-metrics": [ScrapeTarget(kube_state_metrics.address)]},
        prometheus_port=port_if_free(9090),
        alertmanager_port=port_if_free(9093),
    )
    stops.callback(stack.stop)
    stack.start()
    assert stack.prometheus is not None and stack.alertmanager is not None
    say(f"Prometheus:   {stack.prometheus.url}/alerts  (rules: {', '.join(map(str, rules))})")
    say(f"Alertmanager: {stack.alertmanager.url}/#/alerts")
    say(f"Webhook:      {stack.receiver.url if stack.receiver else ''}")
    say("Waiting for the first scrape (Prometheus takes ~5 s to discover its targets) ...")
    stack.prometheus.wait_targets_up(1, timeout=60)
    time.sleep(2 * DEMO_INTERVALS.scrape_seconds)  # a healthy sample or two first
    say()
    say(f"Restarting {FALLBACK_NAMESPACE}/{FALLBACK_POD}; NCCL comes back on NET/Socket (no IB device found).")
    written = exporter.act("nccl-job-restart", namespace=FALLBACK_NAMESPACE, pod=FALLBACK_POD, network="Socket")["at"]
    say('  +   0.0 s  NCCL init lines written to the pod\'s log ("NET/IB : No device found", "Using network Socket")')

    def on_event(name: str, timeline: Timeline) -> None:
        at = {
            "metric": timeline.metric_at,
            "pending": timeline.pending_at,
            "firing": timeline.firing_at,
            "notified": timeline.notified_at,
        }[name]
        say(f"  +{(at or written) - written:6.1f} s  {EVENT_TEXT[name]}")

    shown = wait_fabric_ready(exporter, FALLBACK_NAMESPACE, FALLBACK_POD, "False", timeout=30)
    if shown is not None:
        at, condition = shown
        say(
            f"  +{at - written:6.1f} s  pod condition {FABRIC_READY}={condition['status']} ({condition['reason']}) "
            "and Event NcclTcpFallback written to the API by the exporter (no Prometheus on this path)"
        )
    watch = tcp_fallback_watch(FALLBACK_NAMESPACE, FALLBACK_POD, NODE)
    timeline = follow(written, watch, exporter, stack.prometheus, stack.receiver, timeout, on_event=on_event)
    hold = next(
        (
            rule.get("duration", 0)
            for group in stack.prometheus.rule_groups()
            for rule in group["rules"]
            if rule.get("name") == watch.alertname
        ),
        0,
    )
    say()
    if timeline.complete:
        labels = timeline.notification_labels
        say(
            "Notification: "
            + ", ".join(
                f"{key}={labels.get(key, '?')}"
                for key in ("alertname", "namespace", "pod", "job_name", "job_kind", "node", "severity")
            )
        )
        say(
            f"Detection: {timeline.seconds(timeline.notified_at):.1f} s from the NCCL lines to the receiver "
            f"(the rule's for: holds it {hold:g} s; scrape and evaluation every {DEMO_INTERVALS.scrape_seconds:g} s "
            "here, 15-30 s in production)."
        )
    else:
        say(f"The chain did not complete within {timeout:.0f} s:")
        say(timeline.render("NCCL lines written"))
        say(stack.prometheus.log_tail())
    return timeline


def show_nic_paths(exporter: SimulatedExporter, timeout: float = 10.0) -> None:
    """Which NIC each pod's GPUs send NCCL traffic through, and its class (ccl_nccl_nic_affinity)."""
    from prometheus_client.parser import text_string_to_metric_families

    deadline = time.monotonic() + timeout
    rows: list[str] = []
    while not rows and time.monotonic() < deadline:
        for family in text_string_to_metric_families(exporter.metrics()):
            if family.name == "ccl_nccl_nic_affinity":
                rows = sorted(
                    f"  {s.labels['namespace']}/{s.labels['pod']}: GPU {s.labels['gpu']} -> {s.labels['device']} "
                    f"({s.labels['affinity'] or 'class unknown'}"
                    + (
                        f"; its nearest NIC is {s.labels['nearest_affinity']})"
                        if s.labels.get("nearest_affinity") not in ("", s.labels["affinity"])
                        else ")"
                    )
                    for s in family.samples
                )
        if not rows:
            time.sleep(0.5)
    if rows:
        say("GPU -> NIC paths of the pods' NCCL traffic (PIX: the NIC beside the GPU; SYS: the other socket's):")
        for row in rows:
            say(row)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="exporter port on 127.0.0.1 (another if taken)")
    parser.add_argument("--no-monitoring", action="store_true", help="only the simulated node, no Prometheus")
    parser.add_argument("--exit-after-timeline", action="store_true", help="stop once the timeline is printed")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for the notification")
    parser.add_argument(
        "--rules",
        type=Path,
        action="append",
        default=None,
        help="alert rules to load, repeatable (default: alerts/ccl-health-rules.yaml and "
        "alerts/ccl-health-global-rules.yaml of the working folder or the source checkout)",
    )
    args = parser.parse_args(argv)
    _stop_on_sigterm()
    exporter = SimulatedExporter(NODE, port=port_if_free(args.port), extra_args=[*DEMO_FLAGS])
    stops = ExitStack()
    try:
        stops.callback(exporter.stop)
        exporter.start()
        say("ccl-health-exporter demo: a simulated GPU node (8 x H200, 8 x NDR InfiniBand, 2 x RoCE, training pods).")
        say(f"Exporter:     {exporter.url}/metrics   (landing page {exporter.url}/)")
        # The simulator ships one pod already on TCP; remove it so the fallback below is the only one.
        for namespace, pod in builtin_fallback_pods():
            exporter.act("nccl-job-stop", namespace=namespace, pod=pod)
        show_nic_paths(exporter)
        missing = [] if not args.no_monitoring else ["--no-monitoring given"]
        missing += missing_parts() if not args.no_monitoring else []
        rules: list[Path] = args.rules or find_rule_files()
        absent = [path for path in rules if not path.is_file()] if rules else [Path("alerts/ccl-health-rules.yaml")]
        if not missing and absent:
            missing.append(f"{', '.join(map(str, absent))} (run from a source checkout, or pass --rules)")
        if missing:
            say(f"Skipped Prometheus, Alertmanager and the alert timeline: {', '.join(missing)} not available.")
            if not args.no_monitoring:
                say(
                    "  To see the whole chain: apt-get install prometheus prometheus-alertmanager, "
                    "then make demo again."
                )
            say(f"  Try: curl -s {exporter.url}/metrics | grep ^ccl_nccl_tcp_fallback")
            say(
                f"       curl -s -X POST "
                f"'{exporter.url}/-/sim/nccl-job-restart?namespace={FALLBACK_NAMESPACE}&pod={FALLBACK_POD}'"
            )
            say(f"       curl -s -X POST {exporter.url}/-/sim/kube-status   (the pods' {FABRIC_READY})")
            if args.exit_after_timeline:
                return 0
            say("Ctrl-C stops it.")
            _wait_forever()
        workdir = Path(stops.enter_context(tempfile.TemporaryDirectory(prefix="ccl-demo-")))
        timeline = run_chain(exporter, rules, workdir, args.timeout, stops)
        if args.exit_after_timeline:
            return 0 if timeline.complete else 1
        say()
        say("Everything keeps running: look around in Prometheus and Alertmanager. Ctrl-C stops it all.")
        _wait_forever()
    except KeyboardInterrupt:
        say("\nStopping ...")
    finally:
        stops.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the lifecycle hooks write, decided from what the exporter knows. Pure: no I/O, no clock.

* ``pod_condition``: the condition ``ccl-health.io/fabric-ready`` of a pod that carries the
  readiness gate: ``False`` with reason ``TcpFallback`` (inter-node NCCL traffic on a TCP-class
  network, and the pod does not declare TCP with ``ccl-health.io/expected-network``),
  ``GdrDisabled`` (inter-node RDMA without GPUDirect RDMA) or ``PreflightFailed``; ``True`` once
  NCCL runs on RDMA (``RdmaTransport``), on one node (``SingleNode``), on the TCP it declares
  (``ExpectedNetwork``), or its pre-flight passed (``PreflightPassed``); None (absent) until known,
  or ``True`` with ``NoVerdictInTime`` once the readiness timeout has passed since the pod's start
  with nothing known (fail open). Its message quotes the deciding log line.
* ``pod_event``: the Warning Event for a pod whose NCCL fell back (``NcclTcpFallback``) or runs
  without GPUDirect RDMA (``NcclGdrDisabled``).
* ``NodeFabricJudge``: the node condition ``CclFabricDegraded`` (``True`` = a problem, the
  node-problem-detector convention) when an RDMA port this node had ACTIVE is down, gone or below
  the rate it had (or below ``min_port_rate``), or the latest probe failed or fell below its floor.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from exporter.fabric_verdicts import PodFabric
from exporter.results.probe_file import ProbeResult
from exporter.sources.rdma import ACTIVE_PORT_STATES, RdmaPort

NODE_CONDITION = "CclFabricDegraded"
MAX_MESSAGE_CHARS = 1024  # what kubectl describe shows in full; Event notes are capped at 1 KiB
MAX_TRACKED_PORTS = 1024
GBIT = 125_000_000  # bytes/s per Gb/s
GB = 1e9

# Pod condition reasons
TCP_FALLBACK = "TcpFallback"
GDR_DISABLED = "GdrDisabled"
PREFLIGHT_FAILED = "PreflightFailed"
RDMA_TRANSPORT = "RdmaTransport"
SINGLE_NODE = "SingleNode"
EXPECTED_NETWORK = "ExpectedNetwork"
PREFLIGHT_PASSED = "PreflightPassed"
NO_VERDICT_IN_TIME = "NoVerdictInTime"
# Event reasons
EVENT_TCP_FALLBACK = "NcclTcpFallback"
EVENT_GDR_DISABLED = "NcclGdrDisabled"
# Node condition reasons
PORT_DOWN = "RdmaPortDown"
PORT_SLOW = "RdmaPortSlow"
PROBE_FAILED = "ProbeFailed"
PROBE_BELOW_FLOOR = "ProbeBelowFloor"
FABRIC_HEALTHY = "FabricHealthy"


@dataclass(frozen=True)
class Condition:
    """A condition to write: status "True"/"False", a CamelCase reason and a message."""

    status: str
    reason: str
    message: str


@dataclass(frozen=True)
class EventNote:
    """A Warning Event to create on a pod."""

    reason: str
    message: str


@dataclass(frozen=True)
class PreflightOutcome:
    """A pod's latest pre-flight result: passed or not, and what failed."""

    passed: bool
    message: str


def bounded(message: str) -> str:
    """A message within ``MAX_MESSAGE_CHARS`` (cut with an ellipsis)."""
    return message if len(message) <= MAX_MESSAGE_CHARS else message[: MAX_MESSAGE_CHARS - 3] + "..."


def preflight_outcome(result: ProbeResult) -> PreflightOutcome:
    """A pre-flight result (a file or a termination message) → passed, or the failed checks as ``check: message``."""
    if result.success:
        return PreflightOutcome(True, f"pre-flight passed ({len(result.checks)} checks)")
    failed = [f"{c.check}: {c.message}" if c.message else c.check for c in result.checks if not c.ok]
    if result.error:
        failed.insert(0, result.error)
    return PreflightOutcome(False, bounded("pre-flight failed: " + ("; ".join(failed) or "no checks passed")))


def latest_preflights(results: Iterable[ProbeResult]) -> dict[tuple[str, str], PreflightOutcome]:
    """(namespace, pod) → the outcome of its newest pre-flight result."""
    newest: dict[tuple[str, str], ProbeResult] = {}
    for result in results:
        if result.source != "preflight" or not result.pod:
            continue
        key = (result.namespace, result.pod)
        if key not in newest or result.finished_at >= newest[key].finished_at:
            newest[key] = result
    return {key: preflight_outcome(result) for key, result in newest.items()}


def _node_rdma(fabric: PodFabric) -> str:
    if fabric.node_rdma_active:
        return " (this node has an ACTIVE RDMA port)"
    if fabric.node_rdma_active is False:
        return " (this node has no ACTIVE RDMA port)"
    return ""


def no_verdict_condition(fabric: PodFabric | None, timeout_seconds: float) -> Condition:
    """``True`` / ``NoVerdictInTime``: the gate opens (fails open) for a pod that nothing spoke for in time."""
    if fabric is None:
        seen = "no NCCL log line of this pod was seen"
    else:
        seen = "NCCL's log of this pod did not show its transport"
    return Condition(
        "True",
        NO_VERDICT_IN_TIME,
        f"{seen} and no pre-flight result came within {_duration_text(timeout_seconds)} of the pod's start, "
        "so the gate opens (--collector.lifecycle.readiness-timeout; 0 waits forever). A fallback seen later "
        "still turns it False. For a verdict, run NCCL with NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=INIT,NET "
        "(the webhook adds them), or add the pre-flight.",
    )


def _duration_text(seconds: float) -> str:
    whole = int(seconds)
    if whole != seconds or whole < 60:
        return f"{seconds:g}s"
    minutes, rest = divmod(whole, 60)
    return f"{minutes}m" + (f"{rest}s" if rest else "")


def pod_condition(
    fabric: PodFabric | None,
    preflight: PreflightOutcome | None,
    expects_tcp: bool,
    waited_seconds: float | None = None,
    readiness_timeout_seconds: float = 0.0,
    current: Condition | None = None,
) -> Condition | None:
    """The ``ccl-health.io/fabric-ready`` condition a gated pod should have; None: leave it as it is.

    What NCCL shows of the running job wins over the pre-flight (it ran before the job); a
    fallback wins over everything. With a ``readiness_timeout_seconds`` (0: none), a pod without
    the condition (``current`` None) that has waited that long since its start
    (``waited_seconds``; None: not started) with neither gets ``True`` / ``NoVerdictInTime``: the
    gate fails open rather than keep the pod NotReady forever. A condition already there is never
    replaced for want of news (an exporter that restarts has not read the logs again yet)."""
    if fabric is not None and fabric.verdict == "tcp_fallback":
        if expects_tcp:
            return Condition("True", EXPECTED_NETWORK, bounded("NCCL runs on TCP, as the pod's "
                             "ccl-health.io/expected-network declares: " + fabric.reason))  # fmt: skip
        return Condition(
            "False",
            TCP_FALLBACK,
            bounded(f"NCCL's inter-node traffic runs on a TCP-class network{_node_rdma(fabric)}: {fabric.reason}"),
        )
    if fabric is not None and fabric.gdr_disabled:
        return Condition("False", GDR_DISABLED, bounded(f"NCCL runs without GPUDirect RDMA: {fabric.gdr_reason}"))
    if fabric is not None and fabric.verdict == "rdma":
        return Condition("True", RDMA_TRANSPORT, bounded(f"NCCL runs on RDMA: {fabric.reason}"))
    if fabric is not None and fabric.verdict == "single_node":
        return Condition("True", SINGLE_NODE, bounded(f"NCCL's communicators are on one node: {fabric.reason}"))
    if preflight is not None:
        if preflight.passed:
            return Condition("True", PREFLIGHT_PASSED, preflight.message)
        return Condition("False", PREFLIGHT_FAILED, preflight.message)
    timed_out = waited_seconds is not None and waited_seconds >= readiness_timeout_seconds
    if current is None and readiness_timeout_seconds > 0 and timed_out:
        return no_verdict_condition(fabric, readiness_timeout_seconds)
    return None


def pod_event(fabric: PodFabric, expects_tcp: bool) -> EventNote | None:
    """The Warning Event a pod should get for its NCCL transport; None when nothing is wrong."""
    if fabric.verdict == "tcp_fallback" and not expects_tcp:
        return EventNote(
            EVENT_TCP_FALLBACK,
            bounded(f"NCCL fell back to a TCP-class network{_node_rdma(fabric)}: {fabric.reason}"),
        )
    if fabric.gdr_disabled:
        return EventNote(EVENT_GDR_DISABLED, bounded(f"NCCL runs without GPUDirect RDMA: {fabric.gdr_reason}"))
    return None


def best_busbw(result: ProbeResult) -> float | None:
    """The highest bus bandwidth any size of any collective of the run reached (bytes/s)."""
    values = [row.busbw_bytes_per_second for c in result.collectives for row in c.rows]
    return max(values) if values else None


def latest_probe(results: Iterable[ProbeResult]) -> ProbeResult | None:
    """The newest probe result about this node's fabric (scheduled probes and probe Jobs, not pre-flights)."""
    probes = [r for r in results if r.source != "preflight"]
    return max(probes, key=lambda r: r.finished_at) if probes else None


def _rate_text(bytes_per_second: float) -> str:
    return f"{bytes_per_second / GBIT:g} Gb/s"


@dataclass
class NodeFabricJudge:
    """The node condition ``CclFabricDegraded`` from the ports this node has had ACTIVE and the
    latest probe. Remembers each port's best ACTIVE rate (bounded: ``MAX_TRACKED_PORTS``)."""

    min_port_rate_gbps: float = 0.0  # 0: only the rate a port had before counts
    probe_floor_gbs: float = 0.0  # 0: only a failed probe counts
    seen_active: dict[tuple[str, int], float] = field(default_factory=dict)  # (device, port) -> best rate

    def judge(self, ports: Sequence[RdmaPort], probe: ProbeResult | None) -> Condition:
        problems: list[tuple[str, str]] = []
        present = {(p.device, p.port): p for p in ports}
        for port in ports:
            key = (port.device, port.port)
            rate = float(port.rate_bytes_per_second or 0)
            if port.state_id in ACTIVE_PORT_STATES and (
                key in self.seen_active or len(self.seen_active) < MAX_TRACKED_PORTS
            ):
                self.seen_active[key] = max(self.seen_active.get(key, 0.0), rate)
        for key, best in sorted(self.seen_active.items()):
            name = f"{key[0]} port {key[1]}"
            now = present.get(key)
            if now is None:
                problems.append((PORT_DOWN, f"{name} is gone (it was ACTIVE)"))
            elif now.state_id not in ACTIVE_PORT_STATES:
                state = now.state or str(now.state_id or "unreadable")
                problems.append((PORT_DOWN, f"{name} is {state} (it was ACTIVE)"))
            elif float(now.rate_bytes_per_second or 0) < best:
                problems.append((PORT_SLOW, f"{name} runs at {now.rate_text or 'an unreadable rate'} "
                                            f"(it was ACTIVE at {_rate_text(best)})"))  # fmt: skip
            elif self.min_port_rate_gbps and float(now.rate_bytes_per_second or 0) < self.min_port_rate_gbps * GBIT:
                problems.append((PORT_SLOW, f"{name} runs at {now.rate_text or 'an unreadable rate'} "
                                            f"(expected at least {self.min_port_rate_gbps:g} Gb/s)"))  # fmt: skip
        probe_note = ""
        if probe is not None:
            busbw = best_busbw(probe)
            if not probe.success:
                why = probe.error or "; ".join(
                    f"{c.collective}: {c.error or 'wrong data'}" for c in probe.collectives if not c.success
                )
                problems.append((PROBE_FAILED, f"the latest {probe.source} probe failed: {why or 'no result'}"))
            elif self.probe_floor_gbs and (busbw is None or busbw < self.probe_floor_gbs * GB):
                shown = "no bandwidth" if busbw is None else f"{busbw / GB:.1f} GB/s"
                problems.append((PROBE_BELOW_FLOOR, f"the latest {probe.source} probe reached {shown}, "
                                                    f"below the floor of {self.probe_floor_gbs:g} GB/s"))  # fmt: skip
            else:
                probe_note = f"; the latest {probe.source} probe passed"
        if problems:
            return Condition("True", problems[0][0], bounded("; ".join(text for _, text in problems)))
        active = len(self.seen_active)
        return Condition("False", FABRIC_HEALTHY, f"{active} RDMA port(s) ACTIVE at their rate{probe_note}")

"""What the lifecycle hooks decide to write (exporter/lifecycle/decisions.py), pure."""

from __future__ import annotations

from exporter.fabric_verdicts import PodFabric
from exporter.lifecycle.decisions import (
    EVENT_GDR_DISABLED,
    EVENT_TCP_FALLBACK,
    MAX_MESSAGE_CHARS,
    Condition,
    NodeFabricJudge,
    PreflightOutcome,
    latest_preflights,
    latest_probe,
    pod_condition,
    pod_event,
)
from exporter.results.probe_file import Check, CollectiveResult, ProbeResult, Row
from exporter.sources.rdma import RdmaPort

SOCKET_LINE = (
    'communicator 0xabc: inter-node connection over TCP-class network Socket: "w-0:90:170 [0] NCCL INFO '
    'Channel 01/0 : 0[0] -> 8[0] [send] via NET/Socket/0"'
)
IB_LINE = (
    'communicator 0xdef uses RDMA network IB: "w-0:90:170 [0] NCCL INFO Channel 00/0 : 7[7] -> 8[0] [send] via '
    'NET/IB/0/GDRDMA"'
)
NO_GDR_LINE = (
    'communicator 0xdef connects nodes over IB without GPUDirect RDMA: "w-0 NCCL INFO Channel 00/0 : '
    '7[7] -> 8[0] [send] via NET/IB/0"'
)


def fabric(verdict: str, gdr_disabled: bool = False, reason: str = "", rdma: bool | None = True) -> PodFabric:
    return PodFabric("ml", "w-0", verdict, rdma, gdr_disabled, reason, NO_GDR_LINE if gdr_disabled else "")


FAILED = PreflightOutcome(
    False, "pre-flight failed: port_state: mlx5_0 port 1 is DOWN/Disabled (expected ACTIVE/LinkUp)"
)
PASSED = PreflightOutcome(True, "pre-flight passed (7 checks)")


def test_a_fallback_is_false_and_quotes_the_deciding_line() -> None:
    condition = pod_condition(fabric("tcp_fallback", reason=SOCKET_LINE), PASSED, expects_tcp=False)
    assert condition is not None and (condition.status, condition.reason) == ("False", "TcpFallback")
    assert "via NET/Socket/0" in condition.message and "ACTIVE RDMA port" in condition.message
    note = pod_event(fabric("tcp_fallback", reason=SOCKET_LINE), expects_tcp=False)
    assert note is not None and note.reason == EVENT_TCP_FALLBACK and "via NET/Socket/0" in note.message


def test_tcp_that_the_pod_declares_is_ready_and_gets_no_event() -> None:
    condition = pod_condition(fabric("tcp_fallback", reason=SOCKET_LINE), None, expects_tcp=True)
    assert condition is not None and (condition.status, condition.reason) == ("True", "ExpectedNetwork")
    assert pod_event(fabric("tcp_fallback", reason=SOCKET_LINE), expects_tcp=True) is None


def test_rdma_and_one_node_are_ready() -> None:
    assert pod_condition(fabric("rdma", reason=IB_LINE), None, False) == Condition(
        "True", "RdmaTransport", f"NCCL runs on RDMA: {IB_LINE}"
    )
    condition = pod_condition(fabric("single_node", reason="communicator 0x1 is on a single node"), None, False)
    assert condition is not None and condition.reason == "SingleNode"
    assert pod_event(fabric("rdma", reason=IB_LINE), False) is None


def test_rdma_without_gpudirect_is_not_ready() -> None:
    condition = pod_condition(fabric("rdma", gdr_disabled=True, reason=IB_LINE), None, False)
    assert condition is not None and (condition.status, condition.reason) == ("False", "GdrDisabled")
    assert 'via NET/IB/0"' in condition.message
    note = pod_event(fabric("rdma", gdr_disabled=True), False)
    assert note is not None and note.reason == EVENT_GDR_DISABLED


def test_preflight_decides_until_nccl_shows_something() -> None:
    assert pod_condition(None, None, False) is None, "absent until known"
    assert pod_condition(fabric("unknown"), None, False) is None
    failed = pod_condition(None, FAILED, False)
    assert failed == Condition("False", "PreflightFailed", FAILED.message)
    assert pod_condition(fabric("unknown"), PASSED, False) == Condition("True", "PreflightPassed", PASSED.message)
    ran = pod_condition(fabric("rdma", reason=IB_LINE), FAILED, False)
    assert ran is not None and ran.reason == "RdmaTransport", "what the running job shows wins over the check before it"


def test_the_readiness_timeout_opens_the_gate_of_a_pod_nothing_spoke_for() -> None:
    """Fail open after the timeout: True/NoVerdictInTime; never before it, never when 0 (fail
    closed), never before the pod started, never over a condition already there."""
    quiet = pod_condition(None, None, False, waited_seconds=240, readiness_timeout_seconds=240)
    assert quiet is not None and (quiet.status, quiet.reason) == ("True", "NoVerdictInTime")
    assert "no NCCL log line of this pod was seen" in quiet.message and "within 4m of the pod's start" in quiet.message
    assert "NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=INIT,NET" in quiet.message
    assert "--collector.lifecycle.readiness-timeout" in quiet.message and len(quiet.message) <= MAX_MESSAGE_CHARS
    unknown = pod_condition(fabric("unknown"), None, False, waited_seconds=900, readiness_timeout_seconds=600)
    assert unknown is not None and "did not show its transport" in unknown.message
    assert "within 10m of" in unknown.message
    assert pod_condition(None, None, False, waited_seconds=239.9, readiness_timeout_seconds=240) is None
    assert pod_condition(None, None, False, waited_seconds=10**6, readiness_timeout_seconds=0) is None
    assert pod_condition(None, None, False, waited_seconds=None, readiness_timeout_seconds=240) is None
    earlier = Condition("False", "TcpFallback", "an earlier exporter saw it")
    assert pod_condition(None, None, False, 10**6, 240, current=earlier) is None, "no news does not undo news"
    assert (
        pod_condition(None, None, False, 95, 90.5) is not None
        and "within 90.5s" in pod_condition(None, None, False, 95, 90.5).message
    )  # type: ignore[union-attr]


def test_what_is_known_wins_over_the_timeout() -> None:
    late = {"waited_seconds": 10**6, "readiness_timeout_seconds": 240.0}
    fallback = pod_condition(fabric("tcp_fallback", reason=SOCKET_LINE), None, False, **late)  # type: ignore[arg-type]
    assert fallback is not None and fallback.reason == "TcpFallback", "a fallback seen later closes the gate"
    failed = pod_condition(None, FAILED, False, **late)  # type: ignore[arg-type]
    assert failed is not None and failed.reason == "PreflightFailed"
    ran = pod_condition(
        fabric("rdma", reason=IB_LINE), None, False, current=Condition("True", "NoVerdictInTime", ""), **late
    )  # type: ignore[arg-type]
    assert ran is not None and ran.reason == "RdmaTransport"


def test_messages_are_bounded() -> None:
    condition = pod_condition(fabric("tcp_fallback", reason="x" * 5000), None, False)
    assert condition is not None and len(condition.message) == MAX_MESSAGE_CHARS


def result(source: str, pod: str, finished: float, ok: bool = True, busbw: float | None = None) -> ProbeResult:
    collectives = ()
    if busbw is not None:
        collectives = (CollectiveResult("all_reduce", (Row(1 << 26, 1 << 24, "float", 0.001, busbw, busbw, 0),)),)
    return ProbeResult(
        source=source,
        started_at=finished - 1,
        finished_at=finished,
        namespace="ml" if pod else "",
        pod=pod,
        checks=(Check("port_state", ok, "mlx5_0 port 1 is DOWN/Disabled"),),
        collectives=collectives,
    )


def test_the_newest_preflight_of_each_pod_counts() -> None:
    outcomes = latest_preflights(
        [
            result("preflight", "w-0", 10, ok=False),
            result("preflight", "w-0", 20),
            result("preflight", "w-1", 5, ok=False),
            result("job", "probe-0", 30),
        ]
    )
    assert outcomes[("ml", "w-0")].passed and not outcomes[("ml", "w-1")].passed
    assert "port_state: mlx5_0 port 1 is DOWN/Disabled" in outcomes[("ml", "w-1")].message
    assert set(outcomes) == {("ml", "w-0"), ("ml", "w-1")}
    assert latest_probe([result("scheduled", "", 40), result("preflight", "w-0", 50)]).finished_at == 40  # type: ignore[union-attr]


def port(device: str, state: int, rate_gbps: float) -> RdmaPort:
    names = {4: "ACTIVE", 1: "DOWN", 2: "INIT"}
    return RdmaPort(
        device,
        1,
        state_id=state,
        state=names[state],
        rate_bytes_per_second=int(rate_gbps * 125_000_000),
        rate_text=f"{rate_gbps:g} Gb/sec (4X NDR)",
    )


def test_node_condition_follows_ports_it_had_active() -> None:
    judge = NodeFabricJudge()
    healthy = judge.judge([port("mlx5_0", 4, 400), port("mlx5_1", 4, 400), port("mlx5_9", 1, 0)], None)
    assert (healthy.status, healthy.reason) == ("False", "FabricHealthy"), "a port never ACTIVE is not a problem"
    assert healthy.message.startswith("2 RDMA port(s)")
    down = judge.judge([port("mlx5_0", 1, 0), port("mlx5_1", 4, 400)], None)
    assert (down.status, down.reason) == ("True", "RdmaPortDown")
    assert down.message == "mlx5_0 port 1 is DOWN (it was ACTIVE)"
    slow = judge.judge([port("mlx5_0", 4, 400), port("mlx5_1", 4, 200)], None)
    assert (slow.status, slow.reason) == ("True", "RdmaPortSlow") and "it was ACTIVE at 400 Gb/s" in slow.message
    gone = judge.judge([port("mlx5_0", 4, 400)], None)
    assert gone.reason == "RdmaPortDown" and "mlx5_1 port 1 is gone" in gone.message
    assert judge.judge([port("mlx5_0", 4, 400), port("mlx5_1", 4, 400)], None).status == "False", "recovered"


def test_node_condition_minimum_rate_and_probe_floor() -> None:
    judge = NodeFabricJudge(min_port_rate_gbps=400, probe_floor_gbs=100)
    assert judge.judge([port("mlx5_0", 4, 200)], None).reason == "RdmaPortSlow"
    judge = NodeFabricJudge(probe_floor_gbs=100)
    assert judge.judge([port("mlx5_0", 4, 400)], result("scheduled", "", 1, busbw=150e9)).message.endswith(
        "the latest scheduled probe passed"
    )
    low = judge.judge([port("mlx5_0", 4, 400)], result("scheduled", "", 2, busbw=40e9))
    assert (low.status, low.reason) == ("True", "ProbeBelowFloor") and "40.0 GB/s" in low.message
    failed = judge.judge([port("mlx5_0", 4, 400)], result("job", "", 3, ok=False))
    assert (failed.status, failed.reason) == ("True", "ProbeFailed")

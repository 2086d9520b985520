"""The readiness gate fails safe, end to end inside one exporter against the recorded API server
(tests/kube_api.py, tests/lifecycle_node.py): the real ``KubePodCache`` lists the pods with their
``status.startTime`` and init container statuses, the real NCCL collector tails their logs, the
real ``kubernetes`` client writes the condition.

- ``--collector.lifecycle.readiness-timeout``: a gated pod with nothing known that long after its
  start gets ``True`` / ``NoVerdictInTime``; measured from the pod's start, so an exporter that
  starts late (or restarts) opens the gates of pods past it in its first pass; a condition already
  there is never replaced for want of news; a fallback seen later still turns it ``False``.
- What that means for a gang waiting on readiness, with the rule Kubernetes and Kueue apply: a pod
  is Ready when its containers are and every readiness gate's condition is ``True``, and Kueue's
  ``waitForPodsReady`` counts the workload ready once every pod is (``ready + succeeded``).
- Pre-flight results from the ``ccl-preflight`` init container's termination message, no
  hostPath: the pod whose status holds the message is the pod it speaks for.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ccl_sim.paths import simulated_paths
from ccl_sim.podlogs import SimJob, pytorchjob_labels
from exporter.collectors.lifecycle import TICK_SECONDS
from exporter.fabric_verdicts import PodFabric, VerdictFeed
from exporter.lifecycle.controller import FIRST_VIEW_GRACE_SECONDS, Clocks, LifecycleController, LifecycleSettings
from exporter.lifecycle.writes import LifecycleApi
from exporter.results.preflight_message import render_report
from exporter.results.probe_file import Check, ProbeResult
from exporter.sources.kube import FABRIC_READY_CONDITION, PodMetadata, pod_metadata_from_object
from tests.kube_api import ApiState, RecordedApiServer, wait_for
from tests.lifecycle_node import LifecycleNode, api_pod, lifecycle_node, write_nccl_log

LONG_AGO = 20 * 60.0  # seconds before now that the "old" pods started
LATE = SimJob("ml-training", "llama-worker-0", pytorchjob_labels("llama"), network="Socket", nnodes=2)
FRESH = SimJob("ml-training", "llama-worker-1", pytorchjob_labels("llama", index=1))
KEPT = SimJob("research", "bert-worker-0", pytorchjob_labels("bert"), network="IB", nnodes=2)
CHECKED = SimJob("vision", "resnet-worker-0", pytorchjob_labels("resnet"))
PORT_DOWN = "mlx5_3 port 1 is DOWN/Disabled (expected ACTIVE/LinkUp)"


@pytest.fixture
def make_node(tmp_path: Path) -> Iterator[Any]:
    nodes: list[LifecycleNode] = []

    def make(timeout: float, pods: tuple[dict[str, Any], ...]) -> LifecycleNode:
        settings = LifecycleSettings(readiness=True, events=True, readiness_timeout_seconds=timeout)
        nodes.append(lifecycle_node(tmp_path / f"node{len(nodes)}", settings, pods=pods))
        return nodes[-1]

    yield make
    for node in nodes:
        node.close()


def failed_preflight() -> str:
    return render_report(
        ProbeResult(
            source="preflight",
            started_at=time.time() - 40,
            finished_at=time.time() - 30,
            checks=(Check("rdma_devices", True, "8 RDMA device(s)"), Check("port_state", False, PORT_DOWN)),
        )
    )


def test_an_exporter_that_starts_late_opens_the_gates_of_pods_past_the_timeout_in_its_first_pass(
    make_node: Any,
) -> None:
    kept_pod = api_pod(KEPT, started_at=time.time() - LONG_AGO)
    # What the exporter before this one wrote: a fallback it saw. No news yet must not undo it.
    kept_pod["status"]["conditions"].append(
        {
            "type": FABRIC_READY_CONDITION,
            "status": "False",
            "reason": "TcpFallback",
            "message": "an earlier verdict",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
    )
    node = make_node(
        600.0,
        (
            api_pod(LATE, started_at=time.time() - LONG_AGO),
            api_pod(FRESH, started_at=time.time()),
            kept_pod,
            api_pod(CHECKED, started_at=time.time() - LONG_AGO, preflight_message=failed_preflight()),
        ),
    )
    synced = time.monotonic()  # the exporter's pod list is complete: its first pass follows

    assert wait_for(
        lambda: node.pod_condition(LATE) is not None and node.pod_condition(CHECKED) is not None, timeout=20
    )
    assert node.pod_patches(LATE)[0].at - synced < 5, "in its first pass, not a timeout later"
    late = node.pod_condition(LATE)
    assert (late["status"], late["reason"]) == ("True", "NoVerdictInTime")
    assert "within 10m of the pod's start" in late["message"] and "NCCL_DEBUG=INFO" in late["message"]
    assert "NCCL_DEBUG_SUBSYS=INIT,NET" in late["message"] and "no NCCL log line" in late["message"]
    checked = node.pod_condition(CHECKED)
    assert (checked["status"], checked["reason"]) == ("False", "PreflightFailed"), "the termination message counts"
    assert f"port_state: {PORT_DOWN}" in checked["message"]

    time.sleep(3 * TICK_SECONDS)
    assert node.pod_condition(FRESH) is None and not node.pod_patches(FRESH), "within the timeout: no answer yet"
    assert not node.pod_patches(KEPT), "a condition already there is kept"

    # The job prints late: its fallback still closes the gate.
    write_nccl_log(node.paths, LATE)
    assert wait_for(lambda: node.pod_condition(LATE)["status"] == "False", timeout=20)
    assert node.pod_condition(LATE)["reason"] == "TcpFallback"


def test_a_restarted_exporter_reads_the_logs_before_the_timeout_answers(make_node: Any, tmp_path: Path) -> None:
    """A pod past the timeout whose log already shows a fallback: the first write is the fallback,
    never a NoVerdictInTime that the tailer would take back a moment later."""
    printed = SimJob("research", "t5-worker-0", pytorchjob_labels("t5"), network="Socket", nnodes=2)
    write_nccl_log(simulated_paths(tmp_path / "node0"), printed)  # before the exporter starts
    node = make_node(600.0, (api_pod(printed, started_at=time.time() - LONG_AGO),))
    assert wait_for(lambda: node.pod_condition(printed) is not None, timeout=20)
    time.sleep(0.5)
    assert [p.body["status"]["conditions"][0]["reason"] for p in node.pod_patches(printed)] == ["TcpFallback"]


def test_the_timeout_runs_from_the_pods_start_and_zero_waits_forever(make_node: Any) -> None:
    waiting = make_node(3.0, (api_pod(FRESH, started_at=time.time()),))
    forever = make_node(0.0, (api_pod(LATE, started_at=time.time() - LONG_AGO),))
    time.sleep(3 * TICK_SECONDS)
    assert waiting.pod_condition(FRESH) is None
    waiting.clock.skip(3.0)
    assert wait_for(lambda: waiting.pod_condition(FRESH) is not None, timeout=20)
    condition = waiting.pod_condition(FRESH)
    assert (condition["status"], condition["reason"]) == ("True", "NoVerdictInTime")
    assert "within 3s of the pod's start" in condition["message"]
    assert forever.pod_condition(LATE) is None and not forever.pod_patches(LATE), "0: fail closed, as before"


def is_ready(pod: dict[str, Any]) -> bool:
    """A pod's Ready as the kubelet computes it: containers ready and every readiness gate True
    (a gate whose condition is absent counts as False)."""
    conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
    gates = [g["conditionType"] for g in pod["spec"].get("readinessGates", [])]
    return conditions.get("ContainersReady") == "True" and all(conditions.get(g) == "True" for g in gates)


def test_a_gang_that_never_prints_becomes_ready_for_kueue_after_the_timeout(make_node: Any) -> None:
    """Kueue's waitForPodsReady counts a workload ready when all its pods are: with the timeout, a
    gang whose jobs print nothing is ready once the timeout has passed since its pods started, so
    a Kueue timeout longer than that never evicts it; without it, it never is."""
    gang = (
        SimJob("ml-training", "gpt-worker-0", pytorchjob_labels("gpt")),
        SimJob("ml-training", "gpt-worker-1", pytorchjob_labels("gpt", index=1), network="IB", nnodes=2),
    )
    node = make_node(4.0, tuple(api_pod(job, started_at=time.time()) for job in gang))
    write_nccl_log(node.paths, gang[1])  # one pod's NCCL says RDMA; the other never prints

    def gang_ready() -> bool:
        return all(is_ready(node.state.pod(job.namespace, job.pod) or {"status": {}, "spec": {}}) for job in gang)

    assert wait_for(lambda: node.pod_condition(gang[1]) is not None, timeout=20)
    time.sleep(3 * TICK_SECONDS)
    assert not gang_ready(), "the quiet pod keeps the gang not ready within the timeout"
    node.clock.skip(4.0)
    assert wait_for(gang_ready, timeout=20), "ready once the readiness timeout has passed"
    assert [node.pod_condition(job)["reason"] for job in gang] == ["NoVerdictInTime", "RdmaTransport"]


class NodePods:
    """The node's pod list, as ``KubePodCache`` gives it (complete)."""

    def __init__(self, *pods: PodMetadata) -> None:
        self.listed = list(pods)

    def pods(self) -> list[PodMetadata]:
        return self.listed

    def lookup(self, namespace: str, pod: str) -> PodMetadata | None:
        return next((p for p in self.listed if (p.namespace, p.name) == (namespace, pod)), None)

    def is_authoritative(self) -> bool:
        return True


def test_the_timeout_waits_for_the_nccl_collectors_first_pass(tmp_path: Path) -> None:
    """Stepped by hand against the recorded API: before the NCCL collector's first view the timeout
    does not answer (the view may hold the fallback), after it it does; with no view at all (the
    NCCL collector off) it answers FIRST_VIEW_GRACE_SECONDS after the start."""
    api = RecordedApiServer(ApiState(pods=[api_pod(job, started_at=time.time() - LONG_AGO) for job in (LATE, KEPT)]))
    api.start()
    try:
        pods = NodePods(*(pod_metadata_from_object(p) for p in api.state.pods))  # type: ignore[arg-type]
        now = [0.0]

        def controller(feed: VerdictFeed) -> LifecycleController:
            return LifecycleController(
                LifecycleSettings(readiness=True, events=False, readiness_timeout_seconds=600),
                feed,
                pods,
                LifecycleApi(api.api_factory()),
                node_name="gpu-node-7",
                sysfs=tmp_path,
                probe_results=tmp_path,
                clocks=Clocks(monotonic=lambda: now[0]),
            )

        feed = VerdictFeed()
        first = controller(feed)
        first.step(0)
        assert not api.state.writes("pods/status"), "no view yet: the logs may still say something"
        fallback = PodFabric(KEPT.namespace, KEPT.pod, "tcp_fallback", True, False, "via NET/Socket/0")
        feed.publish((fallback,))
        first.step(0)
        reasons = {
            w.path.split("/")[6]: w.body["status"]["conditions"][0]["reason"] for w in api.state.writes("pods/status")
        }
        assert reasons == {KEPT.pod: "TcpFallback", LATE.pod: "NoVerdictInTime"}

        for pod in api.state.pods:
            pod["status"]["conditions"] = pod["status"]["conditions"][:2]
        pods.listed = [pod_metadata_from_object(p) for p in api.state.pods]  # type: ignore[misc]
        written = len(api.state.writes("pods/status"))
        alone = controller(VerdictFeed())
        now[0] = FIRST_VIEW_GRACE_SECONDS - 1
        alone.step(0)
        assert len(api.state.writes("pods/status")) == written
        now[0] = FIRST_VIEW_GRACE_SECONDS
        alone.step(0)
        assert len(api.state.writes("pods/status")) == written + 2
    finally:
        api.stop()

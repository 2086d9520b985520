"""The lifecycle hooks end to end inside one exporter: NCCL lines land in a pod's log, the NCCL
collector's tailer reaches a verdict, and the pod condition ``ccl-health.io/fabric-ready``, the
pod Event and the node condition ``CclFabricDegraded`` are written with the real ``kubernetes``
client to the recorded API server (tests/kube_api.py), which merges conditions by type as the API
server does and refuses any patch but a strategic merge. The pod list comes from the real
``KubePodCache`` against the same server; the RDMA ports and pod logs are the simulator's files
(tests/lifecycle_node.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from ccl_sim.podlogs import SimJob, pytorchjob_labels
from exporter.collectors.lifecycle import TICK_SECONDS, LifecycleCollector
from exporter.fabric_verdicts import PodFabric, VerdictFeed
from exporter.lifecycle.controller import LifecycleSettings
from exporter.results.probe_file import Check, ProbeResult, write_result
from exporter.sources.kube import FABRIC_READY_CONDITION
from tests.kube_api import wait_for
from tests.lifecycle_node import NODE, LifecycleNode, api_pod, lifecycle_node, write_nccl_log
from tests.metrics_text import value

KUBERNETES_VERSION = "1.30.0"


HEALTHY = SimJob("ml-training", "llama-worker-0", pytorchjob_labels("llama"), network="IB", nnodes=2)
FALLBACK = SimJob("research", "bert-worker-0", pytorchjob_labels("bert"), network="Socket", nnodes=2, gdr=False)
PREFLIGHT = SimJob("vision", "resnet-worker-0", pytorchjob_labels("resnet"))
QUIET = SimJob("vision", "vit-worker-0", pytorchjob_labels("vit"))  # gated, nothing to say yet
UNGATED = SimJob("batch", "etl-worker-0", pytorchjob_labels("etl"), network="Socket", nnodes=2, gdr=False)


@pytest.fixture
def make_node(tmp_path: Path) -> Iterator[Any]:
    nodes: list[LifecycleNode] = []

    def make(
        hooks: LifecycleSettings, node_object: dict[str, Any] | None = None, pods: tuple[dict[str, Any], ...] = ()
    ) -> LifecycleNode:
        nodes.append(lifecycle_node(tmp_path / f"node{len(nodes)}", hooks, node_object, pods))
        return nodes[-1]

    yield make
    for node in nodes:
        node.close()


ALL_POD_HOOKS = LifecycleSettings(readiness=True, events=True, node_condition=False)


def test_healthy_fallback_and_failed_preflight_pods(make_node: Any) -> None:
    node = make_node(
        ALL_POD_HOOKS,
        pods=(api_pod(HEALTHY), api_pod(FALLBACK), api_pod(PREFLIGHT), api_pod(UNGATED, gated=False), api_pod(QUIET)),
    )
    write_result(
        node.paths.probe_results,
        ProbeResult(
            source="preflight",
            started_at=time.time() - 5,
            finished_at=time.time(),
            namespace=PREFLIGHT.namespace,
            pod=PREFLIGHT.pod,
            pod_uid=PREFLIGHT.uid,
            checks=(
                Check("rdma_devices", True, "8 RDMA device(s)"),
                Check("port_state", False, "mlx5_3 port 1 is DOWN/Disabled (expected ACTIVE/LinkUp)"),
            ),
        ),
    )
    # A neighbour's forgeries for a gated pod with no result and no NCCL output yet: no UID, and a
    # UID that is not the pod's. Neither may give it a PreflightFailed condition.
    for forged_uid in ("", "00000000-0000-4000-8000-00000000dead"):
        write_result(
            node.paths.probe_results,
            ProbeResult(
                source="preflight",
                started_at=time.time() - 5,
                finished_at=time.time(),
                namespace=QUIET.namespace,
                pod=QUIET.pod,
                pod_uid=forged_uid,
                checks=(Check("port_state", False, "forged"),),
            ),
        )
    written = {job.pod: write_nccl_log(node.paths, job) for job in (HEALTHY, FALLBACK, UNGATED)}

    assert wait_for(lambda: all(node.pod_condition(j) for j in (HEALTHY, FALLBACK, PREFLIGHT)), timeout=20)
    assert wait_for(lambda: node.events(FALLBACK) and node.events(UNGATED), timeout=20)

    healthy = node.pod_condition(HEALTHY)
    assert (healthy["status"], healthy["reason"]) == ("True", "RdmaTransport")
    assert "via NET/IB/" in healthy["message"] and "/GDRDMA" in healthy["message"], "quotes the deciding line"
    fallback = node.pod_condition(FALLBACK)
    assert (fallback["status"], fallback["reason"]) == ("False", "TcpFallback")
    assert "via NET/Socket/" in fallback["message"] and "this node has an ACTIVE RDMA port" in fallback["message"]
    preflight = node.pod_condition(PREFLIGHT)
    assert (preflight["status"], preflight["reason"]) == ("False", "PreflightFailed")
    assert "port_state: mlx5_3 port 1 is DOWN/Disabled" in preflight["message"]
    for cond in (healthy, fallback, preflight):
        assert cond["lastTransitionTime"].endswith("Z")
    # The pod's other conditions are untouched: the patch is a strategic merge of ours alone.
    kubelet_conditions = [c["type"] for c in node.state.pod(FALLBACK.namespace, FALLBACK.pod)["status"]["conditions"]]
    assert kubelet_conditions == ["Ready", "ContainersReady", FABRIC_READY_CONDITION]
    for patch in node.state.writes("pods/status"):
        assert patch.content_type.startswith("application/strategic-merge-patch+json")
        assert [c["type"] for c in patch.body["status"]["conditions"]] == [FABRIC_READY_CONDITION]
    assert node.pod_condition(UNGATED) is None and not node.pod_patches(UNGATED), "no gate, no condition"
    assert node.pod_condition(QUIET) is None and not node.pod_patches(QUIET), "a forged result speaks for no one"

    (event,) = node.events(FALLBACK)
    assert (event["reason"], event["type"]) == ("NcclTcpFallback", "Warning")
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": FALLBACK.pod,
        "namespace": FALLBACK.namespace,
        "uid": FALLBACK.uid,
    }
    assert "via NET/Socket/" in event["message"]
    kubernetes_validate.validate(event, KUBERNETES_VERSION, strict=True)
    assert not node.events(HEALTHY) and not node.events(PREFLIGHT)

    # Both within 2 s of the NCCL line reaching the pod log (measured against the recorded API).
    patch_at = node.pod_patches(FALLBACK)[0].at
    event_at = next(w.at for w in node.state.writes("events") if w.body["involvedObject"]["name"] == FALLBACK.pod)
    assert patch_at - written[FALLBACK.pod] < 2.0 and event_at - written[FALLBACK.pod] < 2.0

    # Only on change: more ticks write nothing more, and the Event is not repeated.
    before = len(node.state.writes())
    time.sleep(3 * TICK_SECONDS)
    assert len(node.state.writes()) == before
    metrics = "".join(f"{m.name} {m.samples}\n" for m in node.lifecycle.collect())
    assert "pod_event" in metrics


def test_a_status_change_moves_the_transition_time_and_a_message_change_does_not(make_node: Any) -> None:
    job = SimJob("ml-training", "gpt-worker-0", pytorchjob_labels("gpt"), network="IB", nnodes=2)
    node = make_node(ALL_POD_HOOKS, pods=(api_pod(job),))
    write_nccl_log(node.paths, job)
    assert wait_for(lambda: node.pod_condition(job) is not None, timeout=20)
    first = dict(node.pod_condition(job))
    node.clock.skip(1.1)  # the transition time has a resolution of one second
    job.restarts += 1  # the container restarts, NCCL comes back on IB: same status, new line quoted
    write_nccl_log(node.paths, job)
    assert wait_for(lambda: node.pod_condition(job)["message"] != first["message"], timeout=20)
    second = dict(node.pod_condition(job))
    assert second["status"] == "True" and second["lastTransitionTime"] == first["lastTransitionTime"]
    node.clock.skip(1.1)
    job.restarts += 1
    job.network = "Socket"
    write_nccl_log(node.paths, job)
    assert wait_for(lambda: node.pod_condition(job)["status"] == "False", timeout=20)
    assert node.pod_condition(job)["lastTransitionTime"] > first["lastTransitionTime"]


def test_api_down_never_holds_the_tailer_and_the_write_comes_after(make_node: Any) -> None:
    node = make_node(ALL_POD_HOOKS, pods=(api_pod(FALLBACK),))
    node.state.fail_writes = True
    write_nccl_log(node.paths, FALLBACK)
    # The NCCL collector goes on: its verdict is on /metrics while every write fails.
    assert wait_for(
        lambda: (
            value(
                "".join(_exposition(node.nccl)),
                "ccl_nccl_tcp_fallback",
                namespace=FALLBACK.namespace,
                pod=FALLBACK.pod,
                job_name="bert",
                job_kind="PyTorchJob",
            )
            == 1.0
        ),
        timeout=20,
    )
    assert wait_for(lambda: node.lifecycle.controller.writes[("pod_condition", "error")] >= 2, timeout=20)
    assert node.pod_condition(FALLBACK) is None
    node.state.fail_writes = False
    assert wait_for(lambda: node.pod_condition(FALLBACK) is not None, timeout=40), "retried with backoff"
    assert node.pod_condition(FALLBACK)["reason"] == "TcpFallback"
    assert wait_for(lambda: len(node.events(FALLBACK)) == 1, timeout=40)


def _exposition(collector: Any) -> list[str]:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(collector)
    return [generate_latest(registry).decode()]


def test_node_condition_when_a_port_it_had_active_goes_down(make_node: Any) -> None:
    existing = {
        "type": "CclFabricDegraded",
        "status": "False",
        "reason": "FabricHealthy",
        "message": "old",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
        "lastHeartbeatTime": "2026-01-01T00:00:00Z",
    }
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"}
    node_object = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE},
        "status": {"conditions": [ready, existing]},
    }
    node = make_node(
        LifecycleSettings(readiness=False, events=False, node_condition=True, node_interval_seconds=0.2),
        node_object=node_object,
    )

    def condition() -> dict[str, Any] | None:
        return node.state.condition(node.state.nodes[NODE], "CclFabricDegraded")

    assert wait_for(lambda: condition()["message"] != "old", timeout=20)
    healthy = dict(condition())
    assert (healthy["status"], healthy["reason"]) == ("False", "FabricHealthy")
    assert healthy["lastTransitionTime"] == "2026-01-01T00:00:00Z", "status unchanged: transition time kept"
    node.rdma.set_port_state("mlx5_3", "1: DOWN", "3: Disabled")
    assert wait_for(lambda: condition()["status"] == "True", timeout=20)
    down = condition()
    assert down["reason"] == "RdmaPortDown" and "mlx5_3 port 1 is DOWN (it was ACTIVE)" in down["message"]
    assert down["lastTransitionTime"] != "2026-01-01T00:00:00Z"
    assert node.state.nodes[NODE]["status"]["conditions"][0] == ready, "kubelet's conditions untouched"
    patches = node.state.writes("nodes/status")
    assert all(p.path == f"/api/v1/nodes/{NODE}/status" for p in patches), "its own node only"
    assert len(patches) == 2, "written only on change"
    node.rdma.set_port_state("mlx5_3", "4: ACTIVE", "5: LinkUp")
    assert wait_for(lambda: condition()["status"] == "False", timeout=20)


def test_the_feed_drops_the_oldest_view_and_keeps_the_newest() -> None:
    feed = VerdictFeed(capacity=2)
    views = [(PodFabric("ns", "p", verdict, True, False),) for verdict in ("unknown", "rdma", "tcp_fallback")]
    assert not feed.publish(views[0]), "nothing is queued before a consumer subscribes"
    feed.subscribe()
    for view in views:
        assert feed.publish(view)
    assert not feed.publish(views[-1]), "an unchanged view is not queued again"
    assert feed.dropped == 1
    assert [v.pods for v in feed.take(0)] == views[1:]
    assert feed.take(0.01) == []


def test_without_api_access_nothing_is_written_and_it_says_so(tmp_path: Path) -> None:
    from exporter.lifecycle.controller import LifecycleController
    from exporter.lifecycle.writes import LifecycleApi
    from exporter.sources.kube import NotInCluster, PodMetadata

    class Pods:
        def pods(self) -> list[PodMetadata]:
            return [PodMetadata("ns", "p", "u", "", "", fabric_ready_gate=True)]

        def lookup(self, namespace: str, pod: str) -> None:
            return None

        def is_authoritative(self) -> bool:
            return True

    def not_in_cluster() -> None:
        raise NotInCluster("Service host/port is not set.")

    feed = VerdictFeed()
    controller = LifecycleController(
        ALL_POD_HOOKS,
        feed,
        Pods(),
        LifecycleApi(not_in_cluster),
        node_name=NODE,
        sysfs=tmp_path,
        probe_results=tmp_path,
    )
    feed.publish((PodFabric("ns", "p", "tcp_fallback", True, False, "a reason"),))
    controller.step(0)
    assert controller.status == "no API access"
    collector = LifecycleCollector(controller)
    assert value(_exposition(collector)[0], "ccl_lifecycle_api_access") == 0.0

"""``--collector.lifecycle`` on the simulated node: the lifecycle hooks write to the simulated node's API
(sim/ccl_sim/kube.py) through the same code as in a cluster, and ``kube-status`` shows it."""

from __future__ import annotations

from pathlib import Path

import pytest

from ccl_sim.control import ActionError, kube_status
from ccl_sim.kube import SimApiError, SimKube
from ccl_sim.node import default_node
from ccl_sim.resources import simulated_node_resources
from exporter.collectors import all_collectors
from exporter.commands import build_parser
from exporter.commands.serve import build_collectors, config_from_args

FLAGS = ["serve", "--collector.lifecycle", "--collector.lifecycle.hooks=readiness,events,node-condition"]


def test_the_fallback_pod_is_not_fabric_ready_on_the_simulated_node(tmp_path: Path) -> None:
    node = default_node(tmp_path, seed=7)
    node.setup()
    node.advance(1.0)
    specs = all_collectors()
    config = config_from_args(build_parser({}).parse_args(FLAGS), specs)
    try:
        with simulated_node_resources(node, nvml_collected=True) as resources:
            collectors = {c.name: c for c in build_collectors(specs, config, resources)}
            collectors["nccl"].step()  # type: ignore[attr-defined]
            collectors["lifecycle"].controller.step(0)  # type: ignore[attr-defined]
            status = kube_status(node, {})
    finally:
        node.close()

    def fabric_ready(pod: str) -> dict[str, str]:
        (condition,) = [c for c in status["pods"][pod] if c["type"] == "ccl-health.io/fabric-ready"]
        return condition

    fallback = fabric_ready("research/bert-finetune-worker-0")
    assert (fallback["status"], fallback["reason"]) == ("False", "TcpFallback")
    assert "via NET/Socket/" in fallback["message"]
    assert fabric_ready("ml-training/llama-70b-worker-0")["status"] == "True"
    assert fabric_ready("vision/resnet-eval-0")["reason"] == "SingleNode"
    (event,) = status["events"]
    assert event["reason"] == "NcclTcpFallback" and event["involvedObject"]["name"] == "bert-finetune-worker-0"
    (node_condition,) = status["node"]["conditions"]
    assert (node_condition["type"], node_condition["status"]) == ("CclFabricDegraded", "False")


def test_the_simulated_api_behaves_like_the_api_server() -> None:
    kube = SimKube()
    with pytest.raises(SimApiError) as refused:
        kube.patch_namespaced_pod_status("p", "ns", {"status": {"conditions": [{"type": "A", "status": "True"}]}})
    assert refused.value.status == 415, "a JSON merge patch would replace the whole list: refused"
    strategic = {"_content_type": "application/strategic-merge-patch+json"}
    kube.patch_node_status("simulated-node", {"status": {"conditions": [{"type": "A", "status": "True"}]}}, **strategic)
    kube.patch_node_status(
        "simulated-node", {"status": {"conditions": [{"type": "B", "status": "False"}]}}, **strategic
    )
    kube.patch_node_status(
        "simulated-node", {"status": {"conditions": [{"type": "A", "status": "False"}]}}, **strategic
    )
    assert kube.read_node_status("simulated-node")["status"]["conditions"] == [
        {"type": "A", "status": "False"},
        {"type": "B", "status": "False"},
    ]
    with pytest.raises(SimApiError):
        kube.patch_node_status("another-node", {}, **strategic)
    event = {"metadata": {"name": "p.ccl-1"}, "reason": "NcclTcpFallback"}
    kube.create_namespaced_event("ns", event)
    with pytest.raises(SimApiError) as exists:
        kube.create_namespaced_event("ns", event)
    assert exists.value.status == 409


def test_kube_status_needs_the_simulated_api(tmp_path: Path) -> None:
    node = default_node(tmp_path)
    node.kube = None
    with pytest.raises(ActionError):
        kube_status(node, {})

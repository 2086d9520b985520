"""The node's shared resources: one of each, started with the server, closed once, by their owner
only; and a node without a kubelet socket or an API server loads neither gRPC nor the
Kubernetes client."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ccl_sim.node import default_node
from ccl_sim.resources import simulated_node_resources
from exporter.collectors import all_collectors
from exporter.collectors.base import close_collector
from exporter.commands import build_parser
from exporter.commands.serve import build_collectors, config_from_args
from exporter.resources import HostPaths, NodeResources
from exporter.sources.kube import NoPodMetadata
from exporter.sources.nvml import NvmlReading
from exporter.sources.podresources import PodResourcesClient
from tests.conftest import REPO


class CountingPods(NoPodMetadata):
    def __init__(self) -> None:
        self.started = self.closed = 0

    def start(self) -> None:
        self.started += 1

    def close(self) -> None:
        self.closed += 1


class CountingNvml:
    def __init__(self) -> None:
        self.closed = 0

    def read(self) -> NvmlReading:
        return NvmlReading()

    def gpus(self) -> list:  # type: ignore[type-arg]
        return []

    def compute_processes(self) -> dict:  # type: ignore[type-arg]
        return {}

    def close(self) -> None:
        self.closed += 1


class CountingClient(PodResourcesClient):
    closed = 0

    def close(self) -> None:
        self.closed += 1
        super().close()


def paths(root: Path) -> HostPaths:
    return HostPaths(
        root / "sys", root / "pods", root / "nccl", root / "state", root / "kubelet.sock", root / "results"
    )


def resources(root: Path, pods: CountingPods, made: list[int] | None = None, **kw: object) -> NodeResources:
    def make() -> CountingPods:
        if made is not None:
            made.append(1)
        return pods

    return NodeResources(
        paths(root), nvml=CountingNvml(), pod_resources=CountingClient(root / "kubelet.sock"), pod_metadata=make, **kw
    )  # type: ignore[arg-type]


def every_collector(node: NodeResources, *flags: str) -> list:  # type: ignore[type-arg]
    specs = all_collectors()
    config = config_from_args(build_parser({}).parse_args(["serve", "--probe.interval", "60", *flags]), specs)
    return build_collectors(specs, config, node)


def test_one_pod_list_made_when_asked_started_with_the_server_and_closed_once(tmp_path: Path) -> None:
    pods, made = CountingPods(), []
    node = resources(tmp_path, pods, made)
    assert made == [], "nothing is made before a collector asks"
    every_collector(node)
    assert made == [1] and node.pod_metadata is pods and pods.started == 0
    node.start()
    node.start()
    assert pods.started == 1
    node.close()
    node.close()
    assert pods.closed == 1 and node.nvml.closed == 1 and node.pod_resources.closed == 1  # type: ignore[attr-defined]


def test_a_pod_list_asked_for_after_start_is_started_at_once(tmp_path: Path) -> None:
    pods = CountingPods()
    node = resources(tmp_path, pods)
    node.start()
    assert node.pod_metadata is pods and pods.started == 1


def test_closing_the_collectors_leaves_the_shared_resources_open(tmp_path: Path) -> None:
    pods = CountingPods()
    node = resources(tmp_path, pods)
    collectors = every_collector(node)
    assert [c.name for c in collectors] == [
        "rdma",
        "nvml",
        "podresources",
        "podnetwork",
        "nccl",
        "inspector",
        "probe",
        "topology",
    ]
    for collector in collectors:
        close_collector(collector)
    assert pods.closed == 0 and node.nvml.closed == 0 and node.pod_resources.closed == 0  # type: ignore[attr-defined]


def test_nvml_switched_off_reaches_no_other_collector(tmp_path: Path) -> None:
    node = resources(tmp_path, CountingPods(), nvml_collected=False)
    assert node.nvml_if_collected() is None
    collectors = {c.name: c for c in every_collector(node, "--no-collector.nvml")}
    assert "nvml" not in collectors
    assert collectors["podresources"]._nvml is None
    assert collectors["nccl"]._attributor._gpu_inventory._nvml is None
    assert node.topology._nvml is None, "no GPUs from NVML on the topology either"
    assert collectors["topology"]._source is node.topology is collectors["nccl"]._topology, "one topology source"


def test_the_simulated_node_offers_its_own_nvml_pods_and_tree(tmp_path: Path) -> None:
    sim = default_node(tmp_path)
    node = simulated_node_resources(sim)
    assert node.nvml is sim.nvml and node.pod_metadata is sim.pod_metadata
    assert node.paths.sysfs == sim.sysfs == tmp_path / "sys"
    assert node.pod_resources.socket_path == tmp_path / "pod-resources" / "kubelet.sock"


REAL_NODE_SCRAPE = """
import json, sys
from pathlib import Path
from exporter.commands import build_parser
from exporter.commands.serve import build_collectors, config_from_args
from exporter.collectors import all_collectors
from exporter.resources import real_node_resources
root = Path(sys.argv[1])
flags = [f"--path.{name}={root / name}" for name in ("sysfs", "pod-logs", "nccl-debug-files", "state",
                                                    "pod-resources", "probe-results")]
specs = all_collectors()
config = config_from_args(build_parser({}).parse_args(["serve", "--kube.node-name=gpu-1", *flags]), specs)
with real_node_resources(config.paths, config.node_name) as node:
    collectors = build_collectors(specs, config, node)
    node.start()
    for collector in collectors:
        try:
            list(collector.collect())
        except Exception:
            pass
        if collector.name == "nccl":
            collector.step()
    node.pod_metadata._thread.join(10)
    print(json.dumps(sorted(m for m in ("grpc", "kubernetes") if m in sys.modules)))
"""


def test_a_node_without_kubelet_socket_or_api_server_loads_neither_client(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}  # no KUBERNETES_SERVICE_HOST: not in a cluster
    done = subprocess.run(
        [sys.executable, "-c", REAL_NODE_SCRAPE, str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == []

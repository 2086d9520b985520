"""The shared resources of the simulated node, for ``python -m ccl_sim serve``.

The same ``NodeResources`` the real node gives its collectors, taken from the simulated node:
its NVML (``SimNvml``), its pods (the simulated pod logs' own pod list; there is no API
server), a client of its pod-resources socket (a real gRPC server), its folder tree, its clock,
and the API the lifecycle hooks write to (``SimKube``, which records the writes). The
collectors cannot tell the difference.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ccl_sim import clock
from ccl_sim.node import SimulatedNode, default_node
from exporter.resources import KubeNode, NodeResources
from exporter.sources.podresources import PodResourcesClient


def simulated_node_resources(node: SimulatedNode, *, nvml_collected: bool = True) -> NodeResources:
    """``node``'s resources; closing them leaves the node running (it is closed by its owner)."""
    if node.nvml is None or node.pod_metadata is None or node.kube is None or node.kubelet is None:
        raise ValueError("the simulated node has no NVML, pod list, API or kubelet (build it with default_node)")
    pods, kube = node.pod_metadata, node.kube
    return NodeResources(
        node.paths,
        nvml=node.nvml,
        pod_resources=PodResourcesClient(node.paths.pod_resources),
        pod_metadata=lambda: pods,
        nvml_collected=nvml_collected,
        clock=clock.now,
        kube=KubeNode(kube.node_name, lambda: kube),
    )


@contextmanager
def temporary_simulated_node(seed: int, job_ends_after_seconds: float = 0.0) -> Iterator[SimulatedNode]:
    """The node ``python -m ccl_sim serve`` runs, laid out in a new temporary folder and advanced one
    tick; stopped and removed on exit."""
    root = Path(tempfile.mkdtemp(prefix="ccl-exporter-sim-"))
    node = default_node(root, seed=seed, job_ends_after_seconds=job_ends_after_seconds)
    try:
        node.setup()
        node.advance(1.0)
        yield node
    finally:
        node.close()
        shutil.rmtree(root, ignore_errors=True)

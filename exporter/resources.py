"""What a node offers every collector, built once per ``serve`` and closed once.

``NodeResources`` holds the node's shared resources: its host paths (sysfs root, pod logs, ...),
one NVML handle, one kubelet pod-resources client, one pod-metadata source (one list/watch of
the node's pods against the API server, however many collectors label series with jobs), one
topology source (GPUs and NICs on the PCI tree), the clock, and for the lifecycle hooks the
node's name and the API they write through (``KubeNode``) and the feed of NCCL verdicts. Every
collector factory takes ``(settings, resources)``; no collector opens, starts or closes a shared
resource itself.

``real_node_resources`` builds them for this node from the flags; a caller of ``serve`` may hand
it resources of its own making instead (``exporter.commands.serve.ServedNode``). Building them is cheap:
the NVML library, gRPC and the Kubernetes client
are loaded only when a collector first reads through them, and the pod list is made when a
collector asks for it and watched once the server starts (``start``). ``close`` (or leaving the
``with`` block) closes what was opened, once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exporter.fabric_verdicts import VerdictFeed
from exporter.sources.kube import KubePodCache, PodMetadataSource, in_cluster_api
from exporter.sources.nvml import NvmlBackend, PynvmlBackend
from exporter.sources.podresources import PodResourcesClient
from exporter.sources.topology import TopologySource

DEFAULT_NCCL_INSPECTOR = Path("/var/log/nccl-inspector")


@dataclass(frozen=True)
class HostPaths:
    """Where the node's files are: the ``--path.*`` flags, or the tree of whichever node ``serve`` is given."""

    sysfs: Path
    pod_logs: Path
    nccl_debug_files: Path
    state: Path  # writable: tail offsets
    pod_resources: Path  # the kubelet's socket
    probe_results: Path
    # NCCL Inspector output (NCCL_INSPECTOR_DUMP_DIR), per-pod folders as for NCCL debug files
    nccl_inspector: Path = DEFAULT_NCCL_INSPECTOR


@dataclass(frozen=True)
class KubeNode:
    """This node as the API server knows it, for the lifecycle hooks: its name ("" when not
    given) and a factory of the CoreV1Api they write through (called in their own thread)."""

    name: str = ""
    api: Callable[[], Any] = field(default=in_cluster_api)


class NodeResources:
    """See the module docstring."""

    def __init__(
        self,
        paths: HostPaths,
        *,
        nvml: NvmlBackend,
        pod_resources: PodResourcesClient,
        pod_metadata: Callable[[], PodMetadataSource],
        nvml_collected: bool = True,
        clock: Callable[[], float] = time.time,
        kube: KubeNode = KubeNode(),
    ) -> None:
        self.paths = paths
        self.nvml = nvml
        self.pod_resources = pod_resources
        self.clock = clock  # wall clock: result files' ages, probe start times
        # For the lifecycle hooks: this node's name, the API they write through, and the NCCL
        # verdicts as the NCCL collector reaches them.
        self.node_name = kube.name
        self.kube_api = kube.api
        self.verdict_feed = VerdictFeed()
        self._make_pod_metadata = pod_metadata
        self._pod_metadata: PodMetadataSource | None = None
        self._nvml_collected = nvml_collected
        self._topology: TopologySource | None = None
        self._lock = threading.Lock()
        self._started = False
        self._closed = False

    @property
    def pod_metadata(self) -> PodMetadataSource:
        """The node's pods and their jobs; made when first asked for, watched from ``start`` on."""
        with self._lock:
            if self._pod_metadata is None:
                self._pod_metadata = self._make_pod_metadata()
                if self._started:
                    _call(self._pod_metadata, "start")
            return self._pod_metadata

    @property
    def topology(self) -> TopologySource:
        """Where the node's GPUs and RDMA NICs sit on the PCI tree (sysfs, GPUs from NVML when the nvml
        collector runs); one source, walked once and again when the node changes."""
        with self._lock:
            if self._topology is None:
                self._topology = TopologySource(self.paths.sysfs, self.nvml_if_collected())
            return self._topology

    def nvml_if_collected(self) -> NvmlBackend | None:
        """NVML for what other collectors add from it (a GPU's index on ``ccl_gpu_pod_info``, the
        GPU count that places NCCL communicators); None when the nvml collector is switched off,
        so that switching it off keeps NVML's answers out of every series."""
        return self.nvml if self._nvml_collected else None

    def start(self) -> None:
        """Start watching what needs a watch (the pod list); the server calls it as it starts. Once."""
        with self._lock:
            if self._started:
                return
            self._started = True
            source = self._pod_metadata
        if source is not None:
            _call(source, "start")

    def close(self) -> None:
        """Stop the pod watch, close the pod-resources channel and shut NVML down; once."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            source = self._pod_metadata
        if source is not None:
            _call(source, "close")
        self.pod_resources.close()
        self.nvml.close()

    def __enter__(self) -> NodeResources:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _call(source: object, method: str) -> None:
    """``start`` / ``close`` of a source that has one (a fixed pod list has neither)."""
    function = getattr(source, method, None)
    if callable(function):
        function()


def real_node_resources(paths: HostPaths, node_name: str, *, nvml_collected: bool = True) -> NodeResources:
    """This node's resources: real NVML, the kubelet's pod-resources socket, the pods the API
    server lists for ``node_name``."""
    return NodeResources(
        paths,
        nvml=PynvmlBackend(),
        pod_resources=PodResourcesClient(paths.pod_resources),
        pod_metadata=lambda: KubePodCache(node_name),
        nvml_collected=nvml_collected,
        kube=KubeNode(node_name),
    )

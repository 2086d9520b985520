"""One exporter node with the lifecycle hooks, for tests and the benchmark: the simulator's RDMA
ports and pod-log layout in a folder, the real NCCL and lifecycle collectors running as ``serve``
runs them (their ``run`` coroutines on an event loop of their own), the real ``KubePodCache`` and
``kubernetes`` client against the recorded API server (tests/kube_api.py)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ccl_sim.clock import cri_timestamp
from ccl_sim.paths import simulated_paths
from ccl_sim.podlogs import SimJob, nccl_init_lines
from ccl_sim.rdma import SimRdma
from exporter.collectors.lifecycle import LifecycleCollector, LifecycleCollectorSettings
from exporter.collectors.lifecycle import build as build_lifecycle
from exporter.collectors.nccl import NcclCollector, NcclLimits, NcclSettings
from exporter.collectors.nccl import build_collector as build_nccl
from exporter.lifecycle.controller import LifecycleSettings
from exporter.resources import HostPaths, KubeNode, NodeResources
from exporter.results.preflight_message import PREFLIGHT_CONTAINER
from exporter.sources.kube import FABRIC_READY_CONDITION, KubePodCache
from exporter.sources.podresources import PodResourcesClient
from tests.clocks import SkippingWallClock
from tests.kube_api import ApiState, RecordedApiServer, wait_for

NODE = "gpu-node-7"


class NoNvml:
    """No NVML here (the nvml collector is off): placement comes from the logs alone."""

    def close(self) -> None:
        pass


def api_pod(
    job: SimJob, gated: bool = True, started_at: float | None = None, preflight_message: str | None = None
) -> dict[str, Any]:
    """The pod as the API server lists it: on this node, kubelet's conditions, the gate when ``gated``;
    ``status.startTime`` (RFC 3339, whole seconds, as the API writes it) when ``started_at`` is given,
    and a ``ccl-preflight`` init container that ended with ``preflight_message``."""
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": job.pod,
            "namespace": job.namespace,
            "uid": job.uid,
            "labels": job.labels,
            "resourceVersion": "10",
        },
        "spec": {"nodeName": NODE, "containers": [{"name": "pytorch", "image": "train:1"}]},
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "ReadinessGatesNotReady"},
                {"type": "ContainersReady", "status": "True"},
            ],
        },
    }
    if gated:
        pod["spec"]["readinessGates"] = [{"conditionType": FABRIC_READY_CONDITION}]
    if started_at is not None:
        pod["status"]["startTime"] = rfc3339(started_at)
    if preflight_message is not None:
        pod["spec"]["initContainers"] = [{"name": PREFLIGHT_CONTAINER, "image": "ccl-health-exporter:0.1.0"}]
        pod["status"]["initContainerStatuses"] = [
            {
                "name": PREFLIGHT_CONTAINER,
                "image": "ccl-health-exporter:0.1.0",
                "imageID": "",
                "ready": True,
                "restartCount": 0,
                "started": False,
                "state": {
                    "terminated": {
                        "exitCode": 0 if preflight_message.split(" ")[1:2] == ["passed"] else 1,
                        "reason": "Completed",
                        "message": preflight_message,
                        "startedAt": rfc3339(time.time() - 60),
                        "finishedAt": rfc3339(time.time()),
                    }
                },
            }
        ]
    return pod


def rfc3339(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def write_nccl_log(paths: HostPaths, job: SimJob) -> float:
    """NCCL's init lines into the pod's CRI log, as the kubelet writes them; the monotonic time after."""
    folder = paths.pod_logs / f"{job.namespace}_{job.pod}_{job.uid}" / job.container
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{job.restarts}.log", "a") as handle:
        handle.write("".join(f"{cri_timestamp()} stdout F {line}\n" for line in nccl_init_lines(job)))
    return time.monotonic()


@dataclass
class LifecycleNode:
    paths: HostPaths
    rdma: SimRdma
    api: RecordedApiServer
    nccl: NcclCollector
    lifecycle: LifecycleCollector
    resources: NodeResources
    clock: SkippingWallClock
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _stopped: bool = field(default=False)

    @property
    def state(self) -> ApiState:
        return self.api.state

    def pod_condition(self, job: SimJob) -> dict[str, Any] | None:
        return self.state.condition(self.state.pod(job.namespace, job.pod), FABRIC_READY_CONDITION)

    def pod_patches(self, job: SimJob) -> list[Any]:
        return [w for w in self.state.writes("pods/status") if f"/pods/{job.pod}/" in w.path]

    def events(self, job: SimJob) -> list[dict[str, Any]]:
        return [
            e
            for (ns, _), e in list(self.state.events.items())
            if ns == job.namespace and e["involvedObject"]["name"] == job.pod
        ]

    def start(self) -> LifecycleNode:
        loop = asyncio.new_event_loop()

        async def main() -> None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(self.nccl.run(), self.lifecycle.run())

        self._loop = loop
        self._thread = threading.Thread(target=lambda: loop.run_until_complete(main()), daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._loop is not None and self._thread is not None:
            loop = self._loop

            def cancel() -> None:
                for task in asyncio.all_tasks(loop):
                    task.cancel()

            loop.call_soon_threadsafe(cancel)
            self._thread.join(timeout=10)
        self.resources.close()
        self.api.stop()


def lifecycle_node(
    root: Path,
    hooks: LifecycleSettings,
    node_object: dict[str, Any] | None = None,
    pods: tuple[dict[str, Any], ...] = (),
) -> LifecycleNode:
    """A started node whose pod list is synced (close it)."""
    paths = simulated_paths(root)
    rdma = SimRdma(rng=random.Random(3))
    rdma.setup(root)
    paths.pod_logs.mkdir(parents=True, exist_ok=True)
    state = ApiState(pods=[*pods], nodes={NODE: node_object or {"metadata": {"name": NODE}, "status": {}}})
    api = RecordedApiServer(state).start()
    clock = SkippingWallClock()
    resources = NodeResources(
        paths,
        nvml=NoNvml(),
        pod_resources=PodResourcesClient(root / "no-kubelet.sock"),  # type: ignore[arg-type]
        pod_metadata=lambda: KubePodCache(NODE, api_factory=api.api_factory(), watch_seconds=5),
        kube=KubeNode(NODE, api.api_factory()),
        nvml_collected=False,
        clock=clock,
    )
    nccl = build_nccl(NcclSettings(300.0, NcclLimits()), resources)
    lifecycle = build_lifecycle(LifecycleCollectorSettings(hooks), resources)
    resources.start()
    node = LifecycleNode(paths, rdma, api, nccl, lifecycle, resources, clock)
    if not wait_for(resources.pod_metadata.is_authoritative):
        node.close()
        raise TimeoutError("the pod list did not sync from the recorded API")
    return node.start()

"""The idle-time probe scheduler: skips while GPUs are held, runs real gloo probes when idle.

Occupancy comes from a real kubelet pod-resources gRPC server on a unix socket
(``tests/podresources_server.py``). NVML compute processes are answered by a small backend
object here: the fake libnvidia-ml that exercises the real NVML binding is covered by the
NVML tests, and ``NvmlOccupancy`` only reads ``compute_processes()``.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from exporter.collectors import all_collectors
from exporter.collectors.probe import ProbeCollector, probe_settings
from exporter.commands import build_parser
from exporter.commands.serve import config_from_args
from exporter.probe.occupancy import NvmlOccupancy, PodResourcesOccupancy
from exporter.probe.schedule import ProbeScheduler, ProbeSettings
from exporter.sources.nvml import GpuProcess, NvmlUnavailable
from exporter.sources.podresources import PodResourcesClient
from tests.podresources_server import Container, Pod, TableLister, serve_pod_resources

GPU = "GPU-8f6c1f5e-0000-4000-8000-000000000001"
TRAINING_POD = Pod("team-a", "llama-worker-0", [Container("trainer", {"nvidia.com/gpu": [GPU]})])
SMALL = {"backend": "gloo", "nprocs": 2, "min_bytes": "64K", "max_bytes": "256K", "iters": 3, "warmup_iters": 1}


def scheduler(tmp_path: Path, checks: list, timeout: float = 60.0, **settings: object) -> ProbeScheduler:  # type: ignore[type-arg]
    merged = {**SMALL, **settings}
    return ProbeScheduler(
        ProbeSettings(interval_seconds=3600, timeout_seconds=timeout, **merged),  # type: ignore[arg-type]
        tmp_path / "results",
        checks,
        poll_seconds=0.2,
    )


def short_socket(tmp_path: Path) -> Path:
    return tmp_path / "kubelet.sock"


async def test_skipped_while_a_pod_holds_a_gpu_then_runs_when_released(tmp_path: Path) -> None:
    sock = short_socket(tmp_path)
    with serve_pod_resources(sock, TableLister([TRAINING_POD])) as lister:
        client = PodResourcesClient(sock)
        sched = scheduler(tmp_path, [PodResourcesOccupancy(client)])
        assert await sched.run_once() == "skipped:gpu_held_by_pod"
        assert sched.state.skipped == {"gpu_held_by_pod": 1}
        assert "team-a/llama-worker-0" in sched.state.last_message
        assert not (tmp_path / "results").exists()

        lister.pods = []
        assert await sched.run_once() == "success"
        client.close()
    document = json.loads((tmp_path / "results" / "scheduled.json").read_text())
    assert document["source"] == "scheduled"
    assert document["transport"]["name"] == "gloo/tcp"
    assert [r["size_bytes"] for r in document["collectives"][0]["rows"]] == [65536, 131072, 262144]
    families = {f.name: f for f in ProbeCollector(tmp_path / "results", 3600, sched).collect()}
    assert {s.labels["reason"]: s.value for s in families["ccl_probe_skipped"].samples if s.name.endswith("_total")}[
        "gpu_held_by_pod"
    ] == 1.0
    assert [s.value for s in families["ccl_probe_success"].samples] == [1.0]
    assert len(families["ccl_probe_bus_bandwidth_bytes_per_second"].samples) == 3


async def test_unreachable_kubelet_means_no_probe(tmp_path: Path) -> None:
    sched = scheduler(tmp_path, [PodResourcesOccupancy(PodResourcesClient(tmp_path / "absent.sock"))])
    assert await sched.run_once() == "skipped:occupancy_unknown"
    assert "no kubelet pod-resources socket" in sched.state.last_message


class ProcessTable:
    """compute_processes() as NVML answers it: GPU UUID -> processes (or no NVML at all)."""

    def __init__(self, processes: dict[str, list[GpuProcess]] | None) -> None:
        self.processes = processes

    def compute_processes(self) -> dict[str, list[GpuProcess]]:
        if self.processes is None:
            raise NvmlUnavailable("no NVML on this node")
        return self.processes


def test_nvml_compute_processes_mean_busy() -> None:
    busy = NvmlOccupancy(ProcessTable({GPU: [GpuProcess(4242, 2 << 30)], "GPU-idle": []}))  # type: ignore[arg-type]
    assert busy.busy_reason() == f"1 GPU(s) run compute processes: {GPU} (pids 4242)"
    assert NvmlOccupancy(ProcessTable({GPU: []})).busy_reason() is None  # type: ignore[arg-type]
    assert NvmlOccupancy(ProcessTable(None)).busy_reason() is None  # type: ignore[arg-type]


async def test_a_job_arriving_preempts_the_probe(tmp_path: Path) -> None:
    sock = short_socket(tmp_path)
    with serve_pod_resources(sock, TableLister([])) as lister:
        client = PodResourcesClient(sock)
        sched = scheduler(tmp_path, [PodResourcesOccupancy(client)], min_bytes="4M", max_bytes="4M", iters=10_000)
        loop = asyncio.get_running_loop()
        loop.call_later(1.0, lambda: setattr(lister, "pods", [TRAINING_POD]))
        t0 = time.monotonic()
        assert await sched.run_once() == "preempted"
        assert time.monotonic() - t0 < 20
        assert sched.state.runs == {"preempted": 1}
        assert sched.state.skipped == {"gpu_held_by_pod": 1}
        assert not sched.state.running
        client.close()
    assert not (tmp_path / "results" / "scheduled.json").exists()  # a preempted probe is no verdict


async def test_a_probe_that_overruns_is_killed_and_reported_failed(tmp_path: Path) -> None:
    sched = scheduler(tmp_path, [], timeout=4.0, min_bytes="4M", max_bytes="4M", iters=100_000)
    assert await sched.run_once() == "failure"
    document = json.loads((tmp_path / "results" / "scheduled.json").read_text())
    assert document["error"] == "probe timed out after 2s"
    families = {f.name: f for f in ProbeCollector(tmp_path / "results", 3600, sched).collect()}
    assert [s.value for s in families["ccl_probe_success"].samples] == [0.0]


async def test_never_two_probes_at_once(tmp_path: Path) -> None:
    sched = scheduler(tmp_path, [], timeout=4.0, min_bytes="4M", max_bytes="4M", iters=100_000)
    first = asyncio.create_task(sched.run_once())
    await asyncio.sleep(0.3)
    assert sched.state.running
    assert await sched.run_once() == "skipped:probe_running"
    assert await first == "failure"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--probe.collectives", "reduce"], "collectives 'reduce'"),
        (["--probe.min-bytes", "2X"], "size '2X'"),
        (["--probe.min-bytes", "8M", "--probe.max-bytes", "1M"], "need 1 <= min"),
        (["--probe.iters", "0"], "interval, timeout and iterations must be positive"),
    ],
)
def test_bad_probe_flags_stop_serve_at_start(flags: list[str], message: str) -> None:
    args = build_parser({}).parse_args(["serve", "--probe.interval", "60", *flags])
    with pytest.raises(SystemExit, match=f"^ccl-exporter: --probe.\\*: {message}"):
        config_from_args(args, all_collectors())
    assert (
        probe_settings(config_from_args(build_parser({}).parse_args(["serve"]), all_collectors()).collector_settings)
        is None
    )

"""The simulated GPUs of ``python -m ccl_sim serve``: NVLink traffic following the job, and the
pod-resources API served over a real gRPC unix socket from the simulated pod ↔ GPU table."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ccl_sim.node import SimulatedNode, default_node
from ccl_sim.nvml import TRAINING_POD, sim_gpu_uuid
from exporter.collectors.nvml import NvmlCollector, NvmlSettings
from exporter.collectors.podresources import PodResourcesCollector
from exporter.sources.nvml import busy_gpus
from exporter.sources.podresources import PodResourcesClient, gpus_held_by_pods
from tests.collectors.test_nvml import promtool_check, samples, series, value
from tests.conftest import ExporterProcess


@pytest.fixture
def node() -> Iterator[SimulatedNode]:
    with tempfile.TemporaryDirectory(prefix="sim-", dir="/tmp") as folder:  # short unix socket path
        sim = default_node(Path(folder))
        sim.setup()
        try:
            yield sim
        finally:
            sim.close()


def transmitted(node: SimulatedNode) -> int:
    assert node.nvml is not None
    return sum(link.transmit_bytes or 0 for gpu in node.nvml.read().gpus for link in gpu.links)


def test_nvlink_traffic_follows_the_job_and_stops_when_gpus_are_released(node: SimulatedNode) -> None:
    assert node.nvml is not None
    node.advance(1.0)
    reading = node.nvml.read()
    assert len(reading.gpus) == 8 and all(len(g.links) == 18 for g in reading.gpus)
    before = transmitted(node)
    node.advance(1.0)
    after = transmitted(node)
    # 144 links at 26.562 GB/s x job activity (0.6..1.0) x 0.8..0.95 for one second
    assert 144 * 26.562e9 * 0.6 * 0.8 * 0.99 <= after - before <= 144 * 26.562e9
    assert set(busy_gpus(node.nvml) or {}) == {sim_gpu_uuid(i) for i in range(8)}

    node.nvml.release()
    node.advance(1.0)
    assert transmitted(node) == after
    assert busy_gpus(node.nvml) == {}

    families = {f.name: f for f in NvmlCollector(node.nvml, NvmlSettings(per_link=True)).collect()}
    assert len(families["ccl_gpu_info"].samples) == 8
    assert len(families["ccl_nvlink_state"].samples) == 144
    assert {s.labels["error"] for s in families["ccl_nvlink_errors"].samples} == {
        "crc_flit",
        "crc_data",
        "replay",
        "recovery",
    }


def test_pod_resources_served_over_grpc_follow_assign_and_release(node: SimulatedNode) -> None:
    assert node.nvml is not None
    sock = node.root / "pod-resources" / "kubelet.sock"
    client = PodResourcesClient(sock)
    try:
        held = client.list_gpus()
        assert sorted(a.device_id for a in held) == [sim_gpu_uuid(i) for i in range(8)]
        assert {a.pod for a in held} == {TRAINING_POD}

        node.nvml.release()
        assert client.list_gpus() == []
        assert gpus_held_by_pods(sock) == set()

        node.nvml.assign("team-b", "bert-0", "main", [sim_gpu_uuid(2), sim_gpu_uuid(5)])
        family = PodResourcesCollector(client, node.nvml).family(client.list_gpus(), {sim_gpu_uuid(2): "2"})
        assert sorted((s.labels["gpu"], s.labels["pod"], s.labels["container"]) for s in family.samples) == [
            ("", "bert-0", "main"),
            ("2", "bert-0", "main"),
        ]
        with pytest.raises(KeyError):
            node.nvml.assign("x", "y", "z", ["GPU-nope"])
    finally:
        client.close()


def test_simulate_serves_nvlink_and_pod_metrics(exporter_process: type[ExporterProcess]) -> None:
    # only our collectors: promtool's lint is about this part's metrics
    proc = exporter_process(
        "--collector.disable-defaults",
        "--collector.nvml",
        "--collector.podresources",
        "--collector.nvml.nvlink-granularity=link",
        simulated=True,
    )
    body = proc.metrics()
    promtool_check(body)
    m = samples(body)
    assert value(m, "ccl_exporter_collector_success", collector="nvml") == 1.0
    assert value(m, "ccl_exporter_collector_success", collector="podresources") == 1.0
    assert len(series(m, "ccl_nvlink_transmit_bytes_total")) == 144
    assert value(m, "ccl_nvlink_speed_bytes_per_second", gpu="0", link="0") == 26_562_000_000
    pods = series(m, "ccl_gpu_pod_info")
    assert sorted(p["gpu"] for p in pods) == [str(i) for i in range(8)]
    assert {p["pod"] for p in pods} == {TRAINING_POD}

"""GPU → pod attribution over a real gRPC exchange with a pod-resources server on a unix socket.

The kubelet itself cannot run here; the server in tests/podresources_server.py speaks the same
v1 protocol (generated from the same api.proto) on a unix socket, as the kubelet does.
"""

from __future__ import annotations

import ctypes.util
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from exporter.sources.podresources import (
    PodResourcesClient,
    PodResourcesError,
    PodResourcesUnavailable,
    gpus_held_by_pods,
)
from exporter.sources.rdma_bindings import RdmaBinding
from tests.collectors.test_nvml import promtool_check, samples, series, uuid
from tests.conftest import ExporterProcess, http_get, require_tool
from tests.fakenvml import build_fake_nvml, fake_nvml_env
from tests.podresources_server import Container, Pod, TableLister, serve_pod_resources

MIG = "MIG-5c6a2b1e-0000-4000-8000-000000000001"
PODS = [
    Pod(
        "ml-training",
        "llama-worker-0",
        [
            Container("trainer", {"nvidia.com/gpu": [uuid(0), uuid(1)], "example.com/nic": ["mlx5_0"]}, cpu_ids=[1, 2]),
            Container("sidecar", {}),
        ],
    ),
    Pod(
        "ml-training",
        "llama-worker-1",
        [Container("trainer", {"nvidia.com/gpu.shared": [f"{uuid(2)}::0", f"{uuid(2)}::3"]})],
    ),
    Pod("inference", "llm-0", [Container("server", {"nvidia.com/mig-1g.18gb": [MIG]})]),
    Pod("kube-system", "coredns-1", [Container("coredns", {})]),
]
EXPECTED = [
    {
        "gpu": "0",
        "uuid": uuid(0),
        "namespace": "ml-training",
        "pod": "llama-worker-0",
        "container": "trainer",
        "resource": "nvidia.com/gpu",
        "job_name": "",
        "job_kind": "",
        "host_network": "",
        "source": "device_plugin",
    },
    {
        "gpu": "1",
        "uuid": uuid(1),
        "namespace": "ml-training",
        "pod": "llama-worker-0",
        "container": "trainer",
        "resource": "nvidia.com/gpu",
        "job_name": "",
        "job_kind": "",
        "host_network": "",
        "source": "device_plugin",
    },
    {
        "gpu": "2",
        "uuid": uuid(2),
        "namespace": "ml-training",
        "pod": "llama-worker-1",
        "container": "trainer",
        "resource": "nvidia.com/gpu.shared",
        "job_name": "",
        "job_kind": "",
        "host_network": "",
        "source": "device_plugin",
    },
    {
        "gpu": "",
        "uuid": MIG,
        "namespace": "inference",
        "pod": "llm-0",
        "container": "server",
        "resource": "nvidia.com/mig-1g.18gb",
        "job_name": "",
        "job_kind": "",
        "host_network": "",
        "source": "device_plugin",
    },
]


def by_uuid(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    return sorted(rows, key=lambda r: r["uuid"])


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # unix socket paths are limited to 108 bytes: keep it short
    with tempfile.TemporaryDirectory(prefix="podres-", dir="/tmp") as folder:
        yield Path(folder)


@pytest.fixture(scope="module")
def fake_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fake_nvml(require_tool("gcc"), tmp_path_factory.mktemp("fakenvml"))


def test_client_lists_gpu_assignments_only(socket_dir: Path) -> None:
    sock = socket_dir / "kubelet.sock"
    with serve_pod_resources(sock, TableLister(PODS)) as lister:
        client = PodResourcesClient(sock)
        got = client.list_gpus()
        client.close()
        assert lister.calls == 1
        assert [(a.device_id, a.pod, a.container, a.resource) for a in got] == [
            (uuid(0), "llama-worker-0", "trainer", "nvidia.com/gpu"),
            (uuid(1), "llama-worker-0", "trainer", "nvidia.com/gpu"),
            (uuid(2), "llama-worker-1", "trainer", "nvidia.com/gpu.shared"),
            (MIG, "llm-0", "server", "nvidia.com/mig-1g.18gb"),
        ]
        assert gpus_held_by_pods(sock) == {uuid(0), uuid(1), uuid(2), MIG}


def test_client_errors_are_typed(socket_dir: Path) -> None:
    sock = socket_dir / "kubelet.sock"
    with pytest.raises(PodResourcesUnavailable):
        PodResourcesClient(sock).list_gpus()
    assert gpus_held_by_pods(sock) is None
    with serve_pod_resources(sock, TableLister(PODS, fail_with=grpc.StatusCode.UNAVAILABLE)):
        with pytest.raises(PodResourcesError, match="UNAVAILABLE"):
            PodResourcesClient(sock, timeout_seconds=2).list_gpus()
        assert gpus_held_by_pods(sock) is None


def test_pod_info_joined_to_nvml_gpu_index(
    fake_lib: Path, socket_dir: Path, exporter_process: type[ExporterProcess]
) -> None:
    sock = socket_dir / "kubelet.sock"
    with serve_pod_resources(sock, TableLister(PODS)):
        proc = exporter_process(
            "--collector.disable-defaults",
            "--collector.nvml",
            "--collector.podresources",
            "--path.pod-resources",
            str(sock),
            env=fake_nvml_env(fake_lib),
        )
        body = proc.metrics()
        promtool_check(body)
        m = samples(body)
        assert by_uuid(series(m, "ccl_gpu_pod_info")) == by_uuid(EXPECTED)
        assert all(v == 1.0 for (name, _), v in m.items() if name == "ccl_gpu_pod_info")
        assert series(m, "ccl_exporter_collector_success", collector="podresources") == [{"collector": "podresources"}]
        assert m[("ccl_exporter_collector_success", frozenset({("collector", "podresources")}))] == 1.0


def test_pod_info_without_nvml_has_empty_gpu(socket_dir: Path, exporter_process: type[ExporterProcess]) -> None:
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("a real libnvidia-ml is installed on this machine")
    sock = socket_dir / "kubelet.sock"
    with serve_pod_resources(sock, TableLister(PODS)):
        proc = exporter_process(
            "--collector.disable-defaults",
            "--collector.nvml",
            "--collector.podresources",
            "--path.pod-resources",
            str(sock),
            env={"LD_LIBRARY_PATH": str(socket_dir)},
        )
        m = samples(proc.metrics())
        assert by_uuid(series(m, "ccl_gpu_pod_info")) == by_uuid([{**row, "gpu": ""} for row in EXPECTED])


def test_absent_socket_and_failing_kubelet_never_fail_the_scrape(
    socket_dir: Path, exporter_process: type[ExporterProcess]
) -> None:
    sock = socket_dir / "kubelet.sock"
    proc = exporter_process(
        "--collector.disable-defaults", "--collector.podresources", "--path.pod-resources", str(sock)
    )
    for _ in range(3):
        status, body, _ = http_get(proc.url + "/metrics")
        assert status == 200
    m = samples(body)
    assert m[("ccl_exporter_collector_success", frozenset({("collector", "podresources")}))] == 0.0
    assert series(m, "ccl_gpu_pod_info") == []
    with serve_pod_resources(sock, TableLister(PODS, fail_with=grpc.StatusCode.PERMISSION_DENIED)):
        status, body, _ = http_get(proc.url + "/metrics")
        assert status == 200 and "ccl_gpu_pod_info{" not in body
    output = proc.stop()
    assert output.count("collector podresources unavailable") == 1, output
    assert "PERMISSION_DENIED" in output


def test_gpu_pod_info_names_the_training_job() -> None:
    """ccl_gpu_pod_info carries job_name/job_kind from the shared pod-metadata source."""
    from exporter.collectors.podresources import PodResourcesCollector
    from exporter.sources.kube import PodMetadata
    from exporter.sources.podresources import GpuAssignment

    class Known:
        def lookup(self, namespace: str, pod: str) -> PodMetadata | None:
            if (namespace, pod) == ("ml", "llama-worker-0"):
                return PodMetadata("ml", "llama-worker-0", "uid-1", "llama", "PyTorchJob", host_network=False)
            if (namespace, pod) == ("ml", "mpi-launcher-0"):
                return PodMetadata("ml", "mpi-launcher-0", "uid-2", "mpi", "MPIJob", host_network=True)
            return None

        def is_authoritative(self) -> bool:
            return True

    assignments = [
        GpuAssignment(
            namespace="ml", pod="llama-worker-0", container="trainer", resource="nvidia.com/gpu", device_id="GPU-a"
        ),
        GpuAssignment(namespace="ml", pod="unknown-0", container="c", resource="nvidia.com/gpu", device_id="GPU-b"),
        GpuAssignment(
            namespace="ml", pod="mpi-launcher-0", container="c", resource="nvidia.com/gpu", device_id="GPU-c"
        ),
    ]
    family = PodResourcesCollector.family(assignments, {"GPU-a": "0"}, Known())
    labels = sorted(
        (s.labels["pod"], s.labels["job_name"], s.labels["job_kind"], s.labels["gpu"], s.labels["host_network"])
        for s in family.samples
    )
    # host_network tells the rules that cAdvisor's network counters of that pod are the host's.
    assert labels == [
        ("llama-worker-0", "llama", "PyTorchJob", "0", "false"),
        ("mpi-launcher-0", "mpi", "MPIJob", "", "true"),
        ("unknown-0", "", "", "", ""),
    ]


def test_per_pod_counts_summarise_the_per_device_series() -> None:
    """ccl_gpu_pod_gpus counts a pod's whole GPUs once each (two containers sharing none, a GPU listed
    twice), not its MIG instances or DRA MIG devices, and exists for a MIG-only pod with 0;
    ccl_pod_rdma_devices counts distinct NICs."""
    from exporter.collectors.podresources import PodResourcesCollector
    from exporter.sources.podresources import GpuAssignment

    assignments = [
        GpuAssignment(namespace="ml", pod="w-0", container="a", resource="nvidia.com/gpu", device_id="GPU-a"),
        GpuAssignment(namespace="ml", pod="w-0", container="b", resource="nvidia.com/gpu", device_id="GPU-b"),
        GpuAssignment(namespace="ml", pod="w-0", container="b", resource="nvidia.com/gpu", device_id="GPU-b"),
        GpuAssignment(namespace="ml", pod="mig-0", container="c", resource="nvidia.com/mig-1g.18gb", device_id="MIG-1"),
        GpuAssignment(namespace="ml", pod="mig-0", container="c", resource="gpu.nvidia.com", device_id="gpu-0-mig-1g"),
    ]
    info = PodResourcesCollector.family(assignments, {})
    gpus = PodResourcesCollector.pod_gpus_family(info)
    assert sorted((s.labels["pod"], s.value) for s in gpus.samples) == [("mig-0", 0.0), ("w-0", 2.0)]
    bindings = [
        RdmaBinding("ml", "w-0", "mlx5_0", "device_plugin", "nvidia.com/hostdev"),
        RdmaBinding("ml", "w-0", "mlx5_1", "multus", "ml/rail-1"),
        RdmaBinding("ml", "w-0", "mlx5_1", "device_plugin", "nvidia.com/hostdev"),
    ]
    rdma = PodResourcesCollector.rdma_families(bindings, 0)
    devices = PodResourcesCollector.pod_rdma_devices_family(rdma[0])
    assert [(s.labels["pod"], s.value) for s in devices.samples] == [("w-0", 2.0)]
    assert PodResourcesCollector.pod_rdma_devices_family(PodResourcesCollector.rdma_families([], 0)[0]).samples == []


def test_dra_gpus_are_attributed_like_device_plugin_ones(
    fake_lib: Path, socket_dir: Path, exporter_process: type[ExporterProcess]
) -> None:
    """NVIDIA's DRA driver names a GPU gpu-<minor>; the real pynvml on the fake library finds its UUID and
    index by the minor number (which the fake numbers backwards: minor 6 is NVML index 1 of 8)."""
    from tests.podresources_server import Claim, ClaimDevice

    pods = [
        Pod(
            "ml",
            "dra-worker-0",
            [
                Container(
                    "trainer",
                    claims=[
                        Claim(
                            "ml",
                            "gpus",
                            [ClaimDevice("gpu.nvidia.com", "node-1", "gpu-6", ["k8s.gpu.nvidia.com/device=gpu-6"])],
                        ),
                    ],
                )
            ],
        )
    ]
    sock = socket_dir / "kubelet.sock"
    with serve_pod_resources(sock, TableLister(pods)):
        proc = exporter_process(
            "--collector.disable-defaults",
            "--collector.nvml",
            "--collector.podresources",
            "--path.pod-resources",
            str(sock),
            env=fake_nvml_env(fake_lib),
        )
        body = proc.metrics()
        promtool_check(body)
        assert series(samples(body), "ccl_gpu_pod_info") == [
            {
                "gpu": "1",
                "uuid": uuid(1),
                "namespace": "ml",
                "pod": "dra-worker-0",
                "container": "trainer",
                "resource": "gpu.nvidia.com",
                "job_name": "",
                "job_kind": "",
                "host_network": "",
                "source": "dra",
            },
        ]

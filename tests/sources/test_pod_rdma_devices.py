"""Which RDMA NICs (and DRA GPUs) each pod was given: a real gRPC pod-resources exchange with
device-plugin and Dynamic Resource Allocation assignments, and a Multus network-status annotation,
resolved through a sysfs tree of the HGX layout."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from ccl_sim.topology import INFINIBAND_CLASS, PciFunction, PciTreeWriter, SimTopology
from exporter.collectors.base import CollectorUnavailable
from exporter.collectors.podresources import PodResourcesCollector, settings_from_args
from exporter.sources.kube import PodMetadata, pod_metadata_from_object
from exporter.sources.multus import NETWORK_STATUS_ANNOTATION, OLD_NETWORK_STATUS_ANNOTATION, attached_devices
from exporter.sources.nvml import GpuIdentity
from exporter.sources.podresources import PodResourcesClient, gpus_held_by_pods
from exporter.sources.rdma_bindings import RdmaResources, parse_pools
from exporter.sources.topology import TopologySource
from tests.metrics_text import samples
from tests.podresources_server import Claim, ClaimDevice, Container, Pod, TableLister, serve_pod_resources

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "multus_network_status.json"


def uuid(i: int) -> str:
    return f"GPU-{i}"


class Nvml:
    """GPUs whose /dev/nvidia minor numbers run backwards against their NVML index."""

    def gpus(self) -> list[GpuIdentity]:
        return [GpuIdentity(i, uuid(i), "NVIDIA H200", "", minor=7 - i) for i in range(8)]


class Pods:
    def __init__(self, records: list[PodMetadata]) -> None:
        self.records = records

    def lookup(self, namespace: str, pod: str) -> PodMetadata | None:
        return next((p for p in self.records if (p.namespace, p.name) == (namespace, pod)), None)

    def is_authoritative(self) -> bool:
        return True

    def pods(self) -> list[PodMetadata]:
        return self.records


def hgx_with_vfs(root: Path) -> Path:
    """The simulated HGX tree plus an SR-IOV VF of mlx5_0 (mlx5_10) and of mlx5_1 (mlx5_11)."""
    SimTopology().setup(root)
    sysfs = root / "sys"
    tree = PciTreeWriter(sysfs)
    for device, bus, vf in (("mlx5_10", 0x18, "0000:19:00.2"), ("mlx5_11", 0x2A, "0000:2b:00.3")):
        chain = [
            PciFunction(f"0000:{bus - 3:02x}:01.0"),
            PciFunction(f"0000:{bus - 2:02x}:00.0"),
            PciFunction(f"0000:{bus - 1:02x}:01.0"),
            PciFunction(vf, INFINIBAND_CLASS),
        ]
        folder = tree.add(f"pci0000:{bus - 3:02x}", chain, 0)
        os.symlink(f"../0000:{bus + 1:02x}:00.0", folder / "physfn")
        tree.link_rdma(device, folder)
    return sysfs


PODS = [
    Pod(
        "ml",
        "sriov-worker-0",
        [
            Container(
                "trainer",
                {
                    "nvidia.com/gpu": [uuid(0), uuid(1)],
                    "intel.com/sriov_rdma": ["0000:19:00.2"],
                    "example.com/fpga": ["0000:19:00.2"],
                },
            ),
        ],
    ),
    Pod("ml", "shared-worker-0", [Container("trainer", {"rdma/hca_shared_devices_a": ["0", "1"]})]),
    Pod(
        "ml",
        "dra-worker-0",
        [
            Container(
                "trainer",
                claims=[
                    Claim(
                        "ml",
                        "dra-worker-0-gpus",
                        [
                            ClaimDevice("gpu.nvidia.com", "node-1", "gpu-7", ["k8s.gpu.nvidia.com/device=gpu-7"]),
                            ClaimDevice(
                                "gpu.nvidia.com",
                                "node-1",
                                "gpu-0-mig-9-0-1",
                                ["k8s.gpu.nvidia.com/device=gpu-0-mig-9-0-1"],
                            ),
                        ],
                    ),
                    Claim(
                        "ml",
                        "dra-worker-0-nics",
                        [
                            ClaimDevice("dra.net", "node-1", "pci-0000-2b-00-0"),  # mlx5_1 by its PCI address
                            ClaimDevice(
                                "sriovnetwork.example.com", "node-1", "vf-3", ["sriov.example.com/vf=0000:19:00.2"]
                            ),
                            ClaimDevice("cpu.example.com", "node-1", "cpu-0"),  # not a NIC: no binding, not unresolved
                        ],
                    ),
                ],
            ),
        ],
    ),
    Pod("kube-system", "coredns-1", [Container("coredns", {})]),
]


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="podres-", dir="/tmp") as folder:
        yield Path(folder)


def multus_pod() -> PodMetadata:
    record = pod_metadata_from_object(
        {
            "metadata": {
                "namespace": "ml",
                "name": "multus-worker-0",
                "uid": "u-1",
                "labels": {"training.kubeflow.org/job-name": "llama"},
                "annotations": {NETWORK_STATUS_ANNOTATION: FIXTURE.read_text()},
            },
            "spec": {},
        }
    )
    assert record is not None
    return record


def scrape(collector: PodResourcesCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(collector)
    return samples(generate_latest(registry).decode())


def rows(found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str) -> list[dict[str, str]]:
    return sorted((dict(labels) for (n, labels) in found if n == name), key=lambda d: sorted(d.items()))


def test_device_plugin_dra_and_multus_nics_over_a_real_grpc_exchange(socket_dir: Path, tmp_path: Path) -> None:
    sock = socket_dir / "kubelet.sock"
    topology = TopologySource(hgx_with_vfs(tmp_path), Nvml())
    pods = Pods([multus_pod()])
    resources = RdmaResources(pools=parse_pools("rdma/hca_shared_devices_a=mlx5_2+mlx5_3+mlx5_99"))
    with serve_pod_resources(sock, TableLister(PODS)):
        client = PodResourcesClient(sock)
        collector = PodResourcesCollector(client, Nvml(), pods, topology, resources)  # type: ignore[arg-type]
        found = scrape(collector)
        client.close()
    nics = [(r["pod"], r["device"], r["source"], r["resource"]) for r in rows(found, "ccl_pod_rdma_device_info")]
    assert sorted(nics) == sorted(
        [
            ("sriov-worker-0", "mlx5_10", "device_plugin", "intel.com/sriov_rdma"),  # a VF, by PCI address
            ("shared-worker-0", "mlx5_2", "device_plugin", "rdma/hca_shared_devices_a"),  # the named pool
            ("shared-worker-0", "mlx5_3", "device_plugin", "rdma/hca_shared_devices_a"),
            ("dra-worker-0", "mlx5_1", "dra", "dra.net"),
            ("dra-worker-0", "mlx5_10", "dra", "sriovnetwork.example.com"),  # through its CDI device name
            ("multus-worker-0", "mlx5_11", "multus", "ml/rdma-rail-1"),  # by rdma-device
            ("multus-worker-0", "mlx5_2", "multus", "ml/rdma-rail-2"),  # by pci-address alone
        ]
    )
    assert {r["job_name"] for r in rows(found, "ccl_pod_rdma_device_info") if r["pod"] == "multus-worker-0"} == {
        "llama"
    }
    assert found[("ccl_pod_rdma_devices_unresolved", ())] == 0.0
    gpus = [(r["pod"], r["gpu"], r["uuid"], r["resource"], r["source"]) for r in rows(found, "ccl_gpu_pod_info")]
    assert sorted(gpus) == sorted(
        [
            ("sriov-worker-0", "0", uuid(0), "nvidia.com/gpu", "device_plugin"),
            ("sriov-worker-0", "1", uuid(1), "nvidia.com/gpu", "device_plugin"),
            ("dra-worker-0", "0", uuid(0), "gpu.nvidia.com", "dra"),  # gpu-7 is minor 7: NVML index 0
            ("dra-worker-0", "", "gpu-0-mig-9-0-1", "gpu.nvidia.com", "dra"),  # a MIG device NVML cannot name here
        ]
    )


def test_dra_gpus_make_the_node_busy_for_the_probe(socket_dir: Path) -> None:
    sock = socket_dir / "kubelet.sock"
    only_dra = [p for p in PODS if p.name == "dra-worker-0"]
    with serve_pod_resources(sock, TableLister(only_dra)):
        assert gpus_held_by_pods(sock) == {"gpu-7", "gpu-0-mig-9-0-1"}


def test_an_unnamed_shared_pool_is_counted_unresolved_not_guessed(socket_dir: Path, tmp_path: Path) -> None:
    sock = socket_dir / "kubelet.sock"
    topology = TopologySource(hgx_with_vfs(tmp_path), Nvml())
    with serve_pod_resources(sock, TableLister(PODS)):
        client = PodResourcesClient(sock)
        found = scrape(PodResourcesCollector(client, Nvml(), Pods([]), topology))  # type: ignore[arg-type]
        client.close()
    assert not [r for r in rows(found, "ccl_pod_rdma_device_info") if r["pod"] == "shared-worker-0"]
    assert found[("ccl_pod_rdma_devices_unresolved", ())] == 2.0


def test_multus_nics_are_shown_without_a_kubelet_socket(socket_dir: Path, tmp_path: Path) -> None:
    topology = TopologySource(hgx_with_vfs(tmp_path), Nvml())
    client = PodResourcesClient(socket_dir / "absent.sock")
    collector = PodResourcesCollector(client, Nvml(), Pods([multus_pod()]), topology)  # type: ignore[arg-type]
    families = []
    with pytest.raises(CollectorUnavailable):
        for family in collector.collect():
            families.append(family)
    nics = {s.labels["device"] for f in families if f.name == "ccl_pod_rdma_device_info" for s in f.samples}
    assert nics == {"mlx5_11", "mlx5_2"}


@pytest.mark.parametrize(
    "text",
    [
        "",
        "null",
        "{}",
        '{"name": "x"}',
        "[1, 2]",
        '[{"device-info": "pci"}]',
        '[{"device-info": {"pci": []}}]',
        "[" * 10000,
        '[{"name": "a", "device-info": {"pci": {}}}]',
        "x" * 100_000,
    ],
)
def test_malformed_network_status_is_ignored(text: str) -> None:
    assert attached_devices({NETWORK_STATUS_ANNOTATION: text}) == ()


def test_the_old_annotation_name_is_read_and_values_are_bounded() -> None:
    entry = '[{"name": "%s", "device-info": {"pci": {"rdma-device": "mlx5_0"}}}]' % ("n" * 1000)
    (device,) = attached_devices({OLD_NETWORK_STATUS_ANNOTATION: entry})
    assert device.rdma_device == "mlx5_0" and len(device.network) == 253
    many = "[" + ",".join(['{"device-info": {"pci": {"rdma-device": "mlx5_0"}}}'] * 500) + "]"
    assert len(attached_devices({NETWORK_STATUS_ANNOTATION: many})) == 64


def test_rdma_resource_flags() -> None:
    class Args:
        podresources_rdma_resources = "rdma/, nvidia.com/hostdev"
        podresources_rdma_shared_devices = "rdma/a=mlx5_0+mlx5_1"

    settings = settings_from_args(Args())  # type: ignore[arg-type]
    assert settings.rdma_resources.matches("rdma/hca_shared_devices_a")
    assert settings.rdma_resources.matches("nvidia.com/hostdev")
    assert not settings.rdma_resources.matches("nvidia.com/hostdevx") and not settings.rdma_resources.matches(
        "intel.com/x"
    )
    assert settings.rdma_resources.pools == {"rdma/a": ("mlx5_0", "mlx5_1")}
    Args.podresources_rdma_shared_devices = "rdma/a"
    with pytest.raises(SystemExit, match="RESOURCE=device"):
        settings_from_args(Args())  # type: ignore[arg-type]


def exclusive_netns_tree(root: Path) -> Path:
    """The HGX tree with SR-IOV VFs whose RDMA devices moved into pods' network namespaces (``rdma
    system set netns exclusive``): each VF's PCI function stays on the host, with its ``physfn`` link
    to the PF (drivers/pci/iov.c), but no ``/sys/class/infiniband`` entry is left for it. One VF of
    mlx5_0 (``0000:19:00.4``) is still on the host, with its RDMA device mlx5_12."""
    SimTopology().setup(root)
    sysfs = root / "sys"
    tree = PciTreeWriter(sysfs)
    for bus, vf, on_host in (
        (0x18, "0000:19:00.2", None),
        (0x2A, "0000:2b:00.5", None),
        (0x18, "0000:19:00.4", "mlx5_12"),
    ):
        chain = [
            PciFunction(f"0000:{bus - 3:02x}:01.0"),
            PciFunction(f"0000:{bus - 2:02x}:00.0"),
            PciFunction(f"0000:{bus - 1:02x}:01.0"),
            PciFunction(vf, INFINIBAND_CLASS),
        ]
        folder = tree.add(f"pci0000:{bus - 3:02x}", chain, 0)
        os.symlink(f"../0000:{bus + 1:02x}:00.0", folder / "physfn")
        if on_host:
            tree.link_rdma(on_host, folder)
    return sysfs


def test_in_exclusive_netns_mode_a_vfs_pci_address_resolves_to_its_pf(tmp_path: Path) -> None:
    """sriov-network-device-plugin names the VF by PCI address; Multus's network-status gives the VF's
    address and RDMA device (device-info 1.0.0) and, from 1.1.0, the PF's address (the fields of
    ``PciDevice`` in k8snetworkplumbingwg/network-attachment-definition-client
    pkg/apis/k8s.cni.cncf.io/v1/types.go: pci-address, rdma-device, pf-pci-address). With the VF's
    RDMA device gone from the host, each resolves to the PF's RDMA device, not to nothing."""
    from exporter.sources.podresources import DeviceAssignment, PodResourcesListing
    from exporter.sources.rdma_bindings import rdma_bindings

    sysfs = exclusive_netns_tree(tmp_path)
    topology = TopologySource(sysfs, None).read()
    assert not topology.has_nic("mlx5_10") and topology.nics_at("0000:19:00.2") == ()
    assert topology.physical_function_of("0000:19:00.2") == "0000:19:00.0"

    pods = [
        PodMetadata(
            "ml",
            "multus-1-0",
            "u1",
            "job",
            "PyTorchJob",
            attached_devices=attached_devices(
                {
                    NETWORK_STATUS_ANNOTATION: json.dumps(
                        [
                            {
                                "name": "ml/rail-1",
                                "interface": "net1",
                                "device-info": {
                                    "type": "pci",
                                    "version": "1.0.0",
                                    "pci": {"pci-address": "0000:2b:00.5", "rdma-device": "mlx5_15"},
                                },
                            },
                        ]
                    )
                }
            ),
        ),
        PodMetadata(
            "ml",
            "multus-1-1",
            "u2",
            "job",
            "PyTorchJob",
            attached_devices=attached_devices(
                {
                    NETWORK_STATUS_ANNOTATION: json.dumps(
                        [
                            {
                                "name": "ml/rail-0",
                                "interface": "net1",
                                "device-info": {
                                    "type": "pci",
                                    "version": "1.1.0",
                                    "pci": {
                                        "pci-address": "0000:99:00.7",
                                        "rdma-device": "mlx5_20",
                                        "pf-pci-address": "0000:19:00.0",
                                    },
                                },
                            },
                        ]
                    )
                }
            ),
        ),
    ]
    listing = PodResourcesListing(
        devices=(
            DeviceAssignment("intel.com/sriov_rdma", "0000:19:00.2", "ml", "sriov-worker-0", "trainer"),
            DeviceAssignment("intel.com/sriov_rdma", "0000:19:00.4", "ml", "sriov-worker-1", "trainer"),
            DeviceAssignment("intel.com/sriov_rdma", "0000:77:00.2", "ml", "elsewhere-0", "trainer"),
        )
    )
    bindings, unresolved = rdma_bindings(listing, pods, topology, RdmaResources())
    assert [(b.pod, b.device, b.source) for b in bindings] == [
        ("multus-1-0", "mlx5_1", "multus"),  # VF 0000:2b:00.5 -> physfn -> PF 0000:2b:00.0
        ("multus-1-1", "mlx5_0", "multus"),  # a VF this tree does not have: the PF device-info names
        ("sriov-worker-0", "mlx5_0", "device_plugin"),  # VF 0000:19:00.2 -> physfn -> PF 0000:19:00.0
        ("sriov-worker-1", "mlx5_12", "device_plugin"),  # a VF still on the host keeps its own device
    ]
    assert unresolved == 1, "an address that is neither a PCI function with an RDMA device nor a VF of one"

"""``ccl_nccl_nic_affinity``: the NIC each GPU's NCCL traffic uses, joined with the node's topology,
on the simulated HGX node (one pod bound rail by rail, one with crossed rails)."""

from __future__ import annotations

from pathlib import Path

from ccl_sim.node import SimulatedNode, default_node
from ccl_sim.podlogs import SimJob, SimPodLogs, pytorchjob_labels
from exporter.collectors.nccl import NcclCollector
from exporter.collectors.nccl.nic_affinity import pod_nic_affinity
from exporter.nccl.nics import NicUse
from exporter.sources.kube import PodMetadata
from exporter.sources.podlogs import PodLogTailer
from exporter.sources.topology import GpuTopology, NicTopology, Topology, TopologySource
from tests.clocks import ManualClock
from tests.collectors.test_nccl_collector import START, samples


def sim(tmp_path: Path) -> tuple[SimulatedNode, SimPodLogs]:
    node = default_node(tmp_path / "sim")
    node.setup()
    node.advance(1.0)
    return node, next(p for p in node.parts if isinstance(p, SimPodLogs))


def collector_on(node: SimulatedNode, pods: SimPodLogs, metadata: object = None) -> NcclCollector:
    tailer = PodLogTailer(pods.pod_logs, node.root / "nccl", node.root / "state")
    topology = TopologySource(node.sysfs, node.nvml)
    return NcclCollector(tailer, node.sysfs, metadata or pods, clock=ManualClock(START), topology=topology)  # type: ignore[arg-type]


def affinity_rows(collector: NcclCollector) -> list[tuple[str, ...]]:
    keys = ("pod", "gpu", "device", "affinity", "gdr", "nearest_affinity")
    return sorted(
        tuple(dict(labels)[key] for key in keys)
        for (name, labels) in samples(collector)
        if name == "ccl_nccl_nic_affinity"
    )


def test_the_rail_aligned_pod_uses_pix_nics_and_the_crossed_pod_sys_ones(tmp_path: Path) -> None:
    node, pods = sim(tmp_path)
    collector = collector_on(node, pods)
    collector.step()
    assert affinity_rows(collector) == [
        ("gpt-neox-worker-0", "0", "mlx5_4", "SYS", "true", "PIX"),
        ("gpt-neox-worker-0", "7", "mlx5_3", "SYS", "true", "PIX"),
        ("llama-70b-worker-0", "0", "mlx5_0", "PIX", "true", "PIX"),
        ("llama-70b-worker-0", "7", "mlx5_7", "PIX", "true", "PIX"),
    ]
    job = {
        dict(labels)["pod"]: dict(labels)["job_name"]
        for (name, labels) in samples(collector)
        if name == "ccl_nccl_nic_affinity"
    }
    assert job == {"gpt-neox-worker-0": "gpt-neox", "llama-70b-worker-0": "llama-70b"}


def test_without_topology_no_affinity_is_claimed(tmp_path: Path) -> None:
    node, pods = sim(tmp_path)
    tailer = PodLogTailer(pods.pod_logs, node.root / "nccl", node.root / "state")
    collector = NcclCollector(tailer, node.sysfs, pods, clock=ManualClock(START))
    collector.step()
    assert affinity_rows(collector) == []


def test_a_gdr_less_restart_shows_gdr_false_on_the_same_nics(tmp_path: Path) -> None:
    node, pods = sim(tmp_path)
    collector = collector_on(node, pods)
    collector.step()
    pods.restart_job("ml-training", "llama-70b-worker-0", network="IB", gdr=False)
    collector.step()
    rows = [r for r in affinity_rows(collector) if r[0] == "llama-70b-worker-0"]
    assert rows == [
        ("llama-70b-worker-0", "0", "mlx5_0", "PIX", "false", "PIX"),
        ("llama-70b-worker-0", "7", "mlx5_7", "PIX", "false", "PIX"),
    ]


class WithHostNetwork:
    """The simulated pod list, with one pod on the host network."""

    def __init__(self, pods: SimPodLogs, host_network_pod: str) -> None:
        self._pods = pods
        self._name = host_network_pod

    def lookup(self, namespace: str, pod: str) -> PodMetadata | None:
        meta = self._pods.lookup(namespace, pod)
        if meta is not None and pod == self._name:
            return PodMetadata(meta.namespace, meta.name, meta.uid, meta.job_name, meta.job_kind, host_network=True)
        return meta

    def is_authoritative(self) -> bool:
        return True

    def pods(self) -> list[PodMetadata]:
        return self._pods.pods()


def test_only_the_pods_own_processes_count(tmp_path: Path) -> None:
    """An MPI launcher's log carries every node's lines: GPUs named by busIds of other hosts are not this
    node's GPUs. A pod on the host network logs under the node's name: then every host counts."""
    node, pods = sim(tmp_path)
    launcher = SimJob("mpi", "launcher", pytorchjob_labels("mpi-run", "launcher"), network="IB", nnodes=2)
    pods.start_job(launcher)
    # The launcher prints its workers' lines: their host is a worker pod's name, not the launcher's.
    path = pods._log_path(launcher)
    text = path.read_text().replace("launcher:", "mpi-run-worker-1:")
    path.write_text(text)
    collector = collector_on(node, pods)
    collector.step()
    assert [r for r in affinity_rows(collector) if r[0] == "launcher"] == []
    collector = collector_on(node, pods, WithHostNetwork(pods, "launcher"))
    collector.step()
    assert [r[1:4] for r in affinity_rows(collector) if r[0] == "launcher"] == [
        ("0", "mlx5_0", "PIX"),
        ("7", "mlx5_7", "PIX"),
    ]


def test_device_names_a_log_invents_make_no_series(tmp_path: Path) -> None:
    """A pod's log may print any device list; only RDMA devices this node has become label values."""
    node, pods = sim(tmp_path)
    job = SimJob("evil", "liar-0", pytorchjob_labels("liar"), network="IB", nnodes=2)
    pods.start_job(job)
    path = pods._log_path(job)
    path.write_text(path.read_text().replace("]mlx5_0:1/IB", "]" + "x" * 5000 + ":1/IB"))
    collector = collector_on(node, pods)
    collector.step()
    rows = [r for r in affinity_rows(collector) if r[0] == "liar-0"]
    assert rows == [("liar-0", "7", "mlx5_7", "PIX", "true", "PIX")], "GPU 0's device [0] is no NIC of this node"


def test_nearest_class_is_empty_only_when_an_unknown_nic_might_be_nearer() -> None:
    """The class of the GPU's nearest NIC is claimed unless a NIC of unknown class might be nearer: one on
    the GPU's own host bridge might be PIX; one on another host bridge is NODE at best."""
    from exporter.sources.topology import PciPlacement

    def place(address: str, host_bridge: str) -> PciPlacement:
        return PciPlacement(address, host_bridge, (address,), None, ())

    gpu = GpuTopology(0, "GPU-0", "00000000:18:00.0", place("0000:18:00.0", "pci0000:15"))
    near = NicTopology("mlx5_0", place("0000:19:00.0", "pci0000:15"))
    uses = [NicUse("worker-0", "18000", "mlx5_1", "true")]
    for other_bridge, expected in (("pci0000:15", ""), ("pci0000:90", "PIX")):
        used = NicTopology("mlx5_1", place("0000:91:00.0", other_bridge))
        known = Topology(gpus=(gpu,), nics=(near, used), classes={(0, "mlx5_0"): "PIX", (0, "mlx5_1"): "SYS"})
        assert pod_nic_affinity("worker-0", uses, False, known) == (("0", "mlx5_1", "SYS", "true", "PIX"),)
        partial = Topology(gpus=(gpu,), nics=(near, used), classes={(0, "mlx5_0"): "PIX"})
        assert pod_nic_affinity("worker-0", uses, False, partial) == (("0", "mlx5_1", "", "true", expected),), (
            other_bridge
        )


def test_a_software_rdma_device_and_a_nic_of_unknown_numa_node_leave_the_crossed_rail_visible(tmp_path: Path) -> None:
    """A soft-RoCE rxe0 (no PCI device) and a NIC whose numa_node is -1 on a host bridge of its own used to
    blank every GPU's nearest NIC, so a crossed rail (affinity SYS, nearest PIX) could never show."""
    import os

    from ccl_sim.topology import INFINIBAND_CLASS, PciFunction, PciTreeWriter

    node, pods = sim(tmp_path)
    tree = PciTreeWriter(node.sysfs)
    storage = tree.add("pci0000:f0", [PciFunction("0000:f0:01.0"), PciFunction("0000:f1:00.0", INFINIBAND_CLASS)], -1)
    tree.link_rdma("mlx5_10", storage)
    (node.sysfs / "devices" / "virtual" / "infiniband" / "rxe0").mkdir(parents=True)
    os.symlink("../../devices/virtual/infiniband/rxe0", node.sysfs / "class" / "infiniband" / "rxe0")
    collector = collector_on(node, pods)
    collector.step()
    assert affinity_rows(collector) == [
        ("gpt-neox-worker-0", "0", "mlx5_4", "SYS", "true", "PIX"),
        ("gpt-neox-worker-0", "7", "mlx5_3", "SYS", "true", "PIX"),
        ("llama-70b-worker-0", "0", "mlx5_0", "PIX", "true", "PIX"),
        ("llama-70b-worker-0", "7", "mlx5_7", "PIX", "true", "PIX"),
    ]

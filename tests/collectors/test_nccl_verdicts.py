"""``ccl_nccl_verdict``, the ``network_class`` of communicators, what the node's GPU counts decide
where a log leaves placement open, GPU pods that print no NCCL logs, and pods that declare the
network they run on. Pod logs are real CRI files read by the real tailer; the GPU inventory is the
real source over stand-ins for NVML and the kubelet's pod-resources API (neither exists here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.collectors.nccl import VERDICTS, NcclCollector
from exporter.sources.gpu_inventory import GpuInventory, GpuInventorySource
from exporter.sources.kube import PodMetadata
from exporter.sources.nvml import GpuIdentity, NvmlUnavailable
from exporter.sources.podlogs import PodLogTailer
from exporter.sources.podresources import GpuAssignment, PodResourcesUnavailable
from tests.clocks import ManualClock
from tests.collectors.test_nccl_collector import START, samples, sim_node, value

NS = "ml"


class Pods:
    """The node's pods as the Kubernetes API would list them."""

    def __init__(self, *records: PodMetadata) -> None:
        self.records = {(r.namespace, r.name): r for r in records}

    def lookup(self, namespace: str, pod: str) -> PodMetadata | None:
        return self.records.get((namespace, pod))

    def is_authoritative(self) -> bool:
        return True

    def pods(self) -> list[PodMetadata]:
        return list(self.records.values())


class Nvml:
    def __init__(self, count: int | None) -> None:
        self.count = count

    def gpus(self) -> list[GpuIdentity]:
        if self.count is None:
            raise NvmlUnavailable("NVML Shared Library Not Found")
        return [GpuIdentity(i, f"GPU-{i:04d}", "NVIDIA H200", f"00000000:{i:02X}:00.0") for i in range(self.count)]


class PodResources:
    def __init__(self, held: dict[str, int] | None, resource: str = "nvidia.com/gpu") -> None:
        self.held, self.resource, self.calls = held, resource, 0

    def list_gpus(self) -> list[GpuAssignment]:
        self.calls += 1
        if self.held is None:
            raise PodResourcesUnavailable("no socket")
        return [
            GpuAssignment(f"GPU-{pod}-{i}", self.resource, NS, pod, "trainer")
            for pod, count in self.held.items()
            for i in range(count)
        ]


def write_pod_log(root: Path, pod: str, lines: list[str]) -> None:
    folder = root / f"{NS}_{pod}_uid-{pod}" / "trainer"
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "0.log").open("a") as f:
        for line in lines:
            f.write(f"2026-12-01T10:00:00.000000000Z stdout F {line}\n")


def socket_open_placement(host: str, rank: int, nranks: int) -> list[str]:
    """One process on Socket, a communicator of ``nranks``: nothing in the log says where the others are."""
    p = f"{host}:{101 + rank}:{101 + rank} [0] NCCL INFO "
    return [
        p + "NET/IB : No device found.",
        p + "NET/Socket : Using [0]eth0:10.0.3.17<0>",
        p + "Using network Socket",
        p + f"ncclCommInitRank comm 0x55d4c0a1b000 rank {rank} nranks {nranks} cudaDev 0 nvmlDev 0 busId 18000 "
        "commId 0x1111222233334444 - Init START",
        p + f"ncclCommInitRank comm 0x55d4c0a1b000 rank {rank} nranks {nranks} cudaDev 0 nvmlDev 0 busId 18000 "
        "commId 0x1111222233334444 - Init COMPLETE",
    ]


def collector(tmp_path: Path, pods: Pods, nvml_gpus: int | None, held: dict[str, int] | None) -> NcclCollector:
    node, _ = sim_node(tmp_path)  # for its sysfs: 8 IB + 2 RoCE ports, ACTIVE
    tailer = PodLogTailer(tmp_path / "pods", tmp_path / "nccl", tmp_path / "state")
    gpus = GpuInventorySource(Nvml(nvml_gpus), PodResources(held))  # type: ignore[arg-type]
    return NcclCollector(tailer, node.sysfs, pods, clock=ManualClock(START), gpu_inventory=gpus)


def meta(pod: str, job: str = "llama", expected: str = "") -> PodMetadata:
    return PodMetadata(NS, pod, f"uid-{pod}", job, "PyTorchJob", expected, False)


def verdict_of(found: dict, pod: str) -> str:
    states = {state: value(found, "ccl_nccl_verdict", pod=pod, verdict=state) for state in VERDICTS}
    assert sorted(states.values()) == [0.0, 0.0, 0.0, 1.0], states  # exactly one state is 1
    return next(state for state, v in states.items() if v == 1.0)


def test_the_simulated_node_has_one_verdict_per_pod(tmp_path: Path) -> None:
    from tests.collectors.test_nccl_collector import make_collector

    node, sim = sim_node(tmp_path)
    c = make_collector(node, sim)
    c.step()
    found = samples(c)
    assert verdict_of(found, "llama-70b-worker-0") == "rdma"
    assert verdict_of(found, "bert-finetune-worker-0") == "tcp_fallback"
    assert verdict_of(found, "resnet-eval-0") == "single_node"
    assert (
        value(found, "ccl_nccl_communicator_info", pod="bert-finetune-worker-0", network="Socket", network_class="tcp")
        == 1
    )
    assert value(found, "ccl_nccl_communicator_info", pod="llama-70b-worker-0", network="IB", network_class="rdma") == 1


@pytest.mark.parametrize(
    ("nvml_gpus", "held", "want"),
    [
        (8, {"worker-0": 8}, "tcp_fallback"),  # 16 ranks, 8 GPUs on the node: the others are elsewhere
        (16, {"worker-0": 8}, "tcp_fallback"),  # 16 GPUs here, but the job's pods hold 8 of them
        (16, {"worker-0": 8, "worker-1": 8}, "unknown"),  # the job's two pods hold 16 here: could be one node
        (None, None, "unknown"),  # neither NVML nor pod-resources readable: nothing to compare with
        (16, None, "unknown"),  # 16 GPUs, pod-resources unreadable: 16 ranks fit on this node
    ],
)
def test_gpu_counts_decide_what_the_log_leaves_open(
    tmp_path: Path, nvml_gpus: int | None, held: dict[str, int] | None, want: str
) -> None:
    write_pod_log(tmp_path / "pods", "worker-0", socket_open_placement("worker-0", 0, 16))
    c = collector(tmp_path, Pods(meta("worker-0"), meta("worker-1")), nvml_gpus, held)
    c.step()
    found = samples(c)
    assert verdict_of(found, "worker-0") == want
    assert value(found, "ccl_nccl_tcp_fallback", pod="worker-0") == (1.0 if want == "tcp_fallback" else 0.0)
    assert value(found, "ccl_nccl_communicator_info", pod="worker-0", network_class="tcp", nranks="16") == 1


def test_without_the_job_known_only_the_node_gpu_count_bounds_ranks(tmp_path: Path) -> None:
    """No job attribution (no API access): another pod of the same job on this node cannot be told
    apart, so the GPUs this pod holds say nothing; 16 GPUs on the node leave 16 ranks open."""
    write_pod_log(tmp_path / "pods", "worker-0", socket_open_placement("worker-0", 0, 16))
    c = collector(tmp_path, Pods(PodMetadata(NS, "worker-0", "uid-worker-0", "", "", "", None)), 16, {"worker-0": 8})
    c.step()
    assert verdict_of(samples(c), "worker-0") == "unknown"


def test_a_communicator_that_fits_on_the_node_stays_open(tmp_path: Path) -> None:
    write_pod_log(tmp_path / "pods", "worker-0", socket_open_placement("worker-0", 0, 8))
    c = collector(tmp_path, Pods(meta("worker-0")), 8, {"worker-0": 8})
    c.step()
    assert verdict_of(samples(c), "worker-0") == "unknown"


def test_gpu_pods_that_print_no_nccl_logs_are_said_unknown(tmp_path: Path) -> None:
    write_pod_log(tmp_path / "pods", "worker-0", socket_open_placement("worker-0", 0, 16))
    write_pod_log(tmp_path / "pods", "quiet-0", ["epoch 1 loss 0.3"])
    c = collector(
        tmp_path,
        Pods(meta("worker-0"), meta("quiet-0", job="quiet"), meta("web-0", job="")),
        8,
        {"worker-0": 8, "quiet-0": 4},
    )
    c.step()
    found = samples(c)
    assert verdict_of(found, "quiet-0") == "unknown"
    assert value(found, "ccl_nccl_verdict", pod="quiet-0", verdict="unknown", job_name="quiet") == 1
    assert value(found, "ccl_nccl_tcp_fallback", pod="quiet-0") is None  # no log, no exact signal
    assert value(found, "ccl_nccl_verdict", pod="web-0") is None  # holds no GPU: not a training pod


def test_pods_that_declare_their_network_are_listed(tmp_path: Path) -> None:
    write_pod_log(tmp_path / "pods", "worker-0", socket_open_placement("worker-0", 0, 16))
    c = collector(
        tmp_path,
        Pods(meta("worker-0", expected="socket"), meta("etl-0", job="etl", expected="IB"), meta("plain-0")),
        8,
        {"worker-0": 8},
    )
    c.step()
    found = samples(c)
    assert (
        value(
            found,
            "ccl_pod_expected_network_info",
            pod="worker-0",
            expected_network="socket",
            network_class="tcp",
            job_name="llama",
        )
        == 1
    )
    assert value(found, "ccl_pod_expected_network_info", pod="etl-0", expected_network="IB", network_class="rdma") == 1
    assert value(found, "ccl_pod_expected_network_info", pod="plain-0") is None
    # The fact stays a fact: the rules, not the exporter, decide that declared TCP is not a page.
    assert value(found, "ccl_nccl_tcp_fallback", pod="worker-0") == 1


def test_the_inventory_is_cached_and_never_raises() -> None:
    now = [0.0]
    resources = PodResources({"a": 2})
    source = GpuInventorySource(Nvml(None), resources, max_age_seconds=30, clock=lambda: now[0])  # type: ignore[arg-type]
    assert source.read() == GpuInventory(None, {(NS, "a"): 2})
    now[0] = 10.0
    source.read()
    assert resources.calls == 1
    now[0] = 31.0
    resources.held = None
    assert source.read() == GpuInventory(None, {})


def test_mig_instances_do_not_bound_ranks_by_the_node_gpu_count() -> None:
    source = GpuInventorySource(Nvml(8), PodResources({"a": 14}, resource="nvidia.com/mig-1g.10gb"))  # type: ignore[arg-type]
    assert source.read() == GpuInventory(None, {(NS, "a"): 14})

"""The node topology from sysfs trees with real symlinked PCI hierarchies: the nvidia-smi classes
of every GPU/NIC pair, broken and partial trees (only the affected series drop), change detection,
and the collector's families."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from ccl_sim.topology import BRIDGE, GPU_CLASS, INFINIBAND_CLASS, PciFunction, PciTreeWriter, SimTopology
from exporter.collectors.base import CollectorUnavailable, PartialCollection
from exporter.collectors.topology import TopologyCollector
from exporter.sources.nvml import GpuIdentity, NvmlUnavailable
from exporter.sources.topology import (
    GpuTopology,
    NicTopology,
    PciPlacement,
    Topology,
    TopologySource,
    affinity,
    build_topology,
    nccl_bus_id_address,
    pci_address_in,
    placement,
    sysfs_address,
)
from tests.metrics_text import samples as parse_samples

HGX_GPUS = [0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB]


class StaticNvml:
    """The GPUs of the simulated HGX node, as NVML reports them (or NVML absent)."""

    def __init__(self, buses: list[int] | None = None, unavailable: bool = False) -> None:
        self.buses = HGX_GPUS if buses is None else buses
        self.unavailable = unavailable
        self.calls = 0

    def gpus(self) -> list[GpuIdentity]:
        self.calls += 1
        if self.unavailable:
            raise NvmlUnavailable("libnvidia-ml.so.1 not found")
        return [
            GpuIdentity(i, f"GPU-{i}", "NVIDIA H200", f"00000000:{bus:02X}:00.0") for i, bus in enumerate(self.buses)
        ]


def hgx_tree(root: Path) -> Path:
    SimTopology().setup(root)
    return root / "sys"


def classes_of(sysfs: Path, nvml: StaticNvml | None = None) -> dict[int, list[str | None]]:
    topology = build_topology(sysfs, (nvml or StaticNvml()).gpus())
    return {g.index: [topology.affinity(g.index, n.device) for n in topology.nics] for g in topology.gpus}


def test_hgx_node_every_gpu_has_one_pix_nic_node_on_its_socket_and_sys_across(tmp_path: Path) -> None:
    sysfs = hgx_tree(tmp_path)
    topology = build_topology(sysfs, StaticNvml().gpus())
    assert topology.problems == ()
    assert [n.device for n in topology.nics] == [f"mlx5_{i}" for i in range(10)]
    for gpu in range(8):
        socket = range(0, 4) if gpu < 4 else range(4, 8)
        row = {n.device: topology.affinity(gpu, n.device) for n in topology.nics}
        assert [d for d, cls in row.items() if cls == "PIX"] == [f"mlx5_{gpu}"]
        assert all(row[f"mlx5_{i}"] == "NODE" for i in socket if i != gpu)
        assert all(row[f"mlx5_{i}"] == "SYS" for i in range(8) if i not in socket)
        # the two NICs without a GPU: one per socket, on root ports of their own
        assert (row["mlx5_8"], row["mlx5_9"]) == (("NODE", "SYS") if gpu < 4 else ("SYS", "NODE"))
        assert topology.nearest(gpu) == ("PIX", (f"mlx5_{gpu}",))
    gpu0 = topology.gpus[0].placement
    assert gpu0 is not None
    assert (gpu0.address, gpu0.host_bridge, gpu0.numa_node) == ("0000:18:00.0", "pci0000:15", 0)
    assert gpu0.path == ("0000:15:01.0", "0000:16:00.0", "0000:17:00.0", "0000:18:00.0")
    assert gpu0.switches == ("0000:16:00.0",), "the switch is its upstream port, as NCCL climbs"


def write_chain(tree: PciTreeWriter, host_bridge: str, addresses: list[str], cls: str, numa: int | None = 0) -> Path:
    chain = [PciFunction(a) for a in addresses[:-1]] + [PciFunction(addresses[-1], cls)]
    return tree.add(host_bridge, chain, numa)


def test_classes_follow_nvidia_smi_on_nested_switches_and_shared_root_complexes(tmp_path: Path) -> None:
    """PIX below one switch, PXB through several, PHB via the host bridge, NODE across host bridges of a
    NUMA node, SYS across NUMA nodes."""
    sysfs = tmp_path / "sys"
    tree = PciTreeWriter(sysfs)
    # pci0000:00: root port 00:01.0 -> switch A (02:00.0) -> downstream 03:00.0 -> switch B (04:00.0)
    a, b = ["0000:00:01.0", "0000:02:00.0"], ["0000:03:00.0", "0000:04:00.0"]
    write_chain(tree, "pci0000:00", a + b + ["0000:05:00.0", "0000:06:00.0"], GPU_CLASS)  # GPU under B
    tree.link_rdma("nic_b", write_chain(tree, "pci0000:00", a + b + ["0000:05:01.0", "0000:07:00.0"], INFINIBAND_CLASS))
    tree.link_rdma("nic_a", write_chain(tree, "pci0000:00", a + ["0000:03:01.0", "0000:08:00.0"], INFINIBAND_CLASS))
    tree.link_rdma("nic_rc", write_chain(tree, "pci0000:00", ["0000:00:02.0", "0000:09:00.0"], INFINIBAND_CLASS))
    tree.link_rdma("nic_node", write_chain(tree, "pci0000:40", ["0000:40:01.0", "0000:41:00.0"], INFINIBAND_CLASS))
    tree.link_rdma("nic_sys", write_chain(tree, "pci0000:80", ["0000:80:01.0", "0000:81:00.0"], INFINIBAND_CLASS, 1))
    topology = build_topology(sysfs, StaticNvml([0x06]).gpus())
    assert topology.problems == ()
    got = {n.device: topology.affinity(0, n.device) for n in topology.nics}
    assert got == {"nic_a": "PXB", "nic_b": "PIX", "nic_node": "NODE", "nic_rc": "PHB", "nic_sys": "SYS"}
    assert topology.gpus[0].placement is not None
    assert topology.gpus[0].placement.switches == ("0000:04:00.0", "0000:02:00.0"), "nearest first"


def test_a_broken_gpu_link_drops_only_that_gpus_pairs(tmp_path: Path) -> None:
    sysfs = hgx_tree(tmp_path)
    link = sysfs / "bus" / "pci" / "devices" / "0000:3a:00.0"  # GPU 2
    link.unlink()
    os.symlink("../../../devices/pci0000:37/0000:37:01.0/gone", link)  # dangling, as after a hot unplug
    topology = build_topology(sysfs, StaticNvml().gpus())
    assert [p for p in topology.problems if "GPU 2" in p], topology.problems
    assert all(topology.affinity(2, n.device) is None for n in topology.nics)
    assert topology.nearest(2) is None
    assert topology.affinity(1, "mlx5_1") == "PIX" and topology.affinity(3, "mlx5_2") == "NODE"


def test_a_missing_numa_node_leaves_cross_host_bridge_classes_unknown_not_guessed(tmp_path: Path) -> None:
    sysfs = hgx_tree(tmp_path)
    for numa in (sysfs / "devices" / "pci0000:15").rglob("numa_node"):  # GPU 0 and mlx5_0's host bridge
        numa.write_text("-1\n")
    topology = build_topology(sysfs, StaticNvml().gpus())
    assert topology.affinity(0, "mlx5_0") == "PIX", "the switch alone says it"
    assert topology.affinity(0, "mlx5_1") is None and topology.affinity(0, "mlx5_7") is None
    assert topology.affinity(1, "mlx5_0") is None and topology.affinity(1, "mlx5_2") == "NODE"
    # a NIC of unknown NUMA node on another host bridge is NODE at best: never nearer than a PIX one
    assert topology.nearest(0) == ("PIX", ("mlx5_0",)) and topology.nearest(1) == ("PIX", ("mlx5_1",))


def test_an_unreadable_bridge_class_leaves_switch_classes_unknown(tmp_path: Path) -> None:
    sysfs = hgx_tree(tmp_path)
    (sysfs / "devices" / "pci0000:27" / "0000:27:01.0" / "0000:28:00.0" / "class").unlink()  # GPU 1's switch
    topology = build_topology(sysfs, StaticNvml().gpus())
    gpu1 = topology.gpus[1].placement
    assert gpu1 is not None and gpu1.switches is None
    assert topology.affinity(1, "mlx5_1") is None, "PIX or PHB: the tree does not say"
    assert topology.affinity(1, "mlx5_0") == "NODE" and topology.affinity(1, "mlx5_4") == "SYS"


def test_a_non_bridge_in_the_path_is_not_taken_for_a_switch(tmp_path: Path) -> None:
    sysfs = hgx_tree(tmp_path)
    (sysfs / "devices" / "pci0000:27" / "0000:27:01.0" / "0000:28:00.0" / "class").write_text("0x010802\n")
    topology = build_topology(sysfs, StaticNvml().gpus())
    assert topology.affinity(1, "mlx5_1") is None


def test_links_that_leave_sysfs_or_point_at_no_pci_function_are_problems_not_crashes(tmp_path: Path) -> None:
    sysfs = hgx_tree(tmp_path)
    outside = tmp_path / "elsewhere" / "0000:2b:00.0"
    outside.mkdir(parents=True)
    nic1 = sysfs / "class" / "infiniband" / "mlx5_1" / "device"
    nic1.unlink()
    os.symlink(outside, nic1)
    virtual = sysfs / "devices" / "virtual" / "infiniband" / "rxe0"  # a soft-RoCE device: no PCI function
    virtual.mkdir(parents=True)
    os.symlink("../../devices/virtual/infiniband/rxe0", sysfs / "class" / "infiniband" / "rxe0")
    loop = sysfs / "class" / "infiniband" / "mlx5_2" / "device"
    loop.unlink()
    os.symlink("device", loop)  # a link to itself
    topology = build_topology(sysfs, StaticNvml().gpus())
    names = {n.device: n.placement for n in topology.nics}
    assert names["mlx5_1"] is None and names["rxe0"] is None and names["mlx5_2"] is None
    assert {n.device: n.unplaced for n in topology.unplaced_nics} == {
        "mlx5_1": "unreadable",
        "mlx5_2": "unreadable",
        "rxe0": "not_pci",
    }
    assert len(topology.problems) == 2, "a software RDMA device is no problem"
    assert topology.affinity(0, "mlx5_0") == "PIX" and topology.affinity(1, "mlx5_1") is None
    # NICs without a placement are out of the matrix: the others still have a nearest NIC
    assert topology.nearest(0) == ("PIX", ("mlx5_0",)) and topology.nearest(3) == ("PIX", ("mlx5_3",))


def test_class_entries_without_a_device_link_are_placed_through_their_pci_function(tmp_path: Path) -> None:
    """The kernel's own layout: class/infiniband/<dev> -> ../../devices/<...>/<bdf>/infiniband/<dev>."""
    sysfs = tmp_path / "sys"
    tree = PciTreeWriter(sysfs)
    nic = write_chain(tree, "pci0000:00", ["0000:00:01.0", "0000:01:00.0"], INFINIBAND_CLASS)
    (nic / "infiniband" / "mlx5_0").mkdir(parents=True)
    os.makedirs(sysfs / "class" / "infiniband")
    os.symlink(
        "../../devices/pci0000:00/0000:00:01.0/0000:01:00.0/infiniband/mlx5_0",
        sysfs / "class" / "infiniband" / "mlx5_0",
    )
    topology = build_topology(sysfs, [])
    assert topology.nics[0].placement is not None and topology.nics[0].placement.address == "0000:01:00.0"


def test_sr_iov_vfs_resolve_but_stay_out_of_the_matrix(tmp_path: Path) -> None:
    sysfs = hgx_tree(tmp_path)
    tree = PciTreeWriter(sysfs)
    switch = ["0000:15:01.0", "0000:16:00.0", "0000:17:01.0"]
    vf = write_chain(tree, "pci0000:15", switch + ["0000:19:00.2"], INFINIBAND_CLASS)
    os.symlink("../0000:19:00.0", vf / "physfn")
    tree.link_rdma("mlx5_10", vf)
    topology = build_topology(sysfs, StaticNvml().gpus())
    assert topology.nics_at("0000:19:00.2") == ("mlx5_10",)
    assert topology.affinity(0, "mlx5_10") == "PIX"
    assert "mlx5_10" not in [n.device for n in topology.physical_nics]
    assert topology.nearest(0) == ("PIX", ("mlx5_0",))


def test_source_walks_once_and_again_only_when_the_node_changes(tmp_path: Path) -> None:
    sysfs = hgx_tree(tmp_path)
    now = [0.0]
    nvml = StaticNvml()
    source = TopologySource(sysfs, nvml, check_seconds=30, clock=lambda: now[0])
    first = source.read()
    now[0] = 10
    assert source.read() is first and nvml.calls == 1, "within check_seconds nothing is even compared"
    now[0] = 40
    assert source.read() is first and source.walks == 1, "compared, unchanged: not walked again"
    shutil.rmtree(sysfs / "class" / "infiniband" / "mlx5_9")
    now[0] = 80
    changed = source.read()
    assert source.walks == 2 and "mlx5_9" not in [n.device for n in changed.nics]


def test_without_nvml_the_nics_are_still_placed(tmp_path: Path) -> None:
    source = TopologySource(hgx_tree(tmp_path), StaticNvml(unavailable=True))
    topology = source.read()
    assert topology.gpus == () and len(topology.nics) == 10
    assert any("NVML" in p for p in topology.problems)


def test_addresses_as_nvml_nccl_and_dra_spell_them() -> None:
    assert sysfs_address("00000000:DB:00.0") == "0000:db:00.0"
    assert sysfs_address("0001:18:00.1") == "0001:18:00.1"
    assert sysfs_address("GPU-1234") is None and sysfs_address("100000000:18:00.0") is None
    assert nccl_bus_id_address("18000") == "0000:18:00.0"
    assert nccl_bus_id_address("1db001") == "0001:db:00.1"
    assert nccl_bus_id_address("zz") is None
    assert pci_address_in("pci-0000-19-00-2") == "0000:19:00.2"
    assert pci_address_in("k8s.net/device=0000:3B:00.1") == "0000:3b:00.1"
    assert pci_address_in("gpu-3") is None


def test_affinity_needs_both_placements_to_say(tmp_path: Path) -> None:
    sysfs = hgx_tree(tmp_path)
    a = placement(sysfs, sysfs / "bus" / "pci" / "devices" / "0000:18:00.0")
    b = placement(sysfs, sysfs / "bus" / "pci" / "devices" / "0000:19:00.0")
    assert not isinstance(a, str) and not isinstance(b, str)
    assert affinity(a, b) == affinity(b, a) == "PIX"
    assert isinstance(placement(sysfs, sysfs / "bus" / "pci" / "devices" / "0000:f0:00.0"), str)


# --- the collector -------------------------------------------------------------------------------


def scrape(collector: TopologyCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(collector)
    return parse_samples(generate_latest(registry).decode())


def test_collector_exposes_the_matrix_the_nearest_nic_and_placements(tmp_path: Path) -> None:
    collector = TopologyCollector(TopologySource(hgx_tree(tmp_path), StaticNvml()))
    samples = scrape(collector)
    pairs = [dict(labels) for (name, labels) in samples if name == "ccl_topology_gpu_nic_info"]
    assert len(pairs) == 80
    assert {
        "gpu": "3",
        "uuid": "GPU-3",
        "device": "mlx5_3",
        "affinity": "PIX",
        "numa_node": "0",
        "gpu_numa_node": "0",
    } in pairs
    assert {
        "gpu": "3",
        "uuid": "GPU-3",
        "device": "mlx5_9",
        "affinity": "SYS",
        "numa_node": "1",
        "gpu_numa_node": "0",
    } in pairs
    nearest = sorted(
        (d["gpu"], d["device"], d["affinity"])
        for (name, labels) in samples
        if name == "ccl_topology_gpu_nearest_nic_info"
        for d in [dict(labels)]
    )
    assert nearest == [(str(i), f"mlx5_{i}", "PIX") for i in range(8)]
    gpu_pci = [dict(labels) for (name, labels) in samples if name == "ccl_topology_gpu_pci_info"]
    assert {
        "gpu": "0",
        "uuid": "GPU-0",
        "pci_address": "0000:18:00.0",
        "numa_node": "0",
        "host_bridge": "pci0000:15",
        "pci_switches": "0000:16:00.0",
        "pci_path": "0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0",
    } in gpu_pci
    assert len([1 for (name, _) in samples if name == "ccl_topology_nic_pci_info"]) == 10


def test_collector_on_a_partial_tree_drops_only_the_affected_series(tmp_path: Path) -> None:
    sysfs = hgx_tree(tmp_path)
    (sysfs / "bus" / "pci" / "devices" / "0000:5d:00.0").unlink()  # GPU 3 gone from the bus
    collector = TopologyCollector(TopologySource(sysfs, StaticNvml()))
    families = []
    with pytest.raises(PartialCollection, match="GPU 3"):
        for family in collector.collect():
            families.append(family)
    by_name = {f.name: f for f in families}
    gpus_paired = {s.labels["gpu"] for s in by_name["ccl_topology_gpu_nic_info"].samples}
    assert gpus_paired == {"0", "1", "2", "4", "5", "6", "7"}
    assert len(by_name["ccl_topology_gpu_nic_info"].samples) == 70
    assert "3" not in {s.labels["gpu"] for s in by_name["ccl_topology_gpu_nearest_nic_info"].samples}


def summary_of(samples: list[tuple[str, tuple[tuple[str, str], ...]]], values: dict[str, float]) -> dict[str, float]:
    """The node summary, and what the rules used to count from the per-GPU series."""
    nearest_local = [
        dict(labels)
        for (name, labels) in samples
        if name == "ccl_topology_gpu_nearest_nic_info" and dict(labels)["affinity"] in ("PIX", "PXB")
    ]
    from_series = {
        "ccl_topology_node_gpus": len(
            {dict(labels)["gpu"] for (name, labels) in samples if name == "ccl_topology_gpu_pci_info"}
        ),
        "ccl_topology_node_gpus_with_local_nic": len({d["gpu"] for d in nearest_local}),
        "ccl_topology_node_local_nics": len({d["device"] for d in nearest_local}),
    }
    assert {name: values[name] for name in from_series} == from_series
    return from_series


def test_the_node_summary_counts_what_the_per_gpu_series_say(tmp_path: Path) -> None:
    sysfs = hgx_tree(tmp_path)
    collector = TopologyCollector(TopologySource(sysfs, StaticNvml()))
    families = list(collector.collect())
    values = {f.name: f.samples[0].value for f in families if f.name.startswith("ccl_topology_node_")}
    samples = scrape(collector)
    assert summary_of(samples, values) == {
        "ccl_topology_node_gpus": 8,
        "ccl_topology_node_gpus_with_local_nic": 8,
        "ccl_topology_node_local_nics": 8,
    }
    (sysfs / "bus" / "pci" / "devices" / "0000:5d:00.0").unlink()  # GPU 3 gone from the bus
    collector = TopologyCollector(TopologySource(sysfs, StaticNvml()))
    families = []
    with pytest.raises(PartialCollection):
        for family in collector.collect():
            families.append(family)
    values = {f.name: f.samples[0].value for f in families if f.name.startswith("ccl_topology_node_")}
    assert values == {
        "ccl_topology_node_gpus": 7,
        "ccl_topology_node_gpus_with_local_nic": 7,
        "ccl_topology_node_local_nics": 7,
    }


def synthetic_place(address: str, host_bridge: str = "pci0000:00") -> PciPlacement:
    """A placement for a hand-made Topology: only the host bridge matters to ``nearest``."""
    return PciPlacement(address, host_bridge, (address,), 0, ())


def test_the_node_summary_counts_shared_and_far_nics_once() -> None:
    """Two GPUs beside one NIC (one local NIC for two GPUs), a GPU whose nearest NIC is across the host
    bridge (no local NIC), and a GPU whose nearest NIC is unknown (not counted as local)."""
    gpus = tuple(
        GpuTopology(i, f"GPU-{i}", f"00000000:{0x18 + i:02x}:00.0", synthetic_place(f"0000:{0x18 + i:02x}:00.0"))
        for i in range(4)
    )
    nics = (
        NicTopology("mlx5_0", synthetic_place("0000:30:00.0")),
        NicTopology("mlx5_1", synthetic_place("0000:31:00.0")),
    )
    classes = {
        (0, "mlx5_0"): "PIX",
        (0, "mlx5_1"): "SYS",
        (1, "mlx5_0"): "PXB",
        (1, "mlx5_1"): "SYS",
        (2, "mlx5_0"): "PHB",
        (2, "mlx5_1"): "SYS",
        (3, "mlx5_1"): "PIX",
    }  # GPU 3 - mlx5_0: unknown
    families = TopologyCollector.node_families(Topology(gpus=gpus, nics=nics, classes=classes))
    assert {f.name: f.samples[0].value for f in families} == {
        "ccl_topology_node_gpus": 4,
        "ccl_topology_node_gpus_with_local_nic": 2,
        "ccl_topology_node_local_nics": 1,
    }


def test_collector_without_gpus_or_nics_is_unavailable(tmp_path: Path) -> None:
    collector = TopologyCollector(TopologySource(tmp_path, None))
    with pytest.raises(CollectorUnavailable):
        list(collector.collect())


def test_bridge_class_constant_is_what_the_kernel_writes() -> None:
    assert BRIDGE.startswith("0x0604")

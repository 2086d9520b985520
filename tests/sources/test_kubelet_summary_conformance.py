"""The kubelet's Summary API (``/stats/summary``) as the kubelet writes it, with and without interfaces.

The documents are built here by functions that follow, field by field, the Go types and the code
that fills them in kubernetes/kubernetes (read at master; the types are
``staging/src/k8s.io/kubelet/pkg/apis/stats/v1alpha1/types.go`` at 054d429d9f8b, the cAdvisor
path ``pkg/kubelet/stats/helper.go`` ``cadvisorInfoToNetworkStats`` at 099ac1ba0dea, the CRI path
``pkg/kubelet/stats/cri_stats_provider_linux.go`` ``addCRIPodNetworkStats`` and
``cri_stats_provider.go`` ``criInterfaceToSummary``), with Go's ``encoding/json`` rules for their
tags: ``omitempty`` drops a nil pointer and an empty slice, a plain string is always written.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from exporter.collectors.base import PartialCollection
from exporter.collectors.podnetwork import PodNetworkCollector
from exporter.sources.kubelet_stats import PodNetwork, pod_networks, summary_document, summary_from_bytes

TIME = "2026-03-01T12:00:00Z"  # metav1.Time marshals as RFC 3339


def interface_stats(name: str, rx: int | None = None, tx: int | None = None) -> dict[str, Any]:
    """InterfaceStats: ``name`` (no omitempty), then the four ``*uint64`` counters (omitempty)."""
    out: dict[str, Any] = {"name": name}
    for key, value in (("rxBytes", rx), ("rxErrors", 0 if rx is not None else None), ("txBytes", tx),
                       ("txErrors", 0 if tx is not None else None)):  # fmt: skip
        if value is not None:
            out[key] = value
    return out


def network_stats(default: dict[str, Any], interfaces: list[dict[str, Any]]) -> dict[str, Any]:
    """NetworkStats: ``time``, the default interface inlined, ``interfaces`` omitempty."""
    out = {"time": TIME, **default}
    if interfaces:
        out["interfaces"] = interfaces
    return out


def from_cadvisor(interfaces: list[tuple[str, int, int]]) -> dict[str, Any]:
    """cadvisorInfoToNetworkStats: every interface listed, the one named eth0 also inlined; with
    none found, the inlined default stays the zero value (``"name": ""``)."""
    listed = [interface_stats(name, rx, tx) for name, rx, tx in interfaces]
    default = next((entry for entry in listed if entry["name"] == "eth0"), interface_stats(""))
    return network_stats(default, listed)


def from_cri(default: tuple[str, int | None, int | None], interfaces: list[tuple[str, int, int]]) -> dict[str, Any]:
    """addCRIPodNetworkStats: the runtime's DefaultInterface inlined (criInterfaceToSummary: nil
    UInt64Values become nil pointers), its Interfaces listed (an empty slice is omitted)."""
    return network_stats(interface_stats(*default), [interface_stats(*entry) for entry in interfaces])


def pod_stats(namespace: str, name: str, network: dict[str, Any] | None) -> dict[str, Any]:
    """PodStats: podRef, startTime, containers (no omitempty), network omitempty."""
    out: dict[str, Any] = {
        "podRef": {"name": name, "namespace": namespace, "uid": f"{namespace}-{name}-uid"},
        "startTime": TIME,
        "containers": [],
    }
    if network is not None:
        out["network"] = network
    return out


def summary(*pods: dict[str, Any]) -> bytes:
    """Summary as the kubelet sends it: ``node`` then ``pods``, JSON on the wire."""
    return json.dumps({"node": {"nodeName": "gpu-node-1", "startTime": TIME}, "pods": list(pods)}).encode()


def test_cadvisor_with_interfaces() -> None:
    body = summary(
        pod_stats("ml", "worker-0", from_cadvisor([("eth0", 2_000, 1_000), ("net1", 300, 400), ("lo", 9, 9)]))
    )
    found = summary_from_bytes(body, "kubelet")
    assert found.pods == (PodNetwork("ml", "worker-0", transmit_bytes=1_400, receive_bytes=2_300,
                                     interfaces=("eth0", "net1")),)  # fmt: skip
    assert found.malformed == 0


def test_cadvisor_without_eth0_reads_the_list_not_the_empty_default() -> None:
    network = from_cadvisor([("net1", 50, 60)])
    assert network["name"] == "" and network["interfaces"]
    found = summary_from_bytes(summary(pod_stats("ml", "sriov-only", network)), "kubelet")
    assert [(p.pod, p.receive_bytes, p.transmit_bytes) for p in found.pods] == [("sriov-only", 50, 60)]


@pytest.mark.parametrize(
    "network",
    [
        from_cadvisor([]),  # cAdvisor found no interface
        from_cri(("", None, None), []),  # the runtime reported none
    ],
    ids=["cadvisor", "cri"],
)
def test_without_interfaces_a_pod_has_no_interface_data_and_is_not_malformed(network: dict[str, Any]) -> None:
    assert network == {"time": TIME, "name": ""}, "what the kubelet sends, per types.go and its writers"
    found = summary_from_bytes(summary(pod_stats("ml", "no-interfaces", network)), "kubelet")
    assert found.pods == () and found.malformed == 0


def test_cri_default_interface_and_list() -> None:
    network = from_cri(("eth0", 700, 800), [("eth0", 700, 800), ("net1", 1, 2)])
    found = summary_from_bytes(summary(pod_stats("ml", "worker-1", network)), "kubelet")
    assert [(p.receive_bytes, p.transmit_bytes, p.interfaces) for p in found.pods] == [(701, 802, ("eth0", "net1"))]


def test_a_default_interface_without_counters_counts_zero() -> None:
    """criInterfaceToSummary leaves a counter the runtime did not give as a nil pointer: omitted."""
    network = from_cri(("eth0", None, None), [])
    assert network == {"time": TIME, "name": "eth0"}
    found = pod_networks(json.loads(summary(pod_stats("ml", "quiet", network))))
    assert [(p.receive_bytes, p.transmit_bytes) for p in found.pods] == [(0, 0)]


def test_no_network_stats_at_all() -> None:
    """cadvisorInfoToNetworkStats returns nil without HasNetwork: ``network`` is omitted."""
    found = summary_from_bytes(summary(pod_stats("ml", "starting", None)), "kubelet")
    assert found.pods == () and found.malformed == 0


def test_our_simulated_kubelet_writes_what_the_kubelet_writes() -> None:
    """summary_document (the simulated node's kubelet) has the kubelet's shape, error counters aside."""

    def shape(network: dict[str, Any]) -> dict[str, Any]:
        def counters(entry: dict[str, Any]) -> dict[str, Any]:
            return {k: v for k, v in entry.items() if k not in ("rxErrors", "txErrors", "time", "interfaces")}

        return {**counters(network), "interfaces": [counters(i) for i in network.get("interfaces", [])]}

    ours = summary_document([("ml", "a", {"net1": (3, 4), "eth0": (1, 2)}), ("ml", "b", {})])
    expected = (from_cadvisor([("net1", 3, 4), ("eth0", 1, 2)]), from_cadvisor([]))
    assert [shape(entry["network"]) for entry in ours["pods"]] == [shape(network) for network in expected]
    assert "interfaces" not in ours["pods"][1]["network"], "an empty list is omitted (omitempty)"


class _Summary:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def read(self) -> Any:
        return summary_from_bytes(self.body, "kubelet")


class _GpuPods:
    """Pod resources naming the GPU pods (the collector asks which pods hold GPUs first)."""

    def __init__(self, *pods: tuple[str, str]) -> None:
        from exporter.sources.podresources import GpuAssignment, PodResourcesListing

        self._listing = PodResourcesListing(
            gpus=tuple(GpuAssignment(device_id=f"GPU-{pod}", resource="nvidia.com/gpu", namespace=namespace, pod=pod,
                                     container="trainer") for namespace, pod in pods))  # fmt: skip

    def listing(self) -> Any:
        return self._listing


def test_the_collector_succeeds_and_calls_a_pod_without_interfaces_unreported() -> None:
    body = summary(
        pod_stats("ml", "with", from_cadvisor([("eth0", 5, 6)])),
        pod_stats("ml", "without", from_cadvisor([])),
    )
    collector = PodNetworkCollector(_Summary(body), _GpuPods(("ml", "with"), ("ml", "without")))  # type: ignore[arg-type]
    try:
        samples = {(s.name, s.labels["pod"]): s.value for family in collector.collect() for s in family.samples}
    except PartialCollection as exc:  # what a pod without interfaces used to cause
        pytest.fail(f"the collector reported a failure: {exc}")
    assert samples == {
        ("ccl_gpu_pod_network_transmit_bytes_total", "with"): 6.0,
        ("ccl_gpu_pod_network_receive_bytes_total", "with"): 5.0,
        ("ccl_gpu_pod_network_unreported", "without"): 1.0,
    }

"""Parity with the real node_exporter infiniband collector on the same sysfs tree.

Debian's ``prometheus-node-exporter`` is started with ``--path.sysfs`` on a fixture tree; every
value it exposes that we expose too must be equal. Every ``node_infiniband_*`` family must be
known to the mapping below, so a new node_exporter family cannot slip through unchecked.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.collectors.rdma import RdmaCollector
from tests.conftest import free_port, require_tool, wait_http
from tests.metrics_text import samples, scrape_collectors

Labels = tuple[tuple[str, str], ...]

# node_exporter sample name -> (our sample name, extra labels on ours)
SAME = {
    "node_infiniband_state_id": ("ccl_rdma_port_state_id", {}),
    "node_infiniband_physical_state_id": ("ccl_rdma_port_physical_state_id", {}),
    "node_infiniband_rate_bytes_per_second": ("ccl_rdma_port_rate_bytes_per_second", {}),
    "node_infiniband_port_data_transmitted_bytes_total": ("ccl_rdma_port_transmit_bytes_total", {}),
    "node_infiniband_port_data_received_bytes_total": ("ccl_rdma_port_receive_bytes_total", {}),
    "node_infiniband_port_packets_transmitted_total": ("ccl_rdma_port_transmit_packets_total", {}),
    "node_infiniband_port_packets_received_total": ("ccl_rdma_port_receive_packets_total", {}),
    "node_infiniband_unicast_packets_transmitted_total": (
        "ccl_rdma_port_cast_packets_total",
        {"cast": "unicast", "direction": "transmit"},
    ),
    "node_infiniband_unicast_packets_received_total": (
        "ccl_rdma_port_cast_packets_total",
        {"cast": "unicast", "direction": "receive"},
    ),
    "node_infiniband_multicast_packets_transmitted_total": (
        "ccl_rdma_port_cast_packets_total",
        {"cast": "multicast", "direction": "transmit"},
    ),
    "node_infiniband_multicast_packets_received_total": (
        "ccl_rdma_port_cast_packets_total",
        {"cast": "multicast", "direction": "receive"},
    ),
    # congestion ticks, not an error: a family of its own, as node_exporter's
    "node_infiniband_port_transmit_wait_total": ("ccl_rdma_port_transmit_wait_total", {}),
}
# Pre-4.5 kernels' counters_ext/ 64-bit files: node_exporter exposes them as "legacy_" families;
# we use them in place of the 32-bit counters/ files for the same port.
LEGACY = {
    "node_infiniband_legacy_data_transmitted_bytes_total": "node_infiniband_port_data_transmitted_bytes_total",
    "node_infiniband_legacy_data_received_bytes_total": "node_infiniband_port_data_received_bytes_total",
    "node_infiniband_legacy_packets_transmitted_total": "node_infiniband_port_packets_transmitted_total",
    "node_infiniband_legacy_packets_received_total": "node_infiniband_port_packets_received_total",
    "node_infiniband_legacy_unicast_packets_transmitted_total": "node_infiniband_unicast_packets_transmitted_total",
    "node_infiniband_legacy_unicast_packets_received_total": "node_infiniband_unicast_packets_received_total",
    "node_infiniband_legacy_multicast_packets_transmitted_total": "node_infiniband_multicast_packets_transmitted_total",
    "node_infiniband_legacy_multicast_packets_received_total": "node_infiniband_multicast_packets_received_total",
}
# node_exporter error/health families -> the sysfs counters/ file name (our `counter` label).
ERRORS = {
    "node_infiniband_symbol_error_total": "symbol_error",
    "node_infiniband_link_downed_total": "link_downed",
    "node_infiniband_link_error_recovery_total": "link_error_recovery",
    "node_infiniband_port_errors_received_total": "port_rcv_errors",
    "node_infiniband_port_discards_received_total": "port_rcv_discards",
    "node_infiniband_port_discards_transmitted_total": "port_xmit_discards",
    "node_infiniband_port_receive_remote_physical_errors_total": "port_rcv_remote_physical_errors",
    "node_infiniband_port_receive_switch_relay_errors_total": "port_rcv_switch_relay_errors",
    "node_infiniband_local_link_integrity_errors_total": "local_link_integrity_errors",
    "node_infiniband_excessive_buffer_overrun_errors_total": "excessive_buffer_overrun_errors",
    "node_infiniband_vl15_dropped_total": "VL15_dropped",
    "node_infiniband_port_constraint_errors_received_total": "port_rcv_constraint_errors",
    "node_infiniband_port_constraint_errors_transmitted_total": "port_xmit_constraint_errors",
}
INFO = "node_infiniband_info"


def node_exporter_metrics(binary: str, sysfs: Path) -> str:
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            f"--path.sysfs={sysfs}",
            "--collector.disable-defaults",
            "--collector.infiniband",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        return wait_http(f"http://127.0.0.1:{port}/metrics")
    finally:
        proc.terminate()
        proc.wait(10)


def our_metrics(sysfs: Path) -> str:
    return scrape_collectors(RdmaCollector(sysfs))


def with_labels(labels: Labels, extra: dict[str, str]) -> Labels:
    return tuple(sorted({**dict(labels), **extra}.items()))


def compare(node_text: str, ours_text: str) -> Iterator[str]:
    """Yield one line per disagreement; also checks that node_exporter read the tree."""
    theirs = samples(node_text)
    ours = samples(ours_text)
    assert theirs.get(("node_scrape_collector_success", (("collector", "infiniband"),))) == 1.0, (
        "node_exporter could not read this tree"
    )
    legacy_ports = {(name, labels) for (name, labels) in theirs if name in LEGACY}
    overridden = {(LEGACY[name], labels) for name, labels in legacy_ports}
    compared = 0
    for (name, labels), value in sorted(theirs.items()):
        if not name.startswith("node_infiniband_"):
            continue
        if name in SAME or name in LEGACY:
            if (name, labels) in overridden:
                continue  # the 32-bit file; we expose the 64-bit counters_ext value instead
            our_name, extra = SAME[LEGACY.get(name, name)]
            key = (our_name, with_labels(labels, extra))
        elif name in ERRORS:
            key = ("ccl_rdma_port_errors_total", with_labels(labels, {"counter": ERRORS[name]}))
        elif name == INFO:
            facts = dict(labels)
            matching = [
                lab for (n, lab) in ours if n == "ccl_rdma_port_info" and dict(lab)["device"] == facts["device"]
            ]
            if not matching:
                yield f"{INFO} {facts}: no ccl_rdma_port_info for the device"
            for lab in matching:
                mine = dict(lab)
                for fact in ("board_id", "firmware_version", "hca_type"):
                    if mine[fact] != facts.get(fact, ""):
                        yield f"{fact} of {facts['device']}: node_exporter {facts.get(fact)!r}, ours {mine[fact]!r}"
            compared += 1
            continue
        else:
            yield f"unmapped node_exporter family {name}: extend the mapping in this test"
            continue
        compared += 1
        if key not in ours:
            yield f"{name}{dict(labels)} = {value}: we have no {key}"
        elif ours[key] != value:
            yield f"{name}{dict(labels)}: node_exporter {value!r}, ours {ours[key]!r}"
    assert compared > 0


@pytest.mark.parametrize("fixture", ["sysfs_rdma"])
def test_parity_with_node_exporter(fixture_tree, fixture: str) -> None:  # type: ignore[no-untyped-def]
    binary = require_tool("prometheus-node-exporter")
    sysfs = fixture_tree(fixture)
    problems = list(compare(node_exporter_metrics(binary, sysfs), our_metrics(sysfs)))
    assert problems == []


def test_parity_on_the_simulated_node(tmp_path: Path) -> None:
    """The simulator's tree, after some traffic, is read identically by both."""
    from ccl_sim.node import default_node

    binary = require_tool("prometheus-node-exporter")
    node = default_node(tmp_path)
    node.setup()
    try:
        for _ in range(3):
            node.advance(1.0)
        problems = list(compare(node_exporter_metrics(binary, node.sysfs), our_metrics(node.sysfs)))
    finally:
        node.close()
    assert problems == []


def test_parity_catches_a_difference(fixture_tree) -> None:  # type: ignore[no-untyped-def]
    """The comparison itself can fail: change one counter under our reader only."""
    binary = require_tool("prometheus-node-exporter")
    sysfs = fixture_tree("sysfs_rdma")
    node_text = node_exporter_metrics(binary, sysfs)
    counter = sysfs / "devices/pci0000:00/0000:00:00.0/infiniband/mlx5_0/ports/1/counters/symbol_error"
    counter.write_text("2\n")
    problems = list(compare(node_text, our_metrics(sysfs)))
    assert problems == [
        "node_infiniband_symbol_error_total{'device': 'mlx5_0', 'port': '1'}: node_exporter 1, ours 2.0"
    ]


def test_rule_tests_use_the_labels_node_exporter_prints(fixture_tree) -> None:  # type: ignore[no-untyped-def]
    """alerts/tests/node-exporter-test.yaml feeds the rules node_infiniband_* series by hand; each
    must carry exactly the labels the real node_exporter gives that family (plus the target
    labels instance, job and node of a scrape), and exist in its output."""
    import re

    from tests.conftest import REPO

    binary = require_tool("prometheus-node-exporter")
    real: dict[str, set[str]] = {}
    for name, labels in samples(node_exporter_metrics(binary, fixture_tree("sysfs_rdma"))):
        real.setdefault(name, set()).update(key for key, _ in labels)
    target = {"instance", "job", "node"}
    used = re.findall(
        r"series: '(node_infiniband_\w+)\{([^}]*)\}'",
        (REPO / "alerts" / "tests" / "node-exporter-test.yaml").read_text(),
    )
    assert {name for name, _ in used} >= {
        "node_infiniband_info",
        "node_infiniband_state_id",
        "node_infiniband_port_data_transmitted_bytes_total",
    }
    for name, body in used:
        assert name in real, f"node_exporter prints no {name}"
        labels = set(re.findall(r'(\w+)="', body)) - target
        assert labels == real[name], f"{name}: the test uses {sorted(labels)}, node_exporter {sorted(real[name])}"

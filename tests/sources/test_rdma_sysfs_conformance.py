"""RDMA sysfs files as the kernel documents them: each one in the family its meaning calls for.

The tree is built here from the kernel's ``Documentation/ABI/stable/sysfs-class-infiniband``
(torvalds/linux, as read at 031616c434db): every file its "What:" lines name under
``ports/<port-num>/counters/`` (the "Errors info", "Data info" and "Misc info" of the
PortCounters attribute) and ``ports/<port-num>/hw_counters/lifespan`` ("configures how frequently
the core should update the counters ... in milliseconds and defaults to 10"), each given a value
of its own so that where it lands shows.
"""

from __future__ import annotations

from pathlib import Path

from exporter.collectors.rdma import RdmaCollector
from tests.metrics_text import samples, scrape_collectors

# The ABI document's counters/ files, by the section of its description.
ERRORS_INFO = (
    "symbol_error",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    # the What: line spells the second "port_rcv_contraint_errors"; its description and the kernel spell it so:
    "link_error_recovery",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
)
DATA_INFO = (
    "port_xmit_data",
    "port_rcv_data",
    "port_xmit_packets",
    "port_rcv_packets",
    "link_downed",
    "unicast_rcv_packets",
    "unicast_xmit_packets",
    "multicast_rcv_packets",
    "multicast_xmit_packets",
)
MISC_INFO = ("port_xmit_discards", "VL15_dropped", "port_xmit_wait")
# What each file counts: error-like events (errors family), or something else.
COUNTS_FAULTS = set(ERRORS_INFO) | {"link_downed", "port_xmit_discards", "VL15_dropped"}


def _tree(root: Path) -> dict[str, int]:
    port = root / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    values = {name: 1000 + index for index, name in enumerate(ERRORS_INFO + DATA_INFO + MISC_INFO)}
    (port / "counters").mkdir(parents=True)
    for name, value in values.items():
        (port / "counters" / name).write_text(f"{value}\n")
    (port / "hw_counters").mkdir()
    (port / "hw_counters" / "lifespan").write_text("10\n")  # the documented default, in milliseconds
    (port / "hw_counters" / "np_cnp_sent").write_text("77\n")
    for name, text in (("state", "4: ACTIVE"), ("phys_state", "5: LinkUp"), ("link_layer", "Ethernet"),
                       ("rate", "400 Gb/sec (4X NDR)")):  # fmt: skip
        (port / name).write_text(text + "\n")
    return values


def test_every_documented_file_lands_where_its_meaning_says(tmp_path: Path) -> None:
    values = _tree(tmp_path)
    found = samples(scrape_collectors(RdmaCollector(tmp_path)))
    port = (("device", "mlx5_0"), ("port", "1"))

    def get(name: str, **labels: str) -> float | None:
        return found.get((name, tuple(sorted((*port, *labels.items())))))

    errors = {dict(labels)["counter"] for name, labels in found if name == "ccl_rdma_port_errors_total"}
    assert errors == COUNTS_FAULTS
    for counter in COUNTS_FAULTS:
        assert get("ccl_rdma_port_errors_total", counter=counter) == values[counter]
    # "Total number of data octets, divided by 4 (lanes)": bytes are the file times 4
    assert get("ccl_rdma_port_transmit_bytes_total") == 4 * values["port_xmit_data"]
    assert get("ccl_rdma_port_receive_bytes_total") == 4 * values["port_rcv_data"]
    assert get("ccl_rdma_port_transmit_packets_total") == values["port_xmit_packets"]
    assert (
        get("ccl_rdma_port_cast_packets_total", cast="multicast", direction="receive")
        == values["multicast_rcv_packets"]
    )
    # "ticks during which the port had data to transmit but no data was sent": congestion, its own family
    assert get("ccl_rdma_port_transmit_wait_total") == values["port_xmit_wait"]
    # lifespan "configures how frequently the core should update the counters": a setting, in seconds
    assert get("ccl_rdma_port_hw_counters_lifespan_seconds") == 0.010
    assert get("ccl_rdma_port_hw_counters_total", counter="lifespan") is None
    assert get("ccl_rdma_port_hw_counters_total", counter="np_cnp_sent") == 77
    node_errors = {dict(labels)["counter"] for name, labels in found if name == "ccl_rdma_node_errors_total"}
    assert node_errors == COUNTS_FAULTS, "the node summary sums the same error counters"

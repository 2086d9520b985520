"""RDMA port collector: ``ccl_rdma_port_*`` from ``<sysfs>/class/infiniband``, and the node's
summary over its ports, ``ccl_rdma_node_*``.

The summary is what the node-level rules read: one series per node (per counter for the error
counters) instead of one per port, so that a fleet's rule cost grows with nodes, not with
nodes x ports x counters (docs/scaling.md). Its counters are sums over the ports that only
ever grow (``exporter.collectors.counter_sums``): a port whose counter resets, or that goes
away, never makes ``rate`` see a false reset.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterable, Mapping
from pathlib import Path

from prometheus_client.metrics_core import Metric

from exporter.collectors.base import CollectorSpec, CollectorUnavailable, PartialCollection
from exporter.collectors.counter_sums import CounterSums, PartCounters
from exporter.collectors.rows import RowFamily
from exporter.sources.rdma import (
    ACTIVE_PORT_STATES,
    PHYSICAL_PORT_STATES,
    PORT_STATES,
    RdmaDevice,
    RdmaPort,
    read_rdma,
)
from exporter.sources.sysfs import AttributeReader, HeldFolders, read_attribute

PORT_LABELS = ["device", "port"]
# The node summary's counters, by name in CounterSums: the bytes, each error counter, and the
# congestion notification counters of RoCE ports.
_NODE_BYTES = ("transmit", "receive")
_ERROR_PREFIX = "error:"
_CNP_PREFIX = "cnp:"
ROCE_CNP_COUNTERS = ("np_cnp_sent", "rp_cnp_handled")  # hw_counters: CNPs a port sent / acted on (DCQCN)
# The whole the node summary sums over: the node itself (one per exporter).
_NODE = "node"


def _names(states: dict[int, str]) -> str:
    """``{1: "DOWN", 4: "ACTIVE"}`` -> ``"1 DOWN, 4 ACTIVE"``, for a HELP text."""
    return ", ".join(f"{ident} {name}" for ident, name in states.items())


class RdmaCollector:
    name = "rdma"

    def __init__(self, sysfs: Path, reader: AttributeReader = read_attribute) -> None:
        self._sysfs = sysfs
        self._reader = reader
        self._sums = CounterSums()
        # A scrape whose collector ran past its timeout may still be reading when the next one
        # starts: readings reach the sums one at a time and in the order they were taken.
        self._reading = threading.Lock()
        # The counter files stay open between scrapes (one pread per value); read under the lock.
        self._held = HeldFolders()

    def close(self) -> None:
        with self._reading:
            self._held.close()

    def collect(self) -> Iterable[Metric]:
        with self._reading:
            reading = read_rdma(self._sysfs, self._reader, self._held)
            if not reading.class_present:
                raise CollectorUnavailable(f"no {self._sysfs}/class/infiniband on this node")
            ports = [port for device in reading.devices for port in device.ports]
            parts: PartCounters = [((port.device, port.port), _port_counters(port)) for port in ports]
            wholes: dict[Hashable, PartCounters] = {_NODE: parts}
            totals = self._sums.update(wholes, complete=not reading.problems).get(_NODE, {})
        yield from self.families(reading.devices)
        yield from self.node_families(reading.devices, totals)
        if reading.problems:
            raise PartialCollection("; ".join(reading.problems[:5]))

    @staticmethod
    def families(devices: Iterable[RdmaDevice]) -> list[Metric]:
        info = RowFamily(
            "ccl_rdma_port_info",
            "RDMA port facts from sysfs; always 1. link_layer InfiniBand or Ethernet (RoCE); "
            "netdev is the port's network interface (gid_attrs/ndevs or device/net).",
            typ="gauge",
            labels=PORT_LABELS + ["link_layer", "netdev", "hca_type", "firmware_version", "board_id"],
        )
        state = RowFamily(
            "ccl_rdma_port_state_id",
            f"Logical port state from ports/<n>/state: {_names(PORT_STATES)}.",
            typ="gauge",
            labels=PORT_LABELS,
        )
        phys = RowFamily(
            "ccl_rdma_port_physical_state_id",
            f"Physical port state from ports/<n>/phys_state: {_names(PHYSICAL_PORT_STATES)}.",
            typ="gauge",
            labels=PORT_LABELS,
        )
        rate = RowFamily(
            "ccl_rdma_port_rate_bytes_per_second",
            "Negotiated port rate from ports/<n>/rate (Gb/s x 125000000).",
            typ="gauge",
            labels=PORT_LABELS,
        )
        tx_bytes = RowFamily(
            "ccl_rdma_port_transmit_bytes_total",
            "Bytes transmitted: counters/port_xmit_data (or counters_ext/port_xmit_data_64) x 4, "
            "since sysfs counts 4-octet words.",
            typ="counter",
            labels=PORT_LABELS,
        )
        rx_bytes = RowFamily(
            "ccl_rdma_port_receive_bytes_total",
            "Bytes received: counters/port_rcv_data (or counters_ext/port_rcv_data_64) x 4.",
            typ="counter",
            labels=PORT_LABELS,
        )
        tx_packets = RowFamily(
            "ccl_rdma_port_transmit_packets_total",
            "Packets transmitted: counters/port_xmit_packets (or counters_ext/..._64).",
            typ="counter",
            labels=PORT_LABELS,
        )
        rx_packets = RowFamily(
            "ccl_rdma_port_receive_packets_total",
            "Packets received: counters/port_rcv_packets (or counters_ext/..._64).",
            typ="counter",
            labels=PORT_LABELS,
        )
        cast_packets = RowFamily(
            "ccl_rdma_port_cast_packets_total",
            "Unicast and multicast packets by direction, from counters/{unicast,multicast}_"
            "{xmit,rcv}_packets (or counters_ext/port_...).",
            typ="counter",
            labels=PORT_LABELS + ["cast", "direction"],
        )
        errors = RowFamily(
            "ccl_rdma_port_errors_total",
            "Every other counters/ file, each an error or discard count (symbol_error, link_downed, "
            "link_error_recovery, port_rcv_errors, port_xmit_discards, ...); counter = file name.",
            typ="counter",
            labels=PORT_LABELS + ["counter"],
        )
        wait = RowFamily(
            "ccl_rdma_port_transmit_wait",
            "Ticks during which the port had data to transmit but sent none (no credits, or lost "
            "arbitration): congestion, not an error; counters/port_xmit_wait. The tick is the device's "
            "sampling tick, so compare rates of one device model.",
            typ="counter",
            labels=PORT_LABELS,
        )
        hw = RowFamily(
            "ccl_rdma_port_hw_counters_total",
            "Driver hw_counters/ files (RoCE np_cnp_sent, rp_cnp_handled, out_of_sequence, "
            "local_ack_timeout_err, out_of_buffer, ...), lifespan aside; counter = file name.",
            typ="counter",
            labels=PORT_LABELS + ["counter"],
        )
        lifespan = RowFamily(
            "ccl_rdma_port_hw_counters_lifespan_seconds",
            "How long the kernel keeps the hw_counters values it read before reading the device again "
            "(hw_counters/lifespan, a setting in milliseconds: default 0.01 s, at most 10 s); "
            "ccl_rdma_port_hw_counters_total is at most this old.",
            typ="gauge",
            labels=PORT_LABELS,
        )

        def add(family: RowFamily, labels: list[str], value: int | None) -> None:
            if value is not None:
                family.add(labels, float(value))

        for device in devices:
            for p in device.ports:
                labels = [p.device, str(p.port)]
                info.add(
                    labels
                    + [
                        p.link_layer or "",
                        p.netdev or "",
                        device.hca_type or "",
                        device.firmware_version or "",
                        device.board_id or "",
                    ],
                    1.0,
                )
                add(state, labels, p.state_id)
                add(phys, labels, p.physical_state_id)
                add(rate, labels, p.rate_bytes_per_second)
                add(tx_bytes, labels, p.transmit_bytes)
                add(rx_bytes, labels, p.receive_bytes)
                add(tx_packets, labels, p.transmit_packets)
                add(rx_packets, labels, p.receive_packets)
                _add_cast(cast_packets, labels, p)
                for counter, value in sorted(p.errors.items()):
                    errors.add(labels + [counter], float(value))
                add(wait, labels, p.transmit_wait)
                for counter, value in sorted(p.hw_counters.items()):
                    hw.add(labels + [counter], float(value))
                if p.hw_counters_lifespan_ms is not None:
                    lifespan.add(labels, p.hw_counters_lifespan_ms / 1000)
        return [
            info, state, phys, rate, tx_bytes, rx_bytes, tx_packets, rx_packets, cast_packets, errors, wait, hw,
            lifespan,
        ]  # fmt: skip

    @staticmethod
    def node_families(devices: Iterable[RdmaDevice], totals: Mapping[str, float]) -> list[Metric]:
        """``ccl_rdma_node_*``: the node's ports, ACTIVE ports, ACTIVE ports slower than their peers,
        and its counters summed over its ports (``totals`` from ``CounterSums.update``)."""
        devices = list(devices)
        ports = [port for device in devices for port in device.ports]
        count = RowFamily(
            "ccl_rdma_node_ports", "RDMA ports of the node (the ccl_rdma_port_info series).", typ="gauge", labels=[]
        )
        active = RowFamily(
            "ccl_rdma_node_ports_active",
            "RDMA ports of the node in logical state ACTIVE or ACTIVE_DEFER (ccl_rdma_port_state_id 4 or 5).",
            typ="gauge",
            labels=[],
        )
        traffic = {
            name: RowFamily(
                f"ccl_rdma_node_{name}_bytes_total",
                f"Bytes {'transmitted' if name == 'transmit' else 'received'} by all RDMA ports of the node: the "
                f"sum of ccl_rdma_port_{name}_bytes_total over its ports, never decreasing.",
                typ="counter",
                labels=[],
            )
            for name in _NODE_BYTES
        }
        errors = RowFamily(
            "ccl_rdma_node_errors_total",
            "Error counters of all RDMA ports of the node, by counter: the sum of ccl_rdma_port_errors_total "
            "over its ports, never decreasing.",
            typ="counter",
            labels=["counter"],
        )
        degraded = RowFamily(
            "ccl_rdma_node_ports_rate_degraded",
            "ACTIVE RDMA ports of the node whose rate is below the fastest ACTIVE port of the same link layer and "
            "HCA model on the node (a link trained down in width or speed).",
            typ="gauge",
            labels=[],
        )
        cnp = RowFamily(
            "ccl_rdma_node_roce_cnp_total",
            "Congestion notification packets of the node's RoCE (link layer Ethernet) ports, by hw_counters "
            "counter (np_cnp_sent, rp_cnp_handled): the sum over those ports, never decreasing.",
            typ="counter",
            labels=["counter"],
        )
        count.add([], float(len(ports)))
        active.add([], float(sum(1 for port in ports if port.state_id in ACTIVE_PORT_STATES)))
        for name, family in traffic.items():
            if name in totals:
                family.add([], totals[name])
        degraded.add([], float(_rate_degraded_ports(devices)))
        for name, value in sorted(totals.items()):
            if name.startswith(_ERROR_PREFIX):
                errors.add([name.removeprefix(_ERROR_PREFIX)], value)
            elif name.startswith(_CNP_PREFIX):
                cnp.add([name.removeprefix(_CNP_PREFIX)], value)
        return [count, active, *traffic.values(), errors, degraded, cnp]


def _rate_degraded_ports(devices: Iterable[RdmaDevice]) -> int:
    """ACTIVE ports whose rate is below the fastest ACTIVE port of their (link layer, HCA model)."""
    peers: dict[tuple[str | None, str | None], list[int]] = {}
    for device in devices:
        for port in device.ports:
            if port.state_id in ACTIVE_PORT_STATES and port.rate_bytes_per_second is not None:
                peers.setdefault((port.link_layer, device.hca_type), []).append(port.rate_bytes_per_second)
    return sum(1 for rates in peers.values() for rate in rates if rate < max(rates))


def _port_counters(port: RdmaPort) -> dict[str, float]:
    """A port's counters the node summary sums, by name: the bytes, each error counter and, on a RoCE
    port, the CNP counters."""
    found = {
        name: float(value)
        for name, value in zip(_NODE_BYTES, (port.transmit_bytes, port.receive_bytes), strict=True)
        if value is not None
    }
    found.update({_ERROR_PREFIX + counter: float(value) for counter, value in port.errors.items()})
    if port.link_layer == "Ethernet":
        found.update(
            {
                _CNP_PREFIX + name: float(port.hw_counters[name])
                for name in ROCE_CNP_COUNTERS
                if name in port.hw_counters
            }
        )
    return found


def _add_cast(family: RowFamily, labels: list[str], port: RdmaPort) -> None:
    for (cast, direction), value in sorted(port.cast_packets.items()):
        family.add(labels + [cast, direction], float(value))


SPEC = CollectorSpec(
    name="rdma",
    help="RDMA (InfiniBand/RoCE) port state, rate and counters from sysfs",
    default_enabled=True,
    factory=lambda settings, resources: RdmaCollector(resources.paths.sysfs),
)

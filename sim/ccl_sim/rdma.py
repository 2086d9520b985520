"""Simulated ``/sys/class/infiniband``: 8 x NDR 400 Gb/s InfiniBand + 2 x 200 GbE RoCE ports.

Counters advance with the simulated job's load: IB data counters at up to ~40 GB/s per port
(4-octet words, as the hardware counts), packets at 4 KiB MTU, a rare symbol error, and
RoCE ports with CNP/ECN congestion counters in hw_counters/.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path

from ccl_sim.clock import SimClock
from ccl_sim.paths import simulated_paths

IB_COUNTERS = (
    "VL15_dropped excessive_buffer_overrun_errors link_downed link_error_recovery "
    "local_link_integrity_errors multicast_rcv_packets multicast_xmit_packets "
    "port_rcv_constraint_errors port_rcv_data port_rcv_errors port_rcv_packets "
    "port_rcv_remote_physical_errors port_rcv_switch_relay_errors port_xmit_constraint_errors "
    "port_xmit_data port_xmit_discards port_xmit_packets port_xmit_wait symbol_error "
    "unicast_rcv_packets unicast_xmit_packets"
).split()
HW_COUNTERS = (
    "duplicate_request implied_nak_seq_err local_ack_timeout_err np_cnp_sent "
    "np_ecn_marked_roce_packets out_of_buffer out_of_sequence packet_seq_err req_cqe_error "
    "req_cqe_flush_error req_remote_access_errors req_remote_invalid_request resp_cqe_error "
    "resp_cqe_flush_error resp_local_length_error resp_remote_access_errors rnr_nak_retry_err "
    "roce_adp_retrans roce_adp_retrans_to roce_slow_restart roce_slow_restart_cnps "
    "roce_slow_restart_trans rp_cnp_handled rp_cnp_ignored rx_atomic_requests rx_dct_connect "
    "rx_icrc_encapsulated rx_read_requests rx_write_requests"
).split()


@dataclass(frozen=True)
class SimPortSpec:
    device: str
    link_layer: str  # "InfiniBand" | "Ethernet"
    rate: str
    peak_bytes_per_second: float
    netdev: str
    board_id: str
    hca_type: str


def default_ports() -> list[SimPortSpec]:
    ports = [
        SimPortSpec(f"mlx5_{i}", "InfiniBand", "400 Gb/sec (4X NDR)", 40e9, f"ib{i}", "MT_0000000838", "MT4129")
        for i in range(8)
    ]
    ports += [
        SimPortSpec(f"mlx5_{i}", "Ethernet", "200 Gb/sec (4X HDR)", 5e9, f"eth{i - 8}", "MT_0000000359", "MT4125")
        for i in (8, 9)
    ]
    return ports


def write_attribute(path: Path, value: object) -> None:
    """Write a sysfs-like attribute (value + newline) atomically, so readers never see half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{value}\n")
    os.replace(tmp, path)


@dataclass
class SimRdma:
    rng: random.Random
    ports: list[SimPortSpec] = field(default_factory=default_ports)
    counters: dict[tuple[str, str], int] = field(default_factory=dict)
    root: Path | None = None
    quiet_devices: set[str] = field(default_factory=set)  # ports with no traffic (down, or job gone)
    flushed: dict[tuple[str, str], int] = field(default_factory=dict)  # what each counter file holds

    def _port_dir(self, spec: SimPortSpec) -> Path:
        assert self.root is not None
        return simulated_paths(self.root).sysfs / "class" / "infiniband" / spec.device / "ports" / "1"

    def setup(self, root: Path) -> None:
        self.root = root
        for spec in self.ports:
            dev = simulated_paths(root).sysfs / "class" / "infiniband" / spec.device
            write_attribute(dev / "fw_ver", "28.39.1002")
            write_attribute(dev / "board_id", spec.board_id)
            write_attribute(dev / "hca_type", spec.hca_type)
            write_attribute(dev / "node_type", "1: CA")
            port = self._port_dir(spec)
            write_attribute(port / "state", "4: ACTIVE")
            write_attribute(port / "phys_state", "5: LinkUp")
            write_attribute(port / "rate", spec.rate)
            write_attribute(port / "link_layer", spec.link_layer)
            write_attribute(port / "gid_attrs" / "ndevs" / "0", spec.netdev)
            for name in IB_COUNTERS:
                self.counters[(spec.device, f"counters/{name}")] = 0
            if spec.link_layer == "Ethernet":
                for name in HW_COUNTERS:
                    self.counters[(spec.device, f"hw_counters/{name}")] = 0
                # a setting, not a counter: milliseconds the kernel keeps hw_counters values (default 10)
                write_attribute(port / "hw_counters" / "lifespan", 10)
            else:
                for name in ("out_of_sequence", "local_ack_timeout_err", "out_of_buffer"):
                    self.counters[(spec.device, f"hw_counters/{name}")] = 0
        self._flush()

    def _bump(self, device: str, name: str, amount: float) -> None:
        key = (device, name)
        self.counters[key] = self.counters.get(key, 0) + max(0, int(amount))

    def advance(self, clock: SimClock) -> None:
        for spec in self.ports:
            load = clock.job_activity * self.rng.uniform(0.85, 1.0)
            if spec.device in self.quiet_devices:
                load = 0.0
            tx = spec.peak_bytes_per_second * load * clock.step_seconds
            rx = tx * self.rng.uniform(0.97, 1.03)
            d = spec.device
            self._bump(d, "counters/port_xmit_data", tx / 4)
            self._bump(d, "counters/port_rcv_data", rx / 4)
            self._bump(d, "counters/port_xmit_packets", tx / 4096)
            self._bump(d, "counters/port_rcv_packets", rx / 4096)
            self._bump(d, "counters/unicast_xmit_packets", tx / 4096)
            self._bump(d, "counters/unicast_rcv_packets", rx / 4096)
            self._bump(d, "counters/port_xmit_wait", load * 1000 * clock.step_seconds)
            if self.rng.random() < 0.002 * clock.step_seconds:
                self._bump(d, "counters/symbol_error", 1)
            if spec.link_layer == "Ethernet":
                cnp = load * 200 * clock.step_seconds
                self._bump(d, "hw_counters/np_cnp_sent", cnp)
                self._bump(d, "hw_counters/rp_cnp_handled", cnp * 0.98)
                self._bump(d, "hw_counters/np_ecn_marked_roce_packets", cnp * 1.1)
                self._bump(d, "hw_counters/rx_write_requests", tx / 65536)
                self._bump(d, "hw_counters/rx_read_requests", tx / 1048576)
        self._flush()

    def _flush(self) -> None:
        """Write the counters whose value moved since their file was last written."""
        by_device = {spec.device: spec for spec in self.ports}
        for (device, name), value in self.counters.items():
            if self.flushed.get((device, name)) != value:
                write_attribute(self._port_dir(by_device[device]) / name, value)
                self.flushed[(device, name)] = value

    def set_port_state(self, device: str, state: str, phys_state: str) -> None:
        """Take a port down (or up) in the simulated tree, for demos and e2e tests.

        A port that is not ACTIVE carries no traffic until it is set ACTIVE again."""
        spec = self.port(device)
        self.set_traffic(device, state.split(":")[0].strip() == "4")
        write_attribute(self._port_dir(spec) / "state", state)
        write_attribute(self._port_dir(spec) / "phys_state", phys_state)

    def port(self, device: str) -> SimPortSpec:
        """The port of ``device``; KeyError names the known devices when there is none."""
        for spec in self.ports:
            if spec.device == device:
                return spec
        raise KeyError(f"no simulated RDMA device {device!r} (have {', '.join(s.device for s in self.ports)})")

    def set_traffic(self, device: str, flowing: bool) -> None:
        """Stop (or restart) the simulated job's traffic on one port; counters then stay flat."""
        self.port(device)
        if flowing:
            self.quiet_devices.discard(device)
        else:
            self.quiet_devices.add(device)

    def write_port_attribute(self, device: str, name: str, value: str) -> None:
        """Overwrite one attribute file of a port (e.g. garbage, as a buggy driver might expose); a
        counter's file gets its value back at the next tick."""
        write_attribute(self._port_dir(self.port(device)) / name, value)
        self.flushed.pop((device, name), None)

"""RDMA ports from ``<sysfs>/class/infiniband`` (InfiniBand, RoCE, iWARP, EFA-style devices).

Per device: ``fw_ver``, ``board_id``, ``hca_type``; per port ``ports/<n>/``: ``state``,
``phys_state`` ("<id>: <NAME>"), ``rate`` ("400 Gb/sec (4X NDR)"), ``link_layer``, the RoCE
netdev (``gid_attrs/ndevs/*`` or the device's ``net/`` folder), ``counters/`` and
``counters_ext/`` (pre-4.5 kernels' 64-bit files) and ``hw_counters/``, each file as the
kernel's ``Documentation/ABI/stable/sysfs-class-infiniband`` describes it: data counters in
4-octet words, ``port_xmit_wait`` in ticks of congestion, ``hw_counters/lifespan`` a setting in
milliseconds, every other file a count.

Unlike procfs, one unreadable value skips that value, one malformed port skips that port's
broken fields, and one malformed device never hides the others. Each problem is recorded in
``RdmaReading.problems`` so the collector can report a partial read.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from exporter.sources.sysfs import (
    AttributeReader,
    HeldFolders,
    attribute_text,
    list_dir,
    parse_uint,
    read_attribute,
    read_counters,
)

CLASS_PATH = ("class", "infiniband")

# counters/ files that count 4-octet words, not octets (multiplied by 4 for bytes).
DATA_WORD_COUNTERS = {"port_xmit_data": "transmit", "port_rcv_data": "receive"}
PACKET_COUNTERS = {"port_xmit_packets": "transmit", "port_rcv_packets": "receive"}
# counters_ext/ (kernels before 4.5): the 64-bit versions win over the 32-bit counters/ ones.
EXT_DATA_WORD_COUNTERS = {"port_xmit_data_64": "transmit", "port_rcv_data_64": "receive"}
EXT_PACKET_COUNTERS = {"port_xmit_packets_64": "transmit", "port_rcv_packets_64": "receive"}
# Packet counters by cast type, from counters/ (and their counters_ext/ names).
CAST_PACKET_COUNTERS = {
    "unicast_xmit_packets": ("unicast", "transmit"),
    "unicast_rcv_packets": ("unicast", "receive"),
    "multicast_xmit_packets": ("multicast", "transmit"),
    "multicast_rcv_packets": ("multicast", "receive"),
}
EXT_CAST_PACKET_COUNTERS = {
    "port_unicast_xmit_packets": ("unicast", "transmit"),
    "port_unicast_rcv_packets": ("unicast", "receive"),
    "port_multicast_xmit_packets": ("multicast", "transmit"),
    "port_multicast_rcv_packets": ("multicast", "receive"),
}
# counters/port_xmit_wait: "the number of ticks during which the port had data to transmit but
# no data was sent during the entire tick (either because of insufficient credits or because of
# lack of arbitration)" (Documentation/ABI/stable/sysfs-class-infiniband): congestion, not an error.
TRANSMIT_WAIT_COUNTER = "port_xmit_wait"
# Everything else in counters/ is an error/health counter (symbol_error, link_downed,
# port_rcv_errors, port_xmit_discards, VL15_dropped, ...).
NOT_ERROR_COUNTERS = (
    frozenset(DATA_WORD_COUNTERS)
    | frozenset(PACKET_COUNTERS)
    | frozenset(CAST_PACKET_COUNTERS)
    | {TRANSMIT_WAIT_COUNTER}
)
# hw_counters/lifespan is not a counter but a setting: how long, in milliseconds, the kernel keeps
# the hw_counters values it read before reading the hardware again (default 10, writable 0-10000;
# the same ABI document).
HW_COUNTERS_LIFESPAN = "lifespan"

# What the ids of ports/<n>/state and ports/<n>/phys_state ("<id>: <name>") mean, as the kernel
# names them (drivers/infiniband/core/sysfs.c; it prints "<unknown>" for physical state 0 and
# "Phy Test" for 7). The values of ccl_rdma_port_state_id and ccl_rdma_port_physical_state_id.
PORT_STATES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
# The logical states that carry traffic: ACTIVE and ACTIVE_DEFER.
ACTIVE_PORT_STATES = frozenset(state for state, name in PORT_STATES.items() if name.startswith("ACTIVE"))
PHYSICAL_PORT_STATES = {
    0: "Unknown",
    1: "Sleep",
    2: "Polling",
    3: "Disabled",
    4: "PortConfigurationTraining",
    5: "LinkUp",
    6: "LinkErrorRecovery",
    7: "PhyTest",
}


@dataclass(frozen=True)
class RdmaPort:
    device: str
    port: int
    state_id: int | None = None
    state: str | None = None
    physical_state_id: int | None = None
    physical_state: str | None = None
    rate_bytes_per_second: int | None = None
    rate_text: str | None = None
    link_layer: str | None = None
    netdev: str | None = None
    transmit_bytes: int | None = None
    receive_bytes: int | None = None
    transmit_packets: int | None = None
    receive_packets: int | None = None
    # (cast, direction) -> packets, cast in {unicast, multicast}
    cast_packets: dict[tuple[str, str], int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    transmit_wait: int | None = None  # counters/port_xmit_wait, in the device's ticks
    hw_counters: dict[str, int] = field(default_factory=dict)  # hw_counters/ without lifespan
    hw_counters_lifespan_ms: int | None = None  # hw_counters/lifespan


@dataclass(frozen=True)
class RdmaDevice:
    name: str
    hca_type: str | None
    firmware_version: str | None
    board_id: str | None
    ports: tuple[RdmaPort, ...]


@dataclass
class RdmaReading:
    devices: list[RdmaDevice] = field(default_factory=list)
    class_present: bool = False
    problems: list[str] = field(default_factory=list)

    def ports(self) -> list[RdmaPort]:
        return [p for d in self.devices for p in d.ports]


def parse_state(text: str | None) -> tuple[int | None, str | None]:
    """``"4: ACTIVE"`` → (4, "ACTIVE"); anything else → (None, None)."""
    if text is None:
        return None, None
    head, sep, tail = text.partition(":")
    if not sep or ":" in tail:
        return None, None
    ident = parse_uint(head)
    return ident, (tail.strip() or None) if ident is not None else None


def _float32(value: float) -> float:
    rounded: float = struct.unpack("f", struct.pack("f", value))[0]
    return rounded


def parse_rate(text: str | None) -> int | None:
    """``"400 Gb/sec (4X NDR)"`` → 50_000_000_000 bytes/s.

    The number is Gb/s; it is rounded to float32 and multiplied by 125,000,000, as procfs
    does, so our value equals node_exporter's to the byte.
    """
    if not text:
        return None
    number = text.split(" ", 1)[0].strip()
    try:
        gbits = float(number)
    except ValueError:
        return None
    if not 0 <= gbits < 1e6:
        return None
    return int(_float32(gbits) * 125_000_000)


# gid_attrs/ndevs/<index> names the network device of the port's GID at that index; the kernel
# answers EINVAL for a GID without one (drivers/infiniband/core/sysfs.c, print_ndev), which is
# every GID of an InfiniBand port and every unused entry of a RoCE port's table (up to 256).
# Index 0 is a RoCE port's default GID, which belongs to the port's own network device (its
# bond, under LAG), so it alone is read; the others would cost a failed read each, every scrape.
DEFAULT_GID_INDEX = "0"


def _netdev(device_dir: str, port_dir: str, files: _Files) -> str | None:
    name = files.attributes(f"{port_dir}/gid_attrs/ndevs", (DEFAULT_GID_INDEX,))[DEFAULT_GID_INDEX]
    if name:
        return name
    nets = list_dir(f"{device_dir}/device/net")
    return nets[0] if nets else None


# The attribute files read from each port folder and each device folder.
PORT_ATTRIBUTES = ("state", "phys_state", "rate", "link_layer")
DEVICE_ATTRIBUTES = ("hca_type", "fw_ver", "board_id")


class _Files:
    """Where a reading's attributes and counters come from: one file at a time through ``reader``,
    or files ``held`` open between readings."""

    def __init__(self, reader: AttributeReader, held: HeldFolders | None) -> None:
        self.reader = reader
        self.held = held

    def attributes(self, folder: str, names: tuple[str, ...]) -> dict[str, str | None]:
        if self.held is None:
            return {name: self.reader(f"{folder}/{name}") for name in names}
        found = self.held.read(folder, names)
        return {name: attribute_text(found.get(name)) for name in names}

    def counters(self, folder: str) -> dict[str, int]:
        return read_counters(folder) if self.held is None else self.held.counters(folder)


def read_port(device: str, device_dir: str, port_name: str, files: _Files) -> RdmaPort:
    port_dir = f"{device_dir}/ports/{port_name}"
    attributes = files.attributes(port_dir, PORT_ATTRIBUTES)
    state_id, state = parse_state(attributes["state"])
    phys_id, phys = parse_state(attributes["phys_state"])
    rate_text = attributes["rate"]
    counters = files.counters(f"{port_dir}/counters")
    ext = files.counters(f"{port_dir}/counters_ext")
    hw_counters = files.counters(f"{port_dir}/hw_counters")

    def pick(ext_table: dict[str, str], table: dict[str, str], direction: str, scale: int) -> int | None:
        for source, names in ((ext, ext_table), (counters, table)):
            for name, d in names.items():
                if d == direction and name in source:
                    return source[name] * scale
        return None

    cast: dict[tuple[str, str], int] = {}
    for name, key in CAST_PACKET_COUNTERS.items():
        if name in counters:
            cast[key] = counters[name]
    for name, key in EXT_CAST_PACKET_COUNTERS.items():
        if name in ext:
            cast[key] = ext[name]

    return RdmaPort(
        device=device,
        port=int(port_name),
        state_id=state_id,
        state=state,
        physical_state_id=phys_id,
        physical_state=phys,
        rate_bytes_per_second=parse_rate(rate_text),
        rate_text=rate_text,
        link_layer=attributes["link_layer"] or None,
        netdev=_netdev(device_dir, port_dir, files),
        transmit_bytes=pick(EXT_DATA_WORD_COUNTERS, DATA_WORD_COUNTERS, "transmit", 4),
        receive_bytes=pick(EXT_DATA_WORD_COUNTERS, DATA_WORD_COUNTERS, "receive", 4),
        transmit_packets=pick(EXT_PACKET_COUNTERS, PACKET_COUNTERS, "transmit", 1),
        receive_packets=pick(EXT_PACKET_COUNTERS, PACKET_COUNTERS, "receive", 1),
        cast_packets=cast,
        errors={k: v for k, v in counters.items() if k not in NOT_ERROR_COUNTERS},
        transmit_wait=counters.get(TRANSMIT_WAIT_COUNTER),
        hw_counters={k: v for k, v in hw_counters.items() if k != HW_COUNTERS_LIFESPAN},
        hw_counters_lifespan_ms=hw_counters.get(HW_COUNTERS_LIFESPAN),
    )


def read_rdma(sysfs: Path, reader: AttributeReader = read_attribute, held: HeldFolders | None = None) -> RdmaReading:
    """Every RDMA device and port under ``<sysfs>/class/infiniband``, sorted by name.

    With ``held``, the attributes and counters are read from files it keeps open between calls,
    and the folders this call did not read are closed.
    """
    files = _Files(reader, held)
    class_dir = os.path.join(sysfs, *CLASS_PATH)
    reading = RdmaReading(class_present=os.path.isdir(class_dir))
    for device in list_dir(class_dir):
        device_dir = f"{class_dir}/{device}"
        ports: list[RdmaPort] = []
        port_names = list_dir(f"{device_dir}/ports")
        if not port_names:
            reading.problems.append(f"{device}: no ports/ folder")
        for port_name in sorted(port_names, key=lambda n: (len(n), n)):
            if not port_name.isdigit():
                reading.problems.append(f"{device}: unexpected port entry {port_name!r}")
                continue
            try:
                port = read_port(device, device_dir, port_name, files)
            except (OSError, ValueError) as exc:  # a port folder that vanished mid-read
                reading.problems.append(f"{device}/{port_name}: {exc}")
                continue
            if port.state_id is None:
                reading.problems.append(f"{device}/{port_name}: unreadable or malformed state")
            ports.append(port)
        attributes = files.attributes(device_dir, DEVICE_ATTRIBUTES)
        reading.devices.append(
            RdmaDevice(
                name=device,
                hca_type=attributes["hca_type"],
                firmware_version=attributes["fw_ver"],
                board_id=attributes["board_id"],
                ports=tuple(ports),
            )
        )
    if held is not None:
        held.close_unread()
    return reading

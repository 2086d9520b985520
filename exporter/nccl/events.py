"""The typed events NCCL message bodies describe (what :func:`grammar.parse_message` returns)."""

from __future__ import annotations

from typing import NamedTuple


class VersionEvent(NamedTuple):
    version: str  # "2.18.3" (+ suffix such as "a0" kept)


class NetworkEvent(NamedTuple):
    name: str  # as NCCL printed it: "IB", "Socket", "IBext_v8", "AWS Libfabric", ...


class IbDevice(NamedTuple):
    index: int  # type: ignore[assignment]  # NCCL's [index]; hides tuple.index, which nothing here calls
    device: str
    port: int
    link: str  # "IB", "RoCE", "IB/SHARP", ...


class IbDevicesEvent(NamedTuple):
    devices: tuple[IbDevice, ...]
    oob_interface: str | None
    oob_address: str | None


# Why NCCL's IB transport is unusable in a process (IbUnavailableEvent.reason).
IB_NO_DEVICE = "no_device"  # "NET/IB : No device found." (also an IBext plugin's copy of it)
IB_NO_VERBS = "no_verbs_library"  # "Failed to open libibverbs.so[.1]" (WARN up to 2.10, INFO from 2.11)
IB_NO_INTERFACE = "no_ip_interface"  # "NET/IB : No IP interface found."
IB_NO_DEVICE_LISTED = "no_device_listed"  # "NET/IB : Using [RO]; OOB ..." with an empty device list (2.23+)
IB_INIT_FAILED = "init_failed"  # "Failed to initialize NET plugin IB" (2.27+)
IB_ZERO_DEVICES = "zero_devices"  # 2.3's "Net/IB: call to devices() returned 0 devices."


class IbTrafficEvent(NamedTuple):
    """A line of NCCL's IB transport setting up or using a connection: the queue pair of a connection
    (``NET/IB: Dev 0 Port 1 qpn 4711 ...``, ``NET/IB: NCCL Dev 0 IbDev 0 ...``) or a request on one
    (``NET/IB : req 0/1 tag 7 peer ...``). Only a process whose network is IB prints these."""

    detail: str


class SocketTrafficEvent(NamedTuple):
    """NCCL's Socket network moving or connecting data (``net_socket.cc``): ``NET/Socket : message
    truncated``, ``NET/Socket : socket progress error``, or an error returned from that file
    (``transport/net_socket.cc:339 -> 2``). Only a process whose network is Socket runs that code."""

    detail: str


class IbUnavailableEvent(NamedTuple):
    """A line saying that NCCL's IB (verbs) transport cannot be used by this process."""

    reason: str


# What a net plugin line says of the plugin (PluginEvent.state).
PLUGIN_LOADED = "loaded"  # "NET/Plugin: Loaded net plugin X (vN)": found, not yet initialised
PLUGIN_IN_USE = "in_use"  # initialised with devices: "Initialized NET plugin X", a plugin's own init lines
PLUGIN_FAILED = "failed"  # "Failed to initialize NET plugin X", "NET/OFI No eligible providers were found"
PLUGIN_DISABLED = "disabled"  # "NET/FastSocket disabled", "NET/GPUDirectTCPX disabled"

OFI_FAMILY = "OFI"  # aws-ofi-nccl: lines start "NET/OFI "; registers "AWS Libfabric", "Libfabric" or "OFI"


class PluginEvent(NamedTuple):
    """A line about a net plugin: NCCL's own (``NET/Plugin``, ``Initialized NET plugin X``) or the
    plugin's (``NET/FastSocket : ...``, ``NET/OFI ...``)."""

    family: str | None  # "FastSocket", "GPUDirectTCPX", "FasTrak", "OFI"; None for NCCL's generic lines
    name: str | None  # the network name the line gives, if any
    state: str


class OfiProviderEvent(NamedTuple):
    """aws-ofi-nccl's libfabric provider: ``NET/OFI Selected Provider is efa (found 4 nics)``,
    ``... Selected provider is tcp;ofi_rxm, fabric is 172.31.0.0/20 (found 1 nics)``."""

    provider: str
    fabric: str | None


class InterfaceEvent(NamedTuple):
    """2.3's ``NET : Using interface eth0:10.0.0.1<0>`` (one line per interface found)."""

    interface: str
    address: str


class RankEvent(NamedTuple):
    """A line naming the rank of the process that logs it, without a communicator pointer: 2.3's
    ``rank R nranks N``, ``Trees [0] 1/-1/-1->R->-1`` (2.4+), ``Ring 00 : P -> R -> N`` (GRAPH)."""

    rank: int
    nranks: int | None


class RingOrderEvent(NamedTuple):
    """Rank 0's listing of one ring, ``Channel 00/02 :    0   1`` (2.7+) or ``Channel 00 : 0 1``:
    every rank of the communicator, once."""

    ranks: tuple[int, ...]


class AllRanksEvent(NamedTuple):
    """``nranks N`` alone: ncclCommInitAll (2.3-2.4), one process driving every GPU of the communicator."""

    nranks: int


class SocketDevicesEvent(NamedTuple):
    interfaces: tuple[tuple[str, str], ...]  # (ifname, address)


class BootstrapEvent(NamedTuple):
    interface: str
    address: str


class ConnectionEvent(NamedTuple):
    """A ``Ring/Channel … via …`` (or ``CollNet … via COLLNET``) line.

    ``kind``: net, p2p, shm or collnet. For NET, ``[send]`` is logged by ``src`` and
    ``[receive]`` by ``dst``; P2P/SHM lines are logged by ``src``. ``src_id``/``dst_id`` are
    busIds (2.5–2.18.1) or NVML indexes (2.18.3+); ``ids_are_devices`` is False where they may
    be CUDA ordinals (2.3–2.4 ``Ring`` lines), which can repeat inside one node.
    """

    kind: str
    channel: int
    conn_index: int
    src: int
    dst: int
    src_id: str | None
    dst_id: str | None
    direction: str | None  # "send", "receive" or None
    network: str | None  # NET/COLLNET name
    gdr: bool
    mnnvl: bool  # P2P/MNNVL: NVLink across nodes
    ids_are_devices: bool
    via: str  # the transport text after "via "
    net_device: int | None = None  # NET/<net>/<dev>: the index of the network's device (NET/IB : Using [i])
    proxy_rank: int | None = None  # NET/<net>/<dev>(<rank>): PXN, the rank whose GPU talks to that device
    # The line's format is one only NCCL older than 2.14 writes: a "Ring" line (2.3-2.6), or a NET
    # "Channel" line without the connection index (2.7-2.11; 2.12 added "/<connIndex>").
    format_before_2_14: bool = False

    @property
    def logging_rank(self) -> int:
        return self.dst if self.direction == "receive" else self.src

    @property
    def logging_rank_known(self) -> bool:
        """Whether ``logging_rank`` is sure: a NET line without ``[send]``/``[receive]`` (2.3 and older)
        may be logged by either end (2.3's receiver prints it; older versions are not known)."""
        return self.direction is not None or self.kind != "net"


class CommInitEvent(NamedTuple):
    pointer: str
    rank: int
    nranks: int
    comm_id: str | None  # "0x…" (2.16.2+)
    # "START", "COMPLETE", None (2.3's bare "comm %p rank %d nranks %d") or "END" (a Destroy or
    # Abort line: it only tells the communicator's size and the logging rank)
    phase: str | None
    gpu_id: str | None = None  # the GPU as channel lines of the same version name it (see below)
    bus_id: str | None = None  # the GPU's PCI address as NCCL's busId ("18000" = 0000:18:00.0), 2.5+
    # "ncclCommInitAll comm ..." (2.20+ name the API): one process initialises every rank.
    init_all: bool = False


class CommNodesEvent(NamedTuple):
    pointer: str
    rank: int
    nranks: int
    nnodes: int
    local_ranks: int
    local_rank: int
    mnnvl: bool


class ChannelSummaryEvent(NamedTuple):
    coll_channels: int
    collnet_channels: int
    nvls_channels: int


class GdrEvent(NamedTuple):
    enabled: bool
    network: str | None  # "NET/<net> : GPU Direct RDMA …" names the net; paths.cc lines do not
    subject: str


class EnvEvent(NamedTuple):
    variable: str
    value: str


class TestRankEvent(NamedTuple):
    """nccl-tests' device table: ``#  Rank  8 Group  0 Pid  4567 on node-2 device  0 [0x1b] …``."""

    rank: int
    pid: int
    host: str  # cut at the first "." like NCCL's own prefix
    gpu: str | None = None  # the PCI bus id nccl-tests prints in brackets ("0x1b", "0000:02:00"), lower case


Event = (
    VersionEvent
    | NetworkEvent
    | IbDevicesEvent
    | IbUnavailableEvent
    | IbTrafficEvent
    | SocketTrafficEvent
    | SocketDevicesEvent
    | BootstrapEvent
    | ConnectionEvent
    | CommInitEvent
    | CommNodesEvent
    | ChannelSummaryEvent
    | GdrEvent
    | EnvEvent
    | TestRankEvent
    | PluginEvent
    | OfiProviderEvent
    | InterfaceEvent
    | RankEvent
    | RingOrderEvent
    | AllRanksEvent
)
MAX_NAME_CHARS = 64  # a network, plugin or provider name longer than this is not NCCL's (cut there)

"""One NCCL log line → records → typed events.

:mod:`records` finds the records on a physical line (wrappers, interleaved writers, stripped
prefixes) and which of them are warnings; :func:`parse_message` here turns a message body into an
event of :mod:`events`. Nothing here raises on any text; the work per line is bounded by the
caller's length cap (regexes never search more than a small window backwards). The names of
both modules are importable from here: ``from exporter.nccl import grammar as g`` reaches all.

Format strings are those of NVIDIA NCCL 2.3 to 2.30 (``src/debug.cc``, ``src/init.cc``,
``src/transport/*.cc``, ``src/graph/*.cc``).
"""

from __future__ import annotations

import re
from functools import partial

from exporter.nccl.events import (
    IB_INIT_FAILED,
    IB_NO_DEVICE,
    IB_NO_DEVICE_LISTED,
    IB_NO_INTERFACE,
    IB_NO_VERBS,
    IB_ZERO_DEVICES,
    MAX_NAME_CHARS,
    OFI_FAMILY,
    PLUGIN_DISABLED,
    PLUGIN_FAILED,
    PLUGIN_IN_USE,
    PLUGIN_LOADED,
    AllRanksEvent,
    BootstrapEvent,
    ChannelSummaryEvent,
    CommInitEvent,
    CommNodesEvent,
    ConnectionEvent,
    EnvEvent,
    Event,
    GdrEvent,
    IbDevice,
    IbDevicesEvent,
    IbTrafficEvent,
    IbUnavailableEvent,
    InterfaceEvent,
    NetworkEvent,
    OfiProviderEvent,
    PluginEvent,
    RankEvent,
    RingOrderEvent,
    SocketDevicesEvent,
    SocketTrafficEvent,
    TestRankEvent,
    VersionEvent,
)
from exporter.nccl.records import (
    TRAILER,
    WARNING_CATEGORIES,
    Prefix,
    Record,
    clean_message,
    split_records,
    strip_ansi,
    strip_wrappers,
    warning_category,
)

__all__ = [
    # records
    "TRAILER",
    "WARNING_CATEGORIES",
    "Prefix",
    "Record",
    "clean_message",
    "split_records",
    "strip_ansi",
    "strip_wrappers",
    "warning_category",
    # events
    "IB_INIT_FAILED",
    "IB_NO_DEVICE",
    "IB_NO_DEVICE_LISTED",
    "IB_NO_INTERFACE",
    "IB_NO_VERBS",
    "IB_ZERO_DEVICES",
    "MAX_NAME_CHARS",
    "OFI_FAMILY",
    "PLUGIN_DISABLED",
    "PLUGIN_FAILED",
    "PLUGIN_IN_USE",
    "PLUGIN_LOADED",
    "AllRanksEvent",
    "BootstrapEvent",
    "ChannelSummaryEvent",
    "CommInitEvent",
    "CommNodesEvent",
    "ConnectionEvent",
    "EnvEvent",
    "Event",
    "GdrEvent",
    "IbDevice",
    "IbDevicesEvent",
    "IbTrafficEvent",
    "IbUnavailableEvent",
    "SocketTrafficEvent",
    "InterfaceEvent",
    "NetworkEvent",
    "OfiProviderEvent",
    "PluginEvent",
    "RankEvent",
    "RingOrderEvent",
    "SocketDevicesEvent",
    "TestRankEvent",
    "VersionEvent",
    # messages
    "PLUGIN_PREFIXES",
    "VERSION_RE",
    "info_matters",
    "parse_message",
]

# Plugins whose own log lines name them (the prefix of their lines): the net name they register.
PLUGIN_PREFIXES: tuple[tuple[str, str], ...] = (
    ("NET/FastSocket", "FastSocket"),  # google/nccl-fastsocket
    ("NET/GPUDirectTCPX", "GPUDirectTCPX"),  # GCP A3 High TCPX plugin (registers GPUDirectTCPX_v7)
    ("NET/FasTrak", "FasTrak"),  # GCP A3 Mega TCPXO plugin
)

VERSION_RE = re.compile(r"NCCL version (?P<v>\d{1,3}\.\d{1,3}\.\d{1,4})(?P<suffix>[^\s+]{0,16})")
_USING_NETWORK_RE = re.compile(
    r"(?:Using (?:network|internal Network)|Assigned NET plugin) (?P<name>.+?)(?: to comm)?$"
)
_IB_USING_RE = re.compile(r"NET/IB ?: Using(?P<devs>.*?)(?:; OOB (?P<oob>\S+))?$")
# [0]mlx5_0:1/IB; 2.27+ may add the rail (":1:3/IB") or an empty rail and the plane (":1::2/IB")
_IB_DEVICE_RE = re.compile(
    r"\[(?P<i>\d{1,4})\] ?(?P<dev>[^\s:=\[\]{},]+):(?P<port>\d{1,4})(?::\d{0,4}(?::\d{1,4})?)?/(?P<link>[A-Za-z/]+)"
)
# NET/IB's connection set-up and request lines (net_ib.cc): a queue pair, or a request to a peer.
_IB_TRAFFIC_RE = re.compile(
    r"NET/IB ?: (?:(?:NCCL (?:Merged)?Dev \d+ )?(?:Ib)?Dev \d+ Port \d+ qpn \d|req \d+/\d+ tag |collective mismatch)"
)
_SOCKET_USING_RE = re.compile(r"NET/Socket ?: Using(?P<ifs>.*)$")
_SOCKET_IF_RE = re.compile(r"\[\d+\](?P<if>[^\s:\[\]]+):(?P<addr>[^\s<]+)")
_BOOTSTRAP_RE = re.compile(r"Bootstrap ?: Using (?:\[\d+\])?(?P<if>[^\s:]+):(?P<addr>[^\s<]+)")
_CONN_RE = re.compile(
    r"(?:(?P<word>Ring|Channel) (?P<ch>\d{1,4})(?:/(?P<conn>\d{1,4}))? : |^)"
    r"(?P<src>\d{1,7})(?:\[(?P<srcid>[0-9a-fA-F]{1,16})\])?"
    r" -> (?P<dst>\d{1,7})(?:\[(?P<dstid>[0-9a-fA-F]{1,16})\])?(?: \[(?P<dir>send|receive)\])? via (?P<via>.+)$"
)
_NET_VIA_RE = re.compile(
    r"NET/(?P<net>.{1,64}?)/(?P<dev>\d{1,4})(?:\((?P<proxy>\d{1,7})\))?(?P<gdr>/GDRDMA)?(?:\(PCI\))?(?:/Shared)?(?:\s|$)"
)
_COLLNET_RE = re.compile(
    r"Coll(?:Net)? (?P<ch>\d{1,4})(?:/(?P<conn>\d{1,4}))? : (?P<rank>\d{1,7}) \[(?P<dir>send|receive)\]"
    r" via COLLNET/(?P<net>[^/]{1,64})/(?P<dev>\d{1,4})(?P<gdr>/GDRDMA)?"
)
_COMM_RE = re.compile(r"comm (?P<ptr>\S{1,64}) rank (?P<rank>\d{1,7}) nranks (?P<nranks>\d{1,7})(?P<rest>.*)$")
_COMM_ID_RE = re.compile(r"commId (?P<id>0x[0-9a-fA-F]{1,16})")
_NVML_RE = re.compile(r"nvmlDev (\d{1,4})")
_BUSID_RE = re.compile(r"busId ([0-9a-fA-F]{1,16})")
_PHASE_RE = re.compile(r"- (?P<what>Init|Destroy|Abort) (?P<phase>START|COMPLETE)")
_NNODES_RE = re.compile(
    r"comm (?P<ptr>\S{1,64}) rank (?P<rank>\d{1,7}) nRanks (?P<nranks>\d{1,7}) nNodes (?P<nnodes>\d{1,7})"
    r" localRanks (?P<lranks>\d{1,7}) localRank (?P<lrank>\d{1,7})(?: MNNVL (?P<mnnvl>\d))?"
)
_CHANNELS_RE = re.compile(
    r"(?P<coll>\d{1,5}) coll channels, (?:(?P<collnet>\d{1,5}) collnet channels, )?"
    r"(?:(?P<nvls>\d{1,5}) nvls channels, )?\d{1,5} p2p channels"
)
_GDR_RE = re.compile(
    r"(?:NET/(?P<net>[^:]{1,64}?) ?: )?GPU Direct RDMA (?P<state>Enabled|Disabled) for (?P<subject>.*)$"
)
_TEST_RANK_RE = re.compile(
    r"#?\s{0,16}Rank\s{1,16}(?P<rank>\d{1,7})\s{1,16}(?:Group\s{1,16}\d{1,7}\s{1,16})?Pid\s{1,16}(?P<pid>\d{1,10})"
    r"\s{1,16}on\s{1,16}(?P<host>\S{1,253})\s{1,16}device\s{1,16}\d{1,4}"
    r"(?:\s{1,16}\[(?P<bus>(?:0x)?[0-9A-Fa-f]{1,8}(?::[0-9A-Fa-f]{1,8}){0,2}(?:\.[0-9A-Fa-f])?)\])?"
)
_ENV_RE = re.compile(r"(?P<var>NCCL_[A-Z0-9_]{1,64}) set by environment to (?P<val>.*?)\.?$")
_PLUGIN_NAME_RE = re.compile(
    r"(?P<what>Loaded net plugin|Initialized NET plugin|Failed to initialize NET plugin) (?P<name>.{1,64}?)"
    r"(?: \(v\d{1,3}\))?\.?$"
)
# nccl-rdma-sharp-plugins (HPC-X) loads as "NCCL RDMA Plugin" and, in its init, picks the transport
# it stands for and prints its name ("P2P plugin IBext", "P2P plugin v8 UCX"): the network NCCL then
# uses under that name (p2p_plugin.c: pluginInit_vN).
_P2P_PLUGIN_RE = re.compile(r"P2P plugin (?:v\d{1,3} )?(?P<name>[^\s]{1,64})$")
_OFI_PROVIDER_RE = re.compile(
    r"Selected [Pp]rovider is (?P<provider>[^\s,()]{1,64})(?:, fabric is (?P<fabric>[^\s()]{1,64}))?"
)
# aws-ofi-nccl's first lines, before it picks a libfabric provider: "Initializing aws-ofi-nccl 1.9"
# (and "Using aws-ofi-nccl 1.1" before it), then its platform code's "Running on p4d.24xlarge
# platform, ..." (nccl_ofi_net.c's init calls platform_init() before get_ofi_provider()).
_OFI_STARTING = ("NET/OFI Initializing aws-ofi-nccl", "NET/OFI Using aws-ofi-nccl", "NET/OFI Running on ")
_OFI_FAILED = (
    "No eligible providers",
    "Only EFA provider is supported",
    "initialization failed",
    "Couldn't find any optimal provider",
    "No viable endpoint found",
    "Unable to find a protocol",
)
_INTERFACE_RE = re.compile(r"NET : Using interface (?P<if>[^\s:]{1,64}):(?P<addr>[^\s<]{1,64})")
_RANK_NRANKS_RE = re.compile(r"rank (?P<rank>\d{1,7}) nranks (?P<nranks>\d{1,7})$")
_ALL_RANKS_RE = re.compile(r"nranks (?P<nranks>\d{1,7})$")
_TREES_RE = re.compile(r"Trees \[\d{1,4}\] -?\d{1,7}(?:/-?\d{1,7}){0,2}->(?P<rank>\d{1,7})->")
_RING_POSITION_RE = re.compile(r"Ring \d{1,4} : -?\d{1,7} -> (?P<rank>\d{1,7}) -> -?\d{1,7}$")
# (2.1-2.2 put "[<ring>] " before it)
_RING_ORDER_RE = re.compile(
    r"(?:\[\d{1,4}\] )?(?:Ring|Channel) \d{1,4}(?:/\d{1,4})? :(?P<ranks>(?: +\d{1,7}){1,8192}) *$"
)
# 2.4: "CUDA Dev 0[3], Socket NIC distance :  SYS" names the network NCCL selected (ncclNetName()).
_NIC_DISTANCE_RE = re.compile(r"CUDA Dev \d{1,4}\[\d{1,4}\], (?P<net>.{1,64}?) NIC distance :")
_SOCKET_TRAFFIC_RE = re.compile(
    r"NET/Socket ?: (?:message truncated|socket progress error|peer )|net_socket\.cc:\d{1,6} -> \d"
)


def _connection(m: re.Match[str]) -> ConnectionEvent | None:
    via = m.group("via")
    srcid, dstid = m.group("srcid"), m.group("dstid")
    # 2.3–2.4 "Ring" lines put the CUDA ordinal in brackets (it repeats across processes of one
    # node); busIds (2.5+) are at least four hex digits.
    ids_are_devices = m.group("word") == "Channel" or (
        srcid is not None and dstid is not None and len(srcid) >= 4 and len(dstid) >= 4
    )
    connection = partial(
        ConnectionEvent,
        channel=int(m.group("ch") or 0),
        conn_index=int(m.group("conn") or 0),
        src=int(m.group("src")),
        dst=int(m.group("dst")),
        src_id=srcid,
        dst_id=dstid,
        direction=m.group("dir"),
        ids_are_devices=ids_are_devices,
        via=via,
        # "Ring" lines (2.3-2.6), NET "Channel" lines without "/<connIndex>" (2.7-2.11), bare ones (2.1-2.2)
        format_before_2_14=m.group("word") != "Channel" or (via.startswith("NET/") and m.group("conn") is None),
    )
    if via.startswith("NET/"):
        n = _NET_VIA_RE.match(via)
        if n is None:
            return None
        proxy = n.group("proxy")
        return connection(
            kind="net",
            network=n.group("net"),
            gdr=n.group("gdr") is not None,
            mnnvl=False,
            net_device=int(n.group("dev")),
            proxy_rank=int(proxy) if proxy is not None else None,
        )
    if via.startswith("P2P/"):
        return connection(kind="p2p", network=None, gdr=False, mnnvl=via.startswith("P2P/MNNVL"))
    if via.startswith("SHM/") or via.startswith("direct shared memory"):
        return connection(kind="shm", network=None, gdr=False, mnnvl=False)
    return None


def _net_line(message: str) -> Event | None:
    """Lines starting ``NET/``: IB unavailable, 2.3's interfaces, plugins known by their own lines."""
    if message.startswith("NET/IB"):
        if "No device found" in message:
            return IbUnavailableEvent(IB_NO_DEVICE)
        if "No IP interface found" in message:
            return IbUnavailableEvent(IB_NO_INTERFACE)
        if _IB_TRAFFIC_RE.match(message):
            return IbTrafficEvent(message[:80])
        return None
    if message.startswith("NET : Using interface"):
        m = _INTERFACE_RE.match(message)
        return InterfaceEvent(m.group("if"), m.group("addr")) if m else None
    if message.startswith("NET/OFI "):
        if message.startswith(_OFI_STARTING):  # the plugin starts: loaded, not yet in use
            return PluginEvent(OFI_FAMILY, None, PLUGIN_LOADED)
        m = _OFI_PROVIDER_RE.search(message, 8, 8 + 200)
        if m is not None:
            return OfiProviderEvent(m.group("provider"), m.group("fabric"))
        if any(reason in message for reason in _OFI_FAILED):
            return PluginEvent(OFI_FAMILY, None, PLUGIN_FAILED)
        return None
    for prefix, family in PLUGIN_PREFIXES:
        if message.startswith(prefix):
            rest = message[len(prefix) :]
            if rest.startswith(("/", "_")):  # NET/GPUDirectTCPX/CUDA, a longer name: the same plugin
                rest = rest.lstrip("/_")
            words = rest.lstrip(" :").lower()
            if words.startswith("disabled"):
                return PluginEvent(family, None, PLUGIN_DISABLED)
            if words.startswith("initialization start"):
                return PluginEvent(family, None, PLUGIN_LOADED)
            return PluginEvent(family, None, PLUGIN_IN_USE)
    return None


def parse_message(message: str) -> Event | None:
    """The event one NCCL message body describes, or None for lines that do not matter here."""
    if " via " in message:
        m = _CONN_RE.search(message)
        if m is not None:
            return _connection(m)
        c = _COLLNET_RE.search(message)
        if c is not None:
            rank = int(c.group("rank"))
            return ConnectionEvent(
                kind="collnet",
                channel=int(c.group("ch")),
                conn_index=int(c.group("conn") or 0),
                src=rank,
                dst=rank,
                src_id=None,
                dst_id=None,
                direction=c.group("dir"),
                network=c.group("net"),
                gdr=c.group("gdr") is not None,
                mnnvl=False,
                ids_are_devices=False,
                via=message[c.start("net") - 8 :],
            )
    if "comm " in message:
        m = _COMM_RE.search(message)
        if m is not None:
            rest = m.group("rest")
            phase = _PHASE_RE.search(rest)
            ended = phase is not None and phase.group("what") != "Init"  # Destroy / Abort
            cid = _COMM_ID_RE.search(rest)
            nvml, bus = _NVML_RE.search(rest), _BUSID_RE.search(rest)
            # Channel lines name GPUs by NVML index from 2.18.3 (whose init lines print nvmlDev and
            # busId) and by busId in 2.5-2.18.1 (busId only); 2.4 (nvmlDev only) names none.
            gpu_id = nvml.group(1) if (nvml and bus) else (bus.group(1).lower() if bus else None)
            return CommInitEvent(
                init_all=message.startswith("ncclCommInitAll "),
                pointer=m.group("ptr"),
                rank=int(m.group("rank")),
                nranks=int(m.group("nranks")),
                comm_id=cid.group("id").lower() if cid else None,
                phase="END" if ended else (phase.group("phase") if phase else None),
                gpu_id=gpu_id,
                bus_id=bus.group(1).lower() if bus else None,
            )
        n = _NNODES_RE.search(message)
        if n is not None:
            return CommNodesEvent(
                pointer=n.group("ptr"),
                rank=int(n.group("rank")),
                nranks=int(n.group("nranks")),
                nnodes=int(n.group("nnodes")),
                local_ranks=int(n.group("lranks")),
                local_rank=int(n.group("lrank")),
                mnnvl=n.group("mnnvl") == "1",
            )
    if "Using" in message or "Assigned NET plugin" in message:
        m = _USING_NETWORK_RE.match(message)
        if m is not None:
            return NetworkEvent(m.group("name").strip()[:MAX_NAME_CHARS])
        m = _IB_USING_RE.match(message)
        if m is not None:
            devices = tuple(
                IbDevice(int(d.group("i")), d.group("dev"), int(d.group("port")), d.group("link"))
                for d in _IB_DEVICE_RE.finditer(m.group("devs"))
            )
            oob = m.group("oob")
            interface = address = None
            if oob and ":" in oob:
                interface, _, rest = oob.partition(":")
                address = rest.split("<", 1)[0] or None
            return IbDevicesEvent(devices, interface, address)
        m = _SOCKET_USING_RE.match(message)
        if m is not None:
            interfaces = _SOCKET_IF_RE.finditer(m.group("ifs"))
            return SocketDevicesEvent(tuple((i.group("if"), i.group("addr")) for i in interfaces))
        m = _BOOTSTRAP_RE.match(message)
        if m is not None:
            return BootstrapEvent(m.group("if"), m.group("addr"))
    if "NCCL version" in message:
        m = VERSION_RE.search(message)
        return VersionEvent(m.group("v") + m.group("suffix")) if m else None
    if message.startswith(("NET/", "NET : ")):
        event = _net_line(message)
        if event is not None:
            return event
    if "nranks " in message:
        m = _RANK_NRANKS_RE.match(message)
        if m is not None:
            return RankEvent(int(m.group("rank")), int(m.group("nranks")))
        m = _ALL_RANKS_RE.match(message)
        if m is not None:
            return AllRanksEvent(int(m.group("nranks")))
    if " plugin " in message or " NET plugin " in message:
        if message.startswith("P2P plugin "):
            p2p = _P2P_PLUGIN_RE.match(message)
            return PluginEvent(None, p2p.group("name"), PLUGIN_LOADED) if p2p else None
        m = _PLUGIN_NAME_RE.search(message)
        if m is not None:
            state = {"Loaded net plugin": PLUGIN_LOADED, "Initialized NET plugin": PLUGIN_IN_USE}.get(
                m.group("what"), PLUGIN_FAILED
            )
            name = m.group("name").strip()
            if state == PLUGIN_FAILED and name == "IB":
                return IbUnavailableEvent(IB_INIT_FAILED)
            return PluginEvent(None, name, state)
    if message.startswith("Failed to open libibverbs"):
        return IbUnavailableEvent(IB_NO_VERBS)
    if message.startswith("Net/IB") and "returned 0 devices" in message:
        return IbUnavailableEvent(IB_ZERO_DEVICES)
    if message.startswith("Trees "):
        m = _TREES_RE.match(message)
        return RankEvent(int(m.group("rank")), None) if m else None
    if " NIC distance" in message:
        m = _NIC_DISTANCE_RE.match(message)
        return NetworkEvent(m.group("net")) if m else None
    if "net_socket.cc" in message or message.startswith("NET/Socket"):
        if _SOCKET_TRAFFIC_RE.search(message, 0, 300):
            return SocketTrafficEvent(message[:80])
    if message.startswith(("Channel ", "Ring ", "[")) and " -> " not in message:
        m = _RING_ORDER_RE.match(message)
        return RingOrderEvent(tuple(int(r) for r in m.group("ranks").split())) if m else None
    if message.startswith("Ring ") and " -> " in message:
        m = _RING_POSITION_RE.match(message)
        return RankEvent(int(m.group("rank")), None) if m else None
    if "set by environment to" in message:
        m = _ENV_RE.match(message)
        return EnvEvent(m.group("var"), m.group("val").strip()) if m else None
    if "GPU Direct RDMA" in message:
        m = _GDR_RE.search(message)
        if m is not None:
            return GdrEvent(m.group("state") == "Enabled", m.group("net"), m.group("subject"))
        return None
    if message.startswith(("#", "Rank ")) and " Pid " in message:
        m = _TEST_RANK_RE.match(message)
        if m is not None:
            host, bus_id = m.group("host").split(".", 1)[0], m.group("bus")
            return TestRankEvent(int(m.group("rank")), int(m.group("pid")), host, bus_id.lower() if bus_id else None)
        return None
    if " coll channels, " in message:
        m = _CHANNELS_RE.search(message)
        if m is not None:
            return ChannelSummaryEvent(int(m.group("coll")), int(m.group("collnet") or 0), int(m.group("nvls") or 0))
    return None


def info_matters(message: str) -> bool:
    """False for an INFO message that neither :func:`parse_message` nor :func:`warning_category`
    uses (most INFO lines: tuning, allocations, topology); one substring test per event kind."""
    return (
        " via " in message
        or "comm " in message
        or "Using" in message
        or "set by environment to" in message
        or "NCCL version" in message
        or "GPU Direct RDMA" in message
        or " coll channels, " in message
        or " NIC distance" in message
        or "net_socket.cc" in message
        or message.startswith(
            ("NET/", "NET : ", "Trees ", "Channel ", "Ring ", "Failed to open libibverbs", "nranks ", "rank ", "Net/IB")
        )
        or message.startswith("[")  # 2.1-2.2's "[0] Ring 0 : ..." listing
        or " plugin " in message
        or " NET plugin " in message
        or " Pid " in message
    )

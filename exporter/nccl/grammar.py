"""One NCCL log line → records → typed events.

A physical line may carry wrappers (Open MPI ``[1,26]<stdout>:``, pdsh ``host: ``, a
launcher's ``[3] ``, leading timestamps and indentation, CloudWatch ``| <time> |`` rows), zero,
one or several NCCL records (interleaved writers glue records together), or a bare message
body whose prefix was stripped. :func:`split_records` finds the records, :func:`parse_message`
turns a message into an event. Nothing here raises on any text; the work per line is bounded
by the caller's length cap (regexes never search more than a small window backwards).

Format strings are those of NVIDIA NCCL 2.3 to 2.30 (``src/debug.cc``, ``src/init.cc``,
``src/transport/*.cc``, ``src/graph/*.cc``).
"""

from __future__ import annotations

import re
from typing import NamedTuple

# ---------------------------------------------------------------------------------------------
# Records: prefix + level + message


class Prefix(NamedTuple):
    """``hostname:pid:tid [cudaDev]`` of an NCCL record (cudaDev is not the rank)."""

    host: str
    pid: int
    tid: int
    cuda_dev: int
    location: str | None  # ``file:line`` of a WARN/TRACE call site


class Record(NamedTuple):
    prefix: Prefix | None  # None: a bare message body (prefix stripped by whoever shipped the log)
    level: str | None  # "INFO", "WARN", "TRACE"; None for bare bodies and the bare version line
    message: str


_LEVEL_RE = re.compile(r"NCCL (INFO|WARN|TRACE)(?: |$)")
_PRE_2_3_LEVEL_RE = re.compile(r"\] (INFO|WARN) ")
# Matched against the text just before a level marker; anchored at its end.
_PREFIX_RE = re.compile(
    r"(?<![^\s:|/\[\]])(?P<host>[^\s:|/\[\]]{1,253}):(?P<pid>\d{1,10}):(?P<tid>\d{1,10}) \[(?P<dev>-?\d{1,6})\] "
    r"(?:\[Rank \d{1,7}\] )?(?:\d{1,12}\.\d{1,9} )?(?:(?P<loc>\S{1,300}:\d{1,7})(?: \([^)]{0,200}\))? )?$"
)
_ISO_TIME_RE = re.compile(
    r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?"
)
# One wrapper at the start of a bare line; stripped repeatedly.
_WRAPPER_RE = re.compile(
    r"\s+"
    r"|[|\u2502\u2503\u2551]\s?"
    r"|\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?\s?"
    r"|\[[^\]]{0,256}\](?:<std(?:out|err)>)?:?\s?"
    r"|\([^()]{0,200}pid=\d+[^()]{0,200}\)\s?"  # Ray: "(RayTrainWorker pid=285, ip=10.0.0.2) "
    r"|(?<![\w.-])[A-Za-z0-9][\w.-]{0,253}(?:: (?=\S)|\s+\|\s?)"  # pdsh/srun --label "host: ", compose "svc-1  | "
)
_PREFIX_WINDOW = 512
# Trailing padding and frames: log viewers pad lines to the terminal width and close them with
# a box-drawing bar (│ ┃ ║); CloudWatch rows end in " |".
TRAILER = " \t\r\n|\u2502\u2503\u2551"
# ANSI SGR/CSI sequences (coloured console output, kubectl/k9s/stern colours).
# The first folded line also carries Ray's explanation after the marker: drop both.
_RAY_REPEATED_RE = re.compile(r"(?<!\s)\s*\[repeated \d{1,9}x across cluster\].*$")
_ANSI_RE = re.compile(r"\x1b\[[0-9;?]{0,32}[A-Za-z]|\x1b\][^\x07\x1b]{0,256}(?:\x07|\x1b\\)")


def strip_ansi(text: str) -> str:
    """``text`` without terminal escape sequences (only called when it holds an ESC)."""
    return _ANSI_RE.sub("", text).replace("\x1b", "")


def strip_wrappers(text: str) -> str:
    """Remove launcher, MPI, pdsh, timestamp and log-shipper wrappers from the start of ``text``."""
    for _ in range(8):
        m = _WRAPPER_RE.match(text)
        if m is None or m.end() == 0:
            break
        text = text[m.end():]
    return text


def _match_prefix(window: str) -> re.Match[str] | None:
    m = _PREFIX_RE.search(window)
    if m is not None and m.group("host")[0].isdigit() and _ISO_TIME_RE.search(window):
        # A timestamp glued to the host name ("...-07:00ip-10-0-0-1:79:79 [0]"): drop it.
        cleaned = _ISO_TIME_RE.sub(" ", window)
        m2 = _PREFIX_RE.search(cleaned)
        if m2 is not None:
            return m2
    return m


def _prefix_before(line: str, start: int, floor: int) -> tuple[Prefix | None, int]:
    """The prefix ending at ``start`` (searched no further back than ``floor`` or the window)."""
    window_start = max(floor, start - _PREFIX_WINDOW)
    m = _match_prefix(line[window_start:start])
    if m is None:
        return None, start
    host, pid, tid, dev, loc = m.group("host", "pid", "tid", "dev", "loc")
    begin = window_start + m.start()
    if host[0] == "N" and line[max(0, begin - 2):begin] == "] ":
        # Two writers interleaved inside "NCCL INFO": "…[1] NCCg183:161260:…" is host g183.
        cut = next((n for n in (4, 3, 2, 1) if host.startswith("NCCL"[:n])), 0)
        if 0 < cut < len(host):
            host = host[cut:]
    return Prefix(host, int(pid), int(tid), int(dev), loc), begin


_PREFIX_CACHE_SIZE = 4096


def _cached_prefix(line: str, start: int, prefixes: dict[str, Prefix | None]) -> Prefix | None:
    """The prefix before the level marker at ``start``, looked up by the text before it (the
    same few ``host:pid:tid [dev] `` heads repeat on every line of a process)."""
    head = line[:start]
    try:
        return prefixes[head]
    except KeyError:
        pass
    prefix, _ = _prefix_before(line, start, 0)
    if len(head) <= _PREFIX_WINDOW:  # the prefix depends on nothing else then
        if len(prefixes) >= _PREFIX_CACHE_SIZE:
            prefixes.clear()
        prefixes[head] = prefix
    return prefix


def split_records(line: str, prefixes: dict[str, Prefix | None] | None = None) -> list[Record]:
    """Every NCCL record on one physical line (already cut to the caller's length cap).

    ``prefixes`` is the caller's cache of parsed prefixes by the text before ``NCCL <LEVEL>``
    (bounded here); without it every prefix is parsed.
    """
    if "\x1b" in line:
        line = strip_ansi(line)
    if "across cluster]" in line:  # Ray's log deduplication: "... [repeated 7x across cluster]"
        line = _RAY_REPEATED_RE.sub("", line)
    first = _LEVEL_RE.search(line)
    if first is None:
        old = _PRE_2_3_LEVEL_RE.search(line)
        if old is not None:  # NCCL 2.2 and older: "host:pid:tid [dev] INFO message", no "NCCL" word
            prefix, _ = _prefix_before(line, old.start() + 2, 0)
            if prefix is not None:
                return [Record(prefix, old.group(1), line[old.end():].rstrip(TRAILER))]
        body = strip_wrappers(line).rstrip(TRAILER)
        return [Record(None, None, body)] if body else []
    start, end = first.span()
    if line.find("NCCL ", end) == -1 or _LEVEL_RE.search(line, end) is None:  # the common case: one record
        if prefixes is None:
            prefix, _ = _prefix_before(line, start, 0)
        else:
            prefix = _cached_prefix(line, start, prefixes)
        return [Record(prefix, first.group(1), line[end:].rstrip(TRAILER))]
    found: list[tuple[int, int, Prefix | None, str]] = []  # (record start, message start, prefix, level)
    previous_end = 0
    for marker in _LEVEL_RE.finditer(line):
        prefix, start = _prefix_before(line, marker.start(), previous_end)
        found.append((start, marker.end(), prefix, marker.group(1)))
        previous_end = marker.end()
    records = []
    for i, (_, msg_start, prefix, level) in enumerate(found):
        msg_end = found[i + 1][0] if i + 1 < len(found) else len(line)
        records.append(Record(prefix, level, line[msg_start:msg_end].rstrip(TRAILER)))
    return records


# ---------------------------------------------------------------------------------------------
# Events


class VersionEvent(NamedTuple):
    version: str  # "2.18.3" (+ suffix such as "a0" kept)


class NetworkEvent(NamedTuple):
    name: str  # as NCCL printed it: "IB", "Socket", "IBext_v8", "AWS Libfabric", ...


class IbDevice(NamedTuple):
    index: int
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


class IbUnavailableEvent(NamedTuple):
    """A line saying that NCCL's IB (verbs) transport cannot be used by this process."""

    reason: str


# What a net plugin line says of the plugin (PluginEvent.state).
PLUGIN_LOADED = "loaded"  # "NET/Plugin: Loaded net plugin X (vN)": found, not yet initialised
PLUGIN_IN_USE = "in_use"  # initialised with devices: "Initialized NET plugin X", a plugin's own init lines
PLUGIN_FAILED = "failed"  # "Failed to initialize NET plugin X", "NET/OFI No eligible providers were found"
PLUGIN_DISABLED = "disabled"  # "NET/FastSocket disabled", "NET/GPUDirectTCPX disabled"

# Plugins whose own log lines name them (the prefix of their lines): the net name they register.
PLUGIN_PREFIXES: tuple[tuple[str, str], ...] = (
    ("NET/FastSocket", "FastSocket"),  # google/nccl-fastsocket
    ("NET/GPUDirectTCPX", "GPUDirectTCPX"),  # GCP A3 High TCPX plugin (registers GPUDirectTCPX_v7)
    ("NET/FasTrak", "FasTrak"),  # GCP A3 Mega TCPXO plugin
)
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

    @property
    def logging_rank(self) -> int:
        return self.dst if self.direction == "receive" else self.src


class CommInitEvent(NamedTuple):
    pointer: str
    rank: int
    nranks: int
    comm_id: str | None  # "0x…" (2.16.2+)
    # "START", "COMPLETE", None (2.3's bare "comm %p rank %d nranks %d") or "END" (a Destroy or
    # Abort line: it only tells the communicator's size and the logging rank)
    phase: str | None
    gpu_id: str | None = None  # the GPU as channel lines of the same version name it (see below)


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


Event = (
    VersionEvent | NetworkEvent | IbDevicesEvent | IbUnavailableEvent | SocketDevicesEvent | BootstrapEvent
    | ConnectionEvent | CommInitEvent | CommNodesEvent | ChannelSummaryEvent | GdrEvent | EnvEvent | TestRankEvent
    | PluginEvent | OfiProviderEvent | InterfaceEvent | RankEvent | RingOrderEvent | AllRanksEvent
)
MAX_NAME_CHARS = 64  # a network, plugin or provider name longer than this is not NCCL's (cut there)

VERSION_RE = re.compile(r"NCCL version (?P<v>\d{1,3}\.\d{1,3}\.\d{1,4})(?P<suffix>[^\s+]{0,16})")
_USING_NETWORK_RE = re.compile(r"(?:Using (?:network|internal Network)|Assigned NET plugin) (?P<name>.+?)(?: to comm)?$")
_IB_USING_RE = re.compile(r"NET/IB ?: Using(?P<devs>.*?)(?:; OOB (?P<oob>\S+))?$")
_IB_DEVICE_RE = re.compile(r"\[(?P<i>\d+)\] ?(?P<dev>[^\s:=\[\]{},]+):(?P<port>\d+)/(?P<link>[A-Za-z/]+)")
_SOCKET_USING_RE = re.compile(r"NET/Socket ?: Using(?P<ifs>.*)$")
_SOCKET_IF_RE = re.compile(r"\[\d+\](?P<if>[^\s:\[\]]+):(?P<addr>[^\s<]+)")
_BOOTSTRAP_RE = re.compile(r"Bootstrap ?: Using (?:\[\d+\])?(?P<if>[^\s:]+):(?P<addr>[^\s<]+)")
_CONN_RE = re.compile(
    r"(?P<word>Ring|Channel) (?P<ch>\d{1,4})(?:/(?P<conn>\d{1,4}))? : (?P<src>\d{1,7})(?:\[(?P<srcid>[0-9a-fA-F]{1,16})\])?"
    r" -> (?P<dst>\d{1,7})(?:\[(?P<dstid>[0-9a-fA-F]{1,16})\])?(?: \[(?P<dir>send|receive)\])? via (?P<via>.+)$"
)
_NET_VIA_RE = re.compile(
    r"NET/(?P<net>.{1,64}?)/(?P<dev>\d{1,4})(?:\((?P<proxy>\d+)\))?(?P<gdr>/GDRDMA)?(?:\(PCI\))?(?:/Shared)?(?:\s|$)"
)
_COLLNET_RE = re.compile(
    r"Coll(?:Net)? (?P<ch>\d{1,4})(?:/(?P<conn>\d{1,4}))? : (?P<rank>\d{1,7}) \[(?P<dir>send|receive)\]"
    r" via COLLNET/(?P<net>[^/]{1,64})/(?P<dev>\d{1,4})(?P<gdr>/GDRDMA)?"
)
_COMM_RE = re.compile(
    r"comm (?P<ptr>\S{1,64}) rank (?P<rank>\d{1,7}) nranks (?P<nranks>\d{1,7})(?P<rest>.*)$"
)
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
_GDR_RE = re.compile(r"(?:NET/(?P<net>[^:]{1,64}?) ?: )?GPU Direct RDMA (?P<state>Enabled|Disabled) for (?P<subject>.*)$")
_TEST_RANK_RE = re.compile(
    r"#?\s{0,16}Rank\s{1,16}(?P<rank>\d{1,7})\s{1,16}(?:Group\s{1,16}\d{1,7}\s{1,16})?Pid\s{1,16}(?P<pid>\d{1,10})"
    r"\s{1,16}on\s{1,16}(?P<host>\S{1,253})\s{1,16}device\s{1,16}\d{1,4}"
)
_ENV_RE = re.compile(r"(?P<var>NCCL_[A-Z0-9_]{1,64}) set by environment to (?P<val>.*?)\.?$")
_PLUGIN_NAME_RE = re.compile(
    r"(?P<what>Loaded net plugin|Initialized NET plugin|Failed to initialize NET plugin) (?P<name>.{1,64}?)"
    r"(?: \(v\d{1,3}\))?\.?$"
)
_OFI_PROVIDER_RE = re.compile(
    r"Selected [Pp]rovider is (?P<provider>[^\s,()]{1,64})(?:, fabric is (?P<fabric>[^\s()]{1,64}))?"
)
_OFI_FAILED = ("No eligible providers", "Only EFA provider is supported", "initialization failed",
               "Couldn't find any optimal provider", "No viable endpoint found", "Unable to find a protocol")
_INTERFACE_RE = re.compile(r"NET : Using interface (?P<if>[^\s:]{1,64}):(?P<addr>[^\s<]{1,64})")
_RANK_NRANKS_RE = re.compile(r"rank (?P<rank>\d{1,7}) nranks (?P<nranks>\d{1,7})$")
_ALL_RANKS_RE = re.compile(r"nranks (?P<nranks>\d{1,7})$")
_TREES_RE = re.compile(r"Trees \[\d{1,4}\] -?\d{1,7}(?:/-?\d{1,7}){0,2}->(?P<rank>\d{1,7})->")
_RING_POSITION_RE = re.compile(r"Ring \d{1,4} : -?\d{1,7} -> (?P<rank>\d{1,7}) -> -?\d{1,7}$")
_RING_ORDER_RE = re.compile(r"(?:Ring|Channel) \d{1,4}(?:/\d{1,4})? :(?P<ranks>(?: +\d{1,7}){1,8192}) *$")


def _connection(m: re.Match[str]) -> ConnectionEvent | None:
    via = m.group("via")
    srcid, dstid = m.group("srcid"), m.group("dstid")
    # 2.3–2.4 "Ring" lines put the CUDA ordinal in brackets (it repeats across processes of one
    # node); busIds (2.5+) are at least four hex digits.
    ids_are_devices = m.group("word") == "Channel" or (
        srcid is not None and dstid is not None and len(srcid) >= 4 and len(dstid) >= 4
    )
    common = dict(
        channel=int(m.group("ch")),
        conn_index=int(m.group("conn") or 0),
        src=int(m.group("src")),
        dst=int(m.group("dst")),
        src_id=srcid,
        dst_id=dstid,
        direction=m.group("dir"),
        ids_are_devices=ids_are_devices,
        via=via,
    )
    if via.startswith("NET/"):
        n = _NET_VIA_RE.match(via)
        if n is None:
            return None
        return ConnectionEvent(kind="net", network=n.group("net"), gdr=n.group("gdr") is not None, mnnvl=False,
                               **common)  # type: ignore[arg-type]
    if via.startswith("P2P/"):
        return ConnectionEvent(kind="p2p", network=None, gdr=False, mnnvl=via.startswith("P2P/MNNVL"),
                               **common)  # type: ignore[arg-type]
    if via.startswith("SHM/") or via.startswith("direct shared memory"):
        return ConnectionEvent(kind="shm", network=None, gdr=False, mnnvl=False, **common)  # type: ignore[arg-type]
    return None


def _net_line(message: str) -> Event | None:
    """Lines starting ``NET/``: IB unavailable, 2.3's interfaces, plugins known by their own lines."""
    if message.startswith("NET/IB"):
        if "No device found" in message:
            return IbUnavailableEvent(IB_NO_DEVICE)
        if "No IP interface found" in message:
            return IbUnavailableEvent(IB_NO_INTERFACE)
        return None
    if message.startswith("NET : Using interface"):
        m = _INTERFACE_RE.match(message)
        return InterfaceEvent(m.group("if"), m.group("addr")) if m else None
    if message.startswith("NET/OFI "):
        m = _OFI_PROVIDER_RE.search(message, 8, 8 + 200)
        if m is not None:
            return OfiProviderEvent(m.group("provider"), m.group("fabric"))
        if any(reason in message for reason in _OFI_FAILED):
            return PluginEvent(OFI_FAMILY, None, PLUGIN_FAILED)
        return None
    for prefix, family in PLUGIN_PREFIXES:
        if message.startswith(prefix):
            rest = message[len(prefix):]
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
                kind="collnet", channel=int(c.group("ch")), conn_index=int(c.group("conn") or 0), src=rank,
                dst=rank, src_id=None, dst_id=None, direction=c.group("dir"), network=c.group("net"),
                gdr=c.group("gdr") is not None, mnnvl=False, ids_are_devices=False, via=message[c.start("net") - 8:],
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
                pointer=m.group("ptr"), rank=int(m.group("rank")), nranks=int(m.group("nranks")),
                comm_id=cid.group("id").lower() if cid else None,
                phase="END" if ended else (phase.group("phase") if phase else None),
                gpu_id=gpu_id,
            )
        n = _NNODES_RE.search(message)
        if n is not None:
            return CommNodesEvent(
                pointer=n.group("ptr"), rank=int(n.group("rank")), nranks=int(n.group("nranks")),
                nnodes=int(n.group("nnodes")), local_ranks=int(n.group("lranks")), local_rank=int(n.group("lrank")),
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
            return SocketDevicesEvent(tuple((i.group("if"), i.group("addr")) for i in _SOCKET_IF_RE.finditer(m.group("ifs"))))
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
        m = _PLUGIN_NAME_RE.search(message)
        if m is not None:
            state = {"Loaded net plugin": PLUGIN_LOADED, "Initialized NET plugin": PLUGIN_IN_USE}.get(
                m.group("what"), PLUGIN_FAILED)
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
    if message.startswith(("Channel ", "Ring ")) and " -> " not in message:
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
            return TestRankEvent(int(m.group("rank")), int(m.group("pid")), m.group("host").split(".", 1)[0])
        return None
    if " coll channels, " in message:
        m = _CHANNELS_RE.search(message)
        if m is not None:
            return ChannelSummaryEvent(int(m.group("coll")), int(m.group("collnet") or 0), int(m.group("nvls") or 0))
    return None


# ---------------------------------------------------------------------------------------------
# Warnings

# (category, substrings any of which marks it). Checked in order; a fixed vocabulary keeps the
# ccl_nccl_warnings_total{category} label set bounded.
_WARNING_CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ib_library_missing", ("Failed to open libibverbs",)),
    ("ib_no_device", ("NET/IB : No device found",)),
    ("net_plugin_failure", ("Failed to initialize any NET plugin", "NET/OFI", "NET/Plugin", "not found.",
                            "ncclNetPlugin", "nccl_net_ofi", "ib_plugin.c", "p2p_plugin.c")),
    ("ib_completion_error", ("Got completion",)),
    ("ib_async_event", ("async event", "async fatal event", "async non-fatal")),
    ("ib_verbs_error", ("ibv_", "NET/IB")),
    ("socket_connection_closed", ("Connection closed by remote peer", "Connection reset", "Broken pipe")),
    ("socket_error", ("socket", "Socket", "connect failed", "Connect to", "bootstrap", "Bootstrap")),
    ("proxy_error", ("[Service thread]", "[Proxy Service", "proxy", "Proxy")),
    ("cuda_error", ("Cuda failure", "CUDA", "cuda")),
    ("timeout", ("timeout", "Timeout", "timed out")),
)
WARNING_CATEGORIES: tuple[str, ...] = tuple(c for c, _ in _WARNING_CATEGORIES) + ("other",)


def info_matters(message: str) -> bool:
    """False for an INFO message that neither :func:`parse_message` nor :func:`warning_category`
    uses (most INFO lines: tuning, allocations, topology); one substring test per event kind."""
    return (" via " in message or "comm " in message or "Using" in message or "set by environment to" in message
            or "NCCL version" in message or "GPU Direct RDMA" in message or " coll channels, " in message
            or message.startswith(("NET/", "NET : ", "Trees ", "Channel ", "Ring ", "Failed to open libibverbs", "nranks ",
                                   "rank ", "Net/IB"))
            or " plugin " in message or " NET plugin " in message or " Pid " in message)


def warning_category(record: Record) -> str | None:
    """The category of a record worth counting as a warning, or None.

    Every WARN counts; two INFO lines count too because they explain a missing RDMA path
    (``Failed to open libibverbs.so`` is INFO from 2.11, ``NET/IB : No device found.`` always).
    """
    message = record.message
    if record.level != "WARN":
        if message.startswith("Failed to open libibverbs"):
            return "ib_library_missing"
        if message.startswith("NET/IB : No device found"):
            return "ib_no_device"
        return None
    location = record.prefix.location if record.prefix and record.prefix.location else ""
    text = location + " " + message
    for category, needles in _WARNING_CATEGORIES:
        if any(n in text for n in needles):
            return category
    return "other"

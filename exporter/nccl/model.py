"""Per-stream state: processes, communicators and connections, built from grammar events.

One :class:`LogAnalyzer` follows one log stream (a container's log, or one or more NCCL debug
files of one job) in which many processes interleave. Every structure is capped by
:class:`Limits`; what a cap drops is counted in ``overflow``. Nothing here reads files, looks
at a clock or keeps module-level state.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from exporter.nccl import grammar as g
from exporter.nccl.networks import NO_SELECTION, RDMA, Selection, is_libfabric, network_class
from exporter.nccl.verdict import NcclWarning, Verdict, connection_class, decide, node_keys, summarize_communicators

UNATTRIBUTED = "unattributed"
_MEMO_ENTRIES = 4096  # parsed messages remembered per stream (cleared when full)
_MEMO_MESSAGE_CHARS = 512  # longer messages are parsed every time
# What each remembered fact costs, in bytes (CPython 3.11, measured with tracemalloc; the parser
# benchmark checks ``approx_bytes`` against tracemalloc in every run): the estimate a node-wide
# memory budget is enforced with, without walking the objects.
_BYTES_BASE = 16 * 1024
_BYTES_PER_RANK_FACT = 64  # a rank's process, GPU, NVLS channels, pointer reference
_BYTES_PER_CONNECTION = 540  # a distinct connection line, its key and its cited record
_BYTES_PER_PROCESS = 1150
_BYTES_PER_PROCESS_ENTRY = 200  # a comm pointer, logging thread or NCCL_* setting of a process
_BYTES_PER_MEMO_ENTRY = 200  # plus the characters of the remembered message
_BYTES_PER_PREFIX_ENTRY = 250


@dataclass(frozen=True)
class Limits:
    """Caps that bound one stream's memory whatever the log holds."""

    max_line_chars: int = 65536  # text of a line beyond this is ignored (counted as long_lines)
    max_records_per_line: int = 16  # interleaved records split out of one physical line
    max_processes: int = 512
    max_communicators: int = 64  # oldest evicted; its conclusions are kept in a summary
    max_connections: int = 8192  # distinct connection lines remembered per stream
    max_ranks: int = 4096  # rank facts per communicator
    max_pointers: int = 256  # comm pointers remembered per process
    max_threads: int = 64  # logging threads remembered per process
    max_env: int = 64  # NCCL_* settings remembered per process
    max_warnings: int = 32  # warning lines kept as a sample (counts are never capped)
    max_versions: int = 16
    max_cited_chars: int = 300  # length of a line quoted in a reason or warning


def is_loopback(interface: str, address: str) -> bool:
    return interface == "lo" or interface.startswith("lo:") or address.startswith("127.") or address in ("::1", "[::1]")


class Process:
    """One NCCL process, identified by ``(hostname, pid)`` from the line prefix."""

    __slots__ = ("key", "host", "address", "oob_address", "network", "network_line", "ib_devices", "ib_line",
                 "ib_failed", "socket_seen", "threads", "saw_start", "pointers", "env", "version", "gdr_hca",
                 "ib_datapath_line", "named_comm", "plugin_loaded", "plugin_loaded_line", "plugin_in_use",
                 "plugin_in_use_line", "ofi_in_use", "plugins_failed", "ofi_provider", "loopback", "loose_ranks")

    def __init__(self, key: tuple[str, int] | None) -> None:
        self.key = key
        self.host = key[0] if key else None
        self.address: str | None = None  # bootstrap address: tells apart nodes sharing a hostname
        self.oob_address: str | None = None  # NET/IB's OOB address, used where no bootstrap line shows
        self.network: str | None = None  # last "Using network"
        self.network_line: str | None = None
        self.ib_devices: tuple[g.IbDevice, ...] | None = None
        self.ib_line: str | None = None  # the NET/IB : Using line that listed devices
        self.ib_failed: str | None = None  # the line showing IB unusable (no device, no libibverbs, ...)
        self.socket_seen: str | None = None  # the NET/Socket : Using line
        self.threads: dict[int, Thread] = {}  # by tid: one process may init several ranks on threads
        self.saw_start = False  # prints "Init START" (2.18.3+): a thread's context opens at START
        self.pointers: dict[str, str] = {}  # comm pointer -> communicator key
        self.env: dict[str, str] = {}
        self.version: str | None = None
        self.gdr_hca: dict[bool, str] = {}  # GDR enabled/disabled per HCA on an RDMA net -> cited line
        self.ib_datapath_line: str | None = None  # a NET/IB completion/async WARN: IB carries traffic
        self.named_comm = False  # logged an init or nNodes line (its pointers may since be evicted)
        self.plugin_loaded: str | None = None  # "Loaded net plugin X": X
        self.plugin_loaded_line: str | None = None
        self.plugin_in_use: str | None = None  # a plugin shown initialised with devices (its net name)
        self.plugin_in_use_line: str | None = None
        self.ofi_in_use = False  # aws-ofi-nccl selected a provider (its net name may be unknown)
        self.plugins_failed: set[str] = set()  # names and families shown failed or disabled (bounded)
        self.ofi_provider: str | None = None  # aws-ofi-nccl's libfabric provider
        self.loopback: bool | None = None  # bootstrap/socket interfaces: all loopback (True), any other (False)
        self.loose_ranks: set[int] = set()  # ranks this process logged outside any known communicator

    def label(self) -> str:
        return f"{self.key[0]}:{self.key[1]}" if self.key else "(no prefix)"

    def _ib_unusable(self) -> bool:
        return self.ib_failed is not None or self.env.get("NCCL_IB_DISABLE", "0").strip() not in ("0", "")

    def selected_network(self) -> Selection:
        """The network this process uses, and the line that says so.

        ``Using network`` (2.6+) or ``Assigned NET plugin`` (2.28+) when printed. Otherwise what the
        networks' own init lines show. NCCL tries the external plugin, then IB, then Socket, and keeps
        the first that initialises with devices: a plugin shown initialised (``Initialized NET plugin
        X``, aws-ofi-nccl's selected provider, FastSocket/TCPX/FasTrak init lines) wins; then Socket
        when IB is shown unusable; then IB when ``NET/IB : Using`` lists devices (2.4 prints
        ``NET/Socket : Using`` on every rank even when IB is then selected, so that line alone is not
        Socket); then a loaded plugin that no line shows failing.
        """
        provider = self.ofi_provider
        if self.network:
            return Selection(self.network, self.network_line, network_class(self.network, provider))
        if self.plugin_in_use is not None or self.ofi_in_use:
            name = self.plugin_in_use
            line = self.plugin_in_use_line
            return Selection(name, line, network_class(name, provider))
        if self._ib_unusable() and self.socket_seen:
            return Selection("Socket", self.socket_seen, network_class("Socket"))
        if self.ib_devices:
            loaded = self.plugin_loaded
            if loaded and loaded not in self.plugins_failed and network_class(loaded) == RDMA and not is_libfabric(loaded):
                return Selection(loaded, self.plugin_loaded_line, RDMA)  # an IBext plugin prints NET/IB lines too
            return Selection("IB", self.ib_line, RDMA)
        loaded = self.plugin_loaded
        if loaded and loaded not in self.plugins_failed and not self.socket_seen and not self._ib_unusable():
            return Selection(loaded, self.plugin_loaded_line, network_class(loaded, provider))
        if self.ib_datapath_line:
            return Selection("IB", self.ib_datapath_line, RDMA)
        return NO_SELECTION


class Thread:
    """What one logging thread is initialising: connection lines carry no communicator."""

    __slots__ = ("context", "pending", "pending_network", "pending_ranks", "inits")

    def __init__(self) -> None:
        self.context: str | None = None  # communicator whose init (or runtime connect) this thread logs
        self.pending: list[tuple] = []  # connection keys logged before their communicator is known
        self.pending_network: str | None = None  # "Using network" not yet tied to a communicator
        self.pending_ranks: list[tuple[int, int | None]] = []  # (rank, nranks) lines before their init line
        self.inits = 0  # init lines seen: tells apart identical lines of successive inits
        # (2.19+ prints it just before Init START; 2.13–2.18.1 before Init COMPLETE)


class Communicator:
    __slots__ = ("key", "comm_id", "nranks", "nnodes", "nnodes_line", "mnnvl", "network", "network_line",
                 "rank_process", "rank_gpu", "nvls_channels", "connections", "order", "mixed", "pointer_refs")

    def __init__(self, key: str, comm_id: str | None, order: int) -> None:
        self.key = key
        self.comm_id = comm_id
        self.nranks: int | None = None
        self.nnodes: int | None = None
        self.nnodes_line: str | None = None
        self.mnnvl = False
        self.network: str | None = None  # from "Using network" in this communicator's init
        self.network_line: str | None = None
        self.rank_process: dict[int, Process] = {}
        self.rank_gpu: dict[int, str] = {}  # from init lines, in the channel lines' GPU naming
        self.nvls_channels: dict[int, int] = {}  # rank -> NVLS channels
        self.connections: set[tuple] = set()
        self.order = order
        self.pointer_refs: set[tuple[Process, str]] = set()  # process.pointers entries naming this key
        # Several communicators under one key (before commIds, same-size communicators share
        # "nranks:N"): rank numbers then name different GPUs, so ranks are not placed on nodes.
        self.mixed = False


def cite(record: g.Record, cap: int) -> str:
    """The record as one log line (wrappers dropped), cut to ``cap`` characters."""
    text = record.message
    if record.prefix is not None:
        p = record.prefix
        location = f"{p.location} " if p.location else ""
        text = f"{p.host}:{p.pid}:{p.tid} [{p.cuda_dev}] {location}NCCL {record.level} {text}"
    return text if len(text) <= cap else text[: cap - 3] + "..."


class Connection:
    __slots__ = ("event", "process", "comm", "record", "cap")

    def __init__(self, event: g.ConnectionEvent, process: Process, comm: str | None, record: g.Record,
                 cap: int) -> None:
        self.event = event
        self.process = process
        self.comm = comm
        self.record = record  # cited only when a reason names this line
        self.cap = cap

    @property
    def cited(self) -> str:
        return cite(self.record, self.cap)


@dataclass
class Retired:
    """What evicted communicators had shown, so eviction never hides a fallback already seen."""

    count: int = 0
    inter_node_tcp: bool = False
    inter_node_rdma: bool = False
    reasons: list[str] = field(default_factory=list)


class LogAnalyzer:
    """Feed lines of one log stream; ask for the verdict at any time.

    ``feed`` never raises; ``result`` is cached until the next line that changes the state.
    """

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self.warnings_by_category: dict[str, int] = {}
        self.overflow: dict[str, int] = {}
        self.processes: dict[tuple[str, int] | None, Process] = {}
        self.communicators: dict[str, Communicator] = {}
        self.connections: dict[tuple, Connection] = {}
        self.versions: Counter[str] = Counter()
        self.test_ranks: dict[int, tuple[str, int]] = {}  # nccl-tests device table: rank -> (host, pid)
        self.test_runs_mixed = False
        # Ranks logged outside any known communicator (Trees, ring listings, 2.3 rank lines,
        # ncclCommInitAll), and the communicator size such lines gave: placed when the log names at
        # most one communicator.
        self.loose_ranks: dict[int, Process] = {}
        self.loose_nranks: int | None = None
        self.loose_mixed = False
        self.warnings: list[NcclWarning] = []
        self.retired = Retired()
        self.lines = 0
        self._comm_order = 0
        self._cached: Verdict | None = None
        self._prefixes: dict[str, g.Prefix | None] = {}  # parsed line prefixes by their text
        self._events: dict[str, g.Event | None] = {}  # parsed messages by their text
        self._memo_chars = 0  # characters of the messages in _events
        self._nodes: tuple[list[Process], dict[int, object]] | None = None  # see process_nodes()
        self._handlers = {
            g.VersionEvent: self._on_version, g.NetworkEvent: self._on_network, g.IbDevicesEvent: self._on_ib_devices,
            g.IbUnavailableEvent: self._on_ib_unavailable, g.SocketDevicesEvent: self._on_socket_devices,
            g.BootstrapEvent: self._on_bootstrap, g.EnvEvent: self._on_env, g.GdrEvent: self._on_gdr,
            g.CommInitEvent: self._on_comm_init, g.CommNodesEvent: self._on_comm_nodes,
            g.ChannelSummaryEvent: self._on_channel_summary, g.ConnectionEvent: self._on_connection,
            g.PluginEvent: self._on_plugin, g.OfiProviderEvent: self._on_ofi_provider,
            g.InterfaceEvent: self._on_interface, g.RankEvent: self._on_rank, g.RingOrderEvent: self._on_ring_order,
            g.AllRanksEvent: self._on_all_ranks,
        }

    # -- input ------------------------------------------------------------------------------

    def feed(self, line: str) -> None:
        """One line of log text (with or without its newline). Never raises."""
        try:
            self._feed(line)
        except Exception:  # noqa: BLE001 - a parser bug must never take the exporter down
            self._count("internal_errors")

    def _count(self, kind: str, n: int = 1) -> None:
        self.overflow[kind] = self.overflow.get(kind, 0) + n

    def _feed(self, line: str) -> None:
        self.lines += 1
        if not isinstance(line, str):
            line = str(line)
        limit = self.limits.max_line_chars
        if len(line) > limit:
            self._count("long_lines")
            line = line[:limit]
        marker = line.find("NCCL ")
        if marker < 0:
            if " via " not in line and "Using" not in line and "comm " not in line and " Pid " not in line:
                return
        elif (line.startswith("INFO ", marker + 5) and line.find("NCCL ", marker + 10) < 0 and "\x1b" not in line
              and "across cluster]" not in line):
            # The common line: one INFO record, no escape codes (what split_records would find).
            message = line[marker + 10:].rstrip(g.TRAILER)
            if not g.info_matters(message):
                return
            head = line[:marker]
            prefix = self._prefixes.get(head)
            if prefix is None:
                prefix = g.split_records(line, self._prefixes)[0].prefix
            if prefix is not None and " via " in message:
                process = self.processes.get((prefix.host, prefix.pid))
                thread = process.threads.get(prefix.tid) if process is not None else None
                if thread is not None and self._connection_key(process, thread, message) in self.connections:
                    return  # a connection line seen before changes nothing
            self._record(g.Record(prefix, "INFO", message))
            return
        records = g.split_records(line.rstrip("\r\n"), self._prefixes)
        if len(records) > self.limits.max_records_per_line:
            self._count("records", len(records) - self.limits.max_records_per_line)
            records = records[: self.limits.max_records_per_line]
        for record in records:
            self._record(record)

    def _process(self, prefix: g.Prefix | None) -> Process:
        key = (prefix.host, prefix.pid) if prefix else None
        process = self.processes.get(key)
        if process is None and prefix is not None:
            # A record glued to the end of another ("...via NET/Socn1:11:11 [0] NCCL INFO ...")
            # carries the other's tail in its hostname: match a known process by pid and suffix.
            for known in self.processes.values():
                if known.key and known.key[1] == prefix.pid and prefix.host.endswith(known.key[0]):
                    return known
        if process is None:
            if len(self.processes) >= self.limits.max_processes:
                oldest = next(iter(self.processes))
                del self.processes[oldest]
                self._count("processes")
            process = self.processes[key] = Process(key)
            self._nodes = None
        return process

    def _cite(self, record: g.Record) -> str:
        return cite(record, self.limits.max_cited_chars)

    def _parse(self, message: str) -> g.Event | None:
        """``parse_message``, remembered for messages that repeat (every process prints the same
        ``Using network``, every init the same lines); events are immutable."""
        try:
            return self._events[message]
        except KeyError:
            pass
        event = g.parse_message(message)
        if len(message) <= _MEMO_MESSAGE_CHARS:
            if len(self._events) >= _MEMO_ENTRIES:
                self._events.clear()
                self._memo_chars = 0
            self._events[message] = event
            self._memo_chars += len(message)
        return event

    def _record(self, record: g.Record) -> None:
        category = g.warning_category(record)
        if category is not None:
            if category in ("ib_completion_error", "ib_async_event") and record.message.startswith("NET/IB"):
                # The IB transport is carrying traffic (it reports completions from a peer).
                process = self._process(record.prefix)
                process.ib_datapath_line = process.ib_datapath_line or self._cite(record)
            self.warnings_by_category[category] = self.warnings_by_category.get(category, 0) + 1
            if len(self.warnings) < self.limits.max_warnings:
                self.warnings.append(NcclWarning(category, self._cite(record)))
            else:
                self._count("warnings")
            self._cached = None
        if record.level == "TRACE":
            return
        event = self._parse(record.message)
        if event is None:
            return
        if record.prefix is None and isinstance(event, (g.EnvEvent, g.GdrEvent, g.BootstrapEvent)):
            return  # a bare body of these says nothing about whose it is
        self._cached = None
        if isinstance(event, g.TestRankEvent):
            known = self.test_ranks.get(event.rank)
            if known is not None and known != (event.host, event.pid):
                self.test_runs_mixed = True  # the tables of several runs: rank numbers name different processes
            if known is not None or len(self.test_ranks) < self.limits.max_ranks:
                self.test_ranks[event.rank] = (event.host, event.pid)
            else:
                self._count("ranks")
            return
        process = self._process(record.prefix)
        thread = self._thread(process, record.prefix.tid if record.prefix else 0)
        self._handlers[type(event)](process, thread, event, record)

    def _connection_key(self, process: Process, thread: Thread, message: str) -> tuple:
        """Identical lines of one process in one communicator (or, outside any, one init) are one
        connection; the line's text names everything the connection event holds."""
        context = thread.context if thread.context in self.communicators else None
        return (process.key, context or thread.inits, message)

    def _thread(self, process: Process, tid: int) -> Thread:
        thread = process.threads.get(tid)
        if thread is None:
            if len(process.threads) >= self.limits.max_threads:
                del process.threads[next(iter(process.threads))]
                self._count("threads")
            thread = process.threads[tid] = Thread()
        return thread

    # -- events -----------------------------------------------------------------------------

    def _on_version(self, process: Process, thread: Thread, event: g.VersionEvent, record: g.Record) -> None:
        if event.version in self.versions or len(self.versions) < self.limits.max_versions:
            self.versions[event.version] += 1
        else:
            self._count("versions")
        if record.prefix is not None:
            process.version = event.version

    def _on_network(self, process: Process, thread: Thread, event: g.NetworkEvent, record: g.Record) -> None:
        # Printed at every init: the process's first line naming this network is cited.
        cited = process.network_line if process.network == event.name else None
        if cited is None:
            cited = self._cite(record)
        process.network, process.network_line = event.name, cited
        thread.pending_network = event.name
        comm = self.communicators.get(thread.context) if thread.context else None
        if comm is not None and comm.network is None and process.saw_start:
            comm.network, comm.network_line = event.name, cited

    def _on_ib_devices(self, process: Process, thread: Thread, event: g.IbDevicesEvent, record: g.Record) -> None:
        if not event.devices:  # "NET/IB : Using [RO]; OOB eth0:..." with no device (2.23+ after No device found)
            process.ib_failed = process.ib_failed or self._cite(record)
        elif not process.ib_devices:
            process.ib_devices, process.ib_line = event.devices, self._cite(record)
        if event.oob_address and not event.oob_address.startswith("127.") and process.oob_address != event.oob_address:
            process.oob_address = event.oob_address
            self._nodes = None

    def _on_ib_unavailable(self, process: Process, thread: Thread, event: g.IbUnavailableEvent,
                           record: g.Record) -> None:
        process.ib_failed = process.ib_failed or self._cite(record)

    def _note_interface(self, process: Process, interface: str, address: str) -> None:
        local = is_loopback(interface, address)
        process.loopback = local if process.loopback is None else (process.loopback and local)

    def _on_socket_devices(self, process: Process, thread: Thread, event: g.SocketDevicesEvent,
                               record: g.Record) -> None:
        process.socket_seen = process.socket_seen or self._cite(record)
        for interface, address in event.interfaces:
            self._note_interface(process, interface, address)

    def _on_bootstrap(self, process: Process, thread: Thread, event: g.BootstrapEvent, record: g.Record) -> None:
        if not any(c in event.address for c in ".:"):
            return  # 2.30's "Bootstrap: Using <net device>:<port>" of a bootstrap plugin: no address
        self._note_interface(process, event.interface, event.address)
        if not event.address.startswith("127.") and process.address != event.address:
            process.address = event.address
            self._nodes = None

    def _on_interface(self, process: Process, thread: Thread, event: g.InterfaceEvent, record: g.Record) -> None:
        self._note_interface(process, event.interface, event.address)

    def _on_plugin(self, process: Process, thread: Thread, event: g.PluginEvent, record: g.Record) -> None:
        name = event.name[:g.MAX_NAME_CHARS] if event.name else None
        loaded = process.plugin_loaded
        family_loaded = bool(event.family and loaded and loaded.lower().startswith(event.family.lower()))
        if event.state == g.PLUGIN_LOADED:
            if name or not loaded:
                process.plugin_loaded, process.plugin_loaded_line = name or event.family, self._cite(record)
        elif event.state == g.PLUGIN_IN_USE:
            if process.plugin_in_use is None or name:
                process.plugin_in_use = name or (loaded if family_loaded else event.family)
                process.plugin_in_use_line = self._cite(record)
        elif len(process.plugins_failed) < self.limits.max_env:  # failed or disabled
            failed = {n for n in (name, event.family, loaded if (family_loaded or (
                event.family == g.OFI_FAMILY and is_libfabric(loaded))) else None) if n}
            process.plugins_failed |= failed
            if process.plugin_in_use in failed:
                process.plugin_in_use = process.plugin_in_use_line = None
            if event.family == g.OFI_FAMILY and process.ofi_provider is None:
                process.ofi_in_use = False

    def _on_ofi_provider(self, process: Process, thread: Thread, event: g.OfiProviderEvent, record: g.Record) -> None:
        process.ofi_provider = event.provider[:g.MAX_NAME_CHARS]
        process.ofi_in_use = True
        if process.plugin_in_use is None:
            loaded = process.plugin_loaded
            process.plugin_in_use = loaded if is_libfabric(loaded) else None
            process.plugin_in_use_line = self._cite(record)

    def _on_env(self, process: Process, thread: Thread, event: g.EnvEvent, record: g.Record) -> None:
        if event.variable in process.env or len(process.env) < self.limits.max_env:
            process.env[event.variable] = event.value[:200]

    def _on_gdr(self, process: Process, thread: Thread, event: g.GdrEvent, record: g.Record) -> None:
        if event.network is not None and network_class(event.network) != RDMA:
            return  # "NET/Socket : GPU Direct RDMA Disabled for HCA 0 'lo'" says nothing about RDMA
        if event.enabled not in process.gdr_hca:
            process.gdr_hca[event.enabled] = self._cite(record)

    def _communicator(self, key: str, comm_id: str | None) -> Communicator:
        comm = self.communicators.get(key)
        if comm is None:
            if len(self.communicators) >= self.limits.max_communicators:
                self._evict_oldest_communicator()
            self._comm_order += 1
            comm = self.communicators[key] = Communicator(key, comm_id, self._comm_order)
        return comm

    def _evict_oldest_communicator(self, reason: str = "communicators") -> None:
        """Drop the oldest communicator, keeping what it showed in ``retired``. Costs its own size:
        threads still naming it as their context find it gone (every use checks), and the pointers
        naming it are found through its own references."""
        oldest_key = next(iter(self.communicators))
        oldest = self.communicators[oldest_key]
        decisive = oldest.connections or oldest.nnodes is not None or oldest.network is not None
        if decisive and self.retired.inter_node_rdma and self._only_rdma_lines(oldest):
            decisive = False  # it can only tell what is already kept: RDMA carried inter-node traffic
        for summary, reasons in summarize_communicators(self, only=oldest_key) if decisive else ():
            if summary.inter_node_tcp is True:
                self.retired.inter_node_tcp = True
                if len(self.retired.reasons) < 4:
                    self.retired.reasons.extend(reasons[:1])
            elif summary.inter_node_tcp is False and summary.network_class == RDMA:
                self.retired.inter_node_rdma = True
        comm = self.communicators.pop(oldest_key)
        for key in comm.connections:
            connection = self.connections.pop(key, None)
            if connection is not None and self.processes.get(connection.process.key) is not connection.process:
                self._nodes = None  # it held the last reference to a process evicted earlier
        for process, pointer in comm.pointer_refs:
            if process.pointers.get(pointer) == oldest_key:
                del process.pointers[pointer]
        self.retired.count += 1
        self._count(reason)

    def _only_rdma_lines(self, comm: Communicator) -> bool:
        """The communicator shows NET lines and all are on RDMA-class networks (then its network is
        that one and none of its traffic can be TCP)."""
        classes = set()
        for key in comm.connections:
            connection = self.connections.get(key)
            if connection is not None and connection.event.kind == "net":
                classes.add(connection_class(connection))
        return classes == {RDMA}

    def _point(self, process: Process, pointer: str, comm: Communicator) -> None:
        """Remember that ``pointer`` of ``process`` names ``comm`` (bounded per process)."""
        if pointer in process.pointers or len(process.pointers) < self.limits.max_pointers:
            process.pointers[pointer] = comm.key
            if len(comm.pointer_refs) < self.limits.max_ranks:
                comm.pointer_refs.add((process, pointer))

    def process_nodes(self) -> tuple[list[Process], dict[int, object]]:
        """Every process the state refers to, and ``id(process) -> node key``; recomputed only
        after a process appears, goes or shows a new address."""
        if self._nodes is None:
            seen = {id(p): p for p in self.processes.values()}
            for c in self.connections.values():
                seen.setdefault(id(c.process), c.process)
            for p in self.loose_ranks.values():
                seen.setdefault(id(p), p)
            processes = list(seen.values())
            self._nodes = (processes, node_keys(processes))
        return self._nodes

    def _add_rank(self, comm: Communicator, rank: int, process: Process) -> None:
        known = comm.rank_process.get(rank)
        if known is not None and known.key != process.key:
            comm.mixed = True  # one rank, two processes: several communicators share this key
        if known is not None or len(comm.rank_process) < self.limits.max_ranks:
            comm.rank_process[rank] = process
        else:
            self._count("ranks")

    def _on_comm_init(self, process: Process, thread: Thread, event: g.CommInitEvent, record: g.Record) -> None:
        if event.phase == "END":  # Destroy/Abort: the communicator's size and this rank, nothing else
            key = event.comm_id or process.pointers.get(event.pointer) or f"nranks:{event.nranks}"
            comm = self._communicator(key, event.comm_id)
            comm.nranks = comm.nranks or event.nranks
            if record.prefix is not None:
                self._add_rank(comm, event.rank, process)
            process.named_comm = True
            return
        key = event.comm_id or f"nranks:{event.nranks}"
        comm = self._communicator(key, event.comm_id)
        placeholder = process.pointers.get(event.pointer)
        if (event.comm_id and placeholder and placeholder != key and placeholder.startswith("nranks:")
                and placeholder in self.communicators):
            self._merge(self.communicators[placeholder], comm)
        comm.nranks = event.nranks
        if record.prefix is not None:
            self._add_rank(comm, event.rank, process)
        if event.gpu_id is not None and (event.rank in comm.rank_gpu or len(comm.rank_gpu) < self.limits.max_ranks):
            if comm.rank_gpu.setdefault(event.rank, event.gpu_id) != event.gpu_id:
                comm.mixed = True
        process.named_comm = True
        self._point(process, event.pointer, comm)
        for rank, nranks in thread.pending_ranks:
            if rank == event.rank and nranks in (None, event.nranks) and self.loose_ranks.get(rank) is process:
                process.loose_ranks.discard(rank)  # it was this init's own rank: placed by this line
                del self.loose_ranks[rank]
        thread.pending_ranks = []
        if thread.pending_network and comm.network is None:
            comm.network, comm.network_line = thread.pending_network, process.network_line
        thread.pending_network = None
        if event.phase == "START":
            process.saw_start = True
            self._release_pending(thread, UNATTRIBUTED)
            thread.context = key
            return
        # COMPLETE (or 2.3's bare line): connections logged since the last init belong here.
        self._release_pending(thread, key)
        thread.inits += 1
        # With START lines (2.18.3+), connections printed after COMPLETE are runtime connects
        # (2.22+) of this communicator; without them, the next lines belong to a new init.
        thread.context = key if (process.saw_start or event.phase is None) else None

    def _on_rank(self, process: Process, thread: Thread, event: g.RankEvent, record: g.Record) -> None:
        """A line naming this process's rank: placed in the communicator being initialised, or kept as
        a loose rank (used when the log names at most one communicator)."""
        if record.prefix is None:
            return
        comm = self.communicators.get(thread.context) if thread.context else None
        if comm is not None and event.nranks in (None, comm.nranks):
            self._add_rank(comm, event.rank, process)
            return
        self._loose_rank(process, event.rank, event.nranks)
        if len(thread.pending_ranks) < self.limits.max_pointers:
            thread.pending_ranks.append((event.rank, event.nranks))

    def _loose_rank(self, process: Process, rank: int, nranks: int | None) -> None:
        if nranks is not None and nranks > rank:
            self.loose_nranks = max(self.loose_nranks or 0, nranks)
        known = self.loose_ranks.get(rank)
        if known is None and len(self.loose_ranks) >= self.limits.max_ranks:
            self._count("ranks")
            return
        if known is not None and known is not process:
            self.loose_mixed = True  # two processes claim one rank: several communicators' lines
        if known is None:
            self._nodes = None
        self.loose_ranks[rank] = process
        if len(process.loose_ranks) < self.limits.max_ranks:
            process.loose_ranks.add(rank)

    def _on_ring_order(self, process: Process, thread: Thread, event: g.RingOrderEvent, record: g.Record) -> None:
        """Rank 0 lists each ring: the process is rank 0 and the communicator has that many ranks
        (when the listing holds every rank 0..N-1 once)."""
        nranks = len(event.ranks)
        if sorted(event.ranks) != list(range(nranks)):
            return
        self._on_rank(process, thread, g.RankEvent(0, nranks), record)
        comm = self.communicators.get(thread.context) if thread.context else None
        if comm is not None and comm.nranks is None:
            comm.nranks = nranks

    def _on_all_ranks(self, process: Process, thread: Thread, event: g.AllRanksEvent, record: g.Record) -> None:
        """ncclCommInitAll: this one process drives every rank of the communicator."""
        if record.prefix is None:
            return
        for rank in range(min(event.nranks, self.limits.max_ranks)):
            self._loose_rank(process, rank, event.nranks)

    def _merge(self, old: Communicator, new: Communicator) -> None:
        """Fold a communicator known only by size (an ``nNodes`` line seen before the line naming its
        commId) into the one with the commId."""
        if new.nnodes is None or (old.nnodes or 0) > new.nnodes:
            new.nnodes, new.nnodes_line = old.nnodes, old.nnodes_line
        new.mnnvl |= old.mnnvl
        new.mixed |= old.mixed
        new.network, new.network_line = new.network or old.network, new.network_line or old.network_line
        for rank, process in old.rank_process.items():
            if len(new.rank_process) < self.limits.max_ranks:
                new.rank_process.setdefault(rank, process)
        for rank, channels in old.nvls_channels.items():
            new.nvls_channels.setdefault(rank, channels)
        for rank, gpu in old.rank_gpu.items():
            new.rank_gpu.setdefault(rank, gpu)
        for conn_key in old.connections:
            connection = self.connections.get(conn_key)
            if connection is not None:
                connection.comm = new.key
                new.connections.add(conn_key)
        del self.communicators[old.key]
        for process, pointer in old.pointer_refs:
            if process.pointers.get(pointer) == old.key:
                self._point(process, pointer, new)
        for process in self.processes.values():
            for thread in process.threads.values():
                if thread.context == old.key:
                    thread.context = new.key

    def _release_pending(self, thread: Thread, key: str) -> None:
        if not thread.pending:
            return
        comm = self._communicator(key, None)
        for conn_key in thread.pending:
            connection = self.connections.get(conn_key)
            if connection is not None:
                connection.comm = key
                comm.connections.add(conn_key)
        thread.pending = []

    def _on_comm_nodes(self, process: Process, thread: Thread, event: g.CommNodesEvent, record: g.Record) -> None:
        process.named_comm = True
        key = process.pointers.get(event.pointer) or thread.context
        if key is None or key not in self.communicators:
            key = f"nranks:{event.nranks}"
            comm = self._communicator(key, None)
            if len(process.pointers) < self.limits.max_pointers:
                self._point(process, event.pointer, comm)
        comm = self._communicator(key, None)
        comm.nranks = comm.nranks or event.nranks
        if comm.nnodes is None or event.nnodes > comm.nnodes:
            comm.nnodes, comm.nnodes_line = event.nnodes, self._cite(record)
        comm.mnnvl |= event.mnnvl
        if record.prefix is not None:
            self._add_rank(comm, event.rank, process)

    def _on_channel_summary(self, process: Process, thread: Thread, event: g.ChannelSummaryEvent,
                                record: g.Record) -> None:
        comm = self.communicators.get(thread.context) if thread.context else None
        if comm is None or event.nvls_channels <= 0:
            return
        ranks = [r for r, p in comm.rank_process.items() if p is process]
        rank = ranks[-1] if ranks else -1 - len(comm.nvls_channels)
        if rank in comm.nvls_channels or len(comm.nvls_channels) < self.limits.max_ranks:
            comm.nvls_channels[rank] = event.nvls_channels

    def _on_connection(self, process: Process, thread: Thread, event: g.ConnectionEvent,
                            record: g.Record) -> None:
        key = self._connection_key(process, thread, record.message)
        context = key[1] if isinstance(key[1], str) else None
        if key in self.connections:
            return
        if len(self.connections) >= self.limits.max_connections:
            self._count("connections")
            return
        self.connections[key] = Connection(event, process, context, record, self.limits.max_cited_chars)
        if context is not None:
            self.communicators[context].connections.add(key)
        elif len(thread.pending) < self.limits.max_connections:
            thread.pending.append(key)

    # -- memory -----------------------------------------------------------------------------

    def approx_bytes(self) -> int:
        """What this analyzer holds, estimated from the counts of what it remembers (see _BYTES_*)."""
        rank_facts = sum(len(c.rank_process) + len(c.rank_gpu) + len(c.nvls_channels) + len(c.pointer_refs)
                         for c in self.communicators.values())
        rank_facts += len(self.loose_ranks) + len(self.test_ranks)
        entries = sum(len(p.pointers) + len(p.threads) + len(p.env) for p in self.processes.values())
        return (_BYTES_BASE + _BYTES_PER_RANK_FACT * rank_facts + _BYTES_PER_CONNECTION * len(self.connections)
                + _BYTES_PER_PROCESS * len(self.processes) + _BYTES_PER_PROCESS_ENTRY * entries
                + _BYTES_PER_MEMO_ENTRY * len(self._events) + self._memo_chars
                + _BYTES_PER_PREFIX_ENTRY * len(self._prefixes))

    def shrink(self, target_bytes: int) -> int:
        """Give memory back until at most ``target_bytes`` are held (a node-wide budget asks): first
        the caches of parsed lines, then the oldest communicators, whose conclusions are kept
        (``retired``), each counted as ``budget`` in ``overflow``. Returns the estimate after."""
        self._events.clear()
        self._memo_chars = 0
        self._prefixes.clear()
        size = self.approx_bytes()
        while size > target_bytes and self.communicators:
            self._evict_oldest_communicator(reason="budget")
            size = self.approx_bytes()
        self._cached = None
        return size

    # -- output -----------------------------------------------------------------------------

    def result(self) -> Verdict:
        """The verdict for everything fed so far (cached until the next relevant line)."""
        if self._cached is None:
            try:
                self._cached = decide(self)
            except Exception:  # noqa: BLE001 - never let a reasoning bug escape to a scrape
                self._count("internal_errors")
                self._cached = Verdict.unknown(("internal error while deciding; see overflow",))
        return self._cached

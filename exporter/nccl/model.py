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
from exporter.nccl.networks import RDMA, network_class
from exporter.nccl.verdict import NcclWarning, Verdict, decide, summarize_communicators

UNATTRIBUTED = "unattributed"


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


class Process:
    """One NCCL process, identified by ``(hostname, pid)`` from the line prefix."""

    __slots__ = ("key", "host", "address", "oob_address", "network", "network_line", "ib_devices", "ib_failed",
                 "socket_seen", "threads", "saw_start", "pointers", "env", "version", "gdr_hca",
                 "ib_datapath_line")

    def __init__(self, key: tuple[str, int] | None) -> None:
        self.key = key
        self.host = key[0] if key else None
        self.address: str | None = None  # bootstrap address: tells apart nodes sharing a hostname
        self.oob_address: str | None = None  # NET/IB's OOB address, used where no bootstrap line shows
        self.network: str | None = None  # last "Using network"
        self.network_line: str | None = None
        self.ib_devices: tuple[g.IbDevice, ...] | None = None
        self.ib_failed = False
        self.socket_seen: str | None = None  # the NET/Socket : Using line
        self.threads: dict[int, Thread] = {}  # by tid: one process may init several ranks on threads
        self.saw_start = False  # prints "Init START" (2.18.3+): a thread's context opens at START
        self.pointers: dict[str, str] = {}  # comm pointer -> communicator key
        self.env: dict[str, str] = {}
        self.version: str | None = None
        self.gdr_hca: dict[bool, str] = {}  # GDR enabled/disabled per HCA on an RDMA net -> cited line
        self.ib_datapath_line: str | None = None  # a NET/IB completion/async WARN: IB carries traffic

    def label(self) -> str:
        return f"{self.key[0]}:{self.key[1]}" if self.key else "(no prefix)"

    def selected_network(self) -> tuple[str | None, str | None]:
        """The network this process uses, and the line that says so.

        ``Using network`` when printed (2.6+). Before it (2.4–2.5) IB counts when ``NET/IB : Using``
        was printed, Socket only when IB failed or was disabled: 2.4 prints ``NET/Socket : Using`` on
        every rank even when IB is then selected.
        """
        if self.network:
            return self.network, self.network_line
        if self.ib_devices:
            return "IB", None
        ib_disabled = self.env.get("NCCL_IB_DISABLE", "0").strip() not in ("0", "")
        if self.socket_seen and (self.ib_failed or ib_disabled):
            return "Socket", self.socket_seen
        if self.ib_datapath_line:
            return "IB", self.ib_datapath_line
        return None, None


class Thread:
    """What one logging thread is initialising: connection lines carry no communicator."""

    __slots__ = ("context", "pending", "pending_network", "inits")

    def __init__(self) -> None:
        self.context: str | None = None  # communicator whose init (or runtime connect) this thread logs
        self.pending: list[tuple] = []  # connection keys logged before their communicator is known
        self.pending_network: str | None = None  # "Using network" not yet tied to a communicator
        self.inits = 0  # init lines seen: tells apart identical lines of successive inits
        # (2.19+ prints it just before Init START; 2.13–2.18.1 before Init COMPLETE)


class Communicator:
    __slots__ = ("key", "comm_id", "nranks", "nnodes", "nnodes_line", "mnnvl", "network", "network_line",
                 "rank_process", "rank_gpu", "nvls_channels", "connections", "order", "mixed")

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
        # Several communicators under one key (before commIds, same-size communicators share
        # "nranks:N"): rank numbers then name different GPUs, so ranks are not placed on nodes.
        self.mixed = False


class Connection:
    __slots__ = ("event", "process", "comm", "cited")

    def __init__(self, event: g.ConnectionEvent, process: Process, comm: str | None, cited: str) -> None:
        self.event = event
        self.process = process
        self.comm = comm
        self.cited = cited


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
        self.warnings: list[NcclWarning] = []
        self.retired = Retired()
        self.lines = 0
        self._comm_order = 0
        self._cached: Verdict | None = None

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
        if ("NCCL" not in line and " via " not in line and "Using" not in line and "comm " not in line
                and " Pid " not in line):
            return
        records = g.split_records(line.rstrip("\r\n"))
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
        return process

    def _cite(self, record: g.Record) -> str:
        text = record.message
        if record.prefix is not None:
            p = record.prefix
            location = f"{p.location} " if p.location else ""
            text = f"{p.host}:{p.pid}:{p.tid} [{p.cuda_dev}] {location}NCCL {record.level} {text}"
        cap = self.limits.max_cited_chars
        return text if len(text) <= cap else text[: cap - 3] + "..."

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
        event = g.parse_message(record.message)
        if event is None:
            return
        if record.prefix is None and isinstance(event, (g.EnvEvent, g.GdrEvent, g.BootstrapEvent)):
            return  # a bare body of these says nothing about whose it is
        self._cached = None
        if isinstance(event, g.TestRankEvent):
            if event.rank in self.test_ranks or len(self.test_ranks) < self.limits.max_ranks:
                self.test_ranks[event.rank] = (event.host, event.pid)
            else:
                self._count("ranks")
            return
        process = self._process(record.prefix)
        thread = self._thread(process, record.prefix.tid if record.prefix else 0)
        handler = getattr(self, "_on_" + type(event).__name__)
        handler(process, thread, event, record)

    def _thread(self, process: Process, tid: int) -> Thread:
        thread = process.threads.get(tid)
        if thread is None:
            if len(process.threads) >= self.limits.max_threads:
                del process.threads[next(iter(process.threads))]
                self._count("threads")
            thread = process.threads[tid] = Thread()
        return thread

    # -- events -----------------------------------------------------------------------------

    def _on_VersionEvent(self, process: Process, thread: Thread, event: g.VersionEvent, record: g.Record) -> None:
        if event.version in self.versions or len(self.versions) < self.limits.max_versions:
            self.versions[event.version] += 1
        else:
            self._count("versions")
        if record.prefix is not None:
            process.version = event.version

    def _on_NetworkEvent(self, process: Process, thread: Thread, event: g.NetworkEvent, record: g.Record) -> None:
        cited = self._cite(record)
        process.network, process.network_line = event.name, cited
        thread.pending_network = event.name
        comm = self.communicators.get(thread.context) if thread.context else None
        if comm is not None and comm.network is None and process.saw_start:
            comm.network, comm.network_line = event.name, cited

    def _on_IbDevicesEvent(self, process: Process, thread: Thread, event: g.IbDevicesEvent, record: g.Record) -> None:
        process.ib_devices = event.devices or process.ib_devices or ()
        if event.oob_address and not event.oob_address.startswith("127."):
            process.oob_address = event.oob_address

    def _on_IbNoDeviceEvent(self, process: Process, thread: Thread, event: g.IbNoDeviceEvent, record: g.Record) -> None:
        process.ib_failed = True

    def _on_SocketDevicesEvent(self, process: Process, thread: Thread, event: g.SocketDevicesEvent,
                               record: g.Record) -> None:
        process.socket_seen = self._cite(record)

    def _on_BootstrapEvent(self, process: Process, thread: Thread, event: g.BootstrapEvent, record: g.Record) -> None:
        if not event.address.startswith("127."):
            process.address = event.address

    def _on_EnvEvent(self, process: Process, thread: Thread, event: g.EnvEvent, record: g.Record) -> None:
        if event.variable in process.env or len(process.env) < self.limits.max_env:
            process.env[event.variable] = event.value[:200]

    def _on_GdrEvent(self, process: Process, thread: Thread, event: g.GdrEvent, record: g.Record) -> None:
        if event.network is not None and network_class(event.network) != RDMA:
            return  # "NET/Socket : GPU Direct RDMA Disabled for HCA 0 'lo'" says nothing about RDMA
        process.gdr_hca.setdefault(event.enabled, self._cite(record))

    def _communicator(self, key: str, comm_id: str | None) -> Communicator:
        comm = self.communicators.get(key)
        if comm is None:
            if len(self.communicators) >= self.limits.max_communicators:
                self._evict_oldest_communicator()
            self._comm_order += 1
            comm = self.communicators[key] = Communicator(key, comm_id, self._comm_order)
        return comm

    def _evict_oldest_communicator(self) -> None:
        oldest_key = next(iter(self.communicators))
        oldest = self.communicators[oldest_key]
        decisive = oldest.connections or oldest.nnodes is not None or oldest.network is not None
        for summary, reasons in summarize_communicators(self, only=oldest_key) if decisive else ():
            if summary.inter_node_tcp is True:
                self.retired.inter_node_tcp = True
                if len(self.retired.reasons) < 4:
                    self.retired.reasons.extend(reasons[:1])
            elif summary.inter_node_tcp is False and network_class(summary.network) == RDMA:
                self.retired.inter_node_rdma = True
        comm = self.communicators.pop(oldest_key)
        for key in comm.connections:
            self.connections.pop(key, None)
        for process in self.processes.values():
            for thread in process.threads.values():
                if thread.context == oldest_key:
                    thread.context = None
        self.retired.count += 1
        self._count("communicators")

    def _add_rank(self, comm: Communicator, rank: int, process: Process) -> None:
        known = comm.rank_process.get(rank)
        if known is not None and known.key != process.key:
            comm.mixed = True  # one rank, two processes: several communicators share this key
        if known is not None or len(comm.rank_process) < self.limits.max_ranks:
            comm.rank_process[rank] = process
        else:
            self._count("ranks")

    def _on_CommInitEvent(self, process: Process, thread: Thread, event: g.CommInitEvent, record: g.Record) -> None:
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
        if event.pointer in process.pointers or len(process.pointers) < self.limits.max_pointers:
            process.pointers[event.pointer] = key
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
        for process in self.processes.values():
            for pointer, key in process.pointers.items():
                if key == old.key:
                    process.pointers[pointer] = new.key
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

    def _on_CommNodesEvent(self, process: Process, thread: Thread, event: g.CommNodesEvent, record: g.Record) -> None:
        key = process.pointers.get(event.pointer) or thread.context
        if key is None or key not in self.communicators:
            key = f"nranks:{event.nranks}"
            if len(process.pointers) < self.limits.max_pointers:
                process.pointers[event.pointer] = key
        comm = self._communicator(key, None)
        comm.nranks = comm.nranks or event.nranks
        if comm.nnodes is None or event.nnodes > comm.nnodes:
            comm.nnodes, comm.nnodes_line = event.nnodes, self._cite(record)
        comm.mnnvl |= event.mnnvl
        if record.prefix is not None:
            self._add_rank(comm, event.rank, process)

    def _on_ChannelSummaryEvent(self, process: Process, thread: Thread, event: g.ChannelSummaryEvent,
                                record: g.Record) -> None:
        comm = self.communicators.get(thread.context) if thread.context else None
        if comm is None or event.nvls_channels <= 0:
            return
        ranks = [r for r, p in comm.rank_process.items() if p is process]
        rank = ranks[-1] if ranks else -1 - len(comm.nvls_channels)
        if rank in comm.nvls_channels or len(comm.nvls_channels) < self.limits.max_ranks:
            comm.nvls_channels[rank] = event.nvls_channels

    def _on_ConnectionEvent(self, process: Process, thread: Thread, event: g.ConnectionEvent,
                            record: g.Record) -> None:
        context = thread.context if thread.context in self.communicators else None
        key = (process.key, context or thread.inits, event.kind, event.channel, event.conn_index, event.src,
               event.dst, event.src_id, event.dst_id, event.direction, event.via)
        if key in self.connections:
            return
        if len(self.connections) >= self.limits.max_connections:
            self._count("connections")
            return
        self.connections[key] = Connection(event, process, context, self._cite(record))
        if context is not None:
            self.communicators[context].connections.add(key)
        elif len(thread.pending) < self.limits.max_connections:
            thread.pending.append(key)

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

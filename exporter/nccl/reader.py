"""From the lines of one log stream to its state: each line is split into records and parsed into
events (:mod:`grammar`), and each event updates the processes, communicators and connections it
names (:mod:`state`). ``feed`` never raises; every structure stays within the stream's limits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from exporter.nccl import grammar as g
from exporter.nccl import launcher
from exporter.nccl.facts import UNATTRIBUTED, Connection, ConnectionKey, Process, Thread, is_loopback
from exporter.nccl.networks import RDMA, is_libfabric, network_class
from exporter.nccl.state import Limits, StreamState, SummarizeEvicted
from exporter.nccl.verdict import NcclWarning, Verdict

# A line the reader can use holds one of these: "NCCL " (every record the logger writes), or for a
# bare message body (its prefix stripped by whoever shipped the log) one of the others; any other
# line is dropped at once by ``feed``. ``ccl-exporter analyze`` skips, unread, lines holding none.
LINE_NEEDLES = ("NCCL ", " via ", "Using", "comm ", " Pid ", "Ring ", "qpn ", "GLOBAL_RANK", "NCCL_SHM_DISABLE")
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

# Distinct unknown network names a stream may teach as RDMA-class by /GDRDMA (a hostile log repeats one).
_MAX_RDMA_BY_GDR = 16


class StreamReader(StreamState):
    """Feeds one stream's lines into its state. ``_cached`` holds the verdict last concluded on the
    state (see :class:`analyzer.LogAnalyzer`); any line that changes the state drops it."""

    def __init__(self, limits: Limits, summarize_evicted: SummarizeEvicted) -> None:
        super().__init__(limits, summarize_evicted)
        self._cached: Verdict | None = None
        self._prefixes: dict[str, g.Prefix | None] = {}  # parsed line prefixes by their text
        self._events: dict[str, g.Event | None] = {}  # parsed messages by their text
        self._memo_chars = 0  # characters of the messages in _events
        # Event type -> its handler; each handler takes its own event type.
        self._handlers: dict[type, Callable[[Process, Thread, Any, g.Record], None]] = {
            g.VersionEvent: self._on_version,
            g.NetworkEvent: self._on_network,
            g.IbDevicesEvent: self._on_ib_devices,
            g.IbUnavailableEvent: self._on_ib_unavailable,
            g.IbTrafficEvent: self._on_ib_traffic,
            g.SocketTrafficEvent: self._on_socket_traffic,
            g.SocketDevicesEvent: self._on_socket_devices,
            g.BootstrapEvent: self._on_bootstrap,
            g.EnvEvent: self._on_env,
            g.GdrEvent: self._on_gdr,
            g.CommInitEvent: self._on_comm_init,
            g.CommNodesEvent: self._on_comm_nodes,
            g.ChannelSummaryEvent: self._on_channel_summary,
            g.ConnectionEvent: self._on_connection,
            g.PluginEvent: self._on_plugin,
            g.OfiProviderEvent: self._on_ofi_provider,
            g.InterfaceEvent: self._on_interface,
            g.RankEvent: self._on_rank,
            g.RingOrderEvent: self._on_ring_order,
            g.AllRanksEvent: self._on_all_ranks,
        }

    # -- input ------------------------------------------------------------------------------

    def feed(self, line: str) -> None:
        """One line of log text (with or without its newline). Never raises."""
        try:
            self._feed(line)
        except Exception:  # noqa: BLE001 - a parser bug must never take the exporter down
            self._count("internal_errors")

    def _feed(self, line: str) -> None:
        self.lines += 1
        if not isinstance(line, str):
            line = str(line)  # type: ignore[unreachable]  # callers outside typed code may pass bytes
        limit = self.limits.max_line_chars
        if len(line) > limit:
            self._count("long_lines")
            line = line[:limit]
        marker = line.find("NCCL ")
        if marker < 0:  # LINE_NEEDLES, spelled out: the test of every line
            if (
                " via " not in line
                and "Using" not in line
                and "comm " not in line
                and " Pid " not in line
                and "Ring " not in line  # NCCL 2.2 and older print rings and queue pairs without the word NCCL
                and "qpn " not in line
            ):
                if "GLOBAL_RANK" in line:
                    self._launcher_rank(line)
                elif "NCCL_SHM_DISABLE" in line:
                    self._shm_setting(line)
                return
        elif (
            line.startswith("INFO ", marker + 5)
            and line.find("NCCL ", marker + 10) < 0
            and "\x1b" not in line
            and "across cluster]" not in line
        ):
            # The common line: one INFO record, no escape codes (what split_records would find).
            message = g.clean_message(line[marker + 10 :])
            head = line[:marker]
            if not g.info_matters(message):
                if head not in self._prefixes:  # a writer's first line: its process runs NCCL here
                    self._note_process(line, head)
                return
            prefix = self._prefixes.get(head)
            if prefix is None:
                prefix = g.split_records(line, self._prefixes)[0].prefix
                self._note_launcher(head, prefix)
            if prefix is not None and " via " in message:
                process = self.processes.get((prefix.host, prefix.pid))
                if process is not None:
                    thread = process.threads.get(prefix.tid)
                    if thread is not None and self._connection_key(process, thread, message) in self.connections:
                        return  # a connection line seen before changes nothing
            self._record(g.Record(prefix, "INFO", message))
            return
        records = g.split_records(line.rstrip("\r\n"), self._prefixes)
        if records and marker > 0:
            self._note_launcher(line[:marker], records[0].prefix)
        if len(records) > self.limits.max_records_per_line:
            self._count("records", len(records) - self.limits.max_records_per_line)
            records = records[: self.limits.max_records_per_line]
        for index, record in enumerate(records):
            self._record(record, glued=index > 0)

    # -- launchers --------------------------------------------------------------------------

    def _note_process(self, line: str, head: str) -> None:
        """The process a line of no other use names: a host that prints any NCCL line runs a process
        of the job (its prefix is parsed once per writer, then found in the prefix cache)."""
        prefix = g.split_records(line, self._prefixes)[0].prefix
        if prefix is not None and (prefix.host, prefix.pid) not in self.processes:
            self._process(prefix)
            self._cached = None

    def _note_launcher(self, head: str, prefix: g.Prefix | None) -> None:
        """What the text before an NCCL record says: its launch (Open MPI job id), and whether the
        launcher's ``host: `` words name hosts (the word is this record's host)."""
        if not head or (prefix is not None and head.startswith(f"{prefix.host}:{prefix.pid}:")):
            return
        head = _without_colours(head)
        job = launcher.mpi_job(head)
        if job is not None and len(self.launcher_jobs) < self.limits.max_versions:
            self.launcher_jobs.add(job)
        if prefix is not None and not self.launcher_names_hosts:
            word = launcher.line_host(head)
            if word is not None and launcher.names_host(word, prefix.host):
                self.launcher_names_hosts = True
                self._cached = None

    def _launcher_rank(self, line: str) -> None:
        """A launcher's rank line (Lightning's GLOBAL_RANK): the host its ``host: `` word names runs a rank."""
        line = _without_colours(line)
        rank = launcher.rank_line(line)
        word = launcher.line_host(line) if rank is not None else None
        if word is None or word in self.rank_hosts or len(self.rank_hosts) >= self.limits.max_processes:
            return
        self.rank_hosts[word] = g.clean_message(line)[: self.limits.max_cited_chars]
        self._cached = None

    def _shm_setting(self, line: str) -> None:
        """``NCCL_SHM_DISABLE=1`` on a command line (``mpirun -x``, ``export``, ``env``)."""
        at = line.find("NCCL_SHM_DISABLE")
        if line[at + 16 : at + 18] == "=1" and not line[at + 18 : at + 19].isdigit():
            self.shm_disabled = True
            self._cached = None

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

    def _record(self, record: g.Record, glued: bool = False) -> None:
        category = g.warning_category(record)
        if category is not None:
            if category in ("ib_completion_error", "ib_async_event") and record.message.startswith("NET/IB"):
                # The IB transport is carrying traffic (it reports completions from a peer).
                process = self._process(record.prefix, glued)
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
            if record.prefix is not None and (record.prefix.host, record.prefix.pid) not in self.processes:
                self._process(record.prefix, glued)  # a process of this host runs NCCL, whatever it prints
                self._cached = None
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
                if event.gpu is not None:
                    self.test_gpus[event.rank] = event.gpu
            else:
                self._count("ranks")
            return
        process = self._process(record.prefix, glued)
        thread = self._thread(process, record.prefix.tid if record.prefix else 0)
        self._handlers[type(event)](process, thread, event, record)

    def _connection_key(self, process: Process, thread: Thread, message: str) -> ConnectionKey:
        """Identical lines of one process in one communicator (or, outside any, one init) are one
        connection; the line's text names everything the connection event holds."""
        context = thread.context if thread.context in self.communicators else None
        return (process.key, context or thread.inits, message)

    # -- events of a process ----------------------------------------------------------------

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
        if record.prefix is not None and len(process.init_devices) < self.limits.max_threads:
            process.init_devices.add(record.prefix.cuda_dev)  # printed once per rank it initialises
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

    def _on_ib_traffic(self, process: Process, thread: Thread, event: g.IbTrafficEvent, record: g.Record) -> None:
        process.ib_datapath_line = process.ib_datapath_line or self._cite(record)

    def _on_socket_traffic(
        self, process: Process, thread: Thread, event: g.SocketTrafficEvent, record: g.Record
    ) -> None:
        process.socket_datapath_line = process.socket_datapath_line or self._cite(record)

    def _on_ib_unavailable(
        self, process: Process, thread: Thread, event: g.IbUnavailableEvent, record: g.Record
    ) -> None:
        process.ib_failed = process.ib_failed or self._cite(record)

    def _note_interface(self, process: Process, interface: str, address: str) -> None:
        local = is_loopback(interface, address)
        process.loopback = local if process.loopback is None else (process.loopback and local)

    def _on_socket_devices(
        self, process: Process, thread: Thread, event: g.SocketDevicesEvent, record: g.Record
    ) -> None:
        process.socket_seen = process.socket_seen or self._cite(record)
        for interface, address in event.interfaces:
            self._note_interface(process, interface, address)
        if event.interfaces:
            self._note_socket_address(process, *event.interfaces[0])

    def _on_bootstrap(self, process: Process, thread: Thread, event: g.BootstrapEvent, record: g.Record) -> None:
        if not any(c in event.address for c in ".:"):
            return  # 2.30's "Bootstrap: Using <net device>:<port>" of a bootstrap plugin: no address
        self._note_interface(process, event.interface, event.address)
        if not event.address.startswith("127.") and process.address != event.address:
            process.address = event.address
            process.address_from_socket = False
            self._nodes = None

    def _note_socket_address(self, process: Process, interface: str, address: str) -> None:
        """NCCL's sockets listen on the interface its bootstrap uses (both take the first interface
        ``ncclFindInterfaces`` finds): a process printing no bootstrap line is told apart by it."""
        if process.address is None and not is_loopback(interface, address):
            process.address = address
            process.address_from_socket = True
            self._nodes = None

    def _on_interface(self, process: Process, thread: Thread, event: g.InterfaceEvent, record: g.Record) -> None:
        self._note_interface(process, event.interface, event.address)
        self._note_socket_address(process, event.interface, event.address)

    def _on_plugin(self, process: Process, thread: Thread, event: g.PluginEvent, record: g.Record) -> None:
        name = event.name[: g.MAX_NAME_CHARS] if event.name else None
        loaded = process.plugin_loaded
        # The plugin this line's family prefix speaks of, when it is the one "Loaded net plugin" named.
        family_plugin = loaded if event.family and _of_family(loaded, event.family) else None
        if event.state == g.PLUGIN_LOADED:
            if name or not loaded:
                process.plugin_loaded, process.plugin_loaded_line = name or event.family, self._cite(record)
        elif event.state == g.PLUGIN_IN_USE:
            if process.plugin_in_use is None or name:
                process.plugin_in_use = name or family_plugin or event.family
                process.plugin_in_use_line = self._cite(record)
        elif len(process.plugins_failed) < self.limits.max_env:  # failed or disabled
            failed = {n for n in (name, event.family, family_plugin) if n}
            process.plugins_failed |= failed
            if process.plugin_in_use in failed:
                process.plugin_in_use = process.plugin_in_use_line = None
            if event.family == g.OFI_FAMILY and process.ofi_provider is None:
                process.ofi_in_use = False

    def _on_ofi_provider(self, process: Process, thread: Thread, event: g.OfiProviderEvent, record: g.Record) -> None:
        process.ofi_provider = event.provider[: g.MAX_NAME_CHARS]
        process.ofi_in_use = True
        if process.plugin_in_use is None:
            loaded = process.plugin_loaded
            process.plugin_in_use = loaded if is_libfabric(loaded) else None
            process.plugin_in_use_line = self._cite(record)

    def _on_env(self, process: Process, thread: Thread, event: g.EnvEvent, record: g.Record) -> None:
        if event.variable == "NCCL_SHM_DISABLE" and event.value.strip() == "1":
            self.shm_disabled = True
        if event.variable in process.env or len(process.env) < self.limits.max_env:
            process.env[event.variable] = event.value[:200]

    def _on_gdr(self, process: Process, thread: Thread, event: g.GdrEvent, record: g.Record) -> None:
        if event.network is not None and network_class(event.network) != RDMA:
            return  # "NET/Socket : GPU Direct RDMA Disabled for HCA 0 'lo'" says nothing about RDMA
        if event.enabled not in process.gdr_hca:
            process.gdr_hca[event.enabled] = self._cite(record)

    # -- events of a communicator -----------------------------------------------------------

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
        if (
            event.comm_id
            and placeholder
            and placeholder != key
            and placeholder.startswith("nranks:")
            and placeholder in self.communicators
        ):
            self._merge(self.communicators[placeholder], comm)
        comm.nranks = event.nranks
        if record.prefix is not None:
            self._add_rank(comm, event.rank, process)
            if event.init_all:  # ncclCommInitAll: this process initialises every rank
                for rank in range(min(event.nranks, self.limits.max_ranks)):
                    if rank not in comm.rank_process:
                        self._add_rank(comm, rank, process)
        if event.gpu_id is not None and (event.rank in comm.rank_gpu or len(comm.rank_gpu) < self.limits.max_ranks):
            if comm.rank_gpu.setdefault(event.rank, event.gpu_id) != event.gpu_id:
                comm.mixed = True
        if event.bus_id is not None and (event.rank in comm.rank_bus or len(comm.rank_bus) < self.limits.max_ranks):
            comm.rank_bus.setdefault(event.rank, event.bus_id)
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

    def _on_channel_summary(
        self, process: Process, thread: Thread, event: g.ChannelSummaryEvent, record: g.Record
    ) -> None:
        comm = self.communicators.get(thread.context) if thread.context else None
        if comm is None or event.nvls_channels <= 0:
            return
        ranks = [r for r, p in comm.rank_process.items() if p is process]
        rank = ranks[-1] if ranks else -1 - len(comm.nvls_channels)
        if rank in comm.nvls_channels or len(comm.nvls_channels) < self.limits.max_ranks:
            comm.nvls_channels[rank] = event.nvls_channels

    def _on_connection(self, process: Process, thread: Thread, event: g.ConnectionEvent, record: g.Record) -> None:
        key = self._connection_key(process, thread, record.message)
        context = key[1] if isinstance(key[1], str) else None
        if key in self.connections:
            return
        if len(self.connections) >= self.limits.max_connections:
            self._count("connections")
            return
        self.connections[key] = Connection(event, process, context, record, self.limits.max_cited_chars)
        name = event.network
        if event.gdr and name and network_class(name) is None and len(self.rdma_by_gdr) < _MAX_RDMA_BY_GDR:
            self.rdma_by_gdr.add(name)
        if context is not None:
            self.communicators[context].connections.add(key)
        elif len(thread.pending) < self.limits.max_connections:
            thread.pending.append(key)

    # -- memory -----------------------------------------------------------------------------

    def approx_bytes(self) -> int:
        """What this analyzer holds, estimated from the counts of what it remembers (see _BYTES_*)."""
        rank_facts = sum(
            len(c.rank_process) + len(c.rank_gpu) + len(c.rank_bus) + len(c.nvls_channels) + len(c.pointer_refs)
            for c in self.communicators.values()
        )
        rank_facts += len(self.loose_ranks) + len(self.test_ranks) + len(self.test_gpus)
        entries = sum(len(p.pointers) + len(p.threads) + len(p.env) for p in self.processes.values())
        return (
            _BYTES_BASE
            + _BYTES_PER_RANK_FACT * rank_facts
            + _BYTES_PER_CONNECTION * len(self.connections)
            + _BYTES_PER_PROCESS * len(self.processes)
            + _BYTES_PER_PROCESS_ENTRY * entries
            + _BYTES_PER_MEMO_ENTRY * len(self._events)
            + self._memo_chars
            + _BYTES_PER_PREFIX_ENTRY * len(self._prefixes)
        )

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


def _without_colours(text: str) -> str:
    """``text`` without terminal colour codes, whole or with their ESC byte lost."""
    if "\x1b" in text:
        text = g.strip_ansi(text)
    return launcher.ANSI_REMNANT_RE.sub("", text) if "m" in text else text


def _of_family(plugin: str | None, family: str) -> bool:
    """Whether a loaded plugin's net name belongs to a family of plugin lines: its prefix
    (``GPUDirectTCPX_v7`` of ``NET/GPUDirectTCPX``), or any aws-ofi-nccl name for ``NET/OFI``."""
    if not plugin:
        return False
    return plugin.lower().startswith(family.lower()) or (family == g.OFI_FAMILY and is_libfabric(plugin))

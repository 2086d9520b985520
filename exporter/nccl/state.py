"""The state of one log stream: what it remembers (processes, communicators, connections, ranks),
each structure capped by :class:`Limits`, and the bookkeeping that keeps it consistent when a cap
evicts something (an evicted communicator's conclusions are kept in ``retired``).

:class:`reader.StreamReader` fills it from log lines; :mod:`placement`, :mod:`summaries` and
:mod:`decision` only read it. Nothing here reads files, looks at a clock or keeps module-level state.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from exporter.nccl.facts import (
    Communicator,
    Connection,
    ConnectionKey,
    NodeKey,
    Process,
    Retired,
    Thread,
    cite,
    connection_class,
    node_keys,
)
from exporter.nccl.networks import RDMA
from exporter.nccl.records import Prefix, Record
from exporter.nccl.verdict import CommunicatorSummary, NcclWarning


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


# What a communicator about to be evicted showed: its summary and the reasons for it.
SummarizeEvicted = Callable[["StreamState", str], tuple[CommunicatorSummary, list[str]]]


class StreamState:
    """What one log stream has shown so far, within ``limits``; what a cap drops is counted in
    ``overflow``. ``summarize_evicted`` concludes on a communicator before a cap evicts it."""

    def __init__(self, limits: Limits, summarize_evicted: SummarizeEvicted) -> None:
        self.limits = limits
        self.warnings_by_category: dict[str, int] = {}
        self.overflow: dict[str, int] = {}
        self.processes: dict[tuple[str, int] | None, Process] = {}
        self.communicators: dict[str, Communicator] = {}
        self.connections: dict[ConnectionKey, Connection] = {}
        # Network names the table does not know that a connection line showed with /GDRDMA: RDMA-class
        # for every process of the stream (see facts.connection_class). Shared with each Process.
        self.rdma_by_gdr: set[str] = set()
        self.versions: Counter[str] = Counter()
        self.test_ranks: dict[int, tuple[str, int]] = {}  # nccl-tests device table: rank -> (host, pid)
        self.test_gpus: dict[int, str] = {}  # and rank -> the GPU's PCI bus id the table prints
        self.test_runs_mixed = False
        # Ranks logged outside any known communicator (Trees, ring listings, 2.3 rank lines,
        # ncclCommInitAll), and the communicator size such lines gave: placed when the log names at
        # most one communicator.
        self.loose_ranks: dict[int, Process] = {}
        self.loose_nranks: int | None = None
        self.loose_mixed = False
        # NCCL_SHM_DISABLE=1 shown anywhere (an ENV line or a command line): NET may then join two
        # ranks of one node in any version.
        self.shm_disabled = False
        # What launchers show (:mod:`launcher`): whether their ``host: `` words name hosts, the hosts
        # that run a rank by a launcher's rank line (host -> the line), the launches (Open MPI job ids).
        self.launcher_names_hosts = False
        self.rank_hosts: dict[str, str] = {}
        self.launcher_jobs: set[str] = set()
        self.warnings: list[NcclWarning] = []
        self.retired = Retired()
        self.lines = 0
        self._comm_order = 0
        self._nodes: tuple[list[Process], dict[int, NodeKey]] | None = None  # see process_nodes()
        self._summarize_evicted = summarize_evicted

    def _count(self, kind: str, n: int = 1) -> None:
        """Count what a cap dropped (or a parser error), by kind."""
        self.overflow[kind] = self.overflow.get(kind, 0) + n

    def _cite(self, record: Record) -> str:
        """The record as a reason or warning quotes it."""
        return cite(record, self.limits.max_cited_chars)

    def _process(self, prefix: Prefix | None, glued: bool = False) -> Process:
        """The process a record's prefix names (the oldest one evicted at the cap); ``glued``: the
        record followed another on its line (an interleaved writer), so its hostname may carry the
        other record's tail."""
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
            process = self.processes[key] = Process(key, self.rdma_by_gdr)
            self._nodes = None
        if not glued and not process.at_line_start:
            process.at_line_start = True
            self._nodes = None
        return process

    def _thread(self, process: Process, tid: int) -> Thread:
        """The logging thread ``tid`` of ``process`` (the oldest one evicted at the cap)."""
        thread = process.threads.get(tid)
        if thread is None:
            if len(process.threads) >= self.limits.max_threads:
                del process.threads[next(iter(process.threads))]
                self._count("threads")
            thread = process.threads[tid] = Thread()
        return thread

    # -- communicators ----------------------------------------------------------------------

    def _communicator(self, key: str, comm_id: str | None) -> Communicator:
        """The communicator under ``key``, created when new (the oldest one evicted at the cap)."""
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
        if decisive:
            summary, reasons = self._summarize_evicted(self, oldest_key)
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

    def process_nodes(self) -> tuple[list[Process], dict[int, NodeKey]]:
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
        """``rank`` of ``comm`` is logged by ``process``."""
        known = comm.rank_process.get(rank)
        if known is not None and known.key != process.key:
            comm.mixed = True  # one rank, two processes: several communicators share this key
        if known is not None or len(comm.rank_process) < self.limits.max_ranks:
            comm.rank_process[rank] = process
        else:
            self._count("ranks")

    def _loose_rank(self, process: Process, rank: int, nranks: int | None) -> None:
        """``process`` logged ``rank`` outside any known communicator (of ``nranks`` ranks when known)."""
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
        for rank, bus in old.rank_bus.items():
            new.rank_bus.setdefault(rank, bus)
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
        """The connection lines ``thread`` logged before its communicator was known belong to ``key``."""
        if not thread.pending:
            return
        comm = self._communicator(key, None)
        for conn_key in thread.pending:
            connection = self.connections.get(conn_key)
            if connection is not None:
                connection.comm = key
                comm.connections.add(conn_key)
        thread.pending = []

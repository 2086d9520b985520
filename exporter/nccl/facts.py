"""The facts one log stream shows: its processes, their logging threads, its communicators and
connection lines, what evicted communicators showed, and which node each process runs on.

Plain records: :mod:`reader` fills them in (within :class:`state.Limits`), :mod:`placement` and
:mod:`summaries` read them. Nothing here reads files, looks at a clock or keeps module-level state.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from exporter.nccl.events import ConnectionEvent, IbDevice
from exporter.nccl.networks import NO_SELECTION, RDMA, Selection, is_libfabric, network_class
from exporter.nccl.records import Record

# The communicator key of connection lines whose communicator the log never names.
UNATTRIBUTED = "unattributed"
# A node as the log shows it: (hostname, the address that identifies the node, "" when none shows);
# a process that shows NCCL_HOSTID is on the node ("NCCL_HOSTID=<value>", the same).
NodeKey = tuple[str, str]
HOST_ID = "NCCL_HOSTID="
# What makes connection lines one connection (see StreamReader._connection_key).
ConnectionKey = tuple[object, ...]


def is_loopback(interface: str, address: str) -> bool:
    """An interface or address that reaches no other node."""
    return interface == "lo" or interface.startswith("lo:") or address.startswith("127.") or address in ("::1", "[::1]")


class Process:
    """One NCCL process, identified by ``(hostname, pid)`` from the line prefix."""

    __slots__ = (
        "key",
        "host",
        "address",
        "address_from_socket",
        "oob_address",
        "network",
        "network_line",
        "ib_devices",
        "ib_line",
        "ib_failed",
        "socket_seen",
        "threads",
        "saw_start",
        "pointers",
        "env",
        "version",
        "gdr_hca",
        "ib_datapath_line",
        "socket_datapath_line",
        "named_comm",
        "plugin_loaded",
        "plugin_loaded_line",
        "plugin_in_use",
        "plugin_in_use_line",
        "ofi_in_use",
        "plugins_failed",
        "ofi_provider",
        "loopback",
        "loose_ranks",
        "at_line_start",
        "init_devices",
        "rdma_by_gdr",
    )

    def __init__(self, key: tuple[str, int] | None, rdma_by_gdr: set[str] | None = None) -> None:
        self.key = key
        # The stream's network names shown RDMA-class by a /GDRDMA connection line (shared, see class_of).
        self.rdma_by_gdr: set[str] = rdma_by_gdr if rdma_by_gdr is not None else set()
        self.host = key[0] if key else None
        # Bootstrap address (else the first NET/Socket interface's): tells apart nodes sharing a hostname.
        self.address: str | None = None
        self.address_from_socket = False  # taken from a NET/Socket line; a bootstrap line replaces it
        self.oob_address: str | None = None  # NET/IB's OOB address, used where no bootstrap line shows
        self.network: str | None = None  # last "Using network"
        self.network_line: str | None = None
        self.ib_devices: tuple[IbDevice, ...] | None = None
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
        self.socket_datapath_line: str | None = None  # net_socket.cc moving or connecting data: Socket carries it
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
        # Logged a record at the start of a line: its hostname is whole. A process known only from
        # records glued behind another writer's ("...rank 1 nrc0b5:324666:...") may carry that
        # record's tail in front of its hostname.
        self.at_line_start = False
        # The devices ([cudaDev]) its "Using network" lines come from: NCCL prints that line once per
        # rank it initialises (2.6+), so a process driving several GPUs shows one per GPU.
        self.init_devices: set[int] = set()

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
        Socket); then a loaded plugin that no line shows failing; then the network whose own
        connection code the log shows running (IB queue pairs and completions, Socket's data path).
        """
        provider = self.ofi_provider
        if self.network:
            return Selection(self.network, self.network_line, class_of(self.network, provider, self.rdma_by_gdr))
        if self.plugin_in_use is not None or self.ofi_in_use:
            name = self.plugin_in_use
            line = self.plugin_in_use_line
            return Selection(name, line, class_of(name, provider, self.rdma_by_gdr))
        if self._ib_unusable() and self.socket_seen:
            return Selection("Socket", self.socket_seen, network_class("Socket"))
        if self.ib_devices:
            loaded = self.plugin_loaded
            if (
                loaded
                and loaded not in self.plugins_failed
                and network_class(loaded) == RDMA
                and not is_libfabric(loaded)
            ):
                return Selection(loaded, self.plugin_loaded_line, RDMA)  # an IBext plugin prints NET/IB lines too
            return Selection("IB", self.ib_line, RDMA)
        loaded = self.plugin_loaded
        if loaded and loaded not in self.plugins_failed and not self.socket_seen and not self._ib_unusable():
            return Selection(loaded, self.plugin_loaded_line, class_of(loaded, provider, self.rdma_by_gdr))
        if self.ib_datapath_line:
            return Selection("IB", self.ib_datapath_line, RDMA)
        if self.socket_datapath_line:
            return Selection("Socket", self.socket_datapath_line, network_class("Socket"))
        return NO_SELECTION


class Thread:
    """What one logging thread is initialising: connection lines carry no communicator."""

    __slots__ = ("context", "pending", "pending_network", "pending_ranks", "inits")

    def __init__(self) -> None:
        self.context: str | None = None  # communicator whose init (or runtime connect) this thread logs
        self.pending: list[ConnectionKey] = []  # connection keys logged before their communicator is known
        self.pending_network: str | None = None  # "Using network" not yet tied to a communicator
        self.pending_ranks: list[tuple[int, int | None]] = []  # (rank, nranks) lines before their init line
        self.inits = 0  # init lines seen: tells apart identical lines of successive inits
        # (2.19+ prints it just before Init START; 2.13–2.18.1 before Init COMPLETE)


class Communicator:
    """One communicator, by its key: NCCL's commId, or ``nranks:<N>`` before commIds (2.16.2)."""

    __slots__ = (
        "key",
        "comm_id",
        "nranks",
        "nnodes",
        "nnodes_line",
        "mnnvl",
        "network",
        "network_line",
        "rank_process",
        "rank_gpu",
        "rank_bus",
        "nvls_channels",
        "connections",
        "order",
        "mixed",
        "pointer_refs",
    )

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
        self.rank_bus: dict[int, str] = {}  # from init lines: the rank's GPU as NCCL's busId (2.5+)
        self.nvls_channels: dict[int, int] = {}  # rank -> NVLS channels
        self.connections: set[ConnectionKey] = set()
        self.order = order
        self.pointer_refs: set[tuple[Process, str]] = set()  # process.pointers entries naming this key
        # Several communicators under one key (before commIds, same-size communicators share
        # "nranks:N"): rank numbers then name different GPUs, so ranks are not placed on nodes.
        self.mixed = False


def cite(record: Record, cap: int) -> str:
    """The record as one log line (wrappers dropped), cut to ``cap`` characters."""
    text = record.message
    if record.prefix is not None:
        p = record.prefix
        location = f"{p.location} " if p.location else ""
        text = f"{p.host}:{p.pid}:{p.tid} [{p.cuda_dev}] {location}NCCL {record.level} {text}"
    return text if len(text) <= cap else text[: cap - 3] + "..."


class Connection:
    """One distinct connection line, the process that logged it and the communicator it belongs to."""

    __slots__ = ("event", "process", "comm", "record", "cap")

    def __init__(self, event: ConnectionEvent, process: Process, comm: str | None, record: Record, cap: int) -> None:
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


def class_of(name: str | None, provider: str | None, rdma_by_gdr: AbstractSet[str]) -> str | None:
    """``network_class``, and RDMA for a name the table does not know that the stream's connection
    lines showed with ``/GDRDMA``. NCCL's net transport prints ``/GDRDMA`` only for a connection that
    uses GPUDirect RDMA, which needs the network to register CUDA memory (``NCCL_PTR_CUDA`` in its
    properties); NCCL's Socket transport and TCP plugins never offer that. HPC-X's IB plugin, for
    one, may register as ``NCCL RDMA Plugin v8``."""
    known = network_class(name, provider)
    if known is None and name and name in rdma_by_gdr:
        return RDMA
    return known


def connection_class(connection: Connection) -> str | None:
    """The class of the network a connection line names (aws-ofi-nccl's by its process's provider;
    an unknown name by its ``/GDRDMA``, see ``class_of``)."""
    event = connection.event
    known = class_of(event.network, connection.process.ofi_provider, connection.process.rdma_by_gdr)
    if known is None and event.gdr and event.network:
        return RDMA
    return known


# ---------------------------------------------------------------------------------------------
# Which node a process runs on


def _addresses(processes: list[Process]) -> dict[int, str | None]:
    """id(process) -> the address that identifies its node: the bootstrap address, or NET/IB's OOB
    address on hosts where no process printed a bootstrap line (never a mix of both)."""
    with_bootstrap = {p.host for p in processes if p.address}
    return {id(p): (p.address if p.host in with_bootstrap else p.oob_address) for p in processes}


def node_keys(processes: Iterable[Process]) -> dict[int, NodeKey]:
    """id(process) -> node key. A hostname seen with several addresses is several nodes; a process that
    shows ``NCCL_HOSTID`` is on the node of that id, whatever its hostname (``getHostHash``)."""
    processes = list(processes)
    # Interleaved writers glue the tail of one record to the next one's hostname
    # ("[1] NCCg183:161260:..."): a host that ends with the host of another process with the
    # same pid is that process's host.
    by_pid: dict[int, set[str]] = {}
    for p in processes:
        if p.key is not None:
            by_pid.setdefault(p.key[1], set()).add(p.key[0])
    canonical: dict[int, str] = {}
    whole = {p.key[0] for p in processes if p.key is not None and p.at_line_start}
    for p in processes:
        if p.key is not None and len(by_pid[p.key[1]]) > 1:
            shorter = [h for h in by_pid[p.key[1]] if h != p.key[0] and p.key[0].endswith(h)]
            if shorter:
                canonical[id(p)] = min(shorter, key=len)
        if p.key is not None and id(p) not in canonical and not p.at_line_start:
            # Seen only glued behind another record: a whole hostname of the log it ends with is its own.
            suffixes = [h for h in whole if h != p.key[0] and p.key[0].endswith(h)]
            if suffixes:
                canonical[id(p)] = max(suffixes, key=len)
    address = _addresses(processes)
    addresses: dict[str, set[str]] = {}
    for p in processes:
        node_address = address[id(p)]
        if p.host is not None and node_address:
            addresses.setdefault(canonical.get(id(p), p.host), set()).add(node_address)
    keys: dict[int, NodeKey] = {}
    for p in processes:
        if p.host is None:
            continue
        host_id = p.env.get("NCCL_HOSTID")
        if host_id:  # NCCL hashes this string instead of the hostname and boot id
            keys[id(p)] = (f"{HOST_ID}{host_id}", f"{HOST_ID}{host_id}")
            continue
        host = canonical.get(id(p), p.host)
        node_address = address[id(p)]
        if node_address:
            keys[id(p)] = (host, node_address)
            continue
        known = addresses.get(host, set())
        if len(known) == 1:
            keys[id(p)] = (host, next(iter(known)))
        elif not known:
            keys[id(p)] = (host, "")
    return keys


def host_node_key(host: str, processes: Iterable[Process]) -> NodeKey | None:
    """The node key ``node_keys`` gives processes of ``host``; None when that host name is ambiguous."""
    processes = list(processes)
    address = _addresses(processes)
    addresses = {a for a in (address[id(p)] for p in processes if p.host == host) if a}
    if len(addresses) > 1:
        return None
    return (host, next(iter(addresses))) if addresses else (host, "")


def only_loopback(processes: Iterable[Process]) -> bool:
    """Every process that shows its interfaces uses loopback ones only (and at least one shows them)."""
    shown = [p.loopback for p in processes if p.loopback is not None]
    return bool(shown) and all(shown)


def loopback_hosts(processes: Iterable[Process]) -> str:
    """The loopback-only processes, as a reason lists them (four at most)."""
    hosts = sorted({p.label() for p in processes if p.loopback})
    return ", ".join(hosts[:4]) + (" ..." if len(hosts) > 4 else "")

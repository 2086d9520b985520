"""NCCL collector: ``ccl_nccl_*`` — which network and transport each pod's NCCL really uses.

A background coroutine (``run``) polls the pod-log tailer every ``tick_seconds`` in a worker
thread, feeds each stream's NCCL lines to its own ``LogAnalyzer`` and publishes an
immutable snapshot of per-pod facts; ``collect`` only turns the latest snapshot into
metric families. Verdicts are judged against this node: an inter-node TCP-class network is
a *fallback* (``ccl_nccl_tcp_fallback`` 1) only when the node has an ACTIVE RDMA port.

Counters survive restarts of the exporter: each stream's warning counts are saved with the
tail offsets, and the head of a resumed stream is replayed only to rebuild the gauges.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.metrics_core import Metric

from exporter.collectors.base import CollectorSpec, CollectorUnavailable, run_every
from exporter.collectors.nccl.families import (
    CommunicatorRow,
    ConnectionRow,
    ExpectedNetwork,
    NcclLimits,
    PodReport,
    Snapshot,
    nccl_families,
)
from exporter.collectors.nccl.nic_affinity import pod_nic_affinity
from exporter.fabric_verdicts import PodFabric, VerdictFeed
from exporter.flags import Flag
from exporter.nccl import Limits, LogAnalyzer, Verdict
from exporter.nccl.decision import with_node_context
from exporter.nccl.networks import expected_network_class
from exporter.nccl.nics import NicUse, nic_uses
from exporter.resources import NodeResources
from exporter.sources.gpu_inventory import GpuInventory, GpuInventorySource
from exporter.sources.kube import NoPodMetadata, PodMetadata, PodMetadataSource
from exporter.sources.podlogs import SOURCE_POD_LOG, PodLogTailer, StreamKey, TailLimits, pod_known_on_node
from exporter.sources.podlogs.limits import StreamNote
from exporter.sources.rdma import ACTIVE_PORT_STATES, RdmaReading, read_rdma
from exporter.sources.topology import Topology, TopologySource

log = logging.getLogger(__name__)

DEFAULT_GRACE_SECONDS = 300.0
GDR_LABELS = {"1": "true", "0": "false"}  # the parser's transport-key gdr field → label
NOTE_WARNINGS = "warnings"
NOTE_DROPPED = "dropped"
# How a pod's streams combine into one ccl_nccl_verdict state: any fallback decides; then RDMA
# (a process uses one network for all its communicators); "cannot tell" outranks "one node",
# which a later communicator may contradict.
_VERDICT_PRIORITY = ("tcp_fallback", "rdma", "unknown", "single_node")


# The parser's caps as the exporter runs it: tighter than the offline defaults, since one node
# holds an analyzer per stream (a pod's log shows its own ranks, rarely more than 8 processes and
# a few dozen communicators). At these caps one analyzer holds about 10 MB; the node-wide budget
# (NcclLimits.parser_memory_budget_bytes) bounds them all together.
EXPORTER_PARSER_LIMITS = Limits(
    max_processes=64, max_pointers=64, max_communicators=32, max_connections=2048, max_ranks=1024
)


@dataclass
class _Stream:
    key: StreamKey
    analyzer: LogAnalyzer
    # Counts carried over from before this analyzer (saved state, replay, a restarted file).
    warnings_base: dict[str, int] = field(default_factory=dict)
    dropped_base: dict[str, int] = field(default_factory=dict)
    verdict: Verdict | None = None
    nics: tuple[NicUse, ...] = ()  # which NIC each GPU's NET channels use, with the verdict
    dirty: bool = False
    removed_at: float | None = None  # files gone; kept for the grace period
    size: int = 0  # the analyzer's approx_bytes after its last lines

    def warnings(self) -> dict[str, int]:
        return _add_counts(self.warnings_base, self.analyzer.warnings_by_category)

    def dropped(self) -> dict[str, int]:
        return _add_counts(self.dropped_base, self.analyzer.overflow)


@dataclass
class _Pod:
    namespace: str
    pod: str
    streams: dict[StreamKey, _Stream] = field(default_factory=dict)
    retired_warnings: dict[str, int] = field(default_factory=dict)  # of streams no longer held
    gone_since: float | None = None


def _add_counts(base: Mapping[str, int], extra: Mapping[str, int]) -> dict[str, int]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = out.get(key, 0) + int(value)
    return out


def _label(value: object) -> str:
    if value is None:
        return ""
    if value is True:
        return "true"
    if value is False:
        return "false"
    return str(value)


def _int_counts(raw: object) -> dict[str, int]:
    if not isinstance(raw, dict):
        return {}
    return {str(k): int(v) for k, v in raw.items() if isinstance(v, int) and v >= 0}


class NcclCollector:
    """See the module docstring."""

    name = "nccl"

    def __init__(
        self,
        tailer: PodLogTailer,
        sysfs: Path,
        metadata: PodMetadataSource | None = None,
        *,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        tick_seconds: float = 0.5,
        save_every_seconds: float = 5.0,
        rdma_cache_seconds: float = 5.0,
        parser_limits: Limits | None = None,
        limits: NcclLimits | None = None,
        clock: Callable[[], float] = time.monotonic,
        rdma_reader: Callable[[Path], RdmaReading] = read_rdma,
        gpu_inventory: GpuInventorySource | None = None,
        topology: TopologySource | None = None,
        verdict_feed: VerdictFeed | None = None,
    ) -> None:
        self.tailer = tailer
        self._topology = topology
        self.metadata: PodMetadataSource = metadata or NoPodMetadata()
        self._sysfs = sysfs
        self.grace_seconds = grace_seconds
        self.tick_seconds = tick_seconds
        self._save_every = save_every_seconds
        self._rdma_cache_seconds = rdma_cache_seconds
        self._parser_limits = parser_limits or EXPORTER_PARSER_LIMITS
        self.limits = limits or NcclLimits()
        self._clock = clock
        self._read_rdma = rdma_reader
        self._pods: dict[tuple[str, str], _Pod] = {}
        self._dropped_retired: dict[str, int] = {}  # parser overflow of analyzers no longer held
        self._rdma: tuple[float, bool | None] | None = None
        self._gpu_inventory = gpu_inventory
        self._verdict_feed = verdict_feed  # verdicts as they change, for the lifecycle hooks
        self._parser_bytes = 0
        self._last_save = clock()
        self._step_lock = threading.Lock()
        self._snapshot = Snapshot()

    # -- background ------------------------------------------------------------------

    async def run(self) -> None:
        await run_every(self.tick_seconds, self.step)

    def close(self) -> None:
        self.save_state()

    def save_state(self) -> bool:
        with self._step_lock:
            return self.tailer.save_state(self._notes())

    def step(self) -> Snapshot:
        """One tick: read new lines, update analyzers, retire gone pods, publish a snapshot."""
        with self._step_lock:
            now = self._clock()
            batch = self.tailer.poll()
            for key, note in batch.opened.items():
                self._open(key, note)
            for key in batch.restarted:
                self._restart(key)
            for key, lines in batch.replayed.items():
                stream = self._stream(key)
                before = dict(stream.analyzer.warnings_by_category)
                before_dropped = dict(stream.analyzer.overflow)
                self._feed(stream, lines)
                # Already counted by the run that saved the state: take them back out.
                for category, count in stream.analyzer.warnings_by_category.items():
                    replayed = count - before.get(category, 0)
                    stream.warnings_base[category] = stream.warnings_base.get(category, 0) - replayed
                for reason, count in stream.analyzer.overflow.items():
                    replayed = count - before_dropped.get(reason, 0)
                    stream.dropped_base[reason] = stream.dropped_base.get(reason, 0) - replayed
            for key, lines in batch.lines.items():
                self._feed(self._stream(key), lines)
            for key in batch.removed:
                pod = self._pods.get((key.namespace, key.pod))
                if pod is not None and key in pod.streams:
                    pod.streams[key].removed_at = now
            self._expire(now)
            self._enforce_parser_budget()
            if now - self._last_save >= self._save_every:
                self._last_save = now
                self.tailer.save_state(self._notes())
            self._snapshot = self._build_snapshot()
            if self._verdict_feed is not None and self._verdict_feed.subscribed:
                self._verdict_feed.publish(pod_fabrics(self._snapshot))
            return self._snapshot

    def _new_stream(self, key: StreamKey) -> _Stream:
        return _Stream(key=key, analyzer=LogAnalyzer(limits=self._parser_limits))

    def _open(self, key: StreamKey, note: StreamNote | None) -> None:
        pod = self._pods.setdefault((key.namespace, key.pod), _Pod(key.namespace, key.pod))
        stream = self._new_stream(key)
        if note:
            stream.warnings_base = _int_counts(note.get(NOTE_WARNINGS))
            stream.dropped_base = _int_counts(note.get(NOTE_DROPPED))
        old = pod.streams.pop(key, None)
        if old is not None:
            self._retire(pod, old)
        pod.streams[key] = stream
        pod.gone_since = None

    def _stream(self, key: StreamKey) -> _Stream:
        pod = self._pods.get((key.namespace, key.pod))
        if pod is None or key not in pod.streams:
            self._open(key, None)
            pod = self._pods[(key.namespace, key.pod)]
        stream = pod.streams[key]
        stream.removed_at = None
        return stream

    def _restart(self, key: StreamKey) -> None:
        """A debug file rewritten by a new process: new analyzer, counters carried on."""
        pod = self._pods.get((key.namespace, key.pod))
        if pod is None or key not in pod.streams:
            return
        old = pod.streams[key]
        fresh = self._new_stream(key)
        fresh.warnings_base = old.warnings()
        fresh.dropped_base = old.dropped()
        pod.streams[key] = fresh

    def _retire(self, pod: _Pod, stream: _Stream) -> None:
        pod.retired_warnings = _add_counts(pod.retired_warnings, stream.warnings())
        self._dropped_retired = _add_counts(self._dropped_retired, stream.dropped())

    def _feed(self, stream: _Stream, lines: Iterable[str]) -> None:
        feed = stream.analyzer.feed
        for line in lines:
            feed(line)
        stream.dirty = True
        stream.size = stream.analyzer.approx_bytes()

    def _enforce_parser_budget(self) -> None:
        """Keep every analyzer of the node together within the budget: the largest shrink first."""
        streams = [stream for pod in self._pods.values() for stream in pod.streams.values()]
        total = sum(stream.size for stream in streams)
        budget = self.limits.parser_memory_budget_bytes
        if total > budget:
            target = int(budget * 0.8)
            for stream in sorted(streams, key=lambda st: st.size, reverse=True):
                if total <= target:
                    break
                before = stream.size
                stream.size = stream.analyzer.shrink(max(0, before - (total - target)))
                stream.dirty = True
                total -= before - stream.size
        self._parser_bytes = total

    def _notes(self) -> dict[StreamKey, StreamNote]:
        notes: dict[StreamKey, StreamNote] = {}
        for pod in self._pods.values():
            for key, stream in pod.streams.items():
                notes[key] = {NOTE_WARNINGS: stream.warnings(), NOTE_DROPPED: stream.dropped()}
        return notes

    def _expire(self, now: float) -> None:
        """Drop superseded container runs, and pods gone for longer than the grace period."""
        authoritative = self.metadata.is_authoritative()
        for pod_key in list(self._pods):
            pod = self._pods[pod_key]
            newest: dict[tuple[str, str], int] = {}
            for key in pod.streams:
                if key.source == SOURCE_POD_LOG:
                    slot = (key.pod_uid, key.container)
                    newest[slot] = max(newest.get(slot, -1), key.generation)
            for key in list(pod.streams):
                stream = pod.streams[key]
                superseded = key.source == SOURCE_POD_LOG and key.generation < newest[(key.pod_uid, key.container)]
                expired = stream.removed_at is not None and now - stream.removed_at >= self.grace_seconds
                if superseded and not expired:
                    newer = pod.streams.get(
                        StreamKey(
                            key.source,
                            key.namespace,
                            key.pod,
                            key.pod_uid,
                            key.container,
                            str(newest[(key.pod_uid, key.container)]),
                        )
                    )
                    expired = newer is not None and self._supersedes(self._verdict(newer))
                if expired:
                    self._retire(pod, pod.streams.pop(key))
            listed = self.metadata.lookup(pod.namespace, pod.pod)
            gone = not pod.streams or (authoritative and listed is None)
            if gone:
                if pod.gone_since is None:
                    pod.gone_since = now
                elif now - pod.gone_since >= self.grace_seconds:
                    for stream in pod.streams.values():
                        self._retire(pod, stream)
                    del self._pods[pod_key]
            else:
                pod.gone_since = None

    # -- judging ---------------------------------------------------------------------

    def _node_has_active_rdma(self) -> bool | None:
        now = self._clock()
        if self._rdma is not None and now - self._rdma[0] < self._rdma_cache_seconds:
            return self._rdma[1]
        try:
            reading = self._read_rdma(self._sysfs)
            active: bool | None = any(p.state_id in ACTIVE_PORT_STATES for p in reading.ports())
        except Exception as exc:  # noqa: BLE001 - unknown is not "no RDMA": never flag on a guess
            log.warning("could not read RDMA ports under %s: %s", self._sysfs, exc)
            active = None
        self._rdma = (now, active)
        return active

    @staticmethod
    def _verdict(stream: _Stream) -> Verdict:
        if stream.dirty or stream.verdict is None:
            stream.verdict = stream.analyzer.result()
            stream.nics = nic_uses(stream.analyzer)
            stream.dirty = False
        return stream.verdict

    @staticmethod
    def _supersedes(verdict: Verdict) -> bool:
        """A restarted container's log replaces the previous run's once it says something: a verdict,
        or a communicator whose network is known (its placement may stay open)."""
        return verdict.verdict != "unknown" or any(c.network_class for c in verdict.communicators)

    def _job_gpus_here(self, pod: _Pod, meta: PodMetadata | None, gpus: GpuInventory) -> int | None:
        """GPUs the pod's training job holds on this node (its pods' pod-resources GPUs). None when
        that cannot be counted for sure: the pod holds no GPU the kubelet knows of, or its job or the
        node's complete pod list is unknown (another pod of the same job here would be missed, and a
        communicator shared with it taken for one that spans nodes)."""
        if gpus.by_pod.get((pod.namespace, pod.pod), 0) == 0:
            return None
        if meta is None or not meta.job_name or not self.metadata.is_authoritative():
            return None
        job_pods = [(pod.namespace, pod.pod)]
        for namespace, name in gpus.by_pod:
            if namespace != pod.namespace or name == pod.pod:
                continue
            other = self.metadata.lookup(namespace, name)
            if other is not None and other.job_name == meta.job_name:
                job_pods.append((namespace, name))
        return gpus.held(job_pods)

    def _pod_report(
        self, pod: _Pod, meta: PodMetadata | None, gpus: GpuInventory, topology: Topology | None = None
    ) -> PodReport:
        communicators: set[CommunicatorRow] = set()
        connections: dict[tuple[str, str, str, str], int] = {}
        has_nccl = inter_node_tcp = gdr_disabled = False
        warnings = dict(pod.retired_warnings)
        job_gpus = self._job_gpus_here(pod, meta, gpus)
        verdicts: set[str] = set()
        reasons: dict[str, str] = {}  # verdict -> the first reason of a stream that reached it
        gdr_reason = ""
        for stream in pod.streams.values():
            verdict = with_node_context(self._verdict(stream), gpus.total, job_gpus)
            warnings = _add_counts(warnings, stream.warnings())
            if verdict.verdict != "unknown" or verdict.communicators or verdict.network:
                has_nccl = True
                verdicts.add(verdict.verdict)
                if verdict.reasons:
                    reasons.setdefault(verdict.verdict, verdict.reasons[0])
            inter_node_tcp = inter_node_tcp or verdict.inter_node_tcp is True
            for comm in verdict.communicators:
                comm_id = _label(comm.comm_id)
                communicators.add(
                    CommunicatorRow(
                        comm_id,
                        _label(comm.nranks),
                        _label(comm.nnodes),
                        _label(comm.network),
                        _label(comm.network_class),
                        _label(comm.nccl_version),
                    )
                )
                for (transport, scope, gdr), count in comm.transports.items():
                    slot = (comm_id, _label(transport), _label(scope) or "unknown", GDR_LABELS.get(gdr, "unknown"))
                    connections[slot] = connections.get(slot, 0) + int(count)
                gdr_disabled = gdr_disabled or comm.gdr_disabled
                if comm.gdr_disabled and not gdr_reason:
                    gdr_reason = (
                        f"communicator {comm.comm_id} connects nodes over {comm.network or 'RDMA'} without "
                        f'GPUDirect RDMA: "{comm.gdr_disabled_line or ""}"'
                    )
        pod_verdict = next((v for v in _VERDICT_PRIORITY if v in verdicts), "unknown")
        return PodReport(
            namespace=pod.namespace,
            pod=pod.pod,
            job_name=meta.job_name if meta else "",
            job_kind=meta.job_kind if meta else "",
            communicators=tuple(sorted(communicators)),
            connections=tuple(sorted(ConnectionRow(*k, v) for k, v in connections.items())),
            has_nccl=has_nccl,
            inter_node_tcp=inter_node_tcp,
            gdr_disabled=gdr_disabled,
            warnings=tuple(sorted(warnings.items())),
            verdict=pod_verdict,
            reason=reasons.get(pod_verdict, ""),
            gdr_reason=gdr_reason,
            nic_affinity=pod_nic_affinity(
                pod.pod,
                (use for stream in pod.streams.values() for use in stream.nics),
                meta is not None and meta.host_network is True,
                topology,
            ),
        )

    def _silent_gpu_pods(self, gpus: GpuInventory) -> list[PodReport]:
        """GPU pods of this node whose logs show no NCCL output at all: "cannot tell", said out loud."""
        reports = []
        for namespace, name in sorted(gpus.by_pod):
            if (namespace, name) in self._pods:
                continue
            meta = self.metadata.lookup(namespace, name)
            reports.append(PodReport(namespace, name, meta.job_name if meta else "", meta.job_kind if meta else ""))
        return reports

    def _expectations(self) -> tuple[ExpectedNetwork, ...]:
        """Pods of the node that declare the network they run on (its class for the rules)."""
        return tuple(
            ExpectedNetwork(
                p.namespace,
                p.name,
                p.job_name,
                p.job_kind,
                p.expected_network,
                _label(expected_network_class(p.expected_network)),
            )
            for p in self.metadata.pods()
            if p.expected_network
        )

    def _build_snapshot(self) -> Snapshot:
        reports = []
        analyzers = 0
        dropped = dict(self._dropped_retired)
        gpus = self._gpu_inventory.read() if self._gpu_inventory is not None else GpuInventory()
        topology = self._topology.read() if self._topology is not None else None
        for pod in self._pods.values():
            analyzers += len(pod.streams)
            for stream in pod.streams.values():
                dropped = _add_counts(dropped, {f"parser_{k}": v for k, v in stream.dropped().items()})
            reports.append(self._pod_report(pod, self.metadata.lookup(pod.namespace, pod.pod), gpus, topology))
        reports += self._silent_gpu_pods(gpus)
        stats = self.tailer.stats
        dropped = _add_counts(dropped, {f"tail_{k}": v for k, v in stats.events.items()})
        return Snapshot(
            pods=tuple(sorted(reports, key=lambda r: (r.namespace, r.pod))),
            node_has_active_rdma=self._node_has_active_rdma(),
            dropped=tuple(sorted(dropped.items())),
            tail_bytes=tuple(sorted(stats.bytes_read.items())),
            tail_lines=tuple(sorted(stats.lines.items())),
            tail_files=tuple(sorted(stats.files.items())),
            tail_skipped=tuple(sorted(stats.skipped_bytes.items())),
            streams=stats.streams,
            analyzers=analyzers,
            backlog_bytes=stats.backlog_bytes,
            unattributed_files=stats.unattributed_files,
            metadata_available=self.metadata.is_authoritative(),
            state_save_errors=stats.state_errors,
            expectations=self._expectations(),
            parser_bytes=self._parser_bytes,
        )

    # -- scrape ----------------------------------------------------------------------

    def collect(self) -> Iterable[Metric]:
        yield from self.families(self._snapshot, self.limits)
        folders = [p for p in (self.tailer.pod_logs, self.tailer.debug_files) if p is not None]
        if not any(p.is_dir() for p in folders):
            raise CollectorUnavailable("no pod-log or NCCL debug-file folder: " + ", ".join(map(str, folders)))

    families = staticmethod(nccl_families)  # what collect() renders; also callable on any snapshot


def pod_fabrics(snapshot: Snapshot) -> tuple[PodFabric, ...]:
    """What the lifecycle hooks act on: each pod with NCCL output, its verdict and the line that decided it."""
    return tuple(
        PodFabric(
            report.namespace,
            report.pod,
            report.verdict,
            snapshot.node_has_active_rdma,
            report.gdr_disabled,
            report.reason,
            report.gdr_reason,
        )
        for report in snapshot.pods
        if report.has_nccl
    )


@dataclass(frozen=True)
class NcclSettings:
    grace_seconds: float
    limits: NcclLimits


NCCL_FLAGS = (
    Flag(
        "--collector.nccl.grace-period",
        DEFAULT_GRACE_SECONDS,
        "seconds the series of a pod whose logs are gone (or that left the node) stay exposed",
        dest="nccl_grace_period",
        type=float,
    ),
    Flag(
        "--collector.nccl.parser-memory-budget",
        NcclLimits.parser_memory_budget_bytes,
        "bytes all streams' NCCL log analyzers may hold together; over it the largest forget their "
        "oldest communicators (their conclusions are kept)",
        dest="nccl_parser_memory_budget",
        type=int,
    ),
)


def settings_from_args(args: argparse.Namespace) -> NcclSettings:
    return NcclSettings(
        float(args.nccl_grace_period), NcclLimits(parser_memory_budget_bytes=int(args.nccl_parser_memory_budget))
    )


def build_collector(settings: NcclSettings, resources: NodeResources) -> NcclCollector:
    """The collector ``serve`` runs: the tailer on the node's paths, reading only folders of pods
    on this node; the node's pod list for job attribution; GPU counts (NVML, pod-resources) for
    the placement a log leaves open (a communicator larger than this node spans nodes); the
    node's topology for the class of each NIC a GPU's NCCL traffic uses."""
    paths = resources.paths
    metadata = resources.pod_metadata
    # Without a node name there is no pod list to bind folders to: names are taken as they are.
    pod_known = pod_known_on_node(metadata) if resources.node_name else None
    tailer = PodLogTailer(paths.pod_logs, paths.nccl_debug_files, paths.state, TailLimits(), pod_known=pod_known)
    gpus = GpuInventorySource(resources.nvml_if_collected(), resources.pod_resources)
    return NcclCollector(
        tailer,
        paths.sysfs,
        metadata,
        grace_seconds=settings.grace_seconds,
        gpu_inventory=gpus,
        limits=settings.limits,
        topology=resources.topology,
        verdict_feed=resources.verdict_feed,
    )


SPEC = CollectorSpec(
    name="nccl",
    help="NCCL network/transport per pod from pod logs and NCCL debug files (TCP fallback, GDR)",
    default_enabled=True,
    factory=build_collector,
    flags=NCCL_FLAGS,
    flag_group="collector nccl",
    settings=settings_from_args,
)

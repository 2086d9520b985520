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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.metrics_core import Metric

from exporter.collectors.base import CollectorSpec, CollectorUnavailable, run_every
from exporter.collectors.nccl.attribution import PodAttributor
from exporter.collectors.nccl.families import NcclLimits, Snapshot, nccl_families
from exporter.collectors.nccl.pod_reports import pod_fabrics, pod_report
from exporter.collectors.nccl.streams import StreamTable, add_counts
from exporter.fabric_verdicts import VerdictFeed
from exporter.flags import Flag
from exporter.nccl import Limits
from exporter.resources import NodeResources
from exporter.sources.gpu_inventory import GpuInventorySource
from exporter.sources.kube import NoPodMetadata, PodMetadataSource
from exporter.sources.podlogs import PodLogTailer, TailLimits, pod_known_on_node
from exporter.sources.rdma import ACTIVE_PORT_STATES, read_rdma
from exporter.sources.topology import TopologySource

log = logging.getLogger(__name__)

DEFAULT_GRACE_SECONDS = 300.0

# The parser's caps as the exporter runs it: tighter than the offline defaults, since one node
# holds an analyzer per stream (a pod's log shows its own ranks, rarely more than 8 processes and
# a few dozen communicators). At these caps one analyzer holds about 10 MB; the node-wide budget
# (NcclLimits.parser_memory_budget_bytes) bounds them all together.
EXPORTER_PARSER_LIMITS = Limits(
    max_processes=64, max_pointers=64, max_communicators=32, max_connections=2048, max_ranks=1024
)


@dataclass(frozen=True)
class NcclSettings:
    """How the collector runs: the values of its flags (grace period, node-wide caps) first, then
    the parser's caps and its pacing, which have no flag."""

    # seconds the series of a pod whose logs are gone (or that left the node) stay exposed
    grace_seconds: float = DEFAULT_GRACE_SECONDS
    limits: NcclLimits = field(default_factory=NcclLimits)  # series caps, the node-wide parser memory budget
    parser_limits: Limits = EXPORTER_PARSER_LIMITS  # each stream's analyzer
    tick_seconds: float = 0.5  # between polls of the tailer
    save_every_seconds: float = 5.0  # between saves of the tail offsets and each stream's counts
    rdma_cache_seconds: float = 5.0  # how long a reading of the node's RDMA port states is reused


class NcclCollector:
    """See the module docstring. The streams and their bounds are ``streams.StreamTable``'s, who
    each pod is ``attribution.PodAttributor``'s, each pod's verdict ``pod_reports``'."""

    name = "nccl"

    def __init__(
        self,
        tailer: PodLogTailer,
        sysfs: Path,
        metadata: PodMetadataSource | None = None,
        *,
        settings: NcclSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        gpu_inventory: GpuInventorySource | None = None,
        topology: TopologySource | None = None,
        verdict_feed: VerdictFeed | None = None,
    ) -> None:
        self.settings = settings or NcclSettings()
        self.tailer = tailer
        self._topology = topology
        self.metadata: PodMetadataSource = metadata or NoPodMetadata()
        self._sysfs = sysfs
        self.limits = self.settings.limits
        self.streams = StreamTable(
            self.settings.parser_limits, self.limits.parser_memory_budget_bytes, self.settings.grace_seconds
        )
        self._attributor = PodAttributor(self.metadata, gpu_inventory)
        self._clock = clock
        self._rdma: tuple[float, bool | None] | None = None
        self._verdict_feed = verdict_feed  # verdicts as they change, for the lifecycle hooks
        self._last_save = clock()
        self._step_lock = threading.Lock()
        self._snapshot = Snapshot()

    # -- background ------------------------------------------------------------------

    async def run(self) -> None:
        await run_every(self.settings.tick_seconds, self.step)

    def close(self) -> None:
        self.save_state()

    def save_state(self) -> bool:
        with self._step_lock:
            return self.tailer.save_state(self.streams.notes())

    def step(self) -> Snapshot:
        """One tick: read new lines, update analyzers, retire gone pods, publish a snapshot."""
        with self._step_lock:
            now = self._clock()
            self.streams.take(self.tailer.poll(), now)
            self.streams.expire(now, self.metadata)
            self.streams.enforce_budget()
            if now - self._last_save >= self.settings.save_every_seconds:
                self._last_save = now
                self.tailer.save_state(self.streams.notes())
            self._snapshot = self._build_snapshot()
            if self._verdict_feed is not None and self._verdict_feed.subscribed:
                self._verdict_feed.publish(pod_fabrics(self._snapshot))
            return self._snapshot

    # -- judging ---------------------------------------------------------------------

    def _node_has_active_rdma(self) -> bool | None:
        now = self._clock()
        if self._rdma is not None and now - self._rdma[0] < self.settings.rdma_cache_seconds:
            return self._rdma[1]
        try:
            reading = read_rdma(self._sysfs)
            active: bool | None = any(p.state_id in ACTIVE_PORT_STATES for p in reading.ports())
        except Exception as exc:  # noqa: BLE001 - unknown is not "no RDMA": never flag on a guess
            log.warning("could not read RDMA ports under %s: %s", self._sysfs, exc)
            active = None
        self._rdma = (now, active)
        return active

    def _build_snapshot(self) -> Snapshot:
        reports = []
        analyzers = 0
        # A retired stream's overflow keeps its reason: the counter neither drops nor moves to another series.
        dropped = {f"parser_{k}": v for k, v in self.streams.parser_dropped().items()}
        gpus = self._attributor.read_gpus()
        topology = self._topology.read() if self._topology is not None else None
        for pod in self.streams.pods.values():
            analyzers += len(pod.streams)
            reports.append(pod_report(pod, self._attributor.attribute(pod.namespace, pod.pod, gpus), topology))
        reports += self._attributor.silent_gpu_pods(gpus, self.streams.holds_pod)
        stats = self.tailer.stats
        dropped = add_counts(dropped, {f"tail_{k}": v for k, v in stats.events.items()})
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
            expectations=self._attributor.expectations(),
            parser_bytes=self.streams.parser_bytes,
        )

    # -- scrape ----------------------------------------------------------------------

    def collect(self) -> Iterable[Metric]:
        yield from self.families(self._snapshot, self.limits)
        folders = [p for p in (self.tailer.pod_logs, self.tailer.debug_files) if p is not None]
        if not any(p.is_dir() for p in folders):
            raise CollectorUnavailable("no pod-log or NCCL debug-file folder: " + ", ".join(map(str, folders)))

    families = staticmethod(nccl_families)  # what collect() renders; also callable on any snapshot


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
        grace_seconds=float(args.nccl_grace_period),
        limits=NcclLimits(parser_memory_budget_bytes=int(args.nccl_parser_memory_budget)),
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
        settings=settings,
        gpu_inventory=gpus,
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

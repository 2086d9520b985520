"""Inspector collector: ``ccl_nccl_collective_*`` — what a running job's collectives really get.

A background coroutine (``run``) polls the NCCL Inspector source (``exporter.sources.inspector``)
every ``tick_seconds`` in a worker thread and adds each operation to three counters of its pod,
collective, communicator scope and size class: operations, seconds and bus bytes. Any window of
them gives an exact mean: ``rate(ccl_nccl_collective_bus_bytes_total) /
rate(ccl_nccl_collective_seconds_total)`` is the bus bandwidth the job's operations got, in
bytes/s, weighted by time as nccl-tests weighs it.

Bus bytes are the nccl-tests size of the operation times the bus factor of its collective and
rank count (``exporter.probe.formulas``, the probe's own arithmetic); a ``.prom`` file's size is
the one its bandwidth and time give back within the bucket's range (``exporter.nccl.inspector``),
so that the same operation lands in the same size class and adds the same bus bytes from either
format. A version 5.1 bucket holds the mean of an interval's operations without their count: it
adds one operation and its mean time (the format cannot give more). Operations the plugin timed
by CPU timestamps are not counted (skipped, by reason).

Counters only grow: an operation is added to its pod once, and nothing is taken back when a
rank's file goes away (deleted at teardown, rotated, rewritten). A pod's series go once the pod
has had no Inspector file, or has left the node's pod list, for the grace period. The job
(``job_name``, ``job_kind``) comes from the node's pod list, as for the NCCL collector.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter.collectors.base import CollectorSpec, CollectorUnavailable, run_every
from exporter.flags import Flag
from exporter.nccl.inspector import Operation
from exporter.probe.formulas import busbw_factor
from exporter.resources import NodeResources
from exporter.sources.inspector import InspectorBatch, InspectorSource, PodKey
from exporter.sources.kube import NoPodMetadata, PodMetadataSource
from exporter.sources.podlogs import pod_known_on_node

log = logging.getLogger(__name__)

DEFAULT_GRACE_SECONDS = 300.0
# Label value -> the nccl-tests collective whose bus factor applies (point-to-point: sendrecv).
_FORMULA = {"send": "sendrecv", "recv": "sendrecv"}
# (collective, scope, size_class)
SeriesKey = tuple[str, str, str]
SERIES_LABELS = ["namespace", "pod", "job_name", "job_kind", "collective", "scope", "size_class"]


def bus_bytes(operation: Operation) -> float:
    """The bus bytes of one operation (see the module docstring)."""
    factor = busbw_factor(_FORMULA.get(operation.collective, operation.collective), operation.nranks)
    return operation.size_bytes * factor


@dataclass(frozen=True)
class InspectorCollectorLimits:
    """Caps of the collector's series (labels are bounded sets, pods are what is left)."""

    max_pods: int = 512
    max_series: int = 8192


@dataclass
class _Pod:
    series: dict[SeriesKey, list[float]] = field(default_factory=dict)  # [operations, seconds, bus bytes]
    gone_since: float | None = None


@dataclass(frozen=True)
class Snapshot:
    # namespace, pod, job_name, job_kind, collective, scope, size_class, operations, seconds, bus bytes
    series: tuple[tuple[str, str, str, str, str, str, str, float, float, float], ...] = ()
    records: tuple[tuple[str, int], ...] = ()
    read_bytes: tuple[tuple[str, int], ...] = ()
    files: tuple[tuple[str, int], ...] = ()
    skipped: tuple[tuple[str, int], ...] = ()
    unattributed: tuple[tuple[str, int], ...] = ()
    pods: int = 0


class InspectorCollector:
    """See the module docstring."""

    name = "inspector"

    def __init__(
        self,
        source: InspectorSource,
        metadata: PodMetadataSource | None = None,
        *,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        tick_seconds: float = 1.0,
        save_every_seconds: float = 5.0,
        limits: InspectorCollectorLimits | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.metadata: PodMetadataSource = metadata or NoPodMetadata()
        self.grace_seconds = grace_seconds
        self.tick_seconds = tick_seconds
        self.limits = limits or InspectorCollectorLimits()
        self._save_every = save_every_seconds
        self._clock = clock
        self._pods: dict[PodKey, _Pod] = {}
        self._series_count = 0
        self._dropped: dict[str, int] = {}
        self._last_save = clock()
        self._lock = threading.Lock()
        self._snapshot = Snapshot()

    async def run(self) -> None:
        await run_every(self.tick_seconds, self.step)

    def close(self) -> None:
        with self._lock:
            self.source.save_state()

    def step(self) -> Snapshot:
        """One tick: read new operations, add them to their pods' counters, publish a snapshot."""
        with self._lock:
            now = self._clock()
            batch = self.source.poll()
            self._add(batch)
            self._expire(batch, now)
            if now - self._last_save >= self._save_every:
                self._last_save = now
                self.source.save_state()
            self._snapshot = self._build_snapshot()
            return self._snapshot

    def _add(self, batch: InspectorBatch) -> None:
        for pod_key, operations in batch.operations.items():
            pod = self._pods.get(pod_key)
            if pod is None:
                if len(self._pods) >= self.limits.max_pods:
                    self._drop("pod_cap", len(operations))
                    continue
                pod = self._pods[pod_key] = _Pod()
            for operation in operations:
                key = (operation.collective, operation.scope, operation.size_class)
                totals = pod.series.get(key)
                if totals is None:
                    if self._series_count >= self.limits.max_series:
                        self._drop("series_cap")
                        continue
                    totals = pod.series[key] = [0.0, 0.0, 0.0]
                    self._series_count += 1
                totals[0] += 1
                totals[1] += operation.seconds
                totals[2] += bus_bytes(operation)

    def _drop(self, reason: str, count: int = 1) -> None:
        self._dropped[reason] = self._dropped.get(reason, 0) + count

    def _expire(self, batch: InspectorBatch, now: float) -> None:
        """Drop the series of pods without Inspector files, or gone from the node's complete pod
        list, for the grace period (their last values stay exposed until then)."""
        authoritative = self.metadata.is_authoritative()
        for pod_key in list(self._pods):
            pod = self._pods[pod_key]
            gone = pod_key not in batch.pods_present or (authoritative and self.metadata.lookup(*pod_key) is None)
            if not gone:
                pod.gone_since = None
            elif pod.gone_since is None:
                pod.gone_since = now
            elif now - pod.gone_since >= self.grace_seconds:
                self._series_count -= len(pod.series)
                del self._pods[pod_key]

    def _build_snapshot(self) -> Snapshot:
        rows = []
        for (namespace, name), pod in sorted(self._pods.items()):
            meta = self.metadata.lookup(namespace, name)
            job_name, job_kind = (meta.job_name, meta.job_kind) if meta is not None else ("", "")
            for (collective, scope, size_class), (count, seconds, bus) in sorted(pod.series.items()):
                rows.append((namespace, name, job_name, job_kind, collective, scope, size_class, count, seconds, bus))
        stats = self.source.stats
        skipped = dict(stats.skipped)
        for reason, count in self._dropped.items():
            skipped[reason] = skipped.get(reason, 0) + count
        return Snapshot(
            series=tuple(rows),
            records=tuple(sorted(stats.records.items())),
            read_bytes=tuple(sorted(stats.read_bytes.items())),
            files=tuple(sorted(stats.files.items())),
            skipped=tuple(sorted(skipped.items())),
            unattributed=tuple(sorted(stats.unattributed.items())),
            pods=len(self._pods),
        )

    def collect(self) -> Iterable[Metric]:
        yield from inspector_families(self._snapshot)
        if not self.source.root.is_dir():
            raise CollectorUnavailable(f"no NCCL Inspector folder: {self.source.root}")


def inspector_families(snap: Snapshot) -> list[Metric]:
    """The families of one snapshot."""
    operations = CounterMetricFamily(
        "ccl_nccl_collective_operations_total",
        "NCCL operations the NCCL Inspector timed in the pod, by collective (all_reduce, all_gather, "
        "reduce_scatter, broadcast, reduce, alltoall, send, recv, sendrecv), communicator scope "
        "(inter_node, intra_node, unknown) and size class of the nccl-tests size (lt_1MB, 1MB_10MB, "
        "10MB_100MB, 100MB_1GB, ge_1GB). From a .prom file of NCCL >= 2.30, one per bucket and dump.",
        labels=SERIES_LABELS,
    )
    seconds = CounterMetricFamily(
        "ccl_nccl_collective_seconds_total",
        "Execution time of those operations (the slowest channel's kernel time, as the Inspector measures it).",
        labels=SERIES_LABELS,
    )
    bus = CounterMetricFamily(
        "ccl_nccl_collective_bus_bytes_total",
        "Bus bytes of those operations: the nccl-tests size times the collective's bus factor for its "
        "rank count. rate(bus_bytes) / rate(seconds) is the bus bandwidth in bytes/s.",
        labels=SERIES_LABELS,
    )
    for *labels, count, spent, moved in snap.series:
        operations.add_metric(labels, count)
        seconds.add_metric(labels, spent)
        bus.add_metric(labels, moved)
    out: list[Metric] = [operations, seconds, bus]
    for family_type, metric_name, help_text, label, pairs in (
        (
            CounterMetricFamily,
            "ccl_nccl_inspector_records_total",
            "NCCL Inspector records turned into operations, by format (json, prom).",
            "format",
            snap.records,
        ),
        (
            CounterMetricFamily,
            "ccl_nccl_inspector_read_bytes_total",
            "Bytes read from NCCL Inspector files, by format.",
            "format",
            snap.read_bytes,
        ),
        (
            GaugeMetricFamily,
            "ccl_nccl_inspector_files",
            "NCCL Inspector files followed, by format.",
            "format",
            snap.files,
        ),
        (
            CounterMetricFamily,
            "ccl_nccl_inspector_skipped_total",
            "Inspector input not counted, by reason: malformed, not_a_record, invalid_value, no_time, "
            "unknown_collective, incomplete (records or .prom buckets); timing_kernel_cpu, "
            "timing_collective_cpu, timing_unknown (records not timed on the GPU); prom_too_large, prom_incomplete "
            "(.prom versions), prom_file_cap (files); pod_cap, series_cap (operations over the "
            "collector's caps); tail_<event> (the JSON tailer: long_line, truncated, replaced, "
            "stream_evicted, pod_not_on_node, pod_uid_mismatch, pod_uid_missing, pod_list_unavailable, symlink, "
            "folder_cap, ...) and prom_<event> of the .prom scan.",
            "reason",
            snap.skipped,
        ),
        (
            GaugeMetricFamily,
            "ccl_nccl_inspector_unattributed_files",
            "Entries directly under the NCCL Inspector folder that are not read, by reason: flat_layout "
            "(files named as the plugin names them, <hostname>-pid<pid>.log or nccl_inspector_metrics_<uuid>.prom: "
            "NCCL_INSPECTOR_DUMP_DIR shared by pods, whose files name no pod that can be trusted), "
            "not_a_pod_folder (anything else that is not a <namespace>_<pod>_<uid> folder).",
            "reason",
            snap.unattributed,
        ),
    ):
        family = family_type(metric_name, help_text, labels=[label])
        for value, count in pairs:
            family.add_metric([value], float(count))
        out.append(family)
    pods = GaugeMetricFamily("ccl_nccl_inspector_pods", "Pods with NCCL Inspector series on this node.")
    pods.add_metric([], float(snap.pods))
    out.append(pods)
    return out


@dataclass(frozen=True)
class InspectorSettings:
    grace_seconds: float


INSPECTOR_FLAGS = (
    Flag(
        "--collector.inspector.grace-period",
        DEFAULT_GRACE_SECONDS,
        "seconds the series of a pod whose NCCL Inspector files are gone (or that left the node) stay exposed",
        dest="inspector_grace_period",
        type=float,
    ),
)


def settings_from_args(args: argparse.Namespace) -> InspectorSettings:
    grace = float(args.inspector_grace_period)
    if grace < 0:
        raise SystemExit("ccl-exporter: --collector.inspector.grace-period must not be negative")
    return InspectorSettings(grace)


def build_collector(settings: InspectorSettings, resources: NodeResources) -> InspectorCollector:
    """The collector ``serve`` runs: the Inspector folder of the node's paths, read only for
    pods of this node; job names from the node's pod list."""
    metadata = resources.pod_metadata
    paths = resources.paths
    # Without a node name there is no pod list to bind folders to: names are taken as they are.
    pod_known = pod_known_on_node(metadata) if resources.node_name else None
    source = InspectorSource(paths.nccl_inspector, paths.state, pod_known=pod_known)
    return InspectorCollector(source, metadata, grace_seconds=settings.grace_seconds)


SPEC = CollectorSpec(
    name="inspector",
    help="bus bandwidth of running jobs' collectives from NCCL Inspector output (--path.nccl-inspector)",
    default_enabled=True,
    factory=build_collector,
    flags=INSPECTOR_FLAGS,
    flag_group="collector inspector",
    settings=settings_from_args,
)

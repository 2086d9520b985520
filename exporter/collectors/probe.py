"""Probe collector: ``ccl_probe_*`` and ``ccl_preflight_result`` from result files, and the
idle-time probe scheduler (``--probe.interval``, off by default) as its background task.

Result files come from three sources, told apart by the ``source`` label: ``scheduled``
(this exporter's own idle-time probes), ``preflight`` (init containers of training pods on
this node) and ``job`` (probe Jobs). A result names the pod that wrote it, with the pod's UID
(downward API), in a file of its own, so results of several pods never collide: ``namespace``,
``pod`` and ``job_name`` are labels too, empty for scheduled probes. A result is exposed for a
pod only when the node's pod list holds that pod with that UID; any other is counted by reason
(``ccl_probe_result_files{status="not_on_node" | "pod_uid_missing" | ...}``) and exposed for
nobody; see ``exporter.sources.probe_results``.

Pre-flights also arrive without any file: as the termination message of a pod's ``ccl-preflight``
init container, in the node's pod list (``exporter.results.preflight_message``), counted by what they held
in ``ccl_preflight_termination_messages{status}``. Per pod the newest pre-flight counts, from
either place.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter.collectors.base import CollectorSpec
from exporter.flags import Flag
from exporter.probe.occupancy import NvmlOccupancy, PodResourcesOccupancy
from exporter.probe.schedule import GpuOccupancy, ProbeScheduler, ProbeSettings
from exporter.resources import NodeResources
from exporter.results.preflight_message import STATUSES as PREFLIGHT_MESSAGE_STATUSES
from exporter.results.preflight_message import newest_preflights
from exporter.results.probe_file import ProbeResult
from exporter.sources.kube import PodMetadata, PodMetadataSource
from exporter.sources.podlogs import PodKnown, pod_known_on_node
from exporter.sources.probe_results import ParseCache, read_probe_results

WHO = ["source", "namespace", "pod", "job_name"]
SKIP_REASONS = ("gpu_held_by_pod", "gpu_compute_process", "occupancy_unknown", "probe_running")
RUN_OUTCOMES = ("success", "failure", "timeout", "preempted")


class ProbeCollector:
    name = "probe"

    def __init__(
        self,
        results_folder: Path,
        max_age_seconds: float,
        scheduler: ProbeScheduler | None = None,
        clock: Callable[[], float] = time.time,
        pod_known: PodKnown | None = None,
        pods: PodMetadataSource | None = None,
    ) -> None:
        self._folder = results_folder
        self._pod_known = pod_known
        self._pods = pods
        self._max_age = max_age_seconds
        self._scheduler = scheduler
        self._clock = clock
        self._cache: ParseCache = {}  # files parse again only when they change

    async def run(self) -> None:
        if self._scheduler is not None:
            await self._scheduler.run_forever()

    def collect(self) -> Iterable[Metric]:
        reading = read_probe_results(
            self._folder, self._clock(), self._max_age, cache=self._cache, pod_known=self._pod_known
        )
        from_status, message_counts = preflights_from_pods(self._pods.pods() if self._pods is not None else [])
        # Of a pod's two alike (the same run as a file and as its message), the file: it holds the messages in full.
        yield from self.result_families(newest_preflights([*from_status, *reading.results]))
        files = GaugeMetricFamily(
            "ccl_probe_result_files",
            "Result files in --path.probe-results at this scrape, by status: valid, stale (older "
            "than --probe.max-age), malformed (unparseable, wrong schema, too large, not a regular "
            "file), not_read (beyond the newest 256), or attributed to no pod: not_on_node (names a "
            "pod the node's pod list does not hold), pod_uid_mismatch (the pod has another UID), "
            "pod_uid_missing (no pod UID in it), name_mismatch (not the file name its content gives), "
            "pod_list_unavailable (no complete pod list to check it against yet), foreign_owner (a "
            "scheduled result the exporter did not write).",
            labels=["status"],
        )
        counts = {
            "valid": len(reading.results),
            "stale": len(reading.stale),
            "malformed": len(reading.malformed),
            "not_read": reading.not_read,
            **reading.unattributed_by_reason(),
        }
        for status, count in counts.items():
            files.add_metric([status], float(count))
        yield files
        messages = GaugeMetricFamily(
            "ccl_preflight_termination_messages",
            "Pods on this node whose ccl-preflight init container ended with a termination message, by what "
            "it held: valid, cut (a ccl-preflight/v1 report with lines missing: shortened by the pre-flight or "
            "cut by the kubelet, whose share per container is 12 KiB / the pod's containers), malformed (not "
            "a ccl-preflight/v1 report: used for nothing).",
            labels=["status"],
        )
        for status in PREFLIGHT_MESSAGE_STATUSES:
            messages.add_metric([status], float(message_counts[status]))
        yield messages
        if self._scheduler is not None:
            yield from self.scheduler_families(self._scheduler)

    @staticmethod
    def result_families(results: Sequence[ProbeResult]) -> list[Metric]:
        busbw = GaugeMetricFamily(
            "ccl_probe_bus_bandwidth_bytes_per_second",
            "Bus bandwidth of the last probe per collective and size (nccl-tests busbw: algbw x "
            "2(n-1)/n for all_reduce, (n-1)/n for all_gather/reduce_scatter/alltoall, 1 for broadcast).",
            labels=["collective", "scope", "size_bytes"] + WHO,
        )
        peak = GaugeMetricFamily(
            "ccl_probe_peak_bus_bandwidth_bytes_per_second",
            "Best bus bandwidth over the last probe's sizes (the largest sizes reach it; small ones are "
            "latency-bound): what the bandwidth rules compare, one series per probe instead of one per size.",
            labels=["collective", "scope"] + WHO,
        )
        average = GaugeMetricFamily(
            "ccl_probe_average_bus_bandwidth_bytes_per_second",
            "Mean bus bandwidth over the last probe's sizes (nccl-tests' '# Avg bus bandwidth').",
            labels=["collective", "scope"] + WHO,
        )
        success = GaugeMetricFamily(
            "ccl_probe_success",
            "1 if the last probe of this collective ran with correct data on every size, else 0.",
            labels=["collective", "scope"] + WHO,
        )
        last_run = GaugeMetricFamily(
            "ccl_probe_last_run_timestamp_seconds",
            "Unix time the last probe of this collective finished.",
            labels=["collective", "scope"] + WHO,
        )
        transport = GaugeMetricFamily(
            "ccl_probe_transport_info",
            "What the last probe's traffic ran on; always 1. transport_kind rdma, tcp, intra_node or "
            "unknown (from NCCL's own log for nccl, tcp for gloo); transport e.g. net_ib, net_socket, gloo/tcp.",
            labels=WHO + ["backend", "transport", "transport_kind", "network"],
        )
        preflight = GaugeMetricFamily(
            "ccl_preflight_result",
            "1 if the pre-flight check passed in the pod's init container, 0 if it failed.",
            labels=["namespace", "pod", "job_name", "check"],
        )
        for result in results:
            who = [result.source, result.namespace, result.pod, result.job_name]
            scope = result.scope or "unknown"
            if result.collectives or result.backend:
                t = result.transport
                transport.add_metric(who + [result.backend, t.name, t.kind, t.network or ""], 1.0)
            for collective in result.collectives:
                labels = [collective.collective, scope] + who
                success.add_metric(labels, 1.0 if collective.success and result.error is None else 0.0)
                last_run.add_metric(labels, result.finished_at)
                if collective.average_busbw is not None:
                    average.add_metric(labels, collective.average_busbw)
                if collective.rows:
                    peak.add_metric(labels, max(row.busbw_bytes_per_second for row in collective.rows))
                for row in collective.rows:
                    busbw.add_metric(
                        [collective.collective, scope, str(row.size_bytes)] + who, row.busbw_bytes_per_second
                    )
            if result.source == "preflight":
                for check in result.checks:
                    preflight.add_metric(
                        [result.namespace, result.pod, result.job_name, check.check], 1.0 if check.ok else 0.0
                    )
        return [busbw, peak, average, success, last_run, transport, preflight]

    @staticmethod
    def scheduler_families(scheduler: ProbeScheduler) -> list[Metric]:
        state = scheduler.state
        skipped = CounterMetricFamily(
            "ccl_probe_skipped",
            "Scheduled probes not run (or preempted) because the GPUs were in use, by reason: "
            "gpu_held_by_pod (pod-resources), gpu_compute_process (NVML), occupancy_unknown "
            "(a check could not answer), probe_running.",
            labels=["reason"],
        )
        for reason in sorted(set(SKIP_REASONS) | set(state.skipped)):
            skipped.add_metric([reason], float(state.skipped[reason]))
        runs = CounterMetricFamily(
            "ccl_probe_runs",
            "Scheduled probes started, by outcome: success, failure, timeout, preempted.",
            labels=["outcome"],
        )
        for outcome in sorted(set(RUN_OUTCOMES) | set(state.runs)):
            runs.add_metric([outcome], float(state.runs[outcome]))
        running = GaugeMetricFamily("ccl_probe_running", "1 while a scheduled probe runs.")
        running.add_metric([], 1.0 if state.running else 0.0)
        return [skipped, runs, running]


def preflights_from_pods(pods: Iterable[PodMetadata]) -> tuple[list[ProbeResult], dict[str, int]]:
    """The pre-flight results in the pods' ``ccl-preflight`` termination messages, and how many
    messages were of each status (``exporter.results.preflight_message.STATUSES``)."""
    results = []
    counts = dict.fromkeys(PREFLIGHT_MESSAGE_STATUSES, 0)
    for pod in pods:
        if pod.preflight is None:
            continue
        counts[pod.preflight.status] += 1
        if pod.preflight.result is not None:
            results.append(pod.preflight.result)
    return results, counts


PROBE_FLAGS = (
    Flag(
        "--probe.interval",
        0.0,
        "seconds between probes while the GPUs are idle; 0 = off",
        dest="probe_interval",
        type=float,
    ),
    Flag("--probe.timeout", 120.0, "seconds before a probe is killed", dest="probe_timeout", type=float),
    Flag(
        "--probe.backend",
        "auto",
        "auto, nccl or gloo",
        dest="probe_backend",
        choices=("auto", "nccl", "gloo"),
    ),
    Flag("--probe.collectives", "all_reduce", "comma-separated collectives", dest="probe_collectives"),
    Flag("--probe.min-bytes", "", "smallest size (default 1M)", dest="probe_min_bytes"),
    Flag("--probe.max-bytes", "", "largest size (default 64M)", dest="probe_max_bytes"),
    Flag("--probe.iters", 20, "timed iterations per size", dest="probe_iters", type=int),
    Flag(
        "--probe.max-age",
        86400.0,
        "seconds after which a result file is stale (ignored)",
        dest="probe_max_age",
        type=float,
    ),
)


@dataclass(frozen=True)
class ProbeCollectorSettings:
    max_age_seconds: float  # a result file older than this is stale
    schedule: ProbeSettings | None  # idle-time probes; None when off
    # Results name pods: use only those of pods the node's pod list holds (a node whose pod list
    # does not hold the pods its result files name turns it off).
    bind_results_to_node_pods: bool = True


def settings_from_args(args: argparse.Namespace) -> ProbeCollectorSettings:
    """The ``--probe.*`` flags; SystemExit on bad ones."""
    schedule = None
    if float(args.probe_interval) > 0:
        try:
            schedule = ProbeSettings(
                interval_seconds=float(args.probe_interval),
                timeout_seconds=float(args.probe_timeout),
                backend=str(args.probe_backend),
                collectives=str(args.probe_collectives),
                min_bytes=str(args.probe_min_bytes) or "1M",
                max_bytes=str(args.probe_max_bytes) or "64M",
                iters=int(args.probe_iters),
                warmup_iters=min(int(args.probe_iters), 5),
            )
        except ValueError as exc:
            raise SystemExit(f"ccl-exporter: --probe.*: {exc}") from exc
    return ProbeCollectorSettings(float(args.probe_max_age), schedule)


def probe_settings(collector_settings: Mapping[str, object]) -> ProbeSettings | None:
    """The idle-time probe settings among ``serve``'s collector settings (None when off)."""
    settings = collector_settings["probe"]
    assert isinstance(settings, ProbeCollectorSettings)
    return settings.schedule


def build(settings: ProbeCollectorSettings, resources: NodeResources) -> ProbeCollector:
    scheduler = None
    if settings.schedule is not None:
        # How this node tells that its GPUs are in use: pod-resources, then NVML.
        occupancy: list[GpuOccupancy] = [PodResourcesOccupancy(resources.pod_resources), NvmlOccupancy(resources.nvml)]
        scheduler = ProbeScheduler(settings.schedule, resources.paths.probe_results, occupancy, clock=resources.clock)
    # Without a node name there is no pod list to bind results to: a result with a UID is taken as it says.
    bound = settings.bind_results_to_node_pods and bool(resources.node_name)
    pod_known = pod_known_on_node(resources.pod_metadata) if bound else None
    return ProbeCollector(
        resources.paths.probe_results,
        settings.max_age_seconds,
        scheduler,
        clock=resources.clock,
        pod_known=pod_known,
        pods=resources.pod_metadata,
    )


SPEC = CollectorSpec(
    name="probe",
    help="bus-bandwidth probe and pre-flight results (ccl_probe_*, ccl_preflight_result); "
    "idle-time probes with --probe.interval",
    default_enabled=True,
    factory=build,
    flags=PROBE_FLAGS,
    flag_group="idle-time bus-bandwidth probes (collector probe)",
    settings=settings_from_args,
)

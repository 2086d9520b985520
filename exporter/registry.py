"""The umbrella collector: runs every enabled collector, isolates and reports each one.

One collector raising, hanging or returning garbage never fails the scrape and never hides
another collector's metrics. Every scrape yields, per collector,
``ccl_exporter_collector_success{collector}`` and
``ccl_exporter_collector_duration_seconds{collector}``, plus ``ccl_exporter_build_info``.

Output is deterministic: families in collector order then by name, samples sorted by name
and label values, so a golden file can be diffed.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from exporter import __version__
from exporter.collectors.base import Collector, CollectorUnavailable, PartialCollection

log = logging.getLogger(__name__)

_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


@dataclass
class CollectorOutcome:
    """What the last run of one collector did, shown on the landing page."""

    success: bool = False
    duration_seconds: float = math.nan
    error: str = ""
    finished_at: float = 0.0


# (families yielded, the exception that stopped the collector or None, seconds it ran)
_RunResult = tuple[list[object], "BaseException | None", float]


@dataclass
class _Slot:
    collector: Collector
    outcome: CollectorOutcome = field(default_factory=CollectorOutcome)
    in_flight: Future[_RunResult] | None = None
    unavailable_logged: bool = False


def _sample_problem(family: Metric, sample: object, label_names_ok: set[str]) -> str | None:
    value = sample.value  # type: ignore[attr-defined]
    if type(value) is not float and (not isinstance(value, (int, float)) or isinstance(value, bool)):
        return f"{family.name}: non-numeric value {value!r}"
    for key, label_value in sample.labels.items():  # type: ignore[attr-defined]
        if key not in label_names_ok:
            if not isinstance(key, str) or not _LABEL_NAME.match(key):
                return f"{family.name}: bad label name {key!r}"
            label_names_ok.add(key)
        if type(label_value) is not str:
            return f"{family.name}: non-string value for label {key!r}"
    return None


def sanitize_families(families: Iterable[object]) -> tuple[list[Metric], list[str]]:
    """Keep the well-formed metric families, sorted; return them and what was dropped.

    A family is dropped whole when it is not a ``Metric``, has a bad name, or holds a
    sample whose value is not a number or whose labels are not str -> str.
    """
    kept: list[Metric] = []
    problems: list[str] = []
    for family in families:
        if not isinstance(family, Metric):
            problems.append(f"not a metric family: {type(family).__name__}")
            continue
        if not isinstance(family.name, str) or not _METRIC_NAME.match(family.name):
            problems.append(f"bad metric name {family.name!r}")
            continue
        bad = None
        label_names_ok: set[str] = set()
        for sample in family.samples:
            bad = _sample_problem(family, sample, label_names_ok)
            if bad:
                break
        if bad:
            problems.append(bad)
            continue
        family.samples.sort(key=lambda s: (s.name, sorted(s.labels.items())))
        kept.append(family)
    kept.sort(key=lambda f: f.name)
    return kept, problems


class UmbrellaCollector:
    """A client_python collector that runs the exporter's collectors concurrently.

    Each collector runs in a shared thread pool with ``timeout_seconds``. A collector still
    running from an earlier scrape (a hung NVML call, a stuck NFS read) is not started
    again: it reports success 0 until it returns, so hung calls never pile up threads.
    """

    def __init__(self, collectors: Sequence[Collector], timeout_seconds: float = 10.0) -> None:
        self._slots = [_Slot(c) for c in collectors]
        self._timeout = timeout_seconds
        self._pool = ThreadPoolExecutor(
            max_workers=max(2, len(collectors) + 2), thread_name_prefix="collector"
        )
        self._lock = threading.Lock()

    @property
    def collectors(self) -> list[Collector]:
        return [slot.collector for slot in self._slots]

    def outcomes(self) -> dict[str, CollectorOutcome]:
        return {slot.collector.name: slot.outcome for slot in self._slots}

    def describe(self) -> list[Metric]:
        # Registering must never run a collector (NVML at import time): describe nothing.
        return []

    @staticmethod
    def _run_one(slot: _Slot) -> _RunResult:
        """Run one collector; keep what it yielded before failing (as node_exporter does)."""
        gathered: list[object] = []
        t0 = time.perf_counter()
        try:
            for family in slot.collector.collect():
                gathered.append(family)
        except Exception as exc:  # noqa: BLE001 - reported by the umbrella
            return gathered, exc, time.perf_counter() - t0
        return gathered, None, time.perf_counter() - t0

    def collect(self) -> Iterable[Metric]:
        with self._lock:  # concurrent scrapes take turns; each still gets a full answer
            yield from self._collect_locked()

    def _collect_locked(self) -> Iterable[Metric]:
        started: list[tuple[_Slot, Future[_RunResult] | None, float]] = []
        for slot in self._slots:
            if slot.in_flight is not None and not slot.in_flight.done():
                started.append((slot, None, time.perf_counter()))
                continue
            slot.in_flight = self._pool.submit(self._run_one, slot)
            started.append((slot, slot.in_flight, time.perf_counter()))

        deadline = time.perf_counter() + self._timeout
        success = GaugeMetricFamily(
            "ccl_exporter_collector_success",
            "1 if the collector's last scrape read its source completely, 0 otherwise.",
            labels=["collector"],
        )
        duration = GaugeMetricFamily(
            "ccl_exporter_collector_duration_seconds",
            "Seconds the collector took in this scrape (the timeout when it did not return).",
            labels=["collector"],
        )
        families: list[Metric] = []
        for slot, future, t0 in started:
            name = slot.collector.name
            outcome = CollectorOutcome(finished_at=time.time())
            if future is None:
                outcome.error = "still running from an earlier scrape"
                outcome.duration_seconds = self._timeout
                log.warning("collector %s: %s", name, outcome.error)
            else:
                try:
                    result, failure, elapsed = future.result(
                        timeout=max(0.0, deadline - time.perf_counter())
                    )
                except FutureTimeout:
                    result, failure, elapsed = [], None, time.perf_counter() - t0
                    outcome.error = f"timed out after {self._timeout:g}s"
                    log.error("collector %s %s", name, outcome.error)
                kept, problems = sanitize_families(result)
                families.extend(kept)
                if failure is not None:
                    outcome.error = self._describe_failure(slot, failure)
                elif problems:
                    outcome.error = "malformed families: " + "; ".join(problems[:3])
                    log.error("collector %s returned %s", name, outcome.error)
                outcome.success = not outcome.error
                outcome.duration_seconds = elapsed
            slot.outcome = outcome
            success.add_metric([name], 1.0 if outcome.success else 0.0)
            duration.add_metric([name], outcome.duration_seconds)

        build = GaugeMetricFamily(
            "ccl_exporter_build_info", "Version of ccl-health-exporter; always 1.", labels=["version"]
        )
        build.add_metric([__version__], 1.0)
        yield build
        yield success
        yield duration
        yield from families

    @staticmethod
    def _describe_failure(slot: _Slot, failure: BaseException) -> str:
        name = slot.collector.name
        if isinstance(failure, CollectorUnavailable):
            error = f"unavailable: {failure}"
            if not slot.unavailable_logged:  # say it once, not on every scrape
                log.info("collector %s %s", name, error)
                slot.unavailable_logged = True
            return error
        if isinstance(failure, PartialCollection):
            error = f"partial: {failure}"
            log.warning("collector %s %s", name, error)
            return error
        error = f"{type(failure).__name__}: {failure}"
        log.error("collector %s failed: %s", name, error, exc_info=failure)
        return error

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def build_registry(umbrella: UmbrellaCollector, process_metrics: bool = True) -> CollectorRegistry:
    """A private registry (never the global one) holding the umbrella and process metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(umbrella)
    if process_metrics:
        from prometheus_client import PlatformCollector, ProcessCollector

        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
    return registry

"""The umbrella collector: runs every enabled collector, isolates and reports each one.

One collector raising, hanging or returning garbage never fails the scrape and never hides
another collector's metrics. Every scrape yields, per collector,
``ccl_exporter_collector_success{collector}``,
``ccl_exporter_collector_duration_seconds{collector}`` and
``ccl_exporter_collector_status{collector, status}`` (``exporter.collectors.history``), plus
``ccl_exporter_build_info{version, revision, python_version}`` (``exporter.build``).

Output is deterministic: families in collector order then by name, samples sorted by name
and label values, so a golden file can be diffed.

Label values are made safe here, once, for every exposition format: a value that is not
valid UTF-8 (an undecodable file name, a ``"\\ud800"`` escape in a result file) has its lone
surrogates spelled out as ``\\xNN`` / ``\\uNNNN``, and a value longer than
``MAX_LABEL_VALUE_CHARS`` is cut to a prefix plus a hash of the whole value, so two distinct
values never become one series.
"""

from __future__ import annotations

import hashlib
import logging
import math
import operator
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, KeysView, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import CollectorRegistry
from prometheus_client.samples import Sample

from exporter.build import BuildInfo, read_build_info
from exporter.collectors.base import Collector, CollectorUnavailable, PartialCollection
from exporter.collectors.history import CollectorHistory
from exporter.collectors.rows import RowFamily, shared_label_names

log = logging.getLogger(__name__)

_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_SURROGATE = re.compile("[\ud800-\udfff]")

# No legitimate label value comes near this (Kubernetes names stop at 253 characters); a
# longer one is log-derived text gone wrong (``Using network <60 KB>``) and is cut.
MAX_LABEL_VALUE_CHARS = 256
# How long one collector may hold up the ones after it on the scrape's lane (see _Lane).
LANE_STALL_SECONDS = 0.25
_DIGEST_CHARS = 16
_CUT_MARK = "...#"


@dataclass
class CollectorOutcome:
    """What the last run of one collector did, shown on the landing page."""

    success: bool = False
    duration_seconds: float = math.nan
    error: str = ""
    finished_at: float = 0.0
    label_values_rewritten: int = 0  # not valid UTF-8, or too long (see safe_label_value)


# (families yielded, the exception that stopped the collector or None, seconds it ran)
_RunResult = tuple[list[object], "BaseException | None", float]


@dataclass(eq=False)  # a slot is itself: compared and found by identity
class _Slot:
    collector: Collector
    outcome: CollectorOutcome = field(default_factory=CollectorOutcome)
    in_flight: Future[_RunResult] | None = None
    unavailable_logged: bool = False
    rewrite_logged: bool = False


def _spell_surrogate(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte, as os.fsdecode gives it
        return f"\\x{code - 0xDC00:02x}"
    return f"\\u{code:04x}"


def safe_label_value(value: str) -> str:
    """``value`` as valid UTF-8 of at most ``MAX_LABEL_VALUE_CHARS`` characters.

    Lone surrogates are spelled out (``\\xff``); a value still too long keeps its first
    characters and ends in ``...#`` and 16 hex digits of the SHA-256 of the whole value.
    """
    if not value.isascii() and _SURROGATE.search(value):
        value = _SURROGATE.sub(_spell_surrogate, value)
    if len(value) <= MAX_LABEL_VALUE_CHARS:
        return value
    digest = hashlib.sha256(value.encode("utf-8")).hexdigest()[:_DIGEST_CHARS]
    return value[: MAX_LABEL_VALUE_CHARS - len(_CUT_MARK) - _DIGEST_CHARS] + _CUT_MARK + digest


def _needs_rewrite(value: str) -> bool:
    return len(value) > MAX_LABEL_VALUE_CHARS or (not value.isascii() and _SURROGATE.search(value) is not None)


def _is_number(value: object) -> bool:
    """A sample's value must be an int or a float, never a bool."""
    return type(value) is float or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _plain_label_values(values: Sequence[str]) -> bool | None:
    """None when one of ``values`` is not a str (collectors are typed, but may break that); else
    whether all are ASCII and short, so that none needs ``safe_label_value``. One pass in C over a
    whole family's values."""
    try:
        joined = "".join(values)
    except TypeError:
        return None
    return joined.isascii() and max(map(len, values), default=0) <= MAX_LABEL_VALUE_CHARS


def _made_safe(family_name: str, label_name: str, value: str, result: Sanitized) -> str:
    """``safe_label_value(value)``, counted in ``result`` when it differs from ``value``."""
    safe = safe_label_value(value)
    if safe != value:
        result.rewritten_values += 1
        if not result.first_rewrite:
            result.first_rewrite = f"{family_name}{{{label_name}={safe[:80]!r}...}}"
    return safe


def _plainly_safe(samples: Sequence[Sample], names: KeysView[str]) -> bool:
    """Whether every sample of a family with the label ``names`` has a float value and short ASCII
    str label values: the shape of nearly every family, checked a family at a time."""
    for sample in samples:
        if type(sample.value) is not float:
            return False
    if not names:
        return True
    for name in names:
        if not isinstance(name, str) or not _LABEL_NAME.match(name):
            return False
    return bool(_plain_label_values([value for sample in samples for value in sample.labels.values()]))


def _check_samples(family: Metric) -> tuple[str | None, list[int]]:
    """(why ``family`` must be dropped or None, indexes of its samples that may need rewriting).

    A value must be a number, a label name valid, a label value a str. A sample is a rewrite
    suspect when a label value is too long or not ASCII, the cheap half of ``_needs_rewrite``;
    most families have none, and are cleared a family at a time (``_plainly_safe``).
    """
    names = shared_label_names(family.samples)
    if names is not None and _plainly_safe(family.samples, names):
        return None, []
    label_names_ok: set[str] = set()
    suspects: list[int] = []
    for index, sample in enumerate(family.samples):
        value = sample.value
        if not _is_number(value):
            return f"{family.name}: non-numeric value {value!r}", []
        suspect = False
        for key, label_value in sample.labels.items():
            if key not in label_names_ok:
                if not isinstance(key, str) or not _LABEL_NAME.match(key):
                    return f"{family.name}: bad label name {key!r}", []
                label_names_ok.add(key)
            if type(label_value) is not str:
                return f"{family.name}: non-string value for label {key!r}", []
            if len(label_value) > MAX_LABEL_VALUE_CHARS or not label_value.isascii():
                suspect = True
        if suspect:
            suspects.append(index)
    return None, suspects


@dataclass
class Sanitized:
    """What ``sanitize_families`` kept, what it dropped, and how many label values it rewrote."""

    families: list[Metric]
    problems: list[str]
    rewritten_values: int = 0
    first_rewrite: str = ""


def _rewrite_labels(family: Metric, suspects: list[int], result: Sanitized) -> None:
    """Replace the samples of ``family`` (among ``suspects``) whose label values are not safe to expose."""
    for index in suspects:
        sample = family.samples[index]
        if not any(_needs_rewrite(v) for v in sample.labels.values()):
            continue
        labels = {key: _made_safe(family.name, key, label_value, result) for key, label_value in sample.labels.items()}
        family.samples[index] = sample._replace(labels=labels)


def _sample_order(samples: Sequence[Sample]) -> Callable[[Sample], Any]:  # keys of three shapes, each comparable
    """The sort key of samples: by name, then by ``sorted(labels.items())``.

    When every sample has the same label names (a family built with ``add_metric``), comparing
    the label values in label-name order compares exactly like the sorted (name, value) pairs,
    and is several times cheaper than building them for every sample.
    """
    names = shared_label_names(samples)
    if names is None:
        return lambda s: (s.name, sorted(s.labels.items()))
    if not names:
        return lambda s: s.name
    values = operator.itemgetter(*sorted(names))  # one name: the value itself, which compares the same
    return lambda s: (s.name, values(s.labels))


def _sanitize_rows(family: RowFamily, result: Sanitized) -> str | None:
    """Check, rewrite and sort the rows of ``family`` in place, a family at a time; return why it
    must be dropped, or None. The same rules as for samples: values numbers, label names valid,
    label values str, made safe by ``safe_label_value``."""
    for name in family.label_names:
        if not _LABEL_NAME.match(name):
            return f"{family.name}: bad label name {name!r}"
    values = family.values
    if any(type(value) is not float for value in values):
        for index, value in enumerate(values):
            if not _is_number(value):
                return f"{family.name}: non-numeric value {value!r}"
            values[index] = float(value)
    keys = family.keys
    plain = _plain_label_values([label_value for key in keys for label_value in key])
    if plain is None:
        pairs: list[tuple[str, object]] = [pair for key in keys for pair in zip(family.label_names, key, strict=True)]
        culprit = next((name for name, label_value in pairs if not isinstance(label_value, str)), "?")
        return f"{family.name}: non-string value for label {culprit!r}"
    if not plain:
        for index, key in enumerate(keys):
            keys[index] = tuple(
                _made_safe(family.name, name, label_value, result)
                for name, label_value in zip(family.label_names, key, strict=True)
            )
    order = sorted(range(len(keys)), key=keys.__getitem__)
    family.keys = [keys[index] for index in order]
    family.values = [values[index] for index in order]
    return None


def sanitize_families(families: Iterable[object]) -> Sanitized:
    """Keep the well-formed metric families that have series, sorted, with safe label values.

    A family is dropped whole when it is not a ``Metric``, has a bad name, or holds a
    sample whose value is not a number or whose labels are not str -> str. Label values
    are passed through ``safe_label_value``. A family without series is left out of the page
    (as client_golang, and so node_exporter, leave it out): its HELP and TYPE alone tell
    Prometheus nothing, and a node without pods or GPUs would otherwise carry dozens of them.
    """
    result = Sanitized([], [])
    for family in families:
        if not isinstance(family, Metric):
            result.problems.append(f"not a metric family: {type(family).__name__}")
            continue
        if not isinstance(family.name, str) or not _METRIC_NAME.match(family.name):
            result.problems.append(f"bad metric name {family.name!r}")
            continue
        if isinstance(family, RowFamily):
            if not family.keys:
                continue
            bad = _sanitize_rows(family, result)
        elif not family.samples:
            continue
        else:
            bad, suspects = _check_samples(family)
            if not bad:
                if suspects:
                    _rewrite_labels(family, suspects, result)
                family.samples.sort(key=_sample_order(family.samples))
        if bad:
            result.problems.append(bad)
            continue
        result.families.append(family)
    result.families.sort(key=lambda f: f.name)
    return result


class _Lane:
    """Collectors of one scrape, run one after another on one pool thread.

    Handing each collector to a thread of its own costs more than most collectors' work (a
    thread wakes, and the interpreter's state moves between CPU cores, on every scrape); one
    thread that runs them in turn costs one hand-off. What the lane has not started yet can be
    taken back (``take_rest``) and run elsewhere, when a collector before it stalls.

    The scrape waits for the whole lane (``finished``), not for each collector: a thread that
    woke to check each result while the lane still runs Python would take the interpreter lock
    back and forth with it, which costs more than the checking.
    """

    def __init__(self, slots: Sequence[_Slot], run_one: Callable[[_Slot], _RunResult]) -> None:
        self._waiting = deque(slots)
        self._run_one = run_one
        self._lock = threading.Lock()
        self._running_since: float | None = None
        self.finished = threading.Event()
        if not slots:
            self.finished.set()

    def running_since(self) -> float | None:
        """When the collector the lane runs now started (``time.perf_counter``); None before the
        lane starts and after it ends."""
        with self._lock:
            return self._running_since

    def take_rest(self) -> list[_Slot]:
        with self._lock:
            rest = list(self._waiting)
            self._waiting.clear()
        return rest

    def _take(self) -> _Slot | None:
        with self._lock:
            slot = self._waiting.popleft() if self._waiting else None
            self._running_since = None if slot is None else time.perf_counter()
            return slot

    def run(self) -> None:
        try:
            while (slot := self._take()) is not None:
                _settle(slot, self._run_one)
        finally:
            self.finished.set()


def _settle(slot: _Slot, run_one: Callable[[_Slot], _RunResult]) -> None:
    """Run one collector and hand its result to whoever waits on ``slot.in_flight``."""
    future = slot.in_flight
    assert future is not None
    try:
        future.set_result(run_one(slot))
    except BaseException as exc:  # noqa: BLE001 - run_one keeps collectors' errors; this is anything else
        future.set_exception(exc)


class UmbrellaCollector:
    """A client_python collector that runs the exporter's collectors, each isolated from the rest.

    A scrape runs its collectors in turn on one pool thread (a ``_Lane``). A collector that runs
    longer than ``lane_stall_seconds`` has the collectors after it taken from the lane and run
    in parallel, each on a pool thread of its own, so one slow or hung collector delays the others
    by at most that much. Each collector has ``timeout_seconds`` from the start of the scrape. A
    collector still running from an earlier scrape (a hung NVML call, a stuck NFS read) is not
    started again: it reports success 0 until it returns, so hung calls never pile up threads.
    """

    def __init__(
        self,
        collectors: Sequence[Collector],
        timeout_seconds: float = 10.0,
        build: BuildInfo | None = None,
        history: CollectorHistory | None = None,
        lane_stall_seconds: float = LANE_STALL_SECONDS,
    ) -> None:
        self._slots = [_Slot(c) for c in collectors]
        self._history = history or CollectorHistory()
        self._history_write: Future[None] | None = None
        self._timeout = timeout_seconds
        self._lane_stall = min(lane_stall_seconds, timeout_seconds / 4)
        # Read once here, never per scrape (no file reads or programs on the scrape path).
        self._build = read_build_info() if build is None else build
        self._pool = ThreadPoolExecutor(max_workers=max(2, len(collectors) + 2), thread_name_prefix="collector")
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

    def _start(self) -> tuple[list[_Slot], _Lane]:
        """Start this scrape's collectors on a lane; the slots still running from an earlier scrape
        are left alone. Returns the slots started, in order, and the lane."""
        fresh = []
        for slot in self._slots:
            if slot.in_flight is None or slot.in_flight.done():
                slot.in_flight = Future()
                fresh.append(slot)
        lane = _Lane(fresh, self._run_one)
        if fresh:
            self._pool.submit(lane.run)
        return fresh, lane

    def _await_lane(self, lane: _Lane, deadline: float) -> None:
        """Wait until the lane has run every collector, or one of them has run ``lane_stall``
        seconds (the collectors after it then leave the lane for threads of their own), or the
        deadline has passed."""
        while True:
            now = time.perf_counter()
            since = lane.running_since()
            stall_at = min(deadline, (now if since is None else since) + self._lane_stall)
            if lane.finished.wait(timeout=max(0.0, stall_at - now)):
                return
            now = time.perf_counter()
            since = lane.running_since()
            if now >= deadline or since is None or now - since >= self._lane_stall:
                for rest in lane.take_rest():
                    self._pool.submit(_settle, rest, self._run_one)
                return

    @staticmethod
    def _wait(slot: _Slot, deadline: float) -> _RunResult | None:
        """The result of ``slot`` by ``deadline``, or None if it is not done by then. By the time
        a scrape waits here, ``_await_lane`` has emptied the lane: nothing is left to send off."""
        future = slot.in_flight
        assert future is not None
        try:
            return future.result(timeout=max(0.0, deadline - time.perf_counter()))
        except FutureTimeout:
            return None

    def _collect_locked(self) -> Iterable[Metric]:
        started = time.perf_counter()
        fresh, lane = self._start()
        deadline = started + self._timeout
        self._await_lane(lane, deadline)
        success = RowFamily(
            "ccl_exporter_collector_success",
            "1 if the collector's last scrape read its source completely, 0 otherwise.",
            "gauge",
            ["collector"],
        )
        duration = RowFamily(
            "ccl_exporter_collector_duration_seconds",
            "Seconds the collector took in this scrape (the timeout when it did not return).",
            "gauge",
            ["collector"],
        )
        families: list[Metric] = []
        for slot in self._slots:
            name = slot.collector.name
            outcome = CollectorOutcome(finished_at=time.time())
            if slot not in fresh:
                outcome.error = "still running from an earlier scrape"
                outcome.duration_seconds = self._timeout
                log.warning("collector %s: %s", name, outcome.error)
            else:
                ran = self._wait(slot, deadline)
                if ran is None:
                    result: list[object] = []
                    failure, elapsed = None, time.perf_counter() - started
                    outcome.error = f"timed out after {self._timeout:g}s"
                    log.error("collector %s %s", name, outcome.error)
                else:
                    result, failure, elapsed = ran
                sanitized = sanitize_families(result)
                families.extend(sanitized.families)
                self._note_rewrites(slot, sanitized, outcome)
                if failure is not None:
                    outcome.error = self._describe_failure(slot, failure)
                elif sanitized.problems:
                    outcome.error = "malformed families: " + "; ".join(sanitized.problems[:3])
                    log.error("collector %s returned %s", name, outcome.error)
                outcome.success = not outcome.error
                outcome.duration_seconds = elapsed
            slot.outcome = outcome
            success.add([name], 1.0 if outcome.success else 0.0)
            duration.add([name], outcome.duration_seconds)
        status = RowFamily(
            "ccl_exporter_collector_status",
            "The collector's status; always 1, one series per collector: ok (its last scrape succeeded), "
            "failing (it fails now but succeeded within the last day) or unavailable (no success within the "
            "last day: its source is absent on this node). Kept across restarts in --path.state.",
            "gauge",
            ["collector", "status"],
        )
        observed = self._history.observe((slot.collector.name, slot.outcome.success) for slot in self._slots)
        if self._history.write_due and (self._history_write is None or self._history_write.done()):
            self._history_write = self._pool.submit(self._history.write_pending)  # file I/O off the scrape path
        for name, state in observed.items():
            status.add([name, state], 1.0)

        build = RowFamily(
            "ccl_exporter_build_info",
            "Version and source revision of ccl-health-exporter and the Python it runs on; always 1.",
            "gauge",
            ["version", "revision", "python_version"],
        )
        build.add([self._build.version, self._build.revision, self._build.python_version], 1.0)
        for own in (build, success, duration, status):  # in this order; their series sorted, label values made safe
            yield from sanitize_families([own]).families
        yield from families

    @staticmethod
    def _note_rewrites(slot: _Slot, sanitized: Sanitized, outcome: CollectorOutcome) -> None:
        outcome.label_values_rewritten = sanitized.rewritten_values
        if sanitized.rewritten_values and not slot.rewrite_logged:  # once: a hostile pod repeats every scrape
            log.warning(
                "collector %s: %d label values were not valid UTF-8 or longer than %d characters "
                "and were rewritten, e.g. %s",
                slot.collector.name,
                sanitized.rewritten_values,
                MAX_LABEL_VALUE_CHARS,
                sanitized.first_rewrite,
            )
            slot.rewrite_logged = True

    @staticmethod
    def _describe_failure(slot: _Slot, failure: BaseException) -> str:
        """The collector's error for the landing page; logged when it differs from the last scrape's
        (a collector that fails the same way on every scrape says so once, not on every scrape)."""
        name = slot.collector.name
        repeated = slot.outcome.error
        if isinstance(failure, CollectorUnavailable):
            error = f"unavailable: {failure}"
            if not slot.unavailable_logged:  # say it once, not on every scrape
                log.info("collector %s %s", name, error)
                slot.unavailable_logged = True
            return error
        if isinstance(failure, PartialCollection):
            error = f"partial: {failure}"
            log.log(logging.DEBUG if error == repeated else logging.WARNING, "collector %s %s", name, error)
            return error
        error = f"{type(failure).__name__}: {failure}"
        if error == repeated:
            log.debug("collector %s failed again: %s", name, error)
        else:
            log.error("collector %s failed: %s", name, error, exc_info=failure)
        return error

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def build_registry(umbrella: UmbrellaCollector, process_metrics: bool = True) -> CollectorRegistry:
    """A private registry (never the global one) holding the umbrella and process metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(umbrella)
    if process_metrics:
        from prometheus_client import PlatformCollector

        from exporter.collectors.process import ProcessMetrics

        registry.register(ProcessMetrics())
        PlatformCollector(registry=registry)
    return registry

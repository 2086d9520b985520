"""The lifecycle hooks at work: NCCL verdicts as they change → pod conditions, pod Events and the
node condition, written through ``LifecycleApi``.

``step`` runs in a worker thread (``exporter.collectors.lifecycle`` calls it in a loop): it waits
up to ``wait`` seconds for a new view from the ``VerdictFeed``, reads the pre-flight and probe
result files (at most once a second) and takes the pre-flights the pods' own status holds (the
``ccl-preflight`` termination messages), then writes only what changed: the
``ccl-health.io/fabric-ready`` condition of each pod on the node that carries the readiness
gate, a Warning Event for each fallback (once per pod, reason and deciding line), and every
``node_interval_seconds`` the node's ``CclFabricDegraded`` condition. A gated pod that nothing
spoke for ``readiness_timeout_seconds`` after its start (``status.startTime``, so a restart of
the exporter does not reset it) gets ``True`` / ``NoVerdictInTime``, once the NCCL collector has
been through the logs (its first view). ``lastTransitionTime``
moves only when the status does. A failed write is retried with exponential backoff per object
(0.5 s up to 30 s) and never holds the NCCL collector: the feed drops its oldest views while
the API is down (counted), and the newest view always says everything.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from exporter.fabric_verdicts import PodFabric, VerdictFeed
from exporter.lifecycle.decisions import (
    Condition,
    EventNote,
    NodeFabricJudge,
    PreflightOutcome,
    latest_preflights,
    latest_probe,
    pod_condition,
    pod_event,
)
from exporter.lifecycle.writes import ApiUnavailable, LifecycleApi
from exporter.nccl.networks import expected_network_class
from exporter.results.probe_file import ProbeResult
from exporter.sources.kube import PodCondition, PodMetadata, PodMetadataSource
from exporter.sources.podlogs import pod_known_on_node
from exporter.sources.probe_results import ParseCache, read_probe_results
from exporter.sources.rdma import read_rdma

log = logging.getLogger(__name__)

POD_CONDITION, POD_EVENT, NODE_CONDITION_WRITE = "pod_condition", "pod_event", "node_condition"
WRITE_KINDS = (POD_CONDITION, POD_EVENT, NODE_CONDITION_WRITE)
# ok: written; exists: an Event already there (dedup across restarts); error: failed, backing off
WRITE_RESULTS = ("ok", "exists", "error")
DELAY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
MAX_EVENTS_REMEMBERED = 4096
# Below Kueue's default waitForPodsReady.timeout (5 minutes in its config v1beta1, 30 in v1beta2)
DEFAULT_READINESS_TIMEOUT_SECONDS = 240.0
# The readiness timeout waits for the NCCL collector's first pass over the node's logs (its first
# view), or this long after the controller started when no view comes (the collector is off).
FIRST_VIEW_GRACE_SECONDS = 30.0


@dataclass(frozen=True)
class LifecycleSettings:
    readiness: bool = True  # the fabric-ready condition of gated pods
    events: bool = True  # Warning Events on pods whose NCCL fell back
    node_condition: bool = False  # CclFabricDegraded on this node
    node_interval_seconds: float = 2.0
    min_port_rate_gbps: float = 0.0
    probe_floor_gbs: float = 0.0
    results_interval_seconds: float = 1.0
    results_max_age_seconds: float = 86400.0
    # A gated pod with nothing known this long after its start gets True/NoVerdictInTime; 0: never
    readiness_timeout_seconds: float = DEFAULT_READINESS_TIMEOUT_SECONDS


@dataclass
class Backoff:
    """Per-object exponential backoff after failed writes."""

    initial: float = 0.5
    maximum: float = 30.0
    _delay: dict[object, float] = field(default_factory=dict)
    _next: dict[object, float] = field(default_factory=dict)

    def ready(self, key: object, now: float) -> bool:
        return now >= self._next.get(key, 0.0)

    def failed(self, key: object, now: float) -> None:
        delay = min(self._delay.get(key, self.initial / 2) * 2, self.maximum)
        self._delay[key] = delay
        self._next[key] = now + delay

    def succeeded(self, key: object) -> None:
        self._delay.pop(key, None)
        self._next.pop(key, None)

    def keep_only(self, keys: Iterable[object]) -> None:
        kept = set(keys)
        for table in (self._delay, self._next):
            for key in [k for k in table if k not in kept]:
                del table[key]


@dataclass
class DelayHistogram:
    """Seconds from a verdict reaching the feed to its write succeeding (cumulative buckets)."""

    counts: list[int] = field(default_factory=lambda: [0] * len(DELAY_BUCKETS))
    total: int = 0
    sum: float = 0.0

    def observe(self, seconds: float) -> None:
        for index, bound in enumerate(DELAY_BUCKETS):
            if seconds <= bound:
                self.counts[index] += 1
        self.total += 1
        self.sum += seconds


@dataclass(frozen=True)
class _Written:
    condition: Condition
    transition: str


@dataclass(frozen=True)
class Clocks:
    """The controller's two clocks: ``monotonic`` for its intervals, backoff and delays; ``wall``
    for the times it writes to the API and the age of pods and result files."""

    monotonic: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time


def _rfc3339(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def _observed(condition: PodCondition | None) -> _Written | None:
    if condition is None:
        return None
    return _Written(Condition(condition.status, condition.reason, condition.message), condition.last_transition_time)


def _expects_tcp(meta: PodMetadata | None) -> bool:
    return meta is not None and expected_network_class(meta.expected_network) == "tcp"


class LifecycleController:
    """See the module docstring."""

    def __init__(
        self,
        settings: LifecycleSettings,
        feed: VerdictFeed,
        pods: PodMetadataSource,
        api: LifecycleApi,
        *,
        node_name: str,
        sysfs: Path,
        probe_results: Path,
        clocks: Clocks = Clocks(),
    ) -> None:
        self.settings = settings
        self.feed = feed
        self.pods = pods
        self.api = api
        self.node_name = node_name
        self._sysfs = sysfs
        self._probe_results = probe_results
        self._clock = clocks.monotonic
        self._wall = clocks.wall
        self._fabric: dict[tuple[str, str], PodFabric] = {}
        self._view_at: float | None = None
        self._results: list[ProbeResult] = []
        self._results_cache: ParseCache = {}
        self._results_read_at: float | None = None
        self._written: dict[tuple[str, str, str], _Written] = {}
        self._events: OrderedDict[tuple[str, str, str, str, str], None] = OrderedDict()
        self._judge = NodeFabricJudge(settings.min_port_rate_gbps, settings.probe_floor_gbs)
        self._node_written: _Written | None = None
        self._node_read = False
        self._node_due = 0.0
        self._backoff = Backoff()
        self._started = self._clock()
        self._views_seen = False
        self._failing: set[str] = set()  # write kinds whose last attempt failed (logged once per streak)
        self.writes: dict[tuple[str, str], int] = {(k, r): 0 for k in WRITE_KINDS for r in WRITE_RESULTS}
        self.delays = DelayHistogram()
        self.status = "starting"
        feed.subscribe()

    # -- one step ----------------------------------------------------------------------

    def step(self, wait: float) -> None:
        views = self.feed.take(wait)
        if views:
            self._fabric = {(p.namespace, p.pod): p for p in views[-1].pods}
            self._view_at = views[-1].published_at
            self._views_seen = True
        now = self._clock()
        if self._results_read_at is None or now - self._results_read_at >= self.settings.results_interval_seconds:
            self._read_results(now)
        try:
            if self.settings.readiness or self.settings.events:
                listed = {(p.namespace, p.name): p for p in self.pods.pods()}
                if self.settings.readiness:
                    self._pod_conditions(listed, now)
                if self.settings.events:
                    self._pod_events(listed, now)
            if self.settings.node_condition and now >= self._node_due:
                self._node_due = now + self.settings.node_interval_seconds
                self._node_condition(now)
            self.status = "ok"
        except ApiUnavailable as exc:
            if self.status != "no API access":
                log.warning("lifecycle hooks: no Kubernetes API access (%s); nothing is written", exc)
            self.status = "no API access"

    def _read_results(self, now: float) -> None:
        self._results_read_at = now
        reading = read_probe_results(
            self._probe_results,
            self._wall(),
            self.settings.results_max_age_seconds,
            cache=self._results_cache,
            pod_known=pod_known_on_node(self.pods),
        )
        self._results = reading.results

    def _attempt(self, kind: str, key: object, now: float, write: Callable[[], bool]) -> bool:
        """Run one write unless its object is backing off; count it; True when it took effect."""
        if not self._backoff.ready(key, now):
            return False
        try:
            created = write()
        except ApiUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - API down, 403, 5xx: count, back off, go on
            self.writes[(kind, "error")] += 1
            self._backoff.failed(key, now)
            if kind not in self._failing:
                log.warning("lifecycle hooks: writing a %s failed (%s); retrying with backoff", kind, exc)
                self._failing.add(kind)
            return False
        self._backoff.succeeded(key)
        if kind in self._failing:
            log.info("lifecycle hooks: writing a %s works again", kind)
            self._failing.discard(kind)
        self.writes[(kind, "ok" if created else "exists")] += 1
        if kind != NODE_CONDITION_WRITE and self._view_at is not None:
            self.delays.observe(max(0.0, self._clock() - self._view_at))
        return True

    def _transition(self, current: _Written | None, desired: Condition) -> str:
        """``lastTransitionTime``: kept while the status stays, now when it changes (or is unknown)."""
        if current is not None and current.transition and current.condition.status == desired.status:
            return current.transition
        return _rfc3339(self._wall())

    # -- the writes, each True when it took effect ------------------------------------------

    def _patch_pod(self, namespace: str, pod: str, condition: Condition, transition: str) -> bool:
        self.api.patch_pod_condition(namespace, pod, condition, transition, _rfc3339(self._wall()))
        return True

    def _create_event(self, namespace: str, pod: str, uid: str, note: EventNote) -> bool:
        return self.api.create_pod_event(namespace, pod, uid, note, self.node_name, _rfc3339(self._wall()))

    def _patch_node(self, condition: Condition, transition: str) -> bool:
        self.api.patch_node_condition(self.node_name, condition, transition, _rfc3339(self._wall()))
        return True

    # -- pods --------------------------------------------------------------------------

    def _readiness_timeout(self, now: float) -> float:
        """The readiness timeout in force: none before the NCCL collector's first pass over the logs
        (its verdicts would come a moment later), or ``FIRST_VIEW_GRACE_SECONDS`` after the start."""
        if self._views_seen or now - self._started >= FIRST_VIEW_GRACE_SECONDS:
            return self.settings.readiness_timeout_seconds
        return 0.0

    def _pod_conditions(self, listed: dict[tuple[str, str], PodMetadata], now: float) -> None:
        # Pre-flights from the pods' own termination messages (their status, identity by the API
        # server), then from result files: of two alike, the file (it holds the messages in full).
        from_status = [m.preflight.result for m in listed.values() if m.preflight and m.preflight.result]
        preflights: dict[tuple[str, str], PreflightOutcome] = latest_preflights([*from_status, *self._results])
        timeout = self._readiness_timeout(now)
        wall = self._wall()
        live = set()
        for (namespace, name), meta in listed.items():
            if not meta.fabric_ready_gate:
                continue
            key = (namespace, name, meta.uid)
            live.add(key)
            current = self._written.get(key) or _observed(meta.fabric_ready)
            waited = None if meta.start_time is None else wall - meta.start_time
            desired = pod_condition(self._fabric.get((namespace, name)), preflights.get((namespace, name)),
                                    _expects_tcp(meta), waited, timeout,
                                    None if current is None else current.condition)  # fmt: skip
            if desired is None or (current is not None and current.condition == desired):
                continue
            transition = self._transition(current, desired)
            write = functools.partial(self._patch_pod, namespace, name, desired, transition)
            if self._attempt(POD_CONDITION, ("pod", key), now, write):
                self._written[key] = _Written(desired, transition)
        for key in [k for k in self._written if k not in live]:
            del self._written[key]

    def _pod_events(self, listed: dict[tuple[str, str], PodMetadata], now: float) -> None:
        for (namespace, name), fabric in self._fabric.items():
            meta = listed.get((namespace, name))
            note = pod_event(fabric, _expects_tcp(meta))
            if meta is None or note is None:
                continue  # a pod the API does not list (yet) cannot be named in an Event
            key = (namespace, name, meta.uid, note.reason, note.message)
            if key in self._events:
                continue
            write = functools.partial(self._create_event, namespace, name, meta.uid, note)
            if self._attempt(POD_EVENT, ("event", key), now, write):
                self._events[key] = None
                while len(self._events) > MAX_EVENTS_REMEMBERED:
                    self._events.popitem(last=False)

    # -- the node ----------------------------------------------------------------------

    def _node_condition(self, now: float) -> None:
        try:
            ports = read_rdma(self._sysfs).ports()
        except Exception as exc:  # noqa: BLE001 - an unreadable sysfs says nothing about the fabric
            log.debug("lifecycle hooks: cannot read RDMA ports: %s", exc)
            return
        desired = self._judge.judge(ports, latest_probe(self._results))
        if not self._node_read:
            self._node_read = True
            try:
                self._node_written = _observed(self.api.read_node_condition(self.node_name))
            except ApiUnavailable:
                raise
            except Exception as exc:  # noqa: BLE001 - without it, the first write sets the transition time
                log.info("lifecycle hooks: cannot read node %s's conditions (%s)", self.node_name, exc)
        current = self._node_written
        if current is not None and current.condition == desired:
            return
        transition = self._transition(current, desired)
        write = functools.partial(self._patch_node, desired, transition)
        if self._attempt(NODE_CONDITION_WRITE, ("node",), now, write):
            self._node_written = _Written(desired, transition)

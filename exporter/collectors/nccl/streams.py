"""The NCCL collector's log streams: one ``LogAnalyzer`` per stream (a container run or an NCCL
debug file), grouped by pod.

``StreamTable.take`` feeds what one poll of the pod-log tailer found: a stream opened with the
counts saved by the previous run of the exporter, a restarted debug file (a new analyzer, the
counts carried on), a replayed head (fed again only to rebuild what the init lines said; the
warnings and parser overflow it repeats are taken back out, since the saved counts hold them) and
new lines. ``expire`` drops superseded container runs and pods gone for longer than the grace
period; ``enforce_budget`` keeps every analyzer of the node together within the parser memory
budget. Counts of streams no longer held are kept (per pod for warnings, node-wide for overflow).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from exporter.nccl import Limits, LogAnalyzer, Verdict
from exporter.nccl.nics import NicUse, nic_uses
from exporter.sources.kube import PodMetadataSource
from exporter.sources.podlogs import SOURCE_POD_LOG, StreamKey
from exporter.sources.podlogs.limits import StreamNote, TailBatch

# Keys of a stream's note in the tailer's state file: its counts, carried over restarts.
NOTE_WARNINGS = "warnings"
NOTE_DROPPED = "dropped"
# Over the budget, analyzers shrink until all of them together hold this share of it.
BUDGET_SHRINK_TARGET = 0.8


def add_counts(base: Mapping[str, int], extra: Mapping[str, int]) -> dict[str, int]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = out.get(key, 0) + int(value)
    return out


def _int_counts(raw: object) -> dict[str, int]:
    if not isinstance(raw, dict):
        return {}
    return {str(k): int(v) for k, v in raw.items() if isinstance(v, int) and v >= 0}


@dataclass
class TrackedStream:
    """One stream's analyzer, with the counts from before it and its latest verdict."""

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
        return add_counts(self.warnings_base, self.analyzer.warnings_by_category)

    def dropped(self) -> dict[str, int]:
        return add_counts(self.dropped_base, self.analyzer.overflow)

    def current_verdict(self) -> Verdict:
        """The analyzer's verdict (and the NICs its channels use), worked out again only after new lines."""
        if self.dirty or self.verdict is None:
            self.verdict = self.analyzer.result()
            self.nics = nic_uses(self.analyzer)
            self.dirty = False
        return self.verdict

    def feed(self, lines: Iterable[str]) -> None:
        feed = self.analyzer.feed
        for line in lines:
            feed(line)
        self.dirty = True
        self.size = self.analyzer.approx_bytes()


@dataclass
class PodStreams:
    """The streams of one pod, and the warnings of its streams no longer held."""

    namespace: str
    pod: str
    streams: dict[StreamKey, TrackedStream] = field(default_factory=dict)
    retired_warnings: dict[str, int] = field(default_factory=dict)  # of streams no longer held
    gone_since: float | None = None


def supersedes(verdict: Verdict) -> bool:
    """A restarted container's log replaces the previous run's once it says something: a verdict,
    or a communicator whose network is known (its placement may stay open)."""
    return verdict.verdict != "unknown" or any(c.network_class for c in verdict.communicators)


class StreamTable:
    """See the module docstring."""

    def __init__(self, parser_limits: Limits, parser_memory_budget_bytes: int, grace_seconds: float) -> None:
        self._parser_limits = parser_limits
        self._budget = parser_memory_budget_bytes
        self._grace_seconds = grace_seconds
        self.pods: dict[tuple[str, str], PodStreams] = {}
        self.parser_bytes = 0  # what every analyzer holds together, after the last enforce_budget
        self._dropped_retired: dict[str, int] = {}  # parser overflow of analyzers no longer held

    # -- what a poll found -------------------------------------------------------------

    def take(self, batch: TailBatch, now: float) -> None:
        """Feed one poll of the tailer: opened, restarted, replayed, new lines, removed, in that order."""
        for key, note in batch.opened.items():
            self._open(key, note)
        for key in batch.restarted:
            self._restart(key)
        for key, lines in batch.replayed.items():
            self._replay(self._stream(key), lines)
        for key, lines in batch.lines.items():
            self._stream(key).feed(lines)
        for key in batch.removed:
            pod = self.pods.get((key.namespace, key.pod))
            if pod is not None and key in pod.streams:
                pod.streams[key].removed_at = now

    def _new_stream(self, key: StreamKey) -> TrackedStream:
        return TrackedStream(key=key, analyzer=LogAnalyzer(limits=self._parser_limits))

    def _open(self, key: StreamKey, note: StreamNote | None) -> None:
        pod = self.pods.setdefault((key.namespace, key.pod), PodStreams(key.namespace, key.pod))
        stream = self._new_stream(key)
        if note:
            stream.warnings_base = _int_counts(note.get(NOTE_WARNINGS))
            stream.dropped_base = _int_counts(note.get(NOTE_DROPPED))
        old = pod.streams.pop(key, None)
        if old is not None:
            self._retire(pod, old)
        pod.streams[key] = stream
        pod.gone_since = None

    def _stream(self, key: StreamKey) -> TrackedStream:
        pod = self.pods.get((key.namespace, key.pod))
        if pod is None or key not in pod.streams:
            self._open(key, None)
            pod = self.pods[(key.namespace, key.pod)]
        stream = pod.streams[key]
        stream.removed_at = None
        return stream

    def _restart(self, key: StreamKey) -> None:
        """A debug file rewritten by a new process: new analyzer, counters carried on."""
        pod = self.pods.get((key.namespace, key.pod))
        if pod is None or key not in pod.streams:
            return
        old = pod.streams[key]
        fresh = self._new_stream(key)
        fresh.warnings_base = old.warnings()
        fresh.dropped_base = old.dropped()
        pod.streams[key] = fresh

    @staticmethod
    def _replay(stream: TrackedStream, lines: Iterable[str]) -> None:
        before = dict(stream.analyzer.warnings_by_category)
        before_dropped = dict(stream.analyzer.overflow)
        stream.feed(lines)
        # Already counted by the run that saved the state: take them back out.
        for category, count in stream.analyzer.warnings_by_category.items():
            replayed = count - before.get(category, 0)
            stream.warnings_base[category] = stream.warnings_base.get(category, 0) - replayed
        for reason, count in stream.analyzer.overflow.items():
            replayed = count - before_dropped.get(reason, 0)
            stream.dropped_base[reason] = stream.dropped_base.get(reason, 0) - replayed

    def _retire(self, pod: PodStreams, stream: TrackedStream) -> None:
        pod.retired_warnings = add_counts(pod.retired_warnings, stream.warnings())
        self._dropped_retired = add_counts(self._dropped_retired, stream.dropped())

    # -- bounds ------------------------------------------------------------------------

    def enforce_budget(self) -> None:
        """Keep every analyzer of the node together within the budget: the largest shrink first."""
        streams = [stream for pod in self.pods.values() for stream in pod.streams.values()]
        total = sum(stream.size for stream in streams)
        budget = self._budget
        if total > budget:
            target = int(budget * BUDGET_SHRINK_TARGET)
            for stream in sorted(streams, key=lambda st: st.size, reverse=True):
                if total <= target:
                    break
                before = stream.size
                stream.size = stream.analyzer.shrink(max(0, before - (total - target)))
                stream.dirty = True
                total -= before - stream.size
        self.parser_bytes = total

    def expire(self, now: float, metadata: PodMetadataSource) -> None:
        """Drop superseded container runs, and pods gone for longer than the grace period (gone: no
        stream left, or missing from the node's complete pod list)."""
        authoritative = metadata.is_authoritative()
        for pod_key in list(self.pods):
            pod = self.pods[pod_key]
            self._expire_streams(pod, now)
            listed = metadata.lookup(pod.namespace, pod.pod)
            gone = not pod.streams or (authoritative and listed is None)
            if gone:
                if pod.gone_since is None:
                    pod.gone_since = now
                elif now - pod.gone_since >= self._grace_seconds:
                    for stream in pod.streams.values():
                        self._retire(pod, stream)
                    del self.pods[pod_key]
            else:
                pod.gone_since = None

    def _expire_streams(self, pod: PodStreams, now: float) -> None:
        """Drop a pod's streams whose files are gone past the grace period, and container runs a
        newer run of the same container supersedes."""
        newest: dict[tuple[str, str], int] = {}
        for key in pod.streams:
            if key.source == SOURCE_POD_LOG:
                slot = (key.pod_uid, key.container)
                newest[slot] = max(newest.get(slot, -1), key.generation)
        for key in list(pod.streams):
            stream = pod.streams[key]
            superseded = key.source == SOURCE_POD_LOG and key.generation < newest[(key.pod_uid, key.container)]
            expired = stream.removed_at is not None and now - stream.removed_at >= self._grace_seconds
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
                expired = newer is not None and supersedes(newer.current_verdict())
            if expired:
                self._retire(pod, pod.streams.pop(key))

    # -- what the snapshot reads -------------------------------------------------------

    def notes(self) -> dict[StreamKey, StreamNote]:
        """Each stream's counts, saved with the tail offsets."""
        notes: dict[StreamKey, StreamNote] = {}
        for pod in self.pods.values():
            for key, stream in pod.streams.items():
                notes[key] = {NOTE_WARNINGS: stream.warnings(), NOTE_DROPPED: stream.dropped()}
        return notes

    def analyzers(self) -> Iterator[LogAnalyzer]:
        for pod in self.pods.values():
            for stream in pod.streams.values():
                yield stream.analyzer

    def holds_pod(self, namespace: str, pod: str) -> bool:
        return (namespace, pod) in self.pods

    def parser_dropped(self) -> dict[str, int]:
        """Parser overflow of every analyzer, held or no longer held, by reason."""
        dropped = dict(self._dropped_retired)
        for pod in self.pods.values():
            for stream in pod.streams.values():
                dropped = add_counts(dropped, stream.dropped())
        return dropped

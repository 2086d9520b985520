"""``PodLogTailer``: one bounded round per ``poll`` (scan, follow the files, read on fairly),
offsets saved by ``save_state``; see the package docstring."""

from __future__ import annotations

import bisect
import time
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

from exporter.sources.podlogs.cri import CriJoiner
from exporter.sources.podlogs.files import File
from exporter.sources.podlogs.layout import SOURCE_DEBUG_FILE, SOURCE_POD_LOG, SOURCES, PodKnown, StreamKey
from exporter.sources.podlogs.limits import StreamNote, TailBatch, TailLimits, TailSelection, TailStats
from exporter.sources.podlogs.reading import StreamReader
from exporter.sources.podlogs.rotation import FileSync
from exporter.sources.podlogs.scan import Candidate, FolderCache, Scanner, resolved
from exporter.sources.podlogs.state import TailState
from exporter.sources.podlogs.stream import Stream


class PodLogTailer:
    """Incremental reader of pod logs and NCCL debug files; see the package docstring."""

    def __init__(
        self,
        pod_logs: Path | None,
        debug_files: Path | None,
        state_dir: Path | None = None,
        limits: TailLimits | None = None,
        *,
        pod_known: PodKnown | None = None,
        selection: TailSelection | None = None,
    ) -> None:
        self.pod_logs = pod_logs
        self.debug_files = debug_files
        self.state_dir = state_dir
        self.limits = limits or TailLimits()
        self.pod_known = pod_known
        self.selection = selection or TailSelection()
        self.stats = TailStats()
        self._streams: dict[StreamKey, Stream] = {}
        self._folders = FolderCache(self.limits)
        self._scanner = Scanner(
            pod_logs, debug_files, self.limits, self.stats, pod_known, self._folders, self.selection.debug_file_name
        )
        self._state = TailState(state_dir, self.limits, self.stats, self.selection.state_file_name)
        self._file_sync = FileSync(self.limits, self.stats, self._compressed_readers)
        self._reader = StreamReader(self.limits, self.stats, self.selection.needle)
        self._first_scan = True
        self._saved = self._state.load()
        self._cursor: dict[str, StreamKey] = {}  # per source: the stream the next poll starts with
        self._evicted: OrderedDict[StreamKey, list[File]] = OrderedDict()

    def save_state(self, notes: Mapping[StreamKey, StreamNote] | None = None) -> bool:
        """Write offsets, partial messages and ``notes`` atomically; False if it failed."""
        return self._state.save(self._streams, notes)

    def _select_streams(self, found: list[Candidate], batch: TailBatch) -> dict[StreamKey, list[Candidate]]:
        """Group candidates by stream and apply the per-pod and per-source stream caps."""
        by_stream: dict[StreamKey, list[Candidate]] = {}
        for cand in found:
            by_stream.setdefault(cand.key, []).append(cand)
        newest = {key: max(c.mtime for c in cands) for key, cands in by_stream.items()}
        by_pod: dict[tuple[str, str, str], list[StreamKey]] = {}
        for key in by_stream:
            by_pod.setdefault((key.source, key.namespace, key.pod), []).append(key)
        by_source: dict[str, list[StreamKey]] = {source: [] for source in SOURCES}
        for (source, _, _), keys in by_pod.items():
            keys.sort(key=lambda k: (-newest[k], k))
            by_source[source].extend(keys[: self.limits.max_streams_per_pod])
        kept: list[StreamKey] = []
        for keys in by_source.values():
            keys.sort(key=lambda k: (-newest[k], k))
            kept.extend(keys[: self.limits.max_streams])
        kept_set = set(kept)
        for key in by_stream:
            if key not in kept_set and key in self._streams:
                stream = self._streams.pop(key)
                self.stats.event("stream_evicted")
                batch.removed.append(key)
                for comp in stream.compressed:  # not remembered: inflating again is not worth it
                    self.stats.skip("stream_evicted", comp.left())
                self._evicted[key] = list(stream.files.values())
                while len(self._evicted) > len(SOURCES) * self.limits.max_streams:
                    self._evicted.popitem(last=False)
        return {key: by_stream[key] for key in kept}

    # -- polling ---------------------------------------------------------------------

    def poll(self) -> TailBatch:
        """One bounded round: scan, follow renames/truncations, read new complete lines."""
        now = time.time()
        batch = TailBatch()
        scan = self._scanner.scan(now)
        selected = self._select_streams(scan.found, batch)
        first_scan = self._first_scan
        self._first_scan = False

        for key in [k for k in self._streams if k not in selected]:
            gone = self._streams.pop(key)
            refused = (key.source, key.namespace, key.pod, key.pod_uid) in scan.refused
            self.stats.skip("pod_not_on_node" if refused else "vanished", gone.unread())
            batch.removed.append(key)

        by_source: dict[str, list[Stream]] = {source: [] for source in SOURCES}
        for key in sorted(selected):
            gz_names = scan.compressed.get(key, [])
            stream = self._streams.get(key)
            if stream is None:
                # A folder that waited for the pod list since the start holds what was there then.
                from_start = first_scan or (key.source, key.namespace, key.pod, key.pod_uid) in scan.held_since_start
                stream = self._open_stream(key, selected[key], gz_names, from_start, batch)
                self._streams[key] = stream
            self._file_sync.sync(stream, selected[key], gz_names, batch)
            by_source[key.source].append(stream)

        # Pod logs first; debug files keep their share (at most half the tick) while they
        # have bytes waiting, and the same share of the lines; each source may take what the
        # other leaves (the pod logs in a second pass).
        limits = self.limits
        debug_waiting = sum(s.waiting(now) for s in by_source[SOURCE_DEBUG_FILE])
        share = min(limits.debug_file_tick_bytes, limits.tick_bytes // 2)
        reserved = min(share, debug_waiting)
        reserved_lines = limits.tick_lines * share // max(1, limits.tick_bytes) if debug_waiting else 0
        left = (limits.tick_bytes, limits.tick_lines)
        for source, held_back in (
            (SOURCE_POD_LOG, (reserved, reserved_lines)),
            (SOURCE_DEBUG_FILE, (0, 0)),
            (SOURCE_POD_LOG, (0, 0)),
        ):
            budget = (left[0] - held_back[0], left[1] - held_back[1])
            used, lines = self._serve(source, by_source[source], budget, first_scan, batch, now)
            left = (left[0] - used, left[1] - lines)

        self.stats.backlog_bytes = sum(s.waiting(now) for s in self._streams.values())
        self.stats.streams = len(self._streams)
        files = dict.fromkeys(SOURCES, 0)
        for stream in self._streams.values():
            files[stream.key.source] += len(stream.files)
        self.stats.files = files
        return batch

    def _serve(
        self,
        source: str,
        streams: list[Stream],
        budget: tuple[int, int],
        first_scan: bool,
        batch: TailBatch,
        now: float,
    ) -> tuple[int, int]:
        """Turns of one source's streams (sorted by key) within ``budget`` (bytes, lines);
        (bytes read, lines handed back).

        Round-robin from the stream the last poll stopped at; each turn is a fair share of
        what is left, in bytes (at least a line, at most a chunk) and in lines (at least
        ``min_turn_lines``), and rounds go on while budget is left, so one busy stream may use
        what the others do not need, and no stream waits for more than a round of turns.
        """
        given_bytes, given_lines = budget
        left_bytes, left_lines = budget
        active = [s for s in streams if s.waiting(now)]
        if not active or left_bytes <= 0 or left_lines <= 0:
            return 0, 0
        cursor = self._cursor.get(source)
        if cursor is not None:
            start = bisect.bisect_left([s.key for s in active], cursor) % len(active)
            active = active[start:] + active[:start]
        limits = self.limits
        while active:
            share = min(limits.file_chunk_bytes, max(left_bytes // len(active), limits.max_line_bytes))
            line_share = max(left_lines // len(active), limits.min_turn_lines)
            again: list[Stream] = []
            for stream in active:
                if left_bytes <= 0 or left_lines <= 0:
                    self._cursor[source] = stream.key
                    return given_bytes - left_bytes, given_lines - left_lines
                used, lines = self._reader.turn(
                    stream, min(share, left_bytes), first_scan, batch, now, min(line_share, left_lines)
                )
                left_bytes -= used
                left_lines -= lines
                if used > 0 and stream.waiting(now):
                    again.append(stream)
            active = again
        return given_bytes - left_bytes, given_lines - left_lines

    def _open_stream(
        self, key: StreamKey, cands: list[Candidate], gz_names: list[str], first_scan: bool, batch: TailBatch
    ) -> Stream:
        root = resolved(self.pod_logs if key.source == SOURCE_POD_LOG else self.debug_files)
        assert root is not None
        stream = Stream(
            key=key, root=root, cri=key.source == SOURCE_POD_LOG, joiner=CriJoiner(self.limits.max_line_bytes)
        )
        saved = self._saved.pop(key.text(), None)
        note = None
        if saved is not None:
            note = saved.get("note") if isinstance(saved.get("note"), dict) else None
            self._state.restore(stream, saved, cands, gz_names)
            stream.resumed = True
        batch.opened[key] = note
        remembered = self._evicted.pop(key, None)
        # A stream that appears while running is read whole, its compressed rotations too;
        # otherwise .gz files already there are history.
        appeared = not first_scan and saved is None and remembered is None
        stream.gz_known = set() if appeared else set(gz_names) | stream.gz_known
        if remembered is not None:
            # Dropped by a cap earlier in this run: resume where it was and replay its head,
            # like a stream restored from saved state.
            current = {(c.dev, c.ino): c for c in cands}
            for tracked in remembered:
                cand = current.get(tracked.identity)
                if cand is not None:
                    tracked.path, tracked.order = cand.path, cand.order
                    stream.files[tracked.identity] = tracked
            stream.resumed = True
            return stream
        # Streams found at the first scan without saved state are bootstrapped with the cap;
        # restored ones replay their head; later ones are simply read from byte 0.
        stream.bootstrapped = appeared
        return stream

    def _compressed_readers(self) -> int:
        return sum(len(s.compressed) for s in self._streams.values())

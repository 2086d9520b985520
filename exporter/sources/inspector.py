"""NCCL Inspector output in ``--path.nccl-inspector`` (a hostPath the jobs' pods write into).

Layout, as for NCCL debug files: ``<root>/<namespace>_<pod>_<uid>/<file>`` (up to two folders
deeper), what a pod gets with ``NCCL_INSPECTOR_DUMP_DIR`` on a ``subPathExpr`` mount. A folder
speaks for a pod only through the pod's UID, and only for a pod the node's pod list holds with
that UID, exactly as debug-file folders do (``exporter.sources.podlogs.scan``): a folder without
a UID or naming another pod is counted (``tail_``/``prom_`` + ``pod_uid_missing``,
``pod_uid_mismatch``, ``pod_not_on_node``, ``pod_list_unavailable``), never credited to anyone.
Two kinds of file:

* ``*.log``: the plugin's JSON Lines (``<hostname>-pid<pid>.log``), appended by one process and
  truncated when a new process of the same name starts. They are tailed by a ``PodLogTailer``
  with its own ``TailSelection`` (lines with ``_perf"``, ``*.log`` files, offsets in
  ``<state>/inspector-state.json``): the same offsets across restarts, rotation and truncation
  handling, symlink refusal, folder and stream caps and per-poll byte budget as NCCL debug
  files. A file found at the first start without saved offsets is followed from its end (its
  past operations are not counted as if they had just happened; ``start_bytes`` 0); a file that
  appears later is read whole. Replayed heads are not parsed again.
* ``nccl_inspector_metrics_<uuid>.prom``: rewritten in place every dump interval (truncated,
  then written bucket by bucket), deleted at teardown. Found by the same folder scanner. A
  version is read once it has not changed for ``prom_settle_seconds``, ends with a newline and
  is still the same file (inode, size, mtime) after the read; each version is counted once,
  whatever number of polls see it, and whole (the plugin truncates the file before every dump:
  a version holds one dump interval). A file the plugin did not rewrite (no operation in the
  interval) keeps its mtime and is not counted again. Versions already there at the first
  poll are taken as counted (they may have been before a restart); a file that disappears
  takes nothing back.

NVIDIA's README points ``NCCL_INSPECTOR_DUMP_DIR`` at one flat folder for every job
(``<hostname>-pid<pid>.log``, ``nccl_inspector_metrics_<uuid>.prom``). Such a file right under the
root names no pod but by a hostname (a pod's name in Kubernetes), which any pod that can write
the folder picks as it likes, and neither its owner, inode nor times tell its writer: it is never
read, never credited to anyone, and counted (``unattributed``: ``flat_layout`` for files named as
the plugin names them, ``not_a_pod_folder`` for any other entry of the root that is not a
``<namespace>_<pod>[_<uid>]`` folder). The plugin's flat folder works as it is when the folder a
pod sees is its own ``subPathExpr`` mount.

Hostile input is capped and counted, never a crash: lines over ``max_line_bytes`` (the tailer
cuts them; the record no longer parses), records that do not parse or carry values out of
range (``exporter.nccl.inspector`` names the reasons), ``.prom`` files over ``max_prom_bytes``,
more ``.prom`` files than ``max_prom_files``, more than ``prom_tick_bytes`` of them per poll
(the rest wait for the next poll).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from exporter.nccl.inspector import FORMAT_JSON, FORMAT_PROM, INCOMPLETE, Operation, parse_json_record, parse_prom
from exporter.sources.podlogs import PodKnown, PodLogTailer, StreamKey, TailLimits, TailSelection
from exporter.sources.podlogs.files import read_at, regular_file
from exporter.sources.podlogs.layout import is_debug_folder_name
from exporter.sources.podlogs.limits import TailStats
from exporter.sources.podlogs.scan import DIR, FolderCache, Scanner, resolved

log = logging.getLogger(__name__)

STATE_FILE_NAME = "inspector-state.json"
PROM_NAME = re.compile(r"nccl_inspector_metrics_[^/]{1,200}\.prom")
# The plugin's JSON file name, "%s/%s-pid%d.log" of the dump folder, hostname and pid
JSON_NAME = re.compile(r"[^/]{1,255}-pid[0-9]{1,10}\.log")
# Why an entry of the root is not read (``InspectorStats.unattributed``)
FLAT_LAYOUT = "flat_layout"
NOT_A_POD_FOLDER = "not_a_pod_folder"
UNATTRIBUTED_REASONS = (FLAT_LAYOUT, NOT_A_POD_FOLDER)
# Every JSON record holds "coll_perf" or "p2p_perf"; other lines of a .log file are not records.
RECORD_NEEDLE = b'_perf"'
# Pod (namespace, name) -> its operations of one poll
PodKey = tuple[str, str]


def is_json_log_name(name: str) -> bool:
    return name.endswith(".log") and not name.startswith(".")


def is_prom_name(name: str) -> bool:
    return PROM_NAME.fullmatch(name) is not None


def is_plugin_file_name(name: str) -> bool:
    """A name the plugin gives its files: ``<hostname>-pid<pid>.log`` or ``nccl_inspector_metrics_<uuid>.prom``."""
    return JSON_NAME.fullmatch(name) is not None or is_prom_name(name)


JSON_SELECTION = TailSelection(needle=RECORD_NEEDLE, debug_file_name=is_json_log_name, state_file_name=STATE_FILE_NAME)


@dataclass(frozen=True)
class InspectorLimits:
    """Bounds of the Inspector source; the defaults suit a node with ~100 pods."""

    # The JSON tailer: 8 MiB (~25 000 records) per poll; a verbose record stays under the line cap.
    tail: TailLimits = field(
        default_factory=lambda: TailLimits(
            tick_bytes=8 * 1024 * 1024, debug_file_tick_bytes=4 * 1024 * 1024, start_bytes=0, max_line_bytes=64 * 1024
        )
    )
    max_prom_bytes: int = 1024 * 1024  # a .prom file is ~1 KB per communicator and metric
    max_prom_files: int = 1024  # node-wide
    prom_tick_bytes: int = 16 * 1024 * 1024  # .prom bytes read per poll
    prom_settle_seconds: float = 1.0  # unchanged for this long: the writer is done with it
    # A version that never gets its last newline (the writer died mid-write) is given up after this.
    prom_incomplete_seconds: float = 60.0


@dataclass
class InspectorStats:
    """Cumulative counters of the source, for its health metrics."""

    records: dict[str, int] = field(default_factory=lambda: dict.fromkeys((FORMAT_JSON, FORMAT_PROM), 0))
    read_bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys((FORMAT_JSON, FORMAT_PROM), 0))
    # reason -> records, lines or files not used: the parser's reasons (exporter.nccl.inspector),
    # prom_too_large (versions), prom_file_cap (files, once while over it), prom_incomplete
    # (versions), tail_<event> of the JSON tailer and prom_<event> of the .prom scan
    skipped: dict[str, int] = field(default_factory=dict)
    files: dict[str, int] = field(default_factory=lambda: dict.fromkeys((FORMAT_JSON, FORMAT_PROM), 0))
    # reason -> entries of the root not read now (UNATTRIBUTED_REASONS; a gauge)
    unattributed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(UNATTRIBUTED_REASONS, 0))

    def skip(self, reason: str, count: int = 1) -> None:
        if count > 0:
            self.skipped[reason] = self.skipped.get(reason, 0) + count


@dataclass
class InspectorBatch:
    """What one poll found: operations per pod, and the pods that have Inspector files now."""

    operations: dict[PodKey, list[Operation]] = field(default_factory=dict)
    pods_present: set[PodKey] = field(default_factory=set)

    def add(self, pod: PodKey, operation: Operation) -> None:
        self.operations.setdefault(pod, []).append(operation)


# The version of a .prom file: device, inode, size, mtime
PromVersion = tuple[int, int, int, float]


class InspectorSource:
    """See the module docstring. ``poll`` is called from one thread at a time."""

    def __init__(
        self,
        root: Path,
        state_dir: Path | None = None,
        limits: InspectorLimits | None = None,
        *,
        pod_known: PodKnown | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.root = root
        self.limits = limits or InspectorLimits()
        self.stats = InspectorStats()
        self._clock = clock
        self._tailer = PodLogTailer(
            None, root, state_dir, self.limits.tail, pod_known=pod_known, selection=JSON_SELECTION
        )
        self._prom_stats = TailStats()
        prom_limits = self.limits.tail
        self._prom_scanner = Scanner(
            None, root, prom_limits, self._prom_stats, pod_known, FolderCache(prom_limits), is_prom_name
        )
        self._prom: dict[StreamKey, PromVersion] = {}  # the version last counted (or taken as counted)
        self._json_streams: set[StreamKey] = set()
        self._over_cap: set[StreamKey] = set()  # .prom files beyond max_prom_files (counted once)
        self._root_listing = FolderCache(prom_limits)
        self._warned_flat = False
        self._first_poll = True

    def save_state(self) -> bool:
        """Save the JSON tailer's offsets (atomically); False if it failed."""
        return self._tailer.save_state()

    @property
    def tail_stats(self) -> TailStats:
        return self._tailer.stats

    def poll(self) -> InspectorBatch:
        """One bounded round over both kinds of file."""
        batch = InspectorBatch()
        self._poll_json(batch)
        self._poll_prom(batch)
        self._count_unattributed()
        self._first_poll = False
        for reason, count in self._tailer.stats.events.items():
            self.stats.skipped[f"tail_{reason}"] = count
        for reason, count in self._prom_stats.events.items():
            self.stats.skipped[f"prom_{reason}"] = count
        return batch

    def _count_unattributed(self) -> None:
        """What the root holds besides pod folders (see the module docstring), from a listing
        reused while the root is unchanged."""
        root = resolved(self.root)
        assert root is not None
        listing = self._root_listing.list(root, self._clock())
        counts = dict.fromkeys(UNATTRIBUTED_REASONS, 0)
        for name, kind in listing.entries:
            if kind == DIR and is_debug_folder_name(name):
                continue  # a pod's folder: read, or refused and counted by the scan
            counts[FLAT_LAYOUT if kind != DIR and is_plugin_file_name(name) else NOT_A_POD_FOLDER] += 1
        self.stats.unattributed = counts
        if counts[FLAT_LAYOUT] and not self._warned_flat:
            self._warned_flat = True
            log.warning(
                "%d NCCL Inspector file(s) directly under %s (NCCL_INSPECTOR_DUMP_DIR shared by pods): not read, "
                "a file there names no pod that can be trusted. Give each pod its own folder "
                "<namespace>_<pod>_<uid> (subPathExpr: $(POD_NAMESPACE)_$(POD_NAME)_$(POD_UID) from the downward API)",
                counts[FLAT_LAYOUT],
                self.root,
            )

    # -- JSON Lines ------------------------------------------------------------------

    def _poll_json(self, batch: InspectorBatch) -> None:
        tailed = self._tailer.poll()  # replayed heads were counted before the restart: not parsed
        records = 0
        for key, lines in tailed.lines.items():
            pod = (key.namespace, key.pod)
            for line in lines:
                parsed = parse_json_record(line)
                if isinstance(parsed, str):
                    self.stats.skip(parsed)
                else:
                    batch.add(pod, parsed)
                    records += 1
        self.stats.records[FORMAT_JSON] += records
        self.stats.read_bytes[FORMAT_JSON] = sum(self._tailer.stats.bytes_read.values())
        self.stats.files[FORMAT_JSON] = sum(self._tailer.stats.files.values())
        self._json_streams |= set(tailed.opened)
        self._json_streams -= set(tailed.removed)
        for key in self._json_streams:
            batch.pods_present.add((key.namespace, key.pod))

    # -- .prom files ------------------------------------------------------------------

    def _poll_prom(self, batch: InspectorBatch) -> None:
        now = self._clock()
        scan = self._prom_scanner.scan(now)
        found = sorted(scan.found, key=lambda c: c.key)
        over = {c.key for c in found[self.limits.max_prom_files :]}
        self.stats.skip("prom_file_cap", len(over - self._over_cap))
        self._over_cap = over
        found = found[: self.limits.max_prom_files]
        current = {c.key for c in found}
        for key in [k for k in self._prom if k not in current]:
            del self._prom[key]  # deleted at teardown: what it held stays counted
        self.stats.files[FORMAT_PROM] = len(found)
        budget = self.limits.prom_tick_bytes
        for cand in found:
            batch.pods_present.add((cand.key.namespace, cand.key.pod))
            version = (cand.dev, cand.ino, cand.size, cand.mtime)
            if self._prom.get(cand.key) == version:
                continue
            key = cand.key
            if self._first_poll or (key.source, key.namespace, key.pod, key.pod_uid) in scan.held_since_start:
                self._prom[cand.key] = version  # there at the start (its folder waited for the pod list)
                continue
            age = now - cand.mtime
            if age < self.limits.prom_settle_seconds or budget <= 0:
                continue  # being written, or no budget left this poll: next poll
            if cand.size > self.limits.max_prom_bytes:
                self.stats.skip("prom_too_large")
                self._prom[cand.key] = version
                continue
            data = read_at(cand.path, (cand.dev, cand.ino), 0, cand.size)
            after = regular_file(cand.path)
            if data is None or after is None or len(data) != cand.size:
                continue  # gone or changed under us: the next scan tells
            if (after.st_dev, after.st_ino, after.st_size, after.st_mtime) != version:
                continue
            budget -= len(data)
            self.stats.read_bytes[FORMAT_PROM] += len(data)
            if data and not data.endswith(b"\n"):
                if age >= self.limits.prom_incomplete_seconds:
                    self.stats.skip(f"prom_{INCOMPLETE}")
                    self._prom[cand.key] = version
                continue  # a writer between two writes: wait for the rest
            self._prom[cand.key] = version
            parsed = parse_prom(data.decode("utf-8", "replace"))
            for reason, count in parsed.skipped.items():
                self.stats.skip(reason, count)
            pod = (cand.key.namespace, cand.key.pod)
            for operation in parsed.operations:
                batch.add(pod, operation)
            self.stats.records[FORMAT_PROM] += len(parsed.operations)

"""Finding the files to tail: folder listings reused while unchanged, folders bound to the pods
of this node, symlinks never followed, every listing capped.

Who may speak for a pod differs by root. Pod-log folders are named by kubelet (tenants cannot
write ``/var/log/pods``): with a complete pod list a folder whose pod is not on the node, or has
another UID, is refused; without one every folder is read as it is named. Debug-file folders
(and the NCCL Inspector's, read with the same scanner) are named by whoever can write the
hostPath, so a folder speaks for a pod only through that pod's UID: ``<namespace>_<pod>_<uid>``
is read when the node's pod list holds that pod with that UID; a folder without a UID is never
read (``pod_uid_missing``), one whose pod the complete list does not hold is refused
(``pod_not_on_node``, ``pod_uid_mismatch``), and while the list is not complete (the API is
down, or not listed yet at start) only folders already bound in this run go on being read, new
ones wait (``pod_list_unavailable``). A tailer built without a ``pod_known`` predicate (an
exporter without a node name, hence no pod list; tests, tools) reads every folder that carries
a UID.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from exporter.sources.podlogs.layout import (
    SOURCE_DEBUG_FILE,
    SOURCE_POD_LOG,
    PodKnown,
    StreamKey,
    is_debug_file_name,
    is_debug_folder_name,
    is_pod_folder_name,
    is_pod_log_name,
    parse_debug_folder,
    parse_pod_folder,
    pod_log_compressed_generation,
    pod_log_generation,
)
from exporter.sources.podlogs.limits import TailLimits, TailStats

log = logging.getLogger(__name__)

Folder = tuple[str, str, str, str]  # (source, namespace, pod, uid) of a pod's folder


@dataclass
class Candidate:
    """A file found by a scan: its stream, identity and size."""

    key: StreamKey
    path: Path
    order: str
    dev: int
    ino: int
    size: int
    mtime: float


@dataclass
class Scan:
    """What one scan found."""

    found: list[Candidate] = field(default_factory=list)
    compressed: dict[StreamKey, list[str]] = field(default_factory=dict)  # .gz names per pod-log stream
    refused: set[Folder] = field(default_factory=set)
    # Folders bound at this scan that waited for the pod list since the first scan: what they
    # hold was there at the start (read as a stream found at the first scan is).
    held_since_start: set[Folder] = field(default_factory=set)


def resolved(root: Path | None) -> Path | None:
    """A root with its own symlinks resolved (the root itself may be a link; nothing below)."""
    return None if root is None else Path(os.path.realpath(root))


# Kinds of directory entries, as listed (no symlink is followed to tell)
DIR, FILE, LINK = "d", "f", "l"


@dataclass(frozen=True)
class Listing:
    entries: tuple[tuple[str, str], ...] = ()  # (name, kind), sorted
    rejected: int = 0  # entries whose names the folder's filter refused
    cut: bool = False  # more entries than max_listed_entries_per_folder: the rest not looked at


class FolderCache:
    """Directory listings reused while a folder's mtime is unchanged (and not recent)."""

    def __init__(self, limits: TailLimits) -> None:
        self._limits = limits
        self._entries: dict[Path, tuple[int, int, Listing]] = {}

    def list(
        self, folder: Path, now: float, keep: Callable[[str], bool] | None = None, room: int | None = None
    ) -> Listing:
        """Entries of ``folder`` whose names pass ``keep``, at most ``room`` (the listing is
        ``cut`` when there are more); empty when it is unreadable or is not a directory (a
        symlink to one is not followed). One folder is always listed with the same ``keep``."""
        room = self._limits.max_listed_entries_per_folder if room is None else room
        try:
            st = os.lstat(folder)
        except OSError:
            self._entries.pop(folder, None)
            return Listing()
        if not stat.S_ISDIR(st.st_mode):
            self._entries.pop(folder, None)
            return Listing()
        cached = self._entries.get(folder)
        recent = now - st.st_mtime < self._limits.relist_recent_seconds
        if cached is not None and cached[0] == st.st_mtime_ns and not recent:
            if cached[1] >= room or not cached[2].cut:  # listed with as much room, or all there is
                return cached[2]
        entries: list[tuple[str, str]] = []
        rejected = looked = 0
        cut = False
        try:
            with os.scandir(folder) as it:
                for entry in it:
                    looked += 1
                    if looked > self._limits.max_listed_entries_per_folder:
                        cut = True
                        break
                    if keep is not None and not keep(entry.name):
                        rejected += 1
                        continue
                    if len(entries) >= room:
                        cut = True
                        break
                    try:
                        kind = LINK if entry.is_symlink() else DIR if entry.is_dir(follow_symlinks=False) else FILE
                    except OSError:
                        continue
                    entries.append((entry.name, kind))
        except OSError:
            return Listing()
        entries.sort()
        listing = Listing(tuple(entries), rejected, cut)
        self._entries[folder] = (st.st_mtime_ns, room, listing)
        return listing

    def forget_missing(self, seen: set[Path]) -> None:
        for folder in [f for f in self._entries if f not in seen]:
            del self._entries[folder]


def _is_folder(name: str, kind: str) -> bool:
    return kind == DIR


def _is_file(name: str, kind: str) -> bool:
    return kind == FILE


def _any_entry(name: str, kind: str) -> bool:
    return True


class Scanner:
    """Lists the pod-log and debug-file roots (``scan``) within the folder caps, counting what
    it does not read in ``stats``."""

    def __init__(
        self,
        pod_logs: Path | None,
        debug_files: Path | None,
        limits: TailLimits,
        stats: TailStats,
        pod_known: PodKnown | None,
        folders: FolderCache,
        debug_file_name: Callable[[str], bool] = is_debug_file_name,
    ) -> None:
        self.pod_logs = pod_logs
        self.debug_file_name = debug_file_name
        self.debug_files = debug_files
        self.limits = limits
        self.stats = stats
        self.pod_known = pod_known
        self.folders = folders
        # (reason, what) counted at the last scan, and at this one: counted once while it lasts
        self._noticed: set[tuple[str, str]] = set()
        self._noticing: set[tuple[str, str]] = set()
        # Tenant-written folders bound to a pod of the node at the last scan, and at this one
        self._bound_before: set[Folder] = set()
        self._bound_now: set[Folder] = set()
        # Folders waiting for the pod list since the first scan (None: the first scan is to come)
        self._held_from_start: set[Folder] | None = None
        self._held_now: set[Folder] = set()
        self._warned_uid_missing = False

    def _notice(self, reason: str, what: str) -> None:
        """Count ``reason`` once for ``what`` while it lasts (in consecutive scans)."""
        item = (reason, what)
        if item in self._noticing:
            return
        self._noticing.add(item)
        if item not in self._noticed:
            self.stats.event(reason)
            if reason == "folder_cap":
                log.warning("%s holds more entries than the tailer examines; the rest are not read", what)

    def _bound(self, source: str, namespace: str, pod: str, uid: str, folder_name: str, scan: Scan) -> bool:
        """Whether a folder may speak for the pod it names (see the module docstring)."""
        folder = (source, namespace, pod, uid)
        if source == SOURCE_POD_LOG:
            answer = None if self.pod_known is None else self.pod_known(namespace, pod, uid)
            if answer is not False:
                return True
        elif not uid:
            self._notice("pod_uid_missing", f"{source}:{folder_name}")
            if not self._warned_uid_missing:
                self._warned_uid_missing = True
                log.warning(
                    "folder %s under %s names no pod UID: not read. Name each pod's folder "
                    "<namespace>_<pod>_<uid> (subPathExpr: $(POD_NAMESPACE)_$(POD_NAME)_$(POD_UID) from the "
                    "downward API)",
                    folder_name,
                    self.debug_files,
                )
            scan.refused.add(folder)
            return False
        else:
            answer = True if self.pod_known is None else self.pod_known(namespace, pod, uid)
            if answer is None and folder in self._bound_before:
                answer = True  # bound while the list was complete: a pod list outage stops nothing
            if answer is True:
                self._bound_now.add(folder)
                if self._held_from_start is not None and folder in self._held_from_start:
                    scan.held_since_start.add(folder)
                return True
            if answer is None:
                self._notice("pod_list_unavailable", f"{source}:{folder_name}")
                self._held_now.add(folder)
                return False
        mismatch = bool(uid) and self.pod_known is not None and self.pod_known(namespace, pod, "") is True
        self._notice("pod_uid_mismatch" if mismatch else "pod_not_on_node", f"{source}:{folder_name}")
        scan.refused.add(folder)
        return False

    def _examine(
        self, folder: Path, listing: Listing, wanted: Callable[[str, str], bool], cap: int | None = None
    ) -> list[tuple[str, str]]:
        """The entries of a listing that ``wanted`` keeps, at most ``cap`` (default
        ``max_entries_per_folder``) in name order; symlinks are never kept. A cut listing is
        counted (``folder_cap``)."""
        cap = self.limits.max_entries_per_folder if cap is None else cap
        kept: list[tuple[str, str]] = []
        cut = listing.cut
        for name, kind in listing.entries:
            if kind == LINK:
                self._notice("symlink", str(folder / name))
                continue
            if not wanted(name, kind):
                continue
            if len(kept) >= cap:
                cut = True
                break
            kept.append((name, kind))
        if cut:
            self._notice("folder_cap", str(folder))
        return kept

    def scan(self, now: float) -> Scan:
        """The files of both roots, the compressed rotations of each pod-log stream, and the
        pods whose folders were refused."""
        scan = Scan()
        seen_folders: set[Path] = set()
        root = resolved(self.pod_logs)
        if root is not None:
            seen_folders.add(root)

            def bound_pod(name: str, kind: str) -> bool:
                parsed = parse_pod_folder(name)
                return kind == DIR and parsed is not None and self._bound(SOURCE_POD_LOG, *parsed, name, scan)

            for pod_name, _ in self._examine(root, self.folders.list(root, now, is_pod_folder_name), bound_pod):
                pod_dir = root / pod_name
                seen_folders.add(pod_dir)
                listing = self.folders.list(pod_dir, now, room=self.limits.max_entries_per_folder)
                for container, _ in self._examine(pod_dir, listing, _is_folder):
                    container_dir = pod_dir / container
                    seen_folders.add(container_dir)
                    self._scan_container(scan, container_dir, parse_pod_folder(pod_name) or ("", "", ""), now)
        unattributed = 0
        root = resolved(self.debug_files)
        if root is not None:
            seen_folders.add(root)
            listing = self.folders.list(root, now, is_debug_folder_name)
            unattributed = listing.rejected + sum(1 for _, kind in listing.entries if kind == FILE)

            def bound_folder(name: str, kind: str) -> bool:
                parsed = parse_debug_folder(name)
                return kind == DIR and parsed is not None and self._bound(SOURCE_DEBUG_FILE, *parsed, name, scan)

            for folder_name, _ in self._examine(root, listing, bound_folder):
                namespace, pod, uid = parse_debug_folder(folder_name) or ("", "", "")
                folder = root / folder_name
                seen_folders.add(folder)
                budget = [self.limits.max_entries_per_debug_folder]
                for rel in self._walk(folder, now, 3, seen_folders, budget):
                    key = StreamKey(SOURCE_DEBUG_FILE, namespace, pod, uid, "", rel)
                    self._add_candidate(scan.found, key, folder / rel, "~")
        self.folders.forget_missing(seen_folders)
        self.stats.unattributed_files = unattributed
        self._noticed, self._noticing = self._noticing, set()
        self._bound_before, self._bound_now = self._bound_now, set()
        if self._held_from_start is None:
            self._held_from_start = set(self._held_now)
        else:
            self._held_from_start &= self._held_now
        self._held_now = set()
        return scan

    def _scan_container(self, scan: Scan, container_dir: Path, pod: tuple[str, str, str], now: float) -> None:
        """The plain files of a container folder as candidates, its .gz names per stream."""
        namespace, name, uid = pod
        listing = self.folders.list(container_dir, now, is_pod_log_name, self.limits.max_entries_per_folder)
        for file_name, _ in self._examine(container_dir, listing, _is_file):
            generation = pod_log_generation(file_name)
            if generation is not None:
                key = StreamKey(SOURCE_POD_LOG, namespace, name, uid, container_dir.name, generation[0])
                self._add_candidate(scan.found, key, container_dir / file_name, generation[1] or "~")
                continue
            compressed = pod_log_compressed_generation(file_name)
            if compressed is not None:
                key = StreamKey(SOURCE_POD_LOG, namespace, name, uid, container_dir.name, compressed[0])
                scan.compressed.setdefault(key, []).append(file_name)

    def _walk(
        self, folder: Path, now: float, depth: int, seen: set[Path], budget: list[int], prefix: str = ""
    ) -> Iterable[str]:
        """Files below a debug-file folder (``depth`` levels), in name order, within one
        entry budget for the whole pod folder: a deep or wide tree costs a bounded listing."""
        listing = self.folders.list(folder, now, is_debug_file_name, max(budget[0], 0))
        for name, kind in self._examine(folder, listing, _any_entry, max(budget[0], 0)):
            if budget[0] <= 0:  # spent in a subfolder
                self._notice("folder_cap", str(folder))
                return
            budget[0] -= 1
            if kind == DIR:
                if depth > 1:
                    seen.add(folder / name)
                    yield from self._walk(folder / name, now, depth - 1, seen, budget, f"{prefix}{name}/")
            elif self.debug_file_name(name):
                yield prefix + name

    def _add_candidate(self, found: list[Candidate], key: StreamKey, path: Path, order: str) -> None:
        try:
            st = os.lstat(path)
        except OSError:
            return
        if stat.S_ISLNK(st.st_mode):  # swapped in after the folder was listed
            self._notice("symlink", str(path))
            return
        if not stat.S_ISREG(st.st_mode):
            return
        found.append(Candidate(key, path, order, st.st_dev, st.st_ino, st.st_size, st.st_mtime))

"""Probe and pre-flight result files in ``--path.probe-results`` (a hostPath on the node).

Written by ``ccl-exporter probe`` (scheduled by the exporter, or run by a probe Job) and by
``ccl-exporter preflight`` init containers; format in ``exporter.results.probe_file``. Any pod with
the hostPath can write here, so every file is read defensively: hidden and temporary files
are ignored, symlinks and non-regular files are refused, a file over 1 MiB or one that does
not parse is *malformed*, a result older than ``max_age_seconds`` is *stale*; each is
skipped and counted, never a crash. At most ``max_files`` files (the newest) are read.

**Who a result speaks for.** A pre-flight or probe-Job result names the pod that ran it, and
whoever can write the folder can name any pod; so a result is *attributed* to a pod only
through the pod's UID, and only to a pod the node runs. Each file that is not is listed in
``unattributed`` with its reason, never credited to anyone:

* ``pod_uid_missing``: it names a pod but no pod UID (an older writer, or no ``CCL_POD_UID``);
* ``name_mismatch``: its file name is not the one its content gives
  (``<source>-<namespace>-<pod>-<uid>.json``): one name per pod object, so a file cannot sit
  beside the pod's own (whose writer's numeric UID the folder's sticky bit protects from
  writers of another UID) and outrank it;
* with a ``pod_known`` predicate (``exporter.sources.podlogs.PodKnown``, from the node's pod
  list): ``not_on_node`` (the complete list has no such pod), ``pod_uid_mismatch`` (it has the
  pod with another UID: a deleted pod of the same name, or a forgery), and while the list is
  not complete ``pod_list_unavailable`` (unless the same file was attributed at an earlier
  reading with this ``ParseCache``: an outage of the API takes nothing away);
* ``foreign_owner``: a ``scheduled`` result (node-wide, written by the exporter itself) in a
  file the exporter's user does not own.

Without a ``pod_known`` predicate (an exporter without a node name, hence no pod list; a probe
collector whose results are not bound to the node's pods; tools) a result with a UID and its own
file name is used as it says. Results without a pod (probe Jobs without the downward API) are
node-wide and not bound.

Scrapes come every few seconds and files rarely change: pass a ``ParseCache`` (owned by the
caller, one per folder) and a file is parsed again only when its inode, size, mtime or owner
changed. The cache holds only the files of the last reading.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from exporter.results.probe_file import (
    MAX_FILE_BYTES,
    SUFFIX,
    MalformedResult,
    ProbeResult,
    parse_result,
    result_filename,
)

DEFAULT_MAX_FILES = 256
# Why a result was not attributed (a value of ccl_probe_result_files{status}).
NOT_ON_NODE = "not_on_node"
POD_UID_MISSING = "pod_uid_missing"
POD_UID_MISMATCH = "pod_uid_mismatch"
NAME_MISMATCH = "name_mismatch"
POD_LIST_UNAVAILABLE = "pod_list_unavailable"
FOREIGN_OWNER = "foreign_owner"
UNATTRIBUTED_REASONS = (
    NOT_ON_NODE,
    POD_UID_MISSING,
    POD_UID_MISMATCH,
    NAME_MISMATCH,
    POD_LIST_UNAVAILABLE,
    FOREIGN_OWNER,
)

# (inode, size, mtime_ns, owner uid) of a file
FileKey = tuple[int, int, int, int]


@dataclass
class CachedFile:
    key: FileKey
    parsed: ProbeResult | MalformedResult
    attributed: bool = False  # its pod was on this node, with its UID, at the last complete pod list


# file name -> what was read from it (see the module docstring)
ParseCache = dict[str, CachedFile]


@dataclass
class ProbeResultsReading:
    results: list[ProbeResult] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)  # file names
    malformed: list[tuple[str, str]] = field(default_factory=list)  # (file name, reason)
    not_read: int = 0  # files beyond max_files
    unattributed: list[tuple[str, str]] = field(default_factory=list)  # (file name, one of UNATTRIBUTED_REASONS)
    folder_present: bool = False

    @property
    def not_on_node(self) -> list[str]:
        """File names of results naming a pod the node's complete pod list does not hold."""
        return [name for name, reason in self.unattributed if reason == NOT_ON_NODE]

    def unattributed_by_reason(self) -> dict[str, int]:
        counts = dict.fromkeys(UNATTRIBUTED_REASONS, 0)
        for _, reason in self.unattributed:
            counts[reason] += 1
        return counts


def _read_bounded(path: Path) -> str:
    """The file's text; ``MalformedResult`` for symlinks, non-files and oversized files."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise MalformedResult(f"cannot open: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise MalformedResult("not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            raise MalformedResult(f"{info.st_size} bytes, over the {MAX_FILE_BYTES} byte limit")
        data = os.read(fd, MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise MalformedResult(f"cannot read: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise MalformedResult(f"over the {MAX_FILE_BYTES} byte limit")
    return data.decode("utf-8", errors="replace")


def _stat_key(path: Path) -> FileKey:
    try:
        info = os.lstat(path)
    except OSError:
        return (0, 0, 0, -1)
    return (info.st_ino, info.st_size, info.st_mtime_ns, info.st_uid)


def _parse(path: Path) -> ProbeResult | MalformedResult:
    try:
        return parse_result(_read_bounded(path))
    except MalformedResult as exc:
        return exc


def _attribution(
    name: str, entry: CachedFile, result: ProbeResult, pod_known: Callable[[str, str, str], bool | None] | None
) -> str | None:
    """Why ``result`` (read from file ``name``) speaks for nobody; None when it may be used."""
    if result.source == "scheduled":
        return FOREIGN_OWNER if entry.key[3] != os.geteuid() else None
    if not result.pod:
        return None  # node-wide
    if not result.pod_uid:
        return POD_UID_MISSING
    if name != result_filename(result):
        return NAME_MISMATCH
    if pod_known is None:
        return None
    answer = pod_known(result.namespace, result.pod, result.pod_uid)
    if answer is True:
        entry.attributed = True
        return None
    if answer is None:
        return None if entry.attributed else POD_LIST_UNAVAILABLE
    entry.attributed = False
    return POD_UID_MISMATCH if pod_known(result.namespace, result.pod, "") is True else NOT_ON_NODE


def read_probe_results(
    folder: Path,
    now: float,
    max_age_seconds: float,
    max_files: int = DEFAULT_MAX_FILES,
    cache: ParseCache | None = None,
    pod_known: Callable[[str, str, str], bool | None] | None = None,
) -> ProbeResultsReading:
    """Every usable result in ``folder``; stale, malformed and unattributed files listed, not raised."""
    reading = ProbeResultsReading(folder_present=folder.is_dir())
    cache = {} if cache is None else cache
    try:
        names = [n for n in os.listdir(folder) if n.endswith(SUFFIX) and not n.startswith(".")]
    except OSError:
        cache.clear()
        return reading
    keys = {name: _stat_key(folder / name) for name in names}
    ordered = sorted(names, key=lambda n: (-keys[n][2], n))  # newest first
    reading.not_read = max(0, len(ordered) - max_files)
    kept = ordered[:max_files]
    for name in set(cache) - set(kept):
        del cache[name]
    for name in kept:
        entry = cache.get(name)
        if entry is None or entry.key != keys[name] or keys[name][3] < 0:
            entry = CachedFile(keys[name], _parse(folder / name))
            cache[name] = entry
        result = entry.parsed
        if isinstance(result, MalformedResult):
            reading.malformed.append((name, str(result)))
            continue
        reason = _attribution(name, entry, result, pod_known)
        if reason is not None:
            reading.unattributed.append((name, reason))
            continue
        if now - result.finished_at > max_age_seconds:
            reading.stale.append(name)
            continue
        reading.results.append(result)
    reading.results.sort(key=lambda r: (r.source, r.namespace, r.pod, r.finished_at))
    return reading

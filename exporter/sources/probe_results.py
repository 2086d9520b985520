"""Probe and pre-flight result files in ``--path.probe-results`` (a hostPath on the node).

Written by ``ccl-exporter probe`` (scheduled by the exporter, or run by a probe Job) and by
``ccl-exporter preflight`` init containers; format in ``exporter.results``. Any pod with
the hostPath can write here, so every file is read defensively: hidden and temporary files
are ignored, symlinks and non-regular files are refused, a file over 1 MiB or one that does
not parse is *malformed*, a result older than ``max_age_seconds`` is *stale*; each is
skipped and counted, never a crash. At most ``max_files`` files (the newest) are read.

A pre-flight or probe-Job result names the pod that wrote it, and anyone who can write the
folder can name any pod. With a ``pod_known`` predicate (``exporter.sources.podlogs.PodKnown``,
from the node's pod list) a result naming a pod that is not on this node is not used while
the pod list is complete (*not_on_node*); without a complete list it is used as it says.
Results without a pod (scheduled probes) are node-wide and not bound.

Scrapes come every few seconds and files rarely change: pass a ``ParseCache`` (owned by the
caller, one per folder) and a file is parsed again only when its inode, size or mtime
changed. The cache holds only the files of the last reading.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from exporter.results import MAX_FILE_BYTES, SUFFIX, MalformedResult, ProbeResult, parse_result

DEFAULT_MAX_FILES = 256

# file name -> ((inode, size, mtime_ns), the parsed result or why it is malformed)
ParseCache = dict[str, tuple[tuple[int, int, int], "ProbeResult | MalformedResult"]]


@dataclass
class ProbeResultsReading:
    results: list[ProbeResult] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)  # file names
    malformed: list[tuple[str, str]] = field(default_factory=list)  # (file name, reason)
    not_read: int = 0  # files beyond max_files
    not_on_node: list[str] = field(default_factory=list)  # file names of results naming a pod not on this node
    folder_present: bool = False


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


def _stat_key(path: Path) -> tuple[int, int, int]:
    try:
        info = os.lstat(path)
    except OSError:
        return (0, 0, 0)
    return (info.st_ino, info.st_size, info.st_mtime_ns)


def _parse(path: Path) -> ProbeResult | MalformedResult:
    try:
        return parse_result(_read_bounded(path))
    except MalformedResult as exc:
        return exc


def read_probe_results(
    folder: Path,
    now: float,
    max_age_seconds: float,
    max_files: int = DEFAULT_MAX_FILES,
    cache: ParseCache | None = None,
    pod_known: Callable[[str, str, str], bool | None] | None = None,
) -> ProbeResultsReading:
    """Every usable result in ``folder``; stale, malformed and unbound files listed, not raised."""
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
        cached = cache.get(name)
        if cached is None or cached[0] != keys[name] or keys[name] == (0, 0, 0):
            cached = (keys[name], _parse(folder / name))
            cache[name] = cached
        result = cached[1]
        if isinstance(result, MalformedResult):
            reading.malformed.append((name, str(result)))
            continue
        if result.pod and pod_known is not None and pod_known(result.namespace, result.pod, "") is False:
            reading.not_on_node.append(name)
            continue
        if now - result.finished_at > max_age_seconds:
            reading.stale.append(name)
            continue
        reading.results.append(result)
    reading.results.sort(key=lambda r: (r.source, r.namespace, r.pod, r.finished_at))
    return reading

"""``process_*``: the exporter's own CPU, memory, start time and file descriptors.

The same families as client_python's ``ProcessCollector`` (names, help, types and values; a test
holds the two together), with one difference: the open descriptors are counted from the size
of ``/proc/self/fd``, which Linux 6.2 and later report as the number of open descriptors
(checked once against a listing at start), instead of by listing the folder on every scrape.
The RDMA collector keeps a few hundred sysfs files open between scrapes, and listing them on
every scrape cost more than reading them. Where the size is not a count (older kernels report
0), the folder is listed, as client_python does.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Iterable

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

PREFIX = "process_"


class ProcessMetrics:
    """A client_python collector of this process's ``process_*`` metrics, read from ``proc``."""

    def __init__(self, proc: str = "/proc") -> None:
        self._self = os.path.join(proc, "self")
        self._ticks = float(os.sysconf("SC_CLK_TCK"))
        self._page_size = resource.getpagesize()
        self._boot_time = _boot_time(proc)
        self._fd_folder = os.path.join(self._self, "fd")
        self._size_counts = _size_counts(self._fd_folder)

    def collect(self) -> Iterable[Metric]:
        if self._boot_time is None:
            return []
        result: list[Metric] = []
        try:
            with open(os.path.join(self._self, "stat"), "rb") as stat:
                parts = stat.read().split(b")")[-1].split()
            result += [
                GaugeMetricFamily(
                    PREFIX + "virtual_memory_bytes", "Virtual memory size in bytes.", value=float(parts[20])
                ),
                GaugeMetricFamily(
                    PREFIX + "resident_memory_bytes",
                    "Resident memory size in bytes.",
                    value=float(parts[21]) * self._page_size,
                ),
                GaugeMetricFamily(
                    PREFIX + "start_time_seconds",
                    "Start time of the process since unix epoch in seconds.",
                    value=float(parts[19]) / self._ticks + self._boot_time,
                ),
                CounterMetricFamily(
                    PREFIX + "cpu_seconds_total",
                    "Total user and system CPU time spent in seconds.",
                    value=float(parts[11]) / self._ticks + float(parts[12]) / self._ticks,
                ),
            ]
        except (OSError, IndexError, ValueError):
            pass
        try:
            result.append(
                GaugeMetricFamily(PREFIX + "open_fds", "Number of open file descriptors.", self.open_descriptors())
            )
            limit = _max_open_files(os.path.join(self._self, "limits"))
        except OSError:
            return result
        if limit is not None:
            result.append(
                GaugeMetricFamily(PREFIX + "max_fds", "Maximum number of open file descriptors.", value=limit)
            )
        return result

    def open_descriptors(self) -> int:
        """How many descriptors this process has open: the size of ``fd/`` where it counts them
        (Linux 6.2+), else a listing of it. Raises OSError when neither can be read."""
        if self._size_counts:
            return os.stat(self._fd_folder).st_size
        return len(os.listdir(self._fd_folder))


def _size_counts(folder: str) -> bool:
    """Whether the size of ``folder`` (a process's ``fd/``) is its number of entries: on procfs
    since Linux 6.2; 0 on older kernels, a block size on any other file system. The listing
    holds one descriptor of its own while it reads."""
    try:
        size = os.stat(folder).st_size
        listed = len(os.listdir(folder))
    except OSError:
        return False
    return size > 0 and abs(listed - size) <= 1


def _boot_time(proc: str) -> float | None:
    try:
        with open(os.path.join(proc, "stat"), "rb") as stat:
            for line in stat:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return None


def _max_open_files(path: str) -> float | None:
    """The soft limit on open files from a ``limits`` file; None when absent or "unlimited"."""
    with open(path, "rb") as limits:
        for line in limits:
            if line.startswith(b"Max open file"):
                fields = line.split()
                return float(fields[3]) if len(fields) > 3 and fields[3].isdigit() else None
    return None

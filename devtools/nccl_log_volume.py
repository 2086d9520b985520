"""What NCCL's INFO lines weigh: bytes per rank and communicator init, measured in NCCL logs.

``python -m devtools.nccl_log_volume [PATH ...]`` (files or folders of ``*.log``; default: the
real public logs of ``tests/fixtures/nccl/public``, not the logs written here from NCCL's format
strings, which would measure ourselves) prints a Markdown table, one row
per log whose processes show a whole communicator init, then one row per NCCL version.

Each record is counted as NCCL writes it at ``NCCL_DEBUG=INFO``: ``host:pid:tid [dev] NCCL INFO
<message>`` and a newline, whatever wraps it in the file (a CRI prefix, launcher tags: the pod log
adds its own, see ``CRI_BYTES_PER_LINE``). A process counts when it logged a communicator's
``Init START`` and its ``Init COMPLETE``; its records are split into connection lines
(``Channel NN/N : a -> b ... via ...``, one per channel and peer) and the rest, and divided by
the communicators it completed (a rank-init). Channels are the most that a channel summary or a
connection line of the process shows. Logs that were cut to excerpts give lower bounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from exporter.nccl.events import ChannelSummaryEvent, CommInitEvent, ConnectionEvent, VersionEvent
from exporter.nccl.grammar import parse_message
from exporter.nccl.records import split_records

REPO = Path(__file__).resolve().parent.parent
DEFAULT_PATHS = (REPO / "tests" / "fixtures" / "nccl" / "public",)
# What the kubelet adds to every line of a pod log: "<RFC 3339 time with nanoseconds> stdout F ".
CRI_BYTES_PER_LINE = len("2025-01-01T00:00:00.000000000Z stdout F ")


@dataclass
class ProcessLines:
    """One process's NCCL INFO records in one log."""

    bytes: int = 0
    lines: int = 0
    connection_bytes: int = 0
    connection_lines: int = 0
    channels: int = 0
    started: set[str] = field(default_factory=set)  # comm pointers with Init START
    completed: set[str] = field(default_factory=set)  # ... and with Init COMPLETE


@dataclass(frozen=True)
class Measurement:
    """Per rank-init figures of one log (or of one NCCL version's logs together)."""

    name: str
    version: str
    rank_inits: int
    bytes: float
    lines: float
    connection_lines: float
    channels: int
    bytes_per_connection_line: float
    bytes_per_other_line: float


def measure_lines(name: str, lines: Iterable[str]) -> Measurement | None:
    """The log's figures, or None when no process shows a whole communicator init."""
    processes: dict[tuple[str, int], ProcessLines] = {}
    version = ""
    for line in lines:
        for record in split_records(line.rstrip("\r\n")):
            event = parse_message(record.message)
            if isinstance(event, VersionEvent) and not version:
                version = event.version
            prefix = record.prefix
            if prefix is None or record.level != "INFO":
                continue
            size = len(f"{prefix.host}:{prefix.pid}:{prefix.tid} [{prefix.cuda_dev}] NCCL INFO {record.message}\n")
            process = processes.setdefault((prefix.host, prefix.pid), ProcessLines())
            process.bytes += size
            process.lines += 1
            if isinstance(event, ConnectionEvent):
                process.connection_bytes += size
                process.connection_lines += 1
                process.channels = max(process.channels, event.channel + 1)
            elif isinstance(event, ChannelSummaryEvent):
                process.channels = max(process.channels, event.coll_channels)
            elif isinstance(event, CommInitEvent) and event.phase == "START":
                process.started.add(event.pointer)
            elif isinstance(event, CommInitEvent) and event.phase == "COMPLETE":
                process.completed.add(event.pointer)
    whole = [p for p in processes.values() if p.started & p.completed]
    return _combine(name, version or "unknown", whole) if whole else None


def _combine(name: str, version: str, processes: Sequence[ProcessLines]) -> Measurement:
    inits = sum(len(p.completed) for p in processes)
    connection_lines = sum(p.connection_lines for p in processes)
    other_lines = sum(p.lines for p in processes) - connection_lines
    connection_bytes = sum(p.connection_bytes for p in processes)
    other_bytes = sum(p.bytes for p in processes) - connection_bytes
    return Measurement(
        name=name,
        version=version,
        rank_inits=inits,
        bytes=sum(p.bytes for p in processes) / inits,
        lines=sum(p.lines for p in processes) / inits,
        connection_lines=connection_lines / inits,
        channels=max(p.channels for p in processes),
        bytes_per_connection_line=connection_bytes / connection_lines if connection_lines else 0.0,
        bytes_per_other_line=other_bytes / other_lines if other_lines else 0.0,
    )


def by_version(measurements: Sequence[Measurement]) -> list[Measurement]:
    """One row per NCCL version: the median of its logs' per rank-init figures."""
    versions: dict[str, list[Measurement]] = {}
    for found in measurements:
        versions.setdefault(found.version, []).append(found)
    rows = []
    for version, found in sorted(versions.items()):
        rows.append(
            Measurement(
                name=f"{len(found)} log(s)",
                version=version,
                rank_inits=sum(m.rank_inits for m in found),
                bytes=statistics.median(m.bytes for m in found),
                lines=statistics.median(m.lines for m in found),
                connection_lines=statistics.median(m.connection_lines for m in found),
                channels=max(m.channels for m in found),
                bytes_per_connection_line=statistics.median(
                    m.bytes_per_connection_line for m in found if m.bytes_per_connection_line
                )
                if any(m.bytes_per_connection_line for m in found)
                else 0.0,
                bytes_per_other_line=statistics.median(m.bytes_per_other_line for m in found),
            )
        )
    return rows


def log_files(paths: Iterable[Path]) -> list[Path]:
    found: list[Path] = []
    for path in paths:
        found.extend(sorted(path.rglob("*.log")) if path.is_dir() else [path])
    return found


def measure_files(paths: Iterable[Path]) -> list[Measurement]:
    measurements = []
    for path in log_files(paths):
        with path.open(encoding="utf-8", errors="replace") as lines:
            found = measure_lines(str(path.relative_to(REPO) if path.is_relative_to(REPO) else path), lines)
        if found is not None:
            measurements.append(found)
    return measurements


def table(rows: Sequence[Measurement], first: str) -> str:
    head = (
        f"| {first} | NCCL | rank-inits | bytes | lines | connection lines | channels "
        "| bytes per connection line | bytes per other line |\n|---|---|---|---|---|---|---|---|---|\n"
    )
    return head + "".join(
        f"| {m.name} | {m.version} | {m.rank_inits} | {m.bytes:.0f} | {m.lines:.1f} | {m.connection_lines:.1f} "
        f"| {m.channels} | {m.bytes_per_connection_line:.0f} | {m.bytes_per_other_line:.0f} |\n"
        for m in rows
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.nccl_log_volume", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path, default=list(DEFAULT_PATHS), help="log files or folders")
    args = parser.parse_args(argv)
    measurements = measure_files(args.paths)
    if not measurements:
        print("no log shows a whole communicator init", file=sys.stderr)
        return 1
    print("Per rank and communicator init (rank-init), as NCCL writes its INFO records:\n")
    print(table(measurements, "log"))
    print(table(by_version(measurements), "logs"))
    print(f"A pod log adds {CRI_BYTES_PER_LINE} bytes per line (the CRI time, stream and tag).")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The tailer's bounds (``TailLimits``), what it counts (``TailStats``) and what one poll hands
back (``TailBatch``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from exporter.sources.podlogs.layout import SOURCE_DEBUG_FILE, SOURCE_POD_LOG, StreamKey, is_debug_file_name

# The caller's small note about a stream (its counters), saved with the stream's offsets as JSON.
StreamNote = dict[str, Any]


# Every line the NCCL logger writes carries this word in its prefix.
NCCL_NEEDLE = b"NCCL"


@dataclass(frozen=True)
class TailSelection:
    """What one tailer reads: the files of a debug-file folder it follows, the lines it hands
    back (those containing ``needle``) and the name of its state file, so that a second tailer
    (NCCL Inspector output, say) shares the code but neither the files nor the offsets."""

    needle: bytes = NCCL_NEEDLE
    debug_file_name: Callable[[str], bool] = is_debug_file_name
    state_file_name: str = "podlogs-state.json"


@dataclass(frozen=True)
class TailLimits:
    """Every bound of the tailer; the defaults suit a node with ~100 pods."""

    tick_bytes: int = 16 * 1024 * 1024  # read at most this much per poll, all files together
    # Lines handed back per poll, all streams together: what the caller parses per poll (the NCCL
    # analyzer takes up to ~25 us for a line it must parse), so one poll stays well under a second
    # whatever a pod prints. Shared like tick_bytes: a fair share per turn, round-robin.
    tick_lines: int = 16384
    min_turn_lines: int = 64  # a turn may hand back at least this many lines (one NCCL init burst)
    # of tick_bytes (at most half), kept for debug files while they have bytes waiting
    debug_file_tick_bytes: int = 4 * 1024 * 1024
    file_chunk_bytes: int = 1024 * 1024  # at most per read (one file, one turn)
    start_bytes: int = 4 * 1024 * 1024  # head of a stream read (or replayed) when first seen
    max_line_bytes: int = 64 * 1024  # a longer line (or joined P message) is cut to this
    max_streams_per_pod: int = 32
    max_streams: int = 512  # per source: pod-log streams and debug-file streams are capped apart
    max_entries_per_folder: int = 1024  # entries examined per folder (after the name and pod checks)
    max_listed_entries_per_folder: int = 16384  # directory entries looked at per listing
    max_entries_per_debug_folder: int = 256  # entries examined in one pod's debug-file folder, all depths
    relist_recent_seconds: float = 2.0  # folders modified this recently are listed every poll
    max_decompressed_bytes: int = 1024 * 1024 * 1024  # inflated from one .gz at most (a gzip bomb)
    max_compressed_readers: int = 16  # .gz rotations found while running, inflated at once (node-wide)


@dataclass
class TailStats:
    """Cumulative counters and current gauges of the tailer, for its health metrics."""

    # Bytes of each file read, each byte counted once (an unfinished line read again when
    # its newline comes, a replayed head, a checksum are not counted again).
    bytes_read: dict[str, int] = field(default_factory=lambda: {SOURCE_POD_LOG: 0, SOURCE_DEBUG_FILE: 0})
    lines: dict[str, int] = field(default_factory=lambda: {SOURCE_POD_LOG: 0, SOURCE_DEBUG_FILE: 0})
    # reason -> bytes not read: initial_cap (busy stream found at start), long_line (cut),
    # vanished (file gone before it was read to its end), pod_not_on_node (its folder no
    # longer bound to a pod of this node), and for a .gz resumed from saved state whatever was
    # left of it (its compressed bytes not inflated): gz_cap (past max_decompressed_bytes),
    # gz_corrupt, stream_evicted
    skipped_bytes: dict[str, int] = field(default_factory=dict)
    # reason -> count: long_line, stream_evicted, malformed_cri, truncated, replaced,
    # gz_cap, gz_corrupt (files), state_invalid (saved entries); and, once per folder or file
    # while the condition lasts: pod_not_on_node, pod_uid_mismatch (folders not read),
    # symlink (not followed), folder_cap (listing cut at a cap)
    events: dict[str, int] = field(default_factory=dict)
    files: dict[str, int] = field(default_factory=lambda: {SOURCE_POD_LOG: 0, SOURCE_DEBUG_FILE: 0})
    streams: int = 0
    unattributed_files: int = 0
    backlog_bytes: int = 0
    state_saves: int = 0
    state_errors: int = 0

    def skip(self, reason: str, amount: int) -> None:
        if amount > 0:
            self.skipped_bytes[reason] = self.skipped_bytes.get(reason, 0) + amount

    def event(self, reason: str, amount: int = 1) -> None:
        self.events[reason] = self.events.get(reason, 0) + amount


@dataclass
class TailBatch:
    """What one ``poll`` found. Feed ``replayed`` then ``lines`` of a stream, in that order."""

    lines: dict[StreamKey, list[str]] = field(default_factory=dict)
    # Lines already counted by an earlier run (head of a stream resumed from saved state).
    replayed: dict[StreamKey, list[str]] = field(default_factory=dict)
    # Streams seen for the first time in this run, with the note saved for them (or None).
    opened: dict[StreamKey, StreamNote | None] = field(default_factory=dict)
    # Streams whose file was truncated or replaced: what follows is a new log.
    restarted: list[StreamKey] = field(default_factory=list)
    # Streams no longer tailed: every file gone, evicted by a cap, or no longer bound to a
    # pod of this node.
    removed: list[StreamKey] = field(default_factory=list)

"""Tail CRI pod logs and NCCL debug files; hand back the lines that may carry NCCL output.

Two kinds of log stream are read:

* **Pod logs** (``--path.pod-logs``, kubelet layout):
  ``<root>/<namespace>_<pod>_<uid>/<container>/<n>.log``, where ``n`` is the container's
  restart count. One *stream* is one container run: ``<n>.log`` plus its rotated copies
  ``<n>.log.<timestamp>`` (kubelet renames the live file, the runtime reopens a new one,
  and kubelet later compresses older rotated files to ``<n>.log.<timestamp>.gz``, keeping
  the newest one plain). Each line is in the CRI format
  ``<RFC3339Nano> stdout|stderr F|P <message>``; ``P`` (partial) pieces are joined until
  the ``F`` piece, with the joined message capped at ``TailLimits.max_line_bytes``.
* **NCCL debug files** (``--path.nccl-debug-files``, ``NCCL_DEBUG_FILE``): one file per
  process, attributed by folder: ``<root>/<namespace>_<pod>_<uid>/<any file, up to 2
  folders deep>``. Files outside such a folder are not read (``TailStats.unattributed_files``).

**Trust.** Folders are bound to the pods of this node through the injected ``pod_known``
predicate (see ``pod_known_on_node``): while the node's pod list is complete, a pod-log or
debug-file folder that names a pod not on the node, or carries another UID than the pod's,
is not read (events ``pod_not_on_node``, ``pod_uid_mismatch``). A debug-file folder, which
any pod with the hostPath can name, speaks for a pod only through the pod's UID: one without
a UID is never read (``pod_uid_missing``), and while the pod list is not complete only those
bound earlier in the run are read (new ones wait, ``pod_list_unavailable``); pod-log folders,
named by kubelet, are read as named then (``scan``). Symlinks are never followed below a
root: folders and files are looked at with ``lstat``, files opened with ``O_NOFOLLOW`` and the
opened file's real path checked against the expected one (a symlink is skipped and counted,
event ``symlink``).

Files are identified by (device, inode) plus a checksum of their first bytes, never by
name: a rotated file is followed under its new name to its end before the new live file is
read, so lines reach the caller in order. A file that shrinks or whose first bytes change
(NCCL overwrote its debug file for a new process) starts again at 0; a debug file rewritten
that way is reported in ``TailBatch.restarted``. A new file whose first bytes are those of a
file already followed is a ``copytruncate`` copy: it is read on from where the original
was, so nothing is counted twice. A followed pod-log file that disappears is looked for as
a ``.gz`` of its stream (kubelet compresses and deletes older rotations) and read on from
there; a ``.gz`` that appears while running for a rotation never seen as a plain file is
read whole, in rotation order, before the newer files (at most
``max_compressed_readers`` at once). What is lost anyway is counted (``vanished``).

Offsets, unfinished ``P`` messages and a small opaque note per stream (the caller's
counters) are saved atomically (write, fsync, rename) in ``<state>/podlogs-state.json`` by
``save_state``. A restarted tailer resumes every known file at its saved offset (nothing
re-read, nothing skipped) and *replays* the first ``start_bytes`` of each resumed stream in
``TailBatch.replayed``, so the caller can rebuild what the NCCL init lines said without
counting them twice. Every saved value is type- and range-checked; an unreadable state
file is ignored, a bad entry is dropped (event ``state_invalid``) and its file read as new.
A saved pod-log file that kubelet rotated *and* compressed while the exporter was down is
found again as a ``.gz`` of its stream (``<saved rotated name>.gz``; for a saved live file,
any compressed rotation of its generation) whose decompressed first bytes match the saved
checksum. It is inflated in bounded steps (``file_chunk_bytes`` per turn, within
``tick_bytes``; at most ``max_decompressed_bytes`` per file, the rest of a gzip bomb counted
in ``TailStats.skipped_bytes["gz_cap"]``), its head replayed, the part before the saved
offset dropped and the rest read like a plain file, before the newer files of the stream.
A corrupt or truncated ``.gz`` is counted (``gz_corrupt``) and left; a finished one is not
read again, nor saved. A ``.gz`` with no saved offset (history before the first start) is
never read.

Files found at the first scan with no saved state are read from the start when the stream
holds at most ``start_bytes``; a larger stream gets its first ``start_bytes`` (where NCCL
prints its init lines) and is then followed from its end, the bytes in between counted in
``TailStats.skipped_bytes``. Files that appear later are read from byte 0.

Work per ``poll`` is bounded and shared fairly: directory listings are reused while a
folder's mtime is unchanged (at most ``max_listed_entries_per_folder`` entries looked at,
``max_entries_per_folder`` examined after the name and pod checks; a cut listing is counted,
event ``folder_cap``), each file is ``lstat``-ed once, at most ``tick_bytes`` are read in
all and at most ``tick_lines`` lines handed back (what the caller parses per poll). Pod logs
are served first; debug files keep ``debug_file_tick_bytes`` of the budget (and as large a
share of the lines) while they have bytes waiting, and whatever one source leaves unused the
other may take. Within a source, streams take turns in round-robin order that resumes where
the last poll stopped; each turn takes a fair share of the bytes (between ``max_line_bytes``
and ``file_chunk_bytes``) and of the lines (at least ``min_turn_lines``) and stops at a line
boundary when its lines are used (the rest is read again at its next turn, counted once), and
turns go round again while budget is left, so a lone busy stream may use all of it and a noisy
one never delays another stream's lines past the next poll. An unfinished last line is never
read again until its file grows (only the new bytes are read until a newline comes). Only
lines containing ``NCCL`` are decoded
and returned (every line the NCCL logger writes carries that word in its prefix); a tailer
built with another ``TailSelection`` hands back the lines with its own needle, follows only the
debug-folder files its name test accepts and keeps its offsets in its own state file (the NCCL
Inspector's output is read that way). Stream counts are capped per pod and per source (pod
logs and debug files never crowd each other out); the streams whose files were modified least
recently are dropped first (their offsets are remembered, so a stream that comes back resumes
where it was).

The package, one module per concern (each uses only those before it): ``layout`` (where logs
live, which pod a folder speaks for), ``limits`` (bounds, counters, a poll's result), ``cri``
(the CRI record format, read alike by the tailer and ``ccl-exporter analyze``), ``extract`` (the
NCCL lines of a block), ``files``, ``compressed`` and ``stream`` (a stream's files and how far
they are read), ``scan`` (finding the files), ``rotation`` (following them as they change),
``reading`` (reading on within a budget), ``state`` (offsets saved across restarts) and
``tailer`` (``PodLogTailer``).
"""

from exporter.sources.podlogs.compressed import GZ_READ_BYTES
from exporter.sources.podlogs.cri import PARTIAL_TAG_SEARCH
from exporter.sources.podlogs.extract import NEEDLE, NEEDLE_SEARCH, extract_lines
from exporter.sources.podlogs.files import HEAD_BYTES, MIN_COPY_HEAD_BYTES, ROTATED_QUIET_SECONDS, read_at
from exporter.sources.podlogs.layout import (
    SOURCE_DEBUG_FILE,
    SOURCE_POD_LOG,
    SOURCES,
    PodKnown,
    StreamKey,
    parse_debug_folder,
    parse_pod_folder,
    pod_known_on_node,
    pod_log_compressed_generation,
    pod_log_generation,
)
from exporter.sources.podlogs.limits import TailBatch, TailLimits, TailSelection, TailStats
from exporter.sources.podlogs.state import STATE_FILE_NAME, STATE_VERSION
from exporter.sources.podlogs.tailer import PodLogTailer

# The names these had when the package was one module (benchmarks and tests use them).
_NEEDLE_SEARCH = NEEDLE_SEARCH
_PARTIAL_TAG_SEARCH = PARTIAL_TAG_SEARCH
_read_at = read_at

__all__ = [
    "GZ_READ_BYTES",
    "HEAD_BYTES",
    "MIN_COPY_HEAD_BYTES",
    "NEEDLE",
    "ROTATED_QUIET_SECONDS",
    "SOURCES",
    "SOURCE_DEBUG_FILE",
    "SOURCE_POD_LOG",
    "STATE_FILE_NAME",
    "STATE_VERSION",
    "PodKnown",
    "PodLogTailer",
    "StreamKey",
    "TailBatch",
    "TailLimits",
    "TailSelection",
    "TailStats",
    "extract_lines",
    "parse_debug_folder",
    "parse_pod_folder",
    "pod_known_on_node",
    "pod_log_compressed_generation",
    "pod_log_generation",
]

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
  process, attributed by folder: ``<root>/<namespace>_<pod>[_<uid>]/<any file, up to 2
  folders deep>``. Files outside such a folder are not read (``TailStats.unattributed_files``).

**Trust.** Folders are bound to the pods of this node through the injected ``pod_known``
predicate (see ``pod_known_on_node``): while the node's pod list is complete, a pod-log or
debug-file folder that names a pod not on the node, or carries another UID than the pod's,
is not read (events ``pod_not_on_node``, ``pod_uid_mismatch``). Without a pod list every
well-named folder is read. Symlinks are never followed below a root: folders and files are
looked at with ``lstat``, files opened with ``O_NOFOLLOW`` and the opened file's real path
checked against the expected one (a symlink is skipped and counted, event ``symlink``).

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
event ``folder_cap``), each file is ``lstat``-ed once, and at most ``tick_bytes`` are read in
all. Pod logs are served first; debug files keep ``debug_file_tick_bytes`` of the budget while
they have bytes waiting, and whatever one source leaves unused the other may take. Within a
source, streams take turns in round-robin order that resumes where the last poll stopped;
each turn reads a fair share of the budget (between ``max_line_bytes`` and
``file_chunk_bytes``), and turns go round again while budget is left, so a lone busy stream
may use all of it. An unfinished last line is never read again until its file grows (only
the new bytes are read until a newline comes). Only lines containing ``NCCL`` are decoded
and returned (every line the NCCL logger writes carries that word in its prefix). Stream
counts are capped per pod and per source (pod logs and debug files never crowd each other
out); the streams whose files were modified least recently are dropped first (their
offsets are remembered, so a stream that comes back resumes where it was).
"""

from __future__ import annotations

import base64
import binascii
import bisect
import json
import logging
import os
import re
import stat
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SOURCE_POD_LOG = "pod_log"
SOURCE_DEBUG_FILE = "nccl_debug_file"
SOURCES = (SOURCE_POD_LOG, SOURCE_DEBUG_FILE)  # the order in which each poll serves them
STATE_FILE_NAME = "podlogs-state.json"
STATE_VERSION = 1
HEAD_BYTES = 256  # checksum of a file's first bytes: tells a replaced file from the one we read
# A rotated file not modified for this long gets no more bytes: a last line without its
# newline (a runtime killed mid-write) is taken as it is rather than waited for.
ROTATED_QUIET_SECONDS = 5.0
GZ_READ_BYTES = 64 * 1024  # compressed bytes read from a .gz at a time
_GZIP_WBITS = 16 + zlib.MAX_WBITS  # zlib with gzip header and trailer
NEEDLE = b"NCCL"
_CRI_STREAMS = (b"stdout", b"stderr")
_CRI_STREAM_NAMES = ("stdout", "stderr")
# CRI partial-piece tag (" P " after the stream name); a hit in message text only costs the
# slower joining path.
_PARTIAL_TAG_SEARCH = re.compile(rb" P ")
_NEEDLE_SEARCH = re.compile(re.escape(NEEDLE))
# Never follow a symlink in the last component; never block on a FIFO swapped in after lstat.
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_MAX_OFFSET = 1 << 62  # a saved offset beyond this is not a file offset
_CRC_LIMIT = 1 << 32

# (namespace, pod, uid or "") → True: a pod of this node (with that UID when one is given);
# False: the node's pod list is complete and has no such pod (or another UID); None: no
# complete pod list, nothing can be told.
PodKnown = Callable[[str, str, str], "bool | None"]


@dataclass(frozen=True)
class TailLimits:
    """Every bound of the tailer; the defaults suit a node with ~100 pods."""

    tick_bytes: int = 16 * 1024 * 1024  # read at most this much per poll, all files together
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


@dataclass(frozen=True, order=True)
class StreamKey:
    """One log stream: a container run's CRI log, or one NCCL debug file."""

    source: str  # SOURCE_POD_LOG | SOURCE_DEBUG_FILE
    namespace: str
    pod: str
    pod_uid: str  # "" for debug files in a folder without a UID
    container: str  # "" for debug files
    name: str  # restart count for pod logs ("0"), path below the pod folder for debug files

    @property
    def generation(self) -> int:
        """The container restart count of a pod-log stream (0 for debug files)."""
        return int(self.name) if self.source == SOURCE_POD_LOG and self.name.isdigit() else 0

    def text(self) -> str:
        return "/".join((self.source, self.namespace, self.pod, self.pod_uid, self.container, self.name))

    @classmethod
    def from_text(cls, text: str) -> StreamKey | None:
        parts = text.split("/", 5)
        if len(parts) != 6 or parts[0] not in SOURCES:
            return None
        return cls(*parts)


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
    opened: dict[StreamKey, dict | None] = field(default_factory=dict)
    # Streams whose file was truncated or replaced: what follows is a new log.
    restarted: list[StreamKey] = field(default_factory=list)
    # Streams no longer tailed: every file gone, evicted by a cap, or no longer bound to a
    # pod of this node.
    removed: list[StreamKey] = field(default_factory=list)


# ---------------------------------------------------------------------------------------
# Paths and pods


def parse_pod_folder(name: str) -> tuple[str, str, str] | None:
    """``<namespace>_<pod>_<uid>`` → (namespace, pod, uid). Neither name may contain ``_``."""
    parts = name.split("_")
    if len(parts) != 3 or not all(parts):
        return None
    return parts[0], parts[1], parts[2]


def parse_debug_folder(name: str) -> tuple[str, str, str] | None:
    """The NCCL debug-file folder: ``<namespace>_<pod>`` → (namespace, pod, ""), or
    ``<namespace>_<pod>_<uid>`` → (namespace, pod, uid), the form a ``subPathExpr`` from the
    downward API gives (recommended: it binds the folder to one pod object)."""
    parts = name.split("_")
    if len(parts) not in (2, 3) or not all(parts):
        return None
    return parts[0], parts[1], parts[2] if len(parts) == 3 else ""


def pod_log_generation(file_name: str) -> tuple[str, str] | None:
    """``3.log`` → ("3", ""), ``3.log.20260101-120000`` → ("3", "20260101-120000").

    Compressed rotations (``.gz``, see ``pod_log_compressed_generation``), kubelet's
    ``.tmp`` files and anything else → None.
    """
    head, sep, rest = file_name.partition(".log")
    if not sep or not head.isdigit():
        return None
    if rest == "":
        return head, ""
    stamp = rest[1:]
    if rest.startswith(".") and stamp and all(ch.isdigit() or ch == "-" for ch in stamp):
        return head, stamp
    return None


def pod_log_compressed_generation(file_name: str) -> tuple[str, str] | None:
    """``3.log.20260101-120000.gz`` → ("3", "20260101-120000"); anything else → None."""
    if not file_name.endswith(".gz"):
        return None
    parsed = pod_log_generation(file_name[: -len(".gz")])
    return parsed if parsed is not None and parsed[1] else None


def pod_known_on_node(pods: Any) -> PodKnown:
    """The ``pod_known`` predicate from the node's pod list: any object with
    ``lookup(namespace, pod)`` → a record with ``uid``, or None, and ``is_authoritative()``
    (``exporter.sources.kube.PodMetadataSource``). Answers None while the list is not
    complete (no API access, not synced yet): nothing is refused then."""

    def pod_known(namespace: str, pod: str, uid: str = "") -> bool | None:
        if not pods.is_authoritative():
            return None
        record = pods.lookup(namespace, pod)
        if record is None:
            return False
        listed_uid = getattr(record, "uid", "") or ""
        return not uid or not listed_uid or uid == listed_uid

    return pod_known


# ---------------------------------------------------------------------------------------
# Line extraction (the hot path: C-level ``find`` over whole chunks, Python only per hit)


def _cut(data: bytes, limit: int, stats: TailStats) -> bytes:
    if len(data) > limit:
        stats.event("long_line")
        stats.skip("long_line", len(data) - limit)
        return data[:limit]
    return data


def _lines_with_needle(block: bytes, stop: int) -> Iterable[bytes]:
    """Every line of ``block[:stop]`` that contains ``NCCL`` (``stop`` ends on a line end).

    ``re``'s literal search scans about twice as fast as ``bytes.find`` for a short needle.
    """
    rfind, find = block.rfind, block.find
    line_end = -1
    for match in _NEEDLE_SEARCH.finditer(block, 0, stop):
        hit = match.start()
        if hit < line_end:
            continue  # a second NCCL on a line already taken
        start = rfind(b"\n", 0, hit) + 1
        line_end = find(b"\n", hit, stop)
        if line_end < 0:
            line_end = stop
        yield block[start:line_end]


def _cri_message(line: bytes) -> tuple[bytes, bytes, bytes] | None:
    """``<ts> <stream> <tag> <msg>`` → (stream, tag, msg); None when not CRI."""
    parts = line.split(b" ", 3)
    if len(parts) < 3 or parts[1] not in _CRI_STREAMS:
        return None
    return parts[1], parts[2], parts[3] if len(parts) == 4 else b""


@dataclass
class _Partial:
    """A CRI message being joined from P pieces (per stdout/stderr)."""

    data: bytearray = field(default_factory=bytearray)
    cut: bool = False


def extract_lines(
    block: bytes,
    cri: bool,
    partials: dict[str, _Partial],
    limits: TailLimits,
    stats: TailStats,
    stop: int | None = None,
) -> list[str]:
    """NCCL-bearing messages of ``block[:stop]`` (complete lines only), decoded.

    ``partials`` carries unfinished CRI ``P`` messages from one call to the next.

    The fast path touches only lines that contain ``NCCL`` (C-level ``find`` over the whole
    chunk). It gives way to the line-by-line path when a CRI message may be in pieces: a
    ``P`` piece is pending from the last chunk, or `` P `` occurs in the chunk at all (one
    C-level scan; a false hit in message text only costs the slower path). Runtimes split
    a line anywhere (CRI-O at its read-buffer boundaries), even inside ``NCCL``.
    """
    stop = len(block) if stop is None else stop
    pieces_possible = cri and (
        any(p.data or p.cut for p in partials.values()) or _PARTIAL_TAG_SEARCH.search(block, 0, stop) is not None
    )
    if not pieces_possible:
        return _extract_whole_lines(block, stop, cri, limits, stats)
    return _extract_joining_partials(block, stop, partials, limits, stats)


def _extract_whole_lines(block: bytes, stop: int, cri: bool, limits: TailLimits, stats: TailStats) -> list[str]:
    """The fast path of ``extract_lines``: every line is a whole message."""
    out: list[str] = []
    max_line = limits.max_line_bytes
    malformed = 0
    for line in _lines_with_needle(block, stop):
        message = line
        if cri:
            parsed = _cri_message(line)
            if parsed is None:
                malformed += 1
            else:
                message = parsed[2]
        out.append(_cut(message, max_line, stats).decode("utf-8", "replace").rstrip("\r"))
    if malformed:
        stats.event("malformed_cri", malformed)
    return out


def _extract_joining_partials(
    block: bytes, stop: int, partials: dict[str, _Partial], limits: TailLimits, stats: TailStats
) -> list[str]:
    """Line by line, joining CRI ``P`` pieces with their ``F`` end."""
    out: list[str] = []
    max_line = limits.max_line_bytes
    for line in block[:stop].split(b"\n"):
        if not line:
            continue
        parsed = _cri_message(line)
        if parsed is None:
            stats.event("malformed_cri")
            if NEEDLE in line:
                out.append(_cut(line, max_line, stats).decode("utf-8", "replace"))
            continue
        stream_name, tag, message = parsed
        partial = partials.setdefault(stream_name.decode(), _Partial())
        if tag == b"P":
            room = max_line - len(partial.data)
            if len(message) > room:  # counted as one long line when the F piece comes
                partial.data += message[: max(room, 0)]
                partial.cut = True
                stats.skip("long_line", len(message) - max(room, 0))
            else:
                partial.data += message
            continue
        if partial.data or partial.cut:
            joined = bytes(partial.data) + message
            partial.data.clear()
            partial.cut = False
            message = joined
        if NEEDLE in message:
            out.append(_cut(message, max_line, stats).decode("utf-8", "replace").rstrip("\r"))
    return out




# ---------------------------------------------------------------------------------------
# Files and streams


@dataclass
class _File:
    path: Path
    dev: int
    ino: int
    order: str  # rotation timestamp; "~" (sorts last) for the live file
    offset: int = 0  # bytes done with (lines delivered, or dropped)
    size: int = 0
    head_len: int = 0
    head_crc: int = 0
    skipping: bool = False  # inside an over-long line: drop bytes until the next newline
    mtime: float = 0.0
    # Bytes read so far; [offset, read_to) is an unfinished line (no newline in it), so
    # nothing is read again until the file grows past read_to.
    read_to: int = 0

    @property
    def identity(self) -> tuple[int, int]:
        return self.dev, self.ino

    @property
    def rotated(self) -> bool:
        return self.order != "~"

    def unread(self, now: float) -> int:
        """Bytes there is a reason to read now: new ones, or the last line of a rotated file
        that has been quiet long enough to be taken without its newline."""
        start = max(self.offset, self.read_to)
        if self.size > start:
            return self.size - start
        if self.rotated and self.offset < self.size and now - self.mtime >= ROTATED_QUIET_SECONDS:
            return self.size - self.offset
        return 0

    def to_state(self, root: Path) -> dict:
        try:
            path = str(self.path.relative_to(root))
        except ValueError:  # the root was moved under us: the name is enough to find it again
            path = self.path.name
        return {
            "path": path,
            "dev": self.dev,
            "ino": self.ino,
            "offset": self.offset,
            "head_len": self.head_len,
            "head_crc": self.head_crc,
            "skipping": self.skipping,
        }


@dataclass(frozen=True)
class _SavedFile:
    """One file entry of the state file, checked."""

    name: str
    identity: tuple[int, int]
    offset: int
    head_len: int
    head_crc: int
    skipping: bool

    @classmethod
    def parse(cls, entry: object) -> _SavedFile | None:
        """None unless every field has its type and range (a hand-edited or damaged state
        file must not blind a stream: a negative offset, a string, a float, Infinity)."""
        if not isinstance(entry, dict):
            return None
        path, skipping = entry.get("path", ""), entry.get("skipping", False)
        numbers = [entry.get(name) for name in ("dev", "ino", "offset", "head_len", "head_crc")]
        if not isinstance(path, str) or not isinstance(skipping, bool) or any(type(n) is not int for n in numbers):
            return None
        dev, ino, offset, head_len, head_crc = numbers
        if min(dev, ino) < 0 or not 0 <= offset <= _MAX_OFFSET or not 0 <= head_len <= HEAD_BYTES:
            return None
        if not 0 <= head_crc < _CRC_LIMIT:
            return None
        return cls(Path(path).name, (dev, ino), offset, head_len, head_crc, skipping)


def _saved_partials(raw: object, max_line: int) -> dict[str, _Partial] | None:
    """Unfinished CRI messages of the state file, checked; None when malformed."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        return None
    partials: dict[str, _Partial] = {}
    for name, value in raw.items():
        if name not in _CRI_STREAM_NAMES or not isinstance(value, dict):
            return None
        data, cut = value.get("data"), value.get("cut", False)
        if not isinstance(data, str) or not isinstance(cut, bool):
            return None
        try:
            decoded = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            return None
        partials[name] = _Partial(bytearray(decoded[:max_line]), cut)
    return partials


@dataclass(eq=False)
class _Compressed(_File):
    """A rotated file of a stream that kubelet compressed (``.gz``) while the exporter was
    down, known from saved state. ``offset`` counts decompressed bytes; the file is inflated
    from its start in bounded steps, the part before ``offset`` only replayed or dropped.
    ``size`` is the compressed size."""

    trailer_size: int | None = None  # the gzip trailer's content size (mod 2**32)
    position: int = 0  # decompressed bytes produced so far
    raw_offset: int = 0  # compressed bytes read so far
    pending: bytes = b""  # compressed bytes read, not inflated yet
    carry: bytes = b""  # decompressed bytes after ``offset``: an unfinished line
    ended: bool = False  # the last gzip member is inflated
    done: bool = False  # no longer read (ended, failed or dropped)
    fresh_member: bool = True  # no input given to ``inflater`` yet
    inflater: zlib._Decompress = field(default_factory=lambda: zlib.decompressobj(_GZIP_WBITS))

    def inflate(self, want: int) -> bytes:
        """Up to ``want`` more decompressed bytes: fewer at the end, or when about ``want``
        compressed bytes gave less (at most ``want + GZ_READ_BYTES`` are read per call).

        Raises ``zlib.error`` (corrupt), ``EOFError`` (truncated) or ``OSError`` (gone or
        replaced). Concatenated gzip members are read one after the other.
        """
        out: list[bytes] = []
        got = 0
        raw_left = want + GZ_READ_BYTES
        while got < want and not self.ended:
            if not self.pending:
                if raw_left <= 0:
                    break
                raw = _read_at(self.path, self.identity, self.raw_offset, min(GZ_READ_BYTES, want + 1024, raw_left))
                if raw is None:
                    raise FileNotFoundError(f"{self.path} is gone or was replaced")
                if not raw:
                    if not self.fresh_member:
                        raise EOFError(f"{self.path} ends inside a gzip member")
                    self.ended = True
                    break
                self.raw_offset += len(raw)
                raw_left -= len(raw)
                self.pending = raw
            self.fresh_member = False
            piece = self.inflater.decompress(self.pending, want - got)
            if self.inflater.eof:
                self.pending = self.inflater.unused_data
                self.inflater = zlib.decompressobj(_GZIP_WBITS)
                self.fresh_member = True
            else:
                self.pending = self.inflater.unconsumed_tail
            if piece:
                out.append(piece)
                got += len(piece)
        self.position += got
        return b"".join(out)

    def left(self) -> int:
        """What is left unread: the unfinished line and the compressed bytes not inflated."""
        return len(self.carry) + len(self.pending) + max(0, self.size - self.raw_offset)




@dataclass
class _Stream:
    key: StreamKey
    root: Path
    cri: bool
    files: dict[tuple[int, int], _File] = field(default_factory=dict)
    # Compressed rotations being read, oldest first; read before ``files``.
    compressed: list[_Compressed] = field(default_factory=list)
    partials: dict[str, _Partial] = field(default_factory=dict)
    bootstrapped: bool = False
    resumed: bool = False  # restored from saved state: replay the head, then go on
    # .gz names of the stream already accounted for (history, or found and handled)
    gz_known: set[str] = field(default_factory=set)

    def ordered(self) -> list[_File]:
        return sorted(self.files.values(), key=lambda f: (f.order, f.path.name))

    def waiting(self, now: float) -> int:
        """Bytes there is a reason to read now (1 for a stream not bootstrapped yet)."""
        if not self.bootstrapped:
            return max(1, sum(f.size for f in self.files.values()))
        return sum(c.left() for c in self.compressed) + sum(f.unread(now) for f in self.files.values())

    def unread(self) -> int:
        """Bytes not read yet, for the skipped counters when the stream is dropped."""
        return sum(c.left() for c in self.compressed) + sum(max(0, f.size - f.offset) for f in self.files.values())


@dataclass
class _Candidate:
    """A file found by a scan: its stream, identity and size."""

    key: StreamKey
    path: Path
    order: str
    dev: int
    ino: int
    size: int
    mtime: float


@dataclass
class _Scan:
    """What one scan found."""

    found: list[_Candidate] = field(default_factory=list)
    compressed: dict[StreamKey, list[str]] = field(default_factory=dict)  # .gz names per pod-log stream
    refused: set[tuple[str, str, str, str]] = field(default_factory=set)  # (source, namespace, pod, uid)


def _opened_where_expected(fd: int, path: Path) -> bool:
    """Whether ``fd`` was reached through ``path`` with no symlink on the way (the roots
    are resolved; a folder below one swapped for a symlink after it was listed is caught
    here). Without /proc the path is resolved by name instead."""
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        real = os.path.realpath(path)
    return real == str(path)


def _read_at(path: Path, identity: tuple[int, int], offset: int, length: int) -> bytes | None:
    """``length`` bytes at ``offset`` of ``path`` if it is still the regular file
    ``identity``, reached without following a symlink; None otherwise."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != identity or not stat.S_ISREG(st.st_mode):
            return None
        if not _opened_where_expected(fd, path):
            return None
        return os.pread(fd, length, offset)
    except OSError:
        return None
    finally:
        os.close(fd)


def _head_checksum(path: Path, identity: tuple[int, int], length: int) -> int | None:
    data = _read_at(path, identity, 0, length)
    return zlib.crc32(data) if data is not None and len(data) == length else None


def _gz_head(path: Path, identity: tuple[int, int], length: int) -> bytes | None:
    """The first ``length`` decompressed bytes of a .gz (fewer if it holds fewer); None
    when it cannot be read or is not gzip."""
    probe = _Compressed(path, identity[0], identity[1], "")
    try:
        return probe.inflate(length)
    except (zlib.error, EOFError, OSError):
        return None


def _gz_head_checksum(path: Path, identity: tuple[int, int], length: int) -> int | None:
    """Checksum of the first ``length`` decompressed bytes of a .gz (None if it has fewer)."""
    head = _gz_head(path, identity, length)
    return zlib.crc32(head) if head is not None and len(head) == length else None


def _gz_trailer_size(path: Path, identity: tuple[int, int], size: int) -> int | None:
    """The content size (mod 2**32) a gzip file's trailer states for its last member."""
    trailer = _read_at(path, identity, size - 4, 4) if size >= 18 else None
    return int.from_bytes(trailer, "little") if trailer is not None and len(trailer) == 4 else None


def _regular_file(path: Path) -> os.stat_result | None:
    """``lstat`` of ``path`` if it is a regular file (a symlink is not)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def _resolved(root: Path | None) -> Path | None:
    """A root with its own symlinks resolved (the root itself may be a link; nothing below)."""
    return None if root is None else Path(os.path.realpath(root))


# Kinds of directory entries, as listed (no symlink is followed to tell)
DIR, FILE, LINK = "d", "f", "l"


@dataclass(frozen=True)
class _Listing:
    entries: tuple[tuple[str, str], ...] = ()  # (name, kind), sorted
    rejected: int = 0  # entries whose names the folder's filter refused
    cut: bool = False  # more entries than max_listed_entries_per_folder: the rest not looked at


class _FolderCache:
    """Directory listings reused while a folder's mtime is unchanged (and not recent)."""

    def __init__(self, limits: TailLimits) -> None:
        self._limits = limits
        self._entries: dict[Path, tuple[int, int, _Listing]] = {}

    def list(self, folder: Path, now: float, keep: Callable[[str], bool] | None = None,
             room: int | None = None) -> _Listing:
        """Entries of ``folder`` whose names pass ``keep``, at most ``room`` (the listing is
        ``cut`` when there are more); empty when it is unreadable or is not a directory (a
        symlink to one is not followed). One folder is always listed with the same ``keep``."""
        room = self._limits.max_listed_entries_per_folder if room is None else room
        try:
            st = os.lstat(folder)
        except OSError:
            self._entries.pop(folder, None)
            return _Listing()
        if not stat.S_ISDIR(st.st_mode):
            self._entries.pop(folder, None)
            return _Listing()
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
            return _Listing()
        entries.sort()
        listing = _Listing(tuple(entries), rejected, cut)
        self._entries[folder] = (st.st_mtime_ns, room, listing)
        return listing

    def forget_missing(self, seen: set[Path]) -> None:
        for folder in [f for f in self._entries if f not in seen]:
            del self._entries[folder]


def _is_pod_folder_name(name: str) -> bool:
    return parse_pod_folder(name) is not None


def _is_debug_folder_name(name: str) -> bool:
    return parse_debug_folder(name) is not None


def _is_pod_log_name(name: str) -> bool:
    return pod_log_generation(name) is not None or pod_log_compressed_generation(name) is not None


def _is_debug_file_name(name: str) -> bool:
    return not name.startswith(".") and not name.endswith(".gz")


def _is_folder(name: str, kind: str) -> bool:
    return kind == DIR


def _is_file(name: str, kind: str) -> bool:
    return kind == FILE


def _any_entry(name: str, kind: str) -> bool:
    return True


# A copytruncate copy is told by its first bytes: fewer than this could be a shared prefix.
MIN_COPY_HEAD_BYTES = 64


class PodLogTailer:
    """Incremental reader of pod logs and NCCL debug files; see the module docstring."""

    def __init__(
        self,
        pod_logs: Path | None,
        debug_files: Path | None,
        state_dir: Path | None = None,
        limits: TailLimits | None = None,
        *,
        pod_known: PodKnown | None = None,
    ) -> None:
        self.pod_logs = pod_logs
        self.debug_files = debug_files
        self.state_dir = state_dir
        self.limits = limits or TailLimits()
        self.pod_known = pod_known
        self.stats = TailStats()
        self._streams: dict[StreamKey, _Stream] = {}
        self._folders = _FolderCache(self.limits)
        self._first_scan = True
        self._saved = self._load_state()
        self._cursor: dict[str, StreamKey] = {}  # per source: the stream the next poll starts with
        self._evicted: OrderedDict[StreamKey, list[_File]] = OrderedDict()
        self._save_failing = False
        # (reason, what) counted at the last scan, and at this one: counted once while it lasts
        self._noticed: set[tuple[str, str]] = set()
        self._noticing: set[tuple[str, str]] = set()

    # -- state -----------------------------------------------------------------------

    def _state_path(self) -> Path | None:
        return self.state_dir / STATE_FILE_NAME if self.state_dir is not None else None

    def _load_state(self) -> dict[str, dict]:
        path = self._state_path()
        if path is None:
            return {}
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, RecursionError) as exc:  # RecursionError: deeply nested JSON
            log.warning("ignoring unreadable tail state %s: %s", path, exc)
            self.stats.state_errors += 1
            return {}
        if not isinstance(raw, dict) or raw.get("version") != STATE_VERSION or not isinstance(raw.get("streams"), dict):
            log.warning("ignoring tail state %s of an unknown version", path)
            self.stats.state_errors += 1
            return {}
        return {k: v for k, v in raw["streams"].items() if isinstance(v, dict)}

    def save_state(self, notes: Mapping[StreamKey, dict] | None = None) -> bool:
        """Write offsets, partial messages and ``notes`` atomically; False if it failed."""
        path = self._state_path()
        if path is None:
            return False
        streams: dict[str, dict] = {}
        for key, stream in self._streams.items():
            root = stream.root
            streams[key.text()] = {
                "files": [f.to_state(root) for f in [*stream.compressed, *stream.ordered()]],
                "partials": {
                    name: {"data": base64.b64encode(bytes(p.data)).decode(), "cut": p.cut}
                    for name, p in stream.partials.items()
                    if p.data or p.cut
                },
                "note": (notes or {}).get(key),
            }
        body = json.dumps({"version": STATE_VERSION, "streams": streams}, sort_keys=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "w") as handle:
                handle.write(body)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            self.stats.state_errors += 1
            if not self._save_failing:  # say it once, not every few seconds
                log.warning("could not save tail state to %s (a restart will re-read from the "
                            "start caps): %s", path, exc)
            self._save_failing = True
            try:
                tmp.unlink()
            except OSError:
                pass
            return False
        if self._save_failing:
            log.info("tail state saved to %s again", path)
        self._save_failing = False
        self.stats.state_saves += 1
        return True

    # -- scanning --------------------------------------------------------------------

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

    def _bound(self, source: str, namespace: str, pod: str, uid: str, folder_name: str, scan: _Scan) -> bool:
        """Whether a folder may speak for the pod it names (see ``PodKnown``)."""
        if self.pod_known is None or self.pod_known(namespace, pod, uid) is not False:
            return True
        mismatch = bool(uid) and self.pod_known(namespace, pod, "") is True
        self._notice("pod_uid_mismatch" if mismatch else "pod_not_on_node", f"{source}:{folder_name}")
        scan.refused.add((source, namespace, pod, uid))
        return False

    def _examine(self, folder: Path, listing: _Listing, wanted: Callable[[str, str], bool],
                 cap: int | None = None) -> list[tuple[str, str]]:
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

    def _scan(self, now: float) -> _Scan:
        scan = _Scan()
        seen_folders: set[Path] = set()
        root = _resolved(self.pod_logs)
        if root is not None:
            seen_folders.add(root)

            def bound_pod(name: str, kind: str) -> bool:
                parsed = parse_pod_folder(name)
                return kind == DIR and parsed is not None and self._bound(SOURCE_POD_LOG, *parsed, name, scan)

            for pod_name, _ in self._examine(root, self._folders.list(root, now, _is_pod_folder_name), bound_pod):
                pod_dir = root / pod_name
                seen_folders.add(pod_dir)
                listing = self._folders.list(pod_dir, now, room=self.limits.max_entries_per_folder)
                for container, _ in self._examine(pod_dir, listing, _is_folder):
                    container_dir = pod_dir / container
                    seen_folders.add(container_dir)
                    self._scan_container(scan, container_dir, parse_pod_folder(pod_name) or ("", "", ""), now)
        unattributed = 0
        root = _resolved(self.debug_files)
        if root is not None:
            seen_folders.add(root)
            listing = self._folders.list(root, now, _is_debug_folder_name)
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
        self._folders.forget_missing(seen_folders)
        self.stats.unattributed_files = unattributed
        self._noticed, self._noticing = self._noticing, set()
        return scan

    def _scan_container(self, scan: _Scan, container_dir: Path, pod: tuple[str, str, str], now: float) -> None:
        """The plain files of a container folder as candidates, its .gz names per stream."""
        namespace, name, uid = pod
        listing = self._folders.list(container_dir, now, _is_pod_log_name, self.limits.max_entries_per_folder)
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

    def _walk(self, folder: Path, now: float, depth: int, seen: set[Path], budget: list[int],
              prefix: str = "") -> Iterable[str]:
        """Files below a debug-file folder (``depth`` levels), in name order, within one
        entry budget for the whole pod folder: a deep or wide tree costs a bounded listing."""
        listing = self._folders.list(folder, now, _is_debug_file_name, max(budget[0], 0))
        for name, kind in self._examine(folder, listing, _any_entry, max(budget[0], 0)):
            if budget[0] <= 0:  # spent in a subfolder
                self._notice("folder_cap", str(folder))
                return
            budget[0] -= 1
            if kind == DIR:
                if depth > 1:
                    seen.add(folder / name)
                    yield from self._walk(folder / name, now, depth - 1, seen, budget, f"{prefix}{name}/")
            else:
                yield prefix + name

    def _add_candidate(self, found: list[_Candidate], key: StreamKey, path: Path, order: str) -> None:
        try:
            st = os.lstat(path)
        except OSError:
            return
        if stat.S_ISLNK(st.st_mode):  # swapped in after the folder was listed
            self._notice("symlink", str(path))
            return
        if not stat.S_ISREG(st.st_mode):
            return
        found.append(_Candidate(key, path, order, st.st_dev, st.st_ino, st.st_size, st.st_mtime))

    def _select_streams(self, found: list[_Candidate], batch: TailBatch) -> dict[StreamKey, list[_Candidate]]:
        """Group candidates by stream and apply the per-pod and per-source stream caps."""
        by_stream: dict[StreamKey, list[_Candidate]] = {}
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
        scan = self._scan(now)
        selected = self._select_streams(scan.found, batch)
        first_scan = self._first_scan
        self._first_scan = False

        for key in [k for k in self._streams if k not in selected]:
            stream = self._streams.pop(key)
            refused = (key.source, key.namespace, key.pod, key.pod_uid) in scan.refused
            self.stats.skip("pod_not_on_node" if refused else "vanished", stream.unread())
            batch.removed.append(key)

        by_source: dict[str, list[_Stream]] = {source: [] for source in SOURCES}
        for key in sorted(selected):
            gz_names = scan.compressed.get(key, [])
            stream = self._streams.get(key)
            if stream is None:
                stream = self._open_stream(key, selected[key], gz_names, first_scan, batch)
                self._streams[key] = stream
            self._sync_files(stream, selected[key], gz_names, batch)
            by_source[key.source].append(stream)

        # Pod logs first; debug files keep their share (at most half the tick) while they
        # have bytes waiting, and each source may take what the other leaves.
        debug_waiting = sum(s.waiting(now) for s in by_source[SOURCE_DEBUG_FILE])
        reserved = min(self.limits.debug_file_tick_bytes, self.limits.tick_bytes // 2, debug_waiting)
        pod_budget = self.limits.tick_bytes - reserved
        used = self._serve(SOURCE_POD_LOG, by_source[SOURCE_POD_LOG], pod_budget, first_scan, batch, now)
        debug_budget = self.limits.tick_bytes - used
        self._serve(SOURCE_DEBUG_FILE, by_source[SOURCE_DEBUG_FILE], debug_budget, first_scan, batch, now)

        self.stats.backlog_bytes = sum(s.waiting(now) for s in self._streams.values())
        self.stats.streams = len(self._streams)
        files = {source: 0 for source in SOURCES}
        for stream in self._streams.values():
            files[stream.key.source] += len(stream.files)
        self.stats.files = files
        return batch

    def _serve(self, source: str, streams: list[_Stream], budget: int, first_scan: bool, batch: TailBatch,
               now: float) -> int:
        """Turns of one source's streams (sorted by key) within ``budget``; bytes read.

        Round-robin from the stream the last poll stopped at; each turn is a fair share of
        what is left (at least a line, at most a chunk), and rounds go on while budget is
        left, so one busy stream may use what the others do not need.
        """
        given = budget
        active = [s for s in streams if s.waiting(now)]
        if not active or budget <= 0:
            return 0
        cursor = self._cursor.get(source)
        if cursor is not None:
            start = bisect.bisect_left([s.key for s in active], cursor) % len(active)
            active = active[start:] + active[:start]
        while active:
            share = min(self.limits.file_chunk_bytes, max(budget // len(active), self.limits.max_line_bytes))
            again: list[_Stream] = []
            for stream in active:
                if budget <= 0:
                    self._cursor[source] = stream.key
                    return given - budget
                used = self._turn(stream, min(share, budget), first_scan, batch, now)
                budget -= used
                if used > 0 and stream.waiting(now):
                    again.append(stream)
            active = again
        return given - budget

    def _turn(self, stream: _Stream, budget: int, first_scan: bool, batch: TailBatch, now: float) -> int:
        """One turn of a stream: its bootstrap, then reading on in file order; bytes read."""
        used = 0
        if not stream.bootstrapped:
            used = self._bootstrap(stream, first_scan, batch)
        for comp in list(stream.compressed):
            if used >= budget:
                return used
            used += self._read_compressed(stream, comp, budget - used, batch)
            if not comp.done:
                return used  # older than every plain file: those wait
        for tracked in stream.ordered():
            if used >= budget:
                break
            used += self._read_file(stream, tracked, budget - used, batch, now)
            if tracked.rotated and tracked.offset < tracked.size:
                break  # finish a rotated file before reading the newer one
        return used

    def _open_stream(self, key: StreamKey, cands: list[_Candidate], gz_names: list[str], first_scan: bool,
                     batch: TailBatch) -> _Stream:
        root = _resolved(self.pod_logs if key.source == SOURCE_POD_LOG else self.debug_files)
        assert root is not None
        stream = _Stream(key=key, root=root, cri=key.source == SOURCE_POD_LOG)
        saved = self._saved.pop(key.text(), None)
        note = None
        if saved is not None:
            note = saved.get("note") if isinstance(saved.get("note"), dict) else None
            self._restore(stream, saved, cands, gz_names)
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

    def _restore(self, stream: _Stream, saved: dict, cands: list[_Candidate], gz_names: list[str]) -> None:
        by_identity = {(c.dev, c.ino): c for c in cands}
        folder = cands[0].path.parent
        claimed: set[str] = set()
        entries = saved.get("files", [])
        if not isinstance(entries, list):
            self.stats.event("state_invalid")
            entries = []
        for entry in entries:
            saved_file = _SavedFile.parse(entry)
            if saved_file is None:
                self.stats.event("state_invalid")  # that file is then read as a new one
                continue
            identity = saved_file.identity
            cand = by_identity.get(identity)
            if cand is None or (saved_file.head_len and _head_checksum(cand.path, identity, saved_file.head_len)
                                != saved_file.head_crc):
                # Rotated away and compressed, or deleted, while we were down (its inode may
                # hold another file now).
                comp = self._find_compressed(stream, folder, gz_names, saved_file.name, saved_file.head_len,
                                             saved_file.head_crc, claimed)
                if comp is not None:
                    comp.offset, comp.skipping = saved_file.offset, saved_file.skipping
                    stream.compressed.append(comp)
                continue
            tracked = _File(cand.path, cand.dev, cand.ino, cand.order, offset=min(saved_file.offset, cand.size),
                            size=cand.size, head_len=saved_file.head_len, head_crc=saved_file.head_crc,
                            skipping=saved_file.skipping, mtime=cand.mtime)
            if saved_file.offset > cand.size:
                self.stats.event("truncated")
                tracked.offset, tracked.skipping = 0, False
            tracked.read_to = tracked.offset
            stream.files[identity] = tracked
        stream.compressed.sort(key=lambda c: (c.order, c.path.name))
        stream.gz_known |= claimed
        partials = _saved_partials(saved.get("partials"), self.limits.max_line_bytes)
        if partials is None:
            self.stats.event("state_invalid")
        else:
            stream.partials = partials

    def _find_compressed(self, stream: _Stream, folder: Path, gz_names: list[str], saved_name: str, head_len: int,
                         head_crc: int, claimed: set[str]) -> _Compressed | None:
        """The ``.gz`` that a pod-log file became, if its decompressed head matches.

        A rotated file must be ``<its name>.gz``; a saved ``.gz`` (read halfway before a
        restart) keeps its name; a live file may be any compressed rotation of its
        generation. Only the first ``head_len`` bytes are inflated to check.
        """
        if stream.key.source != SOURCE_POD_LOG or not head_len:
            return None
        if saved_name.endswith(".gz"):
            saved = pod_log_compressed_generation(saved_name)
        else:
            saved = pod_log_generation(saved_name)
        if saved is None or saved[0] != stream.key.name:
            return None
        if saved_name.endswith(".gz"):
            names = [saved_name]
        elif saved[1]:
            names = [saved_name + ".gz"]
        else:
            names = sorted(gz_names)
        for name in names:
            if name in claimed or name not in gz_names:
                continue
            path = folder / name
            st = _regular_file(path)
            if st is None:
                continue
            identity = (st.st_dev, st.st_ino)
            if _gz_head_checksum(path, identity, head_len) != head_crc:
                continue
            claimed.add(name)
            return self._compressed(path, st, head_len, head_crc)
        return None

    @staticmethod
    def _compressed(path: Path, st: os.stat_result, head_len: int, head_crc: int) -> _Compressed:
        identity = (st.st_dev, st.st_ino)
        stamp = (pod_log_compressed_generation(path.name) or ("", ""))[1]
        return _Compressed(path, st.st_dev, st.st_ino, stamp, size=st.st_size, head_len=head_len, head_crc=head_crc,
                           trailer_size=_gz_trailer_size(path, identity, st.st_size))

    def _compressed_readers(self) -> int:
        return sum(len(s.compressed) for s in self._streams.values())

    def _bootstrap(self, stream: _Stream, first_scan: bool, batch: TailBatch) -> int:
        """Replay (resumed stream) or read with the start cap (busy stream at first start)."""
        stream.bootstrapped = True
        cap = self.limits.start_bytes
        used = 0
        if stream.resumed:
            replay: list[str] = []
            scratch = TailStats()
            for tracked in [*stream.compressed, *stream.ordered()]:
                length = min(tracked.offset, cap - used)
                if length <= 0:
                    break
                if isinstance(tracked, _Compressed):  # inflated once, then read on from here
                    data = self._inflate(stream, tracked, length)
                else:
                    data = _read_at(tracked.path, tracked.identity, 0, length) or b""
                used += len(data)
                end = data.rfind(b"\n")
                if end >= 0:
                    replay += extract_lines(data[: end + 1], stream.cri, {}, self.limits, scratch)
            if replay:
                batch.replayed[stream.key] = replay
            return used
        # First scan, no saved state: read everything if it is small, else the head then the end.
        total = sum(f.size for f in stream.files.values())
        if total <= cap:
            return 0
        ordered = stream.ordered()
        head = ordered[0]
        data = _read_at(head.path, head.identity, 0, cap) or b""
        used = len(data)
        self.stats.bytes_read[stream.key.source] += used
        end = data.rfind(b"\n")
        if end >= 0:
            self._deliver(stream, extract_lines(data[: end + 1], stream.cri, stream.partials, self.limits, self.stats), batch)
        stream.partials.clear()
        for tracked in ordered:
            skipped_from = (end + 1) if tracked is head and end >= 0 else 0
            self.stats.skip("initial_cap", tracked.size - skipped_from)
            tracked.offset = tracked.read_to = tracked.size
            tracked.skipping = tracked.size > 0 and _read_at(tracked.path, tracked.identity, tracked.size - 1, 1) != b"\n"
            self._remember_head(tracked)
        return used

    def _sync_files(self, stream: _Stream, cands: list[_Candidate], gz_names: list[str], batch: TailBatch) -> None:
        """Follow renames; notice new, copied, vanished, truncated and replaced files, and
        compressed rotations of the stream."""
        current = {(c.dev, c.ino): c for c in cands}
        before = {identity: replace(f) for identity, f in stream.files.items()}  # as followed until now
        gone = [stream.files.pop(i) for i in [i for i in stream.files if i not in current]]
        added = [identity for identity in current if identity not in stream.files]
        copies = self._add_files(stream, [current[i] for i in added], list(before.values()))
        reset: list[_File] = []  # truncated or replaced: what they held may live on in a .gz
        for identity, cand in current.items():
            if identity in added:
                continue
            tracked = stream.files[identity]
            tracked.path, tracked.order, tracked.mtime = cand.path, cand.order, cand.mtime
            replaced = False
            if cand.size != tracked.size and tracked.head_len:
                replaced = _head_checksum(cand.path, identity, tracked.head_len) != tracked.head_crc
            if cand.size < max(tracked.offset, tracked.read_to) or replaced:
                self.stats.event("replaced" if replaced and cand.size >= tracked.offset else "truncated")
                reset.append(before[identity])
                tracked.offset = tracked.read_to = 0
                tracked.skipping, tracked.head_len, tracked.head_crc = False, 0, 0
                if identity not in copies:
                    stream.partials.clear()  # else an unfinished message goes on in the copy
                    # A debug file is rewritten by a new process; a pod log (copytruncate) goes on.
                    if stream.key not in batch.restarted and stream.key.source == SOURCE_DEBUG_FILE:
                        batch.restarted.append(stream.key)
            elif identity in copies:
                # Copied, not truncated yet: the copy holds what the original has up to the
                # copy's size; the original goes on after it.
                copy = copies[identity]
                if copy.size > tracked.offset:
                    last = _read_at(copy.path, copy.identity, copy.size - 1, 1)
                    tracked.offset = tracked.read_to = copy.size
                    tracked.skipping = last != b"\n"
            tracked.size = cand.size
        self._sync_compressed(stream, gone, reset, gz_names)

    def _add_files(self, stream: _Stream, cands: list[_Candidate],
                   followed: list[_File]) -> dict[tuple[int, int], _File]:
        """Follow new files from byte 0, except a copy of a followed file (copytruncate),
        read on from where the original was; returns the copies by their original."""
        copies: dict[tuple[int, int], _File] = {}
        originals = [f for f in followed if f.head_len >= MIN_COPY_HEAD_BYTES]
        for cand in cands:
            fresh = _File(cand.path, cand.dev, cand.ino, cand.order, size=cand.size, mtime=cand.mtime)
            origin = self._copied_from(fresh, originals)
            if origin is not None:
                fresh.offset = fresh.read_to = min(origin.offset, fresh.size)
                fresh.skipping = origin.skipping and origin.offset <= fresh.size
                fresh.head_len, fresh.head_crc = origin.head_len, origin.head_crc
                copies[origin.identity] = fresh
            stream.files[fresh.identity] = fresh
        return copies

    def _sync_compressed(self, stream: _Stream, gone: list[_File], reset: list[_File], gz_names: list[str]) -> None:
        """What a followed pod-log file held is read on from its ``.gz`` when the file is gone
        or its inode now holds another file (kubelet rotated, compressed and deleted it
        between two polls); a ``.gz`` of a rotation never seen plain is read whole. What
        cannot be read is counted as vanished."""
        claimed = {c.path.name for c in stream.compressed}
        for old in [*gone, *reset]:
            comp = None
            if self._compressed_readers() < self.limits.max_compressed_readers:
                comp = self._find_compressed(stream, old.path.parent, gz_names, old.path.name, old.head_len,
                                             old.head_crc, claimed)
            if comp is not None:
                comp.offset, comp.skipping = old.offset, old.skipping
                stream.compressed.append(comp)
            elif old in gone:
                self.stats.skip("vanished", max(0, old.size - old.offset))
        folder = next(iter(stream.files.values())).path.parent if stream.files else None
        unseen = set(gz_names) - stream.gz_known - claimed
        for name in sorted(unseen, key=lambda n: (pod_log_compressed_generation(n) or ("", ""))[1]):
            if folder is not None:
                self._unseen_rotation(stream, folder / name)
        stream.gz_known = set(gz_names)
        stream.compressed.sort(key=lambda c: (c.order, c.path.name))

    def _unseen_rotation(self, stream: _Stream, path: Path) -> None:
        """A ``.gz`` that appeared while running for a rotation never seen as a plain file
        (rotated and compressed between two polls): read whole, unless it is the compressed
        copy of a file still followed."""
        st = _regular_file(path)
        if st is None:
            return
        identity = (st.st_dev, st.st_ino)
        head = _gz_head(path, identity, HEAD_BYTES)
        if head is None:
            self.stats.event("gz_corrupt")
            self.stats.skip("gz_corrupt", st.st_size)
            return
        if any(_read_at(f.path, f.identity, 0, len(head)) == head for f in stream.files.values()):
            return
        if self._compressed_readers() >= self.limits.max_compressed_readers:
            self.stats.skip("vanished", _gz_trailer_size(path, identity, st.st_size) or st.st_size)
            return
        stream.compressed.append(self._compressed(path, st, len(head), zlib.crc32(head)))

    @staticmethod
    def _copied_from(fresh: _File, followed: list[_File]) -> _File | None:
        """The followed file whose first bytes ``fresh`` starts with (a copytruncate copy)."""
        for origin in followed:
            if fresh.size >= origin.head_len and _head_checksum(fresh.path, fresh.identity,
                                                                origin.head_len) == origin.head_crc:
                return origin
        return None

    def _remember_head(self, tracked: _File) -> None:
        if tracked.head_len >= HEAD_BYTES or tracked.size <= tracked.head_len:
            return
        length = min(HEAD_BYTES, tracked.size)
        crc = _head_checksum(tracked.path, tracked.identity, length)
        if crc is not None:
            tracked.head_len, tracked.head_crc = length, crc

    def _read_file(self, stream: _Stream, tracked: _File, budget: int, batch: TailBatch, now: float) -> int:
        """Read on in one file and deliver its complete lines; return the bytes read.

        After an unfinished last line, a few new bytes are read alone until a newline comes,
        then the line once more; many new bytes (8 times the line or more) are read in one go
        with the line, which is cheaper than joining them.
        """
        self._remember_head(tracked)
        start = max(tracked.offset, tracked.read_to)
        pending = start - tracked.offset  # an unfinished line, read before
        want = min(tracked.size - start, self.limits.file_chunk_bytes, budget - pending)
        quiet = tracked.rotated and now - tracked.mtime >= ROTATED_QUIET_SECONDS
        if want <= 0 and not (quiet and pending and tracked.size <= start):
            return 0
        source = stream.key.source
        if pending and want >= 8 * pending:
            data = _read_at(tracked.path, tracked.identity, tracked.offset, pending + want) or b""
            if len(data) <= pending:
                return 0
            self.stats.bytes_read[source] += len(data) - pending
        else:
            fresh = b""
            if want > 0:
                fresh = _read_at(tracked.path, tracked.identity, start, want) or b""
                if not fresh:
                    return 0
            self.stats.bytes_read[source] += len(fresh)
            if pending and b"\n" not in fresh and not (quiet and start + len(fresh) >= tracked.size):
                tracked.read_to = start + len(fresh)
                if tracked.read_to - tracked.offset >= self.limits.max_line_bytes:
                    tracked.offset += self._drop_fragment(tracked, tracked.read_to - tracked.offset)
                return len(fresh)
            data = fresh
            if pending:
                line_start = _read_at(tracked.path, tracked.identity, tracked.offset, pending)
                if line_start is None or len(line_start) != pending:
                    return len(fresh)  # changed under us: the next scan tells how
                data = line_start + fresh
        if quiet and tracked.offset + len(data) >= tracked.size and not data.endswith(b"\n"):
            # The end of a rotated file that no longer grows: its last line will never get a
            # newline, and waiting for one would hold back every newer file of the stream.
            done = min(len(data), self._consume(stream, tracked, data + b"\n", batch))
        else:
            done = self._consume(stream, tracked, data, batch)
        tracked.read_to = tracked.offset + len(data)
        tracked.offset += done
        return len(data)

    def _drop_fragment(self, tracked: _File, length: int) -> int:
        """An unfinished line already as long as a line may be: drop it, and the rest of it
        up to its newline; return ``length``."""
        self.stats.event("long_line")
        self.stats.skip("long_line", length)
        tracked.skipping = True
        return length

    def _consume(self, stream: _Stream, tracked: _File, data: bytes, batch: TailBatch) -> int:
        """Deliver the complete lines of ``data`` (the bytes at ``tracked.offset``); return
        how many bytes are done with. The rest, an unfinished line, is read again later."""
        start = 0
        if tracked.skipping:
            newline = data.find(b"\n")
            if newline < 0:
                self.stats.skip("long_line", len(data))
                return len(data)
            self.stats.skip("long_line", newline + 1)
            tracked.skipping = False
            start = newline + 1
        end = data.rfind(b"\n")
        if end < start:
            # No complete line yet. A fragment longer than a line may be is dropped to its end.
            if len(data) - start >= self.limits.max_line_bytes:
                return start + self._drop_fragment(tracked, len(data) - start)
            return start
        lines = extract_lines(data if start == 0 else data[start:], stream.cri, stream.partials, self.limits,
                              self.stats, stop=end + 1 - start)
        self._deliver(stream, lines, batch)
        return end + 1


    def _read_compressed(self, stream: _Stream, comp: _Compressed, budget: int, batch: TailBatch) -> int:
        """Inflate one chunk of a compressed rotation: drop what lies before the saved offset,
        read lines after it. Finish the file at its end, at the decompression cap or at an
        error. Returns the decompressed bytes handled (the work done)."""
        if comp.trailer_size == comp.offset % (1 << 32):
            self._finish_compressed(stream, comp)  # the trailer says nothing follows the saved offset
            return 0
        want = min(self.limits.file_chunk_bytes, budget, self.limits.max_decompressed_bytes - comp.position)
        used = 0
        if want > 0 and comp.position < comp.offset:  # read before the restart
            used = len(self._inflate(stream, comp, min(want, comp.offset - comp.position)))
            want -= used
        data = b""
        if want > 0 and comp.position >= comp.offset and not comp.done:
            data = self._inflate(stream, comp, want)
        if data:
            self.stats.bytes_read[stream.key.source] += len(data)
            block = comp.carry + data if comp.carry else data
            consumed = self._consume(stream, comp, block, batch)
            comp.offset += consumed
            comp.carry = block[consumed:]
        if comp.done:
            return used + len(data)
        if comp.ended:
            if comp.carry:  # a last line without its newline: nothing more will come
                self._consume(stream, comp, comp.carry + b"\n", batch)
                comp.offset, comp.carry = comp.offset + len(comp.carry), b""
            self._finish_compressed(stream, comp)
        elif comp.position >= self.limits.max_decompressed_bytes:
            self.stats.event("gz_cap")
            self._finish_compressed(stream, comp, "gz_cap")
        return used + len(data)

    def _inflate(self, stream: _Stream, comp: _Compressed, want: int) -> bytes:
        """``comp.inflate``; a corrupt or truncated .gz is counted and finished, one that
        is gone (kubelet keeps a few rotations only) is counted as vanished."""
        try:
            return comp.inflate(want)
        except (zlib.error, EOFError) as exc:
            log.debug("skipping the rest of %s: %s", comp.path, exc)
            self.stats.event("gz_corrupt")
            self._finish_compressed(stream, comp, "gz_corrupt")
        except OSError:
            self._finish_compressed(stream, comp, "vanished")
        return b""

    def _finish_compressed(self, stream: _Stream, comp: _Compressed, skip_reason: str | None = None) -> None:
        """Stop reading a compressed rotation (its state is not saved again); count what is
        left of it under ``skip_reason``."""
        if skip_reason is not None:
            self.stats.skip(skip_reason, comp.left())
        comp.done = True
        comp.carry = comp.pending = b""
        stream.compressed = [c for c in stream.compressed if c is not comp]

    def _deliver(self, stream: _Stream, lines: list[str], batch: TailBatch) -> None:
        if lines:
            self.stats.lines[stream.key.source] += len(lines)
            batch.lines.setdefault(stream.key, []).extend(lines)



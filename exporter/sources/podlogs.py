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
  process, attributed by folder: ``<root>/<namespace>_<pod>/<any file, up to 2 folders
  deep>``. Files outside such a folder are not read (``TailStats.unattributed_files``).

Files are identified by (device, inode) plus a checksum of their first bytes, never by
name: a rotated file is followed under its new name to its end before the new live file is
read, so lines reach the caller in order. A file that shrinks (copytruncate) or whose first
bytes change (NCCL overwrote its debug file for a new process) starts again at 0 and is
reported in ``TailBatch.restarted``.

Offsets, unfinished ``P`` messages and a small opaque note per stream (the caller's
counters) are saved atomically (write, fsync, rename) in ``<state>/podlogs-state.json`` by
``save_state``. A restarted tailer resumes every known file at its saved offset (nothing
re-read, nothing skipped) and *replays* the first ``start_bytes`` of each resumed stream in
``TailBatch.replayed``, so the caller can rebuild what the NCCL init lines said without
counting them twice. A saved pod-log file that kubelet rotated *and* compressed while the
exporter was down is found again as a ``.gz`` of its stream (``<saved rotated name>.gz``;
for a saved live file, any compressed rotation of its generation) whose decompressed first
bytes match the saved checksum. It is inflated in bounded steps (``file_chunk_bytes`` per
turn, within ``tick_bytes``; at most ``max_decompressed_bytes`` per file, the rest of a
gzip bomb counted in ``TailStats.skipped_bytes["gz_cap"]``), its head replayed, the part
before the saved offset dropped and the rest read like a plain file, before the newer files
of the stream. A corrupt or truncated ``.gz`` is counted (``gz_corrupt``) and left; a
finished one is not read again, nor saved. A ``.gz`` with no saved offset (history before
the first start) is never read.

Files found at the first scan with no saved state are read from the start when the stream
holds at most ``start_bytes``; a larger stream gets its first ``start_bytes`` (where NCCL
prints its init lines) and is then followed from its end, the bytes in between counted in
``TailStats.skipped_bytes``. Files that appear later are read from byte 0.

Work per ``poll`` is bounded: directory listings are reused while a folder's mtime is
unchanged, each file is ``stat``-ed once, at most ``tick_bytes`` are read in all (at most
``file_chunk_bytes`` per file and turn, streams taken in round-robin order), and only lines
containing ``NCCL`` are decoded and returned (every line the NCCL logger writes carries
that word in its prefix). Stream counts per pod and per node are capped; the streams whose files were
modified least recently are dropped first (their offsets are remembered, so a stream that
comes back resumes where it was).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import time
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

SOURCE_POD_LOG = "pod_log"
SOURCE_DEBUG_FILE = "nccl_debug_file"
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
# CRI partial-piece tag (" P " after the stream name); a hit in message text only costs the
# slower joining path.
_PARTIAL_TAG_SEARCH = re.compile(rb" P ")
_NEEDLE_SEARCH = re.compile(re.escape(NEEDLE))


@dataclass(frozen=True)
class TailLimits:
    """Every bound of the tailer; the defaults suit a node with ~100 pods."""

    tick_bytes: int = 16 * 1024 * 1024  # read at most this much per poll, all files together
    file_chunk_bytes: int = 1024 * 1024  # per file and turn
    start_bytes: int = 4 * 1024 * 1024  # head of a stream read (or replayed) when first seen
    max_line_bytes: int = 64 * 1024  # a longer line (or joined P message) is cut to this
    max_streams_per_pod: int = 32
    max_streams: int = 512
    max_entries_per_folder: int = 1024  # directory entries examined per folder and scan
    relist_recent_seconds: float = 2.0  # folders modified this recently are listed every poll
    max_decompressed_bytes: int = 1024 * 1024 * 1024  # inflated from one .gz at most (a gzip bomb)


@dataclass(frozen=True, order=True)
class StreamKey:
    """One log stream: a container run's CRI log, or one NCCL debug file."""

    source: str  # SOURCE_POD_LOG | SOURCE_DEBUG_FILE
    namespace: str
    pod: str
    pod_uid: str  # "" for debug files
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
        if len(parts) != 6 or parts[0] not in (SOURCE_POD_LOG, SOURCE_DEBUG_FILE):
            return None
        return cls(*parts)


@dataclass
class TailStats:
    """Cumulative counters and current gauges of the tailer, for its health metrics."""

    bytes_read: dict[str, int] = field(default_factory=lambda: {SOURCE_POD_LOG: 0, SOURCE_DEBUG_FILE: 0})
    lines: dict[str, int] = field(default_factory=lambda: {SOURCE_POD_LOG: 0, SOURCE_DEBUG_FILE: 0})
    # reason -> bytes not read: initial_cap (busy stream found at start), long_line (cut),
    # vanished (file gone before it was read to its end), and for a .gz resumed from saved
    # state whatever was left of it (its compressed bytes not inflated): gz_cap (past
    # max_decompressed_bytes), gz_corrupt, stream_evicted
    skipped_bytes: dict[str, int] = field(default_factory=dict)
    # reason -> count: long_line, stream_evicted, malformed_cri, truncated, replaced,
    # gz_cap, gz_corrupt (files)
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
    # Streams no longer tailed: every file gone, or evicted by a cap.
    removed: list[StreamKey] = field(default_factory=list)


# ---------------------------------------------------------------------------------------
# Paths


def parse_pod_folder(name: str) -> tuple[str, str, str] | None:
    """``<namespace>_<pod>_<uid>`` → (namespace, pod, uid). Neither name may contain ``_``."""
    parts = name.split("_")
    if len(parts) != 3 or not all(parts):
        return None
    return parts[0], parts[1], parts[2]


def parse_debug_folder(name: str) -> tuple[str, str] | None:
    """``<namespace>_<pod>`` → (namespace, pod), the NCCL debug-file folder convention."""
    parts = name.split("_")
    if len(parts) != 2 or not all(parts):
        return None
    return parts[0], parts[1]


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
    offset: int = 0
    size: int = 0
    head_len: int = 0
    head_crc: int = 0
    skipping: bool = False  # inside an over-long line: drop bytes until the next newline
    mtime: float = 0.0

    @property
    def identity(self) -> tuple[int, int]:
        return self.dev, self.ino

    def to_state(self, root: Path) -> dict:
        return {
            "path": str(self.path.relative_to(root)),
            "dev": self.dev,
            "ino": self.ino,
            "offset": self.offset,
            "head_len": self.head_len,
            "head_crc": self.head_crc,
            "skipping": self.skipping,
        }


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
    # Compressed rotations resumed from saved state, oldest first; read before ``files``.
    compressed: list[_Compressed] = field(default_factory=list)
    partials: dict[str, _Partial] = field(default_factory=dict)
    bootstrapped: bool = False
    resumed: bool = False  # restored from saved state: replay the head, then go on

    def ordered(self) -> list[_File]:
        return sorted(self.files.values(), key=lambda f: (f.order, f.path.name))


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


def _head_checksum(path: Path, length: int) -> int | None:
    try:
        with open(path, "rb") as handle:
            data = handle.read(length)
    except OSError:
        return None
    return zlib.crc32(data) if len(data) == length else None


def _gz_head_checksum(path: Path, identity: tuple[int, int], length: int) -> int | None:
    """Checksum of the first ``length`` decompressed bytes of a .gz (None if it has fewer)."""
    probe = _Compressed(path, identity[0], identity[1], "")
    try:
        head = probe.inflate(length)
    except (zlib.error, EOFError, OSError):
        return None
    return zlib.crc32(head) if len(head) == length else None


def _gz_trailer_size(path: Path, identity: tuple[int, int], size: int) -> int | None:
    """The content size (mod 2**32) a gzip file's trailer states for its last member."""
    trailer = _read_at(path, identity, size - 4, 4) if size >= 18 else None
    return int.from_bytes(trailer, "little") if trailer is not None and len(trailer) == 4 else None


def _read_at(path: Path, identity: tuple[int, int], offset: int, length: int) -> bytes | None:
    """``length`` bytes at ``offset`` of ``path`` if it is still the file ``identity``."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != identity:
            return None
        return os.pread(fd, length, offset)
    except OSError:
        return None
    finally:
        os.close(fd)


class _FolderCache:
    """Directory listings reused while a folder's mtime is unchanged (and not recent)."""

    def __init__(self, limits: TailLimits) -> None:
        self._limits = limits
        self._entries: dict[Path, tuple[int, list[tuple[str, bool]]]] = {}

    def list(self, folder: Path, now: float) -> list[tuple[str, bool]]:
        """(name, is_dir) of at most ``max_entries_per_folder`` entries; [] when unreadable."""
        try:
            st = os.stat(folder)
        except OSError:
            self._entries.pop(folder, None)
            return []
        cached = self._entries.get(folder)
        recent = now - st.st_mtime < self._limits.relist_recent_seconds
        if cached is not None and cached[0] == st.st_mtime_ns and not recent:
            return cached[1]
        entries: list[tuple[str, bool]] = []
        try:
            with os.scandir(folder) as it:
                for entry in it:
                    if len(entries) >= self._limits.max_entries_per_folder:
                        break
                    try:
                        entries.append((entry.name, entry.is_dir(follow_symlinks=False)))
                    except OSError:
                        continue
        except OSError:
            return []
        entries.sort()
        self._entries[folder] = (st.st_mtime_ns, entries)
        return entries

    def forget_missing(self, seen: set[Path]) -> None:
        for folder in [f for f in self._entries if f not in seen]:
            del self._entries[folder]


class PodLogTailer:
    """Incremental reader of pod logs and NCCL debug files; see the module docstring."""

    def __init__(
        self,
        pod_logs: Path | None,
        debug_files: Path | None,
        state_dir: Path | None = None,
        limits: TailLimits | None = None,
    ) -> None:
        self.pod_logs = pod_logs
        self.debug_files = debug_files
        self.state_dir = state_dir
        self.limits = limits or TailLimits()
        self.stats = TailStats()
        self._streams: dict[StreamKey, _Stream] = {}
        self._folders = _FolderCache(self.limits)
        self._first_scan = True
        self._saved = self._load_state()
        self._turn = 0
        self._evicted: OrderedDict[StreamKey, list[_File]] = OrderedDict()
        self._save_failing = False

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
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable tail state %s: %s", path, exc)
            self.stats.state_errors += 1
            return {}
        if not isinstance(raw, dict) or raw.get("version") != STATE_VERSION or not isinstance(raw.get("streams"), dict):
            log.warning("ignoring tail state %s of an unknown version", path)
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

    def _scan(self, now: float) -> list[_Candidate]:
        found: list[_Candidate] = []
        seen_folders: set[Path] = set()
        unattributed = 0
        if self.pod_logs is not None:
            root = self.pod_logs
            seen_folders.add(root)
            for pod_name, is_dir in self._folders.list(root, now):
                parsed = parse_pod_folder(pod_name) if is_dir else None
                if parsed is None:
                    continue
                namespace, pod, uid = parsed
                pod_dir = root / pod_name
                seen_folders.add(pod_dir)
                for container, c_is_dir in self._folders.list(pod_dir, now):
                    if not c_is_dir:
                        continue
                    container_dir = pod_dir / container
                    seen_folders.add(container_dir)
                    for file_name, f_is_dir in self._folders.list(container_dir, now):
                        generation = None if f_is_dir else pod_log_generation(file_name)
                        if generation is None:
                            continue
                        key = StreamKey(SOURCE_POD_LOG, namespace, pod, uid, container, generation[0])
                        self._add_candidate(found, key, container_dir / file_name, generation[1] or "~")
        if self.debug_files is not None:
            root = self.debug_files
            seen_folders.add(root)
            for folder_name, is_dir in self._folders.list(root, now):
                parsed = parse_debug_folder(folder_name) if is_dir else None
                if parsed is None:
                    unattributed += 1
                    continue
                folder = root / folder_name
                seen_folders.add(folder)
                for rel in self._walk(folder, now, depth=3, seen=seen_folders):
                    key = StreamKey(SOURCE_DEBUG_FILE, parsed[0], parsed[1], "", "", rel)
                    self._add_candidate(found, key, folder / rel, "~")
        self._folders.forget_missing(seen_folders)
        self.stats.unattributed_files = unattributed
        return found

    def _walk(self, folder: Path, now: float, depth: int, seen: set[Path], prefix: str = "") -> Iterable[str]:
        for name, is_dir in self._folders.list(folder, now):
            if name.startswith(".") or name.endswith(".gz"):
                continue
            if is_dir:
                if depth > 1:
                    seen.add(folder / name)
                    yield from self._walk(folder / name, now, depth - 1, seen, f"{prefix}{name}/")
            else:
                yield prefix + name

    @staticmethod
    def _add_candidate(found: list[_Candidate], key: StreamKey, path: Path, order: str) -> None:
        try:
            st = os.stat(path)
        except OSError:
            return
        if not (st.st_mode & 0o170000 == 0o100000):  # regular files only
            return
        found.append(_Candidate(key, path, order, st.st_dev, st.st_ino, st.st_size, st.st_mtime))

    def _select_streams(self, found: list[_Candidate], batch: TailBatch) -> dict[StreamKey, list[_Candidate]]:
        """Group candidates by stream and apply the per-pod and per-node stream caps."""
        by_stream: dict[StreamKey, list[_Candidate]] = {}
        for cand in found:
            by_stream.setdefault(cand.key, []).append(cand)
        newest = {key: max(c.mtime for c in cands) for key, cands in by_stream.items()}
        by_pod: dict[tuple[str, str, str], list[StreamKey]] = {}
        for key in by_stream:
            by_pod.setdefault((key.source, key.namespace, key.pod), []).append(key)
        kept: list[StreamKey] = []
        for keys in by_pod.values():
            keys.sort(key=lambda k: (-newest[k], k))
            kept.extend(keys[: self.limits.max_streams_per_pod])
        kept.sort(key=lambda k: (-newest[k], k))
        kept = kept[: self.limits.max_streams]
        kept_set = set(kept)
        for key in by_stream:
            if key not in kept_set and key in self._streams:
                stream = self._streams.pop(key)
                self.stats.event("stream_evicted")
                batch.removed.append(key)
                for comp in stream.compressed:  # not remembered: inflating again is not worth it
                    self.stats.skip("stream_evicted", comp.left())
                self._evicted[key] = list(stream.files.values())
                while len(self._evicted) > self.limits.max_streams:
                    self._evicted.popitem(last=False)
        return {key: by_stream[key] for key in kept}

    # -- polling ---------------------------------------------------------------------

    def poll(self) -> TailBatch:
        """One bounded round: scan, follow renames/truncations, read new complete lines."""
        now = time.time()
        batch = TailBatch()
        selected = self._select_streams(self._scan(now), batch)
        first_scan = self._first_scan
        self._first_scan = False

        for key in [k for k in self._streams if k not in selected]:
            stream = self._streams.pop(key)
            for tracked in stream.files.values():
                self.stats.skip("vanished", max(0, tracked.size - tracked.offset))
            for comp in stream.compressed:
                self.stats.skip("vanished", comp.left())
            batch.removed.append(key)

        budget = self.limits.tick_bytes
        keys = sorted(selected)
        if keys:
            self._turn %= len(keys)
            keys = keys[self._turn:] + keys[: self._turn]
            self._turn += 1
        backlog = 0
        for key in keys:
            stream = self._streams.get(key)
            if stream is None:
                stream = self._open_stream(key, selected[key], first_scan, batch)
                if stream is None:
                    continue
                self._streams[key] = stream
            self._sync_files(stream, selected[key], batch)
            if not stream.bootstrapped:
                if budget <= 0:
                    backlog += sum(f.size for f in stream.files.values())
                    continue
                budget -= self._bootstrap(stream, first_scan, batch)
            for comp in list(stream.compressed):
                if budget <= 0:
                    break
                budget -= self._read_compressed(stream, comp, budget, batch)
                if not comp.done:
                    break
            if stream.compressed:  # older than every plain file: those wait
                backlog += sum(c.left() for c in stream.compressed)
                backlog += sum(max(0, f.size - f.offset) for f in stream.files.values())
                continue
            for tracked in stream.ordered():
                if budget <= 0:
                    break
                budget -= self._read_file(stream, tracked, budget, batch)
                if tracked.offset < tracked.size and tracked.order != "~":
                    break  # finish a rotated file before reading the newer one
            backlog += sum(max(0, f.size - f.offset) for f in stream.files.values())
        self.stats.backlog_bytes = backlog
        self.stats.streams = len(self._streams)
        files = {SOURCE_POD_LOG: 0, SOURCE_DEBUG_FILE: 0}
        for stream in self._streams.values():
            files[stream.key.source] += len(stream.files)
        self.stats.files = files
        return batch

    def _open_stream(self, key: StreamKey, cands: list[_Candidate], first_scan: bool, batch: TailBatch) -> _Stream | None:
        root = self.pod_logs if key.source == SOURCE_POD_LOG else self.debug_files
        assert root is not None
        stream = _Stream(key=key, root=root, cri=key.source == SOURCE_POD_LOG)
        saved = self._saved.pop(key.text(), None)
        note = None
        if saved is not None:
            note = saved.get("note") if isinstance(saved.get("note"), dict) else None
            self._restore(stream, saved, cands)
            stream.resumed = True
        batch.opened[key] = note
        remembered = self._evicted.pop(key, None)
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
        stream.bootstrapped = not first_scan and saved is None
        return stream

    def _restore(self, stream: _Stream, saved: dict, cands: list[_Candidate]) -> None:
        by_identity = {(c.dev, c.ino): c for c in cands}
        claimed: set[str] = set()
        for entry in saved.get("files") or []:
            try:
                identity = (int(entry["dev"]), int(entry["ino"]))
                offset, head_len, head_crc = int(entry["offset"]), int(entry["head_len"]), int(entry["head_crc"])
            except (KeyError, TypeError, ValueError):
                continue
            cand = by_identity.get(identity)
            if cand is None or (head_len and _head_checksum(cand.path, head_len) != head_crc):
                # Rotated away and compressed, or deleted, while we were down (its inode may
                # hold another file now).
                saved_name = Path(str(entry.get("path", ""))).name
                comp = self._find_compressed(stream, cands, saved_name, head_len, head_crc, claimed)
                if comp is not None:
                    comp.offset, comp.skipping = offset, bool(entry.get("skipping"))
                    stream.compressed.append(comp)
                continue
            tracked = _File(cand.path, cand.dev, cand.ino, cand.order, offset=min(offset, cand.size), size=cand.size,
                            head_len=head_len, head_crc=head_crc, skipping=bool(entry.get("skipping")),
                            mtime=cand.mtime)
            if offset > cand.size:
                self.stats.event("truncated")
                tracked.offset, tracked.skipping = 0, False
            stream.files[identity] = tracked
        stream.compressed.sort(key=lambda c: (c.order, c.path.name))
        for name, value in (saved.get("partials") or {}).items():
            try:
                data = base64.b64decode(value["data"])
            except (KeyError, TypeError, ValueError):
                continue
            stream.partials[str(name)] = _Partial(bytearray(data[: self.limits.max_line_bytes]), bool(value.get("cut")))

    def _find_compressed(
        self, stream: _Stream, cands: list[_Candidate], saved_name: str, head_len: int, head_crc: int, claimed: set[str]
    ) -> _Compressed | None:
        """The ``.gz`` that a saved pod-log file became, if its decompressed head matches.

        A saved rotated file must be ``<its name>.gz``; a saved ``.gz`` (read halfway
        before a restart) keeps its name; a saved live file may be any compressed rotation
        of its generation. Only the first ``head_len`` bytes are inflated to check.
        """
        if stream.key.source != SOURCE_POD_LOG or not cands or not head_len:
            return None
        folder = cands[0].path.parent
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
            names = [
                name
                for name, is_dir in self._folders.list(folder, time.time())
                if not is_dir and (pod_log_compressed_generation(name) or ("",))[0] == saved[0]
            ]
        for name in names:
            path = folder / name
            try:
                st = os.stat(path)
            except OSError:
                continue
            if name in claimed or st.st_mode & 0o170000 != 0o100000:
                continue
            identity = (st.st_dev, st.st_ino)
            if _gz_head_checksum(path, identity, head_len) != head_crc:
                continue
            claimed.add(name)
            stamp = (pod_log_compressed_generation(name) or ("", ""))[1]
            return _Compressed(path, st.st_dev, st.st_ino, stamp, size=st.st_size, head_len=head_len,
                               head_crc=head_crc, trailer_size=_gz_trailer_size(path, identity, st.st_size))
        return None

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
        end = data.rfind(b"\n")
        if end >= 0:
            self._deliver(stream, extract_lines(data[: end + 1], stream.cri, stream.partials, self.limits, self.stats), batch)
        stream.partials.clear()
        for tracked in ordered:
            skipped_from = (end + 1) if tracked is head and end >= 0 else 0
            self.stats.skip("initial_cap", tracked.size - skipped_from)
            tracked.offset = tracked.size
            tracked.skipping = tracked.size > 0 and _read_at(tracked.path, tracked.identity, tracked.size - 1, 1) != b"\n"
            self._remember_head(tracked)
        return used

    def _sync_files(self, stream: _Stream, cands: list[_Candidate], batch: TailBatch) -> None:
        """Follow renames, notice new, vanished, truncated and replaced files."""
        current = {(c.dev, c.ino): c for c in cands}
        for identity in [i for i in stream.files if i not in current]:
            gone = stream.files.pop(identity)
            self.stats.skip("vanished", max(0, gone.size - gone.offset))
        for identity, cand in current.items():
            tracked = stream.files.get(identity)
            if tracked is None:
                stream.files[identity] = _File(cand.path, cand.dev, cand.ino, cand.order, size=cand.size,
                                               mtime=cand.mtime)
                continue
            tracked.path, tracked.order, tracked.mtime = cand.path, cand.order, cand.mtime
            replaced = False
            if cand.size != tracked.size and tracked.head_len:
                replaced = _head_checksum(cand.path, tracked.head_len) != tracked.head_crc
            if cand.size < tracked.offset or replaced:
                self.stats.event("replaced" if replaced and cand.size >= tracked.offset else "truncated")
                tracked.offset, tracked.skipping, tracked.head_len, tracked.head_crc = 0, False, 0, 0
                stream.partials.clear()
                # A debug file is rewritten by a new process; a pod log (copytruncate) goes on.
                if stream.key not in batch.restarted and stream.key.source == SOURCE_DEBUG_FILE:
                    batch.restarted.append(stream.key)
            tracked.size = cand.size

    def _remember_head(self, tracked: _File) -> None:
        if tracked.head_len >= HEAD_BYTES or tracked.size <= tracked.head_len:
            return
        length = min(HEAD_BYTES, tracked.size)
        crc = _head_checksum(tracked.path, length)
        if crc is not None:
            tracked.head_len, tracked.head_crc = length, crc

    def _read_file(self, stream: _Stream, tracked: _File, budget: int, batch: TailBatch) -> int:
        """Read one chunk of new bytes; consume complete lines; return bytes read."""
        self._remember_head(tracked)
        want = min(tracked.size - tracked.offset, self.limits.file_chunk_bytes, budget)
        if want <= 0:
            return 0
        data = _read_at(tracked.path, tracked.identity, tracked.offset, want)
        if not data:
            return 0
        self.stats.bytes_read[stream.key.source] += len(data)
        if (tracked.order != "~" and tracked.offset + len(data) >= tracked.size and not data.endswith(b"\n")
                and time.time() - tracked.mtime >= ROTATED_QUIET_SECONDS):
            # The end of a rotated file that no longer grows: its last line will never get a
            # newline, and waiting for one would hold back every newer file of the stream.
            tracked.offset += min(len(data), self._consume(stream, tracked, data + b"\n", batch))
            return len(data)
        tracked.offset += self._consume(stream, tracked, data, batch)
        return len(data)

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
                self.stats.event("long_line")
                self.stats.skip("long_line", len(data) - start)
                tracked.skipping = True
                return len(data)
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



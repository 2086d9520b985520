"""The lines of a log block that may carry NCCL output, decoded (the hot path: C-level search
over whole chunks, Python only per hit), CRI records taken apart and their pieces joined."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from exporter.sources.podlogs.limits import TailLimits, TailStats

NEEDLE = b"NCCL"
CRI_STREAMS = (b"stdout", b"stderr")
CRI_STREAM_NAMES = ("stdout", "stderr")
# CRI partial-piece tag (" P " after the stream name); a hit in message text only costs the
# slower joining path.
PARTIAL_TAG_SEARCH = re.compile(rb" P ")
NEEDLE_SEARCH = re.compile(re.escape(NEEDLE))


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
    for match in NEEDLE_SEARCH.finditer(block, 0, stop):
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
    if len(parts) < 3 or parts[1] not in CRI_STREAMS:
        return None
    return parts[1], parts[2], parts[3] if len(parts) == 4 else b""


@dataclass
class Partial:
    """A CRI message being joined from P pieces (per stdout/stderr)."""

    data: bytearray = field(default_factory=bytearray)
    cut: bool = False


def extract_lines(
    block: bytes,
    cri: bool,
    partials: dict[str, Partial],
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
        any(p.data or p.cut for p in partials.values()) or PARTIAL_TAG_SEARCH.search(block, 0, stop) is not None
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
    block: bytes, stop: int, partials: dict[str, Partial], limits: TailLimits, stats: TailStats
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
        partial = partials.setdefault(stream_name.decode(), Partial())
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

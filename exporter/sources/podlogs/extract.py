"""The lines of a log block that may carry NCCL output, decoded (the hot path: C-level search
over whole chunks, Python only per hit); in a pod log, the messages of its CRI records (read
by ``cri``, the format's one reader)."""

from __future__ import annotations

import functools
import re

from exporter.sources.podlogs.cri import CRI_RE_BYTES, PARTIAL_TAG_SEARCH, CriJoiner
from exporter.sources.podlogs.limits import NCCL_NEEDLE, TailLimits, TailStats

NEEDLE = NCCL_NEEDLE
# ``re``'s literal search scans about twice as fast as ``bytes.find`` for a short needle.
NEEDLE_SEARCH = re.compile(re.escape(NEEDLE))


@functools.lru_cache(maxsize=8)
def needle_search(needle: bytes) -> re.Pattern[bytes]:
    """The compiled literal search for ``needle`` (one per needle a tailer uses)."""
    return NEEDLE_SEARCH if needle == NEEDLE else re.compile(re.escape(needle))


def extract_lines(
    block: bytes,
    cri: bool,
    joiner: CriJoiner[bytes],
    limits: TailLimits,
    stats: TailStats,
    stop: int | None = None,
    needle: bytes = NEEDLE,
) -> list[str]:
    """The lines of ``block[:stop]`` (complete lines only) that carry ``needle``, decoded; see
    ``extract_lines_upto``."""
    return extract_lines_upto(block, cri, joiner, limits, stats, stop, needle)[0]


def extract_lines_upto(
    block: bytes,
    cri: bool,
    joiner: CriJoiner[bytes],
    limits: TailLimits,
    stats: TailStats,
    stop: int | None = None,
    needle: bytes = NEEDLE,
    max_lines: int | None = None,
) -> tuple[list[str], int]:
    """The lines of ``block[:stop]`` (complete lines only) that carry ``needle`` (``NCCL``
    unless the tailer selects others), decoded, at most ``max_lines`` of them; and where in
    ``block`` reading stopped: ``stop``, or with ``max_lines`` lines taken, the start of the
    next line that would have been one more (a line boundary; the joiner has seen every line
    before it, none after).

    In a pod log (``cri``) a line is the message of a record, its pieces joined by ``joiner``
    from one call to the next; a line that is not a record is counted (``malformed_cri``) and
    taken whole. A line is returned when ``NCCL`` is in what is returned: in the message (not
    only in a record's framing), within ``max_line_bytes`` (the rest is cut and counted,
    ``long_line``).

    The fast path touches only lines that contain ``NCCL`` (C-level search over the whole
    chunk). It gives way to the record-by-record path when a line may be in pieces: a piece
    is pending from the last chunk, or ``cri.PARTIAL_TAG_SEARCH`` finds a ``P`` record in the
    chunk (one C-level scan). Runtimes split a line anywhere (CRI-O at its read-buffer
    boundaries), even inside ``NCCL``. Both paths return the same lines and count alike.
    """
    stop = len(block) if stop is None else stop
    most = len(block) + 1 if max_lines is None else max_lines
    if cri and (joiner.pending or PARTIAL_TAG_SEARCH.search(block, 0, stop) is not None):
        return _extract_joining_pieces(block, stop, joiner, limits, stats, needle, most)
    return _extract_whole_lines(block, stop, cri, limits, stats, needle, most)


def _extract_whole_lines(
    block: bytes, stop: int, cri: bool, limits: TailLimits, stats: TailStats, needle: bytes, most: int
) -> tuple[list[str], int]:
    """The fast path of ``extract_lines``: every line is whole (no ``P`` record in the block)."""
    out: list[str] = []
    cut = stop
    max_line = limits.max_line_bytes
    match_record = CRI_RE_BYTES.match
    rfind, find = block.rfind, block.find
    malformed = 0
    line_end = -1
    for found in needle_search(needle).finditer(block, 0, stop):
        hit = found.start()
        if hit < line_end:
            continue  # a second NCCL on a line already taken
        start = rfind(b"\n", 0, hit) + 1
        if len(out) >= most:
            cut = start
            break
        line_end = find(b"\n", hit, stop)
        if line_end < 0:
            line_end = stop
        end = line_end
        if block[end - 1] == 13:  # a CR before the newline belongs to the line end
            end = start + len(block[start:end].rstrip(b"\r"))
        if cri:
            record = match_record(block, start, end)
            if record is None:
                malformed += 1
            else:
                start = record.end()
                if hit < start and find(needle, start, end) < 0:
                    continue  # the needle only in the record's framing
        if end - start > max_line:
            if find(needle, start, start + max_line) < 0:
                continue  # the needle only beyond the cap
            stats.event("long_line")
            stats.skip("long_line", end - start - max_line)
            end = start + max_line
        out.append(block[start:end].decode("utf-8", "replace"))
    if malformed:
        stats.event("malformed_cri", malformed)
    return out, cut


def _extract_joining_pieces(
    block: bytes, stop: int, joiner: CriJoiner[bytes], limits: TailLimits, stats: TailStats, needle: bytes, most: int
) -> tuple[list[str], int]:
    """Record by record, ``P`` pieces joined with their ``F`` end by ``joiner``."""
    out: list[str] = []
    max_line = limits.max_line_bytes
    partials = joiner.partials  # an entry per stream whose line is in pieces
    read = joiner.read
    position = 0  # where the line being looked at starts in block
    for line in block[:stop].split(b"\n"):
        if len(out) >= most:
            return out, position
        position += len(line) + 1
        if not partials and needle not in line and b" P" not in line:
            continue  # no line in pieces, no P tag, no needle: nothing to join, nothing to hand on
        line = line.rstrip(b"\r")
        if not line:
            continue
        record = read(line)
        if record is None:  # not a record: taken whole
            if needle not in line:
                continue
            stats.event("malformed_cri")
            record = line[:max_line], max(0, len(line) - max_line), len(line) > max_line
        whole, dropped, cut = record
        if whole is None:
            if dropped:
                stats.skip("long_line", dropped)  # of a piece, beyond the cap
        elif needle in whole:
            if cut:
                stats.event("long_line")
                stats.skip("long_line", dropped)
            out.append(whole.decode("utf-8", "replace"))
    return out, stop

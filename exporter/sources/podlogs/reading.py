"""Reading on in a stream within a byte budget and a line budget: its head at start (replayed,
or read up to the start cap), then its compressed rotations and plain files in rotation order,
complete lines only; an over-long line is dropped to its end. A turn that has handed back as
many lines as it may stops at a line boundary; the rest is read again at the stream's next turn."""

from __future__ import annotations

import logging
import zlib

from exporter.sources.podlogs.compressed import Compressed
from exporter.sources.podlogs.cri import CriJoiner
from exporter.sources.podlogs.extract import extract_lines, extract_lines_upto
from exporter.sources.podlogs.files import ROTATED_QUIET_SECONDS, File, read_at
from exporter.sources.podlogs.limits import NCCL_NEEDLE, TailBatch, TailLimits, TailStats
from exporter.sources.podlogs.stream import Stream

log = logging.getLogger(__name__)


class StreamReader:
    """Reads streams for one tailer (``turn``), counting in ``stats``; hands back the lines
    containing ``needle``."""

    def __init__(self, limits: TailLimits, stats: TailStats, needle: bytes = NCCL_NEEDLE) -> None:
        self.limits = limits
        self.stats = stats
        self.needle = needle

    def turn(
        self, stream: Stream, budget: int, first_scan: bool, batch: TailBatch, now: float, max_lines: int = 1 << 62
    ) -> tuple[int, int]:
        """One turn of a stream: its bootstrap, then reading on in file order, until ``budget``
        bytes are read or ``max_lines`` (at least 1) lines handed back; (bytes read, lines).
        A bootstrap hands back what the stream's head holds, whatever ``max_lines`` is."""
        delivered = len(batch.lines.get(stream.key, ()))
        used = 0
        if not stream.bootstrapped:
            used = self._bootstrap(stream, first_scan, batch)

        def lines_left() -> int:
            return max_lines - (len(batch.lines.get(stream.key, ())) - delivered)

        for comp in list(stream.compressed):
            if used >= budget or lines_left() <= 0:
                return used, max_lines - lines_left()
            used += self._read_compressed(stream, comp, budget - used, batch, lines_left())
            if not comp.done:
                return used, max_lines - lines_left()  # older than every plain file: those wait
        for tracked in stream.ordered():
            if used >= budget or lines_left() <= 0:
                break
            used += self._read_file(stream, tracked, budget - used, batch, now, lines_left())
            if tracked.rotated and tracked.offset < tracked.size:
                break  # finish a rotated file before reading the newer one
        return used, max_lines - lines_left()

    def _bootstrap(self, stream: Stream, first_scan: bool, batch: TailBatch) -> int:
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
                if isinstance(tracked, Compressed):  # inflated once, then read on from here
                    data = self._inflate(stream, tracked, length)
                else:
                    data = read_at(tracked.path, tracked.identity, 0, length) or b""
                used += len(data)
                end = data.rfind(b"\n")
                if end >= 0:
                    pieces: CriJoiner[bytes] = CriJoiner(self.limits.max_line_bytes)  # a replay joins within a file
                    replay += extract_lines(
                        data[: end + 1], stream.cri, pieces, self.limits, scratch, needle=self.needle
                    )
            if replay:
                batch.replayed[stream.key] = replay
            return used
        # First scan, no saved state: read everything if it is small, else the head then the end.
        total = sum(f.size for f in stream.files.values())
        if total <= cap:
            return 0
        ordered = stream.ordered()
        head = ordered[0]
        data = read_at(head.path, head.identity, 0, cap) or b""
        used = len(data)
        self.stats.bytes_read[stream.key.source] += used
        end = data.rfind(b"\n")
        if end >= 0:
            lines = extract_lines(
                data[: end + 1], stream.cri, stream.joiner, self.limits, self.stats, needle=self.needle
            )
            self._deliver(stream, lines, batch)
        stream.joiner.partials.clear()
        for tracked in ordered:
            skipped_from = (end + 1) if tracked is head and end >= 0 else 0
            self.stats.skip("initial_cap", tracked.size - skipped_from)
            tracked.offset = tracked.read_to = tracked.size
            tracked.skipping = (
                tracked.size > 0 and read_at(tracked.path, tracked.identity, tracked.size - 1, 1) != b"\n"
            )
            tracked.remember_head()
        return used

    def _read_file(
        self, stream: Stream, tracked: File, budget: int, batch: TailBatch, now: float, max_lines: int
    ) -> int:
        """Read on in one file and deliver its complete lines (at most ``max_lines``); return
        the bytes read (those read again at the next turn, after the last line delivered, not).

        After an unfinished last line, a few new bytes are read alone until a newline comes,
        then the line once more; many new bytes (8 times the line or more) are read in one go
        with the line, which is cheaper than joining them.
        """
        tracked.remember_head()
        start = max(tracked.offset, tracked.read_to)
        pending = start - tracked.offset  # an unfinished line, read before
        want = min(tracked.size - start, self.limits.file_chunk_bytes, budget - pending)
        quiet = tracked.rotated and now - tracked.mtime >= ROTATED_QUIET_SECONDS
        if want <= 0 and not (quiet and pending and tracked.size <= start):
            return 0
        source = stream.key.source
        if pending and want >= 8 * pending:
            data = read_at(tracked.path, tracked.identity, tracked.offset, pending + want) or b""
            if len(data) <= pending:
                return 0
            self.stats.bytes_read[source] += len(data) - pending
        else:
            fresh = b""
            if want > 0:
                fresh = read_at(tracked.path, tracked.identity, start, want) or b""
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
                line_start = read_at(tracked.path, tracked.identity, tracked.offset, pending)
                if line_start is None or len(line_start) != pending:
                    return len(fresh)  # changed under us: the next scan tells how
                data = line_start + fresh
        if quiet and tracked.offset + len(data) >= tracked.size and not data.endswith(b"\n"):
            # The end of a rotated file that no longer grows: its last line will never get a
            # newline, and waiting for one would hold back every newer file of the stream.
            done, cut = self._consume(stream, tracked, data + b"\n", batch, max_lines)
            done = min(len(data), done)
        else:
            done, cut = self._consume(stream, tracked, data, batch, max_lines)
        if cut:
            # Lines are left in what was read: read them again at the next turn (counted once).
            start = max(tracked.offset, tracked.read_to)
            end = tracked.offset + done
            self.stats.bytes_read[source] -= tracked.offset + len(data) - end
            tracked.offset = tracked.read_to = end
            return end - start
        tracked.read_to = tracked.offset + len(data)
        tracked.offset += done
        return len(data)

    def _drop_fragment(self, tracked: File, length: int) -> int:
        """An unfinished line already as long as a line may be: drop it, and the rest of it
        up to its newline; return ``length``."""
        self.stats.event("long_line")
        self.stats.skip("long_line", length)
        tracked.skipping = True
        return length

    def _consume(
        self, stream: Stream, tracked: File, data: bytes, batch: TailBatch, max_lines: int
    ) -> tuple[int, bool]:
        """Deliver the complete lines of ``data`` (the bytes at ``tracked.offset``), at most
        ``max_lines``; return how many bytes are done with, and whether complete lines are left
        (``max_lines`` reached). The rest is read again later: an unfinished line, or those lines."""
        start = 0
        if tracked.skipping:
            newline = data.find(b"\n")
            if newline < 0:
                self.stats.skip("long_line", len(data))
                return len(data), False
            self.stats.skip("long_line", newline + 1)
            tracked.skipping = False
            start = newline + 1
        end = data.rfind(b"\n")
        if end < start:
            # No complete line yet. A fragment longer than a line may be is dropped to its end.
            if len(data) - start >= self.limits.max_line_bytes:
                return start + self._drop_fragment(tracked, len(data) - start), False
            return start, False
        lines, stopped = extract_lines_upto(
            data if start == 0 else data[start:],
            stream.cri,
            stream.joiner,
            self.limits,
            self.stats,
            stop=end + 1 - start,
            needle=self.needle,
            max_lines=max_lines,
        )
        self._deliver(stream, lines, batch)
        return start + stopped, start + stopped < end + 1

    def _read_compressed(self, stream: Stream, comp: Compressed, budget: int, batch: TailBatch, max_lines: int) -> int:
        """Inflate one chunk of a compressed rotation: drop what lies before the saved offset,
        read lines after it (at most ``max_lines``; complete lines left over wait in ``carry``,
        and nothing more is inflated while a chunk of them waits). Finish the file at its end, at
        the decompression cap or at an error. Returns the decompressed bytes handled (the work done)."""
        if comp.trailer_size == comp.offset % (1 << 32):
            self._finish_compressed(stream, comp)  # the trailer says nothing follows the saved offset
            return 0
        want = min(self.limits.file_chunk_bytes, budget, self.limits.max_decompressed_bytes - comp.position)
        if len(comp.carry) >= self.limits.file_chunk_bytes:
            want = 0  # hand back the lines already inflated first
        used = 0
        if want > 0 and comp.position < comp.offset:  # read before the restart
            used = len(self._inflate(stream, comp, min(want, comp.offset - comp.position)))
            want -= used
        data = b""
        if want > 0 and comp.position >= comp.offset and not comp.done:
            data = self._inflate(stream, comp, want)
        cut = False
        if data or (comp.carry and not comp.done and b"\n" in comp.carry):
            self.stats.bytes_read[stream.key.source] += len(data)
            block = comp.carry + data if comp.carry else data
            consumed, cut = self._consume(stream, comp, block, batch, max_lines)
            comp.offset += consumed
            comp.carry = block[consumed:]
        if comp.done:
            return used + len(data)
        if comp.ended and not cut:
            if comp.carry:  # a last line without its newline: nothing more will come
                self._consume(stream, comp, comp.carry + b"\n", batch, max(1, max_lines))
                comp.offset, comp.carry = comp.offset + len(comp.carry), b""
            self._finish_compressed(stream, comp)
        elif comp.position >= self.limits.max_decompressed_bytes:
            self.stats.event("gz_cap")
            self._finish_compressed(stream, comp, "gz_cap")
        return used + len(data)

    def _inflate(self, stream: Stream, comp: Compressed, want: int) -> bytes:
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

    def _finish_compressed(self, stream: Stream, comp: Compressed, skip_reason: str | None = None) -> None:
        """Stop reading a compressed rotation (its state is not saved again); count what is
        left of it under ``skip_reason``."""
        if skip_reason is not None:
            self.stats.skip(skip_reason, comp.left())
        comp.done = True
        comp.carry = comp.pending = b""
        stream.compressed = [c for c in stream.compressed if c is not comp]

    def _deliver(self, stream: Stream, lines: list[str], batch: TailBatch) -> None:
        if lines:
            self.stats.lines[stream.key.source] += len(lines)
            batch.lines.setdefault(stream.key, []).extend(lines)

"""``ccl-exporter analyze [--json] PATH...``: offline verdict on NCCL logs.

Files and folders (walked, sorted) are read as one log stream — one job's logs, whatever
their wrappers: plain text, ``.gz`` rotated logs, CRI pod logs (partial lines joined).

Reading takes the pod-log tailer's fast path: each block of input is searched at C speed for the
few words a line the analyzer can use must hold (``exporter.nccl.reader.LINE_NEEDLES``), and only
those lines are decoded and fed; a block with a CRI partial record (or a line in pieces from the
block before) is read line by line, as a partial line may hide a word. The verdict is the one a
line-by-line reading gives. With a terminal on stderr and more than ``PROGRESS_MIN_BYTES`` of
input, progress is shown there.

Exit codes: 0 no fallback shown (RDMA, or one node), 3 TCP fallback, 4 the log does not show
enough to tell ("cannot tell" is an answer, never silence), 1 an input cannot be read (one line on
stderr, no verdict on stdout: a verdict on part of a job's logs would be a guess) or the
``--html`` page cannot be written, 2 usage. ``--html OUT`` writes a self-contained page
(``exporter.commands.analyze_report``) besides the usual output.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO, TextIO

from exporter.nccl import LogAnalyzer, Verdict
from exporter.nccl.reader import LINE_NEEDLES
from exporter.nccl.verdict import transport_key
from exporter.sources.podlogs.cri import CRI_RE_BYTES, CriJoiner
from exporter.sources.podlogs.extract import NEEDLE, NEEDLE_SEARCH

EXIT_OK = 0
EXIT_UNREADABLE = 1
EXIT_TCP_FALLBACK = 3
EXIT_CANNOT_TELL = 4
EXIT_CODES = {"rdma": EXIT_OK, "single_node": EXIT_OK, "tcp_fallback": EXIT_TCP_FALLBACK, "unknown": EXIT_CANNOT_TELL}
# What a job needs so that its log shows the transport (every line the verdict reads is INIT or NET).
LOGGING_HINT = "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET"
_CHUNK = 4 << 20
# The words a usable line holds, each found by a C-level search over a whole block: ``NCCL`` with
# the tailer's own search (so both hand over the same records), then the words of bare message
# bodies. Those are searched without their leading space (a superset of lines, which the analyzer
# sorts out): ``re``'s literal search runs as fast as its first byte is rare, and a space is the
# commonest byte of a log. Where that first byte is rare in a block, memchr to each and a check
# beats even that (about 3x on training output); where it is not, ``re`` scans.
_BARE_WORDS = tuple(word.lstrip(" ").encode() for word in LINE_NEEDLES if NEEDLE.decode() not in word)
_BARE_SEARCHES = {word: re.compile(re.escape(word)) for word in _BARE_WORDS}
# cri.PARTIAL_TAG_SEARCH (" P" then " " or ":") without its space, which is checked at each hit.
_PARTIAL_TAG_AFTER_SPACE = re.compile(rb"P[ :]")
# Candidates per block byte under which checking candidates is cheaper than a scan (a check costs
# what an re scan does over about 2 KiB).
_CANDIDATES_PER_BYTE = 1 / 2048
_RE_ONLY_BLOCKS = 16
# A record framing the bytes and text patterns read alike: printable ASCII (the text pattern's
# \\s also matches \\x1c-\\x1f and non-ASCII spaces, its \\d non-ASCII digits).
_PLAIN_FRAMING = re.compile(rb"[\x20-\x7e]*")
PROGRESS_MIN_BYTES = 64 << 20
PROGRESS_EVERY_SECONDS = 0.5


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], environ: Mapping[str, str]
) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "analyze",
        help="offline verdict on NCCL logs: RDMA or TCP fallback",
        description="Read NCCL_DEBUG=INFO logs (files or folders; plain, .gz or CRI pod logs; any NCCL "
        "2.3-2.30 and any launcher wrapper) as one job and say whether inter-node traffic runs on "
        "RDMA or fell back to TCP. Exit 0 no fallback shown (RDMA, or one node), 3 TCP fallback, "
        "4 the log does not show enough to tell, 1 unreadable input (nothing on stdout), 2 usage.",
    )
    parser.add_argument("--json", action="store_true", help="print exactly one JSON object")
    parser.add_argument(
        "--html",
        metavar="OUT",
        help="also write a self-contained page to OUT: the verdict and its deciding lines, nodes with their "
        "ranks and GPUs, inter-node connections coloured by transport (TCP red, RDMA without GPUDirect amber)",
    )
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="log file or folder; - reads standard input (e.g. kubectl logs POD | ccl-exporter analyze -)",
    )
    parser.set_defaults(handler=run)
    return parser


def standalone_main(argv: Sequence[str]) -> int:
    """``ccl-exporter analyze ARGS``, parsed and run without the other commands (``exporter.commands.main``)."""
    parser = argparse.ArgumentParser(prog="ccl-exporter")
    add_parser(parser.add_subparsers(dest="command", metavar="COMMAND", required=True), os.environ)
    args = parser.parse_args(["analyze", *argv])
    return int(args.handler(args) or 0)


def iter_files(path: Path) -> Iterator[Path]:
    """The file itself, or every file under a folder in sorted order (symlinked folders not followed)."""
    if not path.is_dir():
        yield path
        return
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            yield Path(root) / name


STDIN = Path("-")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _open(path: Path) -> tuple[BinaryIO, BinaryIO]:
    """(the stream to read, the file under it: its position is the progress of a .gz)."""
    if path == STDIN:  # a buffered reader over fd 0 that can peek; closing it leaves fd 0 open
        raw = open(sys.stdin.fileno(), "rb", closefd=False)  # noqa: SIM115 - closed by the caller
    else:
        raw = open(path, "rb")  # noqa: SIM115 - closed by the caller
    head = raw.peek(2)[:2] if hasattr(raw, "peek") else b""
    if head == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=raw), raw  # type: ignore[return-value]  # reads like any BinaryIO
    return raw, raw


class Progress:
    """``analyze: 120 of 512 MB (23%)`` on a terminal, rewritten in place at most every
    ``PROGRESS_EVERY_SECONDS``, erased at the end. Silent unless ``enabled``."""

    def __init__(
        self, total_bytes: int, out: TextIO, enabled: bool, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.total = max(1, total_bytes)
        self.out = out
        self.enabled = enabled
        self.done = 0  # bytes of the files already finished
        self._clock = clock
        self._last = clock()
        self._shown = 0

    @classmethod
    def for_inputs(cls, paths: list[Path], out: TextIO) -> Progress:
        total = 0
        for path in paths:
            try:
                total += path.stat().st_size
            except OSError:
                continue
        return cls(total, out, total >= PROGRESS_MIN_BYTES and out.isatty())

    def at(self, position: int) -> None:
        """``position`` bytes of the current file are read."""
        now = self._clock()
        if not self.enabled or now - self._last < PROGRESS_EVERY_SECONDS:
            return
        self._last = now
        done = min(self.done + position, self.total)
        text = f"analyze: {done / 1e6:.0f} of {self.total / 1e6:.0f} MB ({100 * done / self.total:.0f}%)"
        self.out.write("\r" + text.ljust(self._shown))
        self.out.flush()
        self._shown = len(text)

    def finished_file(self, size: int) -> None:
        self.done += size

    def close(self) -> None:
        if self._shown:
            self.out.write("\r" + " " * self._shown + "\r")
            self.out.flush()
            self._shown = 0


def _whole_line_text(line: bytes, joiner: CriJoiner[str]) -> str | None:
    """What ``joiner.feed`` gives for ``line`` (no piece pending, not a P record), without its
    work where the bytes say for sure: an F record whose framing is plain ASCII (there the text
    and bytes patterns of ``cri`` agree) is its message; a line whose first byte is an ASCII
    non-digit is no record (both patterns start with four digits). Else the joiner decides."""
    line = line.rstrip(b"\r\n")
    record = CRI_RE_BYTES.match(line)
    if record is not None:
        if record.group("partial") is None and _PLAIN_FRAMING.fullmatch(line, 0, record.end()) is not None:
            return line[record.end() :].decode("utf-8", "replace")
    elif line and line[0] < 0x80 and not 0x30 <= line[0] <= 0x39:
        return line.decode("utf-8", "replace")
    return joiner.feed(line.decode("utf-8", "replace"))


def _line_start(block: bytes, begin: int, position: int) -> int:
    newline = block.rfind(b"\n", begin, position)
    return begin if newline < 0 else newline + 1


def _scan(block: bytes, begin: int, stop: int, search: re.Pattern[bytes], ends: dict[int, int]) -> None:
    """Add the lines of ``block[begin:stop]`` (``begin`` a line start) that ``search`` finds to
    ``ends`` (start -> end)."""
    find = block.find
    line_end = -1
    for found in search.finditer(block, begin, stop):
        hit = found.start()
        if hit < line_end:
            continue  # the line is taken already
        line_end = find(b"\n", hit, stop)
        ends[_line_start(block, begin, hit)] = line_end


class _RareBytes:
    """Where memchr over a rare byte paid off in the blocks of one input: after a block where the
    byte was not rare, the next ``_RE_ONLY_BLOCKS`` blocks use ``re`` at once."""

    def __init__(self) -> None:
        self.re_only: dict[bytes, int] = {}

    def worth_trying(self, key: bytes) -> bool:
        left = self.re_only.get(key, 0)
        if left:
            self.re_only[key] = left - 1
        return not left

    def not_rare(self, key: bytes) -> None:
        self.re_only[key] = _RE_ONLY_BLOCKS


def _find_word(block: bytes, begin: int, stop: int, word: bytes, ends: dict[int, int], rare_bytes: _RareBytes) -> None:
    """``_scan`` for ``word``: memchr to each of its first bytes and a check there, while they
    are few; past ``_CANDIDATES_PER_BYTE`` of them, the ``re`` scan does the rest of the block."""
    search = _BARE_SEARCHES[word]
    if not rare_bytes.worth_trying(word):
        _scan(block, begin, stop, search, ends)
        return
    find, startswith = block.find, block.startswith
    first = word[:1]
    budget = int((stop - begin) * _CANDIDATES_PER_BYTE) + 1
    position = find(first, begin, stop)
    while position >= 0:
        budget -= 1
        if budget < 0:
            rare_bytes.not_rare(word)
            _scan(block, _line_start(block, begin, position), stop, search, ends)
            return
        if startswith(word, position):
            line_end = find(b"\n", position, stop)
            ends[_line_start(block, begin, position)] = line_end
            position = find(first, line_end + 1, stop)  # the next line
        else:
            position = find(first, position + 1, stop)


def _may_hold_a_partial_record(block: bytes, begin: int, stop: int, rare_bytes: _RareBytes) -> bool:
    """Whether ``cri.PARTIAL_TAG_SEARCH`` finds `` P `` or `` P:`` in ``block[begin:stop]``:
    memchr to each ``P`` while they are few, then an ``re`` search for ``P[ :]`` with a space
    before."""
    first = begin + 1  # the earliest P with a space before it in the range
    if rare_bytes.worth_trying(b"P"):
        find = block.find
        budget = int((stop - begin) * _CANDIDATES_PER_BYTE) + 1
        position = find(b"P", first, stop)
        while position >= 0:
            budget -= 1
            if budget < 0:
                rare_bytes.not_rare(b"P")
                break
            if block[position - 1] == 0x20 and position + 1 < stop and block[position + 1] in (0x20, 0x3A):
                return True
            position = find(b"P", position + 1, stop)
        else:
            return False
        first = position
    return any(block[found.start() - 1] == 0x20 for found in _PARTIAL_TAG_AFTER_SPACE.finditer(block, first, stop))


def _usable_lines(
    block: bytes, begin: int, stop: int, max_bytes: int, joiner: CriJoiner[str], rare_bytes: _RareBytes
) -> list[str]:
    """The lines of ``block[begin:stop]`` (complete lines) the analyzer may use, through ``joiner``."""
    out: list[str] = []
    if joiner.pending or _may_hold_a_partial_record(block, begin, stop, rare_bytes):
        lines = block[begin:stop].split(b"\n")
        lines.pop()  # after the last newline: nothing
        for line in lines:  # a line may be in pieces: every record goes to the joiner
            text = joiner.feed(line[:max_bytes].decode("utf-8", "replace"))
            if text is not None:
                out.append(text)
        return out
    ends: dict[int, int] = {}  # line start -> its end, for each line holding a needle
    _scan(block, begin, stop, NEEDLE_SEARCH, ends)
    for word in _BARE_WORDS:
        _find_word(block, begin, stop, word, ends, rare_bytes)
    for start in sorted(ends):
        text = _whole_line_text(block[start : min(ends[start], start + max_bytes)], joiner)
        if text is not None:
            out.append(text)
    return out


def read_usable_lines(
    stream: BinaryIO, max_bytes: int, joiner: CriJoiner[str], on_read: Callable[[], None] | None = None
) -> Iterator[str]:
    """The lines of a binary stream the analyzer may use, decoded leniently and joined by
    ``joiner`` (CRI pieces); text beyond ``max_bytes`` in one line is dropped without being held
    in memory. ``on_read`` is called after each block read."""
    rare_bytes = _RareBytes()
    carry = b""  # the start of a line not ended yet, at most max_bytes of it
    skipping = False  # that line is longer than max_bytes: what follows is dropped
    while chunk := stream.read(_CHUNK):
        if on_read is not None:
            on_read()
        begin = 0
        if carry or skipping:
            newline = chunk.find(b"\n")
            if not skipping:
                room = max_bytes - len(carry)
                carry += chunk[: room if newline < 0 else min(room, newline)]
                skipping = (len(chunk) if newline < 0 else newline) > room
            if newline < 0:
                continue
            yield from _usable_lines(carry + b"\n", 0, len(carry) + 1, max_bytes, joiner, rare_bytes)
            carry, skipping = b"", False
            begin = newline + 1
        last = chunk.rfind(b"\n", begin)
        if last >= 0:
            yield from _usable_lines(chunk, begin, last + 1, max_bytes, joiner, rare_bytes)
        tail = chunk[max(last + 1, begin) : max(last + 1, begin) + max_bytes]
        carry, skipping = tail, len(chunk) - max(last + 1, begin) > max_bytes
    if carry:
        yield from _usable_lines(carry + b"\n", 0, len(carry) + 1, max_bytes, joiner, rare_bytes)


def feed_file(analyzer: LogAnalyzer, path: Path, progress: Progress | None = None) -> None:
    """Feed one file to the analyzer (raises OSError/EOFError/gzip errors when unreadable)."""
    joiner: CriJoiner[str] = CriJoiner(max_chars=analyzer.limits.max_line_chars)
    stream, raw = _open(path)
    with stream:
        on_read = None if progress is None else (lambda: progress.at(raw.tell()))
        feed = analyzer.feed
        for text in read_usable_lines(stream, analyzer.limits.max_line_chars * 4, joiner, on_read):
            feed(text)
    for text in joiner.flush():
        analyzer.feed(text)


_YES_NO: dict[object, str] = {True: "yes", False: "no", None: "?"}


def _yes_no(value: object) -> str:
    return _YES_NO.get(value, str(value))


def one_line(verdict: Verdict) -> str:
    """The verdict as one sentence an SRE can paste into a ticket."""
    facts = [
        f"network {verdict.network or '?'}",
        f"GDR {_yes_no(verdict.gdr)}",
        f"NCCL {verdict.nccl_version or '?'}",
        f"nodes {verdict.nodes or '?'}",
        f"ranks {verdict.nranks or '?'}",
    ]
    meaning = {
        "tcp_fallback": "inter-node NCCL traffic runs over TCP (fallback from RDMA)",
        "rdma": "inter-node NCCL traffic runs over RDMA",
        "single_node": "single-node job: no inter-node NCCL traffic",
        "unknown": "the log does not show which network carries inter-node NCCL traffic",
    }[verdict.verdict]
    return f"NCCL verdict: {verdict.verdict.upper()} - {meaning} ({', '.join(facts)})"


def next_step(verdict: Verdict) -> str:
    """What the exit code means for the job, and what to do when the log cannot tell."""
    if verdict.verdict == "unknown":
        return (
            f"  cannot tell (exit {EXIT_CANNOT_TELL}): run the job with {LOGGING_HINT} and give this command "
            "the log from the start of the job (NCCL prints its network choice once, at communicator init)"
        )
    if verdict.verdict == "tcp_fallback":
        return f"  TCP fallback (exit {EXIT_TCP_FALLBACK}): see the CclNcclTcpFallback runbook"
    return f"  no fallback shown (exit {EXIT_OK})"


def render_text(verdict: Verdict, out: TextIO, warning_counts: Mapping[str, int] | None = None) -> None:
    rows = [("COMMUNICATOR", "RANKS", "NODES", "NETWORK", "GDR", "INTER-NODE TCP", "CONNECTIONS")]
    for c in verdict.communicators:
        transports = " ".join(f"{transport_key(k)}={v}" for k, v in sorted(c.transports.items())) or "-"
        rows.append(
            (
                c.comm_id,
                str(c.nranks or "?"),
                str(c.nnodes or "?"),
                c.network or "?",
                _yes_no(c.gdr),
                _yes_no(c.inter_node_tcp),
                transports,
            )
        )
    if len(rows) > 1:
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        for r in rows:
            out.write("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=False)) + "  " + r[-1] + "\n")
        out.write("\n")
    out.write(one_line(verdict) + "\n")
    for reason in verdict.reasons:
        out.write(f"  because: {reason}\n")
    out.write(next_step(verdict) + "\n")
    counts = dict(warning_counts) if warning_counts is not None else {}
    if warning_counts is None:  # only the verdict's sample of warning lines is known
        for w in verdict.warnings:
            counts[w.category] = counts.get(w.category, 0) + 1
    if counts:
        out.write("  warnings: " + ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())) + "\n")


def run(args: argparse.Namespace) -> int:
    analyzer = LogAnalyzer()
    unreadable: list[str] = []
    files = {raw: list(iter_files(Path(raw))) for raw in args.paths if Path(raw) != STDIN and Path(raw).exists()}
    progress = Progress.for_inputs([file for found in files.values() for file in found], sys.stderr)
    try:
        for raw in args.paths:
            path = Path(raw)
            if path == STDIN:
                try:
                    feed_file(analyzer, STDIN)
                except (OSError, EOFError, gzip.BadGzipFile) as exc:
                    unreadable.append(f"standard input: {exc}")
                continue
            if raw not in files:
                unreadable.append(f"{raw}: no such file or folder")
                continue
            for file in files[raw]:
                try:
                    feed_file(analyzer, file, progress)
                except (OSError, EOFError, gzip.BadGzipFile) as exc:
                    unreadable.append(f"{file}: {exc}")
                progress.finished_file(_size(file))
    finally:
        progress.close()
    if unreadable:
        more = f" (and {len(unreadable) - 1} more unreadable inputs)" if len(unreadable) > 1 else ""
        print(f"ccl-exporter analyze: cannot read {unreadable[0]}{more}", file=sys.stderr)
        return EXIT_UNREADABLE
    verdict = analyzer.result()
    if getattr(args, "html", None):
        from exporter.commands import analyze_report  # only when asked for

        try:
            analyze_report.write(Path(args.html), analyzer, [str(p) for p in args.paths], one_line(verdict))
        except OSError as exc:
            print(f"ccl-exporter analyze: cannot write {args.html}: {exc.strerror or exc}", file=sys.stderr)
            return EXIT_UNREADABLE
    try:
        if args.json:
            sys.stdout.write(json.dumps(verdict.to_json(), sort_keys=False) + "\n")
        else:
            render_text(verdict, sys.stdout, analyzer.warnings_by_category)
        sys.stdout.flush()
    except BrokenPipeError:  # the reader stopped early (`| head -1`): the exit code still says the verdict
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
    return EXIT_CODES[verdict.verdict]

"""``ccl-exporter analyze [--json] PATH...``: offline verdict on NCCL logs.

Files and folders (walked, sorted) are read as one log stream — one job's logs, whatever
their wrappers: plain text, ``.gz`` rotated logs, CRI pod logs (partial lines joined).

Exit codes: 0 no fallback shown (RDMA, or one node), 3 TCP fallback, 4 the log does not show
enough to tell ("cannot tell" is an answer, never silence), 1 an input cannot be read (one line on
stderr, no verdict on stdout: a verdict on part of a job's logs would be a guess), 2 usage.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import BinaryIO, TextIO

from exporter.nccl import LogAnalyzer, Verdict
from exporter.nccl.verdict import transport_key
from exporter.sources.podlogs.cri import CriJoiner

EXIT_OK = 0
EXIT_UNREADABLE = 1
EXIT_TCP_FALLBACK = 3
EXIT_CANNOT_TELL = 4
EXIT_CODES = {"rdma": EXIT_OK, "single_node": EXIT_OK, "tcp_fallback": EXIT_TCP_FALLBACK, "unknown": EXIT_CANNOT_TELL}
# What a job needs so that its log shows the transport (every line the verdict reads is INIT or NET).
LOGGING_HINT = "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET"
_CHUNK = 1 << 20


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
        "paths",
        nargs="+",
        metavar="PATH",
        help="log file or folder; - reads standard input (e.g. kubectl logs POD | ccl-exporter analyze -)",
    )
    parser.set_defaults(handler=run)
    return parser


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


def _open(path: Path) -> BinaryIO:
    if path == STDIN:  # a buffered reader over fd 0 that can peek; closing it leaves fd 0 open
        raw = open(sys.stdin.fileno(), "rb", closefd=False)  # noqa: SIM115 - closed by the caller
    else:
        raw = open(path, "rb")  # noqa: SIM115 - closed by the caller
    head = raw.peek(2)[:2] if hasattr(raw, "peek") else b""
    if head == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=raw)  # type: ignore[return-value]  # reads like any BinaryIO
    return raw


def iter_lines(stream: BinaryIO, max_bytes: int) -> Iterator[str]:
    """Lines of a binary stream, decoded leniently; text beyond ``max_bytes`` in one line is skipped
    without being held in memory."""
    pending = bytearray()
    skipping = False
    while True:
        chunk = stream.read(_CHUNK)
        if not chunk:
            break
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            piece = chunk[start:] if nl < 0 else chunk[start:nl]
            if not skipping:
                room = max_bytes - len(pending)
                pending += piece[:room]
                if len(piece) > room:
                    skipping = True
            if nl < 0:
                break
            yield pending.decode("utf-8", errors="replace")
            pending.clear()
            skipping = False
            start = nl + 1
    if pending:
        yield pending.decode("utf-8", errors="replace")


def feed_file(analyzer: LogAnalyzer, path: Path) -> None:
    """Feed one file to the analyzer (raises OSError/EOFError/gzip errors when unreadable)."""
    joiner = CriJoiner(max_chars=analyzer.limits.max_line_chars)
    with _open(path) as stream:
        for line in iter_lines(stream, analyzer.limits.max_line_chars * 4):
            text = joiner.feed(line)
            if text is not None:
                analyzer.feed(text)
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
    for raw in args.paths:
        path = Path(raw)
        if path == STDIN:
            try:
                feed_file(analyzer, STDIN)
            except (OSError, EOFError, gzip.BadGzipFile) as exc:
                unreadable.append(f"standard input: {exc}")
            continue
        if not path.exists():
            unreadable.append(f"{raw}: no such file or folder")
            continue
        for file in iter_files(path):
            try:
                feed_file(analyzer, file)
            except (OSError, EOFError, gzip.BadGzipFile) as exc:
                unreadable.append(f"{file}: {exc}")
    if unreadable:
        more = f" (and {len(unreadable) - 1} more unreadable inputs)" if len(unreadable) > 1 else ""
        print(f"ccl-exporter analyze: cannot read {unreadable[0]}{more}", file=sys.stderr)
        return EXIT_UNREADABLE
    verdict = analyzer.result()
    if args.json:
        sys.stdout.write(json.dumps(verdict.to_json(), sort_keys=False) + "\n")
    else:
        render_text(verdict, sys.stdout, analyzer.warnings_by_category)
    return EXIT_CODES[verdict.verdict]

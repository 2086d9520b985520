"""The tailer (bytes, kubelet's pod-log files) and ``analyze`` (text, logs copied anywhere) read
CRI records alike (``exporter.sources.podlogs.cri`` is the format's one reader): fed the same
file, the tailer returns exactly the lines with ``NCCL`` among those ``analyze``'s analyzer reads.

The tailer takes one of two paths through a chunk: a fast one while no ``P`` record can be in
it, and one that joins pieces record by record. Each input is fed to both (an unrelated record
with `` P `` in its message sends the chunk down the joining path).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from exporter.commands.analyze import feed_file
from exporter.sources.podlogs import PodLogTailer, TailLimits, TailStats
from tests.sources.test_podlogs import UID

CAP = 64  # the joined-message cap of both readers, small enough to be reached
STAMP = b"2026-03-01T10:00:00.123456789Z"
NCCL = b"host-0:41:41 [0] NCCL INFO Using network IB"
FORCE_JOINING = STAMP + b" stderr F this message has a P in it\n"


def rec(message: bytes, tag: bytes = b"F", stream: bytes = b"stdout", end: bytes = b"\n") -> bytes:
    return STAMP + b" " + stream + b" " + tag + b" " + message + end


PIECE = b"host-0:41:41 [0] NCCL INFO Using net"
JOINED = "host-0:41:41 [0] NCCL INFO Using network IB"
LINE = NCCL.decode()

# name -> (the log, the lines with NCCL both readers give; the decisions are ``cri``'s)
CASES: dict[str, tuple[bytes, list[str]]] = {
    "full records": (rec(NCCL) + rec(b"epoch 1 loss 2.3") + rec(NCCL + b" 2", stream=b"stderr"), [LINE, LINE + " 2"]),
    "partial pieces": (rec(b"host-0:41:41 [0] NC", b"P") + rec(b"CL INFO Using network IB"), [JOINED]),
    "stdout and stderr interleaved": (
        rec(PIECE, b"P")
        + rec(b"host-0:41:41 [0] NCCL WARN x", stream=b"stderr")
        + rec(b"host-1:9:9 [1] NC", b"P", b"stderr")
        + rec(b"work IB")
        + rec(b"CL INFO y", stream=b"stderr"),
        ["host-0:41:41 [0] NCCL WARN x", JOINED, "host-1:9:9 [1] NCCL INFO y"],
    ),
    "plain line, no framing": (NCCL + b"\n", [LINE]),
    "a line without NCCL that is not a record": (b"epoch 1 loss 2.3\n" + rec(NCCL), [LINE]),
    "no timestamp": (b"stdout F " + NCCL + b"\n", ["stdout F " + LINE]),
    "another first field": (b"x stdout F " + NCCL + b"\n", ["x stdout F " + LINE]),
    "a date without a time": (b"2026-03-01 stdout F " + NCCL + b"\n", ["2026-03-01 stdout F " + LINE]),
    "a tag with a : suffix": (rec(NCCL, b"F:x"), [LINE]),
    "a partial tag with a : suffix": (rec(b"host-0:41:41 [0] NC", b"P:x") + rec(b"CL INFO Using network IB"), [JOINED]),
    "an unknown tag": (rec(NCCL, b"X"), [rec(NCCL, b"X").decode()[:CAP]]),
    "a tag run into the message": (STAMP + b" stdout F" + NCCL + b"\n", [(STAMP + b" stdout F" + NCCL).decode()[:CAP]]),
    "an unknown stream": (rec(NCCL, stream=b"stdin"), [rec(NCCL, stream=b"stdin").decode()[:CAP]]),
    "a record cut short": (STAMP + b" stdout NCCL\n", [(STAMP + b" stdout NCCL").decode()]),
    "NCCL only in the tag": (rec(b"epoch 1 loss 2.3", b"F:NCCL"), []),
    "CRLF records": (rec(NCCL, end=b"\r\n") + rec(b"epoch 1", end=b"\r\n"), [LINE]),
    "CRLF partial pieces": (rec(PIECE, b"P", end=b"\r\n") + rec(b"work IB", end=b"\r\n"), [JOINED]),
    "CRLF plain line": (NCCL + b"\r\n", [LINE]),
    "a record over the cap": (rec(NCCL + b" " + b"x" * 100), [(LINE + " " + "x" * 100)[:CAP]]),
    "partials over the cap": (
        rec(b"host-0:41:41 [0] NCCL INFO ", b"P") + rec(b"y" * 30, b"P") * 5 + rec(b"end"),
        [("host-0:41:41 [0] NCCL INFO " + "y" * 150)[:CAP]],
    ),
    "NCCL only beyond the cap": (rec(b"z" * 70, b"P") + rec(b" NCCL INFO late"), []),
}


def analyze_lines(path: Path) -> list[str]:
    """What ``analyze``'s analyzer reads from ``path`` (the first ``max_line_chars`` of each line it is
    fed), the lines with NCCL."""
    fed: list[str] = []
    analyzer = SimpleNamespace(limits=SimpleNamespace(max_line_chars=CAP), feed=fed.append)
    feed_file(analyzer, path)  # type: ignore[arg-type]
    read = [line[:CAP] for line in fed]
    return [line for line in read if "NCCL" in line]


def tailer_lines(root: Path, data: bytes) -> tuple[list[str], TailStats]:
    """What the tailer hands on from a pod log holding ``data``, and what it counted."""
    log = root / f"training_llama-worker-0_{UID}" / "pytorch" / "0.log"
    log.parent.mkdir(parents=True)
    log.write_bytes(data)
    tailer = PodLogTailer(root, None, limits=TailLimits(max_line_bytes=CAP))
    lines: list[str] = []
    for _ in range(3):
        for found in tailer.poll().lines.values():
            lines.extend(found)
    return lines, tailer.stats


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("path", ["fast", "joining"])
def test_the_tailer_and_analyze_read_a_record_alike(tmp_path: Path, name: str, path: str) -> None:
    data, expected = CASES[name]
    if path == "joining":
        data = FORCE_JOINING + data
    text_file = tmp_path / "copied.log"
    text_file.write_bytes(data)
    lines, _ = tailer_lines(tmp_path / "pods", data)
    assert lines == analyze_lines(text_file) == expected


@pytest.mark.parametrize("name", CASES)
def test_both_paths_of_the_tailer_count_alike(tmp_path: Path, name: str) -> None:
    """Lines that are not records, and what the cap cuts, are counted the same whichever path
    a chunk takes (only lines with NCCL: the fast path never looks at the others)."""
    data, _ = CASES[name]
    _, fast = tailer_lines(tmp_path / "fast", data)
    _, joining = tailer_lines(tmp_path / "joining", FORCE_JOINING + data)
    assert (fast.events, fast.skipped_bytes) == (joining.events, joining.skipped_bytes)

"""The tailer (bytes, kubelet's pod-log files) and ``analyze`` (text, logs copied anywhere) read
CRI records alike: fed the same file, the tailer returns exactly the lines with ``NCCL`` among
those ``analyze`` hands to its analyzer.

The tailer takes one of two paths through a chunk: a fast one while no ``P`` record can be in
it, and one that joins pieces record by record. Each input is fed to both (an unrelated record
with `` P `` in its message sends the chunk down the joining path).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from exporter.analyze import feed_file
from exporter.sources.podlogs import PodLogTailer, TailLimits
from tests.test_podlogs import UID

CAP = 64  # the joined-message cap of both readers, small enough to be reached
STAMP = b"2026-03-01T10:00:00.123456789Z"
NCCL = b"host-0:41:41 [0] NCCL INFO Using network IB"
FORCE_JOINING = STAMP + b" stderr F this message has a P in it\n"


def rec(message: bytes, tag: bytes = b"F", stream: bytes = b"stdout", end: bytes = b"\n") -> bytes:
    return STAMP + b" " + stream + b" " + tag + b" " + message + end


CASES: dict[str, bytes] = {
    "full records": rec(NCCL) + rec(b"epoch 1 loss 2.3") + rec(NCCL + b" 2", stream=b"stderr"),
    "partial pieces": rec(b"host-0:41:41 [0] NC", b"P") + rec(b"CL INFO Using network IB"),
    "stdout and stderr interleaved": (
        rec(b"host-0:41:41 [0] NCCL INFO Using net", b"P") + rec(b"host-0:41:41 [0] NCCL WARN x", stream=b"stderr")
        + rec(b"host-1:9:9 [1] NC", b"P", b"stderr") + rec(b"work IB") + rec(b"CL INFO y", stream=b"stderr")),
    "plain line, no framing": NCCL + b"\n",
    "no timestamp": b"stdout F " + NCCL + b"\n",
    "another first field": b"x stdout F " + NCCL + b"\n",
    "a date without a time": b"2026-03-01 stdout F " + NCCL + b"\n",
    "a tag with a : suffix": rec(NCCL, b"F:x"),
    "a partial tag with a : suffix": rec(b"host-0:41:41 [0] NC", b"P:x") + rec(b"CL INFO Using network IB"),
    "an unknown tag": rec(NCCL, b"X"),
    "a tag run into the message": STAMP + b" stdout F" + NCCL + b"\n",
    "an unknown stream": rec(NCCL, stream=b"stdin"),
    "a record cut short": STAMP + b" stdout NCCL\n",
    "NCCL only in the tag": rec(b"epoch 1 loss 2.3", b"F:NCCL"),
    "CRLF records": rec(NCCL, end=b"\r\n") + rec(b"epoch 1", end=b"\r\n"),
    "CRLF partial pieces": rec(b"host-0:41:41 [0] NCCL INFO Using net", b"P", end=b"\r\n") + rec(b"work IB", end=b"\r\n"),
    "CRLF plain line": NCCL + b"\r\n",
    "a record over the cap": rec(NCCL + b" " + b"x" * 100),
    "partials over the cap": rec(b"host-0:41:41 [0] NCCL INFO ", b"P") + rec(b"y" * 30, b"P") * 5 + rec(b"end"),
    "NCCL only beyond the cap": rec(b"z" * 70, b"P") + rec(b" NCCL INFO late"),
}

# Where the two readers disagreed before there was one CRI parser: (case, tailer path).
DISAGREED = {
    ("another first field", "fast"), ("another first field", "joining"),
    ("a date without a time", "fast"), ("a date without a time", "joining"),
    ("a partial tag with a : suffix", "fast"), ("a partial tag with a : suffix", "joining"),
    ("an unknown tag", "fast"), ("an unknown tag", "joining"),
    ("a tag run into the message", "fast"), ("a tag run into the message", "joining"),
    ("a record cut short", "fast"), ("a record cut short", "joining"),
    ("NCCL only in the tag", "fast"),
    ("CRLF partial pieces", "fast"), ("CRLF partial pieces", "joining"),
    ("CRLF plain line", "joining"),
    ("NCCL only beyond the cap", "fast"), ("NCCL only beyond the cap", "joining"),
}


def analyze_lines(path: Path) -> list[str]:
    """What ``analyze``'s analyzer reads from ``path`` (the first ``max_line_chars`` of each line it is
    fed), the lines with NCCL."""
    fed: list[str] = []
    feed_file(SimpleNamespace(limits=SimpleNamespace(max_line_chars=CAP), feed=fed.append), path)  # type: ignore[arg-type]
    read = [line[:CAP] for line in fed]
    return [line for line in read if "NCCL" in line]


def tailer_lines(root: Path, data: bytes) -> list[str]:
    log = root / f"training_llama-worker-0_{UID}" / "pytorch" / "0.log"
    log.parent.mkdir(parents=True)
    log.write_bytes(data)
    tailer = PodLogTailer(root, None, limits=TailLimits(max_line_bytes=CAP))
    lines: list[str] = []
    for _ in range(3):
        for found in tailer.poll().lines.values():
            lines.extend(found)
    return lines


PARAMS = [
    pytest.param(name, path, marks=[pytest.mark.xfail(strict=True, reason="the readers disagreed")]
                 if (name, path) in DISAGREED else [], id=f"{name}-{path}")
    for name in CASES for path in ("fast", "joining")
]


@pytest.mark.parametrize(("name", "path"), PARAMS)
def test_the_tailer_and_analyze_read_a_record_alike(tmp_path: Path, name: str, path: str) -> None:
    data = CASES[name] if path == "fast" else FORCE_JOINING + CASES[name]
    text_file = tmp_path / "copied.log"
    text_file.write_bytes(data)
    assert tailer_lines(tmp_path / "pods", data) == analyze_lines(text_file)

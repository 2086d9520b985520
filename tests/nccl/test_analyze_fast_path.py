"""``analyze``'s fast path: lines are searched for the analyzer's words block by block, and only
those are decoded and fed. Its verdict must be the one a line-by-line reading gives, whatever the
block boundaries (here as small as one byte), partial CRI records, CRLF, over-long lines or a
last line without its newline; progress shows on a terminal only."""

from __future__ import annotations

import io
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.commands import analyze
from exporter.nccl import LogAnalyzer
from exporter.nccl.reader import LINE_NEEDLES
from exporter.sources.podlogs.cri import PARTIAL_TAG_SEARCH, CriJoiner
from tests.nccl.conftest import FIXTURES

STAMP = "2026-03-01T10:00:00.123456789Z"


def line_by_line(data: bytes, max_bytes: int) -> Iterator[str]:
    """The reading the fast path must equal: every line, cut at ``max_bytes``, through the joiner."""
    joiner: CriJoiner[str] = CriJoiner()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    for line in lines:
        text = joiner.feed(line[:max_bytes].decode("utf-8", "replace"))
        if text is not None:
            yield text
    yield from joiner.flush()


def usable(lines: Iterator[str]) -> list[str]:
    """The lines the analyzer does anything with (the others it drops unread)."""
    return [line for line in lines if any(n in line[:65536] for n in LINE_NEEDLES)]


def fast(data: bytes, max_bytes: int, chunk: int, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setattr(analyze, "_CHUNK", chunk)
    joiner: CriJoiner[str] = CriJoiner()
    return [*analyze.read_usable_lines(io.BytesIO(data), max_bytes, joiner), *joiner.flush()]


def mixed_log(rng: random.Random, cri: bool) -> bytes:
    """Training output, NCCL records, bare bodies, CRI pieces, CRLF, long and broken lines."""
    bodies = [line for path in sorted(FIXTURES.glob("*.log"))[:12] for line in path.read_text().splitlines()]
    out = []
    for _ in range(400):
        kind = rng.random()
        if kind < 0.5:
            text = f"step {rng.randrange(10**6)} loss {rng.random():.4f} lr 3e-4"
        elif kind < 0.8:
            text = rng.choice(bodies)
        elif kind < 0.85:
            text = "x" * rng.randrange(50, 400) + " NCCL INFO Using network IB " + "y" * rng.randrange(0, 300)
        elif kind < 0.9:
            text = "Channel 00/0 : 0[0] -> 1[1] via NET/IB/0/GDRDMA"  # a bare body
        elif kind < 0.95:
            text = "caf\xe9 \udcff NCCL WARN odd bytes"
        else:
            text = ""
        data = text.encode("utf-8", "surrogateescape")
        if rng.random() < 0.1:
            data += b"\r"
        if cri:
            stream = rng.choice([b"stdout", b"stderr"])
            if len(data) > 4 and rng.random() < 0.3:  # the runtime cut it, even inside a word
                cut = rng.randrange(1, len(data))
                out.append(STAMP.encode() + b" " + stream + b" P " + data[:cut])
                data = data[cut:]
            out.append(STAMP.encode() + b" " + stream + b" F " + data)
        else:
            out.append(data)
    body = b"\n".join(out)
    return body if rng.random() < 0.5 else body + b"\n"


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("chunk", [1, 3, 17, 256, 4096, 1 << 22])
def test_the_fast_path_hands_over_what_a_line_by_line_reading_does(
    seed: int, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    data = mixed_log(rng, cri=seed % 2 == 0)
    max_bytes = rng.choice([64, 200, 1 << 16])
    assert usable(iter(fast(data, max_bytes, chunk, monkeypatch))) == usable(line_by_line(data, max_bytes))


@pytest.mark.parametrize("chunk", [5, 64, 1 << 22])
def test_the_verdicts_of_the_fixtures_are_those_of_a_line_by_line_reading(
    chunk: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(analyze, "_CHUNK", chunk)
    for path in sorted(FIXTURES.glob("*.log")):
        reference = LogAnalyzer()
        for text in line_by_line(path.read_bytes(), reference.limits.max_line_chars * 4):
            reference.feed(text)
        ours = LogAnalyzer()
        analyze.feed_file(ours, path)
        assert ours.result().to_json() == reference.result().to_json(), path.name


def test_a_hostile_line_full_of_needles_costs_one_search_per_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hundreds of thousands of needles on one line are one line handed over, found without
    quadratic work (a bound that only quadratic work misses: linear takes milliseconds)."""
    line = b" via NCCL Using comm  Pid " * 80_000 + b"\n"
    started = time.perf_counter()
    got = fast(line * 3, 1 << 16, 1 << 22, monkeypatch)
    assert time.perf_counter() - started < 5.0
    assert len(got) == 3 and all(len(text) == 1 << 16 for text in got)


class Terminal(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_progress_shows_on_a_terminal_for_large_input_and_is_erased() -> None:
    now = [0.0]
    out = Terminal(tty=True)
    progress = analyze.Progress(500_000_000, out, enabled=True, clock=lambda: now[0])
    progress.at(1000)  # too soon after the start
    assert out.getvalue() == ""
    now[0] = 1.0
    progress.at(125_000_000)
    assert out.getvalue() == "\ranalyze: 125 of 500 MB (25%)"
    progress.close()
    assert out.getvalue().endswith("\r" + " " * len("analyze: 125 of 500 MB (25%)") + "\r")


def test_progress_stays_silent_without_a_terminal_or_for_small_input(tmp_path: Path) -> None:
    big = tmp_path / "big.log"
    with big.open("wb") as handle:
        handle.truncate(analyze.PROGRESS_MIN_BYTES)  # sparse: large without taking the disk
    small = tmp_path / "small.log"
    small.write_text("x\n")
    assert analyze.Progress.for_inputs([big], Terminal(tty=True)).enabled
    assert not analyze.Progress.for_inputs([big], Terminal(tty=False)).enabled
    assert not analyze.Progress.for_inputs([small], Terminal(tty=True)).enabled


@pytest.mark.parametrize("seed", range(20))
def test_the_memchr_searches_find_what_the_re_searches_find(seed: int) -> None:
    """Where a rare byte is rare, analyze finds words and partial tags by memchr and a check; past
    its budget, by ``re``. Both ways must find the same: blocks with few and with many rare bytes."""
    rng = random.Random(seed)
    alphabet = [b"P", b"U", b"v", b"c", b" ", b":", b"\n", b"x", b"i", b"a", b"s", b"n", b"g", b"o", b"m", b"d"]
    words = [b" via ", b"Using", b"comm ", b" Pid ", b" P ", b" P:", b"P"]
    pieces = [
        rng.choice(words) if rng.random() < rng.choice([0.01, 0.3]) else rng.choice(alphabet)
        for _ in range(rng.randrange(1, 6000))
    ]
    block = b"".join(pieces) + b"\n"
    stop = block.rfind(b"\n") + 1
    for word in analyze._BARE_WORDS:
        expected: dict[int, int] = {}
        analyze._scan(block, 0, stop, analyze._BARE_SEARCHES[word], expected)
        found: dict[int, int] = {}
        analyze._find_word(block, 0, stop, word, found, analyze._RareBytes())
        assert found == expected, word
    for cut in (stop, max(1, stop // 2)):
        expected = PARTIAL_TAG_SEARCH.search(block, 0, cut) is not None
        assert analyze._may_hold_a_partial_record(block, 0, cut, analyze._RareBytes()) == expected
        not_rare = analyze._RareBytes()
        not_rare.not_rare(b"P")
        assert analyze._may_hold_a_partial_record(block, 0, cut, not_rare) == expected
        # from a line start inside the block, as after the end of a line carried over
        begin = block.find(b"\n") + 1
        if begin < cut:
            expected = PARTIAL_TAG_SEARCH.search(block[begin:cut]) is not None
            assert analyze._may_hold_a_partial_record(block, begin, cut, analyze._RareBytes()) == expected
            for word in analyze._BARE_WORDS:
                found_from = {}
                analyze._find_word(block, begin, cut, word, found_from, analyze._RareBytes())
                alone = {}
                analyze._scan(block[begin:cut], 0, cut - begin, analyze._BARE_SEARCHES[word], alone)
                assert found_from == {start + begin: end + begin if end >= 0 else -1 for start, end in alone.items()}

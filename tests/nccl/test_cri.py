"""CRI pod-log records back to the container's lines."""

from __future__ import annotations

from exporter.sources.podlogs.cri import CriJoiner


def test_full_records_and_plain_lines() -> None:
    joiner = CriJoiner()
    assert joiner.feed("2026-01-01T00:00:00.000000001Z stdout F hello world\n") == "hello world"
    assert joiner.feed("2026-01-01T00:00:00Z stderr F ") == ""
    assert joiner.feed("not a cri line") == "not a cri line"


def test_partials_are_joined_per_stream() -> None:
    joiner = CriJoiner()
    assert joiner.feed("2026-01-01T00:00:00Z stdout P h:1:1 [0] NCCL ") is None
    assert joiner.feed("2026-01-01T00:00:00Z stderr F unrelated") == "unrelated"
    assert joiner.feed("2026-01-01T00:00:00Z stdout P INFO Using ") is None
    assert joiner.feed("2026-01-01T00:00:01Z stdout F network IB") == "h:1:1 [0] NCCL INFO Using network IB"


def test_overlong_partials_are_cut_and_counted() -> None:
    joiner = CriJoiner(max_chars=10)
    for _ in range(5):
        assert joiner.feed("2026-01-01T00:00:00Z stdout P abcdefgh") is None
    assert joiner.feed("2026-01-01T00:00:00Z stdout F end") == "abcdefghab"
    assert joiner.truncated == 1
    assert joiner.feed("2026-01-01T00:00:00Z stdout F short") == "short"
    assert joiner.truncated == 1


def test_flush_returns_open_partials() -> None:
    joiner = CriJoiner()
    joiner.feed("2026-01-01T00:00:00Z stdout P tail of a log")
    assert joiner.flush() == ["tail of a log"]
    assert joiner.flush() == []

"""Nothing a log can hold makes the analyzer raise, hang or grow without bound."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.nccl import Limits, LogAnalyzer
from exporter.nccl import grammar as g
from tests.nccl.conftest import FIXTURES

REAL_LINES = [line for path in sorted(FIXTURES.glob("*.log")) for line in path.read_text().splitlines()]

decoded_bytes = st.binary(max_size=400).map(lambda b: b.decode("utf-8", errors="replace"))
truncated_real = st.builds(lambda line, cut: line[:cut], st.sampled_from(REAL_LINES), st.integers(0, 300))
spliced = st.builds(
    lambda a, b, cut: a[:cut] + b, st.sampled_from(REAL_LINES), st.sampled_from(REAL_LINES), st.integers(0, 200)
)
lines = st.one_of(st.text(max_size=300), decoded_bytes, truncated_real, spliced, st.sampled_from(REAL_LINES))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(lines, max_size=40))
def test_feed_never_raises_and_result_is_valid_json(batch: list[str]) -> None:
    analyzer = LogAnalyzer()
    for line in batch:
        analyzer.feed(line)
    verdict = analyzer.result()
    assert verdict.verdict in {"rdma", "tcp_fallback", "single_node", "unknown"}
    assert verdict.inter_node_tcp in (True, False, None)
    json.dumps(verdict.to_json())
    assert "internal_errors" not in analyzer.overflow


@settings(max_examples=200, deadline=None)
@given(lines)
def test_grammar_never_raises(line: str) -> None:
    for record in g.split_records(line):
        g.parse_message(record.message)
        g.warning_category(record)


def test_invalid_utf8_and_control_characters() -> None:
    analyzer = LogAnalyzer()
    analyzer.feed(b"\xff\xfe h:1:1 [0] NCCL INFO Using network \xc3\x28IB".decode("utf-8", errors="replace"))
    analyzer.feed("h:1:1 [0] NCCL INFO Using network IB\x00\x1b[31m")
    analyzer.feed("\r\n")
    assert analyzer.result().verdict in {"rdma", "unknown"}
    assert "internal_errors" not in analyzer.overflow


def test_ten_megabyte_line_is_cut_and_counted() -> None:
    analyzer = LogAnalyzer(Limits(max_line_chars=65536))
    huge = "h:1:1 [0] NCCL INFO Using network Socket " + "x" * (10 * 1024 * 1024)
    analyzer.feed(huge)
    analyzer.feed("NCCL INFO " * 1_000_000)  # a million markers on one line
    assert analyzer.overflow["long_lines"] == 2
    assert analyzer.overflow["records"] > 0
    analyzer.result()


def test_pathological_prefix_text_is_fast_enough_to_finish() -> None:
    """No backtracking blow-up: colon/digit soup before markers (bounded window per marker)."""
    analyzer = LogAnalyzer()
    analyzer.feed(("1:" * 30000) + " NCCL INFO x")
    analyzer.feed(("a" * 60000) + ":1:1 [0] NCCL INFO Using network IB")
    assert analyzer.result() is not None


TINY = Limits(
    max_processes=2,
    max_threads=1,
    max_communicators=2,
    max_connections=5,
    max_ranks=3,
    max_pointers=2,
    max_env=1,
    max_warnings=1,
    max_versions=1,
    max_records_per_line=2,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(REAL_LINES), max_size=80))
def test_eviction_paths_never_raise(batch: list[str]) -> None:
    """Real lines through tiny caps: every eviction, merge and forget path runs."""
    analyzer = LogAnalyzer(TINY)
    for i, line in enumerate(batch):
        analyzer.feed(line)
        if i % 7 == 0:
            analyzer.result()
    json.dumps(analyzer.result().to_json())
    assert "internal_errors" not in analyzer.overflow
    assert len(analyzer.communicators) <= 2 and len(analyzer.connections) <= 5 and len(analyzer.processes) <= 2


def _verdict_json(batch: list[str], through_general_path: bool) -> dict:
    # An escape sequence in front of a line sends it through the full record splitter (which
    # strips it) instead of the analyzer's shortcut for plain one-record INFO lines.
    analyzer = LogAnalyzer()
    for line in batch:
        analyzer.feed("\x1b[0m" + line if through_general_path else line)
    return analyzer.result().to_json()


CORPUS_LOGS = sorted(FIXTURES.rglob("*.log"))


def test_shortcut_and_caches_agree_with_the_full_parser_on_every_fixture_log() -> None:
    assert len(CORPUS_LOGS) > 50
    for path in CORPUS_LOGS:
        batch = path.read_text(encoding="utf-8", errors="replace").splitlines()
        assert _verdict_json(batch, False) == _verdict_json(batch, True), path.name


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(lines, max_size=40))
def test_shortcut_and_caches_agree_with_the_full_parser(batch: list[str]) -> None:
    batch = [line for line in batch if "\x1b" not in line]
    assert _verdict_json(batch, False) == _verdict_json(batch, True)

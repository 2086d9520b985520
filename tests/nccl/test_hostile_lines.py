"""Hostile lines: no pattern applied to a log line may cost more than linear time.

A pod can print anything. A regular expression that backtracks over a long run of the tokens it
looks for (``NET/`` x 16,000 before ``GPU Direct RDMA``) turns one 64 KiB line into seconds of CPU
and stalls fallback detection for every pod on the node. Each test builds 64 KiB lines out of
NCCL's own vocabulary (the tokens the patterns anchor on, repeated, then a tail that completes a
match; the generator is ``bench.hostile_parse``'s, which measures the same lines) and bounds the
time one line may take. A linear scan of 64 KiB takes about a millisecond;
the bound is two orders of magnitude above that and far below what a quadratic pattern needs
(seconds), so the test tells the two apart on a busy machine without timing anything real.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable

import pytest

from devtools.hostile_lines import hostile_lines
from exporter.nccl import LogAnalyzer, records
from exporter.nccl import grammar as g
from exporter.sources.podlogs import cri

PER_LINE_SECONDS = 0.25
RETRIES_OVER_THE_BOUND = 3


def patterns() -> list[tuple[str, re.Pattern[str]]]:
    """Every compiled pattern of the grammar and of the CRI reader: all see untrusted text."""
    found = [(f"grammar.{name}", value) for name, value in vars(g).items() if isinstance(value, re.Pattern)]
    found += [(f"records.{name}", value) for name, value in vars(records).items() if isinstance(value, re.Pattern)]
    found += [(f"cri.{name}", value) for name, value in vars(cri).items() if isinstance(value, re.Pattern)]
    return [(name, p) for name, p in found if isinstance(p.pattern, str)]


def slowest(call: Callable[[str], object]) -> tuple[float, str]:
    """The longest one call took over the hostile lines, and on which; stops at the first line over
    the bound (a quadratic pattern would otherwise take minutes to prove it)."""
    worst, worst_line = 0.0, ""
    for label, line in hostile_lines():
        took = math.inf
        for _ in range(RETRIES_OVER_THE_BOUND):  # a busy machine can stall one run; a quadratic line stays slow
            started = time.perf_counter()
            call(line)
            took = min(took, time.perf_counter() - started)
            if took < PER_LINE_SECONDS:
                break
        if took > worst:
            worst, worst_line = took, label
            if worst >= PER_LINE_SECONDS:
                break
    return worst, worst_line


def test_the_grammar_has_patterns_to_check() -> None:
    names = {name for name, _ in patterns()}
    assert len(names) >= 20 and "cri.CRI_RE" in names


@pytest.mark.parametrize(("name", "pattern"), patterns(), ids=[name for name, _ in patterns()])
def test_every_pattern_is_linear_on_hostile_lines(name: str, pattern: re.Pattern[str]) -> None:
    def apply(line: str) -> None:
        pattern.search(line)
        pattern.match(line)
        for _ in zip(range(64), pattern.finditer(line), strict=False):  # at most 64 matches
            pass

    worst, line = slowest(apply)
    assert worst < PER_LINE_SECONDS, f"{name} took {worst:.2f} s on {line}"


@pytest.mark.parametrize("entry", ["split_records", "parse_message", "analyzer"])
def test_every_entry_point_is_linear_on_hostile_lines(entry: str) -> None:
    analyzer = LogAnalyzer()
    calls: dict[str, Callable[[str], object]] = {
        "split_records": lambda line: g.split_records(line, {}),
        "parse_message": g.parse_message,
        "analyzer": analyzer.feed,
    }
    worst, line = slowest(calls[entry])
    assert worst < PER_LINE_SECONDS, f"{entry} took {worst:.2f} s on {line}"
    if entry == "analyzer":
        assert not analyzer.overflow.get("internal_errors"), analyzer.overflow


def test_the_line_from_the_review_is_cheap() -> None:
    """The review's line: 16,000 x NET/ before a GDR phrase (11 s of CPU per line before the fix)."""
    line = "h:1:2 [0] NCCL INFO " + "NET/" * 16000 + "GPU Direct RDMA Enabled for x"
    started = time.perf_counter()
    analyzer = LogAnalyzer()
    analyzer.feed(line)
    analyzer.result()
    assert time.perf_counter() - started < PER_LINE_SECONDS


def test_log_derived_names_are_capped() -> None:
    """``Using network <60 KB>`` once made a 15 MB /metrics page: names that become label values
    (network, version, commId) are cut to what NCCL itself can print."""
    analyzer = LogAnalyzer()
    huge = "x" * 60000
    analyzer.feed(f"h:1:2 [0] NCCL INFO Using network {huge}")
    analyzer.feed("h:1:2 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 busId 1000 commId 0x1234 - Init COMPLETE")
    analyzer.feed(f"h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/{huge}/0")
    analyzer.feed(f"NCCL version 2.18.3+{huge}")
    verdict = analyzer.result()
    labels = [verdict.network, verdict.nccl_version] + [
        value for c in verdict.communicators for value in (c.comm_id, c.network, c.nccl_version)
    ]
    assert all(value is None or len(value) <= g.MAX_NAME_CHARS for value in labels), [len(v or "") for v in labels]

"""One node-wide memory budget for every stream's NCCL log analyzer.

The review found one stream's analyzer holding ~28 MB at its caps, nine streams 317 MB, with 512
streams allowed. Each analyzer now estimates what it holds (checked here against tracemalloc), and
the collector keeps their sum within a budget: the largest forget their oldest communicators first,
keeping what those communicators showed, so a fallback already seen is never forgotten.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

from devtools.hostile_lines import communicator_flood
from exporter.collectors.nccl import EXPORTER_PARSER_LIMITS, NcclCollector, NcclLimits, NcclSettings
from exporter.nccl import LogAnalyzer
from exporter.sources.podlogs import PodLogTailer
from tests.clocks import ManualClock
from tests.collectors.test_nccl_collector import START, samples, sim_node, value
from tests.collectors.test_nccl_verdicts import socket_open_placement, write_pod_log


def test_the_estimate_follows_what_is_really_held() -> None:
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        analyzer = LogAnalyzer(EXPORTER_PARSER_LIMITS)
        for line in communicator_flood("h", 24, 1024):
            analyzer.feed(line)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert 0.6 < analyzer.approx_bytes() / held < 1.6, (analyzer.approx_bytes(), held)


def test_shrinking_keeps_a_fallback_already_seen() -> None:
    analyzer = LogAnalyzer(EXPORTER_PARSER_LIMITS)
    for line in [
        "a:1:1 [0] NCCL INFO Using network Socket",
        "a:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0",
        "a:1:1 [0] NCCL INFO ncclCommInitRank comm 0x1 rank 0 nranks 16 cudaDev 0 nvmlDev 0 busId 1000 "
        "commId 0xaa - Init COMPLETE",
        *communicator_flood("a", 8, 256),
    ]:
        analyzer.feed(line)
    assert analyzer.result().verdict == "tcp_fallback"
    before = analyzer.approx_bytes()
    size = analyzer.shrink(0)
    assert size < before / 4 and not analyzer.communicators
    assert analyzer.overflow["budget"] >= 1
    assert analyzer.result().verdict == "tcp_fallback"


def test_the_node_wide_budget_holds_and_says_what_it_dropped(tmp_path: Path) -> None:
    budget = 6 * 1024 * 1024
    pods = tmp_path / "pods"
    write_pod_log(
        pods,
        "victim-0",
        socket_open_placement("victim-0", 0, 16)
        + [
            "victim-0:101:101 [0] NCCL INFO comm 0x55d4c0a1b000 rank 0 nRanks 16 nNodes 2 localRanks 8 "
            "localRank 0 MNNVL 0"
        ],
    )
    for i in range(6):
        write_pod_log(pods, f"noisy-{i}", communicator_flood(f"noisy-{i}", 32, 512))
    node, _ = sim_node(tmp_path)
    tailer = PodLogTailer(pods, tmp_path / "nccl", tmp_path / "state")
    collector = NcclCollector(
        tailer,
        node.sysfs,
        clock=ManualClock(START),
        settings=NcclSettings(limits=NcclLimits(parser_memory_budget_bytes=budget)),
    )
    for _ in range(20):
        collector.step()
    found = samples(collector)
    held = sum(analyzer.approx_bytes() for analyzer in collector.streams.analyzers())
    assert held <= budget
    assert value(found, "ccl_nccl_parser_memory_bytes") <= budget
    assert value(found, "ccl_nccl_dropped_total", reason="parser_budget") >= 1
    assert value(found, "ccl_nccl_tcp_fallback", pod="victim-0") == 1  # the small stream is not the one shrunk

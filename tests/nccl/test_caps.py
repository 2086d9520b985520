"""A hostile pod cannot grow one stream's state without bound: caps hold, overflow is counted."""

from __future__ import annotations

import sys

from exporter.nccl import Limits, LogAnalyzer


def _deep_size(obj: object, seen: set[int] | None = None) -> int:
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(_deep_size(k, seen) + _deep_size(v, seen) for k, v in obj.items())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        size += sum(_deep_size(x, seen) for x in obj)
    elif hasattr(obj, "__dict__"):
        size += _deep_size(vars(obj), seen)
    elif hasattr(obj, "__slots__"):
        size += sum(_deep_size(getattr(obj, s), seen) for s in obj.__slots__ if hasattr(obj, s))
    return size


def test_a_million_distinct_comm_ids_stay_bounded() -> None:
    limits = Limits()
    analyzer = LogAnalyzer(limits)
    n = 1_000_000
    for i in range(n):
        analyzer.feed(
            f"h:1:1 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1000 "
            f"commId 0x{i:x} - Init COMPLETE"
        )
        if i % 100_000 == 0:
            analyzer.result()
    assert len(analyzer.communicators) <= limits.max_communicators
    assert analyzer.overflow["communicators"] == n - limits.max_communicators
    assert _deep_size(analyzer) < 2_000_000
    assert len(analyzer.result().communicators) <= limits.max_communicators


def test_endless_distinct_connections_processes_and_threads_stay_bounded() -> None:
    limits = Limits(max_connections=1000, max_processes=50, max_threads=8)
    analyzer = LogAnalyzer(limits)
    for i in range(20_000):
        analyzer.feed(
            f"host{i % 200}:{i}:{i % 97} [0] NCCL INFO Channel {i % 64:02d}/0 : {i}[0] -> {i + 1}[0] "
            f"[send] via NET/Socket/0"
        )
    assert len(analyzer.connections) <= 1000
    assert len(analyzer.processes) <= 50
    assert all(len(p.threads) <= 8 for p in analyzer.processes.values())
    assert analyzer.overflow["connections"] > 0 and analyzer.overflow["processes"] > 0
    analyzer.result()


def test_a_fallback_seen_before_eviction_is_not_forgotten() -> None:
    analyzer = LogAnalyzer(Limits(max_communicators=4))
    for line in [
        "a:1:1 [0] NCCL INFO Using network Socket",
        "a:1:1 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1000 commId 0xf00 - Init START",
        "a:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0",
    ]:
        analyzer.feed(line)
    assert analyzer.result().verdict == "tcp_fallback"
    for i in range(10):
        analyzer.feed(
            f"a:1:1 [0] NCCL INFO comm 0x2 rank 0 nranks 1 cudaDev 0 nvmlDev 0 busId 1000 "
            f"commId 0x{i:x} - Init COMPLETE"
        )
    verdict = analyzer.result()
    assert "0xf00" not in [c.comm_id for c in verdict.communicators]
    assert verdict.verdict == "tcp_fallback" and verdict.inter_node_tcp is True


def test_warning_sample_is_capped_but_counts_are_not() -> None:
    analyzer = LogAnalyzer(Limits(max_warnings=5))
    for i in range(100):
        analyzer.feed(f"h:1:1 [0] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote peer x<{i}>")
    assert analyzer.warnings_by_category == {"socket_connection_closed": 100}
    assert len(analyzer.result().warnings) == 5
    assert analyzer.overflow["warnings"] == 95


def test_evicted_communicators_leave_no_pointers_behind() -> None:
    """Each init names a new comm pointer; evicting a communicator forgets the pointers naming it,
    so one process's pointer table holds only live communicators."""
    limits = Limits(max_communicators=8, max_pointers=256)
    analyzer = LogAnalyzer(limits)
    for i in range(2000):
        analyzer.feed(
            f"h:1:1 [0] NCCL INFO comm 0x{i:x} rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1000 "
            f"commId 0x{i + 1:x} - Init START"
        )
        analyzer.feed("h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0")
    (process,) = analyzer.processes.values()
    assert set(process.pointers.values()) <= set(analyzer.communicators)
    assert len(process.pointers) <= limits.max_communicators
    assert analyzer.overflow["communicators"] == 2000 - limits.max_communicators
    assert analyzer.result().verdict == "rdma"

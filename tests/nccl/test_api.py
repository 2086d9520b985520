"""The public API the collector builds on: names, types, caching, counters."""

from __future__ import annotations

import dataclasses

from exporter.nccl import CommunicatorSummary, Limits, LogAnalyzer, NcclWarning, Verdict

SOCKET_TWO_NODES = """\
node0:100:100 [0] NCCL INFO NET/IB : No device found.
node0:100:100 [0] NCCL INFO Using network Socket
node0:100:110 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1b000 commId 0xabc - Init START
node0:100:110 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0
node0:100:110 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0
node0:100:110 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1b000 commId 0xabc - Init COMPLETE
node0:100:120 [0] transport/net_socket.cc:400 NCCL WARN NET/Socket : socketProgress: Connection closed by remote peer node1<4242>
"""  # noqa: E501 - NCCL log lines, whole as NCCL writes them


def feed(text: str, limits: Limits | None = None) -> LogAnalyzer:
    analyzer = LogAnalyzer(limits)
    for line in text.splitlines():
        analyzer.feed(line)
    return analyzer


def test_verdict_types_and_json_shape() -> None:
    analyzer = feed(SOCKET_TWO_NODES)
    verdict = analyzer.result()
    assert isinstance(verdict, Verdict)
    assert verdict.verdict == "tcp_fallback" and verdict.inter_node_tcp is True
    assert verdict.network == "Socket"
    (comm,) = verdict.communicators
    assert isinstance(comm, CommunicatorSummary)
    assert comm.comm_id == "0xabc" and comm.nranks == 2
    assert comm.transports == {("net_socket", "inter_node", "0"): 2}
    assert all(isinstance(w, NcclWarning) for w in verdict.warnings)
    assert set(verdict.to_json()) == {
        "verdict",
        "inter_node_tcp",
        "network",
        "gdr",
        "nccl_version",
        "nodes",
        "nranks",
        "communicators",
        "warnings",
        "reasons",
    }
    assert dataclasses.is_dataclass(verdict) and dataclasses.fields(CommunicatorSummary)[0].name == "comm_id"


def test_result_is_cached_until_state_changes() -> None:
    analyzer = feed(SOCKET_TWO_NODES)
    first = analyzer.result()
    assert analyzer.result() is first
    analyzer.feed("python: step 10 loss 2.3")  # not NCCL: no recompute
    assert analyzer.result() is first
    analyzer.feed("node0:100:110 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[0] [send] via NET/Socket/0")
    assert analyzer.result() is not first


def test_warning_counts_are_monotonic_by_category() -> None:
    analyzer = feed(SOCKET_TWO_NODES)
    assert analyzer.warnings_by_category == {"ib_no_device": 1, "socket_connection_closed": 1}
    analyzer.feed(SOCKET_TWO_NODES.splitlines()[-1])
    assert analyzer.warnings_by_category["socket_connection_closed"] == 2


def test_network_class_is_exported() -> None:
    from exporter.nccl import RDMA, TCP, network_class

    assert network_class("IBext_v8") == RDMA and network_class("GPUDirectTCPX_v7") == TCP
    assert network_class("NCCL RDMA Plugin v10") == RDMA, "HPC-X's plugin by the name it loads under"
    assert network_class("SomethingNew") is None

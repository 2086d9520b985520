"""Which NIC each GPU's NCCL traffic leaves through (exporter.nccl.nics), from NET channel lines."""

from __future__ import annotations

from pathlib import Path

from exporter.nccl import LogAnalyzer
from exporter.nccl.events import ConnectionEvent, IbDevicesEvent
from exporter.nccl.grammar import parse_message
from exporter.nccl.nics import NicUse, nic_uses

CORPUS = Path(__file__).resolve().parent.parent / "fixtures" / "nccl" / "synthetic"


def uses(lines: list[str]) -> tuple[NicUse, ...]:
    analyzer = LogAnalyzer()
    for line in lines:
        analyzer.feed(line)
    return nic_uses(analyzer)


def test_two_node_log_names_each_gpu_and_its_nic_through_the_init_lines_busid() -> None:
    found = uses((CORPUS / "ib-2.18-two-nodes-16-ranks-gdrdma.log").read_text().splitlines())
    # 7 -> 8 [send] via NET/IB/3 from node-a (GPU db000), [receive] via NET/IB/0 on node-b (GPU 18000), ...
    assert NicUse("node-a", "db000", "mlx5_3", "true") in found
    assert NicUse("node-b", "18000", "mlx5_0", "true") in found
    assert NicUse("node-a", "18000", "mlx5_0", "true") in found
    assert {u.host for u in found} == {"node-a", "node-b"}


def test_pxn_lines_name_the_proxy_ranks_gpu() -> None:
    p = "h1:10:10 [0] NCCL INFO "
    q = "h1:11:11 [1] NCCL INFO "
    lines = [
        p + "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]; OOB eth0:10.0.0.1<0>",
        q + "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]; OOB eth0:10.0.0.1<0>",
        p + "Using network IB",
        p + "ncclCommInitRank comm 0x1 rank 0 nranks 4 cudaDev 0 nvmlDev 0 busId 18000 commId 0xab - Init START",
        q + "ncclCommInitRank comm 0x2 rank 1 nranks 4 cudaDev 1 nvmlDev 1 busId 2a000 commId 0xab - Init START",
        # rank 0's traffic goes over NVLink to rank 1, whose GPU talks to mlx5_1 (PXN)
        p + "Channel 00/0 : 0[0] -> 2[0] [send] via NET/IB/1(1)/GDRDMA",
        p + "ncclCommInitRank comm 0x1 rank 0 nranks 4 cudaDev 0 nvmlDev 0 busId 18000 commId 0xab - Init COMPLETE",
    ]
    assert uses(lines) == (NicUse("h1", "2a000", "mlx5_1", "true"),)


def test_before_2_18_3_the_channel_line_names_the_gpu_by_busid() -> None:
    p = "h1:10:10 [0] NCCL INFO "
    lines = [
        p + "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.0.0.1<0>",
        p + "Channel 00 : 3[5d000] -> 4[9a000] [send] via NET/IB/1",
        p + "Channel 01 : 3[5d000] -> 4[9a000] [send] via NET/IB/1/GDRDMA",
    ]
    assert uses(lines) == (NicUse("h1", "5d000", "mlx5_1", "mixed"),)


def test_lines_the_log_cannot_place_are_left_out() -> None:
    p = "h1:10:10 [0] NCCL INFO "
    base = [p + "NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.1<0>"]
    assert uses(base + [p + "Channel 00/0 : 3[3] -> 4[0] [send] via NET/IB/0"]) == (), "an NVML index, no init line"
    assert uses(base + [p + "Channel 00 : 3[5d000] -> 4[9a000] [send] via NET/IB/4"]) == (), "no device [4] listed"
    assert uses([p + "Channel 00 : 3[5d000] -> 4[9a000] [send] via NET/IB/0"]) == (), "no NET/IB : Using line"
    socket = [
        p + "NET/Socket : Using [0]eth0:10.0.0.1<0>",
        p + "Channel 00 : 3[5d000] -> 4[9a000] [send] via NET/Socket/0",
    ]
    assert uses(socket) == (), "TCP: no RDMA NIC"


def test_device_lists_with_rails_and_planes_are_read() -> None:
    event = parse_message(
        "NET/IB : Using [0]mlx5_0:1:3/IB [1]mlx5_1:1::2/RoCE [2]mlx5_2:1/IB [RO]; OOB eth0:10.0.0.1<0>"
    )
    assert isinstance(event, IbDevicesEvent)
    assert [(d.index, d.device, d.port, d.link) for d in event.devices] == [
        (0, "mlx5_0", 1, "IB"),
        (1, "mlx5_1", 1, "RoCE"),
        (2, "mlx5_2", 1, "IB"),
    ]
    line = parse_message("Channel 02/1 : 7[7] -> 8[0] [send] via NET/IB/3(5)/GDRDMA(PCI)/Shared")
    assert isinstance(line, ConnectionEvent) and (line.net_device, line.proxy_rank, line.gdr) == (3, 5, True)

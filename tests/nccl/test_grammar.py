"""Table-driven tests of wrapper stripping, record splitting and message events."""

from __future__ import annotations

import pytest

from exporter.nccl import grammar as g

PREFIX_CASES = [
    # (physical line, host, pid, tid, cudaDev, level, message)
    ("node1:123:456 [3] NCCL INFO Using network IB", "node1", 123, 456, 3, "INFO", "Using network IB"),
    (
        "[1,26]<stdout>:ip-172-32-36-209:8716:9558 [2] NCCL INFO Using network Socket",
        "ip-172-32-36-209",
        8716,
        9558,
        2,
        "INFO",
        "Using network Socket",
    ),
    ("[155] crow-a:5330:5330 [3] NCCL INFO Using network IB", "crow-a", 5330, 5330, 3, "INFO", "Using network IB"),
    (
        "gpu1505: gpu1505:22060:22174 [0] NCCL INFO Using network IB",
        "gpu1505",
        22060,
        22174,
        0,
        "INFO",
        "Using network IB",
    ),
    (
        "104.171.201.171: lambda-scalar02:77:78 [1] NCCL INFO Using network IB",
        "lambda-scalar02",
        77,
        78,
        1,
        "INFO",
        "Using network IB",
    ),
    ("        [1,0]<stdout>:h:1:2 [0] NCCL INFO Using network IB", "h", 1, 2, 0, "INFO", "Using network IB"),
    (
        "[2026-05-05 06:16:47] node-01:189884:189884 [3] plugin/net.cc:334 NCCL WARN "
        "Failed to initialize any NET plugin",
        "node-01",
        189884,
        189884,
        3,
        "WARN",
        "Failed to initialize any NET plugin",
    ),
    (
        "  | 2025-05-16T16:39:51.208-07:00 | ip-10-0-0-1:79:79 [0] NCCL INFO Using network Libfabric",
        "ip-10-0-0-1",
        79,
        79,
        0,
        "INFO",
        "Using network Libfabric",
    ),
    (
        "  | 2025-05-16T16:39:51.208-07:00ip-10-0-0-1:79:79 [0] NCCL INFO Using network Libfabric |",
        "ip-10-0-0-1",
        79,
        79,
        0,
        "INFO",
        "Using network Libfabric",
    ),
    (
        "<cluster_name>:922:1158 [3] proxy.cc:1485 NCCL WARN [Service thread] Error encountered progressing",
        "<cluster_name>",
        922,
        1158,
        3,
        "WARN",
        "[Service thread] Error encountered progressing",
    ),
    (
        "h:1:2 [0] transport/net_ib.cc:1295 (ncclIbTest) NCCL WARN NET/IB: Got completion from peer 10.0.0.2<1>",
        "h",
        1,
        2,
        0,
        "WARN",
        "NET/IB: Got completion from peer 10.0.0.2<1>",
    ),
    ("h:1:2 [0] 12.345678 net.cc:10 NCCL TRACE x", "h", 1, 2, 0, "TRACE", "x"),
    # a terminal log viewer: a frame bar in front, padding and a closing bar behind
    (
        "\u2502 pod-a:73:73 [1] NCCL INFO Using network AWS Libfabric" + " " * 120 + "\u2502",
        "pod-a",
        73,
        73,
        1,
        "INFO",
        "Using network AWS Libfabric",
    ),
    ("\x1b[32mh:1:2 [0] NCCL INFO Using network IB\x1b[0m", "h", 1, 2, 0, "INFO", "Using network IB"),  # ANSI colours
    ("h:1:2 [0] NCCL INFO Using network IB\r", "h", 1, 2, 0, "INFO", "Using network IB"),  # CRLF
    ("12: h:1:2 [0] NCCL INFO Using network IB", "h", 1, 2, 0, "INFO", "Using network IB"),  # srun --label
    ("trainer-1  | h:1:2 [0] NCCL INFO Using network IB", "h", 1, 2, 0, "INFO", "Using network IB"),  # compose
    (
        "2024-05-01T10:00:00.123456789Z h:1:2 [0] NCCL INFO Using network IB",  # kubectl logs --timestamps
        "h",
        1,
        2,
        0,
        "INFO",
        "Using network IB",
    ),
    (
        "(EngineCore pid=1088) (RayWorkerWrapper pid=285, ip=10.0.0.2) h:285:285 [0] NCCL INFO Using network IB "
        "[repeated 3x across cluster]",
        "h",
        285,
        285,
        0,
        "INFO",
        "Using network IB",
    ),  # Ray, deduplicated
    (
        "(RayWorkerWrapper pid=285) h:285:285 [0] NCCL INFO Using network IB [repeated 12x across cluster] (Ray "
        "deduplicates logs by default. Set RAY_DEDUP_LOGS=0 to disable log deduplication.)      [615/4138]",
        "h",
        285,
        285,
        0,
        "INFO",
        "Using network IB",
    ),
]


@pytest.mark.parametrize("line,host,pid,tid,dev,level,message", PREFIX_CASES)
def test_prefix_and_wrappers(line: str, host: str, pid: int, tid: int, dev: int, level: str, message: str) -> None:
    (record,) = g.split_records(line)
    assert record.prefix is not None
    assert (record.prefix.host, record.prefix.pid, record.prefix.tid, record.prefix.cuda_dev) == (host, pid, tid, dev)
    assert (record.level, record.message) == (level, message)


def test_warn_location_is_kept() -> None:
    (record,) = g.split_records("h:1:2 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]")
    assert record.prefix is not None and record.prefix.location == "misc/ibvwrap.cc:63"
    assert g.warning_category(record) == "ib_library_missing"


def test_two_records_on_one_line() -> None:
    records = g.split_records("a:1:1 [0] NCCL INFO Using network IB b:2:2 [1] NCCL INFO Using network Socket")
    assert [(r.prefix.host, r.message) for r in records if r.prefix] == [
        ("a", "Using network IB"),
        ("b", "Using network Socket"),
    ]


@pytest.mark.parametrize(
    "line",
    [
        "Using network IBext_v8",
        "[1,0]<stdout>:Using network IBext_v8",
        "2024-01-01T00:00:00Z Using network IBext_v8",
        "[12] Using network IBext_v8",
        "0: Using network IBext_v8",
        "trainer-1  | Using network IBext_v8",
        "(RayTrainWorker pid=285, ip=10.0.0.2) Using network IBext_v8",
        "\u2502 Using network IBext_v8     \u2502",
        "[pod/train-worker-0/pytorch] Using network IBext_v8\r",
    ],
)
def test_bare_bodies(line: str) -> None:
    (record,) = g.split_records(line)
    assert record.prefix is None and record.level is None
    assert g.parse_message(record.message) == g.NetworkEvent("IBext_v8")


EVENT_CASES = [
    ("NCCL version 2.18.3+cuda12.2", g.VersionEvent("2.18.3")),
    ("NCCL version 2.19.0a0+cuda12.1", g.VersionEvent("2.19.0a0")),
    ("Using internal Network IB", g.NetworkEvent("IB")),
    ("Using network AWS Libfabric", g.NetworkEvent("AWS Libfabric")),
    ("Assigned NET plugin IBext_v10 to comm", g.NetworkEvent("IBext_v10")),
    ("NET/IB : No device found.", g.IbUnavailableEvent(g.IB_NO_DEVICE)),
    (
        "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE [RO]; OOB eth0:10.0.0.1<0>",
        g.IbDevicesEvent((g.IbDevice(0, "mlx5_0", 1, "IB"), g.IbDevice(1, "mlx5_1", 1, "RoCE")), "eth0", "10.0.0.1"),
    ),
    (
        "NET/IB : Using [0]mlx5_0:1/IB/SHARP ; OOB ib0:10.0.0.1<0>",
        g.IbDevicesEvent((g.IbDevice(0, "mlx5_0", 1, "IB/SHARP"),), "ib0", "10.0.0.1"),
    ),
    (
        "NET/Socket : Using [0]ib0:192.168.11.1<0> [1]eth0:10.0.0.1<0>",
        g.SocketDevicesEvent((("ib0", "192.168.11.1"), ("eth0", "10.0.0.1"))),
    ),
    ("Bootstrap : Using eth0:10.1.2.3<0>", g.BootstrapEvent("eth0", "10.1.2.3")),
    ("Bootstrap: Using [0]enp71s0:10.1.2.3<0>", g.BootstrapEvent("enp71s0", "10.1.2.3")),
    (
        "comm 0x55d rank 3 nranks 16 cudaDev 3 busId 1c000 - Init COMPLETE",
        g.CommInitEvent("0x55d", 3, 16, None, "COMPLETE", "1c000", "1c000"),
    ),
    (
        "ncclCommSplit comm 0x1 rank 0 nranks 8 cudaDev 0 nvmlDev 0 busId 18000 parent 0x2 color 1 key 0 "
        "commId 0xABCDEF - Init START",
        g.CommInitEvent("0x1", 0, 8, "0xabcdef", "START", "0", "18000"),
    ),
    (
        "[Rank 4] ncclCommInitRankConfig comm 0x9 rank 4 nranks 8 cudaDev 4 nvmlDev 4 busId 9b000 "
        "commId 0x12 - Init START",
        g.CommInitEvent("0x9", 4, 8, "0x12", "START", "4", "9b000"),
    ),
    ("comm 0x5 rank 1 nranks 8 cudaDev 1 nvmlDev 1 - Init COMPLETE", g.CommInitEvent("0x5", 1, 8, None, "COMPLETE")),
    ("comm 0x7f12 rank 1 nranks 4", g.CommInitEvent("0x7f12", 1, 4, None, None)),
    (
        "comm 0x1 rank 0 nranks 8 cudaDev 0 busId 1b000 - Destroy COMPLETE",
        g.CommInitEvent("0x1", 0, 8, None, "END", "1b000", "1b000"),
    ),
    (
        "comm 0x1 rank 5 nRanks 16 nNodes 2 localRanks 8 localRank 5 MNNVL 0",
        g.CommNodesEvent("0x1", 5, 16, 2, 8, 5, False),
    ),
    (
        "24 coll channels, 0 collnet channels, 16 nvls channels, 32 p2p channels, 32 p2p channels per peer",
        g.ChannelSummaryEvent(24, 0, 16),
    ),
    (
        "NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0' (no module)",
        g.GdrEvent(False, "IB", "HCA 0 'mlx5_0' (no module)"),
    ),
    (
        "GPU Direct RDMA Enabled for GPU 1b000 / HCA 0 (distance 4 <= 5), read 1",
        g.GdrEvent(True, None, "GPU 1b000 / HCA 0 (distance 4 <= 5), read 1"),
    ),
    ("NCCL_IB_DISABLE set by environment to 1.", g.EnvEvent("NCCL_IB_DISABLE", "1")),
    (
        "#  Rank  8 Group  0 Pid   4567 on node-2.cluster.local device  0 [0x1b] NVIDIA H100",
        g.TestRankEvent(8, 4567, "node-2", "0x1b"),
    ),
    (  # nccl-tests 2.14+ prints the domain too
        "#  Rank  1 Group  0 Pid 3120 on gpu-a device  0 [0000:C1:00] NVIDIA GeForce RTX 4090",
        g.TestRankEvent(1, 3120, "gpu-a", "0000:c1:00"),
    ),
    ("#  Rank  0 Pid  700 on gpu-a device  3 Tesla V100", g.TestRankEvent(0, 700, "gpu-a")),  # no bus id
    ("Channel 00 :    0   1   2   3", g.RingOrderEvent((0, 1, 2, 3))),  # rank 0's ring listing, not a connection
    ("Channel 01/02 :    0   3   2   1", g.RingOrderEvent((0, 3, 2, 1))),
    ("Ring 00 : 0 -> 1 -> 0", g.RankEvent(1, None)),  # prev -> me -> next (GRAPH)
    ("Trees [0] 1/-1/-1->0->-1 [1] -1/-1/-1->0->1", g.RankEvent(0, None)),  # downs -> me -> up
    ("Trees [0] 2->1->-1/-1/-1", g.RankEvent(1, None)),  # 2.4: up -> me -> downs
    ("rank 3 nranks 4", g.RankEvent(3, 4)),  # 2.3, after ncclCommInitRank
    ("nranks 8", g.AllRanksEvent(8)),  # 2.3-2.4 ncclCommInitAll: one process, every rank
    ("Failed to open libibverbs.so[.1]", g.IbUnavailableEvent(g.IB_NO_VERBS)),
    ("NET/IB : No IP interface found.", g.IbUnavailableEvent(g.IB_NO_INTERFACE)),
    ("Failed to initialize NET plugin IB", g.IbUnavailableEvent(g.IB_INIT_FAILED)),
    ("Net/IB: call to devices() returned 0 devices.", g.IbUnavailableEvent(g.IB_ZERO_DEVICES)),
    ("NET/IB : Using [RO]; OOB eth0:172.17.16.64<0>", g.IbDevicesEvent((), "eth0", "172.17.16.64")),
    ("NET/Plugin: Loaded net plugin FastSocket (v6)", g.PluginEvent(None, "FastSocket", g.PLUGIN_LOADED)),
    ("NET/Plugin: Loaded net plugin AWS Libfabric (v5)", g.PluginEvent(None, "AWS Libfabric", g.PLUGIN_LOADED)),
    ("Initialized NET plugin Socket", g.PluginEvent(None, "Socket", g.PLUGIN_IN_USE)),
    ("Failed to initialize NET plugin IBext_v8", g.PluginEvent(None, "IBext_v8", g.PLUGIN_FAILED)),
    ("NET/FastSocket : Using [0]eth0:10.128.0.2<0>", g.PluginEvent("FastSocket", None, g.PLUGIN_IN_USE)),
    ("NET/FastSocket disabled", g.PluginEvent("FastSocket", None, g.PLUGIN_DISABLED)),
    (
        "NET/GPUDirectTCPX : Using [0]eth1:10.0.1.2<0> [1]eth2:10.0.2.2<0>",
        g.PluginEvent("GPUDirectTCPX", None, g.PLUGIN_IN_USE),
    ),
    ("NET/GPUDirectTCPX disabled", g.PluginEvent("GPUDirectTCPX", None, g.PLUGIN_DISABLED)),
    ("NET/FasTrak : Using 8 NICs", g.PluginEvent("FasTrak", None, g.PLUGIN_IN_USE)),
    ("NET/OFI Selected Provider is efa", g.OfiProviderEvent("efa", None)),
    ("NET/OFI Selected Provider is tcp;ofi_rxm (found 1 nics)", g.OfiProviderEvent("tcp;ofi_rxm", None)),
    (
        "NET/OFI Selected provider is sockets, fabric is 172.31.0.0/20 (found 2 nics)",
        g.OfiProviderEvent("sockets", "172.31.0.0/20"),
    ),
    ("NET/OFI No eligible providers were found", g.PluginEvent(g.OFI_FAMILY, None, g.PLUGIN_FAILED)),
    # aws-ofi-nccl's lines before it picks a provider: loaded, not yet shown in use.
    ("NET/OFI Initializing aws-ofi-nccl 1.9.1-aws", g.PluginEvent(g.OFI_FAMILY, None, g.PLUGIN_LOADED)),
    ("NET/OFI Using aws-ofi-nccl 1.1.0", g.PluginEvent(g.OFI_FAMILY, None, g.PLUGIN_LOADED)),
    (
        "NET/OFI Running on p5.48xlarge platform, topology file /opt/x.xml",
        g.PluginEvent(g.OFI_FAMILY, None, g.PLUGIN_LOADED),
    ),
    # HPC-X's plugin names the transport it picked in its init: the network NCCL uses from then on.
    ("P2P plugin IBext", g.PluginEvent(None, "IBext", g.PLUGIN_LOADED)),
    ("P2P plugin v8 UCX-RMA", g.PluginEvent(None, "UCX-RMA", g.PLUGIN_LOADED)),
    ("P2P plugin IBext and more words", None),
    ("NET : Using interface lo:127.0.0.1<0>", g.InterfaceEvent("lo", "127.0.0.1")),
    ("Allocated 4194656 bytes of shared memory in /dev/shm/nccl-x", None),
    ("Init timings: rank 0 nranks 16 total 1.08 (kernels 0.51)", None),
]


@pytest.mark.parametrize("message,event", EVENT_CASES)
def test_events(message: str, event: object) -> None:
    assert g.parse_message(message) == event


CONNECTION_CASES = [
    # message, kind, network, src, dst, direction, gdr, ids_are_devices, mnnvl
    ("Ring 00 : 1 -> 2 via NET/IB/0/GDRDMA", "net", "IB", 1, 2, None, True, False, False),
    ("Ring 00 : 3 -> 4 [send] via NET/IB/0/GDRDMA", "net", "IB", 3, 4, "send", True, False, False),
    ("Ring 00 : 0[0] -> 1[1] via P2P/IPC", "p2p", None, 0, 1, None, False, False, False),
    ("Ring 01 : 7[1b000] -> 0[3d000] [receive] via NET/Socket/1", "net", "Socket", 7, 0, "receive", False, True, False),
    ("Channel 00 : 3[3d000] -> 4[1b000] [send] via NET/Socket/0", "net", "Socket", 3, 4, "send", False, True, False),
    ("Channel 02/1 : 8[0] -> 0[0] [receive] via NET/IB/2(1)/GDRDMA", "net", "IB", 8, 0, "receive", True, True, False),
    (
        "Channel 00/0 : 1[1] -> 0[0] [send] via NET/AWS Libfabric/1/GDRDMA",
        "net",
        "AWS Libfabric",
        1,
        0,
        "send",
        True,
        True,
        False,
    ),
    (
        "Channel 00/1 : 0[0] -> 2[0] [send] via NET/IBext_v10/0/GDRDMA(PCI)/Shared",
        "net",
        "IBext_v10",
        0,
        2,
        "send",
        True,
        True,
        False,
    ),
    ("Channel 00 : 2[1] -> 0[0] via SHM/direct/direct", "shm", None, 2, 0, None, False, True, False),
    ("Channel 00 : 2[1] -> 0[0] via direct shared memory", "shm", None, 2, 0, None, False, True, False),
    ("Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read", "p2p", None, 0, 1, None, False, True, False),
    ("Channel 00/0 : 0[0] -> 4[0] via P2P/MNNVL/read", "p2p", None, 0, 4, None, False, True, True),
    ("Channel 01/0 : 9[1] -> 10[2] via P2P/indirect/8[0]", "p2p", None, 9, 10, None, False, True, False),
    ("CollNet 00/0 : 3 [send] via COLLNET/SHARP/1/GDRDMA", "collnet", "SHARP", 3, 3, "send", True, False, False),
]


@pytest.mark.parametrize("message,kind,network,src,dst,direction,gdr,ids,mnnvl", CONNECTION_CASES)
def test_connections(
    message: str,
    kind: str,
    network: str | None,
    src: int,
    dst: int,
    direction: str | None,
    gdr: bool,
    ids: bool,
    mnnvl: bool,
) -> None:
    event = g.parse_message(message)
    assert isinstance(event, g.ConnectionEvent)
    assert (
        event.kind,
        event.network,
        event.src,
        event.dst,
        event.direction,
        event.gdr,
        event.ids_are_devices,
        event.mnnvl,
    ) == (kind, network, src, dst, direction, gdr, ids, mnnvl)


def test_receive_line_is_logged_by_its_destination() -> None:
    event = g.parse_message("Channel 00/0 : 15[7] -> 0[0] [receive] via NET/Socket/0")
    assert isinstance(event, g.ConnectionEvent) and event.logging_rank == 0


WARNING_CASES = [
    ("misc/ibvwrap.cc:63", "Failed to open libibverbs.so[.1]", "ib_library_missing"),
    ("plugin/net.cc:334", "Failed to initialize any NET plugin", "net_plugin_failure"),
    ("nccl_net_ofi_rdma_init:7978", "NET/OFI OFI fi_getinfo() call failed: No data available", "net_plugin_failure"),
    ("transport/net_ib.cc:1295", "NET/IB : Got completion from peer 10.0.0.2<1> with error 12", "ib_completion_error"),
    ("transport/net_ib.cc:90", "NET/IB : Got async event : port error", "ib_async_event"),
    # HPC-X's IB plugin prints net_ib.cc's warnings from its own file: still the verbs transport at work.
    (
        "ib_plugin.c:1615",
        "NET/IB : Got completion from peer 10.0.0.2<1> with status=12 opcode=0",
        "ib_completion_error",
    ),
    ("ib_plugin.c:90", "NET/IB : Got async event : GID table change", "ib_async_event"),
    ("ib_plugin.c:410", "NET/IB : Unable to open device mlx5_0", "net_plugin_failure"),
    ("misc/ibvwrap.cc:200", "Call to ibv_modify_qp failed with error Connection timed out", "ib_verbs_error"),
    ("misc/socket.cc:49", "socketProgress: Connection closed by remote peer n0<1>", "socket_connection_closed"),
    ("proxy.cc:1485", "[Service thread] Error encountered progressing operation=Connect", "proxy_error"),
    ("enqueue.cc:1", "Cuda failure 'out of memory'", "cuda_error"),
    ("init.cc:1", "something nobody expected", "other"),
]


@pytest.mark.parametrize("location,message,category", WARNING_CASES)
def test_warning_categories(location: str, message: str, category: str) -> None:
    (record,) = g.split_records(f"h:1:2 [0] {location} NCCL WARN {message}")
    assert g.warning_category(record) == category
    assert category in g.WARNING_CATEGORIES


def test_info_lines_that_explain_a_missing_rdma_path_count_as_warnings() -> None:
    (record,) = g.split_records("h:1:2 [0] NCCL INFO NET/IB : No device found.")
    assert g.warning_category(record) == "ib_no_device"
    (record,) = g.split_records("h:1:2 [0] NCCL INFO Using network IB")
    assert g.warning_category(record) is None

"""How ranks are placed on nodes and connections attributed to communicators (small logs, one rule each)."""

from __future__ import annotations

from tests.nccl.conftest import analyze_text


def _socket_pair(host_a: str, host_b: str, extra_a: str = "", extra_b: str = "") -> str:
    lines = []
    for rank, (host, extra) in enumerate(((host_a, extra_a), (host_b, extra_b))):
        pid = 100 + rank
        if extra:
            lines.append(f"{host}:{pid}:{pid} [0] NCCL INFO {extra}")
        lines.append(f"{host}:{pid}:{pid} [0] NCCL INFO Using network Socket")
        lines.append(
            f"{host}:{pid}:{pid} [0] NCCL INFO Channel 00/0 : {rank}[{rank + 1}000] -> {1 - rank}[{2 - rank}000] "
            f"[send] via NET/Socket/0"
        )
        lines.append(
            f"{host}:{pid}:{pid} [0] NCCL INFO comm 0x{rank} rank {rank} nranks 2 cudaDev 0 busId {rank + 1}000 "
            f"- Init COMPLETE"
        )
    return "\n".join(lines)


def test_two_hostnames_are_two_nodes() -> None:
    verdict = analyze_text(_socket_pair("a", "b")).result()
    assert verdict.verdict == "tcp_fallback" and verdict.nodes == 2


def test_one_hostname_is_one_node() -> None:
    verdict = analyze_text(_socket_pair("a", "a")).result()
    assert verdict.verdict == "single_node" and verdict.inter_node_tcp is False and verdict.nodes == 1


def test_one_hostname_with_two_bootstrap_addresses_is_two_nodes() -> None:
    log = _socket_pair("worker", "worker", "Bootstrap : Using eth0:10.0.0.1<0>", "Bootstrap : Using eth0:10.0.0.2<0>")
    verdict = analyze_text(log).result()
    assert verdict.verdict == "tcp_fallback" and verdict.nodes == 2


def test_bootstrap_and_ib_oob_addresses_are_never_compared() -> None:
    """One process shows its bootstrap address, the other only NET/IB's OOB one: still one node."""
    log = _socket_pair(
        "worker",
        "worker",
        "Bootstrap : Using eth0:10.0.0.1<0>",
        "NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:192.168.0.1<0>",
    )
    verdict = analyze_text(log).result()
    assert verdict.verdict == "single_node" and verdict.nodes == 1


def test_loopback_addresses_do_not_name_nodes() -> None:
    log = _socket_pair("worker", "worker", "Bootstrap : Using lo:127.0.0.1<0>", "Bootstrap : Using lo:127.0.0.1<0>")
    assert analyze_text(log).result().verdict == "single_node"


def test_same_gpu_on_both_ends_beats_an_identical_hostname() -> None:
    """Two ranks on one GPU cannot share a node, whatever the (redacted) hostnames say."""
    log = "\n".join(
        [
            "<cluster_name>:1:1 [0] NCCL INFO Using network Socket",
            "<cluster_name>:1:1 [0] NCCL INFO Channel 00/0 : 8[0] -> 0[0] [send] via NET/Socket/0",
            "<cluster_name>:2:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/Socket/0",
        ]
    )
    verdict = analyze_text(log).result()
    assert verdict.verdict == "tcp_fallback"


def _test_table_on_one_host(gpus: tuple[str, str]) -> str:
    """nccl-tests' device table of two ranks on hostname "lab", each its own process, then NCCL's
    lines of each: its version and a Socket choice, nothing that places a rank."""
    lines = ["# Using devices"]
    for rank, gpu in enumerate(gpus):
        lines.append(f"#  Rank  {rank} Group  0 Pid {300 + rank} on        lab device  0 [{gpu}] NVIDIA RTX 6000")
    for rank in range(2):
        lines.append(f"lab:{300 + rank}:{300 + rank} [0] NCCL INFO NCCL version 2.29.3+cuda13.0")
        lines.append(f"lab:{300 + rank}:{300 + rank} [0] NCCL INFO Using network Socket")
    return "\n".join(lines)


def test_two_ranks_the_test_table_puts_on_one_gpu_are_not_one_node_by_hostname() -> None:
    """The device table's bus id counts as an init line's: one hostname without an address (weak)
    does not put two ranks of one GPU on one node (NCCL would have refused a duplicate GPU)."""
    one_gpu = analyze_text(_test_table_on_one_host(("0000:02:00", "0000:02:00"))).result()
    assert one_gpu.verdict == "tcp_fallback", "two host hashes (NCCL_HOSTID, as scripts/gpu-check runs) on Socket"
    assert "ranks 0, 1 on GPU 0000:02:00 (nccl-tests device table)" in one_gpu.reasons[0]
    two_gpus = analyze_text(_test_table_on_one_host(("0000:02:00", "0000:03:00"))).result()
    assert two_gpus.verdict == "single_node" and two_gpus.nodes == 1


def test_net_between_different_gpus_of_an_unknown_peer_stays_unknown() -> None:
    log = "\n".join(
        [
            "h:1:1 [0] NCCL INFO Using network Socket",
            "h:1:1 [0] NCCL INFO Channel 00/0 : 0[1b000] -> 1[3d000] [send] via NET/Socket/0",
        ]
    )
    verdict = analyze_text(log).result()
    assert verdict.verdict == "unknown" and verdict.inter_node_tcp is None
    assert verdict.communicators[0].transports == {("net_socket", "unknown", "0"): 1}


def test_runtime_connect_lines_after_init_complete_stay_with_their_communicator() -> None:
    """2.22+: connections are made at the first collective, after Init COMPLETE."""
    log = "\n".join(
        [
            "a:1:5 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1000 commId 0xaa - Init START",
            "a:1:5 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1000 commId 0xaa - Init COMPLETE",
            "a:1:5 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA",
        ]
    )
    verdict = analyze_text(log).result()
    (comm,) = verdict.communicators
    assert comm.comm_id == "0xaa" and comm.transports == {("net_ib", "inter_node", "1"): 1}
    assert verdict.gdr is True and verdict.verdict == "rdma"


def test_connections_before_init_complete_belong_to_it_on_older_versions() -> None:
    """2.12-2.17 lines ("Channel 00/0"): NET says nothing of placement in 2.14+, so only the shared
    busId places the first communicator's peer on another node."""
    log = "\n".join(
        [
            "a:1:5 [0] NCCL INFO Channel 00/0 : 0[1b000] -> 1[1b000] [send] via NET/IB/0",
            "a:1:5 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 busId 1b000 - Init COMPLETE",
            "a:1:5 [0] NCCL INFO Channel 00/0 : 0[1b000] -> 1[3d000] [send] via NET/IB/0",
            "a:1:5 [0] NCCL INFO comm 0x2 rank 0 nranks 4 cudaDev 0 busId 1b000 - Init COMPLETE",
        ]
    )
    verdict = analyze_text(log).result()
    by_id = {c.comm_id: c for c in verdict.communicators}
    assert by_id["nranks:2"].transports == {("net_ib", "inter_node", "0"): 1}
    assert by_id["nranks:4"].transports == {("net_ib", "unknown", "0"): 1}
    assert verdict.gdr is False


def test_net_lines_before_2_14_join_two_nodes() -> None:
    """2.7-2.11 lines ("Channel 00 :", no connection index): SHM connects any two ranks of one host,
    so a NET connection crosses nodes, whatever GPUs it names."""
    log = "\n".join(
        [
            "a:1:5 [0] NCCL INFO Channel 00 : 0[1b000] -> 1[3d000] [send] via NET/Socket/0",
            "a:1:5 [0] NCCL INFO comm 0x2 rank 0 nranks 4 cudaDev 0 busId 1b000 - Init COMPLETE",
        ]
    )
    verdict = analyze_text(log).result()
    (comm,) = verdict.communicators
    assert comm.transports == {("net_socket", "inter_node", "0"): 1}
    assert verdict.verdict == "tcp_fallback"


def test_net_lines_before_2_14_say_nothing_once_shm_is_disabled() -> None:
    for setting in (
        "a:1:5 [0] NCCL INFO NCCL_SHM_DISABLE set by environment to 1.",
        "$ mpirun -np 4 -x NCCL_SHM_DISABLE=1 ./all_reduce_perf -b 8 -e 1G",
    ):
        log = "\n".join(
            [
                setting,
                "a:1:5 [0] NCCL INFO Channel 00 : 0[1b000] -> 1[3d000] [send] via NET/Socket/0",
                "a:1:5 [0] NCCL INFO comm 0x2 rank 0 nranks 4 cudaDev 0 busId 1b000 - Init COMPLETE",
            ]
        )
        verdict = analyze_text(log).result()
        assert verdict.communicators[0].transports == {("net_socket", "unknown", "0"): 1}, setting
        assert verdict.verdict == "unknown", setting


def test_net_lines_before_2_14_between_processes_of_one_hostname_stay_open() -> None:
    """One hostname on both ends: two machines named alike, or SHM disabled off the excerpt."""
    log = "\n".join(
        [
            "NCCL version 2.11.4+cuda11.4",
            "h:1:5 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 busId 1b000 - Init COMPLETE",
            "h:2:6 [0] NCCL INFO comm 0x2 rank 1 nranks 2 cudaDev 0 busId 3d000 - Init COMPLETE",
            "h:1:5 [0] NCCL INFO Channel 00/0 : 0[1b000] -> 1[3d000] [send] via NET/Socket/0",
        ]
    )
    verdict = analyze_text(log).result()
    assert verdict.inter_node_tcp is not True


def test_nnodes_line_before_the_commid_line_is_merged() -> None:
    log = "\n".join(
        [
            "comm 0x7 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0",
            "Using network Socket",
            "comm 0x7 rank 0 nranks 16 cudaDev 0 nvmlDev 0 busId 18000 commId 0x51 - Init COMPLETE",
        ]
    )
    verdict = analyze_text(log).result()
    assert [c.comm_id for c in verdict.communicators] == ["0x51"]
    assert verdict.nodes == 2 and verdict.verdict == "tcp_fallback"


def test_socket_line_alone_is_not_a_network_choice_in_2_4() -> None:
    log = "\n".join(
        [
            "a:1:1 [0] NCCL INFO NET/Socket : Using [0]ib0:192.168.11.1<0>",
            "b:2:2 [0] NCCL INFO NET/Socket : Using [0]ib0:192.168.11.2<0>",
        ]
    )
    verdict = analyze_text(log).result()
    assert verdict.network is None and verdict.inter_node_tcp is None


def test_disagreeing_ranks_are_judged_by_the_tcp_one() -> None:
    log = "\n".join(
        [
            "a:1:1 [0] NCCL INFO Using network IB",
            "b:2:2 [0] NCCL INFO Using network Socket",
            "a:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0",
            "b:2:2 [0] NCCL INFO comm 0x2 rank 1 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0",
        ]
    )
    verdict = analyze_text(log).result()
    assert verdict.inter_node_tcp is True and verdict.network == "Socket"


def test_connection_lines_of_a_process_without_init_join_the_only_communicator_on_its_node() -> None:
    """Process 2 prints connection lines but no init line; the log's one communicator is on one
    node, the lines come from that node and name ranks inside its size: they are its lines."""
    log = "\n".join(
        [
            "ws:1:1 [0] NCCL INFO Using network Socket",
            "ws:1:1 [0] NCCL INFO comm 0x1 rank 0 nranks 4 cudaDev 0 nvmlDev 0 busId 1000 commId 0xaa - Init START",
            "ws:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 4 nNodes 1 localRanks 4 localRank 0 MNNVL 0",
            "ws:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] [send] via NET/Socket/0",
            "ws:2:2 [1] NCCL INFO Channel 00/0 : 1[1] -> 2[2] [send] via NET/Socket/0",
        ]
    )
    verdict = analyze_text(log).result()
    assert [c.comm_id for c in verdict.communicators] == ["0xaa"]
    assert verdict.verdict == "single_node" and verdict.inter_node_tcp is False


def test_connection_lines_from_another_node_or_outside_the_size_are_not_adopted() -> None:
    base = [
        "ws:1:1 [0] NCCL INFO Using network Socket",
        "ws:1:1 [0] NCCL INFO comm 0x1 rank 0 nranks 4 cudaDev 0 nvmlDev 0 busId 1000 commId 0xaa - Init START",
        "ws:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 4 nNodes 1 localRanks 4 localRank 0 MNNVL 0",
    ]
    for stray in (
        "other:2:2 [1] NCCL INFO Channel 00/0 : 1[1] -> 2[2] [send] via NET/Socket/0",
        "ws:2:2 [1] NCCL INFO Channel 00/0 : 5[1] -> 6[2] [send] via NET/Socket/0",
        "ws:2:2 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] [receive] via NET/Socket/0",
    ):
        verdict = analyze_text("\n".join(base + [stray])).result()
        assert "unattributed" in [c.comm_id for c in verdict.communicators], stray
        assert verdict.inter_node_tcp is None and verdict.verdict == "unknown", stray


def test_rdma_connection_lines_decide_a_communicator_that_shows_no_network() -> None:
    """Only P2P lines for the named communicator, NET lines (all RDMA) from processes whose init
    the excerpt lacks: the job's network is RDMA."""
    log = "\n".join(
        [
            "h:1:1 [0] NCCL INFO Channel 00/0 : 32[0] -> 33[1] via P2P/CUMEM",
            "h:1:1 [0] NCCL INFO comm 0x1 rank 32 nranks 64 cudaDev 0 nvmlDev 0 busId 18000 "
            "commId 0xbb - Init COMPLETE",
            "h:2:2 [1] NCCL INFO Channel 00/0 : 33[1] -> 41[1] [send] via NET/IBext_v8/4",
        ]
    )
    verdict = analyze_text(log).result()
    assert verdict.verdict == "rdma" and verdict.inter_node_tcp is False and verdict.network == "IBext_v8"
    with_socket = log.replace("NET/IBext_v8/4", "NET/Socket/0")
    assert analyze_text(with_socket).result().inter_node_tcp is not False


def test_ib_queue_pair_lines_show_the_network() -> None:
    """No Using network or NET/IB : Using line: the IB transport's own connection lines show IB."""
    log = "\n".join(
        [
            "gpu-a:1:1 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 busId 1b000 - Init COMPLETE",
            "gpu-b:2:2 [0] NCCL INFO comm 0x2 rank 1 nranks 2 cudaDev 0 busId 1b000 - Init COMPLETE",
            "gpu-a:1:9 [0] NCCL INFO NET/IB: Dev 0 Port 1 qpn 3904 mtu 5 LID 4",
        ]
    )
    verdict = analyze_text(log).result()
    assert verdict.verdict == "rdma" and verdict.network == "IB"


def test_nccl_hostid_names_the_node_whatever_the_hostname() -> None:
    """NCCL hashes NCCL_HOSTID instead of the hostname: two processes of one machine with two ids are
    two nodes, and their Socket connection crosses them (the emulation scripts/gpu-check runs)."""
    lines = []
    for rank, host_id in ((0, "emulated-a"), (1, "emulated-b")):
        pid = 10 + rank
        lines += [
            f"gpu-box:{pid}:{pid} [0] NCCL INFO NCCL_HOSTID set by environment to {host_id}",
            f"gpu-box:{pid}:{pid} [0] NCCL INFO Bootstrap : Using eth0:10.0.0.9<0>",
            f"gpu-box:{pid}:{pid} [0] NCCL INFO Using network Socket",
            f"gpu-box:{pid}:{pid} [0] NCCL INFO comm 0x{rank} rank {rank} nranks 2 cudaDev 0 nvmlDev 0 busId 1b000 "
            f"commId 0x77 - Init COMPLETE",
        ]
    lines.append("gpu-box:10:10 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0")
    verdict = analyze_text("\n".join(lines)).result()
    assert verdict.verdict == "tcp_fallback" and verdict.nodes == 2
    same = "\n".join(line.replace("emulated-b", "emulated-a") for line in lines)
    assert analyze_text(same).result().verdict == "single_node"


def test_an_unlisted_network_shown_with_gdrdma_is_rdma_for_the_whole_log() -> None:
    """A network name in neither table is RDMA-class once one of its connection lines says /GDRDMA
    (GPUDirect RDMA needs a network that registers CUDA memory), also for the ranks that only print
    its name; without /GDRDMA the class stays open; the names learnt are capped and per log."""
    log = "\n".join(
        [
            "n1:1:1 [0] NCCL INFO Using network Vendor Net v2",
            "n1:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0",
            "n1:1:1 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 busId 1b000 commId 0x42 - Init COMPLETE",
            "n2:2:2 [0] NCCL INFO comm 0x2 rank 1 nranks 2 cudaDev 0 busId 1b000 commId 0x43 - Init COMPLETE",
            "n2:2:2 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [send] via NET/Vendor Net v2/0/GDRDMA",
        ]
    )
    verdict = analyze_text(log).result()
    assert verdict.verdict == "rdma" and verdict.inter_node_tcp is False and verdict.network == "Vendor Net v2"
    without_gdr = analyze_text(log.replace("/0/GDRDMA", "/0")).result()
    assert without_gdr.verdict == "unknown" and without_gdr.inter_node_tcp is None
    # A hostile log naming many networks with /GDRDMA teaches a bounded number of names.
    flood = [f"n2:2:2 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [send] via NET/Fake{i}/0/GDRDMA" for i in range(500)]
    analyzer = analyze_text("\n".join(flood))
    assert 0 < len(analyzer.rdma_by_gdr) <= 16
    # What one log taught is not another's: the log without /GDRDMA above stayed unknown after this
    # one, and a fresh analyzer knows no name.
    assert not analyze_text("n1:1:1 [0] NCCL INFO Using network Vendor Net v2").rdma_by_gdr

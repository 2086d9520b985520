"""The ``nccl`` collector on the simulated node's real CRI log files: verdicts judged against
the node's RDMA ports, job attribution, grace-period removal, restarts without double
counting, and bounds under a hostile pod."""

from __future__ import annotations

import random
import tracemalloc
from pathlib import Path

from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from ccl_sim.node import SimulatedNode, default_node
from ccl_sim.podlogs import SimJob, SimPodLogs, nccl_init_lines, pytorchjob_labels
from exporter.collectors.nccl import NcclCollector, NcclSettings
from exporter.nccl import Limits
from exporter.sources.podlogs import PodLogTailer, TailLimits, pod_known_on_node
from tests.clocks import ManualClock

START = 1000.0  # the collectors' monotonic clock when a test begins


def samples(collector: NcclCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry(auto_describe=False)

    class Adapter:
        def collect(self):  # type: ignore[no-untyped-def]
            return list(collector.families(collector._snapshot, collector.limits))

    registry.register(Adapter())
    text = generate_latest(registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(found: dict, name: str, **labels: str) -> float | None:
    for (metric, label_items), v in found.items():
        if metric == name and all(dict(label_items).get(k) == want for k, want in labels.items()):
            return v
    return None


def sim_node(tmp_path: Path, rdma: bool = True) -> tuple[SimulatedNode, SimPodLogs]:
    node = default_node(tmp_path / "sim")
    if not rdma:
        node.parts = [p for p in node.parts if isinstance(p, SimPodLogs)]
    node.setup()
    node.advance(1.0)
    sim = next(p for p in node.parts if isinstance(p, SimPodLogs))
    return node, sim


def make_collector(node: SimulatedNode, sim: SimPodLogs, clock: ManualClock | None = None, **kw) -> NcclCollector:  # type: ignore[no-untyped-def]
    tailer = PodLogTailer(sim.pod_logs, node.root / "nccl", node.root / "state", kw.pop("tail_limits", None))
    return NcclCollector(tailer, node.sysfs, sim, clock=clock or ManualClock(START), settings=NcclSettings(**kw))


def test_simulated_node_shows_the_fallback_pod_and_healthy_pods(tmp_path: Path) -> None:
    node, sim = sim_node(tmp_path)
    collector = make_collector(node, sim)
    collector.step()
    found = samples(collector)
    assert (
        value(
            found,
            "ccl_nccl_tcp_fallback",
            pod="bert-finetune-worker-0",
            namespace="research",
            job_name="bert-finetune",
            job_kind="PyTorchJob",
        )
        == 1
    )
    assert value(found, "ccl_nccl_tcp_fallback", pod="llama-70b-worker-0", job_name="llama-70b") == 0
    assert value(found, "ccl_nccl_tcp_fallback", pod="resnet-eval-0", job_name="resnet-eval", job_kind="Job") == 0
    assert (
        value(
            found,
            "ccl_nccl_communicator_info",
            pod="bert-finetune-worker-0",
            network="Socket",
            nnodes="2",
            nranks="16",
            nccl_version="2.21.5",
        )
        == 1
    )
    assert (
        value(
            found, "ccl_nccl_connections", pod="llama-70b-worker-0", transport="net_ib", scope="inter_node", gdr="true"
        )
        == 4
    )
    assert value(found, "ccl_nccl_connections", pod="resnet-eval-0", transport="net_ib") is None
    assert value(found, "ccl_nccl_gdr_disabled", pod="llama-70b-worker-0") == 0
    assert value(found, "ccl_nccl_warnings_total", pod="bert-finetune-worker-0", category="ib_no_device") == 8
    assert value(found, "ccl_nccl_node_rdma_active") == 1
    assert value(found, "ccl_nccl_pod_metadata_available") == 1


def test_a_job_that_falls_back_later_is_flagged_at_the_next_tick(tmp_path: Path) -> None:
    """New lines are read on the next ``step`` (the background loop runs one every 0.5 s)."""
    node, sim = sim_node(tmp_path)
    collector = make_collector(node, sim)
    collector.step()
    assert value(samples(collector), "ccl_nccl_tcp_fallback", pod="llama-70b-worker-0") == 0
    sim.restart_job("ml-training", "llama-70b-worker-0", network="Socket", gdr=False)
    collector.step()
    found = samples(collector)
    assert value(found, "ccl_nccl_tcp_fallback", pod="llama-70b-worker-0", job_name="llama-70b") == 1
    # The earlier container run (on IB) is superseded by the new one.
    assert value(found, "ccl_nccl_communicator_info", pod="llama-70b-worker-0", network="IB") is None
    # A new pod that starts on GDR-less RDMA is flagged for GDR, not for TCP.
    sim.start_job(SimJob("ml", "gpt-worker-1", pytorchjob_labels("gpt"), network="IB", gdr=False, node_index=1))
    collector.step()
    found = samples(collector)
    assert value(found, "ccl_nccl_gdr_disabled", pod="gpt-worker-1", job_name="gpt") == 1
    assert value(found, "ccl_nccl_tcp_fallback", pod="gpt-worker-1") == 0


def test_socket_is_expected_on_a_node_without_rdma(tmp_path: Path) -> None:
    node, sim = sim_node(tmp_path, rdma=False)
    collector = make_collector(node, sim)
    collector.step()
    found = samples(collector)
    assert value(found, "ccl_nccl_tcp_fallback", pod="bert-finetune-worker-0") == 0
    assert value(found, "ccl_nccl_communicator_info", pod="bert-finetune-worker-0", network="Socket") == 1
    assert value(found, "ccl_nccl_node_rdma_active") == 0


def test_pods_gone_disappear_after_the_grace_period(tmp_path: Path) -> None:
    node, sim = sim_node(tmp_path)
    clock = ManualClock(START)
    collector = make_collector(node, sim, clock, grace_seconds=300)
    collector.step()
    sim.stop_job("research", "bert-finetune-worker-0")
    clock.now += 1
    collector.step()
    # The log folder is gone but the series stay (job_name now empty: the pod left the list).
    assert value(samples(collector), "ccl_nccl_tcp_fallback", pod="bert-finetune-worker-0") == 1
    clock.now += 300
    collector.step()
    assert value(samples(collector), "ccl_nccl_tcp_fallback", pod="bert-finetune-worker-0") is None
    assert value(samples(collector), "ccl_nccl_warnings_total", pod="bert-finetune-worker-0") is None
    assert value(samples(collector), "ccl_nccl_tcp_fallback", pod="llama-70b-worker-0") == 0


def warnings_of(collector: NcclCollector, pod: str) -> float | None:
    return value(samples(collector), "ccl_nccl_warnings_total", pod=pod, category="ib_no_device")


def test_restart_neither_recounts_nor_skips(tmp_path: Path) -> None:
    node, sim = sim_node(tmp_path)
    first = make_collector(node, sim)
    first.step()
    assert warnings_of(first, "bert-finetune-worker-0") == 8
    first.close()  # saves the state, as the server does on SIGTERM

    second = make_collector(node, sim)
    second.step()
    found = samples(second)
    assert warnings_of(second, "bert-finetune-worker-0") == 8  # not 16: the replay rebuilt gauges only
    assert value(found, "ccl_nccl_tcp_fallback", pod="bert-finetune-worker-0") == 1
    sim.restart_job("research", "bert-finetune-worker-0")  # 8 more "NET/IB : No device found."
    second.step()
    assert warnings_of(second, "bert-finetune-worker-0") == 16


def test_crash_between_saves_recounts_nothing(tmp_path: Path) -> None:
    """Killed after a save and more lines: the restart resumes at the saved offsets with the
    counts saved alongside them, and reads the rest once."""
    node, sim = sim_node(tmp_path)
    first = make_collector(node, sim)
    first.step()
    first.save_state()
    sim.restart_job("research", "bert-finetune-worker-0")
    first.step()
    assert warnings_of(first, "bert-finetune-worker-0") == 16  # then SIGKILL: no save

    second = make_collector(node, sim)
    second.step()
    assert warnings_of(second, "bert-finetune-worker-0") == 16


def test_hostile_pod_keeps_memory_and_series_bounded(tmp_path: Path) -> None:
    """Distinct commIds, endless channel lines and a 100 MB line from one pod.

    Memory is measured with tracemalloc after a first wave and after four times as much
    input; with every cap in place the second wave adds (almost) nothing.
    """
    node, sim = sim_node(tmp_path)
    collector = make_collector(
        node,
        sim,
        parser_limits=Limits(max_communicators=16, max_connections=256, max_processes=64, max_pointers=16),
        tail_limits=TailLimits(tick_bytes=64 << 20, file_chunk_bytes=8 << 20),
    )
    collector.step()
    log = sim.pod_logs / "evil_miner-0_0000-uid" / "main" / "0.log"
    log.parent.mkdir(parents=True)
    stamp = "2026-03-01T10:00:00.000000000Z stdout F "
    rng = random.Random(3)

    def wave(n: int) -> None:
        with open(log, "a") as handle:
            for i in range(n):
                comm = rng.getrandbits(64)
                handle.write(
                    f"{stamp}evil:{i % 97}:1 [0] NCCL INFO ncclCommInitRank comm 0x{comm:x} rank 0 nranks "
                    f"2 cudaDev 0 nvmlDev 0 busId 1000 commId 0x{comm:016x} - Init START\n"
                )
                handle.write(
                    f"{stamp}evil:{i % 97}:1 [0] NCCL INFO Channel {i % 64:02d}/0 : {i % 512}[0] -> "
                    f"{(i + 1) % 512}[1] via NET/Socket/{i % 8}\n"
                )
        for _ in range(20):
            collector.step()

    tracemalloc.start()
    try:
        wave(1_000)
        first, _ = tracemalloc.get_traced_memory()
        wave(4_000)
        with open(log, "ab") as handle:  # and one 100 MB line, written in 1 MiB pieces
            handle.write(stamp.encode() + b"NCCL ")
            piece = b"X" * (1 << 20)
            for _ in range(100):
                handle.write(piece)
            handle.write(b"\n")
        for _ in range(20):
            collector.step()
        second, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    growth = second - first
    found = samples(collector)
    evil_comms = [k for k in found if k[0] == "ccl_nccl_communicator_info" and ("pod", "miner-0") in k[1]]
    assert len(evil_comms) <= 16
    assert value(found, "ccl_nccl_dropped_total", reason="parser_communicators") > 4_500
    assert value(found, "ccl_nccl_log_skipped_bytes_total", reason="long_line") > 99 << 20
    assert growth < 2 << 20, f"memory grew {growth} bytes between waves"
    assert peak - first < 40 << 20, f"peak {peak - first} bytes above the first wave"


def test_a_neighbour_cannot_flag_a_healthy_pod_through_a_debug_folder(tmp_path: Path) -> None:
    """The forgery of issue 31: fallback lines in a debug-file folder named for a healthy pod of the
    node, without its UID or with another one. Neither is read or credited to the pod (counted by
    reason); the pod's own folder, with its UID, is."""
    node, sim = sim_node(tmp_path)
    tailer = PodLogTailer(sim.pod_logs, node.root / "nccl", node.root / "state", pod_known=pod_known_on_node(sim))
    collector = NcclCollector(tailer, node.sysfs, sim, clock=ManualClock(START))
    collector.step()
    victim = next(job for job in sim.running() if job.pod == "llama-70b-worker-0")
    socket_lines = nccl_init_lines(SimJob(victim.namespace, victim.pod, victim.labels, network="Socket"))
    for folder in (f"{victim.namespace}_{victim.pod}", f"{victim.namespace}_{victim.pod}_{'0' * 8}-{victim.uid[9:]}"):
        path = node.root / "nccl" / folder / "nccl.forged.1.log"
        path.parent.mkdir(parents=True)
        path.write_text("".join(line + "\n" for line in socket_lines))
    for _ in range(3):
        collector.step()
    found = samples(collector)
    assert value(found, "ccl_nccl_tcp_fallback", pod=victim.pod) == 0
    assert value(found, "ccl_nccl_dropped_total", reason="tail_pod_uid_missing") == 1
    assert value(found, "ccl_nccl_dropped_total", reason="tail_pod_uid_mismatch") == 1
    own = node.root / "nccl" / f"{victim.namespace}_{victim.pod}_{victim.uid}" / "nccl.own.1.log"
    own.parent.mkdir(parents=True)
    own.write_text("".join(line + "\n" for line in socket_lines))
    collector.step()
    assert value(samples(collector), "ccl_nccl_tcp_fallback", pod=victim.pod) == 1


def polls_until_fallback_is_shown(tmp_path: Path, noisy_lines: int) -> tuple[int, list[int], int]:
    """A pod starts on ``Socket`` while another pod has ``noisy_lines`` of NCCL-looking lines
    waiting (distinct connection lines: each one the analyzer must parse, none that decides
    anything for the victim). The polls (collector steps) until the victim's
    ``ccl_nccl_tcp_fallback`` is 1, the lines each of them fed to the analyzers, and the noisy
    pod's bytes still waiting then."""
    node, sim = sim_node(tmp_path)
    collector = make_collector(node, sim, tail_limits=TailLimits(tick_lines=2000))
    collector.step()
    noisy = sim.start_job(SimJob("team-x", "noisy-0", pytorchjob_labels("noisy"), network="IB"))
    log = sim.pod_logs / f"team-x_noisy-0_{noisy.uid}" / "pytorch" / "0.log"
    stamp = "2026-03-01T10:00:00.000000000Z stdout F "
    with open(log, "a") as handle:
        handle.writelines(
            f"{stamp}noisy:7:{n % 64} [0] NCCL INFO Channel {n % 32:02d}/0 : {n}[0] -> {n + 1}[1] via P2P/CUMEM/read\n"
            for n in range(noisy_lines)
        )
    collector.step()
    sim.start_job(SimJob("research", "victim-0", pytorchjob_labels("victim"), network="Socket", node_index=1))
    fed: list[int] = []
    for poll in range(1, 30):
        before = sum(collector.tailer.stats.lines.values())
        collector.step()
        fed.append(sum(collector.tailer.stats.lines.values()) - before)
        if value(samples(collector), "ccl_nccl_tcp_fallback", pod="victim-0") == 1:
            return poll, fed, collector.tailer.stats.backlog_bytes
    raise AssertionError(f"no fallback shown after {len(fed)} polls; lines fed per poll: {fed}")


def test_a_noisy_pod_does_not_delay_another_pods_fallback(tmp_path: Path) -> None:
    """Fair share, counted in polls and lines rather than timed: with a neighbour whose backlog
    would fill 40 polls, the victim's fallback shows at the same poll as on a quiet node, and no
    poll feeds more than ``tick_lines`` lines to the analyzers (what a poll costs)."""
    # short folder names: the simulated kubelet's socket path must fit in 107 bytes, under a
    # pytest-xdist worker's longer tmp_path too
    quiet_polls, quiet_fed, _ = polls_until_fallback_is_shown(tmp_path / "q", 0)
    noisy_polls, noisy_fed, waiting = polls_until_fallback_is_shown(tmp_path / "n", 80_000)
    assert noisy_polls == quiet_polls == 1
    assert waiting > 4 << 20  # the neighbour still had most of its backlog
    assert max(noisy_fed) <= 2000 and min(noisy_fed) >= 1900, noisy_fed
    assert max(quiet_fed) < 200


def test_serve_simulate_shows_the_fallback(exporter_process) -> None:  # type: ignore[no-untyped-def]
    """``python -m ccl_sim serve`` end to end: the simulated pods' logs are tailed by the
    background task and the fallback pod is flagged, with its training job named."""
    import time

    exporter = exporter_process("--no-collector.rdma", simulated=True)
    deadline = time.monotonic() + 20
    found: dict = {}
    while time.monotonic() < deadline:
        found = {}
        for family in text_string_to_metric_families(exporter.metrics()):
            for sample in family.samples:
                found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        if value(found, "ccl_nccl_tcp_fallback", pod="bert-finetune-worker-0") is not None:
            break
        time.sleep(0.2)
    assert (
        value(
            found,
            "ccl_nccl_tcp_fallback",
            namespace="research",
            pod="bert-finetune-worker-0",
            job_name="bert-finetune",
            job_kind="PyTorchJob",
        )
        == 1
    )
    assert (
        value(found, "ccl_nccl_tcp_fallback", namespace="ml-training", pod="llama-70b-worker-0", job_name="llama-70b")
        == 0
    )
    assert value(found, "ccl_nccl_tcp_fallback", pod="resnet-eval-0") == 0
    assert value(found, "ccl_exporter_collector_success", collector="nccl") == 1

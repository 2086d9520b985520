"""NCCL Inspector output end to end: files in a pod's folder -> the exporter process -> a real
Prometheus -> PromQL. The bus bandwidth computed from the counters equals the records' own
``coll_busbw_gbs`` within 1 %, and a simulated fleet's jobs carry their namespace, pod and job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ccl_sim.inspector import RecordWriter, TimedCollective, json_record, prom_bucket_lines, size_range
from devtools.stack import (
    Intervals,
    ScrapeTarget,
    Stack,
    find_rule_files,
    free_loopback_port,
    stop_process,
    wait_answering,
)
from tests.conftest import REPO
from tests.e2e.harness import PARTITIONED_OTHERS, require_stack, rule_partitions

# (collective, message bytes, microseconds): constant per collective, so every window has one mean
OPERATIONS = (("AllReduce", 256 << 20, 1680), ("AllGather", 16 << 20, 2100), ("Broadcast", 64 << 20, 400))


def records(count: int, first_sn: int) -> list[str]:
    out = []
    for i in range(count):
        collective, size, micros = OPERATIONS[i % len(OPERATIONS)]
        writer = RecordWriter(comm_id="0x77", comm_name="DP", rank=0, nranks=16, nnodes=2, hostname="llama-0", pid=41)
        out.append(json_record(writer, TimedCollective(collective, first_sn + i, size, micros), dump_us=1))
    return out


def stated_busbw(lines: list[str]) -> dict[str, float]:
    """Time-weighted mean of coll_busbw_gbs (bytes/s) per Inspector collective name."""
    weighted: dict[str, float] = {}
    spent: dict[str, float] = {}
    for line in lines:
        perf = json.loads(line)["coll_perf"]
        seconds = perf["coll_exec_time_us"] / 1e6
        weighted[perf["coll"]] = weighted.get(perf["coll"], 0.0) + perf["coll_busbw_gbs"] * 1e9 * seconds
        spent[perf["coll"]] = spent.get(perf["coll"], 0.0) + seconds
    return {name: weighted[name] / spent[name] for name in weighted}


LABEL = {"AllReduce": "all_reduce", "AllGather": "all_gather", "Broadcast": "broadcast"}
UID = "6a1d2f3e-0000-4000-8000-00000000e2e0"  # a pod's folder names its UID (subPathExpr, downward API)


def test_bus_bandwidth_through_prometheus_matches_the_records(tmp_path: Path) -> None:
    prometheus_binary, _ = require_stack()
    inspector = tmp_path / "inspector"
    (inspector / f"ml_llama-0_{UID}").mkdir(parents=True)
    (inspector / f"ml_eval-0_{UID}").mkdir(parents=True)
    port = free_loopback_port()
    address = f"127.0.0.1:{port}"
    argv = [
        sys.executable,
        "-m",
        "exporter",
        "serve",
        f"--web.listen-address={address}",
        "--collector.disable-defaults",
        "--collector.inspector",
        f"--path.nccl-inspector={inspector}",
        f"--path.state={tmp_path / 'state'}",
        "--log.level=warning",
    ]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_answering(f"http://{address}/healthz", proc, "exporter", 30.0)
        stack = Stack(
            tmp_path / "stack",
            [ScrapeTarget(address, {"node": "gpu-a"})],
            alerting=False,
            intervals=Intervals(),
            prometheus_binary=prometheus_binary,
        )
        with stack:
            prometheus = stack.prometheus
            assert prometheus is not None
            prometheus.wait_targets_up(1, timeout=60.0)
            time.sleep(1.5)  # the exporter has polled the (empty) folder: what follows is new
            written: list[str] = []
            log = inspector / f"ml_llama-0_{UID}" / "llama-0-pid41.log"
            for batch in range(12):
                lines = records(30, first_sn=batch * 30)
                with open(log, "a") as handle:
                    handle.write("\n".join(lines) + "\n")
                written += lines
                time.sleep(0.5)
            # A .prom file (v5.1) of another pod: one bucket at 200 GB/s, settled when read.
            labels = (
                'version="v5.1",slurm_job_id="unknown",node="eval-0",gpu="GPU0",comm_name="eval",n_nodes="1",'
                f'nranks="8",collective="AllReduce",message_size="{size_range(512 << 20)}",algo_proto="NVLS_Simple"'
            )
            prom = inspector / f"ml_eval-0_{UID}" / "nccl_inspector_metrics_1a2b.prom"
            prom.write_text("\n".join(prom_bucket_lines(labels, [4697], [200.0])) + "\n")
            os.utime(prom, (time.time() - 5, time.time() - 5))
            expected = stated_busbw(written)
            operations = 'sum by (collective) (ccl_nccl_collective_operations_total{pod="llama-0"})'
            prometheus.wait_until(lambda: sum(prometheus.values(operations)) == len(written), 30, "every record")
            time.sleep(1.5)  # one more scrape of the final values
            for name, busbw in expected.items():
                selector = f'{{namespace="ml",pod="llama-0",collective="{LABEL[name]}"}}'
                cumulative = prometheus.values(
                    f"sum(ccl_nccl_collective_bus_bytes_total{selector})"
                    f" / sum(ccl_nccl_collective_seconds_total{selector})"
                )
                assert cumulative and cumulative[0] == pytest.approx(busbw, rel=0.01), name
                windowed = prometheus.values(
                    f"sum(rate(ccl_nccl_collective_bus_bytes_total{selector}[30s]))"
                    f" / sum(rate(ccl_nccl_collective_seconds_total{selector}[30s]))"
                )
                assert windowed and windowed[0] == pytest.approx(busbw, rel=0.01), name
            prom_selector = '{namespace="ml",pod="eval-0",collective="all_reduce",scope="intra_node"}'
            found = prometheus.wait_until(
                lambda: prometheus.values(
                    f"sum(ccl_nccl_collective_bus_bytes_total{prom_selector})"
                    f" / sum(ccl_nccl_collective_seconds_total{prom_selector})"
                ),
                30,
                ".prom",
            )
            assert found[0] == pytest.approx(200e9, rel=0.01)
    finally:
        stop_process(proc)


def test_a_simulated_fleets_jobs_carry_their_names_and_their_networks_bandwidth(start_cluster) -> None:  # type: ignore[no-untyped-def]
    """The simulated node: llama-70b (IB) and bert-finetune (TCP fallback) through the shipped
    recording rule, with namespace and job kind."""
    rules = find_rule_files(REPO)
    assert rules
    cluster = start_cluster(nodes=1, rule_files=rules, before_scrape=None)
    prometheus = cluster.prometheus
    rule = "job_name_collective:ccl_nccl_collective_bus_bandwidth_bytes_per_second:rate5m"
    query = f'{rule}{{collective="all_reduce",scope="inter_node",size_class="100MB_1GB"}}'
    jobs = {"llama-70b", "bert-finetune"}  # the node's other multi-node jobs (a crossed-rail one) may show too
    prometheus.wait_until(
        lambda: jobs <= {r["metric"]["job_name"] for r in prometheus.query(query)}, 60, "both multi-node jobs"
    )
    time.sleep(3)
    got = {
        (r["metric"]["namespace"], r["metric"]["job_name"], r["metric"]["job_kind"]): float(r["value"][1])
        for r in prometheus.query(query)
    }
    assert got[("ml-training", "llama-70b", "PyTorchJob")] == pytest.approx(355e9, rel=0.05)
    assert got[("research", "bert-finetune", "PyTorchJob")] == pytest.approx(9e9, rel=0.05)
    pods = {r["metric"]["pod"] for r in prometheus.query("ccl_nccl_collective_operations_total")}
    assert {"llama-70b-worker-0", "bert-finetune-worker-0"} <= pods
    # The PodMonitor's metric relabeling gave the node's Inspector counters one partition of 0 to
    # 7 and no other series one: the bandwidth above came through a numbered rate group.
    partitions = {r["metric"].get("ccl_rule_partition") for r in prometheus.query("ccl_nccl_collective_seconds_total")}
    assert len(partitions) == 1 and partitions <= rule_partitions(), partitions
    assert prometheus.query(PARTITIONED_OTHERS) == []

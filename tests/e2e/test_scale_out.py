"""Scale-out, end to end, with real components from Debian's ``victoria-metrics`` package: two
``vmagent`` shards (``-promscrape.cluster.membersCount=2``) of cluster ``east`` scrape a
simulated fleet and remote-write, with ``cluster="east"``, to a store per shard and to a global
store (VictoriaMetrics); a ``vmalert`` per shard evaluates the node-level rules
(``alerts/ccl-health-rules.yaml``) on its shard's series, a global ``vmalert`` the rules across
nodes (``alerts/ccl-health-global-rules.yaml``) on every shard's series; all notify a real
Alertmanager.

A training job whose two nodes land in different shards falls back to TCP with a log that
cannot place its communicators: only the job's nodes, counted across the fleet, decide the
page. It reaches the receiver from the global ruler with its cluster, namespace and job, and the
same rule on a shard's series finds one node. Rules are the shipped ones, time-compressed 60x as
in ``test_alerts.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from ccl_sim.nvml import TRAINING_NAMESPACE, TRAINING_POD
from devtools.stack import Intervals, SimulatedExporter, make_healthy, start_exporters, stop_all
from devtools.vmstack import ShardedStack
from tests.conftest import require_tool
from tests.e2e.harness import EXPORTER_ARGS, PARTITIONED_OTHERS, compressed_rules, rule_partitions

CLUSTER = "east"
JOB_NAME = "llama-70b"  # the simulated training pod's job, on every simulated node


def require_distributed_stack() -> None:
    for tool in ("victoria-metrics", "vmagent", "vmalert", "prometheus-alertmanager"):
        require_tool(tool)


@pytest.fixture
def fleet() -> Iterator[list[SimulatedExporter]]:
    """Simulated nodes (two to start with; a test may add more), all stopped afterwards."""
    exporters = start_exporters(2, extra_args=EXPORTER_ARGS)
    try:
        make_healthy(exporters)
        yield exporters
    finally:
        stop_all(exporters)


def split_across_shards(stack: ShardedStack, fleet: list[SimulatedExporter]) -> list[set[str]]:
    """The nodes of each shard, with at least one node in every shard: vmagent hashes each
    target's labels (its random loopback port among them) to a member, so nodes are added
    until every shard has one."""
    by_shard = stack.wait_scraped(e.node for e in fleet)
    while not all(by_shard):
        assert len(fleet) < 8, f"vmagent put {len(fleet)} targets in one shard: {by_shard}"
        number = len(fleet) + 1
        extra = SimulatedExporter(f"gpu-node-{number:02d}", seed=number, extra_args=EXPORTER_ARGS)
        fleet.append(extra)
        extra.start()
        make_healthy([extra])
        stack.set_targets([e.target for e in fleet])
        by_shard = stack.wait_scraped(e.node for e in fleet)
    return by_shard


def placement_page(global_rules: Path) -> str:
    """The expression of the TCP-fallback page from the job's placement, as the global rules have it."""
    (expr,) = [
        rule["expr"]
        for group in yaml.safe_load(global_rules.read_text())["groups"]
        for rule in group["rules"]
        if rule.get("alert") == "CclNcclTcpFallback"
    ]
    return str(expr)


def test_job_split_across_shards_pages_from_the_global_ruler_only(fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    require_distributed_stack()
    intervals = Intervals()
    node_rules, global_rules = compressed_rules(tmp_path / "rules", shortest_interval=intervals.evaluation_seconds)
    with ShardedStack(
        tmp_path / "stack",
        [e.target for e in fleet],
        local_rules=[node_rules],
        global_rules=[global_rules],
        cluster=CLUSTER,
        intervals=intervals,
    ) as stack:
        by_shard = split_across_shards(stack, fleet)
        first, second = sorted(by_shard[0])[0], sorted(by_shard[1])[0]
        # The job keeps GPUs and NCCL pods on exactly two nodes, one per shard.
        for exporter in fleet:
            if exporter.node not in (first, second):
                exporter.act("gpu-release")
                exporter.act("nccl-job-stop", namespace=TRAINING_NAMESPACE, pod=TRAINING_POD)
        assert stack.store is not None and stack.receiver is not None
        job_nodes = f'count(max by (node) (ccl_gpu_pod_info{{namespace="{TRAINING_NAMESPACE}",job_name="{JOB_NAME}"}}))'
        stack.store.wait_until(lambda: stack.store.values(job_nodes) == [2.0], 30, "the job on two nodes")  # type: ignore[union-attr]

        fleet_node = next(e for e in fleet if e.node == first)
        fleet_node.act(
            "nccl-job-restart", namespace=TRAINING_NAMESPACE, pod=TRAINING_POD, network="Socket", placement="open"
        )
        want = {
            "cluster": CLUSTER,
            "namespace": TRAINING_NAMESPACE,
            "pod": TRAINING_POD,
            "job_name": JOB_NAME,
            "node": first,
            "evidence": "placement",
        }
        got = stack.receiver.wait_alert("CclNcclTcpFallback", "firing", timeout=60, match=want)
        assert got is not None, stack.global_ruler.alerts() if stack.global_ruler else None
        _, alert = got
        assert alert["labels"]["severity"] == "critical"
        description = " ".join(alert["annotations"]["description"].split())
        assert "Evidence: placement" in description and "the job has pods on 2 nodes" in description, description

        # A shard alone sees one node of the job: the same rule on its series finds nothing, where
        # on the global store it finds the pod. The shard's own rules (the log's page) evaluate
        # without error and stay silent: this log does not say the traffic crosses nodes.
        page = placement_page(global_rules)
        assert [s["metric"]["pod"] for s in stack.store.query(page) if s["metric"]["node"] == first] == [TRAINING_POD]
        for shard in stack.shard_parts:
            assert shard.store.values(job_nodes) == [1.0], shard.nodes()
            assert shard.store.query(page) == [], shard.nodes()
            (rule,) = [r for g in shard.ruler.rule_groups() for r in g["rules"] if r["name"] == "CclNcclTcpFallback"]
            assert rule["health"] == "ok" and not rule["lastError"], rule
            assert not [a for a in shard.ruler.alerts() if a["labels"].get("pod") == TRAINING_POD], shard.ruler.alerts()
        # The shards' recording rules reach the global store through their vmagent, with `cluster`.
        ports = stack.store.query(f'node:ccl_rdma_ports:count{{cluster="{CLUSTER}",node=~"{first}|{second}"}}')
        assert sorted((s["metric"]["node"], s["metric"]["cluster"]) for s in ports) == sorted(
            [(first, CLUSTER), (second, CLUSTER)]
        ), ports

        # The PodMonitor's metric relabeling, as vmagent applies it: each node's NCCL Inspector
        # counters carry one `ccl_rule_partition` of 0 to 7, no other series carries one, and the
        # in-job rates recorded by a shard's numbered group (not -unpartitioned) reach the store.
        counters = stack.store.wait_until(
            lambda: stack.store.query("ccl_nccl_collective_seconds_total"), 30, "the Inspector's counters"
        )  # type: ignore[union-attr]
        partitions = {(s["metric"]["node"], s["metric"].get("ccl_rule_partition")) for s in counters}
        assert {partition for _, partition in partitions} <= rule_partitions(), partitions
        assert len(partitions) == len({node for node, _ in partitions}), f"one partition per node: {partitions}"
        assert stack.store.query(PARTITIONED_OTHERS) == []
        rates = "job_name_node_collective:ccl_nccl_collective_seconds:rate5m"
        recorded = stack.store.wait_until(lambda: stack.store.query(rates), 30, "the in-job rates")  # type: ignore[union-attr]
        assert {s["metric"]["node"] for s in recorded} == {node for node, _ in partitions}

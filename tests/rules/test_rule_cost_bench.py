"""bench/rule_cost.py's pieces that decide what it measures: which history each series gets, how a
node's series are named, and the OpenMetrics promtool backfills."""

from __future__ import annotations

import io
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from bench import rule_cost
from bench.rule_cost import (
    CADVISOR_PODS,
    MEASURED_PREFIX,
    SEQUENCE_GROUP,
    Node,
    RuleReads,
    TemplateSeries,
    busy_per_minute,
    costs_of,
    group_intervals,
    node_template,
    range_reads,
    rules_in_sequence,
    write_family,
    written_as,
)
from tests.conftest import REPO, require_tool
from tests.promql_names import groups


def test_range_reads_give_each_series_the_history_its_readers_need() -> None:
    assert range_reads('sum by (node) (rate(x_total{a="b[1h]"}[5m])) > on (c) group_left () y') == {"x_total": 300.0}
    # a subquery of an expression: everything inside it, plus the ranges inside
    assert range_reads("max_over_time((rate(k[5m]))[1h:1m])")["k"] == 3900.0
    # an offset moves the range back: its history reaches that much further
    assert range_reads("q:r:s[1h] offset 23h and t[5m]") == {"q:r:s": 86400.0, "t": 300.0}
    # instant reads need no history of their own
    assert range_reads("a == 0 and on (n) b") == {}


def test_rule_reads_tell_raw_from_recorded_and_long_from_short() -> None:
    rules = {
        "groups": [
            {
                "name": "g",
                "rules": [
                    {"record": "n:x:rate5m", "expr": "rate(x_total[5m])"},
                    {"alert": "A", "expr": "max_over_time(n:x:rate5m[7d]) and increase(y_total[1h]) > 0"},
                ],
            },
            {"name": "h", "interval": "1h", "rules": [{"record": "n:y:max1h", "expr": "max_over_time(y[1h])"}]},
        ]
    }
    reads = RuleReads.of(rules, {"x_total", "y_total", "y"})
    assert reads.raw() == {"y_total": 3600.0, "y": 3600.0}, "5 minutes fill from live scrapes"
    assert reads.recorded_ranges() == {"n:x:rate5m": 604800.0}
    assert reads.recorded == {"n:x:rate5m": 30.0, "n:y:max1h": 3600.0}


def test_each_node_has_pods_of_its_own_in_jobs_of_four_nodes() -> None:
    series = TemplateSeries(
        "ccl_gpu_pod_info",
        (
            ("job_name", "llama"),
            ("namespace", "ml"),
            ("pod", "llama-worker-0"),
            ("uuid", "GPU-5e1a0000-0000-4000-8000-000000000003"),
        ),
        1.0,
    )
    fifth, sixth = Node(5).stored_labels(series), Node(6).stored_labels(series)
    assert (fifth["pod"], fifth["job_name"]) == ("llama-0001-worker-1", "llama-0001")
    assert (sixth["pod"], sixth["job_name"]) == ("llama-0001-worker-2", "llama-0001")
    assert fifth["uuid"] != sixth["uuid"] and fifth["node"] == "gpu-node-0005"
    assert fifth["namespace"] == "ml", "the training pod's namespace wins (honor_labels)"
    node_level = Node(5).stored_labels(TemplateSeries("ccl_rdma_port_state_id", (("device", "mlx5_0"),), 4.0))
    assert node_level["namespace"] == "ccl-exporter" and node_level["pod"] == "ccl-exporter-00005"
    kubelet = Node(5).stored_labels(
        TemplateSeries("container_network_receive_bytes_total", (("pod", "x-0"),), 1.0, source="kubelet")
    )
    assert kubelet["job"] == "kubelet" and kubelet["pod"] == "x-0-0005"
    host = Node(5).stored_labels(
        TemplateSeries("container_network_receive_bytes_total", (("id", "/"), ("pod", "")), 1.0, source="kubelet")
    )
    assert host["pod"] == "" and host["node"] == "gpu-node-0005", "the host's own interfaces name no pod"


def test_cadvisor_reports_each_pod_once_for_its_sandbox_and_the_host_without_a_pod() -> None:
    exporter = [TemplateSeries("ccl_gpu_pod_info", (("namespace", "ml"), ("pod", "llama-worker-0")), 1.0)]
    kubelet = [s for s in node_template(exporter) if s.name == "container_network_transmit_bytes_total"]
    per_pod = [dict(s.labels) for s in kubelet if dict(s.labels)["pod"]]
    assert len(per_pod) == CADVISOR_PODS and {p["interface"] for p in per_pod} == {"eth0"}
    assert {p["container"] for p in per_pod} == {""} and ("ml", "llama-worker-0") in {
        (p["namespace"], p["pod"]) for p in per_pod
    }
    host = [dict(s.labels) for s in kubelet if not dict(s.labels)["pod"]]
    assert {h["id"] for h in host} == {"/"} and len(host) == CADVISOR_PODS + 1, "the node's NIC and a cali* per pod"


def test_history_is_openmetrics_promtool_backfills(tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    out = io.StringIO()
    written = write_family(out, "c_total", [({"node": "a", "q": 'say "hi"'}, 10.0, 2.0)], [1000.0, 1015.0], 1000.0)
    out.write("# EOF\n")
    assert written.samples == 2
    assert 'c_total{node="a",q="say \\"hi\\""} 40 1015.000' in out.getvalue()
    source = tmp_path / "history.om"
    source.write_text(out.getvalue())
    done = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(tmp_path / "tsdb")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_rule_runs_in_one_group_in_file_order_and_each_knows_its_group(tmp_path: Path) -> None:
    rules = {
        "groups": [
            {
                "name": "a",
                "interval": "5m",
                "rules": [{"record": "n:x:rate5m", "expr": "rate(x[5m])"}, {"alert": "A", "expr": "n:x:rate5m > 1"}],
            },
            {"name": "b", "rules": [{"record": "n:x:rate5m", "expr": "vector(1)", "labels": {"k": "v"}}]},
        ]
    }
    owners = rules_in_sequence(rules, tmp_path / "rules.yaml")
    written = yaml.safe_load((tmp_path / "rules.yaml").read_text())
    assert owners == ["a", "a", "b"]
    assert [g["name"] for g in written["groups"]] == [SEQUENCE_GROUP] and "interval" not in written["groups"][0]
    # Group a runs every 5 minutes: its record is written under another name, so that alert A
    # (and every other reader) reads n:x:rate5m at its own interval, not every 10 s.
    assert [r.get("record") or r.get("alert") for r in written["groups"][0]["rules"]] == [
        MEASURED_PREFIX + "n:x:rate5m",
        "A",
        "n:x:rate5m",
    ]
    assert written["groups"][0]["rules"][1]["expr"] == "n:x:rate5m > 1"
    assert written["groups"][0]["rules"][2]["labels"] == {"k": "v"}


def test_only_the_records_of_groups_slower_than_the_default_interval_are_written_elsewhere() -> None:
    rules = {
        "groups": [
            {"name": "fast", "interval": "15s", "rules": [{"record": "a:x:rate5m", "expr": "rate(x[5m])"}]},
            {"name": "default", "rules": [{"record": "b:x:max", "expr": "max(x)"}]},
            {
                "name": "hourly",
                "interval": "1h",
                "rules": [
                    {"record": "c:x:max1h", "expr": "max_over_time(b:x:max[1h])"},
                    {"alert": "C", "expr": "c:x:max1h > 1"},
                ],
            },
            {"name": "daily", "interval": "1d", "rules": [{"record": "d:x:median1d", "expr": "vector(1)"}]},
        ]
    }
    assert written_as(rules) == {
        "a:x:rate5m": "a:x:rate5m",
        "b:x:max": "b:x:max",
        "c:x:max1h": MEASURED_PREFIX + "c:x:max1h",
        "d:x:median1d": MEASURED_PREFIX + "d:x:median1d",
    }


def test_a_group_costs_the_sum_of_its_rules_per_cycle() -> None:
    owners = ["a", "a", "b"]
    cycle = {
        "evaluationTime": 0.7,
        "rules": [
            {"name": "r1", "evaluationTime": 0.1},
            {"name": "r2", "evaluationTime": 0.2},
            {"name": "r1", "evaluationTime": 0.4},
        ],
    }
    costs = costs_of([cycle, cycle], owners)
    assert costs.groups == {"a": [0.1 + 0.2] * 2, "b": [0.4] * 2}
    assert costs.rules == {"a/r1": [0.1, 0.1], "a/r2": [0.2, 0.2], "b/r1": [0.4, 0.4]}
    assert costs.total == [0.7, 0.7]
    measured = {"evaluationTime": 0.1, "rules": [{"name": MEASURED_PREFIX + "n:x:max1h", "evaluationTime": 0.1}]}
    assert costs_of([measured], ["hourly"]).rules == {"hourly/n:x:max1h": [0.1]}
    with pytest.raises(ValueError, match="2 rules evaluated, 3 loaded"):
        costs_of([{"rules": cycle["rules"][:2]}], owners)


def test_evaluation_per_minute_weighs_each_group_by_its_interval() -> None:
    intervals = group_intervals(
        {
            "groups": [
                {"name": "a", "rules": []},
                {"name": "b", "interval": "5m", "rules": []},
                {"name": "c", "interval": "15s", "rules": []},
            ]
        }
    )
    assert intervals == {"a": 30.0, "b": 300.0, "c": 15.0}
    assert busy_per_minute({"a": 0.1, "b": 1.0, "c": 0.05}, intervals) == pytest.approx(0.2 + 0.2 + 0.2)


def test_the_report_names_the_prometheus_version() -> None:
    """The engine's version changes the numbers (docs/scaling.md): the report says which ran."""
    binary = require_tool("prometheus")
    assert re.fullmatch(r"\d+\.\d+\.\d+", rule_cost.prometheus_version(binary))


def test_the_command_names_the_rule_files_it_was_given() -> None:
    """A run on other rules (bench/inspector_rate_anatomy.yaml) reports a command that repeats
    it; one on the shipped rules names none."""
    assert rule_cost.command_line([1000], [], None) == "python -m bench.rule_cost --nodes 1000"
    assert (
        rule_cost.command_line([32, 1000], [Path("bench/inspector_rate_anatomy.yaml")], "/opt/prometheus")
        == "python -m bench.rule_cost --nodes 32,1000 --rules bench/inspector_rate_anatomy.yaml --prometheus PATH"
    )


def test_the_anatomy_rules_take_apart_the_shipped_inspector_groups() -> None:
    """The first group of the anatomy file is a shipped in-job rate group, rule for rule (record
    names aside), on another selection of the counters (all_reduce of every node, not every
    collective of one partition of the nodes): its numbers are comparable with the shipped ones."""
    anatomy = yaml.safe_load((REPO / "bench" / "inspector_rate_anatomy.yaml").read_text())["groups"][0]
    shipped = next(group for group in groups() if group["name"] == "ccl-health-job-nodes-0")
    assert [rule["expr"] for rule in anatomy["rules"]] == [
        rule["expr"].replace('ccl_rule_partition="0"', 'collective="all_reduce"') for rule in shipped["rules"]
    ]


def test_a_prometheus_that_is_not_an_executable_is_refused(tmp_path: Path) -> None:
    require_tool("promtool")
    not_a_binary = tmp_path / "prometheus"
    not_a_binary.write_text("")
    with pytest.raises(FileNotFoundError, match="not an executable"):
        rule_cost._binaries(str(not_a_binary))


def test_cpu_per_rule_second_is_what_prometheus_spent_beside_its_rules() -> None:
    before = rule_cost.ProcessSeconds(cpu=93.0, rules=0.0, collections=13)
    after = rule_cost.ProcessSeconds(cpu=187.0, rules=50.0, collections=16)
    spent = after.minus(before)
    assert spent == rule_cost.ProcessSeconds(cpu=94.0, rules=50.0, collections=3)
    assert spent.cpu_per_rule_second() == 94.0 / 50.0
    assert rule_cost.ProcessSeconds(cpu=5.0).cpu_per_rule_second() == 0.0  # no rule ran: nothing to say


class _Recorder:
    """What Prometheus answers for a record, one answer per query, the last one repeating."""

    def __init__(self, answers: dict[str, list[int]]) -> None:
        self.answers = {name: list(counts) for name, counts in answers.items()}

    def query(self, expr: str) -> list[dict[str, object]]:
        name = expr.split('"')[1]
        counts = self.answers.get(name, [0])
        count = counts.pop(0) if len(counts) > 1 else counts[0]
        return [{"metric": {"__name__": name, "node": str(i)}, "value": [0, "1"]} for i in range(count)]


def test_a_record_is_backfilled_once_its_series_count_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rate answers first for the targets scraped twice: the history waits for the whole fleet."""
    clock = iter(float(i) for i in range(10_000))
    monkeypatch.setattr(rule_cost.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(rule_cost.time, "sleep", lambda seconds: None)
    prometheus = _Recorder({"a:b:rate5m": [3, 3, 700, 1000, 1000], "c:d:sum": [0]})
    found = rule_cost.settled_records(prometheus, ["a:b:rate5m", "c:d:sum"], deadline=200.0)  # type: ignore[arg-type]
    assert set(found) == {"a:b:rate5m"}
    assert len(found["a:b:rate5m"]) == 1000


def test_a_record_still_growing_at_the_deadline_is_taken_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(float(i) for i in range(10_000))
    monkeypatch.setattr(rule_cost.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(rule_cost.time, "sleep", lambda seconds: None)
    prometheus = _Recorder({"a:b:rate5m": list(range(1, 500))})
    found = rule_cost.settled_records(prometheus, ["a:b:rate5m"], deadline=20.0)  # type: ignore[arg-type]
    assert 1 < len(found["a:b:rate5m"]) < 20


def test_the_template_is_taken_once_the_nodes_series_stop_changing() -> None:
    """A job's series that appear a few seconds late are in the template: the page is taken once
    its series have held (one run took it before the simulator's single-node job wrote its NCCL
    Inspector file, and measured a fleet with two thirds of the in-job series)."""
    pages = iter(["a 1\n", "a 2\n", 'a 3\nb{pod="late"} 1\n'] + ['a 4\nb{pod="late"} 2\n'] * 100)
    page = rule_cost.settled_page(lambda: next(pages), hold=0.05, deadline=time.monotonic() + 10.0, poll=0.01)
    assert ("b", (("pod", "late"),)) in page


def test_a_page_that_never_settles_is_an_error() -> None:
    counter = iter(range(10_000))
    with pytest.raises(RuntimeError, match="still change"):
        rule_cost.settled_page(lambda: f"s{next(counter)} 1\n", hold=0.05, deadline=time.monotonic() + 0.2, poll=0.01)


def test_a_healthy_template_grows_its_traffic_counters_and_not_its_error_counters() -> None:
    link = (("gpu", "0"), ("link", "3"))
    first = {
        ("ccl_nvlink_transmit_bytes_total", link): 100.0,
        ("ccl_nvlink_errors_total", link): 0.0,
        ("ccl_nvlink_node_errors_total", ()): 4.0,
        ("ccl_rdma_node_ports", ()): 10.0,
    }
    second = {
        ("ccl_nvlink_transmit_bytes_total", link): 400.0,
        ("ccl_nvlink_errors_total", link): 1.0,
        ("ccl_nvlink_node_errors_total", ()): 5.0,
        ("ccl_rdma_node_ports", ()): 10.0,
    }
    rates = {s.name: s.per_second for s in rule_cost.template_series(first, second, elapsed=3.0)}
    assert rates == {
        "ccl_nvlink_transmit_bytes_total": 100.0,
        "ccl_nvlink_errors_total": 0.0,
        "ccl_nvlink_node_errors_total": 0.0,
        "ccl_rdma_node_ports": 0.0,
    }

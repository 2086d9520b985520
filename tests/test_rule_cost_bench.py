"""bench/rule_cost.py's pieces that decide what it measures: which history each series gets, how a
node's series are named, and the OpenMetrics promtool backfills."""

from __future__ import annotations

import io
import subprocess
from pathlib import Path

from bench.rule_cost import Node, RuleReads, TemplateSeries, range_reads, write_family
from tests.conftest import require_tool


def test_range_reads_give_each_series_the_history_its_readers_need() -> None:
    assert range_reads('sum by (node) (rate(x_total{a="b[1h]"}[5m])) > on (c) group_left () y') == {"x_total": 300.0}
    # a subquery of an expression: everything inside it, plus the ranges inside
    assert range_reads("max_over_time((rate(k[5m]))[1h:1m])")["k"] == 3900.0
    # an offset moves the range back: its history reaches that much further
    assert range_reads("q:r:s[1h] offset 23h and t[5m]") == {"q:r:s": 86400.0, "t": 300.0}
    # instant reads need no history of their own
    assert range_reads("a == 0 and on (n) b") == {}


def test_rule_reads_tell_raw_from_recorded_and_long_from_short() -> None:
    rules = {"groups": [
        {"name": "g", "rules": [{"record": "n:x:rate5m", "expr": "rate(x_total[5m])"},
                                {"alert": "A", "expr": "max_over_time(n:x:rate5m[7d]) and increase(y_total[1h]) > 0"}]},
        {"name": "h", "interval": "1h", "rules": [{"record": "n:y:max1h", "expr": "max_over_time(y[1h])"}]},
    ]}
    reads = RuleReads.of(rules, {"x_total", "y_total", "y"})
    assert reads.raw() == {"y_total": 3600.0, "y": 3600.0}, "5 minutes fill from live scrapes"
    assert reads.recorded_ranges() == {"n:x:rate5m": 604800.0}
    assert reads.recorded == {"n:x:rate5m": 30.0, "n:y:max1h": 3600.0}


def test_each_node_has_pods_of_its_own_in_jobs_of_four_nodes() -> None:
    series = TemplateSeries("ccl_gpu_pod_info", (("job_name", "llama"), ("namespace", "ml"), ("pod", "llama-worker-0"),
                                                 ("uuid", "GPU-5e1a0000-0000-4000-8000-000000000003")), 1.0)
    fifth, sixth = Node(5).stored_labels(series), Node(6).stored_labels(series)
    assert (fifth["pod"], fifth["job_name"]) == ("llama-0001-worker-1", "llama-0001")
    assert (sixth["pod"], sixth["job_name"]) == ("llama-0001-worker-2", "llama-0001")
    assert fifth["uuid"] != sixth["uuid"] and fifth["node"] == "gpu-node-0005"
    assert fifth["namespace"] == "ml", "the training pod's namespace wins (honor_labels)"
    node_level = Node(5).stored_labels(TemplateSeries("ccl_rdma_port_state_id", (("device", "mlx5_0"),), 4.0))
    assert node_level["namespace"] == "ccl-exporter" and node_level["pod"] == "ccl-exporter-00005"
    kubelet = Node(5).stored_labels(TemplateSeries("container_network_receive_bytes_total", (("pod", "x-0"),), 1.0,
                                                   source="kubelet"))
    assert kubelet["job"] == "kubelet" and kubelet["pod"] == "x-0-0005"


def test_history_is_openmetrics_promtool_backfills(tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    out = io.StringIO()
    written = write_family(out, "c_total", [({"node": "a", "q": 'say "hi"'}, 10.0, 2.0)], [1000.0, 1015.0], 1000.0)
    out.write("# EOF\n")
    assert written.samples == 2
    assert 'c_total{node="a",q="say \\"hi\\""} 40 1015.000' in out.getvalue()
    source = tmp_path / "history.om"
    source.write_text(out.getvalue())
    done = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(tmp_path / "tsdb")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr

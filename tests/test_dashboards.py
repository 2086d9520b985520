"""The Grafana dashboards: generated JSON is committed and current, importable as-is
(datasource variable, stable uids, the expected variables), and every panel query is valid
PromQL over documented metrics and recording rules.

No Grafana server can run here (none is packaged for this platform), so importability is
checked structurally; PromQL validity is checked by promtool, which parses each query as the
expression of a recording rule.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import dashboards
from tests.conftest import REPO, require_tool
from tests.promql_names import unknown_names

EXPECTED_VARIABLES = {
    "ccl-fleet.json": {"datasource", "node"},
    "ccl-training-job.json": {"datasource", "namespace", "job_name"},
    "ccl-node-fabric.json": {"datasource", "node"},
}
SAMPLE_VALUES = {"node": "gpu-a", "namespace": "ml", "job_name": "llama"}


def _load(path: Path) -> dict:  # type: ignore[type-arg]
    return json.loads(path.read_text())


def test_committed_json_is_what_the_generator_makes() -> None:
    result = subprocess.run([sys.executable, str(REPO / "dashboards" / "generate.py"), "--check"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_the_three_dashboards_exist() -> None:
    assert {p.name for p in dashboards.dashboard_files()} == set(EXPECTED_VARIABLES)


@pytest.mark.parametrize("name", sorted(EXPECTED_VARIABLES))
def test_dashboard_is_importable_as_is(name: str) -> None:
    board = _load(REPO / "dashboards" / name)
    assert board["uid"] == hashlib.md5(name.encode()).hexdigest(), "uid = md5(file name): stable links"
    assert board["schemaVersion"] >= 39 and board["title"].startswith("CCL health / ")
    assert board["timezone"] == "utc" and "ccl-health" in board["tags"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert set(variables) == EXPECTED_VARIABLES[name]
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"]["uid"] == "${datasource}"
            assert variable["query"].startswith("label_values(")
    panels = [p for p in board["panels"] if p["type"] != "row"]
    assert len(panels) >= 8
    for panel in panels:
        assert panel["title"] and panel["gridPos"]["w"] > 0 and panel["gridPos"]["h"] > 0
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}" and target["expr"].strip()
    ids = [t["refId"] for p in panels for t in p["targets"]]
    assert all(ids)


def test_queries_list_every_panel_query() -> None:
    listed = dashboards.queries()
    in_json = sum(len(p.get("targets", [])) for f in dashboards.dashboard_files() for p in _load(f)["panels"])
    assert len(listed) == in_json > 40
    by_board = {q.dashboard for q in listed}
    assert by_board == set(EXPECTED_VARIABLES)
    job_queries = [q for q in listed if q.dashboard == "ccl-training-job.json" and "job_name" in q.variables]
    assert job_queries, "training-job panels use $job_name"
    assert dashboards.substitute('x{node="$node"}[$__rate_interval]', {"node": "n1"}) == 'x{node="n1"}[1m]'


def test_every_query_parses_as_promql(tmp_path: Path) -> None:
    """promtool parses each substituted query as a recording rule's expression."""
    promtool = require_tool("promtool")
    rules = [{"record": f"dashboard:query_{i}:check", "expr": dashboards.substitute(q.expr, SAMPLE_VALUES)}
             for i, q in enumerate(dashboards.queries())]
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard-queries", "rules": rules}]}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout
    path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [{"record": "a:b:c", "expr": "sum(x"}]}]}))
    assert subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, timeout=60).returncode != 0


def test_queries_use_only_known_metrics() -> None:
    for query in dashboards.queries():
        unknown = unknown_names(query.expr)
        assert not unknown, f"{query.dashboard} / {query.panel}: unknown metrics {sorted(unknown)}"

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
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import dashboards
from alerts.sync import RUNBOOK_BASE_URL
from exporter.collectors.nccl.families import VERDICTS
from exporter.sources.rdma import PHYSICAL_PORT_STATES, PORT_STATES
from tests.conftest import REPO, require_tool
from tests.promql_names import grouping_labels, known_names, rules, unknown_names, vector_selectors

# In the order Grafana resolves them: a variable's query may use the ones before it.
EXPECTED_VARIABLES = {
    "ccl-fleet.json": ["datasource", "cluster", "node"],
    "ccl-training-job.json": ["datasource", "cluster", "namespace", "job_name"],
    "ccl-node-fabric.json": ["datasource", "cluster", "node"],
}
SAMPLE_VALUES = {"node": "gpu-a", "namespace": "ml", "job_name": "llama"}


def _load(path: Path) -> dict:  # type: ignore[type-arg]
    return json.loads(path.read_text())


def test_committed_json_is_what_the_generator_makes() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "dashboards" / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
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
    assert list(variables) == EXPECTED_VARIABLES[name]
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
    rules = [
        {"record": f"dashboard:query_{i}:check", "expr": dashboards.substitute(q.expr, SAMPLE_VALUES)}
        for i, q in enumerate(dashboards.queries())
    ]
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard-queries", "rules": rules}]}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout
    path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [{"record": "a:b:c", "expr": "sum(x"}]}]}))
    assert subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, timeout=60).returncode != 0


def test_queries_use_only_known_metrics() -> None:
    known = known_names()
    for query in dashboards.queries():
        unknown = unknown_names(query.expr, known)
        assert not unknown, f"{query.dashboard} / {query.panel}: unknown metrics {sorted(unknown)}"


# ---- cluster, links, value mappings, units -------------------------------------------------

CLUSTER_MATCHER = 'cluster=~"$cluster"'
# Alerts no panel shows, each with the reason.
NOT_ON_A_PANEL = {
    "CclExporterAbsent": "reads Prometheus' up and kube-state-metrics, not the exporter: nothing to plot",
    "CclSuspectedTcpFallback": "reads cAdvisor's pod network bytes, which the dashboards do not query",
    # The admission webhook and the certificates: the dashboards show the fabric, and the simulated
    # fleet they are tested on (tests/e2e/test_dashboards.py) runs no webhook, no API server and no TLS.
    "CclWebhookFailingOpen": "reads the API server's series, which no dashboard queries",
    "CclWebhookRejectingPods": "reads the API server's series, which no dashboard queries",
    "CclWebhookReviewsFailing": "reads the webhook's own series (another target than the fleet's exporters)",
    "CclWebhookReviewsSlow": "reads the webhook's own series (another target than the fleet's exporters)",
    "CclWebhookCertificateExpiring": "reads the webhook's own series (another target than the fleet's exporters)",
    "CclExporterCertificateExpiring": "exists with TLS on only; one number per node, in the runbook's query",
}
# The exporter's 1/0 gauges (value = 1.0 if <condition> else 0.0).
BOOLEAN = {0, 1}
# Every (dashboard, panel, column) that shows a state, and every value the exporter can emit there;
# column None is the panel's own value (stat, state timeline).
PORT_STATE_VALUES = {10 * state + physical for state in PORT_STATES for physical in PHYSICAL_PORT_STATES}
STATE_PANELS: dict[tuple[str, str, str | None], set[int] | set[str]] = {
    ("ccl-fleet.json", "RDMA ports not ACTIVE", "State"): PORT_STATE_VALUES,
    ("ccl-fleet.json", "Exporter collectors failing", "Status"): BOOLEAN,
    ("ccl-training-job.json", "TCP fallback", None): BOOLEAN,
    ("ccl-training-job.json", "GPUDirect RDMA disabled", None): BOOLEAN,
    # ccl_nccl_tcp_fallback + 2 x ccl_nccl_gdr_disabled, and the pod's ccl_nccl_verdict
    ("ccl-training-job.json", "Pods and nodes (TCP fallback, GPUDirect off)", "Transport"): {
        fallback + 2 * gdr for fallback in BOOLEAN for gdr in BOOLEAN
    },
    ("ccl-training-job.json", "Pods and nodes (TCP fallback, GPUDirect off)", "verdict"): set(VERDICTS),
    ("ccl-training-job.json", "Probe success", None): BOOLEAN,
    ("ccl-training-job.json", "Transport verdict", "verdict"): set(VERDICTS),
    ("ccl-node-fabric.json", "Port state (logical / physical)", "State"): PORT_STATE_VALUES,
    ("ccl-node-fabric.json", "NVLink state", "State"): BOOLEAN,
    ("ccl-node-fabric.json", "Collectors", "Status"): BOOLEAN,
}
STATE_METRICS = {
    "ccl_rdma_port_state_id",
    "ccl_rdma_port_physical_state_id",
    "ccl_nvlink_state",
    "ccl_exporter_collector_success",
    "ccl_probe_success",
    "ccl_nccl_tcp_fallback",
    "ccl_nccl_gdr_disabled",
    "ccl_nccl_verdict",
    "job_name:ccl_nccl_tcp_fallback:max",
    "job_name:ccl_nccl_gdr_disabled:max",
}


def _boards() -> dict[str, dict]:  # type: ignore[type-arg]
    return {path.name: _load(path) for path in dashboards.dashboard_files()}


def _panels() -> list[tuple[str, dict]]:  # type: ignore[type-arg]
    return [(name, panel) for name, board in _boards().items() for panel in board["panels"] if panel["type"] != "row"]


def _organize(panel: dict) -> dict:  # type: ignore[type-arg]
    return next((t["options"] for t in panel.get("transformations", []) if t["id"] == "organize"), {})


def _shows_value(panel: dict) -> bool:  # type: ignore[type-arg]
    return not _organize(panel).get("excludeByName", {}).get("Value", False)


def _mappings(panel: dict) -> dict[str | None, dict]:  # type: ignore[type-arg]
    """Value mappings of a panel by column (None: the panel's own value), merged into one options dict."""
    found: dict[str | None, dict] = {}  # type: ignore[type-arg]
    for mapping in panel["fieldConfig"]["defaults"].get("mappings", []):
        found.setdefault(None, {}).update(mapping["options"])
    for override in panel["fieldConfig"].get("overrides", []):
        for prop in override["properties"]:
            if prop["id"] == "mappings":
                for mapping in prop["value"]:
                    found.setdefault(override["matcher"]["options"], {}).update(mapping["options"])
    return found


def test_selector_scanner_finds_every_selector() -> None:
    """The helper the cluster test relies on: a selector without the matcher cannot hide from it."""
    expr = (
        'sum by (cluster, node) (rate(a{cluster=~"$cluster", x="}"}[5m])) and on (node) b'
        " + on (cluster) group_left () 2 * max(c:d:e) by (x)"
    )
    assert vector_selectors(expr) == [("a", '{cluster=~"$cluster", x="}"}'), ("b", ""), ("c:d:e", "")]
    assert grouping_labels(expr) == [
        ("by", ["cluster", "node"]),
        ("on", ["node"]),
        ("on", ["cluster"]),
        ("group_left", []),
        ("by", ["x"]),
    ]


@pytest.mark.parametrize("name", sorted(EXPECTED_VARIABLES))
def test_cluster_variable_defaults_to_all_which_matches_series_without_the_label(name: str) -> None:
    variables = {v["name"]: v for v in _load(REPO / "dashboards" / name)["templating"]["list"]}
    cluster = variables["cluster"]
    assert cluster["query"] == "label_values(ccl_exporter_build_info, cluster)"
    assert cluster["includeAll"] and cluster["current"]["value"] == "$__all"
    # Prometheus reads a missing label as "" and anchors =~: the All value must match "".
    assert re.fullmatch(cluster["allValue"], "") and re.fullmatch(cluster["allValue"], "eu-west-1")
    for variable in variables.values():
        if variable["type"] == "query" and variable["name"] != "cluster":
            assert CLUSTER_MATCHER in variable["query"], variable["name"]


def test_every_panel_query_selects_the_cluster_and_keeps_it_when_grouping() -> None:
    for query in dashboards.queries():
        where = f"{query.dashboard} / {query.panel} / {query.ref_id}"
        selectors = vector_selectors(query.expr)
        assert selectors, where
        for metric, matchers in selectors:
            assert CLUSTER_MATCHER in matchers, f"{where}: {metric}{matchers} lacks {CLUSTER_MATCHER}"
        for keyword, labels in grouping_labels(query.expr):
            if keyword in ("by", "on"):
                assert "cluster" in labels, f"{where}: {keyword} ({', '.join(labels)}) drops cluster"


@pytest.mark.parametrize("name", sorted(EXPECTED_VARIABLES))
def test_dashboards_link_each_other_keeping_variables_and_time(name: str) -> None:
    board = _load(REPO / "dashboards" / name)
    others = {f"/d/{_load(path)['uid']}" for path in dashboards.dashboard_files() if path.name != name}
    assert len(others) == 2
    assert {link["url"] for link in board["links"]} == others
    for link in board["links"]:
        assert link["type"] == "link" and link["includeVars"] and link["keepTime"], link


def test_panels_link_the_runbooks_of_their_alerts() -> None:
    alerts = {rule["alert"] for rule in rules() if "alert" in rule}
    linked = set()
    for name, panel in _panels():
        for link in panel.get("links", []):
            url = link["url"]
            assert url.startswith(RUNBOOK_BASE_URL) and url.endswith(".md"), f"{name} / {panel['title']}: {url}"
            alert = url[len(RUNBOOK_BASE_URL) : -len(".md")]
            assert alert in alerts, f"{name} / {panel['title']}: no alert {alert}"
            assert (REPO / "docs" / "runbooks" / f"{alert}.md").is_file(), alert
            assert link["title"] == f"Runbook: {alert}" and link["targetBlank"]
            linked.add(alert)
    assert alerts - linked == set(NOT_ON_A_PANEL), "alerts without a panel that links their runbook"


def test_data_links_open_an_existing_dashboard_with_its_variables() -> None:
    boards = {board["uid"]: board for board in _boards().values()}
    found = 0
    for name, panel in _panels():
        for override in panel["fieldConfig"].get("overrides", []):
            for link in (link for prop in override["properties"] if prop["id"] == "links" for link in prop["value"]):
                found += 1
                path, _, query = link["url"].partition("?")
                target = boards.get(path.removeprefix("/d/"))
                assert target is not None, f"{name} / {panel['title']}: {link['url']} is no dashboard of ours"
                names = {v["name"] for v in target["templating"]["list"]}
                params = query.split("&")
                for param in params:
                    if param.startswith("var-"):
                        assert param.removeprefix("var-").split("=")[0] in names, f"{panel['title']}: {param}"
                assert {"${__url_time_range}", "${datasource:queryparam}", "${cluster:queryparam}"} <= set(params)
    assert found >= 8


def test_state_panels_map_every_value_the_exporter_emits() -> None:
    mapped = {
        (name, panel["title"], column): options
        for name, panel in _panels()
        for column, options in _mappings(panel).items()
    }
    assert set(mapped) == set(STATE_PANELS)
    for key, values in STATE_PANELS.items():
        options = mapped[key]
        missing = {str(value) for value in values} - set(options)
        assert not missing, f"{key}: no words for {sorted(missing)}"
        for value, result in options.items():
            assert result["text"] and result["color"], f"{key}: {value}"
    for key in [k for k in STATE_PANELS if STATE_PANELS[k] is PORT_STATE_VALUES]:
        for state, state_name in PORT_STATES.items():
            for physical, physical_name in PHYSICAL_PORT_STATES.items():
                result = mapped[key][str(10 * state + physical)]
                assert result["text"] == f"{state_name} / {physical_name}"
                healthy = state_name.startswith("ACTIVE") and physical_name == "LinkUp"
                assert (result["color"] == "green") == healthy, result


def test_every_panel_that_shows_a_state_metric_shows_words() -> None:
    for name, panel in _panels():
        for target in panel["targets"]:
            names = {metric for metric, _ in vector_selectors(target["expr"])}
            if names & STATE_METRICS and _shows_value(panel) and not target["expr"].startswith("count("):
                assert _mappings(panel), f"{name} / {panel['title']} shows {sorted(names & STATE_METRICS)} as numbers"


def test_stats_are_coloured_only_where_a_value_is_a_problem() -> None:
    for name, panel in _panels():
        if panel["type"] != "stat":
            continue
        steps = panel["fieldConfig"]["defaults"].get("thresholds", {}).get("steps", [])
        alarming = [step for step in steps if step["color"] in ("red", "orange") and step["value"] is not None]
        if alarming:
            assert panel.get("links"), f"{name} / {panel['title']}: coloured as a problem without a runbook"
    for title in ("Nodes", "Pods"):
        [panel] = [p for name, p in _panels() if p["title"] == title and name == "ccl-training-job.json"]
        steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
        assert all(step["color"] not in ("red", "orange") for step in steps), title
        assert panel["options"]["colorMode"] == "none"


def test_every_panel_has_a_unit_that_fits_its_query() -> None:
    for name, panel in _panels():
        where = f"{name} / {panel['title']}"
        unit = panel["fieldConfig"]["defaults"].get("unit")
        assert unit, where
        if panel["type"] == "table":
            assert _organize(panel)["excludeByName"]["Time"], f"{where}: shows the Time column"
        if not _shows_value(panel) or _mappings(panel):
            continue
        for target in panel["targets"]:
            names = " ".join(metric for metric, _ in vector_selectors(target["expr"]))
            if "bytes" in names:
                assert unit == "Bps", where
            elif "seconds" in names:
                assert unit == "s", where
            elif "rate(" in target["expr"]:
                assert unit in ("pps", "cps"), where

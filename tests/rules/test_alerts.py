"""The alert rules: promtool checks them and runs their unit tests; a lint holds every alert to
the conventions (three annotations, a known severity, a runbook that exists, known metrics)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from devtools.stack import ALERTMANAGER_NAMES, Alertmanager, WebhookReceiver, find_binary
from tests.conftest import REPO, require_tool
from tests.promql_names import (
    EXTERNAL_METRICS,
    GLOBAL_RULES_FILE,
    RULE_FILES,
    RULES_FILE,
    documented_metric_names,
    grouping_labels,
    known_names,
    recording_rule_names,
    referenced_names,
    rules,
    unknown_names,
    vector_selectors,
)

TESTS_DIR = REPO / "alerts" / "tests"
ALERTMANAGER_CONFIG = REPO / "alerts" / "alertmanager.yml"
RUNBOOKS = REPO / "docs" / "runbooks"
SEVERITIES = {"critical", "warning", "info"}

ALERTS = [rule for rule in rules() if "alert" in rule]
# Alerts about no node, each with the labels its description names instead: the webhook's own
# replicas (a Deployment's pods, wherever they run), the API server's calls to the webhook, and
# a namespace's pods across nodes.
NOT_ABOUT_A_NODE = {
    "CclWebhookReviewsFailing": ("namespace", "pod"),
    "CclWebhookReviewsSlow": ("namespace", "pod"),
    "CclWebhookCertificateExpiring": ("namespace", "pod"),
    "CclWebhookFailingOpen": ("name",),
    "CclWebhookRejectingPods": ("name",),
    "CclNcclVerdictsUnknown": ("namespace",),
}
# The webhook's name in its MutatingWebhookConfiguration, which the API server's series carry as `name`.
WEBHOOK_CONFIGURATIONS = (
    REPO / "manifests" / "overlays" / "webhook" / "mutatingwebhookconfiguration.yaml",
    REPO / "manifests" / "helm" / "ccl-health-exporter" / "templates" / "webhook-configuration.yaml",
)


def test_promtool_check_rules_is_clean() -> None:
    """promtool's check with every lint fatal: no warning, and no two rules of one name and the same
    static labels in a file (rules split between groups carry their group's empty-valued label,
    tests/rules/test_rule_split.py)."""
    promtool = require_tool("promtool")
    result = subprocess.run(
        [promtool, "check", "rules", "--lint-fatal", *map(str, RULE_FILES)], capture_output=True, text=True, timeout=60
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "WARNING" not in output.upper() and "FAILED" not in output
    assert output.count("SUCCESS") == len(RULE_FILES), output


def test_promtool_lint_sees_rules_split_between_groups_without_their_group_label(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Without the empty-valued group labels, --lint-fatal fails on exactly the split rules."""
    promtool = require_tool("promtool")
    in_several_groups = set()
    for path in RULE_FILES:
        stripped = re.sub(
            r'^\s+labels: \{ccl_group_[a-z0-9_]+: ""\}\n|^\s+ccl_group_[a-z0-9_]+: ""\n',
            "",
            path.read_text(),
            flags=re.MULTILINE,
        )
        (tmp_path / path.name).write_text(stripped)
        owners: dict[str, set[str]] = {}
        for group in yaml.safe_load(stripped)["groups"]:
            for rule in group["rules"]:
                owners.setdefault(rule.get("record") or rule["alert"], set()).add(group["name"])
        in_several_groups |= {name for name, found in owners.items() if len(found) > 1}
    result = subprocess.run(
        [promtool, "check", "rules", "--lint-fatal", *(str(tmp_path / p.name) for p in RULE_FILES)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert set(re.findall(r"^Metric: (\S+)$", output, re.MULTILINE)) == in_several_groups != set()


def test_promtool_unit_tests_pass() -> None:
    promtool = require_tool("promtool")
    files = sorted(TESTS_DIR.glob("*.yaml"))
    assert files
    result = subprocess.run(
        [promtool, "test", "rules", *map(str, files)], capture_output=True, text=True, timeout=300, cwd=TESTS_DIR
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_broken_rule_fails_its_unit_test(tmp_path: Path) -> None:
    """The unit tests can fail: rename the TCP-fallback alert and its test must break."""
    promtool = require_tool("promtool")
    broken = RULES_FILE.read_text().replace(
        "      - alert: CclNcclTcpFallback\n", "      - alert: CclNcclTcpFallbackRenamed\n", 1
    )
    (tmp_path / "alerts").mkdir()
    (tmp_path / "alerts" / RULES_FILE.name).write_text(broken)
    (tmp_path / "alerts" / GLOBAL_RULES_FILE.name).write_text(GLOBAL_RULES_FILE.read_text())
    (tmp_path / "alerts" / "tests").mkdir()
    test_file = tmp_path / "alerts" / "tests" / "nccl-test.yaml"
    test_file.write_text((TESTS_DIR / "nccl-test.yaml").read_text())
    result = subprocess.run(
        [promtool, "test", "rules", str(test_file)], capture_output=True, text=True, timeout=60, cwd=test_file.parent
    )
    assert result.returncode != 0
    assert "CclNcclTcpFallback" in result.stdout + result.stderr


def _unit_test_cases() -> dict[str, list[list[dict]]]:  # type: ignore[type-arg]
    cases: dict[str, list[list[dict]]] = {}  # type: ignore[type-arg]
    for path in TESTS_DIR.glob("*.yaml"):
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                cases.setdefault(case["alertname"], []).append(case.get("exp_alerts") or [])
    return cases


@pytest.fixture(scope="module")
def unit_test_cases() -> dict[str, list[list[dict]]]:  # type: ignore[type-arg]
    """The promtool unit tests' alert cases, read once for every alert."""
    return _unit_test_cases()


@pytest.mark.parametrize("alert", ALERTS, ids=[a["alert"] for a in ALERTS])
def test_every_alert_is_tested_firing_and_silent(alert: dict, unit_test_cases: dict) -> None:  # type: ignore[type-arg]
    cases = unit_test_cases.get(alert["alert"], [])
    assert any(expected for expected in cases), f"{alert['alert']}: no case where it fires"
    assert any(not expected for expected in cases), f"{alert['alert']}: no case where it stays silent"
    for expected in cases:
        for firing in expected:
            assert firing["exp_labels"]["severity"] == alert["labels"]["severity"]
            assert set(firing["exp_annotations"]) == {"summary", "description", "runbook_url"}


@pytest.mark.parametrize("alert", ALERTS, ids=[a["alert"] for a in ALERTS])
def test_alert_follows_the_conventions(alert: dict) -> None:  # type: ignore[type-arg]
    name = alert["alert"]
    assert re.fullmatch(r"Ccl(?:[A-Z][a-z0-9]+)+", name), f"{name}: CamelCase with the Ccl prefix"
    assert alert["labels"]["severity"] in SEVERITIES
    annotations = alert["annotations"]
    assert set(annotations) >= {"summary", "description", "runbook_url"}
    assert annotations["summary"].endswith("."), "a summary is one static sentence"
    assert "{{" not in annotations["summary"]
    for label in NOT_ABOUT_A_NODE.get(name, ("node",)):
        assert f"$labels.{label}" in annotations["description"], f"the description names the {label}"
    assert annotations["runbook_url"].endswith(f"/{name}.md")
    runbook = RUNBOOKS / f"{name}.md"
    assert runbook.is_file(), f"missing runbook {runbook.relative_to(REPO)}"
    text = runbook.read_text()
    for section in ("## Meaning", "## Confirm", "## Causes", "## Fix", "## Verify"):
        assert section in text, f"{runbook.name}: no '{section}' section"
    assert "for" in alert, f"{name}: no `for`"


def test_only_alerts_about_no_node_leave_the_node_out() -> None:
    """An alert whose output keeps `node` names it; the ones listed as about no node keep none."""
    for alert in ALERTS:
        kept = {label for keyword, labels in grouping_labels(alert["expr"]) if keyword == "by" for label in labels}
        if alert["alert"] in NOT_ABOUT_A_NODE:
            assert "node" not in kept and set(NOT_ABOUT_A_NODE[alert["alert"]]) <= kept | {"namespace"}, alert["alert"]
        else:
            assert "$labels.node" in alert["annotations"]["description"], alert["alert"]


def test_the_webhook_rules_select_the_webhook_by_its_name_in_the_manifests() -> None:
    """`name` on the API server's series is the webhook's name in the MutatingWebhookConfiguration:
    the kustomize overlay's and the chart's, and every rule that reads those series selects it."""
    names = set()
    for path in WEBHOOK_CONFIGURATIONS:
        text = path.read_text()
        webhooks = text[text.index("\nwebhooks:\n") :]
        names |= set(re.findall(r"^  - name: (\S+)$", webhooks, re.MULTILINE))
    selected = [
        re.findall(r'name="([^"]*)"', selector)
        for rule in rules()
        for metric, selector in vector_selectors(rule["expr"])
        if metric.startswith("apiserver_admission_webhook_")
    ]
    assert len(selected) >= 3 and all(found == [*names] for found in selected), (names, selected)
    assert names == {"pods.ccl-health.io"}


def test_pod_level_alerts_name_namespace_pod_and_job() -> None:
    for alert in ALERTS:
        if re.search(r"\bpod\b", alert["expr"]) and "job_name" in alert["expr"] and "ccl_nccl" in alert["expr"]:
            description = alert["annotations"]["description"]
            for label in ("namespace", "pod", "job_name", "node"):
                assert f"$labels.{label}" in description, f"{alert['alert']} lacks {label}"


def test_tcp_fallback_is_critical_and_fast() -> None:
    """Two rules, one per evidence: the log's in the node-level rules, the placement's (it counts
    a job's nodes) in the global ones; each in a 15 s group that reads no recording rule."""
    fallbacks = [a for a in ALERTS if a["alert"] == "CclNcclTcpFallback"]
    assert len(fallbacks) == 2
    for fallback in fallbacks:
        assert fallback["labels"]["severity"] == "critical"
        assert fallback["for"] in ("0s", "15s")
    homes = [
        (path, group)
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        if any(r.get("alert") == "CclNcclTcpFallback" for r in group["rules"])
    ]
    assert [path for path, _ in homes] == [RULES_FILE, GLOBAL_RULES_FILE]
    for _, group in homes:
        assert group.get("interval") == "15s"
        assert not any("record" in r for r in group["rules"]), "the fast group depends on no recording rule"


def test_rules_reference_only_known_metrics() -> None:
    assert documented_metric_names(), "docs/metrics.md lists no ccl_ metric"
    known = known_names()
    for rule in rules():
        unknown = unknown_names(rule["expr"], known)
        assert not unknown, f"{rule.get('alert') or rule.get('record')}: unknown metrics {sorted(unknown)}"


def test_name_extraction_sees_what_it_must() -> None:
    expr = (
        'sum by (node) (rate(ccl_rdma_port_transmit_bytes_total{counter="ccl_not_a_metric"}[5m]))'
        ' > on (node) node:ccl_rdma_ports:count and max_over_time(x:y:z[7d:1h]) unless up{job="a"}'
    )
    assert referenced_names(expr) == {"ccl_rdma_port_transmit_bytes_total", "node:ccl_rdma_ports:count", "x:y:z", "up"}
    assert "x:y:z" in unknown_names(expr)
    # a label named ccl_*, in any matcher, is no metric; a ccl_ metric compared is one
    labelled = 'rate(ccl_a_total{ccl_rule_partition="0"}[5m]) + ccl_b{ccl_c!~"1", ccl_d =~ "2"} and ccl_e != 0'
    assert referenced_names(labelled) == {"ccl_a_total", "ccl_b", "ccl_e"}


def test_external_metrics_are_used() -> None:
    used = set().union(*(referenced_names(rule["expr"]) for rule in rules()))
    assert set(EXTERNAL_METRICS) <= used, "drop external metrics no rule uses"


def test_recording_rules_follow_level_metric_operations() -> None:
    for name in recording_rule_names():
        assert re.fullmatch(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", name), name


def test_runbook_urls_and_prometheus_rule_are_in_sync() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "alerts" / "sync.py"), "--check"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_prometheus_rule_spec_equals_the_rules_file() -> None:
    for name, rules_file in (("prometheusrule.yaml", RULES_FILE), ("prometheusrule-global.yaml", GLOBAL_RULES_FILE)):
        manifest = yaml.safe_load((REPO / "manifests" / "base" / name).read_text())
        assert manifest["kind"] == "PrometheusRule"
        assert manifest["spec"] == yaml.safe_load(rules_file.read_text())


def test_every_runbook_belongs_to_an_alert() -> None:
    names = {a["alert"] for a in ALERTS}
    orphans = {p.stem for p in RUNBOOKS.glob("*.md")} - names
    assert not orphans, f"runbooks without an alert: {sorted(orphans)}"


def test_alerts_doc_lists_every_alert() -> None:
    doc = (REPO / "docs" / "alerts.md").read_text()
    for alert in ALERTS:
        row = [line for line in doc.splitlines() if line.startswith(f"| `{alert['alert']}`")]
        assert row, f"docs/alerts.md has no row for {alert['alert']}"
        assert alert["labels"]["severity"] in row[0] and alert["for"] in row[0]


def test_example_alertmanager_config_is_valid_and_pages_fast() -> None:
    """The route we document: amtool accepts it, and the critical route waits at most 10 s."""
    amtool = require_tool("amtool")
    result = subprocess.run(
        [amtool, "check-config", str(ALERTMANAGER_CONFIG)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    from devtools.stack import Intervals

    shipped = Intervals.shipped(REPO)
    assert shipped.group_wait_seconds <= 10 and shipped.scrape_seconds <= 15


# One TCP-fallback incident as Alertmanager sees it: the exact page of job ml/llama and the alerts
# around it, each with the labels its rule gives it. ``True``: the shipped inhibitions mute it.
_FALLBACK = {
    "alertname": "CclNcclTcpFallback",
    "severity": "critical",
    "evidence": "log",
    "namespace": "ml",
    "pod": "llama-worker-0",
    "job_name": "llama",
    "job_kind": "PyTorchJob",
    "node": "gpu-a",
}
_SUSPECTED = {
    "alertname": "CclSuspectedTcpFallback",
    "severity": "warning",
    "evidence": "pod_network",
    "namespace": "ml",
    "pod": "llama-worker-1",
    "job_name": "llama",
    "node": "gpu-b",
}
_INCIDENT: list[tuple[dict[str, str], bool]] = [
    (_FALLBACK, False),
    # The same job's other signals: the page already names the job.
    ({**_FALLBACK, "evidence": "placement", "pod": "llama-worker-2", "node": "gpu-c"}, False),  # same page, grouped
    (_SUSPECTED, True),
    ({**_SUSPECTED, "evidence": "host_network", "pod": "", "node": "gpu-d"}, True),
    (
        {
            "alertname": "CclNcclGdrDisabled",
            "severity": "warning",
            "namespace": "ml",
            "pod": "llama-worker-3",
            "job_name": "llama",
            "job_kind": "PyTorchJob",
            "node": "gpu-d",
        },
        True,
    ),
    # Not the same job: another job, the same job name in another namespace or another cluster.
    ({**_SUSPECTED, "job_name": "gpt", "pod": "gpt-worker-0"}, False),
    ({**_SUSPECTED, "namespace": "research"}, False),
    ({**_SUSPECTED, "cluster": "east"}, False),
    # The node's hardware keeps its own page (docs/alerts.md says why).
    ({"alertname": "CclRdmaPortDown", "severity": "critical", "node": "gpu-a"}, False),
    # A fallback without a job name mutes nothing, not even another unnamed pod's warning.
    ({**_FALLBACK, "job_name": "", "job_kind": "", "namespace": "batch", "pod": "bare-0"}, False),
    (
        {
            "alertname": "CclNcclGdrDisabled",
            "severity": "warning",
            "namespace": "batch",
            "pod": "bare-1",
            "node": "gpu-a",
        },
        False,
    ),
]


def _label_set(labels: dict[str, str]) -> frozenset[tuple[str, str]]:
    return frozenset((k, v) for k, v in labels.items() if v)  # Alertmanager drops empty labels


@pytest.fixture
def shipped_alertmanager(tmp_path: Path) -> Iterator[str]:
    """The real Alertmanager with alerts/alertmanager.yml on 127.0.0.1 (free port, temporary
    storage, no gossip); its webhook receivers point at a receiver in this process."""
    binary = find_binary(ALERTMANAGER_NAMES) or require_tool("prometheus-alertmanager")
    config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    receiver = WebhookReceiver().start()
    for entry in config["receivers"]:
        for webhook in entry.get("webhook_configs", []):
            webhook["url"] = receiver.url
    alertmanager = Alertmanager(binary, tmp_path / "alertmanager", config)
    try:
        alertmanager.start()
        yield alertmanager.url
    finally:
        alertmanager.stop()
        receiver.stop()


def _amtool(amtool: str, url: str, *args: str) -> str:
    result = subprocess.run([amtool, f"--alertmanager.url={url}", *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _queried(amtool: str, url: str, *flags: str) -> set[frozenset[tuple[str, str]]]:
    """Label sets of the alerts ``amtool alert query`` lists: active ones without flags, plus
    the inhibited or silenced ones with ``--inhibited`` or ``--silenced``."""
    alerts = json.loads(_amtool(amtool, url, "--output=json", "alert", "query", *flags) or "[]")
    return {_label_set(alert["labels"]) for alert in alerts}


def _suppressed_and_active(amtool: str, url: str, how: str) -> tuple[set[frozenset[tuple[str, str]]], ...]:
    active = _queried(amtool, url)
    return _queried(amtool, url, f"--{how}") - active, active


def _settled(
    read: Callable[[], tuple[set[frozenset[tuple[str, str]]], ...]], want: tuple[object, ...], timeout: float = 20.0
) -> tuple[set[frozenset[tuple[str, str]]], ...]:
    """``read()`` once it returns ``want``, or its last answer after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = read()
        if got == want or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def test_one_fallback_incident_pages_once_with_the_job_named(shipped_alertmanager: str) -> None:
    """The inhibitions of alerts/alertmanager.yml in a real Alertmanager: the job's fallback page
    mutes that job's suspicion and GPUDirect warning, and nothing else."""
    amtool = require_tool("amtool")
    url = shipped_alertmanager
    for labels, _ in _INCIDENT:
        _amtool(amtool, url, "alert", "add", *(f"{k}={v}" for k, v in labels.items() if v))
    want_inhibited = {_label_set(labels) for labels, muted in _INCIDENT if muted}
    want_active = {_label_set(labels) for labels, muted in _INCIDENT if not muted}
    inhibited, active = _settled(
        lambda: _suppressed_and_active(amtool, url, "inhibited"), (want_inhibited, want_active)
    )
    assert inhibited == want_inhibited
    assert active == want_active

    # Why CclRdmaPortDown is not a target: a silenced source still inhibits (docs/alerts.md).
    _amtool(
        amtool,
        url,
        "silence",
        "add",
        "--comment=restart planned",
        "--author=test",
        "alertname=CclNcclTcpFallback",
        "namespace=ml",
        "job_name=llama",
    )
    pages = {
        _label_set(labels)
        for labels, _ in _INCIDENT
        if labels["alertname"] == "CclNcclTcpFallback" and labels["job_name"] == "llama"
    }
    silenced, _ = _settled(lambda: _suppressed_and_active(amtool, url, "silenced"), (pages, want_active - pages))
    assert silenced == pages
    assert _suppressed_and_active(amtool, url, "inhibited")[0] == want_inhibited


def test_one_base_url_moves_every_runbook_link(tmp_path: Path) -> None:
    """RUNBOOK_BASE_URL (or --runbook-base-url) is the one place: rules and promtool tests follow it."""
    promtool = require_tool("promtool")
    sys.path.insert(0, str(REPO / "alerts"))
    try:
        import sync
    finally:
        sys.path.remove(str(REPO / "alerts"))
    base = "https://runbooks.internal.test/ccl/"
    (tmp_path / "tests").mkdir()
    rules_text = ""
    for rules_file in RULE_FILES:
        text = sync.with_runbook_urls(rules_file.read_text(), base)
        (tmp_path / rules_file.name).write_text(text)
        rules_text += text
    for test in sorted(TESTS_DIR.glob("*.yaml")):
        (tmp_path / "tests" / test.name).write_text(sync.with_expected_runbook_urls(test.read_text(), base))
    urls = re.findall(
        r"runbook_url: (\S+)", rules_text + "".join(p.read_text() for p in (tmp_path / "tests").iterdir())
    )
    assert urls and all(re.fullmatch(re.escape(base) + r"Ccl[A-Za-z]+\.md", url) for url in urls)
    shipped = "".join(path.read_text() for path in RULE_FILES)
    assert all(url.startswith(sync.RUNBOOK_BASE_URL) for url in re.findall(r"runbook_url: (\S+)", shipped))
    result = subprocess.run(
        [promtool, "test", "rules", *sorted(p.name for p in (tmp_path / "tests").iterdir())],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path / "tests",
    )
    assert result.returncode == 0, result.stdout + result.stderr

"""The rules as two files for shards and a global ruler, with `cluster` everywhere.

``alerts/ccl-health-rules.yaml`` holds the node-level rules (each shard runs them on its own
nodes), ``alerts/ccl-health-global-rules.yaml`` the rules across nodes (the global ruler runs
them); a single Prometheus loads both. What the promtool tests cannot see is checked here from
the rule text: every aggregation and join carries `cluster`, every node-level rule keeps the node
(or the pod) it reads, each threshold lives in the one file that reads it, and the same text is
accepted by vmalert. ``alerts/tests/clusters-test.yaml`` evaluates two clusters with the same
names; ``tests/e2e/test_scale_out.py`` runs both files on shards and a global ruler.
"""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml

from devtools.stack import pod_monitor_endpoint
from tests import yaml_docs
from tests.conftest import REPO, require_tool
from tests.promql_names import GLOBAL_RULES_FILE, RULE_FILES, RULES_FILE, grouping_labels, groups, referenced_names

# The labels a threshold constant is selected by: a join on only these, with a threshold, is the
# one kind of join without `cluster` (the constants are the evaluating ruler's own).
THRESHOLD_KEYS = {"counter", "error", "scope"}
_SELECTOR = re.compile(r"\{([^{}]*)\}")
# How the in-job rate groups select their partition of the nodes (ccl-health-job-nodes-*).
_PARTITION_MATCHER = re.compile(r'ccl_rule_partition(=~|!~|!=|=)"([^"]*)"')
# What an alert's rule marks its finds with, where the alert is in several groups.
_MARK = re.compile(r'label_replace\(.*?"(evidence|compared_to)", "([a-z_]+)", "", ""\s*\)')


def _rules(path):  # type: ignore[no-untyped-def]
    return [rule for group in yaml_docs.load(path.read_text())["groups"] for rule in group["rules"]]


def _name(rule) -> str:  # type: ignore[no-untyped-def]
    return str(rule.get("alert") or rule.get("record"))


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_every_aggregation_and_join_carries_cluster(path) -> None:  # type: ignore[no-untyped-def]
    missing = []
    for rule in _rules(path):
        expr = rule["expr"]
        for keyword, labels in grouping_labels(expr):
            if keyword not in ("by", "on") or "cluster" in labels:
                continue
            if keyword == "on" and set(labels) <= THRESHOLD_KEYS and "ccl:threshold:" in expr:
                continue
            missing.append(f"{_name(rule)}: {keyword} ({', '.join(labels)})")
        assert "without" not in [k for k, _ in grouping_labels(expr)], (
            f"{_name(rule)}: `without` would keep cluster implicitly"
        )
    assert not missing, "\n".join(missing)


def test_the_check_sees_a_join_without_cluster() -> None:
    labels = grouping_labels("sum by (cluster, node) (x) and on (node) y > on (counter) group_left () ccl:threshold:z")
    assert ("on", ["node"]) in labels and ("by", ["cluster", "node"]) in labels


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_description_queries_select_the_alerts_cluster(path) -> None:  # type: ignore[no-untyped-def]
    """A description that looks up the alert's node, namespace or pod does so in its cluster:
    `{cluster=%q,...}` with `$labels.cluster` (empty on a single cluster: matches series
    without the label)."""
    for rule in _rules(path):
        for text in rule.get("annotations", {}).values():
            # arguments: the alert's labels, a range element's (.Labels.device) or literals
            for call in re.findall(r'printf "((?:[^"\\]|\\.)*)"((?: (?:\$labels\.\w+|\.Labels\.\w+|"[^"]*"))+)', text):
                fmt, args = call[0], call[1].split()
                for selector in _SELECTOR.findall(fmt):
                    if "node=%q" in selector or "namespace=%q" in selector:
                        assert selector.startswith("cluster=%q,"), f"{_name(rule)}: {{{selector}}}"
                assert fmt.count("%q") == len(args), f"{_name(rule)}: {fmt!r} {args}"
                assert args.count("$labels.cluster") == fmt.count("cluster=%q"), f"{_name(rule)}: {fmt!r} {args}"
                for keyword, labels in grouping_labels(fmt):
                    if keyword == "on":
                        assert "cluster" in labels, f"{_name(rule)}: {fmt!r}"


def test_node_level_rules_keep_the_node_they_read() -> None:
    """What a shard can answer alone: every aggregation of the node-level rules keeps `node` or
    `pod` (a pod is on one node), so no output mixes nodes."""
    for rule in _rules(RULES_FILE):
        for keyword, labels in grouping_labels(rule["expr"]):
            if keyword == "by":
                assert {"node", "pod"} & set(labels), f"{_name(rule)}: by ({', '.join(labels)}) mixes nodes"


def test_rules_across_nodes_are_global() -> None:
    """The node counts of jobs, the placement page, the job roll-ups and the exporter-absent alert
    (kube-state-metrics' target with every node's `up`) are in the global file only."""
    global_names = {_name(rule) for rule in _rules(GLOBAL_RULES_FILE)}
    node_names = {_name(rule) for rule in _rules(RULES_FILE)}
    for name in (
        "namespace_job_name:ccl_gpu_pod_nodes:count",
        "CclSuspectedTcpFallback",
        "CclExporterAbsent",
        "job_name:ccl_nccl_nodes:count",
        "CclJobBusBandwidthDegraded",
    ):
        assert name in global_names and name not in node_names, name
    evidences = {
        path.name: {
            rule["expr"].count('"evidence", "log"') + 2 * rule["expr"].count('"evidence", "placement"')
            for rule in _rules(path)
            if rule.get("alert") == "CclNcclTcpFallback"
        }
        for path in RULE_FILES
    }
    assert evidences == {RULES_FILE.name: {1}, GLOBAL_RULES_FILE.name: {2}}, "log evidence per node, placement global"


def test_each_threshold_is_defined_in_the_one_file_that_reads_it() -> None:
    """So no ruler reads a copy another ruler recorded (two copies would break `scalar()` and
    the `on (counter)` joins), and one Prometheus loading both files records each once."""
    defined = {
        path: {r["record"] for r in _rules(path) if r.get("record", "").startswith("ccl:threshold:")}
        for path in RULE_FILES
    }
    assert not defined[RULES_FILE] & defined[GLOBAL_RULES_FILE]
    for path in RULE_FILES:
        read = set().union(*(referenced_names(r["expr"]) for r in _rules(path)))
        read |= {
            name
            for r in _rules(path)
            for text in r.get("annotations", {}).values()
            for name in re.findall(r"ccl:threshold:[a-z_]+", text)
        }
        assert {n for n in read if n.startswith("ccl:threshold:")} <= defined[path], path.name


def test_the_in_job_floor_of_a_scope_is_the_probes_floor() -> None:
    """The global file's in-job floor per scope repeats the node file's probe floor (each file
    defines the thresholds it reads): the two must say the same numbers."""

    def floors(path, name):  # type: ignore[no-untyped-def]
        return {r["labels"]["scope"]: r["expr"] for r in _rules(path) if r.get("record") == name}

    probe = floors(RULES_FILE, "ccl:threshold:probe_bus_bandwidth_floor_bytes_per_second")
    job = floors(GLOBAL_RULES_FILE, "ccl:threshold:job_bus_bandwidth_floor_bytes_per_second")
    assert probe == job and set(probe) == {"inter_node", "intra_node"}


def test_group_names_are_unique_across_both_files() -> None:
    names = [group["name"] for group in groups()]
    assert len(names) == len(set(names)), names


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_a_rule_split_between_groups_carries_its_groups_empty_label(path) -> None:  # type: ignore[no-untyped-def]
    """promtool --lint-fatal takes rules of one name and the same static labels for duplicates:
    each rule whose name is in several groups of a file has `ccl_group_<its group>: ""`, a label
    that no series or alert gets (Prometheus drops empty values), and no other rule has one."""
    owners: dict[str, set[str]] = {}
    for group in yaml.safe_load(path.read_text())["groups"]:
        for rule in group["rules"]:
            owners.setdefault(_name(rule), set()).add(group["name"])
    for group in yaml.safe_load(path.read_text())["groups"]:
        own_label = "ccl_group_" + group["name"].removeprefix("ccl-health-").replace("-", "_")
        for rule in group["rules"]:
            marks = {k: v for k, v in (rule.get("labels") or {}).items() if k.startswith("ccl_group_")}
            if len(owners[_name(rule)]) > 1:
                assert marks == {own_label: ""}, f"{group['name']}: {_name(rule)}"
            else:
                assert marks == {}, f"{group['name']}: {_name(rule)} is in one group only"


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_vmalert_accepts_the_same_rule_text(path) -> None:  # type: ignore[no-untyped-def]
    """No Prometheus-only syntax: vmalert parses every expression and annotation template."""
    vmalert = require_tool("vmalert")
    result = subprocess.run(
        [vmalert, "-dryRun", f"-rule={path}", "-loggerLevel=ERROR"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_five_minute_error_increases_read_the_counters_with_a_threshold() -> None:
    """The RDMA error increases read only the counters that have a threshold (the rest never
    alert): the selector's list and the thresholds' labels are the same set."""
    rules = _rules(RULES_FILE)
    thresholds = {r["labels"]["counter"] for r in rules if r.get("record") == "ccl:threshold:rdma_port_errors_per_hour"}
    exprs = [r["expr"] for r in rules if r.get("record") == "node_counter:ccl_rdma_node_errors:increase5m"]
    selected = [
        counter
        for expr in exprs
        for found in re.findall(r'ccl_rdma_node_errors_total\{counter=~"([^"]+)"\}', expr)
        for counter in found.split("|")
    ]
    assert sorted(selected) == sorted(thresholds) and len(thresholds) == 8, "each counter with a threshold, once"


def test_the_large_collectives_are_the_exporters_size_classes_from_10_mb() -> None:
    """The in-job rules restrict to large collectives by a size-class regex, written out in each
    rule that needs it: each copy names exactly the exporter's classes from 10 MB up, so a class
    added to the exporter cannot slip past the baseline or the busy check."""
    from exporter.nccl.inspector import SIZE_CLASSES

    lower_bounds = [0.0] + [upper for _, upper in SIZE_CLASSES[:-1]]  # a class starts where the last ends
    large = {name for (name, _), lower in zip(SIZE_CLASSES, lower_bounds, strict=True) if lower >= 1e7}
    assert large == {"10MB_100MB", "100MB_1GB", "ge_1GB"}
    copies = [
        set(found.split("|"))
        for path in RULE_FILES
        for rule in _rules(path)
        for found in re.findall(r'size_class=~"([^"]*)"', rule["expr"])
    ]
    assert len(copies) >= 4
    assert all(copy == large for copy in copies), copies


def _recorders(rule_groups) -> dict[str, dict[str, tuple[str, ...]]]:  # type: ignore[no-untyped-def]
    """Each record: the groups that record it, each with the label matchers its rule there
    selects its input by (a record split between groups by a label has one rule per group)."""
    found: dict[str, dict[str, tuple[str, ...]]] = {}
    for group in rule_groups:
        for rule in group["rules"]:
            if "record" in rule:
                matchers = tuple(
                    sorted(m.strip() for s in _SELECTOR.findall(rule["expr"]) for m in s.split(",") if m.strip())
                )
                found.setdefault(str(rule["record"]), {})[group["name"]] = matchers
    return found


def test_records_divided_by_each_other_come_from_one_group() -> None:
    """A bandwidth is bytes over seconds: two records taken by two groups come from different
    instants, and their ratio mixes two windows (a job's 355 GB/s read as 378 GB/s). Every rule
    that divides one recorded series by another reads two records of the same group; where the
    records are split between groups by a label, each group records both for the same values."""
    recorders = _recorders(groups())
    recorded = r"([a-z_]+:[a-z0-9_]+:[a-z0-9_]+)"
    division = re.compile(recorded + r"\{[^}]*\}\)?\s*/\s*(?:sum by \([^)]*\) \()?" + recorded)
    pairs = [
        found.groups() for path in RULE_FILES for rule in _rules(path) for found in division.finditer(rule["expr"])
    ]
    assert len(pairs) >= 2, pairs
    split = [(a, b) for a, b in pairs if a in recorders and b in recorders and recorders[a] != recorders[b]]
    assert not split, split


def test_the_check_sees_a_ratio_of_records_from_two_groups() -> None:
    """The comparison above on the split the end-to-end test caught (the two rates in two
    groups), and on groups that split the collectives differently for the two rates."""

    def rate(record: str, selector: str) -> dict[str, str]:
        return {"record": record, "expr": f"sum by (cluster, node) (rate(x_total{selector}[5m]))"}

    def differ(*rule_groups) -> bool:  # type: ignore[no-untyped-def]
        found = _recorders([{"name": name, "rules": rules} for name, rules in rule_groups])
        return found["n:bytes:rate5m"] != found["n:seconds:rate5m"]

    assert differ(("a", [rate("n:bytes:rate5m", "")]), ("b", [rate("n:seconds:rate5m", "")]))
    assert differ(
        ("a", [rate("n:bytes:rate5m", '{c="x"}'), rate("n:seconds:rate5m", '{c!="x"}')]),
        ("b", [rate("n:bytes:rate5m", '{c!="x"}'), rate("n:seconds:rate5m", '{c="x"}')]),
    )
    assert not differ(
        ("a", [rate("n:bytes:rate5m", '{c="x"}'), rate("n:seconds:rate5m", '{c="x"}')]),
        ("b", [rate("n:bytes:rate5m", '{c!="x"}'), rate("n:seconds:rate5m", '{c!="x"}')]),
    )


def _expressions_by_name(kind: str) -> dict[str, list[str]]:
    """Each record's or alert's (``kind``) expressions in both files, whitespace collapsed."""
    found: dict[str, list[str]] = {}
    for group in groups():
        for rule in group["rules"]:
            if kind in rule:
                found.setdefault(str(rule[kind]), []).append(" ".join(rule["expr"].split()))
    return found


def test_a_record_split_between_groups_covers_each_series_once() -> None:
    """A record written by rules in several groups splits its input by one label: one group
    takes a value (`label="v"`), the other every other (`label!="v"`), and the rules are
    otherwise the same text, so no series is recorded twice (two groups writing one series
    would overwrite each other) and none is left out."""
    split = {
        record: exprs
        for record, exprs in _expressions_by_name("record").items()
        if len(exprs) > 1 and not record.startswith("ccl:threshold:")
    }
    assert split, "no record is split between groups"
    for record, exprs in split.items():
        if all(_PARTITION_MATCHER.search(expr) for expr in exprs):
            continue  # split by node partition: test_the_in_job_rate_groups_read_each_node_once
        assert len(exprs) == 2, (record, exprs)
        assert _covers_each_series_once(*exprs), (record, exprs)


def _covers_each_series_once(first: str, second: str) -> bool:
    """Two rules' expressions take disjoint parts of one input: the same text but for one label,
    which one takes (`label="v"`) and the other leaves (`label!="v"`), or for which each takes
    values of its own (`label=~"a|b"` and `label=~"c|d"`, no value in both)."""
    taken = re.findall(r'([a-z_]+)="([^"]*)"', first)
    if second in [first.replace(f'{label}="{value}"', f'{label}!="{value}"') for label, value in taken]:
        return True
    for label, values in set(re.findall(r'([a-z_]+)=~"([^"]*)"', first)):
        for other in set(re.findall(label + r'=~"([^"]*)"', second)):
            same_text = first.replace(f'{label}=~"{values}"', f'{label}=~"{other}"') == second
            if same_text and not set(values.split("|")) & set(other.split("|")):
                return True
    return False


def test_the_split_check_sees_overlapping_and_unsplit_pairs() -> None:
    rate = 'sum by (node) (increase(x_total{counter=~"%s"}[5m]))'
    assert _covers_each_series_once(rate % "a|b", rate % "c|d")
    assert not _covers_each_series_once(rate % "a|b", rate % "b|c"), "b in both"
    assert _covers_each_series_once('rate(x{c="v"}[5m])', 'rate(x{c!="v"}[5m])')
    assert not _covers_each_series_once('rate(x{c="v"}[5m])', 'rate(x{c="w"}[5m])'), "neither takes the rest"
    assert not _covers_each_series_once('rate(x{c="v"}[5m])', 'rate(y{c!="v"}[5m])'), "another input"


def test_an_alert_in_several_groups_covers_each_series_once() -> None:
    """An alert in several groups: its rules take disjoint parts of the input as split records do,
    or each marks what it found with a label value of its own (`evidence`, `compared_to`), so
    that no alert is raised twice with the same labels; rules with the same mark come in pairs
    that take disjoint parts (CclJobBusBandwidthDegraded: each comparison by collective)."""
    split = {alert: exprs for alert, exprs in _expressions_by_name("alert").items() if len(exprs) > 1}
    assert {"CclNcclTcpFallback", "CclJobBusBandwidthDegraded"} <= set(split)
    for alert, exprs in split.items():
        by_mark: dict[tuple[tuple[str, str], ...], list[str]] = {}
        for expr in exprs:
            by_mark.setdefault(tuple(_MARK.findall(expr)), []).append(expr)
        for mark, same in by_mark.items():
            assert len(same) == 1 or (len(same) == 2 and _covers_each_series_once(*same)), (alert, mark, same)


def test_the_alert_split_check_sees_a_mark_repeated_without_a_split() -> None:
    def rule(mark: str, selector: str) -> str:
        return f'label_replace(x{selector} < 1, "compared_to", "{mark}", "", "")'

    assert _covers_each_series_once(rule("a", '{c="v"}'), rule("a", '{c!="v"}'))
    assert not _covers_each_series_once(rule("a", '{c="v"}'), rule("a", '{c="v"}')), "the same series twice"
    assert _MARK.findall(rule("a", "")) == [("compared_to", "a")]


def _group_names_in(text: str) -> set[str]:
    """Group names a text gives, whole or as a prefix (`ccl-health-probe-daily-*`)."""
    not_groups = {"ccl-health-exporter", "ccl-health-rules", "ccl-health-global-rules"}
    return {name.rstrip("-") for name in re.findall(r"ccl-health-[a-z0-9-]*[a-z0-9]-?\*?", text)} - not_groups


def test_the_group_table_lists_every_group_once_and_the_docs_name_only_groups_that_exist() -> None:
    """docs/alerts.md's table of groups is the rule files' groups; the rule files' comments, the
    alert docs and the runbooks name no group that is gone (scaling.md and the changelog keep
    the names of their time)."""
    names = [str(group["name"]) for group in groups()]
    alerts_doc = (REPO / "docs" / "alerts.md").read_text()
    table = alerts_doc[alerts_doc.index("| group | every | what |") :].split("\n\n", 1)[0]
    assert sorted(re.findall(r"`(ccl-health-[a-z0-9-]+)`", table)) == sorted(names)
    texts = [path.read_text() for path in RULE_FILES] + [alerts_doc]
    texts += [path.read_text() for path in sorted((REPO / "docs" / "runbooks").glob("*.md"))]
    for name in set().union(*(_group_names_in(text) for text in texts)):
        if name.endswith("*"):
            assert any(group.startswith(name[:-1]) for group in names), name
        else:
            assert name in names, name


def _matches(operator: str, value: str, label: str) -> bool:
    """A PromQL label matcher on one value (an absent label is the empty value)."""
    equal = re.fullmatch(value, label) is not None if "~" in operator else value == label
    return equal if operator in ("=", "=~") else not equal


def test_the_in_job_rate_groups_read_each_node_once() -> None:
    """The PodMonitor labels the Inspector's counters with the hash of the node name modulo N
    (``ccl_rule_partition``): every value a counter can carry, none at all (a scrape without
    that relabeling) and a value of another modulus, is read by exactly one of the
    ``ccl-health-job-nodes-*`` groups, and the groups differ only in that matcher."""
    (hashmod,) = [step for step in pod_monitor_endpoint(REPO)["metricRelabelings"] if step["action"] == "hashmod"]
    assert hashmod["targetLabel"] == "ccl_rule_partition" and hashmod["sourceLabels"] == ["node"]
    partition_groups = [g for g in groups() if g["name"].startswith("ccl-health-job-nodes-")]
    matchers = {}
    for group in partition_groups:
        found = {m for rule in group["rules"] for m in _PARTITION_MATCHER.findall(rule["expr"])}
        assert len(found) == 1, (group["name"], found)
        matchers[group["name"]] = found.pop()
    for label in [str(p) for p in range(hashmod["modulus"])] + ["", str(hashmod["modulus"] + 3)]:
        readers = [name for name, (operator, value) in matchers.items() if _matches(operator, value, label)]
        assert len(readers) == 1, (label, readers)
    texts = {tuple(_PARTITION_MATCHER.sub("", rule["expr"]) for rule in group["rules"]) for group in partition_groups}
    assert len(texts) == 1, texts
    read = {name for rule in partition_groups[0]["rules"] for name in referenced_names(rule["expr"])}
    assert {name for name in read if name.endswith("_total")} == {
        "ccl_nccl_collective_seconds_total",
        "ccl_nccl_collective_bus_bytes_total",
    }

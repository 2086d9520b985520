"""Which metric names PromQL expressions use, and which names the project knows.

Known names come from one place: the metric reference, ``docs/metrics.md`` (every backticked
``ccl_*`` name there), plus the recording rules defined in ``alerts/ccl-health-rules.yaml`` and
``alerts/ccl-health-global-rules.yaml``, plus the few outside metrics listed in ``EXTERNAL_METRICS``.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests import yaml_docs

REPO = Path(__file__).resolve().parent.parent
RULES_FILE = REPO / "alerts" / "ccl-health-rules.yaml"  # node-level rules
GLOBAL_RULES_FILE = REPO / "alerts" / "ccl-health-global-rules.yaml"  # rules across nodes
RULE_FILES = (RULES_FILE, GLOBAL_RULES_FILE)
METRICS_DOC = REPO / "docs" / "metrics.md"

# Metrics from outside the exporter that rules may use, each for one reason:
EXTERNAL_METRICS = {
    "up": "Prometheus' own scrape health, for CclExporterAbsent",
    "kube_node_status_capacity": "kube-state-metrics: which nodes have GPUs, for CclExporterAbsent",
    # node_exporter's InfiniBand collector, where our RDMA collector is off (docs/coexistence.md).
    "node_infiniband_info": "node_exporter: the node has RDMA devices, for CclNcclTcpFallback",
    "node_infiniband_state_id": "node_exporter: port states, for the RDMA port counts",
    "node_infiniband_port_data_transmitted_bytes_total": "node_exporter: port bytes, for node RDMA throughput",
    "node_infiniband_port_data_received_bytes_total": "node_exporter: port bytes, for node RDMA throughput",
    # The API server's calls to our admission webhook (k8s.io/apiserver pkg/admission/metrics).
    "apiserver_admission_webhook_fail_open_count": "the API server: calls that failed open, for CclWebhookFailingOpen",
    "apiserver_admission_webhook_request_total": "the API server: every call, for CclWebhookFailingOpen",
    "apiserver_admission_webhook_rejection_count": "the API server: pods refused, for CclWebhookRejectingPods",
}

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
# A ccl_ name, unless a label name: one matched against a string (strings are "" by then).
_CCL_NAME = re.compile(r'(?<![\w:$])(ccl_[a-z0-9_]+)(?![\w:])(?!\s*(?:=~|!~|!=|=)\s*"")')
_RECORDED_NAME = re.compile(r"(?<![\w:$])([a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z0-9_:]+)")
_SELECTOR = re.compile(r"(?<![\w:$])([a-zA-Z_][a-zA-Z0-9_:]*)\s*\{")


def _without_strings(expr: str) -> str:
    return _STRING.sub('""', expr)


def referenced_names(expr: str) -> set[str]:
    """Metric and recording-rule names an expression reads (label values are ignored)."""
    text = _without_strings(expr)
    names = set(_CCL_NAME.findall(text)) | set(_RECORDED_NAME.findall(text))
    names |= {name for name in _SELECTOR.findall(text) if name not in ("by", "without", "on", "ignoring")}
    return names


def documented_metric_names() -> set[str]:
    """Every backticked ``ccl_*`` name of the metric reference, and the series of its histograms
    (a row typed ``histogram``): ``_bucket``, ``_sum`` and ``_count``."""
    text = METRICS_DOC.read_text()
    histograms = re.findall(r"^\| `(ccl_[a-z0-9_]+)` \| histogram \|", text, re.MULTILINE)
    series = {f"{name}{suffix}" for name in histograms for suffix in ("_bucket", "_sum", "_count")}
    return set(re.findall(r"`(ccl_[a-z0-9_]+)`", text)) | series


def groups() -> list[dict]:  # type: ignore[type-arg]
    """Every rule group of both rule files, in file order."""
    return [group for path in RULE_FILES for group in yaml_docs.load(path.read_text())["groups"]]


def rules() -> list[dict]:  # type: ignore[type-arg]
    return [rule for group in groups() for rule in group["rules"]]


def recording_rule_names() -> set[str]:
    return {rule["record"] for rule in rules() if "record" in rule}


def known_names() -> set[str]:
    """What an expression may read: documented metrics, recording rules, the external metrics."""
    return documented_metric_names() | recording_rule_names() | set(EXTERNAL_METRICS)


def unknown_names(expr: str, known: set[str] | None = None) -> set[str]:
    """The names ``expr`` reads that are not ``known`` (by default ``known_names()``: pass it in when
    checking many expressions, it reads the docs and both rule files)."""
    return referenced_names(expr) - (known_names() if known is None else known)


# A PromQL expression as tokens: strings, range/subquery brackets, label-matcher braces, numbers
# and durations, names (with colons, as recording rules have), and single characters.
_TOKEN = re.compile(
    r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\''
    r"|\[[^\]]*\]"
    r'|\{(?:[^{}"\']|"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\')*\}'
    r"|\d[\w.]*"
    r"|[A-Za-z_:][A-Za-z0-9_:]*"
    r"|\S"
)
_GROUPING = ("by", "without", "on", "ignoring", "group_left", "group_right")
_OPERATOR_WORDS = {"and", "or", "unless", "bool", "offset", "atan2"}


def vector_selectors(expr: str) -> list[tuple[str, str]]:
    """Every vector selector of ``expr`` as (metric name or "", its ``{...}`` or "")."""
    tokens = _TOKEN.findall(expr)
    found = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        following = tokens[i + 1] if i + 1 < len(tokens) else ""
        if token in _GROUPING:
            i = tokens.index(")", i) + 1 if following == "(" else i + 1  # a label list, not selectors
            continue
        if token.startswith("{"):
            found.append(("", token))
        elif (
            re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*", token)
            and token not in _OPERATOR_WORDS
            and following not in ("(", "by", "without")
        ):  # a call or an aggregation, not a selector
            if following.startswith("{"):
                found.append((token, following))
                i += 1
            else:
                found.append((token, ""))
        i += 1
    return found


def grouping_labels(expr: str) -> list[tuple[str, list[str]]]:
    """Every ``by``/``without``/``on``/``ignoring``/``group_left``/``group_right`` list of ``expr``."""
    tokens = _TOKEN.findall(expr)
    found = []
    for i, token in enumerate(tokens):
        if token in _GROUPING and i + 1 < len(tokens) and tokens[i + 1] == "(":
            end = tokens.index(")", i)
            found.append((token, [t for t in tokens[i + 2 : end] if t != ","]))
    return found

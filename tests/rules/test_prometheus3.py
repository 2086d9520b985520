"""The rules and dashboards under Prometheus 3 (kube-prometheus-stack ships 3.x).

No Prometheus 3 can be installed where these tests run: Debian carries 2.x only (bookworm 2.42,
trixie 2.53), and neither PyPI nor npm, the other registries reachable here, ships its binaries.
So the promtool checks of 3.x run where one is given (``CCL_PROMETHEUS3_PROMTOOL``, or a 3.x
``promtool`` first on PATH) and are skipped, saying so, elsewhere; and the points of Prometheus'
migration guide (docs/migration.md, 2.x to 3.0) that can change what a rule or a panel answers
are checked on the text:

- ``le`` and ``quantile`` label values are normalised to floats (``"1"`` becomes ``"1.0"``): a
  string matcher on them matches nothing any more;
- ``.`` in a regular expression matches a newline;
- range selectors are left-open: ``x[1h]`` on a series recorded once an hour holds one sample,
  not two, and a range shorter than the series' interval may hold none; a subquery whose range
  equals its step gives one point;
- ``holt_winters`` is ``double_exponential_smoothing``, behind a feature flag.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from tests.conftest import REPO
from tests.promql_names import RULE_FILES, groups

DASHBOARDS = sorted((REPO / "dashboards").glob("*.json"))
RULE_TESTS = sorted((REPO / "alerts" / "tests").glob("*.yaml"))
NO_PROMETHEUS_3 = (
    "no Prometheus 3 here: Debian carries 2.x only and no reachable registry (PyPI, npm) ships its "
    "binaries; set CCL_PROMETHEUS3_PROMTOOL to a 3.x promtool to run these (docs/deploy.md)"
)
_DURATION = re.compile(r"(\d+)([smhdw])")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
# A range selector on a name (with or without matchers), or a subquery's range and step.
_RANGE = re.compile(r"(?<![\w:])([a-zA-Z_][\w:]*)\s*(?:\{[^{}]*\})?\[(\d+[smhdw])\]")
_SUBQUERY = re.compile(r"\[(\d+[smhdw]):(\d+[smhdw])\]")
_STRING_MATCHER = re.compile(r'\b(le|quantile)\s*(=|!=)\s*"([^"]*)"')
_REGEX_MATCHER = re.compile(r'\b\w+\s*(?:=~|!~)\s*"((?:[^"\\]|\\.)*)"')


def _seconds(duration: str) -> int:
    return sum(int(n) * _SECONDS[unit] for n, unit in _DURATION.findall(duration))


def _promtool_3() -> str | None:
    candidates = [os.environ.get("CCL_PROMETHEUS3_PROMTOOL", ""), shutil.which("promtool") or ""]
    for candidate in filter(None, candidates):
        done = subprocess.run([candidate, "--version"], capture_output=True, text=True, timeout=30)
        if re.search(r"version 3\.", done.stdout + done.stderr):
            return candidate
    return None


def _expressions() -> list[tuple[str, str]]:
    """(where, expr) of every rule and every dashboard query."""
    found = [(f"rule {r.get('record') or r.get('alert')}", r["expr"]) for g in groups() for r in g["rules"]]
    for path in DASHBOARDS:
        text = json.loads(path.read_text())
        for panel in text.get("panels", []):
            for target in panel.get("targets", []):
                if target.get("expr"):
                    found.append((f"{path.name}: {panel.get('title')}", target["expr"]))
    assert len(found) > 150
    return found


def test_promtool_3_checks_the_rules_and_runs_their_tests() -> None:
    promtool = _promtool_3()
    if promtool is None:
        pytest.skip(NO_PROMETHEUS_3)
    check = subprocess.run(
        [promtool, "check", "rules", "--lint-fatal", *map(str, RULE_FILES)], capture_output=True, text=True, timeout=120
    )
    assert check.returncode == 0, check.stdout + check.stderr
    unit = subprocess.run(
        [promtool, "test", "rules", *map(str, RULE_TESTS)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO / "alerts" / "tests",
    )
    assert unit.returncode == 0, unit.stdout + unit.stderr


def test_no_string_matcher_on_le_or_quantile() -> None:
    """Prometheus 3 writes `le` and `quantile` as floats: `le="1"` would match nothing."""
    found = [(where, m.group(0)) for where, expr in _expressions() for m in _STRING_MATCHER.finditer(expr)]
    assert found == []


def test_the_le_check_sees_an_integer_bucket() -> None:
    assert _STRING_MATCHER.search('histogram_quantile(0.9, x_bucket{le="1"})')


def test_no_regex_dot_that_would_also_match_a_newline() -> None:
    """In Prometheus 3 `.` matches a newline too: only `.*`/`.+` (which match everything anyway)
    and escaped dots are used."""
    dots = []
    for where, expr in _expressions():
        for pattern in _REGEX_MATCHER.findall(expr):
            bare = re.sub(r"\\\\\.|\\\.|\.\*|\.\+", "", pattern)
            if "." in bare:
                dots.append((where, pattern))
    assert dots == []


def test_no_function_renamed_in_prometheus_3() -> None:
    assert [where for where, expr in _expressions() if "holt_winters" in expr] == []


def test_ranges_hold_a_sample_with_left_open_ranges() -> None:
    """A range over one of our records spans at least the interval it is recorded at (in
    Prometheus 3 a shorter one may hold no sample at all), and a subquery's range is at least
    twice its step (one equal to its step gives one point)."""
    default = 30  # the evaluation interval the docs and the rule tests use
    interval = {}
    for group in groups():
        seconds = _seconds(group.get("interval", "")) or default
        for rule in group["rules"]:
            if "record" in rule:
                interval[rule["record"]] = max(interval.get(rule["record"], 0), seconds)
    short, subqueries = [], []
    for where, expr in _expressions():
        for name, duration in _RANGE.findall(expr):
            if name in interval and _seconds(duration) < interval[name]:
                short.append((where, name, duration))
        for window, step in _SUBQUERY.findall(expr):
            if _seconds(window) < 2 * _seconds(step):
                subqueries.append((where, window, step))
    assert short == [] and subqueries == []
    assert any(interval[name] == 3600 for name in interval), "the check knows the hourly records"


def test_the_range_check_sees_a_short_range_and_a_one_point_subquery() -> None:
    assert _RANGE.findall('max_over_time(node:x:max1h{node="a"}[30m])') == [("node:x:max1h", "30m")]
    assert _SUBQUERY.findall("sum_over_time(x[5m:5m])") == [("5m", "5m")]


def test_the_docs_say_which_prometheus_versions_are_tested() -> None:
    deploy = (REPO / "docs" / "deploy.md").read_text()
    assert "Prometheus 3" in deploy and "CCL_PROMETHEUS3_PROMTOOL" in deploy
    matrix = [row for row in deploy.splitlines() if row.startswith("| Prometheus, promtool |")]
    assert len(matrix) == 1 and "3." in matrix[0]

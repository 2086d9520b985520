"""CONTRIBUTING's recipe for adding a collector, kept true: the files it names are few and every
registered collector has them, and a collector known only by its spec reaches the command line
and the Helm chart without a hand edit of either (``make chart-files`` writes the chart's part)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_python import Chart

from devtools import chart_files
from exporter.collectors import all_collectors
from exporter.collectors.base import CollectorSpec
from exporter.flags import Flag
from tests.conftest import REPO
from tests.manifests.test_helm_chart import NAMESPACE, RELEASE, container, objects_of

MAX_RECIPE_FILES = 6


def _recipe() -> str:
    text = (REPO / "CONTRIBUTING.md").read_text()
    start = text.index("## Adding a collector")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def _recipe_files() -> list[str]:
    """The file each numbered step of the recipe names first (``1. **The source**, `path`: ...``)."""
    numbered = re.findall(r"^\d+\. .*$", _recipe(), flags=re.M)
    steps = [re.match(r"\d+\. \*\*[^*]+\*\*, `([^`]+)`", line) for line in numbered]
    assert numbered and all(steps), "each step reads '1. **What**, `file`: ...'"
    return [step.group(1) for step in steps if step]


def test_the_recipe_names_few_files_and_the_command_that_writes_the_rest() -> None:
    files = _recipe_files()
    assert len(set(files)) == len(files), "each step has its own file"
    assert len(files) <= MAX_RECIPE_FILES, files
    assert "make chart-files" in _recipe()


@pytest.mark.parametrize("spec", all_collectors(), ids=lambda spec: spec.name)
def test_every_registered_collector_has_what_the_recipe_asks_for(spec: CollectorSpec) -> None:
    for template in _recipe_files():
        path = re.sub(r"<(?!name>)[a-z]+>", "*", template.replace("<name>", spec.name))
        candidates = list(REPO.glob(path)) if "*" in path else [REPO / path]
        if path.endswith(".py") and "*" not in path:  # a collector may be a package: collectors/<name>/
            candidates.append(REPO / path.removesuffix(".py") / "__init__.py")
        assert any(candidate.exists() for candidate in candidates), f"{spec.name}: no {path}"
    headings = re.findall(r"^## .*$", (REPO / "docs" / "metrics.md").read_text(), flags=re.M)
    assert any(f"`{spec.name}`" in heading for heading in headings), f"docs/metrics.md has no section for {spec.name}"


def _example_spec(default_enabled: bool) -> CollectorSpec:
    return CollectorSpec(
        name="example",
        help="an example collector that only exists in this test",
        default_enabled=default_enabled,
        factory=lambda settings, resources: pytest.fail("never built here"),
        flags=(Flag("--collector.example.depth", 3, "how deep the example reads", dest="example_depth", type=int),),
        flag_group="example collector",
        settings=lambda args: int(args.example_depth),
    )


def _chart_with(specs: tuple[CollectorSpec, ...], folder: Path) -> Path:
    """A copy of the chart with what ``make chart-files`` would write for ``specs``."""
    copy = folder / "chart"
    shutil.copytree(chart_files.CHART, copy, ignore=shutil.ignore_patterns("files"))
    for path, content in chart_files.wanted(specs).items():
        if path.is_relative_to(chart_files.CHART_FILES):
            continue  # the rules and dashboards: not what this test is about
        (copy / path.relative_to(chart_files.CHART)).write_bytes(content)
    (copy / "files" / "dashboards").mkdir(parents=True)
    for name in ("ccl-health-rules.yaml", "ccl-health-global-rules.yaml"):
        shutil.copy(chart_files.CHART_FILES / name, copy / "files" / name)
    return copy


def _daemonset_args(chart: Path, values: dict[str, Any]) -> list[str]:
    with Chart.load(chart) as loaded:
        rendered = loaded.render(values, name=RELEASE, namespace=NAMESPACE)
    return [str(arg) for arg in container(objects_of(rendered))["args"]]


@pytest.mark.parametrize("default_enabled", [True, False], ids=["on-by-default", "off-by-default"])
def test_a_collector_known_only_by_its_spec_reaches_the_flags_and_the_chart(
    default_enabled: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    specs = (*all_collectors(), _example_spec(default_enabled))
    import exporter.commands.serve as serve
    from exporter.commands import build_parser

    monkeypatch.setattr(serve, "all_collectors", lambda: specs)
    args = build_parser(environ={}).parse_args(["serve", "--collector.example.depth=5"])
    config = serve.config_from_args(args, specs)
    assert ("example" in config.enabled_collectors) is default_enabled
    assert specs[-1].settings(args) == 5
    switched = serve.config_from_args(
        build_parser(environ={}).parse_args(
            ["serve", "--no-collector.example" if default_enabled else "--collector.example"]
        ),
        specs,
    )
    assert ("example" in switched.enabled_collectors) is not default_enabled

    chart = _chart_with(specs, tmp_path)
    values = yaml.safe_load((chart / "values.yaml").read_text())
    assert values["collectors"]["example"] is default_enabled
    flag_on, flag_off = "--collector.example", "--no-collector.example"
    assert flag_on not in _daemonset_args(chart, {}) and flag_off not in _daemonset_args(chart, {}), (
        "the chart passes no switch where the value is the exporter's default"
    )
    flipped = _daemonset_args(chart, {"collectors": {"example": not default_enabled}})
    assert (flag_off if default_enabled else flag_on) in flipped
    with pytest.raises(Exception, match="example"):  # the schema takes the switch's type from the registry
        _daemonset_args(chart, {"collectors": {"example": "yes"}})

"""Write what the Helm chart holds of the rest of the repository: ``python -m devtools.chart_files``.

Helm reads no file outside a chart's folder, so ``manifests/helm/ccl-health-exporter/files/``
holds copies of ``alerts/ccl-health-rules.yaml``, ``alerts/ccl-health-global-rules.yaml`` and
``dashboards/*.json``, byte for byte. The chart's collector switches (the ``collectors:`` block of
``values.yaml``, its part of ``values.schema.json`` and, in ``templates/_collectors.tpl``, which
collectors are off unless switched on) are written from the exporter's collector
registry (``exporter.collectors.all_collectors``), so that a new collector needs no hand edit of
the chart. Run this after ``alerts/sync.py``, ``dashboards/generate.py`` or adding a collector;
``--check`` only reports drift (exit 1), which is what the tests run (``make chart-files`` writes).
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

from exporter.collectors import all_collectors
from exporter.collectors.base import CollectorSpec

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "manifests" / "helm" / "ccl-health-exporter"
CHART_FILES = CHART / "files"
VALUES = CHART / "values.yaml"
SCHEMA = CHART / "values.schema.json"
COLLECTORS_TEMPLATE = CHART / "templates" / "_collectors.tpl"
_COLLECTORS_HEAD = "# Each collector on (true) or off (false)"
# Chart-only remarks on a collector's switch, after its help text.
_VALUE_NOTES = {"rdma": "off when node_exporter's infiniband collector is kept instead (docs/coexistence.md)"}
# Switches that follow another value (unset by default, and checked against it when set).
_FOLLOWERS = {
    "lifecycle": (
        "Follows lifecycle.enabled (below), which also installs the RBAC the hooks write with: leave it "
        "unset. When set, it must agree with lifecycle.enabled (the render fails otherwise).",
        "Follows lifecycle.enabled; when set, must agree with it.",
    )
}
_WIDTH = 100


def collector_values(specs: Sequence[CollectorSpec]) -> str:
    """The ``collectors:`` block of ``values.yaml``, with its comment, for ``specs``."""
    lines = [
        f"{_COLLECTORS_HEAD}: --collector.<name> / --no-collector.<name>.",
        "# Written from the exporter's collector registry by `make chart-files`.",
    ]
    for spec in specs:
        if spec.name in _FOLLOWERS:
            continue
        text = f"{spec.name}: {spec.help}" + (f"; {_VALUE_NOTES[spec.name]}" if spec.name in _VALUE_NOTES else "")
        lines += textwrap.wrap(
            text + ".", _WIDTH - 2, initial_indent="# ", subsequent_indent="#   ", break_on_hyphens=False
        )
    lines.append("collectors:")
    for spec in specs:
        if spec.name in _FOLLOWERS:
            lines += textwrap.wrap(
                _FOLLOWERS[spec.name][0], _WIDTH - 4, initial_indent="  # ", subsequent_indent="  # "
            )
            lines.append(f"  {spec.name}: null")
        else:
            lines.append(f"  {spec.name}: {'true' if spec.default_enabled else 'false'}")
    return "\n".join(lines) + "\n"


def with_collector_values(values: str, specs: Sequence[CollectorSpec]) -> str:
    """``values`` (the text of values.yaml) with its ``collectors:`` block written for ``specs``."""
    start = values.index(_COLLECTORS_HEAD)
    end = values.index("\n\n", values.index("\ncollectors:\n", start)) + 1
    return values[:start] + collector_values(specs) + values[end:]


def with_collector_schema(schema: str, specs: Sequence[CollectorSpec]) -> str:
    """``schema`` (the text of values.schema.json) with ``collectors`` allowing exactly ``specs``."""
    document = json.loads(schema)
    properties: dict[str, object] = {}
    for spec in specs:
        if spec.name in _FOLLOWERS:
            properties[spec.name] = {"type": ["boolean", "null"], "description": _FOLLOWERS[spec.name][1]}
        else:
            properties[spec.name] = {"type": "boolean"}
    document["properties"]["collectors"]["properties"] = properties
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def collectors_template(specs: Sequence[CollectorSpec]) -> str:
    """``templates/_collectors.tpl``: the collectors that are off unless switched on, for the DaemonSet's
    switches (a flag only where the value differs from the exporter's default)."""
    off = " ".join(spec.name for spec in specs if not spec.default_enabled)
    return (
        "{{- /* Written from the exporter's collector registry by `make chart-files`: the collectors that are\n"
        "off unless --collector.<name> switches them on, space-separated. */}}\n"
        '{{- define "ccl.collectorsOffByDefault" -}}\n'
        f"{off}\n"
        "{{- end }}\n"
    )


def wanted(specs: Sequence[CollectorSpec] | None = None) -> dict[Path, bytes]:
    """Every file of the chart written from elsewhere, with its content (``specs``: the registry's)."""
    specs = all_collectors() if specs is None else specs
    copies = {
        CHART_FILES / name: (REPO / "alerts" / name).read_bytes()
        for name in ("ccl-health-rules.yaml", "ccl-health-global-rules.yaml")
    }
    for dashboard in sorted((REPO / "dashboards").glob("*.json")):
        copies[CHART_FILES / "dashboards" / dashboard.name] = dashboard.read_bytes()
    copies[VALUES] = with_collector_values(VALUES.read_text(), specs).encode()
    copies[SCHEMA] = with_collector_schema(SCHEMA.read_text(), specs).encode()
    copies[COLLECTORS_TEMPLATE] = collectors_template(specs).encode()
    return copies


def stale(copies: dict[Path, bytes]) -> list[Path]:
    """Copies that are missing or differ, and files in ``files/`` that nothing copies."""
    drift = [path for path, content in copies.items() if not path.is_file() or path.read_bytes() != content]
    extra = [path for path in sorted(CHART_FILES.rglob("*")) if path.is_file() and path not in copies]
    return drift + extra


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report drift, change nothing")
    args = parser.parse_args(argv)
    copies = wanted()
    drift = stale(copies)
    if args.check:
        for path in drift:
            print(f"{path.relative_to(REPO)} is out of date: run python -m devtools.chart_files", file=sys.stderr)
        return 1 if drift else 0
    for path in drift:
        if path in copies:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(copies[path])
            print(f"wrote {path.relative_to(REPO)}")
        else:
            path.unlink()
            print(f"removed {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

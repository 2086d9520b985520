"""Copy the rules and dashboards into the Helm chart: ``python -m devtools.chart_files``.

Helm reads no file outside a chart's folder, so ``manifests/helm/ccl-health-exporter/files/``
holds copies of ``alerts/ccl-health-rules.yaml``, ``alerts/ccl-health-global-rules.yaml`` and
``dashboards/*.json``, byte for byte. Run this after ``alerts/sync.py`` or
``dashboards/generate.py``; ``--check`` only reports drift (exit 1), which is what the tests run
(``make chart-files`` does the copy).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "manifests" / "helm" / "ccl-health-exporter"
CHART_FILES = CHART / "files"


def wanted() -> dict[Path, bytes]:
    """Every file the chart's ``files/`` must hold, with its content."""
    copies = {
        CHART_FILES / name: (REPO / "alerts" / name).read_bytes()
        for name in ("ccl-health-rules.yaml", "ccl-health-global-rules.yaml")
    }
    for dashboard in sorted((REPO / "dashboards").glob("*.json")):
        copies[CHART_FILES / "dashboards" / dashboard.name] = dashboard.read_bytes()
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

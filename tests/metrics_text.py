"""Helpers for reading /metrics text in tests."""

from __future__ import annotations

import re
import subprocess

from prometheus_client.parser import text_string_to_metric_families

from devtools.stack import PROMETHEUS_SCRAPE_HEADERS

# Families whose values change from run to run; dropped before golden comparisons.
VOLATILE = re.compile(r"^(process_|python_|ccl_exporter_collector_duration_seconds|ccl_exporter_build_info)")
# Accept headers that ask for OpenMetrics: what Prometheus sends by default (2.49 and later
# weigh its scrape_protocols with q values; 3.x adds the escaping it wants; before 2.49 it sent
# a fixed header), and an OpenMetrics request without a version.
OPENMETRICS_ACCEPTS = (
    PROMETHEUS_SCRAPE_HEADERS["Accept"],
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;version=0.0.1;"
    "q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
    "application/openmetrics-text;version=1.0.0;escaping=underscores;q=0.6,*/*;q=0.2",
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "application/openmetrics-text",
)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} of an exposition."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(text: str, name: str, **labels: str) -> float | None:
    return samples(text).get((name, tuple(sorted(labels.items()))))


def stable_lines(text: str) -> str:
    """The exposition without volatile families (their HELP/TYPE lines included)."""
    kept = []
    for line in text.splitlines():
        bare = line.split(" ", 3)[2] if line.startswith("# ") and len(line.split(" ")) > 2 else line
        if VOLATILE.match(bare):
            continue
        kept.append(line)
    return "\n".join(kept) + "\n"


def promtool_check_metrics(promtool: str, text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)


def scrape_collectors(*collectors: object) -> str:
    """The exposition of an umbrella over ``collectors`` (no process metrics), as a scrape sees it."""
    from prometheus_client.exposition import generate_latest

    from exporter.collectors.umbrella import UmbrellaCollector, build_registry

    umbrella = UmbrellaCollector(list(collectors))  # type: ignore[arg-type]
    try:
        return generate_latest(build_registry(umbrella, process_metrics=False)).decode()
    finally:
        umbrella.close()

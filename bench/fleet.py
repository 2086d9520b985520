"""A simulated fleet: N ``python -m ccl_sim serve`` nodes on loopback, one Prometheus with our rules.

Measures what a Prometheus operator sizes for: series per node, scrape duration, rule
evaluation time (``prometheus_rule_group_last_duration_seconds``), head series and
Prometheus memory, and the exporters' own CPU and memory. ``docs/scaling.md`` extrapolates
these to 1,000 and 10,000 nodes.

    python -m bench.fleet --nodes 32 --seconds 60

Everything listens on 127.0.0.1 and is stopped (PIDs waited for) before it returns.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import BenchResult
from bench.proc import process_cpu_seconds, process_rss_bytes
from devtools.stack import SCRAPE_JOB, Intervals, Stack, find_rule_files, start_exporters, stop_all


@dataclass
class FleetMeasurement:
    nodes: int
    seconds: float
    scrape_interval: float
    series_per_node: float
    samples_per_scrape: float
    head_series: float
    scrape_duration_p50: float
    scrape_duration_max: float
    rule_groups: dict[str, float]  # group -> last evaluation duration (s)
    slowest_rules: list[tuple[str, float]]  # (rule name, last evaluation duration (s)), slowest first
    biggest_families: list[tuple[str, float]]  # (metric name, series on one node), biggest first
    rule_count: int
    recording_series: float
    prometheus_rss: int
    prometheus_cpu_seconds: float
    exporter_rss_mean: float
    exporter_cpu_share: float  # CPU-seconds per second per exporter


def measure(nodes: int = 32, seconds: float = 60.0, scrape_interval: float = 5.0) -> FleetMeasurement:
    rules = find_rule_files()
    # The simulator writes every counter file on each tick; tick with the scrape, not every second.
    exporters = start_exporters(nodes, extra_args=[f"--tick={scrape_interval:g}"])
    try:
        with tempfile.TemporaryDirectory(prefix="ccl-fleet-") as workdir:
            intervals = Intervals(scrape_seconds=scrape_interval, evaluation_seconds=scrape_interval)
            with Stack(
                Path(workdir),
                [e.target for e in exporters],
                rule_files=rules,
                intervals=intervals,
                alerting=False,
            ) as stack:
                prometheus = stack.prometheus
                assert prometheus is not None and prometheus.pid is not None
                prometheus.wait_targets_up(nodes, timeout=60.0 + nodes)
                exporter_cpu_before = {e.node: process_cpu_seconds(e.pid) for e in exporters if e.pid}
                started = time.monotonic()
                time.sleep(seconds)
                elapsed = time.monotonic() - started
                exporter_cpu = [
                    (process_cpu_seconds(e.pid) - exporter_cpu_before[e.node]) / elapsed for e in exporters if e.pid
                ]
                exporter_rss = [process_rss_bytes(e.pid) for e in exporters if e.pid]
                job = f'job="{SCRAPE_JOB}"'
                per_node = prometheus.values(f"count by (node) ({{{job}}})")
                samples = prometheus.values(f"scrape_samples_scraped{{{job}}}")
                durations = sorted(prometheus.values(f"scrape_duration_seconds{{{job}}}"))
                groups = prometheus.rule_groups()
                families = prometheus.query(f'topk(8, count by (__name__) ({{{job}, node="{exporters[0].node}"}}))')
                recording = prometheus.values('count({__name__=~".+:.+"})') or [0.0]
                head = _own_metric(prometheus.url, "prometheus_tsdb_head_series")
                return FleetMeasurement(
                    nodes=nodes,
                    seconds=elapsed,
                    scrape_interval=scrape_interval,
                    series_per_node=statistics.mean(per_node),
                    samples_per_scrape=statistics.mean(samples),
                    head_series=head,
                    scrape_duration_p50=statistics.median(durations),
                    scrape_duration_max=durations[-1],
                    rule_groups={g["name"]: float(g.get("evaluationTime", 0.0)) for g in groups},
                    slowest_rules=sorted(
                        ((r["name"], float(r.get("evaluationTime", 0.0))) for g in groups for r in g.get("rules", [])),
                        key=lambda item: -item[1],
                    )[:8],
                    biggest_families=sorted(
                        ((f["metric"]["__name__"], float(f["value"][1])) for f in families), key=lambda item: -item[1]
                    ),
                    rule_count=sum(len(g.get("rules", [])) for g in groups),
                    recording_series=recording[0],
                    prometheus_rss=process_rss_bytes(prometheus.pid),
                    prometheus_cpu_seconds=process_cpu_seconds(prometheus.pid),
                    exporter_rss_mean=statistics.mean(exporter_rss),
                    exporter_cpu_share=statistics.mean(exporter_cpu),
                )
    finally:
        stop_all(exporters)


def _own_metric(prometheus_url: str, name: str) -> float:
    """A gauge from Prometheus' own /metrics (it does not scrape itself here)."""
    import urllib.request

    with urllib.request.urlopen(prometheus_url + "/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0


def run(nodes: int = 32, seconds: float = 60.0) -> BenchResult:
    m = measure(nodes, seconds)
    rule_ms = sum(m.rule_groups.values()) * 1000
    bytes_per_series = m.prometheus_rss / max(m.head_series, 1)
    groups = "\n".join(f"| group `{name}` | {value * 1000:.2f} |" for name, value in sorted(m.rule_groups.items()))
    families = "\n".join(f"| `{name}` | {count:.0f} |" for name, count in m.biggest_families)
    groups += "\n" + "\n".join(f"| rule `{name}` | {value * 1000:.2f} |" for name, value in m.slowest_rules)
    markdown = f"""
{m.nodes} simulated nodes (one `python -m ccl_sim serve` process each, 8 IB + 2 RoCE ports and
whatever simulated parts the build has; simulator ticking every scrape interval) on 127.0.0.1, scraped every {m.scrape_interval:g} s by one
Prometheus {"with our rules" if m.rule_count else "(no rule file found)"}, measured after {m.seconds:.0f} s on a
2-core machine that also runs all the exporters.

| measure | value |
|---|---|
| series per node (`count by (node)`) | {m.series_per_node:.0f} |
| samples per scrape | {m.samples_per_scrape:.0f} |
| Prometheus head series | {m.head_series:.0f} |
| recording-rule output series | {m.recording_series:.0f} |
| scrape duration p50 / max | {m.scrape_duration_p50 * 1000:.1f} ms / {m.scrape_duration_max * 1000:.1f} ms |
| rules loaded | {m.rule_count} |
| rule evaluation, all groups (last) | {rule_ms:.2f} ms |
| Prometheus RSS | {m.prometheus_rss / 2**20:.0f} MiB ({bytes_per_series / 1024:.1f} KiB per head series, incl. the process baseline) |
| exporter RSS (mean) | {m.exporter_rss_mean / 2**20:.1f} MiB |
| exporter CPU (mean, simulator included) | {m.exporter_cpu_share * 100:.1f} % of a core |

| metric (series on one node, largest first) | series |
|---|---|
{families}

| rule group, and the slowest rules | last evaluation (ms) |
|---|---|
{groups or "| (none) | |"}
"""
    return BenchResult(
        title=f"Simulated fleet ({m.nodes} nodes, one Prometheus)",
        command=f"python -m bench.fleet --nodes {m.nodes} --seconds {seconds:g}",
        peer="none: a sizing measurement (docs/scaling.md extrapolates it)",
        ratio=None,
        summary=f"{m.series_per_node:.0f} series per node; rule evaluation {rule_ms:.2f} ms for "
        f"{m.head_series:.0f} head series; Prometheus RSS {m.prometheus_rss / 2**20:.0f} MiB.",
        markdown=markdown,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args(argv)
    if not 1 <= args.nodes <= 256:
        parser.error("--nodes must be 1..256 (each node is a process on this machine)")
    print(run(args.nodes, args.seconds).section())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

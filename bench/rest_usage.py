"""Exporter memory, CPU and scrape time at rest, against node_exporter on the same node, in the same run.

For 7 and then 16 RDMA ports (NDR, laid out by the simulator once, then left still), both
exporters read the same sysfs tree, run side by side and are scraped in turn at the same pace
for the same time; we compare resident memory after the run, CPU seconds used during it and the
median time a scrape took. ccl-exporter runs its default collectors, pointed at empty pod-log,
NCCL and probe folders and at no kubelet socket (a node with no training job); node_exporter
runs only its infiniband collector (the part of it that does the same job).

    python -m bench.rest_usage --seconds 30 --scrape-interval 1 --ports 7 16
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.common import BenchResult
from bench.proc import process_cpu_seconds, process_rss_bytes
from bench.scrape_rdma import PORT_COUNTS, build_tree
from devtools.stack import free_loopback_port, stop_process, wait_answering

NODE_EXPORTER = "prometheus-node-exporter"
GOAL_RSS_MIB = 80.0  # dcgm-exporter holds 200-450 MB; a maintained HTTP server is worth its megabytes
# What the exporter's process holds before any of its own code: the libraries it serves with.
SERVING_STACK = ("asyncio", "aiohttp.web", "prometheus_client")


@dataclass
class Usage:
    """One exporter's use of the machine over a run."""

    rss_bytes: int
    cpu_seconds: float
    scrape_ms: float  # median wall time of one scrape (connect, request, whole body)
    body_bytes: int


@dataclass
class RestRun:
    ports: int
    ours: Usage
    peer: Usage

    @property
    def rss_ratio(self) -> float:
        return self.ours.rss_bytes / self.peer.rss_bytes


def _scrape(url: str) -> tuple[float, int]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=10) as response:
        size = len(response.read())
    return (time.perf_counter() - started) * 1000, size


def _measure(commands: dict[str, list[str]], urls: dict[str, str], seconds: float, interval: float) -> dict[str, Usage]:
    """Start every command, let them settle, scrape each in turn every ``interval`` for ``seconds``."""
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, argv in commands.items():
            procs[name] = subprocess.Popen(
                argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL
            )
        for name, proc in procs.items():
            if not wait_answering(urls[name], proc, commands[name][0], 30.0):
                raise TimeoutError(f"{commands[name][0]} did not answer")
        time.sleep(1.0)
        cpu_before = {name: process_cpu_seconds(proc.pid) for name, proc in procs.items()}
        times: dict[str, list[float]] = {name: [] for name in procs}
        sizes = dict.fromkeys(procs, 0)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for name in procs:
                elapsed_ms, sizes[name] = _scrape(urls[name])
                times[name].append(elapsed_ms)
            time.sleep(interval)
        return {
            name: Usage(
                process_rss_bytes(proc.pid),
                process_cpu_seconds(proc.pid) - cpu_before[name],
                statistics.median(times[name]),
                sizes[name],
            )
            for name, proc in procs.items()
        }
    finally:
        for proc in procs.values():
            stop_process(proc)


def import_rss_bytes(modules: Sequence[str]) -> int:
    """Resident memory of an idle interpreter (this one's executable) that imported ``modules``."""
    script = f"import sys\nfor m in {list(modules)!r}: __import__(m)\nprint('ready', flush=True)\nsys.stdin.read()"
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        return process_rss_bytes(proc.pid)
    finally:
        stop_process(proc)


def measure(ports: int, seconds: float, interval: float, node_exporter: str) -> RestRun:
    with tempfile.TemporaryDirectory(prefix="ccl-rest-") as workdir:
        root = Path(workdir)
        sysfs = build_tree(root / "node", ports)
        ours_port, peer_port = free_loopback_port(), free_loopback_port()
        commands = {
            "ours": [
                sys.executable,
                "-m",
                "exporter",
                "serve",
                f"--web.listen-address=127.0.0.1:{ours_port}",
                f"--path.sysfs={sysfs}",
                f"--path.pod-logs={root / 'pods'}",
                f"--path.nccl-debug-files={root / 'nccl'}",
                f"--path.state={root / 'state'}",
                f"--path.pod-resources={root / 'no-kubelet.sock'}",
                f"--path.probe-results={root / 'probe'}",
                "--log.level=error",
            ],
            "peer": [
                node_exporter,
                f"--web.listen-address=127.0.0.1:{peer_port}",
                f"--path.sysfs={sysfs}",
                "--collector.disable-defaults",
                "--collector.infiniband",
                "--log.level=error",
            ],
        }
        urls = {"ours": f"http://127.0.0.1:{ours_port}/metrics", "peer": f"http://127.0.0.1:{peer_port}/metrics"}
        usage = _measure(commands, urls, seconds, interval)
    return RestRun(ports, usage["ours"], usage["peer"])


def _rows(run: RestRun, seconds: float, scrapes: float) -> str:
    ours, peer = run.ours, run.peer

    def cpu(usage: Usage) -> str:
        return f"{usage.cpu_seconds:.2f} s ({usage.cpu_seconds / seconds * 100:.2f} % of a core)"

    return (
        f"| {run.ports} | resident memory after the run | {ours.rss_bytes / 2**20:.1f} MiB | "
        f"{peer.rss_bytes / 2**20:.1f} MiB | {run.rss_ratio:.2f} |\n"
        f"| {run.ports} | CPU during the run | {cpu(ours)} | {cpu(peer)} | "
        f"{ours.cpu_seconds / max(peer.cpu_seconds, 0.01):.2f} |\n"
        f"| {run.ports} | CPU per scrape | {ours.cpu_seconds / scrapes * 1000:.1f} ms | "
        f"{peer.cpu_seconds / scrapes * 1000:.1f} ms | |\n"
        f"| {run.ports} | median scrape time | {ours.scrape_ms:.2f} ms | {peer.scrape_ms:.2f} ms | "
        f"{ours.scrape_ms / peer.scrape_ms:.2f} |\n"
        f"| {run.ports} | /metrics size | {ours.body_bytes / 1024:.1f} KiB | {peer.body_bytes / 1024:.1f} KiB | |\n"
    )


def run(seconds: float = 30.0, scrape_interval: float = 1.0, ports: Sequence[int] = PORT_COUNTS) -> BenchResult:
    node_exporter = shutil.which(NODE_EXPORTER)
    if node_exporter is None:
        raise FileNotFoundError(f"{NODE_EXPORTER} is not installed (apt-get install prometheus-node-exporter)")
    runs = [measure(count, seconds, scrape_interval, node_exporter) for count in ports]
    bare, stack = import_rss_bytes([]), import_rss_bytes(SERVING_STACK)
    peer_rss = min(r.peer.rss_bytes for r in runs)
    scrapes = seconds / scrape_interval
    markdown = (
        f"Same still sysfs tree per row group (NDR ports), both exporters running side by side and scraped in "
        f"turn every {scrape_interval:g} s for {seconds:g} s (~{scrapes:.0f} scrapes each, a new connection "
        "per scrape).\n\n"
        "| ports | | ccl-exporter (default collectors) | node_exporter 1.x (`--collector.infiniband` only) | ratio |\n"
        "|---|---|---|---|---|\n"
        + "".join(_rows(r, seconds, scrapes) for r in runs)
        + f"""
Where our resident memory goes: an idle interpreter holds {bare / 2**20:.1f} MiB, and one that only
imported what the exporter serves with (`{"`, `".join(SERVING_STACK)}`; asyncio loads ssl and
OpenSSL) {stack / 2**20:.1f} MiB, {stack / peer_rss:.2f}x node_exporter's whole process, before any
of the exporter's own code, collectors or data. The goal is at most {GOAL_RSS_MIB:g} MiB RSS. CPU is
counted in kernel clock ticks (10 ms at 100 Hz), so short runs round.
"""
    )
    rss = ", ".join(
        f"{r.ours.rss_bytes / 2**20:.1f} MiB vs {r.peer.rss_bytes / 2**20:.1f} MiB "
        f"(**{r.rss_ratio:.2f}x**) at {r.ports} ports"
        for r in runs
    )
    cpu = ", ".join(
        f"{r.ours.cpu_seconds / scrapes * 1000:.1f} ms vs {r.peer.cpu_seconds / scrapes * 1000:.1f} ms" for r in runs
    )
    scrape = ", ".join(f"{r.ours.scrape_ms / r.peer.scrape_ms:.2f}x" for r in runs)
    return BenchResult(
        title="Exporter memory and CPU at rest vs node_exporter",
        command=(
            f"python -m bench.rest_usage --seconds {seconds:g} --scrape-interval {scrape_interval:g} "
            f"--ports {' '.join(map(str, ports))}"
        ),
        peer="prometheus-node-exporter (infiniband collector) on the same sysfs tree",
        ratio=max(r.rss_ratio for r in runs),
        summary=f"RSS {rss} (goal: at most {GOAL_RSS_MIB:g} MiB); CPU per scrape {cpu}; median scrape time {scrape}.",
        markdown=markdown,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--scrape-interval", type=float, default=1.0)
    parser.add_argument("--ports", type=int, nargs="+", default=list(PORT_COUNTS))
    args = parser.parse_args(argv)
    print(run(args.seconds, args.scrape_interval, args.ports).section())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Exporter memory and CPU at rest, against node_exporter on the same node, in the same run.

Both read the same sysfs tree (8 InfiniBand + 2 RoCE ports laid out by the simulator once,
then left still), both are scraped at the same pace for the same time, and we compare
resident memory after the run and CPU seconds used during it. ccl-exporter runs its default
collectors, pointed at empty pod-log, NCCL and probe folders (a node with no training job);
node_exporter runs only its infiniband collector (the part of it that does the same job).

    python -m bench.rest_usage --seconds 30 --scrape-interval 1
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.common import BenchResult
from bench.proc import process_cpu_seconds, process_rss_bytes
from devtools.stack import free_loopback_port, stop_process, wait_answering
from exporter.sim.node import default_node
from exporter.sim.rdma import SimRdma

NODE_EXPORTER = "prometheus-node-exporter"


def _still_node(root: Path) -> Path:
    """A sysfs tree with RDMA ports and counters that no longer move."""
    node = default_node(root)
    node.parts = [part for part in node.parts if isinstance(part, SimRdma)]
    node.setup()
    node.advance(10.0)
    return node.sysfs


def _measure(argv: list[str], url: str, seconds: float, interval: float) -> tuple[int, float, int]:
    """Start, let it settle, scrape every ``interval`` for ``seconds``: (RSS bytes, CPU s, bytes per scrape)."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        if not wait_answering(url, proc, argv[0], 30.0):
            raise TimeoutError(f"{argv[0]} did not answer")
        time.sleep(1.0)
        cpu_before = process_cpu_seconds(proc.pid)
        size = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            with urllib.request.urlopen(url, timeout=10) as response:
                size = len(response.read())
            time.sleep(interval)
        return process_rss_bytes(proc.pid), process_cpu_seconds(proc.pid) - cpu_before, size
    finally:
        stop_process(proc)


def run(seconds: float = 30.0, scrape_interval: float = 1.0) -> BenchResult:
    node_exporter = shutil.which(NODE_EXPORTER)
    if node_exporter is None:
        raise FileNotFoundError(f"{NODE_EXPORTER} is not installed (apt-get install prometheus-node-exporter)")
    with tempfile.TemporaryDirectory(prefix="ccl-rest-") as workdir:
        root = Path(workdir)
        sysfs = _still_node(root / "node")
        ours_port, peer_port = free_loopback_port(), free_loopback_port()
        ours = _measure(
            [sys.executable, "-m", "exporter", "serve", f"--web.listen-address=127.0.0.1:{ours_port}",
             f"--path.sysfs={sysfs}", f"--path.pod-logs={root / 'pods'}",
             f"--path.nccl-debug-files={root / 'nccl'}", f"--path.state={root / 'state'}",
             f"--path.pod-resources={root / 'no-kubelet.sock'}", f"--path.probe-results={root / 'probe'}",
             "--log.level=error"],
            f"http://127.0.0.1:{ours_port}/metrics", seconds, scrape_interval,
        )
        peer = _measure(
            [node_exporter, f"--web.listen-address=127.0.0.1:{peer_port}", f"--path.sysfs={sysfs}",
             "--collector.disable-defaults", "--collector.infiniband", "--log.level=error"],
            f"http://127.0.0.1:{peer_port}/metrics", seconds, scrape_interval,
        )
    (our_rss, our_cpu, our_size), (peer_rss, peer_cpu, peer_size) = ours, peer
    scrapes = seconds / scrape_interval
    markdown = f"""
Same still sysfs tree (10 RDMA ports), scraped every {scrape_interval:g} s for {seconds:g} s (~{scrapes:.0f} scrapes).

| | ccl-exporter (default collectors) | node_exporter 1.x (`--collector.infiniband` only) | ratio |
|---|---|---|---|
| resident memory after the run | {our_rss / 2**20:.1f} MiB | {peer_rss / 2**20:.1f} MiB | {our_rss / peer_rss:.2f} |
| CPU during the run | {our_cpu:.2f} s ({our_cpu / seconds * 100:.2f} % of a core) | {peer_cpu:.2f} s ({peer_cpu / seconds * 100:.2f} % of a core) | {our_cpu / max(peer_cpu, 0.01):.2f} |
| CPU per scrape | {our_cpu / scrapes * 1000:.1f} ms | {peer_cpu / scrapes * 1000:.1f} ms | |
| /metrics size | {our_size / 1024:.1f} KiB | {peer_size / 1024:.1f} KiB | |

ccl-exporter is a CPython process (interpreter, aiohttp, client_python, kubernetes client): its
floor is the interpreter's, not the work. The design target is well under 100 MB RSS.
CPU is counted in kernel clock ticks (10 ms at 100 Hz), so short runs round.
"""
    return BenchResult(
        title="Exporter memory and CPU at rest vs node_exporter",
        command=f"python -m bench.rest_usage --seconds {seconds:g} --scrape-interval {scrape_interval:g}",
        peer="prometheus-node-exporter (infiniband collector) on the same sysfs tree",
        ratio=our_rss / peer_rss,
        summary=f"RSS {our_rss / 2**20:.1f} MiB vs {peer_rss / 2**20:.1f} MiB ({our_rss / peer_rss:.2f}x); "
        f"CPU {our_cpu / scrapes * 1000:.1f} ms vs {peer_cpu / scrapes * 1000:.1f} ms per scrape.",
        markdown=markdown,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--scrape-interval", type=float, default=1.0)
    args = parser.parse_args(argv)
    print(run(args.seconds, args.scrape_interval).section())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""/metrics latency on a 7-port and a 16-port RDMA node: ccl-exporter vs node_exporter's infiniband collector.

For each port count, both read the same generated sysfs tree (NDR ports with full counters/ and
hw_counters/) and are scraped alternately over keep-alive loopback connections, so machine noise
hits both. Ratio = our median latency / node_exporter's median latency (goal: within 1.5x at
both port counts; the headline ratio is the worse of the two).
"""

from __future__ import annotations

import argparse
import http.client
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.common import BenchResult
from devtools.stack import PROMETHEUS_SCRAPE_HEADERS

REPO = Path(__file__).resolve().parent.parent
PORT_COUNTS = (7, 16)
GOAL_RATIO = 1.5


def build_tree(root: Path, ports: int) -> Path:
    from ccl_sim.node import SimulatedNode
    from ccl_sim.rdma import SimPortSpec, SimRdma

    node = SimulatedNode(root=root)
    specs = [
        SimPortSpec(f"mlx5_{i}", "InfiniBand", "400 Gb/sec (4X NDR)", 40e9, f"ib{i}", "MT_0000000838", "MT4129")
        for i in range(ports)
    ]
    node.parts.append(SimRdma(rng=random.Random(1), ports=specs))
    node.setup()
    node.advance(1.0)
    return node.sysfs


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/metrics", headers=PROMETHEUS_SCRAPE_HEADERS)
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing answered on port {port}")


def scrape_ms(conn: http.client.HTTPConnection) -> tuple[float, int]:
    t0 = time.perf_counter()
    conn.request("GET", "/metrics", headers=PROMETHEUS_SCRAPE_HEADERS)
    response = conn.getresponse()
    body = response.read()
    return (time.perf_counter() - t0) * 1000, len(body)


def measure(scrapes: int, ports: int) -> dict[str, object]:
    node_exporter = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if not node_exporter:
        raise SystemExit("prometheus-node-exporter is not installed (apt-get install prometheus-node-exporter)")
    tmp = Path(tempfile.mkdtemp(prefix="bench-rdma-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        sysfs = build_tree(tmp, ports)
        ours_port, theirs_port = free_port(), free_port()
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "exporter",
                    "serve",
                    "--path.sysfs",
                    str(sysfs),
                    "--collector.disable-defaults",
                    "--collector.rdma",
                    "--web.listen-address",
                    f"127.0.0.1:{ours_port}",
                    "--log.level",
                    "warning",
                ],
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        procs.append(
            subprocess.Popen(
                [
                    node_exporter,
                    f"--path.sysfs={sysfs}",
                    "--collector.disable-defaults",
                    "--collector.infiniband",
                    f"--web.listen-address=127.0.0.1:{theirs_port}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        wait_ready(ours_port)
        wait_ready(theirs_port)
        ours_conn = http.client.HTTPConnection("127.0.0.1", ours_port, timeout=10)
        theirs_conn = http.client.HTTPConnection("127.0.0.1", theirs_port, timeout=10)
        for _ in range(5):  # warm-up
            scrape_ms(ours_conn)
            scrape_ms(theirs_conn)
        ours, theirs = [], []
        ours_bytes = theirs_bytes = 0
        for index in range(scrapes):  # which goes first alternates: the order alone moves a median
            if index % 2:
                ms, theirs_bytes = scrape_ms(theirs_conn)
                theirs.append(ms)
            ms, ours_bytes = scrape_ms(ours_conn)
            ours.append(ms)
            if not index % 2:
                ms, theirs_bytes = scrape_ms(theirs_conn)
                theirs.append(ms)
        return {
            "ports": ports,
            "scrapes": scrapes,
            "ours_median": statistics.median(ours),
            "ours_p90": statistics.quantiles(ours, n=10)[-1],
            "theirs_median": statistics.median(theirs),
            "theirs_p90": statistics.quantiles(theirs, n=10)[-1],
            "ours_bytes": ours_bytes,
            "theirs_bytes": theirs_bytes,
        }
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


def _ratio(m: dict[str, object]) -> float:
    return float(m["ours_median"]) / float(m["theirs_median"])  # type: ignore[arg-type]


def run(scrapes: int = 200, ports: Sequence[int] = PORT_COUNTS) -> BenchResult:
    runs = [measure(scrapes, count) for count in ports]
    rows = "".join(
        f"| {m['ports']} | ccl-exporter (rdma collector) | {m['ours_median']:.2f} | {m['ours_p90']:.2f} | "
        f"{m['ours_bytes']} | {_ratio(m):.2f} |\n"
        f"| {m['ports']} | node_exporter (infiniband collector) | {m['theirs_median']:.2f} | {m['theirs_p90']:.2f} | "
        f"{m['theirs_bytes']} | |\n"
        for m in runs
    )
    table = (
        "| ports | exporter | median ms | p90 ms | body bytes | ratio |\n|---|---|---|---|---|---|\n"
        + rows
        + f"\nNDR ports, {scrapes} alternating keep-alive scrapes each on loopback per port count, each exporter "
        "first in every other round, with the headers Prometheus sends (OpenMetrics first, gzip; node_exporter "
        "answers in the text format); body bytes as sent, gzipped; both bodies "
        "include the exporter's own process metrics. Ours also carries hw_counters/ and the info/netdev facts "
        "that node_exporter does not read."
    )
    ratios = ", ".join(f"**{_ratio(m):.2f}x** at {m['ports']} ports" for m in runs)
    return BenchResult(
        title="RDMA scrape latency vs node_exporter",
        command=f"python -m bench.scrape_rdma --scrapes {scrapes} --ports {' '.join(map(str, ports))}",
        peer="prometheus-node-exporter (Debian) --collector.infiniband on the same sysfs tree",
        ratio=max(_ratio(m) for m in runs),
        summary=f"Median /metrics latency ratio ours/node_exporter: {ratios} (goal: within {GOAL_RATIO:g}x).",
        markdown=table,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--ports", type=int, nargs="+", default=list(PORT_COUNTS))
    args = parser.parse_args()
    print(run(args.scrapes, args.ports).section())


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()

"""/metrics under hostile tenants: the label-size attack and 1,000 half-open connections.

The real exporter (``python -m exporter serve --collector.disable-defaults --collector.nccl``)
runs twice on a pod-log tree of one pod with 4 containers whose NCCL logs init 64
communicators each. In the hostile tree every communicator's init says
``Using network <60 KB of text>`` (the attack that gave a 15.4 MB page); in the clean tree,
the peer, it says ``Using network IB``. For each: the /metrics page size (plain and gzip),
and the exporter's peak RSS (``VmHWM``) before and after rounds of 4 concurrent scrapes.
Then, on the hostile exporter, the time one scrape takes while 1,000 connections that never
finish their request headers are held open, against the same scrape with none.

    python -m bench.hostile_http [--rounds 5] [--half-open 1000]
"""

from __future__ import annotations

import argparse
import gzip
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.common import BenchResult
from devtools.stack import free_loopback_port, stop_process, wait_answering
from exporter.collectors.nccl import EXPORTER_PARSER_LIMITS, NcclLimits

STAMP = "2026-03-01T10:00:00.123456789Z"
POD_FOLDER = "training_attack-worker-0_0b7c5a1e-1111-2222-3333-444455556666"
CONTAINERS = 4
COMMUNICATORS = 64
ATTACK_NETWORK_BYTES = 60_000
# What the exporter keeps of them: the parser's communicator cap per stream, the series cap per pod.
EXPOSED = min(
    CONTAINERS * min(COMMUNICATORS, EXPORTER_PARSER_LIMITS.max_communicators),
    NcclLimits().max_communicator_series_per_pod,
)
HALF_OPEN_REQUEST = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n"  # the blank line never comes


def _cri(message: str) -> str:
    return f"{STAMP} stdout F {message}\n"


def write_tree(root: Path, network_of: Callable[[int, int], str]) -> None:
    """<root>/pods/<ns>_<pod>_<uid>/<container>/0.log: NCCL init of 64 communicators per container."""
    for container in range(CONTAINERS):
        folder = root / "pods" / POD_FOLDER / f"trainer-{container}"
        folder.mkdir(parents=True)
        lines = []
        pid = 100 + container
        prefix = f"attack-worker-0:{pid}:{pid} [0] NCCL INFO "
        lines.append(_cri(prefix + "NCCL version 2.21.5+cuda12.4"))
        for comm in range(COMMUNICATORS):
            pointer = f"0x55d4{container:02x}{comm:06x}"
            comm_id = f"0x{container:02x}{comm:014x}"
            lines += [
                _cri(prefix + f"Using network {network_of(container, comm)}"),
                _cri(
                    prefix + f"ncclCommInitRank comm {pointer} rank 0 nranks 16 cudaDev 0 nvmlDev 0 busId 18000 "
                    f"commId {comm_id} - Init START"
                ),
                _cri(prefix + f"comm {pointer} rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0"),
                _cri(
                    prefix + f"ncclCommInitRank comm {pointer} rank 0 nranks 16 cudaDev 0 nvmlDev 0 busId 18000 "
                    f"commId {comm_id} - Init COMPLETE"
                ),
            ]
        (folder / "0.log").write_text("".join(lines))


def hostile_network(container: int, comm: int) -> str:
    return f"c{container}-{comm}-" + "X" * ATTACK_NETWORK_BYTES


def clean_network(container: int, comm: int) -> str:
    return "IB"


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _scrape(url: str, encoding: str = "identity") -> tuple[bytes, float]:
    request = urllib.request.Request(url, headers={"Accept-Encoding": encoding})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=60) as response:
        body = response.read()
    return body, time.perf_counter() - started


def _concurrent_scrapes(url: str, clients: int, rounds: int) -> None:
    for _ in range(rounds):
        threads = [threading.Thread(target=_scrape, args=(url,)) for _ in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


def _wait_ingested(url: str, timeout: float) -> int:
    """Scrape until every communicator is exposed; return how many series the page shows."""
    deadline = time.monotonic() + timeout
    seen = 0
    while time.monotonic() < deadline:
        page = _scrape(url)[0].decode("utf-8", "replace")
        seen = sum(1 for line in page.splitlines() if line.startswith("ccl_nccl_communicator_info{"))
        if seen >= EXPOSED:
            return seen
        time.sleep(0.5)
    raise TimeoutError(f"only {seen} of {EXPOSED} communicators exposed after {timeout:g} s")


@dataclass
class Measured:
    series: int
    page_bytes: int
    gzip_bytes: int
    hwm_before_kib: int
    hwm_after_kib: int
    rss_after_kib: int
    scrape_seconds: float
    scrape_with_half_open_seconds: float | None = None
    half_open_still_open: int | None = None


def _hold_half_open(port: int, count: int) -> list[socket.socket]:
    held = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(HALF_OPEN_REQUEST)
        held.append(sock)
    return held


def _still_open(sockets: list[socket.socket]) -> int:
    """How many of ``sockets`` the server has not closed (no EOF or reset waiting)."""
    open_count = 0
    for sock in sockets:
        sock.setblocking(False)
        try:
            open_count += 1 if sock.recv(1, socket.MSG_PEEK) else 0
        except BlockingIOError:
            open_count += 1
        except OSError:
            pass
    return open_count


def _median_scrape(url: str, times: int = 5) -> float:
    return statistics.median(_scrape(url)[1] for _ in range(times))


def measure(tree: Path, rounds: int, half_open: int) -> Measured:
    port = free_loopback_port()
    url = f"http://127.0.0.1:{port}/metrics"
    argv = [
        sys.executable,
        "-m",
        "exporter",
        "serve",
        "--collector.disable-defaults",
        "--collector.nccl",
        f"--path.pod-logs={tree / 'pods'}",
        f"--path.nccl-debug-files={tree / 'nccl'}",
        f"--path.state={tree / 'state'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=error",
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        if not wait_answering(url, proc, "ccl-exporter", 60.0):
            raise TimeoutError("ccl-exporter did not answer")
        series = _wait_ingested(url, 120.0)
        page = _scrape(url)[0]
        zipped = _scrape(url, "gzip")[0]
        assert gzip.decompress(zipped).count(b"\n") == page.count(b"\n")
        hwm_before = _status_kib(proc.pid, "VmHWM")
        _concurrent_scrapes(url, 4, rounds)
        result = Measured(
            series,
            len(page),
            len(zipped),
            hwm_before,
            _status_kib(proc.pid, "VmHWM"),
            _status_kib(proc.pid, "VmRSS"),
            _median_scrape(url),
        )
        if half_open:
            held = _hold_half_open(port, half_open)
            try:
                result.scrape_with_half_open_seconds = _median_scrape(url)
                time.sleep(0.2)
                result.half_open_still_open = _still_open(held)
            finally:
                for sock in held:
                    sock.close()
        return result
    finally:
        stop_process(proc)


def _raise_open_file_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(needed, hard), hard))


def run(rounds: int = 5, half_open: int = 1000) -> BenchResult:
    _raise_open_file_limit(half_open + 256)
    with tempfile.TemporaryDirectory(prefix="ccl-bench-hostile-") as workdir:
        root = Path(workdir)
        write_tree(root / "hostile", hostile_network)
        write_tree(root / "clean", clean_network)
        log_bytes = sum(p.stat().st_size for p in (root / "hostile").rglob("0.log"))
        hostile = measure(root / "hostile", rounds, half_open)
        clean = measure(root / "clean", rounds, 0)
    mib = 1 / 2**20
    page_ratio = hostile.page_bytes / clean.page_bytes
    rss_ratio = hostile.hwm_after_kib / clean.hwm_after_kib
    assert hostile.scrape_with_half_open_seconds is not None and hostile.half_open_still_open is not None
    stall_ratio = hostile.scrape_with_half_open_seconds / hostile.scrape_seconds
    markdown = f"""
One pod, {CONTAINERS} containers, {COMMUNICATORS} communicators each ({CONTAINERS * COMMUNICATORS} in all):
the hostile logs ({log_bytes * mib:.1f} MiB) say `Using network <{ATTACK_NETWORK_BYTES // 1000} KB of text>` for
every communicator, the clean ones `Using network IB`. Peak RSS is `VmHWM` of the exporter
process: after ingest, and after {rounds} rounds of 4 concurrent scrapes.

| | hostile tree | clean tree (peer) | ratio |
|---|---|---|---|
| communicator series exposed | {hostile.series} | {clean.series} | |
| /metrics page, plain | {hostile.page_bytes / 1024:.1f} KiB | {clean.page_bytes / 1024:.1f} KiB | {page_ratio:.2f} |
| /metrics page, gzip | {hostile.gzip_bytes / 1024:.1f} KiB | {clean.gzip_bytes / 1024:.1f} KiB | {hostile.gzip_bytes / clean.gzip_bytes:.2f} |
| peak RSS after ingest | {hostile.hwm_before_kib / 1024:.1f} MiB | {clean.hwm_before_kib / 1024:.1f} MiB | {hostile.hwm_before_kib / clean.hwm_before_kib:.2f} |
| peak RSS after 4 concurrent scrapes | {hostile.hwm_after_kib / 1024:.1f} MiB | {clean.hwm_after_kib / 1024:.1f} MiB | {rss_ratio:.2f} |
| median scrape | {hostile.scrape_seconds * 1000:.1f} ms | {clean.scrape_seconds * 1000:.1f} ms | {hostile.scrape_seconds / clean.scrape_seconds:.2f} |

Half-open connections (hostile exporter, default `--web.max-connections` 64): {half_open}
connections that sent `GET /metrics` without the blank line ending the headers, held while
scraping. A scrape took {hostile.scrape_with_half_open_seconds * 1000:.1f} ms (median of 5) against
{hostile.scrape_seconds * 1000:.1f} ms with none ({stall_ratio:.2f}x); {hostile.half_open_still_open} of
the {half_open} were still open afterwards (each new connection past the cap closes the least
recently active idle one; the rest are closed after `--web.read-header-timeout`).

gzip: the hostile page is {hostile.page_bytes / hostile.gzip_bytes:.1f}x smaller compressed,
the clean one {clean.page_bytes / clean.gzip_bytes:.1f}x (Prometheus asks for gzip).
"""
    return BenchResult(
        title="/metrics under hostile tenants (label-size attack, half-open connections)",
        command=f"python -m bench.hostile_http --rounds {rounds} --half-open {half_open}",
        peer=f"the same exporter on a clean tree of the same size ({CONTAINERS * COMMUNICATORS} communicators, "
        "`Using network IB`), same run",
        ratio=page_ratio,
        summary=f"Hostile page {hostile.page_bytes / 1024:.0f} KiB vs clean {clean.page_bytes / 1024:.0f} KiB "
        f"({page_ratio:.2f}x; the unbounded page was ~15 MB); peak RSS {hostile.hwm_after_kib / 1024:.0f} MiB vs "
        f"{clean.hwm_after_kib / 1024:.0f} MiB ({rss_ratio:.2f}x); a scrape with {half_open} half-open connections "
        f"held: {hostile.scrape_with_half_open_seconds * 1000:.0f} ms ({stall_ratio:.2f}x of none).",
        markdown=markdown,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--half-open", type=int, default=1000)
    args = parser.parse_args(argv)
    print(run(args.rounds, args.half_open).section())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

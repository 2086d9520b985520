"""/metrics under hostile clients and tenants, against node_exporter under the same attacks.

Hostile clients: for each attack, ccl-exporter (``serve`` with its default collectors) and
node_exporter (Debian's ``prometheus-node-exporter --collector.infiniband``) read the same RDMA
sysfs tree (7 NDR ports), each with the same ``--web.config.file`` (plain, TLS, basic auth,
rate limit), a real Prometheus scrapes both every 2 s (timeout 2 s), and the attack (see
bench/http_attacks.py) runs against both at once for ``--seconds``. Per attack and exporter:
the fraction of scrapes Prometheus got (``up``), the median and worst scrape duration, peak
RSS (``VmHWM`` of a process started for that attack) and what the exporter logged meanwhile.
The first row, "at rest", has no attack; its latency ratio is the median of alternating
keep-alive scrapes of both with the headers Prometheus sends, each going first in every other
round.

Hostile tenants (the label-size attack): the exporter with only its nccl collector runs twice
on a pod-log tree of one pod with 4 containers whose NCCL logs init 64 communicators each. In
the hostile tree every communicator's init says ``Using network <60 KB of text>`` (the attack
that gave a 15.4 MB page); in the clean tree, the peer, it says ``Using network IB``. For
each: the /metrics page size (plain and gzip), and peak RSS before and after rounds of 4
concurrent scrapes.

    python -m bench.hostile_http [--seconds 60] [--attacks pipeline tls-stall ...] [--rounds 5] [--no-labels]
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.common import BenchResult
from bench.http_attacks import (
    PARTIAL_CLIENT_HELLO,
    Attack,
    HeldConnections,
    Malformed,
    Oversized,
    PipelineNoRead,
    Probe,
    Requests,
    basic_auth,
    wrong_passwords,
)
from bench.scrape_rdma import build_tree
from devtools.stack import (
    PROMETHEUS_SCRAPE_HEADERS,
    Prometheus,
    find_binary,
    free_loopback_port,
    stop_process,
    wait_answering,
)
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


def _median_scrape(url: str, times: int = 5) -> float:
    return statistics.median(_scrape(url)[1] for _ in range(times))


def measure_labels(tree: Path, rounds: int) -> Measured:
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
        return Measured(
            series,
            len(page),
            len(zipped),
            hwm_before,
            _status_kib(proc.pid, "VmHWM"),
            _status_kib(proc.pid, "VmRSS"),
            _median_scrape(url),
        )
    finally:
        stop_process(proc)


# --- hostile clients, against node_exporter -------------------------------------------------------

NODE_EXPORTER = "prometheus-node-exporter"
SCRAPE_SECONDS = 2.0
USER, PASSWORD = "prometheus", "scrape-secret"
POD_MEMORY_LIMIT = Path(__file__).resolve().parent.parent / "manifests" / "base" / "daemonset.yaml"
GOAL_REST_RATIO = 1.5
GOAL_FLOOD_LATENCY_RATIO = 3.0


@dataclass(frozen=True)
class Scenario:
    key: str  # --attacks name
    label: str  # table row
    web: str  # plain | tls | auth | rate-limit
    attack: Callable[[], Attack] | None


SCENARIOS = (
    Scenario("rest", "at rest (no attack)", "plain", None),
    Scenario("pipeline", "64 clients pipeline GET /metrics, never read", "plain", lambda: PipelineNoRead("pipeline")),
    Scenario(
        "tls-stall",
        "3,000 TLS connections stalled mid-handshake",
        "tls",
        lambda: HeldConnections("tls-stall", connections=3000, first=PARTIAL_CLIENT_HELLO),
    ),
    Scenario(
        "bcrypt",
        "16 threads of wrong passwords (bcrypt cost 10)",
        "auth",
        lambda: Requests("bcrypt", threads=16, authorization=wrong_passwords(USER)),
    ),
    Scenario(
        "malformed",
        "malformed heads (`Content-Length: ²`, CL+TE, ...), 4 threads",
        "plain",
        lambda: Malformed("malformed"),
    ),
    Scenario(
        "slowloris",
        "1,000 slowloris connections (a header line a second)",
        "plain",
        lambda: HeldConnections(
            "slowloris", connections=1000, first=b"GET /metrics HTTP/1.1\r\nHost: x\r\n", drip=b"X-a: b\r\n"
        ),
    ),
    Scenario(
        "flood", "connection flood: 4,000 idle connections", "plain", lambda: HeldConnections("flood", connections=4000)
    ),
    Scenario("oversized", "oversized heads and a 1 GiB body, 4 threads", "plain", lambda: Oversized("oversized")),
    Scenario(
        "rate-limit",
        "8 anonymous threads exhaust rate_limit (auth on)",
        "rate-limit",
        lambda: Requests("rate-limit", threads=8),
    ),
)


@dataclass
class Side:
    """What one exporter did during one scenario."""

    up: float = float("nan")
    scrapes: int = 0
    median_scrape: float = float("nan")
    max_scrape: float = float("nan")
    peak_rss_kib: int = 0
    log_bytes: int = 0
    attacker: dict[str, int] = field(default_factory=dict)
    probe_idle: float = float("nan")  # authenticated scrape, median seconds, before the attack
    probe_attack: float = float("nan")  # ... and during it
    health_ok: float = float("nan")  # fraction of health probes answered 200 during the attack


@dataclass
class ScenarioResult:
    scenario: Scenario
    ours: Side
    peer: Side
    rest_ratio: float | None = None


def _pod_memory_limit_mib() -> float:
    for document in yaml.safe_load_all(POD_MEMORY_LIMIT.read_text()):
        for container in (document or {}).get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            if container.get("name") == "exporter":
                limit = str(container["resources"]["limits"]["memory"])
                return float(limit.removesuffix("Mi"))
    raise ValueError(f"no exporter memory limit in {POD_MEMORY_LIMIT}")


def _certificate(folder: Path) -> tuple[Path, Path]:
    openssl = find_binary(("openssl",))
    if openssl is None:
        raise FileNotFoundError("openssl is not installed")
    cert, key = folder / "server.crt", folder / "server.key"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


def _web_config(web: str, cert: Path, key: Path, hashed: str, *, peer: bool) -> dict[str, Any]:
    config: dict[str, Any] = {}
    if web == "tls":
        config["tls_server_config"] = {"cert_file": str(cert), "key_file": str(key)}
    if web in ("auth", "rate-limit"):
        config["basic_auth_users"] = {USER: hashed}
    if web == "rate-limit" and not peer:  # node_exporter 1.5's exporter-toolkit has no rate_limit
        config["rate_limit"] = {"burst": 10, "interval": "200ms"}
    return config


def _status(pid: int, field_name: str) -> int:
    try:
        return _status_kib(pid, field_name)
    except OSError:
        return 0


def _wait_listening(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listens on {port}")


def _scrape_job(name: str, port: int, web: str) -> dict[str, Any]:
    job: dict[str, Any] = {"job_name": name, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
    if web == "tls":
        job["scheme"] = "https"
        job["tls_config"] = {"insecure_skip_verify": True}
    if web in ("auth", "rate-limit"):
        job["basic_auth"] = {"username": USER, "password": PASSWORD}
    return job


def _query_one(prometheus: Prometheus, expr: str) -> float:
    values = prometheus.values(expr)
    return values[0] if values else float("nan")


def _rest_ratio(ours_port: int, peer_port: int, scrapes: int = 200) -> float:
    """Median /metrics latency of ours over the peer's, over keep-alive scrapes of one and then the
    other, 10 ms apart, each with the headers Prometheus sends (OpenMetrics first, gzip). Which
    goes first alternates: the first scrape after a pause and the one right after the other
    server's differ by a tenth of a millisecond or more, either way."""
    connections = [http.client.HTTPConnection("127.0.0.1", port, timeout=10) for port in (ours_port, peer_port)]
    times: list[list[float]] = [[], []]
    for index in range(scrapes + 10):
        pairs = list(zip(connections, times, strict=True))
        for connection, seen in pairs if index % 2 == 0 else reversed(pairs):
            started = time.perf_counter()
            connection.request("GET", "/metrics", headers=PROMETHEUS_SCRAPE_HEADERS)
            connection.getresponse().read()
            if index >= 10:  # warm-up
                seen.append(time.perf_counter() - started)
        time.sleep(0.01)
    return statistics.median(times[0]) / statistics.median(times[1])


class _RssWatch:
    """Largest VmRSS of some processes, sampled every 0.1 s (the attack's processes live on)."""

    def __init__(self, pids: list[int]) -> None:
        self.peak = dict.fromkeys(pids, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.1):
            for pid in self.peak:
                self.peak[pid] = max(self.peak[pid], _status(pid, "VmRSS"))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def run_scenario(scenario: Scenario, sysfs: Path, workdir: Path, seconds: float, node_exporter: str) -> ScenarioResult:
    folder = workdir / scenario.key
    folder.mkdir()
    cert, key = _certificate(folder)
    import bcrypt

    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10)).decode()
    ports = {"ours": free_loopback_port(), "peer": free_loopback_port()}
    configs = {}
    for name in ports:
        configs[name] = folder / f"web-{name}.yml"
        configs[name].write_text(yaml.safe_dump(_web_config(scenario.web, cert, key, hashed, peer=name == "peer")))
    argv = {
        "ours": [
            sys.executable, "-m", "exporter", "serve", f"--web.listen-address=127.0.0.1:{ports['ours']}",
            f"--web.config.file={configs['ours']}", f"--path.sysfs={sysfs}", f"--path.pod-logs={folder / 'pods'}",
            f"--path.nccl-debug-files={folder / 'nccl'}", f"--path.state={folder / 'state'}",
            f"--path.pod-resources={folder / 'no-kubelet.sock'}", f"--path.probe-results={folder / 'probe'}",
        ],
        "peer": [
            node_exporter, f"--web.listen-address=127.0.0.1:{ports['peer']}", f"--web.config.file={configs['peer']}",
            f"--path.sysfs={sysfs}", "--collector.disable-defaults", "--collector.infiniband",
        ],
    }  # fmt: skip
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs = {name: folder / f"{name}.log" for name in ports}
    prometheus = Prometheus(
        find_binary(("prometheus",)) or "prometheus",
        folder / "prometheus",
        {
            "global": {"scrape_interval": f"{SCRAPE_SECONDS:g}s", "scrape_timeout": f"{SCRAPE_SECONDS:g}s"},
            "scrape_configs": [_scrape_job(name, port, scenario.web) for name, port in ports.items()],
        },
    )
    sides = {name: Side() for name in ports}
    rest_ratio = None
    try:
        for name in ports:
            with open(logs[name], "wb") as log_file:
                procs[name] = subprocess.Popen(argv[name], stdout=log_file, stderr=subprocess.STDOUT)
        for port in ports.values():
            _wait_listening(port)
        prometheus.start()
        prometheus.wait_until(lambda: len(prometheus.values("up == 1")) == 2, timeout=60, what="both exporters up")
        stop = threading.Event()
        authorization = basic_auth(USER, PASSWORD) if scenario.web in ("auth", "rate-limit") else None
        probes: dict[str, Probe] = {}
        if scenario.web == "auth":  # an authenticated scraper's latency, idle and then under the flood
            probes = {name: Probe(port, "/metrics", authorization) for name, port in ports.items()}
            idle_stop = threading.Event()
            idle_threads = [probe.run(idle_stop) for probe in probes.values()]
            time.sleep(5.0)
            idle_stop.set()
            for thread in idle_threads:
                thread.join()
            for name, probe in probes.items():
                sides[name].probe_idle = probe.median_seconds()
                probe.results.clear()
        if scenario.web == "rate-limit":  # /healthz for us; node_exporter has only / (a probe with credentials)
            probes = {"ours": Probe(ports["ours"], "/healthz"), "peer": Probe(ports["peer"], "/", authorization)}
        log_sizes = {name: logs[name].stat().st_size for name in ports}
        watch = _RssWatch([proc.pid for proc in procs.values()])
        attacks = {name: scenario.attack() for name in ports} if scenario.attack else {}
        threads = [thread for name, attack in attacks.items() for thread in attack.start(ports[name], stop)]
        threads += [probe.run(stop) for probe in probes.values()]
        if scenario.attack is None:
            rest_ratio = _rest_ratio(ports["ours"], ports["peer"])
        time.sleep(seconds)
        stop.set()
        for thread in threads:
            thread.join(10)
        watch.stop()
        window = f"{seconds:.0f}s"
        for name, proc in procs.items():
            side = sides[name]
            job = f'job="{name}"'
            side.up = _query_one(prometheus, f"avg_over_time(up{{{job}}}[{window}])")
            side.scrapes = int(_query_one(prometheus, f"count_over_time(up{{{job}}}[{window}])"))
            side.median_scrape = _query_one(
                prometheus, f"quantile_over_time(0.5, scrape_duration_seconds{{{job}}}[{window}])"
            )
            side.max_scrape = _query_one(prometheus, f"max_over_time(scrape_duration_seconds{{{job}}}[{window}])")
            side.peak_rss_kib = max(watch.peak[proc.pid], _status(proc.pid, "VmHWM"))
            side.log_bytes = logs[name].stat().st_size - log_sizes[name]
            side.attacker = dict(attacks[name].counts) if name in attacks else {}
            if scenario.web == "auth":
                side.probe_attack = probes[name].median_seconds()
            if scenario.web == "rate-limit":
                side.health_ok = probes[name].ok_fraction()
    finally:
        prometheus.stop()
        for proc in procs.values():
            stop_process(proc)
    return ScenarioResult(scenario, sides["ours"], sides["peer"], rest_ratio)


def _ms(seconds: float) -> str:
    return "–" if seconds != seconds else f"{seconds * 1000:.0f} ms"


def _notes(result: ScenarioResult) -> str:
    ours, peer = result.ours, result.peer
    key = result.scenario.key
    if key == "rest":
        return f"/metrics latency ours/node_exporter {result.rest_ratio:.2f}x (alternating keep-alive scrapes, Prometheus' headers)"
    if key == "bcrypt":
        return (
            f"authenticated scrape {_ms(ours.probe_idle)} idle, {_ms(ours.probe_attack)} under the flood "
            f"({ours.probe_attack / ours.probe_idle:.1f}x); node_exporter {_ms(peer.probe_idle)} → "
            f"{_ms(peer.probe_attack)} ({peer.probe_attack / peer.probe_idle:.1f}x)"
        )
    if key == "rate-limit":
        return (
            f"/healthz answered {ours.health_ok:.0%}; node_exporter's / (with credentials) {peer.health_ok:.0%} "
            "(its exporter-toolkit 0.8 has no rate_limit)"
        )
    seen = ", ".join(f"{k} {v}" for k, v in sorted(ours.attacker.items()))
    return f"the attacker saw from us: {seen}"


def clients_markdown(results: list[ScenarioResult], seconds: float) -> str:
    limit = _pod_memory_limit_mib()
    rows = []
    for result in results:
        ours, peer = result.ours, result.peer
        ratio = ours.up / peer.up if peer.up else float("inf")
        rows.append(
            f"| {result.scenario.label} | {ours.up:.0%} ({ours.scrapes}) | {peer.up:.0%} ({peer.scrapes}) | "
            f"{ratio:.2f} | {_ms(ours.median_scrape)} / {_ms(ours.max_scrape)} | "
            f"{_ms(peer.median_scrape)} / {_ms(peer.max_scrape)} | {ours.peak_rss_kib / 1024:.0f} MiB | "
            f"{peer.peak_rss_kib / 1024:.0f} MiB | {ours.log_bytes / 1024:.1f} KiB | {_notes(result)} |"
        )
    return (
        f"Each attack ran {seconds:g} s against both exporters at once, with Prometheus scraping both every "
        f"{SCRAPE_SECONDS:g} s (timeout {SCRAPE_SECONDS:g} s); `up` is the fraction of its scrapes that "
        "succeeded (how many it made), scrape duration as Prometheus measured it (median / worst), peak RSS "
        f"of a process started for that attack. The exporter's memory limit in the DaemonSet is {limit:.0f} MiB.\n\n"
        "| attack | up: ours | up: node_exporter | up ratio | scrape: ours | scrape: node_exporter | peak RSS: ours | "
        "peak RSS: node_exporter | our log during it | notes |\n|---|---|---|---|---|---|---|---|---|---|\n"
        + "\n".join(rows)
        + "\n"
    )


def run_clients(seconds: float, keys: list[str] | None) -> list[ScenarioResult]:
    node_exporter = shutil.which(NODE_EXPORTER)
    if node_exporter is None:
        raise FileNotFoundError(f"{NODE_EXPORTER} is not installed (apt-get install prometheus-node-exporter)")
    if find_binary(("prometheus",)) is None:
        raise FileNotFoundError("prometheus is not installed (apt-get install prometheus)")
    _raise_open_file_limit(16384)
    results = []
    with tempfile.TemporaryDirectory(prefix="ccl-bench-clients-") as workdir:
        root = Path(workdir)
        sysfs = build_tree(root / "node", 7)
        for scenario in SCENARIOS:
            if keys is None or scenario.key in keys:
                results.append(run_scenario(scenario, sysfs, root, seconds, node_exporter))
                print(
                    f"{scenario.key}: ours up {results[-1].ours.up:.2f}, node_exporter {results[-1].peer.up:.2f}",
                    file=sys.stderr,
                )
    return results


def _raise_open_file_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(needed, hard), hard))


def labels_markdown(hostile: Measured, clean: Measured, rounds: int, log_bytes: int) -> str:
    mib = 1 / 2**20
    page_ratio = hostile.page_bytes / clean.page_bytes
    return f"""
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
| peak RSS after 4 concurrent scrapes | {hostile.hwm_after_kib / 1024:.1f} MiB | {clean.hwm_after_kib / 1024:.1f} MiB | {hostile.hwm_after_kib / clean.hwm_after_kib:.2f} |
| median scrape | {hostile.scrape_seconds * 1000:.1f} ms | {clean.scrape_seconds * 1000:.1f} ms | {hostile.scrape_seconds / clean.scrape_seconds:.2f} |

gzip: the hostile page is {hostile.page_bytes / hostile.gzip_bytes:.1f}x smaller compressed,
the clean one {clean.page_bytes / clean.gzip_bytes:.1f}x (Prometheus asks for gzip).
"""


def run(seconds: float = 60.0, attacks: list[str] | None = None, rounds: int = 5, labels: bool = True) -> BenchResult:
    results = run_clients(seconds, attacks)
    markdown = "### Hostile clients, beside node_exporter\n\n" + clients_markdown(results, seconds)
    if labels:
        with tempfile.TemporaryDirectory(prefix="ccl-bench-hostile-") as workdir:
            root = Path(workdir)
            write_tree(root / "hostile", hostile_network)
            write_tree(root / "clean", clean_network)
            log_bytes = sum(p.stat().st_size for p in (root / "hostile").rglob("0.log"))
            hostile = measure_labels(root / "hostile", rounds)
            clean = measure_labels(root / "clean", rounds)
        markdown += "\n### Hostile tenants: the label-size attack\n" + labels_markdown(
            hostile, clean, rounds, log_bytes
        )
    attacked = [r for r in results if r.scenario.attack is not None]
    worst = min(attacked, key=lambda r: r.ours.up / r.peer.up if r.peer.up else float("inf"), default=None)
    worst_ratio = worst.ours.up / worst.peer.up if worst and worst.peer.up else float("nan")
    limit = _pod_memory_limit_mib()
    peak = max((r.ours.peak_rss_kib for r in results), default=0) / 1024
    rest = next((r.rest_ratio for r in results if r.rest_ratio is not None), None)
    flood = next((r.ours for r in results if r.scenario.key == "bcrypt"), None)
    summary = (
        f"Under {len(attacked)} attacks our `up` fraction / node_exporter's is at worst {worst_ratio:.2f}"
        + (f" ({worst.scenario.key})" if worst else "")
        + f" (goal: at least 1); our peak RSS {peak:.0f} MiB (limit {limit:.0f} MiB)"
        + (
            f"; an authenticated scrape under the bcrypt flood {flood.probe_attack / flood.probe_idle:.1f}x its idle "
            f"latency (goal: within {GOAL_FLOOD_LATENCY_RATIO:g}x)"
            if flood
            else ""
        )
        + (
            f"; at rest /metrics latency {rest:.2f}x node_exporter's (goal: within {GOAL_REST_RATIO:g}x)"
            if rest
            else ""
        )
        + "."
    )
    flags = f"--seconds {seconds:g}" + (f" --attacks {' '.join(attacks)}" if attacks else "")
    flags += f" --rounds {rounds}" if labels else " --no-labels"
    return BenchResult(
        title="/metrics under hostile clients and tenants, beside node_exporter",
        command=f"python -m bench.hostile_http {flags}",
        peer="prometheus-node-exporter (Debian) --collector.infiniband on the same sysfs tree with the same web "
        "config, attacked at the same time, scraped by the same Prometheus",
        ratio=worst_ratio,
        summary=summary,
        markdown=markdown,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="how long each attack runs")
    parser.add_argument("--attacks", nargs="+", choices=[s.key for s in SCENARIOS], help="only these (default: all)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of 4 concurrent scrapes (label-size attack)")
    parser.add_argument("--no-labels", action="store_true", help="skip the label-size attack")
    args = parser.parse_args(argv)
    print(run(args.seconds, args.attacks, args.rounds, not args.no_labels).section())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

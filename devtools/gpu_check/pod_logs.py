"""The two-host runs' rank logs as a kubelet writes pod logs, read by ``ccl-exporter serve``.

Each rank's NCCL log becomes one pod's container log, ``<root>/<namespace>_<pod>_<uid>/<container>/0.log``
with every line in the CRI format ``<RFC3339Nano> stdout F <line>`` (exporter.sources.podlogs), as
each node's exporter would see its own pod. The real ``serve`` command (only the ``nccl``
collector) tails that tree and is scraped over HTTP until every pod shows; its ``ccl_nccl_*``
series are kept. It runs twice: with this machine's sysfs (a TCP fallback is only flagged where
the node has an ACTIVE RDMA port) and with a simulated sysfs holding one active InfiniBand port
(``ccl_sim.rdma``), where the fallback run must be flagged.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from devtools.gpu_check.report import FAILED, OK, SKIPPED, Report, free_port, repo_env

NAMESPACE = "gpu-check"
CONTAINER = "trainer"
POD_LOGS_DIR = "pod-logs"
MUST_FALL_BACK = "socket-"  # the variants whose pods must show tcp_fallback (IB disabled, Socket)
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def pod_name(variant: str, rank_log: Path) -> str:
    rank = re.search(r"rank(\d+)", rank_log.name)
    name = f"{variant}-rank{rank.group(1) if rank else 0}".lower()
    return re.sub(r"[^a-z0-9-]", "-", name)[:63].strip("-")


def cri_line(stamp: dt.datetime, message: str) -> str:
    """One CRI log record as the kubelet's runtime writes it (nanosecond digits, UTC)."""
    return f"{stamp:%Y-%m-%dT%H:%M:%S}.{stamp.microsecond:06d}000Z stdout F {message}\n"


def lay_out(rank_logs: Mapping[str, Sequence[Path]], root: Path, start: dt.datetime) -> list[str]:
    """Write each variant's rank logs under ``root`` as pod logs; the pods' names."""
    pods = []
    for variant, logs in rank_logs.items():
        for log in logs:
            pod = pod_name(variant, log)
            uid = uuid.uuid5(uuid.NAMESPACE_URL, f"gpu-check/{pod}")
            path = root / f"{NAMESPACE}_{pod}_{uid}" / CONTAINER / "0.log"
            path.parent.mkdir(parents=True, exist_ok=True)
            lines = log.read_text(errors="replace").splitlines()
            path.write_text(
                "".join(cri_line(start + dt.timedelta(microseconds=i), line) for i, line in enumerate(lines))
            )
            pods.append(pod)
    return pods


def parse_samples(text: str) -> Samples:
    from prometheus_client.parser import text_string_to_metric_families

    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(samples: Samples, name: str, **labels: str) -> float | None:
    for (metric, items), v in samples.items():
        if metric == name and all(dict(items).get(k) == want for k, want in labels.items()):
            return v
    return None


def nccl_series(text: str) -> str:
    """The ``ccl_nccl_*`` families of a page, HELP and TYPE lines included."""
    keep = [
        line
        for line in text.splitlines()
        if line.startswith("ccl_nccl_") or line.startswith(("# HELP ccl_nccl_", "# TYPE ccl_nccl_"))
    ]
    return "\n".join(keep) + "\n"


def serve_and_scrape(
    pod_root: Path, sysfs: Path, scratch: Path, pods: Sequence[str], timeout: float
) -> tuple[str | None, str, str]:
    """Start ``ccl-exporter serve`` on the tree, scrape ``/metrics`` until each pod has a verdict (or
    ``timeout``); the last page (None if none came), the server's own log, and what was missing."""
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "debug-files").mkdir(exist_ok=True)
    port = free_port()
    argv = [
        sys.executable, "-m", "exporter", "serve", "--collector.disable-defaults", "--collector.nccl",
        "--path.pod-logs", str(pod_root), "--path.nccl-debug-files", str(scratch / "debug-files"),
        "--path.state", str(scratch / "state"), "--path.sysfs", str(sysfs),
        "--path.pod-resources", str(scratch / "no-kubelet.sock"),
        "--web.listen-address", f"127.0.0.1:{port}",
    ]  # fmt: skip
    log_path = scratch / "serve.log"
    page: str | None = None
    missing = "no page scraped"
    with open(log_path, "wb") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=repo_env({"NODE_NAME": ""}), start_new_session=True)  # fmt: skip
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                        page = response.read().decode()
                except (urllib.error.URLError, OSError):
                    time.sleep(0.5)
                    continue
                samples = parse_samples(page)
                absent = [p for p in pods if value(samples, "ccl_nccl_verdict", pod=p) is None]
                missing = f"no ccl_nccl_verdict for {', '.join(absent)}" if absent else ""
                if not absent:
                    break
                time.sleep(0.5)
            if proc.poll() is not None:
                missing = f"serve exited {proc.returncode}" + (f"; {missing}" if missing else "")
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    return page, log_path.read_text(errors="replace"), missing


def rdma_node_sysfs(scratch: Path) -> Path:
    """A sysfs tree with one ACTIVE InfiniBand port (the simulated node's first port)."""
    from ccl_sim.paths import simulated_paths
    from ccl_sim.rdma import SimRdma, default_ports

    SimRdma(random.Random(0), ports=default_ports()[:1]).setup(scratch)
    return simulated_paths(scratch).sysfs


def pod_verdicts(samples: Samples, pods: Sequence[str]) -> dict[str, dict[str, float | str | None]]:
    table: dict[str, dict[str, float | str | None]] = {}
    for pod in pods:
        verdict = next(
            (v for v in ("tcp_fallback", "rdma", "single_node", "unknown")
             if value(samples, "ccl_nccl_verdict", pod=pod, verdict=v) == 1),
            None,
        )  # fmt: skip
        info = next(
            (dict(items) for (name, items), _ in samples.items() if name == "ccl_nccl_communicator_info"
             and dict(items).get("pod") == pod),
            {},
        )  # fmt: skip
        table[pod] = {
            "verdict": verdict,
            "tcp_fallback": value(samples, "ccl_nccl_tcp_fallback", pod=pod),
            "network": info.get("network"),
            "nnodes": info.get("nnodes"),
            "nranks": info.get("nranks"),
        }
    return table


def check_node(label: str, samples: Samples, pods: Sequence[str], rdma_expected: bool | None) -> list[str]:
    """What is wrong with the exporter's answer on one node (empty: nothing). The Socket variants'
    pods must have verdict tcp_fallback; ``ccl_nccl_tcp_fallback`` must be 1 where the node has an
    active RDMA port (``rdma_expected`` True, or None: as this node's sysfs says) and 0 where not."""
    problems = []
    rdma = value(samples, "ccl_nccl_node_rdma_active")
    if rdma_expected is not None and rdma != float(rdma_expected):
        problems.append(f"ccl_nccl_node_rdma_active is {rdma}, not {int(rdma_expected)}")
    table = pod_verdicts(samples, pods)
    for pod, row in table.items():
        if not pod.startswith(MUST_FALL_BACK):
            continue
        if row["verdict"] != "tcp_fallback":
            problems.append(f"{pod}: verdict {row['verdict']}, not tcp_fallback")
        want = 1.0 if rdma == 1.0 else 0.0
        if row["tcp_fallback"] != want:
            problems.append(f"{pod}: ccl_nccl_tcp_fallback {row['tcp_fallback']}, not {want:g} ({label})")
    return problems


def exporter_on_pod_logs(report: Report, rank_logs: Mapping[str, Sequence[Path]], sysfs: Path, scratch: Path) -> None:
    """Lay the rank logs out as pod logs and scrape serve on them: on this node's sysfs and on one with RDMA."""
    steps = ("exporter on pod logs, this node", "exporter on pod logs, RDMA node")
    if not any(rank_logs.values()):
        for step in steps:
            report.add(step, SKIPPED, "no rank logs to lay out")
        return
    root = report.out / POD_LOGS_DIR
    pods = lay_out(rank_logs, root, dt.datetime.now(dt.timezone.utc))
    nodes: list[tuple[str, str, Path, bool | None]] = [
        (steps[0], "this-node", sysfs, None),
        (steps[1], "rdma-node", rdma_node_sysfs(scratch / "rdma-node"), True),
    ]
    for step, label, node_sysfs, rdma_expected in nodes:
        timeout = report.timeout(60)
        if timeout is None:
            report.out_of_time(step)
            continue
        page, serve_log, missing = serve_and_scrape(root, node_sysfs, scratch / f"serve-{label}", pods, timeout)
        report.write(f"exporter-serve-{label}.log", serve_log)
        if page is None:
            report.add(step, FAILED, f"no /metrics page: {missing}; see exporter-serve-{label}.log")
            continue
        report.write(f"exporter-metrics-{label}.txt", nccl_series(page))
        samples = parse_samples(page)
        problems = ([missing] if missing else []) + check_node(label, samples, pods, rdma_expected)
        rdma = value(samples, "ccl_nccl_node_rdma_active")
        table = pod_verdicts(samples, pods)
        rows = "; ".join(
            f"{pod} {row['verdict']} (tcp_fallback {row['tcp_fallback']}, network {row['network']}, "
            f"nnodes {row['nnodes']})"
            for pod, row in table.items()
        )
        report.finding(f"exporter on `{POD_LOGS_DIR}/`, {label} (node_rdma_active {rdma}): {rows}")
        detail = f"{len(pods)} pods, node_rdma_active {rdma}; exporter-metrics-{label}.txt"
        report.add(step, FAILED if problems else OK, detail + (f"; {'; '.join(problems)}" if problems else ""))

"""Rule evaluation per group with a real Prometheus on synthetic fleets of 32, 256 and 1,000 nodes.

The fleet is the exporter's real series shape: one ``python -m ccl_sim serve`` page (made
healthy: the simulator's built-in TCP-fallback pod removed) is read twice to learn every series,
its value and how fast each counter grows. A small HTTP server in this process then serves it
for every node, live (counters growing at those rates), with each node's training pods named its
own (jobs of ``NODES_PER_JOB`` nodes, pod names as operators make them), and beside it what a
real cluster's Prometheus also holds: cAdvisor's pod network series per node (``CADVISOR_PODS``
pods, as the kubelet serves them; no rule reads them, the exporter reports its GPU pods' own
traffic, but a rule's selectors run against every series there is) and kube-state-metrics' GPU
capacity (CclExporterAbsent reads it). Prometheus scrapes all of
it every 15 s as our PodMonitor does (target labels ``node``, ``instance``, ``namespace``/``pod``
of the exporter's pod, ``honor_labels``).

History is what the rules read over ranges, at the rate it is written: before Prometheus starts,
every series a rule reads over a range is backfilled over that range (the longest of any rule)
with ``promtool tsdb create-blocks-from openmetrics``; once it runs, every recording rule read
over a range gets that range of history at its group's interval (30 s, the Prometheus Operator's
default, unless the group sets one), holding the values Prometheus just recorded, backfilled the
same way while Prometheus runs (it loads new blocks within a minute and compacts them).

While measuring, every rule of both files runs in one group, in file order, every
``EVALUATION_SECONDS`` (what a rule costs does not depend on how often its group runs; the hourly
groups would otherwise not run at all), and ``evaluationTime`` of each rule is read from
``/api/v1/rules``; a group's cost is the sum of its rules' times, i.e. what the group takes with a
core to itself, and the sum over all groups is the CPU time a cycle of every group takes. Run as
they are, 50-odd groups at once on two cores would wait for each other, and each group's wall time
would measure that queue. The number reported is the median over ``--cycles`` cycles. Nothing is
scraped during those cycles, so the numbers are the rules' own cost, not ingestion's (a 2-core
machine cannot ingest 1,000 nodes and evaluate beside it): Prometheus stops and starts again on
the same TSDB with the rules and no scrape jobs. A stopping Prometheus writes no staleness markers,
so every series stays as fresh as the last scrape left it, for Prometheus' 5-minute lookback;
only cycles that end within it count. (Raising the scrape interval by a reload would not do: the
old scrape loops mark their series stale two intervals later, and until the new loops' first
scrapes, spread over the new interval, much of the fleet would be missing from what the rules
read.)
Prometheus is the Debian 2.42 package.

    python -m bench.rule_cost [--nodes 32,256,1000] [--rules FILE ...] [--cycles 15]

All three fleets take about 35 minutes on a 2-core machine, and Prometheus needs ~12 GiB of
memory at 1,000 nodes.

Goal: every group under ``GOAL_MS`` per cycle at 1,000 nodes. The ratio is the slowest group at
the largest fleet over that goal. A fleet whose backfill would exceed ``--max-samples`` is
reported as not measured, not cut short.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml

from bench.common import BenchResult
from devtools.stack import (
    LOOPBACK,
    SCRAPE_JOB,
    Intervals,
    Prometheus,
    ScrapeTarget,
    SimulatedExporter,
    builtin_crossed_rail_pods,
    builtin_fallback_pods,
    duration_seconds,
    find_binary,
    find_rule_files,
    make_healthy,
    prometheus_config,
)
from devtools.timeline import parse_timestamp

NODE_COUNTS = (32, 256, 1000)
GOAL_MS = 100.0
# How long the simulated node may take to drop the series of the pods make_healthy() removes.
HEALTHY_TIMEOUT_SECONDS = 60.0
GRACE_SECONDS = 2.0
# The simulated node's page is taken once its series have held this long: longer than the
# simulator's slowest cycle (a single-node job's NCCL Inspector file, rewritten every 5 s), so
# every run measures the same fleet (runs that read the page sooner missed that job's series).
SETTLE_SECONDS = 12.0
SCRAPE_SECONDS = 15.0  # manifests/base/podmonitor.yaml
GROUP_SECONDS = 30.0  # the Prometheus Operator's evaluationInterval default
EVALUATION_SECONDS = 10.0  # how often every group runs while measuring
# Ranges up to this long fill from live scrapes before measuring; longer ones are backfilled.
LIVE_SECONDS = 300.0
# Cycles per fleet, the median's count: 15 of 10 s fit in the 5-minute lookback after the restart,
# and their median moves less between runs on a shared 2-core machine than that of 5.
CYCLES = 15
RECORDED_ROUNDS = 3  # backfills of recorded history: rules whose inputs need history first
# While the benchmark runs, every rule runs every EVALUATION_SECONDS; the records of groups that
# run less often than GROUP_SECONDS (every 5 minutes, hour or day) are written under this prefix,
# so that their readers read them at their own interval (the backfilled history) and not one
# sample every 10 s (one run read 74 hourly maxima per probe for a day's median instead of 24).
MEASURED_PREFIX = "measured_"
LOOKBACK_SECONDS = 300.0  # Prometheus' default: how long a series stays fresh after its last sample
NODES_PER_JOB = 4
CADVISOR_PODS = 30
EXPORTER_NAMESPACE = "ccl-exporter"
MAX_SAMPLES = 60_000_000
SLOWEST_RULES = 8

_IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_WINDOW = re.compile(r"\[(\d+(?:ms|[smhdwy])(?:\d+(?:ms|[smhdwy]))*)(?::[^\]]*)?\]")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_OFFSET = re.compile(r"\s*offset\s+(\d+(?:ms|[smhdwy])(?:\d+(?:ms|[smhdwy]))*)")
_ROLE_POD = re.compile(r"^(?P<job>.+?)-(?P<role>master|worker|launcher|chief|evaluator)-\d+$")


def progress(message: str) -> None:
    print(f"rule_cost: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class TemplateSeries:
    """One series of one node: sample name, labels, value, growth per second, and who serves
    it: ``exporter`` (ours), ``kubelet`` (cAdvisor) or ``kube-state-metrics``."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float
    per_second: float = 0.0
    source: str = "exporter"


# --------------------------------------------------------------------------------------------
# One node's series


def pods_on(page: Mapping[tuple[str, tuple[tuple[str, str], ...]], float]) -> set[str]:
    """The pods whose NCCL verdicts a page holds (``ccl_nccl_*`` series' label ``pod``)."""
    return {value for name, labels in page if name.startswith("ccl_nccl_") for key, value in labels if key == "pod"}


def _parse_page(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Sample name and sorted labels -> value, from a text exposition page."""
    found = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, rest = line.rpartition(" ")
        name, _, labels = head.partition("{")
        pairs = tuple(sorted((k, v.replace('\\"', '"').replace("\\\\", "\\")) for k, v in _LABEL.findall(labels)))
        try:
            found[(name.strip(), pairs)] = float(rest)
        except ValueError:
            continue
    return found


def settled_page(
    read: Callable[[], str], hold: float, deadline: float, poll: float = 0.5
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The page ``read`` returns, once the series on it (names and labels) have not changed for
    ``hold`` seconds; RuntimeError at ``deadline`` (time.monotonic()) if they still do."""
    page = _parse_page(read())
    since = time.monotonic()
    while time.monotonic() - since < hold:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the simulated node's series still change after {hold:g} s")
        time.sleep(poll)
        latest = _parse_page(read())
        if latest.keys() != page.keys():
            since = time.monotonic()
        page = latest
    return page


def exporter_template(seconds: float = 3.0, extra_args: Sequence[str] = ()) -> list[TemplateSeries]:
    """Every series of a healthy simulated node, read twice ``seconds`` apart."""
    # A short grace period: the pods make_healthy() deletes leave the page within seconds.
    exporter = SimulatedExporter(
        "template", seed=1, extra_args=(f"--collector.nccl.grace-period={GRACE_SECONDS:g}", *extra_args)
    )
    exporter.start()
    try:
        make_healthy([exporter])
        removed = {pod for _, pod in builtin_fallback_pods() + builtin_crossed_rail_pods()}
        deadline = time.monotonic() + HEALTHY_TIMEOUT_SECONDS
        while removed & pods_on(page := _parse_page(exporter.metrics())):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the simulated node still serves {sorted(removed & pods_on(page))}")
            time.sleep(0.5)
        page = settled_page(exporter.metrics, SETTLE_SECONDS, deadline)
        first, started = page, time.monotonic()
        time.sleep(seconds)
        second, elapsed = _parse_page(exporter.metrics()), time.monotonic() - started
    finally:
        exporter.stop()
    return template_series(first, second, elapsed)


def template_series(
    first: Mapping[tuple[str, tuple[tuple[str, str], ...]], float],
    second: Mapping[tuple[str, tuple[tuple[str, str], ...]], float],
    elapsed: float,
) -> list[TemplateSeries]:
    """The template from two reads ``elapsed`` seconds apart: each counter grows at the rate it
    grew between them, except error counters. The simulator's rare link errors (an NVLink replay
    now and then) would grow at that rate on every node, all the time: one error in the
    3-second window is 1,200 an hour, and one run measured an NVLink error alert firing on every
    node (2.1 s per cycle, its descriptions' queries) instead of a healthy fleet."""
    series = []
    for (name, labels), value in sorted(second.items()):
        grown = value - first.get((name, labels), value)
        counts = name.endswith("_total") and not name.endswith("errors_total")
        series.append(TemplateSeries(name, labels, value, grown / elapsed if counts and grown > 0 else 0.0))
    return series


def node_template(exporter: Sequence[TemplateSeries]) -> list[TemplateSeries]:
    """A node as Prometheus sees it: the exporter's series, kube-state-metrics' GPU capacity, and
    cAdvisor's network series as the kubelet serves them for the node's training pods and system
    pods (``CADVISOR_PODS`` in all). cAdvisor reports a pod's network once, for its sandbox (the
    pause container: ``container=""`` under containerd, ``"POD"`` under CRI-O; the containers
    share its network namespace), skips ``lo``, ``veth*``, ``docker*`` and ``nerdctl*``, and
    reports the host's own interfaces under ``id="/"`` with no pod: the node's NIC and each pod's
    host end of its veth pair as the CNI names it (``cali*`` here)."""
    pods = sorted(
        {(dict(s.labels)["namespace"], dict(s.labels)["pod"]) for s in exporter if s.name == "ccl_gpu_pod_info"}
    )
    pods += [("kube-system", f"system-pod-{i}") for i in range(max(0, CADVISOR_PODS - len(pods)))]
    series = list(exporter)
    capacity = (("resource", "nvidia_com_gpu"), ("unit", "integer"))
    series.append(TemplateSeries("kube_node_status_capacity", capacity, 8.0, source="kube-state-metrics"))
    host_interfaces = ["ens1f0np0"] + [f"cali{index:011x}" for index in range(len(pods))]
    for direction in ("transmit", "receive"):
        name = f"container_network_{direction}_bytes_total"
        for index, (namespace, pod) in enumerate(pods):
            sandbox = f"{index:064x}"
            labels = (
                ("container", ""),
                ("id", f"/kubepods/pod{index:08x}/{sandbox}"),
                ("image", "registry.k8s.io/pause:3.9"),
                ("interface", "eth0"),
                ("name", sandbox),
                ("namespace", namespace),
                ("pod", pod),
            )
            series.append(TemplateSeries(name, labels, 1e9, 1e4, source="kubelet"))
        for interface in host_interfaces:
            labels = (
                ("container", ""),
                ("id", "/"),
                ("image", ""),
                ("interface", interface),
                ("name", ""),
                ("namespace", ""),
                ("pod", ""),
            )
            series.append(TemplateSeries(name, labels, 1e9, 1e4, source="kubelet"))
    return series


@dataclass(frozen=True)
class Node:
    """Node ``index`` of the fleet: its names, and how it labels the template's series."""

    index: int

    @property
    def name(self) -> str:
        return f"gpu-node-{self.index:04d}"

    @property
    def address(self) -> str:
        return f"10.{self.index // 65536 % 256}.{self.index // 256 % 256}.{self.index % 256}"

    @property
    def exporter_pod(self) -> str:
        return f"ccl-exporter-{self.index:05x}"

    def job(self, job: str) -> str:
        return f"{job}-{self.index // NODES_PER_JOB:04d}" if job else job

    def pod(self, pod: str) -> str:
        found = _ROLE_POD.match(pod)
        if found:
            return f"{self.job(found['job'])}-{found['role']}-{self.index % NODES_PER_JOB}"
        return f"{pod}-{self.index:04d}"

    def own_labels(self, series: TemplateSeries) -> dict[str, str]:
        """The series' labels as the node's target serves them: its own pods, jobs, GPUs and
        communicators; kube-state-metrics names the node itself."""
        labels = dict(series.labels)
        if labels.get("pod"):  # the host's own series (cAdvisor's id="/") have pod=""
            labels["pod"] = self.pod(labels["pod"])
        if "job_name" in labels:
            labels["job_name"] = self.job(labels["job_name"])
        if "uuid" in labels:
            labels["uuid"] = f"{labels['uuid'][:-4]}{self.index:04x}"
        if "comm_id" in labels:
            labels["comm_id"] = f"{labels['comm_id']}-{self.index // NODES_PER_JOB:04d}"
        if series.source == "kube-state-metrics":
            labels["node"] = self.name
        return labels

    def target_labels(self, source: str) -> dict[str, str]:
        """What a scrape of the node's ``source`` adds (the PodMonitor's for ours)."""
        if source == "exporter":
            return {
                "job": SCRAPE_JOB,
                "instance": f"{self.address}:19400",
                "node": self.name,
                "namespace": EXPORTER_NAMESPACE,
                "pod": self.exporter_pod,
                "container": "exporter",
            }
        if source == "kubelet":
            return {"job": "kubelet", "instance": f"{self.address}:10250", "node": self.name}
        return {"job": source, "instance": "kube-state-metrics:8080"}

    def stored_labels(self, series: TemplateSeries) -> dict[str, str]:
        """The labels Prometheus stores: the target's, then the series' own (honor_labels)."""
        return {**self.target_labels(series.source), **self.own_labels(series)}


# --------------------------------------------------------------------------------------------
# The fleet's targets, served live


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _series_text(name: str, labels: Mapping[str, str]) -> str:
    return name + "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items())) + "}"


@dataclass
class Page:
    """A target's page: constant lines, and counters (series text, value at ``origin``, per second)."""

    constant: str
    counters: list[tuple[str, float, float]]

    def render(self, now: float, origin: float) -> bytes:
        grown = "".join(
            f"{text} {value + per_second * (now - origin):.15g}\n" for text, value, per_second in self.counters
        )
        return (self.constant + grown).encode()


class FleetServer:
    """Every node's exporter and kubelet, and one kube-state-metrics, on one loopback port:
    ``/exporter/<index>``, ``/kubelet/<index>``, ``/kube-state-metrics``. Values at time ``t``
    are the template's at ``origin`` plus growth, the same ones the backfilled history holds."""

    def __init__(self, template: Sequence[TemplateSeries], nodes: int, origin: float) -> None:
        self.origin = origin
        self.nodes = [Node(i + 1) for i in range(nodes)]
        self.pages: dict[str, Page] = {}
        for node in self.nodes:
            for source in ("exporter", "kubelet"):
                self.pages[f"/{source}/{node.index}"] = self._page(node, [s for s in template if s.source == source])
        ksm = [s for s in template if s.source == "kube-state-metrics"]
        lines = [f"{_series_text(s.name, node.own_labels(s))} {s.value:.15g}\n" for node in self.nodes for s in ksm]
        self.pages["/kube-state-metrics"] = Page("".join(lines), [])
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="fleet-server", daemon=True)
        self.port = 0

    @staticmethod
    def _page(node: Node, series: Iterable[TemplateSeries]) -> Page:
        constant, counters = [], []
        for s in series:
            text = _series_text(s.name, node.own_labels(s))
            if s.per_second:
                counters.append((text, s.value, s.per_second))
            else:
                constant.append(f"{text} {s.value:.15g}\n")
        return Page("".join(constant), counters)

    def targets(self) -> dict[str, list[ScrapeTarget]]:
        """Scrape jobs: our exporter and the kubelet on every node, kube-state-metrics once."""
        address = f"{LOOPBACK}:{self.port}"
        jobs: dict[str, list[ScrapeTarget]] = {}
        paths = [(node, source, f"/{source}/{node.index}") for node in self.nodes for source in ("exporter", "kubelet")]
        paths.append((self.nodes[0], "kube-state-metrics", "/kube-state-metrics"))
        for node, source, path in paths:
            labels = node.target_labels(source)
            job = labels.pop("job")  # the scrape job's name gives it
            jobs.setdefault(job, []).append(ScrapeTarget(address, {**labels, "__metrics_path__": path}))
        return jobs

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1].decode().split("?", 1)[0]
                page = self.pages.get(path)
                body = page.render(time.time(), self.origin) if page else b"not found\n"
                status = b"200 OK" if page else b"404 Not Found"
                writer.write(
                    b"HTTP/1.1 "
                    + status
                    + b"\r\nContent-Type: text/plain; version=0.0.4\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, LOOPBACK, 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()
        self._loop.run_until_complete(server.wait_closed())

    def start(self) -> FleetServer:
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


# --------------------------------------------------------------------------------------------
# What the rules read over ranges, and its history


def range_reads(expr: str) -> dict[str, float]:
    """The names ``expr`` reads over a range, with the seconds of history each needs: a range
    selector's range (``x[5m]``), a subquery's range for every name inside it (``(...)[1h:5m]``,
    plus the ranges inside). Names read without a range are left out."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    found: dict[str, float] = {}
    for window in _WINDOW.finditer(text):
        seconds = duration_seconds(window.group(1))
        offset = _OFFSET.match(text, window.end())
        if offset:  # the range ends that much earlier: history goes back that much further
            seconds += duration_seconds(offset.group(1))
        before = text[: window.start()].rstrip()
        if before.endswith("}"):  # drop the selector's matchers
            before = before[: before.rindex("{")].rstrip()
        if before.endswith(")"):  # a subquery of an expression: everything in its parentheses
            depth, start = 0, len(before)
            for start in range(len(before) - 1, -1, -1):
                depth += {")": 1, "(": -1}.get(before[start], 0)
                if depth == 0:
                    break
            inner = before[start:]
            for name in set(_IDENTIFIER.findall(inner)):
                found[name] = max(found.get(name, 0.0), seconds + range_reads(inner).get(name, 0.0))
        else:
            name = _IDENTIFIER.findall(before)[-1]
            found[name] = max(found.get(name, 0.0), seconds)
    return found


def group_interval(group: Mapping[str, Any]) -> float:
    """A group's evaluation interval (s): its own, else the Prometheus Operator's default."""
    return duration_seconds(group["interval"]) if "interval" in group else GROUP_SECONDS


@dataclass
class RuleReads:
    """Per name, the longest range (seconds) any rule reads it over; each recording rule's
    group interval."""

    ranges: dict[str, float] = field(default_factory=dict)
    recorded: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, rules: Mapping[str, Any], known: Iterable[str]) -> RuleReads:
        reads = cls()
        for group in rules["groups"]:
            interval = group_interval(group)
            for rule in group["rules"]:
                if "record" in rule:
                    reads.recorded[rule["record"]] = interval
        names = set(known) | set(reads.recorded)
        for group in rules["groups"]:
            for rule in group["rules"]:
                for name, window in range_reads(str(rule["expr"])).items():
                    if name in names:
                        reads.ranges[name] = max(reads.ranges.get(name, 0.0), window)
        return reads

    def raw(self) -> dict[str, float]:
        """Scraped series read over ranges longer than the live scrapes fill before measuring."""
        return {n: w for n, w in self.ranges.items() if n not in self.recorded and w > LIVE_SECONDS}

    def recorded_ranges(self) -> dict[str, float]:
        return {name: window for name, window in self.ranges.items() if name in self.recorded}


@dataclass
class Written:
    series: int = 0
    samples: int = 0

    def add(self, other: Written) -> None:
        self.series += other.series
        self.samples += other.samples


def write_family(
    out: TextIO,
    name: str,
    rows: Iterable[tuple[Mapping[str, str], float, float]],
    times: Sequence[float],
    origin: float,
) -> Written:
    """One family in OpenMetrics: ``rows`` of (labels, value at ``origin``, growth per second)."""
    written = Written()
    out.write(f"# TYPE {name} unknown\n")
    stamps = [f" {t:.3f}\n" for t in times]
    for labels, value, per_second in rows:
        prefix = _series_text(name, labels) + " "
        if per_second:
            out.write(
                "".join(
                    f"{prefix}{value + per_second * (t - origin):.15g}{stamp}"
                    for t, stamp in zip(times, stamps, strict=True)
                )
            )
        else:
            value_text = f"{value:.15g}"
            out.write("".join(prefix + value_text + stamp for stamp in stamps))
        written.series += 1
        written.samples += len(times)
    return written


def _times(window: float, end: float, step: float) -> list[float]:
    """Every ``step`` over ``window`` seconds, the last one at ``end``."""
    return [end - i * step for i in range(int(window // step), -1, -1)]


def raw_history(
    out: TextIO, template: Sequence[TemplateSeries], nodes: int, ranges: Mapping[str, float], end: float, origin: float
) -> Written:
    """The fleet's series that rules read over a range, over that range until ``end``."""
    written = Written()
    fleet = [Node(i + 1) for i in range(nodes)]
    for name, window in sorted(ranges.items()):
        members = [s for s in template if s.name == name]
        if members:
            rows = ((node.stored_labels(s), s.value, s.per_second) for node in fleet for s in members)
            written.add(write_family(out, name, rows, _times(window, end, SCRAPE_SECONDS), origin))
    out.write("# EOF\n")
    return written


def planned_samples(template: Sequence[TemplateSeries], nodes: int, reads: RuleReads) -> int:
    """Samples of raw history the fleet needs (recording rules' history is far smaller)."""
    return sum(len(_times(reads.raw()[s.name], 0.0, SCRAPE_SECONDS)) * nodes for s in template if s.name in reads.raw())


def backfill(promtool: str, source: Path, tsdb: Path) -> None:
    started = time.monotonic()
    done = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(source), str(tsdb)],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"promtool backfill failed: {(done.stderr or done.stdout).strip()[-2000:]}")
    progress(f"backfilled {source.stat().st_size / 2**20:.0f} MiB of OpenMetrics in {time.monotonic() - started:.0f} s")
    source.unlink()


# --------------------------------------------------------------------------------------------
# Prometheus


SEQUENCE_GROUP = "ccl-health-in-sequence"


def _written_name(group: Mapping[str, Any], record: str) -> str:
    """The name the sequence writes ``record`` of ``group`` under: MEASURED_PREFIX and its own for
    a group that runs less often than GROUP_SECONDS, else its own."""
    return (MEASURED_PREFIX if group_interval(group) > GROUP_SECONDS else "") + record


def written_as(rules: Mapping[str, Any]) -> dict[str, str]:
    """Each record and the name the sequence writes it under (``_written_name``)."""
    return {
        str(rule["record"]): _written_name(group, str(rule["record"]))
        for group in rules["groups"]
        for rule in group["rules"]
        if "record" in rule
    }


def rules_in_sequence(rules: Mapping[str, Any], path: Path) -> list[str]:
    """Every rule of every group, in file order, as one group (no interval: all run at the global
    one); returns the group each rule came from, by position. Prometheus evaluates a group's rules
    one after another, so each rule's time is its own: with the groups as they are, 50-odd of them
    evaluated at once on two cores wait for each other, and a group's wall time would measure the
    queue once the fleet's rules need more than the cores give. The records of groups that run
    less often than GROUP_SECONDS are written under another name (``written_as``): same work,
    and their readers read their history at their own interval."""
    owners = [str(group["name"]) for group in rules["groups"] for _ in group["rules"]]
    sequence = [
        {**rule, "record": _written_name(group, str(rule["record"]))} if "record" in rule else rule
        for group in rules["groups"]
        for rule in group["rules"]
    ]
    path.write_text(yaml.safe_dump({"groups": [{"name": SEQUENCE_GROUP, "rules": sequence}]}, sort_keys=False))
    return owners


def own_metrics(prometheus: Prometheus, names: Sequence[str]) -> dict[str, float]:
    """Prometheus' own unlabelled series of ``names`` from one read of its /metrics (0.0 when absent)."""
    found = dict.fromkeys(names, 0.0)
    with urllib.request.urlopen(prometheus.url + "/metrics", timeout=30) as response:
        for line in response.read().decode().splitlines():
            name, _, value = line.partition(" ")
            if name in found:
                found[name] = float(value.split()[0])
    return found


def own_metric(prometheus: Prometheus, name: str) -> float:
    return own_metrics(prometheus, [name])[name]


def recorded_history(
    prometheus: Prometheus, promtool: str, reads: RuleReads, workdir: Path, names: Mapping[str, str]
) -> Written:
    """History for the recording rules read over ranges: the values Prometheus records now (under
    ``names[record]``, see ``written_as``), held over the range at the group's interval up to
    just before it started, backfilled into its TSDB under the record's own name while it runs;
    returns once it has loaded and compacted the new blocks. A rule that records nothing until
    its own inputs have history (the probe's daily median needs the hourly maxima of a day ago)
    is waited for again once the history of the others is in: up to ``RECORDED_ROUNDS`` rounds,
    each backfilling what was recorded since the last."""
    ranges = reads.recorded_ranges()
    found: dict[str, list[dict[str, Any]]] = {}
    written = Written()
    for round_number in range(RECORDED_ROUNDS):
        missing = {names.get(name, name): name for name in set(ranges) - set(found)}
        deadline = time.monotonic() + (120.0 if round_number == 0 else 60.0)
        settled = settled_records(prometheus, missing, deadline)
        this_round = {missing[name]: samples for name, samples in settled.items()}
        found.update(this_round)
        progress(
            f"recording rules with a range to backfill: {sorted(this_round)}; "
            f"not recorded (yet): {sorted(set(ranges) - set(found))}"
        )
        if not this_round:
            break
        written.add(_backfill_recorded(prometheus, promtool, this_round, ranges, reads, workdir))
    return written


def settled_records(prometheus: Prometheus, names: Iterable[str], deadline: float) -> dict[str, list[dict[str, Any]]]:
    """What Prometheus records now under each of ``names``, once its series count has held for a
    scrape and an evaluation. A rate's first evaluations answer only for the targets scraped
    twice by then, so the first answer can be part of the fleet, and its history would be too
    (one run backfilled 0.53 M samples where the whole fleet's are 0.95 M). At the deadline, a
    record still growing is taken as it is, and a record not there at all is left out."""
    hold = SCRAPE_SECONDS + EVALUATION_SECONDS
    latest: dict[str, list[dict[str, Any]]] = {}
    since: dict[str, float] = {}  # name -> when its series count last changed
    done: dict[str, list[dict[str, Any]]] = {}
    pending = set(names)
    while pending - set(done) and time.monotonic() < deadline:
        for name in sorted(pending - set(done)):
            result = prometheus.query(f'{{__name__="{name}"}}')
            if not result:
                continue
            now = time.monotonic()
            if name not in latest or len(result) != len(latest[name]):
                since[name] = now
            latest[name] = result
            if now - since[name] >= hold:
                done[name] = result
        time.sleep(1.0)
    growing = sorted(set(latest) - set(done))
    if growing:
        progress(f"still growing at the deadline, taken as they are: {growing}")
    return {**latest, **done}


def _backfill_recorded(
    prometheus: Prometheus,
    promtool: str,
    found: Mapping[str, list[dict[str, Any]]],
    ranges: Mapping[str, float],
    reads: RuleReads,
    workdir: Path,
) -> Written:
    end = prometheus_started(prometheus) - 60.0
    written = Written()
    source = workdir / "recorded.om"
    with source.open("w") as out:
        for name, samples in sorted(found.items()):
            rows = (
                ({k: v for k, v in s["metric"].items() if k != "__name__"}, float(s["value"][1]), 0.0) for s in samples
            )
            written.add(write_family(out, name, rows, _times(ranges[name], end, reads.recorded[name]), end))
        out.write("# EOF\n")
    backfill(promtool, source, prometheus.workdir / "tsdb")
    # Loaded within a minute (its oldest samples answer), then compacted (2 h blocks into larger
    # ones, which may leave as many blocks as before): wait for the block count to settle.
    name = min(found)
    oldest = _times(ranges[name], end, reads.recorded[name])[0]
    deadline, last, steady = time.monotonic() + 600.0, -1.0, 0
    while time.monotonic() < deadline and steady < 3:
        time.sleep(20.0)
        loaded = prometheus.api("query", query=f'count({{__name__="{name}"}})', time=f"{oldest + 1.0:.3f}")["result"]
        now = own_metric(prometheus, "prometheus_tsdb_blocks_loaded")
        steady = steady + 1 if loaded and now == last else 0
        last = now
    progress(f"Prometheus holds {last:.0f} blocks")
    return written


def prometheus_started(prometheus: Prometheus) -> float:
    return own_metric(prometheus, "process_start_time_seconds")


@dataclass
class Cycles:
    """Evaluation times (s) of each group (the sum of its rules') and each rule, one entry per
    cycle, and of the whole sequence."""

    groups: dict[str, list[float]] = field(default_factory=dict)
    rules: dict[str, list[float]] = field(default_factory=dict)  # "group/rule" -> times
    total: list[float] = field(default_factory=list)


def costs_of(evaluations: Sequence[Mapping[str, Any]], owners: Sequence[str]) -> Cycles:
    """Per group and rule, from evaluations of the sequence group as ``/api/v1/rules`` gives them."""
    found = Cycles()
    for evaluation in evaluations:
        rules = list(evaluation.get("rules", []))
        if len(rules) != len(owners):
            raise ValueError(f"{len(rules)} rules evaluated, {len(owners)} loaded")
        per_group: dict[str, float] = {}
        for owner, rule in zip(owners, rules, strict=True):
            seconds = float(rule.get("evaluationTime", 0.0))
            per_group[owner] = per_group.get(owner, 0.0) + seconds
            name = str(rule["name"]).removeprefix(MEASURED_PREFIX)  # the rule as the files name it
            found.rules.setdefault(f"{owner}/{name}", []).append(seconds)
        for owner, seconds in per_group.items():
            found.groups.setdefault(owner, []).append(seconds)
        found.total.append(float(evaluation.get("evaluationTime", 0.0)))
    return found


def fresh_evaluations(prometheus: Prometheus, cycles: int, fresh_until: float) -> list[dict[str, Any]]:
    """Up to ``cycles`` evaluations of the sequence that end before ``fresh_until`` (wall clock),
    while every scraped series is still within the lookback."""
    seen: dict[str, dict[str, Any]] = {}
    while time.time() < fresh_until and len(seen) < cycles:
        for group in prometheus.rule_groups():
            stamp = str(group.get("lastEvaluation", ""))
            if group["name"] != SEQUENCE_GROUP or stamp.startswith("0001-") or not stamp or stamp in seen:
                continue
            if parse_timestamp(stamp) + float(group.get("evaluationTime", 0.0)) <= fresh_until:
                seen[stamp] = group
        time.sleep(0.5)
    return [group for _, group in sorted(seen.items())][:cycles]


def group_intervals(rules: Mapping[str, Any]) -> dict[str, float]:
    """Each group's evaluation interval (s)."""
    return {str(group["name"]): group_interval(group) for group in rules["groups"]}


def busy_per_minute(group_seconds: Mapping[str, float], intervals: Mapping[str, float]) -> float:
    """Seconds of evaluation per minute when each group runs at its own interval: what the rules
    keep a core busy for, where the per-group number is what one cycle takes."""
    return sum(seconds * 60.0 / intervals.get(name, GROUP_SECONDS) for name, seconds in group_seconds.items())


@dataclass(frozen=True)
class ProcessSeconds:
    """Prometheus' own counters: CPU seconds, seconds spent evaluating rules (wall time, summed
    over rules), garbage collections."""

    cpu: float = 0.0
    rules: float = 0.0
    collections: float = 0.0

    def minus(self, earlier: ProcessSeconds) -> ProcessSeconds:
        return ProcessSeconds(
            self.cpu - earlier.cpu, self.rules - earlier.rules, self.collections - earlier.collections
        )

    def cpu_per_rule_second(self) -> float:
        """CPU seconds Prometheus used per second it spent evaluating rules: 1.0 or less when the
        rules had its CPU to themselves; above that, the rest went to Go's garbage collector and
        the TSDB's upkeep, which on a machine with few cores run on the rules' cores."""
        return self.cpu / self.rules if self.rules > 0 else 0.0


def process_seconds(prometheus: Prometheus) -> ProcessSeconds:
    names = (
        "process_cpu_seconds_total",
        "prometheus_rule_evaluation_duration_seconds_sum",
        "go_gc_duration_seconds_count",
    )
    return ProcessSeconds(*own_metrics(prometheus, names).values())


@dataclass
class FleetCost:
    nodes: int
    groups: dict[str, float]  # group -> median evaluation (s) per cycle
    rules: dict[str, float]  # "group/rule" -> median per cycle (a repeated name: its evaluations pooled)
    head_series: float
    backfilled_samples: int
    seconds: float  # wall time for this fleet, set-up included
    skipped: str = ""  # why this fleet was not measured
    total: float = 0.0  # every rule of both files, one after another (median per cycle, s)
    cycles: int = 0
    process: ProcessSeconds = field(default_factory=ProcessSeconds)  # Prometheus' own, while measuring


def _binaries(prometheus: str | None = None) -> tuple[str, str]:
    """The Prometheus to measure (``prometheus``, else the one on PATH) and promtool."""
    prometheus_binary, promtool = prometheus or find_binary(("prometheus",)), find_binary(("promtool",))
    if not prometheus_binary or not promtool:
        raise FileNotFoundError("prometheus and promtool are not installed (apt-get install prometheus)")
    if not os.access(prometheus_binary, os.X_OK):
        raise FileNotFoundError(f"{prometheus_binary} is not an executable")
    return prometheus_binary, promtool


def prometheus_version(binary: str) -> str:
    """``2.42.0`` from ``prometheus --version`` ("prometheus, version 2.42.0+ds (branch: ...)")."""
    result = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    found = re.search(r"version (\d+\.\d+\.\d+)", result.stdout + result.stderr)
    return found.group(1) if found else "of unknown version"


def measure(
    nodes: int,
    template: Sequence[TemplateSeries],
    rules: Mapping[str, Any],
    cycles: int = CYCLES,
    max_samples: int = MAX_SAMPLES,
    prometheus: str | None = None,
) -> FleetCost:
    """One fleet's rule costs; ``rules`` is every group of the rule files, in order;
    ``prometheus`` the binary that evaluates them (default: the one on PATH)."""
    started = time.monotonic()
    prometheus_binary, promtool = _binaries(prometheus)
    reads = RuleReads.of(rules, {series.name for series in template})
    planned = planned_samples(template, nodes, reads)
    if planned > max_samples:
        return FleetCost(nodes, {}, {}, 0.0, planned, 0.0, f"its history needs {planned / 1e6:.0f} M samples")
    origin = time.time()
    with tempfile.TemporaryDirectory(prefix="ccl-rule-cost-") as folder:
        workdir = Path(folder)
        server = FleetServer(template, nodes, origin).start()
        try:
            source = workdir / "raw.om"
            with source.open("w") as out:
                written = raw_history(out, template, nodes, reads.raw(), time.time() - SCRAPE_SECONDS, origin)
            rule_file = workdir / "rules.yaml"
            owners = rules_in_sequence(rules, rule_file)

            jobs = server.targets()
            intervals = Intervals(scrape_seconds=SCRAPE_SECONDS, evaluation_seconds=EVALUATION_SECONDS)
            config = prometheus_config(jobs.pop(SCRAPE_JOB), [rule_file], None, intervals, other_jobs=jobs)
            prometheus = Prometheus(prometheus_binary, workdir / "prometheus", config)
            backfill(promtool, source, prometheus.workdir / "tsdb")
            prometheus.start(ready_timeout=600.0)
            try:
                prometheus.wait_until(
                    lambda: prometheus.values("count(up == 1)") == [2.0 * nodes + 1],
                    300.0,
                    "every target scraped",
                    poll=2.0,
                )
                written.add(recorded_history(prometheus, promtool, reads, workdir, written_as(rules)))
                live = prometheus_started(prometheus) + LIVE_SECONDS - time.time()
                if live > 0:
                    progress(f"{live:.0f} s until {LIVE_SECONDS:g} s of scrapes fill the short ranges")
                    time.sleep(live)
                head = own_metric(prometheus, "prometheus_tsdb_head_series")
                # Rule evaluation alone: Prometheus stops (no staleness markers: it presumes it
                # restarts where it stopped) and starts again on the same TSDB with the rules and
                # no scrape jobs, so nothing is ingested while measuring and every series stays
                # fresh until Prometheus' 5-minute lookback runs out after the last scrape.
                prometheus.stop(timeout=300.0)
                last_scrape = time.time()
                server.stop()
                prometheus.write_config({**config, "scrape_configs": []})
                prometheus.start(ready_timeout=LOOKBACK_SECONDS)
                fresh_until = last_scrape + LOOKBACK_SECONDS - SCRAPE_SECONDS
                progress(
                    f"{nodes} nodes: {head:,.0f} head series, {written.samples:,} samples backfilled; "
                    f"restarted without scrapes in {time.time() - last_scrape:.0f} s, measuring {cycles} cycles"
                )
                before = process_seconds(prometheus)
                evaluations = fresh_evaluations(prometheus, cycles, fresh_until)
                after = process_seconds(prometheus)
                costs = costs_of(evaluations, owners)
            finally:
                prometheus.stop()
        finally:
            server.stop()
    medians = {name: statistics.median(values) for name, values in costs.groups.items() if values}
    rule_medians = {name: statistics.median(values) for name, values in costs.rules.items() if values}
    total = statistics.median(costs.total) if costs.total else 0.0
    return FleetCost(
        nodes,
        medians,
        rule_medians,
        head,
        written.samples,
        time.monotonic() - started,
        total=total,
        cycles=len(costs.total),
        process=after.minus(before),
    )


# --------------------------------------------------------------------------------------------
# The benchmark


def command_line(node_counts: Sequence[int], rule_files: Sequence[Path], prometheus: str | None) -> str:
    """The command that repeats a run: its fleets, the rule files it was given (none: the shipped
    ones) as given, and whether a Prometheus other than the one on PATH measured."""
    nodes = ",".join(str(n) for n in node_counts)
    given = "".join(f" --rules {path}" for path in rule_files)
    return f"python -m bench.rule_cost --nodes {nodes}{given}" + (" --prometheus PATH" if prometheus else "")


def run(
    node_counts: Sequence[int] = NODE_COUNTS,
    rule_files: Sequence[Path] = (),
    cycles: int = CYCLES,
    max_samples: int = MAX_SAMPLES,
    exporter_args: Sequence[str] = (),
    prometheus: str | None = None,
) -> BenchResult:
    command = command_line(node_counts, rule_files, prometheus)
    rule_files = list(rule_files) or find_rule_files()
    if not rule_files:
        raise FileNotFoundError("alerts/ccl-health-rules.yaml not found (run from a source checkout)")
    exporter = exporter_template(extra_args=exporter_args)
    template = node_template(exporter)
    rules = {"groups": [group for path in rule_files for group in yaml.safe_load(path.read_text())["groups"]]}
    version = prometheus_version(_binaries(prometheus)[0])
    fleets = [measure(nodes, template, rules, cycles, max_samples, prometheus) for nodes in node_counts]
    intervals = group_intervals(rules)
    measured = [fleet for fleet in fleets if not fleet.skipped]
    groups = sorted({name for fleet in measured for name in fleet.groups})
    lines = [
        "| group | " + " | ".join(f"{fleet.nodes:,} nodes" for fleet in fleets) + " |",
        "|---|" + "---|" * len(fleets),
    ]
    for name in groups:
        cells = [
            "not measured" if fleet.skipped else f"{fleet.groups.get(name, 0.0) * 1000:.1f} ms" for fleet in fleets
        ]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    lines.append(
        "| every rule of both files, one after another | "
        + " | ".join("" if fleet.skipped else f"{fleet.total * 1000:.1f} ms" for fleet in fleets)
        + " |"
    )
    lines.append(
        "| evaluation per minute, each group at its interval | "
        + " | ".join("" if fleet.skipped else f"{busy_per_minute(fleet.groups, intervals):.2f} s" for fleet in fleets)
        + " |"
    )
    lines.append(
        "| cycles measured (the medians' count) | "
        + " | ".join("" if fleet.skipped else str(fleet.cycles) for fleet in fleets)
        + " |"
    )
    lines.append(
        "| Prometheus CPU per second of rule evaluation while measuring (garbage collections) | "
        + " | ".join(
            "" if fleet.skipped else f"{fleet.process.cpu_per_rule_second():.2f} s ({fleet.process.collections:.0f})"
            for fleet in fleets
        )
        + " |"
    )
    lines.append(
        "| Prometheus head series | "
        + " | ".join(
            f"not measured: {fleet.skipped}" if fleet.skipped else f"{fleet.head_series / 1e6:.2f} M"
            for fleet in fleets
        )
        + " |"
    )
    lines.append(
        "| samples backfilled | " + " | ".join(f"{fleet.backfilled_samples / 1e6:.1f} M" for fleet in fleets) + " |"
    )
    largest = measured[-1] if measured else None
    if largest:
        lines += ["", f"| slowest rules at {largest.nodes:,} nodes (group/rule) | per cycle |", "|---|---|"]
        slow = sorted(largest.rules.items(), key=lambda item: -item[1])[:SLOWEST_RULES]
        lines += [f"| `{name}` | {cost * 1000:.1f} ms |" for name, cost in slow]
    slowest = max(largest.groups.items(), key=lambda item: item[1]) if largest and largest.groups else ("", 0.0)
    ratio = slowest[1] * 1000 / GOAL_MS if largest else None
    exporter_series = sum(1 for s in template if s.source == "exporter")
    flags = f" (`python -m ccl_sim serve {' '.join(exporter_args)}`)" if exporter_args else ""
    table = "\n".join(lines)
    markdown = f"""
Rule evaluation per group and cycle (median of up to {cycles} cycles), rules from {" and ".join(f"`{p.name}`" for p in rule_files)}, on
synthetic fleets of the exporter's real series shape{flags}: {exporter_series:,} exporter series per
node, plus cAdvisor's and kube-state-metrics' ({len(template):,} in all), scraped every
{SCRAPE_SECONDS:g} s from a server in the benchmark (none while measuring, Prometheus restarted without scrape
jobs: the rules' cost alone),
with the history the rules read over ranges backfilled; one Prometheus {version} evaluating every rule one
after another (a group's cost is the sum of its rules': the group with a core to itself), on a
2-core machine shared with other work. Prometheus' CPU per second of rule evaluation says how
much of the machine the rules had: above 1 s, Go's garbage collector (marking a heap of millions
of series) and the TSDB's upkeep ran beside them on the same two cores, and the rules' times
include that wait.

{table}
"""
    return BenchResult(
        title=f"Rule evaluation cost per group (synthetic fleets, one Prometheus {version})",
        command=command,
        peer=f"the goal: every group under {GOAL_MS:g} ms per cycle at 1,000 nodes",
        ratio=ratio,
        summary=(
            f"Slowest group at {largest.nodes:,} nodes: `{slowest[0]}` {slowest[1] * 1000:.1f} ms per cycle, "
            f"{ratio:.2f}x the {GOAL_MS:g} ms goal."
            if largest and ratio is not None
            else "Nothing measured."
        ),
        markdown=markdown,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default=",".join(str(n) for n in NODE_COUNTS), help="comma-separated fleet sizes")
    parser.add_argument(
        "--rules",
        type=Path,
        action="append",
        default=[],
        help="a rule file, repeatable (default: alerts/ccl-health-rules.yaml and alerts/ccl-health-global-rules.yaml)",
    )
    parser.add_argument("--cycles", type=int, default=CYCLES)
    parser.add_argument("--max-samples", type=int, default=MAX_SAMPLES, help="largest raw history to backfill")
    parser.add_argument(
        "--exporter-arg",
        action="append",
        default=[],
        help="a flag for the template's python -m ccl_sim serve, e.g. --collector.nvml.nvlink-granularity=gpu",
    )
    parser.add_argument(
        "--prometheus",
        help="the Prometheus binary to measure with (default: the one on PATH; promtool from PATH backfills)",
    )
    args = parser.parse_args(argv)
    counts = [int(n) for n in str(args.nodes).split(",") if n]
    print(run(counts, args.rules, args.cycles, args.max_samples, args.exporter_arg, args.prometheus).section())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A local monitoring stack on 127.0.0.1: Prometheus, Alertmanager and a webhook receiver.

``make demo``, the end-to-end tests and the fleet benchmark all start the real
``prometheus`` and ``prometheus-alertmanager`` binaries (Debian packages of those names)
through this module, with generated configs in a temporary folder, our alert rules loaded,
and every notification Alertmanager sends recorded with the time it arrived.

Everything listens on loopback only. ``Stack.stop()`` (or leaving the ``with`` block) stops
each process it started and waits for its PID, so ports and folders can be reused at once.

Pitfalls this module handles (all measured on Prometheus 2.42 / Alertmanager 0.25):
the first scrape comes ~5 s after start whatever the scrape interval (wait for ``up``, not
``/-/ready``); Alertmanager's HA gossip must be switched off (``--cluster.listen-address=``)
or it listens on every interface; both take 1-2 s to exit on SIGTERM.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any

PROMETHEUS_NAMES = ("prometheus",)
ALERTMANAGER_NAMES = ("prometheus-alertmanager", "alertmanager")  # Debian name first, upstream second
SCRAPE_JOB = "ccl-exporter"  # the scrape job our rules expect (up{job="ccl-exporter"})
RULES_FILE = Path("alerts") / "ccl-health-rules.yaml"  # node-level rules
GLOBAL_RULES_FILE = Path("alerts") / "ccl-health-global-rules.yaml"  # rules across nodes
LOOPBACK = "127.0.0.1"
# The request headers Prometheus (2.49 and later, default scrape_protocols) scrapes with:
# OpenMetrics first, then the text format, and gzip.
PROMETHEUS_SCRAPE_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
    "Accept-Encoding": "gzip",
}


def find_binary(names: Sequence[str]) -> str | None:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    return None


def free_loopback_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def port_if_free(port: int) -> int:
    """``port`` when nothing listens on it on loopback, else some free port."""
    with socket.socket() as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return free_loopback_port()
    return port


def find_rules_file(start: Path | None = None) -> Path | None:
    """Our node-level rules: ``alerts/ccl-health-rules.yaml`` in the working folder or the source checkout."""
    candidates = [(start or Path.cwd()) / RULES_FILE, Path(__file__).resolve().parents[1] / RULES_FILE]
    return next((path for path in candidates if path.is_file()), None)


def find_rule_files(start: Path | None = None) -> list[Path]:
    """All our rules, as one Prometheus loads them: the node-level file and the global one
    (``alerts/ccl-health-global-rules.yaml`` beside it); [] when they are not found."""
    rules = find_rules_file(start)
    if rules is None or not (rules.parent / GLOBAL_RULES_FILE.name).is_file():
        return []
    return [rules, rules.parent / GLOBAL_RULES_FILE.name]


OPERATOR_DEFAULT_INTERVAL_SECONDS = 30.0  # Prometheus Operator's scrapeInterval/evaluationInterval default
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def duration_seconds(text: str) -> float:
    """A Prometheus duration (``1h30m``, ``5m``, ``250ms``) in seconds."""
    parts = re.findall(r"(\d+)(ms|[smhdwy])", text)
    if not parts or "".join(a + b for a, b in parts) != text:
        raise ValueError(f"not a Prometheus duration: {text!r}")
    return float(sum(int(amount) * _UNIT_SECONDS[unit] for amount, unit in parts))


def _duration(seconds: float) -> str:
    """Prometheus duration syntax: whole milliseconds."""
    return f"{max(1, round(seconds * 1000))}ms"


@dataclass(frozen=True)
class Intervals:
    """How fast the stack reacts. Tests use short ones; ``shipped()`` is what users get."""

    scrape_seconds: float = 1.0
    evaluation_seconds: float = 1.0
    group_wait_seconds: float = 1.0
    group_interval_seconds: float = 1.0
    repeat_interval_seconds: float = 3600.0

    @classmethod
    def shipped(cls, checkout: Path | None = None) -> Intervals:
        """What a user of our manifests gets: the PodMonitor's scrape ``interval`` (read from
        ``manifests/base/podmonitor.yaml`` when the checkout has it), rule evaluation at the
        Prometheus Operator's default ``evaluationInterval`` (30 s; groups that set their own
        ``interval`` in the rules file keep it, as in Prometheus), and the timing of the
        critical route of ``alerts/alertmanager.yml`` (Alertmanager's defaults without it:
        group_wait 30 s, group_interval 5 m, repeat_interval 4 h)."""
        root = checkout or Path(__file__).resolve().parents[1]
        scrape = pod_monitor_endpoint(root).get("interval")
        route = _critical_route(root / "alerts" / "alertmanager.yml")
        return cls(
            scrape_seconds=duration_seconds(scrape) if scrape else OPERATOR_DEFAULT_INTERVAL_SECONDS,
            evaluation_seconds=OPERATOR_DEFAULT_INTERVAL_SECONDS,
            group_wait_seconds=duration_seconds(route.get("group_wait", "30s")),
            group_interval_seconds=duration_seconds(route.get("group_interval", "5m")),
            repeat_interval_seconds=duration_seconds(route.get("repeat_interval", "4h")),
        )


# The PodMonitor's relabeling fields, as prometheus.yml (and vmagent) spell them.
_RELABEL_KEYS = {
    "sourceLabels": "source_labels",
    "targetLabel": "target_label",
    "separator": "separator",
    "regex": "regex",
    "modulus": "modulus",
    "replacement": "replacement",
    "action": "action",
}


def pod_monitor_endpoint(checkout: Path | None = None) -> dict[str, Any]:
    """The scrape endpoint of ``manifests/base/podmonitor.yaml`` as the file has it (interval,
    relabelings...), or {} where the checkout has no such file."""
    root = checkout or Path(__file__).resolve().parents[1]
    podmonitor = root / "manifests" / "base" / "podmonitor.yaml"
    if not podmonitor.is_file():
        return {}
    import yaml

    (endpoint,) = yaml.safe_load(podmonitor.read_text())["spec"]["podMetricsEndpoints"]
    return dict(endpoint)


def pod_monitor_metric_relabelings(checkout: Path | None = None) -> list[dict[str, Any]]:
    """The PodMonitor's ``metricRelabelings`` as ``metric_relabel_configs``: what the scrapes
    here apply, so that the rules read the labels our PodMonitor gives (``ccl_rule_partition``
    on the NCCL Inspector's counters)."""
    return relabel_configs(pod_monitor_endpoint(checkout).get("metricRelabelings", []))


def relabel_configs(steps: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Prometheus Operator relabeling steps (``sourceLabels``, ``targetLabel``, ...) as prometheus.yml
    spells them (``source_labels``, ``target_label``, ...)."""
    return [{_RELABEL_KEYS[key]: value for key, value in step.items()} for step in steps]


def _critical_route(config: Path) -> dict[str, str]:
    """The first sub-route for critical alerts in our example Alertmanager config, or {}."""
    if not config.is_file():
        return {}
    import yaml

    route = (yaml.safe_load(config.read_text()) or {}).get("route", {})
    for sub in route.get("routes", []):
        if any('severity="critical"' in m for m in sub.get("matchers", [])):
            return {k: str(v) for k, v in sub.items() if isinstance(v, str)}
    return {}


@dataclass(frozen=True)
class ScrapeTarget:
    address: str  # host:port
    labels: Mapping[str, str] = field(default_factory=dict)  # target labels, e.g. {"node": "gpu-node-01"}


def prometheus_config(
    targets: Sequence[ScrapeTarget],
    rule_files: Sequence[Path],
    alertmanager_address: str | None,
    intervals: Intervals,
    job_name: str = SCRAPE_JOB,
    other_jobs: Mapping[str, Sequence[ScrapeTarget]] | None = None,
) -> dict[str, Any]:
    """A prometheus.yml (as a dict; JSON is valid YAML) that scrapes ``targets`` like our PodMonitor:
    ``honor_labels`` so the training pod's namespace/pod labels win, ``node`` as a target label,
    the PodMonitor's metric relabelings. ``other_jobs`` adds scrape jobs (e.g. a kube-state-metrics
    stand-in), also with honor_labels."""
    scrape_timeout = min(intervals.scrape_seconds, 10.0)
    jobs = {job_name: targets, **(other_jobs or {})}
    relabelings = pod_monitor_metric_relabelings()
    config: dict[str, Any] = {
        "global": {
            "scrape_interval": _duration(intervals.scrape_seconds),
            "scrape_timeout": _duration(scrape_timeout),
            "evaluation_interval": _duration(intervals.evaluation_seconds),
        },
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [
            {
                "job_name": name,
                "honor_labels": True,
                "static_configs": [{"targets": [t.address], "labels": dict(t.labels)} for t in job_targets],
                **({"metric_relabel_configs": relabelings} if name == job_name and relabelings else {}),
            }
            for name, job_targets in jobs.items()
        ],
    }
    if alertmanager_address:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager_address]}]}]}
    return config


def alertmanager_config(webhook_url: str, intervals: Intervals) -> dict[str, Any]:
    return {
        "route": {
            "receiver": "webhook",
            "group_by": ["alertname", "namespace", "job_name", "node"],
            "group_wait": _duration(intervals.group_wait_seconds),
            "group_interval": _duration(intervals.group_interval_seconds),
            "repeat_interval": _duration(intervals.repeat_interval_seconds),
        },
        "receivers": [{"name": "webhook", "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}],
    }


# --------------------------------------------------------------------------------------------
# Webhook receiver


@dataclass(frozen=True)
class Notification:
    received_at: float  # wall clock (time.time()), comparable with Prometheus' activeAt
    payload: dict[str, Any]

    @property
    def status(self) -> str:
        return str(self.payload.get("status", ""))

    @property
    def alerts(self) -> list[dict[str, Any]]:
        return list(self.payload.get("alerts", []))


def alert_matches(labels: Mapping[str, str], alertname: str, match: Mapping[str, str] | None) -> bool:
    if labels.get("alertname") != alertname:
        return False
    return all(labels.get(key) == value for key, value in (match or {}).items())


class WebhookReceiver:
    """Alertmanager's webhook target: records each POSTed notification (bounded) with its arrival time."""

    def __init__(self, max_notifications: int = 10_000) -> None:
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._notifications: list[Notification] = []
        self._max = max_notifications
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = min(int(self.headers.get("Content-Length") or 0), 16 * 1024 * 1024)
                body = self.rfile.read(length)
                try:
                    payload = json.loads(body)
                    status = 200
                except ValueError:
                    payload, status = None, 400
                if isinstance(payload, dict):
                    receiver._record(Notification(time.time(), payload))
                self.send_response(status)
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://{LOOPBACK}:{self._server.server_address[1]}/alerts"
        self._thread = threading.Thread(target=self._server.serve_forever, name="webhook-receiver", daemon=True)

    def _record(self, notification: Notification) -> None:
        with self._arrived:
            if len(self._notifications) < self._max:
                self._notifications.append(notification)
            self._arrived.notify_all()

    def start(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    @property
    def notifications(self) -> list[Notification]:
        with self._lock:
            return list(self._notifications)

    def wait_for(self, predicate: Callable[[Notification], bool], timeout: float) -> Notification | None:
        """The first notification (already here or arriving within ``timeout``) that satisfies ``predicate``."""
        deadline = time.monotonic() + timeout
        seen = 0
        with self._arrived:
            while True:
                for notification in self._notifications[seen:]:
                    if predicate(notification):
                        return notification
                seen = len(self._notifications)
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._arrived.wait(min(left, 0.5))

    def wait_alert(
        self, alertname: str, status: str, timeout: float, match: Mapping[str, str] | None = None
    ) -> tuple[Notification, dict[str, Any]] | None:
        """The first notification carrying ``alertname`` with ``status`` (firing/resolved) and labels ``match``."""
        found: dict[str, Any] = {}

        def wanted(notification: Notification) -> bool:
            for alert in notification.alerts:
                if alert.get("status") == status and alert_matches(alert.get("labels", {}), alertname, match):
                    found["alert"] = alert
                    return True
            return False

        notification = self.wait_for(wanted, timeout)
        return None if notification is None else (notification, found["alert"])

    def alertnames(self, status: str = "firing") -> set[str]:
        return {
            alert.get("labels", {}).get("alertname", "")
            for notification in self.notifications
            for alert in notification.alerts
            if alert.get("status") == status
        }


class StaticMetricsServer:
    """Serves an exposition text on /metrics: a stand-in for a target we do not run here
    (kube-state-metrics' ``kube_node_status_capacity``, which the exporter-absent alert joins on).
    ``text`` is the page, or a function that renders it at each scrape."""

    def __init__(self, text: str | Callable[[], str]) -> None:
        self.text = text
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = server.page().encode()
                self.send_response(200 if self.path.startswith("/metrics") else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self._server.daemon_threads = True
        self.address = f"{LOOPBACK}:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="static-metrics", daemon=True)
        self._thread.start()

    def page(self) -> str:
        return self.text() if callable(self.text) else self.text

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def gpu_node_capacity_metrics(nodes: Iterable[str], gpus_per_node: int = 8) -> str:
    """kube-state-metrics' view of GPU nodes, as the exporter-absent alert expects it."""
    lines = ["# TYPE kube_node_status_capacity gauge"]
    lines += [
        f'kube_node_status_capacity{{node="{node}",resource="nvidia_com_gpu",unit="integer"}} {gpus_per_node}'
        for node in nodes
    ]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Server processes


def http_json(url: str, data: bytes | None = None, timeout: float = 10.0) -> Any:
    request = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read() or b"null")


def wait_answering(url: str, proc: subprocess.Popen[bytes], what: str, timeout: float) -> bool:
    """Poll ``url`` until it answers 200 (True), the process exits (RuntimeError) or ``timeout`` passes (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2.0) as response:
                if response.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


def read_tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a process' log file ("" when it cannot be read)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def stop_process(proc: subprocess.Popen[bytes] | None, timeout: float = 15.0) -> None:
    """SIGTERM, wait for the PID; SIGKILL if it does not exit within ``timeout``."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


class ManagedProcess:
    """A server binary started on loopback with a generated config, logging to a file, stopped by PID."""

    name = "process"
    ready_path = "/-/ready"  # answers 200 once the server is ready

    def __init__(
        self, binary: str, workdir: Path, config: Mapping[str, Any] | None = None, port: int | None = None
    ) -> None:
        self.binary = binary
        self.workdir = workdir
        self.port = port or free_loopback_port()
        self.address = f"{LOOPBACK}:{self.port}"
        self.url = f"http://{self.address}"
        self.log_path = workdir / f"{self.name}.log"
        self.config_path = workdir / f"{self.name}.yml"
        self.proc: subprocess.Popen[bytes] | None = None
        self.workdir.mkdir(parents=True, exist_ok=True)
        if config is not None:
            self.write_config(config)

    def write_config(self, config: Mapping[str, Any]) -> None:
        self.config_path.write_text(json.dumps(config, indent=2))  # JSON is valid YAML

    def own_flags(self) -> list[str]:
        return []

    def argv(self) -> list[str]:
        return [
            self.binary,
            f"--config.file={self.config_path}",
            *self.own_flags(),
            f"--web.listen-address={self.address}",
            f"--web.external-url={self.url}/",
            "--log.level=warn",
        ]

    def start(self, ready_timeout: float = 30.0) -> None:
        with open(self.log_path, "ab") as log_file:
            self.proc = subprocess.Popen(
                self.argv(), stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        try:
            if wait_answering(self.url + self.ready_path, self.proc, self.name, ready_timeout):
                return
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}: {self.log_tail()}") from None
        self.stop()
        raise TimeoutError(f"{self.name} not ready within {ready_timeout}s: {self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        return read_tail(self.log_path, lines)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def stop(self, timeout: float = 15.0) -> None:
        stop_process(self.proc, timeout)


class Alertmanager(ManagedProcess):
    name = "alertmanager"

    def own_flags(self) -> list[str]:
        # No HA gossip: by default it listens on every interface and advertises a non-loopback address.
        return [f"--storage.path={self.workdir / 'alertmanager-data'}", "--cluster.listen-address="]

    def alerts(self) -> list[dict[str, Any]]:
        return list(http_json(self.url + "/api/v2/alerts") or [])


class QueryApi(ManagedProcess):
    """A server that answers Prometheus' HTTP API under ``/api/v1``: Prometheus itself, and
    VictoriaMetrics and vmalert (``devtools.vmstack``) for the parts each serves (queries;
    alerts and rule groups)."""

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        body = http_json(f"{self.url}/api/v1/{path}" + (f"?{query}" if query else ""))
        if body.get("status") != "success":
            raise RuntimeError(f"{self.name} {path}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant vector query; returns the result list (``[{"metric": {...}, "value": [t, "v"]}, ...]``)."""
        data = self.api("query", query=expr)
        result = data["result"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": result}]
        return list(result)

    def values(self, expr: str) -> list[float]:
        return [float(sample["value"][1]) for sample in self.query(expr)]

    def alerts(self) -> list[dict[str, Any]]:
        return list(self.api("alerts")["alerts"] or [])  # vmalert answers null for none

    def rule_groups(self) -> list[dict[str, Any]]:
        return list(self.api("rules")["groups"] or [])

    def wait_until(self, check: Callable[[], Any], timeout: float, what: str, poll: float = 0.1) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = check()
            except (OSError, RuntimeError, ValueError):
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: {what} not seen within {timeout}s")
            time.sleep(poll)

    def wait_alert(
        self, alertname: str, state: str, timeout: float, match: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """The first alert in /api/v1/alerts named ``alertname`` in ``state`` (pending/firing) with labels ``match``."""

        def find() -> dict[str, Any] | None:
            for alert in self.alerts():
                if alert.get("state") == state and alert_matches(alert.get("labels", {}), alertname, match):
                    return alert
            return None

        found = self.wait_until(find, timeout, f"alert {alertname} {state} {dict(match or {})}")
        return found  # type: ignore[no-any-return]  # find() gives a dict or keeps waiting

    def firing_alertnames(self) -> set[str]:
        return {a["labels"]["alertname"] for a in self.alerts() if a.get("state") == "firing"}


class Prometheus(QueryApi):
    name = "prometheus"

    def own_flags(self) -> list[str]:
        return [f"--storage.tsdb.path={self.workdir / 'tsdb'}", "--web.enable-lifecycle"]

    def backfill(self, openmetrics: str, promtool: str | None = None) -> None:
        """Write history into the TSDB before ``start()``: ``promtool tsdb create-blocks-from
        openmetrics`` (the text must end with ``# EOF``; timestamps in seconds)."""
        if self.alive:
            raise RuntimeError("backfill before start(): Prometheus loads blocks when it opens the TSDB")
        promtool = promtool or find_binary(("promtool",))
        if promtool is None:
            raise StackUnavailable("promtool is not installed (it comes with the prometheus package)")
        source = self.workdir / "backfill.om"
        source.write_text(openmetrics)
        done = subprocess.run(
            [promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(self.workdir / "tsdb")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(f"promtool backfill failed: {done.stderr.strip() or done.stdout.strip()}")

    def reload(self) -> None:
        http_json(self.url + "/-/reload", data=b"")

    def wait_targets_up(self, count: int, timeout: float = 60.0, job_name: str = SCRAPE_JOB) -> None:
        self.wait_until(
            lambda: len(self.values(f'up{{job="{job_name}"}} == 1')) >= count,
            timeout,
            f"{count} targets up",
        )


# --------------------------------------------------------------------------------------------
# The whole stack


class StackUnavailable(RuntimeError):
    """A binary the stack needs is not installed."""


@dataclass
class Stack:
    """Prometheus (+ Alertmanager + webhook receiver when ``alerting``) scraping ``targets``."""

    workdir: Path
    targets: Sequence[ScrapeTarget]
    rule_files: Sequence[Path] = ()
    intervals: Intervals = field(default_factory=Intervals)
    alerting: bool = True
    other_jobs: Mapping[str, Sequence[ScrapeTarget]] = field(default_factory=dict)
    backfill: str = ""  # OpenMetrics history written into the TSDB before Prometheus starts
    prometheus_port: int | None = None  # None: any free loopback port
    alertmanager_port: int | None = None
    prometheus_binary: str | None = None
    alertmanager_binary: str | None = None
    receiver: WebhookReceiver | None = None
    alertmanager: Alertmanager | None = None
    prometheus: Prometheus | None = None

    def start(self) -> Stack:
        prometheus_binary = self.prometheus_binary or find_binary(PROMETHEUS_NAMES)
        if not prometheus_binary:
            raise StackUnavailable("prometheus is not installed (apt-get install prometheus)")
        alertmanager_binary = self.alertmanager_binary or find_binary(ALERTMANAGER_NAMES)
        if self.alerting and not alertmanager_binary:
            raise StackUnavailable("prometheus-alertmanager is not installed (apt-get install prometheus-alertmanager)")
        try:
            alertmanager_address = None
            if self.alerting:
                assert alertmanager_binary is not None
                self.receiver = WebhookReceiver().start()
                self.alertmanager = Alertmanager(
                    alertmanager_binary,
                    self.workdir / "alertmanager",
                    alertmanager_config(self.receiver.url, self.intervals),
                    port=self.alertmanager_port,
                )
                self.alertmanager.start()
                alertmanager_address = self.alertmanager.address
            self.prometheus = Prometheus(
                prometheus_binary,
                self.workdir / "prometheus",
                prometheus_config(
                    self.targets, self.rule_files, alertmanager_address, self.intervals, other_jobs=self.other_jobs
                ),
                port=self.prometheus_port,
            )
            if self.backfill:
                self.prometheus.backfill(self.backfill)
            self.prometheus.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for process in (self.prometheus, self.alertmanager):
            if process is not None:
                process.stop()
        if self.receiver is not None:
            self.receiver.stop()
            self.receiver = None

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def processes(self) -> Iterable[ManagedProcess]:
        return [p for p in (self.prometheus, self.alertmanager) if p is not None]


# --------------------------------------------------------------------------------------------
# Simulated exporters


# The simulated node's distribution in this checkout (sim/ccl_sim): put first on the path of the
# processes it starts, so that they run this checkout's simulator whatever is installed.
SIMULATOR_ROOT = Path(__file__).resolve().parent.parent / "sim"


def simulated_serve_argv(*args: str) -> list[str]:
    """The command line of ``ccl-exporter serve`` on a simulated node (``python -m ccl_sim serve``),
    with ``args`` (any ``serve`` flag, and ``--seed``, ``--tick``, ``--job-ends-after``)."""
    import sys

    return [sys.executable, "-m", "ccl_sim", "serve", *args]


def simulator_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with this checkout's simulator first on ``PYTHONPATH``, so that ``python -m ccl_sim``
    runs it from any working directory."""
    paths = [str(SIMULATOR_ROOT), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    return {**env, "PYTHONPATH": os.pathsep.join(paths)}


class SimulatedExporter:
    """``ccl-exporter serve`` on a simulated node (``python -m ccl_sim serve``) in a subprocess on a
    loopback port, driven through ``/-/sim``."""

    def __init__(
        self,
        node: str,
        seed: int = 7,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        log_path: Path | None = None,
    ) -> None:
        self.node = node
        self.port = port or free_loopback_port()
        self.address = f"{LOOPBACK}:{self.port}"
        self.url = f"http://{self.address}"
        self.argv = simulated_serve_argv(
            f"--web.listen-address={self.address}", f"--seed={seed}", "--log.level=warning", *extra_args
        )
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        # Where its output goes without a log_path: kept until stop(), so that an exporter that
        # exits at start says why.
        self._output: IO[bytes] | None = None
        # Its TMPDIR, where the simulated node lays out its folders, removed by stop(): a process
        # killed on purpose (kill()) cannot remove its own.
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def target(self) -> ScrapeTarget:
        return ScrapeTarget(self.address, {"node": self.node})

    def _output_path(self) -> Path:
        if self.log_path:
            return self.log_path
        if self._output is None:
            self._output = tempfile.NamedTemporaryFile(prefix=f"exporter-{self.node}-", suffix=".log")  # noqa: SIM115 - closed by stop()
        return Path(self._output.name)

    def start(self, wait: bool = True) -> SimulatedExporter:
        if self._tmpdir is None:
            self._tmpdir = tempfile.TemporaryDirectory(prefix=f"exporter-{self.node}-tmp-")
        env = simulator_env({**os.environ, "TMPDIR": self._tmpdir.name})
        with open(self._output_path(), "ab") as log_file:
            self.proc = subprocess.Popen(
                self.argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
        if wait:
            self.wait_ready()
        return self

    def output_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines the exporter wrote (its log file, or the kept output)."""
        return read_tail(self._output_path(), lines)

    def wait_ready(self, timeout: float = 30.0) -> None:
        assert self.proc is not None, "start() first"
        try:
            if wait_answering(self.url + "/healthz", self.proc, f"exporter for {self.node}", timeout):
                return
        except RuntimeError as exited:
            raise RuntimeError(f"{exited}: {self.output_tail()}") from None
        tail = self.output_tail()
        self.stop()
        raise TimeoutError(f"exporter for {self.node} not answering within {timeout}s: {tail}")

    def act(self, action: str, **params: object) -> dict[str, Any]:
        """Perform a simulation action (see ccl_sim/control.py); returns its JSON answer."""
        query = urllib.parse.urlencode({key: str(value) for key, value in params.items()})
        url = f"{self.url}/-/sim/{action}" + (f"?{query}" if query else "")
        try:
            return dict(http_json(url, data=b""))
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"{action} on {self.node}: {exc.code} {exc.read().decode(errors='replace')}") from None

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10.0) as response:
            return response.read().decode()

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def kill(self) -> None:
        """Die without a clean shutdown, as an OOM-killed or crashed exporter would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self, timeout: float = 10.0) -> None:
        stop_process(self.proc, timeout)
        if self._output is not None:
            self._output.close()
            self._output = None
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None


def start_exporters(
    count: int, node_prefix: str = "gpu-node-", first_seed: int = 1, extra_args: Sequence[str] = ()
) -> list[SimulatedExporter]:
    """``count`` simulated nodes (``gpu-node-01`` ...), started together, then waited for."""
    width = max(2, len(str(count)))
    exporters = [
        SimulatedExporter(f"{node_prefix}{i + 1:0{width}d}", seed=first_seed + i, extra_args=extra_args)
        for i in range(count)
    ]
    try:
        for exporter in exporters:
            exporter.start(wait=False)
        for exporter in exporters:
            exporter.wait_ready(timeout=60.0 + count)
    except BaseException:
        stop_all(exporters)
        raise
    return exporters


def builtin_fallback_pods() -> list[tuple[str, str]]:
    """(namespace, pod) of the simulated node's pods that start on TCP (its built-in fallback example)."""
    from ccl_sim.podlogs import default_jobs

    return [(job.namespace, job.pod) for job in default_jobs() if job.network == "Socket" and job.nnodes > 1]


def builtin_crossed_rail_pods() -> list[tuple[str, str]]:
    """(namespace, pod) of the simulated node's pods whose NCCL traffic crosses rails (its built-in
    NIC-affinity example)."""
    from ccl_sim.podlogs import default_jobs

    return [(job.namespace, job.pod) for job in default_jobs() if job.rails == "crossed"]


def make_healthy(exporters: Iterable[SimulatedExporter]) -> None:
    """Remove the built-in fallback and crossed-rail examples from every node: what is left is a
    healthy fleet."""
    for exporter in exporters:
        for namespace, pod in builtin_fallback_pods() + builtin_crossed_rail_pods():
            exporter.act("nccl-job-stop", namespace=namespace, pod=pod)


def stop_all(exporters: Iterable[SimulatedExporter]) -> None:
    exporters = list(exporters)
    for exporter in exporters:
        if exporter.proc is not None and exporter.proc.poll() is None:
            exporter.proc.terminate()
    for exporter in exporters:
        exporter.stop()

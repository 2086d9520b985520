"""The simulated node's kubelet Summary API: each pod's network bytes over real HTTP.

A loopback HTTP server answers ``GET /stats/summary`` in the kubelet's shape
(``exporter.sources.kubelet_stats.summary_document``) for the node's pods: those holding its
GPUs (the simulated NVML's assignments) and those with logs. Every pod's ``eth0`` counters grow
at its own rates on each tick: background chatter (a few kB/s) unless ``set_traffic`` gave it
more, as a job whose collectives fell back to TCP does. The exporter reads it with the same
client it uses against a real kubelet (without TLS and token: the real path is tested against
an HTTPS server of the tests).
"""

from __future__ import annotations

import functools
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from ccl_sim.clock import SimClock
from ccl_sim.nvml import SimNvml
from exporter.sources.kube import PodMetadataSource
from exporter.sources.kubelet_stats import summary_document

CHATTER_BYTES_PER_SECOND = 20e3  # metrics, logs, heartbeats: what every pod sends and receives
SUMMARY_PATH = "/stats/summary"
SHUTDOWN_POLL_SECONDS = 0.05

PodKey = tuple[str, str]


@dataclass
class _PodTraffic:
    transmit_rate: float = CHATTER_BYTES_PER_SECOND
    receive_rate: float = CHATTER_BYTES_PER_SECOND
    transmit_bytes: float = 0.0
    receive_bytes: float = 0.0


@dataclass
class SimKubeletStats:
    """See the module docstring."""

    nvml: SimNvml
    pods: PodMetadataSource
    _traffic: dict[PodKey, _PodTraffic] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._server is None:
            return ""
        return f"http://127.0.0.1:{self._server.server_port}{SUMMARY_PATH}"

    def _node_pods(self) -> set[PodKey]:
        held = {(a.namespace, a.pod) for a in self.nvml.assignments()}
        return held | {(p.namespace, p.name) for p in self.pods.pods()}

    def setup(self, root: Path) -> None:
        stats = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != SUMMARY_PATH:
                    self.send_error(404)
                    return
                body = json.dumps(stats.summary()).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                """Quiet: the exporter's scrapes would fill the log."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        # A short poll: close() waits for the serving loop to see the shutdown, at most one poll.
        serve = functools.partial(self._server.serve_forever, poll_interval=SHUTDOWN_POLL_SECONDS)
        self._thread = threading.Thread(target=serve, name="sim-kubelet", daemon=True)
        self._thread.start()

    def advance(self, clock: SimClock) -> None:
        pods = self._node_pods()
        with self._lock:
            for key in pods:
                traffic = self._traffic.setdefault(key, _PodTraffic())
                traffic.transmit_bytes += traffic.transmit_rate * clock.step_seconds
                traffic.receive_bytes += traffic.receive_rate * clock.step_seconds

    def set_traffic(
        self, namespace: str, pod: str, transmit_bytes_per_second: float, receive_bytes_per_second: float
    ) -> None:
        """From the next tick on, the pod's interface moves these bytes/s."""
        with self._lock:
            traffic = self._traffic.setdefault((namespace, pod), _PodTraffic())
            traffic.transmit_rate, traffic.receive_rate = transmit_bytes_per_second, receive_bytes_per_second

    def summary(self) -> dict[str, object]:
        pods = self._node_pods()
        with self._lock:
            counters = {key: self._traffic.get(key, _PodTraffic()) for key in sorted(pods)}
            return summary_document(
                (namespace, pod, {"eth0": (int(t.receive_bytes), int(t.transmit_bytes))})
                for (namespace, pod), t in counters.items()
            )

    def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(5)

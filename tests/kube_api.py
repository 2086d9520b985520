"""A recorded-response Kubernetes API server for tests: no real API server can run here.

It answers, on 127.0.0.1, the real API paths the exporter calls with the real ``kubernetes``
client: the node-filtered pod list and its watch (newline-delimited JSON events, chunked, held
open like the API server holds a watch), the namespace list, a node's status, and the writes of
the lifecycle hooks: ``PATCH .../pods/<name>/status`` and ``PATCH /api/v1/nodes/<name>/status``
(strategic merge patches only, merged into the stored object's ``status.conditions`` by
``type``, as the API server does; any other patch type is refused 415) and
``POST .../events`` (409 for a name that exists). Every request is recorded with its time.
``fail_writes`` answers writes 503 (the API server down); ``write_delay`` holds each write.
"""

from __future__ import annotations

import copy
import functools
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

STRATEGIC_MERGE = "application/strategic-merge-patch+json"


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    content_type: str
    body: Any
    at: float  # time.monotonic() when the request arrived
    status: int = 0


@dataclass
class ApiState:
    pods: list[dict[str, Any]] = field(default_factory=list)
    namespaces: list[dict[str, Any]] = field(default_factory=list)
    watch_events: list[dict[str, Any]] = field(default_factory=list)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    requests: list[Recorded] = field(default_factory=list)
    fail_writes: bool = False
    write_delay: float = 0.0
    release: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def queries(self) -> list[dict[str, list[str]]]:
        return [r.query for r in self.requests if r.method == "GET"]

    def writes(self, kind: str | None = None) -> list[Recorded]:
        """Successful writes, oldest first; ``kind`` is ``pods/status``, ``nodes/status`` or ``events``."""
        with self.lock:
            done = [r for r in self.requests if r.method in ("PATCH", "POST") and r.status in (200, 201)]
        if kind == "events":
            return [r for r in done if r.path.endswith("/events")]
        if kind is not None:
            resource = kind.split("/")[0]
            return [r for r in done if f"/{resource}/" in r.path and r.path.endswith("/status")]
        return done

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return next(
            (p for p in self.pods if p["metadata"]["namespace"] == namespace and p["metadata"]["name"] == name), None
        )

    def condition(self, obj: dict[str, Any] | None, condition_type: str) -> dict[str, Any] | None:
        if obj is None:
            return None
        return next((c for c in obj.get("status", {}).get("conditions", []) if c.get("type") == condition_type), None)


def merge_conditions(obj: dict[str, Any], patch: dict[str, Any]) -> None:
    """The API server's strategic merge of ``status.conditions`` (merge key ``type``)."""
    status = obj.setdefault("status", {})
    conditions = status.setdefault("conditions", [])
    for entry in patch.get("status", {}).get("conditions", []):
        existing = next((c for c in conditions if c.get("type") == entry["type"]), None)
        if existing is None:
            conditions.append({k: v for k, v in entry.items() if v is not None})
        else:
            for key, value in entry.items():
                if value is None:
                    existing.pop(key, None)
                else:
                    existing[key] = value


def _handler(state: ApiState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _record(self, body: Any = None) -> Recorded:
            url = urlparse(self.path)
            record = Recorded(
                self.command,
                url.path,
                parse_qs(url.query),
                self.headers.get("Content-Type", ""),
                body,
                time.monotonic(),
            )
            with state.lock:
                state.requests.append(record)
            return record

        def send_json(self, document: dict[str, Any], status: int = 200, record: Recorded | None = None) -> None:
            if record is not None:
                record.status = status
            body = json.dumps(document).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def send_status(self, code: int, reason: str, record: Recorded) -> None:
            self.send_json(
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "message": reason,
                    "reason": reason,
                    "code": code,
                },
                code,
                record,
            )

        def do_GET(self) -> None:
            record = self._record()
            path, query = record.path, record.query
            if path == "/api/v1/namespaces":
                selector = query.get("labelSelector", [""])[0]
                items = [n for n in state.namespaces if not selector or selector in n["metadata"].get("labels", {})]
                self.send_json(
                    {"kind": "NamespaceList", "apiVersion": "v1", "metadata": {"resourceVersion": "9"}, "items": items},
                    record=record,
                )
            elif path.startswith("/api/v1/nodes/") and path.endswith("/status"):
                node = state.nodes.get(path.split("/")[4])
                if node is None:
                    self.send_status(404, "NotFound", record)
                else:
                    self.send_json(node, record=record)
            elif path == "/api/v1/pods" and query.get("watch") != ["true"]:
                with state.lock:
                    items = copy.deepcopy(state.pods)
                self.send_json(
                    {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "100"}, "items": items},
                    record=record,
                )
            elif path == "/api/v1/pods":
                record.status = 200
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for event in state.watch_events:
                    data = (json.dumps(event) + "\n").encode()
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()
                state.release.wait(5)  # hold the watch open like the API server does
                self.wfile.write(b"0\r\n\r\n")
            else:
                self.send_status(404, "NotFound", record)

        def _body(self) -> Any:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            return json.loads(raw) if raw else None

        def _write_allowed(self, record: Recorded) -> bool:
            if state.write_delay:
                time.sleep(state.write_delay)
            if state.fail_writes:
                self.send_status(503, "ServiceUnavailable", record)
                return False
            return True

        def do_PATCH(self) -> None:
            record = self._record(self._body())
            if not self._write_allowed(record):
                return
            if record.content_type.split(";")[0] != STRATEGIC_MERGE:
                self.send_status(415, "UnsupportedMediaType", record)  # the tests want strategic merges only
                return
            parts = record.path.split("/")
            with state.lock:
                if record.path.startswith("/api/v1/namespaces/") and record.path.endswith("/status"):
                    target = state.pod(parts[4], parts[6])
                elif record.path.startswith("/api/v1/nodes/") and record.path.endswith("/status"):
                    target = state.nodes.get(parts[4])
                else:
                    target = None
                if target is not None:
                    merge_conditions(target, record.body)
                    answer = copy.deepcopy(target)
            if target is None:
                self.send_status(404, "NotFound", record)
            else:
                self.send_json(answer, record=record)

        def do_POST(self) -> None:
            record = self._record(self._body())
            if not self._write_allowed(record):
                return
            parts = record.path.split("/")
            if len(parts) != 6 or parts[5] != "events":
                self.send_status(404, "NotFound", record)
                return
            key = (parts[4], record.body["metadata"]["name"])
            with state.lock:
                exists = key in state.events
                if not exists:
                    state.events[key] = record.body
            if exists:
                self.send_status(409, "AlreadyExists", record)
            else:
                self.send_json(record.body, 201, record)

    return Handler


class RecordedApiServer:
    """The server on 127.0.0.1 (a free port) with its ``state``; ``api_factory()`` for the client."""

    def __init__(self, state: ApiState | None = None) -> None:
        self.state = state or ApiState()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.state))
        self._server.daemon_threads = True
        # stop() waits for the serving loop to see the shutdown: at most one poll of 50 ms.
        serve = functools.partial(self._server.serve_forever, poll_interval=0.05)
        self._thread = threading.Thread(target=serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> RecordedApiServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.state.release.set()
        self._server.shutdown()
        self._server.server_close()

    def api_factory(self):  # type: ignore[no-untyped-def]
        return api_for(self.url)


def api_for(host: str):  # type: ignore[no-untyped-def]
    """A factory of the real ``CoreV1Api`` talking to ``host``."""
    from kubernetes import client

    configuration = client.Configuration()
    configuration.host = host
    return lambda: client.CoreV1Api(client.ApiClient(configuration))


def wait_for(predicate, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False

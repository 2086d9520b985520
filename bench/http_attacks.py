"""Hostile HTTP clients for bench/hostile_http.py: each runs against one loopback port until told to stop.

Every attack is bounded in count and time (its ``stop`` event, set by the benchmark after the
attack window) and speaks only to 127.0.0.1. Each keeps a few counters of what it saw.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import os
import select
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

LOOPBACK = "127.0.0.1"
METRICS_REQUEST = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
# A TLS record header announcing a 512-byte ClientHello, and its first bytes: the rest never comes.
PARTIAL_CLIENT_HELLO = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"
MALFORMED_HEADS = (
    b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: \xc2\xb2\r\n\r\n",  # a superscript two
    b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: +1\r\n\r\nx",
    b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxx",
    b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"GET /metrics HTTP/1.1\r\n Host: folded\r\n\r\n",
    b"GET /metrics HTTP/1.1\r\nHost : x\r\n\r\n",
    b"GET /metrics HTTP/1.1\nHost: x\n\n",
    b"\x16\x03\x01\x00\x05hello\r\n\r\n",
)


def _connect(port: int, timeout: float = 2.0, rcvbuf: int | None = None) -> socket.socket | None:
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(timeout)
    try:
        sock.connect((LOOPBACK, port))
    except OSError:
        sock.close()
        return None
    return sock


def _closed(sockets: list[socket.socket]) -> list[socket.socket]:
    """The sockets among ``sockets`` that the server closed or reset (readable with nothing, or an error)."""
    poller = select.poll()
    by_fd = {sock.fileno(): sock for sock in sockets}
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    gone = []
    for fd, _ in poller.poll(0):
        sock = by_fd[fd]
        try:
            if not sock.recv(65536, socket.MSG_DONTWAIT):
                gone.append(sock)
        except BlockingIOError:
            pass
        except OSError:
            gone.append(sock)
    return gone


@dataclass
class Attack:
    """One attack on one port; ``threads`` workers each run ``work`` until ``stop`` is set."""

    name: str
    threads: int = 1
    counts: Counter[str] = field(default_factory=Counter)

    def work(self, port: int, stop: threading.Event) -> None:
        raise NotImplementedError

    def start(self, port: int, stop: threading.Event) -> list[threading.Thread]:
        workers = [
            threading.Thread(target=self.work, args=(port, stop), name=f"{self.name}-{i}", daemon=True)
            for i in range(self.threads)
        ]
        for worker in workers:
            worker.start()
        return workers


@dataclass
class PipelineNoRead(Attack):
    """``clients`` connections that pipeline ``GET /metrics`` as fast as the socket takes it and never read."""

    clients: int = 64

    def work(self, port: int, stop: threading.Event) -> None:
        held: list[socket.socket | None] = [None] * self.clients
        while not stop.is_set():
            for i, sock in enumerate(held):
                if sock is None:
                    sock = held[i] = _connect(port, rcvbuf=4096)
                    if sock is None:
                        self.counts["refused"] += 1
                        continue
                    sock.setblocking(False)
                    self.counts["connections"] += 1
                try:
                    self.counts["requests"] += sock.send(METRICS_REQUEST * 16) // len(METRICS_REQUEST)
                except BlockingIOError:
                    pass
                except OSError:
                    sock.close()
                    held[i] = None
                    self.counts["closed by server"] += 1
            stop.wait(0.05)
        for sock in held:
            if sock is not None:
                sock.close()


@dataclass
class HeldConnections(Attack):
    """``connections`` connections held open, each sent ``first`` once (and ``drip`` every second);
    the ones the server closes are opened again."""

    connections: int = 1000
    first: bytes = b""
    drip: bytes = b""

    def work(self, port: int, stop: threading.Event) -> None:
        held: list[socket.socket] = []
        last_drip = time.monotonic()
        while not stop.is_set():
            for sock in _closed(held):
                held.remove(sock)
                sock.close()
                self.counts["closed by server"] += 1
            opened = 0
            while len(held) < self.connections and opened < 200 and not stop.is_set():
                sock = _connect(port, timeout=1.0)
                opened += 1
                if sock is None:
                    self.counts["refused"] += 1
                    break
                try:
                    if self.first:
                        sock.sendall(self.first)
                except OSError:
                    sock.close()
                    continue
                held.append(sock)
                self.counts["connections"] += 1
            if self.drip and time.monotonic() - last_drip >= 1.0:
                last_drip = time.monotonic()
                for sock in held:
                    with contextlib.suppress(OSError):
                        sock.send(self.drip, socket.MSG_DONTWAIT)
            self.counts["held at most"] = max(self.counts["held at most"], len(held))
            stop.wait(0.05)
        for sock in held:
            sock.close()


def _status_of(sock: socket.socket) -> str:
    try:
        answer = sock.recv(64)
    except OSError as exc:
        return type(exc).__name__
    if not answer:
        return "closed unanswered"
    parts = answer.split(b" ", 2)
    return parts[1].decode("ascii", "replace") if len(parts) > 1 else "garbage"


@dataclass
class Malformed(Attack):
    """Each worker sends the malformed heads in turn, one per connection, and notes the status."""

    threads: int = 4

    def work(self, port: int, stop: threading.Event) -> None:
        index = 0
        while not stop.is_set():
            sock = _connect(port)
            if sock is None:
                self.counts["refused"] += 1
                stop.wait(0.01)
                continue
            with sock:
                with contextlib.suppress(OSError):
                    sock.sendall(MALFORMED_HEADS[index % len(MALFORMED_HEADS)])
                self.counts[_status_of(sock)] += 1
            index += 1


@dataclass
class Oversized(Attack):
    """Heads over every sane limit (a 64 KiB line, 500 header fields) and a 1 GiB body streamed at the server."""

    threads: int = 4

    def work(self, port: int, stop: threading.Event) -> None:
        heads = (
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 65536 + b"\r\n\r\n",
            b"GET /metrics HTTP/1.1\r\n" + b"X-Many: b\r\n" * 500 + b"\r\n",
            b"GET /" + b"p" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        )
        chunk = b"z" * 65536
        index = 0
        while not stop.is_set():
            sock = _connect(port)
            if sock is None:
                self.counts["refused"] += 1
                stop.wait(0.01)
                continue
            with sock:
                try:
                    if index % 4 == 3:
                        sock.sendall(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1073741824\r\n\r\n")
                        deadline = time.monotonic() + 2.0
                        while time.monotonic() < deadline and not stop.is_set():
                            sock.sendall(chunk)
                            self.counts["body bytes sent"] += len(chunk)
                    else:
                        sock.sendall(heads[index % 3])
                except OSError:
                    pass
                self.counts[_status_of(sock)] += 1
            index += 1


def basic_auth(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@dataclass
class Requests(Attack):
    """Each worker sends ``GET path`` over keep-alive connections as fast as answered, with an
    ``Authorization`` header from ``authorization()`` (None: none)."""

    path: str = "/metrics"
    authorization: Callable[[], str | None] = lambda: None

    def work(self, port: int, stop: threading.Event) -> None:
        connection: http.client.HTTPConnection | None = None
        while not stop.is_set():
            if connection is None:
                connection = http.client.HTTPConnection(LOOPBACK, port, timeout=5)
            header = self.authorization()
            try:
                connection.request("GET", self.path, headers={"Authorization": header} if header else {})
                response = connection.getresponse()
                response.read()
                self.counts[str(response.status)] += 1
                if response.will_close:
                    connection.close()
                    connection = None
            except (OSError, http.client.HTTPException) as exc:
                self.counts[type(exc).__name__] += 1
                connection.close()
                connection = None
                stop.wait(0.01)


def wrong_passwords(user: str) -> Callable[[], str]:
    """A new wrong password for ``user`` on every call: nothing an attacker sends is ever cached."""
    return lambda: basic_auth(user, os.urandom(12).hex())


@dataclass
class Probe:
    """A well-behaved client: ``GET path`` every ``interval`` over one keep-alive connection; keeps
    each (status, seconds)."""

    port: int
    path: str
    authorization: str | None = None
    interval: float = 0.25
    scheme_tls: bool = False
    results: list[tuple[int, float]] = field(default_factory=list)

    def run(self, stop: threading.Event) -> threading.Thread:
        def loop() -> None:
            connection: http.client.HTTPConnection | None = None
            while not stop.is_set():
                if connection is None:
                    connection = http.client.HTTPConnection(LOOPBACK, self.port, timeout=5)
                started = time.perf_counter()
                try:
                    headers = {"Authorization": self.authorization} if self.authorization else {}
                    connection.request("GET", self.path, headers=headers)
                    response = connection.getresponse()
                    response.read()
                    self.results.append((response.status, time.perf_counter() - started))
                except (OSError, http.client.HTTPException):
                    self.results.append((0, time.perf_counter() - started))
                    connection.close()
                    connection = None
                stop.wait(self.interval)

        thread = threading.Thread(target=loop, name=f"probe-{self.path}", daemon=True)
        thread.start()
        return thread

    def ok_fraction(self) -> float:
        return sum(1 for status, _ in self.results if status == 200) / max(1, len(self.results))

    def median_seconds(self) -> float:
        times = sorted(seconds for status, seconds in self.results if status == 200)
        return times[len(times) // 2] if times else float("nan")

"""Bounds on the connections a server holds, and on how long each may sit without a request.

At most ``max_connections`` are open at once: a new one sheds the least recently active idle
connection, or is closed at once when every connection is busy. A connection that has not sent
a whole request within ``read_header_timeout_seconds`` is closed (slowloris; with TLS the
handshake counts), and so is one idle for ``keepalive_timeout_seconds`` after its last response.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import cast


@dataclass(frozen=True)
class ConnectionLimits:
    """How many connections the server holds, and for how long each may sit idle."""

    max_connections: int = 64
    read_header_timeout_seconds: float = 10.0
    # Above the usual scrape intervals (15 s, 30 s) so Prometheus keeps reusing its
    # connection, and not one of them, so a close never races a scrape.
    keepalive_timeout_seconds: float = 45.0
    shutdown_timeout_seconds: float = 5.0

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        if self.read_header_timeout_seconds <= 0 or self.keepalive_timeout_seconds <= 0:
            raise ValueError("timeouts must be positive")


@dataclass
class _Connection:
    timer: asyncio.TimerHandle | None = None
    requests_in_progress: int = 0


class ConnectionGuard:
    """Bounds the open connections and the time each may wait without a request.

    Runs on the event loop only (no lock). Connections are kept least recently active first.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, limits: ConnectionLimits) -> None:
        self._loop = loop
        self._limits = limits
        self._open: dict[asyncio.BaseTransport, _Connection] = {}
        self.refused = 0  # closed at once: every open connection was busy
        self.shed = 0  # idle connections closed to make room for a new one
        self.timed_out = 0  # no request headers in time, or idle past the keep-alive timeout

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def admit(self, transport: asyncio.BaseTransport) -> bool:
        """Take a new connection; False when it must be closed unserved."""
        if len(self._open) >= self._limits.max_connections:
            idle = next((t for t, c in self._open.items() if not c.requests_in_progress), None)
            if idle is None:
                self.refused += 1
                return False
            self.shed += 1
            self._drop(idle)
        connection = _Connection()
        self._open[transport] = connection
        self._arm(transport, connection, self._limits.read_header_timeout_seconds)
        return True

    def request_started(self, transport: asyncio.BaseTransport) -> None:
        connection = self._open.pop(transport, None)
        if connection is None:
            return
        self._open[transport] = connection  # now the most recently active
        connection.requests_in_progress += 1
        if connection.timer is not None:
            connection.timer.cancel()
            connection.timer = None

    def request_finished(self, transport: asyncio.BaseTransport) -> None:
        connection = self._open.get(transport)
        if connection is None:
            return
        connection.requests_in_progress -= 1
        if not connection.requests_in_progress:
            self._arm(transport, connection, self._limits.keepalive_timeout_seconds)

    def forget(self, transport: asyncio.BaseTransport) -> None:
        connection = self._open.pop(transport, None)
        if connection is not None and connection.timer is not None:
            connection.timer.cancel()

    def _arm(self, transport: asyncio.BaseTransport, connection: _Connection, seconds: float) -> None:
        if connection.timer is not None:
            connection.timer.cancel()
        connection.timer = self._loop.call_later(seconds, self._expire, transport)

    def _expire(self, transport: asyncio.BaseTransport) -> None:
        connection = self._open.get(transport)
        if connection is None or connection.requests_in_progress:
            return
        self.timed_out += 1
        self._drop(transport)

    def _drop(self, transport: asyncio.BaseTransport) -> None:
        self.forget(transport)
        # not close(): a client that stopped reading must not keep it open (a TCP server's transport)
        cast(asyncio.Transport, transport).abort()

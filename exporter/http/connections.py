"""Which connections aiohttp gets to serve, and for how long each may hold the server.

aiohttp has no connection cap, no time limit on a client that has not finished its first request
head, and, with ``ssl=`` on the listening socket, asyncio allocates a TLS connection's buffers
(256 KiB of read buffer per ``SSLProtocol``) before any code of ours sees it, so stalled
handshakes grow memory without bound (see docs/architecture.md, "Hostile clients"). So the
listening socket accepts plain TCP and ``ConnectionGuard`` admits each connection first:

* at most ``max_connections`` are open at once; a new one sheds a connection with no request
  in progress (a TLS handshake stalled for a second, then one that never sent a request, then
  an idle keep-alive one, least recently active first), or is closed at once when there is
  none (every connection busy, or handshakes too young to tell stalled);
* a connection that has not sent a whole request head within ``read_header_timeout_seconds``
  (TLS handshake included) is closed;
* TLS starts on an admitted connection only, with the web configuration's context in force when
  it arrives (rotated certificates apply to the next handshake), and, when the file lists
  ``client_allowed_sans`` and asks for client certificates, the client's must name one of them.

An admitted connection is then aiohttp's: its ``RequestHandler`` parses, routes, keeps alive
(``keepalive_timeout_seconds`` after each response) and closes it. ``exporter.http.server``
tells the guard when a request starts and ends, and writes each response within
``write_timeout_seconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from aiohttp import web

from exporter.http.webconfig import WebConfigSource, peer_has_allowed_san

if TYPE_CHECKING:
    from aiohttp.web_protocol import RequestHandler

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConnectionLimits:
    """How many connections the server holds, how long each may take, and what a request may carry."""

    max_connections: int = 256
    read_header_timeout_seconds: float = 10.0
    # Above the usual scrape intervals (15 s, 30 s) so Prometheus keeps reusing its
    # connection, and not one of them, so a close never races a scrape.
    keepalive_timeout_seconds: float = 45.0
    # Prometheus gives up on a scrape after its scrape_timeout (10 s at most by default): a
    # response still not taken by then goes to a client that does not read.
    write_timeout_seconds: float = 10.0
    shutdown_timeout_seconds: float = 5.0
    max_line_bytes: int = 8190  # the request line, and each header line
    max_headers: int = 100

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        timeouts = (self.read_header_timeout_seconds, self.keepalive_timeout_seconds, self.write_timeout_seconds)
        if min(timeouts) <= 0:
            raise ValueError("timeouts must be positive")


# A TLS handshake younger than this is not shed for a newcomer (a real client's takes
# milliseconds): shedding stalled handshakes as fast as an attacker opens new ones would
# allocate a TLS connection's 256 KiB per attacker connection.
MIN_HANDSHAKE_AGE_SECONDS = 1.0


@dataclass
class _Connection:
    timer: asyncio.TimerHandle | None = None
    requests_in_progress: int = 0
    started_a_request: bool = False
    handshake_since: float | None = None  # when its TLS handshake began; None: plain, or done


class ConnectionGuard:
    """Bounds the open connections and the time each may wait without a request.

    Runs on the event loop only (no lock). Connections are keyed by the transport their
    requests arrive on (the TLS transport once the handshake is done) and kept least recently
    active first. A connection that closed on its own is noticed by ``transport.is_closing()``.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, limits: ConnectionLimits) -> None:
        self._loop = loop
        self._limits = limits
        self._open: dict[asyncio.BaseTransport, _Connection] = {}
        self.refused = 0  # closed at once: every open connection was busy
        self.shed = 0  # idle connections closed to make room for a new one
        self.timed_out = 0  # no whole request head in time
        self.write_timeouts = 0  # a response not taken within the write timeout

    @property
    def open_connections(self) -> int:
        self._forget_closed()
        return len(self._open)

    def admit(self, transport: asyncio.BaseTransport, tls: bool = False) -> bool:
        """Take a new connection; False when it must be closed unserved."""
        now = self._loop.time()
        if len(self._open) >= self._limits.max_connections:
            self._forget_closed()
        if len(self._open) >= self._limits.max_connections:
            idle = self._victim(now)
            if idle is None:
                self.refused += 1
                return False
            self.shed += 1
            self._drop(idle)
        connection = _Connection(handshake_since=now if tls else None)
        self._open[transport] = connection
        connection.timer = self._loop.call_later(
            self._limits.read_header_timeout_seconds, self._expire, transport, connection
        )
        return True

    def _victim(self, now: float) -> asyncio.BaseTransport | None:
        """The connection to shed for a newcomer, least recently active first among: TLS handshakes
        older than ``MIN_HANDSHAKE_AGE_SECONDS``, then connections that never sent a request, then
        idle keep-alive ones (a scraper's connection goes last, and not while younger handshakes
        wait); None when there is none."""
        never_asked: asyncio.BaseTransport | None = None
        idle: asyncio.BaseTransport | None = None
        young_handshakes = False
        for transport, connection in self._open.items():
            if connection.requests_in_progress:
                continue
            if connection.handshake_since is not None:
                if now - connection.handshake_since >= MIN_HANDSHAKE_AGE_SECONDS:
                    return transport
                young_handshakes = True
            elif not connection.started_a_request:
                never_asked = never_asked or transport
            else:
                idle = idle or transport
        # While handshakes crowd the server, a client that has been served keeps its connection.
        return never_asked or (None if young_handshakes else idle)

    def handed_over(self, before: asyncio.BaseTransport, after: asyncio.BaseTransport) -> None:
        """Requests of the connection admitted as ``before`` now arrive on ``after`` (TLS done)."""
        connection = self._open.pop(before, None)
        if connection is not None:
            connection.handshake_since = None
            self._open[after] = connection

    def request_started(self, transport: asyncio.BaseTransport | None) -> None:
        connection = self._open.pop(transport, None) if transport is not None else None
        if connection is None:
            return
        self._open[transport] = connection  # type: ignore[index]  # now the most recently active
        connection.requests_in_progress += 1
        connection.started_a_request = True
        if connection.timer is not None:
            connection.timer.cancel()
            connection.timer = None

    def request_finished(self, transport: asyncio.BaseTransport | None) -> None:
        connection = self._open.get(transport) if transport is not None else None
        if connection is not None:
            connection.requests_in_progress -= 1

    def forget(self, transport: asyncio.BaseTransport) -> None:
        connection = self._open.pop(transport, None)
        if connection is not None and connection.timer is not None:
            connection.timer.cancel()

    def _forget_closed(self) -> None:
        for transport in [t for t in self._open if t.is_closing()]:
            self.forget(transport)

    def _expire(self, transport: asyncio.BaseTransport, connection: _Connection) -> None:
        connection.timer = None
        if self._open.get(transport) is not connection or connection.started_a_request:
            return
        self.timed_out += 1
        self._drop(transport)

    def _drop(self, transport: asyncio.BaseTransport) -> None:
        self.forget(transport)
        # not close(): a client that stopped reading must not keep it open
        cast(asyncio.Transport, transport).abort()


def _forget_traceback(error: BaseException | None) -> None:
    """Drop the tracebacks of a failed ``start_tls``'s exception and of those it chains.

    ``start_tls`` re-raises the exception its handshake waiter holds, and that exception's
    traceback holds ``start_tls``'s frame, which holds the waiter and the ``SSLProtocol``
    (with its 256 KiB read buffer): a reference cycle that only a full garbage collection
    frees, so stalled handshakes that are shed or time out piled up (measured on Python
    3.11.7, 3.12.1 and 3.13.0; see docs/architecture.md). Without the tracebacks there is no
    cycle and each one is freed at once.
    """
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        error.__traceback__ = None
        error = error.__context__ or error.__cause__


class _Admission(asyncio.Protocol):
    """The first owner of an accepted connection: admits it, starts TLS, hands it to aiohttp."""

    def __init__(self, site: GuardedSite) -> None:
        self._site = site

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._site.admit(cast(asyncio.Transport, transport))

    def data_received(self, data: bytes) -> None:  # never: the transport has a new protocol or is paused
        return None


class GuardedSite(web.TCPSite):
    """``web.TCPSite`` whose connections pass ``ConnectionGuard`` (and TLS) before aiohttp serves them."""

    def __init__(
        self,
        runner: web.AppRunner,
        host: str,
        port: int,
        *,
        guard: ConnectionGuard,
        limits: ConnectionLimits,
        web_config: WebConfigSource | None = None,
        backlog: int = 512,
    ) -> None:
        super().__init__(runner, host, port, backlog=backlog)
        self.guard = guard
        self._limits = limits
        self._web_config = web_config
        self._handshakes: set[asyncio.Task[None]] = set()
        self._make_handler = cast(Callable[[], "RequestHandler"], runner.server)
        self._collect_timer: asyncio.TimerHandle | None = None
        self.collections = 0  # garbage collections run for TLS connections dropped in their handshake

    @property
    def tls(self) -> bool:
        return self._web_config is not None and self._web_config.tls

    async def start(self) -> None:
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Admission(self), self._host, self._port, backlog=self._backlog, reuse_address=True
        )
        sockets = self._server.sockets
        self._bound_port = int(sockets[0].getsockname()[1]) if sockets else self._port

    async def stop(self) -> None:
        for task in list(self._handshakes):
            task.cancel()
        if self._collect_timer is not None:
            self._collect_timer.cancel()
        await super().stop()

    def _tls_dropped(self, raw: asyncio.Transport) -> None:
        """``raw`` goes without its TLS handshake done.

        asyncio leaves the ``SSLProtocol`` of a handshake cut short (and its 256 KiB buffer) in
        reference cycles (its handshake timer, its waiter) that only a full garbage collection
        frees; on every Python measured (3.11.7, 3.12.1, 3.13.0) thousands piled up under stalled
        handshakes. So a second after the first such connection, one collection runs.
        """
        self.guard.forget(raw)
        raw.abort()
        if self._collect_timer is None:
            self._collect_timer = asyncio.get_running_loop().call_later(1.0, self._collect)

    def _collect(self) -> None:
        self._collect_timer = None
        self.collections += 1
        gc.collect()

    def admit(self, transport: asyncio.Transport) -> None:
        loaded = self._web_config.current() if self._web_config is not None else None
        if not self.guard.admit(transport, tls=loaded is not None and loaded.ssl_context is not None):
            transport.abort()
            return
        if loaded is None or loaded.ssl_context is None:
            handler = self._make_handler()
            transport.set_protocol(handler)
            handler.connection_made(transport)
            return
        transport.pause_reading()  # the ClientHello stays in the socket until start_tls takes it
        tls = loaded.config.tls
        task = asyncio.get_running_loop().create_task(
            self._start_tls(transport, loaded.ssl_context, tls.sans_to_check if tls else None)
        )
        self._handshakes.add(task)
        task.add_done_callback(self._handshakes.discard)

    async def _start_tls(self, raw: asyncio.Transport, context: ssl.SSLContext, sans: tuple[str, ...] | None) -> None:
        loop = asyncio.get_running_loop()
        if raw.is_closing():  # shed or timed out before its turn came
            self.guard.forget(raw)
            return
        handler = self._make_handler()
        peer = raw.get_extra_info("peername")
        try:
            transport = await loop.start_tls(
                raw, handler, context, server_side=True, ssl_handshake_timeout=self._limits.read_header_timeout_seconds
            )
        except (OSError, ssl.SSLError, asyncio.TimeoutError, ConnectionError, RuntimeError) as exc:
            log.debug("TLS handshake with %s failed: %s", peer, exc)
            _forget_traceback(exc)
            self._tls_dropped(raw)
            return
        if transport is None or raw.is_closing():
            self._tls_dropped(raw)
            return
        if not peer_has_allowed_san(transport.get_extra_info("peercert"), sans):
            log.info("client %s: its certificate names none of client_allowed_sans", peer)
            transport.abort()
            self._tls_dropped(raw)
            return
        self.guard.handed_over(raw, transport)
        with contextlib.suppress(ConnectionError):
            handler.connection_made(transport)

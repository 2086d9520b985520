"""The aiohttp application of ``ccl-exporter serve``, and the socket it listens on.

``/metrics`` is rendered in a worker thread (collectors read sysfs, NVML and files, and a
slow one must not stall ``/healthz``); at most ``max_requests`` requests are handled at once
(more wait), their pages collected and built one at a time by the umbrella collector, each
within ``max_page_bytes`` (see exporter/exposition.py), and gzip-compressed in that thread
when the client accepts it (Prometheus does). Collectors that are a ``BackgroundCollector``
(tailers, watches, schedulers) have their ``run`` started with the app and cancelled on
shutdown.

``HttpServer`` puts the app behind a ``ConnectionGuard``: at most ``max_connections`` open
at once (a new one sheds the least recently active idle connection, or is closed at once
when every connection is busy), a connection that has not sent its request headers within
``read_header_timeout_seconds`` is closed (slowloris), and so is one idle for
``keepalive_timeout_seconds`` after its last response. A malformed request is logged as one
line, without a traceback. ``run_server`` turns SIGTERM into a clean shutdown, which every
DaemonSet rollout sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import html
import logging
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client.registry import CollectorRegistry

from exporter import __version__
from exporter.collectors.base import BackgroundCollector, Collector, close_collector
from exporter.exposition import DEFAULT_MAX_PAGE_BYTES, PageRenderer
from exporter.registry import UmbrellaCollector, build_registry

log = logging.getLogger(__name__)

GZIP_LEVEL = 6  # client_golang's default; level 9 costs twice the CPU for ~3 % less


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


UMBRELLA = web.AppKey("umbrella", UmbrellaCollector)
REGISTRY = web.AppKey("registry", CollectorRegistry)
PAGE_RENDERER = web.AppKey("page_renderer", PageRenderer)
RENDER_SLOTS = web.AppKey("render_slots", asyncio.Semaphore)
READY = web.AppKey("ready", asyncio.Event)
CONNECTION_GUARD = web.AppKey("connection_guard", ConnectionGuard)

# Hooks run at startup; each gets the app and returns an async generator (cleanup_ctx form).
StartupHook = Callable[[web.Application], AsyncIterator[None]]


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an ``Accept-Encoding`` header admits gzip (``gzip;q=0`` refuses it, ``*`` admits it)."""
    quality: dict[str, float] = {}
    for item in accept_encoding.split(","):
        coding, _, params = item.partition(";")
        q = 1.0
        for param in params.split(";"):
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        quality.setdefault(coding.strip().lower(), q)
    for coding in ("gzip", "x-gzip", "*"):
        if coding in quality:
            return quality[coding] > 0
    return False


def _page(app: web.Application, accept: str, compress: bool) -> tuple[bytes, str]:
    """Render (and compress) one page; runs in a worker thread."""
    body, content_type = app[PAGE_RENDERER].render(app[REGISTRY], accept)
    if compress:
        body = gzip.compress(body, compresslevel=GZIP_LEVEL)
    return body, content_type


async def metrics(request: web.Request) -> web.Response:
    app = request.app
    compress = accepts_gzip(request.headers.get("Accept-Encoding", ""))
    async with app[RENDER_SLOTS]:
        body, content_type = await asyncio.to_thread(_page, app, request.headers.get("Accept", ""), compress)
    mime, _, params = content_type.partition(";")
    charset = "utf-8"
    response = web.Response(body=body)
    response.headers["Content-Type"] = content_type if params else f"{mime}; charset={charset}"
    response.headers["Vary"] = "Accept-Encoding"
    if compress:
        response.headers["Content-Encoding"] = "gzip"
    return response


@web.middleware
async def _track_requests(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Tell the connection guard (when the app is served by ``HttpServer``) a request is in progress."""
    guard = request.app.get(CONNECTION_GUARD)
    transport = request.transport
    if guard is None or transport is None:
        return await handler(request)
    guard.request_started(transport)
    try:
        return await handler(request)
    finally:
        guard.request_finished(transport)


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def readyz(request: web.Request) -> web.Response:
    if request.app[READY].is_set():
        return web.Response(text="ready\n")
    return web.Response(status=503, text="starting\n")


async def landing(request: web.Request) -> web.Response:
    rows = []
    for name, outcome in request.app[UMBRELLA].outcomes().items():
        status = "never scraped" if not outcome.finished_at else ("ok" if outcome.success else "failing")
        rewritten = (
            f" ({outcome.label_values_rewritten} label values rewritten: not UTF-8 or too long)"
            if outcome.label_values_rewritten
            else ""
        )
        seconds = outcome.duration_seconds
        duration = "" if seconds != seconds else f"{seconds * 1000:.1f} ms"
        rows.append(
            f"<tr><td>{html.escape(name)}</td><td>{status}</td><td>{duration}</td>"
            f"<td>{html.escape(outcome.error)}{rewritten}</td></tr>"
        )
    page = f"""<!doctype html>
<html><head><title>ccl-health-exporter</title></head>
<body>
<h1>ccl-health-exporter {html.escape(__version__)}</h1>
<p>Is this node's collective communication on the fabric it should be?</p>
<ul><li><a href="metrics">/metrics</a></li><li><a href="healthz">/healthz</a></li>
<li><a href="readyz">/readyz</a></li></ul>
<h2>Collectors (last scrape)</h2>
<table border="1" cellpadding="4"><tr><th>collector</th><th>status</th><th>duration</th><th>last error</th></tr>
{"".join(rows)}
</table>
</body></html>
"""
    return web.Response(text=page, content_type="text/html")


def create_app(
    collectors: Sequence[Collector],
    *,
    max_requests: int = 4,
    max_page_bytes: int = DEFAULT_MAX_PAGE_BYTES,
    scrape_timeout_seconds: float = 10.0,
    process_metrics: bool = True,
    startup_hooks: Sequence[StartupHook] = (),
) -> web.Application:
    """Build the app around already-constructed collectors (tests pass fixture-backed ones)."""
    app = web.Application(middlewares=[_track_requests])
    umbrella = UmbrellaCollector(collectors, timeout_seconds=scrape_timeout_seconds)
    app[UMBRELLA] = umbrella
    app[REGISTRY] = build_registry(umbrella, process_metrics=process_metrics)
    app[PAGE_RENDERER] = PageRenderer(max_page_bytes)
    app[RENDER_SLOTS] = asyncio.Semaphore(max_requests)
    app[READY] = asyncio.Event()
    app.router.add_get("/", landing)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    for hook in startup_hooks:
        app.cleanup_ctx.append(hook)
    app.cleanup_ctx.append(_background_tasks)
    return app


async def _supervise(name: str, run: Callable[[], Awaitable[None]]) -> None:
    """Keep a collector's background coroutine alive: log a crash, back off, restart."""
    backoff = 1.0
    while True:
        try:
            await run()
            return
        except asyncio.CancelledError:
            raise
        except Exception:  # logged: one broken tailer must not end the exporter
            log.exception("background task of collector %s crashed; restarting in %.0fs", name, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 60.0)


async def _background_tasks(app: web.Application) -> AsyncIterator[None]:
    tasks = []
    for collector in app[UMBRELLA].collectors:
        if isinstance(collector, BackgroundCollector):
            tasks.append(
                asyncio.create_task(_supervise(collector.name, collector.run), name=f"collector-{collector.name}")
            )
    app[READY].set()
    yield
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            try:
                await task
            except Exception:  # logged: shutting down; say it and go on
                log.exception("background task %s failed during shutdown", task.get_name())
    for collector in app[UMBRELLA].collectors:
        try:
            close_collector(collector)
        except Exception:  # logged
            log.exception("closing collector %s failed", collector.name)
    app[UMBRELLA].close()


class _OneLineRequestErrors(logging.LoggerAdapter):  # type: ignore[type-arg]  # LoggerAdapter[Logger] only runs on 3.11+
    """aiohttp's server logger, except that a malformed request is one line, not a traceback."""

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        error = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1]
        if isinstance(error, HttpProcessingError):
            reason = " ".join(str(error).split())[:200]
            self.info(f"{msg}: %s", *args, reason)
            return
        super().exception(msg, *args, exc_info=exc_info, **kwargs)


class _GuardedProtocol(asyncio.Protocol):
    """aiohttp's protocol for one connection, created only once the guard admits it."""

    def __init__(self, make_handler: Callable[[], asyncio.Protocol], guard: ConnectionGuard) -> None:
        self._make_handler = make_handler
        self._guard = guard
        self._inner: asyncio.Protocol | None = None
        self._transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        if not self._guard.admit(transport):
            cast(asyncio.Transport, transport).abort()
            return
        self._inner = self._make_handler()
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self._guard.forget(self._transport)
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()


class HttpServer:
    """``app`` listening on one address behind a ``ConnectionGuard``."""

    def __init__(self, app: web.Application, limits: ConnectionLimits = ConnectionLimits()) -> None:
        self._app = app
        self._limits = limits
        self._runner: web.AppRunner | None = None
        self._server: asyncio.AbstractServer | None = None
        self.guard: ConnectionGuard | None = None

    async def start(self, host: str, port: int) -> int:
        """Start the app and listen; return the port (useful with port 0)."""
        loop = asyncio.get_running_loop()
        guard = self.guard = ConnectionGuard(loop, self._limits)
        self._app[CONNECTION_GUARD] = guard
        self._runner = web.AppRunner(
            self._app,
            access_log=None,
            keepalive_timeout=self._limits.keepalive_timeout_seconds,
            shutdown_timeout=self._limits.shutdown_timeout_seconds,
            logger=_OneLineRequestErrors(logging.getLogger("aiohttp.server"), {}),
        )
        await self._runner.setup()
        make_handler = self._runner.server
        assert make_handler is not None
        self._server = await loop.create_server(lambda: _GuardedProtocol(make_handler, guard), host, port)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop listening, let requests in progress finish (up to the shutdown timeout), run cleanups."""
        if self._server is not None:
            self._server.close()
        if self._runner is not None:
            await self._runner.cleanup()


def run_server(app: web.Application, host: str, port: int, limits: ConnectionLimits = ConnectionLimits()) -> None:
    """Serve ``app`` until SIGTERM or SIGINT, then shut down cleanly."""

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        server = HttpServer(app, limits)
        try:
            await server.start(host, port)
            await stop.wait()
        finally:  # also when the address is taken: the collectors' cleanups still run
            await server.stop()

    asyncio.run(serve())

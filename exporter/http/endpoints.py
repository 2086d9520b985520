"""The endpoints of ``ccl-exporter serve``, the lifetime of its collectors, and the signals that end it.

``/metrics`` is rendered in a worker thread (collectors read sysfs, NVML and files, and a
slow one must not stall ``/healthz``), each page within ``max_page_bytes`` (see
exporter/http/exposition.py) and gzip-compressed in that thread when the client accepts it
(Prometheus does). Pages are built one at a time per format (``SharedPages``): requests that
arrive while a page is being built wait for the next build and all get that one, so a crowd
of clients (64 that pipeline scrapes, say) costs one collection at a time, and a scrape waits
for at most two. Collectors that are a ``BackgroundCollector`` (tailers, watches, schedulers)
have their ``run`` started with the app and cancelled on shutdown.

The HTTP side (aiohttp, connection limits and timeouts, TLS and basic auth from
``--web.config.file``) is exporter/http. ``run_server`` turns SIGTERM into a clean shutdown,
which every DaemonSet rollout sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import html
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from aiohttp import web
from prometheus_client.exposition import choose_encoder

from exporter import __version__
from exporter.backoff import supervise
from exporter.collectors.base import BackgroundCollector, Collector, close_collector
from exporter.collectors.history import CollectorHistory
from exporter.collectors.umbrella import UmbrellaCollector, build_registry
from exporter.http.certificates import CertificateExpiryGauge
from exporter.http.connections import ConnectionLimits
from exporter.http.exposition import DEFAULT_MAX_PAGE_BYTES, PageRenderer
from exporter.http.server import Handler, WebServer, listening, until_terminated
from exporter.http.webconfig import WebConfigSource

log = logging.getLogger(__name__)

GZIP_LEVEL = 6  # client_golang's default; level 9 costs twice the CPU for ~3 % less
CERTIFICATE_EXPIRY_METRIC = "ccl_exporter_tls_certificate_expiry_timestamp_seconds"
CERTIFICATE_EXPIRY_HELP = (
    "When the TLS certificate served on /metrics (--web.config.file) expires: the earliest notAfter of "
    "its chain, in seconds since the epoch; read again when the files change. Absent without TLS."
)

# Hooks run at startup; each gets the app and returns an async generator: the code before its
# ``yield`` runs before the server listens, the code after it once the server has stopped.
StartupHook = Callable[["ExporterApp"], AsyncIterator[None]]
Page = tuple[bytes, str]  # (body, content type)


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


class SharedPages:
    """``/metrics`` pages built in a worker thread, one build at a time per (format, compression).

    A request joins the build of its kind that has not started yet, or starts one; so every
    request gets a page collected after it arrived, while any number of requests that arrive
    together cost one build. Builds of different kinds run at most ``max_builds`` at once.
    """

    def __init__(self, build: Callable[[str, bool], Page], max_builds: int) -> None:
        self._build = build
        self._slots = asyncio.Semaphore(max_builds)
        self._next: dict[tuple[str, bool], asyncio.Future[Page]] = {}  # not started yet: joinable
        self._last: dict[tuple[str, bool], asyncio.Task[None]] = {}  # the latest build of each kind
        self.builds = 0

    async def page(self, accept: str, compress: bool) -> Page:
        key = (choose_encoder(accept)[1], compress)
        future = self._next.get(key)
        if future is None:
            future = self._next[key] = asyncio.get_running_loop().create_future()
            self._last[key] = asyncio.create_task(self._run(key, future, self._last.get(key), accept, compress))
        return await asyncio.shield(future)

    async def _run(
        self,
        key: tuple[str, bool],
        future: asyncio.Future[Page],
        previous: asyncio.Task[None] | None,
        accept: str,
        compress: bool,
    ) -> None:
        if previous is not None:
            await asyncio.wait([previous])
        async with self._slots:
            if self._next.get(key) is future:
                del self._next[key]  # from now on a new request waits for the build after this one
            self.builds += 1
            try:
                page = await asyncio.to_thread(self._build, accept, compress)
            except Exception as exc:  # noqa: BLE001 - every request waiting for this page gets it
                future.set_exception(exc)
            else:
                future.set_result(page)
        if self._last.get(key) is asyncio.current_task():
            del self._last[key]


class ExporterApp:
    """The collectors behind ``/metrics``, the other endpoints, and what runs while serving."""

    def __init__(
        self,
        collectors: Sequence[Collector],
        *,
        max_requests: int = 4,
        max_page_bytes: int = DEFAULT_MAX_PAGE_BYTES,
        scrape_timeout_seconds: float = 10.0,
        process_metrics: bool = True,
        startup_hooks: Sequence[StartupHook] = (),
        collector_history: CollectorHistory | None = None,
    ) -> None:
        self.umbrella = UmbrellaCollector(collectors, timeout_seconds=scrape_timeout_seconds, history=collector_history)
        self.registry = build_registry(self.umbrella, process_metrics=process_metrics)
        self.page_renderer = PageRenderer(max_page_bytes)
        self.pages = SharedPages(self._page, max_requests)
        self.ready = asyncio.Event()
        self.startup_hooks = list(startup_hooks)
        self.routes: dict[tuple[str, str], Handler] = {
            ("GET", "/"): self.landing,
            ("GET", "/metrics"): self.metrics,
            ("GET", "/healthz"): self.healthz,
            ("GET", "/readyz"): self.readyz,
        }

    def _page(self, accept: str, compress: bool) -> tuple[bytes, str]:
        """Render (and compress) one page; runs in a worker thread."""
        body, content_type = self.page_renderer.render(self.registry, accept)
        if compress:
            body = gzip.compress(body, compresslevel=GZIP_LEVEL)
        return body, content_type

    async def metrics(self, request: web.Request) -> web.Response:
        compress = accepts_gzip(request.headers.get("Accept-Encoding", ""))
        body, content_type = await self.pages.page(request.headers.get("Accept", ""), compress)
        mime, _, params = content_type.partition(";")
        response = web.Response(body=body)
        response.headers["Content-Type"] = content_type if params else f"{mime}; charset=utf-8"
        response.headers["Vary"] = "Accept-Encoding"
        if compress:
            response.headers["Content-Encoding"] = "gzip"
        return response

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(self, request: web.Request) -> web.Response:
        if self.ready.is_set():
            return web.Response(text="ready\n")
        return web.Response(text="starting\n", status=503)

    async def landing(self, request: web.Request) -> web.Response:
        rows = []
        for name, outcome in self.umbrella.outcomes().items():
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
        # A collector's error may quote a file name that is not UTF-8 (os.fsdecode's surrogates).
        body = page.encode("utf-8", "backslashreplace")
        return web.Response(body=body, content_type="text/html", charset="utf-8")

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The startup hooks and the collectors' background tasks, for as long as the server runs."""
        async with contextlib.AsyncExitStack() as stack:
            for hook in self.startup_hooks:
                await stack.enter_async_context(contextlib.asynccontextmanager(hook)(self))
            stack.callback(self._close_collectors)  # after the tasks stop, before the hooks end
            tasks = [
                asyncio.create_task(_supervise(collector.name, collector.run), name=f"collector-{collector.name}")
                for collector in self.umbrella.collectors
                if isinstance(collector, BackgroundCollector)
            ]
            stack.push_async_callback(_cancel, tasks)
            self.ready.set()
            yield

    def _close_collectors(self) -> None:
        for collector in self.umbrella.collectors:
            try:
                close_collector(collector)
            except Exception:  # logged
                log.exception("closing collector %s failed", collector.name)
        self.umbrella.close()


# Build the app around already-constructed collectors (tests pass fixture-backed ones).
create_app = ExporterApp


async def _supervise(name: str, run: Callable[[], Awaitable[None]]) -> None:
    """Keep a collector's background coroutine alive: log a crash, back off, restart."""
    await supervise(name, run)  # the back-off resets once a run lasted (exporter.backoff)


async def _cancel(tasks: Sequence[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            try:
                await task
            except Exception:  # logged: shutting down; say it and go on
                log.exception("background task %s failed during shutdown", task.get_name())


@contextlib.asynccontextmanager
async def serving(
    app: ExporterApp,
    host: str,
    port: int,
    limits: ConnectionLimits = ConnectionLimits(),
    web_config: WebConfigSource | None = None,
) -> AsyncIterator[WebServer]:
    """``app`` running and listening on ``host:port`` (port 0: any) until the block ends; with TLS
    from ``web_config``, its certificate's expiry on ``/metrics`` too."""
    expiry = None
    if web_config is not None and web_config.tls:
        expiry = CertificateExpiryGauge(
            CERTIFICATE_EXPIRY_METRIC, CERTIFICATE_EXPIRY_HELP, web_config.certificate_expiry
        )
        app.registry.register(expiry)
    try:
        async with (
            app.running(),
            listening(WebServer(app.routes, limits=limits, web_config=web_config), host, port) as server,
        ):
            yield server
    finally:
        if expiry is not None:
            app.registry.unregister(expiry)


def run_server(
    app: ExporterApp,
    host: str,
    port: int,
    limits: ConnectionLimits = ConnectionLimits(),
    web_config: WebConfigSource | None = None,
) -> None:
    """Serve ``app`` until SIGTERM or SIGINT, then shut down cleanly."""

    async def serve() -> None:
        async with serving(app, host, port, limits, web_config):
            await until_terminated()

    asyncio.run(serve())

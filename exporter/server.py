"""The aiohttp application of ``ccl-exporter serve``.

``/metrics`` is rendered in a worker thread (collectors read sysfs, NVML and files, and a
slow one must not stall ``/healthz`` or another scrape); at most ``max_requests`` renders
run at once. Collectors with a background coroutine (tailers, watches, schedulers) have it
started with the app and cancelled on shutdown. ``web.run_app`` turns SIGTERM into a clean
shutdown, which every DaemonSet rollout sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from aiohttp import web
from prometheus_client.registry import CollectorRegistry

from exporter import __version__
from exporter.collectors.base import Collector, close_collector
from exporter.exposition import render
from exporter.registry import UmbrellaCollector, build_registry

log = logging.getLogger(__name__)

UMBRELLA = web.AppKey("umbrella", UmbrellaCollector)
REGISTRY = web.AppKey("registry", CollectorRegistry)
RENDER_SLOTS = web.AppKey("render_slots", asyncio.Semaphore)
READY = web.AppKey("ready", asyncio.Event)

# Hooks run at startup; each gets the app and returns an async generator (cleanup_ctx form).
StartupHook = Callable[[web.Application], AsyncIterator[None]]


async def metrics(request: web.Request) -> web.Response:
    app = request.app
    async with app[RENDER_SLOTS]:
        body, content_type = await asyncio.to_thread(
            render, app[REGISTRY], request.headers.get("Accept", "")
        )
    mime, _, params = content_type.partition(";")
    charset = "utf-8"
    response = web.Response(body=body)
    response.headers["Content-Type"] = content_type if params else f"{mime}; charset={charset}"
    return response


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
        duration = "" if outcome.duration_seconds != outcome.duration_seconds else f"{outcome.duration_seconds * 1000:.1f} ms"
        rows.append(
            f"<tr><td>{html.escape(name)}</td><td>{status}</td><td>{duration}</td>"
            f"<td>{html.escape(outcome.error)}</td></tr>"
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
    scrape_timeout_seconds: float = 10.0,
    process_metrics: bool = True,
    startup_hooks: Sequence[StartupHook] = (),
) -> web.Application:
    """Build the app around already-constructed collectors (tests pass fixture-backed ones)."""
    app = web.Application()
    umbrella = UmbrellaCollector(collectors, timeout_seconds=scrape_timeout_seconds)
    app[UMBRELLA] = umbrella
    app[REGISTRY] = build_registry(umbrella, process_metrics=process_metrics)
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
        except Exception:  # noqa: BLE001 - one broken tailer must not end the exporter
            log.exception("background task of collector %s crashed; restarting in %.0fs", name, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 60.0)


async def _background_tasks(app: web.Application) -> AsyncIterator[None]:
    tasks = []
    for collector in app[UMBRELLA].collectors:
        run = getattr(collector, "run", None)
        if callable(run):
            tasks.append(asyncio.create_task(_supervise(collector.name, run), name=f"collector-{collector.name}"))
    app[READY].set()
    yield
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            try:
                await task
            except Exception:  # noqa: BLE001 - shutting down; say it and go on
                log.exception("background task %s failed during shutdown", task.get_name())
    for collector in app[UMBRELLA].collectors:
        try:
            close_collector(collector)
        except Exception:  # noqa: BLE001
            log.exception("closing collector %s failed", collector.name)
    app[UMBRELLA].close()

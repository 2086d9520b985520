"""The webhook's HTTPS server: ``POST /mutate``, ``GET /metrics``, ``GET /healthz`` on ``exporter.http``.

The certificate and key come from ``WebConfigSource.from_tls_files``, which reads them again when
they change on disk (a renewed certificate applies to new connections without a restart, and
``/metrics`` tells when the one in force expires). The
server (aiohttp, behind ``exporter.http``'s connection guard) answers an unknown path 404, another
method 405, a body over ``--web.max-body-bytes`` 413 (from its ``Content-Length``, unread), a body
that does not arrive within the header timeout 408 and a malformed request 400; a review is
decided in a worker thread, so a large pod never stalls other connections.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from exporter import __version__
from exporter.flags import parse_listen_address
from exporter.http.connections import ConnectionLimits
from exporter.http.server import WebServer, listening, read_body, until_terminated
from exporter.http.webconfig import WebConfigError, WebConfigSource
from exporter.webhook.admission import WebhookConfig
from exporter.webhook.metrics import Answer, WebhookMetrics, WebhookService

log = logging.getLogger("exporter.webhook")

MAX_CONCURRENT_REVIEWS = 2  # reviews are decided one at a time (WebhookService.mutate); a second body reads meanwhile


def _response(answer: Answer) -> web.Response:
    response = web.Response(status=answer.status, body=answer.body)
    response.headers["Content-Type"] = answer.content_type
    return response


def webhook_server(service: WebhookService, web_config: WebConfigSource | None, max_body_bytes: int) -> WebServer:
    """The routes of the webhook on a ``WebServer`` (not started)."""
    limits = ConnectionLimits()
    # Reviews read and decided at once: each holds its body (up to --web.max-body-bytes) while it
    # does, so the connection cap alone would let 256 of them fill the pod's memory. The rest wait
    # unread; the API server's timeoutSeconds bounds the wait, and the webhook fails open.
    reviews = asyncio.Semaphore(MAX_CONCURRENT_REVIEWS)

    async def mutate(request: web.Request) -> web.Response:
        async with reviews:
            body = await read_body(request, limits.read_header_timeout_seconds)
            return _response(await asyncio.to_thread(service.mutate, body))

    async def metrics(request: web.Request) -> web.Response:
        return _response(service.render_metrics())

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    routes = {("POST", "/mutate"): mutate, ("GET", "/metrics"): metrics, ("GET", "/healthz"): healthz}
    return WebServer(routes, limits=limits, web_config=web_config, max_body_bytes=max_body_bytes)


@contextlib.asynccontextmanager
async def serving_webhook(
    service: WebhookService, host: str, port: int, web_config: WebConfigSource | None, max_body_bytes: int
) -> AsyncIterator[WebServer]:
    """The webhook listening on ``host:port`` (port 0: any) until the block ends."""
    async with listening(webhook_server(service, web_config, max_body_bytes), host, port) as server:
        yield server


def serve_forever(config: WebhookConfig, args: argparse.Namespace) -> int:
    """Serve over HTTPS until SIGTERM or SIGINT; 1 when the certificate or the address is unusable."""
    try:
        web_config = WebConfigSource.from_tls_files(args.tls_cert_file, args.tls_key_file)
    except WebConfigError as exc:
        log.error("cannot use the TLS certificate and key: %s", exc)
        return 1
    host, port = parse_listen_address(str(args.listen_address))
    service = WebhookService(config, WebhookMetrics(certificate_expiry=web_config.certificate_expiry))

    async def serve() -> None:
        async with serving_webhook(service, host, port, web_config, int(args.max_body_bytes)):
            log.info("ccl-exporter %s webhook listening on https://%s:%d/mutate", __version__, host, port)
            await until_terminated()

    try:
        asyncio.run(serve())
    except OSError as exc:  # the address is taken or not this host's
        log.error("cannot listen on %s: %s", args.listen_address, exc.strerror or exc)
        return 1
    return 0

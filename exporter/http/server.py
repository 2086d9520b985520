"""Serve a table of routes on aiohttp, behind the web configuration, the connection guard and a write deadline.

Routes are ``{(method, path): handler}`` with aiohttp's path patterns (``/-/sim/{action}``); a
``GET`` route answers ``HEAD`` too. aiohttp parses requests (a malformed or oversized head is a
400, logged as one line, at most ``_LogBudget.LINES`` lines per ten seconds), routes them (404,
405) and keeps connections alive; ``exporter.http.connections`` admits connections and starts
TLS. Every request then passes, in order:

* a body over ``max_body_bytes`` is refused from its ``Content-Length`` (413), unread;
* with a ``WebConfigSource``: the health paths go straight through (kubelet probes carry no
  credentials and must not be rate limited); a client whose Basic credentials were checked
  before and are good goes through; anyone else takes a token from the rate limit (429), then
  must pass basic auth when users are configured (401 with ``WWW-Authenticate``; 429 while too
  many passwords wait for bcrypt);
* the handler: an ``HTTPException`` it raises is its answer, any other exception a 500 and one
  log line;
* the configured security headers go on the response, which is then written within
  ``write_timeout_seconds``; a client that does not take it in time (one that pipelines
  requests and never reads) has its connection aborted, so it holds no slot for longer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from exporter.http.access import AuthBusy
from exporter.http.connections import ConnectionGuard, ConnectionLimits, GuardedSite
from exporter.http.webconfig import LoadedWebConfig, WebConfigSource

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Routes = Mapping[tuple[str, str], Handler]

DEFAULT_MAX_BODY_BYTES = 64 * 1024
# Paths a kubelet probe reaches without credentials (TLS still applies): they say nothing of the node.
UNAUTHENTICATED_PATHS = frozenset({"/healthz", "/readyz"})


class _LogBudget:
    """At most ``LINES`` lines per ``SECONDS`` for one kind of client error, then a count of the rest."""

    LINES = 10
    SECONDS = 10.0

    def __init__(self, what: str) -> None:
        self._what = what
        self._window_start = time.monotonic()
        self._used = 0
        self._suppressed = 0

    def log(self, logger: logging.Logger, level: int, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._window_start >= self.SECONDS:
            if self._suppressed:
                logger.log(
                    level, "%d more %s not logged in the last %.0f s", self._suppressed, self._what, self.SECONDS
                )
            self._window_start, self._used, self._suppressed = now, 0, 0
        if self._used >= self.LINES:
            self._suppressed += 1
            return
        self._used += 1
        logger.log(level, message, *args)


class _ParserLog(logging.LoggerAdapter):  # type: ignore[type-arg]  # LoggerAdapter[Logger] only runs on 3.11+
    """aiohttp's server logger, except that a malformed request is one line (budgeted), not a traceback."""

    def __init__(self, logger: logging.Logger, budget: _LogBudget) -> None:
        super().__init__(logger, {})
        self._budget = budget

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        error = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1]
        if isinstance(error, HttpProcessingError):
            client = args[0] if args else "unknown client"
            reason = " ".join(str(error).split())[:200]
            self._budget.log(log, logging.INFO, "bad request from %s: %s", client, reason)
            return
        super().exception(msg, *args, exc_info=exc_info, **kwargs)


def error_response(status: int, reason: str) -> web.Response:
    return web.Response(status=status, text=f"{status} {reason}\n")


async def read_body(request: web.Request, timeout_seconds: float) -> bytes:
    """The request's whole body (at most the app's ``client_max_size``, else 413), within
    ``timeout_seconds`` (else 408): a client that sends its body a byte at a time holds no slot."""
    try:
        return await asyncio.wait_for(request.read(), timeout_seconds)
    except asyncio.TimeoutError:
        raise web.HTTPRequestTimeout(text=f"the body did not arrive within {timeout_seconds:g} s\n") from None


class WebServer:
    """``routes`` on one address; see the module doc."""

    def __init__(
        self,
        routes: Routes,
        *,
        limits: ConnectionLimits = ConnectionLimits(),
        web_config: WebConfigSource | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        self.routes = dict(routes)
        self.limits = limits
        self.web_config = web_config
        self.max_body_bytes = max_body_bytes
        self.guard: ConnectionGuard | None = None
        self.port: int | None = None
        self._runner: web.AppRunner | None = None
        self._parser_log_budget = _LogBudget("malformed requests")
        self._failure_log_budget = _LogBudget("failed requests")
        self._write_log_budget = _LogBudget("responses not taken in time")

    async def start(self, host: str, port: int) -> int:
        """Listen; return the port (useful with port 0). OSError when the address is taken."""
        guard = self.guard = ConnectionGuard(asyncio.get_running_loop(), self.limits)

        @web.middleware
        async def serve(request: web.Request, handler: Handler) -> web.StreamResponse:
            transport = request.transport
            guard.request_started(transport)
            try:
                response = await self._respond(request, handler)
                if not response.prepared:
                    await self._write(request, response)
                return response
            finally:
                guard.request_finished(transport)

        app = web.Application(middlewares=[serve], client_max_size=self.max_body_bytes)
        for (method, path), route_handler in self.routes.items():
            if method == "GET":
                app.router.add_get(path, route_handler)
            else:
                app.router.add_route(method, path, route_handler)
        runner = self._runner = web.AppRunner(
            app,
            access_log=None,
            logger=_ParserLog(logging.getLogger("aiohttp.server"), self._parser_log_budget),
            keepalive_timeout=self.limits.keepalive_timeout_seconds,
            shutdown_timeout=self.limits.shutdown_timeout_seconds,
            max_line_size=self.limits.max_line_bytes,
            max_field_size=self.limits.max_line_bytes,
            max_headers=self.limits.max_headers,
            lingering_time=0,  # a body nobody reads is not waited for: the connection closes
        )
        await runner.setup()
        site = GuardedSite(runner, host, port, guard=guard, limits=self.limits, web_config=self.web_config)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self.port = site.port
        return site.port

    async def stop(self) -> None:
        """Stop listening, let requests in progress finish (up to the shutdown timeout), close the rest."""
        if self._runner is not None:
            await self._runner.cleanup()
        if self.web_config is not None:
            self.web_config.auth.close()

    async def _respond(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        loaded = self.web_config.current() if self.web_config is not None else None
        response = await self._checked(request, handler, loaded)
        response.headers["Server"] = "ccl-exporter"  # not aiohttp's default, which names its version and Python's
        if loaded is not None:
            response.headers.update(loaded.config.headers)
        return response

    async def _checked(
        self, request: web.Request, handler: Handler, loaded: LoadedWebConfig | None
    ) -> web.StreamResponse:
        if request.version < (1, 0):
            response = error_response(400, "Bad Request: HTTP/0.9 (a request line without a version) is not served")
            response.force_close()
            return response
        length = request.content_length
        if length is not None and length > self.max_body_bytes:
            response = error_response(
                413, f"Request Entity Too Large: a body of {length} bytes, over {self.max_body_bytes}"
            )
            response.force_close()
            return response
        refused = await self._refusal(request, loaded)
        if refused is not None:
            return refused
        try:
            return await handler(request)
        except web.HTTPException as exc:
            answer = web.Response(status=exc.status, reason=exc.reason, text=exc.text, headers=exc.headers)
            if exc.status in (408, 413):
                answer.force_close()
            return answer
        except Exception as exc:  # logged: one broken handler must not end the server
            self._failure_log_budget.log(
                log, logging.ERROR, "%s %s failed: %s: %s", request.method, request.path[:100], type(exc).__name__, exc
            )
            log.debug("%s %s failed", request.method, request.path[:100], exc_info=exc)
            return error_response(500, "Internal Server Error: the handler failed; see the log")

    async def _refusal(self, request: web.Request, loaded: LoadedWebConfig | None) -> web.Response | None:
        """None when the request may go on, else the response that refuses it."""
        source = self.web_config
        if source is None or loaded is None or request.path in UNAUTHENTICATED_PATHS:
            return None
        users = loaded.config.basic_auth_users
        authorization = request.headers.get("Authorization", "")
        if users and authorization:
            found = source.auth.credentials(users, authorization)
            if found is not None and source.auth.cached(found[0]):
                return None  # checked before and good: never rate limited, never waits for bcrypt
        if not source.rate_allows():
            return error_response(429, "Too Many Requests: rate limit exceeded")
        if not users:
            return None
        if authorization:
            try:
                if await source.auth.allows(users, authorization):
                    return None
            except AuthBusy as exc:
                return error_response(429, f"Too Many Requests: {exc}")
        response = error_response(401, "Unauthorized: valid basic auth credentials are required")
        response.headers["WWW-Authenticate"] = "Basic"
        return response

    async def _write(self, request: web.Request, response: web.StreamResponse) -> None:
        async def send() -> None:
            await response.prepare(request)
            await response.write_eof()

        try:
            await asyncio.wait_for(send(), self.limits.write_timeout_seconds)
        except asyncio.TimeoutError:
            assert self.guard is not None
            self.guard.write_timeouts += 1
            self._write_log_budget.log(
                log,
                logging.INFO,
                "client %s did not take its response within %g s; connection closed",
                request.remote,
                self.limits.write_timeout_seconds,
            )
            if request.transport is not None:
                request.transport.abort()
        except ConnectionError:
            pass  # the client went away; aiohttp notices it too


@contextlib.asynccontextmanager
async def listening(server: WebServer, host: str, port: int) -> AsyncIterator[WebServer]:
    """``server`` listening on ``host:port`` (port 0: any) until the block ends, then stopped."""
    await server.start(host, port)
    try:
        yield server
    finally:
        await server.stop()


async def until_terminated() -> None:
    """Return once SIGTERM (every DaemonSet or Deployment rollout sends it) or SIGINT arrives."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()

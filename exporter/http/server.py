"""Serve a table of routes over HTTP/1.1 (and TLS), behind a ``ConnectionGuard``.

Routes are ``{(method, path): handler}``; a path ending in ``/*`` matches every path under it.
``HEAD`` is answered by the ``GET`` handler without the body. An unknown path is 404, a known
path with another method 405, a body over ``max_body_bytes`` 413, a malformed request 400 (and
the connection closed), all logged as one line naming the client. A handler that raises is a
500 with the traceback logged once. Requests on one connection are answered in order, one at a
time; a client that stops reading holds at most one response in memory.

With a ``WebConfigSource`` every connection starts TLS with the context in force when it
arrives (so rotated certificates apply to new connections without a restart), client
certificates are checked against ``client_allowed_sans``, every request but the health paths
must pass basic auth when users are configured (401 with ``WWW-Authenticate``), the rate limit
answers 429, and the configured security headers go on every response.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import cast

from exporter.http.guard import ConnectionGuard, ConnectionLimits
from exporter.http.messages import (
    MAX_HEAD_BYTES,
    BadRequest,
    Request,
    RequestHead,
    Response,
    error_response,
    parse_head,
    serialize_response,
)
from exporter.http.webconfig import LoadedWebConfig, WebConfigSource, peer_has_allowed_san

log = logging.getLogger(__name__)

Handler = Callable[[Request], Awaitable[Response]]
Routes = Mapping[tuple[str, str], Handler]

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
# Paths a kubelet probe reaches without credentials (TLS still applies): they say nothing of the node.
UNAUTHENTICATED_PATHS = frozenset({"/healthz", "/readyz"})


class _Router:
    def __init__(self, routes: Routes) -> None:
        self._exact: dict[str, dict[str, Handler]] = {}
        self._prefixes: list[tuple[str, dict[str, Handler]]] = []
        for (method, path), handler in routes.items():
            if path.endswith("/*"):
                prefix = path[:-1]
                table = next((t for p, t in self._prefixes if p == prefix), None)
                if table is None:
                    table = {}
                    self._prefixes.append((prefix, table))
                table[method.upper()] = handler
            else:
                self._exact.setdefault(path, {})[method.upper()] = handler
        self._prefixes.sort(key=lambda item: -len(item[0]))

    def find(self, method: str, path: str) -> Handler | Response:
        table = self._exact.get(path)
        if table is None:
            table = next((t for prefix, t in self._prefixes if path.startswith(prefix) and path != prefix), None)
        if table is None:
            return error_response(404, f"no such path {path[:100]!r}")
        handler = table.get(method) or (table.get("GET") if method == "HEAD" else None)
        if handler is None:
            allowed = sorted(set(table) | ({"HEAD"} if "GET" in table else set()))
            response = error_response(405, f"{method} is not allowed here")
            response.headers["Allow"] = ", ".join(allowed)
            return response
        return handler


class _HttpConnection(asyncio.Protocol):
    """One client connection: TLS (when configured), then requests answered in order."""

    def __init__(self, server: HttpServer, guard: ConnectionGuard) -> None:
        self._server = server
        self._guard = guard
        self._raw: asyncio.Transport | None = None  # the TCP transport: what the guard knows
        self._transport: asyncio.Transport | None = None  # what we read and write (TLS or TCP)
        self._buffer = bytearray()
        self._head: RequestHead | None = None
        self._busy = False
        self._closed = False
        self._writable = asyncio.Event()
        self._writable.set()
        self._peer = ""
        self._local_port: int | None = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        raw = self._raw = cast(asyncio.Transport, transport)
        peer = raw.get_extra_info("peername")
        self._peer = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        sockname = raw.get_extra_info("sockname")
        self._local_port = int(sockname[1]) if isinstance(sockname, tuple) and len(sockname) >= 2 else None
        if not self._guard.admit(raw):
            raw.abort()
            self._closed = True
            return
        self._server.connections.add(self)
        # One configuration for the whole connection: the context it starts TLS with and the
        # client SANs it then checks come from the same version of the file.
        loaded = self._server.web_config.current() if self._server.web_config is not None else None
        if loaded is None or loaded.ssl_context is None:
            self._transport = raw
            return
        raw.pause_reading()  # the ClientHello stays in the socket until start_tls takes it
        tls = loaded.config.tls
        self._server.spawn(self._start_tls(raw, loaded.ssl_context, tls.client_allowed_sans if tls else ()))

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self._busy:
            if len(self._buffer) > MAX_HEAD_BYTES and self._transport is not None:
                self._transport.pause_reading()  # pipelined requests wait in the socket
            return
        self._next_request()

    def eof_received(self) -> bool | None:
        if not self._busy and self._transport is not None:
            self._transport.close()
        # Over TCP keep the socket half-open to finish a response in progress (we close after
        # it); a TLS transport closes itself and would only warn about a True.
        return self._transport is self._raw

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._writable.set()
        self._server.connections.discard(self)
        if self._raw is not None:
            self._guard.forget(self._raw)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # TLS

    async def _start_tls(self, raw: asyncio.Transport, context: ssl.SSLContext, sans: tuple[str, ...]) -> None:
        loop = asyncio.get_running_loop()
        try:
            transport = await loop.start_tls(
                raw,
                self,
                context,
                server_side=True,
                ssl_handshake_timeout=self._server.limits.read_header_timeout_seconds,
            )
        except (OSError, ssl.SSLError, asyncio.TimeoutError, ConnectionError) as exc:
            log.debug("TLS handshake with %s failed: %s", self._peer, exc)
            raw.abort()
            return
        if transport is None or self._closed:
            raw.abort()
            return
        if sans and not peer_has_allowed_san(transport.get_extra_info("peercert"), sans):
            log.info("client %s: its certificate names none of client_allowed_sans", self._peer)
            transport.abort()
            return
        self._transport = transport
        if self._buffer:
            self._next_request()

    # requests

    def _next_request(self) -> None:
        if self._busy or self._closed or self._transport is None:
            return
        if self._head is None:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > MAX_HEAD_BYTES:
                    self._reject(BadRequest(431, f"request head over {MAX_HEAD_BYTES} bytes"))
                return
            try:
                head = parse_head(bytes(self._buffer[:end]))
            except BadRequest as exc:
                self._reject(exc)
                return
            del self._buffer[: end + 4]
            if head.content_length > self._server.max_body_bytes:
                self._reject(
                    BadRequest(413, f"body of {head.content_length} bytes, over {self._server.max_body_bytes}")
                )
                return
            self._head = head
            if head.expects_continue and head.content_length and len(self._buffer) < head.content_length:
                self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        head = self._head
        if len(self._buffer) < head.content_length:
            return
        body = bytes(self._buffer[: head.content_length])
        del self._buffer[: head.content_length]
        self._head = None
        self._busy = True
        request = Request(
            method=head.method,
            path=head.path,
            query=head.query,
            headers=head.headers,
            body=body,
            peer=self._peer,
            local_port=self._local_port,
            tls=self._transport is not self._raw,
        )
        self._server.spawn(self._answer(request, head.keep_alive))

    async def _answer(self, request: Request, keep_alive: bool) -> None:
        assert self._raw is not None
        self._guard.request_started(self._raw)
        try:
            response = await self._server.respond(request)
            keep_alive = keep_alive and not self._server.stopping
            if self._closed or self._transport is None:
                return
            self._transport.write(
                serialize_response(response, keep_alive=keep_alive, head_only=request.method == "HEAD")
            )
            await self._writable.wait()
        finally:
            self._guard.request_finished(self._raw)
            self._busy = False
        if not keep_alive:
            self._transport.close()
            return
        self._transport.resume_reading()
        self._next_request()

    def _reject(self, error: BadRequest) -> None:
        log.info("bad request from %s: %s %s", self._peer or "unknown client", error.status, error.reason)
        self._busy = True  # nothing more is read from this connection
        if self._transport is not None:
            self._transport.write(serialize_response(error_response(error.status, error.reason), keep_alive=False))
            self._transport.close()

    def close_if_idle(self) -> None:
        if not self._busy and self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        for transport in (self._transport, self._raw):
            if transport is not None:
                transport.abort()


class HttpServer:
    """``routes`` on one address; see the module doc."""

    def __init__(
        self,
        routes: Routes,
        *,
        limits: ConnectionLimits = ConnectionLimits(),
        web_config: WebConfigSource | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        self._router = _Router(routes)
        self.limits = limits
        self.web_config = web_config
        self.max_body_bytes = max_body_bytes
        self.guard: ConnectionGuard | None = None
        self.connections: set[_HttpConnection] = set()
        self.stopping = False
        self.port: int | None = None
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> int:
        """Listen; return the port (useful with port 0). OSError when the address is taken."""
        loop = asyncio.get_running_loop()
        guard = self.guard = ConnectionGuard(loop, self.limits)  # the tests read its counters
        self._server = await loop.create_server(lambda: _HttpConnection(self, guard), host, port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        """Stop listening, let requests in progress finish (up to the shutdown timeout), close the rest."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.close_if_idle()
        pending = [task for task in self._tasks if not task.done()]
        if pending:
            await asyncio.wait(pending, timeout=self.limits.shutdown_timeout_seconds)
        for connection in list(self.connections):
            connection.abort()
        for task in list(self._tasks):
            task.cancel()
        if self._server is not None:
            await self._server.wait_closed()

    # for connections

    def spawn(self, coroutine: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def respond(self, request: Request) -> Response:
        loaded = self.web_config.current() if self.web_config is not None else None
        response = await self._authorized(request, loaded)
        if response is None:
            found = self._router.find(request.method, request.path)
            if isinstance(found, Response):
                response = found
            else:
                try:
                    response = await found(request)
                except Exception:  # logged: one broken handler must not end the server
                    log.exception("%s %s failed", request.method, request.path[:100])
                    response = error_response(500, "the handler failed; see the exporter's log")
        if loaded is not None:
            response.headers.update(loaded.config.headers)
        return response

    async def _authorized(self, request: Request, loaded: LoadedWebConfig | None) -> Response | None:
        """None when the request may go on, else the response that refuses it."""
        if self.web_config is None or loaded is None:
            return None
        if not self.web_config.rate_allows():
            return error_response(429, "rate limit exceeded")
        users = loaded.config.basic_auth_users
        if not users or request.path in UNAUTHENTICATED_PATHS:
            return None
        authorization = request.headers.get("authorization", "")
        if authorization:
            allowed: bool = await asyncio.to_thread(self.web_config.auth.allows, users, authorization)
            if allowed:
                return None
        response = error_response(401, "valid basic auth credentials are required")
        response.headers["WWW-Authenticate"] = "Basic"
        return response


@contextlib.asynccontextmanager
async def listening(server: HttpServer, host: str, port: int) -> AsyncIterator[HttpServer]:
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

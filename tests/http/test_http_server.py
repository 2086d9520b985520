"""exporter/http: the server on its own (aiohttp behind our guard), spoken to in raw bytes over real sockets."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from exporter.http.connections import ConnectionLimits
from exporter.http.server import WebServer, read_body


async def _echo(request: web.Request) -> web.Response:
    body = await read_body(request, 5.0)
    return web.json_response(
        {
            "method": request.method,
            "path": request.path,
            "query": dict(request.query),
            "body": body.decode(),
            "type": request.headers.get("Content-Type", ""),
        }
    )


async def _boom(request: web.Request) -> web.Response:
    raise RuntimeError("handler exploded")


def _server(**options: object) -> WebServer:
    return WebServer(
        {
            ("POST", "/mutate"): _echo,
            ("GET", "/mutate"): _echo,
            ("POST", "/-/sim/{action}"): _echo,
            ("GET", "/boom"): _boom,
        },
        max_body_bytes=1000,
        **options,  # type: ignore[arg-type]
    )


@pytest.fixture
async def port() -> AsyncIterator[int]:
    server = _server()
    yield await server.start("127.0.0.1", 0)
    await server.stop()


async def _exchange(port: int, raw: bytes, reads: int = 1) -> list[bytes]:
    """Send ``raw``, read ``reads`` responses (each whole, by Content-Length)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    answers = []
    try:
        for _ in range(reads):
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                0,
            )
            body = b"" if head.startswith(b"HTTP/1.1 100") or b"HEAD" in raw[:4] else await reader.readexactly(length)
            answers.append(head + body)
    finally:
        writer.close()
    return answers


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


async def test_a_post_body_reaches_the_handler(port: int) -> None:
    body = b'{"kind":"AdmissionReview"}'
    (answer,) = await _exchange(
        port,
        b"POST /mutate?timeout=10s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
        b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body),
    )
    assert _status(answer) == 200
    assert b'"body": "{\\"kind\\":\\"AdmissionReview\\"}"' in answer and b'"timeout": "10s"' in answer
    assert b'"type": "application/json"' in answer


async def test_a_body_sent_in_pieces_and_pipelined_requests_are_answered_in_order(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n01234")
    await asyncio.sleep(0.05)
    writer.write(b"56789GET /mutate?n=2 HTTP/1.1\r\nHost: x\r\n\r\nGET /mutate?n=3 HTTP/1.1\r\nHost: x\r\n\r\n")
    answers = []
    for _ in range(3):
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        length = int(next(line for line in head.split(b"\r\n") if line.startswith(b"Content-Length")).split(b":")[1])
        answers.append(await reader.readexactly(length))
    writer.close()
    assert b'"body": "0123456789"' in answers[0]
    assert b'"n": "2"' in answers[1] and b'"n": "3"' in answers[2]


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"DELETE /mutate HTTP/1.1\r\nHost: x\r\n\r\n", 405),
        (b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n", 404),
        (b"POST /-/sim HTTP/1.1\r\nHost: x\r\n\r\n", 404),  # the prefix itself is not under it
        (b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n", 413),
        (
            b"POST /mutate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n7d0\r\n"
            + b"x" * 2000
            + b"\r\n0\r\n\r\n",
            413,
        ),
        (b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", 400),
        (b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: \xc2\xb2\r\n\r\n", 400),  # a superscript two
        (b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: +1\r\n\r\nx", 400),
        (b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxx", 400),
        (b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
        (b"GET /mutate\r\n\r\n", 400),
        (b"GET /mutate HTTP/1.1\r\n Host: folded\r\n\r\n", 400),
        (b"GET /mutate HTTP/1.1\r\nHost : x\r\n\r\n", 400),
        (b"GET /mutate HTTP/1.1\r\nX: a\x00b\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * 101 + b"\r\n", 400),
        (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", 400),
        (b"GET /mutate HTTP/1.1\r\nX: " + b"v" * 9000 + b"\r\n\r\n", 400),
        (b"\xff\xfe HTTP/1.1\r\n\r\n", 400),
        (b"GET /boom HTTP/1.1\r\nHost: x\r\n\r\n", 500),
    ],
)
async def test_what_cannot_be_served_gets_a_status_and_the_server_goes_on(port: int, raw: bytes, status: int) -> None:
    (answer,) = await _exchange(port, raw)
    assert _status(answer) == status, answer
    (after,) = await _exchange(port, b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nok")
    assert _status(after) == 200


async def test_malformed_requests_are_one_line_each_and_a_flood_is_counted_not_logged(
    port: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    for _ in range(30):
        (answer,) = await _exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: \xc2\xb2\r\n\r\n")
        assert _status(answer) == 400
    lines = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert 1 <= len(lines) <= 10, [r.getMessage() for r in lines]
    assert all(r.exc_info is None and "\n" not in r.getMessage() for r in lines)
    assert all(r.getMessage().startswith("bad request from 127.0.0.1") for r in lines)


async def test_a_failing_handler_is_a_500_and_one_log_line(port: int, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    (answer,) = await _exchange(port, b"GET /boom HTTP/1.1\r\nHost: x\r\n\r\n")
    assert _status(answer) == 500 and b"handler exploded" not in answer, "no details to the client"
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1 and errors[0].exc_info is None
    assert errors[0].getMessage() == "GET /boom failed: RuntimeError: handler exploded"


async def test_a_head_request_gets_the_get_headers_without_a_body(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"HEAD /mutate HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert _status(head) == 200 and body == b"" and b"Content-Length: " in head


async def test_expect_100_continue_is_honoured(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /mutate HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n")
    assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).startswith(b"HTTP/1.1 100 Continue")
    writer.write(b"abc")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert _status(head) == 200
    writer.close()


async def test_http_1_0_closes_after_the_response(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /mutate HTTP/1.0\r\n\r\n")
    answer = await asyncio.wait_for(reader.read(), 5)  # read() returns only once the server closes
    writer.close()
    assert _status(answer) == 200 and answer.endswith(b"}")


async def test_a_body_that_trickles_in_is_cut_off() -> None:
    async def reading(request: web.Request) -> web.Response:
        return web.Response(body=await read_body(request, 0.3))

    server = WebServer({("POST", "/mutate"): reading})
    port = await server.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        assert _status(answer) == 408
    finally:
        await server.stop()


async def test_stop_lets_a_slow_request_finish() -> None:
    release = asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        await release.wait()
        return web.Response(text="done\n")

    server = WebServer({("GET", "/slow"): slow})
    port = await server.start("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.sleep(0.05)
    stopping = asyncio.create_task(server.stop())
    await asyncio.sleep(0.05)
    release.set()
    answer = await asyncio.wait_for(reader.read(), 5)
    await stopping
    writer.close()
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"done\n")
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)


async def test_a_client_that_pipelines_and_never_reads_is_shed_after_the_write_timeout() -> None:
    """Each answer is 256 KiB: the socket buffers fill, the write stalls, the connection is aborted."""
    page = b"x" * 256 * 1024

    async def big(request: web.Request) -> web.Response:
        return web.Response(body=page)

    server = WebServer({("GET", "/big"): big}, limits=ConnectionLimits(write_timeout_seconds=0.5, max_connections=4))
    port = await server.start("127.0.0.1", 0)
    try:
        stuck = socket.create_connection(("127.0.0.1", port))
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n" * 200)
        assert server.guard is not None
        deadline = time.monotonic() + 10
        while server.guard.write_timeouts == 0:
            assert time.monotonic() < deadline, "the stalled write was never timed out"
            await asyncio.sleep(0.05)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        assert _status(answer) == 200 and answer.endswith(page), "other clients are served meanwhile"
        stuck.setblocking(False)
        with pytest.raises(OSError):  # aborted: whatever was buffered, then a reset
            while stuck.recv(1 << 20):
                pass
        stuck.close()
    finally:
        await server.stop()

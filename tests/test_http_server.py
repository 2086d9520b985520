"""exporter/http: the HTTP/1.1 server on its own, spoken to in raw bytes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from exporter.http.messages import BadRequest, Request, Response, parse_head
from exporter.http.server import HttpServer


async def _echo(request: Request) -> Response:
    return Response.json({"method": request.method, "path": request.path, "query": request.query_params(),
                          "body": request.body.decode(), "type": request.headers.get("content-type", "")})


async def _boom(request: Request) -> Response:
    raise RuntimeError("handler exploded")


@pytest.fixture
async def port() -> AsyncIterator[int]:
    server = HttpServer(
        {("POST", "/mutate"): _echo, ("GET", "/mutate"): _echo, ("POST", "/-/sim/*"): _echo, ("GET", "/boom"): _boom},
        max_body_bytes=1000,
    )
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
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            body = b"" if head.startswith(b"HTTP/1.1 100") or b"HEAD" in raw[:4] else await reader.readexactly(length)
            answers.append(head + body)
    finally:
        writer.close()
    return answers


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


async def test_a_post_body_reaches_the_handler(port: int) -> None:
    body = b'{"kind":"AdmissionReview"}'
    (answer,) = await _exchange(port, b"POST /mutate?timeout=10s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                                      b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
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
        (b"GET /-/sim HTTP/1.1\r\nHost: x\r\n\r\n", 404),  # the prefix itself is not under it
        (b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n", 413),
        (b"POST /mutate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 501),
        (b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", 400),
        (b"GET /mutate HTTP/2.0\r\nHost: x\r\n\r\n", 505),
        (b"GET /mutate\r\n\r\n", 400),
        (b"GET /mutate HTTP/1.1\r\n Host: folded\r\n\r\n", 400),
        (b"GET /mutate HTTP/1.1\r\nX: a\x00b\r\n\r\n", 400),
        (b"GET /boom HTTP/1.1\r\nHost: x\r\n\r\n", 500),
    ],
)
async def test_what_cannot_be_served_gets_a_status_and_the_server_goes_on(port: int, raw: bytes, status: int,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="exporter.http.server")
    (answer,) = await _exchange(port, raw)
    assert _status(answer) == status, answer
    (after,) = await _exchange(port, b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nok")
    assert _status(after) == 200


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
    assert _status(answer) == 200 and b"Connection: close" in answer


async def test_stop_lets_a_slow_request_finish() -> None:
    release = asyncio.Event()

    async def slow(request: Request) -> Response:
        await release.wait()
        return Response.text("done\n")

    server = HttpServer({("GET", "/slow"): slow})
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
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"done\n") and b"Connection: close" in answer
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)


@pytest.mark.parametrize(
    "head",
    [b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * 101, b"GET /" + b"a" * 70_000 + b" HTTP/1.1", b"", b"\xff\xfe HTTP/1.1"],
)
def test_parse_head_refuses_what_it_cannot_bound(head: bytes) -> None:
    with pytest.raises(BadRequest):
        parse_head(head)


def test_parse_head_reads_a_request() -> None:
    head = parse_head(b"\r\nPOST /a%20b?x=1 HTTP/1.1\r\nHost: h\r\nX-Two: 1\r\nx-two: 2\r\nContent-Length: 7")
    assert (head.method, head.path, head.query, head.content_length) == ("POST", "/a b", "x=1", 7)
    assert head.headers["x-two"] == "1, 2" and head.keep_alive
    assert not parse_head(b"GET / HTTP/1.1\r\nConnection: close").keep_alive
    assert parse_head(b"GET http://h:1/p?q HTTP/1.1").path == "/p"

"""HTTP/1.1 requests and responses as values: parse a request head, write a response.

Pure: bytes in, values out. What a request may carry is bounded (``MAX_HEAD_BYTES``,
``MAX_HEADERS``); anything outside HTTP/1.0 and 1.1 as RFC 9112 writes them is a
``BadRequest`` with a status and a one-line reason, never an exception of another kind.
Request bodies come with a ``Content-Length``; a chunked upload is refused (501), which no
client of ours (Prometheus, kube-apiserver, kubelet probes, curl) sends.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from urllib.parse import parse_qsl, unquote, urlsplit

MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 100

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_REQUEST_LINE = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+) (\S+) HTTP/(\d)\.(\d)")
_FIELD_VALUE = re.compile(rb"[\t\x20-\x7e\x80-\xff]*")


class BadRequest(Exception):
    """A request we answer with ``status`` and close: ``reason`` is one line."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class RequestHead:
    method: str
    path: str  # percent-decoded
    query: str  # as sent
    version: tuple[int, int]
    headers: Mapping[str, str]  # lower-case names; repeated fields joined with ", "
    content_length: int

    @property
    def keep_alive(self) -> bool:
        tokens = {token.strip().lower() for token in self.headers.get("connection", "").split(",")}
        if self.version >= (1, 1):
            return "close" not in tokens
        return "keep-alive" in tokens

    @property
    def expects_continue(self) -> bool:
        return self.headers.get("expect", "").lower() == "100-continue"


@dataclass(frozen=True)
class Request:
    """What a handler sees: the head, the whole body, and who asked."""

    method: str
    path: str
    query: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""
    peer: str = ""  # the client's address, without port
    local_port: int | None = None
    tls: bool = False

    def query_params(self) -> dict[str, str]:
        """The query string as a dict (a repeated key: the last value)."""
        return dict(parse_qsl(self.query, keep_blank_values=True))


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def text(cls, text: str, status: int = 200) -> Response:
        return cls(status=status, body=text.encode())

    @classmethod
    def html(cls, page: str, status: int = 200) -> Response:
        return cls(status=status, body=page.encode(), content_type="text/html; charset=utf-8")

    @classmethod
    def json(cls, value: object, status: int = 200) -> Response:
        return cls(status=status, body=json.dumps(value).encode(), content_type="application/json; charset=utf-8")


def parse_head(head: bytes) -> RequestHead:
    """The request line and header fields (``head`` without the blank line that ends it)."""
    if len(head) > MAX_HEAD_BYTES:
        raise BadRequest(431, f"request head over {MAX_HEAD_BYTES} bytes")
    lines = head.split(b"\r\n")
    while lines and not lines[0]:  # RFC 9112 2.2: ignore empty lines before the request line
        lines.pop(0)
    if not lines:
        raise BadRequest(400, "empty request")
    match = _REQUEST_LINE.fullmatch(lines[0])
    if match is None:
        raise BadRequest(400, f"malformed request line {_shown(lines[0])}")
    method, target, major, minor = match.groups()
    version = (int(major), int(minor))
    if version not in ((1, 0), (1, 1)):
        raise BadRequest(505, f"HTTP/{version[0]}.{version[1]} is not supported")
    if len(lines) - 1 > MAX_HEADERS:
        raise BadRequest(431, f"more than {MAX_HEADERS} header fields")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):  # also obs-fold (a line starting with space)
            raise BadRequest(400, f"malformed header line {_shown(line)}")
        value = value.strip(b" \t")
        if not _FIELD_VALUE.fullmatch(value):
            raise BadRequest(400, f"control character in header {_shown(name)}")
        key = name.decode("ascii").lower()
        text = value.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    if "transfer-encoding" in headers:
        raise BadRequest(501, "request bodies must come with Content-Length, not Transfer-Encoding")
    length_field = headers.get("content-length", "0")
    if not length_field.isdigit() or len(length_field) > 18:
        raise BadRequest(400, f"invalid Content-Length {length_field[:40]!r}")
    path, query = _split_target(target)
    return RequestHead(method.decode("ascii"), path, query, version, headers, int(length_field))


def _split_target(target: bytes) -> tuple[str, str]:
    try:
        text = target.decode("ascii")
    except UnicodeDecodeError:
        raise BadRequest(400, "request target is not ASCII") from None
    if text.startswith(("http://", "https://")):  # absolute-form (proxies)
        parts = urlsplit(text)
        text = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if not text.startswith("/") and text != "*":
        raise BadRequest(400, f"request target {text[:80]!r} is not a path")
    path, _, query = text.partition("?")
    return unquote(path, errors="replace"), query


def _shown(raw: bytes) -> str:
    return repr(raw[:80].decode("latin-1"))


def reason_phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def serialize_response(response: Response, *, keep_alive: bool, head_only: bool = False) -> bytes:
    """Status line, header fields and body (no body for HEAD; its length still announced)."""
    fields = {
        "Content-Type": response.content_type,
        "Content-Length": str(len(response.body)),
        "Date": formatdate(time.time(), usegmt=True),
        **response.headers,
    }
    if not keep_alive:
        fields["Connection"] = "close"
    head = f"HTTP/1.1 {response.status} {reason_phrase(response.status)}\r\n" + "".join(
        f"{name}: {value}\r\n" for name, value in fields.items()
    )
    return (head + "\r\n").encode("latin-1") + (b"" if head_only else response.body)


def error_response(status: int, reason: str) -> Response:
    return Response.text(f"{reason_phrase(status)}: {reason}\n", status=status)

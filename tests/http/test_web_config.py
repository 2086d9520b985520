"""``--web.config.file``: exporter-toolkit's web configuration (TLS, client certificates, basic auth).

Certificates are made in the test with the ``openssl`` command line (a CA, a server certificate
for 127.0.0.1, a client certificate); the server is ours (aiohttp behind exporter/http), served on
loopback; the clients are Python's ssl, aiohttp and a real Prometheus.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import bcrypt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from exporter.http.access import AUTH_CACHE_SIZE, AuthBusy
from exporter.http.endpoints import create_app, serving
from exporter.http.webconfig import (
    WebConfigError,
    WebConfigSource,
    parse_web_config,
    peer_has_allowed_san,
)
from tests.conftest import REPO, free_port, require_tool
from tests.pki import issue, make_ca

PASSWORD = "s3cret-scrape"
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()  # cost 4: fast tests, same check


class Fixed:
    name = "fixed"

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily("ccl_test_fixed", "test")
        family.add_metric([], 1.0)
        yield family


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for 127.0.0.1 (and a second one, for rotation), two client certificates."""
    folder = tmp_path_factory.mktemp("pki")
    make_ca(folder)
    issue(folder, "server", "/CN=exporter", "IP:127.0.0.1,DNS:localhost")
    issue(folder, "server2", "/CN=exporter rotated", "IP:127.0.0.1,DNS:localhost")
    issue(folder, "client", "/CN=prometheus", "DNS:prometheus.monitoring.svc")
    issue(folder, "stranger", "/CN=stranger", "DNS:stranger.example")
    return folder


def _write_config(folder: Path, text: str) -> Path:
    path = folder / "web-config.yml"
    path.write_text(text)
    return path


def _mtls(pki: Path) -> str:
    """A web config that requires client certificates signed by the test CA."""
    return (
        f"tls_server_config:\n  cert_file: {pki}/server.crt\n  key_file: {pki}/server.key\n"
        f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {pki}/ca.crt\n"
    )


def _client_context(pki: Path, cert: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if cert:
        context.load_cert_chain(pki / f"{cert}.crt", pki / f"{cert}.key")
    return context


def _auth(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


async def _get(port: int, path: str, context: ssl.SSLContext | None, headers: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    """(status, headers, body) of one GET over a fresh connection."""
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname="127.0.0.1" if context else None
    )
    fields = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{fields}\r\n".encode())
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    if not raw:  # with TLS 1.3 a refused client certificate shows as a close after the handshake
        raise ConnectionError("closed without an answer")
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    response_headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), response_headers, body


@contextlib.asynccontextmanager
async def _serving(config: Path):  # type: ignore[no-untyped-def]
    async with serving(
        create_app([Fixed()], process_metrics=False), "127.0.0.1", 0, web_config=WebConfigSource.from_file(config)
    ) as server:
        yield server.port


# --- the file ---------------------------------------------------------------------------------


def test_a_full_config_is_read_with_paths_relative_to_its_folder(tmp_path: Path) -> None:
    config = parse_web_config(
        f"""
tls_server_config:
  cert_file: tls/server.crt
  key_file: /abs/server.key
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: ca.crt
  client_allowed_sans: [prometheus.monitoring.svc]
  min_version: TLS13
  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]
  prefer_server_cipher_suites: true
http_server_config:
  http2: true
  headers:
    X-Frame-Options: deny
    Strict-Transport-Security: max-age=31536000
basic_auth_users:
  prometheus: {HASH}
rate_limit:
  burst: 10
  interval: 1s
""",
        tmp_path,
    )
    assert config.tls is not None
    assert config.tls.cert_file == tmp_path / "tls/server.crt" and config.tls.key_file == Path("/abs/server.key")
    assert config.tls.client_ca_file == tmp_path / "ca.crt" and config.tls.min_version == "TLS13"
    assert config.basic_auth_users == {"prometheus": HASH}
    assert config.headers == {"X-Frame-Options": "deny", "Strict-Transport-Security": "max-age=31536000"}
    assert config.rate_limit is not None and config.rate_limit.burst == 10 and config.rate_limit.interval_seconds == 1


def test_no_tls_key_means_plain_http_and_an_empty_file_is_valid(tmp_path: Path) -> None:
    assert parse_web_config("", tmp_path).tls is None
    assert parse_web_config("basic_auth_users:\n  u: " + HASH, tmp_path).tls is None


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("tls_server_config:\n  cert_file: a.crt\n", "missing one of key or key_file"),
        ("tls_server_config:\n  key_file: a.key\n", "missing one of cert or cert_file"),
        ("tls_server_config:\n  cert: PEM\n", "missing one of key or key_file"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  client_ca_file: ca.crt\n", "without a client_auth_type"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: Sometimes\n", "invalid 'Sometimes'"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: SSL3\n", "unknown 'SSL3'"),
        (
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  cipher_suites: [TLS_RSA_WITH_AES_128_GCM_SHA256]\n",
            "unknown cipher",
        ),
        ("tls_server_config:\n  certfile: a\n", "unknown field 'certfile'"),
        ("tls_server_config:\n  cert_file: a\n  cert_file: b\n", "set twice"),
        ("tls_config:\n  cert_file: a\n", "unknown field 'tls_config'"),
        ("basic_auth_users:\n  u: plaintext\n", "too short to be a bcrypted password"),
        ("http_server_config:\n  headers:\n    Server: ours\n", "'Server' can not be configured"),
        ("http_server_config:\n  headers:\n    X-Frame-Options: allow\n", "is not one of deny, sameorigin"),
        ('http_server_config:\n  http2: "yes"\n', "must be true or false"),
        ("rate_limit:\n  burst: 5\n  interval: soon\n", "not a duration"),
        ('rate_limit:\n  burst: "5"\n  interval: 1s\n', "must be a whole number"),
        ("rate_limit:\n  burst: 1e400\n  interval: 1s\n", "must be a whole number"),
        ("rate_limit:\n  burst: 1\n  interval: 1sec\n", "not a duration"),
        ("[1, 2", "not YAML"),
        ("- a list\n", "must be a mapping"),
    ],
)
def test_what_exporter_toolkit_refuses_is_refused_with_a_reason(tmp_path: Path, text: str, reason: str) -> None:
    with pytest.raises(WebConfigError, match=reason.replace("(", r"\(")):
        parse_web_config(text, tmp_path)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # yaml.v2 into Go types: a string field takes the scalar as written, a Duration a plain int as
        # nanoseconds or Go's duration syntax, an int a plain number, a bool YAML 1.1's words.
        ("http_server_config:\n  headers:\n    X-XSS-Protection: 1\n", {"headers": {"X-XSS-Protection": "1"}}),
        ("http_server_config:\n  headers:\n    X-XSS-Protection: 0x10\n", {"headers": {"X-XSS-Protection": "0x10"}}),
        ("rate_limit:\n  interval: 1000000000\n  burst: 0x10\n", {"rate_limit": (16, 1.0)}),
        ("rate_limit:\n  interval: 1h30m\n  burst: 1_000\n", {"rate_limit": (1000, 5400.0)}),
        ("rate_limit:\n  interval: 1.5s\n  burst: 3.9\n", {"rate_limit": (3, 1.5)}),
        ("rate_limit:\n  interval: 250ms\n  burst: -2\n", {"rate_limit": (-2, 0.25)}),  # refuses all, as Go
        ("rate_limit:\n  interval: -1s\n  burst: 1\n", {"rate_limit": None}),  # rate.Every(<0): no limit
        ("http_server_config:\n  http2: off\n", {"http2": False}),
        ("http_server_config:\n  http2: y\n", {"http2": True}),
        ("http_server_config:\n", {"http2": False}),  # yaml.v2 zeroes a struct given as null
        ("", {"http2": True}),
        ("first: document\n---\n", None),
    ],
)
def test_values_are_read_as_go_reads_them_into_typed_fields(tmp_path: Path, text: str, expected: dict | None) -> None:
    if expected is None:
        with pytest.raises(WebConfigError, match="unknown field 'first'"):
            parse_web_config(text, tmp_path)
        return
    config = parse_web_config(text, tmp_path)
    if "headers" in expected:
        assert config.headers == expected["headers"]
    if "rate_limit" in expected:
        limit = config.rate_limit
        assert (None if limit is None else (limit.burst, limit.interval_seconds)) == expected["rate_limit"]
    if "http2" in expected:
        assert config.http2 is expected["http2"]


@pytest.mark.parametrize(
    "text",
    [
        # a null http_server_config turns HTTP/2 off (above), so Go's HTTP/2 cipher rule does not apply
        "tls_server_config:\n  cert_file: a\n  key_file: b\n  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA]\n"
        "http_server_config:\n",
        # nor from TLS 1.3 up, where Go does not use the list
        "tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS13\n"
        "  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA]\n",
        # RequireClientCert: exporter-toolkit's old name for RequireAnyClientCert
        "tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: RequireClientCert\n",
    ],
)
def test_configurations_go_takes_are_taken(tmp_path: Path, text: str) -> None:
    config = parse_web_config(text, tmp_path)
    assert config.tls is not None and config.tls.client_auth_type in ("NoClientCert", "RequireAnyClientCert")


def test_client_allowed_sans_apply_only_when_a_certificate_is_asked_for(tmp_path: Path) -> None:
    base = "tls_server_config:\n  cert_file: a\n  key_file: b\n  client_allowed_sans: []\n"
    plain = parse_web_config(base, tmp_path).tls
    asking = parse_web_config(base + "  client_auth_type: VerifyClientCertIfGiven\n", tmp_path).tls
    assert plain is not None and plain.sans_to_check is None, "Go calls VerifyPeerCertificate only after asking"
    assert asking is not None and asking.sans_to_check == (), "an empty list is a check that nothing passes"
    ipv6 = {"subjectAltName": (("IP Address", "2001:DB8:0:0:0:0:0:1\n"),)}
    assert peer_has_allowed_san(ipv6, ("2001:db8::1",)), "IP SANs compared in Go's net.IP.String() form"
    assert not peer_has_allowed_san(None, ()) and peer_has_allowed_san(None, None)


def test_a_certificate_that_does_not_load_stops_the_start(tmp_path: Path, pki: Path) -> None:
    config = _write_config(
        tmp_path, f"tls_server_config:\n  cert_file: {pki}/server.crt\n  key_file: {pki}/client.key\n"
    )
    with pytest.raises(WebConfigError, match="TLS:"):
        WebConfigSource.from_file(config)


# --- served ------------------------------------------------------------------------------------


async def test_tls_and_basic_auth(tmp_path: Path, pki: Path) -> None:
    config = _write_config(
        tmp_path,
        f"""
tls_server_config:
  cert_file: {pki}/server.crt
  key_file: {pki}/server.key
http_server_config:
  headers:
    X-Content-Type-Options: nosniff
basic_auth_users:
  prometheus: {HASH}
""",
    )
    context = _client_context(pki)
    async with _serving(config) as port:
        status, headers, body = await _get(port, "/metrics", context, _auth("prometheus", PASSWORD))
        assert status == 200 and b"ccl_test_fixed 1.0" in body
        assert headers["X-Content-Type-Options"] == "nosniff"
        for credentials in (_auth("prometheus", "wrong"), _auth("nobody", PASSWORD), {}, {"Authorization": "Basic !!"}):
            status, headers, _ = await _get(port, "/metrics", context, credentials)
            assert status == 401 and headers["WWW-Authenticate"] == "Basic", credentials
            assert headers["X-Content-Type-Options"] == "nosniff"
        status, _, body = await _get(port, "/healthz", context)
        assert (status, body) == (200, b"ok\n"), "kubelet probes need no credentials"


async def test_plain_http_on_the_tls_port_gets_no_metrics(tmp_path: Path, pki: Path) -> None:
    config = _write_config(
        tmp_path, f"tls_server_config:\n  cert_file: {pki}/server.crt\n  key_file: {pki}/server.key\n"
    )
    async with _serving(config) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert answer == b"", "the handshake fails: the connection is closed unanswered"
        assert (await _get(port, "/metrics", _client_context(pki)))[0] == 200, "TLS clients still served"


async def test_client_certificates_are_required_and_checked(tmp_path: Path, pki: Path) -> None:
    config = _write_config(tmp_path, _mtls(pki) + "  client_allowed_sans: [prometheus.monitoring.svc]\n")
    async with _serving(config) as port:
        assert (await _get(port, "/metrics", _client_context(pki, "client")))[0] == 200
        for context in (_client_context(pki), _client_context(pki, "stranger")):
            with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError, OSError, ValueError)):
                await _get(port, "/metrics", context)
        assert (await _get(port, "/metrics", _client_context(pki, "client")))[0] == 200, "still serving"


async def test_rotated_certificates_apply_to_new_connections(tmp_path: Path, pki: Path) -> None:
    tls = tmp_path / "tls"
    tls.mkdir()
    for suffix in ("crt", "key"):
        (tls / f"server.{suffix}").write_bytes((pki / f"server.{suffix}").read_bytes())
    config = _write_config(tmp_path, "tls_server_config:\n  cert_file: tls/server.crt\n  key_file: tls/server.key\n")

    async def served_subject(port: int) -> str:
        _, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=_client_context(pki), server_hostname="127.0.0.1"
        )
        cert = writer.get_extra_info("peercert")
        writer.close()
        return dict(item[0] for item in cert["subject"])["commonName"]

    async with _serving(config) as port:
        assert await served_subject(port) == "exporter"
        await asyncio.sleep(WebConfigSource.RECHECK_SECONDS)
        (tls / "server.key").write_bytes(b"not a key")  # half-way through a rotation: keep the old pair
        await asyncio.sleep(WebConfigSource.RECHECK_SECONDS + 0.1)
        assert await served_subject(port) == "exporter"
        for suffix in ("crt", "key"):
            (tls / f"server.{suffix}").write_bytes((pki / f"server2.{suffix}").read_bytes())
        await asyncio.sleep(WebConfigSource.RECHECK_SECONDS + 0.1)
        assert await served_subject(port) == "exporter rotated"


async def test_the_rate_limit_answers_429_but_never_to_the_health_paths(tmp_path: Path) -> None:
    config = _write_config(tmp_path, "rate_limit:\n  burst: 2\n  interval: 1h\n")
    async with _serving(config) as port:
        statuses = [(await _get(port, "/metrics", None))[0] for _ in range(4)]
        health = [(await _get(port, path, None))[0] for path in ("/healthz", "/readyz") for _ in range(3)]
    assert statuses == [200, 200, 429, 429]
    assert health == [200] * 6, "kubelet probes are never rate limited"


@pytest.mark.parametrize(
    ("rate_limit", "expected"),
    [
        ("burst: 0\n  interval: 1s", [429, 429, 429]),  # exporter-toolkit: a zero burst allows nothing
        ("burst: 1\n  interval: 0", [200, 200, 200]),  # a zero interval turns the limiter off
        ("burst: 1", [200, 200, 200]),
    ],
)
async def test_rate_limit_edges_as_exporter_toolkit(tmp_path: Path, rate_limit: str, expected: list[int]) -> None:
    config = _write_config(tmp_path, f"rate_limit:\n  {rate_limit}\n")
    async with _serving(config) as port:
        assert [(await _get(port, "/metrics", None))[0] for _ in range(3)] == expected


async def test_anonymous_clients_exhausting_the_rate_limit_leave_a_known_scraper_alone(tmp_path: Path) -> None:
    config = _write_config(
        tmp_path, f"basic_auth_users:\n  prometheus: {HASH}\nrate_limit:\n  burst: 3\n  interval: 1h\n"
    )
    async with _serving(config) as port:
        good = _auth("prometheus", PASSWORD)
        assert (await _get(port, "/metrics", None, good))[0] == 200  # checked once: takes a token
        anonymous = [(await _get(port, "/metrics", None))[0] for _ in range(5)]
        assert anonymous == [401, 401, 429, 429, 429]
        assert [(await _get(port, "/metrics", None, good))[0] for _ in range(3)] == [200] * 3
        assert (await _get(port, "/metrics", None, _auth("prometheus", "guess")))[0] == 429, "a new guess waits"
        assert (await _get(port, "/healthz", None))[0] == 200


async def test_a_cached_login_never_waits_for_bcrypt(tmp_path: Path) -> None:
    """A flood of wrong passwords keeps the hashing thread busy; a known client is answered meanwhile."""
    config = _write_config(tmp_path, f"basic_auth_users:\n  prometheus: {HASH}\n")
    source = WebConfigSource.from_file(config)
    users = source.current().config.basic_auth_users
    good = _auth("prometheus", PASSWORD)["Authorization"]
    assert await source.auth.allows(users, good)
    hashing = threading.Event()
    release = threading.Event()

    def slow(password: bytes, hashed: bytes) -> bool:
        hashing.set()
        release.wait(10)
        return bcrypt.checkpw(password, hashed)

    source.auth._check = slow
    floods = [
        asyncio.create_task(source.auth.allows(users, _auth("prometheus", f"guess{i}")["Authorization"]))
        for i in range(source.auth.MAX_WAITING)
    ]
    await asyncio.to_thread(hashing.wait, 5)
    started = time.perf_counter()
    assert await source.auth.allows(users, good)
    assert time.perf_counter() - started < 0.1, "the cache is read outside the hashing lock"
    with pytest.raises(AuthBusy):
        await source.auth.allows(users, _auth("prometheus", "one-too-many")["Authorization"])
    release.set()
    assert not any(await asyncio.gather(*floods))
    for _ in range(3 * AUTH_CACHE_SIZE):  # wrong passwords fill and churn the failure cache ...
        source.auth._remember(os.urandom(32), False)
    assert source.auth.cached(source.auth.credentials(users, good)[0]) is True, "... never the good one"  # type: ignore[index]
    source.auth.close()


async def test_basic_auth_checks_bcrypt_once_per_credentials(tmp_path: Path) -> None:
    """bcrypt costs tens of ms by design; a scrape every 15 s must not pay it each time."""
    config = _write_config(tmp_path, f"basic_auth_users:\n  prometheus: {HASH}\n")
    source = WebConfigSource.from_file(config)
    checks: list[bytes] = []

    def counting(password: bytes, hashed: bytes) -> bool:
        checks.append(password)
        return bcrypt.checkpw(password, hashed)

    source.auth._check = counting
    users = source.current().config.basic_auth_users
    header = _auth("prometheus", PASSWORD)["Authorization"]
    assert all([await source.auth.allows(users, header) for _ in range(5)])
    for _ in range(2):  # failures are cached too (exporter-toolkit's cache.go)
        assert not await source.auth.allows(users, _auth("prometheus", "nope")["Authorization"])
        assert not await source.auth.allows(users, _auth("ghost", "nope")["Authorization"])
    assert len(checks) == 3, "one bcrypt per distinct (user, password); an unknown user costs one too"
    source.auth.close()


async def test_a_reload_that_would_leave_no_user_keeps_the_last_good_config(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(WebConfigSource, "RECHECK_SECONDS", 0.2)  # eight rechecks: no need to wait seconds each
    config = _write_config(tmp_path, f"basic_auth_users:\n  prometheus: {HASH}\n")
    async with _serving(config) as port:
        assert (await _get(port, "/metrics", None))[0] == 401
        for text in ("", "basic_auth_users: {}\n", "basic_auth_users:\n  prometheus: [oops\n"):
            await asyncio.sleep(WebConfigSource.RECHECK_SECONDS)
            config.write_text(text)
            await asyncio.sleep(WebConfigSource.RECHECK_SECONDS + 0.1)
            assert (await _get(port, "/metrics", None))[0] == 401, f"auth still on after {text!r}"
            assert (await _get(port, "/metrics", None, _auth("prometheus", PASSWORD)))[0] == 200
        await asyncio.sleep(WebConfigSource.RECHECK_SECONDS)
        config.write_text(f"basic_auth_users:\n  prometheus: {HASH}\n  grafana: {HASH}\n")
        await asyncio.sleep(WebConfigSource.RECHECK_SECONDS + 0.1)
        assert (await _get(port, "/metrics", None, _auth("grafana", PASSWORD)))[0] == 200, "a good file still loads"
    kept = [r.getMessage() for r in caplog.records if "keeping the last" in r.getMessage()]
    assert len(kept) == 3 and sum("no basic auth user is left" in message for message in kept) == 2, kept


# --- the command and a real Prometheus ---------------------------------------------------------


def test_serve_refuses_a_bad_web_config_with_one_line(tmp_path: Path) -> None:
    config = _write_config(tmp_path, "tls_server_config:\n  cert_file: missing.crt\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "exporter",
            "serve",
            "--collector.disable-defaults",
            f"--path.state={tmp_path}",
            f"--web.config.file={config}",
            f"--web.listen-address=127.0.0.1:{free_port()}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"ccl-exporter: --web.config.file {config}: tls_server_config: missing one of key or key_file"
    ]


def test_a_real_prometheus_scrapes_over_tls_with_basic_auth(tmp_path: Path, pki: Path) -> None:
    from devtools.stack import Prometheus

    prometheus_binary = require_tool("prometheus")
    config = _write_config(tmp_path, _mtls(pki) + f"basic_auth_users:\n  prometheus: {HASH}\n")
    port = free_port()
    exporter = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "exporter",
            "serve",
            "--collector.disable-defaults",
            f"--path.state={tmp_path}",
            f"--web.config.file={config}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )

    def job(name: str, password: str) -> dict[str, object]:
        return {
            "job_name": name,
            "scheme": "https",
            "tls_config": {
                "ca_file": str(pki / "ca.crt"),
                "cert_file": str(pki / "client.crt"),
                "key_file": str(pki / "client.key"),
                "server_name": "127.0.0.1",
            },
            "basic_auth": {"username": "prometheus", "password": password},
            "static_configs": [{"targets": [f"127.0.0.1:{port}"]}],
        }

    plain = {"job_name": "plain", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
    prometheus = Prometheus(
        prometheus_binary,
        tmp_path / "prometheus",
        {
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms"},
            "scrape_configs": [job("right", PASSWORD), job("wrong", "guess"), plain],
        },
    )
    try:
        _wait_listening(port)
        prometheus.start()
        up = prometheus.wait_until(
            lambda: (
                (values := {s["metric"]["job"]: s["value"][1] for s in prometheus.query("up")})
                and len(values) == 3
                and values
            ),
            timeout=30,
            what="three scrape jobs reporting",
        )
        assert up == {"right": "1", "wrong": "0", "plain": "0"}, json.dumps(up)
        assert prometheus.values('ccl_exporter_build_info{job="right"}') == [1.0]
        targets = {t["labels"]["job"]: t["lastError"] for t in prometheus.api("targets")["activeTargets"]}
        assert "401" in targets["wrong"]
    finally:
        prometheus.stop()
        exporter.terminate()
        exporter.wait(10)


def _wait_listening(port: int, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
        time.sleep(0.1)
    raise TimeoutError(f"the exporter did not listen on {port}")


_KEYS = [
    "tls_server_config",
    "http_server_config",
    "basic_auth_users",
    "rate_limit",
    "cert",
    "key",
    "cert_file",
    "key_file",
    "client_ca",
    "client_ca_file",
    "client_auth_type",
    "cipher_suites",
    "curve_preferences",
    "min_version",
    "max_version",
    "prefer_server_cipher_suites",
    "client_allowed_sans",
    "http2",
    "headers",
    "burst",
    "interval",
    "X-Frame-Options",
]
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.sampled_from(
        ["TLS13", "X25519", "1s", "-1.5h", "0x1F", ".s", "1e400", "RequireAnyClientCert", "$2y$99$" + "a" * 53]
    ),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(_KEYS), inner, max_size=4)),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(document=st.dictionaries(st.sampled_from(_KEYS), _VALUES, max_size=5), raw=st.text(max_size=80))
def test_any_file_is_a_web_config_or_one_clear_error(tmp_path: Path, document: dict, raw: str) -> None:
    import yaml

    for text in (yaml.safe_dump(document), raw):
        try:
            parse_web_config(text, tmp_path)
        except WebConfigError as exc:
            assert "\n" not in str(exc)

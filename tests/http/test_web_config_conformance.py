"""exporter-toolkit's own test configurations: accepted, refused and served as exporter-toolkit does.

Each configuration in ``CONFIGS`` is our copy of the file of the same name in
prometheus/exporter-toolkit ``web/testdata/`` at v0.17.1 (commit 7d8838ccf7a7), written from its
keys and values. What upstream decides comes from its test table in ``web/tls_config_test.go``
(``TestYAMLFiles``, ``TestServerBehaviour``, ``TestUsers``, ``TestConfigReloading``) and, for the
two files no test there names (``web_config_auth_clientCAs_missing.bad.yml`` and
``tls_config_noAuth.requireanyclientcertkeyinline.good.yml``), from ``Validate`` in
``web/tls_config.go``: both pass it. ``web_config_noAuth_noHTTP2Cipher.bad.yml`` passes
``Validate`` but Go's HTTP/2 server refuses to start with it (net/http ``http2ConfigureServer``).

The certificates are made in the test: ``server.crt`` for 127.0.0.1 and localhost signed by
``tls-ca-chain.pem``, and two self-signed client certificates, ``client_selfsigned`` and
``client2_selfsigned`` (whose SANs include ``test3``, the name upstream's good SAN list shares
with it). The clients are Python's ssl and ``openssl s_client``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import ssl
import string
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

import bcrypt
import pytest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from exporter.http.endpoints import create_app, serving
from exporter.http.webconfig import WebConfigError, WebConfigSource
from tests.conftest import require_tool
from tests.pki import issue, make_ca, self_signed

UPSTREAM = "prometheus/exporter-toolkit v0.17.1 (7d8838ccf7a7) web/testdata"


def _junk() -> str:
    """web_config_junk.yml: twenty lines of twenty letters and digits, one YAML string."""
    rng = random.Random(20)
    return "".join("".join(rng.choices(string.ascii_letters + string.digits, k=20)) + "\n" for _ in range(20))


def _hash(password: str, cost: int) -> str:
    """A bcrypt hash whose cost field says ``cost``; only costs up to 10 are real (upstream's alice and
    bob, at 12 and 18, are never checked against a password, only read at start)."""
    real = bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()
    return real if cost == 4 else real[:4] + f"{cost:02d}" + real[6:]


USERS = (
    f"  alice: {_hash('alice123', 12)}\n  bob: {_hash('bob123', 18)}\n"
    f"  carol: {_hash('carol123', 4)}\n  dave: {_hash('dave123', 4)}\n"
)
TLS = '  cert_file: "server.crt"\n  key_file: "server.key"\n'
NO_AUTH = TLS + '  client_auth_type: "VerifyClientCertIfGiven"\n'

# file name in web/testdata -> our copy ("%CERT%"/"%KEY%": the PEM inline, indented)
CONFIGS: dict[str, str] = {
    "tls_config_noAuth.requireandverifyclientcert.good.yml": (
        f'tls_server_config:\n{TLS}  client_auth_type: "RequireAndVerifyClientCert"\n'
        '  client_ca_file: "client_selfsigned.pem"\n'
    ),
    "tls_config_noAuth.requireanyclientcert.good.yml": (
        f'tls_server_config:\n{TLS}  client_auth_type: "RequireAnyClientCert"\n'
    ),
    "tls_config_noAuth.requireanyclientcertkeyinline.good.yml": (
        'tls_server_config:\n  cert_file: "server.crt"\n  key: |\n%KEY%  client_auth_type: "RequireAnyClientCert"\n'
    ),
    "web_config_auth_clientCAs_invalid.bad.yml": f'tls_server_config:\n{TLS}  client_ca_file: "somefile"\n',
    "web_config_auth_clientCAs_missing.bad.yml": (
        f'tls_server_config:\n{TLS}  client_auth_type: "RequireAndVerifyClientCert"\n'
    ),
    "web_config_auth_client_san.bad.yaml": (
        f'tls_server_config:\n{TLS}  client_auth_type: "RequireAndVerifyClientCert"\n'
        '  client_ca_file: "client2_selfsigned.pem"\n  client_allowed_sans:\n    - "bad"\n'
    ),
    "web_config_auth_client_san.good.yaml": (
        f'tls_server_config:\n{TLS}  client_auth_type: "RequireAndVerifyClientCert"\n'
        '  client_ca_file: "client2_selfsigned.pem"\n  client_allowed_sans:\n    - "one"\n    - "test3"\n    - "two"\n'
    ),
    "web_config_auth_user_list_invalid.bad.yml": f"tls_server_config:\n{TLS}basic_auth_users:\n  john: doe\n",
    "web_config_empty.yml": "",
    "web_config_headers.good.yml": (
        "http_server_config:\n  headers:\n    X-Frame-Options: deny\n"
        "    Strict-Transport-Security: max-age=31536000; includeSubDomains\n"
        "    X-Content-Type-Options: nosniff\n    X-XSS-Protection: 1\n"
        "    Content-Security-Policy: \"default-src 'self' *.test.example.net\"\n"
    ),
    "web_config_headers_content_type_options.bad.yml": (
        "http_server_config:\n  headers:\n    X-Content-Type-Options: sniff\n"
    ),
    "web_config_headers_extra_header.bad.yml": "http_server_config:\n  headers:\n    Content-Type: foo\n",
    "web_config_headers_frame_options.bad.yml": "http_server_config:\n  headers:\n    X-Frame-Options: foo\n",
    "web_config_junk.yml": _junk(),
    "web_config_junk_key.yml": 'tls_server_config:\n  cert_filse: "server.crt"\n',
    "web_config_noAuth.bad.yml": f'tls_server_config:\n{TLS}  client_ca_file: "/dev/null"\n',
    "web_config_noAuth.good.blocking.yml": (
        f'tls_server_config:\n{TLS}  client_auth_type: "RequireAndVerifyClientCert"\n'
    ),
    "web_config_noAuth.good.yml": f"tls_server_config:\n{NO_AUTH}",
    "web_config_noAuth_allCiphers.good.yml": (
        f"tls_server_config:\n{NO_AUTH}  cipher_suites:\n"
        + "".join(
            f"  - {suite}\n"
            for suite in (
                "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
                "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
                "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
                "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
                "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
                "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
                "TLS_AES_128_GCM_SHA256",
                "TLS_AES_256_GCM_SHA384",
                "TLS_CHACHA20_POLY1305_SHA256",
                "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
                "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
                "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
                "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
            )
        )
    ),
    "web_config_noAuth_allCurves.good.yml": (
        f"tls_server_config:\n{NO_AUTH}  curve_preferences:\n    - CurveP256\n    - CurveP384\n    - CurveP521\n"
        "    - X25519\n"
    ),
    "web_config_noAuth_certPath_empty.bad.yml": 'tls_server_config:\n  cert_file: ""\n  key_file: "server.key"\n',
    "web_config_noAuth_certPath_invalid.bad.yml": (
        'tls_server_config:\n  cert_file: "somefile"\n  key_file: "server.key"\n'
    ),
    "web_config_noAuth_certPath_keyPath_empty.bad.yml": (
        'tls_server_config:\n  cert_file: ""\n  key_file: ""\n  client_auth_type: "x"\n'
    ),
    "web_config_noAuth_certPath_keyPath_invalid.bad.yml": (
        'tls_server_config:\n  cert_file: "somefile"\n  key_file: "somefile"\n'
    ),
    "web_config_noAuth_cert_empty.bad.yml": 'tls_server_config:\n  cert: ""\n  key_file: "server.key"\n',
    "web_config_noAuth_inventedCiphers.bad.yml": (
        f"tls_server_config:\n{NO_AUTH}  cipher_suites:\n  - TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA2048\n"
    ),
    "web_config_noAuth_inventedCurves.bad.yml": f"tls_server_config:\n{NO_AUTH}  curve_preferences:\n    - CurveP257\n",
    "web_config_noAuth_keyPath_empty.bad.yml": 'tls_server_config:\n  cert_file: "server.crt"\n  key_file: ""\n',
    "web_config_noAuth_keyPath_invalid.bad.yml": (
        'tls_server_config:\n  cert_file: "server.cert"\n  key_file: "somefile"\n'
    ),
    "web_config_noAuth_key_empty.bad.yml": 'tls_server_config:\n  cert_file: "server.crt"\n  key: ""\n',
    "web_config_noAuth_noHTTP2.good.yml": (
        f"tls_server_config:\n{NO_AUTH}  cipher_suites:\n    - TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384\n"
        "  max_version: TLS12\nhttp_server_config:\n  http2: false\n"
    ),
    "web_config_noAuth_noHTTP2Cipher.bad.yml": (
        f"tls_server_config:\n{NO_AUTH}  cipher_suites:\n    - TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384\n"
        "  max_version: TLS12\n"
    ),
    "web_config_noAuth_someCiphers.good.yml": (
        f"tls_server_config:\n{NO_AUTH}  cipher_suites:\n  - TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256\n"
        "  - TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384\n  min_version: TLS12\n  max_version: TLS12\n"
    ),
    "web_config_noAuth_someCiphers_noOrder.good.yml": (
        f"tls_server_config:\n{NO_AUTH}  cipher_suites:\n  - TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384\n"
        "  - TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256\n  prefer_server_cipher_suites: false\n  min_version: TLS12\n"
        "  max_version: TLS12\n"
    ),
    "web_config_noAuth_someCurves.good.yml": (
        f"tls_server_config:\n{NO_AUTH}  min_version: TLS13\n  curve_preferences:\n  - CurveP521\n"
    ),
    "web_config_noAuth_tlsInline.good.yml": (
        'tls_server_config:\n  cert: |\n%CERT%  key: |\n%KEY%  client_auth_type: "VerifyClientCertIfGiven"\n'
    ),
    "web_config_noAuth_wrongTLSVersion.bad.yml": f"tls_server_config:\n{NO_AUTH}  min_version: TLS111\n",
    "web_config_rate_limiter_nonblocking.yaml": "rate_limit:\n  interval: 0\n  burst: 0\n",
    "web_config_rate_limiter_one_second.yaml": 'rate_limit:\n  interval: "1s"\n  burst: 0\n',
    "web_config_users.good.yml": f"tls_server_config:\n{TLS}basic_auth_users:\n{USERS}",
    "web_config_users_noTLS.good.yml": f"basic_auth_users:\n{USERS}",
}

# What exporter-toolkit refuses (at start, or for noHTTP2Cipher when its HTTP/2 server starts),
# with the part of our one-line reason that names the cause.
REFUSED: dict[str, str] = {
    "web_config_auth_clientCAs_invalid.bad.yml": "client CA is configured without a client_auth_type",
    "web_config_auth_user_list_invalid.bad.yml": "basic_auth_users.john: hashedSecret too short",
    "web_config_headers_content_type_options.bad.yml": "X-Content-Type-Options: 'sniff' is not one of nosniff",
    "web_config_headers_extra_header.bad.yml": "'Content-Type' can not be configured",
    "web_config_headers_frame_options.bad.yml": "X-Frame-Options: 'foo' is not one of deny, sameorigin",
    "web_config_junk.yml": "the web configuration must be a mapping",
    "web_config_junk_key.yml": "unknown field 'cert_filse'",
    "web_config_noAuth.bad.yml": "client CA is configured without a client_auth_type",
    "web_config_noAuth_certPath_empty.bad.yml": "missing one of cert or cert_file",
    "web_config_noAuth_certPath_invalid.bad.yml": "TLS: .*No such file",
    "web_config_noAuth_certPath_keyPath_empty.bad.yml": "missing one of cert or cert_file",
    "web_config_noAuth_certPath_keyPath_invalid.bad.yml": "TLS: .*No such file",
    "web_config_noAuth_cert_empty.bad.yml": "missing one of cert or cert_file",
    "web_config_noAuth_inventedCiphers.bad.yml": "unknown cipher: unknown 'TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA2048'",
    "web_config_noAuth_inventedCurves.bad.yml": "unknown curve: unknown 'CurveP257'",
    "web_config_noAuth_keyPath_empty.bad.yml": "missing one of key or key_file",
    "web_config_noAuth_keyPath_invalid.bad.yml": "TLS: .*No such file",
    "web_config_noAuth_key_empty.bad.yml": "missing one of key or key_file",
    "web_config_noAuth_noHTTP2Cipher.bad.yml": "HTTP/2 .* needs TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "web_config_noAuth_wrongTLSVersion.bad.yml": "min_version: unknown 'TLS111'",
}
ACCEPTED = sorted(set(CONFIGS) - set(REFUSED))


def test_every_upstream_test_configuration_is_classified() -> None:
    """The 41 files of web/testdata at v0.17.1 that are configurations, each accepted or refused."""
    assert len(CONFIGS) == 41 and set(REFUSED) <= set(CONFIGS)
    assert len(ACCEPTED) == 21


class Hello:
    name = "hello"

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily("ccl_test_hello", "test")
        family.add_metric([], 1.0)
        yield family


@pytest.fixture(scope="module")
def testdata(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder like upstream's web/testdata: the certificates, then the configurations beside them."""
    folder = tmp_path_factory.mktemp("testdata")
    make_ca(folder, "tls-ca-chain", "/CN=Prometheus TLS CA")
    issue(folder, "server", "/CN=localhost", "IP:127.0.0.1,DNS:localhost", ca="tls-ca-chain")
    self_signed(folder, "client_selfsigned", "/CN=Test-Client", "DNS:test-client.example")
    self_signed(folder, "client2_selfsigned", "/CN=Test-Client2", "DNS:test1,DNS:test3,email:test2@example.net")
    for name in ("tls-ca-chain", "client_selfsigned", "client2_selfsigned"):
        (folder / f"{name}.pem").write_bytes((folder / f"{name}.crt").read_bytes())

    def indented(path: Path) -> str:
        return "".join(f"    {line}\n" for line in path.read_text().splitlines())

    for name, text in CONFIGS.items():
        text = text.replace("%CERT%", indented(folder / "server.crt")).replace("%KEY%", indented(folder / "server.key"))
        (folder / name).write_text(text)
    return folder


# --- accepted or refused, as upstream decides -----------------------------------------------------


@pytest.mark.parametrize("name", ACCEPTED)
def test_what_exporter_toolkit_accepts_is_accepted(testdata: Path, name: str) -> None:
    source = WebConfigSource.from_file(testdata / name)
    source.auth.close()


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_what_exporter_toolkit_refuses_is_refused(testdata: Path, name: str) -> None:
    with pytest.raises(WebConfigError, match=REFUSED[name]):
        WebConfigSource.from_file(testdata / name)


# --- served, as upstream's TestServerBehaviour, TestUsers and TestConfigReloading -----------------


def _client(testdata: Path, certificate: str | None = None) -> ssl.SSLContext:
    """upstream's getTLSClient: trusts tls-ca-chain.pem, presents ``certificate`` when named."""
    context = ssl.create_default_context(cafile=str(testdata / "tls-ca-chain.pem"))
    if certificate:
        context.load_cert_chain(testdata / f"{certificate}.crt", testdata / f"{certificate}.key")
    return context


async def _get(
    port: int, context: ssl.SSLContext | None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], str | None]:
    """(status, headers, the TLS cipher) of one GET /metrics over a fresh connection."""
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname="localhost" if context else None
    )
    cipher = writer.get_extra_info("cipher")
    fields = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    writer.write(f"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{fields}\r\n".encode())
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    if not raw:  # with TLS 1.3 a refused client certificate shows as a close after the handshake
        raise ConnectionError("closed without an answer")
    head = raw.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
    return int(head[0].split()[1]), dict(line.split(": ", 1) for line in head[1:]), cipher[0] if cipher else None


REFUSED_CONNECTION = (ssl.SSLError, ConnectionError, asyncio.IncompleteReadError, OSError)


@contextlib.asynccontextmanager
async def _serving(config: Path) -> AsyncIterator[int]:
    async with serving(
        create_app([Hello()], process_metrics=False), "127.0.0.1", 0, web_config=WebConfigSource.from_file(config)
    ) as server:
        yield server.port


def _basic(user: str, password: str) -> dict[str, str]:
    import base64

    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated:DeprecationWarning")
async def test_plain_and_tls_clients(testdata: Path) -> None:
    """`valid tls config yml and default client`, `... and tls client`, `(cert and key inline)`,
    `with TLS 1.1 client`, `with all ciphers`, `with all curves`, `with non-http2 ciphers`."""
    async with _serving(testdata / "web_config_noAuth.good.yml") as port:
        with pytest.raises(REFUSED_CONNECTION):
            await _get(port, None)  # HTTP to the HTTPS server
        assert (await _get(port, _client(testdata)))[0] == 200
        old = _client(testdata)
        old.set_ciphers("DEFAULT:@SECLEVEL=0")
        old.minimum_version = old.maximum_version = ssl.TLSVersion.TLSv1_1
        with pytest.raises(REFUSED_CONNECTION):
            await _get(port, old)
    for name in (
        "web_config_noAuth_tlsInline.good.yml",
        "web_config_noAuth_allCiphers.good.yml",
        "web_config_noAuth_allCurves.good.yml",
        "web_config_noAuth_noHTTP2.good.yml",
    ):
        async with _serving(testdata / name) as port:
            assert (await _get(port, _client(testdata)))[0] == 200, name


@pytest.mark.parametrize(
    ("name", "client_ciphers", "expected"),
    [
        # `valid tls config yml with some ciphers`
        ("web_config_noAuth_someCiphers.good.yml", ["ECDHE-RSA-AES128-GCM-SHA256"], "ECDHE-RSA-AES128-GCM-SHA256"),
        # `... with no common cipher`
        ("web_config_noAuth_someCiphers.good.yml", ["ECDHE-RSA-AES256-SHA"], None),
        # `... with multiple client ciphers`
        (
            "web_config_noAuth_someCiphers.good.yml",
            ["ECDHE-RSA-AES128-GCM-SHA256", "ECDHE-RSA-AES256-GCM-SHA384"],
            "ECDHE-RSA-AES128-GCM-SHA256",
        ),
        # `... with multiple client ciphers, client chooses cipher`
        (
            "web_config_noAuth_someCiphers_noOrder.good.yml",
            ["ECDHE-RSA-AES128-GCM-SHA256", "ECDHE-RSA-AES256-GCM-SHA384"],
            "ECDHE-RSA-AES128-GCM-SHA256",
        ),
        # Not in upstream's table: Go picks by its own preference order (AES-128-GCM before
        # AES-256-GCM), whatever the order of the configured list or of the client's.
        (
            "web_config_noAuth_someCiphers_noOrder.good.yml",
            ["ECDHE-RSA-AES256-GCM-SHA384", "ECDHE-RSA-AES128-GCM-SHA256"],
            "ECDHE-RSA-AES128-GCM-SHA256",
        ),
    ],
)
async def test_cipher_suites(testdata: Path, name: str, client_ciphers: list[str], expected: str | None) -> None:
    client = _client(testdata)
    client.set_ciphers(":".join(client_ciphers))
    client.maximum_version = ssl.TLSVersion.TLSv1_2
    async with _serving(testdata / name) as port:
        if expected is None:
            with pytest.raises(REFUSED_CONNECTION):
                await _get(port, client)
        else:
            status, _, cipher = await _get(port, client)
            assert (status, cipher) == (200, expected)


@pytest.mark.parametrize(("client_curve", "served"), [("secp521r1", True), ("secp384r1", False)])
async def test_curve_preferences(testdata: Path, client_curve: str, served: bool) -> None:
    """`valid tls config yml with some curves` (P-521 only, TLS 1.3) and `... with no common curves`."""
    client = _client(testdata)
    client.set_ecdh_curve(client_curve)
    async with _serving(testdata / "web_config_noAuth_someCurves.good.yml") as port:
        if served:
            assert (await _get(port, client))[0] == 200
        else:
            with pytest.raises(REFUSED_CONNECTION):
                await _get(port, client)


async def test_several_curves_restrict_the_groups(testdata: Path, tmp_path: Path) -> None:
    """Not in upstream's table: with two curves, a client offering only a third is refused (Go's
    CurvePreferences), one offering a listed curve is served."""
    for name in ("server.crt", "server.key"):
        (tmp_path / name).write_bytes((testdata / name).read_bytes())
    config = tmp_path / "web.yml"
    config.write_text(f"tls_server_config:\n{TLS}  curve_preferences: [CurveP384, X25519]\n")
    async with _serving(config) as port:
        for curve, served in (("secp384r1", True), ("X25519", True), ("prime256v1", False), ("secp521r1", False)):
            client = _client(testdata)
            client.set_ecdh_curve(curve)
            if served:
                assert (await _get(port, client))[0] == 200, curve
            else:
                with pytest.raises(REFUSED_CONNECTION):
                    await _get(port, client)


async def test_headers(testdata: Path) -> None:
    """`valid headers config`: the five headers on every answer, X-XSS-Protection as the string "1"."""
    async with _serving(testdata / "web_config_headers.good.yml") as port:
        status, headers, _ = await _get(port, None)
    assert status == 200
    assert headers["X-Frame-Options"] == "deny" and headers["X-XSS-Protection"] == "1"
    assert headers["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains"
    assert headers["Content-Security-Policy"] == "default-src 'self' *.test.example.net"
    assert headers["X-Content-Type-Options"] == "nosniff"


@pytest.mark.parametrize(
    "name",
    ["tls_config_noAuth.requireanyclientcert.good.yml", "tls_config_noAuth.requireanyclientcertkeyinline.good.yml"],
)
async def test_require_any_client_certificate(testdata: Path, name: str) -> None:
    """`valid tls config yml and tls client with RequireAnyClientCert (present certificate)`, and
    `(cert from file, key inline)`: a self-signed certificate no CA vouches for is taken; a client
    without one is refused."""
    async with _serving(testdata / name) as port:
        assert (await _get(port, _client(testdata, "client_selfsigned")))[0] == 200
        assert (await _get(port, _client(testdata, "client2_selfsigned")))[0] == 200
        with pytest.raises(REFUSED_CONNECTION):
            await _get(port, _client(testdata))


async def test_require_any_client_certificate_with_openssl_s_client(testdata: Path) -> None:
    """The same with another TLS implementation's client than the one we serve with."""
    openssl = require_tool("openssl")
    request = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"

    async def s_client(port: int, *certificate: str) -> bytes:
        process = await asyncio.create_subprocess_exec(
            openssl, "s_client", "-connect", f"127.0.0.1:{port}", "-CAfile", str(testdata / "tls-ca-chain.pem"),
            "-verify_return_error", "-quiet", *certificate,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        output, _ = await asyncio.wait_for(process.communicate(request), 30)
        return output

    selfsigned = ("-cert", str(testdata / "client_selfsigned.crt"), "-key", str(testdata / "client_selfsigned.key"))
    async with _serving(testdata / "tls_config_noAuth.requireanyclientcert.good.yml") as port:
        assert (await s_client(port, *selfsigned)).startswith(b"HTTP/1.1 200")
        assert b"HTTP/1.1" not in await s_client(port)


async def test_require_and_verify_client_certificate(testdata: Path) -> None:
    """`... with RequireAndVerifyClientCert (present certificate)`: the CA is the client's own certificate."""
    async with _serving(testdata / "tls_config_noAuth.requireandverifyclientcert.good.yml") as port:
        assert (await _get(port, _client(testdata, "client_selfsigned")))[0] == 200
        for refused in ("client2_selfsigned", None):
            with pytest.raises(REFUSED_CONNECTION):
                await _get(port, _client(testdata, refused))


async def test_verify_client_certificate_if_given_without_a_ca(testdata: Path) -> None:
    """web_config_noAuth.good.yml has no client CA: Go verifies a given certificate against the system
    roots, which vouch for no self-signed one; a client that gives none is served."""
    async with _serving(testdata / "web_config_noAuth.good.yml") as port:
        assert (await _get(port, _client(testdata)))[0] == 200
        with pytest.raises(REFUSED_CONNECTION):
            await _get(port, _client(testdata, "client_selfsigned"))


@pytest.mark.parametrize(("name", "served"), [("web_config_auth_client_san.good.yaml", True),
                                              ("web_config_auth_client_san.bad.yaml", False)])  # fmt: skip
async def test_client_allowed_sans(testdata: Path, name: str, served: bool) -> None:
    """`... with VerifyPeerCertificate (present good SAN DNS entry)` and `(present invalid SAN DNS entries)`."""
    async with _serving(testdata / name) as port:
        if served:
            assert (await _get(port, _client(testdata, "client2_selfsigned")))[0] == 200
        else:
            with pytest.raises(REFUSED_CONNECTION):
                await _get(port, _client(testdata, "client2_selfsigned"))


@pytest.mark.parametrize(("name", "expected"), [("web_config_rate_limiter_nonblocking.yaml", [200] * 11),
                                                ("web_config_rate_limiter_one_second.yaml", [429] * 11)])  # fmt: skip
async def test_rate_limiter(testdata: Path, name: str, expected: list[int]) -> None:
    """`valid rate limiter (no rate limiter set up) that doesn't block` and `... with an interval of one
    second` (burst 0: Go's limiter allows nothing)."""
    async with _serving(testdata / name) as port:
        assert [(await _get(port, None))[0] for _ in range(11)] == expected


@pytest.mark.parametrize(
    ("name", "tls", "credentials", "status"),
    [
        ("web_config_users_noTLS.good.yml", False, None, 401),
        ("web_config_users_noTLS.good.yml", False, ("dave", "dave123"), 200),
        ("web_config_users.good.yml", True, None, 401),
        ("web_config_users.good.yml", True, ("dave", "dave123"), 200),
        ("web_config_users.good.yml", True, ("carol", "carol123"), 200),
        ("web_config_users.good.yml", True, ("dave", "bad"), 401),
        ("web_config_users.good.yml", True, ("nonexistent", "nonexistent"), 401),
    ],
)
async def test_users(testdata: Path, name: str, tls: bool, credentials: tuple[str, str] | None, status: int) -> None:
    """upstream's TestUsers."""
    async with _serving(testdata / name) as port:
        headers = _basic(*credentials) if credentials else None
        assert (await _get(port, _client(testdata) if tls else None, headers))[0] == status


async def test_config_reloading(testdata: Path, tmp_path: Path) -> None:
    """TestConfigReloading: started with the blocking file (RequireAndVerifyClientCert, no CA), a client
    without a certificate is refused; once the good file replaces it, the same client is served."""
    for name in ("server.crt", "server.key"):
        (tmp_path / name).write_bytes((testdata / name).read_bytes())
    config = tmp_path / "web.yml"
    config.write_text((testdata / "web_config_noAuth.good.blocking.yml").read_text())
    async with _serving(config) as port:
        with pytest.raises(REFUSED_CONNECTION):
            await _get(port, _client(testdata))
        await asyncio.sleep(WebConfigSource.RECHECK_SECONDS)
        config.write_text((testdata / "web_config_noAuth.good.yml").read_text())
        await asyncio.sleep(WebConfigSource.RECHECK_SECONDS + 0.1)
        assert (await _get(port, _client(testdata)))[0] == 200


# --- where Python's ssl cannot reach OpenSSL's callback or group list ------------------------------


def test_without_the_openssl_hooks_unverified_client_auth_is_refused_and_curves_degrade(
    testdata: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import exporter.http.webconfig as webconfig

    monkeypatch.setattr(webconfig, "native_context", lambda context: None)
    with pytest.raises(WebConfigError, match="RequireAnyClientCert takes a client certificate without verifying"):
        WebConfigSource.from_file(testdata / "tls_config_noAuth.requireanyclientcert.good.yml")
    WebConfigSource.from_file(testdata / "web_config_noAuth_allCurves.good.yml").auth.close()
    assert any("cannot restrict the groups" in record.getMessage() for record in caplog.records)
    WebConfigSource.from_file(testdata / "web_config_noAuth_someCurves.good.yml").auth.close()  # one curve: no hook


def test_the_openssl_hooks_reach_the_context_python_made() -> None:
    from exporter.http.openssl_hooks import native_context

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    native = native_context(context)
    assert native is not None, "CPython with a dynamically linked libssl: the hooks must be reachable"
    native.accept_any_client_certificate(required=True)
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert native.set_groups(["P-384", "X25519"]) and not native.set_groups(["P-257"])
    assert native_context(ssl.create_default_context()) is None, "a client context is left alone"

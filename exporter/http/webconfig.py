"""The web configuration file of Prometheus exporters (exporter-toolkit's ``--web.config.file``).

The same YAML that node_exporter and dcgm-exporter take, accepted and refused as
exporter-toolkit v0.17.1 (``web/tls_config.go``, ``web/handler.go``, built with Go 1.25) does,
read into typed fields as Go's yaml.v2 ``UnmarshalStrict`` reads them (``exporter.http.goyaml``):
unknown and repeated keys are errors, paths are relative to the file's folder, TLS is on when any
of ``cert``, ``cert_file``, ``key``, ``key_file``, ``client_ca``, ``client_ca_file`` or
``client_auth_type`` is set, and then a certificate and a key are required::

    tls_server_config:
      cert_file | cert                      # a file, or the PEM inline (the file wins when both)
      key_file | key
      client_ca_file | client_ca            # optional; with NoClientCert an error
      client_auth_type: NoClientCert | RequestClientCert | RequireAnyClientCert (alias
                        RequireClientCert) | VerifyClientCertIfGiven | RequireAndVerifyClientCert
      client_allowed_sans: [...]            # a client certificate must carry one of these
      min_version / max_version: TLS10 | TLS11 | TLS12 | TLS13   (defaults TLS12, TLS13)
      cipher_suites: [names of Go's tls.CipherSuites()]
      curve_preferences: [CurveP256, CurveP384, CurveP521, X25519]
      prefer_server_cipher_suites: bool     # accepted and ignored, as Go ignores it
    http_server_config: {headers: {...}, http2: bool}
    basic_auth_users: {user: bcrypt hash}
    rate_limit: {burst: N, interval: 1s}   # interval 0 or absent: off; burst 0: every request 429

How each setting reaches OpenSSL (Python's ``ssl``), where Go's ``crypto/tls`` and OpenSSL differ:

* ``client_auth_type``: ``VerifyClientCertIfGiven`` and ``RequireAndVerifyClientCert`` verify the
  client's chain against the client CA, and, with none configured, against the system's roots
  (Go verifies against the system pool when ``ClientCAs`` is nil). ``RequestClientCert`` and
  ``RequireAnyClientCert`` take any certificate unverified, through OpenSSL's verify callback
  (``exporter.http.openssl_hooks``); on a Python where that cannot be reached they are refused
  with a reason. ``client_allowed_sans`` applies, as in Go, whenever a certificate is requested
  (a client that sends none is refused), never with ``NoClientCert``.
* A client CA file is read as Go's ``AppendCertsFromPEM`` reads it: every ``CERTIFICATE`` block
  that parses, others skipped; one with none leaves an empty pool that verifies no client.
* ``cipher_suites``: the TLS 1.2 suites are handed to OpenSSL in Go's own preference order
  (Go ignores the order of the list and ``prefer_server_cipher_suites``), ChaCha20 first when
  the client puts it first. TLS 1.3 suite names are accepted and have no effect, as in Go; a
  list of only those leaves no TLS 1.2 suite, so only TLS 1.3 can be negotiated, as in Go.
  Names outside Go 1.25's ``tls.CipherSuites()`` are refused (``TLS_RSA_*`` are in
  ``InsecureCipherSuites()``; the legacy ``..._CHACHA20_POLY1305`` aliases are constants, not names).
* ``http2`` (on by default): our server speaks HTTP/1.1, which is what Prometheus scrapes with,
  but a configuration that Go's HTTP/2 server refuses to start with is refused too: a TLS 1.2
  cipher list without ``TLS_ECDHE_{RSA,ECDSA}_WITH_AES_128_GCM_SHA256``.
* ``curve_preferences``: one curve is ``SSLContext.set_ecdh_curve``; several are OpenSSL's
  ``SSL_CTX_set1_groups_list`` (``openssl_hooks``). Where that cannot be reached, several curves
  leave OpenSSL's default groups, which include all four (a warning says so): every client Go
  would take is taken, and also one that offers only X448 or a finite-field group.
* Inline ``cert``/``key`` PEM is loaded from an anonymous in-memory file; an encrypted key is
  refused (Go's ``X509KeyPair`` takes none either) rather than prompting for a passphrase.

``WebConfigSource`` re-reads the file, and the certificate files it names, when any of them
changes on disk (checked at most once a second, on new connections and requests): cert-manager
and kubelet rotate mounted Secrets in place. A change that does not load is logged and the
last good configuration stays in force, and so does one that would switch TLS on or off or leave
no basic auth user (an emptied file): those take a restart. The rate limiter, as
exporter-toolkit's, is built once at start. ``certificate_expiry`` says when the certificate in
force expires (``exporter.http.certificates``), for the servers' expiry gauges.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import re
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exporter.http import goyaml
from exporter.http.access import BasicAuth, RateLimit, RateLimiter
from exporter.http.certificates import CertificateError, earliest_not_after
from exporter.http.openssl_hooks import NativeContext, native_context

log = logging.getLogger(__name__)

# exporter-toolkit's client_auth_type values -> the Go mode each one is.
CLIENT_AUTH_TYPES = {
    "NoClientCert": "NoClientCert",
    "RequestClientCert": "RequestClientCert",
    "RequireAnyClientCert": "RequireAnyClientCert",
    "RequireClientCert": "RequireAnyClientCert",  # exporter-toolkit keeps the old name as an alias
    "VerifyClientCertIfGiven": "VerifyClientCertIfGiven",
    "RequireAndVerifyClientCert": "RequireAndVerifyClientCert",
}
_UNVERIFIED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert")
TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# Go 1.25's tls.CipherSuites() (crypto/tls/cipher_suites.go), in Go's preference order
# (cipherSuitesPreferenceOrder), each with OpenSSL's name; None for the TLS 1.3 suites, which Go
# does not let a configuration choose.
CIPHER_SUITES: dict[str, str | None] = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_AES_128_GCM_SHA256": None,
    "TLS_AES_256_GCM_SHA384": None,
    "TLS_CHACHA20_POLY1305_SHA256": None,
}
# Go's http2 server refuses a TLS 1.2 cipher list without one of these (net/http h2_bundle.go).
HTTP2_REQUIRED_SUITES = ("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256")
# exporter-toolkit's curve names -> (OpenSSL group name, the name set_ecdh_curve takes).
CURVES = {
    "CurveP256": ("P-256", "prime256v1"),
    "CurveP384": ("P-384", "secp384r1"),
    "CurveP521": ("P-521", "secp521r1"),
    "X25519": ("X25519", "X25519"),
}
# SSL_OP_PRIORITIZE_CHACHA (OpenSSL 1.1.1+): with server preference, ChaCha20 first when the
# client lists it first (Go's cipherSuitesPreferenceOrderNoAES); Python's ssl has no name for it.
_OP_PRIORITIZE_CHACHA = 0x00200000
# exporter-toolkit's allowed response headers; a value list restricts the value.
ALLOWED_HEADERS: dict[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}
_TOP_KEYS = {"tls_server_config", "http_server_config", "basic_auth_users", "rate_limit"}
_TLS_KEYS = {
    "cert",
    "key",
    "client_ca",
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "cipher_suites",
    "curve_preferences",
    "min_version",
    "max_version",
    "prefer_server_cipher_suites",
    "client_allowed_sans",
}
# The string fields whose being set turns TLS on (exporter-toolkit's TLSConfig.IsEnabled).
_TLS_TEXT_KEYS = ("cert", "cert_file", "key", "key_file", "client_ca", "client_ca_file", "client_auth_type")
_HTTP_KEYS = {"http2", "headers"}
_RATE_KEYS = {"burst", "interval"}
_PEM_CERTIFICATE = re.compile(r"-----BEGIN CERTIFICATE-----\r?\n(.*?)-----END CERTIFICATE-----", re.DOTALL)
_BCRYPT_MIN_HASH_BYTES = 59  # golang.org/x/crypto/bcrypt minHashSize


class WebConfigError(ValueError):
    """A web configuration that cannot be used; the message is one line."""


@dataclass(frozen=True)
class TlsSettings:
    """``tls_server_config`` once TLS is on: each PEM from its file, or inline where no file is named."""

    cert_file: Path | None = None
    key_file: Path | None = None
    cert_pem: str = ""
    key_pem: str = field(default="", repr=False)
    client_auth_type: str = "NoClientCert"
    client_ca_file: Path | None = None
    client_ca_pem: str = ""
    client_allowed_sans: tuple[str, ...] | None = None  # None: no check; () checks and matches nothing
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    cipher_suites: tuple[str, ...] = ()
    curve_preferences: tuple[str, ...] = ()

    def files(self) -> tuple[Path, ...]:
        return tuple(path for path in (self.cert_file, self.key_file, self.client_ca_file) if path is not None)

    @property
    def requests_client_certificate(self) -> bool:
        return self.client_auth_type != "NoClientCert"

    @property
    def sans_to_check(self) -> tuple[str, ...] | None:
        """The SANs a client certificate must name (None: no check). Go checks them whenever it asks
        for a certificate (``VerifyPeerCertificate``), so never with ``NoClientCert``."""
        return self.client_allowed_sans if self.requests_client_certificate else None


@dataclass(frozen=True)
class WebConfig:
    tls: TlsSettings | None = None
    basic_auth_users: Mapping[str, str] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    rate_limit: RateLimit | None = None
    http2: bool = True


def _choice(value: str, allowed: Mapping[str, object], what: str) -> str:
    if value not in allowed:
        raise WebConfigError(f"{what}: unknown {value!r} (have: {', '.join(allowed)})")
    return value


def _tls_settings(raw: dict[str, Any], folder: Path, http2: bool) -> TlsSettings | None:
    where = "tls_server_config"
    text = {key: goyaml.string(raw.get(key), f"{where}.{key}") for key in _TLS_TEXT_KEYS}
    # Checked when the YAML is read (exporter-toolkit's UnmarshalYAML), whether TLS is on or not.
    versions = {
        name: _choice(goyaml.string(raw.get(name), f"{where}.{name}") or default, TLS_VERSIONS, f"{where}.{name}")
        for name, default in (("min_version", "TLS12"), ("max_version", "TLS13"))
    }
    suites = tuple(
        _choice(suite, CIPHER_SUITES, f"{where}.cipher_suites: unknown cipher")
        for suite in goyaml.strings(raw.get("cipher_suites"), f"{where}.cipher_suites") or ()
    )
    curves = tuple(
        _choice(curve, CURVES, f"{where}.curve_preferences: unknown curve")
        for curve in goyaml.strings(raw.get("curve_preferences"), f"{where}.curve_preferences") or ()
    )
    goyaml.boolean(raw.get("prefer_server_cipher_suites"), f"{where}.prefer_server_cipher_suites", True)
    sans = goyaml.strings(raw.get("client_allowed_sans"), f"{where}.client_allowed_sans")
    if not any(text.values()):
        return None  # exporter-toolkit: no TLS key set, plain HTTP
    if not (text["cert_file"] or text["cert"]):
        raise WebConfigError(f"{where}: missing one of cert or cert_file")
    if not (text["key_file"] or text["key"]):
        raise WebConfigError(f"{where}: missing one of key or key_file")
    auth = text["client_auth_type"] or "NoClientCert"
    if auth not in CLIENT_AUTH_TYPES:
        raise WebConfigError(f"{where}.client_auth_type: invalid {auth!r} (have: {', '.join(CLIENT_AUTH_TYPES)})")
    auth = CLIENT_AUTH_TYPES[auth]
    if (text["client_ca_file"] or text["client_ca"]) and auth == "NoClientCert":
        raise WebConfigError(f"{where}: a client CA is configured without a client_auth_type that uses it")
    if http2 and suites and versions["min_version"] != "TLS13" and not set(HTTP2_REQUIRED_SUITES) & set(suites):
        raise WebConfigError(
            f"{where}.cipher_suites: HTTP/2 (http_server_config.http2, on by default) needs "
            f"{' or '.join(HTTP2_REQUIRED_SUITES)} below TLS 1.3; add one or set http2: false"
        )

    def path(name: str) -> Path | None:
        return folder / text[name] if text[name] else None

    return TlsSettings(
        cert_file=path("cert_file"),
        key_file=path("key_file"),
        cert_pem=text["cert"],
        key_pem=text["key"],
        client_auth_type=auth,
        client_ca_file=path("client_ca_file"),
        client_ca_pem=text["client_ca"],
        client_allowed_sans=sans,
        min_version=versions["min_version"],
        max_version=versions["max_version"],
        cipher_suites=suites,
        curve_preferences=curves,
    )


def bcrypt_hash_problem(hashed: str) -> str | None:
    """Why golang.org/x/crypto/bcrypt's ``Cost`` refuses ``hashed`` (exporter-toolkit's check at
    start), or None. Like Go, only the length, the ``$`` prefix, the version and the cost are read."""
    raw = hashed.encode()
    if len(raw) < _BCRYPT_MIN_HASH_BYTES:
        return "hashedSecret too short to be a bcrypted password"
    if raw[:1] != b"$":
        return "a bcrypt hash starts with '$'"
    if raw[1] > ord("2"):
        return f"bcrypt version {chr(raw[1])!r} is newer than 2"
    start = 3 if raw[2:3] == b"$" else 4
    cost = raw[start : start + 2]
    if not re.fullmatch(rb"[+-]?[0-9]+", cost) or not 4 <= int(cost) <= 31:
        return f"bcrypt cost {cost.decode(errors='replace')!r} is not one of 4..31"
    return None


def _parse(text: str, folder: Path) -> WebConfig:
    document = goyaml.document(text)
    top = goyaml.fields(document, "the web configuration", _TOP_KEYS)
    http_node = top.get("http_server_config")
    http = goyaml.fields(http_node, "http_server_config", _HTTP_KEYS)
    # yaml.v2 zeroes a struct given as null, so `http_server_config:` alone turns HTTP/2 off.
    http2_default = http_node is None or not goyaml.is_null(http_node)
    http2 = goyaml.boolean(http.get("http2"), "http_server_config.http2", http2_default)
    tls = _tls_settings(goyaml.fields(top.get("tls_server_config"), "tls_server_config", _TLS_KEYS), folder, http2)
    headers = goyaml.string_map(http.get("headers"), "http_server_config.headers")
    for name, value in headers.items():
        if name not in ALLOWED_HEADERS:
            raise WebConfigError(
                f"http_server_config.headers: HTTP header {name!r} can not be configured "
                f"(have: {', '.join(ALLOWED_HEADERS)})"
            )
        allowed = ALLOWED_HEADERS[name]
        if allowed and value not in allowed:
            raise WebConfigError(f"http_server_config.headers.{name}: {value!r} is not one of {', '.join(allowed)}")
    users = goyaml.string_map(top.get("basic_auth_users"), "basic_auth_users")
    for user, hashed in users.items():
        problem = bcrypt_hash_problem(hashed)
        if problem:
            raise WebConfigError(f"basic_auth_users.{user}: {problem} (generate one with htpasswd -nBC 10)")
    rate = goyaml.fields(top.get("rate_limit"), "rate_limit", _RATE_KEYS)
    interval = goyaml.duration_seconds(rate.get("interval"), "rate_limit.interval")
    burst = goyaml.integer(rate.get("burst"), "rate_limit.burst", 0)
    # exporter-toolkit: an interval of 0 (or none) turns the limiter off; a negative one is
    # rate.Every's infinite rate, which lets everything through: off as well.
    rate_limit = RateLimit(burst, interval) if interval > 0 else None
    return WebConfig(tls=tls, basic_auth_users=users, headers=headers, rate_limit=rate_limit, http2=http2)


def parse_web_config(text: str, folder: Path) -> WebConfig:
    """A ``WebConfig`` from the file's text; relative paths are taken from ``folder``."""
    try:
        return _parse(text, folder)
    except goyaml.YamlShapeError as exc:
        raise WebConfigError(str(exc)) from None


@contextlib.contextmanager
def _pem_path(pem: str) -> Iterator[str]:
    """A path OpenSSL can open that holds ``pem``: an anonymous in-memory file where Linux has them."""
    data = pem.encode()
    if hasattr(os, "memfd_create"):
        descriptor = os.memfd_create("web-config-pem", os.MFD_CLOEXEC)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(descriptor, view) :]
            yield f"/proc/self/fd/{descriptor}"
        finally:
            os.close(descriptor)
        return
    with tempfile.TemporaryDirectory() as folder:  # mode 0700
        path = Path(folder) / "pem"
        path.touch(mode=0o600)
        path.write_bytes(data)
        yield str(path)


def _no_passphrase() -> bytes:
    raise WebConfigError("the key is encrypted; exporter-toolkit takes unencrypted PEM keys only")


def _load_client_cas(context: ssl.SSLContext, pem: str) -> int:
    """Go's ``AppendCertsFromPEM``: every CERTIFICATE block that parses; the count loaded."""
    loaded = 0
    for match in _PEM_CERTIFICATE.finditer(pem):
        with contextlib.suppress(ssl.SSLError, ValueError):
            context.load_verify_locations(cadata=match.group(0))
            loaded += 1
    return loaded


def build_ssl_context(tls: TlsSettings, warn: Callable[[str], None] = log.warning) -> ssl.SSLContext:
    """A server context for ``tls``; WebConfigError when a file is missing or does not match."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    native: NativeContext | None = None
    try:
        context.minimum_version = TLS_VERSIONS[tls.min_version]
        context.maximum_version = TLS_VERSIONS[tls.max_version]
        if tls.cipher_suites:
            chosen = set(tls.cipher_suites)
            tls12 = [openssl for name, openssl in CIPHER_SUITES.items() if name in chosen and openssl]
            if tls12:
                context.set_ciphers(":".join(tls12))
            else:  # Go: a list of TLS 1.3 names only leaves no TLS 1.2 suite to negotiate
                context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE | _OP_PRIORITIZE_CHACHA
        if len(tls.curve_preferences) == 1:
            context.set_ecdh_curve(CURVES[tls.curve_preferences[0]][1])
        elif tls.curve_preferences:
            native = native_context(context)
            groups = [CURVES[curve][0] for curve in tls.curve_preferences]
            if native is None or not native.set_groups(groups):
                warn(
                    f"tls_server_config.curve_preferences: this Python cannot restrict the groups to {groups}; "
                    "OpenSSL's defaults (which include them) stay in force"
                )
        with contextlib.ExitStack() as stack:
            cert = str(tls.cert_file) if tls.cert_file else stack.enter_context(_pem_path(tls.cert_pem))
            key = str(tls.key_file) if tls.key_file else stack.enter_context(_pem_path(tls.key_pem))
            context.load_cert_chain(cert, key, password=_no_passphrase)
        client_ca = tls.client_ca_file.read_text(errors="replace") if tls.client_ca_file else tls.client_ca_pem
        if client_ca and not _load_client_cas(context, client_ca):
            warn("tls_server_config: the client CA holds no certificate, so no client certificate verifies")
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise WebConfigError(f"TLS: {' '.join(str(exc).split())[:200]}") from None
    auth = tls.client_auth_type
    if auth in _UNVERIFIED_CLIENT_AUTH:
        native = native or native_context(context)
        if native is None:
            raise WebConfigError(
                f"tls_server_config.client_auth_type {auth} takes a client certificate without verifying it, "
                "which needs OpenSSL's verify callback, out of reach on this Python; use VerifyClientCertIfGiven "
                "or RequireAndVerifyClientCert with a client_ca_file"
            )
        native.accept_any_client_certificate(required=auth == "RequireAnyClientCert")
        return context
    context.verify_mode = {
        "NoClientCert": ssl.CERT_NONE,
        "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
        "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
    }[auth]
    if context.verify_mode != ssl.CERT_NONE and not client_ca:
        context.load_default_certs(ssl.Purpose.CLIENT_AUTH)  # Go: nil ClientCAs is the system pool
    return context


def _san_value(kind: str, value: str) -> str:
    """A SAN as Go's ``VerifyPeerCertificate`` compares it: IP addresses in ``net.IP.String()`` form."""
    if kind == "IP Address":
        with contextlib.suppress(ValueError):
            return str(ipaddress.ip_address(value.strip()))
    return value


def peer_has_allowed_san(peercert: Mapping[str, Any] | None, allowed: tuple[str, ...] | None) -> bool:
    """Whether a client certificate (``SSLObject.getpeercert()``) names an allowed DNS name, email
    address, IP address or URI; always when ``allowed`` is None (no check)."""
    if allowed is None:
        return True
    names = {_san_value(str(kind), str(value)) for kind, value in (peercert or {}).get("subjectAltName", ())}
    return bool(names & set(allowed))


@dataclass(frozen=True)
class LoadedWebConfig:
    config: WebConfig
    ssl_context: ssl.SSLContext | None
    # The earliest notAfter (seconds since the epoch) of the certificates served with TLS on;
    # None without TLS, or where it could not be read (logged).
    certificate_expiry: float | None = None


def served_certificate_expiry(tls: TlsSettings, name: str) -> float | None:
    """The earliest notAfter of the certificate chain ``tls`` serves (its file, else its inline PEM);
    None, with a warning, when it cannot be read."""
    try:
        pem = tls.cert_file.read_bytes() if tls.cert_file else tls.cert_pem.encode()
        return earliest_not_after(pem)
    except (OSError, CertificateError) as exc:
        log.warning("web configuration %s: cannot read when the certificate expires: %s", name, exc)
        return None


def _stamp(path: Path) -> tuple[int, int, int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


class WebConfigSource:
    """The web configuration in force, re-read when its files change (see the module doc)."""

    RECHECK_SECONDS = 1.0

    def __init__(
        self, load: Callable[[], WebConfig], watched: Callable[[WebConfig], tuple[Path, ...]], name: str
    ) -> None:
        self._load = load
        self._watched = watched
        self.name = name
        self._lock = threading.Lock()
        self._checked_at = 0.0
        self.reload_failures = 0
        self._current = self._build()  # raises WebConfigError: a bad file stops the start
        self._stamps = self._stamp_all(self._current.config)
        self.auth = BasicAuth()
        # exporter-toolkit builds its limiter once, at start: a changed rate_limit takes a restart.
        rate_limit = self._current.config.rate_limit
        self._limiter = RateLimiter(rate_limit) if rate_limit else None
        if rate_limit is not None and rate_limit.burst <= 0:
            log.warning(
                "web configuration %s: rate_limit.burst is %d, so every request is refused (429)",
                name,
                rate_limit.burst,
            )

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> WebConfigSource:
        """exporter-toolkit's ``--web.config.file``."""
        config_path = Path(path)

        def load() -> WebConfig:
            try:
                text = config_path.read_text()
            except (OSError, UnicodeDecodeError) as exc:
                raise WebConfigError(f"cannot read {config_path}: {exc}") from None
            return parse_web_config(text, config_path.parent)

        return cls(load, lambda config: (config_path, *(config.tls.files() if config.tls else ())), str(config_path))

    @classmethod
    def from_tls_files(cls, cert_file: str | os.PathLike[str], key_file: str | os.PathLike[str]) -> WebConfigSource:
        """TLS from a certificate and key (the webhook's ``--tls.cert-file``/``--tls.key-file``)."""
        tls = TlsSettings(cert_file=Path(cert_file), key_file=Path(key_file))
        return cls(lambda: WebConfig(tls=tls), lambda config: tls.files(), f"{cert_file}, {key_file}")

    def _build(self) -> LoadedWebConfig:
        config = self._load()
        if config.tls is None:
            return LoadedWebConfig(config, None)
        context = build_ssl_context(config.tls)
        return LoadedWebConfig(config, context, served_certificate_expiry(config.tls, self.name))

    def _stamp_all(self, config: WebConfig) -> tuple[object, ...]:
        return tuple(_stamp(path) for path in self._watched(config))

    def current(self) -> LoadedWebConfig:
        """The configuration in force, re-read first when a watched file changed."""
        now = time.monotonic()
        with self._lock:
            if now - self._checked_at < self.RECHECK_SECONDS:
                return self._current
            self._checked_at = now
            stamps = self._stamp_all(self._current.config)
            if stamps == self._stamps:
                return self._current
            self._stamps = stamps
            try:
                loaded = self._build()
            except WebConfigError as exc:
                self.reload_failures += 1
                log.error(
                    "web configuration %s changed but does not load, keeping the last good one: %s", self.name, exc
                )
                return self._current
            refusal = self._refusal(loaded.config)
            if refusal:
                self.reload_failures += 1
                log.error(
                    "web configuration %s changed %s; that takes a restart, keeping the last one", self.name, refusal
                )
                return self._current
            if loaded.config.rate_limit != self._current.config.rate_limit:
                log.warning("web configuration %s: a changed rate_limit applies after a restart", self.name)
            self._current = loaded
            self._stamps = self._stamp_all(loaded.config)
            log.info("web configuration %s reloaded", self.name)
            return loaded

    def _refusal(self, new: WebConfig) -> str:
        """What a reload to ``new`` would switch off or on that only a restart may (empty: nothing).

        A file emptied or cut short during an edit would otherwise turn basic auth off without a word.
        """
        old = self._current.config
        if (new.tls is None) != (old.tls is None):
            return "whether TLS is on"
        if old.basic_auth_users and not new.basic_auth_users:
            return "so that no basic auth user is left (auth would be off)"
        return ""

    @property
    def tls(self) -> bool:
        return self._current.ssl_context is not None

    def certificate_expiry(self) -> float | None:
        """When the certificate served now expires (its chain's earliest notAfter, seconds since the
        epoch), read again after a renewal; None without TLS or when it could not be read."""
        return self.current().certificate_expiry

    def rate_allows(self) -> bool:
        with self._lock:
            return self._limiter is None or self._limiter.allow()

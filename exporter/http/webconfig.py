"""The web configuration file of Prometheus exporters (exporter-toolkit's ``--web.config.file``).

The same YAML that node_exporter and dcgm-exporter take, read with the same rules: unknown
keys are an error, paths are relative to the file's folder, TLS is on when any TLS key is set,
``min_version`` defaults to TLS 1.2, a client CA without a client-auth policy is an error,
``basic_auth_users`` holds bcrypt hashes and ``http_server_config.headers`` only the security
headers exporter-toolkit allows. Supported::

    tls_server_config:
      cert_file, key_file, client_ca_file
      client_auth_type: NoClientCert | VerifyClientCertIfGiven | RequireAndVerifyClientCert
      client_allowed_sans: [...]            # the client certificate must carry one of these
      min_version / max_version: TLS10 | TLS11 | TLS12 | TLS13
      cipher_suites: [Go names of TLS 1.2 suites]
      prefer_server_cipher_suites           # accepted; OpenSSL servers prefer their own order
    http_server_config: {headers: {...}, http2: ...}   # http2 accepted, served as HTTP/1.1
    basic_auth_users: {user: bcrypt hash}
    rate_limit: {burst: N, interval: 1s}   # interval 0 or absent: off; burst 0: every request 429

Refused with a one-line reason: inline ``cert``/``key``/``client_ca`` (mount files),
``RequestClientCert`` and ``RequireAnyClientCert`` (OpenSSL cannot ask for a certificate it
does not check) and ``curve_preferences``.

``WebConfigSource`` re-reads the file, and the certificate files it names, when any of them
changes on disk (checked at most once a second, on new connections and requests): cert-manager
and kubelet rotate mounted Secrets in place. A change that does not load is logged and the
last good configuration stays in force, and so does one that would switch TLS on or off or leave
no basic auth user (an emptied file): those take a restart. The rate limiter, as
exporter-toolkit's, is built once at start.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import logging
import os
import random
import re
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CLIENT_AUTH_TYPES = ("NoClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert")
_UNSUPPORTED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")
TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# Go's names of TLS 1.2 suites -> OpenSSL's (TLS 1.3 suites are not configurable in Go either).
CIPHER_SUITES = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
}
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
_HTTP_KEYS = {"http2", "headers"}
_RATE_KEYS = {"burst", "interval"}
_BCRYPT_HASH = re.compile(r"\$2[abxy]?\$\d\d\$[./A-Za-z0-9]{53}")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
# Compared against when the user is unknown, so that a wrong user costs as long as a wrong password.
_DUMMY_HASH = "$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi"
AUTH_CACHE_SIZE = 100


class WebConfigError(ValueError):
    """A web configuration that cannot be used; the message is one line."""


@dataclass(frozen=True)
class TlsSettings:
    cert_file: Path
    key_file: Path
    client_auth_type: str = "NoClientCert"
    client_ca_file: Path | None = None
    client_allowed_sans: tuple[str, ...] = ()
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    cipher_suites: tuple[str, ...] = ()

    def files(self) -> tuple[Path, ...]:
        return (self.cert_file, self.key_file) + ((self.client_ca_file,) if self.client_ca_file else ())


@dataclass(frozen=True)
class RateLimit:
    burst: int
    interval_seconds: float


@dataclass(frozen=True)
class WebConfig:
    tls: TlsSettings | None = None
    basic_auth_users: Mapping[str, str] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    rate_limit: RateLimit | None = None


def _mapping(value: object, where: str, allowed: set[str]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise WebConfigError(f"{where} must be a mapping")
    unknown = sorted(str(key) for key in value if key not in allowed)
    if unknown:
        raise WebConfigError(f"{where}: unknown field {unknown[0]!r} (have: {', '.join(sorted(allowed))})")
    return value


def _string(value: object, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise WebConfigError(f"{where} must be a string")
    return value


def _strings(value: object, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise WebConfigError(f"{where} must be a list of strings")
    return tuple(value)


def _duration_seconds(value: object, where: str) -> float:
    text = str(value)
    if value is None or text == "0":  # Go's time.ParseDuration takes a bare 0
        return 0.0
    parts = _DURATION.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        raise WebConfigError(f"{where}: {text!r} is not a duration like 1s or 500ms")
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    return sum(float(number) * scale[unit] for number, unit in parts)


def _tls_settings(raw: dict[str, Any], folder: Path) -> TlsSettings | None:
    for inline in ("cert", "key", "client_ca"):
        if raw.get(inline):
            raise WebConfigError(f"tls_server_config.{inline}: inline PEM is not supported; use {inline}_file")
    if raw.get("curve_preferences"):
        raise WebConfigError("tls_server_config.curve_preferences is not supported; remove it")
    cert = _string(raw.get("cert_file"), "tls_server_config.cert_file")
    key = _string(raw.get("key_file"), "tls_server_config.key_file")
    client_ca = _string(raw.get("client_ca_file"), "tls_server_config.client_ca_file")
    auth = _string(raw.get("client_auth_type"), "tls_server_config.client_auth_type")
    if not (cert or key or client_ca or auth):
        return None  # exporter-toolkit: no TLS key set, plain HTTP
    if not cert:
        raise WebConfigError("tls_server_config: missing cert_file")
    if not key:
        raise WebConfigError("tls_server_config: missing key_file")
    auth = auth or "NoClientCert"
    if auth in _UNSUPPORTED_CLIENT_AUTH:
        raise WebConfigError(
            f"tls_server_config.client_auth_type {auth} is not supported "
            f"(OpenSSL cannot request a certificate without verifying it); use one of {', '.join(CLIENT_AUTH_TYPES)}"
        )
    if auth not in CLIENT_AUTH_TYPES:
        raise WebConfigError(
            f"tls_server_config.client_auth_type: invalid {auth!r} (have: {', '.join(CLIENT_AUTH_TYPES)})"
        )
    if client_ca and auth == "NoClientCert":
        raise WebConfigError("tls_server_config: client_ca_file is set without a client_auth_type that uses it")
    if auth != "NoClientCert" and not client_ca:
        raise WebConfigError(f"tls_server_config: client_auth_type {auth} needs client_ca_file")
    versions = {}
    for name, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        version = _string(raw.get(name), f"tls_server_config.{name}") or default
        if version not in TLS_VERSIONS:
            raise WebConfigError(f"tls_server_config.{name}: unknown {version!r} (have: {', '.join(TLS_VERSIONS)})")
        versions[name] = version
    suites = _strings(raw.get("cipher_suites"), "tls_server_config.cipher_suites")
    unknown = [suite for suite in suites if suite not in CIPHER_SUITES]
    if unknown:
        raise WebConfigError(f"tls_server_config.cipher_suites: unknown or TLS 1.3 suite {unknown[0]!r}")
    return TlsSettings(
        cert_file=folder / cert,
        key_file=folder / key,
        client_auth_type=auth,
        client_ca_file=folder / client_ca if client_ca else None,
        client_allowed_sans=_strings(raw.get("client_allowed_sans"), "tls_server_config.client_allowed_sans"),
        min_version=versions["min_version"],
        max_version=versions["max_version"],
        cipher_suites=suites,
    )


def parse_web_config(text: str, folder: Path) -> WebConfig:
    """A ``WebConfig`` from the file's text; relative paths are taken from ``folder``."""
    import yaml

    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise WebConfigError(f"not YAML: {' '.join(str(exc).split())[:200]}") from None
    top = _mapping(document, "the web configuration", _TOP_KEYS)
    tls = _tls_settings(_mapping(top.get("tls_server_config"), "tls_server_config", _TLS_KEYS), folder)
    http = _mapping(top.get("http_server_config"), "http_server_config", _HTTP_KEYS)
    headers = {
        str(k): str(v)
        for k, v in _mapping(http.get("headers"), "http_server_config.headers", set(ALLOWED_HEADERS)).items()
    }
    for name, value in headers.items():
        allowed = ALLOWED_HEADERS[name]
        if allowed and value not in allowed:
            raise WebConfigError(f"http_server_config.headers.{name}: {value!r} is not one of {', '.join(allowed)}")
    users = _mapping(
        top.get("basic_auth_users"), "basic_auth_users", {str(k) for k in top.get("basic_auth_users") or {}}
    )
    for user, hashed in users.items():
        if not isinstance(hashed, str) or not _BCRYPT_HASH.fullmatch(hashed):
            raise WebConfigError(f"basic_auth_users.{user}: not a bcrypt hash (generate one with htpasswd -nBC 10)")
    rate = _mapping(top.get("rate_limit"), "rate_limit", _RATE_KEYS)
    rate_limit = None
    interval = _duration_seconds(rate.get("interval"), "rate_limit.interval")
    burst = rate.get("burst", 0)
    if not isinstance(burst, int) or isinstance(burst, bool) or burst < 0:
        raise WebConfigError("rate_limit.burst must be a whole number, 0 or more")
    if interval > 0:  # exporter-toolkit: an interval of 0 (or none) turns the limiter off
        rate_limit = RateLimit(burst, interval)
    return WebConfig(
        tls=tls, basic_auth_users={str(k): v for k, v in users.items()}, headers=headers, rate_limit=rate_limit
    )


def build_ssl_context(tls: TlsSettings) -> ssl.SSLContext:
    """A server context for ``tls``; WebConfigError when a file is missing or does not match."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.minimum_version = TLS_VERSIONS[tls.min_version]
        context.maximum_version = TLS_VERSIONS[tls.max_version]
        if tls.cipher_suites:
            context.set_ciphers(":".join(CIPHER_SUITES[suite] for suite in tls.cipher_suites))
        context.load_cert_chain(tls.cert_file, tls.key_file)
        if tls.client_ca_file is not None:
            context.load_verify_locations(cafile=tls.client_ca_file)
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise WebConfigError(f"TLS: {' '.join(str(exc).split())[:200]}") from None
    context.verify_mode = {
        "NoClientCert": ssl.CERT_NONE,
        "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
        "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
    }[tls.client_auth_type]
    return context


def peer_has_allowed_san(peercert: Mapping[str, Any] | None, allowed: tuple[str, ...]) -> bool:
    """Whether a verified client certificate (``SSLObject.getpeercert()``) names an allowed SAN."""
    if not allowed:
        return True
    names = {str(value) for _, value in (peercert or {}).get("subjectAltName", ())}
    return bool(names & set(allowed))


@dataclass(frozen=True)
class LoadedWebConfig:
    config: WebConfig
    ssl_context: ssl.SSLContext | None


class AuthBusy(Exception):
    """Too many passwords are waiting for bcrypt already; answered 429 without checking this one."""


class BasicAuth:
    """Checks ``Authorization: Basic`` against bcrypt hashes, as exporter-toolkit does.

    bcrypt costs tens of milliseconds by design, so results are cached, failures too
    (exporter-toolkit's cache.go), and the cache is read without waiting for any hashing: a
    client whose credentials were checked once never waits behind a flood of wrong passwords.
    Hashes are computed one at a time (exporter-toolkit's ``bcryptMtx``) on a thread of their
    own, not on the pool the collectors use, and at most ``MAX_WAITING`` requests wait for one;
    more are refused (``AuthBusy``). Successes are kept apart from failures, so a flood of wrong
    passwords never evicts a known-good client. An unknown user is checked against a dummy
    hash, so a wrong user costs as long as a wrong password.
    """

    MAX_WAITING = 16

    def __init__(self, check: Callable[[bytes, bytes], bool] | None = None) -> None:
        self._check = check
        self._good: OrderedDict[bytes, None] = OrderedDict()  # least recently used first
        self._bad: dict[bytes, None] = {}
        self._cache_lock = threading.Lock()  # held for dictionary operations only
        self._hash_lock = threading.Lock()  # one bcrypt at a time
        self._pool: ThreadPoolExecutor | None = None
        self._waiting = 0
        self.checks = 0  # bcrypt computations so far

    @staticmethod
    def credentials(users: Mapping[str, str], authorization: str) -> tuple[bytes, bytes, bytes, bool] | None:
        """(cache key, password, hash to check it against, whether the user exists), or None for no
        usable Basic credentials."""
        scheme, _, encoded = authorization.partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            user, colon, password = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        if not colon:
            return None
        hashed = users.get(user, _DUMMY_HASH)
        key = hashlib.sha256("\0".join((user, hashed, password)).encode()).digest()
        return key, password.encode(), hashed.encode(), user in users

    def cached(self, key: bytes) -> bool | None:
        """The cached result for ``key`` (from ``credentials``), or None when it was never checked."""
        with self._cache_lock:
            if key in self._good:
                self._good.move_to_end(key)
                return True
            return False if key in self._bad else None

    def _remember(self, key: bytes, allowed: bool) -> None:
        with self._cache_lock:
            if allowed:
                self._good[key] = None
                if len(self._good) > AUTH_CACHE_SIZE:
                    self._good.popitem(last=False)
            else:
                if len(self._bad) >= AUTH_CACHE_SIZE:
                    del self._bad[random.choice(list(self._bad))]
                self._bad[key] = None

    def check(self, users: Mapping[str, str], authorization: str) -> bool:
        """Whether ``authorization`` names a user with its password; blocking (bcrypt on a miss)."""
        found = self.credentials(users, authorization)
        if found is None:
            return False
        key, password, hashed, known = found
        cached = self.cached(key)
        if cached is not None:
            return cached
        allowed = self._bcrypt(password, hashed) and known  # bcrypt first: same cost either way
        self._remember(key, allowed)
        return allowed

    async def allows(self, users: Mapping[str, str], authorization: str) -> bool:
        """``check`` for the event loop: a cached answer at once, a miss on the hashing thread.
        ``AuthBusy`` when ``MAX_WAITING`` misses wait already."""
        found = self.credentials(users, authorization)
        if found is None:
            return False
        cached = self.cached(found[0])
        if cached is not None:
            return cached
        if self._waiting >= self.MAX_WAITING:
            raise AuthBusy(f"{self._waiting} passwords are waiting for bcrypt")
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bcrypt")
        self._waiting += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, self.check, users, authorization)
        finally:
            self._waiting -= 1

    def _bcrypt(self, password: bytes, hashed: bytes) -> bool:
        if self._check is None:
            import bcrypt

            self._check = bcrypt.checkpw
        with self._hash_lock:
            self.checks += 1
            try:
                return self._check(password, hashed)
            except ValueError:
                return False

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


class RateLimiter:
    """exporter-toolkit's limiter (Go's ``rate.NewLimiter(rate.Every(interval), burst)``): a bucket of
    ``burst`` tokens, full at start, one more every ``interval_seconds``; ``burst`` 0 refuses everything."""

    def __init__(self, limit: RateLimit) -> None:
        self._limit = limit
        self._tokens = float(limit.burst)
        self._at = time.monotonic()

    def allow(self) -> bool:
        now = time.monotonic()
        self._tokens = min(float(self._limit.burst), self._tokens + (now - self._at) / self._limit.interval_seconds)
        self._at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False


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
        if rate_limit is not None and rate_limit.burst == 0:
            log.warning("web configuration %s: rate_limit.burst is 0, so every request is refused (429)", name)

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
        return LoadedWebConfig(config, build_ssl_context(config.tls) if config.tls else None)

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

    def rate_allows(self) -> bool:
        with self._lock:
            return self._limiter is None or self._limiter.allow()

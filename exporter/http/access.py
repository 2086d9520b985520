"""Who may ask: basic auth checked as exporter-toolkit checks it, and its rate limit.

Both are built by ``exporter.http.webconfig.WebConfigSource`` from the web configuration and used
by ``exporter.http.server`` on every request.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

# Compared against when the user is unknown, so that a wrong user costs as long as a wrong password.
_DUMMY_HASH = "$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi"
AUTH_CACHE_SIZE = 100


@dataclass(frozen=True)
class RateLimit:
    burst: int  # 0 or less: every request is refused, as by Go's rate.Limiter
    interval_seconds: float


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

"""Restarting a background task that failed: how long to wait (``RestartBackoff``) and the loop
that does it (``supervise``), for the collectors' background coroutines.

The delay doubles from ``initial`` up to ``maximum`` while the task keeps failing, and goes back to
``initial`` once a run has lasted ``healthy_after_seconds``: the task had recovered (read its
source, stepped many times) before it failed again, so the new failure is a new problem and is
retried as quickly as the first one. Without that reset, a collector that failed a few times
once would wait the longest delay after every later failure, for the life of the process. The
same rule as a container runtime's restart back-off (reset after a run of some length).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


class RestartBackoff:
    """The delay before each restart of one task; see the module docstring."""

    def __init__(self, initial: float = 1.0, maximum: float = 60.0, healthy_after_seconds: float = 60.0) -> None:
        if initial <= 0 or maximum < initial or healthy_after_seconds <= 0:
            raise ValueError("need 0 < initial <= maximum and healthy_after_seconds > 0")
        self.initial = initial
        self.maximum = maximum
        self.healthy_after_seconds = healthy_after_seconds
        self._next = initial

    def failed(self, ran_seconds: float) -> float:
        """The task failed after running ``ran_seconds``: the seconds to wait before restarting it."""
        if ran_seconds >= self.healthy_after_seconds:
            self._next = self.initial
        delay = self._next
        self._next = min(self._next * 2, self.maximum)
        return delay


async def supervise(
    name: str,
    run: Callable[[], Awaitable[None]],
    backoff: RestartBackoff | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Keep collector ``name``'s background coroutine alive: log a failure, wait, restart. Returns
    when ``run`` returns; cancellation goes through."""
    backoff = backoff or RestartBackoff()
    while True:
        started = clock()
        try:
            await run()
            return
        except asyncio.CancelledError:
            raise
        except Exception:  # logged: one broken collector must not end the exporter
            delay = backoff.failed(clock() - started)
            log.exception("background task of collector %s crashed; restarting in %.0fs", name, delay)
            await sleep(delay)

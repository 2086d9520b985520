"""Clocks for the code under test that a test moves itself: ``ManualClock`` stands still until
the test sets ``now``; ``SkippingWallClock`` runs with real time, plus the seconds a test skips."""

from __future__ import annotations

import time


class ManualClock:
    """Reads ``now``, which only the test changes."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class SkippingWallClock:
    """Real time plus the seconds a test skipped ahead, so a test waits out a timeout, or the
    one-second resolution of a written time, at once while threads of the code under test run."""

    def __init__(self) -> None:
        self.skipped = 0.0

    def __call__(self) -> float:
        return time.time() + self.skipped

    def skip(self, seconds: float) -> None:
        self.skipped += seconds

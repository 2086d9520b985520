"""When each collector last succeeded, kept across restarts: ``ccl_exporter_collector_status``.

A collector that fails now is ``failing`` when it succeeded within the window (a day by
default: a regression, a driver upgrade or an unmounted path) and ``unavailable`` when it did
not (its source is absent on this node); ``ok`` when it succeeds. The exporter exposes one
series per collector, labelled with its status, so the alerts select the few failing ones by
label instead of reading every collector's success over a day of history on every evaluation
(docs/scaling.md).

The last success times are written to a small JSON file in ``--path.state`` (a hostPath in the
DaemonSet), so a restarted exporter still tells a regression from a source that was never
there. ``observe`` (on the scrape path) only takes a copy of them when there are newer success
times: at once when a collector's outcome changed too, otherwise at most every
``SAVE_SECONDS``. ``write_pending`` writes the copy, atomically (a temporary file renamed over
it), off the scrape path: the umbrella hands it to its thread pool, as no file is read or
written while a scrape waits. A file that cannot be read or parsed, or that holds malformed
names or impossible times, is ignored where it is wrong and logged once; a folder that
cannot be written to leaves the history in memory, logged once.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from exporter.atomic_write import write_atomically

log = logging.getLogger(__name__)

WINDOW_SECONDS = 86400.0  # "succeeded earlier today": the alerts' look-back
SAVE_SECONDS = 300.0  # how stale the file's last-success times may get while collectors succeed
MAX_FILE_BYTES = 64 * 1024  # a few dozen collectors take a few hundred bytes
FUTURE_SLACK_SECONDS = 300.0  # a time further ahead than this is a broken clock or a forged file
FILE_NAME = "collectors.json"


class CollectorHistory:
    """Last success time per collector; ``path`` None keeps it in memory only."""

    def __init__(
        self,
        path: Path | None = None,
        window_seconds: float = WINDOW_SECONDS,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._path = path
        self._window = window_seconds
        self._clock = clock or time.time
        self._last_success: dict[str, float] = {}
        self._outcomes: dict[str, bool] = {}
        self._saved_at = -math.inf
        self._dirty = False
        self._pending: dict[str, float] | None = None  # the copy write_pending writes next
        self._lock = threading.Lock()  # observe (a scrape) and write_pending (a pool thread) hand over copies
        self._write_failed = False
        if path is not None:
            self._last_success = _read(path, self._clock())

    def observe(self, outcomes: Iterable[tuple[str, bool]]) -> dict[str, str]:
        """Fold one scrape's outcomes (collector, success) in; each collector's status."""
        now = self._clock()
        statuses: dict[str, str] = {}
        changed = False
        for name, success in outcomes:
            if self._outcomes.get(name) != success:
                changed = True
                self._outcomes[name] = success
            if success:
                self._last_success[name] = now
                self._dirty = True
                statuses[name] = "ok"
            elif now - self._last_success.get(name, -math.inf) <= self._window:
                statuses[name] = "failing"
            else:
                statuses[name] = "unavailable"
        with self._lock:
            if self._path is not None and self._dirty and (changed or now - self._saved_at >= SAVE_SECONDS):
                self._pending = dict(self._last_success)
                self._saved_at = now
                self._dirty = False
        return statuses

    @property
    def write_due(self) -> bool:
        return self._pending is not None

    def write_pending(self) -> None:
        """Write the last copy ``observe`` took, if any. A failed write is logged once and tried
        again with a later copy."""
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is None or self._path is None:
            return
        body = json.dumps({"last_success": pending}, sort_keys=True).encode()
        try:
            write_atomically(self._path, body, prefix=".collectors-")
        except OSError as exc:
            if not self._write_failed:
                log.warning("cannot keep collector history in %s (kept in memory): %s", self._path, exc)
                self._write_failed = True
            with self._lock:
                self._dirty = True
            return
        self._write_failed = False


def _read(path: Path, now: float) -> dict[str, float]:
    """The last success times a file holds; what is wrong in it is left out and logged."""
    try:
        if path.is_symlink() or not path.exists():
            return {}
        with path.open("rb") as source:
            raw = source.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        log.warning("cannot read collector history %s: %s", path, exc)
        return {}
    if len(raw) > MAX_FILE_BYTES:
        log.warning("collector history %s is over %d bytes: ignored", path, MAX_FILE_BYTES)
        return {}
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        log.warning("collector history %s is not JSON (%s): ignored", path, exc)
        return {}
    entries = document.get("last_success") if isinstance(document, dict) else None
    if not isinstance(entries, dict):
        log.warning("collector history %s has no last_success object: ignored", path)
        return {}
    kept: dict[str, float] = {}
    for name, value in entries.items():
        if (
            isinstance(name, str)
            and 0 < len(name) <= 64
            and isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
            and 0 < value <= now + FUTURE_SLACK_SECONDS
        ):
            kept[name] = float(value)
    if len(kept) != len(entries):
        log.warning("collector history %s: %d of %d entries ignored", path, len(entries) - len(kept), len(entries))
    return kept

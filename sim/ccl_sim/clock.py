"""The simulated node's clock: the one place its parts read time from.

Two kinds of time: the simulation's own (``SimClock``: seconds since start, the tick's length
and how busy the training job is, handed to every part on each tick), and the wall clock
(``now``), which stamps what the node writes (log lines, result files, the ``at`` of a control
action) so the exporter and Prometheus see real times.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import datetime, timezone


@dataclass(frozen=True)
class SimClock:
    """Where the simulation is: seconds since start and how busy the training job is."""

    elapsed_seconds: float
    step_seconds: float
    job_activity: float  # 0 idle .. 1 full all-reduce traffic


def job_activity(elapsed_seconds: float, period_seconds: float = 120.0) -> float:
    """The simulated job's communication load: busy phases with short idle gaps (checkpoints)."""
    phase = (elapsed_seconds % period_seconds) / period_seconds
    if phase > 0.9:  # checkpoint / eval: the fabric goes quiet for 10% of each period
        return 0.05
    return 0.6 + 0.4 * math.sin(2 * math.pi * phase * 3) ** 2


def now() -> float:
    """Wall-clock seconds since the epoch."""
    return time.time()


def cri_timestamp() -> str:
    """The wall clock as the kubelet stamps a CRI log line (RFC 3339, nanosecond digits, UTC)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")

"""Each pod's NCCL transport verdict as the NCCL collector reaches it, for what acts on it at once.

Its own module, beside the collector and the lifecycle hooks, because both depend on it: the NCCL
collector publishes a ``FabricView`` (every pod of the node) whenever a verdict changes, as the
tailer produces lines, and the lifecycle hooks take views to write pod conditions and Events
within seconds, not at the next scrape. Neither imports the other.

``VerdictFeed`` is a bounded queue: ``publish`` never blocks (the tailer must never wait on the
Kubernetes API); when the consumer falls behind, the oldest view is dropped and counted. Each
view is complete, so the newest one always says everything. Nothing is queued until a consumer
has subscribed.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_CAPACITY = 64


@dataclass(frozen=True)
class PodFabric:
    """What the NCCL collector concluded about one pod's transport."""

    namespace: str
    pod: str
    verdict: str  # rdma | single_node | tcp_fallback | unknown (ccl_nccl_verdict)
    node_rdma_active: bool | None  # this node has an ACTIVE RDMA port (None: could not read)
    gdr_disabled: bool  # inter-node traffic on RDMA without GPUDirect RDMA (ccl_nccl_gdr_disabled)
    reason: str = ""  # why the verdict, quoting the deciding log line
    gdr_reason: str = ""  # the line that shows GPUDirect RDMA off, when gdr_disabled


@dataclass(frozen=True)
class FabricView:
    """Every pod of the node with NCCL output, as of ``published_at`` (the feed's monotonic clock)."""

    pods: tuple[PodFabric, ...]
    published_at: float


class VerdictFeed:
    """See the module docstring."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY, clock: Callable[[], float] = time.monotonic) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._capacity = capacity
        self._clock = clock
        self._changed = threading.Condition()
        self._queue: deque[FabricView] = deque()
        self._last: tuple[PodFabric, ...] | None = None
        self._subscribed = False
        self.published = 0
        self.dropped = 0

    def subscribe(self) -> None:
        """From now on, views are queued (before, publishing costs nothing)."""
        with self._changed:
            self._subscribed = True

    @property
    def subscribed(self) -> bool:
        return self._subscribed

    def publish(self, pods: tuple[PodFabric, ...]) -> bool:
        """Queue ``pods`` as a view when it differs from the last one; never blocks. True when queued."""
        with self._changed:
            if not self._subscribed or pods == self._last:
                return False
            self._last = pods
            if len(self._queue) >= self._capacity:
                self._queue.popleft()
                self.dropped += 1
            self._queue.append(FabricView(pods, self._clock()))
            self.published += 1
            self._changed.notify_all()
            return True

    def take(self, timeout: float) -> list[FabricView]:
        """Every queued view, oldest first; waits up to ``timeout`` seconds for one (empty when none came)."""
        with self._changed:
            if not self._queue:
                self._changed.wait(timeout)
            views = list(self._queue)
            self._queue.clear()
            return views

"""What every collector is, and how it is described to the umbrella.

A collector turns records from ``exporter.sources`` (and state kept by its own background
task, if it has one) into client_python metric families, fresh on every scrape. It never
reaches another collector; the umbrella in ``exporter.registry`` times it, isolates its
failures and reports ``ccl_exporter_collector_success`` / ``..._duration_seconds`` for it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from prometheus_client.metrics_core import Metric

if TYPE_CHECKING:
    from exporter.config import ServeConfig


class CollectorUnavailable(Exception):
    """The collector's source does not exist on this node (no RDMA class, no NVML, ...).

    Reported as success 0 and logged once at info level rather than on every scrape.
    """


class PartialCollection(Exception):
    """Some devices could not be read; the families already yielded are still exposed."""


@runtime_checkable
class Collector(Protocol):
    """A scrape-time metric producer. ``collect`` runs in a worker thread."""

    name: str

    def collect(self) -> Iterable[Metric]: ...


@runtime_checkable
class BackgroundCollector(Collector, Protocol):
    """A collector that also owns a coroutine running for the life of the server.

    ``run`` is started when the server starts and cancelled on shutdown (SIGTERM); it is
    where tailers, watches and schedulers live. It must never block the event loop.
    """

    def run(self) -> Awaitable[None]: ...


@dataclass(frozen=True)
class CollectorSpec:
    """How the CLI and the server know a collector: its name, default and factory."""

    name: str
    help: str
    default_enabled: bool
    factory: Callable[["ServeConfig"], Collector]


def close_collector(collector: Collector) -> None:
    """Call ``close()`` on a collector that has one (NVML shutdown, file handles)."""
    close = getattr(collector, "close", None)
    if callable(close):
        close()

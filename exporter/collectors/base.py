"""What every collector is, and how it is described to the umbrella.

A collector turns records from ``exporter.sources`` (and state kept by its own background
task, if it has one) into client_python metric families, fresh on every scrape. It never
reaches another collector; the umbrella in ``exporter.collectors.umbrella`` times it, isolates its
failures and reports ``ccl_exporter_collector_success`` / ``..._duration_seconds`` for it.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from prometheus_client.metrics_core import Metric

from exporter.flags import Flag, Switch
from exporter.resources import NodeResources


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


async def run_every(seconds: float, step: Callable[[], object]) -> None:
    """The ``run`` of a collector that polls its source: ``step`` in a worker thread (it reads
    files), then a pause of ``seconds``, for ever (until the server cancels it)."""
    while True:
        await asyncio.to_thread(step)
        await asyncio.sleep(seconds)


def no_settings(args: argparse.Namespace) -> None:
    """The settings of a collector without flags of its own."""
    return None


@dataclass(frozen=True)
class CollectorSpec:
    """How ``serve`` knows a collector, as node_exporter's collectors register themselves.

    ``name`` gives ``--collector.<name>`` / ``--no-collector.<name>`` (on unless
    ``default_enabled`` is False). The collector's own flags (``flags``, shown under
    ``flag_group`` in ``serve --help``) become its settings through ``settings``, which reads the
    parsed ``serve`` flags and raises SystemExit with a clear message on bad values. ``factory``
    builds the collector from those settings and the node's shared resources.
    """

    name: str
    help: str
    default_enabled: bool
    factory: Callable[[Any, NodeResources], Collector]
    flags: tuple[Flag | Switch, ...] = ()
    flag_group: str = ""
    settings: Callable[[argparse.Namespace], Any] = no_settings


def close_collector(collector: Collector) -> None:
    """Call ``close()`` on a collector that has one (NVML shutdown, file handles)."""
    close = getattr(collector, "close", None)
    if callable(close):
        close()

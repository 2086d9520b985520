"""The umbrella's lane: a scrape's collectors run in turn on one thread, and a collector that
stalls hands the ones after it to threads of their own."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from exporter.build import BuildInfo
from exporter.collectors.umbrella import UmbrellaCollector

BUILD = BuildInfo("0.0.0", "test", "3")


class Recording:
    """Says which thread ran it, and when it finished."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.threads: list[int] = []
        self.finished_at = 0.0

    def collect(self) -> Iterable[Metric]:
        self.threads.append(threading.get_ident())
        family = GaugeMetricFamily(f"ccl_test_{self.name}", "test", labels=["x"])
        family.add_metric(["a"], 1.0)
        self.finished_at = time.perf_counter()
        yield family


class Stalling(Recording):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.release = threading.Event()

    def collect(self) -> Iterable[Metric]:
        self.release.wait(30)
        yield from super().collect()


def _success(families: list[Metric]) -> dict[str, float]:
    [success] = [f for f in families if f.name == "ccl_exporter_collector_success"]
    return {s.labels["collector"]: s.value for s in success.samples}


def test_a_scrape_runs_its_collectors_in_turn_on_one_thread_not_the_scrapes() -> None:
    collectors = [Recording(f"c{index}") for index in range(5)]
    umbrella = UmbrellaCollector(collectors, build=BUILD)  # type: ignore[arg-type]
    try:
        for _ in range(3):
            families = list(umbrella.collect())
            assert _success(families) == {c.name: 1.0 for c in collectors}
        for scrape in range(3):
            threads = {c.threads[scrape] for c in collectors}
            assert len(threads) == 1, "one hand-off per scrape, not one per collector"
            assert threads != {threading.get_ident()}, "never on the scraping thread: a hung collector would hang it"
    finally:
        umbrella.close()


def test_a_stalled_collector_hands_the_ones_after_it_to_threads_of_their_own() -> None:
    before, stalled, after = Recording("before"), Stalling("stalled"), [Recording(f"after{i}") for i in range(3)]
    umbrella = UmbrellaCollector(
        [before, stalled, *after],  # type: ignore[list-item]
        timeout_seconds=1.0,
        build=BUILD,
        lane_stall_seconds=0.1,
    )
    try:
        started = time.perf_counter()
        families = list(umbrella.collect())
        took = time.perf_counter() - started
        assert _success(families) == {"before": 1.0, "stalled": 0.0, "after0": 1.0, "after1": 1.0, "after2": 1.0}
        assert 1.0 <= took < 1.8, "the scrape waits out the stalled collector's timeout, no longer"
        for collector in after:
            assert collector.finished_at - started < 0.6, "run soon after the stall, not after the timeout"
        # The stalled collector is not started again while it runs; the others still are.
        families = list(umbrella.collect())
        assert _success(families)["stalled"] == 0.0 and _success(families)["after2"] == 1.0
        stalled.release.set()
        time.sleep(0.2)
        assert _success(list(umbrella.collect()))["stalled"] == 1.0
    finally:
        stalled.release.set()
        umbrella.close()


class Slow(Recording):
    def collect(self) -> Iterable[Metric]:
        time.sleep(0.06)
        yield from super().collect()


def test_a_lane_longer_than_the_stall_time_stays_one_lane_while_no_collector_stalls() -> None:
    collectors = [Slow(f"s{index}") for index in range(4)]  # 0.24 s in all, 0.06 s each
    umbrella = UmbrellaCollector(collectors, timeout_seconds=2.0, build=BUILD, lane_stall_seconds=0.1)  # type: ignore[arg-type]
    try:
        assert _success(list(umbrella.collect())) == {c.name: 1.0 for c in collectors}
        assert len({c.threads[0] for c in collectors}) == 1, "no collector ran 0.1 s: none left the lane"
    finally:
        umbrella.close()

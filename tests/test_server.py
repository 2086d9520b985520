"""The HTTP server and the umbrella collector: failure isolation, negotiation, pages, signals."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from exporter.collectors.base import CollectorUnavailable
from exporter.collectors.rdma import RdmaCollector
from exporter.server import create_app
from tests.metrics_text import value


class Fixed:
    def __init__(self, name: str, val: float = 1.0) -> None:
        self.name = name
        self.val = val

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(f"ccl_test_{self.name}", "test", labels=["x"])
        family.add_metric(["a"], self.val)
        yield family


class Raising:
    name = "raising"

    def collect(self) -> Iterable[Metric]:
        yield from Fixed("before_raise").collect()
        raise RuntimeError("reader exploded")


class Hanging:
    name = "hanging"

    def __init__(self) -> None:
        self.release = threading.Event()

    def collect(self) -> Iterable[Metric]:
        self.release.wait(30)
        yield from Fixed("late").collect()


class Garbage:
    name = "garbage"

    def collect(self) -> Iterable[Metric]:
        yield "not a metric"  # type: ignore[misc]
        bad = GaugeMetricFamily("ccl_test_bad_value", "x")
        bad.add_metric([], "NaN please")  # type: ignore[arg-type]
        yield bad
        yield from Fixed("kept_from_garbage").collect()


class Unavailable:
    name = "unavailable"

    def collect(self) -> Iterable[Metric]:
        raise CollectorUnavailable("no such device")


async def test_one_failing_collector_never_fails_the_scrape(aiohttp_client, fixture_tree) -> None:  # type: ignore[no-untyped-def]
    hanging = Hanging()
    app = create_app(
        [RdmaCollector(fixture_tree("sysfs_rdma")), Raising(), hanging, Garbage(), Unavailable(), Fixed("ok")],
        scrape_timeout_seconds=0.5,
    )
    client = await aiohttp_client(app)
    try:
        response = await client.get("/metrics")
        assert response.status == 200
        text = await response.text()
        success = {name: value(text, "ccl_exporter_collector_success", collector=name)
                   for name in ("rdma", "raising", "hanging", "garbage", "unavailable", "ok")}
        assert success == {"rdma": 1.0, "raising": 0.0, "hanging": 0.0, "garbage": 0.0, "unavailable": 0.0, "ok": 1.0}
        assert value(text, "ccl_rdma_port_state_id", device="mlx5_0", port="1") == 4.0
        assert value(text, "ccl_test_ok", x="a") == 1.0
        assert value(text, "ccl_test_before_raise", x="a") == 1.0  # yielded before the error: kept
        assert value(text, "ccl_test_kept_from_garbage", x="a") == 1.0
        assert "ccl_test_bad_value" not in text
        assert value(text, "ccl_exporter_collector_duration_seconds", collector="hanging") >= 0.5

        # The hung collector is not started again while it still runs: no thread pile-up.
        started = time.perf_counter()
        text = await (await client.get("/metrics")).text()
        assert time.perf_counter() - started < 0.5
        assert value(text, "ccl_exporter_collector_success", collector="hanging") == 0.0

        landing = await (await client.get("/")).text()
        assert "reader exploded" in landing and "still running from an earlier scrape" in landing
    finally:
        hanging.release.set()


async def test_killing_the_rdma_reader_leaves_other_metrics(aiohttp_client, fixture_tree, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import exporter.collectors.rdma as rdma

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise PermissionError("sysfs went away")

    monkeypatch.setattr(rdma, "read_rdma", broken)
    client = await aiohttp_client(create_app([RdmaCollector(fixture_tree("sysfs_rdma")), Fixed("other")]))
    response = await client.get("/metrics")
    assert response.status == 200
    text = await response.text()
    assert value(text, "ccl_exporter_collector_success", collector="rdma") == 0.0
    assert value(text, "ccl_test_other", x="a") == 1.0
    assert value(text, "ccl_exporter_build_info", version=__import__("exporter").__version__) == 1.0
    assert "process_resident_memory_bytes" in text


async def test_openmetrics_negotiation(aiohttp_client) -> None:  # type: ignore[no-untyped-def]
    client = await aiohttp_client(create_app([Fixed("ok")]))
    plain = await client.get("/metrics")
    assert plain.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    om = await client.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert om.headers["Content-Type"].startswith("application/openmetrics-text")
    assert (await om.text()).rstrip().endswith("# EOF")


async def test_health_and_readiness(aiohttp_client) -> None:  # type: ignore[no-untyped-def]
    client = await aiohttp_client(create_app([Fixed("ok")]))
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/readyz")).status == 200
    assert (await client.get("/nope")).status == 404


def test_sigterm_shuts_down_cleanly(exporter_process, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc = exporter_process("--path.sysfs", str(tmp_path))
    assert "ccl_exporter_build_info" in proc.metrics()
    proc.proc.send_signal(signal.SIGTERM)
    assert proc.proc.wait(10) == 0


def test_environment_variables_set_flags(exporter_process, fixture_tree) -> None:  # type: ignore[no-untyped-def]
    sysfs = fixture_tree("sysfs_rdma")
    proc = exporter_process(env={"CCL_EXPORTER_PATH_SYSFS": str(sysfs)})
    assert value(proc.metrics(), "ccl_rdma_port_state_id", device="mlx5_0", port="1") == 4.0
    off = exporter_process(env={"CCL_EXPORTER_PATH_SYSFS": str(sysfs), "CCL_EXPORTER_COLLECTOR_RDMA": "false"})
    text = off.metrics()
    assert "ccl_rdma_port_state_id" not in text and 'collector="rdma"' not in text

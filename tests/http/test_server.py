"""The HTTP server and the umbrella collector: failure isolation, negotiation, pages, signals."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from unittest import mock

import pytest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from exporter.build import read_build_info
from exporter.collectors.base import CollectorUnavailable
from exporter.collectors.rdma import RdmaCollector
from exporter.collectors.umbrella import MAX_LABEL_VALUE_CHARS
from exporter.http.connections import ConnectionGuard, ConnectionLimits
from exporter.http.endpoints import accepts_gzip, create_app, serving
from tests.conftest import REPO
from tests.metrics_text import samples, value


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


async def test_one_failing_collector_never_fails_the_scrape(app_client, fixture_tree) -> None:  # type: ignore[no-untyped-def]
    hanging = Hanging()
    app = create_app(
        [RdmaCollector(fixture_tree("sysfs_rdma")), Raising(), hanging, Garbage(), Unavailable(), Fixed("ok")],
        scrape_timeout_seconds=0.5,
    )
    client = await app_client(app)
    try:
        response = await client.get("/metrics")
        assert response.status == 200
        text = await response.text()
        success = {
            name: value(text, "ccl_exporter_collector_success", collector=name)
            for name in ("rdma", "raising", "hanging", "garbage", "unavailable", "ok")
        }
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


async def test_killing_the_rdma_reader_leaves_other_metrics(app_client, fixture_tree, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import exporter.collectors.rdma as rdma

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise PermissionError("sysfs went away")

    monkeypatch.setattr(rdma, "read_rdma", broken)
    client = await app_client(create_app([RdmaCollector(fixture_tree("sysfs_rdma")), Fixed("other")]))
    response = await client.get("/metrics")
    assert response.status == 200
    text = await response.text()
    assert value(text, "ccl_exporter_collector_success", collector="rdma") == 0.0
    assert value(text, "ccl_test_other", x="a") == 1.0
    build = read_build_info()
    assert (
        value(
            text,
            "ccl_exporter_build_info",
            version=build.version,
            revision=build.revision,
            python_version=build.python_version,
        )
        == 1.0
    )
    assert "process_resident_memory_bytes" in text


async def test_openmetrics_negotiation(app_client) -> None:  # type: ignore[no-untyped-def]
    client = await app_client(create_app([Fixed("ok")]))
    plain = await client.get("/metrics")
    assert plain.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    om = await client.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert om.headers["Content-Type"].startswith("application/openmetrics-text")
    assert (await om.text()).rstrip().endswith("# EOF")


async def test_health_and_readiness(app_client) -> None:  # type: ignore[no-untyped-def]
    client = await app_client(create_app([Fixed("ok")]))
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/readyz")).status == 200
    assert (await client.get("/nope")).status == 404
    for path in ("/healthz", "/metrics", "/nope"):
        # No versions for a scanner to match against advisories (aiohttp's default names its own and Python's).
        assert (await client.get(path)).headers["Server"] == "ccl-exporter", path


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


class HostileLabels:
    """Label values as hostile pods and files produce them: undecodable, escaped, huge."""

    name = "hostile"

    def collect(self) -> Iterable[Metric]:
        folders = GaugeMetricFamily("ccl_test_folder", "pod folders", labels=["pod", "network"])
        folders.add_metric(["worker-\udcff", "IB"], 1.0)  # os.listdir of a folder named b"worker-\xff"
        folders.add_metric(["worker-\udcfe", "IB"], 2.0)
        folders.add_metric(["probe", "\ud800"], 3.0)  # json.loads of '"\\ud800"'
        yield folders
        huge = GaugeMetricFamily("ccl_test_network", "Using network <60 KB>", labels=["network"])
        prefix = "A" * 60_000
        huge.add_metric([prefix + "1"], 1.0)
        huge.add_metric([prefix + "2"], 2.0)
        huge.add_metric(["IB"], 3.0)
        yield huge


@pytest.mark.parametrize("accept", ["", "application/openmetrics-text; version=1.0.0"])
async def test_label_values_that_are_not_utf8_never_fail_the_page(app_client, accept: str) -> None:  # type: ignore[no-untyped-def]
    client = await app_client(create_app([HostileLabels(), Fixed("ok")], process_metrics=False))
    response = await client.get("/metrics", headers={"Accept": accept})
    assert response.status == 200, await response.text()
    text = await response.text()
    if accept:
        found = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in parse_openmetrics(text) for s in f.samples}
    else:
        found = samples(text)
    assert found[("ccl_test_folder", (("network", "IB"), ("pod", "worker-\\xff")))] == 1.0
    assert found[("ccl_test_folder", (("network", "IB"), ("pod", "worker-\\xfe")))] == 2.0, "still two series"
    assert found[("ccl_test_folder", (("network", "\\ud800"), ("pod", "probe")))] == 3.0
    assert found[("ccl_test_ok", (("x", "a"),))] == 1.0
    assert found[("ccl_exporter_collector_success", (("collector", "hostile"),))] == 1.0
    assert (await client.get("/healthz")).status == 200


async def test_long_label_values_are_cut_without_merging_series(app_client) -> None:  # type: ignore[no-untyped-def]
    client = await app_client(create_app([HostileLabels()], process_metrics=False))
    text = await (await client.get("/metrics")).text()
    networks = {dict(labels)["network"]: v for (name, labels), v in samples(text).items() if name == "ccl_test_network"}
    assert len(networks) == 3, "two values that differ only after the cut stay two series"
    assert all(len(network) <= MAX_LABEL_VALUE_CHARS for network in networks)
    assert networks["IB"] == 3.0
    cut = sorted(n for n in networks if n != "IB")
    assert all(n.startswith("A" * 200) for n in cut) and cut[0] != cut[1]
    assert len(text) < 10_000, "the page no longer carries the 60 KB values"
    landing = await (await client.get("/")).text()
    assert "label values rewritten" in landing


async def test_metrics_are_gzipped_when_the_client_accepts_it(app_client) -> None:  # type: ignore[no-untyped-def]
    client = await app_client(create_app([Fixed("ok")]), auto_decompress=False)
    zipped = await client.get("/metrics", headers={"Accept-Encoding": "gzip"})
    assert zipped.headers["Content-Encoding"] == "gzip" and "Accept-Encoding" in zipped.headers["Vary"]
    page = gzip.decompress(await zipped.read()).decode()
    assert value(page, "ccl_test_ok", x="a") == 1.0
    plain = await client.get("/metrics", headers={"Accept-Encoding": "identity"})
    assert "Content-Encoding" not in plain.headers
    assert value((await plain.read()).decode(), "ccl_test_ok", x="a") == 1.0


def test_accept_encoding_negotiation() -> None:
    assert accepts_gzip("gzip") and accepts_gzip("deflate, gzip;q=0.5") and accepts_gzip("*")
    assert accepts_gzip("gzip, deflate, br") and accepts_gzip("x-gzip")
    assert not accepts_gzip("") and not accepts_gzip("identity") and not accepts_gzip("gzip;q=0")
    assert not accepts_gzip("gzip;q=0, *") and not accepts_gzip("br") and not accepts_gzip("gzip;q=oops")


@pytest.fixture
async def served() -> AsyncIterator:  # type: ignore[type-arg]
    """Start an app on 127.0.0.1 behind the real connection guard: call it with limits, get (port, server)."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(limits: ConnectionLimits):  # type: ignore[no-untyped-def]
            app = create_app([Fixed("ok")], process_metrics=False)
            server = await stack.enter_async_context(serving(app, "127.0.0.1", 0, limits))
            return server.port, server

        yield start


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    """True when the server closes the connection within ``seconds`` (whatever it sent first)."""

    async def drain() -> None:
        while await reader.read(65536):
            pass

    try:
        await asyncio.wait_for(drain(), seconds)
    except asyncio.TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


async def _get(port: int, path: str = "/healthz") -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())
    response = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return response


async def test_a_client_that_never_finishes_its_headers_is_closed(served) -> None:  # type: ignore[no-untyped-def]
    port, server = await served(ConnectionLimits(read_header_timeout_seconds=0.3, keepalive_timeout_seconds=30))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n")  # slowloris: the blank line never comes
    started = time.monotonic()
    assert await _closed_within(reader, 5.0), "a half-open request must not hold the connection"
    assert time.monotonic() - started >= 0.25
    assert server.guard.timed_out == 1 and server.guard.open_connections == 0
    assert (await _get(port)).startswith(b"HTTP/1.1 200"), "complete requests are still served"
    writer.close()


async def test_an_idle_keepalive_connection_is_closed(served) -> None:  # type: ignore[no-untyped-def]
    port, server = await served(ConnectionLimits(read_header_timeout_seconds=30, keepalive_timeout_seconds=0.4))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert (await asyncio.wait_for(reader.readuntil(b"ok\n"), 5)).startswith(b"HTTP/1.1 200")
    assert await _closed_within(reader, 5.0)
    assert server.guard.open_connections == 0
    writer.close()


async def test_connections_beyond_the_cap_shed_the_least_recently_active_idle_one(served) -> None:  # type: ignore[no-untyped-def]
    port, server = await served(ConnectionLimits(max_connections=3, read_header_timeout_seconds=30))
    idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
    await asyncio.sleep(0.1)
    assert server.guard.open_connections == 3
    assert (await _get(port)).startswith(b"HTTP/1.1 200"), "a new client gets in"
    assert await _closed_within(idle[0][0], 5.0), "the oldest idle connection made room"
    assert not await _closed_within(idle[2][0], 0.2)
    assert server.guard.open_connections <= 3 and server.guard.shed == 1
    for _, writer in idle:
        writer.close()


async def test_a_new_connection_is_refused_when_every_connection_is_busy() -> None:
    guard = ConnectionGuard(asyncio.get_running_loop(), ConnectionLimits(max_connections=2))
    first, second, third = (mock.Mock(name=f"transport{i}", **{"is_closing.return_value": False}) for i in range(3))
    assert guard.admit(first) and guard.admit(second)
    guard.request_started(first)
    guard.request_started(second)
    assert not guard.admit(third) and guard.refused == 1, "never queued beyond the cap"
    guard.request_finished(first)
    assert guard.admit(third) and guard.shed == 1
    first.abort.assert_called_once()
    second.abort.assert_not_called()
    assert guard.open_connections == 2
    for transport in (second, third):
        guard.forget(transport)


async def test_a_malformed_request_is_logged_as_one_line(served, caplog) -> None:  # type: ignore[no-untyped-def]
    port, _ = await served(ConnectionLimits())
    caplog.set_level(logging.INFO, logger="exporter.http.server")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: localhost\r\nNot a header line\r\n\r\n")
    assert b" 400 Bad Request" in (await asyncio.wait_for(reader.read(), 5)).split(b"\r\n")[0]
    writer.close()
    records = [r for r in caplog.records if r.name == "exporter.http.server"]
    assert len(records) == 1
    assert records[0].exc_info is None and "\n" not in records[0].getMessage()
    assert "127.0.0.1" in records[0].getMessage()
    assert not [r for r in caplog.records if r.exc_info], "no traceback anywhere"


def test_web_flags_are_validated_before_anything_starts() -> None:
    from exporter.commands import build_parser
    from exporter.commands.serve import _web_settings

    def settings(*flags: str) -> tuple[ConnectionLimits, int]:
        return _web_settings(build_parser(environ={}).parse_args(["serve", *flags]))

    limits, page = settings("--web.max-connections", "8", "--web.read-header-timeout", "2.5")
    assert limits.max_connections == 8 and limits.read_header_timeout_seconds == 2.5 and page == 4 * 1024 * 1024
    for flags in (("--web.max-page-bytes", "100"), ("--web.max-connections", "0"), ("--web.keepalive-timeout", "0")):
        with pytest.raises(SystemExit):
            settings(*flags)
    env_limits, env_page = _web_settings(
        build_parser(environ={"CCL_EXPORTER_WEB_MAX_PAGE_BYTES": "65536"}).parse_args(["serve"])
    )
    assert env_page == 65536 and env_limits == ConnectionLimits()


def test_an_address_in_use_is_one_error_line_and_exit_1(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "exporter",
                "serve",
                "--collector.disable-defaults",
                f"--web.listen-address=127.0.0.1:{port}",
                f"--path.state={tmp_path}",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr


class UndecodableDevice:
    """A partial RDMA read that names a device folder whose name is not UTF-8 (os.fsdecode's surrogate)."""

    name = "undecodable"

    def collect(self) -> Iterable[Metric]:
        from exporter.collectors.base import PartialCollection

        yield from Fixed("undecodable").collect()
        raise PartialCollection("cannot read /sys/class/infiniband/mlx5_\udcff/ports/1/state")


async def test_the_landing_page_survives_a_device_name_that_is_not_utf8(app_client) -> None:  # type: ignore[no-untyped-def]
    client = await app_client(create_app([UndecodableDevice()], process_metrics=False))
    assert (await client.get("/metrics")).status == 200
    landing = await client.get("/")
    assert landing.status == 200 and landing.headers["Content-Type"] == "text/html; charset=utf-8"
    assert "mlx5_\\udcff" in await landing.text()


class Counting:
    """Counts its collections; each takes ``seconds``."""

    name = "counting"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.collections = 0

    def collect(self) -> Iterable[Metric]:
        self.collections += 1
        time.sleep(self.seconds)
        yield from Fixed("counted", self.collections).collect()


async def test_concurrent_scrapes_share_builds_and_every_page_is_collected_after_its_request(app_client) -> None:  # type: ignore[no-untyped-def]
    counting = Counting(0.2)
    app = create_app([counting], process_metrics=False)
    client = await app_client(app)

    async def scrape() -> float:
        return value(await (await client.get("/metrics")).text(), "ccl_test_counted", x="a")

    first = asyncio.create_task(scrape())
    await asyncio.sleep(0.05)  # the first build is under way: the crowd waits for the next one
    crowd = await asyncio.gather(*(scrape() for _ in range(40)))
    assert await first == 1.0
    assert set(crowd) == {2.0}, "all 40 share the one build that started after they arrived"
    assert counting.collections == 2 and app.pages.builds == 2
    openmetrics = await client.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert (await openmetrics.text()).rstrip().endswith("# EOF"), "each format is built on its own"


async def test_a_collector_failing_the_same_way_every_scrape_is_logged_once(app_client, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.INFO, logger="exporter.collectors.umbrella")
    client = await app_client(create_app([UndecodableDevice(), Raising()], process_metrics=False))
    for _ in range(5):
        assert (await client.get("/metrics")).status == 200
    logged = [r for r in caplog.records if r.name == "exporter.collectors.umbrella"]
    assert sorted(r.levelname for r in logged) == ["ERROR", "WARNING"], [r.getMessage() for r in logged]
    assert "reader exploded" in (await (await client.get("/")).text()), "the landing page still says why"

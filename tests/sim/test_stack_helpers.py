"""Helpers of the e2e stack: durations, time compression of rules, Prometheus timestamps, configs, stand-ins."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.stack import (
    Intervals,
    ScrapeTarget,
    SimulatedExporter,
    alertmanager_config,
    duration_seconds,
    prometheus_config,
)
from devtools.timeline import parse_timestamp
from tests.e2e.harness import compress_time


def test_durations() -> None:
    assert duration_seconds("1h30m") == 5400
    assert duration_seconds("250ms") == 0.25
    assert duration_seconds("7d") == 7 * 86400
    for bad in ("", "5", "m5", "5x", "1h 30m"):
        with pytest.raises(ValueError):
            duration_seconds(bad)


def test_compress_time_divides_for_windows_subquery_steps_and_group_intervals_only() -> None:
    rules = (
        "  - name: fast\n"
        "    interval: 15s\n"
        "    rules:\n"
        "      - alert: Now\n"
        "        expr: x == 1\n"
        "        for: 0s\n"
        "  - name: slow\n"
        "    interval: 5m\n"
        "    rules:\n"
        "      - alert: A\n"
        "        expr: rate(x_total[5m]) > 1 and max_over_time(y[7d:10m]) == 1 and z[1h:] > 0 and w[1h] offset 23h\n"
        "        for: 15m\n"
        "        labels: {severity: warning}\n"
        "        annotations: {summary: 'for: 15m in text stays'}\n"
    )
    out = compress_time(rules, 60)
    assert "rate(x_total[5000ms])" in out
    assert "max_over_time(y[10080000ms:10000ms])" in out
    assert "z[60000ms:]" in out
    assert "w[60000ms] offset 1380000ms" in out
    assert "        for: 15000ms\n" in out
    assert "'for: 15m in text stays'" in out
    assert "        for: 0s\n" in out, "for: 0s fires on first sight, compressed or not"
    assert "    interval: 1000ms\n" in out, "15 s / 60 is floored at the 1 s evaluation interval"
    assert "    interval: 5000ms\n" in out
    assert "    interval: 2000ms\n" in compress_time(rules, 60, shortest_interval=2.0)


def test_parse_timestamp() -> None:
    assert parse_timestamp("2026-11-29T23:20:01.5Z") == parse_timestamp("2026-11-30T00:20:01.5+01:00")
    # the rules API's lastEvaluation, which bench/rule_cost.py reads
    assert parse_timestamp("2026-12-01T22:03:25.123456789Z") == pytest.approx(1796162605.123456)
    assert parse_timestamp("2026-11-29T23:20:01.123456789Z") % 1 == pytest.approx(0.123456789, abs=1e-6)
    with pytest.raises(ValueError):
        parse_timestamp("yesterday")


def test_configs_scrape_like_the_podmonitor_and_stay_on_loopback() -> None:
    config = prometheus_config(
        [ScrapeTarget("127.0.0.1:19400", {"node": "n1"})],
        [],
        "127.0.0.1:9093",
        Intervals(scrape_seconds=30, evaluation_seconds=30),
    )
    job = config["scrape_configs"][0]
    assert job["job_name"] == "ccl-exporter" and job["honor_labels"] is True
    assert job["static_configs"] == [{"targets": ["127.0.0.1:19400"], "labels": {"node": "n1"}}]
    assert config["global"]["scrape_timeout"] == "10000ms"
    route = alertmanager_config("http://127.0.0.1:1/alerts", Intervals.shipped())["route"]
    assert route["group_wait"] == "10000ms"  # the critical route of alerts/alertmanager.yml
    assert {"alertname", "namespace", "job_name", "node"} <= set(route["group_by"])


@pytest.mark.parametrize("logged", [False, True], ids=["kept output", "log file"])
def test_an_exporter_that_exits_at_start_says_why(tmp_path, logged: bool) -> None:  # type: ignore[no-untyped-def]
    """An e2e run once lost an exporter that exited 1 at start with nothing to say why: its
    output went nowhere. The error now carries the end of it."""
    exporter = SimulatedExporter(
        "gpu-node-1", extra_args=["--no-such-flag"], log_path=tmp_path / "exporter.log" if logged else None
    )
    with pytest.raises(RuntimeError, match=r"(?s)exited with 2: .*unrecognized arguments: --no-such-flag"):
        exporter.start()
    exporter.stop()


def test_a_killed_exporter_leaves_no_folder_behind() -> None:
    """An exporter killed on purpose (CclExporterAbsent's test) cannot remove its simulated
    node's folder; it lives in the exporter's own TMPDIR, which stop() removes."""
    exporter = SimulatedExporter("gpu-node-1")
    exporter.start()
    try:
        scratch = exporter._tmpdir
        assert scratch is not None and list(Path(scratch.name).glob("ccl-exporter-sim-*"))
        exporter.kill()
        assert list(Path(scratch.name).glob("ccl-exporter-sim-*")), "killed: nothing cleaned up"
    finally:
        exporter.stop()
    assert not Path(scratch.name).exists()

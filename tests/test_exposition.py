"""Our text renderer must be byte-identical to client_python's generate_latest."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import Histogram, ProcessCollector
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from exporter.exposition import render, render_text


class Awkward:
    def collect(self) -> Iterable[Metric]:
        g = GaugeMetricFamily("ccl_test_gauge", 'help with "quotes", back\\slash\nand newline', labels=["b", "a"])
        g.add_metric(['va"l', "x\\y\nz"], 1.5)
        g.add_metric(["", "ünïcode"], float("inf"))
        g.add_metric(["n", "n"], float("nan"))
        g.add_metric(["big", "v"], 1.2345678901234e20)
        g.add_metric(["small", "v"], 5e-7)
        yield g
        c = CounterMetricFamily("ccl_test_events", "events", labels=["k"], created=None)
        c.add_metric(["1"], 3.0)
        yield c
        c2 = CounterMetricFamily("ccl_test_with_created_total", "with created", labels=["k"])
        c2.add_metric(["1"], 3.0, created=1700000000.0)
        yield c2
        yield GaugeMetricFamily("ccl_test_unlabelled", "plain", value=-2)
        yield GaugeMetricFamily("ccl_test_empty", "no samples", labels=["x"])


def registry() -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(Awkward())
    ProcessCollector(registry=reg)
    Histogram("ccl_test_seconds", "a histogram", registry=reg).observe(0.3)
    return reg


def test_identical_to_generate_latest() -> None:
    reg = registry()
    ours = render_text(reg)
    theirs = generate_latest(reg)
    # process metrics move between the two calls; compare everything else exactly
    strip = lambda text: [l for l in text.decode().splitlines() if not l.startswith("process_")]  # noqa: E731
    assert strip(ours) == strip(theirs)


def test_content_types() -> None:
    reg = registry()
    assert render(reg, "")[1] == "text/plain; version=0.0.4; charset=utf-8"
    body, ctype = render(reg, "application/openmetrics-text; version=1.0.0")
    assert ctype.startswith("application/openmetrics-text") and body.endswith(b"# EOF\n")

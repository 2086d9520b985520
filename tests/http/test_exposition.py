"""Our text renderer must be byte-identical to client_python's generate_latest, and a page
must survive any one family: one that cannot be rendered, or one too large for the page."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import Histogram, ProcessCollector
from prometheus_client.exposition import choose_encoder, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.registry import CollectorRegistry
from prometheus_client.samples import Sample

from exporter.http import exposition
from exporter.http.exposition import (
    OMITTED_FAMILIES,
    PageRenderer,
    SeriesTexts,
    openmetrics_encoder,
    render,
    render_text,
    text_family,
)
from tests.metrics_text import OPENMETRICS_ACCEPTS, samples, value


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
    # process metrics move between the two calls; compare everything else exactly (our page
    # ends with its own count of omitted families)
    strip = lambda text: [  # noqa: E731
        line for line in text.decode().splitlines() if not line.startswith("process_") and OMITTED_FAMILIES not in line
    ]
    assert strip(ours) == strip(theirs)
    assert value(ours.decode(), OMITTED_FAMILIES, reason="page_size") == 0.0


def test_content_types() -> None:
    reg = registry()
    assert render(reg, "")[1] == "text/plain; version=0.0.4; charset=utf-8"
    body, ctype = render(reg, "application/openmetrics-text; version=1.0.0")
    assert ctype.startswith("application/openmetrics-text") and body.endswith(b"# EOF\n")


class Unencodable:
    """A collector outside the umbrella (so nothing sanitised its labels) with one bad family."""

    def collect(self) -> Iterable[Metric]:
        before = GaugeMetricFamily("ccl_test_before", "fine", labels=["x"])
        before.add_metric(["a"], 1.0)
        yield before
        bad = GaugeMetricFamily("ccl_test_bad_folder", "a folder named with an undecodable byte", labels=["pod"])
        bad.add_metric(["worker-\udcff"], 1.0)
        yield bad
        after = CounterMetricFamily("ccl_test_after", "fine", labels=["x"])
        after.add_metric(["b"], 2.0)
        yield after


@pytest.mark.parametrize("accept", ["", "application/openmetrics-text; version=1.0.0"])
def test_a_family_that_cannot_be_encoded_is_left_out_not_the_page(accept: str, caplog) -> None:  # type: ignore[no-untyped-def]
    reg = CollectorRegistry(auto_describe=False)
    reg.register(Unencodable())
    renderer = PageRenderer()
    for _ in range(2):
        body, _ = renderer.render(reg, accept)
    text = body.decode("utf-8")
    if accept:
        parsed = {s.name: s for f in parse_openmetrics(text) for s in f.samples}
        assert text.endswith("# EOF\n") and text.count("# EOF") == 1
        assert parsed["ccl_test_before"].value == 1.0 and parsed["ccl_test_after_total"].value == 2.0
        omitted = {
            s.labels["reason"]: s.value
            for f in parse_openmetrics(text)
            for s in f.samples
            if s.name == OMITTED_FAMILIES
        }
    else:
        assert value(text, "ccl_test_before", x="a") == 1.0 and value(text, "ccl_test_after_total", x="b") == 2.0
        omitted = {reason: value(text, OMITTED_FAMILIES, reason=reason) for reason in ("page_size", "render_error")}
    assert "ccl_test_bad_folder" not in text
    assert omitted == {"page_size": 0.0, "render_error": 1.0}
    said = [r for r in caplog.records if "ccl_test_bad_folder" in r.getMessage()]
    assert len(said) == 1, "logged once, not on every scrape"


class Sized:
    """Self-metrics, a small verdict family and families of chosen sizes, lazily."""

    def __init__(self, big_series: int, big_families: int = 1) -> None:
        self.big_series = big_series
        self.big_families = big_families

    def collect(self) -> Iterable[Metric]:
        build = GaugeMetricFamily("ccl_exporter_build_info", "version", labels=["version"])
        build.add_metric(["1.0"], 1.0)
        yield build
        for index in range(self.big_families):
            big = GaugeMetricFamily(f"ccl_test_big_{index}", "large", labels=["network"])
            for series in range(self.big_series):
                big.add_metric([f"{series:06d}" + "x" * 200], 1.0)
            yield big
        verdict = GaugeMetricFamily("ccl_nccl_tcp_fallback", "the verdict", labels=["pod"])
        verdict.add_metric(["worker-0"], 1.0)
        yield verdict


@pytest.mark.parametrize("accept", ["", "application/openmetrics-text; version=1.0.0"])
def test_the_page_stays_within_its_size_by_leaving_out_the_largest_family(accept: str) -> None:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(Sized(big_series=200))  # ~42 KB
    body, _ = PageRenderer(max_page_bytes=16 * 1024).render(reg, accept)
    text = body.decode()
    assert len(body) <= 16 * 1024
    assert "ccl_test_big_0" not in text
    assert "ccl_nccl_tcp_fallback" in text and "ccl_exporter_build_info" in text, "small families and self-metrics stay"
    assert f'{OMITTED_FAMILIES}{{reason="page_size"}} 1.0' in text
    roomy, _ = PageRenderer(max_page_bytes=1 << 20).render(reg, accept)
    assert b"ccl_test_big_0" in roomy and f'{OMITTED_FAMILIES}{{reason="page_size"}} 0.0'.encode() in roomy


def test_a_render_holds_at_most_the_page_budget_plus_one_family() -> None:
    """40 families of ~210 KB each (8 MB in all) with a 256 KiB page: one fits, memory stays near the page."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(Sized(big_series=1000, big_families=40))
    renderer = PageRenderer(max_page_bytes=256 * 1024)
    tracemalloc.start()
    try:
        body, _ = renderer.render(reg, "")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(body) <= 256 * 1024
    assert samples(body.decode())[(OMITTED_FAMILIES, (("reason", "page_size"),))] == 39.0
    assert peak < 3 * 1024 * 1024, f"peak {peak} bytes: the render kept more than the page and one family"


def test_text_family_matches_generate_latest_for_one_family() -> None:
    family = GaugeMetricFamily("ccl_test_one", "one", labels=["a"])
    family.add_metric(['q"uote'], 2.0)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(type("One", (), {"collect": lambda self: [family]})())
    assert text_family(family) == generate_latest(reg)


_LABEL_TEXT = st.text(alphabet=st.sampled_from(list('ab{}"\\\n =,é🙂') + ["x"]), max_size=6)


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.permutations(["zone", "a", "mid"]),
            st.lists(_LABEL_TEXT, min_size=3, max_size=3),
            st.floats(allow_nan=False) | st.sampled_from([0.0, 1e6, 123456789.0, -1e-7]),
        ),
        max_size=8,
    ),
    unlabelled=st.booleans(),
)
def test_text_family_matches_generate_latest_whatever_the_labels(
    rows: list[tuple[list[str], list[str], float]], unlabelled: bool
) -> None:
    """Label values with braces, quotes, backslashes and newlines, label dicts in any order, and
    samples of one family with and without labels: byte for byte what client_python writes."""
    family = GaugeMetricFamily("ccl_test_many", "many", labels=[])
    for names, values, number in rows:
        family.samples.append(Sample("ccl_test_many", dict(zip(names, values, strict=True)), number))
        if unlabelled:
            family.samples.append(Sample("ccl_test_many", {}, number))
    reg = CollectorRegistry(auto_describe=False)
    reg.register(type("Many", (), {"collect": lambda self: [family]})())
    assert text_family(family) == generate_latest(reg)
    for accept in OPENMETRICS_ACCEPTS:
        encoder, _ = choose_encoder(accept)
        assert openmetrics_encoder(encoder)(family) + b"# EOF\n" == encoder(reg)


def _one(family: Metric) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(type("One", (), {"collect": lambda self: [family]})())
    return reg


def _odd_families() -> list[Metric]:
    """Families our loop leaves to client_python, or writes differently in each format."""
    untyped = Metric("ccl_test_untyped", 'an "untyped" one\\', "unknown")
    untyped.add_sample("ccl_test_untyped", {"a": "1"}, 3.0)
    with_unit = GaugeMetricFamily("ccl_test_seconds", "with a unit", value=1.5, unit="seconds")
    created = CounterMetricFamily(
        "ccl_test_events", "a counter with its creation time", value=2.0, created=1700000000.0
    )
    colon = GaugeMetricFamily("ccl:test_ratio", "a recording-rule style name", value=0.5)
    stamped = GaugeMetricFamily("ccl_test_stamped", "a sample with a timestamp", labels=["x"])
    stamped.add_metric(["y"], 1.0, timestamp=1700000000.5)
    stranger = GaugeMetricFamily("ccl_test_gauge", "a sample named for another family", labels=[])
    stranger.samples.append(Sample("ccl_test_other", {}, 4.0))
    return [untyped, with_unit, created, colon, stamped, stranger]


@pytest.mark.parametrize("index", range(len(_odd_families())))
def test_families_our_loop_does_not_write_alike_come_out_as_client_python_writes_them(index: int) -> None:
    family = _odd_families()[index]
    assert text_family(family) == generate_latest(_one(family))
    for accept in OPENMETRICS_ACCEPTS:
        encoder, _ = choose_encoder(accept)
        assert openmetrics_encoder(encoder)(family) + b"# EOF\n" == encoder(_one(family))


def test_a_page_in_openmetrics_is_what_client_python_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole page, for what Prometheus sends, from our loop and from client_python alone."""
    families = _odd_families()
    rows = GaugeMetricFamily("ccl_test_ports", 'port "facts"', labels=["device", "port"])
    for port in range(20):
        rows.add_metric([f"mlx5_{port}", "1"], float(port) * 1e9)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(type("Page", (), {"collect": lambda self: [rows, *families]})())
    for accept in OPENMETRICS_ACCEPTS:
        ours = PageRenderer().render(reg, accept)
        with monkeypatch.context() as patched:
            patched.setattr(exposition, "_plain_openmetrics", lambda encoder: False)
            theirs = PageRenderer().render(reg, accept)
        assert ours == theirs
        assert ours[0].endswith(b"# EOF\n") and ours[0].count(b"# EOF") == 1


def test_the_headers_and_label_names_a_renderer_keeps_stay_bounded() -> None:
    """Families whose help text or label names change on every scrape (a collector that puts a
    value in either) are rendered right, and what is kept of them never grows past its bound."""
    renderer = PageRenderer()
    for scrape in range(3 * SeriesTexts.MAX_FAMILIES):
        family = GaugeMetricFamily("ccl_test_shifting", f"help {scrape}", labels=[f"l{scrape}", "pod"])
        family.add_metric(["a", "b"], float(scrape))
        assert renderer.text_family(family) == text_family(family)
        kept = renderer._series
        assert len(kept._headers) <= SeriesTexts.MAX_FAMILIES and len(kept._label_names) <= SeriesTexts.MAX_FAMILIES


def test_the_series_texts_a_renderer_keeps_stay_within_their_share_of_a_page() -> None:
    """Label values that change on every scrape (a hostile pod) refill the store, never grow it."""
    renderer = PageRenderer(max_page_bytes=64 * 1024)
    for scrape in range(30):
        family = GaugeMetricFamily("ccl_test_churn", "churn", labels=["pod"])
        for series in range(200):
            family.add_metric([f"pod-{scrape}-{series}"], 1.0)
        reg = CollectorRegistry(auto_describe=False)
        reg.register(type("Churn", (), {"collect": lambda self, family=family: [family]})())
        body, _ = renderer.render(reg, "")
        assert body.count(b"ccl_test_churn{") == 200
        kept = renderer._series
        assert kept._chars <= kept.max_chars == 16 * 1024
        assert sum(len(text) for text in kept._texts.values()) == kept._chars

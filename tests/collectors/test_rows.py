"""RowFamily: the same series as client_python's families, on every path a family takes.

A family built as rows must read, sanitize, sort and render exactly as the same series built
with ``GaugeMetricFamily`` / ``CounterMetricFamily``: in text format 0.0.4 byte for byte as
client_python's ``generate_latest`` writes the sample-built family, in OpenMetrics through its
``samples`` view, and through the umbrella's checks with the same verdicts.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.exposition import choose_encoder, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.registry import CollectorRegistry

from exporter.collectors.rows import RowFamily
from exporter.collectors.umbrella import MAX_LABEL_VALUE_CHARS, sanitize_families
from exporter.http.exposition import PageRenderer, openmetrics_encoder, text_family
from tests.metrics_text import OPENMETRICS_ACCEPTS


def _registry(*families: Metric) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(type("Families", (), {"collect": lambda self: list(families)})())
    return registry


def _both(kind: str, names: list[str], rows: list[tuple[list[str], float]]) -> tuple[RowFamily, Metric]:
    """The same series as a RowFamily and as client_python's own family type."""
    as_rows = RowFamily("ccl_test_rows", 'help with "quotes" and \\ back\nslash', kind, names)  # type: ignore[arg-type]
    classic: Metric = (GaugeMetricFamily if kind == "gauge" else CounterMetricFamily)(
        "ccl_test_rows", 'help with "quotes" and \\ back\nslash', labels=names
    )
    for labels, value in rows:
        as_rows.add(labels, value)
        classic.add_metric(labels, value)  # type: ignore[attr-defined]
    return as_rows, classic


_VALUE_TEXT = st.text(alphabet=st.sampled_from(list('ab{}"\\\n =,é\udcff')), max_size=5) | st.sampled_from(
    ["mlx5_1", "mlx5_10", "", "x" * (MAX_LABEL_VALUE_CHARS + 3)]
)
_NUMBERS = (
    st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([0.0, -0.0, 1.0, 1e6, 1234567.0, 123456789.0, 1e21, 5e-7, -1e-7, 2.0**64])
    | st.integers(min_value=0, max_value=2**64).map(float)
)


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(["gauge", "counter"]),
    names=st.sampled_from([[], ["device"], ["device", "port"], ["port", "device", "counter"], ["zz", "a", "m"]]),
    data=st.data(),
)
def test_rows_render_byte_for_byte_as_client_python_writes_the_same_samples(
    kind: str, names: list[str], data: st.DataObject
) -> None:
    rows = data.draw(
        st.lists(st.tuples(st.lists(_VALUE_TEXT, min_size=len(names), max_size=len(names)), _NUMBERS), max_size=8)
    )
    as_rows, classic = _both(kind, names, rows)
    [kept_rows] = sanitize_families([as_rows]).families or [None]
    [kept_classic] = sanitize_families([classic]).families or [None]
    if not rows:
        assert kept_rows is None and kept_classic is None, "a family without series is left out either way"
        return
    assert isinstance(kept_rows, RowFamily)
    assert kept_rows.samples == kept_classic.samples, "same order, same rewrites"
    expected = generate_latest(_registry(kept_classic))
    renderer = PageRenderer()
    for _ in range(2):  # the second time from the series texts the renderer kept
        assert renderer.text_family(kept_rows) == expected
    assert text_family(kept_rows) == expected
    assert generate_openmetrics(_registry(kept_rows)) == generate_openmetrics(_registry(kept_classic))
    for accept in OPENMETRICS_ACCEPTS:
        encoder, _ = choose_encoder(accept)
        assert openmetrics_encoder(encoder, renderer._series)(kept_rows) + b"# EOF\n" == encoder(
            _registry(kept_classic)
        )


def test_label_values_are_kept_in_sorted_label_name_order_whatever_order_they_were_declared_in() -> None:
    family = RowFamily("ccl_test_order", "order", "counter", ["port", "device", "counter"])
    family.add(["1", "mlx5_0", "symbol_error"], 3)
    assert family.name == "ccl_test_order" and family.sample_name == "ccl_test_order_total"
    assert family.label_names == ("counter", "device", "port")
    assert family.keys == [("symbol_error", "mlx5_0", "1")]
    [sample] = family.samples
    assert sample.name == "ccl_test_order_total"
    assert sample.labels == {"port": "1", "device": "mlx5_0", "counter": "symbol_error"}
    assert RowFamily("ccl_test_x_total", "x", "counter", []).name == "ccl_test_x", "as CounterMetricFamily does"


def test_a_row_with_the_wrong_number_of_values_and_repeated_label_names_are_refused() -> None:
    family = RowFamily("ccl_test_shape", "shape", "gauge", ["device", "port"])
    with pytest.raises(ValueError, match="1 label values for 2"):
        family.add(["mlx5_0"], 1.0)
    with pytest.raises(ValueError, match="repeated"):
        RowFamily("ccl_test_shape", "shape", "gauge", ["device", "device"])
    with pytest.raises(TypeError):
        family.samples = [object()]  # type: ignore[list-item]


def test_the_umbrella_holds_rows_to_the_rules_it_holds_samples_to() -> None:
    non_numeric = RowFamily("ccl_test_bad_value", "x", "gauge", ["a"])
    non_numeric.add(["v"], "NaN please")  # type: ignore[arg-type]
    non_string = RowFamily("ccl_test_bad_label", "x", "gauge", ["a", "b"])
    non_string.add(["v", 7], 1.0)  # type: ignore[list-item]
    boolean = RowFamily("ccl_test_bool", "x", "gauge", ["a"])
    boolean.add(["v"], True)
    integer = RowFamily("ccl_test_int", "x", "gauge", ["a"])
    integer.add(["v"], 3)
    long_and_broken = RowFamily("ccl_test_rewritten", "x", "gauge", ["pod", "note"])
    long_and_broken.add(["bad\udcff", "x" * (MAX_LABEL_VALUE_CHARS + 1)], 1.0)
    long_and_broken.add(["plain", "ok"], 2.0)
    result = sanitize_families([non_numeric, non_string, boolean, integer, long_and_broken])
    assert result.problems == [
        "ccl_test_bad_value: non-numeric value 'NaN please'",
        "ccl_test_bad_label: non-string value for label 'b'",
        "ccl_test_bool: non-numeric value True",
    ]
    kept = {family.name: family for family in result.families}
    assert set(kept) == {"ccl_test_int", "ccl_test_rewritten"}
    assert kept["ccl_test_int"].values == [3.0] and type(kept["ccl_test_int"].values[0]) is float
    by_value = {s.value: s.labels for s in kept["ccl_test_rewritten"].samples}
    assert by_value[1.0]["pod"] == "bad\\xff"
    assert len(by_value[1.0]["note"]) == MAX_LABEL_VALUE_CHARS and "...#" in by_value[1.0]["note"]
    assert by_value[2.0] == {"pod": "plain", "note": "ok"}
    assert result.rewritten_values == 2


def test_go_float_formatting_agrees_with_client_python_at_the_edges() -> None:
    edges = [math.inf, -math.inf, math.nan, 999999.0, 1000000.0, 1234567.0, 12345678.9, -1234567.0, 1e16, 1.5e300]
    family = RowFamily("ccl_test_edges", "edges", "gauge", ["i"])
    classic = GaugeMetricFamily("ccl_test_edges", "edges", labels=["i"])
    for index, number in enumerate(edges):
        family.add([f"{index:02d}"], number)
        classic.add_metric([f"{index:02d}"], number)
    assert text_family(family) == generate_latest(_registry(classic))

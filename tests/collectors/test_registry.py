"""The umbrella's sanitizing of metric families: sample order and label rewrites."""

from __future__ import annotations

import random

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily

from exporter.collectors.umbrella import MAX_LABEL_VALUE_CHARS, sanitize_families


def _reference_order(samples: list) -> list:  # type: ignore[type-arg]
    return sorted(samples, key=lambda s: (s.name, sorted(s.labels.items())))


def _shuffled_family(rng: random.Random, labels: list[str]) -> CounterMetricFamily:
    family = CounterMetricFamily("ccl_test_shuffled", "test", labels=labels)
    values = ["", "a", "b", "mlx5_1", "mlx5_10", "mlx5_2", "port_rcv_errors", "symbol_error"]
    for _ in range(60):
        family.add_metric([rng.choice(values) for _ in labels], float(rng.randint(0, 3)))
    return family


def test_samples_are_ordered_by_name_then_sorted_labels() -> None:
    rng = random.Random(12)
    for labels in ([], ["device"], ["device", "port"], ["port", "device", "counter"], ["zz", "a", "m", "b"]):
        family = _shuffled_family(rng, labels)
        expected = _reference_order(list(family.samples))
        [kept] = sanitize_families([family]).families
        assert kept.samples == expected, labels


def test_samples_with_different_label_names_in_one_family_are_ordered_the_same_way() -> None:
    family = GaugeMetricFamily("ccl_test_mixed", "test")
    rng = random.Random(3)
    for _ in range(40):
        names = rng.sample(["a", "b", "c"], rng.randint(0, 3))
        family.add_sample("ccl_test_mixed", {name: rng.choice("xyz") for name in names}, 1.0)
    expected = _reference_order(list(family.samples))
    [kept] = sanitize_families([family]).families
    assert kept.samples == expected


def test_only_unsafe_label_values_are_rewritten_and_counted() -> None:
    family = GaugeMetricFamily("ccl_test_labels", "test", labels=["pod", "note"])
    family.add_metric(["plain", "é ascii-free but valid"], 1.0)
    family.add_metric(["bad\udcff", "x" * (MAX_LABEL_VALUE_CHARS + 1)], 2.0)
    family.add_metric(["plain2", "ok"], 3.0)
    result = sanitize_families([family])
    by_value = {s.value: s.labels for s in result.families[0].samples}
    assert by_value[1.0] == {"pod": "plain", "note": "é ascii-free but valid"}
    assert by_value[2.0]["pod"] == "bad\\xff"
    assert len(by_value[2.0]["note"]) == MAX_LABEL_VALUE_CHARS and "...#" in by_value[2.0]["note"]
    assert by_value[3.0] == {"pod": "plain2", "note": "ok"}
    assert result.rewritten_values == 2
    assert result.first_rewrite.startswith("ccl_test_labels{pod=")

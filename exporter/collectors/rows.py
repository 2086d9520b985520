"""``RowFamily``: a gauge or counter family kept as rows, for collectors with many series a scrape.

A node's RDMA ports make a few hundred series every scrape. Built as client_python ``Sample``s,
each costs a named tuple and a label dict, then a check, a sort key and a render label by label;
together that was a third of a scrape. A ``RowFamily`` keeps each series as a tuple of label
values and a float, so the umbrella checks and sorts a family at a time
(``exporter.collectors.umbrella``) and the text renderer writes it from the series texts it
kept from the last page (``exporter.http.exposition``).

``samples`` is client_python's view of the same rows, built when it is read, so the OpenMetrics
encoder, tests and any other consumer of a ``Metric`` see an ordinary family.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, KeysView, Sequence
from typing import Literal

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample


class RowFamily(Metric):
    """A gauge or counter whose series all have the same label names.

    ``label_names`` are kept sorted, and each row's label values (``keys``) in that order, which
    is the order the text format writes them and the order rows sort in; ``add`` takes values in
    the order the family was declared with. A counter's name loses a ``_total`` suffix and its
    series gain it, as with ``CounterMetricFamily``.
    """

    def __init__(self, name: str, documentation: str, typ: Literal["gauge", "counter"], labels: Sequence[str]) -> None:
        if typ == "counter" and name.endswith("_total"):
            name = name[: -len("_total")]
        super().__init__(name, documentation, typ)
        self.sample_name = name + "_total" if typ == "counter" else name
        self.label_names: tuple[str, ...] = tuple(sorted(labels))
        if len(set(labels)) != len(self.label_names):
            raise ValueError(f"{name}: repeated label name in {list(labels)}")
        self._in_order: Callable[[Sequence[str]], tuple[str, ...]] = tuple
        if list(labels) != list(self.label_names) and len(labels) > 1:
            self._in_order = operator.itemgetter(*(list(labels).index(label) for label in self.label_names))
        self.keys: list[tuple[str, ...]] = []
        self.values: list[float] = []

    def add(self, labels: Sequence[str], value: float) -> None:
        """One series: its label values in the declared order, and its value."""
        if len(labels) != len(self.label_names):
            raise ValueError(f"{self.name}: {len(labels)} label values for {len(self.label_names)} label names")
        self.keys.append(self._in_order(labels))
        self.values.append(value)

    @property
    def samples(self) -> list[Sample]:
        names = self.label_names
        return [
            Sample(self.sample_name, dict(zip(names, key, strict=True)), value)
            for key, value in zip(self.keys, self.values, strict=True)
        ]

    @samples.setter
    def samples(self, samples: list[Sample]) -> None:
        if samples:  # Metric.__init__ sets an empty list; rows are added with add()
            raise TypeError(f"{self.name}: a RowFamily's series are added with add(), not through samples")


def shared_label_names(samples: Sequence[Sample]) -> KeysView[str] | None:
    """The label names every one of ``samples`` has (the shape a ``RowFamily`` keeps), or None
    when there are no samples or their label names differ."""
    if not samples:
        return None
    names = samples[0].labels.keys()
    for sample in samples:
        if sample.labels.keys() != names:
            return None
    return names

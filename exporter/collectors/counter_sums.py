"""Sums of counters over the parts of a whole (a GPU's NVLinks, a node's RDMA ports) that only
ever grow, as counters must.

Rules that read one sum per GPU or node instead of every link's or port's counter cost a
fleet's Prometheus a fraction (docs/scaling.md). A plain sum would fall when a part's counter
resets or a part disappears, and ``rate`` would take the fall for a reset of the sum. So each
sum starts as its parts' sum when the whole is first seen, and then grows by each part's
increase since the reading before: a part whose counter went back counts from zero (what
``rate`` does with a reset), a part not read this time adds nothing and keeps its last value,
and a part first read later starts from its value then.

State is one number per (whole, part, counter) and one total per (whole, counter): bounded by
what the node has. A whole missing from a complete reading is gone and forgotten; one missing
because its read failed keeps its totals for when it is back.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping

# One reading of a whole's parts: (part, {counter name: value}) for each part read.
PartCounters = Iterable[tuple[Hashable, Mapping[str, float]]]


class CounterSums:
    def __init__(self) -> None:
        self._last: dict[Hashable, dict[Hashable, dict[str, float]]] = {}
        self._totals: dict[Hashable, dict[str, float]] = {}

    def update(self, wholes: Mapping[Hashable, PartCounters], complete: bool) -> dict[Hashable, dict[str, float]]:
        """Fold one reading in; the totals (counter name -> value) of each whole read."""
        seen: dict[Hashable, dict[str, float]] = {}
        for whole, parts in wholes.items():
            last = self._last.setdefault(whole, {})
            totals = self._totals.setdefault(whole, {})
            starting: set[str] = set()  # counters first seen now: they start at their parts' sum
            for part, counters in parts:
                last_of_part = last.setdefault(part, {})
                for counter, raw in counters.items():
                    value = float(raw)
                    previous = last_of_part.get(counter)
                    if counter not in totals or counter in starting:
                        starting.add(counter)
                        totals[counter] = totals.get(counter, 0.0) + value
                    elif previous is not None:  # a part first read later starts from its value then
                        totals[counter] += value - previous if value >= previous else value
                    last_of_part[counter] = value
            seen[whole] = dict(totals)
        if complete:
            for whole in set(self._totals) - set(seen):
                del self._totals[whole]
                self._last.pop(whole, None)
        return seen

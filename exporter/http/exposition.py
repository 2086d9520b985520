"""Render a registry for one request, honouring ``Accept`` (OpenMetrics or text 0.0.4).

The classic text format and OpenMetrics (what Prometheus asks for first) are rendered by our
own loop, byte-identical to client_python's ``generate_latest`` and its OpenMetrics writer for
the families we build (gauges, counters, untyped; valid names; no timestamps, exemplars or
units), and several times faster: a 16-port RDMA node has ~500 samples, and the per-sample
work of client_python's writers was a third of the scrape (in OpenMetrics, half of it). Any
family our loop does not handle, and OpenMetrics with an escaping that rewrites names, is
rendered by client_python itself.

A page is assembled one family at a time, so that no single family can take it down:

* a family that fails to render (a label value that is not valid UTF-8 slipped past the
  umbrella's sanitising, a broken custom collector) is left out, logged once, and counted;
* the page never grows past ``max_page_bytes``: while it would, the largest family rendered so
  far is left out (never a ``ccl_exporter_*`` self-metric), so a hostile pod that inflates
  one family loses that family, not the verdicts next to it. A render holds at most
  ``max_page_bytes`` plus the one family being rendered.

Between pages, a renderer keeps the text of each series it wrote (``name{labels}``, at most a
quarter of a page in all) and each family's HELP and TYPE lines, so a scrape of series whose
labels did not change formats only their values.

``ccl_exporter_families_omitted{reason}`` at the end of every page says how many families
were left out of it, by reason (``page_size``, ``render_error``).
"""

from __future__ import annotations

import functools
import heapq
import logging
import operator
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client.exposition import choose_encoder, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.openmetrics import exposition as openmetrics_exposition
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from exporter.collectors.rows import RowFamily, shared_label_names

log = logging.getLogger(__name__)

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_MAX_PAGE_BYTES = 4 * 1024 * 1024
OMITTED_FAMILIES = "ccl_exporter_families_omitted"
OMITTED_REASONS = ("page_size", "render_error")
SELF_METRIC_PREFIX = "ccl_exporter_"
_OPENMETRICS_EOF = b"# EOF\n"
_RESERVED_BYTES = 512  # room kept for the omitted-families gauge and the OpenMetrics EOF
MIN_PAGE_BYTES = 2 * _RESERVED_BYTES
SERIES_TEXTS_SHARE = 4  # the series texts a renderer keeps add up to at most this fraction of a page
_MAX_REPORTED = 1024  # family names remembered as already logged
_LEGACY_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LEGACY_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_FAST_TYPES = {"gauge": "gauge", "counter": "counter", "unknown": "untyped"}

FamilyEncoder = Callable[[Metric], bytes]
_Key = TypeVar("_Key")
_Value = TypeVar("_Value")


class _OneFamily:
    def __init__(self, family: Metric) -> None:
        self._family = family

    def collect(self) -> Iterable[Metric]:
        return [self._family]


def _escape_value(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


class SeriesTexts:
    """The rendered ``name{labels}`` of series seen on recent pages, so that a series whose labels
    have not changed since the last scrape costs one lookup, not a label-by-label format; and,
    as they repeat from page to page too, each family's HELP and TYPE lines and which label
    names are valid.

    Bounded: a text longer than ``MAX_TEXT_CHARS`` is not kept (long label values are rare), and
    once the texts kept add up to ``max_chars`` the store is emptied and refilled, so series of
    pods long gone do not stay; headers and label names likewise past ``MAX_FAMILIES``. Safe to
    share between threads (dicts read and written under the GIL; two threads adding at once at
    worst miscount the characters held).
    """

    MAX_TEXT_CHARS = 256
    MAX_FAMILIES = 1024

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self._chars = 0
        self._texts: dict[tuple[str, tuple[str, ...], str | tuple[str, ...]], str] = {}
        self._headers: dict[tuple[str, str, str, str, bool], str | None] = {}
        self._label_names: dict[tuple[str, ...], tuple[str, ...] | None] = {}

    def header(self, family: Metric, openmetrics: bool = False) -> str | None:
        """``_header(family, openmetrics)``, kept for the next page."""
        key = (family.name, family.type, family.documentation, family.unit, openmetrics)
        return _kept(self._headers, key, lambda: _header(family, openmetrics), self.MAX_FAMILIES)

    def label_names(self, names: Iterable[str]) -> tuple[str, ...] | None:
        """``_valid_label_names(names)``, kept for the next page."""
        key = tuple(names)
        return _kept(self._label_names, key, lambda: _valid_label_names(key), self.MAX_FAMILIES)

    def text(self, name: str, names: tuple[str, ...], values: str | tuple[str, ...]) -> str:
        """``name{a="1",b="2"} `` for label ``names`` (sorted, valid) and their ``values`` (a str
        when there is one name, else a tuple in the same order)."""
        key = (name, names, values)
        found = self._texts.get(key)
        if found is not None:
            return found
        spelled = (values,) if isinstance(values, str) else values
        parts = ",".join(f'{n}="{_escape_value(v)}"' for n, v in zip(names, spelled, strict=True))
        text = f"{name}{{{parts}}} "
        if len(text) <= min(self.MAX_TEXT_CHARS, self.max_chars):
            if self._chars + len(text) > self.max_chars:
                self._texts.clear()
                self._chars = 0
            self._texts[key] = text
            self._chars += len(text)
        return text


def _kept(store: dict[_Key, _Value], key: _Key, make: Callable[[], _Value], limit: int) -> _Value:
    """``store[key]``, made and kept first when absent; the store is emptied past ``limit``."""
    try:
        return store[key]
    except KeyError:
        found = store[key] = make()
        if len(store) > limit:
            store.clear()
        return found


def _valid_label_names(names: Iterable[str]) -> tuple[str, ...] | None:
    """``names`` sorted, or None when one is not a valid (legacy) label name."""
    ordered = tuple(sorted(names))
    if not all(isinstance(name, str) and _LEGACY_LABEL.match(name) for name in ordered):
        return None
    return ordered


def _header(family: Metric, openmetrics: bool = False) -> str | None:
    """The HELP and TYPE lines of a family our loop can write, or None when it needs client_python.

    Text 0.0.4 names a counter's lines ``<name>_total`` and escapes backslashes and newlines in
    the help; OpenMetrics names them ``<name>``, writes the type as the family has it
    (``unknown``, not ``untyped``) and escapes double quotes too. Names with ``:`` are left to
    client_python in OpenMetrics, whose default escaping rewrites them in sample names.
    """
    mtype = _FAST_TYPES.get(family.type)
    if mtype is None or not _LEGACY_NAME.match(family.name):
        return None
    doc = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
    if openmetrics:
        if family.unit or ":" in family.name:
            return None
        doc = doc.replace('"', r"\"")
        return f"# HELP {family.name} {doc}\n# TYPE {family.name} {family.type}\n"
    name = family.name + "_total" if mtype == "counter" else family.name
    return f"# HELP {name} {doc}\n# TYPE {name} {mtype}\n"


def _lines(header: str, prefixes: list[str], numbers: list[str]) -> list[str]:
    """The header, then one line per series: its ``name{labels} `` and its number."""
    if not prefixes:
        return [header]
    return [header, "\n".join(map(str.__add__, prefixes, numbers)), "\n"]


def _fast_lines(family: Metric, series: SeriesTexts, openmetrics: bool = False) -> list[str] | None:
    """The family's lines, or None when it needs client_python's general renderer."""
    header = series.header(family, openmetrics)
    if header is None:
        return None
    samples = family.samples
    if not samples:
        return [header]
    own_names = (family.name, family.name + "_total")  # a gauge's, an untyped family's, a counter's
    for sample in samples:
        if sample.timestamp is not None or sample.exemplar is not None or sample.name not in own_names:
            return None
    shared = shared_label_names(samples)
    names = None if shared is None else series.label_names(shared)
    if names is None:
        return _mixed_label_lines(samples, [header])
    if not names:
        prefixes = [sample.name + " " for sample in samples]
    else:
        values = operator.itemgetter(*names)
        text = series.text
        prefixes = [text(sample.name, names, values(sample.labels)) for sample in samples]
    return _lines(header, prefixes, _go_floats([sample.value for sample in samples]))


def _mixed_label_lines(samples: Sequence[Sample], lines: list[str]) -> list[str] | None:
    """The lines of samples whose label names differ from one sample to the next."""
    label_ok: set[str] = set()
    for sample in samples:
        if sample.labels:
            parts = []
            for key in sorted(sample.labels):
                if key not in label_ok:
                    if not _LEGACY_LABEL.match(key):
                        return None
                    label_ok.add(key)
                parts.append(f'{key}="{_escape_value(sample.labels[key])}"')
            lines.append(f"{sample.name}{{{','.join(parts)}}} {floatToGoString(sample.value)}\n")
        else:
            lines.append(f"{sample.name} {floatToGoString(sample.value)}\n")
    return lines


def _go_floats(values: Sequence[float]) -> list[str]:
    """``floatToGoString`` of each float, with ``repr`` doing the work where the two agree (all
    but infinities, NaN and numbers of seven or more integer digits, which Go writes with an
    exponent)."""
    if set(map(type, values)) - {float}:
        return [floatToGoString(value) for value in values]
    texts = list(map(repr, values))
    for index, text in enumerate(texts):
        if len(text) > 8 or text[-1] in "fn":
            texts[index] = floatToGoString(values[index])
    return texts


def _row_lines(family: RowFamily, series: SeriesTexts, openmetrics: bool = False) -> list[str] | None:
    """The lines of a ``RowFamily`` (its rows checked and sorted by the umbrella), or None when it
    needs client_python's general renderer."""
    header = series.header(family, openmetrics)
    names = family.label_names
    if header is None or series.label_names(names) is None:
        return None
    name = family.sample_name
    if names:
        text = series.text
        prefixes = [text(name, names, key) for key in family.keys]
    else:
        prefixes = [name + " "] * len(family.keys)
    return _lines(header, prefixes, _go_floats(family.values))


def _family_lines(family: Metric, series: SeriesTexts, openmetrics: bool) -> list[str] | None:
    if isinstance(family, RowFamily):
        return _row_lines(family, series, openmetrics)
    return _fast_lines(family, series, openmetrics)


def text_family(family: Metric, series: SeriesTexts | None = None) -> bytes:
    """One family in text format 0.0.4; raises when it cannot be encoded. ``series`` keeps the
    texts of series between calls (a renderer's); without it, nothing is kept."""
    lines = _family_lines(family, SeriesTexts(max_chars=0) if series is None else series, openmetrics=False)
    if lines is None:
        return generate_latest(_OneFamily(family))
    return "".join(lines).encode("utf-8")


def openmetrics_encoder(encoder: Callable[[Collector], bytes], series: SeriesTexts | None = None) -> FamilyEncoder:
    """What writes one family in OpenMetrics as client_python's ``encoder`` (from
    ``choose_encoder``) writes it, without ``# EOF``: our loop where it writes the same bytes, else
    ``encoder``. ``series`` keeps the texts of series between calls (a renderer's)."""
    fallback = _client_python_family(encoder)
    if not _plain_openmetrics(encoder):
        return fallback
    kept = SeriesTexts(max_chars=0) if series is None else series

    def encode(family: Metric) -> bytes:
        lines = _family_lines(family, kept, openmetrics=True)
        return fallback(family) if lines is None else "".join(lines).encode("utf-8")

    return encode


def _plain_openmetrics(encoder: Callable[[Collector], bytes]) -> bool:
    """Whether ``encoder`` is client_python's OpenMetrics writer with an escaping that leaves
    valid legacy names as they are (``underscores``, the default, or ``allow-utf-8``)."""
    return (
        isinstance(encoder, functools.partial)
        and encoder.func is openmetrics_exposition.generate_latest
        and encoder.keywords.get("escaping") in (openmetrics_exposition.UNDERSCORES, openmetrics_exposition.ALLOWUTF8)
    )


def _client_python_family(encoder: Callable[[Collector], bytes]) -> FamilyEncoder:
    """client_python's ``encoder`` applied to one family, without OpenMetrics' ``# EOF``."""

    def encode(family: Metric) -> bytes:
        body = encoder(_OneFamily(family))
        return body[: -len(_OPENMETRICS_EOF)] if body.endswith(_OPENMETRICS_EOF) else body

    return encode


@dataclass
class _Assembly:
    """The families of one page being rendered, and what was left out of it."""

    budget: int
    chunks: list[bytes | None]
    evictable: list[tuple[int, int]]  # heap of (-size, index into chunks)
    size: int = 0
    too_large: int = 0
    failed: int = 0

    def add(self, chunk: bytes, evictable: bool) -> list[int]:
        """Add one rendered family; return the indexes left out to stay within the budget."""
        self.chunks.append(chunk)
        self.size += len(chunk)
        if evictable:
            heapq.heappush(self.evictable, (-len(chunk), len(self.chunks) - 1))
        left_out = []
        while self.size > self.budget and self.evictable:
            negative_size, index = heapq.heappop(self.evictable)
            self.size += negative_size
            self.chunks[index] = None
            self.too_large += 1
            left_out.append(index)
        return left_out


class PageRenderer:
    """Renders ``/metrics`` pages within ``max_page_bytes``; safe to call from several threads."""

    def __init__(self, max_page_bytes: int = DEFAULT_MAX_PAGE_BYTES) -> None:
        if max_page_bytes < MIN_PAGE_BYTES:
            raise ValueError(f"max_page_bytes must be at least {MIN_PAGE_BYTES}")
        self.max_page_bytes = max_page_bytes
        self._reported: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._series = SeriesTexts(max_chars=max_page_bytes // SERIES_TEXTS_SHARE)

    def render(self, registry: CollectorRegistry, accept_header: str) -> tuple[bytes, str]:
        """(body, content type) for ``accept_header``. Blocking: call it off the event loop."""
        encoder, content_type = choose_encoder(accept_header)
        if encoder is generate_latest:
            return self.assemble(registry.collect(), self.text_family, openmetrics=False), TEXT_CONTENT_TYPE
        if not content_type.startswith("application/openmetrics-text"):
            return self.assemble(registry.collect(), _client_python_family(encoder), openmetrics=False), content_type
        return self.assemble(
            registry.collect(), openmetrics_encoder(encoder, self._series), openmetrics=True
        ), content_type

    def text_family(self, family: Metric) -> bytes:
        """One family in text format 0.0.4, its series' texts kept for the next page."""
        return text_family(family, self._series)

    def assemble(self, families: Iterable[Metric], encode: FamilyEncoder, *, openmetrics: bool) -> bytes:
        """The page of ``families``, each encoded by ``encode``, within the byte budget."""
        page = _Assembly(self.max_page_bytes - _RESERVED_BYTES, [], [])
        names: list[str] = []
        for family in self._families(families, page):
            try:
                chunk = encode(family)
            except Exception as exc:  # noqa: BLE001 - one family must never take the page down
                page.failed += 1
                self._report_once("render_error", family.name, f"left out of /metrics: cannot be rendered: {exc!r}")
                continue
            names.append(family.name)
            for index in page.add(chunk, evictable=not family.name.startswith(SELF_METRIC_PREFIX)):
                self._report_once(
                    "page_size",
                    names[index],
                    f"left out of /metrics: the page would exceed {self.max_page_bytes} bytes",
                )
        tail = encode(self._omitted_family(page))
        return (
            b"".join(chunk for chunk in page.chunks if chunk is not None)
            + tail
            + (_OPENMETRICS_EOF if openmetrics else b"")
        )

    def _families(self, families: Iterable[Metric], page: _Assembly) -> Iterator[Metric]:
        """``families``, stopping (counted as a render error) if the registry itself raises."""
        iterator = iter(families)
        while True:
            try:
                family = next(iterator)
            except StopIteration:
                return
            except Exception as exc:  # noqa: BLE001 - serve what was collected before it
                page.failed += 1
                self._report_once("render_error", type(exc).__name__, f"collecting stopped early: {exc!r}")
                return
            yield family

    @staticmethod
    def _omitted_family(page: _Assembly) -> Metric:
        family = GaugeMetricFamily(
            OMITTED_FAMILIES,
            "Metric families left out of this page: page_size (the page would have exceeded "
            "--web.max-page-bytes; largest first), render_error (the family could not be rendered).",
            labels=["reason"],
        )
        family.add_metric(["page_size"], float(page.too_large))
        family.add_metric(["render_error"], float(page.failed))
        return family

    def _report_once(self, reason: str, name: str, message: str) -> None:
        with self._lock:
            if (reason, name) in self._reported or len(self._reported) >= _MAX_REPORTED:
                return
            self._reported.add((reason, name))
        log.warning("metric family %s %s", name, message)


def render_text(registry: CollectorRegistry) -> bytes:
    """Text format 0.0.4 of every family in the registry, within the default page size."""
    renderer = PageRenderer()
    return renderer.assemble(registry.collect(), renderer.text_family, openmetrics=False)


def render(registry: CollectorRegistry, accept_header: str) -> tuple[bytes, str]:
    """(body, content type) for ``accept_header``, within the default page size. Blocking."""
    return PageRenderer().render(registry, accept_header)

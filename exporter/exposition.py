"""Render a registry for one request, honouring ``Accept`` (OpenMetrics or text 0.0.4).

The classic text format is rendered by our own loop, byte-identical to client_python's
``generate_latest`` for the families we build (gauges, counters, untyped; valid names; no
timestamps), and about twice as fast: a 16-port RDMA node has ~500 samples and the
per-sample validation in ``generate_latest`` was a third of the scrape. Any family our loop
does not handle is rendered by client_python itself. OpenMetrics always goes through
client_python.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from prometheus_client.exposition import choose_encoder, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import CollectorRegistry
from prometheus_client.utils import floatToGoString

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LEGACY_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LEGACY_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_FAST_TYPES = {"gauge": "gauge", "counter": "counter", "unknown": "untyped"}
_OM_SUFFIXES = ("_created", "_gsum", "_gcount")


class _OneFamily:
    def __init__(self, family: Metric) -> None:
        self._family = family

    def collect(self) -> Iterable[Metric]:
        return [self._family]


def _escape_value(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def _fast_lines(family: Metric) -> list[str] | None:
    """The family's text lines, or None when it needs client_python's general renderer."""
    mtype = _FAST_TYPES.get(family.type)
    if mtype is None or not _LEGACY_NAME.match(family.name):
        return None
    name = family.name + "_total" if mtype == "counter" else family.name
    doc = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
    lines = [f"# HELP {name} {doc}\n# TYPE {name} {mtype}\n"]
    om_names = {family.name + suffix for suffix in _OM_SUFFIXES}
    label_ok: set[str] = set()
    for sample in family.samples:
        if sample.timestamp is not None or sample.exemplar is not None or sample.name in om_names:
            return None
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


def render_text(registry: CollectorRegistry) -> bytes:
    """Text format 0.0.4 of every family in the registry."""
    out: list[str] = []
    for family in registry.collect():
        lines = _fast_lines(family)
        if lines is None:
            out.append(generate_latest(_OneFamily(family)).decode("utf-8"))  # type: ignore[arg-type]
        else:
            out.extend(lines)
    return "".join(out).encode("utf-8")


def render(registry: CollectorRegistry, accept_header: str) -> tuple[bytes, str]:
    """(body, content type) for ``accept_header``. Blocking: call it off the event loop."""
    encoder, content_type = choose_encoder(accept_header)
    if encoder is generate_latest:
        return render_text(registry), TEXT_CONTENT_TYPE
    return encoder(registry), content_type

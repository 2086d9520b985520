"""Render a registry for one request, honouring ``Accept`` (OpenMetrics or text 0.0.4)."""

from __future__ import annotations

from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry


def render(registry: CollectorRegistry, accept_header: str) -> tuple[bytes, str]:
    """(body, content type) for ``accept_header``. Blocking: call it off the event loop."""
    encoder, content_type = choose_encoder(accept_header)
    return encoder(registry), content_type

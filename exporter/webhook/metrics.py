"""The webhook's own ``/metrics``: every review counted by its decision, on a registry of its own.

``WebhookService`` is what the HTTP layer calls, independent of it: ``mutate`` turns a request
body into (status, body) and counts the decision; ``metrics`` renders the registry. A body that
is not an AdmissionReview v1 request is answered 400 with a one-line reason; a failure while
deciding about a pod answers "allowed, no patch" (decision ``error``): the webhook never keeps a
pod from starting.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from exporter import __version__
from exporter.webhook.admission import (
    CHANGES,
    DECISIONS,
    ERROR,
    MALFORMED,
    MalformedReview,
    Review,
    WebhookConfig,
    parse_review,
    request_uid,
    response_for,
    review,
)

log = logging.getLogger(__name__)

JSON = "application/json"
TEXT = "text/plain; charset=utf-8"
METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST
# A review takes well under a millisecond; the API server gives up after timeoutSeconds.
DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


@dataclass(frozen=True)
class Answer:
    """An HTTP answer, for whichever server carries it."""

    status: int
    body: bytes
    content_type: str


class WebhookMetrics:
    """The webhook's registry: ``ccl_webhook_*``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.reviews = Counter(
            "ccl_webhook_admission_reviews",
            "AdmissionReview requests answered, by decision: mutated, unchanged, no_gpu, skipped, malformed, error.",
            ["decision"],
            registry=self.registry,
        )
        self.mutations = Counter(
            "ccl_webhook_mutations",
            "Pods patched, by what the patch added: nccl_env, nccl_debug_file, readiness_gate, preflight.",
            ["change"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "ccl_webhook_review_duration_seconds",
            "Time to decide one AdmissionReview (parsing and building the patch).",
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        build = Gauge("ccl_webhook_build_info", "The webhook's version; always 1.", ["version"], registry=self.registry)
        build.labels(__version__).set(1)
        for decision in DECISIONS:
            self.reviews.labels(decision)
        for change in CHANGES:
            self.mutations.labels(change)

    def record(self, decision: str, changes: tuple[str, ...], seconds: float) -> None:
        self.reviews.labels(decision).inc()
        for change in changes:
            self.mutations.labels(change).inc()
        self.duration.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class WebhookService:
    """``POST /mutate`` and ``GET /metrics`` of the webhook, without the HTTP server around them."""

    def __init__(
        self,
        config: WebhookConfig,
        metrics: WebhookMetrics | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.config = config
        self.metrics = metrics or WebhookMetrics()
        self._clock = clock

    def mutate(self, body: bytes) -> Answer:
        started = self._clock()
        try:
            document = parse_review(body)
            uid = request_uid(document)
        except MalformedReview as exc:
            self.metrics.record(MALFORMED, (), self._clock() - started)
            log.info("malformed AdmissionReview: %s", exc)
            return Answer(400, f"{exc}\n".encode(), TEXT)
        try:
            result = review(document, self.config)
        except Exception:  # a bug here must never keep a pod from starting
            log.exception("deciding on AdmissionReview %s failed; allowing it without a patch", uid)
            result = Review(response_for(uid), ERROR)
        self.metrics.record(result.decision, result.changes, self._clock() - started)
        return Answer(200, json.dumps(result.response, separators=(",", ":")).encode(), JSON)

    def render_metrics(self) -> Answer:
        return Answer(200, self.metrics.render(), METRICS_CONTENT_TYPE)

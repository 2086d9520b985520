"""The webhook's own ``/metrics``: every review counted by its decision, on a registry of its own.

``WebhookService`` is what the HTTP layer calls, independent of it: ``mutate`` turns a request
body into (status, body) and counts the decision; ``render_metrics`` renders the registry. Every
body gets an answer and is counted, whatever the server in front of it let through: one over
``MAX_REVIEW_BYTES`` (the limit a server in front should apply too) or holding more values than
an API server sends is answered 413 (decision ``oversized``), one that is not an AdmissionReview
v1 request as an API server sends it (not UTF-8 or not JSON, nested too deep, a key twice, ...)
400 (``malformed``), both with a one-line reason; a failure while deciding about a pod answers
"allowed, no patch" (decision ``error``): the webhook never keeps a pod from starting (with
``failurePolicy: Ignore`` a 400 or 413 does not either).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from exporter import __version__
from exporter.http.certificates import CertificateExpiryGauge
from exporter.webhook.admission import (
    CHANGES,
    DECISIONS,
    ERROR,
    MALFORMED,
    OVERSIZED,
    WITHHELD,
    Review,
    WebhookConfig,
    request_uid,
    response_for,
    review,
)
from exporter.webhook.body import MAX_REVIEW_BYTES, MalformedReview, ReviewTooLarge, parse_review

__all__ = ["MAX_REVIEW_BYTES", "Answer", "WebhookMetrics", "WebhookService"]

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
    """The webhook's registry: ``ccl_webhook_*``; with ``certificate_expiry`` (the serving
    certificate's, ``WebConfigSource.certificate_expiry``) also when that certificate expires."""

    def __init__(self, certificate_expiry: Callable[[], float | None] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.reviews = Counter(
            "ccl_webhook_admission_reviews",
            "AdmissionReview requests answered, by decision: " + ", ".join(DECISIONS) + ".",
            ["decision"],
            registry=self.registry,
        )
        self.mutations = Counter(
            "ccl_webhook_mutations",
            "Pods patched, by what the patch added: " + ", ".join(CHANGES) + ".",
            ["change"],
            registry=self.registry,
        )
        self.withheld = Counter(
            "ccl_webhook_withheld_changes",
            "Pods a change was not made to, by change and why (the pod already uses its name or path, "
            "or sets NCCL_DEBUG its own way); each also an admission warning.",
            ["change", "reason"],
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
        if certificate_expiry is not None:
            self.registry.register(
                CertificateExpiryGauge(
                    "ccl_webhook_tls_certificate_expiry_timestamp_seconds",
                    "When the webhook's serving certificate (--tls.cert-file) expires: the earliest notAfter of "
                    "its chain, in seconds since the epoch; read again when the file changes.",
                    certificate_expiry,
                )
            )
        for decision in DECISIONS:
            self.reviews.labels(decision)
        for change in CHANGES:
            self.mutations.labels(change)
        for change, reason in WITHHELD:
            self.withheld.labels(change, reason)

    def record(self, result: Review, seconds: float) -> None:
        self.reviews.labels(result.decision).inc()
        for change in result.changes:
            self.mutations.labels(change).inc()
        for change, reason in result.withheld:
            self.withheld.labels(change, reason).inc()
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
        # One review decided at a time: a review at the bounds takes about 35 MiB while it is
        # parsed, and the interpreter lock runs one at a time anyway.
        self._deciding = threading.Lock()

    def mutate(self, body: bytes) -> Answer:
        """The answer to one ``POST /mutate`` body, counted; never raises. Safe to call from
        several threads (the server's workers): the reviews are decided one after another."""
        with self._deciding:
            return self._mutate(body)

    def _mutate(self, body: bytes) -> Answer:
        started = self._clock()
        try:
            document = parse_review(body)
            uid = request_uid(document)
        except ReviewTooLarge as exc:
            return self._refuse(413, OVERSIZED, str(exc), started)
        except MalformedReview as exc:
            return self._refuse(400, MALFORMED, str(exc), started)
        try:
            result = review(document, self.config)
            answer = json.dumps(result.response, separators=(",", ":")).encode()
        except Exception:  # a bug here must never keep a pod from starting
            log.exception("deciding on AdmissionReview %s failed; allowing it without a patch", uid)
            result = Review(response_for(uid), ERROR)
            answer = json.dumps(result.response, separators=(",", ":")).encode()
        self.metrics.record(result, self._clock() - started)
        return Answer(200, answer, JSON)

    def _refuse(self, status: int, decision: str, reason: str, started: float) -> Answer:
        self.metrics.record(Review({}, decision), self._clock() - started)
        log.info("AdmissionReview refused (%d): %s", status, reason)
        return Answer(status, f"{reason}\n".encode(errors="backslashreplace"), TEXT)

    def render_metrics(self) -> Answer:
        return Answer(200, self.metrics.render(), METRICS_CONTENT_TYPE)

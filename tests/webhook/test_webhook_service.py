"""The webhook's request handling and its own /metrics (exporter/webhook/metrics.py), without a server."""

from __future__ import annotations

import json

import pytest

from exporter.webhook.admission import WebhookConfig
from exporter.webhook.metrics import WebhookMetrics, WebhookService
from tests.metrics_text import value
from tests.webhook.test_webhook_admission import admission as review_request
from tests.webhook.test_webhook_admission import gpu_pod


def sample(service: WebhookService, name: str, **labels: str) -> float:
    found = value(service.render_metrics().body.decode(), name, **labels)
    assert found is not None, f"{name}{labels} not exposed"
    return found


def test_every_decision_is_counted() -> None:
    service = WebhookService(WebhookConfig())
    gpu = service.mutate(json.dumps(review_request(gpu_pod(annotations={"ccl-health.io/preflight": "true"}))).encode())
    assert gpu.status == 200 and gpu.content_type == "application/json"
    assert json.loads(gpu.body)["response"]["patchType"] == "JSONPatch"
    cpu_pod = gpu_pod()
    cpu_pod["spec"]["containers"][0]["resources"] = {}
    assert service.mutate(json.dumps(review_request(cpu_pod)).encode()).status == 200
    garbage = service.mutate(b"{not json")
    assert garbage.status == 400 and garbage.body.count(b"\n") == 1 and garbage.body.startswith(b"body is not JSON")
    assert sample(service, "ccl_webhook_admission_reviews_total", decision="mutated") == 1
    assert sample(service, "ccl_webhook_admission_reviews_total", decision="no_gpu") == 1
    assert sample(service, "ccl_webhook_admission_reviews_total", decision="malformed") == 1
    assert sample(service, "ccl_webhook_admission_reviews_total", decision="error") == 0, "every decision is exposed"
    assert sample(service, "ccl_webhook_mutations_total", change="preflight") == 1
    assert sample(service, "ccl_webhook_mutations_total", change="readiness_gate") == 0
    assert sample(service, "ccl_webhook_review_duration_seconds_count") == 3


def test_a_failure_while_deciding_allows_the_pod_without_a_patch(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: object) -> None:
        raise KeyError("a bug")

    monkeypatch.setattr("exporter.webhook.metrics.review", broken)
    service = WebhookService(WebhookConfig())
    answer = service.mutate(json.dumps(review_request(gpu_pod())).encode())
    assert answer.status == 200
    assert json.loads(answer.body)["response"] == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}
    assert sample(service, "ccl_webhook_admission_reviews_total", decision="error") == 1


def test_withheld_changes_are_counted_by_change_and_reason() -> None:
    from exporter.webhook.admission import WITHHELD

    service = WebhookService(WebhookConfig(nccl_debug_file_host_path="/var/log/nccl"))
    for change, reason in WITHHELD:
        assert sample(service, "ccl_webhook_withheld_changes_total", change=change, reason=reason) == 0
    pod = gpu_pod(annotations={"ccl-health.io/preflight": "true"}, volumes=[{"name": "ccl-nccl-debug", "emptyDir": {}}])
    pod["spec"]["containers"][1]["name"] = "ccl-preflight"
    pod["spec"]["containers"][0]["env"].append({"name": "CCL_POD_NAME", "value": "someone-else"})
    assert service.mutate(json.dumps(review_request(pod)).encode()).status == 200
    assert sample(service, "ccl_webhook_withheld_changes_total", change="preflight", reason="container_name_taken") == 1
    assert (
        sample(service, "ccl_webhook_withheld_changes_total", change="nccl_debug_file", reason="volume_name_taken") == 1
    )
    assert sample(service, "ccl_webhook_mutations_total", change="nccl_env") == 1
    assert sample(service, "ccl_webhook_mutations_total", change="pod_identity_env") == 0, (
        "no folder is named from it: the pod's own CCL_POD_NAME is left alone"
    )
    pod["spec"]["volumes"] = []
    assert service.mutate(json.dumps(review_request(pod)).encode()).status == 200
    assert sample(service, "ccl_webhook_mutations_total", change="pod_identity_env") == 1


def test_reviews_from_many_threads_are_decided_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The memory of a review at the bounds is taken once, however many workers call."""
    import threading
    import time

    from exporter.webhook import admission

    active, most = [0], [0]
    lock = threading.Lock()

    def slow_review(*args: object) -> admission.Review:
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        time.sleep(0.02)
        with lock:
            active[0] -= 1
        return admission.review(*args)

    monkeypatch.setattr("exporter.webhook.metrics.review", slow_review)
    service = WebhookService(WebhookConfig())
    body = json.dumps(review_request(gpu_pod())).encode()
    threads = [threading.Thread(target=service.mutate, args=(body,)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most[0] == 1
    assert sample(service, "ccl_webhook_admission_reviews_total", decision="mutated") == 8


def test_two_services_do_not_share_counts() -> None:
    first, second = WebhookService(WebhookConfig()), WebhookService(WebhookConfig())
    first.mutate(b"[]")
    assert sample(first, "ccl_webhook_admission_reviews_total", decision="malformed") == 1
    assert sample(second, "ccl_webhook_admission_reviews_total", decision="malformed") == 0


def test_the_certificate_expiry_is_exposed_as_the_source_says_it_now() -> None:
    expiry: list[float | None] = [1.8e9]
    service = WebhookService(WebhookConfig(), WebhookMetrics(certificate_expiry=lambda: expiry[0]))
    assert sample(service, "ccl_webhook_tls_certificate_expiry_timestamp_seconds") == 1.8e9
    expiry[0] = 1.9e9  # renewed
    assert sample(service, "ccl_webhook_tls_certificate_expiry_timestamp_seconds") == 1.9e9
    expiry[0] = None  # unreadable: no sample rather than a made-up one
    text = service.render_metrics().body.decode()
    assert "ccl_webhook_tls_certificate_expiry_timestamp_seconds" not in text
    assert (
        "ccl_webhook_tls_certificate_expiry_timestamp_seconds"
        not in WebhookService(WebhookConfig()).render_metrics().body.decode()
    )


def test_the_exposition_passes_promtool() -> None:
    import subprocess

    from tests.conftest import require_tool

    service = WebhookService(WebhookConfig(), WebhookMetrics(certificate_expiry=lambda: 1.8e9))
    service.mutate(json.dumps(review_request(gpu_pod())).encode())
    result = subprocess.run(
        [require_tool("promtool"), "check", "metrics"],
        input=service.render_metrics().body,
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


async def test_the_server_reads_and_decides_a_few_reviews_at_a_time() -> None:
    """Each review holds its body while it is decided: beyond MAX_CONCURRENT_REVIEWS the others wait,
    unread, so many large reviews at once cannot fill the pod's memory."""
    import asyncio
    import threading

    import aiohttp

    from exporter.webhook.metrics import Answer
    from exporter.webhook.serving import MAX_CONCURRENT_REVIEWS, serving_webhook

    class SlowService(WebhookService):
        def __init__(self) -> None:
            super().__init__(WebhookConfig())
            self.lock = threading.Lock()
            self.now = self.most = 0

        def mutate(self, body: bytes) -> Answer:
            with self.lock:
                self.now += 1
                self.most = max(self.most, self.now)
            threading.Event().wait(0.2)
            with self.lock:
                self.now -= 1
            return Answer(200, b"{}", "application/json")

    service = SlowService()
    async with (
        serving_webhook(service, "127.0.0.1", 0, None, 1 << 20) as server,
        aiohttp.ClientSession() as session,
    ):

        async def post() -> int:
            async with session.post(f"http://127.0.0.1:{server.port}/mutate", data=b"{}") as answer:
                return answer.status

        statuses = await asyncio.gather(*(post() for _ in range(3 * MAX_CONCURRENT_REVIEWS)))
    assert statuses == [200] * (3 * MAX_CONCURRENT_REVIEWS)
    assert service.most == MAX_CONCURRENT_REVIEWS

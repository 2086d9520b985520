"""``ccl-exporter webhook`` as a process, over real HTTPS with a certificate made in the test
(``openssl``, the ``pki`` fixture of tests/http/test_web_config.py): a GPU pod gets its patch (env, gate
and init container when annotated), a pod that sets NCCL_DEBUG keeps its env, a CPU pod gets no
patch, garbage gets 400 and the server keeps serving, every decision shows on /metrics, and a
renewed certificate is served without a restart."""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest

from tests.conftest import free_port
from tests.http.test_web_config import _client_context, pki  # noqa: F401 - pki is a fixture
from tests.metrics_text import value
from tests.pki import openssl
from tests.webhook.test_webhook_admission import admission, gpu_pod


class Webhook:
    def __init__(self, folder: Path, pki: Path) -> None:  # noqa: F811 - the fixture's name
        self.folder, self.pki = folder, pki
        for name in ("tls.crt", "tls.key"):
            shutil.copy(pki / f"server.{name.split('.')[1]}", folder / name)
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "exporter",
                "webhook",
                "--web.listen-address",
                f"127.0.0.1:{self.port}",
                "--tls.cert-file",
                str(folder / "tls.crt"),
                "--tls.key-file",
                str(folder / "tls.key"),
                "--webhook.preflight-image",
                "registry.example/ccl-health-exporter:0.1.0",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=dict(os.environ),
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if self.get("/healthz")[0] == 200:
                    return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise TimeoutError("the webhook did not answer")

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        request = urllib.request.Request(
            self.url + path, data=body, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, context=_client_context(self.pki), timeout=10) as answer:
                return answer.status, answer.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def get(self, path: str) -> tuple[int, bytes]:
        return self.request("GET", path)

    def review(self, pod: dict[str, Any]) -> dict[str, Any]:
        status, body = self.request("POST", "/mutate", json.dumps(admission(pod)).encode())
        assert status == 200, body
        return json.loads(body)["response"]  # type: ignore[no-any-return]

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        return self.proc.stdout.read() if self.proc.stdout else ""


@pytest.fixture
def webhook(tmp_path: Path, pki: Path) -> Iterator[Webhook]:  # noqa: F811 - the fixture's name
    running = Webhook(tmp_path, pki)
    yield running
    running.stop()


def patched(pod: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    out = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(response["patch"])))
    kubernetes_validate.validate(out, "1.30.0", strict=True)
    return out  # type: ignore[no-any-return]


def test_the_done_when_cases_over_https(webhook: Webhook) -> None:
    gpu = gpu_pod(annotations={"ccl-health.io/readiness-gate": "true", "ccl-health.io/preflight": "true"})
    out = patched(gpu, webhook.review(gpu))
    env = {e["name"]: e.get("value") for e in out["spec"]["containers"][0]["env"]}
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
    assert out["spec"]["readinessGates"] == [{"conditionType": "ccl-health.io/fabric-ready"}]
    (init,) = out["spec"]["initContainers"]
    assert init["name"] == "ccl-preflight" and init["image"] == "registry.example/ccl-health-exporter:0.1.0"

    sets_debug = gpu_pod()
    sets_debug["spec"]["containers"][0]["env"].append({"name": "NCCL_DEBUG", "value": "INFO"})
    assert "patch" not in webhook.review(sets_debug), "its env untouched, nothing else asked for"

    cpu = gpu_pod(annotations={"ccl-health.io/preflight": "true"})
    cpu["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "2"}}
    response = webhook.review(cpu)
    assert response == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}

    status, body = webhook.request("POST", "/mutate", b"\x00garbage{")
    assert status == 400 and body.decode().count("\n") == 1 and "not JSON" in body.decode()
    assert webhook.get("/healthz")[0] == 200, "still serving"
    assert "patch" in webhook.review(gpu_pod()), "and still reviewing"

    metrics = webhook.get("/metrics")[1].decode()
    for decision, count in (("mutated", 2), ("unchanged", 1), ("no_gpu", 1), ("malformed", 1), ("error", 0)):
        assert value(metrics, "ccl_webhook_admission_reviews_total", decision=decision) == count, decision
    assert value(metrics, "ccl_webhook_mutations_total", change="preflight") == 1


def test_wrong_paths_methods_and_sizes_are_refused(webhook: Webhook) -> None:
    assert webhook.get("/mutate")[0] == 405
    assert webhook.get("/nothing")[0] == 404
    # A body over --web.max-body-bytes (7 MiB, what an API server can send) is refused from its
    # Content-Length, before it is read.
    context = _client_context(webhook.pki)
    with (
        ssl.create_connection(("127.0.0.1", webhook.port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        tls.sendall(
            b"POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 8388608\r\n\r\n{"
        )
        assert tls.recv(200).startswith(b"HTTP/1.1 413 ")
    assert webhook.get("/healthz")[0] == 200


def test_a_renewed_certificate_is_served_without_a_restart(webhook: Webhook) -> None:
    def served_subject() -> str:
        context = _client_context(webhook.pki)
        with (
            ssl.create_connection(("127.0.0.1", webhook.port), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            certificate = tls.getpeercert()
        return dict(item[0] for item in certificate["subject"])["commonName"]  # type: ignore[index]

    assert served_subject() == "exporter"
    time.sleep(1.1)  # file stamps are compared at most once a second
    shutil.copy(webhook.pki / "server2.key", webhook.folder / "tls.key.new")
    shutil.copy(webhook.pki / "server2.crt", webhook.folder / "tls.crt.new")
    os.replace(webhook.folder / "tls.key.new", webhook.folder / "tls.key")
    os.replace(webhook.folder / "tls.crt.new", webhook.folder / "tls.crt")
    deadline = time.monotonic() + 10
    while served_subject() != "exporter rotated":
        assert time.monotonic() < deadline, "the renewed certificate was never served"
        time.sleep(0.2)
    assert webhook.proc.poll() is None


def test_metrics_say_when_the_served_certificate_expires_and_follow_a_renewal(webhook: Webhook) -> None:
    def served_not_after() -> float:
        context = _client_context(webhook.pki)
        with (
            ssl.create_connection(("127.0.0.1", webhook.port), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            return float(ssl.cert_time_to_seconds(tls.getpeercert()["notAfter"]))  # type: ignore[index]

    def exposed() -> float | None:
        return value(webhook.get("/metrics")[1].decode(), "ccl_webhook_tls_certificate_expiry_timestamp_seconds")

    assert exposed() == served_not_after()
    # A renewal with a longer validity (30 days, the test CA's server certificates have 2).
    folder = webhook.folder
    openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "renewed.key",
        "-out",
        "renewed.csr",
        "-subj",
        "/CN=exporter renewed",
        cwd=folder,
    )
    (folder / "renewed.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl(
        "x509",
        "-req",
        "-in",
        "renewed.csr",
        "-CA",
        str(webhook.pki / "ca.crt"),
        "-CAkey",
        str(webhook.pki / "ca.key"),
        "-CAcreateserial",
        "-CAserial",
        "renewed.srl",
        "-days",
        "30",
        "-out",
        "renewed.crt",
        "-extfile",
        "renewed.ext",
        cwd=folder,
    )
    before = exposed()
    time.sleep(1.1)  # file stamps are compared at most once a second
    os.replace(folder / "renewed.key", folder / "tls.key")
    os.replace(folder / "renewed.crt", folder / "tls.crt")
    deadline = time.monotonic() + 10
    while exposed() == before:
        assert time.monotonic() < deadline, "the gauge never followed the renewal"
        time.sleep(0.2)
    renewed = exposed()
    assert renewed is not None and before is not None and renewed - before > 27 * 86400
    assert renewed == served_not_after()


def test_without_certificate_files_it_says_why(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "exporter", "webhook"], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "--tls.cert-file and --tls.key-file are required" in result.stderr
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "exporter",
            "webhook",
            "--tls.cert-file",
            str(tmp_path / "no.crt"),
            "--tls.key-file",
            str(tmp_path / "no.key"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1 and "cannot use the TLS certificate and key" in result.stderr

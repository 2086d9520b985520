"""The chart with TLS and basic auth on, against a real exporter and a real Prometheus.

Two exporters on simulated nodes (``python -m ccl_sim serve``) serve the web configuration a user would put in
``web.configSecret``: TLS with basic auth, and the same with client certificates required
(RequireAndVerifyClientCert). The chart is rendered by the real Helm engine with the values that
describe each; then, with certificates made by openssl:

- kubelet's probes, as the DaemonSet renders them, pass (HTTPS httpGet, or tcpSocket under mTLS,
  where an HTTPS httpGet cannot pass);
- a real Prometheus, scraping with the job the Prometheus Operator would generate from the
  rendered PodMonitor (tests/operator_scrape.py), gets the metrics, with ``node`` and ``job`` as
  the rules want; the same Prometheus fails with the default monitor (no TLS), without the
  client certificate and with a wrong password, so the settings are what makes it work;
- `helm test`'s script (scripts/smoke_check.py), given what the rendered test pod mounts, passes,
  and fails with a wrong password.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bcrypt
import pytest

from devtools.stack import Prometheus, SimulatedExporter
from tests.conftest import require_tool
from tests.manifests.test_helm_chart import container, objects_of, one, render
from tests.operator_scrape import Pod, Store, kubelet_probe, scrape_config
from tests.pki import issue, make_ca

SERVER_NAME = "ccl-exporter.ccl-health.svc"  # what the exporter's certificate names (podMonitor.tlsConfig.serverName)
USERNAME, PASSWORD = "prometheus", "s3cret-scrape"
SECRETS_WITHOUT_TLS: dict[str, dict[str, bytes]] = {
    "ccl-scrape": {"username": USERNAME.encode(), "password": PASSWORD.encode()},
    "ccl-scrape-wrong": {"username": USERNAME.encode(), "password": b"not-the-password"},
}
TLS_CONFIG = {"ca": {"secret": {"name": "ccl-scrape-tls", "key": "ca.crt"}}, "serverName": SERVER_NAME}
CLIENT_CERTIFICATE = {
    "cert": {"secret": {"name": "ccl-scrape-tls", "key": "tls.crt"}},
    "keySecret": {"name": "ccl-scrape-tls", "key": "tls.key"},
}
BASIC_AUTH = {
    "username": {"name": "ccl-scrape", "key": "username"},
    "password": {"name": "ccl-scrape", "key": "password"},
}

TLS_AND_AUTH: dict[str, Any] = {
    "web": {"configSecret": "ccl-web", "tls": {"enabled": True}, "basicAuth": {"enabled": True}},
    "podMonitor": {"tlsConfig": TLS_CONFIG, "basicAuth": BASIC_AUTH},
}
MTLS_AND_AUTH: dict[str, Any] = {
    "web": {
        "configSecret": "ccl-web",
        "tls": {"enabled": True, "clientAuthType": "RequireAndVerifyClientCert"},
        "basicAuth": {"enabled": True},
    },
    "podMonitor": {"tlsConfig": {**TLS_CONFIG, **CLIENT_CERTIFICATE}, "basicAuth": BASIC_AUTH},
}
WRONG_PASSWORD: dict[str, Any] = {
    **TLS_AND_AUTH,
    "podMonitor": {
        "tlsConfig": TLS_CONFIG,
        "basicAuth": {**BASIC_AUTH, "password": {"name": "ccl-scrape-wrong", "key": "password"}},
    },
}


@dataclass
class Served:
    """An exporter serving one web configuration, and the chart rendered for it."""

    name: str
    values: dict[str, Any]
    exporter: SimulatedExporter
    objects: list[dict[str, Any]]

    @property
    def port(self) -> int:
        return self.exporter.port


def _web_config(folder: Path, pki: Path, client_certificates: bool) -> Path:
    """web-config.yml and its files, as the Secret web.configSecret would hold them."""
    folder.mkdir(parents=True)
    for name in ("server.crt", "server.key", "ca.crt"):
        (folder / name).write_bytes((pki / name).read_bytes())
    client = "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n" if client_certificates else ""
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
    config = folder / "web-config.yml"
    config.write_text(
        f"tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n{client}"
        f"basic_auth_users:\n  {USERNAME}: '{hashed}'\n"
    )
    return config


def _wait_until(check: Any, timeout: float, what: str, exporter: SimulatedExporter) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if exporter.proc is not None and exporter.proc.poll() is not None:
            raise AssertionError(f"the exporter exited: {exporter.output_tail()}")
        time.sleep(0.2)
    raise AssertionError(f"{what} not within {timeout}s: {exporter.output_tail()}")


def _probes(served: Served) -> tuple[dict[str, Any], dict[str, Any]]:
    exporter = container(served.objects)
    return exporter["livenessProbe"], exporter["readinessProbe"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("pki")
    make_ca(folder)
    issue(folder, "server", "/CN=ccl-exporter", f"DNS:{SERVER_NAME}")
    issue(folder, "client", "/CN=prometheus", "DNS:prometheus")
    return folder


@pytest.fixture(scope="module")
def secrets(pki: Path) -> Store:
    return {
        **SECRETS_WITHOUT_TLS,
        "ccl-scrape-tls": {
            "ca.crt": (pki / "ca.crt").read_bytes(),
            "tls.crt": (pki / "client.crt").read_bytes(),
            "tls.key": (pki / "client.key").read_bytes(),
        },
    }


@pytest.fixture(scope="module")
def served(pki: Path) -> Iterator[dict[str, Served]]:
    """The two exporters, started, and answering their rendered liveness probe."""
    started: dict[str, Served] = {}
    try:
        for name, values, client_certificates in (
            ("tls-basic-auth", TLS_AND_AUTH, False),
            ("mtls-basic-auth", MTLS_AND_AUTH, True),
        ):
            config = _web_config(pki / name / "web", pki, client_certificates)
            exporter = SimulatedExporter(f"gpu-node-{len(started) + 1}", extra_args=[f"--web.config.file={config}"])
            started[name] = Served(name, values, exporter.start(wait=False), objects_of(render(values), tests=True))
        for one_served in started.values():
            liveness, _ = _probes(one_served)
            _wait_until(
                lambda s=one_served, p=liveness: kubelet_probe(p, "127.0.0.1", {"metrics": s.port}),
                60,
                f"{one_served.name}: the liveness probe",
                one_served.exporter,
            )
        yield started
    finally:
        for one_served in started.values():
            one_served.exporter.stop()


# ---- kubelet's probes ----


def test_kubelet_probes_pass_with_tls_and_auth_on(served: dict[str, Served]) -> None:
    for one_served in served.values():
        liveness, readiness = _probes(one_served)
        ports = {"metrics": one_served.port}
        assert kubelet_probe(liveness, "127.0.0.1", ports), one_served.name
        _wait_until(
            lambda r=readiness, p=ports: kubelet_probe(r, "127.0.0.1", p),
            60,
            f"{one_served.name}: the readiness probe",
            one_served.exporter,
        )
    plain_liveness, _ = _probes(served["tls-basic-auth"])
    assert plain_liveness["httpGet"]["scheme"] == "HTTPS"
    assert "tcpSocket" in _probes(served["mtls-basic-auth"])[0]


def test_an_https_probe_cannot_pass_where_client_certificates_are_required(served: dict[str, Served]) -> None:
    """Why the chart probes with tcpSocket under RequireAndVerifyClientCert: kubelet presents no
    certificate, so the HTTPS probe the TLS-only render has fails against that exporter, and a
    plain-HTTP probe (the chart before TLS was wired) fails against either."""
    https_probe, _ = _probes(served["tls-basic-auth"])
    strict = served["mtls-basic-auth"]
    assert not kubelet_probe(https_probe, "127.0.0.1", {"metrics": strict.port})
    plain_probe = container(objects_of(render({})))["livenessProbe"]
    for one_served in served.values():
        assert not kubelet_probe(plain_probe, "127.0.0.1", {"metrics": one_served.port}), one_served.name


# ---- a real Prometheus with the operator's job for the rendered PodMonitor ----


def _job(name: str, values: dict[str, Any], target: Served, secrets: Store, folder: Path) -> dict[str, Any]:
    objects = objects_of(render(values))
    monitor = one(objects, "PodMonitor")
    pod_labels = one(objects, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    pod = Pod(f"127.0.0.1:{target.port}", pod_labels, node=target.exporter.node, extra={"variant": name})
    job = scrape_config(monitor, [pod], secrets=secrets, config_maps={}, folder=folder / name, job_name=name)
    job.update({"scrape_interval": "1s", "scrape_timeout": "1s"})  # the test's pace, not the chart's 15 s
    return job


def test_prometheus_scrapes_with_the_rendered_monitor(
    served: dict[str, Served], secrets: Store, tmp_path: Path
) -> None:
    tls, mtls = served["tls-basic-auth"], served["mtls-basic-auth"]
    jobs = {  # job -> (values, exporter, whether Prometheus gets the metrics)
        "tls-basic-auth": (TLS_AND_AUTH, tls, True),
        "mtls-basic-auth": (MTLS_AND_AUTH, mtls, True),
        "defaults-against-tls": ({}, tls, False),
        "tls-values-against-mtls": (TLS_AND_AUTH, mtls, False),
        "wrong-password": (WRONG_PASSWORD, tls, False),
    }
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            _job(name, values, target, secrets, tmp_path / "certs") for name, (values, target, _) in jobs.items()
        ],
    }
    prometheus = Prometheus(require_tool("prometheus"), tmp_path / "prometheus", config)
    prometheus.start()
    try:
        up = prometheus.wait_until(
            lambda: (
                {s["metric"]["variant"]: s["value"][1] for s in prometheus.query("up")}.keys() == jobs.keys()
                and {s["metric"]["variant"]: float(s["value"][1]) for s in prometheus.query("up")}
            ),
            timeout=60,
            what="every job scraped once",
        )
        assert up == {name: float(works) for name, (_, _, works) in jobs.items()}, prometheus.api("targets")
        for name in ("tls-basic-auth", "mtls-basic-auth"):
            (build,) = prometheus.query(f'ccl_exporter_build_info{{variant="{name}"}}')
            assert build["metric"]["job"] == "ccl-exporter", "the job the rules select"
            assert build["metric"]["node"] == jobs[name][1].exporter.node, "node from the pod's node name"
            assert build["metric"]["namespace"] == "ccl-health"
        errors = {t["labels"]["variant"]: t["lastError"] for t in prometheus.api("targets")["activeTargets"]}
        assert "401" in errors["wrong-password"], errors
        assert errors["defaults-against-tls"], errors
    finally:
        prometheus.stop()


def test_the_translation_keeps_only_the_pods_the_monitor_selects(
    served: dict[str, Served], secrets: Store, tmp_path: Path
) -> None:
    """The operator's relabelings run on the discovered labels: of two pods behind the same
    port, the one of another release is dropped before any scrape, so the selector the chart
    renders is the one in force."""
    job = _job("own-release", TLS_AND_AUTH, served["tls-basic-auth"], secrets, tmp_path)
    other = {
        **job["static_configs"][0]["labels"],
        "variant": "other-release",
        "__meta_kubernetes_pod_label_app_kubernetes_io_instance": "another-release",
    }
    job["static_configs"].append({"targets": job["static_configs"][0]["targets"], "labels": other})
    config = {"global": {"scrape_interval": "1s"}, "scrape_configs": [job]}
    prometheus = Prometheus(require_tool("prometheus"), tmp_path / "prometheus", config)
    prometheus.start()
    try:
        targets = prometheus.wait_until(
            lambda: (found := prometheus.api("targets"))["activeTargets"] and found["droppedTargets"] and found,
            timeout=30,
            what="the targets sorted",
        )
        assert [t["labels"]["variant"] for t in targets["activeTargets"]] == ["own-release"]
        (dropped,) = targets["droppedTargets"]
        assert dropped["discoveredLabels"]["variant"] == "other-release"
    finally:
        prometheus.stop()


# ---- helm test ----


def _materialised(sources: list[dict[str, Any]], secrets: Store, folder: Path) -> Path:
    """A projected volume of Secret items, as kubelet would mount it."""
    folder.mkdir(parents=True)
    for source in sources:
        ((kind, spec),) = source.items()
        assert kind == "secret"
        for item in spec["items"]:
            (folder / item["path"]).write_bytes(secrets[spec["name"]][item["key"]])
    return folder


def _run_helm_test(
    values: dict[str, Any], target: Served, secrets: Store, folder: Path
) -> subprocess.CompletedProcess[str]:
    """The rendered `helm test` pod's script, with its environment and mounts, against ``target``
    (the Service name resolved to the exporter's loopback address)."""
    objects = objects_of(render(values), tests=True)
    pod = one(objects, "Pod")
    (smoke,) = pod["spec"]["containers"]
    env = {e["name"]: e["value"] for e in smoke["env"]}
    env.update({"SMOKE_HOST": "127.0.0.1", "SMOKE_PORT": str(target.port)})
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    for volume, variable in (("tls", "SMOKE_TLS_FOLDER"), ("basic-auth", "SMOKE_BASIC_AUTH_FOLDER")):
        sources = volumes[volume]["projected"]["sources"] if volume in volumes else []
        env[variable] = str(_materialised(sources, secrets, folder / volume))
    script = folder / "smoke_check.py"
    (config_map,) = [
        o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == pod["metadata"]["name"]
    ]
    script.write_text(config_map["data"]["smoke_check.py"])
    return subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ.get("PATH", ""), **env},
    )


def test_helm_test_passes_with_the_monitors_settings(served: dict[str, Served], secrets: Store, tmp_path: Path) -> None:
    for name, values in (("tls-basic-auth", TLS_AND_AUTH), ("mtls-basic-auth", MTLS_AND_AUTH)):
        done = _run_helm_test(values, served[name], secrets, tmp_path / name)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "1 of 1 exporters behind 127.0.0.1 served /metrics over https" in done.stdout


@pytest.mark.parametrize(
    ("values", "target", "complaint"),
    [
        (WRONG_PASSWORD, "tls-basic-auth", "HTTP 401"),
        (TLS_AND_AUTH, "mtls-basic-auth", "failed 127.0.0.1"),
        ({}, "tls-basic-auth", "failed 127.0.0.1"),
    ],
    ids=["wrong-password", "no-client-certificate", "plain-http"],
)
def test_helm_test_fails_when_the_scrape_would(
    served: dict[str, Served], secrets: Store, tmp_path: Path, values: dict[str, Any], target: str, complaint: str
) -> None:
    done = _run_helm_test(values, served[target], secrets, tmp_path)
    assert done.returncode == 1 and complaint in done.stdout, done.stdout + done.stderr
    assert "0 of 1 exporters" in done.stdout

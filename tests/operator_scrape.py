"""What the Prometheus Operator makes of a rendered PodMonitor, and what kubelet does with a probe,
for tests that run a real Prometheus and a real exporter on loopback with the chart's settings.

``scrape_config`` translates a PodMonitor into a prometheus.yml scrape job as the operator does
(prometheus-operator pkg/prometheus/promcfg.go, v0.93.0), with one difference: the targets are
static (no Kubernetes API here), carrying the ``__meta_kubernetes_*`` labels that pod discovery
would give them, so that the operator's own relabelings run on them unchanged: keep the pods the
selector matches and the named port, set ``namespace``, ``pod``, ``container`` and the job from
``jobLabel``, then the endpoint's relabelings. The TLS assets the endpoint takes from Secrets
and ConfigMaps are written to files (the operator mounts them under /etc/prometheus/certs), its
basic-auth credentials are written inline (as the operator does).

``kubelet_probe`` runs a liveness or readiness probe as kubelet does: an httpGet without
credentials, HTTPS without verifying the certificate or presenting one, success on 200-399; a
tcpSocket probe that only connects.
"""

from __future__ import annotations

import http.client
import re
import socket
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools.stack import relabel_configs

Store = Mapping[str, Mapping[str, bytes]]  # Secret or ConfigMap name -> key -> value

_TLS_FIELDS = {
    "serverName": "server_name",
    "insecureSkipVerify": "insecure_skip_verify",
    "minVersion": "min_version",
    "maxVersion": "max_version",
}


@dataclass(frozen=True)
class Pod:
    """A pod the PodMonitor may select, as Kubernetes pod discovery would describe it."""

    address: str  # host:port of the named port
    labels: Mapping[str, str]
    node: str
    name: str = "ccl-exporter-abcde"
    namespace: str = "ccl-health"
    container: str = "exporter"
    port_name: str = "metrics"
    extra: Mapping[str, str] = field(default_factory=dict)  # labels that are not discovery's (e.g. a test's variant)


def _label_name(name: str) -> str:
    """A Kubernetes label name as a Prometheus label name part (what discovery does)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _discovered_labels(pod: Pod) -> dict[str, str]:
    labels = {
        "__meta_kubernetes_namespace": pod.namespace,
        "__meta_kubernetes_pod_name": pod.name,
        "__meta_kubernetes_pod_node_name": pod.node,
        "__meta_kubernetes_pod_container_name": pod.container,
        "__meta_kubernetes_pod_container_port_name": pod.port_name,
    }
    for name, value in pod.labels.items():
        labels[f"__meta_kubernetes_pod_label_{_label_name(name)}"] = value
        labels[f"__meta_kubernetes_pod_labelpresent_{_label_name(name)}"] = "true"
    return {**labels, **pod.extra}


def _written(ref: Mapping[str, str], store: Store, kind: str, folder: Path) -> str:
    """The file the operator would write one Secret or ConfigMap key to; its path."""
    try:
        value = store[ref["name"]][ref["key"]]
    except KeyError:
        raise KeyError(f"{kind} {ref['name']} has no key {ref['key']}: the scrape would fail to load") from None
    path = folder / f"{kind.lower()}_{ref['name']}_{ref['key']}"
    path.write_bytes(value)
    return str(path)


def _selector_keeps(selector: Mapping[str, Any]) -> list[dict[str, Any]]:
    steps = []
    for name, value in selector.get("matchLabels", {}).items():
        label = _label_name(name)
        steps.append(
            {
                "source_labels": [
                    f"__meta_kubernetes_pod_label_{label}",
                    f"__meta_kubernetes_pod_labelpresent_{label}",
                ],
                "regex": f"({re.escape(value)});true",
                "action": "keep",
            }
        )
    if selector.get("matchExpressions"):
        raise NotImplementedError("matchExpressions: the chart's monitors select by matchLabels")
    return steps


def scrape_config(
    monitor: Mapping[str, Any],
    pods: Sequence[Pod],
    *,
    secrets: Store,
    config_maps: Store,
    folder: Path,
    job_name: str | None = None,
) -> dict[str, Any]:
    """The scrape job the operator would generate for ``monitor`` (a rendered PodMonitor) over
    ``pods``; its TLS files are written into ``folder``."""
    if monitor["kind"] != "PodMonitor":
        raise ValueError(f"a PodMonitor, not a {monitor['kind']}")
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    folder.mkdir(parents=True, exist_ok=True)
    meta = monitor["metadata"]
    job: dict[str, Any] = {
        "job_name": job_name or f"podMonitor/{meta['namespace']}/{meta['name']}/0",
        "honor_labels": bool(endpoint.get("honorLabels", False)),
        "metrics_path": endpoint.get("path", "/metrics"),
        "static_configs": [{"targets": [pod.address], "labels": _discovered_labels(pod)} for pod in pods],
    }
    for ours, theirs in (("interval", "scrape_interval"), ("scrapeTimeout", "scrape_timeout"), ("scheme", "scheme")):
        if endpoint.get(ours):
            job[theirs] = endpoint[ours]
    tls = endpoint.get("tlsConfig")
    if tls:
        unknown = set(tls) - {"ca", "cert", "keySecret", *_TLS_FIELDS}
        if unknown:
            raise ValueError(f"a PodMonitor's tlsConfig has no {sorted(unknown)}")
        config: dict[str, Any] = {}
        for field_name, option in (("ca", "ca_file"), ("cert", "cert_file")):
            if field_name in tls:
                ((kind, ref),) = tls[field_name].items()
                store = secrets if kind == "secret" else config_maps
                config[option] = _written(ref, store, "Secret" if kind == "secret" else "ConfigMap", folder)
        if "keySecret" in tls:
            config["key_file"] = _written(tls["keySecret"], secrets, "Secret", folder)
        config.update({option: tls[name] for name, option in _TLS_FIELDS.items() if name in tls})
        job["tls_config"] = config
    auth = endpoint.get("basicAuth")
    if auth:
        job["basic_auth"] = {
            part: secrets[auth[part]["name"]][auth[part]["key"]].decode() for part in ("username", "password")
        }
    job_label = _label_name(monitor["spec"].get("jobLabel", ""))
    job["relabel_configs"] = [
        *_selector_keeps(monitor["spec"]["selector"]),
        {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": endpoint["port"], "action": "keep"},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"},
        *(
            [
                {
                    "source_labels": [f"__meta_kubernetes_pod_label_{job_label}"],
                    "target_label": "job",
                    "regex": "(.+)",
                    "replacement": "${1}",
                }
            ]
            if job_label
            else []
        ),
        {"target_label": "endpoint", "replacement": endpoint["port"]},
        *relabel_configs(endpoint.get("relabelings", [])),
    ]
    if endpoint.get("metricRelabelings"):
        job["metric_relabel_configs"] = relabel_configs(endpoint["metricRelabelings"])
    return job


def kubelet_probe(probe: Mapping[str, Any], host: str, ports: Mapping[str, int]) -> bool:
    """Whether kubelet would count ``probe`` (a rendered liveness or readiness probe) a success
    against a container on ``host`` whose named ports are ``ports``."""
    timeout = float(probe.get("timeoutSeconds", 1))
    if "tcpSocket" in probe:
        port = probe["tcpSocket"]["port"]
        try:
            with socket.create_connection((host, ports.get(port, port)), timeout=timeout):
                return True
        except OSError:
            return False
    get = probe["httpGet"]
    port = ports.get(get["port"], get["port"])
    if get.get("scheme", "HTTP").upper() == "HTTPS":
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # kubelet: InsecureSkipVerify, no client certificate
        connection: http.client.HTTPConnection = http.client.HTTPSConnection(
            host, port, timeout=timeout, context=context
        )
    else:
        connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("GET", get.get("path", "/"), headers={"User-Agent": "kube-probe/1.30", "Accept": "*/*"})
        status = connection.getresponse().status
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()
    return 200 <= status < 400

"""manifests/overlays/webhook and manifests/overlays/lifecycle: they render offline, every core
object validates strictly, cert-manager's objects match their shapes, the webhook can never block
a pod (failurePolicy Ignore, short timeout, opt-in namespaces), the arguments parse with the real
CLI, the RBAC is exactly what the code calls, and the scanner (checkov) finds nothing unexplained.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.conftest import REPO
from tests.manifests.test_manifests import KUBERNETES_VERSION, _documents, _one, _render, scan

OVERLAYS = REPO / "manifests" / "overlays"
WEBHOOK, LIFECYCLE = OVERLAYS / "webhook", OVERLAYS / "lifecycle"
CORE_KINDS = {
    "Namespace",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "DaemonSet",
    "Deployment",
    "Service",
    "NetworkPolicy",
    "ConfigMap",
    "PodDisruptionBudget",
    "MutatingWebhookConfiguration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}
_STR = {"type": "string"}


def _closed(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


_META = _closed({"name": _STR, "namespace": _STR, "labels": {"type": "object"}}, ["name"])
_ISSUER_REF = _closed({"name": _STR, "kind": {"enum": ["Issuer", "ClusterIssuer"]}}, ["name"])
# cert-manager.io/v1, only the fields used here (cert-manager's CRDs are not installable here).
CERT_MANAGER = {
    "Issuer": _closed(
        {
            "apiVersion": {"const": "cert-manager.io/v1"},
            "kind": {"const": "Issuer"},
            "metadata": _META,
            "spec": {
                "oneOf": [
                    _closed({"selfSigned": _closed({}, [])}, ["selfSigned"]),
                    _closed({"ca": _closed({"secretName": _STR}, ["secretName"])}, ["ca"]),
                ]
            },
        },
        ["apiVersion", "kind", "metadata", "spec"],
    ),
    "Certificate": _closed(
        {
            "apiVersion": {"const": "cert-manager.io/v1"},
            "kind": {"const": "Certificate"},
            "metadata": _META,
            "spec": _closed(
                {
                    "secretName": _STR,
                    "isCA": {"type": "boolean"},
                    "commonName": _STR,
                    "dnsNames": {"type": "array", "items": _STR},
                    "duration": _STR,
                    "renewBefore": _STR,
                    "privateKey": _closed(
                        {"algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]}, "size": {"type": "integer"}}, []
                    ),
                    "issuerRef": _ISSUER_REF,
                },
                ["secretName", "issuerRef"],
            ),
        },
        ["apiVersion", "kind", "metadata", "spec"],
    ),
}


@pytest.fixture(scope="module")
def webhook_objects() -> list[dict[str, Any]]:
    return _documents(_render(WEBHOOK))


@pytest.fixture(scope="module")
def lifecycle_objects() -> list[dict[str, Any]]:
    return _documents(_render(LIFECYCLE))


@pytest.fixture(scope="module")
def base_objects() -> list[dict[str, Any]]:
    return _documents(_render(REPO / "manifests"))


def _validate(objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        if obj["kind"] in CORE_KINDS:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        elif obj["kind"] in CERT_MANAGER:
            jsonschema.validate(obj, CERT_MANAGER[obj["kind"]])


def test_overlays_validate_strictly(
    webhook_objects: list[dict[str, Any]], lifecycle_objects: list[dict[str, Any]]
) -> None:
    _validate(webhook_objects)
    _validate(lifecycle_objects)
    known = CORE_KINDS | set(CERT_MANAGER) | {"PodMonitor", "PrometheusRule"}
    assert {o["kind"] for o in webhook_objects + lifecycle_objects} <= known


def test_overlays_add_to_the_base_and_change_nothing_else(
    webhook_objects: list[dict[str, Any]], lifecycle_objects: list[dict[str, Any]], base_objects: list[dict[str, Any]]
) -> None:
    def key(obj: dict[str, Any]) -> tuple[str, str]:
        return obj["kind"], obj["metadata"]["name"]

    base = {key(o): o for o in base_objects}
    for objects, changed in ((webhook_objects, set()), (lifecycle_objects, {("DaemonSet", "ccl-exporter")})):
        for obj in objects:
            if key(obj) in base and key(obj) not in changed:
                assert obj == base[key(obj)], f"{key(obj)} differs from the base"


def test_the_webhook_can_never_block_a_pod(webhook_objects: list[dict[str, Any]]) -> None:
    config = _one(webhook_objects, "MutatingWebhookConfiguration")
    (hook,) = config["webhooks"]
    assert hook["failurePolicy"] == "Ignore"
    assert hook["sideEffects"] == "None"
    assert hook["timeoutSeconds"] <= 5
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["namespaceSelector"] == {"matchLabels": {"ccl-health.io/inject": "enabled"}}
    assert hook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    (condition,) = hook["matchConditions"]
    assert "'nvidia.com/gpu' in c.resources.limits" in condition["expression"]
    assert "'nvidia.com/gpu' in c.resources.requests" in condition["expression"]


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def test_only_opted_in_namespaces_are_sent_to_the_webhook(webhook_objects: list[dict[str, Any]]) -> None:
    (hook,) = _one(webhook_objects, "MutatingWebhookConfiguration")["webhooks"]
    assert _selects(hook["namespaceSelector"], {"ccl-health.io/inject": "enabled", "team": "ml"})
    assert not _selects(hook["namespaceSelector"], {"team": "ml"})
    assert not _selects(hook["namespaceSelector"], {"ccl-health.io/inject": "disabled"})
    own = _one(webhook_objects, "Namespace")
    assert not _selects(hook["namespaceSelector"], own["metadata"].get("labels", {})), "never its own namespace"


def test_the_webhook_is_wired_to_its_service_and_certificate(webhook_objects: list[dict[str, Any]]) -> None:
    from exporter.commands import build_parser

    config = _one(webhook_objects, "MutatingWebhookConfiguration")
    (hook,) = config["webhooks"]
    service_ref = hook["clientConfig"]["service"]
    service = _one(webhook_objects, "Service", service_ref["name"])
    assert service["metadata"]["namespace"] == service_ref["namespace"] and service_ref["path"] == "/mutate"
    (port,) = service["spec"]["ports"]
    assert port["port"] == service_ref["port"]
    deployment = _one(webhook_objects, "Deployment", "ccl-webhook")
    pod = deployment["spec"]["template"]["spec"]
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    (container,) = pod["containers"]
    (container_port,) = container["ports"]
    assert port["targetPort"] == container_port["name"]
    args = build_parser({}).parse_args(container["args"])
    assert args.command == "webhook" and args.listen_address.endswith(f":{container_port['containerPort']}")
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    secret = volumes[mounts["tls"]["name"]]["secret"]["secretName"]
    for path in (args.tls_cert_file, args.tls_key_file):
        assert Path(path).parent == Path(mounts["tls"]["mountPath"])
    namespace, _, certificate_name = config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].partition("/")
    certificate = _one(webhook_objects, "Certificate", certificate_name)
    assert certificate["metadata"]["namespace"] == namespace and certificate["spec"]["secretName"] == secret
    assert f"{service['metadata']['name']}.{namespace}.svc" in certificate["spec"]["dnsNames"]
    issuer = _one(webhook_objects, "Issuer", certificate["spec"]["issuerRef"]["name"])
    ca = _one(webhook_objects, "Certificate", "ccl-webhook-ca")
    assert issuer["spec"]["ca"]["secretName"] == ca["spec"]["secretName"] and ca["spec"]["isCA"] is True
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "https", "scheme": "HTTPS"}
    assert pod["automountServiceAccountToken"] is False, "the webhook needs no API access"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert not [v for v in pod["volumes"] if "hostPath" in v]


def test_the_webhook_is_scraped_over_https_with_its_certificate_ca(webhook_objects: list[dict[str, Any]]) -> None:
    monitor = _one(webhook_objects, "PodMonitor", "ccl-webhook")
    deployment = _one(webhook_objects, "Deployment", "ccl-webhook")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items()
        <= deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert endpoint["port"] in {p["name"] for p in container["ports"]} and endpoint["scheme"] == "https"
    certificate = _one(webhook_objects, "Certificate", "ccl-webhook")
    assert endpoint["tlsConfig"]["ca"]["secret"] == {"name": certificate["spec"]["secretName"], "key": "ca.crt"}
    assert endpoint["tlsConfig"]["serverName"] in certificate["spec"]["dnsNames"]


def test_the_injected_preflight_needs_no_host_folder(webhook_objects: list[dict[str, Any]]) -> None:
    """The overlay's pre-flight reports through its termination message: no hostPath, which Pod
    Security baseline and restricted namespaces refuse."""
    from exporter.commands import build_parser
    from exporter.commands.webhook import webhook_config_from_args

    (container,) = _one(webhook_objects, "Deployment", "ccl-webhook")["spec"]["template"]["spec"]["containers"]
    config = webhook_config_from_args(build_parser({}).parse_args(container["args"]))
    assert config.probe_results_host_path == ""


def test_lifecycle_rbac_is_exactly_the_writes_the_code_makes(lifecycle_objects: list[dict[str, Any]]) -> None:
    role = _one(lifecycle_objects, "ClusterRole", "ccl-exporter-lifecycle")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["get", "patch"]},
    ]
    code = (REPO / "exporter" / "lifecycle" / "writes.py").read_text()
    calls = set(re.findall(r"\.api\(\)\.(\w+)\(", code))
    assert calls == {
        "patch_namespaced_pod_status",
        "create_namespaced_event",
        "read_node_status",
        "patch_node_status",
    }, "a new call needs its verb in rbac-lifecycle.yaml"
    binding = _one(lifecycle_objects, "ClusterRoleBinding", "ccl-exporter-lifecycle")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "ccl-exporter", "namespace": "ccl-health"}]
    policy = _one(lifecycle_objects, "ValidatingAdmissionPolicy")
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["nodes/status", "pods/status"]
    assert "system:serviceaccount:ccl-health:ccl-exporter" in policy["spec"]["matchConditions"][0]["expression"]
    assert (
        _one(lifecycle_objects, "ValidatingAdmissionPolicyBinding")["spec"]["policyName"] == policy["metadata"]["name"]
    )


def test_lifecycle_daemonset_args_turn_the_hooks_on(lifecycle_objects: list[dict[str, Any]]) -> None:
    from exporter.collectors import all_collectors
    from exporter.commands import build_parser
    from exporter.commands.serve import config_from_args

    (container,) = _one(lifecycle_objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    args = [a.replace("$(NODE_NAME)", "gpu-node-1") for a in container["args"]]
    config = config_from_args(build_parser(environ={}).parse_args(args), all_collectors())
    assert "lifecycle" in config.enabled_collectors and config.node_name == "gpu-node-1"
    settings = config.collector_settings["lifecycle"].controller  # type: ignore[attr-defined]
    assert settings.readiness and settings.events and settings.node_condition


def test_the_documented_path_without_cert_manager_renders(tmp_path: Path) -> None:
    """docs/lifecycle.md shows an overlay without cert-manager (a Secret made with openssl, the CA
    in caBundle): it must render, validate and keep everything else of the webhook overlay."""
    from tests.manifests.test_manifests import _yaml_block_with

    overlay = yaml.safe_load(_yaml_block_with(REPO / "docs" / "lifecycle.md", "caBundle"))
    overlay["resources"] = [os.path.relpath(WEBHOOK, tmp_path)]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    objects = _documents(_render(tmp_path))
    _validate(objects)
    assert not [o for o in objects if o["kind"] in CERT_MANAGER], "no cert-manager objects left"
    config = _one(objects, "MutatingWebhookConfiguration")
    assert "cert-manager.io/inject-ca-from" not in config["metadata"].get("annotations", {})
    (hook,) = config["webhooks"]
    assert hook["clientConfig"]["caBundle"] and hook["failurePolicy"] == "Ignore"


def test_checkov_finds_nothing_unexplained_in_the_overlays(tmp_path: Path) -> None:
    (tmp_path / "k8s").mkdir()
    (tmp_path / "k8s" / "webhook.yaml").write_text(_render(WEBHOOK))
    (tmp_path / "k8s" / "lifecycle.yaml").write_text(_render(LIFECYCLE))
    report = scan(tmp_path / "k8s")
    assert report["summary"]["passed"] > 10

"""The Helm chart's lifecycle hooks (``lifecycle.*``) and admission webhook (``webhook.*``), driven
by the real Helm engine like tests/manifests/test_helm_chart.py:

- with the values on, the render is the kustomize overlays ``manifests/overlays/lifecycle`` and
  ``manifests/overlays/webhook`` in substance (the differences test_helm_chart allows, no more);
- renders validate strictly against every Kubernetes version kubernetes-validate bundles: with
  the 1.30 features (the ValidatingAdmissionPolicy, matchConditions) from 1.30 on, without them
  (``lifecycle.ownNodePolicy=false``, ``webhook.matchConditions=false``) on 1.25 to 1.29;
- strict lint is clean, the scanner (checkov) finds nothing unexplained;
- the rendered webhook arguments parse with the real ``webhook`` parser, the exporter's with
  ``serve``'s, and say what the values say;
- the collector switch and ``lifecycle.enabled`` cannot contradict each other; the schema and the
  templates reject what would break the webhook (a failurePolicy other than Ignore, a negative
  timeout, a caBundle that is not a certificate).
"""

from __future__ import annotations

import base64
import copy
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from helm_python import Chart, HelmRenderError, HelmValuesError, lint

from tests.manifests.test_helm_chart import (
    ACCEPTED_LINT_INFO,
    CHART,
    KUBERNETES_VERSIONS,
    NAMESPACE,
    OPERATOR_SCHEMAS,
    RELEASE,
    assert_same_in_substance,
    chart_objects,
    compared_objects,
    container,
    one,
    render,
)
from tests.manifests.test_lifecycle_manifests import CERT_MANAGER, LIFECYCLE, WEBHOOK
from tests.manifests.test_lifecycle_manifests import CORE_KINDS as LIFECYCLE_CORE_KINDS
from tests.manifests.test_manifests import _documents, _render, scan

# The chart's appVersion, the default image tag (the latest release: tests/house/test_release.py).
APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]

HOOKS_ON: dict[str, Any] = {"lifecycle": {"enabled": True}}
WEBHOOK_ON: dict[str, Any] = {"webhook": {"enabled": True}}
BOTH_ON: dict[str, Any] = {**HOOKS_ON, **WEBHOOK_ON}
# What a cluster before 1.30 needs: no ValidatingAdmissionPolicy v1, no matchConditions.
BEFORE_1_30: dict[str, Any] = {
    "lifecycle": {"enabled": True, "ownNodePolicy": False},
    "webhook": {"enabled": True, "matchConditions": False},
}
FIRST_WITH_POLICY = (1, 30)
CORE_KINDS = LIFECYCLE_CORE_KINDS | {"ConfigMap"}
# Not a real CA: the chart checks only that caBundle is a PEM certificate; the API server would
# parse it.
CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIBfake+certificate/for/the/chart/test==\n-----END CERTIFICATE-----\n"
NON_DEFAULT: dict[str, Any] = {
    "fullnameOverride": "gpu-fabric",
    "image": {"repository": "registry.internal/ccl-health-exporter", "digest": "sha256:" + "ab" * 32},
    "hostPaths": {"probeResults": "/data/ccl/probe-results", "ncclDebugFiles": "/data/ccl/nccl"},
    "lifecycle": {
        "enabled": True,
        "hooks": ["readiness", "node-condition"],
        "nodeCondition": {"interval": 5, "minPortRate": 400, "probeFloor": 150.5},
    },
    "webhook": {
        "enabled": True,
        "image": {"pullPolicy": "Always"},
        "replicas": 1,
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}},
        "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
        "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}],
        "extraArgs": ["--log.level=debug"],
        "gpuResources": ["amd.com/gpu", "nvidia.com/mig-1g.10gb"],
        "ncclDebugFile": True,
        "preflight": {
            "image": {"repository": "registry.internal/ccl-health-exporter", "tag": "0.1.0-probe"},
            "args": ["preflight", "--expect-link-layer=InfiniBand", "--expect-rate=400"],
            "writeResults": True,
        },
        "timeoutSeconds": 5,
        "namespaceSelector": {
            "matchExpressions": [{"key": "ccl-health.io/inject", "operator": "In", "values": ["enabled", "gpu"]}]
        },
        "certManager": {"enabled": False},
        "tls": {"secretName": "gpu-fabric-webhook-serving"},
        "caBundle": CA_PEM,
    },
    "podMonitor": {"enabled": False},
    "serviceMonitor": {"enabled": True, "additionalLabels": {"release": "monitoring-stack"}, "interval": "30s"},
}


# What may differ beyond test_helm_chart.ALLOWED_DIFFERENCES, and why:
ALLOWED_DIFFERENCES = {
    "cluster-scoped namespace": "kustomize's namespace transformer does not know the ValidatingAdmissionPolicy "
    "(and its binding) to be cluster-scoped and gives them metadata.namespace, which "
    "the API server ignores for cluster-scoped objects; the chart writes none.",
}
CLUSTER_SCOPED = {
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "MutatingWebhookConfiguration",
    "ClusterRole",
    "ClusterRoleBinding",
}


def overlay_objects(folder: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize folder``, cluster-scoped objects without a namespace (ALLOWED_DIFFERENCES)."""
    objects = _documents(_render(folder))
    for obj in objects:
        if obj["kind"] in CLUSTER_SCOPED:
            obj["metadata"].pop("namespace", None)
    return objects


def _merged(*values: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for layer in values:
        for key, value in layer.items():
            out[key] = (
                _merged(out[key], value)
                if isinstance(value, dict) and isinstance(out.get(key), dict)
                else copy.deepcopy(value)
            )
    return out


def named(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def webhook_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (only,) = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    return only  # type: ignore[no-any-return]


def _minor(version: str) -> tuple[int, int]:
    major, minor, _ = version.split(".")
    return int(major), int(minor)


def validate_strictly(objects: list[dict[str, Any]], versions: list[str]) -> None:
    for obj in objects:
        if obj["kind"] in CORE_KINDS:
            for version in versions:
                kubernetes_validate.validate(obj, version, strict=True)
        elif obj["kind"] in CERT_MANAGER:
            jsonschema.validate(obj, CERT_MANAGER[obj["kind"]])
        else:
            jsonschema.validate(obj, OPERATOR_SCHEMAS[obj["kind"]])


# ---- the same objects as the kustomize overlays ----


def test_lifecycle_values_render_the_lifecycle_overlay() -> None:
    overlay = overlay_objects(LIFECYCLE)
    assert_same_in_substance(overlay, compared_objects(HOOKS_ON))


def test_webhook_values_render_the_webhook_overlay() -> None:
    overlay = overlay_objects(WEBHOOK)
    charted = compared_objects(WEBHOOK_ON)
    assert_same_in_substance(overlay, charted)
    assert {"Deployment", "MutatingWebhookConfiguration", "Certificate", "Issuer", "PodDisruptionBudget"} <= {
        o["kind"] for o in charted
    }


def test_the_comparison_sees_a_changed_hook() -> None:
    overlay = overlay_objects(LIFECYCLE)
    with pytest.raises(AssertionError, match="ccl-exporter-lifecycle"):
        assert_same_in_substance(
            overlay, compared_objects({"lifecycle": {"enabled": True, "hooks": ["readiness", "events"]}})
        )
    with pytest.raises(AssertionError):
        assert_same_in_substance(overlay, compared_objects({"lifecycle": {"enabled": True, "ownNodePolicy": False}}))
    with pytest.raises(AssertionError, match="DaemonSet"):
        assert_same_in_substance(
            overlay, compared_objects({"lifecycle": {"enabled": True, "nodeCondition": {"interval": 5}}})
        )


def test_off_by_default() -> None:
    objects = chart_objects()
    names = {o["metadata"]["name"] for o in objects}
    assert not {n for n in names if "webhook" in n or "lifecycle" in n or "own-node" in n}
    assert not any(a.startswith("--collector.lifecycle") for a in container(objects)["args"])


# ---- strictly valid on every Kubernetes version, lint, scanner ----


@pytest.mark.parametrize("values", [BOTH_ON, NON_DEFAULT], ids=["on", "non-default"])
def test_renders_validate_strictly_from_1_30(values: dict[str, Any]) -> None:
    objects = chart_objects(values)
    validate_strictly(objects, [v for v in KUBERNETES_VERSIONS if _minor(v) >= FIRST_WITH_POLICY])
    assert {o["kind"] for o in objects} <= CORE_KINDS | set(CERT_MANAGER) | set(OPERATOR_SCHEMAS)


def test_renders_without_the_1_30_features_validate_strictly_before_1_30() -> None:
    older = [v for v in KUBERNETES_VERSIONS if _minor(v) < FIRST_WITH_POLICY]
    assert older
    objects = chart_objects(BEFORE_1_30)
    validate_strictly(objects, older)
    assert "matchConditions" not in one(objects, "MutatingWebhookConfiguration")["webhooks"][0]
    # Without the guards, the objects are not valid there: what the two values are for.
    policy = one(chart_objects(BOTH_ON), "ValidatingAdmissionPolicy")
    with pytest.raises(kubernetes_validate.utils.SchemaNotFoundError):
        kubernetes_validate.validate(policy, "1.29.0", strict=True)
    configuration = one(chart_objects(BOTH_ON), "MutatingWebhookConfiguration")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(configuration, "1.26.0", strict=True)
    for version in ("1.28.0", "1.29.0"):  # beta there, on by default: webhook.matchConditions may stay on
        kubernetes_validate.validate(configuration, version, strict=True)


@pytest.mark.parametrize(
    ("values", "kube_versions"),
    [
        (BOTH_ON, ("v1.30.0", "v1.37.0")),
        (NON_DEFAULT, ("v1.30.0", "v1.37.0")),
        (BEFORE_1_30, ("v1.25.0", "v1.29.0")),
    ],
    ids=["on", "non-default", "before-1.30"],
)
def test_strict_lint_is_clean(values: dict[str, Any], kube_versions: tuple[str, ...]) -> None:
    for kube_version in kube_versions:
        report = lint(CHART, values, strict=True, namespace=NAMESPACE, kube_version=kube_version)
        assert report["errors"] == [], report
        assert {m["error"] for m in report["messages"]} <= ACCEPTED_LINT_INFO, report
        assert all(m["severity"] <= 1 for m in report["messages"]), report


def test_checkov_finds_nothing_unexplained_in_the_renders(tmp_path: Path) -> None:
    for name, values in (("on", BOTH_ON), ("non-default", NON_DEFAULT)):
        text = "\n---\n".join(yaml.safe_dump(o) for o in chart_objects(values))
        (tmp_path / f"{name}.yaml").write_text(text)
    report = scan(tmp_path)
    checked = {c["resource"].split(".")[0] for c in report["results"]["passed_checks"]}
    assert {"Deployment", "DaemonSet", "ClusterRole"} <= checked, "the scanner checked the webhook and the hooks"
    skipped = {(c["resource"], c["check_id"]) for c in report["results"]["skipped_checks"]}
    assert ("Deployment.ccl-health.ccl-health-exporter-webhook", "CKV_K8S_43") in skipped, (
        "the webhook's accepted findings, with reasons"
    )


# ---- the arguments, through the real parsers ----


def _webhook_config(objects: list[dict[str, Any]]) -> Any:
    from exporter.commands import build_parser
    from exporter.commands.webhook import webhook_config_from_args

    parsed = build_parser(environ={}).parse_args(webhook_container(objects)["args"])
    assert parsed.command == "webhook"
    return parsed, webhook_config_from_args(parsed)


def test_webhook_args_parse_with_the_webhook_parser() -> None:
    from exporter.webhook.admission import WebhookConfig

    objects = chart_objects(WEBHOOK_ON)
    parsed, config = _webhook_config(objects)
    # No hostPath by default: the pre-flight's result is its termination message (Pod Security baseline).
    assert config == WebhookConfig(preflight_image=f"ccl-health-exporter:{APP_VERSION}")
    assert parsed.listen_address == "0.0.0.0:8443"
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in webhook_container(objects)["volumeMounts"]}
    for path in (parsed.tls_cert_file, parsed.tls_key_file):
        assert Path(path).parent == Path(mounts["tls"])
    assert {v["name"]: v for v in pod["volumes"]}["tls"]["secret"]["secretName"] == "ccl-health-exporter-webhook-tls"


def test_non_default_webhook_args_say_what_the_values_say() -> None:
    objects = chart_objects(NON_DEFAULT)
    parsed, config = _webhook_config(objects)
    assert config.gpu_resources == ("amd.com/gpu", "nvidia.com/mig-1g.10gb")
    assert config.preflight_args == ("preflight", "--expect-link-layer=InfiniBand", "--expect-rate=400")
    assert config.preflight_image == "registry.internal/ccl-health-exporter:0.1.0-probe"
    assert config.probe_results_host_path == "/data/ccl/probe-results", (
        "writeResults true: the result file into the exporter's probe-results hostPath too"
    )
    assert config.nccl_debug_file_host_path == "/data/ccl/nccl", "the exporter's own NCCL debug-file folder"
    assert parsed.log_level == "debug"
    hook = webhook_container(objects)
    assert hook["image"] == "registry.internal/ccl-health-exporter@sha256:" + "ab" * 32, "the exporter's image"
    assert hook["imagePullPolicy"] == "Always"
    volumes = {v["name"]: v for v in one(objects, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "gpu-fabric-webhook-serving"


@pytest.mark.parametrize(
    ("webhook_image", "expected"),
    [
        ({}, "registry.internal/ccl-health-exporter@sha256:" + "ab" * 32),
        ({"tag": "0.1.1"}, "registry.internal/ccl-health-exporter:0.1.1"),
        ({"repository": "mirror.internal/ccl"}, f"mirror.internal/ccl:{APP_VERSION}"),
        (
            {"repository": "mirror.internal/ccl", "digest": "sha256:" + "cd" * 32},
            "mirror.internal/ccl@sha256:" + "cd" * 32,
        ),
    ],
    ids=["exporter's", "own-tag", "own-repository", "own-digest"],
)
def test_the_webhook_image_is_the_exporters_unless_its_own_is_given(
    webhook_image: dict[str, str], expected: str
) -> None:
    values = {
        "image": {"repository": "registry.internal/ccl-health-exporter", "digest": "sha256:" + "ab" * 32},
        "webhook": {"enabled": True, "image": webhook_image, "preflight": {"image": webhook_image}},
    }
    objects = chart_objects(values)
    _, config = _webhook_config(objects)
    assert webhook_container(objects)["image"] == expected == config.preflight_image


def test_the_preflight_writes_where_the_exporter_reads() -> None:
    objects = chart_objects(
        _merged(
            WEBHOOK_ON,
            {
                "hostPaths": {"probeResults": "/data/ccl/probe-results"},
                "webhook": {"preflight": {"writeResults": True}},
            },
        )
    )
    _, config = _webhook_config(objects)
    exporter_volumes = {v["name"]: v for v in one(objects, "DaemonSet")["spec"]["template"]["spec"]["volumes"]}
    assert (
        config.probe_results_host_path
        == exporter_volumes["probe-results"]["hostPath"]["path"]
        == "/data/ccl/probe-results"
    )


def test_exporter_args_turn_the_lifecycle_collector_on() -> None:
    from exporter.collectors import all_collectors
    from exporter.commands import build_parser
    from exporter.commands.serve import config_from_args

    def config_of(values: dict[str, Any]) -> Any:
        args = [a.replace("$(NODE_NAME)", "gpu-node-1") for a in container(chart_objects(values))["args"]]
        return config_from_args(build_parser(environ={}).parse_args(args), all_collectors())

    config = config_of(HOOKS_ON)
    assert "lifecycle" in config.enabled_collectors and config.node_name == "gpu-node-1"
    settings = config.collector_settings["lifecycle"].controller
    assert settings.readiness and settings.events and settings.node_condition
    config = config_of(NON_DEFAULT)
    assert "lifecycle" in config.enabled_collectors
    settings = config.collector_settings["lifecycle"].controller
    assert settings.readiness and not settings.events and settings.node_condition
    args = container(chart_objects(NON_DEFAULT))["args"]
    assert {
        "--collector.lifecycle.node-interval=5",
        "--collector.lifecycle.min-port-rate=400",
        "--collector.lifecycle.probe-floor=150.5",
    } <= set(args)
    assert "lifecycle" not in config_of({}).enabled_collectors
    # The readiness timeout: the exporter's default unless given (a duration Kueue's timeout must exceed).
    default = config_of(HOOKS_ON).collector_settings["lifecycle"].controller.readiness_timeout_seconds
    assert not any(
        a.startswith("--collector.lifecycle.readiness-timeout") for a in container(chart_objects(HOOKS_ON))["args"]
    )
    given = config_of(_merged(HOOKS_ON, {"lifecycle": {"readinessTimeout": "90s"}}))
    assert given.collector_settings["lifecycle"].controller.readiness_timeout_seconds == 90 != default


# ---- one switch for the collector ----


def test_collectors_lifecycle_agreeing_with_lifecycle_enabled_is_fine() -> None:
    both = chart_objects({"lifecycle": {"enabled": True}, "collectors": {"lifecycle": True}})
    assert "--collector.lifecycle" in container(both)["args"]
    neither = chart_objects({"collectors": {"lifecycle": False}})
    assert "--collector.lifecycle" not in container(neither)["args"]


@pytest.mark.parametrize(
    "values",
    [
        {"collectors": {"lifecycle": True}},
        {"lifecycle": {"enabled": True}, "collectors": {"lifecycle": False}},
    ],
    ids=["collector-without-hooks", "hooks-without-collector"],
)
def test_a_contradicting_collector_switch_fails_with_the_way_out(values: dict[str, Any]) -> None:
    with pytest.raises(HelmRenderError, match=r"contradicts lifecycle.enabled.*leave collectors.lifecycle unset"):
        render(values)


# ---- what each value does ----


def test_each_hook_gets_only_the_rbac_it_writes_with() -> None:
    def rules(hooks: list[str]) -> list[dict[str, Any]]:
        role = named(
            chart_objects({"lifecycle": {"enabled": True, "hooks": hooks}}),
            "ClusterRole",
            "ccl-health-exporter-lifecycle",
        )
        return role["rules"]  # type: ignore[no-any-return]

    assert rules(["events"]) == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    assert rules(["readiness"]) == [{"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]}]
    assert rules(["node-condition"]) == [{"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["get", "patch"]}]


def test_the_own_node_policy_names_the_release_service_account() -> None:
    objects = chart_objects(_merged(NON_DEFAULT, {"serviceAccount": {"name": "fabric-reader"}}))
    policy = named(objects, "ValidatingAdmissionPolicy", "gpu-fabric-own-node-only")
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == f"request.userInfo.username == 'system:serviceaccount:{NAMESPACE}:fabric-reader'"
    assert (
        named(objects, "ValidatingAdmissionPolicyBinding", "gpu-fabric-own-node-only")["spec"]["policyName"]
        == "gpu-fabric-own-node-only"
    )
    binding = named(objects, "ClusterRoleBinding", "gpu-fabric-lifecycle")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "fabric-reader", "namespace": NAMESPACE}]


def test_the_daemonset_scanner_reason_names_the_writes() -> None:
    annotations = one(chart_objects(HOOKS_ON), "DaemonSet")["metadata"]["annotations"]
    assert "writes their status, Events and the node status" in annotations["checkov.io/skip3"]


def test_a_disruption_budget_only_with_more_than_one_replica() -> None:
    assert one(chart_objects(WEBHOOK_ON), "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    single = chart_objects({"webhook": {"enabled": True, "replicas": 1}})
    assert not [o for o in single if o["kind"] == "PodDisruptionBudget"]
    assert one(single, "Deployment")["spec"]["replicas"] == 1


def test_the_webhook_configuration_follows_the_values() -> None:
    objects = chart_objects(NON_DEFAULT)
    configuration = named(objects, "MutatingWebhookConfiguration", "gpu-fabric-webhook")
    (hook,) = configuration["webhooks"]
    assert hook["failurePolicy"] == "Ignore" and hook["timeoutSeconds"] == 5
    assert hook["namespaceSelector"] == NON_DEFAULT["webhook"]["namespaceSelector"]
    assert hook["clientConfig"]["service"] == {
        "name": "gpu-fabric-webhook",
        "namespace": NAMESPACE,
        "path": "/mutate",
        "port": 443,
    }
    (condition,) = hook["matchConditions"]
    expression = condition["expression"]
    for name in ("nvidia.com/gpu", "amd.com/gpu", "nvidia.com/mig-1g.10gb"):
        for section in ("limits", "requests"):
            assert f"'{name}' in c.resources.{section}" in expression
    assert expression.count("(") == expression.count(")")
    service = named(objects, "Service", "gpu-fabric-webhook")
    assert (
        service["spec"]["selector"].items()
        <= one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"].items()
    )


def test_without_cert_manager_the_ca_is_the_given_bundle() -> None:
    encoded = base64.b64encode(CA_PEM.encode()).decode()
    for given in (CA_PEM, encoded, "\n  ".join(encoded[i : i + 16] for i in range(0, len(encoded), 16))):
        objects = chart_objects(_merged(NON_DEFAULT, {"webhook": {"caBundle": given}}))
        assert not [o for o in objects if o["kind"] in CERT_MANAGER]
        configuration = one(objects, "MutatingWebhookConfiguration")
        assert "cert-manager.io/inject-ca-from" not in configuration["metadata"].get("annotations", {})
        (hook,) = configuration["webhooks"]
        assert base64.b64decode(hook["clientConfig"]["caBundle"]).decode() == CA_PEM


@pytest.mark.parametrize(
    "bundle",
    ["", base64.b64encode(b"not a certificate").decode(), "%%%"],
    ids=["missing", "not-a-certificate", "garbage"],
)
def test_without_cert_manager_a_missing_or_wrong_ca_fails(bundle: str) -> None:
    with pytest.raises((HelmRenderError, HelmValuesError), match="caBundle"):
        render({"webhook": {"enabled": True, "certManager": {"enabled": False}, "caBundle": bundle}})


def test_an_issuer_of_the_cluster_replaces_the_chart_ca() -> None:
    objects = chart_objects(
        {"webhook": {"enabled": True, "certManager": {"issuerRef": {"name": "cluster-ca", "kind": "ClusterIssuer"}}}}
    )
    assert not [o for o in objects if o["kind"] == "Issuer"]
    (certificate,) = [o for o in objects if o["kind"] == "Certificate"]
    assert certificate["spec"]["issuerRef"] == {"name": "cluster-ca", "kind": "ClusterIssuer"}
    assert certificate["spec"]["secretName"] == "ccl-health-exporter-webhook-tls"
    assert one(objects, "MutatingWebhookConfiguration")["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": f"{NAMESPACE}/ccl-health-exporter-webhook"
    }
    validate_strictly(objects, ["1.30.0"])


def test_the_webhook_monitor_follows_the_exporters() -> None:
    objects = chart_objects(NON_DEFAULT)
    monitor = named(objects, "ServiceMonitor", "gpu-fabric-webhook")
    assert monitor["metadata"]["labels"]["release"] == "monitoring-stack"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["scheme"] == "https" and endpoint["interval"] == "30s"
    assert endpoint["tlsConfig"] == {
        "ca": {"secret": {"name": "gpu-fabric-webhook-serving", "key": "ca.crt"}},
        "serverName": f"gpu-fabric-webhook.{NAMESPACE}.svc",
    }
    service_ports = {p["name"] for p in named(objects, "Service", "gpu-fabric-webhook")["spec"]["ports"]}
    assert endpoint["port"] in service_ports
    assert not [
        o
        for o in chart_objects({"webhook": {"enabled": True, "monitor": {"enabled": False}}})
        if o["metadata"]["name"] == "ccl-health-exporter-webhook" and o["kind"] in ("PodMonitor", "ServiceMonitor")
    ]
    assert not [
        o
        for o in chart_objects({"webhook": {"enabled": True}, "podMonitor": {"enabled": False}})
        if o["kind"] in ("PodMonitor", "ServiceMonitor")
    ]


def test_the_webhook_certificate_names_the_service_the_api_server_calls() -> None:
    objects = chart_objects({"fullnameOverride": "gpu-fabric", "webhook": {"enabled": True}})
    configuration = one(objects, "MutatingWebhookConfiguration")
    namespace, _, name = configuration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].partition("/")
    certificate = named(objects, "Certificate", name)
    service = configuration["webhooks"][0]["clientConfig"]["service"]
    assert namespace == service["namespace"] == NAMESPACE
    assert f"{service['name']}.{namespace}.svc" in certificate["spec"]["dnsNames"]
    volumes = {v["name"]: v for v in one(objects, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == certificate["spec"]["secretName"]
    issuer = named(objects, "Issuer", certificate["spec"]["issuerRef"]["name"])
    assert (
        named(objects, "Certificate", "gpu-fabric-webhook-ca")["spec"]["secretName"]
        == issuer["spec"]["ca"]["secretName"]
    )


def test_notes_mention_the_hooks_when_on() -> None:
    notes_path = f"{RELEASE}/templates/NOTES.txt"
    quiet = render()[notes_path]
    assert "ccl-health.io/inject" not in quiet and "fabric-ready" not in quiet
    notes = render(BOTH_ON)[notes_path]
    assert "kubectl label namespace <namespace> ccl-health.io/inject=enabled" in notes
    assert "ccl-health.io/readiness-gate" in notes and "ccl-health.io/preflight" in notes
    assert "readiness, events, node-condition" in notes
    assert "cert-manager" in notes
    assert "ccl-health.io/inject" not in render(HOOKS_ON)[notes_path]


# ---- values.schema.json ----


def test_the_schema_accepts_the_test_values() -> None:
    with Chart.load(CHART) as chart:
        for values in (HOOKS_ON, WEBHOOK_ON, BOTH_ON, BEFORE_1_30, NON_DEFAULT):
            chart.validate_schema(values)


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"webhook": {"failurePolicy": "Fail"}}, "failurePolicy"),
        ({"webhook": {"timeoutSeconds": -1}}, "timeoutSeconds"),
        ({"webhook": {"timeoutSeconds": 0}}, "timeoutSeconds"),
        ({"webhook": {"timeoutSeconds": 31}}, "timeoutSeconds"),
        ({"webhook": {"replicas": 0}}, "replicas"),
        ({"webhook": {"namespaceSelector": {"matchNames": ["ml"]}}}, "matchNames"),
        ({"webhook": {"gpuResources": ["nvidia.com/gpu'"]}}, "gpuResources"),
        ({"webhook": {"preflight": {"args": ["preflight --probe"]}}}, "args"),
        ({"webhook": {"preflight": {"args": []}}}, "args"),
        ({"webhook": {"caBundle": "%%%"}}, "caBundle"),
        ({"webhook": {"certManager": {"issuerRef": {"kind": "ClusterIssuer"}}}}, "issuerRef"),
        ({"webhook": {"tls": {"secretName": "Not_A_Name"}}}, "secretName"),
        ({"webhook": {"enabld": True}}, "enabld"),
        ({"lifecycle": {"hooks": ["taint"]}}, "hooks"),
        ({"lifecycle": {"hooks": []}}, "hooks"),
        ({"lifecycle": {"nodeCondition": {"interval": 0}}}, "interval"),
        ({"lifecycle": {"nodeCondition": {"probeFloor": -1}}}, "probeFloor"),
        ({"collectors": {"lifecycle": "yes"}}, "lifecycle"),
    ],
    ids=lambda v: str(v)[:50],
)
def test_the_schema_rejects_bad_values(values: dict[str, Any], complaint: str) -> None:
    with Chart.load(CHART) as chart, pytest.raises(HelmValuesError, match=re.escape(complaint)):
        chart.validate_schema(values)

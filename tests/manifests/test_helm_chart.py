"""The Helm chart, driven by the real Helm engine (helm-python-sdk bundles Helm v4's Go SDK).

- ``helm lint --strict`` finds nothing beyond the icon note (with default and other values);
- the default render is the kustomize base in substance, the probe render the idle-probes
  overlay, the kube-prometheus-stack values file the kube-prometheus-stack overlay; what may
  differ is listed in ``ALLOWED_DIFFERENCES`` and normalised away (the chart's object names,
  made from the release, renamed to the base's), nothing else;
- renders with non-default values validate strictly against every Kubernetes version
  kubernetes-validate bundles, and the scanner (checkov) accepts them as it does the base;
- values.schema.json rejects bad values;
- the chart's copies of the rules and dashboards equal their sources (a drift test).
"""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from helm_python import Chart, HelmRenderError, HelmValuesError, lint

from devtools import chart_files
from devtools.stack import pod_monitor_endpoint
from tests import yaml_docs
from tests.conftest import REPO
from tests.manifests.test_manifests import (
    _STR,
    CORE_KINDS,
    CRD_SCHEMAS,
    IDLE_PROBES,
    KUBE_PROMETHEUS_STACK,
    MANIFESTS,
    _closed,
    _render,
    assert_prepares_the_results_folder,
    scan,
)

CHART = MANIFESTS / "helm" / "ccl-health-exporter"
NAMESPACE = "ccl-health"
RELEASE = "ccl-health-exporter"  # what docs/deploy.md installs: its objects are named ccl-health-exporter
# The release the comparisons with kustomize render, and the names its objects get, each with the
# base's name for the same object (longest first: the webhook's names start with the fullname).
COMPARED_RELEASE = "fabric"
_COMPARED_FULLNAME = "fabric-ccl-health-exporter"
BASE_NAMES = [
    (f"{_COMPARED_FULLNAME}-webhook", "ccl-webhook"),
    (f"{_COMPARED_FULLNAME}-global-rules", "ccl-health-global-rules"),
    (f"{_COMPARED_FULLNAME}-rules", "ccl-health-rules"),
    (f"{_COMPARED_FULLNAME}-dashboard-", "grafana-dashboard-"),
    (_COMPARED_FULLNAME, "ccl-exporter"),
]
# Cluster-scoped objects the base named after the project rather than after the object it serves.
BASE_NAMES_BY_KIND = {("MutatingWebhookConfiguration", "ccl-webhook"): "ccl-health-webhook"}
# Every minor version whose schemas kubernetes-validate bundles (docs/deploy.md's matrix).
KUBERNETES_VERSIONS = [f"1.{minor}.0" for minor in range(25, 38)]

# What may differ between the default render and `kubectl kustomize manifests/`, and why:
ALLOWED_DIFFERENCES = {
    "Namespace": "Helm installs into a namespace that exists (or --create-namespace); the chart "
    "does not own it. docs/deploy.md labels it for Pod Security, as the base's does.",
    "standard labels": "Helm's standard labels (helm.sh/chart, app.kubernetes.io/instance, managed-by, version) "
    "and the app name label on objects where the base has none.",
    "checkov reasons": "the DaemonSet's checkov skips accept the same checks; a reason may name the "
    "chart's value instead of a kustomize overlay.",
    "list order": "env, volumeMounts, volumes and ports are compared by name (kustomize's patches reorder "
    "them; Kubernetes does not care), and readOnly: false is the same as no readOnly.",
    "object names": "the chart names its objects after the release (<release>-ccl-health-exporter, as "
    "prometheus-node-exporter's chart does) so that two releases coexist; the base keeps its fixed "
    "names. The comparison renames the chart's to the base's (BASE_NAMES), references included.",
    "instance label in selectors": "the chart's selectors also match app.kubernetes.io/instance, so that a "
    "release never selects another's pods; the base is one install per cluster and "
    "keeps its selectors (a DaemonSet's selector cannot change in place).",
    "helm test": "the objects of `helm test` (annotated helm.sh/hook: test) exist only while the test runs.",
}
HELM_LABELS = {
    "helm.sh/chart",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/version",
    "app.kubernetes.io/name",
}
# The only lint note the chart keeps: it has no icon to show in a chart repository.
ACCEPTED_LINT_INFO = {"icon is recommended"}


def render(values: dict[str, Any] | None = None, *, name: str = RELEASE, namespace: str = NAMESPACE) -> dict[str, str]:
    with Chart.load(CHART) as chart:
        return chart.render(values or {}, name=name, namespace=namespace)


def is_test_hook(obj: dict[str, Any]) -> bool:
    return obj["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"


def objects_of(rendered: dict[str, str], *, tests: bool = False) -> list[dict[str, Any]]:
    """The objects of a render; those of `helm test` (which exist only while it runs) with ``tests``."""
    found = []
    for path, text in sorted(rendered.items()):
        if path.endswith(".txt"):
            continue
        found.extend(doc for doc in yaml_docs.load_all(text) if doc and (tests or not is_test_hook(doc)))
    return found


def chart_objects(values: dict[str, Any] | None = None, *, tests: bool = False) -> list[dict[str, Any]]:
    return objects_of(render(values), tests=tests)


def base_named(obj: dict[str, Any]) -> dict[str, Any]:
    """A chart object rendered for COMPARED_RELEASE with the base's names (ALLOWED_DIFFERENCES)."""
    text = yaml.safe_dump(obj)
    for chart_name, base_name in BASE_NAMES:
        text = text.replace(chart_name, base_name)
    renamed: dict[str, Any] = yaml_docs.load(text)
    key = (renamed["kind"], renamed["metadata"]["name"])
    renamed["metadata"]["name"] = BASE_NAMES_BY_KIND.get(key, key[1])
    return renamed


def compared_objects(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The render to compare with kustomize: COMPARED_RELEASE's objects without `helm test`'s,
    named as the base names them."""
    return [base_named(o) for o in objects_of(render(values, name=COMPARED_RELEASE))]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


RULE_FILES = {"ccl-health-rules": "node", "ccl-health-global-rules": "global"}  # alerts/ file -> its half


def prometheus_rules(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The PrometheusRules by their half (ccl-health.io/rules: node or global)."""
    return {o["metadata"]["labels"]["ccl-health.io/rules"]: o for o in objects if o["kind"] == "PrometheusRule"}


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (only,) = one(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    return only  # type: ignore[no-any-return]


def _sorted_named(value: Any) -> Any:
    """Lists of named items sorted by name, readOnly: false dropped, recursively."""
    if isinstance(value, dict):
        return {k: _sorted_named(v) for k, v in value.items() if not (k == "readOnly" and v is False)}
    if isinstance(value, list):
        items = [_sorted_named(v) for v in value]
        if items and all(isinstance(v, dict) and "name" in v for v in items):
            items.sort(key=lambda v: str(v["name"]))
        return items
    return value


def _metadata(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The object's metadata and, for a workload, its pod template's."""
    return [obj["metadata"], *([obj["spec"]["template"]["metadata"]] if "template" in obj.get("spec", {}) else [])]


def _without_key(value: Any, key: str) -> Any:
    if isinstance(value, dict):
        return {k: _without_key(v, key) for k, v in value.items() if k != key}
    if isinstance(value, list):
        return [_without_key(v, key) for v in value]
    return value


def normalised(obj: dict[str, Any], base: dict[str, Any] | None = None) -> dict[str, Any]:
    """``obj`` with the allowed differences taken out (see ALLOWED_DIFFERENCES): for a rendered
    object, Helm's standard labels that ``base`` (its kustomize twin) does not have, and the
    instance label in selectors where the base has it nowhere."""
    obj = copy.deepcopy(obj)
    if base is not None and "app.kubernetes.io/instance" not in yaml.safe_dump(base):
        obj = _without_key(obj, "app.kubernetes.io/instance")
    for index, meta in enumerate(_metadata(obj)):
        labels = meta.get("labels", {})
        if base is not None:
            base_labels = _metadata(base)[index].get("labels", {})
            for key in HELM_LABELS & set(labels) - set(base_labels):
                del labels[key]
        for key, reason in list(meta.get("annotations", {}).items()):
            if key.startswith("checkov.io/skip"):
                meta["annotations"][key] = reason.partition("=")[0]
    return _sorted_named(obj)  # type: ignore[no-any-return]


def assert_same_in_substance(kustomized: list[dict[str, Any]], charted: list[dict[str, Any]]) -> None:
    base = {(o["kind"], o["metadata"]["name"]): o for o in kustomized if o["kind"] != "Namespace"}
    helm = {(o["kind"], o["metadata"]["name"]): o for o in charted}
    assert sorted(helm) == sorted(base)
    for key, obj in base.items():
        assert normalised(helm[key], obj) == normalised(obj), f"{key} differs from the kustomize base"


@pytest.fixture(scope="module")
def kustomized() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(_render(MANIFESTS)) if doc]


# ---- lint ----


@pytest.mark.parametrize("values_name", ["defaults", "values-kube-prometheus-stack.yaml", "non-default"])
def test_strict_lint_is_clean(values_name: str) -> None:
    values = (
        yaml.safe_load((CHART / values_name).read_text())
        if values_name.endswith(".yaml")
        else {"defaults": None, "non-default": NON_DEFAULT}[values_name]
    )
    for kube_version in ("v1.25.0", "v1.37.0"):
        report = lint(CHART, values, strict=True, namespace=NAMESPACE, kube_version=kube_version)
        assert report["errors"] == [], report
        assert {m["error"] for m in report["messages"]} <= ACCEPTED_LINT_INFO, report
        assert all(m["severity"] <= 1 for m in report["messages"]), report


def test_strict_lint_catches_a_broken_template(tmp_path: Path) -> None:
    broken = tmp_path / "ccl-health-exporter"
    shutil.copytree(CHART, broken)
    daemonset = broken / "templates" / "daemonset.yaml"
    daemonset.write_text(daemonset.read_text().replace("{{- end }}\n", "", 1))
    report = lint(broken, strict=True)
    assert report["errors"] or any(m["severity"] >= 2 for m in report["messages"])


# ---- the same objects as kustomize ----


def test_default_render_equals_the_kustomize_base(kustomized: list[dict[str, Any]]) -> None:
    assert {o["kind"] for o in kustomized} - {o["kind"] for o in compared_objects()} == {"Namespace"}
    assert_same_in_substance(kustomized, compared_objects())


def test_probes_render_equals_the_idle_probes_overlay() -> None:
    overlay = [doc for doc in yaml.safe_load_all(_render(IDLE_PROBES)) if doc]
    assert_same_in_substance(overlay, compared_objects({"probes": {"enabled": True}}))


def test_kube_prometheus_stack_values_equal_the_overlay() -> None:
    overlay = [doc for doc in yaml.safe_load_all(_render(KUBE_PROMETHEUS_STACK)) if doc]
    values = yaml.safe_load((CHART / "values-kube-prometheus-stack.yaml").read_text())
    charted = compared_objects(values)
    assert_same_in_substance(overlay, charted)
    assert {o["kind"] for o in charted if o["metadata"]["labels"].get("release") == "kube-prometheus-stack"} == {
        "PodMonitor",
        "PrometheusRule",
    }
    (scraper,) = one(charted, "NetworkPolicy")["spec"]["ingress"][0]["from"]
    assert scraper["podSelector"]["matchLabels"]["operator.prometheus.io/name"] == "kube-prometheus-stack-prometheus"


def test_the_comparison_sees_a_difference(kustomized: list[dict[str, Any]]) -> None:
    with pytest.raises(AssertionError, match="DaemonSet"):
        assert_same_in_substance(kustomized, compared_objects({"priorityClassName": "system-cluster-critical"}))
    with pytest.raises(AssertionError):
        assert_same_in_substance(kustomized, compared_objects({"networkPolicy": {"enabled": False}}))
    with pytest.raises(AssertionError, match="NetworkPolicy"):
        assert_same_in_substance(kustomized, compared_objects({"networkPolicy": {"prometheus": {"namespace": "obs"}}}))
    # The names are compared too: a chart name the renaming does not know is a difference.
    with pytest.raises(AssertionError):
        assert_same_in_substance(kustomized, [base_named(o) for o in objects_of(render(name="other"))])


# ---- non-default values ----

NON_DEFAULT: dict[str, Any] = {
    "fullnameOverride": "gpu-fabric",
    "image": {
        "repository": "registry.internal/ccl-health-exporter",
        "pullPolicy": "Always",
        "digest": "sha256:" + "ab" * 32,
    },
    "imagePullSecrets": [{"name": "registry-credentials"}],
    "port": 19500,
    "collectors": {"rdma": False, "podresources": False},
    "probes": {
        "enabled": True,
        "interval": 3600,
        "timeout": 120,
        "image": {"repository": "registry.internal/ccl-health-exporter-probe", "digest": "sha256:" + "cd" * 32},
    },
    "hostPaths": {"podResources": "/var/lib/k0s/kubelet/pod-resources", "probeResults": "/data/ccl/results/"},
    "commonLabels": {"cost-center": "gpu-platform"},
    "nvml": {"nvlinkGranularity": "gpu"},
    "web": {"configSecret": "ccl-web-config", "tls": {"enabled": True}, "basicAuth": {"enabled": True}},
    "extraArgs": ["--log.level=debug"],
    "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy.internal:3128"}],
    "extraVolumes": [{"name": "nccl-extra", "hostPath": {"path": "/scratch/nccl", "type": "Directory"}}],
    "extraVolumeMounts": [{"name": "nccl-extra", "mountPath": "/host/scratch/nccl", "readOnly": True}],
    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}},
    "priorityClassName": "gpu-infra",
    "runtimeClassName": "nvidia",
    "nodeSelector": {"node-role.kubernetes.io/gpu": ""},
    "tolerations": [{"operator": "Exists"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "nvidia.com/gpu.count", "operator": "Gt", "values": ["0"]}]}
                ]
            }
        }
    },
    "podLabels": {"team": "gpu-platform"},
    "podAnnotations": {"example.com/owner": "gpu-platform"},
    "serviceAccount": {"annotations": {"example.com/audit": "true"}},
    "networkPolicy": {
        "scrapers": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "vmagent"}},
            }
        ],
        "apiServer": {"cidrs": ["10.0.0.1/32"], "ports": [6443]},
        "kubelet": {"cidrs": ["10.1.0.0/16"]},
    },
    "kubelet": {"port": 10255, "insecureSkipVerify": True},
    "podMonitor": {"enabled": False},
    "serviceMonitor": {
        "enabled": True,
        "additionalLabels": {"release": "monitoring-stack"},
        "interval": "30s",
        "scrapeTimeout": "20s",
        "scheme": "https",
        "tlsConfig": {"ca": {"secret": {"name": "ccl-web-config", "key": "ca.crt"}}, "serverName": "ccl-exporter"},
        "basicAuth": {
            "username": {"name": "ccl-scrape", "key": "username"},
            "password": {"name": "ccl-scrape", "key": "password"},
        },
        "metricRelabelings": [{"sourceLabels": ["__name__"], "regex": "python_.*", "action": "drop"}],
    },
    "prometheusRule": {
        "additionalLabels": {"release": "monitoring-stack"},
        "runbookBaseUrl": "https://wiki.internal/gpu/runbooks/",
    },
    "dashboards": {"namespace": "grafana", "annotations": {"grafana_folder": "GPU fabric"}},
    # A handler of the user's own replaces the chart's; timings alone keep it.
    "livenessProbe": {"tcpSocket": {"port": "metrics"}, "periodSeconds": 30},
    "readinessProbe": {"periodSeconds": 5},
}


def _operator_schemas() -> dict[str, Any]:
    """test_manifests' structural schemas, with the endpoint fields the chart can set, and the
    ServiceMonitor (the prometheus-operator v1 API; unknown fields still rejected)."""
    schemas = copy.deepcopy(CRD_SCHEMAS)
    endpoint = schemas["PodMonitor"]["properties"]["spec"]["properties"]["podMetricsEndpoints"]["items"]
    key_ref = _closed({"name": _STR, "key": _STR, "optional": {"type": "boolean"}}, ["name", "key"])
    secret_or_config_map = {
        "oneOf": [_closed({"secret": key_ref}, ["secret"]), _closed({"configMap": key_ref}, ["configMap"])]
    }
    safe_tls = {
        "ca": secret_or_config_map,
        "cert": secret_or_config_map,
        "keySecret": key_ref,
        "serverName": _STR,
        "insecureSkipVerify": {"type": "boolean"},
        "minVersion": _STR,
        "maxVersion": _STR,
    }
    endpoint["properties"].update(
        {
            # Lowercase only: operators before v0.87 reject HTTP and HTTPS.
            "scheme": {"enum": ["http", "https"]},
            # A PodMonitor's TLS has no file fields (SafeTLSConfig).
            "tlsConfig": _closed(safe_tls),
            "basicAuth": _closed({"username": key_ref, "password": key_ref}, ["username", "password"]),
        }
    )
    service_monitor = copy.deepcopy(schemas["PodMonitor"])
    service_monitor["properties"]["kind"] = {"const": "ServiceMonitor"}
    spec = service_monitor["properties"]["spec"]
    spec["properties"]["endpoints"] = spec["properties"].pop("podMetricsEndpoints")
    spec["required"] = ["selector", "endpoints"]
    spec["properties"]["endpoints"]["items"]["properties"]["tlsConfig"] = _closed(
        {**safe_tls, "caFile": _STR, "certFile": _STR, "keyFile": _STR}
    )
    schemas["ServiceMonitor"] = service_monitor
    return schemas


OPERATOR_SCHEMAS = _operator_schemas()
# What the chart renders beyond the base's kinds: the `helm test` pod.
CHART_CORE_KINDS = CORE_KINDS | {"Pod"}


def validate_strictly(objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        if obj["kind"] in CHART_CORE_KINDS:
            for version in KUBERNETES_VERSIONS:
                kubernetes_validate.validate(obj, version, strict=True)
        else:
            jsonschema.validate(obj, OPERATOR_SCHEMAS[obj["kind"]])


@pytest.mark.parametrize(
    "values", [{}, {"probes": {"enabled": True}}, NON_DEFAULT], ids=["defaults", "probes", "non-default"]
)
def test_renders_validate_strictly_on_every_kubernetes_version(values: dict[str, Any]) -> None:
    objects = chart_objects(values, tests=True)
    validate_strictly(objects)
    assert {o["kind"] for o in objects} <= CHART_CORE_KINDS | set(OPERATOR_SCHEMAS)


def test_strict_validation_of_a_render_catches_a_typo() -> None:
    objects = chart_objects(
        {
            "extraVolumeMounts": [{"name": "x", "mountPath": "/x", "readOnlee": True}],
            "extraVolumes": [{"name": "x", "emptyDir": {}}],
        }
    )
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_strictly(objects)


def test_non_default_values_reach_the_objects() -> None:
    objects = chart_objects(NON_DEFAULT)
    kinds = {o["kind"] for o in objects}
    assert "ServiceMonitor" in kinds and "PodMonitor" not in kinds
    daemonset = one(objects, "DaemonSet")
    assert daemonset["metadata"]["name"] == "gpu-fabric"
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia" and pod["priorityClassName"] == "gpu-infra"
    assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}]
    assert pod["affinity"] == NON_DEFAULT["affinity"] and pod["tolerations"] == NON_DEFAULT["tolerations"]
    assert pod["serviceAccountName"] == "gpu-fabric"
    exporter_container = container(objects)
    assert exporter_container["image"] == "registry.internal/ccl-health-exporter-probe@sha256:" + "cd" * 32
    assert exporter_container["imagePullPolicy"] == "Always"
    assert exporter_container["ports"] == [{"name": "metrics", "containerPort": 19500, "protocol": "TCP"}]
    args = exporter_container["args"]
    assert "--web.listen-address=0.0.0.0:19500" in args
    assert {"--no-collector.podresources", "--no-collector.rdma"} <= set(args)
    assert "--collector.nvml.nvlink-granularity=gpu" in args
    assert args[-2:] == ["--web.config.file=/etc/ccl-exporter/web/web-config.yml", "--log.level=debug"]
    assert {"name": "HTTPS_PROXY", "value": "http://proxy.internal:3128"} in exporter_container["env"]
    mounts = {m["name"]: m for m in exporter_container["volumeMounts"]}
    assert mounts["web-config"] == {"name": "web-config", "mountPath": "/etc/ccl-exporter/web", "readOnly": True}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["web-config"]["secret"]["secretName"] == "ccl-web-config"
    assert volumes["pod-resources"]["hostPath"]["path"] == "/var/lib/k0s/kubelet/pod-resources"
    assert "nccl-extra" in volumes and "nccl-extra" in mounts
    monitor = one(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "monitoring-stack"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["scheme"] == "https" and endpoint["honorLabels"] is True
    assert endpoint["relabelings"][0] == {
        "sourceLabels": ["__meta_kubernetes_pod_node_name"],
        "targetLabel": "node",
        "action": "replace",
    }
    assert one(objects, "Service")["spec"]["ports"][0]["port"] == 19500
    rules = prometheus_rules(objects)
    assert set(rules) == set(RULE_FILES.values())
    assert all(rule["metadata"]["labels"]["release"] == "monitoring-stack" for rule in rules.values())
    assert {o["metadata"]["labels"]["cost-center"] for o in objects} == {"gpu-platform"}, "commonLabels on everything"
    assert daemonset["spec"]["template"]["metadata"]["labels"]["cost-center"] == "gpu-platform"
    assert exporter_container["livenessProbe"] == {
        "tcpSocket": {"port": "metrics"},
        "periodSeconds": 30,
        "initialDelaySeconds": 5,
        "timeoutSeconds": 5,
    }
    assert exporter_container["readinessProbe"] == {
        "httpGet": {"path": "/readyz", "port": "metrics", "scheme": "HTTPS"},
        "periodSeconds": 5,
        "timeoutSeconds": 5,
    }
    assert {m["metadata"]["namespace"] for m in objects if m["kind"] == "ConfigMap"} == {"grafana"}
    policy = one(objects, "NetworkPolicy")["spec"]
    assert policy["ingress"][0]["from"] == NON_DEFAULT["networkPolicy"]["scrapers"]
    assert policy["egress"][1] == {
        "to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}],
        "ports": [{"protocol": "TCP", "port": 6443}],
    }
    assert policy["egress"][2] == {
        "to": [{"ipBlock": {"cidr": "10.1.0.0/16"}}],
        "ports": [{"protocol": "TCP", "port": 10255}],
    }


def test_the_args_are_flags_serve_accepts() -> None:
    """Every argument the chart renders parses as a `serve` flag, web.configSecret's included."""
    from exporter.collectors import all_collectors
    from exporter.commands import build_parser
    from exporter.commands.serve import config_from_args

    exporter = container(chart_objects(NON_DEFAULT))
    args = [a.replace("$(NODE_NAME)", "gpu-node-1").replace("$(HOST_IP)", "10.1.2.3") for a in exporter["args"]]
    parsed = build_parser(environ={}).parse_args(args)
    assert parsed.web_config_file == "/etc/ccl-exporter/web/web-config.yml"
    config = config_from_args(parsed, all_collectors())
    assert config.enabled_collectors == ("nvml", "podnetwork", "nccl", "inspector", "probe", "topology")
    assert parsed.podnetwork_kubelet_url == "https://10.1.2.3:10255/stats/summary"
    assert parsed.podnetwork_insecure_skip_verify is True
    host_ip = next(e for e in exporter["env"] if e["name"] == "HOST_IP")
    assert host_ip["valueFrom"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    assert config.listen_address == "0.0.0.0:19500" and parsed.node_name == "gpu-node-1"
    assert parsed.probe_interval == 3600 and parsed.probe_timeout == 120


def test_without_the_podnetwork_collector_the_kubelet_is_neither_called_nor_reachable() -> None:
    objects = chart_objects({"collectors": {"podnetwork": False}})
    args = container(objects)["args"]
    assert "--no-collector.podnetwork" in args
    assert not any(a.startswith("--collector.podnetwork.") for a in args)
    assert len(one(objects, "NetworkPolicy")["spec"]["egress"]) == 2, "DNS and the API server only"
    default = chart_objects()
    assert "--collector.podnetwork.kubelet-url=https://$(HOST_IP):10250/stats/summary" in container(default)["args"]
    assert "--collector.podnetwork.insecure-skip-verify" not in container(default)["args"], "verified by default"


def test_web_config_secret_is_off_by_default() -> None:
    exporter_container = container(chart_objects())
    assert not any(a.startswith("--web.config.file") for a in exporter_container["args"])
    assert "web-config" not in {m["name"] for m in exporter_container["volumeMounts"]}


def _dashboard_links(objects: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(title, url) of every panel link of the rendered dashboards."""
    found = []
    for config_map in (o for o in objects if o["kind"] == "ConfigMap"):
        for text in config_map["data"].values():
            for panel in json.loads(text)["panels"]:
                found.extend((link["title"], link["url"]) for link in panel.get("links", []))
    return found


def test_runbook_base_url_moves_every_link() -> None:
    """The alerts' runbook_url and the dashboards' runbook links alike; the dashboards' links to
    each other stay."""
    from alerts.sync import RUNBOOK_BASE_URL

    base = "https://wiki.internal/gpu/runbooks/"
    objects = chart_objects({"prometheusRule": {"runbookBaseUrl": base}})
    rules = prometheus_rules(objects).values()
    alerts = [r for rule in rules for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert alerts
    for alert in alerts:
        assert alert["annotations"]["runbook_url"] == f"{base}{alert['alert']}.md"
    links, shipped = _dashboard_links(objects), _dashboard_links(chart_objects())
    runbooks = [(title, url) for title, url in links if title.startswith("Runbook: ")]
    assert len(runbooks) >= 10
    for title, url in runbooks:
        assert url == f"{base}{title.removeprefix('Runbook: ')}.md"
    assert [u for t, u in shipped if t.startswith("Runbook: ")] == [
        f"{RUNBOOK_BASE_URL}{t.removeprefix('Runbook: ')}.md" for t, _ in shipped if t.startswith("Runbook: ")
    ]
    assert [link for link in links if not link[0].startswith("Runbook: ")] == [
        link for link in shipped if not link[0].startswith("Runbook: ")
    ], "links between dashboards stay"


def test_global_rules_can_be_left_to_a_global_ruler() -> None:
    """prometheusRule.globalRules=false: only the node-level rules, for a sharded Prometheus whose
    cross-node rules run on Thanos Ruler, Mimir's ruler or vmalert."""
    assert set(prometheus_rules(chart_objects({"prometheusRule": {"globalRules": False}}))) == {"node"}
    assert prometheus_rules(chart_objects({"prometheusRule": {"enabled": False}})) == {}


def test_both_monitors_relabel_as_the_kustomize_pod_monitor_then_as_the_user_asks() -> None:
    """The rules need what the base PodMonitor's metric relabelings give (``ccl_rule_partition``
    on the Inspector's counters, which the in-job rate groups split the nodes by): the chart's
    Pod- and ServiceMonitor give the same, and append the user's own."""
    shipped = pod_monitor_endpoint(REPO)["metricRelabelings"]
    assert any(step["targetLabel"] == "ccl_rule_partition" for step in shipped)
    (pod_endpoint,) = one(chart_objects({}), "PodMonitor")["spec"]["podMetricsEndpoints"]
    assert pod_endpoint["metricRelabelings"] == shipped
    (service_endpoint,) = one(chart_objects(NON_DEFAULT), "ServiceMonitor")["spec"]["endpoints"]
    assert service_endpoint["metricRelabelings"] == shipped + NON_DEFAULT["serviceMonitor"]["metricRelabelings"]


def test_service_monitor_needs_the_service() -> None:
    with pytest.raises(HelmRenderError, match=r"serviceMonitor\.enabled needs service\.enabled"):
        render({"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": False}, "service": {"enabled": False}})


def _pod(values: dict[str, Any]) -> dict[str, Any]:
    return one(chart_objects(values), "DaemonSet")["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def test_the_results_folder_is_prepared_wherever_it_is() -> None:
    """The init container follows hostPaths.probeResults (with probes on, too); a trailing slash
    does not separate the folder from its parent."""
    init = assert_prepares_the_results_folder(_pod(NON_DEFAULT))
    assert init["args"] == ["prepare-results", "--warn-only", "--path.probe-results=/host/data/ccl/results"]
    assert init["image"] == "registry.internal/ccl-health-exporter-probe@sha256:" + "cd" * 32
    volumes = {v["name"]: v for v in _pod(NON_DEFAULT)["volumes"]}
    assert volumes["probe-results-parent"]["hostPath"] == {"path": "/data/ccl", "type": "DirectoryOrCreate"}
    assert_prepares_the_results_folder(_pod({"probes": {"enabled": True}}))


def test_preparing_the_results_folder_can_be_left_to_the_nodes() -> None:
    pod = _pod({"prepareProbeResults": {"enabled": False}})
    assert "initContainers" not in pod
    assert "probe-results-parent" not in {v["name"] for v in pod["volumes"]}


def test_a_results_folder_right_below_the_root_is_not_prepared_through_it() -> None:
    """Its parent would be the node's /, mounted read-write: the render fails and says the way out."""
    with pytest.raises(HelmRenderError, match=r"hostPaths\.probeResults must be a folder below another folder than /"):
        render({"hostPaths": {"probeResults": "/results"}})
    assert "initContainers" not in _pod(
        {"hostPaths": {"probeResults": "/results"}, "prepareProbeResults": {"enabled": False}}
    )


def test_probes_need_the_probe_collector() -> None:
    with pytest.raises(HelmRenderError, match=r"probes\.enabled needs collectors\.probe"):
        render({"probes": {"enabled": True}, "collectors": {"probe": False}})


def test_notes_say_what_to_do_next() -> None:
    notes = render()[f"{RELEASE}/templates/NOTES.txt"]
    assert "pod-security.kubernetes.io/enforce=privileged" in notes
    assert "port-forward daemonset/ccl-health-exporter 19400" in notes
    assert "podMonitor.additionalLabels.release" in notes, "points kube-prometheus-stack users at the release label"
    assert f"helm test {RELEASE} -n {NAMESPACE}" in notes
    assert "DEPRECATED" not in notes
    labelled = render(yaml.safe_load((CHART / "values-kube-prometheus-stack.yaml").read_text()))
    assert "(release: kube-prometheus-stack)" in labelled[f"{RELEASE}/templates/NOTES.txt"]
    old_name = render({"podMonitor": {"labels": {"release": "stack"}}})[f"{RELEASE}/templates/NOTES.txt"]
    assert "(release: stack)" in old_name and "DEPRECATED: podMonitor.labels" in old_name


def test_checkov_finds_nothing_unexplained_in_the_renders(tmp_path: Path) -> None:
    for name, values in (("defaults", {}), ("probes", {"probes": {"enabled": True}}), ("non-default", NON_DEFAULT)):
        text = "\n---\n".join(yaml.safe_dump(o) for o in chart_objects(values, tests=True))
        (tmp_path / f"{name}.yaml").write_text(text)
    report = scan(tmp_path)
    assert report["summary"]["passed"] > 30, "the scanner checked all three renders"


# ---- values.schema.json ----


@pytest.mark.parametrize(
    "values",
    [
        {},
        NON_DEFAULT,
        {"probes": {"enabled": True}},
    ],
    ids=["defaults", "non-default", "probes"],
)
def test_the_schema_accepts_good_values(values: dict[str, Any]) -> None:
    with Chart.load(CHART) as chart:
        chart.validate_schema(values)
        chart.validate_schema(yaml.safe_load((CHART / "values-kube-prometheus-stack.yaml").read_text()))


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"imagee": {"tag": "1"}}, "imagee"),
        ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
        ({"image": {"digest": "latest"}}, "digest"),
        ({"port": "19400"}, "port"),
        ({"port": 70000}, "port"),
        ({"collectors": {"rdma": "no"}}, "rdma"),
        ({"collectors": {"infiniband": False}}, "infiniband"),
        ({"tolerations": {"key": "nvidia.com/gpu"}}, "tolerations"),
        ({"resources": {"limits": {"memory": "lots"}}}, "memory"),
        ({"hostPaths": {"podLogs": "var/log/pods"}}, "podLogs"),
        ({"web": {"configSecret": "Not_A_Name"}}, "configSecret"),
        ({"extraArgs": ["serve"]}, "extraArgs"),
        ({"podMonitor": {"interval": "15 seconds"}}, "interval"),
        ({"podMonitor": {"labels": {"release": 1}}}, "release"),
        ({"prometheusRule": {"runbookBaseUrl": "wiki/runbooks"}}, "runbookBaseUrl"),
        ({"networkPolicy": {"apiServer": {"cidrs": ["control-plane"]}}}, "cidrs"),
        ({"probes": {"interval": 0}}, "interval"),
        ({"prepareProbeResults": {"enabled": "yes"}}, "enabled"),
    ],
    ids=lambda v: str(v)[:40],
)
def test_the_schema_rejects_bad_values(values: dict[str, Any], complaint: str) -> None:
    with Chart.load(CHART) as chart:
        with pytest.raises(HelmValuesError, match=re.escape(complaint)):
            chart.validate_schema(values)
        with pytest.raises(HelmValuesError):
            chart.render(values, name=RELEASE, namespace=NAMESPACE)


# ---- drift: the chart, the kustomize base, alerts/ and dashboards/ in step ----


def test_the_chart_copies_equal_their_sources() -> None:
    assert chart_files.stale(chart_files.wanted()) == [], "run python -m devtools.chart_files"
    for name in RULE_FILES:
        assert (CHART / "files" / f"{name}.yaml").read_bytes() == (REPO / "alerts" / f"{name}.yaml").read_bytes()
    assert sorted(p.name for p in (CHART / "files" / "dashboards").iterdir()) == sorted(
        p.name for p in (REPO / "dashboards").glob("*.json")
    )


def test_the_drift_check_sees_a_stale_copy() -> None:
    copies = chart_files.wanted()
    rules = CHART / "files" / "ccl-health-rules.yaml"
    copies[rules] = copies[rules] + b"# changed\n"
    assert chart_files.stale(copies) == [rules]
    dashboard = next(iter(p for p in copies if p.suffix == ".json"))
    del copies[dashboard]
    assert dashboard in chart_files.stale(copies), "a copy nothing makes any more is stale too"


def test_rendered_rules_and_dashboards_equal_the_base_and_their_sources(kustomized: list[dict[str, Any]]) -> None:
    charted = compared_objects()
    charted_rules, kustomized_rules = prometheus_rules(charted), prometheus_rules(kustomized)
    assert set(charted_rules) == set(kustomized_rules) == set(RULE_FILES.values())
    for name, half in RULE_FILES.items():
        rules = yaml.safe_load((REPO / "alerts" / f"{name}.yaml").read_text())
        assert charted_rules[half]["spec"] == rules == kustomized_rules[half]["spec"]
        assert charted_rules[half]["metadata"]["name"] == kustomized_rules[half]["metadata"]["name"] == name
    maps = {m["metadata"]["name"]: m["data"] for m in charted if m["kind"] == "ConfigMap"}
    assert maps == {m["metadata"]["name"]: m["data"] for m in kustomized if m["kind"] == "ConfigMap"}
    for data in maps.values():
        for key, text in data.items():
            assert text == (REPO / "dashboards" / key).read_text()


def test_the_chart_knows_every_collector_and_the_version() -> None:
    from exporter.collectors import all_collectors

    specs = all_collectors()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    # The lifecycle collector follows lifecycle.enabled (which brings its RBAC): unset here.
    assert values["collectors"] == {
        spec.name: None if spec.name == "lifecycle" else spec.default_enabled for spec in specs
    }
    schema = yaml.safe_load((CHART / "values.schema.json").read_text())
    assert set(schema["properties"]["collectors"]["properties"]) == {spec.name for spec in specs}
    every_collector_on = {"collectors": {spec.name: True for spec in specs}, "lifecycle": {"enabled": True}}
    args = [a.replace("$(NODE_NAME)", "n") for a in container(chart_objects(every_collector_on))["args"]]
    from exporter.commands import build_parser
    from exporter.commands.serve import config_from_args

    enabled = config_from_args(build_parser(environ={}).parse_args(args), specs).enabled_collectors
    assert set(enabled) == {spec.name for spec in specs}, "a collector off by default is switched on when asked"
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    # appVersion names the latest release (tests/house/test_release.py); the default image tag follows it.
    assert container(chart_objects())["image"] == f"ccl-health-exporter:{chart['appVersion']}"


def test_every_documented_set_is_a_value_the_schema_accepts() -> None:
    """`--set key=value` in the docs and the chart's NOTES must name values the chart has."""
    from helm_python import parse_set_string

    texts = [(REPO / "docs" / name).read_text() for name in ("deploy.md", "coexistence.md", "lifecycle.md")]
    texts.append((CHART / "templates" / "NOTES.txt").read_text())
    found = [match for text in texts for match in re.findall(r"--set ([A-Za-z0-9_.\[\]]+=[^\s`]+)", text)]
    assert len(found) >= 5
    with Chart.load(CHART) as chart:
        for assignment in found:
            filled = re.sub(r"<[^>]*>", "placeholder", assignment)  # <release-name>, <your-docs>
            chart.validate_schema(parse_set_string(filled))

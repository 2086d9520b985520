"""The chart's conventions, as in the charts SREs already run (prometheus-node-exporter's,
dcgm-exporter's), rendered by the real Helm engine like tests/manifests/test_helm_chart.py:

- object names follow the release (node-exporter's fullname helper, 63 characters), selectors
  carry app.kubernetes.io/instance: two releases coexist in a namespace and in a cluster, none
  selecting the other's pods;
- the web configuration (TLS, client certificates, basic auth) reaches the probes and the
  monitors, and a render that could not scrape or probe fails with the way out;
- `helm test` scrapes as the monitor does; labels (commonLabels, podLabels, additionalLabels and
  the deprecated `labels`), tolerations, the NetworkPolicy's Prometheus, NVLink granularity and
  the requests follow the values and the measurements.

The TLS settings against a real exporter and a real Prometheus: tests/e2e/test_chart_tls.py.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from helm_python import Chart, HelmRenderError, HelmValuesError, lint

from exporter.http.server import UNAUTHENTICATED_PATHS
from tests.conftest import REPO
from tests.manifests.test_helm_chart import (
    ACCEPTED_LINT_INFO,
    CHART,
    NAMESPACE,
    RELEASE,
    container,
    objects_of,
    one,
    render,
)
from tests.manifests.test_manifests import tolerates

EVERYTHING_ON: dict[str, Any] = {
    "lifecycle": {"enabled": True},
    "webhook": {"enabled": True},
    "serviceMonitor": {"enabled": True},
}
CLUSTER_SCOPED = {
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "MutatingWebhookConfiguration",
    "PriorityClass",
}

TLS_CONFIG = {"ca": {"secret": {"name": "ccl-scrape-tls", "key": "ca.crt"}}, "serverName": "ccl-exporter"}
CLIENT_CERTIFICATE = {
    "cert": {"secret": {"name": "ccl-scrape-tls", "key": "tls.crt"}},
    "keySecret": {"name": "ccl-scrape-tls", "key": "tls.key"},
}
BASIC_AUTH = {
    "username": {"name": "ccl-scrape", "key": "username"},
    "password": {"name": "ccl-scrape", "key": "password"},
}


def release_objects(
    name: str, values: dict[str, Any] | None = None, namespace: str = NAMESPACE
) -> list[dict[str, Any]]:
    with Chart.load(CHART) as chart:
        return objects_of(chart.render(values or {}, name=name, namespace=namespace), tests=True)


def identity(obj: dict[str, Any]) -> tuple[str, str, str]:
    """What the API server keys an object by: kind, namespace (none for cluster-scoped), name."""
    namespace = "" if obj["kind"] in CLUSTER_SCOPED else obj["metadata"]["namespace"]
    return obj["kind"], namespace, obj["metadata"]["name"]


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and selector.items() <= labels.items()


def pod_labels(objects: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The labels of every pod the objects make (workloads' templates, `helm test`'s pod)."""
    found = [o["spec"]["template"]["metadata"]["labels"] for o in objects if o["kind"] in ("DaemonSet", "Deployment")]
    found += [o["metadata"]["labels"] for o in objects if o["kind"] == "Pod"]
    return found


def pod_selectors(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, str]]]:
    """Every label selector of the objects that picks pods, with where it is."""
    found = []
    for obj in objects:
        kind, spec, name = obj["kind"], obj.get("spec", {}), obj["metadata"]["name"]
        if kind in ("DaemonSet", "Deployment", "PodDisruptionBudget", "PodMonitor"):
            found.append((f"{kind} {name}", spec["selector"]["matchLabels"]))
        if kind == "Service":
            found.append((f"{kind} {name}", spec["selector"]))
        if kind == "NetworkPolicy":
            found.append((f"{kind} {name}", spec["podSelector"]["matchLabels"]))
            for rule in spec.get("ingress", []):
                found += [
                    (f"{kind} {name} from", peer["podSelector"]["matchLabels"])
                    for peer in rule.get("from", [])
                    if "podSelector" in peer and "namespaceSelector" not in peer
                ]
        for constraint in spec.get("template", {}).get("spec", {}).get("topologySpreadConstraints", []):
            found.append((f"{kind} {name} spread", constraint["labelSelector"]["matchLabels"]))
    return found


# ---- names and selectors: two releases coexist ----


@pytest.mark.parametrize(
    ("release", "fullname"),
    [
        (RELEASE, "ccl-health-exporter"),
        ("gpu-ccl-health-exporter-prod", "gpu-ccl-health-exporter-prod"),
        ("gpu-fabric", "gpu-fabric-ccl-health-exporter"),
    ],
    ids=["chart-name", "contains-chart-name", "other"],
)
def test_names_follow_the_release_as_node_exporters_chart_does(release: str, fullname: str) -> None:
    objects = release_objects(release)
    assert one(objects, "DaemonSet")["metadata"]["name"] == fullname
    assert one(objects, "ClusterRole")["metadata"]["name"] == fullname
    names = {o["metadata"]["name"] for o in objects}
    assert {f"{fullname}-rules", f"{fullname}-global-rules", f"{fullname}-test"} <= names
    override = release_objects(release, {"fullnameOverride": "gpu-fabric"})
    assert one(override, "DaemonSet")["metadata"]["name"] == "gpu-fabric"


@pytest.mark.parametrize("namespaces", [(NAMESPACE, NAMESPACE), ("gpu-a", "gpu-b")], ids=["one-namespace", "two"])
def test_two_releases_share_no_object_and_select_none_of_each_others_pods(namespaces: tuple[str, str]) -> None:
    first = release_objects("fabric-a", EVERYTHING_ON, namespace=namespaces[0])
    second = release_objects("fabric-b", EVERYTHING_ON, namespace=namespaces[1])
    kinds = {o["kind"] for o in first}
    assert {
        "DaemonSet",
        "Deployment",
        "MutatingWebhookConfiguration",
        "ValidatingAdmissionPolicy",
        "ClusterRole",
        "PodMonitor",
        "ServiceMonitor",
        "PrometheusRule",
        "ConfigMap",
        "Pod",
        "NetworkPolicy",
    } <= kinds
    for objects in (first, second):
        identities = [identity(o) for o in objects]
        assert len(identities) == len(set(identities)), "a release's own objects are distinct"
    assert not {identity(o) for o in first} & {identity(o) for o in second}
    for own, other in ((first, second), (second, first)):
        own_pods, other_pods = pod_labels(own), pod_labels(other)
        for where, selector in pod_selectors(own):
            assert any(selects(selector, labels) for labels in own_pods), f"{where} selects none of its own pods"
            assert not any(selects(selector, labels) for labels in other_pods), f"{where} selects the other's pods"
        services = {o["metadata"]["name"]: o["metadata"]["labels"] for o in other if o["kind"] == "Service"}
        for monitor in (o for o in own if o["kind"] == "ServiceMonitor"):
            selector = monitor["spec"]["selector"]["matchLabels"]
            assert not [name for name, labels in services.items() if selects(selector, labels)]


def test_the_selector_check_sees_a_shared_selector() -> None:
    """Without the instance label (what the chart had), the second release's pods are selected."""
    first, second = release_objects("fabric-a"), release_objects("fabric-b")
    (where, selector), *_ = pod_selectors(first)
    stripped = {k: v for k, v in selector.items() if k != "app.kubernetes.io/instance"}
    assert any(selects(selector, labels) for labels in pod_labels(first))
    assert not any(selects(selector, labels) for labels in pod_labels(second))
    assert any(selects(stripped, labels) for labels in pod_labels(second)), where


def test_long_release_names_fit_and_stay_apart() -> None:
    """Helm allows 53 characters: every name fits 63 (what a Service's name may have; the chart
    holds every name to it), and two long names that start alike still give two sets of names
    (a cut name ends in a hash of the whole)."""
    first = "gpu-fabric-" + "x" * 40 + "-a"
    second = "gpu-fabric-" + "x" * 40 + "-b"
    objects = {name: release_objects(name, EVERYTHING_ON) for name in (first, second)}
    for rendered in objects.values():
        for obj in rendered:
            name = obj["metadata"]["name"]
            assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", name), name
            assert len(name) <= 63, f"{obj['kind']} {name}: {len(name)} characters"
            assert all(len(v) <= 63 for v in obj["metadata"].get("labels", {}).values())
    assert not {identity(o) for o in objects[first]} & {identity(o) for o in objects[second]}
    webhook = one(objects[first], "Deployment")["metadata"]["name"]
    assert webhook.endswith("-webhook") and len(f"{webhook}-selfsigned") <= 63


# ---- the web configuration reaches the probes and the monitors ----


def _probes(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    exporter = container(release_objects(RELEASE, values))
    return exporter["livenessProbe"], exporter["readinessProbe"]


def test_the_probes_reach_the_paths_the_server_leaves_open() -> None:
    """Basic auth on: kubelet's httpGet probes carry no credentials, so they must probe paths
    the server serves without them."""
    liveness, readiness = _probes(
        {"web": {"configSecret": "ccl-web", "basicAuth": {"enabled": True}}, "podMonitor": {"basicAuth": BASIC_AUTH}}
    )
    assert {liveness["httpGet"]["path"], readiness["httpGet"]["path"]} == {"/healthz", "/readyz"}
    assert {liveness["httpGet"]["path"], readiness["httpGet"]["path"]} <= UNAUTHENTICATED_PATHS
    assert "scheme" not in liveness["httpGet"], "no TLS: plain HTTP"


@pytest.mark.parametrize(
    ("web", "monitor", "handler"),
    [
        ({}, {}, {"httpGet": {"path": "/healthz", "port": "metrics"}}),
        (
            {"tls": {"enabled": True}},
            {"tlsConfig": TLS_CONFIG},
            {"httpGet": {"path": "/healthz", "port": "metrics", "scheme": "HTTPS"}},
        ),
        (
            {"tls": {"enabled": True, "clientAuthType": "VerifyClientCertIfGiven"}},
            {"tlsConfig": TLS_CONFIG},
            {"httpGet": {"path": "/healthz", "port": "metrics", "scheme": "HTTPS"}},
        ),
        (
            {"tls": {"enabled": True, "clientAuthType": "RequireAndVerifyClientCert"}},
            {"tlsConfig": {**TLS_CONFIG, **CLIENT_CERTIFICATE}},
            {"tcpSocket": {"port": "metrics"}},
        ),
        (
            {"tls": {"enabled": True, "clientAuthType": "RequireAnyClientCert"}},
            {"tlsConfig": {**TLS_CONFIG, **CLIENT_CERTIFICATE}},
            {"tcpSocket": {"port": "metrics"}},
        ),
        (
            {"tls": {"enabled": True, "clientAuthType": "RequestClientCert"}},
            {"tlsConfig": TLS_CONFIG},
            {"httpGet": {"path": "/healthz", "port": "metrics", "scheme": "HTTPS"}},
        ),
        (
            {"tls": {"enabled": True}, "basicAuth": {"enabled": True}},
            {"tlsConfig": TLS_CONFIG, "basicAuth": BASIC_AUTH},
            {"httpGet": {"path": "/healthz", "port": "metrics", "scheme": "HTTPS"}},
        ),
    ],
    ids=[
        "plain",
        "tls",
        "tls-client-cert-if-given",
        "mtls",
        "any-client-cert",
        "client-cert-requested",
        "tls-basic-auth",
    ],
)
def test_the_probes_and_the_monitor_follow_the_web_configuration(
    web: dict[str, Any], monitor: dict[str, Any], handler: dict[str, Any]
) -> None:
    values = {"web": {"configSecret": "ccl-web", **web} if web else {}, "podMonitor": monitor}
    objects = release_objects(RELEASE, values)
    liveness = container(objects)["livenessProbe"]
    readiness = container(objects)["readinessProbe"]
    assert {k: v for k, v in liveness.items() if k in ("httpGet", "tcpSocket")} == handler
    if "httpGet" in handler:
        assert readiness["httpGet"] == {**handler["httpGet"], "path": "/readyz"}
    else:
        assert readiness["tcpSocket"] == handler["tcpSocket"]
    assert liveness["periodSeconds"] == 20 and readiness["periodSeconds"] == 10, "the timings stay"
    (endpoint,) = one(objects, "PodMonitor")["spec"]["podMetricsEndpoints"]
    assert endpoint.get("scheme") == ("https" if web.get("tls") else None)
    assert endpoint.get("tlsConfig") == monitor.get("tlsConfig")
    assert endpoint.get("basicAuth") == monitor.get("basicAuth")


def test_strict_lint_is_clean_with_client_certificates_and_basic_auth() -> None:
    values = {
        "web": {
            "configSecret": "ccl-web",
            "basicAuth": {"enabled": True},
            "tls": {"enabled": True, "clientAuthType": "RequireAndVerifyClientCert"},
        },
        "podMonitor": {"tlsConfig": {**TLS_CONFIG, **CLIENT_CERTIFICATE}, "basicAuth": BASIC_AUTH},
        "commonLabels": {"cost-center": "gpu"},
        **EVERYTHING_ON,
    }
    report = lint(CHART, values, strict=True, namespace=NAMESPACE, kube_version="v1.30.0")
    assert report["errors"] == [], report
    assert {m["error"] for m in report["messages"]} <= ACCEPTED_LINT_INFO, report


def test_the_scheme_is_written_lowercase() -> None:
    """Prometheus Operator before v0.87 accepts only http and https."""
    objects = release_objects(
        RELEASE,
        {
            "web": {"configSecret": "ccl-web", "tls": {"enabled": True}},
            "podMonitor": {"scheme": "HTTPS", "tlsConfig": TLS_CONFIG},
        },
    )
    assert one(objects, "PodMonitor")["spec"]["podMetricsEndpoints"][0]["scheme"] == "https"


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"web": {"tls": {"enabled": True}}}, "set web.configSecret"),
        (
            {"web": {"configSecret": "w", "tls": {"clientAuthType": "RequireAndVerifyClientCert"}}},
            "set web.tls.enabled too",
        ),
        ({"web": {"configSecret": "w", "tls": {"enabled": True}}}, "set podMonitor.tlsConfig"),
        (
            {
                "web": {"configSecret": "w", "tls": {"enabled": True}},
                "podMonitor": {"scheme": "http", "tlsConfig": TLS_CONFIG},
            },
            "podMonitor.scheme is http",
        ),
        (
            {"web": {"configSecret": "w"}, "podMonitor": {"scheme": "https", "tlsConfig": TLS_CONFIG}},
            "set web.tls.enabled",
        ),
        (
            {
                "web": {"configSecret": "w", "tls": {"enabled": True, "clientAuthType": "RequireAndVerifyClientCert"}},
                "podMonitor": {"tlsConfig": TLS_CONFIG},
            },
            "needs the client certificate and key",
        ),
        (
            {
                "web": {"configSecret": "w", "tls": {"enabled": True, "clientAuthType": "RequireAnyClientCert"}},
                "podMonitor": {"tlsConfig": TLS_CONFIG},
            },
            "RequireAnyClientCert: podMonitor.tlsConfig needs the client certificate",
        ),
        ({"web": {"configSecret": "w", "basicAuth": {"enabled": True}}}, "set podMonitor.basicAuth"),
        (
            {
                "web": {"configSecret": "w", "basicAuth": {"enabled": True}},
                "podMonitor": {"enabled": False},
                "serviceMonitor": {"enabled": True},
            },
            "set serviceMonitor.basicAuth",
        ),
    ],
    ids=[
        "tls-without-secret",
        "mtls-without-tls",
        "tls-without-tls-config",
        "tls-scraped-over-http",
        "https-without-tls",
        "mtls-without-client-certificate",
        "any-client-cert-without-one",
        "basic-auth-without-credentials",
        "service-monitor-without-credentials",
    ],
)
def test_a_render_that_could_not_scrape_fails_with_the_way_out(values: dict[str, Any], complaint: str) -> None:
    with pytest.raises(HelmRenderError, match=re.escape(complaint)):
        render(values)


def test_a_pod_monitor_takes_tls_from_secrets_only() -> None:
    """The operator's PodMonitor has no caFile/certFile/keyFile (files in the Prometheus pod);
    a ServiceMonitor has."""
    with Chart.load(CHART) as chart:
        with pytest.raises(HelmValuesError, match="caFile"):
            chart.validate_schema({"podMonitor": {"tlsConfig": {"caFile": "/etc/prometheus/ca.crt"}}})
        chart.validate_schema({"serviceMonitor": {"tlsConfig": {"caFile": "/etc/prometheus/ca.crt"}}})
        with pytest.raises(HelmValuesError, match="basicAuth"):
            chart.validate_schema({"podMonitor": {"basicAuth": {"username": {"name": "s", "key": "u"}}}})
    service_monitor = release_objects(
        RELEASE,
        {
            "web": {"configSecret": "w", "tls": {"enabled": True}},
            "podMonitor": {"enabled": False},
            "serviceMonitor": {"enabled": True, "tlsConfig": {"caFile": "/etc/prometheus/ca.crt", "serverName": "x"}},
        },
    )
    assert (
        one(service_monitor, "ServiceMonitor")["spec"]["endpoints"][0]["tlsConfig"]["caFile"]
        == "/etc/prometheus/ca.crt"
    )


# ---- helm test ----


def _test_pod(values: dict[str, Any]) -> dict[str, Any]:
    return one(release_objects(RELEASE, values), "Pod")


def _environment(pod: dict[str, Any]) -> dict[str, str]:
    (smoke,) = pod["spec"]["containers"]
    assert all("valueFrom" not in e for e in smoke["env"]), "secrets come as files"
    return {e["name"]: e["value"] for e in smoke["env"]}


def test_helm_test_scrapes_as_the_monitor_does() -> None:
    values = {
        "web": {
            "configSecret": "w",
            "tls": {"enabled": True, "clientAuthType": "RequireAndVerifyClientCert"},
            "basicAuth": {"enabled": True},
        },
        "podMonitor": {
            "tlsConfig": {
                **TLS_CONFIG,
                **CLIENT_CERTIFICATE,
                "ca": {"configMap": {"name": "fabric-ca", "key": "ca.pem"}},
            },
            "basicAuth": BASIC_AUTH,
        },
        "probes": {"enabled": True},
    }
    objects = release_objects(RELEASE, values)
    pod = one(objects, "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    env = _environment(pod)
    assert env == {
        "SMOKE_HOST": f"{RELEASE}.{NAMESPACE}.svc",
        "SMOKE_PORT": "19400",
        "SMOKE_SCHEME": "https",
        "SMOKE_SERVER_NAME": "ccl-exporter",
    }
    assert one(objects, "Service")["metadata"]["name"] == RELEASE
    (smoke,) = pod["spec"]["containers"]
    assert smoke["image"] == container(objects)["image"].removesuffix("-probe"), "the exporter's image, not the probe's"
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["tls"]["projected"]["sources"] == [
        {"configMap": {"name": "fabric-ca", "items": [{"key": "ca.pem", "path": "ca.crt"}]}},
        {"secret": {"name": "ccl-scrape-tls", "items": [{"key": "tls.crt", "path": "tls.crt"}]}},
        {"secret": {"name": "ccl-scrape-tls", "items": [{"key": "tls.key", "path": "tls.key"}]}},
    ]
    assert volumes["basic-auth"]["projected"]["sources"] == [
        {"secret": {"name": "ccl-scrape", "items": [{"key": "username", "path": "username"}]}},
        {"secret": {"name": "ccl-scrape", "items": [{"key": "password", "path": "password"}]}},
    ]
    mounts = {m["name"]: m["mountPath"] for m in smoke["volumeMounts"]}
    assert mounts == {
        "script": "/etc/ccl-exporter-test/script",
        "tls": "/etc/ccl-exporter-test/tls",
        "basic-auth": "/etc/ccl-exporter-test/basic-auth",
    }
    script = one(
        [o for o in objects if o["kind"] == "ConfigMap" and "helm.sh/hook" in o["metadata"].get("annotations", {})],
        "ConfigMap",
    )
    assert script["data"]["smoke_check.py"] == (CHART / "scripts" / "smoke_check.py").read_text()
    assert smoke["command"][-1] == "/etc/ccl-exporter-test/script/smoke_check.py"


def test_helm_test_is_admitted_to_the_exporters_and_kept_to_them() -> None:
    objects = release_objects(RELEASE)
    policies = {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "NetworkPolicy"}
    pod_labels_ = one(objects, "Pod")["metadata"]["labels"]
    exporter_labels = one(objects, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    admitting = policies[f"{RELEASE}-test-scrape"]
    assert selects(admitting["podSelector"]["matchLabels"], exporter_labels)
    assert selects(admitting["ingress"][0]["from"][0]["podSelector"]["matchLabels"], pod_labels_)
    confining = policies[f"{RELEASE}-test"]
    assert selects(confining["podSelector"]["matchLabels"], pod_labels_)
    assert confining["ingress"] == [] and confining["policyTypes"] == ["Ingress", "Egress"]
    assert selects(confining["egress"][1]["to"][0]["podSelector"]["matchLabels"], exporter_labels)
    assert not [
        o
        for o in release_objects(RELEASE, {"helmTest": {"enabled": False}})
        if "helm.sh/hook" in o["metadata"].get("annotations", {})
    ]


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        ({"service": {"enabled": False}}, "no Service to find the exporters by"),
        (
            {
                "web": {"configSecret": "w", "tls": {"enabled": True}},
                "podMonitor": {"enabled": False},
                "serviceMonitor": {"enabled": True, "tlsConfig": {"caFile": "/etc/prometheus/ca.crt"}},
            },
            "serviceMonitor.tlsConfig names files in the Prometheus pod",
        ),
    ],
    ids=["no-service", "files"],
)
def test_helm_test_says_what_it_cannot_test_when_it_runs(values: dict[str, Any], reason: str) -> None:
    """Not at install: the release installs, and `helm test` fails with the reason."""
    assert reason in _environment(_test_pod(values))["SMOKE_UNSUPPORTED"]


# ---- labels ----


def test_additional_labels_and_the_deprecated_labels_reach_the_monitors_and_rules() -> None:
    values = {
        "podMonitor": {"labels": {"release": "old", "team": "gpu"}, "additionalLabels": {"release": "new"}},
        "prometheusRule": {"labels": {"release": "old-rules"}},
        "webhook": {"enabled": True},
    }
    objects = release_objects(RELEASE, values)
    for monitor in (o for o in objects if o["kind"] == "PodMonitor"):  # the exporter's and the webhook's
        assert monitor["metadata"]["labels"]["release"] == "new", "additionalLabels wins"
        assert monitor["metadata"]["labels"]["team"] == "gpu", "the deprecated name still counts"
    assert {r["metadata"]["labels"]["release"] for r in objects if r["kind"] == "PrometheusRule"} == {"old-rules"}
    service_monitor = one(
        release_objects(
            RELEASE,
            {
                "podMonitor": {"enabled": False},
                "serviceMonitor": {"enabled": True, "additionalLabels": {"release": "stack"}},
            },
        ),
        "ServiceMonitor",
    )
    assert service_monitor["metadata"]["labels"]["release"] == "stack"


def test_common_labels_go_everywhere_and_pod_labels_on_pods_only() -> None:
    objects = release_objects(
        RELEASE, {**EVERYTHING_ON, "commonLabels": {"cost-center": "gpu"}, "podLabels": {"team": "fabric"}}
    )
    assert all(o["metadata"]["labels"]["cost-center"] == "gpu" for o in objects)
    assert all(labels["cost-center"] == "gpu" for labels in pod_labels(objects))
    daemonset = one(objects, "DaemonSet")
    assert daemonset["spec"]["template"]["metadata"]["labels"]["team"] == "fabric"
    assert "team" not in daemonset["metadata"]["labels"]
    assert "cost-center" not in daemonset["spec"]["selector"]["matchLabels"], "selectors stay as they are"


# ---- scheduling and resources ----


def test_the_default_tolerations_keep_the_exporter_on_degraded_nodes() -> None:
    pod = one(release_objects(RELEASE), "DaemonSet")["spec"]["template"]["spec"]
    for taint in ("ccl-health.io/fabric-degraded", "nvidia.com/gpu", "node.example.com/reserved"):
        assert tolerates(pod["tolerations"], taint, "NoSchedule")
    for taint in ("ccl-health.io/fabric-degraded", "nvidia.com/gpu"):
        assert tolerates(pod["tolerations"], taint, "NoExecute")
    assert not tolerates(pod["tolerations"], "node.example.com/maintenance", "NoExecute")
    own = [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]
    replaced = one(release_objects(RELEASE, {"tolerations": own}), "DaemonSet")["spec"]["template"]["spec"]
    assert replaced["tolerations"] == own


def test_the_taint_tolerated_is_the_one_the_docs_tell_to_set() -> None:
    assert "ccl-health.io/fabric-degraded:NoSchedule" in (REPO / "docs" / "lifecycle.md").read_text()


def _mebibytes(quantity: str) -> float:
    number, unit = re.fullmatch(r"([0-9.]+)(Mi|Gi)", quantity).groups()  # type: ignore[union-attr]
    return float(number) * (1024 if unit == "Gi" else 1)


def test_the_memory_request_and_limit_cover_what_was_measured() -> None:
    """docs/benchmarks.md: resident memory at rest (the simulated fleet's mean), the NCCL
    parser's node-wide budget, and the peak under hostile clients. A re-measurement above the
    values fails here."""
    benchmarks = (REPO / "docs" / "benchmarks.md").read_text()
    at_rest = float(re.search(r"\| exporter RSS \(mean\) \| ([0-9.]+) MiB \|", benchmarks).group(1))  # type: ignore[union-attr]
    budget = float(re.search(r"\| node-wide budget \(peer\) \| ([0-9.]+) MiB \|", benchmarks).group(1))  # type: ignore[union-attr]
    hostile = float(re.search(r"our peak RSS ([0-9.]+) MiB", benchmarks).group(1))  # type: ignore[union-attr]
    resources = container(release_objects(RELEASE))["resources"]
    assert _mebibytes(resources["requests"]["memory"]) >= at_rest + budget
    assert _mebibytes(resources["limits"]["memory"]) >= hostile * 1.25, "a quarter above the worst measured"


# ---- the NetworkPolicy's Prometheus ----


def _scrapers(values: dict[str, Any]) -> list[dict[str, Any]]:
    policy = next(
        o for o in release_objects(RELEASE, values) if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == RELEASE
    )
    return policy["spec"]["ingress"][0]["from"]  # type: ignore[no-any-return]


def test_the_network_policy_admits_the_prometheus_the_values_name() -> None:
    assert _scrapers({}) == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
        }
    ]
    agent = {
        "networkPolicy": {
            "prometheus": {"namespace": "observability", "podLabels": {"app.kubernetes.io/name": "prometheus-agent"}}
        }
    }
    assert _scrapers(agent) == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus-agent"}},
        }
    ]
    anywhere = _scrapers({"networkPolicy": {"prometheus": {"namespace": ""}}})
    assert anywhere == [
        {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
    ]
    vmagent = [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "vm"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "vmagent"}},
        }
    ]
    assert _scrapers({"networkPolicy": {"scrapers": vmagent}}) == vmagent, "scrapers replace the Prometheus peer"


# ---- NVLink granularity ----


@pytest.mark.parametrize("granularity", ["", "gpu", "link"])
def test_nvlink_granularity_is_a_value_the_exporter_parses(granularity: str) -> None:
    from exporter.collectors import all_collectors
    from exporter.commands import build_parser
    from exporter.commands.serve import config_from_args

    args = container(release_objects(RELEASE, {"nvml": {"nvlinkGranularity": granularity}}))["args"]
    flags = [a for a in args if a.startswith("--collector.nvml.nvlink-granularity")]
    assert flags == ([f"--collector.nvml.nvlink-granularity={granularity}"] if granularity else []), (
        "unset: the exporter's own default"
    )
    parsed = build_parser(environ={}).parse_args([a.replace("$(NODE_NAME)", "n") for a in args])
    settings = config_from_args(parsed, all_collectors()).collector_settings["nvml"]
    default = build_parser(environ={}).parse_args(["serve"]).nvml_nvlink_granularity
    assert settings.per_link == ((granularity or default) == "link")

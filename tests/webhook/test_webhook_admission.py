"""The webhook's decision (exporter/webhook/admission.py), without HTTP: AdmissionReview v1 in,
AdmissionReview out. Every returned JSONPatch is applied to the pod with a real RFC 6902 library
(``jsonpatch``) and the result checked as the API server would before storing it: the strict Pod
schema and the rules a schema cannot state (tests/pod_rules.py). tests/webhook/test_webhook_properties.py
does the same for generated pods.
"""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import jsonpatch
import pytest

import exporter
from exporter.sources.kube import FABRIC_READY_CONDITION
from exporter.webhook.admission import (
    ERROR,
    INJECTED_ANNOTATION,
    MUTATED,
    NO_GPU,
    PREFLIGHT_CONTAINER,
    SKIPPED,
    UNCHANGED,
    MalformedReview,
    WebhookConfig,
    escape_pointer,
    review,
)
from exporter.webhook.body import parse_review
from tests.pod_rules import check_pod, validate_with_the_library

CONFIG = WebhookConfig()


def gpu_pod(**extra: Any) -> dict[str, Any]:
    """A Kubeflow PyTorchJob worker as the training operator creates it."""
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "llama-worker-",
            "namespace": "ml-training",
            "labels": {
                "training.kubeflow.org/job-name": "llama",
                "training.kubeflow.org/operator-name": "pytorchjob-controller",
            },
            "ownerReferences": [
                {
                    "apiVersion": "kubeflow.org/v1",
                    "kind": "PyTorchJob",
                    "name": "llama",
                    "uid": "6f1e2d3c-0000-4000-8000-000000000001",
                    "controller": True,
                }
            ],
        },
        "spec": {
            "containers": [
                {
                    "name": "pytorch",
                    "image": "llama-train:2024.06",
                    "command": ["torchrun", "train.py"],
                    "env": [{"name": "NCCL_IB_HCA", "value": "mlx5"}],
                    "resources": {
                        "limits": {"nvidia.com/gpu": "8", "rdma/ib": "8", "cpu": "64", "memory": "512Gi"},
                        "requests": {"cpu": "32", "memory": "256Gi"},
                    },
                },
                {"name": "log-shipper", "image": "fluent-bit:3", "resources": {"limits": {"cpu": "100m"}}},
            ],
            "restartPolicy": "OnFailure",
        },
    }
    for key, value in extra.items():
        pod["metadata" if key in ("annotations",) else "spec"][key] = value
    return pod


def admission(pod: dict[str, Any] | None, operation: str = "CREATE", kind: str = "Pod") -> dict[str, Any]:
    request: dict[str, Any] = {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "", "version": "v1", "kind": kind},
        "resource": {"group": "", "version": "v1", "resource": kind.lower() + "s"},
        "namespace": "ml-training",
        "operation": operation,
        "userInfo": {"username": "system:serviceaccount:kubeflow:training-operator"},
        "dryRun": False,
    }
    if pod is not None:
        request["object"] = pod
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def patched(pod: dict[str, Any], config: WebhookConfig = CONFIG) -> tuple[dict[str, Any], dict[str, Any], str]:
    """(the patched pod, validated strictly; the response; the decision)."""
    result = review(admission(pod), config)
    response = result.response["response"]
    assert result.response["apiVersion"] == "admission.k8s.io/v1" and result.response["kind"] == "AdmissionReview"
    assert response["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002" and response["allowed"] is True
    if "patch" not in response:
        assert "patchType" not in response
        return pod, response, result.decision
    assert response["patchType"] == "JSONPatch"
    operations = json.loads(base64.b64decode(response["patch"]))
    assert operations == list(result.patch)
    out = jsonpatch.apply_patch(pod, operations)
    check_pod(out)
    validate_with_the_library(out)
    return out, response, result.decision


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_a_gpu_pod_gets_nccl_logging_on_its_gpu_container_only() -> None:
    pod = gpu_pod()
    out, response, decision = patched(pod)
    assert decision == MUTATED
    trainer, shipper = out["spec"]["containers"]
    assert env_of(trainer) == {"NCCL_IB_HCA": "mlx5", "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
    assert shipper == pod["spec"]["containers"][1], "a container without GPUs is left alone"
    assert "readinessGates" not in out["spec"] and "initContainers" not in out["spec"], "not annotated"
    assert out["metadata"]["annotations"] == {INJECTED_ANNOTATION: "nccl_env"}
    assert "warnings" not in response


def test_env_is_created_when_the_container_has_none() -> None:
    pod = gpu_pod()
    del pod["spec"]["containers"][0]["env"]
    out, _, _ = patched(pod)
    assert out["spec"]["containers"][0]["env"] == [
        {"name": "NCCL_DEBUG", "value": "INFO"},
        {"name": "NCCL_DEBUG_SUBSYS", "value": "INIT,NET"},
    ]


def test_a_container_that_sets_nccl_debug_is_left_exactly_as_it_is() -> None:
    pod = gpu_pod()
    pod["spec"]["containers"][0]["env"].append({"name": "NCCL_DEBUG", "value": "WARN"})
    out, response, decision = patched(pod)
    assert decision == UNCHANGED and out == pod
    assert "NCCL_DEBUG=WARN" in response["warnings"][0], "kubectl shows why the verdict will be unknown"
    pod["spec"]["containers"][0]["env"][-1] = {"name": "NCCL_DEBUG", "value": "INFO"}
    out, response, decision = patched(pod)
    assert decision == UNCHANGED and out == pod and "warnings" not in response


def test_a_container_with_env_from_is_left_alone_with_a_warning() -> None:
    pod = gpu_pod()
    pod["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "nccl-settings"}}]
    out, response, decision = patched(pod)
    assert decision == UNCHANGED and out == pod
    assert "envFrom" in response["warnings"][0]


def test_an_own_nccl_debug_subsys_is_kept() -> None:
    pod = gpu_pod()
    pod["spec"]["containers"][0]["env"].append({"name": "NCCL_DEBUG_SUBSYS", "value": "INIT,NET,GRAPH"})
    out, _, _ = patched(pod)
    env = env_of(out["spec"]["containers"][0])
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_SUBSYS"] == "INIT,NET,GRAPH"
    assert [e["name"] for e in out["spec"]["containers"][0]["env"]].count("NCCL_DEBUG_SUBSYS") == 1


def test_readiness_gate_and_preflight_when_annotated() -> None:
    pod = gpu_pod(annotations={"ccl-health.io/readiness-gate": "true", "ccl-health.io/preflight": "True"})
    out, _, decision = patched(pod)
    assert decision == MUTATED
    assert out["spec"]["readinessGates"] == [{"conditionType": FABRIC_READY_CONDITION}]
    (init,) = out["spec"]["initContainers"]
    assert init["name"] == PREFLIGHT_CONTAINER
    assert init["image"] == f"ccl-health-exporter:{exporter.__version__}" and init["args"] == [
        "preflight",
        "--no-write",
    ]
    # Its result goes to the exporter as its termination message: no volume, no hostPath.
    assert (init["terminationMessagePath"], init["terminationMessagePolicy"]) == ("/dev/termination-log", "File")
    assert "volumeMounts" not in init and "volumes" not in out["spec"]
    # What the pre-flight needs, as manifests/examples/pytorchjob-preflight.yaml shows it.
    env = env_of(init)
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["JOB_NAME"] == "llama"
    # The identity its result file is named and checked by (exporter/results/probe_file.py): the pod's UID.
    assert env["CCL_POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["CCL_POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["CCL_POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert env["NCCL_IB_HCA"] == "mlx5", "the trainer's NCCL settings: preflight fails when they force sockets"
    assert init["resources"] == pod["spec"]["containers"][0]["resources"], "the devices the job will use"
    assert init["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    annotations = out["metadata"]["annotations"]
    assert annotations[INJECTED_ANNOTATION] == "nccl_env,readiness_gate,preflight"
    assert annotations["ccl-health.io/preflight"] == "True", "the pod's own annotations stay"


def test_existing_arrays_are_appended_to_and_the_preflight_goes_first() -> None:
    existing_init = {"name": "fetch-data", "image": "busybox:1.36", "command": ["true"]}
    pod = gpu_pod(
        annotations={"ccl-health.io/readiness-gate": "true", "ccl-health.io/preflight": "true"},
        readinessGates=[{"conditionType": "example.com/ready"}],
        initContainers=[existing_init],
        volumes=[{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
    )
    out, _, _ = patched(pod, WebhookConfig(probe_results_host_path="/var/lib/ccl-exporter/probe-results"))
    assert [g["conditionType"] for g in out["spec"]["readinessGates"]] == ["example.com/ready", FABRIC_READY_CONDITION]
    assert [c["name"] for c in out["spec"]["initContainers"]] == [PREFLIGHT_CONTAINER, "fetch-data"]
    assert [v["name"] for v in out["spec"]["volumes"]] == ["dshm", "ccl-probe-results"]


def test_a_pod_that_has_everything_is_not_patched_again() -> None:
    pod = gpu_pod(annotations={"ccl-health.io/readiness-gate": "true", "ccl-health.io/preflight": "true"})
    once, _, _ = patched(pod)
    twice, _, decision = patched(once)
    assert decision == UNCHANGED and twice == once, "reinvocation adds nothing twice"


def test_annotation_keys_are_escaped_in_the_pointer() -> None:
    assert escape_pointer("ccl-health.io/injected") == "ccl-health.io~1injected"
    assert escape_pointer("a~b/c") == "a~0b~1c"
    pod = gpu_pod(annotations={"team": "llm"})
    result = review(admission(pod), CONFIG)
    paths = [op["path"] for op in result.patch]
    assert "/metadata/annotations/ccl-health.io~1injected" in paths
    out = jsonpatch.apply_patch(pod, list(result.patch))
    assert out["metadata"]["annotations"] == {"team": "llm", INJECTED_ANNOTATION: "nccl_env"}


def test_nccl_debug_file_goes_to_a_per_pod_folder_the_exporter_reads() -> None:
    config = WebhookConfig(nccl_debug_file_host_path="/var/log/nccl")
    out, _, _ = patched(gpu_pod(), config)
    trainer = out["spec"]["containers"][0]
    env = env_of(trainer)
    assert env["NCCL_DEBUG_FILE"] == "/var/run/ccl-health/nccl/nccl.%h.%p.log"
    assert env["CCL_POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    (mount,) = trainer["volumeMounts"]
    assert mount["subPathExpr"] == "$(CCL_POD_NAMESPACE)_$(CCL_POD_NAME)_$(CCL_POD_UID)"
    assert out["spec"]["volumes"] == [
        {"name": "ccl-nccl-debug", "hostPath": {"path": "/var/log/nccl", "type": "DirectoryOrCreate"}}
    ]
    # The folder name is one the exporter's tailer attributes to the pod.
    from exporter.sources.podlogs.layout import parse_debug_folder

    expanded = (
        mount["subPathExpr"]
        .replace("$(CCL_POD_NAMESPACE)", "ml-training")
        .replace("$(CCL_POD_NAME)", "llama-worker-x7k2p")
        .replace("$(CCL_POD_UID)", "5b0c9c1e-8d6f-4d2a-9f1b-0e9d1c2b3a4f")
    )
    assert parse_debug_folder(expanded) == ("ml-training", "llama-worker-x7k2p", "5b0c9c1e-8d6f-4d2a-9f1b-0e9d1c2b3a4f")
    assert out["metadata"]["annotations"][INJECTED_ANNOTATION] == "nccl_env,nccl_debug_file"


def test_without_a_results_folder_the_preflight_writes_no_file() -> None:
    config = WebhookConfig(
        probe_results_host_path="",
        preflight_image="registry.example/ccl:1.2",
        preflight_args=("preflight", "--expect-rate=400"),
    )
    out, _, _ = patched(gpu_pod(annotations={"ccl-health.io/preflight": "true"}), config)
    (init,) = out["spec"]["initContainers"]
    assert init["image"] == "registry.example/ccl:1.2"
    assert init["args"] == ["preflight", "--expect-rate=400", "--no-write"]
    assert "volumeMounts" not in init and "volumes" not in out["spec"]


def test_with_a_results_folder_the_preflight_also_writes_a_file_there() -> None:
    """``--webhook.preflight-results-host-path`` set: the hostPath as before, beside the termination message."""
    config = WebhookConfig(probe_results_host_path="/var/lib/ccl-exporter/probe-results")
    out, _, _ = patched(gpu_pod(annotations={"ccl-health.io/preflight": "true"}), config)
    (init,) = out["spec"]["initContainers"]
    assert init["args"] == ["preflight"]
    assert init["volumeMounts"] == [{"name": "ccl-probe-results", "mountPath": "/var/lib/ccl-exporter/probe-results"}]
    assert out["spec"]["volumes"] == [
        {
            "name": "ccl-probe-results",
            "hostPath": {"path": "/var/lib/ccl-exporter/probe-results", "type": "DirectoryOrCreate"},
        }
    ]
    assert init["terminationMessagePath"] == "/dev/termination-log"


@pytest.mark.parametrize("host_path", ["", "/var/lib/ccl-exporter/probe-results"], ids=["default", "results-folder"])
def test_the_preflight_args_parse_as_the_preflight_command(host_path: str) -> None:
    from exporter.commands import build_parser

    out, _, _ = patched(
        gpu_pod(annotations={"ccl-health.io/preflight": "true"}), WebhookConfig(probe_results_host_path=host_path)
    )
    (init,) = out["spec"]["initContainers"]
    args = build_parser(environ={}).parse_args(init["args"])
    assert args.termination_message == init["terminationMessagePath"], "the report lands where the kubelet reads"
    if host_path:
        assert args.write_results and args.probe_results == init["volumeMounts"][0]["mountPath"], (
            "the result file lands in the mounted folder"
        )
    else:
        assert not args.write_results and "volumeMounts" not in init


@pytest.mark.parametrize(
    "resources",
    [
        {"limits": {"cpu": "4"}},
        {"limits": {"nvidia.com/gpu": "0"}},
        {"limits": {"nvidia.com/gpu": 0}},
        {"requests": {"nvidia.com/gpu": "garbage"}},
        {},
        None,
    ],
)
def test_a_pod_without_gpus_is_allowed_without_a_patch(resources: dict[str, Any] | None) -> None:
    pod = gpu_pod(annotations={"ccl-health.io/preflight": "true"})
    pod["spec"]["containers"][0]["resources"] = resources
    out, _, decision = patched(pod)
    assert decision == NO_GPU and out == pod


def test_gpus_in_requests_or_configured_names_count() -> None:
    pod = gpu_pod()
    pod["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": 2}}
    assert patched(pod)[2] == MUTATED
    pod["spec"]["containers"][0]["resources"] = {"limits": {"amd.com/gpu": "8"}}
    assert patched(pod)[2] == NO_GPU
    assert patched(pod, WebhookConfig(gpu_resources=("amd.com/gpu",)))[2] == MUTATED


def test_requests_without_a_pod_being_created_are_allowed_without_a_patch() -> None:
    for document in (
        admission(gpu_pod(), operation="UPDATE"),
        admission(None),
        admission(gpu_pod(), kind="Deployment"),
    ):
        result = review(document, CONFIG)
        assert result.decision == SKIPPED
        assert result.response["response"] == {"uid": document["request"]["uid"], "allowed": True}
    document = admission(gpu_pod())
    document["request"]["subResource"] = "status"
    assert review(document, CONFIG).decision == SKIPPED
    broken = admission(gpu_pod())
    broken["request"]["object"]["spec"] = "not a spec"
    assert review(broken, CONFIG).decision == SKIPPED


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "not JSON"),
        (b"\xff\xfe garbage", "not UTF-8"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {"uid": "x"}}', "v1"),
        (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}', "no request"),
        (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": ""}}', "no uid"),
    ],
)
def test_malformed_reviews_raise_a_one_line_reason(body: bytes, reason: str) -> None:
    with pytest.raises(MalformedReview) as raised:
        review(parse_review(body), CONFIG)
    assert reason in str(raised.value) and "\n" not in str(raised.value)


def test_the_input_is_never_modified() -> None:
    pod = gpu_pod(annotations={"ccl-health.io/readiness-gate": "true", "ccl-health.io/preflight": "true"})
    document = admission(pod)
    before = copy.deepcopy(document)
    review(document, WebhookConfig(nccl_debug_file_host_path="/var/log/nccl"))
    assert document == before


def test_decisions_are_the_documented_ones() -> None:
    from pathlib import Path

    from exporter.webhook.admission import CHANGES, DECISIONS, WITHHELD

    doc = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    for value in (*DECISIONS, *CHANGES, *(reason for _, reason in WITHHELD)):
        assert f"`{value}`" in doc, f"{value} is not documented in docs/metrics.md"
    assert ERROR in DECISIONS


def test_the_injected_preflight_names_its_result_by_the_pods_uid() -> None:
    """The pre-flight the webhook adds resolves, as the kubelet would set its env, to the identity the
    exporter accepts a result with (the pod's namespace, name and UID)."""
    from exporter.probe.runner import Identity

    pod = gpu_pod(annotations={"ccl-health.io/preflight": "true"})
    out, _, _ = patched(pod)
    (init,) = out["spec"]["initContainers"]
    fields = {"metadata.namespace": "ml-training", "metadata.name": "llama-worker-0", "metadata.uid": "5d1e-uid"}
    environ = {
        e["name"]: fields.get(e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath"), e.get("value", ""))
        for e in init["env"]
    }
    identity = Identity.from_env("preflight", environ)
    assert (identity.namespace, identity.pod, identity.pod_uid) == ("ml-training", "llama-worker-0", "5d1e-uid")
    assert identity.unattributable() is None

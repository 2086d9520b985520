"""The webhook never costs a pod its Pod Security level: PodSecurity admission runs after every
mutating webhook and judges the mutated pod, so a patch that adds a hostPath, or a container that
does not meet ``restricted``, gets a namespace's pods refused at creation.

Checked with the checks of ``baseline`` and ``restricted`` written from the upstream policy
(tests/pod_security.py): under the default flags every pod the webhook returns passes each level
the submitted pod passed; the pre-flight's result file on a hostPath comes only with
``--webhook.preflight-results-host-path`` (and the NCCL debug files' with their own flag), and then
costs exactly the hostPath checks. The pre-flight also never gets a ``runAsNonRoot`` that the
kubelet would refuse to start under the pod's ``runAsUser: 0``.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from exporter.flags import DEFAULT_PROBE_RESULTS
from exporter.webhook.admission import PREFLIGHT_CONTAINER, WebhookConfig, review
from tests.pod_rules import check_pod
from tests.pod_security import BASELINE, RESTRICTED, passes, violations
from tests.webhook.test_webhook_admission import admission, gpu_pod, patched

DEFAULTS = WebhookConfig()
HOST_FOLDERS = WebhookConfig(probe_results_host_path=DEFAULT_PROBE_RESULTS, nccl_debug_file_host_path="/var/log/nccl")
WANTS_ALL = {"ccl-health.io/preflight": "true", "ccl-health.io/readiness-gate": "true"}
HARDENED = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def restricted_gpu_pod(pod_level: bool) -> dict[str, Any]:
    """The PyTorchJob worker of tests/webhook/test_webhook_admission.py made ``restricted``: with the
    non-root and seccomp settings at pod level, or (``pod_level`` False) in every container."""
    pod = gpu_pod(annotations=dict(WANTS_ALL))
    own = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    if pod_level:
        pod["spec"]["securityContext"] = own
    for container in pod["spec"]["containers"]:
        container["securityContext"] = copy.deepcopy(HARDENED) | ({} if pod_level else copy.deepcopy(own))
    return pod


def preflight_of(pod: dict[str, Any]) -> dict[str, Any]:
    (found,) = [c for c in pod["spec"]["initContainers"] if c["name"] == PREFLIGHT_CONTAINER]
    return found


def test_a_baseline_pod_stays_baseline_with_everything_the_webhook_adds() -> None:
    pod = gpu_pod(annotations=dict(WANTS_ALL))
    assert passes(pod, BASELINE)
    out, _, _ = patched(pod, DEFAULTS)
    assert preflight_of(out) and out["spec"]["readinessGates"]
    assert violations(out, BASELINE) == {}, "no hostPath, nothing privileged"


def test_a_host_folder_comes_only_when_asked_for_and_costs_only_the_host_path_checks() -> None:
    pod = restricted_gpu_pod(pod_level=True)
    out, _, _ = patched(pod, HOST_FOLDERS)
    assert set(violations(out, RESTRICTED)) == {"host_path_volumes", "restricted_volumes"}
    assert {v["name"] for v in out["spec"]["volumes"]} == {"ccl-probe-results", "ccl-nccl-debug"}


def test_a_restricted_pod_stays_restricted_with_its_settings_at_pod_level() -> None:
    pod = restricted_gpu_pod(pod_level=True)
    assert passes(pod, RESTRICTED)
    out, _, _ = patched(pod, DEFAULTS)
    assert violations(out, RESTRICTED) == {}
    assert "runAsNonRoot" not in preflight_of(out)["securityContext"], "it inherits the pod's"


def test_a_restricted_pod_stays_restricted_with_its_settings_in_every_container() -> None:
    pod = restricted_gpu_pod(pod_level=False)
    assert passes(pod, RESTRICTED)
    out, _, _ = patched(pod, DEFAULTS)
    assert violations(out, RESTRICTED) == {}
    assert preflight_of(out)["securityContext"]["runAsNonRoot"] is True


def test_the_preflight_does_not_ask_for_non_root_where_the_pod_runs_as_root() -> None:
    """A pod with ``runAsUser: 0`` (its containers overriding it) is no restricted pod; a
    ``runAsNonRoot`` on a pre-flight that inherits UID 0 would keep the kubelet from starting it."""
    pod = restricted_gpu_pod(pod_level=False)
    pod["spec"]["securityContext"] = {"runAsUser": 0}
    for container in pod["spec"]["containers"]:
        container["securityContext"]["runAsUser"] = 1000
    out, _, _ = patched(pod, DEFAULTS)
    assert "runAsNonRoot" not in preflight_of(out)["securityContext"]


# ---- generated pods ----

contexts = st.fixed_dictionaries(
    {},
    optional={
        "runAsNonRoot": st.booleans(),
        "runAsUser": st.sampled_from([0, 1000, 65532]),
        "allowPrivilegeEscalation": st.booleans(),
        "privileged": st.booleans(),
        "capabilities": st.sampled_from(
            [
                {"drop": ["ALL"]},
                {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
                {"add": ["IPC_LOCK"]},
                {"drop": ["NET_RAW"]},
                {},
            ]
        ),
        "seccompProfile": st.sampled_from(
            [{"type": "RuntimeDefault"}, {"type": "Unconfined"}, {"type": "Localhost", "localhostProfile": "p.json"}]
        ),
    },
)
# Mostly settings that pass restricted, so that many generated pods do.
good_contexts = st.just({**HARDENED, "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}})
pod_contexts = st.fixed_dictionaries(
    {},
    optional={
        "runAsNonRoot": st.booleans(),
        "runAsUser": st.sampled_from([0, 1000]),
        "seccompProfile": st.sampled_from([{"type": "RuntimeDefault"}, {"type": "Unconfined"}]),
        "sysctls": st.just([{"name": "net.ipv4.tcp_syncookies", "value": "1"}]),
    },
)
volumes = st.sampled_from(
    [
        {"emptyDir": {}},
        {"configMap": {"name": "c"}},
        {"emptyDir": {"medium": "Memory"}},
        {"emptyDir": {}},
        {"configMap": {"name": "c"}},
        {"hostPath": {"path": "/data"}},
    ]
)
gpu_resources = st.sampled_from(
    [{"limits": {"nvidia.com/gpu": "8", "rdma/ib": "8"}}, {"limits": {"nvidia.com/gpu": 1}}, {"limits": {"cpu": "1"}}]
)


@st.composite
def secured_pods(draw: st.DrawFn) -> dict[str, Any]:
    def container(name: str) -> dict[str, Any]:
        found: dict[str, Any] = {"name": name, "image": "train:1", "resources": draw(gpu_resources)}
        if context := draw(contexts if draw(st.integers(0, 9)) == 0 else good_contexts):
            found["securityContext"] = context
        return found

    apps, inits = draw(st.integers(1, 3)), draw(st.integers(0, 2))
    spec: dict[str, Any] = {"containers": [container(f"app-{i}") for i in range(apps)], "restartPolicy": "Never"}
    spec["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "8"}}
    if inits:
        spec["initContainers"] = [container(f"init-{i}") for i in range(inits)]
    if draw(st.booleans()) and (context := draw(pod_contexts)):
        spec["securityContext"] = context
    if names := draw(st.lists(st.sampled_from(["data", "dshm", "cfg"]), max_size=3, unique=True)):
        spec["volumes"] = [{"name": n, **draw(volumes)} for n in names]
    if draw(st.integers(0, 19)) == 0:
        spec["hostNetwork"] = True
    annotations = {k: "true" for k in WANTS_ALL if draw(st.integers(0, 3)) > 0}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "spec": spec,
        "metadata": {"name": "w-0", "namespace": "ml", "annotations": annotations},
    }


def mutated(pod: dict[str, Any], config: WebhookConfig) -> dict[str, Any]:
    return jsonpatch.apply_patch(pod, list(review(admission(pod), config).patch))


@given(secured_pods())
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_no_pod_loses_its_level_to_the_webhook(pod: dict[str, Any]) -> None:
    check_pod(pod)
    out = mutated(pod, DEFAULTS)
    check_pod(out)
    for level in (BASELINE, RESTRICTED):
        if passes(pod, level):
            event(f"passes {level}")
            assert violations(out, level) == {}, (level, violations(out, level))
    if any(c["name"] == PREFLIGHT_CONTAINER for c in out["spec"].get("initContainers", [])):
        event("pre-flight added")
        if preflight_of(out)["securityContext"].get("runAsNonRoot"):
            assert out["spec"].get("securityContext", {}).get("runAsUser") != 0, "the kubelet would refuse it"
    with_folders = mutated(pod, HOST_FOLDERS)
    for level in (BASELINE, RESTRICTED):
        if passes(pod, level):
            assert set(violations(with_folders, level)) <= {"host_path_volumes", "restricted_volumes"}

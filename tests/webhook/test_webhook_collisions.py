"""What the webhook does when the pod already uses a name or a path it would add, when the pod
defines the variables the per-pod debug folder is named from, and when a pod or its patch is
larger than it looks at. Every patch is applied with ``jsonpatch`` and the pod checked as the API
server would (``patched`` of tests/webhook/test_webhook_admission.py).
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch

from exporter.webhook.admission import (
    CONTAINER_NAME_TAKEN,
    DEBUG_FOLDER_EXPR,
    ENV_FROM,
    INJECTED_ANNOTATION,
    MAX_PATCH_BYTES,
    MAX_POD_CONTAINERS,
    MOUNT_PATH_TAKEN,
    MUTATED,
    NCCL_DEBUG_MOUNT,
    NCCL_DEBUG_VOLUME,
    OVERSIZED,
    OWN_NCCL_DEBUG,
    PREFLIGHT_CONTAINER,
    UNCHANGED,
    VOLUME_NAME_TAKEN,
    WebhookConfig,
    review,
)
from tests.pod_rules import effective_env
from tests.webhook.test_webhook_admission import admission, env_of, gpu_pod, patched

DEBUG_FILE = WebhookConfig(nccl_debug_file_host_path="/var/log/nccl")
# Both host folders: the pre-flight's result-file hostPath is there only when configured.
HOST_FOLDERS = WebhookConfig(
    nccl_debug_file_host_path="/var/log/nccl", probe_results_host_path="/var/lib/ccl-exporter/probe-results"
)
OUR_DEBUG_VOLUME = {"name": NCCL_DEBUG_VOLUME, "hostPath": {"path": "/var/log/nccl", "type": "DirectoryOrCreate"}}
OUR_DEBUG_MOUNT = {"name": NCCL_DEBUG_VOLUME, "mountPath": NCCL_DEBUG_MOUNT, "subPathExpr": DEBUG_FOLDER_EXPR}
IDENTITY = {"CCL_POD_NAMESPACE": "metadata.namespace", "CCL_POD_NAME": "metadata.name", "CCL_POD_UID": "metadata.uid"}
PREFLIGHT = {"ccl-health.io/preflight": "true"}


def withheld(pod: dict[str, Any], config: WebhookConfig = WebhookConfig()) -> tuple[tuple[str, str], ...]:
    return review(admission(pod), config).withheld


def assert_identity_from_the_downward_api(container: dict[str, Any]) -> None:
    env = effective_env(container)
    for name, field_path in IDENTITY.items():
        assert env[name]["valueFrom"]["fieldRef"]["fieldPath"] == field_path, (name, env[name])
        assert "value" not in env[name]


def test_an_app_container_named_like_the_preflight_withholds_only_the_preflight() -> None:
    pod = gpu_pod(annotations=PREFLIGHT)
    pod["spec"]["containers"][1]["name"] = PREFLIGHT_CONTAINER  # the log shipper
    out, response, decision = patched(pod)
    assert decision == MUTATED
    assert "initContainers" not in out["spec"], "two containers named ccl-preflight make the pod invalid"
    assert env_of(out["spec"]["containers"][0])["NCCL_DEBUG"] == "INFO", "the other changes are still made"
    assert any(PREFLIGHT_CONTAINER in w and "no pre-flight" in w for w in response["warnings"])
    assert withheld(pod) == (("preflight", CONTAINER_NAME_TAKEN),)
    assert "preflight" not in out["metadata"]["annotations"][INJECTED_ANNOTATION]


def test_an_ephemeral_container_named_like_the_preflight_withholds_it() -> None:
    pod = gpu_pod(annotations=PREFLIGHT)
    pod["spec"]["ephemeralContainers"] = [{"name": PREFLIGHT_CONTAINER, "image": "busybox:1.36"}]
    assert withheld(pod) == (("preflight", CONTAINER_NAME_TAKEN),)
    result = review(admission(pod), WebhookConfig())
    assert all(op["path"] != "/spec/initContainers" for op in result.patch)


def test_an_init_container_named_like_the_preflight_is_the_preflight_added_by_hand() -> None:
    pod = gpu_pod(annotations=PREFLIGHT, initContainers=[{"name": PREFLIGHT_CONTAINER, "image": "mine:1"}])
    out, response, _ = patched(pod)
    assert [c["image"] for c in out["spec"]["initContainers"]] == ["mine:1"]
    assert "warnings" not in response and withheld(pod) == ()


def test_a_volume_of_our_name_that_is_not_ours_withholds_what_needs_it() -> None:
    own_results = {"name": "ccl-probe-results", "emptyDir": {}}
    own_debug = {"name": NCCL_DEBUG_VOLUME, "hostPath": {"path": "/somewhere/else", "type": "Directory"}}
    pod = gpu_pod(annotations=PREFLIGHT, volumes=[own_results, own_debug])
    out, response, decision = patched(pod, HOST_FOLDERS)
    assert decision == MUTATED
    assert out["spec"]["volumes"] == [own_results, own_debug], "no second volume of either name"
    trainer = out["spec"]["containers"][0]
    assert env_of(trainer) == {"NCCL_IB_HCA": "mlx5", "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}, (
        "NCCL's lines stay on stdout, where the exporter reads them too"
    )
    assert "volumeMounts" not in trainer and "initContainers" not in out["spec"]
    assert set(withheld(pod, HOST_FOLDERS)) == {
        ("nccl_debug_file", VOLUME_NAME_TAKEN),
        ("preflight", VOLUME_NAME_TAKEN),
    }
    assert len(response["warnings"]) == 2
    # Without the result-file hostPath (the default) the pre-flight needs no volume: nothing collides.
    out, _, _ = patched(pod, DEBUG_FILE)
    assert out["spec"]["initContainers"][0]["name"] == PREFLIGHT_CONTAINER and withheld(pod, DEBUG_FILE) == (
        ("nccl_debug_file", VOLUME_NAME_TAKEN),
    )
    assert "volumeMounts" not in out["spec"]["initContainers"][0]


def test_a_volume_that_is_exactly_ours_is_used_not_added_again() -> None:
    results = {
        "name": "ccl-probe-results",
        "hostPath": {"path": "/var/lib/ccl-exporter/probe-results", "type": "DirectoryOrCreate"},
    }
    pod = gpu_pod(annotations=PREFLIGHT, volumes=[results, copy.deepcopy(OUR_DEBUG_VOLUME)])
    out, response, _ = patched(pod, HOST_FOLDERS)
    assert out["spec"]["volumes"] == pod["spec"]["volumes"]
    assert out["spec"]["initContainers"][0]["name"] == PREFLIGHT_CONTAINER
    assert out["spec"]["containers"][0]["volumeMounts"] == [OUR_DEBUG_MOUNT]
    assert "warnings" not in response


def test_something_else_mounted_at_our_path_keeps_that_container_on_stdout() -> None:
    pod = gpu_pod(volumes=[{"name": "scratch", "emptyDir": {}}])
    second = copy.deepcopy(pod["spec"]["containers"][0])
    second["name"] = "pytorch-2"
    pod["spec"]["containers"].append(second)
    for path in (NCCL_DEBUG_MOUNT, NCCL_DEBUG_MOUNT + "/", "/var/run/ccl-health/./nccl", "//var/run/ccl-health/nccl"):
        pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "scratch", "mountPath": path}]
        out, response, _ = patched(pod, DEBUG_FILE)
        first, _, other = out["spec"]["containers"]
        assert first["volumeMounts"] == [{"name": "scratch", "mountPath": path}], path
        assert "NCCL_DEBUG_FILE" not in env_of(first) and env_of(first)["NCCL_DEBUG"] == "INFO"
        assert "CCL_POD_NAME" not in env_of(first), "nothing to name a folder for"
        assert other["volumeMounts"] == [OUR_DEBUG_MOUNT], "the other GPU container still gets its debug file"
        assert any("pytorch " in w and NCCL_DEBUG_MOUNT in w for w in response["warnings"])
        assert withheld(pod, DEBUG_FILE) == (("nccl_debug_file", MOUNT_PATH_TAKEN),)


def test_our_volume_mounted_elsewhere_by_the_pod_is_left_as_it_is() -> None:
    pod = gpu_pod(volumes=[copy.deepcopy(OUR_DEBUG_VOLUME)])
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": NCCL_DEBUG_VOLUME, "mountPath": "/logs"}]
    out, _, _ = patched(pod, DEBUG_FILE)
    assert out["spec"]["containers"][0]["volumeMounts"] == [{"name": NCCL_DEBUG_VOLUME, "mountPath": "/logs"}]
    assert withheld(pod, DEBUG_FILE) == (("nccl_debug_file", MOUNT_PATH_TAKEN),)


def test_the_pod_cannot_name_its_debug_folder_after_another_pod() -> None:
    """The attack: the pod sets the variables the folder is named from as plain values (another
    pod's namespace, name and uid), so its NCCL lines would land in that pod's folder."""
    pod = gpu_pod()
    pod["spec"]["containers"][0]["env"] = [
        {"name": "CCL_POD_NAMESPACE", "value": "other-team"},
        {"name": "CCL_POD_NAME", "value": "victim-worker-0"},
        {"name": "RUN_DIR", "value": "/runs/$(CCL_POD_NAME)"},
        {"name": "CCL_POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['victim-uid']"}}},
        {"name": "CCL_POD_NAME", "value": "victim-worker-0"},
    ]
    out, _, decision = patched(pod, DEBUG_FILE)
    assert decision == MUTATED
    trainer = out["spec"]["containers"][0]
    assert_identity_from_the_downward_api(trainer)
    names = [e["name"] for e in trainer["env"]]
    assert names[:5] == ["CCL_POD_NAMESPACE", "CCL_POD_NAME", "RUN_DIR", "CCL_POD_UID", "CCL_POD_NAME"], (
        "replaced where they stood: RUN_DIR's $(CCL_POD_NAME) now expands to the pod's real name"
    )
    assert all("value" not in e for e in trainer["env"] if e["name"].startswith("CCL_POD_"))
    assert trainer["env"][2] == {"name": "RUN_DIR", "value": "/runs/$(CCL_POD_NAME)"}, "the pod's own entry stays"
    assert names.count("CCL_POD_UID") == 1, "none added twice"
    assert out["metadata"]["annotations"][INJECTED_ANNOTATION] == "nccl_env,nccl_debug_file,pod_identity_env"


def test_identity_is_enforced_wherever_the_folder_is_mounted_even_with_env_from() -> None:
    """A container that mounts the per-pod folder (written by the pod, or an earlier call) gets
    the three variables from the downward API even when the webhook adds nothing else to it:
    explicit ``env`` wins over ``envFrom``, which could otherwise set them from a ConfigMap."""
    pod = gpu_pod(volumes=[copy.deepcopy(OUR_DEBUG_VOLUME)])
    trainer = pod["spec"]["containers"][0]
    trainer["envFrom"] = [{"prefix": "CCL_", "configMapRef": {"name": "pod-names"}}]
    trainer["volumeMounts"] = [copy.deepcopy(OUR_DEBUG_MOUNT)]
    del trainer["env"]
    pod["spec"]["initContainers"] = [
        {
            "name": "warmup",
            "image": "warmup:1",
            "volumeMounts": [copy.deepcopy(OUR_DEBUG_MOUNT)],
            "env": [{"name": "CCL_POD_UID", "value": "forged"}],
        }
    ]
    out, response, decision = patched(pod, DEBUG_FILE)
    assert decision == MUTATED
    assert_identity_from_the_downward_api(out["spec"]["containers"][0])
    assert_identity_from_the_downward_api(out["spec"]["initContainers"][0])
    assert "NCCL_DEBUG" not in env_of(out["spec"]["containers"][0]), "envFrom may set it: left to the pod"
    assert any("envFrom" in w for w in response["warnings"])
    assert set(withheld(pod, DEBUG_FILE)) == {("nccl_env", ENV_FROM)}


def test_identity_is_enforced_however_the_pod_mounts_the_folder() -> None:
    pod = gpu_pod(volumes=[copy.deepcopy(OUR_DEBUG_VOLUME)])
    sidecar = {
        "name": "reader",
        "image": "reader:1",
        "env": [{"name": "CCL_POD_NAME", "value": "victim"}],
        "volumeMounts": [dict(OUR_DEBUG_MOUNT, mountPath=NCCL_DEBUG_MOUNT + "/")],
    }
    pod["spec"]["containers"].append(sidecar)
    out, _, _ = patched(pod, DEBUG_FILE)
    assert_identity_from_the_downward_api(out["spec"]["containers"][2])
    assert out["spec"]["containers"][2]["volumeMounts"] == sidecar["volumeMounts"]


def test_a_pod_that_mounts_our_volume_without_declaring_it_is_not_lent_the_host_folder() -> None:
    """Invalid as sent; the hostPath the webhook adds would make it valid, with the host folder
    mounted where and how the pod chose (another pod's folder, the pre-flight results)."""
    for volume, config, change in (
        (NCCL_DEBUG_VOLUME, DEBUG_FILE, "nccl_debug_file"),
        ("ccl-probe-results", HOST_FOLDERS, "preflight"),
    ):
        pod = gpu_pod(annotations=PREFLIGHT)
        pod["spec"]["containers"][1]["volumeMounts"] = [{"name": volume, "mountPath": "/x", "subPath": "ml_victim_u"}]
        result = review(admission(pod), config)
        out = jsonpatch.apply_patch(pod, list(result.patch))
        assert volume not in [v["name"] for v in out["spec"].get("volumes", [])], volume
        assert (change, VOLUME_NAME_TAKEN) in result.withheld


def test_identity_entries_as_the_api_server_stores_them_are_not_patched_again() -> None:
    once, _, _ = patched(gpu_pod(annotations=PREFLIGHT | {"ccl-health.io/readiness-gate": "true"}), DEBUG_FILE)
    stored = copy.deepcopy(once)
    for container in stored["spec"]["containers"] + stored["spec"]["initContainers"]:
        for entry in container.get("env", []):
            if "fieldRef" in entry.get("valueFrom", {}):
                entry["valueFrom"]["fieldRef"]["apiVersion"] = "v1"  # the API server's default
    for pod in (once, stored):
        result = review(admission(pod), DEBUG_FILE)
        assert result.decision == UNCHANGED and result.patch == ()


def test_a_reinvocation_that_adds_something_keeps_the_earlier_annotation() -> None:
    once, _, _ = patched(gpu_pod(annotations=PREFLIGHT))
    later = copy.deepcopy(once)  # another webhook adds a GPU sidecar after ours ran
    later["spec"]["containers"].append(
        {"name": "late", "image": "late:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    )
    twice, _, decision = patched(later)
    assert decision == MUTATED
    assert twice["metadata"]["annotations"][INJECTED_ANNOTATION] == "nccl_env,preflight"
    assert [c["name"] for c in twice["spec"]["initContainers"]] == [PREFLIGHT_CONTAINER]


def test_an_nccl_debug_level_that_hides_the_transport_is_counted() -> None:
    pod = gpu_pod()
    pod["spec"]["containers"][0]["env"] += [
        {"name": "NCCL_DEBUG", "value": "INFO"},
        {"name": "NCCL_DEBUG", "value": "warn"},
    ]
    _, response, decision = patched(pod)
    assert decision == UNCHANGED and "NCCL_DEBUG=WARN" in response["warnings"][0], "the last definition is in effect"
    assert withheld(pod) == (("nccl_env", OWN_NCCL_DEBUG),)


def test_a_pod_with_more_containers_than_looked_at_is_not_patched() -> None:
    pod = gpu_pod(annotations=PREFLIGHT)
    template = pod["spec"]["containers"][0]
    pod["spec"]["containers"] = [dict(copy.deepcopy(template), name=f"w{i}") for i in range(MAX_POD_CONTAINERS)]
    out, _, decision = patched(pod)
    assert decision == MUTATED, "exactly the limit is looked at"
    pod["spec"]["initContainers"] = [{"name": "one-more", "image": "busybox:1.36"}]
    out, response, decision = patched(pod)
    assert decision == OVERSIZED and out == pod
    assert response["warnings"] == [
        f"ccl-health: the pod has {MAX_POD_CONTAINERS + 1} containers, more than the "
        f"{MAX_POD_CONTAINERS} looked at: unchanged"
    ]


def test_a_patch_over_the_limit_is_not_sent() -> None:
    """The pre-flight copies the GPU container's NCCL settings: a pod whose settings alone are
    over the limit would make a patch over it."""
    pod = gpu_pod(annotations=PREFLIGHT)
    pod["spec"]["containers"][0]["env"] = [{"name": f"NCCL_SETTING_{i}", "value": "x" * 1000} for i in range(300)]
    result = review(admission(pod), WebhookConfig())
    assert result.decision == OVERSIZED and result.patch == ()
    assert result.response["response"] == {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "allowed": True,
        "warnings": [f"ccl-health: the patch would be over {MAX_PATCH_BYTES} bytes: unchanged"],
    }
    pod["spec"]["containers"][0]["env"] = pod["spec"]["containers"][0]["env"][:200]
    assert review(admission(pod), WebhookConfig()).decision == MUTATED, "just under the limit"


def test_the_largest_pod_looked_at_gets_a_patch_well_under_the_limit() -> None:
    pod = gpu_pod(annotations=PREFLIGHT | {"ccl-health.io/readiness-gate": "true"})
    pod["spec"]["containers"] = [
        {"name": f"worker-{i}", "image": "train:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
        for i in range(MAX_POD_CONTAINERS - 1)
    ]
    result = review(admission(pod), DEBUG_FILE)
    assert result.decision == MUTATED
    size = len(jsonpatch.JsonPatch(list(result.patch)).to_string())
    assert size < MAX_PATCH_BYTES / 2, size


def test_warnings_are_bounded_and_names_cut() -> None:
    pod = gpu_pod()
    template = pod["spec"]["containers"][0]
    pod["spec"]["containers"] = [
        dict(copy.deepcopy(template), name=("n" * 500) + str(i), envFrom=[{"configMapRef": {"name": "x"}}])
        for i in range(20)
    ]
    response = review(admission(pod), WebhookConfig()).response["response"]
    assert len(response["warnings"]) == 8 and response["warnings"][-1] == "ccl-health: 13 more warnings"
    assert all(len(w) < 300 for w in response["warnings"])

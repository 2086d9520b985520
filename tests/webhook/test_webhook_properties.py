"""Every patch the webhook can return leaves a valid pod, never takes what the pod uses, and is
idempotent: checked on generated pods.

The pods are valid ones (checked first) built to collide with the webhook: container names drawn
from a pool holding ``ccl-preflight`` and the webhook's volume names, volumes of the webhook's
names with the webhook's own or other sources, mounts at the webhook's path (also spelled with a
trailing slash or ``/./``) and the webhook's exact mount, env entries that set ``NCCL_DEBUG`` at
every level, ``NCCL_DEBUG_FILE``, and ``CCL_POD_*`` as plain values (another pod's identity),
from other fields or from the downward API (as the API server stores it, with ``apiVersion``),
``envFrom`` with and without a ``CCL_`` prefix, init containers that request GPUs, up to 140
containers. Each returned patch is applied with ``jsonpatch`` and the result checked as the API
server does (tests/pod_rules.py); the webhook is then called again on its own output, as
``reinvocationPolicy: IfNeeded`` does, also after the API server's defaulting of ``fieldRef``.
"""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import jsonpatch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from exporter.flags import DEFAULT_PROBE_RESULTS
from exporter.sources.kube import FABRIC_READY_CONDITION
from exporter.webhook.admission import (
    DEBUG_FOLDER_EXPR,
    MAX_PATCH_BYTES,
    MAX_POD_CONTAINERS,
    MAX_WARNINGS,
    MUTATED,
    NCCL_DEBUG_MOUNT,
    NCCL_DEBUG_VOLUME,
    NO_GPU,
    OVERSIZED,
    POD_IDENTITY_ENV,
    PREFLIGHT_CONTAINER,
    PROBE_RESULTS_VOLUME,
    UNCHANGED,
    WITHHELD,
    WebhookConfig,
    review,
)
from tests.pod_rules import check_pod, containers_of, effective_env
from tests.webhook.test_webhook_admission import admission

DEBUG_HOST_PATH = "/var/log/nccl"
OUR_VOLUMES = {
    NCCL_DEBUG_VOLUME: {"hostPath": {"path": DEBUG_HOST_PATH, "type": "DirectoryOrCreate"}},
    PROBE_RESULTS_VOLUME: {"hostPath": {"path": DEFAULT_PROBE_RESULTS, "type": "DirectoryOrCreate"}},
}
OUR_MOUNT = {"name": NCCL_DEBUG_VOLUME, "mountPath": NCCL_DEBUG_MOUNT, "subPathExpr": DEBUG_FOLDER_EXPR}
IDENTITY = dict(POD_IDENTITY_ENV)

labels = st.from_regex(r"\A[a-z]([-a-z0-9]{0,12}[a-z0-9])?\Z")
container_names = (
    st.sampled_from(
        [PREFLIGHT_CONTAINER, NCCL_DEBUG_VOLUME, PROBE_RESULTS_VOLUME, "pytorch", "ccl-preflight-1", "x" * 63]
    )
    | labels
)
volume_names = st.sampled_from([NCCL_DEBUG_VOLUME, PROBE_RESULTS_VOLUME, "data", "dshm"]) | labels
mount_paths = st.sampled_from(
    [
        NCCL_DEBUG_MOUNT,
        NCCL_DEBUG_MOUNT + "/",
        "/var/run/ccl-health/./nccl",
        "/var/run/ccl-health",
        NCCL_DEBUG_MOUNT + "/sub",
        DEFAULT_PROBE_RESULTS,
        "/data",
        "/dev/shm",
    ]
) | st.from_regex(r"\A/m/[a-z]{1,4}\Z")
env_names = st.sampled_from(
    [
        "NCCL_DEBUG",
        "NCCL_DEBUG_SUBSYS",
        "NCCL_DEBUG_FILE",
        "NCCL_IB_HCA",
        "NCCL_SOCKET_IFNAME",
        *IDENTITY,
        "POD_NAME",
        "HOME",
    ]
) | st.from_regex(r"\A[A-Za-z_][A-Za-z0-9_.-]{0,10}\Z")
field_refs = st.sampled_from(
    ["metadata.name", "metadata.namespace", "metadata.uid", "metadata.labels['app']", "spec.nodeName"]
).flatmap(lambda path: st.sampled_from([{"fieldPath": path}, {"apiVersion": "v1", "fieldPath": path}]))
env_sources = st.one_of(
    st.builds(
        lambda v: {"value": v},
        st.sampled_from(
            ["INFO", "info", "WARN", "TRACE", "VERSION", "victim", "other-team", "$(CCL_POD_NAME)", "", "mlx5"]
        ),
    ),
    st.builds(lambda ref: {"valueFrom": {"fieldRef": ref}}, field_refs),
    st.just({"valueFrom": {"configMapKeyRef": {"name": "settings", "key": "k"}}}),
)
env_entries = st.builds(lambda name, source: {"name": name, **source}, env_names, env_sources)
env_from = st.sampled_from(
    [[{"configMapRef": {"name": "settings"}}], [{"prefix": "CCL_", "secretRef": {"name": "pod-names"}}]]
)
resources = st.sampled_from(
    [
        {"limits": {"nvidia.com/gpu": "8", "rdma/ib": "8"}},
        {"limits": {"nvidia.com/gpu": 1, "cpu": "4"}, "requests": {"cpu": "2"}},
        {"requests": {"nvidia.com/gpu": "2"}},
        {"limits": {"cpu": "1"}},
        {"limits": {"nvidia.com/gpu": "0"}},
    ]
)
sources = st.sampled_from(
    [{"emptyDir": {}}, *OUR_VOLUMES.values(), {"hostPath": {"path": "/elsewhere"}}, {"configMap": {"name": "settings"}}]
)
annotation_values = st.sampled_from(["true", "True", " TRUE ", "false", "yes"])


@st.composite
def mounts(draw: st.DrawFn, volumes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not volumes:
        return []
    found: list[dict[str, Any]] = []
    names = [v["name"] for v in volumes]
    if NCCL_DEBUG_VOLUME in names and draw(st.booleans()):
        # The webhook's own mount, or one that differs from it in one way.
        found.append(
            dict(
                OUR_MOUNT,
                **draw(
                    st.sampled_from(
                        [{}, {}, {"mountPath": NCCL_DEBUG_MOUNT + "/"}, {"mountPath": "/logs"}, {"readOnly": True}]
                    )
                ),
            )
        )
    for _ in range(draw(st.integers(0, 3))):
        mount: dict[str, Any] = {"name": draw(st.sampled_from(names)), "mountPath": draw(mount_paths)}
        extra = draw(
            st.sampled_from(
                [
                    {},
                    {"readOnly": True},
                    {"subPath": "sub"},
                    {"subPathExpr": "$(POD_NAME)"},
                    {"subPathExpr": DEBUG_FOLDER_EXPR},
                ]
            )
        )
        mount.update(extra)
        if all(m["mountPath"] != mount["mountPath"] for m in found):
            found.append(mount)
    return found


@st.composite
def containers(draw: st.DrawFn, name: str, volumes: list[dict[str, Any]], gpu_often: bool) -> dict[str, Any]:
    container: dict[str, Any] = {"name": name, "image": "train:1"}
    if draw(st.integers(0, 3)) > (0 if gpu_often else 2):
        container["resources"] = draw(resources)
    if draw(st.integers(0, 3)) > 0:
        container["env"] = draw(st.lists(env_entries, max_size=8))
    if draw(st.integers(0, 4)) == 0:
        container["envFrom"] = draw(env_from)
    if found := draw(mounts(volumes)):
        container["volumeMounts"] = found
    return container


@st.composite
def pods(draw: st.DrawFn, apps: st.SearchStrategy[int] = st.integers(1, 5)) -> dict[str, Any]:  # noqa: B008 - a strategy is immutable
    volume_list = [{"name": n, **draw(sources)} for n in draw(st.lists(volume_names, max_size=4, unique=True))]
    apps_, inits = draw(apps), draw(st.integers(0, 3))
    drawn = draw(st.lists(container_names, min_size=min(apps_ + inits, 2), max_size=min(apps_ + inits, 8), unique=True))
    # The rest start with a digit, which no drawn name does: many containers, no retries.
    names = draw(st.permutations(drawn + [f"{i}-c" for i in range(apps_ + inits - len(drawn))]))
    spec: dict[str, Any] = {
        # Past the first eight, plain GPU containers: a pod of 130 is drawn in a fraction of the time.
        "containers": [
            draw(containers(n, volume_list, gpu_often=True))
            if i < 8
            else {"name": n, "image": "train:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
            for i, n in enumerate(names[:apps_])
        ],
        "restartPolicy": "Never",
    }
    if inits or draw(st.booleans()):
        spec["initContainers"] = [draw(containers(n, volume_list, gpu_often=False)) for n in names[apps_:]]
    if volume_list or draw(st.booleans()):
        spec["volumes"] = volume_list
    if draw(st.integers(0, 3)) == 0:
        spec["readinessGates"] = [{"conditionType": draw(st.sampled_from([FABRIC_READY_CONDITION, "example.com/x"]))}]
    metadata: dict[str, Any] = {
        "name": "worker-0",
        "namespace": "ml",
        "labels": {"training.kubeflow.org/job-name": "llama"},
    }
    annotations = {
        key: draw(annotation_values)
        for key in ("ccl-health.io/preflight", "ccl-health.io/readiness-gate")
        if draw(st.booleans())
    }
    if draw(st.integers(0, 4)) == 0:
        annotations["ccl-health.io/injected"] = draw(st.sampled_from(["nccl_env", "preflight,unknown", ""]))
    if annotations or draw(st.booleans()):
        metadata["annotations"] = annotations
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
    undeclared = [n for n in (NCCL_DEBUG_VOLUME, PROBE_RESULTS_VOLUME) if n not in [v["name"] for v in volume_list]]
    if undeclared and draw(st.integers(0, 5)) == 3:
        # Invalid as sent: it mounts a volume it does not declare, and would be valid if the webhook added it.
        _, _, thief = draw(st.sampled_from(list(containers_of(pod))))
        if all(m["mountPath"] != "/stolen" for m in thief.get("volumeMounts", ())):
            thief.setdefault("volumeMounts", []).append(
                {"name": draw(st.sampled_from(undeclared)), "mountPath": "/stolen", "subPath": "other_victim_uid"}
            )
    return pod


configs = st.builds(
    WebhookConfig,
    nccl_debug_file_host_path=st.sampled_from(["", DEBUG_HOST_PATH]),
    probe_results_host_path=st.sampled_from([DEFAULT_PROBE_RESULTS, ""]),
)


def apply(pod: dict[str, Any], config: WebhookConfig) -> tuple[dict[str, Any], Any]:
    """(the pod after the webhook's patch, the Review), after checking the response's shape."""
    result = review(admission(pod), config)
    response = result.response["response"]
    assert response["allowed"] is True and len(response.get("warnings", ())) <= MAX_WARNINGS
    assert set(result.withheld) <= set(WITHHELD)
    if "patch" not in response:
        assert result.patch == () and result.decision != MUTATED
        return pod, result
    encoded = base64.b64decode(response["patch"])
    assert len(encoded) <= MAX_PATCH_BYTES and json.loads(encoded) == list(result.patch)
    assert result.decision == MUTATED
    for op in result.patch:
        assert op["op"] == "add" or (
            op["op"] == "replace" and "/env/" in op["path"] and op["value"]["name"] in IDENTITY
        ), op
    return jsonpatch.apply_patch(pod, list(result.patch)), result


def assert_identity_where_the_folder_is_mounted(pod: dict[str, Any], config: WebhookConfig, decision: str) -> None:
    """In a pod the webhook looks into, every container that mounts the host's debug folder with
    the per-pod ``subPathExpr`` names that folder from the downward API, whatever the pod wrote.
    (A pod it does not look into, one without GPUs or over the limits, gets no debug folder from
    it: one that mounts the host folder has declared the hostPath itself.)"""
    ours = {
        "name": NCCL_DEBUG_VOLUME,
        "hostPath": {"path": config.nccl_debug_file_host_path, "type": "DirectoryOrCreate"},
    }
    if decision in (NO_GPU, OVERSIZED) or ours not in pod["spec"].get("volumes", []):
        return
    for _, _, container in containers_of(pod):
        if any(
            m.get("name") == NCCL_DEBUG_VOLUME and "$(CCL_POD_" in m.get("subPathExpr", "")
            for m in container.get("volumeMounts", ())
        ):
            env = effective_env(container)
            for name, field_path in IDENTITY.items():
                entry = env.get(name)
                assert entry is not None and "value" not in entry, (container["name"], entry)
                assert entry["valueFrom"]["fieldRef"]["fieldPath"] == field_path


def assert_no_host_folder_is_lent(before: dict[str, Any], after: dict[str, Any]) -> None:
    """A volume the patch adds is mounted only where the patch mounts it: a pod that mounts a
    name it does not declare never gets a host folder under that name."""
    added = {v["name"] for v in after["spec"].get("volumes", [])} - {
        v["name"] for v in before["spec"].get("volumes", [])
    }
    for _, _, container in containers_of(before):
        assert not [m for m in container.get("volumeMounts", ()) if m["name"] in added], container


def assert_the_pod_keeps_what_it_had(before: dict[str, Any], after: dict[str, Any]) -> None:
    """Nothing of the pod is removed or changed, but its own ``CCL_POD_*`` entries where replaced."""
    old, new = before["spec"], after["spec"]
    assert new.get("volumes", [])[: len(old.get("volumes", []))] == old.get("volumes", [])
    assert [c["name"] for c in new["containers"]] == [c["name"] for c in old["containers"]]
    old_inits, new_inits = old.get("initContainers", []), new.get("initContainers", [])
    added = len(new_inits) - len(old_inits)
    assert added in (0, 1) and [c["name"] for c in new_inits[added:]] == [c["name"] for c in old_inits], (
        "the pod's init containers keep their order, after the pre-flight"
    )
    for was, now in [
        *zip(old["containers"], new["containers"], strict=True),
        *zip(old_inits, new_inits[added:], strict=True),
    ]:
        assert now.get("volumeMounts", [])[: len(was.get("volumeMounts", []))] == was.get("volumeMounts", [])
        assert now.get("envFrom") == was.get("envFrom") and now.get("resources") == was.get("resources")
        for entry, kept in zip(was.get("env", []), now.get("env", []), strict=False):
            assert kept == entry or (kept["name"] == entry["name"] in IDENTITY), (entry, kept)
    for key, value in before["metadata"].get("annotations", {}).items():
        if key != "ccl-health.io/injected":
            assert after["metadata"]["annotations"][key] == value


def requests_gpus(container: dict[str, Any]) -> bool:
    sections = container.get("resources", {})
    return any(str(sections.get(s, {}).get("nvidia.com/gpu", "0")) != "0" for s in ("limits", "requests"))


def assert_the_webhook_did_its_job(
    pod: dict[str, Any], out: dict[str, Any], decision: str, config: WebhookConfig
) -> None:
    """Withholding is for collisions only: a GPU container that sets no NCCL_DEBUG and has no
    envFrom gets NCCL_DEBUG=INFO, and an annotated pod whose container names and results volume
    leave room for it gets the pre-flight."""
    containers_ = [c for _, _, c in containers_of(pod)]
    gpus = any(requests_gpus(c) for c in containers_)
    assert (decision == NO_GPU) == (not gpus)
    # These pods stay far below MAX_PATCH_BYTES (tests/webhook/test_webhook_collisions.py reaches it).
    assert (decision == OVERSIZED) == (gpus and len(containers_) > MAX_POD_CONTAINERS)
    if decision in (NO_GPU, OVERSIZED):
        assert out == pod
        return
    for was, now in zip(pod["spec"]["containers"], out["spec"]["containers"], strict=True):
        if (
            requests_gpus(was)
            and "NCCL_DEBUG" not in {e["name"] for e in was.get("env", [])}
            and not was.get("envFrom")
        ):
            assert effective_env(now)["NCCL_DEBUG"] == {"name": "NCCL_DEBUG", "value": "INFO"}
    wanted = pod["metadata"].get("annotations", {}).get("ccl-health.io/preflight", "").strip().lower() == "true"
    name_free = all(c["name"] != PREFLIGHT_CONTAINER for c in containers_)
    results = [v for v in pod["spec"].get("volumes", []) if v["name"] == PROBE_RESULTS_VOLUME]
    mounted = any(m["name"] == PROBE_RESULTS_VOLUME for c in containers_ for m in c.get("volumeMounts", ()))
    volume_free = (
        not config.probe_results_host_path
        or (not results and not mounted)
        or results == [{"name": PROBE_RESULTS_VOLUME, **OUR_VOLUMES[PROBE_RESULTS_VOLUME]}]
    )
    if wanted and name_free and volume_free:
        first = out["spec"]["initContainers"][0]
        assert first["name"] == PREFLIGHT_CONTAINER and first["image"] == config.preflight_image


def as_stored(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as the API server stores it: ``fieldRef.apiVersion`` defaulted to v1."""
    stored = copy.deepcopy(pod)
    for _, _, container in containers_of(stored):
        for entry in container.get("env", []):
            if "fieldRef" in entry.get("valueFrom", {}):
                entry["valueFrom"]["fieldRef"].setdefault("apiVersion", "v1")
    return stored


def mounts_undeclared(pod: dict[str, Any]) -> bool:
    declared = {v["name"] for v in pod["spec"].get("volumes", [])}
    return any(m["name"] not in declared for _, _, c in containers_of(pod) for m in c.get("volumeMounts", ()))


def check_one(pod: dict[str, Any], config: WebhookConfig) -> None:
    invalid_as_sent = mounts_undeclared(pod)
    event(f"invalid as sent: {invalid_as_sent}")
    if not invalid_as_sent:
        check_pod(pod)  # every other generated pod is valid
    before = copy.deepcopy(pod)
    out, result = apply(pod, config)
    assert pod == before, "the request is never modified"
    event(result.decision)
    for change, reason in result.withheld:
        event(f"withheld {change} ({reason})")
    for change in result.changes:
        event(f"change {change}")
    if invalid_as_sent:
        assert mounts_undeclared(out), "the webhook made a pod valid by lending it a host folder"
    else:
        check_pod(out)
    assert_identity_where_the_folder_is_mounted(out, config, result.decision)
    assert_the_pod_keeps_what_it_had(pod, out)
    assert_no_host_folder_is_lent(pod, out)
    assert_the_webhook_did_its_job(pod, out, result.decision, config)
    for again in (out, as_stored(out)):
        second = review(admission(again), config)
        assert second.patch == (), f"a reinvocation changed the pod again: {second.patch}"
        assert second.decision in (UNCHANGED, OVERSIZED, NO_GPU) or result.decision == NO_GPU


@given(pods(), configs)
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
def test_every_patch_leaves_a_valid_pod_and_a_reinvocation_adds_nothing(
    pod: dict[str, Any], config: WebhookConfig
) -> None:
    check_one(pod, config)


@given(pods(apps=st.sampled_from(range(MAX_POD_CONTAINERS - 4, MAX_POD_CONTAINERS + 3))), configs)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
def test_pods_around_the_container_limit(pod: dict[str, Any], config: WebhookConfig) -> None:
    check_one(pod, config)

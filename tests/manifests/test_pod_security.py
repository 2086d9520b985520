"""The Pod Security checker of the tests (tests/pod_security.py) fails each pod built to break
one check of the upstream policy (pod-security-admission/policy/check_*.go), and no other, and
passes the pods the standards' documentation gives as compliant."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.pod_security import BASELINE, RESTRICTED, passes, violations


def restricted_pod() -> dict[str, Any]:
    """What the Pod Security Standards page shows as a restricted pod: non-root, RuntimeDefault
    seccomp at pod level, every container dropping ALL with no privilege escalation."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "w-0", "namespace": "ml"},
        "spec": {
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "train",
                    "image": "t:1",
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
            "initContainers": [
                {
                    "name": "fetch",
                    "image": "f:1",
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
                    },
                }
            ],
            "volumes": [{"name": "data", "emptyDir": {}}, {"name": "cfg", "configMap": {"name": "c"}}],
        },
    }


def changed(path: str, value: Any, container: str = "containers") -> dict[str, Any]:
    pod = restricted_pod()
    target = pod["spec"] if path.startswith("spec.") else pod["spec"][container][0]
    keys = path.removeprefix("spec.").split(".")
    for key in keys[:-1]:
        target = target.setdefault(key, {})
    target[keys[-1]] = value
    return pod


def test_the_restricted_example_passes_both_levels() -> None:
    assert violations(restricted_pod(), RESTRICTED) == {}
    assert passes(restricted_pod(), BASELINE)


# (the change, the check it breaks, the level whose check it is)
BREAKS = [
    (changed("spec.hostNetwork", True), "host_namespaces", BASELINE),
    (changed("spec.hostPID", True), "host_namespaces", BASELINE),
    (changed("securityContext.privileged", True), "privileged", BASELINE),
    (changed("securityContext.capabilities.add", ["NET_ADMIN"], "initContainers"), "capabilities_baseline", BASELINE),
    (changed("spec.volumes", [{"name": "h", "hostPath": {"path": "/var/lib/x"}}]), "host_path_volumes", BASELINE),
    (changed("ports", [{"containerPort": 80, "hostPort": 8080}]), "host_ports", BASELINE),
    (changed("securityContext.appArmorProfile", {"type": "Unconfined"}), "app_armor", BASELINE),
    (changed("securityContext.seLinuxOptions", {"type": "spc_t"}), "se_linux_options", BASELINE),
    (changed("securityContext.procMount", "Unmasked"), "proc_mount", BASELINE),
    (changed("securityContext.seccompProfile", {"type": "Unconfined"}), "seccomp_baseline", BASELINE),
    (changed("spec.securityContext.sysctls", [{"name": "kernel.msgmax", "value": "1"}]), "sysctls", BASELINE),
    (changed("securityContext.windowsOptions", {"hostProcess": True}), "windows_host_process", BASELINE),
    (changed("readinessProbe", {"httpGet": {"port": 80, "host": "10.0.0.1"}}), "host_probes_and_lifecycle", BASELINE),
    (changed("spec.volumes", [{"name": "n", "nfs": {"server": "s", "path": "/"}}]), "restricted_volumes", RESTRICTED),
    (
        changed("securityContext.allowPrivilegeEscalation", True, "initContainers"),
        "allow_privilege_escalation",
        RESTRICTED,
    ),
    (changed("securityContext.runAsNonRoot", False), "run_as_non_root", RESTRICTED),
    (changed("securityContext.runAsUser", 0), "run_as_user", RESTRICTED),
    (changed("securityContext.capabilities", {"drop": ["NET_RAW"]}), "capabilities_restricted", RESTRICTED),
]


@pytest.mark.parametrize(("pod", "check", "level"), BREAKS, ids=[f"{c}-{i}" for i, (_, c, _) in enumerate(BREAKS)])
def test_each_check_fails_the_pod_built_to_break_it(pod: dict[str, Any], check: str, level: str) -> None:
    assert list(violations(pod, BASELINE)) == ([check] if level == BASELINE else [])
    assert check in violations(pod, RESTRICTED)
    if level == RESTRICTED:
        assert list(violations(pod, RESTRICTED)) == [check]


def test_the_pod_level_settings_restricted_accepts_from_either_place() -> None:
    """runAsNonRoot and seccomp: at pod level, or in every container (init ones included)."""
    pod = restricted_pod()
    del pod["spec"]["securityContext"]
    assert set(violations(pod, RESTRICTED)) == {"run_as_non_root", "seccomp_restricted"}
    for container in pod["spec"]["containers"] + pod["spec"]["initContainers"]:
        container["securityContext"].update(
            runAsNonRoot=True, seccompProfile={"type": "Localhost", "localhostProfile": "p.json"}
        )
    assert passes(pod, RESTRICTED)
    unset = copy.deepcopy(pod)
    del unset["spec"]["initContainers"][0]["securityContext"]["runAsNonRoot"]
    assert list(violations(unset, RESTRICTED)) == ["run_as_non_root"], "an init container counts too"
    ephemeral = copy.deepcopy(pod)
    ephemeral["spec"]["ephemeralContainers"] = [{"name": "debug", "image": "busybox"}]
    assert set(violations(ephemeral, RESTRICTED)) == {
        "allow_privilege_escalation",
        "run_as_non_root",
        "seccomp_restricted",
        "capabilities_restricted",
    }

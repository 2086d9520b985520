"""Pod Security Standards, the checks of the ``baseline`` and ``restricted`` levels as the
PodSecurity admission plugin runs them on a pod, written from the upstream policy definitions:
kubernetes/kubernetes ``staging/src/k8s.io/pod-security-admission/policy/check_*.go`` (each check
below names its file). No validator of these levels is on PyPI; this one is checked against
pods built to fail each check (tests/manifests/test_pod_security.py).

What it leaves out, each making it stricter than upstream, never laxer: the relaxations for pods
with user namespaces (``hostUsers: false``, runAsNonRoot/runAsUser from 1.33) and the sysctls
added to the safe list after 1.0 (``check_sysctls.go`` newer versions). Every container kind is
visited as upstream ``visitContainers`` does: ``containers``, ``initContainers`` and
``ephemeralContainers``. A level's checks are those of all levels below it too: ``restricted``
is ``baseline`` plus its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

BASELINE, RESTRICTED = "baseline", "restricted"
CONTAINER_KINDS = ("containers", "initContainers", "ephemeralContainers")
# check_capabilities_baseline.go
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}
# check_sysctls.go (the 1.0 set)
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
}
# check_seLinuxOptions.go
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t"}
# check_restrictedVolumes.go: the only volume sources restricted allows
RESTRICTED_VOLUME_SOURCES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"

Pod = Mapping[str, Any]


def _map(obj: Any, key: str) -> Mapping[str, Any]:
    found = obj.get(key) if isinstance(obj, Mapping) else None
    return found if isinstance(found, Mapping) else {}


def containers(pod: Pod) -> Iterator[Mapping[str, Any]]:
    spec = _map(pod, "spec")
    for kind in CONTAINER_KINDS:
        for container in spec.get(kind) or []:
            if isinstance(container, Mapping):
                yield container


def _pod_context(pod: Pod) -> Mapping[str, Any]:
    return _map(_map(pod, "spec"), "securityContext")


def _context(container: Mapping[str, Any]) -> Mapping[str, Any]:
    return _map(container, "securityContext")


def _names(pod: Pod, bad: Callable[[Mapping[str, Any]], bool]) -> list[str]:
    return [str(c.get("name")) for c in containers(pod) if bad(c)]


# ---- baseline ----


def host_namespaces(pod: Pod) -> str | None:
    """check_hostNamespaces.go: hostNetwork, hostPID, hostIPC unset or false."""
    spec = _map(pod, "spec")
    used = [key for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key) is True]
    return f"{', '.join(used)} must not be true" if used else None


def privileged(pod: Pod) -> str | None:
    """check_privileged.go: no container with securityContext.privileged true."""
    bad = _names(pod, lambda c: _context(c).get("privileged") is True)
    return f"containers {bad} are privileged" if bad else None


def capabilities_baseline(pod: Pod) -> str | None:
    """check_capabilities_baseline.go: capabilities.add only from the default set."""
    bad = _names(pod, lambda c: bool(set(_map(_context(c), "capabilities").get("add") or []) - BASELINE_CAPABILITIES))
    return f"containers {bad} add non-default capabilities" if bad else None


def host_path_volumes(pod: Pod) -> str | None:
    """check_hostPathVolumes.go: no hostPath volume."""
    bad = [v.get("name") for v in _map(pod, "spec").get("volumes") or [] if isinstance(v, Mapping) and "hostPath" in v]
    return f"hostPath volumes {bad}" if bad else None


def host_ports(pod: Pod) -> str | None:
    """check_hostPorts.go: containers' ports[].hostPort unset or 0."""
    bad = _names(
        pod, lambda c: any(isinstance(p, Mapping) and p.get("hostPort") not in (None, 0) for p in c.get("ports") or [])
    )
    return f"containers {bad} use host ports" if bad else None


def app_armor(pod: Pod) -> str | None:
    """check_appArmorProfile.go: no Unconfined profile (field or annotation)."""
    annotations = _map(_map(pod, "metadata"), "annotations")
    bad_annotations = [
        k
        for k, v in annotations.items()
        if str(k).startswith(APPARMOR_ANNOTATION)
        and v not in ("", "runtime/default")
        and not str(v).startswith("localhost/")
    ]
    contexts = [_pod_context(pod), *(_context(c) for c in containers(pod))]
    bad_fields = [
        c for c in contexts if _map(c, "appArmorProfile").get("type") not in (None, "RuntimeDefault", "Localhost")
    ]
    return "AppArmor profile Unconfined" if bad_annotations or bad_fields else None


def se_linux_options(pod: Pod) -> str | None:
    """check_seLinuxOptions.go: type from the allowed set, no user, no role."""

    def bad(context: Mapping[str, Any]) -> bool:
        options = _map(context, "seLinuxOptions")
        return options.get("type", "") not in SELINUX_TYPES or bool(options.get("user")) or bool(options.get("role"))

    contexts = [_pod_context(pod), *(_context(c) for c in containers(pod))]
    return "forbidden seLinuxOptions" if any(bad(c) for c in contexts) else None


def proc_mount(pod: Pod) -> str | None:
    """check_procMount.go: procMount unset or Default."""
    bad = _names(pod, lambda c: _context(c).get("procMount") not in (None, "Default"))
    return f"containers {bad} set procMount" if bad else None


def seccomp_baseline(pod: Pod) -> str | None:
    """check_seccompProfile_baseline.go: no Unconfined seccomp profile."""
    contexts = [_pod_context(pod), *(_context(c) for c in containers(pod))]
    unconfined = any(_map(c, "seccompProfile").get("type") == "Unconfined" for c in contexts)
    return "seccompProfile Unconfined" if unconfined else None


def sysctls(pod: Pod) -> str | None:
    """check_sysctls.go: only the safe sysctls."""
    bad = [
        s.get("name")
        for s in _pod_context(pod).get("sysctls") or []
        if isinstance(s, Mapping) and s.get("name") not in SAFE_SYSCTLS
    ]
    return f"forbidden sysctls {bad}" if bad else None


def windows_host_process(pod: Pod) -> str | None:
    """check_windowsHostProcess.go: windowsOptions.hostProcess not true."""
    contexts = [_pod_context(pod), *(_context(c) for c in containers(pod))]
    return "hostProcess" if any(_map(c, "windowsOptions").get("hostProcess") is True for c in contexts) else None


def host_probes_and_lifecycle(pod: Pod) -> str | None:
    """check_hostProbesAndhostLifecycle.go (1.34): no host in probes' or lifecycle handlers' httpGet/tcpSocket."""

    def hosts(c: Mapping[str, Any]) -> bool:
        handlers = [_map(c, probe) for probe in ("livenessProbe", "readinessProbe", "startupProbe")]
        handlers += [_map(_map(c, "lifecycle"), hook) for hook in ("postStart", "preStop")]
        return any(_map(h, kind).get("host") for h in handlers for kind in ("httpGet", "tcpSocket"))

    bad = _names(pod, hosts)
    return f"containers {bad} set a probe or lifecycle host" if bad else None


# ---- restricted ----


def restricted_volumes(pod: Pod) -> str | None:
    """check_restrictedVolumes.go: only configMap, csi, downwardAPI, emptyDir, ephemeral, PVC, projected, secret."""
    bad = [
        v.get("name")
        for v in _map(pod, "spec").get("volumes") or []
        if isinstance(v, Mapping) and not (set(v) - {"name"}) & RESTRICTED_VOLUME_SOURCES
    ]
    return f"volumes {bad} have restricted types" if bad else None


def allow_privilege_escalation(pod: Pod) -> str | None:
    """check_allowPrivilegeEscalation.go: every container sets allowPrivilegeEscalation false."""
    bad = _names(pod, lambda c: _context(c).get("allowPrivilegeEscalation") is not False)
    return f"containers {bad} must set allowPrivilegeEscalation=false" if bad else None


def run_as_non_root(pod: Pod) -> str | None:
    """check_runAsNonRoot.go: pod runAsNonRoot true (and no container false), or every container true."""
    pod_value = _pod_context(pod).get("runAsNonRoot")
    if pod_value is False:
        return "the pod sets runAsNonRoot=false"
    explicit = _names(pod, lambda c: _context(c).get("runAsNonRoot") is False)
    implicit = _names(pod, lambda c: _context(c).get("runAsNonRoot") is None and pod_value is not True)
    if explicit or implicit:
        return f"containers {explicit + implicit} must set runAsNonRoot=true"
    return None


def run_as_user(pod: Pod) -> str | None:
    """check_runAsUser.go: no runAsUser 0, pod or container."""
    bad = _names(pod, lambda c: _context(c).get("runAsUser") == 0)
    return "runAsUser=0" if _pod_context(pod).get("runAsUser") == 0 or bad else None


def seccomp_restricted(pod: Pod) -> str | None:
    """check_seccompProfile_restricted.go: RuntimeDefault or Localhost, at pod level or in every container."""
    allowed = ("RuntimeDefault", "Localhost")
    pod_profile = _pod_context(pod).get("seccompProfile")
    if isinstance(pod_profile, Mapping) and pod_profile.get("type") not in allowed:
        return f"the pod sets seccompProfile {pod_profile.get('type')}"

    def bad(c: Mapping[str, Any]) -> bool:
        own = _context(c).get("seccompProfile")
        return own.get("type") not in allowed if isinstance(own, Mapping) else not isinstance(pod_profile, Mapping)

    found = _names(pod, bad)
    return f"containers {found} must set seccompProfile RuntimeDefault or Localhost" if found else None


def capabilities_restricted(pod: Pod) -> str | None:
    """check_capabilities_restricted.go: every container drops ALL and adds at most NET_BIND_SERVICE."""

    def bad(c: Mapping[str, Any]) -> bool:
        capabilities = _map(_context(c), "capabilities")
        return "ALL" not in (capabilities.get("drop") or []) or bool(
            set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}
        )

    found = _names(pod, bad)
    return f"containers {found} must drop ALL capabilities" if found else None


CHECKS: dict[str, tuple[Callable[[Pod], str | None], ...]] = {
    BASELINE: (
        host_namespaces,
        privileged,
        capabilities_baseline,
        host_path_volumes,
        host_ports,
        app_armor,
        se_linux_options,
        proc_mount,
        seccomp_baseline,
        sysctls,
        windows_host_process,
        host_probes_and_lifecycle,
    ),
    RESTRICTED: (
        restricted_volumes,
        allow_privilege_escalation,
        run_as_non_root,
        run_as_user,
        seccomp_restricted,
        capabilities_restricted,
    ),
}


def violations(pod: Pod, level: str) -> dict[str, str]:
    """check name → why, for every check of ``level`` (and the levels below it) the pod fails."""
    checks = CHECKS[BASELINE] + (CHECKS[RESTRICTED] if level == RESTRICTED else ())
    return {check.__name__: why for check in checks if (why := check(pod)) is not None}


def passes(pod: Pod, level: str) -> bool:
    return not violations(pod, level)

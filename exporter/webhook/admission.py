"""The webhook's decision, pure: an AdmissionReview v1 request in, the AdmissionReview response out.

For a pod being created that requests GPUs (``nvidia.com/gpu`` or a name in
``WebhookConfig.gpu_resources``, in the requests or limits of any container) the response
carries one JSONPatch (RFC 6902, base64) that adds:

* ``NCCL_DEBUG=INFO`` and ``NCCL_DEBUG_SUBSYS=INIT,NET`` to every GPU container that sets no
  ``NCCL_DEBUG`` (a container that sets it, or takes its environment from ``envFrom``, where it
  may be set, is left exactly as it is), and with ``nccl_debug_file_host_path`` also
  ``NCCL_DEBUG_FILE`` into a per-pod folder of that host path (``<namespace>_<pod>_<uid>``, what
  the exporter's ``--path.nccl-debug-files`` reads), so the application's stdout stays clean;
* the readiness gate ``ccl-health.io/fabric-ready`` when the pod is annotated
  ``ccl-health.io/readiness-gate: "true"``;
* the pre-flight init container (``ccl-exporter preflight``, first among the init containers)
  when annotated ``ccl-health.io/preflight: "true"``: its result reaches the exporter as its
  termination message, with no volume (Pod Security ``baseline`` forbids hostPath; a result-file
  hostPath only with ``probe_results_host_path``);
* the annotation ``ccl-health.io/injected`` naming what was added.

Every patch leaves a valid pod: what it adds never takes a name or a path the pod already uses.
Where the pod already uses one (a container named ``ccl-preflight`` that is not an init
container, a volume named like ours that is not ours, something else mounted at our mount path)
that one change is withheld, with an admission warning, and counted (``WITHHELD``). The folder a
container's debug file goes to is named from ``CCL_POD_NAMESPACE``, ``CCL_POD_NAME`` and
``CCL_POD_UID``: in every container that mounts it, each definition of those three the pod wrote
is replaced by the downward API one (``pod_identity_env``), so no pod can write into another's
folder. A pod with more than ``MAX_POD_CONTAINERS`` containers, or whose patch would be over
``MAX_PATCH_BYTES``, is allowed without a patch (decision ``oversized``).

Everything else (another kind, another operation, a CPU-only pod, a pod that already has all of
it) is allowed without a patch. A body that is not an AdmissionReview v1 request as an API
server sends it raises ``MalformedReview`` (HTTP 400), one larger than an API server sends
``ReviewTooLarge`` (HTTP 413; ``exporter.webhook.body``). Which namespaces are asked at all is the
``namespaceSelector`` of the MutatingWebhookConfiguration (``ccl-health.io/inject: enabled``):
the request carries no namespace labels.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from exporter import __version__
from exporter.flags import DEFAULT_PROBE_RESULTS
from exporter.results.preflight_message import DEFAULT_TERMINATION_MESSAGE_PATH
from exporter.results.preflight_message import PREFLIGHT_CONTAINER as PREFLIGHT_CONTAINER
from exporter.sources.kube import FABRIC_READY_CONDITION, attribute_job
from exporter.webhook.body import MAX_UID_CHARS, MalformedReview
from exporter.webhook.podspec import (
    ABSENT,
    TAKEN,
    annotated,
    dicts,
    env_names,
    is_list,
    largest_gpu_container,
    last_literal_env,
    length,
    listed,
    mapping,
    requests_gpu,
    same_path,
    shown_name,
    volume_state,
)

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"
GPU_RESOURCE = "nvidia.com/gpu"
INJECT_NAMESPACE_LABEL = "ccl-health.io/inject"
READINESS_GATE_ANNOTATION = "ccl-health.io/readiness-gate"
PREFLIGHT_ANNOTATION = "ccl-health.io/preflight"
INJECTED_ANNOTATION = "ccl-health.io/injected"
PROBE_RESULTS_VOLUME = "ccl-probe-results"
NCCL_DEBUG_VOLUME = "ccl-nccl-debug"
NCCL_DEBUG_MOUNT = "/var/run/ccl-health/nccl"
# Downward-API variables the debug-file folder is named from (subPathExpr expands a container's env).
POD_IDENTITY_ENV = (("CCL_POD_NAMESPACE", "metadata.namespace"), ("CCL_POD_NAME", "metadata.name"),
                    ("CCL_POD_UID", "metadata.uid"))  # fmt: skip
DEBUG_FOLDER_EXPR = "$(CCL_POD_NAMESPACE)_$(CCL_POD_NAME)_$(CCL_POD_UID)"

# What a review decided; each is a value of ccl_webhook_admission_reviews_total{decision}.
MUTATED = "mutated"  # a GPU pod, patched
UNCHANGED = "unchanged"  # a GPU pod that already has everything (or sets NCCL_DEBUG itself)
NO_GPU = "no_gpu"  # a pod that requests no GPU
SKIPPED = "skipped"  # not a pod being created: another kind or operation, a subresource, no object
MALFORMED = "malformed"  # not an AdmissionReview v1 request as an API server sends it: HTTP 400
OVERSIZED = "oversized"  # a body over the limits (HTTP 413), or a pod or patch over them (no patch)
ERROR = "error"  # the webhook failed on this pod: allowed without a patch (fail-safe)
DECISIONS = (MUTATED, UNCHANGED, NO_GPU, SKIPPED, MALFORMED, OVERSIZED, ERROR)
# What a patch adds; each is a value of ccl_webhook_mutations_total{change}.
NCCL_ENV, NCCL_DEBUG_FILE, POD_IDENTITY, READINESS_GATE, PREFLIGHT = (
    "nccl_env", "nccl_debug_file", "pod_identity_env", "readiness_gate", "preflight")  # fmt: skip
CHANGES = (NCCL_ENV, NCCL_DEBUG_FILE, POD_IDENTITY, READINESS_GATE, PREFLIGHT)
# Why a change was withheld; each pair is a series of ccl_webhook_withheld_changes_total{change,reason}.
ENV_FROM = "env_from"  # the container takes variables from envFrom, which may set NCCL_DEBUG
OWN_NCCL_DEBUG = "own_nccl_debug"  # the container sets an NCCL_DEBUG level that hides the transport
CONTAINER_NAME_TAKEN = "container_name_taken"  # a container that is not an init container has our name
VOLUME_NAME_TAKEN = "volume_name_taken"  # the pod has a volume of our name that is not ours
MOUNT_PATH_TAKEN = "mount_path_taken"  # the container mounts something else at our path (or ours elsewhere)
WITHHELD = ((NCCL_ENV, ENV_FROM), (NCCL_ENV, OWN_NCCL_DEBUG), (NCCL_DEBUG_FILE, VOLUME_NAME_TAKEN),
            (NCCL_DEBUG_FILE, MOUNT_PATH_TAKEN), (PREFLIGHT, CONTAINER_NAME_TAKEN),
            (PREFLIGHT, VOLUME_NAME_TAKEN))  # fmt: skip

# Work per review: a pod with more containers (of every kind) than this is not looked into.
MAX_POD_CONTAINERS = 128
# A patch of a pod with MAX_POD_CONTAINERS GPU containers is about 100 KiB; one over this is not sent.
MAX_PATCH_BYTES = 256 * 1024
MAX_WARNINGS = 8  # admission warnings shown by kubectl; a pod with many containers gets a summary


class PatchTooLarge(Exception):
    """The patch grew over ``MAX_PATCH_BYTES``."""


# The pre-flight's image unless --webhook.preflight-image says otherwise: this build's own version,
# the tag `make image` gives the image it builds (docs/release.md).
DEFAULT_PREFLIGHT_IMAGE = f"ccl-health-exporter:{__version__}"


@dataclass(frozen=True)
class WebhookConfig:
    """What the webhook adds, from the ``ccl-exporter webhook`` flags."""

    gpu_resources: tuple[str, ...] = (GPU_RESOURCE,)
    nccl_debug_subsys: str = "INIT,NET"
    # A host folder for NCCL_DEBUG_FILE (a per-pod folder below it); "" keeps NCCL's output on stdout.
    nccl_debug_file_host_path: str = ""
    preflight_image: str = DEFAULT_PREFLIGHT_IMAGE
    preflight_args: tuple[str, ...] = ("preflight",)
    # A host folder for the pre-flight's result file too (the exporter's --path.probe-results); "": none,
    # the result reaches the exporter as the container's termination message alone (no hostPath).
    probe_results_host_path: str = ""


@dataclass(frozen=True)
class Review:
    """The response to send (an AdmissionReview), what was decided, what the patch adds and which
    changes were withheld (``(change, reason)``)."""

    response: dict[str, Any]
    decision: str
    changes: tuple[str, ...] = ()
    patch: tuple[dict[str, Any], ...] = ()
    withheld: tuple[tuple[str, str], ...] = ()


@dataclass
class _Patch:
    """JSONPatch operations for one pod (bounded in bytes), what they add and what was withheld."""

    spec: Mapping[str, Any]
    ops: list[dict[str, Any]] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    withheld: list[tuple[str, str]] = field(default_factory=list)
    volumes: list[dict[str, Any]] = field(default_factory=list)
    size: int = 2  # the brackets of the JSON array

    def add(self, operation: dict[str, Any]) -> None:
        self.size += len(json.dumps(operation, separators=(",", ":"))) + 1
        if self.size > MAX_PATCH_BYTES:
            raise PatchTooLarge
        self.ops.append(operation)

    def append(self, path: str, items: Sequence[Any], present: bool) -> None:
        """Add ``items`` to the array at ``path``: create it when absent, else append each."""
        if not items:
            return
        if present:
            for item in items:
                self.add({"op": "add", "path": f"{path}/-", "value": item})
        else:
            self.add({"op": "add", "path": path, "value": list(items)})

    def note(self, change: str) -> None:
        if change not in self.changes:
            self.changes.append(change)

    def withhold(self, change: str, reason: str, warning: str) -> None:
        if (change, reason) not in self.withheld:
            self.withheld.append((change, reason))
        self.warnings.append(f"ccl-health: {warning}")

    def add_volume(self, folder: _HostFolder) -> None:
        if folder.state == ABSENT and folder.volume not in self.volumes:
            self.volumes.append(folder.volume)


def escape_pointer(token: str) -> str:
    """One JSON Pointer reference token (RFC 6901): ``~`` is ``~0``, ``/`` is ``~1``."""
    return token.replace("~", "~0").replace("/", "~1")


def request_uid(document: Mapping[str, Any]) -> str:
    """The request's uid, after checking the envelope; ``MalformedReview`` when it is not one."""
    if document.get("apiVersion") != API_VERSION or document.get("kind") != KIND:
        raise MalformedReview(f"not an {KIND} {API_VERSION} (admissionReviewVersions must be [v1])")
    request = document.get("request")
    if not isinstance(request, dict):
        raise MalformedReview("AdmissionReview has no request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise MalformedReview("AdmissionReview request has no uid")
    if len(uid) > MAX_UID_CHARS:
        raise MalformedReview(f"AdmissionReview request uid is longer than {MAX_UID_CHARS} characters")
    return uid


def response_for(uid: str, patch: Sequence[Mapping[str, Any]] = (), warnings: Sequence[str] = ()) -> dict[str, Any]:
    """An AdmissionReview v1 response that allows the request, with the patch if there is one."""
    answer: dict[str, Any] = {"uid": uid, "allowed": True}
    if patch:
        answer["patchType"] = "JSONPatch"
        answer["patch"] = base64.b64encode(json.dumps(list(patch), separators=(",", ":")).encode()).decode()
    if warnings:
        answer["warnings"] = list(warnings)
    return {"apiVersion": API_VERSION, "kind": KIND, "response": answer}


def review(document: Mapping[str, Any], config: WebhookConfig) -> Review:
    """The response to one AdmissionReview request (``MalformedReview`` when it is not one)."""
    uid = request_uid(document)
    request = document["request"]
    pod = request.get("object")
    kind = request.get("kind")
    is_pod = isinstance(kind, dict) and kind.get("group", "") == "" and kind.get("kind") == "Pod"
    if not is_pod or request.get("operation") != "CREATE" or request.get("subResource") or not isinstance(pod, dict):
        return Review(response_for(uid), SKIPPED)
    spec = pod.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("containers"), list):
        return Review(response_for(uid), SKIPPED)
    gpu_names = tuple(dict.fromkeys((GPU_RESOURCE, *config.gpu_resources)))
    apps, inits = listed(spec, "containers"), listed(spec, "initContainers")
    if not any(requests_gpu(c, gpu_names) for _, c in apps + inits):
        return Review(response_for(uid), NO_GPU)
    count = len(spec["containers"]) + length(spec, "initContainers") + length(spec, "ephemeralContainers")
    if count > MAX_POD_CONTAINERS:
        warning = f"ccl-health: the pod has {count} containers, more than the {MAX_POD_CONTAINERS} looked at: unchanged"
        return Review(response_for(uid, warnings=[warning]), OVERSIZED)
    patch = _Patch(spec)
    try:
        _build(patch, pod, config, gpu_names)
    except PatchTooLarge:
        warning = f"ccl-health: the patch would be over {MAX_PATCH_BYTES} bytes: unchanged"
        return Review(response_for(uid, warnings=[warning]), OVERSIZED)
    warnings = _bounded_warnings(patch.warnings)
    if not patch.ops:
        return Review(response_for(uid, warnings=warnings), UNCHANGED, withheld=tuple(patch.withheld))
    return Review(
        response_for(uid, patch.ops, warnings), MUTATED, tuple(patch.changes), tuple(patch.ops), tuple(patch.withheld)
    )


def _build(patch: _Patch, pod: Mapping[str, Any], config: WebhookConfig, gpu_names: Sequence[str]) -> None:
    """Every operation, in an order that keeps each path valid: edits inside containers before
    the pre-flight is inserted at index 0 of the init containers."""
    spec = patch.spec
    debug = _HostFolder.of(spec, NCCL_DEBUG_VOLUME, config.nccl_debug_file_host_path)
    for index, container in listed(spec, "containers"):
        edit = _ContainerEdit(f"/spec/containers/{index}", container)
        if requests_gpu(container, gpu_names):
            _plan_nccl(patch, edit, config, debug)
        _plan_identity(patch, edit, debug)
        edit.emit(patch)
    for index, container in listed(spec, "initContainers"):
        edit = _ContainerEdit(f"/spec/initContainers/{index}", container)
        _plan_identity(patch, edit, debug)
        edit.emit(patch)
    metadata = mapping(pod, "metadata")
    annotations = mapping(metadata, "annotations")
    if annotated(annotations, READINESS_GATE_ANNOTATION):
        _add_readiness_gate(patch)
    if annotated(annotations, PREFLIGHT_ANNOTATION):
        _add_preflight(patch, metadata, gpu_names, config)
    patch.append("/spec/volumes", patch.volumes, is_list(spec, "volumes"))
    if patch.ops:
        _annotate(patch, pod, metadata)


@dataclass(frozen=True)
class _HostFolder:
    """A hostPath volume the webhook adds, and whether the pod has it (``volume_state``)."""

    volume: dict[str, Any]
    state: str

    @classmethod
    def of(cls, spec: Mapping[str, Any], name: str, host_path: str) -> _HostFolder | None:
        """The folder (``None`` when not configured), its state read once per review."""
        if not host_path:
            return None
        volume = {"name": name, "hostPath": {"path": host_path, "type": "DirectoryOrCreate"}}
        return cls(volume, volume_state(spec, volume))


def _debug_mount() -> dict[str, Any]:
    return {"name": NCCL_DEBUG_VOLUME, "mountPath": NCCL_DEBUG_MOUNT, "subPathExpr": DEBUG_FOLDER_EXPR}


@dataclass
class _ContainerEdit:
    """What one container gets: entries replaced, entries appended to ``env``, a volume mount."""

    path: str
    container: Mapping[str, Any]
    replace: dict[int, dict[str, Any]] = field(default_factory=dict)
    env: list[dict[str, Any]] = field(default_factory=list)
    mount: dict[str, Any] | None = None

    def mounts_debug_folder(self) -> bool:
        """The container mounts (or will) the debug volume, in whatever way."""
        mounts = dicts(self.container.get("volumeMounts"))
        return self.mount is not None or any(m.get("name") == NCCL_DEBUG_VOLUME for m in mounts)

    def emit(self, patch: _Patch) -> None:
        for index, entry in self.replace.items():
            patch.add({"op": "replace", "path": f"{self.path}/env/{index}", "value": entry})
        patch.append(f"{self.path}/env", self.env, is_list(self.container, "env"))
        if self.mount is not None:
            patch.append(f"{self.path}/volumeMounts", [self.mount], is_list(self.container, "volumeMounts"))


def _plan_nccl(patch: _Patch, edit: _ContainerEdit, config: WebhookConfig, debug: _HostFolder | None) -> None:
    container = edit.container
    index = int(edit.path.rpartition("/")[2])
    name = shown_name(container, index)
    names = env_names(container)
    if "NCCL_DEBUG" in names:
        level = (last_literal_env(container, "NCCL_DEBUG") or "").strip().upper()
        if level and level not in ("INFO", "TRACE"):
            patch.withhold(
                NCCL_ENV,
                OWN_NCCL_DEBUG,
                f"container {name} sets NCCL_DEBUG={level[:16]}: its NCCL transport cannot be judged from the "
                "log (INFO is needed)",
            )
        return
    if container.get("envFrom"):
        patch.withhold(
            NCCL_ENV,
            ENV_FROM,
            f"container {name} takes variables from envFrom, which may set NCCL_DEBUG: left unchanged "
            "(set NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=INIT,NET there)",
        )
        return
    edit.env.append({"name": "NCCL_DEBUG", "value": "INFO"})
    if "NCCL_DEBUG_SUBSYS" not in names:
        edit.env.append({"name": "NCCL_DEBUG_SUBSYS", "value": config.nccl_debug_subsys})
    patch.note(NCCL_ENV)
    if debug is None or "NCCL_DEBUG_FILE" in names:
        return
    if debug.state == TAKEN:
        patch.withhold(
            NCCL_DEBUG_FILE,
            VOLUME_NAME_TAKEN,
            f"the pod has or mounts a volume named {NCCL_DEBUG_VOLUME} of its own: NCCL's log stays on stdout",
        )
        return
    mounts = dicts(container.get("volumeMounts"))
    ours = [m for m in mounts if m == _debug_mount()]
    clash = [m for m in mounts if m not in ours and (same_path(m.get("mountPath"), NCCL_DEBUG_MOUNT)
                                                     or m.get("name") == NCCL_DEBUG_VOLUME)]  # fmt: skip
    if clash:
        patch.withhold(
            NCCL_DEBUG_FILE,
            MOUNT_PATH_TAKEN,
            f"container {name} mounts a volume of its own at {NCCL_DEBUG_MOUNT}: its NCCL log stays on stdout",
        )
        return
    edit.env.append({"name": "NCCL_DEBUG_FILE", "value": f"{NCCL_DEBUG_MOUNT}/nccl.%h.%p.log"})
    if not ours:
        edit.mount = _debug_mount()
    patch.add_volume(debug)
    patch.note(NCCL_DEBUG_FILE)


def _identity_entry(name: str, field_path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


def _is_identity_entry(entry: Mapping[str, Any], field_path: str) -> bool:
    """The entry takes ``field_path`` from the downward API and nothing else (the API server adds
    ``apiVersion: v1`` to a fieldRef it stores)."""
    value_from = entry.get("valueFrom")
    if set(entry) != {"name", "valueFrom"} or not isinstance(value_from, dict) or set(value_from) != {"fieldRef"}:
        return False
    ref = value_from["fieldRef"]
    return isinstance(ref, dict) and ref in ({"fieldPath": field_path}, {"apiVersion": "v1", "fieldPath": field_path})


def _plan_identity(patch: _Patch, edit: _ContainerEdit, debug: _HostFolder | None) -> None:
    """In a container that mounts the per-pod debug folder, every definition of ``CCL_POD_*``
    becomes the downward API one: replaced where the pod defined it (its position kept, so an
    entry after it that refers to it with ``$(...)`` sees the real value), appended where it did
    not (``env`` takes precedence over ``envFrom``, so a ConfigMap cannot set them either)."""
    if debug is None or debug.state == TAKEN or not edit.mounts_debug_folder():
        return
    entries = edit.container.get("env")
    for env_name, field_path in POD_IDENTITY_ENV:
        defined = False
        for index, entry in enumerate(entries if isinstance(entries, list) else ()):
            if isinstance(entry, dict) and entry.get("name") == env_name:
                defined = True
                if not _is_identity_entry(entry, field_path):
                    edit.replace[index] = _identity_entry(env_name, field_path)
                    patch.note(POD_IDENTITY)
        if not defined:
            edit.env.append(_identity_entry(env_name, field_path))


def _add_readiness_gate(patch: _Patch) -> None:
    gates = dicts(patch.spec.get("readinessGates"))
    if any(g.get("conditionType") == FABRIC_READY_CONDITION for g in gates):
        return
    patch.append(
        "/spec/readinessGates", [{"conditionType": FABRIC_READY_CONDITION}], is_list(patch.spec, "readinessGates")
    )
    patch.note(READINESS_GATE)


def asks_non_root(spec: Mapping[str, Any]) -> bool:
    """Every app and init container of the pod sets ``runAsNonRoot: true`` itself (what Pod Security
    ``restricted`` asks of each container when the pod does not), and the pod does not run as root.
    Then the pre-flight sets it too; otherwise it inherits the pod's, and never gets a setting that
    the kubelet would refuse to start under the pod's ``runAsUser: 0``."""
    pod_context = mapping(spec, "securityContext")
    if pod_context.get("runAsNonRoot") is True or pod_context.get("runAsUser") == 0:
        return False
    found = [c for key in ("containers", "initContainers") for c in dicts(spec.get(key))]
    return bool(found) and all(mapping(c, "securityContext").get("runAsNonRoot") is True for c in found)


def preflight_container(
    metadata: Mapping[str, Any], like: Mapping[str, Any], config: WebhookConfig, spec: Mapping[str, Any]
) -> dict[str, Any]:
    """The pre-flight init container: the configured image and arguments, the pod's identity (for
    a result file), the NCCL settings and the resources of ``like`` (the kubelet hands an init
    container's devices on to the app containers, so it sees exactly the devices the job will use;
    no larger than one app container, it adds nothing to the pod's request). Its result reaches
    the exporter as its termination message; a result file on a hostPath only with
    ``probe_results_host_path``. It runs with no capability and no privilege escalation, under
    the RuntimeDefault seccomp profile, and non-root where every container of the pod asks for it
    (``asks_non_root``): what Pod Security ``restricted`` asks of it wherever the pod passes."""
    labels = mapping(metadata, "labels")
    annotations = mapping(metadata, "annotations")
    owners = dicts(metadata.get("ownerReferences"))
    job_name, _ = attribute_job(
        {str(k): str(v) for k, v in labels.items()}, owners, {str(k): str(v) for k, v in annotations.items()}
    )
    # The pod's identity from the downward API: the pre-flight names its result file by the pod's
    # UID, and the exporter uses a result only with that UID (exporter/results/probe_file.py).
    env: list[dict[str, Any]] = [
        {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}} for name, field_path in POD_IDENTITY_ENV
    ]
    env += [
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "JOB_NAME", "value": job_name},
    ]
    env += [e for e in dicts(like.get("env")) if str(e.get("name", "")).startswith("NCCL_")]
    args = list(config.preflight_args)
    security: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if asks_non_root(spec):
        security["runAsNonRoot"] = True
    container: dict[str, Any] = {
        "name": PREFLIGHT_CONTAINER,
        "image": config.preflight_image,
        "imagePullPolicy": "IfNotPresent",
        "args": args,
        "env": env,
        "securityContext": security,
        # The result reaches the node's exporter as this file's content (exporter/results/preflight_message.py).
        "terminationMessagePath": DEFAULT_TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "File",
    }
    if isinstance(like.get("resources"), dict):
        container["resources"] = like["resources"]
    if config.probe_results_host_path:
        container["volumeMounts"] = [{"name": PROBE_RESULTS_VOLUME, "mountPath": DEFAULT_PROBE_RESULTS}]
    elif "--no-write" not in args:
        args.append("--no-write")
    return container


def _add_preflight(patch: _Patch, metadata: Mapping[str, Any], gpu_names: Sequence[str], config: WebhookConfig) -> None:
    """The pre-flight, first among the init containers. An init container named ``ccl-preflight``
    is taken to be it (added by hand, or by an earlier call); any other container of that name
    (containers, init, app and ephemeral, share one namespace of names) withholds it."""
    spec = patch.spec
    if any(c.get("name") == PREFLIGHT_CONTAINER for c in dicts(spec.get("initContainers"))):
        return
    if any(c.get("name") == PREFLIGHT_CONTAINER for key in ("containers", "ephemeralContainers")
           for c in dicts(spec.get(key))):  # fmt: skip
        patch.withhold(
            PREFLIGHT,
            CONTAINER_NAME_TAKEN,
            f"the pod has a container named {PREFLIGHT_CONTAINER} of its own: no pre-flight added",
        )
        return
    results = _HostFolder.of(spec, PROBE_RESULTS_VOLUME, config.probe_results_host_path)
    if results is not None:
        if results.state == TAKEN:
            patch.withhold(
                PREFLIGHT,
                VOLUME_NAME_TAKEN,
                f"the pod has or mounts a volume named {PROBE_RESULTS_VOLUME} of its own: no pre-flight added",
            )
            return
        patch.add_volume(results)
    container = preflight_container(metadata, largest_gpu_container(spec, gpu_names), config, spec)
    if is_list(spec, "initContainers"):
        # First among the init containers: nothing else starts on a fabric that failed its check.
        patch.add({"op": "add", "path": "/spec/initContainers/0", "value": container})
    else:
        patch.add({"op": "add", "path": "/spec/initContainers", "value": [container]})
    patch.note(PREFLIGHT)


def _annotate(patch: _Patch, pod: Mapping[str, Any], metadata: Mapping[str, Any]) -> None:
    """``ccl-health.io/injected``: what this call added, after what an earlier call had (a
    reinvocation adds to it, never forgets)."""
    earlier = mapping(metadata, "annotations").get(INJECTED_ANNOTATION)
    known = [c for c in earlier.split(",") if c in CHANGES] if isinstance(earlier, str) else []
    value = ",".join(dict.fromkeys([*known, *patch.changes]))
    if not isinstance(pod.get("metadata"), dict):
        patch.add({"op": "add", "path": "/metadata", "value": {"annotations": {INJECTED_ANNOTATION: value}}})
    elif not isinstance(metadata.get("annotations"), dict):
        patch.add({"op": "add", "path": "/metadata/annotations", "value": {INJECTED_ANNOTATION: value}})
    else:
        path = "/metadata/annotations/" + escape_pointer(INJECTED_ANNOTATION)
        patch.add({"op": "add", "path": path, "value": value})


def _bounded_warnings(warnings: list[str]) -> list[str]:
    if len(warnings) <= MAX_WARNINGS:
        return warnings
    return [*warnings[: MAX_WARNINGS - 1], f"ccl-health: {len(warnings) - MAX_WARNINGS + 1} more warnings"]

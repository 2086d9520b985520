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
  when annotated ``ccl-health.io/preflight: "true"``;
* the annotation ``ccl-health.io/injected`` naming what was added.

Everything else (another kind, another operation, a CPU-only pod, a pod that already has all of
it) is allowed without a patch. A document that is not an AdmissionReview v1 request raises
``MalformedReview`` (HTTP 400 with its one-line reason). Which namespaces are asked at all is
the ``namespaceSelector`` of the MutatingWebhookConfiguration (``ccl-health.io/inject:
enabled``): the request carries no namespace labels.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from exporter.flags import DEFAULT_PROBE_RESULTS
from exporter.sources.kube import FABRIC_READY_CONDITION, attribute_job

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"
GPU_RESOURCE = "nvidia.com/gpu"
INJECT_NAMESPACE_LABEL = "ccl-health.io/inject"
READINESS_GATE_ANNOTATION = "ccl-health.io/readiness-gate"
PREFLIGHT_ANNOTATION = "ccl-health.io/preflight"
INJECTED_ANNOTATION = "ccl-health.io/injected"
PREFLIGHT_CONTAINER = "ccl-preflight"
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
MALFORMED = "malformed"  # not an AdmissionReview v1 request: HTTP 400
ERROR = "error"  # the webhook failed on this pod: allowed without a patch (fail-safe)
DECISIONS = (MUTATED, UNCHANGED, NO_GPU, SKIPPED, MALFORMED, ERROR)
# What a patch adds; each is a value of ccl_webhook_mutations_total{change}.
CHANGES = ("nccl_env", "nccl_debug_file", "readiness_gate", "preflight")
MAX_WARNINGS = 8  # admission warnings shown by kubectl; a pod with many containers gets a summary

_QUANTITY = re.compile(r"^\s*\+?(\d+(?:\.\d*)?|\.\d+)")


class MalformedReview(ValueError):
    """The request is not an AdmissionReview v1 request; the message is one line."""


@dataclass(frozen=True)
class WebhookConfig:
    """What the webhook adds, from the ``ccl-exporter webhook`` flags."""

    gpu_resources: tuple[str, ...] = (GPU_RESOURCE,)
    nccl_debug_subsys: str = "INIT,NET"
    # A host folder for NCCL_DEBUG_FILE (a per-pod folder below it); "" keeps NCCL's output on stdout.
    nccl_debug_file_host_path: str = ""
    preflight_image: str = "ccl-health-exporter:0.1.0"
    preflight_args: tuple[str, ...] = ("preflight",)
    # The host folder the pre-flight result goes to (the exporter reads it); "" = no result file.
    probe_results_host_path: str = DEFAULT_PROBE_RESULTS


@dataclass(frozen=True)
class Review:
    """The response to send (an AdmissionReview), what was decided and what the patch adds."""

    response: dict[str, Any]
    decision: str
    changes: tuple[str, ...] = ()
    patch: tuple[dict[str, Any], ...] = ()


@dataclass
class _Patch:
    """JSONPatch operations for one pod, and what they add."""

    spec: Mapping[str, Any]
    ops: list[dict[str, Any]] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    volumes: list[dict[str, Any]] = field(default_factory=list)

    def append(self, path: str, items: Sequence[Any], present: bool) -> None:
        """Add ``items`` to the array at ``path``: create it when absent, else append each."""
        if not items:
            return
        if present:
            self.ops.extend({"op": "add", "path": f"{path}/-", "value": item} for item in items)
        else:
            self.ops.append({"op": "add", "path": path, "value": list(items)})

    def note(self, change: str) -> None:
        if change not in self.changes:
            self.changes.append(change)

    def add_volume(self, volume: dict[str, Any]) -> None:
        existing = {v.get("name") for v in _dicts(self.spec.get("volumes"))}
        if volume["name"] not in existing and all(v["name"] != volume["name"] for v in self.volumes):
            self.volumes.append(volume)


def escape_pointer(token: str) -> str:
    """One JSON Pointer reference token (RFC 6901): ``~`` is ``~0``, ``/`` is ``~1``."""
    return token.replace("~", "~0").replace("/", "~1")


def parse_review(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object; ``MalformedReview`` otherwise."""
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedReview(f"body is not JSON: {str(exc).splitlines()[0][:120]}") from None
    if not isinstance(document, dict):
        raise MalformedReview("body is not a JSON object")
    return document


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
    gpu_containers = [i for i, c in enumerate(_dicts(spec["containers"])) if requests_gpu(c, gpu_names)]
    uses_gpu = gpu_containers or any(requests_gpu(c, gpu_names) for c in _dicts(spec.get("initContainers")))
    if not uses_gpu:
        return Review(response_for(uid), NO_GPU)
    patch = _Patch(spec)
    for index in gpu_containers:
        _add_nccl_env(patch, index, spec["containers"][index], config)
    metadata = _mapping(pod, "metadata")
    annotations = _mapping(metadata, "annotations")
    if _annotated(annotations, READINESS_GATE_ANNOTATION):
        _add_readiness_gate(patch)
    if _annotated(annotations, PREFLIGHT_ANNOTATION):
        _add_preflight(patch, metadata, gpu_names, config)
    patch.append("/spec/volumes", patch.volumes, _is_list(spec, "volumes"))
    warnings = _bounded_warnings(patch.warnings)
    if not patch.ops:
        return Review(response_for(uid, warnings=warnings), UNCHANGED)
    _annotate(patch, pod, metadata)
    return Review(response_for(uid, patch.ops, warnings), MUTATED, tuple(patch.changes), tuple(patch.ops))


def requests_gpu(container: Mapping[str, Any], gpu_names: Sequence[str]) -> bool:
    """True when the container's requests or limits hold a non-zero quantity of a GPU resource."""
    resources = container.get("resources")
    if not isinstance(resources, dict):
        return False
    for section in ("limits", "requests"):
        values = resources.get(section)
        if isinstance(values, dict) and any(_positive(values.get(name)) for name in gpu_names):
            return True
    return False


def _positive(quantity: object) -> bool:
    """A Kubernetes quantity above zero (``1``, ``"8"``, ``"1k"``); absent, zero or garbage is not."""
    return _amount(quantity) > 0


def _amount(quantity: object) -> float:
    """The number a quantity starts with (its suffix ignored: only compared with zero and each
    other); 0 when absent or garbage."""
    if isinstance(quantity, bool) or quantity is None:
        return 0.0
    match = _QUANTITY.match(str(quantity))
    return float(match.group(1)) if match else 0.0


def _mapping(owner: Mapping[str, Any], key: str) -> dict[str, Any]:
    """The object at ``key``; empty when absent or not an object."""
    found = owner.get(key)
    return found if isinstance(found, dict) else {}


def _dicts(items: object) -> list[dict[str, Any]]:
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


def _is_list(owner: Mapping[str, Any], key: str) -> bool:
    """The array at ``key`` exists (append to it) rather than being absent or null (create it)."""
    return isinstance(owner.get(key), list)


def _annotated(annotations: Mapping[str, Any], key: str) -> bool:
    return str(annotations.get(key, "")).strip().lower() == "true"


def _env_names(container: Mapping[str, Any]) -> set[str]:
    return {str(e.get("name")) for e in _dicts(container.get("env"))}


def _literal_env(container: Mapping[str, Any], name: str) -> str | None:
    for entry in _dicts(container.get("env")):
        if entry.get("name") == name and isinstance(entry.get("value"), str):
            return str(entry["value"])
    return None


def _add_nccl_env(patch: _Patch, index: int, container: Mapping[str, Any], config: WebhookConfig) -> None:
    name = container.get("name", f"#{index}")
    names = _env_names(container)
    if "NCCL_DEBUG" in names:
        level = (_literal_env(container, "NCCL_DEBUG") or "").upper()
        if level and level not in ("INFO", "TRACE"):
            patch.warnings.append(
                f"ccl-health: container {name} sets NCCL_DEBUG={level}: its NCCL transport cannot be "
                "judged from the log (INFO is needed)"
            )
        return
    if container.get("envFrom"):
        patch.warnings.append(
            f"ccl-health: container {name} takes variables from envFrom, which may set NCCL_DEBUG: "
            "left unchanged (set NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=INIT,NET there)"
        )
        return
    additions: list[dict[str, Any]] = [{"name": "NCCL_DEBUG", "value": "INFO"}]
    if "NCCL_DEBUG_SUBSYS" not in names:
        additions.append({"name": "NCCL_DEBUG_SUBSYS", "value": config.nccl_debug_subsys})
    patch.note("nccl_env")
    mount: dict[str, Any] | None = None
    if config.nccl_debug_file_host_path and "NCCL_DEBUG_FILE" not in names:
        additions += [
            {"name": env, "valueFrom": {"fieldRef": {"fieldPath": path}}}
            for env, path in POD_IDENTITY_ENV
            if env not in names
        ]
        additions.append({"name": "NCCL_DEBUG_FILE", "value": f"{NCCL_DEBUG_MOUNT}/nccl.%h.%p.log"})
        if all(m.get("name") != NCCL_DEBUG_VOLUME for m in _dicts(container.get("volumeMounts"))):
            mount = {"name": NCCL_DEBUG_VOLUME, "mountPath": NCCL_DEBUG_MOUNT, "subPathExpr": DEBUG_FOLDER_EXPR}
        patch.add_volume(
            {
                "name": NCCL_DEBUG_VOLUME,
                "hostPath": {"path": config.nccl_debug_file_host_path, "type": "DirectoryOrCreate"},
            }
        )
        patch.note("nccl_debug_file")
    patch.append(f"/spec/containers/{index}/env", additions, _is_list(container, "env"))
    if mount is not None:
        patch.append(f"/spec/containers/{index}/volumeMounts", [mount], _is_list(container, "volumeMounts"))


def _add_readiness_gate(patch: _Patch) -> None:
    gates = _dicts(patch.spec.get("readinessGates"))
    if any(g.get("conditionType") == FABRIC_READY_CONDITION for g in gates):
        return
    patch.append(
        "/spec/readinessGates", [{"conditionType": FABRIC_READY_CONDITION}], _is_list(patch.spec, "readinessGates")
    )
    patch.note("readiness_gate")


def _largest_gpu_container(spec: Mapping[str, Any], gpu_names: Sequence[str]) -> Mapping[str, Any]:
    """The GPU container with the most GPUs: the pre-flight takes its resources and NCCL settings."""

    def gpus(container: Mapping[str, Any]) -> float:
        resources = _mapping(container, "resources")
        best = 0.0
        for section in ("limits", "requests"):
            values = _mapping(resources, section)
            best = max([best, *(_amount(values.get(name)) for name in gpu_names)])
        return best

    candidates = [c for c in _dicts(spec.get("containers")) if requests_gpu(c, gpu_names)]
    candidates += [c for c in _dicts(spec.get("initContainers")) if requests_gpu(c, gpu_names)]
    return max(candidates, key=gpus)


def preflight_container(metadata: Mapping[str, Any], like: Mapping[str, Any], config: WebhookConfig) -> dict[str, Any]:
    """The pre-flight init container: the configured image and arguments, the pod's identity (for
    the result file the exporter reads), the NCCL settings and the resources of ``like`` (the
    kubelet hands an init container's devices on to the app containers, so it sees exactly the
    devices the job will use; no larger than one app container, it adds nothing to the pod's
    request)."""
    labels = _mapping(metadata, "labels")
    annotations = _mapping(metadata, "annotations")
    owners = _dicts(metadata.get("ownerReferences"))
    job_name, _ = attribute_job(
        {str(k): str(v) for k, v in labels.items()}, owners, {str(k): str(v) for k, v in annotations.items()}
    )
    env: list[dict[str, Any]] = [
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "JOB_NAME", "value": job_name},
    ]
    env += [e for e in _dicts(like.get("env")) if str(e.get("name", "")).startswith("NCCL_")]
    args = list(config.preflight_args)
    container: dict[str, Any] = {
        "name": PREFLIGHT_CONTAINER,
        "image": config.preflight_image,
        "imagePullPolicy": "IfNotPresent",
        "args": args,
        "env": env,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    if isinstance(like.get("resources"), dict):
        container["resources"] = like["resources"]
    if config.probe_results_host_path:
        container["volumeMounts"] = [{"name": PROBE_RESULTS_VOLUME, "mountPath": DEFAULT_PROBE_RESULTS}]
    elif "--no-write" not in args:
        args.append("--no-write")
    return container


def _add_preflight(patch: _Patch, metadata: Mapping[str, Any], gpu_names: Sequence[str], config: WebhookConfig) -> None:
    init = _dicts(patch.spec.get("initContainers"))
    if any(c.get("name") == PREFLIGHT_CONTAINER for c in init):
        return
    container = preflight_container(metadata, _largest_gpu_container(patch.spec, gpu_names), config)
    if _is_list(patch.spec, "initContainers"):
        # First among the init containers: nothing else starts on a fabric that failed its check.
        patch.ops.append({"op": "add", "path": "/spec/initContainers/0", "value": container})
    else:
        patch.ops.append({"op": "add", "path": "/spec/initContainers", "value": [container]})
    if config.probe_results_host_path:
        patch.add_volume(
            {
                "name": PROBE_RESULTS_VOLUME,
                "hostPath": {"path": config.probe_results_host_path, "type": "DirectoryOrCreate"},
            }
        )
    patch.note("preflight")


def _annotate(patch: _Patch, pod: Mapping[str, Any], metadata: Mapping[str, Any]) -> None:
    value = ",".join(patch.changes)
    if not isinstance(pod.get("metadata"), dict):
        patch.ops.append({"op": "add", "path": "/metadata", "value": {"annotations": {INJECTED_ANNOTATION: value}}})
    elif not isinstance(metadata.get("annotations"), dict):
        patch.ops.append({"op": "add", "path": "/metadata/annotations", "value": {INJECTED_ANNOTATION: value}})
    else:
        path = "/metadata/annotations/" + escape_pointer(INJECTED_ANNOTATION)
        patch.ops.append({"op": "add", "path": path, "value": value})


def _bounded_warnings(warnings: list[str]) -> list[str]:
    if len(warnings) <= MAX_WARNINGS:
        return warnings
    return [
        *warnings[: MAX_WARNINGS - 1],
        f"ccl-health: {len(warnings) - MAX_WARNINGS + 1} more containers not changed",
    ]

"""A Pod checked as the API server checks it before storing it: the strict JSON schema of the Pod
(kubernetes-validate, no unknown fields) and the rules of Kubernetes' Pod validation
(pkg/apis/core/validation) that a schema cannot state, written from their documented behaviour:

* container names are DNS-1123 labels, unique across ``containers``, ``initContainers`` and
  ``ephemeralContainers`` (one namespace of names);
* volume names are DNS-1123 labels and unique; every ``volumeMount`` names a volume of the pod;
* within one container, every ``mountPath`` is unique; ``subPath`` and ``subPathExpr`` exclude each
  other and are relative paths without ``..``;
* env names are C identifiers extended with ``-`` and ``.`` (``[-._a-zA-Z][-._a-zA-Z0-9]*``, the
  rule up to 1.33); an entry has ``value`` or ``valueFrom``, not both, and ``valueFrom`` has one
  source; a ``fieldRef`` names a field the downward API serves, with ``apiVersion`` ``v1`` if any.

``effective_env`` is what the kubelet hands the process (and expands ``subPathExpr`` with): the
``envFrom`` sources first, then each ``env`` entry in order, a later one replacing an earlier one.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping
from typing import Any

import jsonschema
import kubernetes_validate
from kubernetes_validate.utils import schema_contents
from referencing import Registry, Resource

KUBERNETES_VERSION = "1.30.0"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
FIELD_PATHS = re.compile(
    r"^(metadata\.(name|namespace|uid)|metadata\.(labels|annotations)\['[^']+'\]|"
    r"spec\.(nodeName|serviceAccountName)|status\.(hostIP|hostIPs|podIP|podIPs))$"
)
CONTAINER_KINDS = ("containers", "initContainers", "ephemeralContainers")


class PodInvalid(AssertionError):
    pass


@functools.cache
def _pod_schema() -> jsonschema.protocols.Validator:
    """kubernetes-validate's strict Pod schema, loaded once (``kubernetes_validate.validate``
    reads it again on every call)."""
    minor = ".".join(KUBERNETES_VERSION.split(".")[:2])
    folder = f"kubernetes-json-schema/v{minor}.0-local-strict"
    schema = schema_contents(f"{folder}/pod-v1.json", KUBERNETES_VERSION)
    definitions = schema_contents(f"{folder}/_definitions.json", KUBERNETES_VERSION)
    registry: Registry[Any] = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


def check_schema(pod: Mapping[str, Any]) -> None:
    errors = sorted(_pod_schema().iter_errors(pod), key=lambda e: list(e.absolute_path))
    if errors:
        raise PodInvalid(f"{list(errors[0].absolute_path)}: {errors[0].message}")


def containers_of(pod: Mapping[str, Any]) -> Iterator[tuple[str, int, dict[str, Any]]]:
    spec = pod.get("spec", {})
    for kind in CONTAINER_KINDS:
        for index, container in enumerate(spec.get(kind) or ()):
            yield kind, index, container


def check_api_rules(pod: Mapping[str, Any]) -> None:
    spec = pod["spec"]
    names = [c.get("name") for _, _, c in containers_of(pod)]
    for name in names:
        if not isinstance(name, str) or len(name) > 63 or not DNS_LABEL.match(name):
            raise PodInvalid(f"container name {name!r} is not a DNS-1123 label")
    if len(set(names)) != len(names):
        raise PodInvalid(f"container names are not unique: {names}")
    volumes = [v["name"] for v in spec.get("volumes") or ()]
    for name in volumes:
        if len(name) > 63 or not DNS_LABEL.match(name):
            raise PodInvalid(f"volume name {name!r} is not a DNS-1123 label")
    if len(set(volumes)) != len(volumes):
        raise PodInvalid(f"volume names are not unique: {volumes}")
    for kind, index, container in containers_of(pod):
        where = f"{kind}[{index}]"
        paths = [m["mountPath"] for m in container.get("volumeMounts") or ()]
        if len(set(paths)) != len(paths):
            raise PodInvalid(f"{where}: mountPaths are not unique: {paths}")
        for mount in container.get("volumeMounts") or ():
            if mount["name"] not in volumes:
                raise PodInvalid(f"{where}: volumeMount {mount['name']!r} names no volume of the pod")
            if not mount["mountPath"]:
                raise PodInvalid(f"{where}: empty mountPath")
            if mount.get("subPath") and mount.get("subPathExpr"):
                raise PodInvalid(f"{where}: subPath and subPathExpr together")
            for sub in (mount.get("subPath"), mount.get("subPathExpr")):
                if sub and (sub.startswith("/") or ".." in sub.split("/")):
                    raise PodInvalid(f"{where}: subPath {sub!r} is not a relative descending path")
        for entry in container.get("env") or ():
            _check_env_entry(where, entry)


def _check_env_entry(where: str, entry: Mapping[str, Any]) -> None:
    name = entry["name"]
    if not ENV_NAME.match(name):
        raise PodInvalid(f"{where}: env name {name!r} is not valid")
    value_from = entry.get("valueFrom")
    if value_from is None:
        return
    if entry.get("value"):
        raise PodInvalid(f"{where}: env {name} has value and valueFrom")
    if len(value_from) != 1:
        raise PodInvalid(f"{where}: env {name}: valueFrom needs exactly one source: {value_from}")
    ref = value_from.get("fieldRef")
    if ref is not None:
        if ref.get("apiVersion", "v1") != "v1" or not FIELD_PATHS.match(ref["fieldPath"]):
            raise PodInvalid(f"{where}: env {name}: fieldRef {ref} is not served by the downward API")


def check_pod(pod: Mapping[str, Any]) -> None:
    """Raise ``PodInvalid`` unless the API server would accept the pod."""
    check_schema(pod)
    check_api_rules(pod)


def validate_with_the_library(pod: Mapping[str, Any]) -> None:
    """The same schema through kubernetes-validate's own entry point (slower: it reloads it)."""
    kubernetes_validate.validate(dict(pod), KUBERNETES_VERSION, strict=True)


def effective_env(container: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each ``env`` variable's definition in effect: the last entry of its name (an ``env`` entry
    also overrides whatever ``envFrom`` sets under that name)."""
    found: dict[str, dict[str, Any]] = {}
    for entry in container.get("env") or ():
        found[entry["name"]] = entry
    return found

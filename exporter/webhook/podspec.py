"""Reading a pod as an admission request carries it: before the API server validated it, so no
field is trusted to have its type (a container that is not an object, a name that is not a
string, a quantity that is a list) and nothing read here raises.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping, Sequence
from typing import Any

MAX_SHOWN_NAME = 63  # a name in a warning is cut to this (a valid container name is never longer)

_QUANTITY = re.compile(r"^\s*\+?(\d+(?:\.\d*)?|\.\d+)")


def requests_gpu(container: Mapping[str, Any], gpu_names: Sequence[str]) -> bool:
    """True when the container's requests or limits hold a non-zero quantity of a GPU resource."""
    resources = container.get("resources")
    if not isinstance(resources, dict):
        return False
    for section in ("limits", "requests"):
        values = resources.get(section)
        if isinstance(values, dict) and any(positive_quantity(values.get(name)) for name in gpu_names):
            return True
    return False


def positive_quantity(quantity: object) -> bool:
    """A Kubernetes quantity above zero (``1``, ``"8"``, ``"1k"``); absent, zero or garbage is not."""
    return quantity_amount(quantity) > 0


def quantity_amount(quantity: object) -> float:
    """The number a quantity starts with (its suffix ignored: only compared with zero and each
    other); 0 when absent or garbage."""
    if not isinstance(quantity, (int, float, str)) or isinstance(quantity, bool):
        return 0.0
    match = _QUANTITY.match(str(quantity)[:64])
    return float(match.group(1)) if match else 0.0


def mapping(owner: Mapping[str, Any], key: str) -> dict[str, Any]:
    """The object at ``key``; empty when absent or not an object."""
    found = owner.get(key)
    return found if isinstance(found, dict) else {}


def dicts(items: object) -> list[dict[str, Any]]:
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


def listed(owner: Mapping[str, Any], key: str) -> list[tuple[int, dict[str, Any]]]:
    """(index, object) of the objects in the array at ``key``, indexed as the patch addresses them."""
    items = owner.get(key)
    return [(i, item) for i, item in enumerate(items) if isinstance(item, dict)] if isinstance(items, list) else []


def length(owner: Mapping[str, Any], key: str) -> int:
    items = owner.get(key)
    return len(items) if isinstance(items, list) else 0


def is_list(owner: Mapping[str, Any], key: str) -> bool:
    """The array at ``key`` exists (append to it) rather than being absent or null (create it)."""
    return isinstance(owner.get(key), list)


def annotated(annotations: Mapping[str, Any], key: str) -> bool:
    value = annotations.get(key)
    return isinstance(value, str) and value.strip().lower() == "true"


def shown_name(container: Mapping[str, Any], index: int) -> str:
    """The container's name for a warning: cut to a valid name's length, ``#index`` without one."""
    name = container.get("name")
    if not isinstance(name, str) or not name:
        return f"#{index}"
    return name if len(name) <= MAX_SHOWN_NAME else name[:MAX_SHOWN_NAME] + "..."


def env_names(container: Mapping[str, Any]) -> set[str]:
    return {str(e.get("name")) for e in dicts(container.get("env"))}


def last_literal_env(container: Mapping[str, Any], name: str) -> str | None:
    """The value of the last definition of ``name`` (the one in effect), when it is a literal."""
    found: str | None = None
    for entry in dicts(container.get("env")):
        if entry.get("name") == name:
            value = entry.get("value")
            found = value if isinstance(value, str) else None
    return found


# Whether a volume of our name is in the pod, and whether it is exactly ours.
ABSENT, OURS, TAKEN = "absent", "ours", "taken"
CONTAINER_KINDS = ("containers", "initContainers", "ephemeralContainers")


def volume_state(spec: Mapping[str, Any], volume: Mapping[str, Any]) -> str:
    """``OURS`` (the pod has exactly this volume), ``TAKEN`` (it has another of its name, or a
    container mounts that name without the pod declaring it: adding ours would lend that
    container a host folder to mount as it likes) or ``ABSENT``."""
    name = volume["name"]
    same = [v for v in dicts(spec.get("volumes")) if v.get("name") == name]
    if same:
        return OURS if all(v == volume for v in same) else TAKEN
    for kind in CONTAINER_KINDS:
        for container in dicts(spec.get(kind)):
            if any(m.get("name") == name for m in dicts(container.get("volumeMounts"))):
                return TAKEN
    return ABSENT


def same_path(path: object, other: str) -> bool:
    """The two name one folder in a container (``/a/b/``, ``//a/./b`` and ``/a/b`` do)."""
    return isinstance(path, str) and _normal(path) == _normal(other)


def _normal(path: str) -> str:
    return posixpath.normpath("/" + path.lstrip("/"))


def largest_gpu_container(spec: Mapping[str, Any], gpu_names: Sequence[str]) -> Mapping[str, Any]:
    """The GPU container with the most GPUs: the pre-flight takes its resources and NCCL settings."""

    def gpus(container: Mapping[str, Any]) -> float:
        resources = mapping(container, "resources")
        best = 0.0
        for section in ("limits", "requests"):
            values = mapping(resources, section)
            best = max([best, *(quantity_amount(values.get(name)) for name in gpu_names)])
        return best

    candidates = [c for c in dicts(spec.get("containers")) if requests_gpu(c, gpu_names)]
    candidates += [c for c in dicts(spec.get("initContainers")) if requests_gpu(c, gpu_names)]
    return max(candidates, key=gpus)

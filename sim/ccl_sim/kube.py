"""The simulated node's Kubernetes API for the lifecycle hooks: the writes they make, recorded.

``SimKube`` has the ``CoreV1Api`` methods the hooks call (``patch_namespaced_pod_status``,
``create_namespaced_event``, ``read_node_status``, ``patch_node_status``) and does what the API
server does with them: merges conditions by type, refuses an Event name that exists (409). So
``python -m ccl_sim serve --collector.lifecycle`` runs the real write path, and ``POST
/-/sim/kube-status`` (``status``) shows what a ``kubectl describe`` would: each pod's
``ccl-health.io/fabric-ready``, the Events, the node's ``CclFabricDegraded``. Bounded: at most
``MAX_EVENTS`` Events are kept, the oldest go first.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from typing import Any

SIM_NODE_NAME = "simulated-node"
MAX_EVENTS = 256
STRATEGIC_MERGE = "application/strategic-merge-patch+json"


class SimApiError(Exception):
    """What the client raises for an API error: carries the HTTP ``status``."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"({status}) {reason}")
        self.status = status


def _merge_conditions(conditions: list[dict[str, Any]], body: Any, content_type: str | None) -> None:
    if content_type != STRATEGIC_MERGE:
        raise SimApiError(415, f"the simulated API takes strategic merge patches only, not {content_type}")
    for entry in (body or {}).get("status", {}).get("conditions", []):
        fresh = {k: v for k, v in entry.items() if v is not None}
        for index, existing in enumerate(conditions):
            if existing.get("type") == entry.get("type"):
                conditions[index] = {**existing, **fresh}
                break
        else:
            conditions.append(fresh)


class SimKube:
    """See the module docstring."""

    def __init__(self, node_name: str = SIM_NODE_NAME) -> None:
        self.node_name = node_name
        self._lock = threading.Lock()
        self._pod_conditions: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self._node_conditions: list[dict[str, Any]] = []
        self._events: OrderedDict[tuple[str, str], dict[str, Any]] = OrderedDict()

    # CoreV1Api, as the lifecycle hooks call it
    def patch_namespaced_pod_status(self, name: str, namespace: str, body: Any, **options: Any) -> dict[str, Any]:
        with self._lock:
            conditions = self._pod_conditions.setdefault((namespace, name), [])
            _merge_conditions(conditions, body, options.get("_content_type"))
            return {"metadata": {"name": name, "namespace": namespace}, "status": {"conditions": list(conditions)}}

    def create_namespaced_event(self, namespace: str, body: Any, **options: Any) -> dict[str, Any]:
        key = (namespace, str(body["metadata"]["name"]))
        with self._lock:
            if key in self._events:
                raise SimApiError(409, f"events {key[1]!r} already exists")
            self._events[key] = copy.deepcopy(body)
            while len(self._events) > MAX_EVENTS:
                self._events.popitem(last=False)
        return dict(body)

    def read_node_status(self, name: str, **options: Any) -> dict[str, Any]:
        if name != self.node_name:
            raise SimApiError(404, f"nodes {name!r} not found")
        with self._lock:
            return {"metadata": {"name": name}, "status": {"conditions": copy.deepcopy(self._node_conditions)}}

    def patch_node_status(self, name: str, body: Any, **options: Any) -> dict[str, Any]:
        if name != self.node_name:
            raise SimApiError(404, f"nodes {name!r} not found")
        with self._lock:
            _merge_conditions(self._node_conditions, body, options.get("_content_type"))
        return self.read_node_status(name)

    def status(self) -> dict[str, Any]:
        """What was written: pod conditions by ``namespace/pod``, Events, the node's conditions."""
        with self._lock:
            return {
                "pods": {
                    f"{ns}/{pod}": copy.deepcopy(conds) for (ns, pod), conds in sorted(self._pod_conditions.items())
                },
                "events": [copy.deepcopy(e) for e in self._events.values()],
                "node": {"name": self.node_name, "conditions": copy.deepcopy(self._node_conditions)},
            }

"""The lifecycle hooks' writes to the API server, through a ``CoreV1Api`` (the ``kubernetes``
client's, or a stand-in with the same methods).

Conditions are written with a strategic merge patch of ``status.conditions`` on the ``status``
subresource: the API server merges conditions by ``type``, so the pod's and node's other
conditions (kubelet's ``Ready``, node-problem-detector's) are untouched. The content type is set
explicitly rather than left to the client's choice for a dict body (a JSON merge patch would
replace the whole list). Events are created
with a name derived from what they say: creating one that exists (409) means it was already
written, before a restart too. Every call has a short timeout; a failure raises for the caller
to back off.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from exporter.lifecycle.decisions import NODE_CONDITION, Condition, EventNote
from exporter.sources.kube import FABRIC_READY_CONDITION, PodCondition, find_condition

STRATEGIC_MERGE = "application/strategic-merge-patch+json"
COMPONENT = "ccl-health-exporter"
REQUEST_TIMEOUT = (2.0, 5.0)  # connect, read: a hung API server must not hold the writer long
MAX_NAME_CHARS = 253


class ApiUnavailable(Exception):
    """No API to write to (not in a cluster, no credentials)."""


def condition_body(condition_type: str, condition: Condition, transition: str, now: str, node: bool) -> dict[str, Any]:
    """The strategic merge patch that sets one condition (``lastHeartbeatTime`` on nodes only)."""
    entry: dict[str, Any] = {
        "type": condition_type,
        "status": condition.status,
        "reason": condition.reason,
        "message": condition.message,
        "lastTransitionTime": transition,
    }
    if node:
        entry["lastHeartbeatTime"] = now
    else:
        entry["lastProbeTime"] = None
    return {"status": {"conditions": [entry]}}


def event_name(pod: str, uid: str, note: EventNote) -> str:
    """``<pod>.ccl-<hash of uid, reason, message>``: the same note on the same pod has the same name."""
    digest = hashlib.sha256(f"{uid}\0{note.reason}\0{note.message}".encode()).hexdigest()[:16]
    suffix = f".ccl-{digest}"
    return pod[: MAX_NAME_CHARS - len(suffix)].rstrip(".-") + suffix


def event_body(namespace: str, pod: str, uid: str, note: EventNote, node: str, now: str) -> dict[str, Any]:
    """A core/v1 Warning Event on the pod, as ``kubectl describe pod`` lists them."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": event_name(pod, uid, note), "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod, "namespace": namespace, "uid": uid},
        "reason": note.reason,
        "message": note.message,
        "type": "Warning",
        "source": {"component": COMPONENT, "host": node},
        "reportingComponent": COMPONENT,
        "reportingInstance": node,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


def _status_of(exc: BaseException) -> int | None:
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


@dataclass
class LifecycleApi:
    """See the module docstring. ``api_factory`` is called once, in the writer's thread."""

    api_factory: Callable[[], Any]
    _api: Any = field(default=None, init=False)

    def api(self) -> Any:
        if self._api is None:
            try:
                self._api = self.api_factory()
            except Exception as exc:  # not in a cluster, no token: said by the caller
                raise ApiUnavailable(str(exc)) from exc
        return self._api

    def patch_pod_condition(self, namespace: str, pod: str, condition: Condition, transition: str, now: str) -> None:
        body = condition_body(FABRIC_READY_CONDITION, condition, transition, now, node=False)
        self.api().patch_namespaced_pod_status(
            pod, namespace, body, _content_type=STRATEGIC_MERGE, _request_timeout=REQUEST_TIMEOUT
        )

    def create_pod_event(self, namespace: str, pod: str, uid: str, note: EventNote, node: str, now: str) -> bool:
        """True when created, False when it already existed (409)."""
        body = event_body(namespace, pod, uid, note, node, now)
        try:
            self.api().create_namespaced_event(namespace, body, _request_timeout=REQUEST_TIMEOUT)
        except Exception as exc:
            if _status_of(exc) == 409:
                return False
            raise
        return True

    def read_node_condition(self, node: str) -> PodCondition | None:
        found = self.api().read_node_status(node, _request_timeout=REQUEST_TIMEOUT)
        return find_condition(found, NODE_CONDITION)

    def patch_node_condition(self, node: str, condition: Condition, transition: str, now: str) -> None:
        body = condition_body(NODE_CONDITION, condition, transition, now, node=True)
        self.api().patch_node_status(node, body, _content_type=STRATEGIC_MERGE, _request_timeout=REQUEST_TIMEOUT)

"""Which training job a pod belongs to: labels of the pods on this node, from the API server.

``attribute_job`` is the pure rule (label keys in a fixed order, then the controlling
owner reference). ``KubePodCache`` lists and watches the pods of this node
(``fieldSelector=spec.nodeName=<node>``) in a background thread with the ``kubernetes``
client and keeps a small record per pod. Without API access (not in a cluster, no node
name, API server down) it says so once in the log and answers "unknown": ``job_name`` is
then empty, never guessed.

This cache, and any other pod list a node supplies, implement ``PodMetadataSource``, the one seam the
collectors that label series with jobs depend on; the node's one source is held by
``exporter.resources.NodeResources``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, Protocol, runtime_checkable

from exporter.results.preflight_message import MAX_MESSAGE_BYTES, PREFLIGHT_CONTAINER, PodPreflight, pod_preflight
from exporter.sources.multus import AttachedDevice, attached_devices

log = logging.getLogger(__name__)

KUBEFLOW_JOB_NAME = "training.kubeflow.org/job-name"
KUBEFLOW_OPERATOR = "training.kubeflow.org/operator-name"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
VOLCANO_JOB_NAME = "volcano.sh/job-name"
BATCH_JOB_NAME = "batch.kubernetes.io/job-name"
LEGACY_JOB_NAME = "job-name"
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
POD_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
KUEUE_POD_GROUP = "kueue.x-k8s.io/pod-group-name"
TRAINER_PREFIX = "trainer.kubeflow.org/"
# A pod, or its namespace, that runs on TCP on purpose says so; the pod's own label wins.
EXPECTED_NETWORK_LABEL = "ccl-health.io/expected-network"
# The pod readiness condition the lifecycle hooks write, and the readiness gate that waits for it.
FABRIC_READY_CONDITION = "ccl-health.io/fabric-ready"
MAX_LABEL_VALUE_CHARS = 63  # Kubernetes' own limit for a label value
MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"
# What kubelet sets in every container; the Kubernetes client's in-cluster config reads them.
SERVICE_HOST_ENV = "KUBERNETES_SERVICE_HOST"
SERVICE_PORT_ENV = "KUBERNETES_SERVICE_PORT"

# training.kubeflow.org/operator-name → the job's kind (training-operator, MPI operator v2).
KUBEFLOW_OPERATOR_KINDS = {
    "pytorchjob-controller": "PyTorchJob",
    "tfjob-controller": "TFJob",
    "mpijob-controller": "MPIJob",
    "mpi-operator": "MPIJob",
    "xgboostjob-controller": "XGBoostJob",
    "paddlejob-controller": "PaddleJob",
    "jaxjob-controller": "JAXJob",
    "mxjob-controller": "MXJob",
}


def _owner_fields(owner: Any) -> tuple[str, str, bool]:
    """(kind, name, controller) of an owner reference given as a dict or a client object."""
    if isinstance(owner, Mapping):
        return str(owner.get("kind") or ""), str(owner.get("name") or ""), bool(owner.get("controller"))
    return (
        str(getattr(owner, "kind", "") or ""),
        str(getattr(owner, "name", "") or ""),
        bool(getattr(owner, "controller", False)),
    )


def attribute_job(
    labels: Mapping[str, str] | None,
    owner_references: Iterable[Any] | None = (),
    annotations: Mapping[str, str] | None = None,
) -> tuple[str, str]:
    """(job_name, job_kind) of a pod; ("", "") when nothing says.

    Order: Kubeflow training-operator / MPI operator → JobSet (Kubeflow Trainer v2) →
    LeaderWorkerSet → Volcano → batch Job → pod groups → the controlling ownerReference.
    """
    labels = labels or {}
    annotations = annotations or {}
    owners = [_owner_fields(o) for o in (owner_references or ())]
    controller = next((o for o in owners if o[2]), owners[0] if owners else None)

    name = labels.get(KUBEFLOW_JOB_NAME)
    if name:
        if controller and controller[1] == name and controller[0]:
            return name, controller[0]
        return name, KUBEFLOW_OPERATOR_KINDS.get(labels.get(KUBEFLOW_OPERATOR, ""), "KubeflowJob")
    name = labels.get(JOBSET_NAME)
    if name:
        return name, "TrainJob" if any(k.startswith(TRAINER_PREFIX) for k in labels) else "JobSet"
    name = labels.get(LWS_NAME)
    if name:
        return name, "LeaderWorkerSet"
    name = labels.get(VOLCANO_JOB_NAME)
    if name:
        return name, "VolcanoJob"
    name = labels.get(BATCH_JOB_NAME) or labels.get(LEGACY_JOB_NAME)
    if name:
        return name, "Job"
    name = labels.get(POD_GROUP_LABEL) or annotations.get(POD_GROUP_ANNOTATION) or labels.get(KUEUE_POD_GROUP)
    if name:
        return name, "PodGroup"
    if controller and controller[1]:
        return controller[1], controller[0]
    return "", ""


@dataclass(frozen=True)
class PodCondition:
    """A pod or node condition as the API shows it (times as RFC 3339 text, "" when unset)."""

    status: str  # "True", "False" or "Unknown"
    reason: str = ""
    message: str = ""
    last_transition_time: str = ""


@dataclass(frozen=True)
class PodMetadata:
    namespace: str
    name: str
    uid: str
    job_name: str
    job_kind: str
    expected_network: str = ""  # the pod's ccl-health.io/expected-network label ("" when unset)
    host_network: bool | None = None  # spec.hostNetwork (None when the source does not say)
    # Host devices Multus attached (its network-status annotation): SR-IOV VFs, RDMA NICs
    attached_devices: tuple[AttachedDevice, ...] = ()
    # spec.readinessGates names ccl-health.io/fabric-ready, and that condition in status (None: absent)
    fabric_ready_gate: bool = False
    fabric_ready: PodCondition | None = None
    # status.startTime (Unix seconds, the kubelet's clock on this node; None until the kubelet took the pod)
    start_time: float | None = None
    # The termination message of its ccl-preflight init container (None: none has ended with one)
    preflight: PodPreflight | None = None


def with_namespace_expectation(record: PodMetadata, namespace_labels: Mapping[str, str]) -> PodMetadata:
    """The record with its namespace's expected network when the pod declares none itself."""
    if record.expected_network or record.namespace not in namespace_labels:
        return record
    return replace(record, expected_network=namespace_labels[record.namespace])


@runtime_checkable
class PodMetadataSource(Protocol):
    """Where job attribution comes from: the Kubernetes API, or another pod list the node supplies."""

    def lookup(self, namespace: str, pod: str) -> PodMetadata | None:
        """The pod's record; None when unknown (not listed yet, or no source)."""
        ...

    def is_authoritative(self) -> bool:
        """True when every pod of the node is listed, so an absent pod is gone."""
        ...

    def pods(self) -> list[PodMetadata]:
        """Every pod of the node the source knows (empty when it knows none)."""
        ...


class NoPodMetadata:
    """No attribution at all (the collector's default when nothing else is configured)."""

    def lookup(self, namespace: str, pod: str) -> PodMetadata | None:
        return None

    def is_authoritative(self) -> bool:
        return False

    def pods(self) -> list[PodMetadata]:
        return []


def pod_metadata_from_object(pod: Any) -> PodMetadata | None:
    """A ``V1Pod`` (or the same shape as dicts) → ``PodMetadata``; None if it has no name."""
    meta = pod.get("metadata") if isinstance(pod, Mapping) else getattr(pod, "metadata", None)
    if meta is None:
        return None

    def field(name: str) -> Any:
        return meta.get(name) if isinstance(meta, Mapping) else getattr(meta, name, None)

    namespace, name = _string(field("namespace")), _string(field("name"))
    if not namespace or not name:
        return None
    owners = field("owner_references") if not isinstance(meta, Mapping) else meta.get("ownerReferences")
    labels = _strings(field("labels"))
    annotations = _strings(field("annotations"))
    job_name, job_kind = attribute_job(labels, owners if isinstance(owners, (list, tuple)) else (), annotations)
    spec = pod.get("spec") if isinstance(pod, Mapping) else getattr(pod, "spec", None)
    host_network = None
    if spec is not None:
        raw = spec.get("hostNetwork") if isinstance(spec, Mapping) else getattr(spec, "host_network", None)
        host_network = bool(raw)  # absent means false in the API
    expected = str(labels.get(EXPECTED_NETWORK_LABEL) or "")[:MAX_LABEL_VALUE_CHARS]
    gates = _items(spec, "readinessGates", "readiness_gates")
    gate = any(_field(g, "conditionType", "condition_type") == FABRIC_READY_CONDITION for g in gates)
    condition = find_condition(pod, FABRIC_READY_CONDITION)
    # A static pod's API object is its mirror pod, with a UID of its own; kubelet knows the pod (and
    # names its log folder) by the config hash, which the mirror pod carries in this annotation.
    uid = annotations.get(MIRROR_POD_ANNOTATION) or _string(field("uid"))
    status = _field(pod, "status", "status")
    start_time = None if status is None else _unix_time(_field(status, "startTime", "start_time"))
    message = preflight_message(status)
    preflight = None if message is None else pod_preflight(namespace, name, uid, job_name, message)
    return PodMetadata(
        namespace,
        name,
        uid,
        job_name,
        job_kind,
        expected,
        host_network,
        attached_devices(annotations),
        gate,
        condition,
        start_time,
        preflight,
    )


def preflight_message(status: Any) -> str | None:
    """The termination message of the pod's ``ccl-preflight`` init container: of its current run
    when that has ended, else of the run before (a failed pre-flight waiting to restart); None when
    none has ended with one. Cut to the kubelet's ``MAX_MESSAGE_BYTES``."""
    for entry in _items(status, "initContainerStatuses", "init_container_statuses"):
        if _field(entry, "name", "name") != PREFLIGHT_CONTAINER:
            continue
        for key, attribute in (("state", "state"), ("lastState", "last_state")):
            terminated = _field(_field(entry, key, attribute) or {}, "terminated", "terminated")
            if terminated is not None:
                message = _string(_field(terminated, "message", "message"))
                return message[:MAX_MESSAGE_BYTES] or None
        return None
    return None


def _unix_time(value: Any) -> float | None:
    """An API time (a datetime from the client, RFC 3339 text from JSON) as Unix seconds; None when absent or bad."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    if not isinstance(value, datetime):
        return None
    return (value if value.tzinfo else value.replace(tzinfo=timezone.utc)).timestamp()


def _string(value: Any) -> str:
    """A name or UID as the API gives it; anything but a string (a broken or forged object) is ""."""
    return value if isinstance(value, str) else ""


def _strings(value: Any) -> dict[str, str]:
    """Labels or annotations: the string entries of a mapping (the API allows no others)."""
    if not isinstance(value, Mapping):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


def _field(obj: Any, key: str, attribute: str) -> Any:
    """``obj[key]`` of a dict from JSON, ``obj.attribute`` of a client object; None when absent."""
    return obj.get(key) if isinstance(obj, Mapping) else getattr(obj, attribute, None)


def _items(obj: Any, key: str, attribute: str) -> list[Any]:
    """The list at ``key`` (``attribute``) of ``obj``; empty when ``obj`` or the list is absent."""
    found = None if obj is None else _field(obj, key, attribute)
    return list(found) if isinstance(found, (list, tuple)) else []


def _time_text(value: Any) -> str:
    """An API time as RFC 3339 text: the client gives datetimes, JSON gives strings."""
    if value is None:
        return ""
    if hasattr(value, "strftime"):
        return str(value.strftime("%Y-%m-%dT%H:%M:%SZ"))
    return str(value)


def find_condition(obj: Any, condition_type: str) -> PodCondition | None:
    """The condition of that type in ``status.conditions`` of a pod or node (client object or dict)."""
    status = _field(obj, "status", "status")
    for condition in _items(status, "conditions", "conditions"):
        if _field(condition, "type", "type") == condition_type:
            return condition_from_object(condition)
    return None


def condition_from_object(condition: Any) -> PodCondition:
    """A ``V1PodCondition`` / ``V1NodeCondition`` (or the same as a dict) → ``PodCondition``."""
    return PodCondition(
        status=str(_field(condition, "status", "status") or ""),
        reason=str(_field(condition, "reason", "reason") or ""),
        message=str(_field(condition, "message", "message") or ""),
        last_transition_time=_time_text(_field(condition, "lastTransitionTime", "last_transition_time")),
    )


class NotInCluster(Exception):
    """The process does not run in a Kubernetes pod: no API server to ask."""


def in_cluster_api() -> Any:
    """A ``CoreV1Api`` from the pod's service account; raises when not in a cluster.

    Outside a cluster it says so before loading the Kubernetes client, which is large.
    """
    if SERVICE_HOST_ENV not in os.environ or SERVICE_PORT_ENV not in os.environ:
        raise NotInCluster("Service host/port is not set.")  # the client's own words for it
    from kubernetes import client, config

    config.load_incluster_config()
    return client.CoreV1Api()


class KubePodCache:
    """Pods of this node, listed and watched in a daemon thread; see the module docstring."""

    def __init__(
        self,
        node_name: str,
        api_factory: Callable[[], Any] = in_cluster_api,
        watch_seconds: int = 300,
        max_pods: int = 5000,
        min_cycle_seconds: float = 1.0,
    ) -> None:
        self.node_name = node_name
        self._api_factory = api_factory
        self._watch_seconds = watch_seconds
        self._max_pods = max_pods
        self._min_cycle = min_cycle_seconds
        self._pods: dict[tuple[str, str], PodMetadata] = {}
        self._namespace_expectations: dict[str, str] = {}  # namespace -> its expected-network label
        self._namespaces_readable = True
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._synced = False
        self._thread: threading.Thread | None = None
        self.status = "not started"

    def start(self) -> None:
        """Start the list/watch thread (once; later calls do nothing)."""
        if self._thread is not None or self.status != "not started":
            return
        if not self.node_name:
            self.status = "no node name"
            log.info(
                "no node name (--kube.node-name / NODE_NAME): pods are not attributed to jobs; "
                "job_name and job_kind stay empty"
            )
            return
        self._thread = threading.Thread(target=self._run, name="kube-pod-cache", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()

    def lookup(self, namespace: str, pod: str) -> PodMetadata | None:
        with self._lock:
            record = self._pods.get((namespace, pod))
            return None if record is None else with_namespace_expectation(record, self._namespace_expectations)

    def is_authoritative(self) -> bool:
        return self._synced

    def pods(self) -> list[PodMetadata]:
        with self._lock:
            return sorted(
                (with_namespace_expectation(p, self._namespace_expectations) for p in self._pods.values()),
                key=lambda p: (p.namespace, p.name),
            )

    def _read_namespace_expectations(self, api: Any) -> None:
        """Namespaces that declare an expected network (one small list per list/watch cycle, so a
        namespace label change is seen within ``watch_seconds``). Without permission to list
        namespaces, pods' own labels still count; said once in the log."""
        if not self._namespaces_readable:
            return
        try:
            listing = api.list_namespace(label_selector=EXPECTED_NETWORK_LABEL, _request_timeout=30)
        except Exception as exc:  # noqa: BLE001 - 403 without the RBAC rule, API down: keep going
            status = getattr(exc, "status", None)
            if status in (401, 403):
                self._namespaces_readable = False
                log.warning(
                    "cannot list namespaces (%s): only pods' own %s labels count", status, EXPECTED_NETWORK_LABEL
                )
            return
        found: dict[str, str] = {}
        for item in getattr(listing, "items", None) or []:
            meta = item.get("metadata") if isinstance(item, Mapping) else getattr(item, "metadata", None)
            if meta is None:
                continue
            name = meta.get("name") if isinstance(meta, Mapping) else getattr(meta, "name", None)
            labels = (meta.get("labels") if isinstance(meta, Mapping) else getattr(meta, "labels", None)) or {}
            value = str(labels.get(EXPECTED_NETWORK_LABEL) or "")[:MAX_LABEL_VALUE_CHARS]
            if name and value and len(found) < self._max_pods:
                found[str(name)] = value
        with self._lock:
            self._namespace_expectations = found

    def _replace(self, items: Iterable[Any]) -> None:
        fresh: dict[tuple[str, str], PodMetadata] = {}
        for item in items:
            record = pod_metadata_from_object(item)
            if record is not None and len(fresh) < self._max_pods:
                fresh[(record.namespace, record.name)] = record
        with self._lock:
            self._pods = fresh

    def _apply(self, kind: str, obj: Any) -> None:
        record = pod_metadata_from_object(obj)
        if record is None:
            return
        with self._lock:
            if kind == "DELETED":
                self._pods.pop((record.namespace, record.name), None)
            elif len(self._pods) < self._max_pods or (record.namespace, record.name) in self._pods:
                self._pods[(record.namespace, record.name)] = record

    def _run(self) -> None:
        try:
            api = self._api_factory()
        except Exception as exc:  # noqa: BLE001 - no config, no token: run without attribution
            log.info("no Kubernetes API access (%s): job_name and job_kind stay empty", exc)
            self.status = f"no API access: {exc}"
            return
        from kubernetes import watch

        selector = f"spec.nodeName={self.node_name}"
        failing = False
        backoff = self._min_cycle
        while not self._stop.is_set():
            started = time.monotonic()
            self._read_namespace_expectations(api)
            try:
                listing = api.list_pod_for_all_namespaces(field_selector=selector, _request_timeout=30)
                self._replace(listing.items or [])
                self._synced = True
                self.status = "synced"
                if failing:
                    log.info("Kubernetes API reachable again; attributing pods to jobs")
                failing, backoff = False, self._min_cycle
                watcher = watch.Watch()
                for event in watcher.stream(
                    api.list_pod_for_all_namespaces,
                    field_selector=selector,
                    resource_version=listing.metadata.resource_version,
                    timeout_seconds=self._watch_seconds,
                    _request_timeout=self._watch_seconds + 30,
                ):
                    if self._stop.is_set():
                        watcher.stop()
                        break
                    kind = event.get("type")
                    if kind == "ERROR":  # 410 Gone and friends: list again
                        break
                    self._apply(str(kind), event.get("object"))
            except Exception as exc:  # noqa: BLE001 - API down, 403, bad JSON: keep the cache, retry
                self._synced = False
                if not failing:
                    log.warning(
                        "Kubernetes API unavailable (%s); pods stay attributed from the last list, "
                        "new pods get an empty job_name until it answers",
                        exc,
                    )
                self.status = f"API error: {exc}"
                failing = True
                backoff = min(backoff * 2, 60.0)
                self._stop.wait(backoff)
                continue
            self._stop.wait(max(0.0, self._min_cycle - (time.monotonic() - started)))

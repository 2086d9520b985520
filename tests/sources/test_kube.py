"""Job attribution from pod labels, and the pod list/watch cache.

No Kubernetes API server can run here, so the cache is tested with the real ``kubernetes``
client against a recorded-response HTTP server on 127.0.0.1 (tests/kube_api.py) that answers
the node-filtered pod list and a watch stream (newline-delimited JSON events, chunked, as the
API server sends them). The seam is only the ``CoreV1Api`` the cache is given.
"""

from __future__ import annotations

import logging
import time

import pytest

from exporter.sources.kube import KubePodCache, PodMetadata, attribute_job
from tests.kube_api import ApiState, RecordedApiServer, api_for, wait_for

CONTROLLER = {
    "apiVersion": "kubeflow.org/v1",
    "kind": "PyTorchJob",
    "name": "llama",
    "controller": True,
    "uid": "6f1e2d3c-0000-4000-8000-000000000001",
}


@pytest.mark.parametrize(
    ("labels", "owners", "annotations", "expected"),
    [
        (
            {"training.kubeflow.org/job-name": "llama", "training.kubeflow.org/operator-name": "pytorchjob-controller"},
            [],
            {},
            ("llama", "PyTorchJob"),
        ),
        ({"training.kubeflow.org/job-name": "llama"}, [CONTROLLER], {}, ("llama", "PyTorchJob")),
        (
            {
                "training.kubeflow.org/job-name": "pi",
                "training.kubeflow.org/operator-name": "mpi-operator",
                "training.kubeflow.org/job-role": "launcher",
            },
            [],
            {},
            ("pi", "MPIJob"),
        ),
        ({"training.kubeflow.org/job-name": "x"}, [], {}, ("x", "KubeflowJob")),
        # Kubeflow wins over the JobSet and batch labels a pod may also carry
        (
            {
                "training.kubeflow.org/job-name": "a",
                "jobset.sigs.k8s.io/jobset-name": "b",
                "job-name": "c",
                "training.kubeflow.org/operator-name": "tfjob-controller",
            },
            [],
            {},
            ("a", "TFJob"),
        ),
        (
            {"jobset.sigs.k8s.io/jobset-name": "js", "batch.kubernetes.io/job-name": "js-node-0"},
            [],
            {},
            ("js", "JobSet"),
        ),
        (
            {"jobset.sigs.k8s.io/jobset-name": "tj", "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"},
            [],
            {},
            ("tj", "TrainJob"),
        ),
        ({"leaderworkerset.sigs.k8s.io/name": "vllm", "job-name": "nope"}, [], {}, ("vllm", "LeaderWorkerSet")),
        (
            {"volcano.sh/job-name": "vc", "volcano.sh/queue-name": "q"},
            [],
            {"scheduling.k8s.io/group-name": "pg"},
            ("vc", "VolcanoJob"),
        ),
        (
            {"batch.kubernetes.io/job-name": "bj", "job-name": "bj"},
            [{"kind": "Job", "name": "bj", "controller": True}],
            {},
            ("bj", "Job"),
        ),
        ({"job-name": "legacy"}, [], {}, ("legacy", "Job")),
        ({"scheduling.x-k8s.io/pod-group": "pg1"}, [], {}, ("pg1", "PodGroup")),
        ({}, [], {"scheduling.k8s.io/group-name": "pg2"}, ("pg2", "PodGroup")),
        ({"kueue.x-k8s.io/pod-group-name": "kg"}, [], {}, ("kg", "PodGroup")),
        (
            {"app": "web"},
            [{"kind": "ReplicaSet", "name": "web-5d9c", "controller": True}],
            {},
            ("web-5d9c", "ReplicaSet"),
        ),
        (
            {"app": "web"},
            [{"kind": "Node", "name": "n1"}, {"kind": "StatefulSet", "name": "db", "controller": True}],
            {},
            ("db", "StatefulSet"),
        ),
        ({}, [], {}, ("", "")),
        (None, None, None, ("", "")),
    ],
)
def test_attribute_job(labels, owners, annotations, expected) -> None:  # type: ignore[no-untyped-def]
    assert attribute_job(labels, owners, annotations) == expected


def pod(namespace: str, name: str, uid: str, labels: dict[str, str], rv: str, owners: list | None = None) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "labels": labels,
            "resourceVersion": rv,
            "ownerReferences": owners or [],
        },
        "spec": {"nodeName": "gpu-node-7", "containers": [{"name": "pytorch", "image": "pytorch:2"}]},
        "status": {"phase": "Running"},
    }


LLAMA = pod("training", "llama-worker-0", "u1", {"training.kubeflow.org/job-name": "llama"}, "101", [CONTROLLER])
BERT = pod("research", "bert-0", "u2", {"batch.kubernetes.io/job-name": "bert"}, "102")
RESNET = pod("vision", "resnet-0", "u3", {"volcano.sh/job-name": "resnet"}, "105")
# A pod that says it runs on TCP on purpose, with the host network.
ETL = pod("data", "etl-0", "u4", {"job-name": "etl", "ccl-health.io/expected-network": "socket"}, "103")
ETL["spec"]["hostNetwork"] = True
# Namespaces that declare an expected network for all their pods.
NAMESPACES = [{"metadata": {"name": "research", "labels": {"ccl-health.io/expected-network": "socket"}}}]


MODIFIED_BERT = pod("research", "bert-0", "u2", {"volcano.sh/job-name": "bert-v2"}, "104")
WATCH_EVENTS = [
    {"type": "ADDED", "object": RESNET},
    {"type": "MODIFIED", "object": MODIFIED_BERT},
    {"type": "DELETED", "object": LLAMA},
]


@pytest.fixture
def recorded_api():  # type: ignore[no-untyped-def]
    """The recorded API (tests/kube_api.py): the list holds LLAMA, BERT and ETL, the watch then adds
    RESNET, relabels BERT and deletes LLAMA."""
    server = RecordedApiServer(
        ApiState(pods=[LLAMA, BERT, ETL], namespaces=NAMESPACES, watch_events=WATCH_EVENTS)
    ).start()
    yield server
    server.stop()


def test_cache_lists_and_watches_this_nodes_pods(recorded_api: RecordedApiServer) -> None:
    cache = KubePodCache("gpu-node-7", api_factory=recorded_api.api_factory(), watch_seconds=5)
    cache.start()
    try:
        assert wait_for(lambda: cache.lookup("vision", "resnet-0") is not None)
        assert wait_for(lambda: cache.lookup("training", "llama-worker-0") is None)
        assert cache.is_authoritative()
        # research declares TCP for its pods: the namespace label reaches the pod's record.
        assert cache.lookup("research", "bert-0") == PodMetadata(
            "research", "bert-0", "u2", "bert-v2", "VolcanoJob", "socket", False
        )
        assert cache.lookup("vision", "resnet-0") == PodMetadata(
            "vision", "resnet-0", "u3", "resnet", "VolcanoJob", "", False
        )
        assert cache.lookup("data", "etl-0") == PodMetadata("data", "etl-0", "u4", "etl", "Job", "socket", True)
        assert [p.name for p in cache.pods()] == ["etl-0", "bert-0", "resnet-0"]
    finally:
        cache.close()
    pod_queries = [q for q in recorded_api.state.queries if "fieldSelector" in q]
    listing, watching = pod_queries[0], pod_queries[1]
    assert listing["fieldSelector"] == ["spec.nodeName=gpu-node-7"]
    assert watching["fieldSelector"] == ["spec.nodeName=gpu-node-7"]
    assert watching["resourceVersion"] == ["100"] and watching["watch"] == ["true"]


def test_without_api_access_it_says_so_once_and_attributes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    def no_config() -> None:
        raise RuntimeError("Service host/port is not set.")

    caplog.set_level(logging.INFO, logger="exporter.sources.kube")
    cache = KubePodCache("gpu-node-7", api_factory=no_config)
    cache.start()
    cache.start()
    assert wait_for(lambda: cache.status.startswith("no API access"))
    assert cache.lookup("training", "llama-worker-0") is None
    assert not cache.is_authoritative()
    assert len([r for r in caplog.records if "no Kubernetes API access" in r.getMessage()]) == 1


def test_api_down_is_retried_and_said_once(caplog: pytest.LogCaptureFixture) -> None:
    from tests.conftest import free_port

    caplog.set_level(logging.INFO, logger="exporter.sources.kube")
    cache = KubePodCache("gpu-node-7", api_factory=api_for(f"http://127.0.0.1:{free_port()}"), min_cycle_seconds=0.01)
    cache.start()
    try:
        assert wait_for(lambda: cache.status.startswith("API error"))
        time.sleep(0.2)  # several retries
    finally:
        cache.close()
    assert not cache.is_authoritative()
    assert len([r for r in caplog.records if "Kubernetes API unavailable" in r.getMessage()]) == 1


def test_no_node_name_means_no_watch(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="exporter.sources.kube")
    cache = KubePodCache("")
    cache.start()
    assert cache.status == "no node name" and not cache.is_authoritative()


def test_without_permission_to_list_namespaces_pod_labels_still_count(caplog: pytest.LogCaptureFixture) -> None:
    class Forbidden(Exception):
        status = 403

    class Api:
        def list_namespace(self, **_: object) -> None:
            raise Forbidden("namespaces is forbidden")

    caplog.set_level(logging.INFO, logger="exporter.sources.kube")
    cache = KubePodCache("gpu-node-7")
    for _ in range(3):
        cache._read_namespace_expectations(Api())
    assert len([r for r in caplog.records if "cannot list namespaces" in r.getMessage()]) == 1


def test_a_static_pod_is_known_by_the_uid_its_log_folder_carries() -> None:
    """kubelet names a static pod's log folder with its config hash; the API shows a mirror pod with
    another UID and the hash in an annotation. The hash is the UID the log folders are checked against."""
    from exporter.sources.kube import pod_metadata_from_object

    mirror = pod("kube-system", "gpu-burn-node-7", "3f1b0c2e-mirror", {}, "7")
    mirror["metadata"]["annotations"] = {
        "kubernetes.io/config.mirror": "9a8b7c6d5e4f",
        "kubernetes.io/config.source": "file",
    }
    record = pod_metadata_from_object(mirror)
    assert record is not None and record.uid == "9a8b7c6d5e4f"
    assert pod_metadata_from_object(LLAMA).uid == "u1"  # everyone else: the API's UID


def test_the_fabric_readiness_gate_and_its_condition_are_read_from_the_pod() -> None:
    """The lifecycle hooks act on pods that carry the gate, and compare with the condition already there."""
    from kubernetes import client

    from exporter.sources.kube import FABRIC_READY_CONDITION, PodCondition, pod_metadata_from_object

    gated = pod("training", "llama-worker-1", "u9", {}, "8")
    gated["spec"]["readinessGates"] = [
        {"conditionType": "example.com/other"},
        {"conditionType": FABRIC_READY_CONDITION},
    ]
    gated["status"]["conditions"] = [
        {"type": "Ready", "status": "False"},
        {
            "type": FABRIC_READY_CONDITION,
            "status": "False",
            "reason": "TcpFallback",
            "message": "on Socket",
            "lastTransitionTime": "2026-06-01T10:00:00Z",
        },
    ]
    record = pod_metadata_from_object(gated)
    assert record is not None and record.fabric_ready_gate
    assert record.fabric_ready == PodCondition("False", "TcpFallback", "on Socket", "2026-06-01T10:00:00Z")
    plain = pod_metadata_from_object(LLAMA)
    assert plain is not None and not plain.fabric_ready_gate and plain.fabric_ready is None
    # The same through the client's objects (what the watch hands over).
    from_object = pod_metadata_from_object(client.V1Pod.from_dict(gated))
    assert from_object is not None and from_object.fabric_ready_gate
    assert from_object.fabric_ready == record.fabric_ready


def _preflight_status(state: dict, last_state: dict | None = None, name: str = "ccl-preflight") -> dict:
    entry = {
        "name": name,
        "image": "ccl-health-exporter:0.1.0",
        "imageID": "",
        "ready": False,
        "restartCount": 1,
        "state": state,
    }
    if last_state is not None:
        entry["lastState"] = last_state
    return entry


PASSED_REPORT = "ccl-preflight/v1 passed finished_at=1764457231.700 checks=1 failed=0\nok rdma_devices\n"
FAILED_REPORT = "ccl-preflight/v1 failed finished_at=1764457100.000 checks=1 failed=1\nFAIL port_state: down\n"


def test_start_time_and_the_preflights_termination_message_through_the_real_client(
    recorded_api: RecordedApiServer,
) -> None:
    """What the watch hands the cache are the client's objects (datetimes, snake_case): the pod's
    start and its ccl-preflight init container's message read the same as from JSON."""
    gated = pod("training", "gpt-worker-0", "u9", {"job-name": "gpt"}, "106")
    gated["status"]["startTime"] = "2026-11-30T10:00:00Z"
    gated["status"]["initContainerStatuses"] = [
        _preflight_status({"terminated": {"exitCode": 0, "message": "other\n"}}, name="setup"),
        _preflight_status(
            {"terminated": {"exitCode": 0, "message": PASSED_REPORT, "finishedAt": "2026-11-30T10:00:31Z"}}
        ),
    ]
    recorded_api.state.watch_events.append({"type": "ADDED", "object": gated})
    cache = KubePodCache("gpu-node-7", api_factory=recorded_api.api_factory(), watch_seconds=5)
    cache.start()
    try:
        assert wait_for(lambda: cache.lookup("training", "gpt-worker-0") is not None)
        record = cache.lookup("training", "gpt-worker-0")
        assert record is not None and record.start_time == 1796032800.0
        assert record.preflight is not None and record.preflight.status == "valid"
        result = record.preflight.result
        assert (
            result is not None
            and result.success
            and (result.namespace, result.pod, result.pod_uid, result.job_name)
            == ("training", "gpt-worker-0", "u9", "gpt")
        )
        assert cache.lookup("research", "bert-0").preflight is None  # type: ignore[union-attr]
    finally:
        cache.close()


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (_preflight_status({"terminated": {"exitCode": 1, "message": FAILED_REPORT}}), "port_state"),
        # waiting to restart after a failed run: the run before speaks
        (
            _preflight_status(
                {"waiting": {"reason": "CrashLoopBackOff"}}, {"terminated": {"exitCode": 1, "message": FAILED_REPORT}}
            ),
            "port_state",
        ),
        # running again: still the run before, until this one ends
        (
            _preflight_status(
                {"running": {"startedAt": "2026-11-30T10:01:00Z"}},
                {"terminated": {"exitCode": 1, "message": FAILED_REPORT}},
            ),
            "port_state",
        ),
        # the current run ended: it wins over the one before
        (
            _preflight_status(
                {"terminated": {"exitCode": 0, "message": PASSED_REPORT}},
                {"terminated": {"exitCode": 1, "message": FAILED_REPORT}},
            ),
            "rdma_devices",
        ),
        (_preflight_status({"running": {}}), None),
        (_preflight_status({"terminated": {"exitCode": 137, "reason": "OOMKilled"}}), None),  # ended without one
        (_preflight_status({"terminated": {"exitCode": 0, "message": ["not", "text"]}}), None),
        (_preflight_status({"terminated": {"exitCode": 1, "message": FAILED_REPORT}}, name="ccl-preflight-2"), None),
    ],
    ids=[
        "failed",
        "crash-loop",
        "running-again",
        "passed-after-failing",
        "running",
        "no-message",
        "not-text",
        "other-container",
    ],
)
def test_which_termination_message_is_the_pods_preflight(entry: dict, expected: str | None) -> None:
    from exporter.sources.kube import pod_metadata_from_object

    listed = pod("ml", "w-0", "u1", {}, "1")
    listed["status"]["initContainerStatuses"] = [entry]
    record = pod_metadata_from_object(listed)
    assert record is not None
    found = record.preflight
    if expected is None:
        assert found is None
    else:
        assert found is not None and found.result is not None and found.result.checks[0].check == expected


@pytest.mark.parametrize("start", ["2026-11-30T10:00:00Z", "2026-11-30T10:00:00+00:00", "2026-11-30T11:00:00+01:00"])
def test_start_time_in_the_spellings_an_api_server_writes(start: str) -> None:
    from exporter.sources.kube import pod_metadata_from_object

    listed = pod("ml", "w-0", "u1", {}, "1")
    listed["status"]["startTime"] = start
    assert pod_metadata_from_object(listed).start_time == 1796032800.0  # type: ignore[union-attr]


@pytest.mark.parametrize("start", ["", "yesterday", "2026-13-40T99:00:00Z", 12, None, ["2026"]])
def test_a_start_time_that_is_not_one_is_none(start: object) -> None:
    from exporter.sources.kube import pod_metadata_from_object

    listed = pod("ml", "w-0", "u1", {}, "1")
    listed["status"]["startTime"] = start
    assert pod_metadata_from_object(listed).start_time is None  # type: ignore[union-attr]

"""Result files: round trip, atomic writes, and every way a file on the hostPath can be bad."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.collectors.probe import ProbeCollector
from exporter.results.probe_file import (
    MAX_FILE_BYTES,
    Check,
    CollectiveResult,
    MalformedResult,
    ProbeResult,
    Row,
    Transport,
    parse_result,
    write_result,
)
from exporter.sources.probe_results import read_probe_results

NOW = 1_800_000_000.0
UID = "c0ffee00-1111-4222-8333-444455556666"  # the pod UID every sample result carries
OTHER_UID = "c0ffee00-1111-4222-8333-999999999999"


def sample(source: str = "job", finished_at: float = NOW - 60, pod: str = "p-0", **kw: object) -> ProbeResult:
    row = Row(
        size_bytes=1048576,
        count=262144,
        type="float",
        time_seconds=0.002,
        algbw_bytes_per_second=5.2e8,
        busbw_bytes_per_second=5.2e8,
        wrong=0,
    )
    fields: dict[str, object] = {
        "source": source,
        "started_at": finished_at - 5,
        "finished_at": finished_at,
        "hostname": "node-1",
        "namespace": "team-a",
        "pod": pod,
        "pod_uid": UID if pod else "",
        "job_name": "llama",
        "backend": "nccl",
        "world_size": 16,
        "nnodes": 2,
        "scope": "inter_node",
        "transport": Transport("rdma", "net_ib", "IB", True, ("Using network IB",)),
        "collectives": (CollectiveResult("all_reduce", (row,)),),
    }
    fields.update(kw)
    return ProbeResult(**fields)  # type: ignore[arg-type]


def test_round_trip_and_file_name(tmp_path: Path) -> None:
    result = sample(checks=(Check("port_state", True, "2 port(s) ACTIVE/LinkUp"),))
    path = write_result(tmp_path, result)
    assert path.name == f"job-team-a-p-0-{UID}.json"
    assert parse_result(path.read_text()) == result
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left behind
    assert write_result(tmp_path, sample(source="scheduled", pod="")).name == "scheduled.json"
    assert write_result(tmp_path, sample(namespace="../../etc", pod="a/b", pod_uid="")).name == "job-.._.._etc-a_b.json"


def test_success_needs_every_collective_and_check() -> None:
    assert sample().success
    assert not sample(error="timed out").success
    assert not sample(checks=(Check("nccl_env", False, "NCCL_IB_DISABLE=1"),)).success
    wrong = Row(1024, 256, "float", 0.001, 1e6, 1e6, wrong=3)
    assert not sample(collectives=(CollectiveResult("all_reduce", (wrong,)),)).success
    assert not sample(collectives=(CollectiveResult("alltoall", (), "unsupported"),)).success


def good_document() -> dict:  # type: ignore[type-arg]
    return json.loads(sample().to_json())


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda d: d.update(schema="ccl-probe-result/v0"), "schema"),
        (lambda d: d.update(source="cron"), "source 'cron'"),
        (lambda d: d.pop("finished_at"), "missing 'finished_at'"),
        (lambda d: d.update(world_size="16"), "'world_size' has type str"),
        (lambda d: d.update(world_size=True), "'world_size' is a boolean"),
        (lambda d: d["transport"].update(kind="infiniband"), "transport kind"),
        (lambda d: d["transport"].update(gdr="yes"), "transport gdr"),
        (lambda d: d["collectives"][0]["rows"][0].update(busbw_bytes_per_second=-1), "negative"),
        (lambda d: d["collectives"][0]["rows"].append("row"), "rows[1]: not an object"),
        (lambda d: d["collectives"][0].update(rows=[{}] * 300), "more than 64"),
        (lambda d: d["collectives"][0].update(collective="x" * 40), "is not one of"),
        (lambda d: d.update(collectives=d["collectives"] * 6), "more than 5"),
        (lambda d: d.update(checks=[{"check": "c", "ok": True, "message": ""}] * 33), "more than 32"),
        (lambda d: d.update(pod="x" * 5000), "longer than"),
        (lambda d: d["checks"].append({"check": "x", "ok": 1, "message": ""}), "'ok' has type int"),
    ],
)
def test_malformed_documents_say_why(mutate, reason: str) -> None:  # type: ignore[no-untyped-def]
    document = good_document()
    mutate(document)
    with pytest.raises(MalformedResult, match=reason.replace("[", r"\[").replace("(", r"\(")):
        parse_result(json.dumps(document))


@given(st.text(max_size=300) | st.binary(max_size=300).map(lambda b: b.decode("latin-1")))
@settings(max_examples=200, deadline=None)
def test_garbage_never_crashes_the_parser(text: str) -> None:
    with contextlib.suppress(MalformedResult):
        parse_result(text)


def test_deeply_nested_json_is_malformed_not_a_crash() -> None:
    with pytest.raises(MalformedResult):
        parse_result("[" * 100_000 + "]" * 100_000)


def test_reader_sorts_files_into_valid_stale_malformed(tmp_path: Path) -> None:
    write_result(tmp_path, sample(pod="fresh"))
    write_result(tmp_path, sample(pod="old", finished_at=NOW - 90_000))
    (tmp_path / "garbage.json").write_text("{not json")
    (tmp_path / "huge.json").write_bytes(b" " * (MAX_FILE_BYTES + 1))
    (tmp_path / "folder.json").mkdir()
    os.symlink("/etc/hostname", tmp_path / "link.json")
    (tmp_path / ".tmp-half.json").write_text("{")  # a writer's temp file: not ours to read
    (tmp_path / "notes.txt").write_text("ignored")
    reading = read_probe_results(tmp_path, NOW, max_age_seconds=86_400)
    assert [r.pod for r in reading.results] == ["fresh"]
    assert reading.stale == [f"job-team-a-old-{UID}.json"]
    reasons = dict(reading.malformed)
    assert set(reasons) == {"garbage.json", "huge.json", "folder.json", "link.json"}
    assert reasons["garbage.json"].startswith("not JSON")
    assert "byte limit" in reasons["huge.json"]
    assert reasons["folder.json"] == "not a regular file"
    assert reasons["link.json"].startswith("cannot open")  # O_NOFOLLOW


def test_reader_caps_files_and_survives_a_missing_folder(tmp_path: Path) -> None:
    for i in range(5):
        write_result(tmp_path, sample(pod=f"p-{i}"))
    reading = read_probe_results(tmp_path, NOW, 86_400, max_files=3)
    assert (len(reading.results), reading.not_read) == (3, 2)
    missing = read_probe_results(tmp_path / "absent", NOW, 86_400)
    assert (missing.results, missing.folder_present) == ([], False)


def metric_samples(collector: ProbeCollector) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in collector.collect():
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_collector_exposes_results_and_counts_bad_files(tmp_path: Path) -> None:
    write_result(tmp_path, sample(source="job", pod="bench-0"))
    write_result(
        tmp_path,
        sample(
            source="preflight",
            pod="llama-0",
            collectives=(),
            checks=(Check("port_state", False, "mlx5_1 port 1 is DOWN/Disabled"), Check("nccl_env", True, "ok")),
        ),
    )
    write_result(tmp_path, sample(source="job", pod="stale", finished_at=NOW - 7200))
    (tmp_path / "bad.json").write_text("[]")
    samples = metric_samples(ProbeCollector(tmp_path, max_age_seconds=3600, clock=lambda: NOW))
    assert samples["ccl_probe_bus_bandwidth_bytes_per_second"] == [
        (
            {
                "collective": "all_reduce",
                "scope": "inter_node",
                "size_bytes": "1048576",
                "source": "job",
                "namespace": "team-a",
                "pod": "bench-0",
                "job_name": "llama",
            },
            5.2e8,
        )
    ]
    assert [v for _, v in samples["ccl_probe_success"]] == [1.0]
    assert [v for _, v in samples["ccl_probe_last_run_timestamp_seconds"]] == [NOW - 60]
    assert samples["ccl_probe_transport_info"][0][0]["transport_kind"] == "rdma"
    assert sorted((labels["check"], v) for labels, v in samples["ccl_preflight_result"]) == [
        ("nccl_env", 1.0),
        ("port_state", 0.0),
    ]
    assert samples["ccl_preflight_result"][0][0]["pod"] == "llama-0"
    files = {labels["status"]: v for labels, v in samples["ccl_probe_result_files"]}
    assert files == {
        "valid": 2.0,
        "stale": 1.0,
        "malformed": 1.0,
        "not_read": 0.0,
        "not_on_node": 0.0,
        "pod_uid_missing": 0.0,
        "pod_uid_mismatch": 0.0,
        "name_mismatch": 0.0,
        "pod_list_unavailable": 0.0,
        "foreign_owner": 0.0,
    }


def test_peak_is_the_best_size_of_each_probe_and_absent_without_rows(tmp_path: Path) -> None:
    """The rules compare each probe's best bus bandwidth: the large sizes reach it, a latency-bound
    1 MiB row must not count. A collective with no rows (it failed before measuring) has no peak."""
    small = Row(
        size_bytes=1048576,
        count=262144,
        type="float",
        time_seconds=0.002,
        algbw_bytes_per_second=1e9,
        busbw_bytes_per_second=1e9,
        wrong=0,
    )
    large = Row(
        size_bytes=1073741824,
        count=268435456,
        type="float",
        time_seconds=0.01,
        algbw_bytes_per_second=2e11,
        busbw_bytes_per_second=3.5e11,
        wrong=0,
    )
    write_result(
        tmp_path,
        sample(
            collectives=(
                CollectiveResult("all_reduce", (small, large)),
                CollectiveResult("all_gather", (), error="timeout"),
            )
        ),
    )
    samples = metric_samples(ProbeCollector(tmp_path, max_age_seconds=3600, clock=lambda: NOW))
    peaks = [(labels["collective"], v) for labels, v in samples["ccl_probe_peak_bus_bandwidth_bytes_per_second"]]
    assert peaks == [("all_reduce", 3.5e11)]
    sizes = samples["ccl_probe_bus_bandwidth_bytes_per_second"]
    assert max(v for _, v in sizes) == 3.5e11 and len(sizes) == 2


def on_node(*pods: str):  # type: ignore[no-untyped-def]
    """A ``pod_known`` predicate of a node whose complete pod list holds ``pods`` (team-a, UID ``UID``)."""
    return lambda namespace, pod, uid="": namespace == "team-a" and pod in pods and uid in ("", UID)


def test_results_naming_a_pod_not_on_this_node_are_not_used(tmp_path: Path) -> None:
    """Anyone who can write the folder can claim any pod: with a complete pod list, a
    result speaks only for a pod of this node. Scheduled results name no pod."""
    write_result(tmp_path, sample(source="preflight", pod="real-0"))
    write_result(tmp_path, sample(source="job", pod="ghost-0"))
    write_result(tmp_path, sample(source="preflight", pod="real-0", namespace="team-b"))
    write_result(tmp_path, sample(source="scheduled", pod="", namespace="", job_name=""))
    reading = read_probe_results(tmp_path, NOW, 86_400, pod_known=on_node("real-0"))
    assert [(r.source, r.namespace, r.pod) for r in reading.results] == [
        ("preflight", "team-a", "real-0"),
        ("scheduled", "", ""),
    ]
    assert sorted(reading.not_on_node) == [f"job-team-a-ghost-0-{UID}.json", f"preflight-team-b-real-0-{UID}.json"]

    # Without a complete pod list only the node-wide result is used; the others wait for it.
    no_list = read_probe_results(tmp_path, NOW, 86_400, pod_known=lambda namespace, pod, uid="": None)
    assert [r.source for r in no_list.results] == ["scheduled"]
    assert no_list.unattributed_by_reason()["pod_list_unavailable"] == 3

    collector = ProbeCollector(tmp_path, 86_400, clock=lambda: NOW, pod_known=on_node("real-0"))
    samples = metric_samples(collector)
    assert {labels["pod"] for labels, _ in samples["ccl_probe_success"]} == {"real-0", ""}
    files = {labels["status"]: v for labels, v in samples["ccl_probe_result_files"]}
    assert files["not_on_node"] == 2.0 and files["valid"] == 2.0


def test_a_result_speaks_for_a_pod_only_through_the_pods_uid(tmp_path: Path) -> None:
    """What a neighbour that can write the folder might try, each counted by reason and credited
    to nobody: a result without a UID, one with the victim's name but its own UID (what its own
    pre-flight would write under a forged name), one with the victim's UID under another file
    name (to sit beside the victim's own file and outrank it with a later time). The victim's
    own result is used."""
    own = write_result(
        tmp_path,
        sample(source="preflight", pod="victim-0", finished_at=NOW - 100, checks=(Check("port_state", True, "ok"),)),
    )
    write_result(tmp_path, sample(source="preflight", pod="victim-0", pod_uid=""))
    write_result(
        tmp_path,
        sample(source="preflight", pod="victim-0", pod_uid=OTHER_UID, checks=(Check("port_state", False, "forged"),)),
    )
    forged = json.loads(own.read_text())
    forged.update(finished_at=NOW - 1, checks=[{"check": "port_state", "ok": False, "message": "forged"}])
    (tmp_path / "preflight-team-a-victim-0-x.json").write_text(json.dumps(forged))
    reading = read_probe_results(tmp_path, NOW, 86_400, pod_known=on_node("victim-0"))
    assert [(r.pod, r.pod_uid, [c.ok for c in r.checks]) for r in reading.results] == [("victim-0", UID, [True])]
    assert dict(reading.unattributed) == {
        "preflight-team-a-victim-0-x.json": "name_mismatch",
        f"preflight-team-a-victim-0-{OTHER_UID}.json": "pod_uid_mismatch",
        "preflight-team-a-victim-0.json": "pod_uid_missing",
    }


def test_an_attributed_result_stays_through_a_pod_list_outage(tmp_path: Path) -> None:
    """A result attributed while the pod list was complete is still used while the list is not
    (the API is down); a new one waits until the list is back."""
    cache: dict = {}  # type: ignore[type-arg]
    write_result(tmp_path, sample(source="preflight", pod="real-0"))
    complete = [True]

    def pod_known(namespace: str, pod: str, uid: str = "") -> bool | None:
        return on_node("real-0", "new-0")(namespace, pod, uid) if complete[0] else None

    assert len(read_probe_results(tmp_path, NOW, 86_400, cache=cache, pod_known=pod_known).results) == 1
    complete[0] = False
    write_result(tmp_path, sample(source="preflight", pod="new-0"))
    reading = read_probe_results(tmp_path, NOW, 86_400, cache=cache, pod_known=pod_known)
    assert [r.pod for r in reading.results] == ["real-0"]
    assert reading.unattributed == [(f"preflight-team-a-new-0-{UID}.json", "pod_list_unavailable")]
    complete[0] = True
    assert len(read_probe_results(tmp_path, NOW, 86_400, cache=cache, pod_known=pod_known).results) == 2


def test_a_scheduled_result_the_exporter_did_not_write_is_not_used(tmp_path: Path) -> None:
    """``scheduled.json`` is node-wide and written by the exporter itself: one owned by another
    user (a writer that got there first) speaks for nothing."""
    path = write_result(tmp_path, sample(source="scheduled", pod="", namespace="", job_name=""))
    assert [r.source for r in read_probe_results(tmp_path, NOW, 86_400).results] == ["scheduled"]
    if os.geteuid() != 0:
        pytest.skip("changing a file's owner needs root")
    os.chown(path, 65532, 65532)
    reading = read_probe_results(tmp_path, NOW, 86_400)
    assert (reading.results, reading.unattributed) == ([], [("scheduled.json", "foreign_owner")])


def test_cache_parses_a_file_again_only_when_it_changes(tmp_path: Path) -> None:
    cache: dict = {}  # type: ignore[type-arg]
    write_result(tmp_path, sample(pod="a"))
    write_result(tmp_path, sample(pod="b"))
    first = read_probe_results(tmp_path, NOW, 86_400, cache=cache)
    again = read_probe_results(tmp_path, NOW, 86_400, cache=cache)
    assert [id(r) for r in again.results] == [id(r) for r in first.results]  # not parsed again
    write_result(tmp_path, sample(pod="b", job_name="rerun"))
    (tmp_path / f"job-team-a-a-{UID}.json").unlink()
    changed = read_probe_results(tmp_path, NOW, 86_400, cache=cache)
    assert [(r.pod, r.job_name) for r in changed.results] == [("b", "rerun")]
    assert set(cache) == {f"job-team-a-b-{UID}.json"}


def test_simulated_node_result_files(tmp_path: Path) -> None:
    """The files the simulated node starts with, read back through the real reader."""
    from ccl_sim.probe import SimProbeResults

    SimProbeResults().setup(tmp_path)
    samples = metric_samples(ProbeCollector(tmp_path / "probe-results", 86_400))
    preflight = {(labels["pod"], labels["check"]): v for labels, v in samples["ccl_preflight_result"]}
    assert preflight[("llama-70b-worker-0", "probe_transport")] == 1.0
    assert preflight[("gpt-neox-worker-1", "uverbs_devices")] == 0.0
    assert preflight[("gpt-neox-worker-1", "probe_transport")] == 0.0
    kinds = {
        (labels["source"], labels["pod"]): labels["transport_kind"] for labels, _ in samples["ccl_probe_transport_info"]
    }
    assert kinds == {
        ("preflight", "llama-70b-worker-0"): "rdma",
        ("preflight", "gpt-neox-worker-1"): "tcp",
        ("job", "ccl-probe-0"): "rdma",
    }
    job_busbw = [
        v
        for labels, v in samples["ccl_probe_bus_bandwidth_bytes_per_second"]
        if labels["source"] == "job" and labels["collective"] == "all_reduce"
    ]
    assert len(job_busbw) == 10 and job_busbw == sorted(job_busbw) and 3.0e11 < job_busbw[-1] < 3.55e11
    files = {labels["status"]: v for labels, v in samples["ccl_probe_result_files"]}
    assert files["valid"] == 3.0 and files["malformed"] == 0.0


def test_serve_binds_log_folders_and_result_files_to_the_node_pod_list(tmp_path: Path) -> None:
    """What ``serve`` builds: the NCCL collector's tailer and the probe collector's reader
    both ask the node's one pod list (``NodeResources.pod_metadata``)."""
    from exporter.collectors.nccl import NcclLimits, NcclSettings, build_collector
    from exporter.collectors.probe import ProbeCollectorSettings
    from exporter.collectors.probe import build as build_probe
    from exporter.resources import HostPaths, KubeNode, NodeResources
    from exporter.sources.nvml import PynvmlBackend
    from exporter.sources.podresources import PodResourcesClient
    from tests.sources.test_podlogs_hostile import UID, NodePods, append, debug_file, lines_by_pod, nccl

    node = NodePods({("training", "real-0"): UID})
    config = HostPaths(
        pod_logs=tmp_path / "pods",
        nccl_debug_files=tmp_path / "nccl",
        state=tmp_path / "state",
        sysfs=tmp_path / "sys",
        probe_results=tmp_path / "results",
        pod_resources=tmp_path / "kubelet.sock",
    )
    resources = NodeResources(
        config,
        nvml=PynvmlBackend(),
        pod_resources=PodResourcesClient(config.pod_resources),
        pod_metadata=lambda: node,
        kube=KubeNode("gpu-node-1"),
    )
    append(debug_file(tmp_path / "nccl", "training_real-0"), nccl(1) + "\n")
    append(debug_file(tmp_path / "nccl", "training_victim-0"), nccl(2) + "\n")
    append(debug_file(tmp_path / "nccl", "training_real-0", uid=""), nccl(3) + "\n")
    tailer = build_collector(NcclSettings(300.0, NcclLimits()), resources).tailer
    assert lines_by_pod([tailer.poll()]) == {("nccl_debug_file", "real-0", UID): [nccl(1)]}

    for pod, uid in (("real-0", UID), ("victim-0", UID), ("real-0", "")):
        write_result(
            config.probe_results,
            ProbeResult(
                source="preflight",
                started_at=0,
                finished_at=1e12,
                hostname="h",
                namespace="training",
                pod=pod,
                pod_uid=uid,
            ),
        )
    probe = build_probe(ProbeCollectorSettings(86_400.0, None), resources)
    files = {
        s.labels["status"]: s.value
        for family in probe.collect()
        for s in family.samples
        if s.name == "ccl_probe_result_files"
    }
    assert (files["valid"], files["not_on_node"], files["pod_uid_missing"]) == (1.0, 1.0, 1.0)

    # A node without a node name has no pod list: what is named with a UID is taken as named.
    unbound = NodeResources(
        config, nvml=PynvmlBackend(), pod_resources=PodResourcesClient(config.pod_resources), pod_metadata=lambda: node
    )
    tailer = build_collector(NcclSettings(300.0, NcclLimits()), unbound).tailer
    assert sorted(lines_by_pod([tailer.poll()])) == [
        ("nccl_debug_file", "real-0", UID),
        ("nccl_debug_file", "victim-0", UID),
    ]
    files = {
        s.labels["status"]: s.value
        for family in build_probe(ProbeCollectorSettings(86_400.0, None), unbound).collect()
        for s in family.samples
        if s.name == "ccl_probe_result_files"
    }
    assert (files["valid"], files["pod_uid_missing"]) == (2.0, 1.0)


class ListedPods:
    """The node's complete pod list (what ``KubePodCache`` answers), from pod objects as the API lists them."""

    def __init__(self, *pods: dict) -> None:
        from exporter.sources.kube import pod_metadata_from_object

        self.records = [pod_metadata_from_object(p) for p in pods]

    def pods(self) -> list:
        return self.records

    def lookup(self, namespace: str, pod: str):  # type: ignore[no-untyped-def]
        return next((r for r in self.records if (r.namespace, r.name) == (namespace, pod)), None)

    def is_authoritative(self) -> bool:
        return True


def listed_pod(name: str, message: str | None, uid: str = UID) -> dict:
    status: dict = {"phase": "Running"}
    if message is not None:
        status["initContainerStatuses"] = [
            {
                "name": "ccl-preflight",
                "image": "i",
                "imageID": "",
                "ready": True,
                "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "message": message}},
            }
        ]
    return {
        "metadata": {
            "namespace": "team-a",
            "name": name,
            "uid": uid,
            "labels": {"batch.kubernetes.io/job-name": "gpt"},
        },
        "spec": {"containers": [{"name": "c"}]},
        "status": status,
    }


def test_preflights_from_termination_messages_with_no_file_at_all(tmp_path: Path) -> None:
    """A pod's ccl-preflight termination message is its pre-flight: ccl_preflight_result for that
    pod (its job from the pod list), counted by status; with a result file of the same pod too,
    the newer one alone (no duplicate series)."""
    from exporter.results.preflight_message import render_report

    def report(finished: float, ok: bool) -> str:
        return render_report(
            ProbeResult(
                source="preflight",
                started_at=finished - 5,
                finished_at=finished,
                checks=(Check("port_state", ok, "mlx5_1 port 1 is DOWN/Disabled"), Check("nccl_env", True, "ok")),
            )
        )

    write_result(
        tmp_path,
        sample(
            source="preflight",
            pod="both-0",
            finished_at=NOW - 10,
            collectives=(),
            checks=(Check("port_state", True, "8 port(s) ACTIVE/LinkUp"),),
        ),
    )
    pods = ListedPods(
        listed_pod("message-0", report(NOW - 30, ok=False)),
        listed_pod("both-0", report(NOW - 300, ok=False)),
        listed_pod("garbled-0", "Sleep expired\n"),
        listed_pod("cut-0", report(NOW - 30, ok=False)[:90]),
        listed_pod("none-0", None),
    )
    collector = ProbeCollector(tmp_path, 86_400, clock=lambda: NOW, pod_known=on_node("both-0"), pods=pods)
    samples = metric_samples(collector)
    results = sorted(
        (labels["pod"], labels["job_name"], labels["check"], v) for labels, v in samples["ccl_preflight_result"]
    )
    assert results == [
        ("both-0", "llama", "port_state", 1.0),
        ("message-0", "gpt", "nccl_env", 1.0),
        ("message-0", "gpt", "port_state", 0.0),
    ]
    messages = {labels["status"]: v for labels, v in samples["ccl_preflight_termination_messages"]}
    assert messages == {"valid": 2.0, "cut": 1.0, "malformed": 1.0}

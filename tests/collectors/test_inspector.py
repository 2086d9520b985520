"""NCCL Inspector output from a pod's folder to ``ccl_nccl_collective_*`` counters: the source
(JSON Lines tailed with offsets, ``.prom`` versions read whole and once) and the collector
(counters per pod and job that only grow, bus bandwidth equal to the records' own)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from ccl_sim.inspector import (
    RecordWriter,
    TimedCollective,
    json_record,
    plugin_bandwidths,
    prom_bucket_lines,
    size_range,
)
from exporter.collectors.inspector import InspectorCollector, InspectorCollectorLimits, bus_bytes
from exporter.nccl.inspector import parse_json_record
from exporter.sources.inspector import InspectorLimits, InspectorSource
from exporter.sources.kube import PodMetadata
from exporter.sources.podlogs import TailLimits, pod_known_on_node
from tests.clocks import ManualClock
from tests.conftest import require_tool
from tests.metrics_text import promtool_check_metrics, samples, scrape_collectors

NS, POD = "ml", "llama-worker-0"
UID = "5f0c1d2e-aaaa-4bbb-8ccc-000000000001"
OTHER_UID = "5f0c1d2e-aaaa-4bbb-8ccc-000000000002"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "inspector"


class Pods:
    """The node's pod list: ``jobs`` holds (namespace, pod) -> (job_name, job_kind)."""

    def __init__(self, jobs: dict[tuple[str, str], tuple[str, str]] | None = None, authoritative: bool = True) -> None:
        self.jobs = jobs if jobs is not None else {(NS, POD): ("llama", "PyTorchJob")}
        self.authoritative = authoritative

    def lookup(self, namespace: str, pod: str) -> PodMetadata | None:
        job = self.jobs.get((namespace, pod))
        return None if job is None else PodMetadata(namespace, pod, UID, job[0], job[1])

    def is_authoritative(self) -> bool:
        return self.authoritative

    def pods(self) -> list[PodMetadata]:
        return [PodMetadata(ns, pod, UID, *job) for (ns, pod), job in sorted(self.jobs.items())]


def record(
    sn: int,
    collective: str = "AllReduce",
    size: int = 256 << 20,
    micros: int = 1500,
    nranks: int = 16,
    nnodes: int = 2,
    pid: int = 101,
) -> str:
    writer = RecordWriter(comm_id="0xabc", comm_name="DP", rank=0, nranks=nranks, nnodes=nnodes, hostname=POD, pid=pid)
    return json_record(writer, TimedCollective(collective, sn, size, micros), dump_us=1)


def write(path: Path, text: str, mode: str = "a") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, mode) as handle:
        handle.write(text)


def collector(
    root: Path, state: Path | None = None, pods: Pods | None = None, clock: ManualClock | None = None, **kwargs: object
) -> InspectorCollector:
    pods = pods or Pods()
    source = InspectorSource(root, state, clock=clock or ManualClock(), pod_known=None)
    return InspectorCollector(source, pods, clock=clock or ManualClock(), **kwargs)  # type: ignore[arg-type]


def totals(c: InspectorCollector) -> dict[tuple[str, ...], tuple[float, float, float]]:
    """(namespace, pod, job_name, job_kind, collective, scope, size_class) -> (ops, seconds, bus bytes)"""
    return {row[:7]: row[7:] for row in c._snapshot.series}


def folder(root: Path, namespace: str = NS, pod: str = POD, uid: str = UID) -> Path:
    """A pod's Inspector folder, ``<namespace>_<pod>_<uid>`` (no ``_<uid>`` when ``uid`` is "")."""
    return root / (f"{namespace}_{pod}_{uid}" if uid else f"{namespace}_{pod}")


# ---- JSON Lines ------------------------------------------------------------------------------


def test_json_records_become_counters_with_the_pods_job(tmp_path: Path) -> None:
    root = tmp_path / "inspector"
    folder(root).mkdir(parents=True)
    c = collector(root)
    c.step()  # the first start: nothing there yet
    write(folder(root) / f"{POD}-pid101.log", "".join(record(n) + "\n" for n in range(10)))
    write(folder(root) / f"{POD}-pid102.log", record(1, "AllGather", 64 << 20, 2600, pid=102) + "\n")
    c.step()
    got = totals(c)
    reduce = got[(NS, POD, "llama", "PyTorchJob", "all_reduce", "inter_node", "100MB_1GB")]
    assert reduce[0] == 10
    assert reduce[1] == pytest.approx(10 * 0.0015)
    assert reduce[2] == pytest.approx(10 * (256 << 20) * 2 * 15 / 16)
    gather = got[(NS, POD, "llama", "PyTorchJob", "all_gather", "inter_node", "ge_1GB")]  # 16 x 64 MiB gathered
    assert gather[0] == 1


@pytest.mark.parametrize("fixture", ["nccl-2.28-json.log", "nccl-2.30-json.log"])
def test_bus_bandwidth_from_the_counters_matches_the_records_within_one_percent(tmp_path: Path, fixture: str) -> None:
    """The done-when bar: rate(bus_bytes) / rate(seconds) equals the records' coll_busbw_gbs."""
    root = tmp_path / "inspector"
    folder(root).mkdir(parents=True)
    c = collector(root)
    c.step()
    lines = (FIXTURES / fixture).read_text()
    write(folder(root) / "host-pid1.log", lines)
    c.step()
    expected: dict[tuple[str, str, str], tuple[float, float]] = {}  # time-weighted: sum(busbw x t) / sum(t)
    for line in lines.splitlines():
        op = parse_json_record(line)
        assert not isinstance(op, str)
        perf = json.loads(line).get("coll_perf") or json.loads(line)["p2p_perf"]
        busbw = perf.get("coll_busbw_gbs", perf.get("p2p_busbw_gbs")) * 1e9
        key = (op.collective, op.scope, op.size_class)
        weighted, spent = expected.get(key, (0.0, 0.0))
        expected[key] = (weighted + busbw * op.seconds, spent + op.seconds)
    got = {key[4:]: value for key, value in totals(c).items()}
    assert set(got) == set(expected)
    for key, (weighted, spent) in expected.items():
        assert got[key][2] / got[key][1] == pytest.approx(weighted / spent, rel=0.01), key


def test_a_restart_resumes_at_the_saved_offsets_and_counts_nothing_twice(tmp_path: Path) -> None:
    root, state = tmp_path / "inspector", tmp_path / "state"
    log = folder(root) / f"{POD}-pid101.log"
    write(log, "".join(record(n) + "\n" for n in range(3)))  # before the first start: history, not counted
    first = collector(root, state)
    first.step()
    assert totals(first) == {}
    write(log, "".join(record(n) + "\n" for n in range(3, 8)))
    first.step()
    first.close()
    assert sum(v[0] for v in totals(first).values()) == 5
    write(log, "".join(record(n) + "\n" for n in range(8, 10)))  # while the exporter is down
    second = collector(root, state)
    second.step()
    assert sum(v[0] for v in totals(second).values()) == 2  # a new process: counters start again


def test_counters_never_go_down_when_a_ranks_file_goes_or_is_rewritten(tmp_path: Path) -> None:
    root = tmp_path / "inspector"
    folder(root).mkdir(parents=True)
    c = collector(root)
    c.step()
    log = folder(root) / f"{POD}-pid101.log"
    write(log, "".join(record(n) + "\n" for n in range(6)))
    write(folder(root) / f"{POD}-pid102.log", "".join(record(n, pid=102) + "\n" for n in range(4)))
    c.step()
    key = (NS, POD, "llama", "PyTorchJob", "all_reduce", "inter_node", "100MB_1GB")
    assert totals(c)[key][0] == 10
    (folder(root) / f"{POD}-pid102.log").unlink()
    c.step()
    assert totals(c)[key][0] == 10
    write(log, record(100) + "\n", mode="w")  # a new process of the same name and pid truncates it
    c.step()
    assert totals(c)[key][0] == 11


def test_hostile_json_lines_are_skipped_and_counted(tmp_path: Path) -> None:
    root = tmp_path / "inspector"
    folder(root).mkdir(parents=True)
    limits = InspectorLimits(tail=TailLimits(start_bytes=0, max_line_bytes=4096))
    source = InspectorSource(root, None, limits, clock=ManualClock())
    c = InspectorCollector(source, Pods())
    c.step()
    bad = [
        '{"coll_perf": "x"' + " " * 10_000 + "}",  # over the line cap: cut, no longer JSON
        '{"header":{"n_ranks":8},"coll_perf":{"coll":"Gather","coll_msg_size_bytes":1,"coll_exec_time_us":1}}',
        '{"header":{"n_ranks":-8},"coll_perf":{"coll":"AllReduce","coll_msg_size_bytes":1,"coll_exec_time_us":1}}',
        '{"coll_perf":' * 3000 + "1" + "}" * 3000,
        "no record here",  # no needle: not even handed over
    ]
    write(folder(root) / "evil-pid1.log", "\n".join([*bad, record(1)]) + "\n")
    c.step()
    assert sum(v[0] for v in totals(c).values()) == 1
    skipped = dict(c._snapshot.skipped)
    assert skipped["malformed"] == 2 and skipped["unknown_collective"] == 1 and skipped["invalid_value"] == 1
    assert skipped["tail_long_line"] == 2  # both long lines were cut (and then did not parse)


def test_caps_bound_the_series(tmp_path: Path) -> None:
    root = tmp_path / "inspector"
    pods = Pods({(NS, f"p{i}"): ("j", "Job") for i in range(5)})
    for i in range(5):
        folder(root, pod=f"p{i}").mkdir(parents=True)
    c = collector(root, pods=pods, limits=InspectorCollectorLimits(max_pods=3, max_series=4))
    c.step()
    for i in range(5):
        write(folder(root, pod=f"p{i}") / "x-pid1.log", record(1) + "\n" + record(2, size=1 << 30) + "\n")
    c.step()
    assert len(c._snapshot.series) == 4
    assert c._snapshot.pods == 3
    skipped = dict(c._snapshot.skipped)
    assert skipped["pod_cap"] == 4 and skipped["series_cap"] == 2


def test_a_pods_series_go_after_the_grace_period(tmp_path: Path) -> None:
    root = tmp_path / "inspector"
    clock = ManualClock()
    pods = Pods()
    folder(root).mkdir(parents=True)
    c = collector(root, pods=pods, clock=clock, grace_seconds=60)
    c.step()
    write(folder(root) / "x-pid1.log", record(1) + "\n")
    c.step()
    assert totals(c)
    shutil.rmtree(folder(root))
    del pods.jobs[(NS, POD)]
    c.step()
    clock.now += 59
    c.step()
    assert totals(c)  # kept through the grace period (with the job it had)
    clock.now += 2
    c.step()
    assert totals(c) == {}


# ---- .prom files ----------------------------------------------------------------------------


def prom_text(mean_us: int, size: int = 512 << 20) -> str:
    """A v5.1 bucket of one all-reduce of ``size`` bytes on 16 ranks in ``mean_us``."""
    labels = (
        f'version="v5.1",slurm_job_id="unknown",node="{POD}",gpu="GPU0",comm_name="DP",n_nodes="2",'
        f'nranks="16",collective="AllReduce",message_size="{size_range(size)}",algo_proto="Ring_Simple"'
    )
    busbw = plugin_bandwidths("AllReduce", size, mean_us, 16)[1]
    return "\n".join(prom_bucket_lines(labels, [mean_us], [busbw])) + "\n"


def set_mtime(path: Path, when: float) -> None:
    os.utime(path, (when, when))


def test_each_prom_version_is_counted_once_and_only_when_complete(tmp_path: Path) -> None:
    root = tmp_path / "inspector"
    prom = folder(root) / "nccl_inspector_metrics_a1b2.prom"
    clock = ManualClock()
    write(prom, prom_text(3000))
    set_mtime(prom, clock.now - 100)
    c = collector(root, clock=clock)
    c.step()  # there at the first start: may have been counted before a restart
    assert totals(c) == {}

    write(prom, prom_text(3100), mode="w")  # the next dump interval
    set_mtime(prom, clock.now - 0.2)  # being written: not yet
    c.step()
    assert totals(c) == {}
    clock.now += 2
    for _ in range(3):  # seen by three polls, counted once
        c.step()
    key = (NS, POD, "llama", "PyTorchJob", "all_reduce", "inter_node", "100MB_1GB")
    ops, seconds, bus = totals(c)[key]
    assert (ops, seconds) == (1, pytest.approx(0.0031))
    assert bus / seconds == pytest.approx((512 << 20) * 1.875 / 0.0031, rel=1e-5)

    # A version cut short (its first bucket whole, the second without its last line's end) waits
    # for the rest: read then, its first bucket would be counted twice.
    two_buckets = prom_text(3200) + prom_text(90, size=4 << 20)
    write(prom, two_buckets[:-3], mode="w")
    set_mtime(prom, clock.now - 5)
    c.step()
    assert totals(c)[key][0] == 1
    write(prom, two_buckets, mode="w")
    set_mtime(prom, clock.now - 4)
    c.step()
    assert totals(c)[key][0] == 2
    # Deleted at teardown: nothing is taken back.
    prom.unlink()
    c.step()
    assert totals(c)[key][0] == 2


def test_prom_files_that_are_too_large_or_too_many_are_skipped_and_counted(tmp_path: Path) -> None:
    root = tmp_path / "inspector"
    clock = ManualClock()
    folder(root).mkdir(parents=True)
    limits = InspectorLimits(max_prom_bytes=4096, max_prom_files=2)
    source = InspectorSource(root, None, limits, clock=clock)
    c = InspectorCollector(source, Pods(), clock=clock)
    c.step()
    huge = folder(root) / "nccl_inspector_metrics_0.prom"
    write(huge, prom_text(3000) * 100)
    for name in ("1", "2"):
        write(folder(root) / f"nccl_inspector_metrics_{name}.prom", prom_text(3000))
    for path in folder(root).iterdir():
        set_mtime(path, clock.now - 10)
    c.step()
    c.step()
    skipped = dict(c._snapshot.skipped)
    assert skipped["prom_too_large"] == 1 and skipped["prom_file_cap"] == 1
    assert sum(v[0] for v in totals(c).values()) == 1  # file "1" only; "2" is over the cap


def test_symlinked_prom_files_and_folders_of_other_pods_are_not_read(tmp_path: Path) -> None:
    root = tmp_path / "inspector"
    clock = ManualClock()
    secret = tmp_path / "secret.prom"
    write(secret, prom_text(3000))
    folder(root).mkdir(parents=True)
    folder(root, pod="not-here").mkdir(parents=True)
    pods = Pods()
    source = InspectorSource(
        root, None, clock=clock, pod_known=lambda ns, pod, uid="": pods.lookup(ns, pod) is not None
    )
    c = InspectorCollector(source, pods, clock=clock)
    c.step()
    (folder(root) / "nccl_inspector_metrics_x.prom").symlink_to(secret)
    write(folder(root, pod="not-here") / "nccl_inspector_metrics_y.prom", prom_text(3000))
    write(folder(root, pod="not-here") / "x-pid1.log", record(1) + "\n")
    set_mtime(folder(root, pod="not-here") / "nccl_inspector_metrics_y.prom", clock.now - 10)
    c.step()
    assert totals(c) == {}
    skipped = dict(c._snapshot.skipped)
    assert skipped["prom_symlink"] == 1 and skipped["prom_pod_not_on_node"] == 1
    assert skipped["tail_pod_not_on_node"] == 1


def test_only_a_folder_naming_the_pods_uid_speaks_for_it(tmp_path: Path) -> None:
    """A neighbour that can write the whole hostPath forges ``<ns>_<pod>`` or a wrong UID for a
    pod of the node: neither is counted for that pod, both are counted as skipped with a reason;
    the pod's own folder (with its UID, as the downward API gives it) is."""
    root = tmp_path / "inspector"
    clock = ManualClock()
    pods = Pods()
    source = InspectorSource(root, None, clock=clock, pod_known=pod_known_on_node(pods))
    c = InspectorCollector(source, pods, clock=clock)
    c.step()
    for uid in ("", OTHER_UID, UID):
        write(folder(root, uid=uid) / "x-pid1.log", record(1) + "\n")
        prom = folder(root, uid=uid) / "nccl_inspector_metrics_a1.prom"
        write(prom, prom_text(3000))
        set_mtime(prom, clock.now - 10)
    c.step()
    ops = {key[4:]: value[0] for key, value in totals(c).items() if key[:2] == (NS, POD)}
    assert ops == {("all_reduce", "inter_node", "100MB_1GB"): 2}  # its own record and bucket, no forged one
    skipped = dict(c._snapshot.skipped)
    assert skipped["tail_pod_uid_missing"] == skipped["prom_pod_uid_missing"] == 1
    assert skipped["tail_pod_uid_mismatch"] == skipped["prom_pod_uid_mismatch"] == 1


def test_files_written_straight_into_the_root_are_counted_and_never_credited(tmp_path: Path) -> None:
    """NVIDIA's flat NCCL_INSPECTOR_DUMP_DIR on the host: a file there names a pod only by its
    hostname, which any writer of the folder picks (here the node's own pod's name). Not read,
    not credited, counted while it is there; the pod's own folder is read as before."""
    root = tmp_path / "inspector"
    clock = ManualClock()
    pods = Pods()
    source = InspectorSource(root, None, clock=clock, pod_known=pod_known_on_node(pods))
    c = InspectorCollector(source, pods, clock=clock)
    folder(root).mkdir(parents=True)
    c.step()
    write(root / f"{POD}-pid41.log", record(1, micros=90_000) + "\n")
    write(root / "nccl_inspector_metrics_3f9a1c2e-4b5d-6e7f-8091-a2b3c4d5e6f7.prom", prom_text(90_000))
    set_mtime(root / "nccl_inspector_metrics_3f9a1c2e-4b5d-6e7f-8091-a2b3c4d5e6f7.prom", clock.now - 10)
    write(root / "nccl-inspector-unknown-jobid" / "x-pid1.log", record(1) + "\n")  # the plugin's default folder
    write(root / "notes.txt", "x")
    write(folder(root) / f"{POD}-pid42.log", record(1) + "\n")
    c.step()
    assert {key[4:]: value[:2] for key, value in totals(c).items()} == {
        ("all_reduce", "inter_node", "100MB_1GB"): (1, 0.0015)
    }
    assert dict(c._snapshot.unattributed) == {"flat_layout": 2, "not_a_pod_folder": 2}
    found = samples(scrape_collectors(c))
    assert found[("ccl_nccl_inspector_unattributed_files", (("reason", "flat_layout"),))] == 2
    (root / f"{POD}-pid41.log").unlink()
    c.step()
    assert dict(c._snapshot.unattributed)["flat_layout"] == 1  # a gauge: what is there now


def test_prom_fixture_versions_count_their_operations(tmp_path: Path) -> None:
    root = tmp_path / "inspector"
    clock = ManualClock()
    folder(root).mkdir(parents=True)
    c = collector(root, clock=clock)
    c.step()
    for fixture in FIXTURES.glob("*.prom"):
        shutil.copy(fixture, folder(root) / fixture.name)
        set_mtime(folder(root) / fixture.name, clock.now - 10)
    c.step()
    got = {key[4:]: value for key, value in totals(c).items()}
    # v1: one all_reduce (1 GiB) and one all_gather (16 x 32 MiB); v5.1: one bucket each
    assert got[("all_reduce", "inter_node", "ge_1GB")][0] == 2
    assert got[("all_gather", "inter_node", "100MB_1GB")][0] == 1
    assert got[("reduce_scatter", "inter_node", "ge_1GB")][0] == 1
    assert got[("send", "inter_node", "10MB_100MB")][0] == 1
    reduce = got[("all_reduce", "inter_node", "ge_1GB")]
    assert reduce[2] == pytest.approx(207.553e9 * 0.0097 + 206.534e9 * 0.039)


# ---- exposition -------------------------------------------------------------------------------


def test_exposition_passes_promtool_and_names_every_family(tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    root = tmp_path / "inspector"
    folder(root).mkdir(parents=True)
    c = collector(root)
    c.step()
    write(folder(root) / "x-pid1.log", record(1) + "\n" + '{"coll_perf":bad\n')
    c.step()
    text = scrape_collectors(c)
    result = promtool_check_metrics(promtool, text)
    assert result.returncode == 0 and result.stdout == "" and result.stderr == "", result.stdout + result.stderr
    found = samples(text)
    labels = (
        ("collective", "all_reduce"),
        ("job_kind", "PyTorchJob"),
        ("job_name", "llama"),
        ("namespace", NS),
        ("pod", POD),
        ("scope", "inter_node"),
        ("size_class", "100MB_1GB"),
    )
    assert found[("ccl_nccl_collective_operations_total", labels)] == 1
    assert found[("ccl_nccl_collective_seconds_total", labels)] == pytest.approx(0.0015)
    assert found[("ccl_nccl_collective_bus_bytes_total", labels)] == pytest.approx((256 << 20) * 1.875)
    assert found[("ccl_nccl_inspector_records_total", (("format", "json"),))] == 1
    assert found[("ccl_nccl_inspector_skipped_total", (("reason", "malformed"),))] == 1
    assert found[("ccl_exporter_collector_success", (("collector", "inspector"),))] == 1


def test_no_inspector_folder_is_reported_unavailable(tmp_path: Path) -> None:
    c = collector(tmp_path / "absent")
    c.step()
    found = samples(scrape_collectors(c))
    assert found[("ccl_exporter_collector_success", (("collector", "inspector"),))] == 0


def test_bus_bytes_of_point_to_point_and_reduce_use_factor_one() -> None:
    for name in ("Send", "Recv", "Reduce", "Broadcast"):
        op = parse_json_record(record(1, name, 8 << 20, 100, nranks=8))
        assert not isinstance(op, str)
        assert bus_bytes(op) == 8 << 20


def test_the_simulated_node_shows_each_jobs_bus_bandwidth_by_its_network(tmp_path: Path) -> None:
    """The simulated node's jobs: llama-70b on IB near 355 GB/s, bert-finetune on Socket near
    9 GB/s (JSON Lines per rank), resnet-eval from its rewritten .prom file."""
    from ccl_sim.node import default_node
    from ccl_sim.resources import simulated_node_resources
    from exporter.collectors import inspector as inspector_collector

    node = default_node(tmp_path / "sim")
    node.setup()
    try:
        resources = simulated_node_resources(node)
        c = inspector_collector.build_collector(inspector_collector.InspectorSettings(300.0), resources)
        c.step()
        for _ in range(12):
            node.advance(1.0)
            c.step()
        for path in node.paths.nccl_inspector.rglob("*.prom"):  # settled: read at the next poll
            set_mtime(path, path.stat().st_mtime - 2)
        c.step()
    finally:
        node.close()
    busbw: dict[tuple[str, str], float] = {}
    for (_namespace, _pod, job, _kind, collective, scope, size), (_ops, seconds, bus) in totals(c).items():
        if collective == "all_reduce" and size in ("100MB_1GB", "ge_1GB"):
            busbw[(job, scope)] = bus / seconds
    assert busbw[("llama-70b", "inter_node")] == pytest.approx(355e9, rel=0.05)
    assert busbw[("bert-finetune", "inter_node")] == pytest.approx(9e9, rel=0.05)
    assert busbw[("resnet-eval", "intra_node")] == pytest.approx(480e9, rel=0.05)

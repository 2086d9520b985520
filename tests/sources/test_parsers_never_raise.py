"""Every reader of bytes a tenant controls returns a record or a typed skip, never an exception:
one property-based test per parser, with raw bytes (invalid UTF-8 included) and with valid
documents that have parts swapped for hostile values (``tests/hostile_inputs.py``)."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from exporter.collectors.inspector import InspectorCollector, bus_bytes
from exporter.nccl import LogAnalyzer
from exporter.nccl.inspector import SKIP_REASONS, Operation, parse_json_record, parse_prom
from exporter.results.probe_file import MalformedResult, ProbeResult, parse_result
from exporter.sources.inspector import InspectorSource
from exporter.sources.kube import PodMetadata, pod_metadata_from_object
from exporter.sources.kubelet_stats import KubeletStatsError, PodNetworks, pod_networks, summary_from_bytes
from exporter.sources.multus import NETWORK_STATUS_ANNOTATION, AttachedDevice, attached_devices
from exporter.sources.podlogs import TailLimits, TailStats, extract_lines
from exporter.sources.podlogs.cri import CriJoiner
from exporter.sources.podresources import listing_from_response
from exporter.sources.podresources_v1 import api_pb2
from exporter.sources.probe_results import read_probe_results
from tests.clocks import ManualClock
from tests.hostile_inputs import (
    NUMBER_TEXTS,
    deep_json,
    dumps,
    invalid_utf8,
    json_values,
    mutated,
    number_texts,
)
from tests.nccl.conftest import FIXTURES as NCCL_FIXTURES

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
INSPECTOR = Path(__file__).resolve().parents[1] / "fixtures" / "inspector"
UID = "8d3b1c2a-0000-4000-8000-00000000000a"


def _digits_swapped(line: str, replacements: list[str]) -> str:
    """``line`` with its runs of digits replaced, in order, by ``replacements`` (cycled)."""
    if not replacements:
        return line
    count = iter(range(1_000_000))
    return re.sub(r"\d+", lambda _: replacements[next(count) % len(replacements)], line)


def _finite_operation(operation: Operation) -> None:
    assert operation.nranks >= 1
    assert math.isfinite(operation.seconds) and operation.seconds > 0
    assert operation.size_bytes >= 0
    assert operation.stated_bus_bandwidth is None or math.isfinite(operation.stated_bus_bandwidth)
    assert math.isfinite(bus_bytes(operation))


# ---- CRI records (pod logs) --------------------------------------------------------------------

cri_lines = st.builds(
    lambda stamp, stream, tag, message: b"%s %s %s %s" % (stamp, stream, tag, message),
    st.sampled_from([b"2026-03-01T10:00:00.123456789Z", b"2026-03-01T10:00:00Z", b"\xd9\xa3\xd9\xa3-01-01T", b""]),
    st.sampled_from([b"stdout", b"stderr", b"stdin", b"\xff"]),
    st.sampled_from([b"F", b"P", b"P:x", b"F:", b"X", b"\xc3\x28"]),
    st.one_of(st.binary(max_size=120), invalid_utf8, st.just(b"h:1:1 [0] NCCL INFO Using network Socket")),
)


@FUZZ
@given(st.lists(st.one_of(cri_lines, st.binary(max_size=200), invalid_utf8), max_size=30))
def test_cri_records_are_a_line_or_a_skip(lines: list[bytes]) -> None:
    joiner: CriJoiner[bytes] = CriJoiner(max_chars=64)
    for line in lines:
        joined = joiner.read(line.rstrip(b"\r\n"))
        if joined is not None:
            whole, dropped, cut = joined
            assert whole is None or (isinstance(whole, bytes) and len(whole) <= 64)
            assert dropped >= 0 and isinstance(cut, bool)
    assert all(isinstance(line, bytes) for line in joiner.flush())
    text_joiner: CriJoiner[str] = CriJoiner(max_chars=64)
    for line in lines:
        fed = text_joiner.feed(line.decode("utf-8", "replace"))
        assert fed is None or isinstance(fed, str)
    block = b"\n".join(lines) + b"\n"
    stats = TailStats()
    extracted = extract_lines(block, True, CriJoiner(64), TailLimits(max_line_bytes=64), stats)
    assert all(isinstance(line, str) and "NCCL" in line for line in extracted)


# ---- NCCL lines ---------------------------------------------------------------------------------

REAL_LINES = [line for path in sorted(NCCL_FIXTURES.glob("*.log")) for line in path.read_text().splitlines()]
nccl_lines = st.one_of(
    st.builds(_digits_swapped, st.sampled_from(REAL_LINES), st.lists(number_texts, min_size=1, max_size=4)),
    st.builds(
        lambda line, cut, junk: line[:cut] + junk,
        st.sampled_from(REAL_LINES),
        st.integers(0, 200),
        st.sampled_from(NUMBER_TEXTS),
    ),
    invalid_utf8.map(lambda b: b.decode("utf-8", "replace")),
    st.sampled_from(REAL_LINES),
)


@FUZZ
@given(st.lists(nccl_lines, max_size=40))
@example(["h:1:1 [٣] NCCL INFO comm 0x1 rank ² nRanks 1e400 nNodes " + "9" * 400 + " localRanks ١ localRank 0"])  # noqa: RUF001 - look-alike digits on purpose
def test_nccl_lines_are_a_verdict_never_an_internal_error(lines: list[str]) -> None:
    analyzer = LogAnalyzer()
    for line in lines:
        analyzer.feed(line)
    verdict = analyzer.result()
    assert verdict.verdict in {"rdma", "tcp_fallback", "single_node", "unknown"}
    json.dumps(verdict.to_json())
    assert "internal_errors" not in analyzer.overflow


# ---- NCCL Inspector: JSON Lines and .prom -------------------------------------------------------

JSON_RECORDS = [json.loads(line) for line in (INSPECTOR / "nccl-2.30-json.log").read_text().splitlines()]


@FUZZ
@given(
    st.one_of(
        st.sampled_from(JSON_RECORDS).flatmap(mutated).map(dumps),
        json_values.map(dumps),
        deep_json,
        invalid_utf8.map(lambda b: b.decode("utf-8", "replace")),
    )
)
@example(
    '{"header":{"n_ranks":8,"nnodes":1},"coll_perf":{"coll":"AllReduce","coll_msg_size_bytes":'
    + "1" * 400
    + ',"coll_exec_time_us":1e400,"coll_busbw_gbs":NaN}}'
)
@example(
    '{"header":{"n_ranks":8,"nnodes":1},"coll_perf":{"coll":"AllReduce","coll_msg_size_bytes":1,'
    '"coll_exec_time_us":' + "1" * 400 + "}}"
)
def test_inspector_json_records_are_an_operation_or_a_reason(line: str) -> None:
    parsed = parse_json_record(line)
    if isinstance(parsed, str):
        assert parsed in SKIP_REASONS
    else:
        _finite_operation(parsed)


PROM_LINES = [
    line
    for name in ("nccl_inspector_metrics_v1-2.29.prom", "nccl_inspector_metrics_v5.1-2.30.prom")
    for line in (INSPECTOR / name).read_text().splitlines()
]
prom_texts = st.one_of(
    st.lists(
        st.builds(_digits_swapped, st.sampled_from(PROM_LINES), st.lists(number_texts, min_size=1, max_size=3)),
        min_size=1,
        max_size=12,
    ).map(lambda lines: "\n".join(lines) + "\n"),
    st.lists(st.sampled_from(PROM_LINES), max_size=8).map("\n".join),
    invalid_utf8.map(lambda b: b.decode("utf-8", "replace")),
)


@FUZZ
@given(prom_texts)
@example(
    'nccl_bus_bandwidth_gbs{nranks="2",n_nodes="1",collective="AllReduce",message_size="'
    + "1" * 400
    + 'GB",version="v5.1"} 1\nnccl_collective_exec_time_microseconds{nranks="2",n_nodes="1",collective='
    '"AllReduce",message_size="' + "1" * 400 + 'GB",version="v5.1"} 1\n'
)
@example(
    'nccl_bus_bandwidth_gbs{nranks="²",collective="AllReduce",message_size="1GB"} 1\n'
    'nccl_collective_exec_time_microseconds{nranks="²",collective="AllReduce",message_size="1GB"} 1\n'
)
@example(
    'nccl_bus_bandwidth_gbs{nranks="٣",n_nodes="١",collective="AllReduce",message_size="٣-٤GB"} ٣\n'  # noqa: RUF001 - look-alike digits on purpose
    'nccl_collective_exec_time_microseconds{nranks="٣",n_nodes="١",collective="AllReduce",message_size="٣-٤GB"} ٣\n'  # noqa: RUF001 - look-alike digits on purpose
)
def test_inspector_prom_files_are_operations_and_reasons(text: str) -> None:
    parsed = parse_prom(text)
    assert set(parsed.skipped) <= set(SKIP_REASONS)
    for operation in parsed.operations:
        _finite_operation(operation)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    prom=st.one_of(prom_texts.map(str.encode), invalid_utf8),
    log=st.lists(st.one_of(invalid_utf8, json_values.map(lambda v: dumps(v).encode())), max_size=5),
)
@example(
    prom=(
        'nccl_bus_bandwidth_gbs{nranks="2",n_nodes="1",collective="AllReduce",message_size="'
        + "1" * 400
        + 'GB"} 1\nnccl_collective_exec_time_microseconds{nranks="2",n_nodes="1",collective="AllReduce",'
        'message_size="' + "1" * 400 + 'GB"} 1'
    ).encode(),
    log=[],
)
@example(
    prom=(
        'nccl_bus_bandwidth_gbs{nranks="²",collective="AllReduce",message_size="1GB"} 1\n'
        'nccl_collective_exec_time_microseconds{nranks="²",collective="AllReduce",message_size="1GB"} 1'
    ).encode(),
    log=[],
)
def test_the_inspector_collector_survives_any_file(
    tmp_path_factory: pytest.TempPathFactory, prom: bytes, log: list[bytes]
) -> None:
    """The files as the collector reads them: a .prom and a JSON Lines file of any bytes, through
    the source and the collector's arithmetic (the step that once crash-restarted the collector)."""
    root = tmp_path_factory.mktemp("inspector")
    folder = root / f"team-a_gpt-0_{UID}"
    folder.mkdir()
    clock = ManualClock()
    source = InspectorSource(root, clock=clock)
    collector = InspectorCollector(source, clock=clock)
    collector.step()  # what is there at the first poll is taken as counted
    prom_file = folder / "nccl_inspector_metrics_0a1b.prom"
    prom_file.write_bytes(prom + b"\n")
    (folder / "host-pid1.log").write_bytes(b"".join(line.replace(b"\n", b" ") + b' "_perf"\n' for line in log))
    os.utime(prom_file, (clock.now - 10, clock.now - 10))  # settled: read at this poll
    snapshot = collector.step()
    assert source.stats.read_bytes["prom"] == len(prom) + 1  # the .prom file was read (and parsed)
    assert all(math.isfinite(value) for row in snapshot.series for value in row[-3:])
    list(collector.collect())


# ---- Multus network-status annotation -----------------------------------------------------------

MULTUS = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "multus_network_status.json").read_text())


@FUZZ
@given(
    st.one_of(
        mutated(MULTUS).map(dumps),
        json_values.map(dumps),
        json_values,
        deep_json,
        invalid_utf8.map(lambda b: b.decode("utf-8", "replace")),
    )
)
def test_multus_annotations_are_devices_or_nothing(value: Any) -> None:
    found = attached_devices({NETWORK_STATUS_ANNOTATION: value})
    assert isinstance(found, tuple)
    for device in found:
        assert isinstance(device, AttachedDevice)
        assert isinstance(device.network, str) and isinstance(device.interface, str)
        assert device.pci_address is None or isinstance(device.pci_address, str)
        assert device.rdma_device is None or isinstance(device.rdma_device, str)


# ---- kubelet Summary API ------------------------------------------------------------------------

SUMMARY = {
    "node": {"nodeName": "gpu-node-7", "network": {}},
    "pods": [
        {
            "podRef": {"name": "gpt-0", "namespace": "team-a", "uid": UID},
            "network": {
                "name": "eth0",
                "rxBytes": 10,
                "txBytes": 20,
                "interfaces": [
                    {"name": "eth0", "rxBytes": 10, "txBytes": 20},
                    {"name": "net1", "rxBytes": 5, "txBytes": 6},
                ],
            },
        }
    ],
}


@FUZZ
@given(
    st.one_of(
        mutated(SUMMARY).map(lambda d: dumps(d).encode()),
        json_values.map(lambda v: dumps(v).encode()),
        deep_json.map(str.encode),
        invalid_utf8,
    )
)
def test_kubelet_summaries_are_pod_networks_or_a_typed_error(body: bytes) -> None:
    try:
        networks = summary_from_bytes(body, "https://kubelet:10250/stats/summary")
    except KubeletStatsError:
        return
    assert isinstance(networks, PodNetworks)
    assert networks.malformed >= 0
    for pod in networks.pods:
        assert pod.transmit_bytes >= 0 and pod.receive_bytes >= 0


def test_a_summary_that_is_not_an_object_is_a_typed_error() -> None:
    with pytest.raises(KubeletStatsError):
        pod_networks([])


# ---- kubelet pod-resources ----------------------------------------------------------------------

names = st.one_of(st.text(max_size=30), st.text(min_size=300, max_size=600), number_texts)


@st.composite
def pod_resources_responses(draw: Any) -> api_pb2.ListPodResourcesResponse:
    response = api_pb2.ListPodResourcesResponse()
    for _ in range(draw(st.integers(0, 3))):
        pod = response.pod_resources.add(name=draw(names), namespace=draw(names))
        for _ in range(draw(st.integers(0, 3))):
            container = pod.containers.add(name=draw(names))
            for _ in range(draw(st.integers(0, 2))):
                container.devices.add(
                    resource_name=draw(st.one_of(names, st.just("nvidia.com/gpu"))),
                    device_ids=draw(st.lists(names, max_size=3)),
                )
            for _ in range(draw(st.integers(0, 2))):
                claim = container.dynamic_resources.add(claim_name=draw(names), claim_namespace=draw(names))
                resource = claim.claim_resources.add(
                    driver_name=draw(st.one_of(names, st.just("gpu.nvidia.com"))),
                    pool_name=draw(names),
                    device_name=draw(names),
                )
                for _ in range(draw(st.integers(0, 10))):
                    resource.cdi_devices.add(name=draw(names))
    return response


def _decoded(data: bytes) -> api_pb2.ListPodResourcesResponse:
    response = api_pb2.ListPodResourcesResponse()
    try:
        response.ParseFromString(data)
    except Exception:  # noqa: BLE001 - what gRPC would refuse before the exporter sees it
        response = api_pb2.ListPodResourcesResponse()
    return response


@FUZZ
@given(st.one_of(pod_resources_responses(), st.binary(max_size=300).map(_decoded)))
def test_pod_resources_answers_are_assignments(response: api_pb2.ListPodResourcesResponse) -> None:
    listing = listing_from_response(response)
    for assignment in (*listing.gpus, *listing.devices, *listing.dynamic):
        assert all(len(value) <= 253 for value in (assignment.namespace, assignment.pod, assignment.container))
    assert all(len(d.cdi_devices) <= 8 for d in listing.dynamic)


# ---- probe and pre-flight result files ----------------------------------------------------------

RESULT = json.loads(
    ProbeResult(
        source="preflight", started_at=1.0, finished_at=2.0, namespace="team-a", pod="gpt-0", pod_uid=UID
    ).to_json()
)
RESULT["collectives"] = [
    {
        "collective": "all_reduce",
        "error": None,
        "rows": [
            {
                "size_bytes": 1,
                "count": 1,
                "type": "float",
                "time_seconds": 1.0,
                "algbw_bytes_per_second": 1.0,
                "busbw_bytes_per_second": 1.0,
                "wrong": 0,
            }
        ],
    }
]
RESULT["checks"] = [{"check": "port_state", "ok": True, "message": "ok"}]


@FUZZ
@given(
    st.one_of(
        mutated(RESULT).map(dumps),
        json_values.map(dumps),
        deep_json,
        invalid_utf8.map(lambda b: b.decode("utf-8", "replace")),
    )
)
@example(dumps({**RESULT, "finished_at": 10**400}))
@example(
    dumps(
        {
            **RESULT,
            "collectives": [
                {
                    **RESULT["collectives"][0],
                    "rows": [{**RESULT["collectives"][0]["rows"][0], "time_seconds": -(10**400)}],
                }
            ],
        }
    )
)
def test_result_files_are_a_result_or_malformed(text: str) -> None:
    try:
        result = parse_result(text)
    except MalformedResult:
        return
    assert isinstance(result, ProbeResult)
    assert math.isfinite(result.started_at) and math.isfinite(result.finished_at)
    for collective in result.collectives:
        for row in collective.rows:
            assert all(
                math.isfinite(value)
                for value in (row.time_seconds, row.busbw_bytes_per_second, row.algbw_bytes_per_second)
            )


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.one_of(invalid_utf8, mutated(RESULT).map(lambda d: dumps(d).encode())), min_size=1, max_size=4))
def test_the_results_folder_reader_survives_any_file(
    tmp_path_factory: pytest.TempPathFactory, files: list[bytes]
) -> None:
    folder = tmp_path_factory.mktemp("results")
    for index, data in enumerate(files):
        (folder / f"preflight-{index}.json").write_bytes(data)
    reading = read_probe_results(folder, 3.0, 86_400)
    assert len(reading.results) + len(reading.malformed) + len(reading.stale) + len(reading.unattributed) == len(files)


# ---- pods of the node (labels and annotations are the tenant's) --------------------------------

POD = {
    "metadata": {
        "namespace": "team-a",
        "name": "gpt-0",
        "uid": UID,
        "labels": {"training.kubeflow.org/job-name": "gpt", "ccl-health.io/expected-network": "IB"},
        "annotations": {NETWORK_STATUS_ANNOTATION: dumps(MULTUS)},
        "ownerReferences": [{"kind": "PyTorchJob", "name": "gpt", "controller": True}],
    },
    "spec": {"hostNetwork": False, "readinessGates": [{"conditionType": "ccl-health.io/fabric-ready"}]},
    "status": {"conditions": [{"type": "ccl-health.io/fabric-ready", "status": "True"}]},
}


@FUZZ
@given(mutated(POD))
def test_pod_objects_are_metadata_or_nothing(pod: Any) -> None:
    record = pod_metadata_from_object(pod)
    assert record is None or isinstance(record, PodMetadata)
    if record is not None:
        assert all(
            isinstance(value, str)
            for value in (
                record.namespace,
                record.name,
                record.uid,
                record.job_name,
                record.job_kind,
                record.expected_network,
            )
        )

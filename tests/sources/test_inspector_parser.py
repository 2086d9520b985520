"""The NCCL Inspector's records, parsed (``exporter.nccl.inspector``): every format version of
the plugin's history, the nccl-tests size and class of each operation, and hostile input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from exporter.nccl import inspector
from exporter.nccl.inspector import Operation, parse_json_record, parse_prom, size_class
from exporter.probe.formulas import busbw_factor

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "inspector"


def json_operations(name: str) -> list[Operation]:
    out = []
    for line in (FIXTURES / name).read_text().splitlines():
        parsed = parse_json_record(line)
        assert isinstance(parsed, Operation), (parsed, line)
        out.append(parsed)
    return out


def bus_bytes(op: Operation) -> float:
    return op.size_bytes * busbw_factor(
        op.collective if op.collective not in ("send", "recv", "reduce") else "broadcast", op.nranks
    )


@pytest.mark.parametrize("name", ["nccl-2.28-json.log", "nccl-2.30-json.log"])
def test_json_records_of_every_version_give_the_plugins_own_bus_bandwidth(name: str) -> None:
    operations = json_operations(name)
    assert operations
    for op in operations:
        assert op.stated_bus_bandwidth is not None
        assert bus_bytes(op) / op.seconds == pytest.approx(op.stated_bus_bandwidth, rel=1e-5)


def test_json_record_fields() -> None:
    first, *_, gather = json_operations("nccl-2.28-json.log")[:3]
    assert (first.collective, first.nranks, first.nnodes, first.scope) == ("all_reduce", 16, 2, "inter_node")
    assert (first.size_bytes, first.seconds, first.size_class) == (1 << 30, 0.0096, "ge_1GB")
    # AllGather: 64 MiB per rank, the nccl-tests size is the gathered buffer of 16 ranks
    assert (gather.collective, gather.size_bytes) == ("all_gather", 16 * (64 << 20))
    newer = json_operations("nccl-2.30-json.log")
    assert [op.collective for op in newer] == ["all_reduce", "all_reduce", "broadcast", "all_gather", "send", "recv"]
    assert {op.scope for op in newer} == {"intra_node"}


def test_prom_version_1_has_one_operation_per_sampled_collective() -> None:
    parsed = parse_prom((FIXTURES / "nccl_inspector_metrics_v1-2.29.prom").read_text())
    assert parsed.skipped == {}
    assert parsed.version == "v1"
    by_name = {op.collective: op for op in parsed.operations}
    assert set(by_name) == {"all_reduce", "all_gather"}
    reduce = by_name["all_reduce"]
    assert (reduce.seconds, reduce.scope, reduce.mean) == (0.0097, "inter_node", False)
    # The size its algorithm bandwidth and time give back (%.6g each), within "1.00GB"
    assert reduce.size_bytes == pytest.approx(1 << 30, rel=1e-5)
    assert reduce.stated_bus_bandwidth == pytest.approx(207.553e9)
    assert by_name["all_gather"].size_bytes == pytest.approx(16 * (32 << 20), rel=1e-5)


def test_prom_version_5_1_buckets_are_interval_means() -> None:
    parsed = parse_prom((FIXTURES / "nccl_inspector_metrics_v5.1-2.30.prom").read_text())
    assert parsed.version == "v5.1"
    assert parsed.skipped == {}
    ops = sorted(parsed.operations, key=lambda op: op.collective)
    assert [op.collective for op in ops] == ["all_reduce", "reduce_scatter", "send"]
    assert all(op.mean for op in ops)
    # The size the bucket's bandwidth and mean time give back, inside "4-5GB"
    assert ops[0].size_bytes == round(206.534e9 * 0.039 / 1.875)
    assert 4 << 30 <= ops[0].size_bytes < 5 << 30
    assert ops[0].seconds == pytest.approx(0.039)
    assert ops[0].stated_bus_bandwidth == pytest.approx(206.534e9)
    assert 16 * (128 << 20) <= ops[1].size_bytes < 16 * (129 << 20)


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        (0, "lt_1MB"),
        (999_999, "lt_1MB"),
        (1_000_000, "1MB_10MB"),
        (25 << 20, "10MB_100MB"),
        (10**8, "100MB_1GB"),
        (10**9, "ge_1GB"),
        (1 << 50, "ge_1GB"),
    ],
)
def test_size_classes(size: int, expected: str) -> None:
    assert size_class(size) == expected


RECORD = json.loads((FIXTURES / "nccl-2.30-json.log").read_text().splitlines()[1])


def variant(path: tuple[str, str], value: object) -> str:
    record = json.loads(json.dumps(RECORD))
    if value is KeyError:
        del record[path[0]][path[1]]
    else:
        record[path[0]][path[1]] = value
    return json.dumps(record)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("", inspector.MALFORMED),
        ("{" * 5000 + "}" * 5000, inspector.MALFORMED),
        ("[" * 100_000, inspector.MALFORMED),
        ('{"header":{"id":"0x1"}', inspector.MALFORMED),
        ("[1, 2]", inspector.MALFORMED),
        ('{"header":{}, "metadata":{}}', inspector.NOT_A_RECORD),
        (variant(("coll_perf", "coll_exec_time_us"), -5), inspector.INVALID_VALUE),
        (variant(("coll_perf", "coll_exec_time_us"), "9"), inspector.INVALID_VALUE),
        (variant(("coll_perf", "coll_exec_time_us"), 0), inspector.NO_TIME),
        (variant(("coll_perf", "coll_msg_size_bytes"), 1 << 60), inspector.INVALID_VALUE),
        (variant(("coll_perf", "coll_msg_size_bytes"), 1.5), inspector.INVALID_VALUE),
        (variant(("coll_perf", "coll_msg_size_bytes"), True), inspector.INVALID_VALUE),
        (variant(("header", "n_ranks"), 0), inspector.INVALID_VALUE),
        (variant(("header", "n_ranks"), KeyError), inspector.INVALID_VALUE),
        (variant(("header", "nnodes"), -1), inspector.INVALID_VALUE),
        (variant(("coll_perf", "coll"), "Invalid"), inspector.UNKNOWN_COLLECTIVE),
        (variant(("coll_perf", "coll"), ["AllReduce"]), inspector.INVALID_VALUE),
        (variant(("coll_perf", "coll_exec_time_us"), math.inf).replace("Infinity", "inf"), inspector.MALFORMED),
    ],
)
def test_bad_json_records_are_skipped_with_a_reason(line: str, reason: str) -> None:
    assert parse_json_record(line) == reason


@pytest.mark.parametrize(
    ("path", "timing", "expected"),
    [
        (("coll_perf", "coll_timing_source"), "kernel_gpu", None),
        (("coll_perf", "coll_timing_source"), KeyError, None),  # before the field: taken as it is
        (("coll_perf", "coll_timing_source"), "kernel_cpu", inspector.TIMING_KERNEL_CPU),
        (("coll_perf", "coll_timing_source"), "collective_cpu", inspector.TIMING_COLLECTIVE_CPU),
        (("coll_perf", "coll_timing_source"), "unknown", inspector.TIMING_UNKNOWN),
        (("coll_perf", "coll_timing_source"), 1, inspector.INVALID_VALUE),
    ],
)
def test_only_records_timed_on_the_gpu_are_taken(path: tuple[str, str], timing: object, expected: str | None) -> None:
    """A CPU timing holds launch and polling delays: one of 250 ms beside the GPU's 9.6 ms for
    the same all-reduce would drag the job's bus bandwidth down by an order of magnitude."""
    got = parse_json_record(variant(path, timing))
    assert got == expected if expected is not None else isinstance(got, Operation)


def test_a_node_count_of_zero_is_unknown_not_invalid() -> None:
    op = parse_json_record(variant(("header", "nnodes"), 0))
    assert isinstance(op, Operation) and op.nnodes is None and op.scope == "unknown"


def test_hostile_prom_text_is_skipped_and_counted() -> None:
    good = (FIXTURES / "nccl_inspector_metrics_v5.1-2.30.prom").read_text().splitlines()
    text = "\n".join(
        [
            *good[:2],
            "# a comment",
            "",
            "garbage line",
            'nccl_bus_bandwidth_gbs{collective="AllReduce",nranks="8" 3',  # no closing brace
            "nccl_bus_bandwidth_gbs{" + ",".join(f'l{i}="v"' for i in range(100)) + "} 1",  # too many labels
            'nccl_bus_bandwidth_gbs{collective="AllReduce"} NaNx',
            'nccl_bus_bandwidth_gbs{collective="AllReduce",nranks="8",message_size="1-2MB"} 5',  # no time: incomplete
            'nccl_bus_bandwidth_gbs{collective="Gather",nranks="8",message_size="1-2MB"} 5',
            'nccl_collective_exec_time_microseconds{collective="Gather",nranks="8",message_size="1-2MB"} 5',
            'nccl_bus_bandwidth_gbs{collective="AllReduce",nranks="8",message_size="huge"} 5',
            'nccl_collective_exec_time_microseconds{collective="AllReduce",nranks="8",message_size="huge"} 5',
            'nccl_bus_bandwidth_gbs{collective="Broadcast",nranks="8",message_size="1-2MB"} -1',
            'nccl_collective_exec_time_microseconds{collective="Broadcast",nranks="8",message_size="1-2MB"} 7',
            "x" * 10_000,
        ]
    )
    parsed = parse_prom(text)
    assert [op.collective for op in parsed.operations] == ["all_reduce"]
    assert parsed.skipped == {"malformed": 5, "incomplete": 1, "unknown_collective": 1, "invalid_value": 2}

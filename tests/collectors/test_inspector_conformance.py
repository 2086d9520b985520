"""NCCL Inspector output as the upstream writer prints it, for every version we read.

The writers below are ours, each a transcription of one upstream function of the plugin
(NVIDIA/nccl ``ext-profiler/inspector`` up to v2.29.3-1, ``plugins/profiler/inspector`` from
v2.29.7-1), named in its docstring with the file and the release tags it holds for: the same field
names and order, the same format strings (``%lf``, ``%.6g``, ``%.2f%s``, ``%.0f-%.0f%s``), the same
bandwidth formula, timing-source choice and bucket arithmetic. The operations fed to them are
ours. What they print goes through the parser, and through the source and collector as files in
a pod's folder, and must give what the JSON records of the same operations give:

* one size class per operation from JSON, ``.prom`` version 1 (2.29) and version 5.1 (2.30),
  also where a ``.prom`` size range straddles a class boundary;
* the same operations, seconds and bus bytes, except what version 5.1 cannot give (a bucket is
  the mean of an interval's operations, without their count);
* only operations timed on the GPU (``coll_timing_source``/``p2p_timing_source`` ``kernel_gpu``),
  in every version: what 2.30 keeps by default (``NCCL_INSPECTOR_REQUIRE_KERNEL_TIMING=1``);
* files of NVIDIA's flat ``NCCL_INSPECTOR_DUMP_DIR`` (names as the plugin gives them) counted,
  never read or credited to a pod.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from exporter.collectors.inspector import InspectorCollector, bus_bytes
from exporter.nccl import inspector
from exporter.nccl.inspector import Operation, parse_json_record, parse_prom, size_class
from exporter.sources.inspector import InspectorSource, is_json_log_name, is_plugin_file_name, is_prom_name
from exporter.sources.kube import PodMetadata
from exporter.sources.podlogs import pod_known_on_node
from tests.clocks import ManualClock

NS, POD, UID = "ml", "llama-70b-worker-0", "0d9a7c4e-1111-4222-8333-444455556666"


# ---- the upstream writer, transcribed -------------------------------------------------------


@dataclass(frozen=True)
class Comm:
    """An ``inspectorCommInfo``: what a record's header and a bucket's labels say of it."""

    comm_hash: str = "0x7f8c496ae9f661"
    comm_name: str = "DP Group 0"  # written from 2.30 ("unknown" when the application names none)
    rank: int = 2
    nranks: int = 16
    nnodes: int = 2
    cuda_dev: int = 0


@dataclass(frozen=True)
class Op:
    """An ``inspectorCompletedCollInfo`` (2.28, 2.29) or ``inspectorCompletedOpInfo`` (2.30)."""

    func: str  # ncclFuncToString
    msg_bytes: int  # msgSizeBytes: type size x count, per rank for AllGather and ReduceScatter
    exec_us: int  # execTimeUsecs (calculateMaxKernelExecTimeUsecs)
    timing: str = "kernel_gpu"  # inspectorTimingSourceToString
    sn: int = 1
    algo: str = "Ring"
    proto: str = "Simple"
    p2p: bool = False  # 2.30: a p2p_perf record, a p2p bucket
    peer: int = 0


def max_kernel_exec_time(channels: list[tuple[int, int, int, int]], op_cpu_us: tuple[int, int]) -> tuple[int, str]:
    """``calculateMaxKernelExecTimeUsecs`` (inspector.cc, v2.28.3-1 to v2.30.7-1): per channel
    (GPU start ns, GPU stop ns, CPU start us, CPU stop us) the GPU kernel time when the GPU
    clocks are there, else the CPU one; the largest wins and names the source; no channel time
    at all: the operation's CPU time, ``collective_cpu``."""
    best, source = 0, "collective_cpu"
    for gpu_start, gpu_stop, cpu_start, cpu_stop in channels:
        gpu = (gpu_stop - gpu_start) // 1000 if gpu_start and gpu_stop and gpu_stop > gpu_start else 0
        if gpu > 0:
            if gpu > best:
                best, source = gpu, "kernel_gpu"
        elif cpu_stop > cpu_start and cpu_stop - cpu_start > best:
            best, source = cpu_stop - cpu_start, "kernel_cpu"
    if best > 0:
        return best, source
    return op_cpu_us[1] - op_cpu_us[0], "collective_cpu"


def plugin_bandwidths(op: Op, nranks: int) -> tuple[float, float]:
    """(algBw, busBw) in GB/s: ``inspectorComputeCollBw`` (inspector.cc, v2.28.3-1 to
    v2.29.7-1) and ``inspectorComputeOpBw`` (v2.30.3-1 on: AllGatherV, p2p factor 1)."""
    time_in_sec = op.exec_us / 1000000.0
    if op.p2p or op.func in ("Reduce", "Broadcast", "SendRecv", "Send", "Recv"):
        traffic, factor = float(op.msg_bytes), 1.0
    elif op.func == "AllReduce":
        traffic, factor = float(op.msg_bytes), float(2 * (nranks - 1)) / float(nranks)
    elif op.func in ("ReduceScatter", "AllGather", "AllGatherV"):
        traffic, factor = float(op.msg_bytes * nranks), float(nranks - 1) / float(nranks)
    else:  # All2All among them
        traffic, factor = 0.0, 0.0
    algo = traffic / 1.0e9 / time_in_sec if time_in_sec != 0 else 0.0
    return algo, algo * factor


def json_str(text: str) -> str | None:
    """``jsonStr`` with ``sanitizeJson`` (json.cc): ``"``, ``\\``, ``/``, tab and newline escaped;
    any other control character an error (None: nothing is printed)."""
    out = []
    for char in text:
        if char in '"\\/':
            out.append("\\" + char)
        elif char == "\t":
            out.append("\\t")
        elif char == "\n":
            out.append("\\n")
        elif ord(char) <= 0x1F:
            return None
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def json_double(value: float) -> str:
    """``jsonDouble`` (json.cc): ``%lf``, a NaN as the string ``"nan"``."""
    return '"nan"' if value != value else f"{value:f}"


def _object(pairs: Iterable[tuple[str, str | None]]) -> str:
    """One object as json.cc prints it: ``"key":value`` joined by ``,``. A value the writer could
    not print (None) ends the object there, unclosed, as ``JSON_CHK`` returns mid-object."""
    text = "{"
    for index, (key, value) in enumerate(pairs):
        text += ("," if index else "") + f'"{key}":'
        if value is None:
            return text
        text += value
    return text + "}"


def _header(comm: Comm, with_comm_name: bool) -> str:
    pairs: list[tuple[str, str | None]] = [("id", json_str(comm.comm_hash))]
    if with_comm_name:
        pairs.append(("comm_name", json_str(comm.comm_name or "unknown")))
    pairs += [("rank", str(comm.rank)), ("n_ranks", str(comm.nranks)), ("nnodes", str(comm.nnodes))]
    return _object(pairs)


def _metadata(hostname: str, pid: int, dump_us: int, git_rev: str) -> str:
    return _object(
        [
            ("inspector_output_format_version", json_str("v4.0")),
            ("git_rev", json_str(git_rev)),
            ("rec_mechanism", json_str("nccl_profiler_interface")),
            ("dump_timestamp_us", str(dump_us)),
            ("hostname", json_str(hostname)),
            ("pid", str(pid)),
        ]
    )


def _perf(op: Op, nranks: int, verbose: bool) -> str:
    prefix = "p2p" if op.p2p else "coll"
    algo, bus = plugin_bandwidths(op, nranks)
    pairs: list[tuple[str, str | None]] = [(prefix, json_str(op.func)), (f"{prefix}_sn", str(op.sn))]
    if op.p2p:
        pairs.append(("p2p_peer", str(op.peer)))
    pairs += [
        (f"{prefix}_msg_size_bytes", str(op.msg_bytes)),
        (f"{prefix}_exec_time_us", str(op.exec_us)),
        (f"{prefix}_timing_source", json_str(op.timing)),
        (f"{prefix}_algobw_gbs", json_double(algo)),
        (f"{prefix}_busbw_gbs", json_double(bus)),
    ]
    if verbose:  # inspectorCompletedCollVerbose: one channel's event sequence numbers and times
        pairs += [
            (
                "event_trace_sn",
                f'{{"{prefix}_start_sn":1,"{prefix}_stop_sn":2,"kernel_events":[{{"channel_id":0,'
                '"kernel_start_sn":3,"kernel_stop_sn":48,"kernel_record_sn":47}]}',
            ),
            (
                "event_trace_ts",
                f'{{"{prefix}_start_ts":1752867229235059,"{prefix}_stop_ts":1752867229235064,'
                '"kernel_events":[{"channel_id":0,"kernel_start_ts":1752867229235181,'
                '"kernel_stop_ts":1752867229275811,"kernel_record_ts":1752867229275811}]}',
            ),
        ]
    return _object(pairs)


def json_lines(
    version: str,
    comm: Comm,
    ops: Iterable[Op],
    *,
    hostname: str = POD,
    pid: int = 1639453,
    verbose: bool = False,
    require_kernel_timing: bool = True,
) -> str:
    """The JSON Lines a process writes for ``ops``:

    * 2.28 and 2.29: ``inspectorCommInfoDump`` with ``inspectorCommInfoHeader``,
      ``inspectorCommInfoMetaHeader`` and ``inspectorCompletedColl``
      (``ext-profiler/inspector/inspector.cc`` v2.28.3-1, v2.28.9-1, v2.29.2-1, v2.29.3-1;
      ``plugins/profiler/inspector/inspector.cc`` v2.29.7-1); one record per dump and
      communicator (the last completed operation): one dump per operation here.
    * 2.30: ``inspectorCommInfoDumpColl``/``inspectorCommInfoDumpP2p``
      (``plugins/profiler/inspector/inspector_json.cc`` v2.30.3-1, v2.30.4-1, v2.30.7-1): the
      header gains ``comm_name``, point-to-point operations are ``p2p_perf`` records, and
      operations not timed ``kernel_gpu`` are never written while
      ``NCCL_INSPECTOR_REQUIRE_KERNEL_TIMING`` is 1 (its default; ``inspector_plugin.cc``).
    """
    lines = []
    for index, op in enumerate(ops):
        if version == "2.30" and require_kernel_timing and op.timing != "kernel_gpu":
            continue
        assert version == "2.30" or not op.p2p, "p2p records are 2.30's"
        header = _header(comm, with_comm_name=version == "2.30")
        metadata = _metadata(hostname, pid, 1748030377748202 + index, "9019a1912-dirty")
        key = "p2p_perf" if op.p2p else "coll_perf"
        record = f'{{"header":{header},"metadata":{metadata},"{key}":{_perf(op, comm.nranks, verbose)}'
        # jsonFinishObject closes whatever the stack has on top: the record, or an unclosed header
        lines.append(record + ("}" if header.endswith("}") else "") + "\n")
    return "".join(lines)


def human_size(size: int) -> str:
    """``inspectorFormatHumanReadableSize`` (``inspector_prom.cc`` v2.29.3-1, v2.29.7-1)."""
    units = ("B", "KB", "MB", "GB", "TB")
    value, unit = float(size), 0
    while value >= 1024.0 and unit < 4:
        value /= 1024.0
        unit += 1
    return f"{size}B" if unit == 0 else f"{value:.2f}{units[unit]}"


def prom_v1(comm: Comm, ops: Iterable[Op], *, hostname: str = POD, when: str = "2026-02-01T10:00:00Z") -> str:
    """One dump of a ``.prom`` file of 2.29: ``inspectorPromCacheStaticLabels``,
    ``inspectorPromGetLabels`` and ``inspectorPromWriteCollInfo`` (``inspector_prom.cc``
    v2.29.3-1, v2.29.7-1), three lines per sampled operation."""
    static = (
        f'comm_id="{comm.comm_hash}",hostname="{hostname}",rank="{comm.rank}",slurm_job="unknown",'
        f'slurm_job_id="unknown",nranks="{comm.nranks}",n_nodes="{comm.nnodes}",gpu_device_id="GPU{comm.cuda_dev}"'
    )
    text = ""
    for op in ops:
        labels = (
            f'{static},collective="{op.func}",coll_sn="{op.sn}",timestamp="{when}",'
            f'message_size="{human_size(op.msg_bytes)}"'
        )
        algo, bus = plugin_bandwidths(op, comm.nranks)
        text += (
            f"nccl_algorithm_bandwidth_gbs{{{labels}}} {algo:.6g}\n"
            f"nccl_bus_bandwidth_gbs{{{labels}}} {bus:.6g}\n"
            f"nccl_collective_exec_time_microseconds{{{labels}}} {float(op.exec_us):.6g}\n"
        )
    return text


def range_lower_bound(size: int) -> int:
    """``inspectorPromMessageSizeRangeLowerBound`` (``inspector_prom.cc`` v2.30.3-1 on)."""
    if size == 0:
        return 0
    value, unit = float(size), 0
    while value >= 1024.0 and unit < 4:
        value /= 1024.0
        unit += 1
    return math.floor(max(value, 1.0)) * 1024**unit


def size_range_label(lower_bound: int) -> str:
    """``inspectorPromFormatMessageSizeRange`` (``inspector_prom.cc`` v2.30.3-1 on)."""
    if lower_bound == 0:
        return "0B"
    units = ("B", "KB", "MB", "GB", "TB")
    value, unit = float(lower_bound), 0
    while value >= 1024.0 and unit < 4:
        value /= 1024.0
        unit += 1
    lower = math.floor(max(value, 1.0))
    return f"{lower:.0f}-{lower + 1:.0f}{units[unit]}"


def prom_v5_1(comm: Comm, ops: Iterable[Op], *, hostname: str = POD, require_kernel_timing: bool = True) -> str:
    """One dump of a ``.prom`` file of 2.30 (format ``v5.1``): the interval's operations drained
    into buckets (``inspectorPromCommInfoDumpColl``/``...P2p``, ``inspectorPromAggUpdate``: count,
    sum of times, sum of the logs of the positive bandwidths) and one pair of lines per bucket
    (``inspectorPromWriteCollBucket``/``...P2pBucket``: the geometric-mean bus bandwidth and the
    mean time, ``%.6g``), ``plugins/profiler/inspector/inspector_prom.cc`` v2.30.3-1, v2.30.4-1,
    v2.30.7-1."""
    buckets: dict[tuple[bool, str, int, str], list[float]] = {}  # p2p, func, lower bound, algo_proto
    for op in ops:
        if require_kernel_timing and op.timing != "kernel_gpu":
            continue
        key = (op.p2p, op.func, range_lower_bound(op.msg_bytes), "" if op.p2p else f"{op.algo}_{op.proto}")
        agg = buckets.setdefault(key, [0, 0.0, 0.0, 0])  # count, time sum, bus log sum, bus count
        bus = plugin_bandwidths(op, comm.nranks)[1]
        agg[0] += 1
        agg[1] += float(op.exec_us)
        if bus > 0.0:
            agg[2] += math.log(bus)
            agg[3] += 1
    text = ""
    for (p2p, func, lower, algo_proto), (count, time_sum, log_sum, bus_count) in sorted(buckets.items()):
        labels = (
            f'version="v5.1",slurm_job_id="unknown",node="{hostname}",gpu="GPU{comm.cuda_dev}",'
            f'comm_name="{comm.comm_name or "unknown"}",n_nodes="{comm.nnodes}",nranks="{comm.nranks}",'
        )
        if p2p:
            labels += f'p2p_operation="{func}",message_size="{size_range_label(lower)}"'
        else:
            labels += f'collective="{func}",message_size="{size_range_label(lower)}",algo_proto="{algo_proto}"'
        exec_mean = time_sum / count if count else 0.0
        bus_mean = math.exp(log_sum / bus_count) if bus_count else 0.0
        name = "nccl_p2p" if p2p else "nccl"
        time_name = "nccl_p2p_exec_time_microseconds" if p2p else "nccl_collective_exec_time_microseconds"
        text += f"{name}_bus_bandwidth_gbs{{{labels}}} {bus_mean:.6g}\n{time_name}{{{labels}}} {exec_mean:.6g}\n"
    return text


def device_uuid_str(uuid: bytes) -> str:
    """``deviceUuidStr`` (``inspector.cc`` v2.29.3-1 on): 16 bytes as lowercase hex, 8-4-4-4-12."""
    h = uuid.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def json_file_name(hostname: str, pid: int) -> str:
    """``"%s/%s-pid%d.log"`` of ``inspectorStateDump``/``inspectorStateDumpJSON`` (every version)."""
    return f"{hostname}-pid{pid}.log"


def prom_file_name(uuid: bytes) -> str:
    """``"%s/nccl_inspector_metrics_%s.prom"`` of ``inspectorPromGetFilename`` (v2.29.3-1 on)."""
    return f"nccl_inspector_metrics_{device_uuid_str(uuid)}.prom"


# ---- reading it ----------------------------------------------------------------------------


def json_ops(text: str) -> list[Operation | str]:
    return [parse_json_record(line) for line in text.splitlines()]


def taken(results: Iterable[Operation | str]) -> list[Operation]:
    out = []
    for result in results:
        assert isinstance(result, Operation), result
        out.append(result)
    return out


class Pods:
    """The node's pod list: one pod of a PyTorchJob."""

    def lookup(self, namespace: str, pod: str) -> PodMetadata | None:
        return PodMetadata(NS, POD, UID, "llama", "PyTorchJob") if (namespace, pod) == (NS, POD) else None

    def is_authoritative(self) -> bool:
        return True


def counters(
    tmp_path: Path, files: dict[str, str]
) -> tuple[dict[tuple[str, str, str], tuple[float, float, float]], dict[str, int], dict[str, int]]:
    """The collector's counters after ``files`` (path below the Inspector root -> text) appear
    in a running exporter: (collective, scope, size class) of the pod -> (operations, seconds, bus
    bytes); skipped by reason; unattributed entries by reason."""
    root = tmp_path / "inspector"
    (root / f"{NS}_{POD}_{UID}").mkdir(parents=True)
    clock = ManualClock()
    pods = Pods()
    source = InspectorSource(root, None, clock=clock, pod_known=pod_known_on_node(pods))
    collector = InspectorCollector(source, pods, clock=clock)  # type: ignore[arg-type]
    collector.step()
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        os.utime(path, (clock.now - 10, clock.now - 10))  # a .prom version settled
    snapshot = collector.step()
    series = {
        (c, scope, size): (ops, seconds, bus)
        for ns, pod, _, _, c, scope, size, ops, seconds, bus in snapshot.series
        if (ns, pod) == (NS, POD)
    }
    return series, dict(snapshot.skipped), dict(snapshot.unattributed)


def own(name: str) -> str:
    """A file in the pod's own folder (``<namespace>_<pod>_<uid>``, a subPathExpr mount)."""
    return f"{NS}_{POD}_{UID}/{name}"


GIB = 1 << 30
COMM = Comm()  # 16 ranks on 2 nodes
# Operations of sizes all around the class boundaries (10^6 ... 10^9 bytes), as powers of two
# and as round decimal numbers, of each collective the plugin names.
OPS = (
    Op("AllReduce", GIB, 9600, sn=1),
    Op("AllReduce", 10**9, 8950, sn=2),  # 953.67 MiB: "953.67MB", "953-954MB"
    Op("AllReduce", 10**8, 1020, sn=3),  # 95.37 MiB: "95-96MB"
    Op("AllReduce", 10**7, 160, sn=4),  # 9.54 MiB: "9-10MB"
    Op("AllReduce", 10**6, 41, sn=5),  # 976.56 KiB: "976-977KB"
    Op("AllReduce", 999_000, 41, sn=6),  # just under a class boundary: "975.59KB", "975-976KB"
    Op("AllGather", 62_500_000, 5200, sn=7),  # x 16 ranks = 10^9 bytes gathered
    Op("ReduceScatter", 64 << 20, 4300, sn=8, algo="Ring", proto="LL128"),
    Op("Broadcast", 16 << 20, 400, sn=9, algo="Tree", proto="LL"),
    Op("Reduce", 3 << 20, 120, sn=10),
    Op("AllReduce", 512, 9, sn=11),  # under 1 KiB: "512B", "512-513B"
    Op("AllReduce", 6 * GIB, 1_234_567, sn=12),  # over a second: %.6g rounds the time
)


# ---- JSON Lines: 2.28, 2.29, 2.30 ------------------------------------------------------------


@pytest.mark.parametrize("version", ["2.28", "2.29", "2.30"])
@pytest.mark.parametrize("verbose", [False, True])
def test_json_records_give_the_size_time_and_bus_bandwidth_the_plugin_computed(version: str, verbose: bool) -> None:
    operations = taken(json_ops(json_lines(version, COMM, OPS, verbose=verbose)))
    assert len(operations) == len(OPS)
    for op, got in zip(OPS, operations, strict=True):
        traffic = op.msg_bytes * (COMM.nranks if op.func in ("AllGather", "ReduceScatter") else 1)
        assert (got.size_bytes, got.seconds, got.nranks, got.scope) == (traffic, op.exec_us / 1e6, 16, "inter_node")
        # %lf: six decimals of GB/s
        assert bus_bytes(got) / got.seconds == pytest.approx(plugin_bandwidths(op, 16)[1] * 1e9, abs=1e3)


@pytest.mark.parametrize("version", ["2.28", "2.29", "2.30"])
def test_one_cpu_timed_all_reduce_no_longer_drags_the_bus_bandwidth_down(tmp_path: Path, version: str) -> None:
    """Issue 32's case: two 1 GiB all-reduces on 16 ranks; one timed on the GPU (9.6 ms, 209.7
    GB/s), the other on one channel without GPU clocks, by the CPU (250 ms, what the profiler's
    CPU timestamps hold). Mixed, the counters gave 15.5 GB/s."""
    both_gpu = [(10_000_000, 19_600_000, 10, 9_700), (10_000_000, 19_500_000, 10, 9_650)]
    gpu_us, gpu_source = max_kernel_exec_time(both_gpu, (0, 9_800))
    cpu_us, cpu_source = max_kernel_exec_time([(10_000_000, 19_600_000, 10, 9_700), (0, 0, 10, 250_010)], (0, 250_100))
    assert (gpu_us, gpu_source, cpu_us, cpu_source) == (9600, "kernel_gpu", 250_000, "kernel_cpu")
    ops = [Op("AllReduce", GIB, gpu_us, gpu_source, sn=1), Op("AllReduce", GIB, cpu_us, cpu_source, sn=2)]
    text = json_lines(version, COMM, ops, require_kernel_timing=False)  # 2.30 keeps both only when told to
    assert '"coll_timing_source":"kernel_cpu"' in text
    series, skipped, _ = counters(tmp_path, {own(json_file_name(POD, 41)): text})
    operations, seconds, bus = series[("all_reduce", "inter_node", "ge_1GB")]
    assert (operations, seconds) == (1, 0.0096)
    assert bus / seconds / 1e9 == pytest.approx(209.7152, rel=1e-6)
    assert skipped[inspector.TIMING_KERNEL_CPU] == 1
    mixed = 2 * GIB * 1.875 / (0.0096 + 0.25) / 1e9  # what both together gave
    assert mixed == pytest.approx(15.5, abs=0.05)


@pytest.mark.parametrize(
    ("timing", "reason"),
    [
        ("kernel_cpu", inspector.TIMING_KERNEL_CPU),
        ("collective_cpu", inspector.TIMING_COLLECTIVE_CPU),
        ("unknown", inspector.TIMING_UNKNOWN),  # inspectorTimingSourceToString's default
        ("kernel_gpu_v2", inspector.TIMING_UNKNOWN),  # a source no version writes: not taken on trust
    ],
)
def test_records_not_timed_on_the_gpu_are_skipped_with_their_reason(timing: str, reason: str) -> None:
    for version in ("2.28", "2.30"):
        (line,) = json_lines(
            version, COMM, [Op("AllReduce", GIB, 250_000, timing)], require_kernel_timing=False
        ).splitlines()
        assert parse_json_record(line) == reason
    (p2p,) = json_lines(
        "2.30", COMM, [Op("Send", 64 << 20, 9000, timing, p2p=True)], require_kernel_timing=False
    ).splitlines()
    assert parse_json_record(p2p) == reason


def test_a_record_without_a_timing_source_is_taken_as_it_is() -> None:
    """The README's own example record has no ``coll_timing_source``."""
    (line,) = json_lines("2.28", COMM, [Op("AllReduce", GIB, 9600)]).splitlines()
    older = line.replace(',"coll_timing_source":"kernel_gpu"', "")
    assert "timing_source" not in older
    assert taken([parse_json_record(older)])[0].seconds == 0.0096


def test_a_2_30_file_kept_whole_counts_what_the_default_keeps(tmp_path: Path) -> None:
    """The same operations written with ``NCCL_INSPECTOR_REQUIRE_KERNEL_TIMING=0`` (every record)
    and with its default (GPU-timed ones only) give the same counters."""
    ops = [
        *OPS,
        Op("AllReduce", GIB, 250_000, "kernel_cpu", sn=20),
        Op("AllGather", 64 << 20, 90_000, "collective_cpu", sn=21),
        Op("Send", 64 << 20, 3140, p2p=True, peer=3, sn=22),
        Op("Recv", 64 << 20, 3150, p2p=True, peer=3, sn=23),
        Op("Send", 64 << 20, 80_000, "kernel_cpu", p2p=True, peer=3, sn=24),
    ]
    everything = json_lines("2.30", COMM, ops, require_kernel_timing=False)
    default = json_lines("2.30", COMM, ops)
    assert everything.count("\n") == len(ops) and default.count("\n") == len(ops) - 3
    kept, skipped, _ = counters(tmp_path / "all", {own(json_file_name(POD, 7)): everything})
    assert counters(tmp_path / "default", {own(json_file_name(POD, 7)): default})[0] == kept
    assert skipped[inspector.TIMING_KERNEL_CPU] == 2 and skipped[inspector.TIMING_COLLECTIVE_CPU] == 1
    assert kept[("send", "inter_node", "10MB_100MB")][0] == kept[("recv", "inter_node", "10MB_100MB")][0] == 1


def test_2_30_escapes_a_communicator_name_and_a_name_it_cannot_print_spoils_only_its_record() -> None:
    escaped = json_lines("2.30", replace(COMM, comm_name='TP/"0"\tA'), [Op("AllReduce", GIB, 9600)])
    assert '"comm_name":"TP\\/\\"0\\"\\tA"' in escaped
    assert taken(json_ops(escaped))[0].size_bytes == GIB
    # A control character: jsonStr prints nothing, the header is left open, the record unclosed
    spoiled = json_lines("2.30", replace(COMM, comm_name="TP\x01"), [Op("AllReduce", GIB, 9600)])
    assert '"comm_name":,"metadata"' in spoiled
    assert json_ops(spoiled) == [inspector.MALFORMED]


def test_2_30_all_to_all_and_gather_v_records() -> None:
    """The plugin gives All2All no bus factor (busbw 0); the operation still counts, with
    nccl-tests' factor for its size."""
    ops = taken(json_ops(json_lines("2.30", COMM, [Op("All2All", 8 << 20, 700), Op("AllGatherV", 4 << 20, 300)])))
    assert [(op.collective, op.size_bytes, op.stated_bus_bandwidth) for op in ops] == [
        ("alltoall", 8 << 20, 0.0),
        (
            "all_gather",
            16 * (4 << 20),
            pytest.approx(plugin_bandwidths(Op("AllGatherV", 4 << 20, 300), 16)[1] * 1e9, abs=1e3),
        ),
    ]


# ---- .prom: the same operations as JSON ------------------------------------------------------


def test_prom_v1_gives_each_operation_its_json_size_class_and_counters(tmp_path: Path) -> None:
    """2.29's ``.prom``: one sample per operation, its size printed ``%.2f`` of a 1024-based unit
    ("953.67MB" for 10^9 bytes, a class below taken as written)."""
    by_json = taken(json_ops(json_lines("2.29", COMM, OPS)))
    parsed = parse_prom(prom_v1(COMM, OPS))
    assert parsed.skipped == {} and parsed.version == "v1"
    assert len(parsed.operations) == len(by_json)
    for json_op, prom_op in zip(by_json, parsed.operations, strict=True):  # in the order written
        assert prom_op.seconds == pytest.approx(json_op.seconds, rel=1e-5)
        assert prom_op.size_class == json_op.size_class, (json_op, prom_op)
        assert prom_op.size_bytes == pytest.approx(json_op.size_bytes, rel=2e-5)
        assert bus_bytes(prom_op) == pytest.approx(bus_bytes(json_op), rel=2e-5)
    assert size_class(953.67 * (1 << 20)) == "100MB_1GB"  # what the printed size alone says of 10^9 bytes
    json_counters = counters(tmp_path / "json", {own(json_file_name(POD, 7)): json_lines("2.29", COMM, OPS)})[0]
    prom_counters = counters(tmp_path / "prom", {own(prom_file_name(bytes(range(16)))): prom_v1(COMM, OPS)})[0]
    assert set(prom_counters) == set(json_counters)
    for key, (operations, seconds, bus) in json_counters.items():
        assert prom_counters[key] == (operations, pytest.approx(seconds, rel=1e-5), pytest.approx(bus, rel=2e-5))


# Buckets whose range straddles a class boundary: (collective, message bytes, ranks) and the
# class the range's lower bound would give
STRADDLING = [
    (Op("AllReduce", 10**9, 8950), "100MB_1GB"),  # "953-954MB"
    (Op("AllReduce", 10**8, 1020), "10MB_100MB"),  # "95-96MB"
    (Op("AllReduce", 10**7, 160), "1MB_10MB"),  # "9-10MB"
    (Op("AllReduce", 10**6, 41), "lt_1MB"),  # "976-977KB"
    (Op("AllGather", 62_500_000, 5200), "100MB_1GB"),  # "59-60MB" x 16 ranks
    (Op("ReduceScatter", 1_000_000_000 // 16 + 1, 5300), "100MB_1GB"),
]


@pytest.mark.parametrize(("op", "lower_class"), STRADDLING, ids=lambda v: getattr(v, "func", v))
@pytest.mark.parametrize("spread", [0.0, 0.05, 0.3])
def test_prom_v5_1_buckets_land_in_the_size_class_of_their_operations(op: Op, lower_class: str, spread: float) -> None:
    """2.30's buckets, each of equal sizes and times spread by up to ``spread``: the bucket's
    size class is its operations' (their JSON records'), not its range's lower bound's."""
    times = [round(op.exec_us * (1 + spread * k / 4)) for k in (-2, -1, 0, 1, 2)]
    ops = [replace(op, exec_us=t, sn=i) for i, t in enumerate(times)]
    json_classes = {got.size_class for got in taken(json_ops(json_lines("2.30", COMM, ops)))}
    parsed = parse_prom(prom_v5_1(COMM, ops))
    assert parsed.skipped == {} and parsed.version == "v5.1"
    (bucket,) = parsed.operations
    per_rank = COMM.nranks if op.func in ("AllGather", "ReduceScatter") else 1
    lower = range_lower_bound(op.msg_bytes) * per_rank
    assert size_class(lower) == lower_class != bucket.size_class  # the lower bound alone: a class too low
    assert json_classes == {bucket.size_class}
    assert lower <= bucket.size_bytes < (lower // per_rank + 1024 ** int(math.log(lower // per_rank, 1024))) * per_rank
    # What the format cannot give: the count. One bucket, its mean time.
    assert bucket.mean and bucket.seconds == pytest.approx(sum(times) / len(times) / 1e6, rel=1e-5)
    # Its bus bandwidth: time-weighted, as from JSON, up to the mean-of-times / geometric-mean bias
    json_bandwidth = (
        op.msg_bytes
        * per_rank
        * 1.875 ** (op.func == "AllReduce")
        * (15 / 16) ** (op.func != "AllReduce")
        * len(times)
        / (sum(times) / 1e6)
    )
    assert bus_bytes(bucket) / bucket.seconds == pytest.approx(json_bandwidth, rel=max(1e-5, spread**2))


def test_prom_v5_1_counters_beside_json_for_the_same_interval(tmp_path: Path) -> None:
    """The whole interval of ``OPS``, one bucket per operation: the same series, size classes,
    operations and bus bandwidth (one operation per bucket is all a bucket can say)."""
    json_counters = counters(tmp_path / "json", {own(json_file_name(POD, 7)): json_lines("2.30", COMM, OPS)})[0]
    prom_counters = counters(tmp_path / "prom", {own(prom_file_name(bytes(16))): prom_v5_1(COMM, OPS)})[0]
    assert set(prom_counters) == set(json_counters)
    for key, (operations, seconds, bus) in json_counters.items():
        assert prom_counters[key] == (operations, pytest.approx(seconds, rel=1e-5), pytest.approx(bus, rel=2e-5)), key
    assert prom_counters[("all_reduce", "inter_node", "lt_1MB")][0] == 2  # "512-513B", "975-976KB"


def test_a_size_within_the_printing_precision_under_a_class_boundary_is_taken_at_it() -> None:
    """What %.6g cannot tell apart: 10^6 bytes, and 999 999 (a millionth under). Both land at
    the boundary, so that a round size (10^9 bytes of 250 000 000 floats) keeps its JSON class."""
    for version, text in (("v1", prom_v1), ("v5.1", prom_v5_1)):
        for size in (999_999, 10**6):
            (got,) = parse_prom(text(COMM, [Op("AllReduce", size, 41)])).operations
            assert (got.size_bytes, got.size_class) == (10**6, "1MB_10MB"), (version, size)
        (under,) = parse_prom(text(COMM, [Op("AllReduce", 999_000, 41)])).operations
        assert under.size_class == "lt_1MB"


def test_prom_v5_1_point_to_point_buckets_and_buckets_without_a_bus_factor() -> None:
    ops = [
        Op("Send", 64 << 20, 3140, p2p=True, peer=3),
        Op("Recv", 64 << 20, 3150, p2p=True, peer=3),
        Op("All2All", 8 << 20, 700),  # the plugin's bus factor 0: a bus bandwidth of 0
    ]
    text = prom_v5_1(COMM, ops) + prom_v5_1(replace(COMM, nranks=1, nnodes=1), [Op("AllReduce", 300 << 20, 50)])
    assert 'p2p_operation="Send",message_size="64-65MB"' in text and "nccl_p2p_exec_time_microseconds" in text
    parsed = parse_prom(text)
    assert parsed.skipped == {}
    got = {(op.collective, op.nranks): op for op in parsed.operations}
    assert got[("send", 16)].size_bytes == pytest.approx(64 << 20, rel=1e-5)
    assert got[("recv", 16)].size_bytes == pytest.approx(64 << 20, rel=1e-5)
    # No bandwidth to give a size back: the range's lower bound
    assert got[("alltoall", 16)].size_bytes == 8 << 20
    assert got[("all_reduce", 1)].size_bytes == 300 << 20 and got[("all_reduce", 1)].scope == "intra_node"


def test_prom_v5_1_a_dump_appended_to_the_last_is_two_buckets() -> None:
    """``getOrCreateFileHandle`` appends ("a") to a file flushed less than an interval ago: the
    same bucket twice in one version is two intervals' means."""
    once = prom_v5_1(COMM, [Op("AllReduce", GIB, 9600)])
    assert len(parse_prom(once + once).operations) == 2


def test_prom_message_sizes_as_each_version_prints_them() -> None:
    for size in (1, 512, 1023, 1024, 10**6, 10**9, GIB, 5 * GIB - 1, 3 << 40, 5000 << 40):
        low, high = inspector.message_size_range(human_size(size)) or (math.nan, math.nan)
        assert low <= size < high, (size, human_size(size))
        lower = range_lower_bound(size)
        assert inspector.message_size_range(size_range_label(lower)) == (
            lower,
            lower + 1024 ** max(0, min(4, int(math.log(size, 1024)))),
        ), size
    assert inspector.message_size_range("0B") == (0, 1)
    assert inspector.message_size_range("4-6GB") is None  # not a range the writer prints


# ---- file names and the flat folder ---------------------------------------------------------


def test_the_plugins_file_names_are_recognised() -> None:
    uuid = bytes.fromhex("3f9a1c2e4b5d6e7f8091a2b3c4d5e6f7")
    assert prom_file_name(uuid) == "nccl_inspector_metrics_3f9a1c2e-4b5d-6e7f-8091-a2b3c4d5e6f7.prom"
    assert is_prom_name(prom_file_name(uuid)) and is_plugin_file_name(prom_file_name(uuid))
    for hostname in ("llama-70b-worker-0", "node-a.cluster.local", "x"):
        assert is_json_log_name(json_file_name(hostname, 4194304)) and is_plugin_file_name(json_file_name(hostname, 1))
    assert not is_plugin_file_name("nccl.host.12.log") and not is_plugin_file_name(f"{NS}_{POD}_{UID}")


def test_files_of_a_flat_dump_folder_are_counted_and_never_credited(tmp_path: Path) -> None:
    """NVIDIA's layout: every job's ``NCCL_INSPECTOR_DUMP_DIR`` the one folder. A file there
    names its pod by hostname only, which any writer of the folder picks: the node's own pod's
    name here, in both formats. Neither is read; both are counted; the pod's own folder is read."""
    series, _, unattributed = counters(
        tmp_path,
        {
            json_file_name(POD, 41): json_lines("2.30", COMM, [Op("AllReduce", GIB, 95_000)]),  # 10x slower
            prom_file_name(bytes(range(16))): prom_v5_1(COMM, [Op("AllReduce", GIB, 95_000)]),
            "nccl-inspector-unknown-jobid/x-pid1.log": json_lines("2.30", COMM, [Op("AllReduce", GIB, 95_000)]),
            own(json_file_name(POD, 42)): json_lines("2.30", COMM, [Op("AllReduce", GIB, 9600)]),
        },
    )
    assert series == {("all_reduce", "inter_node", "ge_1GB"): (1, 0.0096, pytest.approx(GIB * 1.875))}
    assert unattributed == {"flat_layout": 2, "not_a_pod_folder": 1}

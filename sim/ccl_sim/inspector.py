"""Simulated NCCL Inspector output for the simulated node's training pods.

``SimInspector`` writes what the NCCL Inspector plugin (NCCL 2.30) writes into
``<root>/nccl-inspector/<namespace>_<pod>_<uid>/`` for each running job of ``SimPodLogs``:

* multi-node jobs in JSON mode: one ``<pod>-pid<pid>.log`` per local rank, a record per operation
  (``coll_perf``, compact JSON as the plugin prints it, its own bandwidths by its own formula),
  appended each tick: gradient all-reduces of 256 MiB and a few small ones, and an all-gather /
  reduce-scatter pair of 64 MiB per rank;
* the single-node job in Prometheus mode (``NCCL_INSPECTOR_PROM_DUMP=1``): one
  ``nccl_inspector_metrics_<uuid>.prom`` per GPU, format v5.1 (per bucket the mean time and the
  geometric-mean bus bandwidth of the interval), rewritten in place every ``prom_every_ticks``.

Bus bandwidth follows the job's network: RDMA (``IB``) about 355 GB/s across nodes (the public
H200 measurement DESIGN.md quotes), ``Socket`` (the TCP fallback) about 9 GB/s, NVLink within a
node about 480 GB/s; each operation jitters by a few percent. A restarted job's processes get new
pids (new files), as NCCL's do. Nothing here is read back by the simulator itself.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path

from ccl_sim.clock import SimClock, now
from ccl_sim.paths import simulated_paths
from ccl_sim.podlogs import GPUS_PER_NODE, SimJob, SimPodLogs

# Bus bandwidth (bytes/s) of large collectives by where they run
INTER_NODE_BUS_BANDWIDTH = {"IB": 355e9, "Socket": 9e9}
INTRA_NODE_BUS_BANDWIDTH = 480e9
# (Inspector collective, message bytes per rank, operations per tick at full activity)
JSON_MIX = (
    ("AllReduce", 256 << 20, 6),
    ("AllReduce", 1 << 20, 2),
    ("AllGather", 64 << 20, 2),
    ("ReduceScatter", 64 << 20, 2),
)
PROM_MIX = (("AllReduce", 512 << 20, 8), ("Broadcast", 4 << 20, 2))
_PER_RANK = {"AllGather", "ReduceScatter"}


def plugin_bandwidths(collective: str, message_bytes: int, micros: int, nranks: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s exactly as the plugin computes them (``inspectorComputeOpBw``)."""
    traffic = message_bytes * nranks if collective in _PER_RANK else message_bytes
    if collective == "AllReduce":
        factor = 2 * (nranks - 1) / nranks
    elif collective in _PER_RANK:
        factor = (nranks - 1) / nranks
    else:
        factor = 1.0
    algo = traffic / 1e9 / (micros / 1e6) if micros else 0.0
    return algo, algo * factor


@dataclass(frozen=True)
class RecordWriter:
    """Who writes an Inspector record: the communicator (its id and name, its size in ranks and
    nodes), the writing rank, and its process (host name and pid)."""

    comm_id: str
    comm_name: str
    rank: int
    nranks: int
    nnodes: int
    hostname: str
    pid: int


@dataclass(frozen=True)
class TimedCollective:
    """One collective as the Inspector times it: its name, sequence number, bytes per rank and time."""

    collective: str
    sn: int
    message_bytes: int
    micros: int


def json_record(writer: RecordWriter, op: TimedCollective, dump_us: int) -> str:
    """One JSON Lines record as NCCL 2.30's Inspector prints it (``%lf`` doubles, no spaces)."""
    algo, bus = plugin_bandwidths(op.collective, op.message_bytes, op.micros, writer.nranks)
    return (
        f'{{"header":{{"id":"{writer.comm_id}","comm_name":"{writer.comm_name}","rank":{writer.rank},'
        f'"n_ranks":{writer.nranks},"nnodes":{writer.nnodes}}},"metadata":{{"inspector_output_format_version":'
        f'"v4.0","git_rev":"","rec_mechanism":"nccl_profiler_interface","dump_timestamp_us":{dump_us},'
        f'"hostname":"{writer.hostname}","pid":{writer.pid}}},"coll_perf":{{"coll":"{op.collective}",'
        f'"coll_sn":{op.sn},"coll_msg_size_bytes":{op.message_bytes},"coll_exec_time_us":{op.micros},'
        f'"coll_timing_source":"kernel_gpu","coll_algobw_gbs":{algo:f},"coll_busbw_gbs":{bus:f}}}}}'
    )


def size_range(message_bytes: int) -> str:
    """The plugin's v5.1 ``message_size`` label: ``"4-5GB"`` (1024-based units, floor)."""
    units = ("B", "KB", "MB", "GB", "TB")
    value, unit = float(max(message_bytes, 1)), 0
    while value >= 1024 and unit < len(units) - 1:
        value /= 1024
        unit += 1
    lower = max(1, math.floor(value))
    return f"{lower}-{lower + 1}{units[unit]}"


def prom_bucket_lines(labels: str, times_us: list[int], buses_gbs: list[float]) -> list[str]:
    """The two lines of one v5.1 bucket: geometric-mean busbw, mean time (``%.6g``)."""
    geometric = math.exp(sum(math.log(b) for b in buses_gbs) / len(buses_gbs))
    mean = sum(times_us) / len(times_us)
    return [
        f"nccl_bus_bandwidth_gbs{{{labels}}} {geometric:.6g}",
        f"nccl_collective_exec_time_microseconds{{{labels}}} {mean:.6g}",
    ]


@dataclass
class _Rank:
    path: Path
    pid: int
    sn: int = 0


@dataclass
class SimInspector:
    """The simulated node's NCCL Inspector output; see the module docstring."""

    pod_logs: SimPodLogs
    rng: random.Random
    prom_every_ticks: int = 5
    root: Path | None = None
    _ranks: dict[tuple[str, str, int, int], _Rank] = field(default_factory=dict)  # ns, pod, restarts, local
    _prom_pending: dict[tuple[str, str], list[tuple[str, int, int, float]]] = field(default_factory=dict)
    _ticks: int = 0

    @property
    def folder(self) -> Path:
        assert self.root is not None, "setup() first"
        return simulated_paths(self.root).nccl_inspector

    def setup(self, root: Path) -> None:
        self.root = root
        self.folder.mkdir(parents=True, exist_ok=True)

    def _bus_bandwidth(self, job: SimJob) -> float:
        base = INTER_NODE_BUS_BANDWIDTH.get(job.network, 9e9) if job.nnodes > 1 else INTRA_NODE_BUS_BANDWIDTH
        return base * self.rng.uniform(0.97, 1.03)

    def _micros(self, job: SimJob, collective: str, message_bytes: int, nranks: int) -> int:
        _, bus_per_second = plugin_bandwidths(collective, message_bytes, 1_000_000, nranks)
        return max(1, round(bus_per_second * 1e9 / self._bus_bandwidth(job) * 1e6))

    def advance(self, clock: SimClock) -> None:
        self._ticks += 1
        jobs = self.pod_logs.running()
        for job in jobs:
            if job.nnodes > 1:
                self._append_records(job, clock.job_activity)
            else:
                self._collect_prom(job, clock.job_activity)
        if self._ticks % self.prom_every_ticks == 0:
            self._write_prom(jobs)
        gone = {(job.namespace, job.pod) for job in jobs}
        self._ranks = {key: rank for key, rank in self._ranks.items() if key[:2] in gone}

    def _append_records(self, job: SimJob, activity: float) -> None:
        nranks = job.nnodes * GPUS_PER_NODE
        folder = self.folder / f"{job.namespace}_{job.pod}_{job.uid}"  # as subPathExpr names it
        folder.mkdir(parents=True, exist_ok=True)
        dump_us = int(now() * 1e6)
        for local in range(GPUS_PER_NODE):
            key = (job.namespace, job.pod, job.restarts, local)
            rank = self._ranks.get(key)
            if rank is None:
                pid = 101 + 20 * job.restarts + local
                rank = self._ranks[key] = _Rank(folder / f"{job.pod}-pid{pid}.log", pid)
            writer = RecordWriter(
                comm_id=job.comm_id,
                comm_name="DP",
                rank=job.node_index * GPUS_PER_NODE + local,
                nranks=nranks,
                nnodes=job.nnodes,
                hostname=job.pod,
                pid=rank.pid,
            )
            lines = []
            for collective, message_bytes, per_tick in JSON_MIX:
                for _ in range(max(1, round(per_tick * activity))):
                    rank.sn += 1
                    micros = self._micros(job, collective, message_bytes, nranks)
                    op = TimedCollective(collective, rank.sn, message_bytes, micros)
                    lines.append(json_record(writer, op, dump_us))
            with open(rank.path, "a") as handle:
                handle.write("\n".join(lines) + "\n")

    def _collect_prom(self, job: SimJob, activity: float) -> None:
        pending = self._prom_pending.setdefault((job.namespace, job.pod), [])
        for collective, message_bytes, per_tick in PROM_MIX:
            for _ in range(max(1, round(per_tick * activity))):
                micros = self._micros(job, collective, message_bytes, GPUS_PER_NODE)
                bus = plugin_bandwidths(collective, message_bytes, micros, GPUS_PER_NODE)[1]
                pending.append((collective, message_bytes, micros, bus))

    def _write_prom(self, jobs: list[SimJob]) -> None:
        """One dump: each single-node job's GPU file rewritten in place with the interval's buckets."""
        intervals, self._prom_pending = self._prom_pending, {}
        for job in jobs:
            pending = intervals.get((job.namespace, job.pod), [])
            if not pending:
                continue
            buckets: dict[tuple[str, str], tuple[list[int], list[float]]] = {}
            for collective, message_bytes, micros, bus in pending:
                times, buses = buckets.setdefault((collective, size_range(message_bytes)), ([], []))
                times.append(micros)
                buses.append(bus)
            lines = []
            for (collective, size), (times, buses) in sorted(buckets.items()):
                labels = (
                    f'version="v5.1",slurm_job_id="unknown",node="{job.pod}",gpu="GPU0",comm_name="eval",'
                    f'n_nodes="1",nranks="{GPUS_PER_NODE}",collective="{collective}",message_size="{size}",'
                    'algo_proto="NVLS_Simple"'
                )
                lines += prom_bucket_lines(labels, times, buses)
            folder = self.folder / f"{job.namespace}_{job.pod}_{job.uid}"  # as subPathExpr names it
            folder.mkdir(parents=True, exist_ok=True)
            uuid = job.uid.split("-", 1)[0]
            with open(folder / f"nccl_inspector_metrics_{uuid}.prom", "w") as handle:  # in place, as the plugin does
                handle.write("\n".join(lines) + "\n")

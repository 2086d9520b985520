"""Simulated probe and pre-flight result files in ``<root>/probe-results``.

What the node's hostPath holds on a busy training node, written with the real result-file
writer so the exporter reads them like any other:

* ``preflight`` of ``ml-training/llama-70b-worker-0`` (the pod holding the simulated GPUs):
  every host check passed, and its gang-wide all-reduce over 2 nodes ran on InfiniBand with
  GPUDirect RDMA at about 355 GB/s bus bandwidth;
* ``preflight`` of ``research/gpt-neox-worker-1``, a pod stuck in ``Init:Error``: the
  container got no ``/dev/infiniband/uverbs*`` device, so its gang probe ran on TCP sockets
  (``probe_transport`` failed) at a fraction of the bandwidth;
* ``job``: a two-node probe Job (``ccl-exporter/ccl-probe-0``) from ten minutes before start.

Scheduled probes are not simulated here: the exporter runs real ones (gloo) once the
simulated GPUs are idle.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

from ccl_sim.clock import SimClock, now
from ccl_sim.nvml import TRAINING_NAMESPACE, TRAINING_POD
from ccl_sim.paths import simulated_paths
from ccl_sim.podlogs import sim_pod_uid
from exporter.probe.formulas import busbw_factor, size_sweep
from exporter.results.probe_file import Check, CollectiveResult, ProbeResult, Row, Transport, write_result

HOSTNAME = "gpu-node-07"
RANKS, NODES = 16, 2
RDMA_PEAK_BUSBW = 355e9  # two-node H200 all-reduce over 8 x 400G InfiniBand
TCP_PEAK_BUSBW = 24e9
HALF_PEAK_BYTES = 64 << 20  # size at which a collective reaches half its peak
HOST_CHECKS_PASSED = (
    Check("rdma_devices", True, "8 RDMA device(s): mlx5_0, mlx5_1, mlx5_2, mlx5_3, mlx5_4, mlx5_5, mlx5_6, mlx5_7"),
    Check(
        "uverbs_devices",
        True,
        "8 uverbs device(s): uverbs0, uverbs1, uverbs2, uverbs3, uverbs4, uverbs5, uverbs6, uverbs7",
    ),
    Check("port_state", True, "8 port(s) ACTIVE/LinkUp"),
    Check("port_rate", True, "8 port(s) at >= 400 Gb/s"),
    Check("port_link_layer", True, "8 port(s) on InfiniBand"),
    Check("gpudirect_rdma", True, "nvidia_peermem loaded (/sys/module/nvidia_peermem)"),
    Check("nccl_env", True, "NCCL environment does not force sockets"),
)


def sweep(collective: str, peak_busbw: float, min_bytes: int, max_bytes: int) -> tuple[Row, ...]:
    """nccl-tests rows whose busbw rises towards ``peak_busbw`` as sizes grow."""
    rows = []
    for size in size_sweep(min_bytes, max_bytes):
        bus = peak_busbw * size / (size + HALF_PEAK_BYTES)
        alg = bus / busbw_factor(collective, RANKS)
        rows.append(Row(size, size // 4, "float", size / alg, alg, bus, 0))
    return tuple(rows)


def results(now: float) -> list[ProbeResult]:
    rdma = Transport("rdma", "net_ib", "IB", True, ("Using network IB; inter-node channels via NET/IB/*/GDRDMA",))
    tcp = Transport(
        "tcp",
        "net_socket",
        "Socket",
        None,
        ("NET/IB : No device found; Using network Socket: inter-node traffic on TCP",),
    )
    tcp_all_reduce = CollectiveResult("all_reduce", sweep("all_reduce", TCP_PEAK_BUSBW, 256 << 20, 1 << 30))
    tcp_average = (tcp_all_reduce.average_busbw or 0.0) / 1e9
    probe_result = partial(
        ProbeResult, hostname=HOSTNAME, backend="nccl", world_size=RANKS, nnodes=NODES, scope="inter_node"
    )
    return [
        probe_result(
            source="preflight",
            started_at=now - 3700,
            finished_at=now - 3640,
            namespace=TRAINING_NAMESPACE,
            pod=TRAINING_POD,
            pod_uid=sim_pod_uid(TRAINING_NAMESPACE, TRAINING_POD),
            job_name="llama-70b",
            transport=rdma,
            collectives=(CollectiveResult("all_reduce", sweep("all_reduce", RDMA_PEAK_BUSBW, 256 << 20, 1 << 30)),),
            checks=HOST_CHECKS_PASSED
            + (
                Check("probe", True, f"1 collective(s) correct on {RANKS} ranks, {NODES} node(s)"),
                Check("probe_transport", True, "traffic ran on net_ib (rdma, NCCL network IB, GPUDirect RDMA True)"),
                Check("probe_bandwidth", True, "average busbw >= 100 GB/s"),
            ),
        ),
        probe_result(
            source="preflight",
            started_at=now - 900,
            finished_at=now - 840,
            namespace="research",
            pod="gpt-neox-worker-1",
            pod_uid=sim_pod_uid("research", "gpt-neox-worker-1"),
            job_name="gpt-neox",
            transport=tcp,
            collectives=(tcp_all_reduce,),
            checks=tuple(c for c in HOST_CHECKS_PASSED if c.check != "uverbs_devices")
            + (
                Check(
                    "uverbs_devices",
                    False,
                    "no /dev/infiniband/uverbs* in the container: verbs cannot open the "
                    "RDMA devices, NCCL will fall back to sockets (request the RDMA device-plugin resource)",
                ),
                Check("probe", True, f"1 collective(s) correct on {RANKS} ranks, {NODES} node(s)"),
                Check("probe_transport", False, "traffic ran on net_socket (tcp, NCCL network Socket), expected rdma"),
                Check(
                    "probe_bandwidth",
                    False,
                    f"all_reduce average busbw {tcp_average:.2f} GB/s (expected at least 100 GB/s)",
                ),
            ),
        ),
        probe_result(
            source="job",
            started_at=now - 660,
            finished_at=now - 600,
            namespace="ccl-exporter",
            pod="ccl-probe-0",
            pod_uid=sim_pod_uid("ccl-exporter", "ccl-probe-0"),
            job_name="ccl-probe",
            transport=rdma,
            collectives=(
                CollectiveResult("all_reduce", sweep("all_reduce", RDMA_PEAK_BUSBW, 8 << 20, 4 << 30)),
                CollectiveResult("all_gather", sweep("all_gather", 0.93 * RDMA_PEAK_BUSBW, 8 << 20, 4 << 30)),
            ),
        ),
    ]


@dataclass
class SimProbeResults:
    """Writes the result files once; the exporter's own scheduled probes add theirs."""

    def setup(self, root: Path) -> None:
        for result in results(now()):
            write_result(simulated_paths(root).probe_results, result)

    def advance(self, clock: SimClock) -> None:
        """The files do not change; their age grows with the wall clock."""

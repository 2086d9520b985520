"""Simulated pod logs: CRI-format logs of training pods with real-looking NCCL 2.21 output.

``SimPodLogs`` lays out ``<root>/pods/<namespace>_<pod>_<uid>/<container>/<n>.log`` as the
kubelet does, with three pods:

* ``ml-training/llama-70b-worker-0`` (PyTorchJob ``llama-70b``, the pod that holds the
  simulated GPUs): 2 nodes x 8 GPUs on
  InfiniBand with GPUDirect RDMA — healthy;
* ``research/bert-finetune-worker-0`` (PyTorchJob ``bert-finetune``): 2 nodes whose NCCL found
  no IB device and fell back to ``Socket`` — the silent TCP fallback;
* ``vision/resnet-eval-0`` (batch Job ``resnet-eval``): one node, P2P over NVLink plus NVLS;
* ``nlp/gpt-neox-worker-0`` (PyTorchJob ``gpt-neox``): 2 nodes on InfiniBand with crossed rails:
  each GPU's inter-node channels leave through a NIC on the other socket (``SYS``), where the
  llama pod's leave through the NIC beside the GPU (``PIX``). Multus attached its NICs (its pod
  carries a ``k8s.v1.cni.cncf.io/network-status`` annotation).

Each tick appends ordinary training output (step lines) to the running pods. The part is
also the simulated node's ``PodMetadataSource`` (there is no API server in simulate mode):
it answers with the job attribution of its own pods' labels. ``start_job``, ``stop_job``
and ``restart_job`` let demos and end-to-end tests make a job appear, vanish, or come back
on another network.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ccl_sim.clock import SimClock, cri_timestamp
from ccl_sim.nvml import GPU_BUSES, TRAINING_NAMESPACE, TRAINING_POD, rail_nics
from ccl_sim.paths import simulated_paths
from exporter.sources.kube import EXPECTED_NETWORK_LABEL, PodMetadata, attribute_job
from exporter.sources.multus import NETWORK_STATUS_ANNOTATION, attached_devices

NCCL_VERSION = "2.21.5"
CUDA_VERSION = "12.4"
GPUS_PER_NODE = 8


def pytorchjob_labels(job_name: str, replica_type: str = "worker", index: int = 0) -> dict[str, str]:
    """Labels the Kubeflow training-operator puts on a PyTorchJob pod."""
    labels = {
        "training.kubeflow.org/job-name": job_name,
        "training.kubeflow.org/operator-name": "pytorchjob-controller",
        "training.kubeflow.org/replica-type": replica_type,
        "training.kubeflow.org/replica-index": str(index),
    }
    if index == 0 and replica_type == "master":
        labels["training.kubeflow.org/job-role"] = "master"
    return labels


def batch_job_labels(job_name: str) -> dict[str, str]:
    return {"batch.kubernetes.io/job-name": job_name, "job-name": job_name}


@dataclass
class SimJob:
    """One simulated training pod on this node and how its NCCL is set up."""

    namespace: str
    pod: str
    labels: dict[str, str]
    network: str = "IB"  # "IB" or "Socket"
    nnodes: int = 2
    gdr: bool = True
    nvls: bool = False
    container: str = "pytorch"
    node_index: int = 0  # this node's place in the job: ranks [node_index*8, node_index*8+8)
    # False: the log leaves placement open (NCCL 2.18, no nNodes line; an 8-rank communicator with
    # 4 ranks on each of two nodes, only this node's ranks in the log) -- what cluster context decides
    placement_shown: bool = True
    # "aligned": GPU i's NET channels use NIC i (beside it); "crossed": NIC (i + 4) % 8, the other socket's
    rails: str = "aligned"
    # The pod's k8s.v1.cni.cncf.io/network-status annotation ("" when Multus attached nothing)
    network_status: str = ""
    restarts: int = 0
    step: int = 0
    uid: str = field(default="")

    def __post_init__(self) -> None:
        if not self.uid:
            self.uid = sim_pod_uid(self.namespace, self.pod)

    def nic_index(self, local: int) -> int:
        """The NET device (the [i] of NET/IB : Using) local rank ``local`` sends through."""
        return local if self.rails == "aligned" else (local + GPUS_PER_NODE // 2) % GPUS_PER_NODE

    @property
    def comm_id(self) -> str:
        digest = hashlib.sha1(f"{self.namespace}/{self.labels}/{self.restarts}".encode()).hexdigest()
        return "0x" + digest[:16]


def sim_pod_uid(namespace: str, pod: str) -> str:
    """The UID a simulated pod has (the same for the same name, as the result files expect)."""
    digest = hashlib.sha1(f"{namespace}/{pod}".encode()).hexdigest()
    return f"{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def _cri(line: str, stream: str = "stdout") -> str:
    return f"{cri_timestamp()} {stream} F {line}\n"


def nccl_init_lines_placement_open(job: SimJob) -> list[str]:
    """NCCL 2.18.3 at INFO for a communicator of 8 ranks, 4 on this node and 4 on another: 2.18
    prints no nNodes line, and this pod's log names only its own ranks, so nothing in it says where
    ranks 4-7 are (a pipeline group across two nodes, say). The pod holds all 8 GPUs of the node."""
    host, nranks, local_ranks = job.pod, GPUS_PER_NODE, GPUS_PER_NODE // 2
    base_pid = 101 + 20 * job.restarts
    lines = ["NCCL version 2.18.3+cuda12.2"]
    for local in range(local_ranks):
        pid = base_pid + local
        p = f"{host}:{pid}:{pid} [{local}] NCCL INFO "
        comm = f"0x{0x55D4C0A1B000 + 0x1000 * local:x}"
        init = (
            f"comm {comm} rank {local} nranks {nranks} cudaDev {local} nvmlDev {local} busId "
            f"{GPU_BUSES[local]:x}000 commId {job.comm_id}"
        )
        lines += [p + "Bootstrap : Using eth0:10.0.3.17<0>"]
        if job.network == "IB":
            lines.append(p + "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]; OOB eth0:10.0.3.17<0>")
        else:
            lines += [p + "NET/IB : No device found.", p + "NET/Socket : Using [0]eth0:10.0.3.17<0>"]
        lines += [p + f"Using network {job.network}", p + f"{init} - Init START"]
        if local < local_ranks - 1:
            lines.append(p + f"Channel 00/0 : {local}[{local}] -> {local + 1}[{local + 1}] via P2P/IPC/read")
        else:
            lines.append(
                p + f"Channel 00/0 : {local}[{local}] -> {local + 1}[{local + 1}] [send] via NET/{job.network}/0"
            )
        lines.append(p + f"{init} - Init COMPLETE")
    return lines


def nccl_init_lines(job: SimJob) -> list[str]:
    """What NCCL 2.21 prints at INFO while the job's first communicator is built on this node."""
    if not job.placement_shown:
        return nccl_init_lines_placement_open(job)
    host = job.pod
    nranks = job.nnodes * GPUS_PER_NODE
    first = job.node_index * GPUS_PER_NODE
    base_pid = 101 + 20 * job.restarts
    lines = [f"NCCL version {NCCL_VERSION}+cuda{CUDA_VERSION}"] if first == 0 else []
    comm_id = job.comm_id
    nvls_note = "NVLS multicast support is available on dev {dev}"
    for local in range(GPUS_PER_NODE):
        rank, pid = first + local, base_pid + local
        p = f"{host}:{pid}:{pid} [{local}] NCCL INFO "
        comm = f"0x{0x55D4C0A1B000 + 0x1000 * local:x}"
        bus = f"{GPU_BUSES[local]:x}000"
        lines += [
            p + "cudaDriverVersion 12040",
            p + "Bootstrap : Using eth0:10.0.3.17<0>",
            p + "NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.",
        ]
        if job.network == "IB":
            devices = " ".join(f"[{i}]mlx5_{i}:1/IB" for i in range(8))
            lines.append(p + f"NET/IB : Using {devices} [RO]; OOB eth0:10.0.3.17<0>")
        else:
            lines += [p + "NET/IB : No device found.", p + "NET/Socket : Using [0]eth0:10.0.3.17<0>"]
        lines += [
            p + "Using non-device net plugin version 0",
            p + f"Using network {job.network}",
            p + f"ncclCommInitRank comm {comm} rank {rank} nranks {nranks} cudaDev {local} nvmlDev {local} "
            f"busId {bus} commId {comm_id} - Init START",
            p + f"comm {comm} rank {rank} nRanks {nranks} nNodes {job.nnodes} localRanks {GPUS_PER_NODE} "
            f"localRank {local} MNNVL 0",
        ]
        if job.nvls:
            lines.append(p + nvls_note.format(dev=local))
        ring = " ".join(f"{r:4d}" for r in range(nranks))
        for channel in range(2):
            if local == 0:
                lines.append(p + f"Channel {channel:02d}/02 : {ring}")
            nxt = rank + 1 if local < GPUS_PER_NODE - 1 else (first + GPUS_PER_NODE) % nranks
            prev = rank - 1 if local > 0 else (first - 1) % nranks
            suffix = "/GDRDMA" if job.gdr and job.network == "IB" else ""
            if local == GPUS_PER_NODE - 1 and job.nnodes > 1:
                lines.append(
                    p + f"Channel {channel:02d}/0 : {rank}[{local}] -> {nxt}[0] [send] via "
                    f"NET/{job.network}/{_net_device(job, local, channel)}{suffix}"
                )
            else:
                lines.append(
                    p + f"Channel {channel:02d}/0 : {rank}[{local}] -> {nxt}[{(local + 1) % 8}] via P2P/CUMEM/read"
                )
            if local == 0 and job.nnodes > 1:
                lines.append(
                    p + f"Channel {channel:02d}/0 : {prev}[7] -> {rank}[{local}] [receive] via "
                    f"NET/{job.network}/{_net_device(job, local, channel)}{suffix}"
                )
        lines.append(p + "Connected all rings")
        if job.nvls:
            lines += [
                p + f"NVLS comm {comm} headRank {local} nHeads {GPUS_PER_NODE} buffSize 4194304 memSize 2097152 "
                "nvlsPerRankSize 201326592 nvlsTotalSize 1610612736",
                p + "Connected NVLS tree",
            ]
        lines += [
            p
            + "32 coll channels, 32 collnet channels, "
            + ("16" if job.nvls else "0")
            + " nvls channels, 32 p2p channels, 32 p2p channels per peer",
            p + f"ncclCommInitRank comm {comm} rank {rank} nranks {nranks} cudaDev {local} nvmlDev {local} "
            f"busId {bus} commId {comm_id} - Init COMPLETE",
        ]
    return lines


def _net_device(job: SimJob, local: int, channel: int) -> int:
    """The NET device index of a channel line: on IB the NIC of the rank's rail (eight devices
    listed); on Socket the channel's, as before."""
    return job.nic_index(local) if job.network == "IB" else channel


def multus_network_status(nics: list[tuple[str, str]]) -> str:
    """A network-status annotation as Multus writes it: the default network, then one SR-IOV
    attachment per (RDMA device, PCI address) with its device-info."""
    entries: list[dict[str, object]] = [{"name": "cbr0", "ips": ["10.244.1.73"], "default": True, "dns": {}}]
    for i, (rdma, address) in enumerate(nics):
        entries.append(
            {
                "name": f"nlp/rdma-rail-{i}",
                "interface": f"net{i + 1}",
                "ips": [f"192.168.{100 + i}.11"],
                "mac": f"86:1d:96:ff:55:{i:02x}",
                "dns": {},
                "device-info": {
                    "type": "pci",
                    "version": "1.1.0",
                    "pci": {"pci-address": address, "rdma-device": rdma},
                },
            }
        )
    return json.dumps(entries)


def default_jobs() -> list[SimJob]:
    return [
        SimJob(TRAINING_NAMESPACE, TRAINING_POD, pytorchjob_labels("llama-70b"), network="IB", nnodes=2),
        SimJob(
            "research",
            "bert-finetune-worker-0",
            pytorchjob_labels("bert-finetune"),
            network="Socket",
            nnodes=2,
            gdr=False,
        ),
        SimJob("vision", "resnet-eval-0", batch_job_labels("resnet-eval"), network="IB", nnodes=1, nvls=True),
        SimJob(
            "nlp",
            "gpt-neox-worker-0",
            pytorchjob_labels("gpt-neox"),
            network="IB",
            nnodes=2,
            rails="crossed",
            network_status=multus_network_status(rail_nics()),
        ),
    ]


@dataclass
class SimPodLogs:
    """The simulated node's pod logs and pod metadata; see the module docstring."""

    rng: random.Random
    jobs: list[SimJob] = field(default_factory=default_jobs)
    root: Path | None = None

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[tuple[str, str], SimJob] = {}

    @property
    def pod_logs(self) -> Path:
        assert self.root is not None, "setup() first"
        return simulated_paths(self.root).pod_logs

    def _log_path(self, job: SimJob) -> Path:
        folder = self.pod_logs / f"{job.namespace}_{job.pod}_{job.uid}" / job.container
        return folder / f"{job.restarts}.log"

    def _append(self, job: SimJob, lines: list[str], stream: str = "stdout") -> None:
        path = self._log_path(job)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as handle:
            handle.write("".join(_cri(line, stream) for line in lines))

    def setup(self, root: Path) -> None:
        self.root = root
        self.pod_logs.mkdir(parents=True, exist_ok=True)
        for job in self.jobs:
            self.start_job(job)

    def start_job(self, job: SimJob) -> SimJob:
        """Start a pod: its log folder appears with startup output and NCCL's init lines."""
        with self._lock:
            self._running[(job.namespace, job.pod)] = job
        self._append(
            job,
            [f"[rank{job.node_index * GPUS_PER_NODE}]: starting {job.pod}, world size {job.nnodes * GPUS_PER_NODE}"],
        )
        self._append(job, nccl_init_lines(job))
        return job

    def restart_job(
        self,
        namespace: str,
        pod: str,
        *,
        network: str | None = None,
        gdr: bool | None = None,
        placement_shown: bool | None = None,
    ) -> SimJob:
        """The container restarts (``<n+1>.log``) and NCCL comes back, on ``network`` if given.

        ``restart_job(ns, pod, network="Socket", gdr=False)`` is how a healthy job is made to
        fall back to TCP in a demo; ``placement_shown=False`` makes its log leave the placement open.
        """
        with self._lock:
            job = self._running[(namespace, pod)]
            job.restarts += 1
            job.step = 0
            if network is not None:
                job.network = network
            if gdr is not None:
                job.gdr = gdr
            if placement_shown is not None:
                job.placement_shown = placement_shown
        self._append(job, nccl_init_lines(job))
        return job

    def stop_job(self, namespace: str, pod: str) -> None:
        """The pod is deleted: the kubelet removes its log folder."""
        with self._lock:
            job = self._running.pop((namespace, pod), None)
        if job is not None:
            shutil.rmtree(self._log_path(job).parent.parent, ignore_errors=True)

    def advance(self, clock: SimClock) -> None:
        with self._lock:
            running = list(self._running.values())
        for job in running:
            job.step += 1
            loss = 2.5 / (1 + 0.01 * job.step) + self.rng.uniform(-0.02, 0.02)
            step_time = (12.4 if job.network == "Socket" and job.nnodes > 1 else 6.1) * self.rng.uniform(0.97, 1.03)
            self._append(job, [f"[rank0]: step {job.step} loss {loss:.4f} step_time {step_time:.2f}s"])

    def running(self) -> list[SimJob]:
        """The pods running now (what other simulated parts write output for)."""
        with self._lock:
            return list(self._running.values())

    # PodMetadataSource
    def lookup(self, namespace: str, pod: str) -> PodMetadata | None:
        with self._lock:
            job = self._running.get((namespace, pod))
        return None if job is None else self._metadata(job)

    @staticmethod
    def _metadata(job: SimJob) -> PodMetadata:
        job_name, job_kind = attribute_job(job.labels, ())
        return PodMetadata(
            job.namespace,
            job.pod,
            job.uid,
            job_name,
            job_kind,
            job.labels.get(EXPECTED_NETWORK_LABEL, ""),
            host_network=False,
            attached_devices=attached_devices({NETWORK_STATUS_ANNOTATION: job.network_status}),
            fabric_ready_gate=True,  # as if the webhook had added the readiness gate to every training pod
        )

    def is_authoritative(self) -> bool:
        return True

    def pods(self) -> list[PodMetadata]:
        with self._lock:
            jobs = list(self._running.values())
        return sorted((self._metadata(job) for job in jobs), key=lambda p: (p.namespace, p.name))

"""Runs the probe's worker processes and turns what they print into a ``ProbeResult``.

This module never imports torch: the workers (``exporter.probe.worker``) do, each in its own
process. The runner

* spawns one worker per local rank with the torchrun environment (``RANK``, ``WORLD_SIZE``,
  ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``); across nodes every
  node runs the same command with its own ``node_rank``, as ``torchrun --nnodes`` does;
* sets ``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET`` and feeds the workers' output to the
  project's NCCL log parser, so the result names the network and transport the traffic
  actually used (a probe that ran on TCP says so whatever its bandwidth);
* enforces one hard timeout for the whole probe, killing every worker's process group;
* keeps at most ``MAX_CAPTURED_LINES`` lines of worker output, each cut at ``MAX_LINE_CHARS``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from exporter.nccl import LogAnalyzer
from exporter.probe.worker import RESULT_PREFIX
from exporter.results.probe_file import CollectiveResult, ProbeResult, Row, Transport

MAX_CAPTURED_LINES = 20_000
MAX_LINE_CHARS = 4096
TAIL_LINES = 20
NCCL_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
GLOO_TRANSPORT = Transport(
    kind="tcp",
    name="gloo/tcp",
    network=None,
    gdr=None,
    reasons=("backend gloo moves tensors over TCP sockets (loopback on one node); it never uses RDMA",),
)
# The NCCL log parser's verdicts, mapped to the result's transport kinds.
VERDICT_KINDS = {"rdma": "rdma", "tcp_fallback": "tcp", "single_node": "intra_node", "unknown": "unknown"}


class NcclLogAnalyzer(Protocol):
    """What the runner needs of ``exporter.nccl.LogAnalyzer``."""

    def feed(self, line: str) -> None: ...

    def result(self) -> Any: ...


def default_analyzer() -> NcclLogAnalyzer:
    """The project's own NCCL log parser (the one behind ``ccl-exporter analyze``)."""
    return LogAnalyzer()


@dataclass(frozen=True)
class Rendezvous:
    """Where the ranks meet: torchrun's static rendezvous (``--nnodes``, ``--node-rank``)."""

    master_addr: str = "127.0.0.1"
    master_port: int = 0  # 0: pick a free loopback port (single node only)
    nnodes: int = 1
    node_rank: int = 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Rendezvous:
        """torchrun / PyTorchJob / indexed-Job variables; a single loopback node when absent."""

        def first(*names: str, default: str) -> str:
            for name in names:
                if environ.get(name):
                    return environ[name]
            return default

        return cls(
            master_addr=first("MASTER_ADDR", default="127.0.0.1"),
            master_port=int(first("MASTER_PORT", default="0")),
            nnodes=int(first("NNODES", "PET_NNODES", default="1")),
            node_rank=int(first("NODE_RANK", "PET_NODE_RANK", "JOB_COMPLETION_INDEX", default="0")),
        )


@dataclass(frozen=True)
class ProbeRequest:
    backend: str  # "nccl" or "gloo" (already resolved from "auto")
    nprocs: int  # ranks on this node
    collectives: tuple[str, ...]
    sizes: tuple[int, ...]
    iters: int = 20
    warmup_iters: int = 5
    timeout_seconds: float = 300.0
    rendezvous: Rendezvous = field(default_factory=Rendezvous)
    python: str = sys.executable  # the interpreter the workers run with (it needs torch)


# The pod's identity from the downward API: the CCL_POD_* variables the admission webhook sets
# from metadata.* whatever the pod's spec says, then the POD_* names of hand-written manifests.
POD_IDENTITY_VARIABLES = (
    ("namespace", ("CCL_POD_NAMESPACE", "POD_NAMESPACE")),
    ("pod", ("CCL_POD_NAME", "POD_NAME")),
    ("pod_uid", ("CCL_POD_UID", "POD_UID")),
)


@dataclass(frozen=True)
class Identity:
    """Who ran the probe (downward API env of the pod), for the result file and labels. The
    exporter uses a pod's result only with the pod's UID (``exporter.sources.probe_results``)."""

    source: str = "job"
    namespace: str = ""
    pod: str = ""
    job_name: str = ""
    pod_uid: str = ""

    @classmethod
    def from_env(cls, source: str, environ: Mapping[str, str]) -> Identity:
        if source == "scheduled":  # the exporter's own probe: about the node, not a pod
            return cls(source=source)
        found = {
            field_name: next((environ[name] for name in names if environ.get(name)), "")
            for field_name, names in POD_IDENTITY_VARIABLES
        }
        return cls(
            source=source,
            namespace=found["namespace"],
            pod=found["pod"],
            pod_uid=found["pod_uid"],
            job_name=environ.get("JOB_NAME", ""),
        )

    def unattributable(self) -> str | None:
        """Why the exporter will use this run's result for no pod (None: it names a pod and its UID)."""
        if self.source == "scheduled" or not self.pod:
            return None
        if not self.pod_uid:
            return (
                "no pod UID (set CCL_POD_UID from the downward API, fieldPath metadata.uid): the exporter "
                f"uses a result for {self.namespace}/{self.pod} only with that pod's UID"
            )
        return None


def visible_gpu_count(procfs: Path, environ: Mapping[str, str]) -> int:
    """GPUs this container may use: ``CUDA_VISIBLE_DEVICES`` if set, else ``<procfs>/driver/nvidia/gpus``."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    try:
        return len(os.listdir(procfs / "driver" / "nvidia" / "gpus"))
    except OSError:
        return 0


def resolve_backend(requested: str, gpu_count: int) -> str:
    """``auto`` is NCCL when the node has GPUs, gloo on CPU otherwise."""
    if requested == "auto":
        return "nccl" if gpu_count > 0 else "gloo"
    if requested not in ("nccl", "gloo"):
        raise ValueError(f"backend {requested!r} is not auto, nccl or gloo")
    return requested


def _free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class _Capture:
    """One worker's output: protocol messages, bounded NCCL lines, a short tail for errors."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    log_lines: list[str] = field(default_factory=list)
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    dropped: int = 0


def _read_output(stream: Any, capture: _Capture, budget: list[int], lock: threading.Lock) -> None:
    for raw in stream:
        line = raw.rstrip("\n")[:MAX_LINE_CHARS]
        if line.startswith(RESULT_PREFIX):
            try:
                message = json.loads(line[len(RESULT_PREFIX) :])
            except ValueError:
                message = None
            if isinstance(message, dict) and len(capture.messages) < 10_000:
                capture.messages.append(message)
                continue
        capture.tail.append(line)
        with lock:
            if budget[0] > 0:
                budget[0] -= 1
                capture.log_lines.append(line)
            else:
                capture.dropped += 1


def worker_env(request: ProbeRequest, local_rank: int, master_port: int, environ: Mapping[str, str]) -> dict[str, str]:
    rdzv = request.rendezvous
    env = dict(environ)
    env.pop("NCCL_DEBUG_FILE", None)  # NCCL's lines must reach our pipe, not a file
    env.update(NCCL_ENV)
    env.update(
        RANK=str(rdzv.node_rank * request.nprocs + local_rank),
        WORLD_SIZE=str(rdzv.nnodes * request.nprocs),
        LOCAL_RANK=str(local_rank),
        LOCAL_WORLD_SIZE=str(request.nprocs),
        GROUP_RANK=str(rdzv.node_rank),
        MASTER_ADDR=rdzv.master_addr,
        MASTER_PORT=str(master_port),
        PYTHONUNBUFFERED="1",
    )
    if request.backend == "gloo":
        env["OMP_NUM_THREADS"] = "1"
    return env


def worker_command(request: ProbeRequest) -> list[str]:
    return [
        request.python,
        "-m",
        "exporter.probe.worker",
        "--backend",
        request.backend,
        "--collectives",
        ",".join(request.collectives),
        "--sizes",
        ",".join(str(s) for s in request.sizes),
        "--iters",
        str(request.iters),
        "--warmup-iters",
        str(request.warmup_iters),
        "--timeout",
        str(max(1.0, request.timeout_seconds)),
    ]


def transport_from_nccl(analyzer: NcclLogAnalyzer, lines: list[str]) -> Transport:
    """The transport NCCL reported using, as decided by the project's NCCL parser."""
    for line in lines:
        analyzer.feed(line)
    verdict = analyzer.result()
    inter_node: set[str] = set()
    every: set[str] = set()
    for communicator in getattr(verdict, "communicators", None) or ():
        for key in getattr(communicator, "transports", None) or {}:
            # keys are (transport, scope, gdr); the inter-node ones say what crossed the network
            transport, scope = (key[0], key[1]) if isinstance(key, tuple) and len(key) > 1 else (key, "")
            every.add(str(transport))
            if scope == "inter_node":
                inter_node.add(str(transport))
    names = inter_node or every
    kind = VERDICT_KINDS.get(str(getattr(verdict, "verdict", "unknown")), "unknown")
    gdr = getattr(verdict, "gdr", None)
    return Transport(
        kind=kind,
        name="+".join(sorted(names)) or (str(verdict.network) if getattr(verdict, "network", None) else "unknown"),
        network=getattr(verdict, "network", None),
        gdr=gdr if gdr in (True, False, None, "mixed") else None,
        reasons=tuple(str(r) for r in (getattr(verdict, "reasons", None) or ())),
    )


def run_probe(
    request: ProbeRequest,
    identity: Identity = Identity(),
    environ: Mapping[str, str] | None = None,
    analyzer_factory: Callable[[], NcclLogAnalyzer] = default_analyzer,
    clock: Callable[[], float] = time.time,
) -> ProbeResult:
    """Run the workers of this node to completion or timeout; never raises for a failed probe."""
    environ = os.environ if environ is None else environ
    started = clock()
    rdzv = request.rendezvous
    port = rdzv.master_port or (_free_loopback_port() if rdzv.nnodes == 1 else 29500)
    captures = [_Capture() for _ in range(request.nprocs)]
    budget, lock = [MAX_CAPTURED_LINES], threading.Lock()
    procs: list[subprocess.Popen[str]] = []
    readers: list[threading.Thread] = []
    error: str | None = None
    try:
        for local_rank in range(request.nprocs):
            proc = subprocess.Popen(
                worker_command(request),
                env=worker_env(request, local_rank, port, environ),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
            )
            procs.append(proc)
            reader = threading.Thread(
                target=_read_output, args=(proc.stdout, captures[local_rank], budget, lock), daemon=True
            )
            reader.start()
            readers.append(reader)
        deadline = time.monotonic() + request.timeout_seconds
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                error = f"probe timed out after {request.timeout_seconds:g}s"
                break
    except OSError as exc:
        error = f"cannot start probe workers: {exc}"
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()  # workers start no children of their own
        for proc in procs:
            proc.wait()
        for reader in readers:
            reader.join(timeout=5.0)
    return _assemble(request, identity, captures, procs, error, started, clock(), analyzer_factory)


def _assemble(
    request: ProbeRequest,
    identity: Identity,
    captures: list[_Capture],
    procs: list[subprocess.Popen[str]],
    error: str | None,
    started: float,
    finished: float,
    analyzer_factory: Callable[[], NcclLogAnalyzer],
) -> ProbeResult:
    reporter = captures[0] if captures else _Capture()
    start = next((m for m in reporter.messages if m.get("kind") == "start"), {})
    rows: dict[str, list[Row]] = {c: [] for c in request.collectives}
    errors: dict[str, str] = {}
    for message in reporter.messages:
        kind, collective = message.get("kind"), message.get("collective")
        if kind == "row" and collective in rows:
            try:
                rows[collective].append(Row(**{k: message[k] for k in Row.__dataclass_fields__}))
            except (KeyError, TypeError):
                errors.setdefault(collective, f"unreadable result row {message!r}"[:300])
        elif kind == "unsupported" and collective in rows:
            errors[collective] = str(message.get("error"))
    if error is None:
        worker_errors = [m for c in captures for m in c.messages if m.get("kind") == "error"]
        failed = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode != 0]
        if worker_errors:
            first = worker_errors[0]
            error = f"rank {first.get('rank')}: {first.get('error')}"
        elif failed:
            index, code = failed[0]
            last = next((line for line in reversed(captures[index].tail) if line.strip()), "no output")
            error = f"local rank {index} exited with {code}: {last}"
    for collective in request.collectives:
        if not rows[collective] and collective not in errors:
            errors[collective] = error or "no result rows"
    nnodes = int(start.get("nnodes", request.rendezvous.nnodes))
    if request.backend == "gloo":
        transport = GLOO_TRANSPORT
    else:
        lines = [line for c in captures for line in c.log_lines]
        transport = transport_from_nccl(analyzer_factory(), lines)
    return ProbeResult(
        source=identity.source,
        started_at=started,
        finished_at=finished,
        hostname=socket.gethostname(),
        namespace=identity.namespace,
        pod=identity.pod,
        pod_uid=identity.pod_uid,
        job_name=identity.job_name,
        backend=request.backend,
        world_size=int(start.get("world_size", request.rendezvous.nnodes * request.nprocs)),
        nnodes=nnodes,
        scope="inter_node" if nnodes > 1 else "intra_node",
        transport=transport,
        collectives=tuple(
            CollectiveResult(collective=c, rows=tuple(rows[c]), error=errors.get(c)) for c in request.collectives
        ),
        error=error,
    )

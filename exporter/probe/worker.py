"""One rank of the bus-bandwidth probe: ``python -m exporter.probe.worker``.

The only module of the project that imports torch, and only when run as a worker process.
It reads the standard torchrun environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``), so the same worker runs spawned by ``ccl-exporter probe``
on one node, or under ``torchrun`` / a Kubernetes Job across nodes.

Method (nccl-tests): per collective and size, the data is checked for correctness once, then
``warmup`` untimed operations, a barrier, ``iters`` timed operations; a rank's time is its
elapsed time over ``iters``; the reported time is the slowest rank's (MAX over ranks).

Everything the parent needs is one JSON object per line on stdout, prefixed with
``RESULT_PREFIX``; NCCL's own ``NCCL INFO`` lines go to the same stream and are left for
the parent's NCCL parser.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import traceback
from datetime import timedelta
from typing import Any

from exporter.probe.formulas import algbw, align_size, busbw
from exporter.results.probe_file import COLLECTIVES

RESULT_PREFIX = "CCL_PROBE "
TYPE_NAME = "float"
TYPE_SIZE = 4


def emit(kind: str, **fields: Any) -> None:
    print(RESULT_PREFIX + json.dumps({"kind": kind, **fields}, sort_keys=True), flush=True)


class Unsupported(Exception):
    """The backend cannot run this collective (e.g. a gloo build without reduce_scatter)."""


def _run_collective(dist: Any, torch: Any, collective: str, send: Any, recv: Any) -> None:
    try:
        if collective == "all_reduce":
            dist.all_reduce(send)
        elif collective == "all_gather":
            dist.all_gather_into_tensor(recv, send)
        elif collective == "reduce_scatter":
            dist.reduce_scatter_tensor(recv, send)
        elif collective == "broadcast":
            dist.broadcast(send, src=0)
        elif collective == "alltoall":
            dist.all_to_all_single(recv, send)
        else:
            raise ValueError(collective)
    except (RuntimeError, NotImplementedError) as exc:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "not support" in text.lower() or "unsupported" in text.lower() or isinstance(exc, NotImplementedError):
            raise Unsupported(text) from exc
        raise


def _buffers(torch: Any, collective: str, size_bytes: int, rank: int, world: int, device: Any) -> tuple[Any, Any, Any]:
    """(send, recv, expected recv or in-place result) filled with a rank-dependent pattern."""
    count = size_bytes // TYPE_SIZE
    f32 = torch.float32
    if collective == "all_reduce":
        send = torch.full((count,), float(rank + 1), dtype=f32, device=device)
        return send, None, torch.full((count,), float(world * (world + 1) // 2), dtype=f32, device=device)
    if collective == "broadcast":
        send = torch.full((count,), 7.0 if rank == 0 else 0.0, dtype=f32, device=device)
        return send, None, torch.full((count,), 7.0, dtype=f32, device=device)
    chunk = count // world
    ramp = torch.arange(1, world + 1, dtype=f32, device=device).repeat_interleave(chunk)
    if collective == "all_gather":
        send = torch.full((chunk,), float(rank + 1), dtype=f32, device=device)
        return send, torch.zeros(count, dtype=f32, device=device), ramp
    if collective == "reduce_scatter":
        # rank r sends (r+1) x (j+1) to rank j; rank j receives (j+1) x sum(r+1).
        send = ramp * float(rank + 1)
        expected = torch.full((chunk,), float((rank + 1) * world * (world + 1) // 2), dtype=f32, device=device)
        return send, torch.zeros(chunk, dtype=f32, device=device), expected
    # alltoall: rank r sends 100r + j to rank j; rank j receives 100i + j from every rank i.
    send = (ramp - 1) + 100.0 * rank
    expected = (torch.arange(world, dtype=f32, device=device) * 100.0 + rank).repeat_interleave(chunk)
    return send, torch.zeros(count, dtype=f32, device=device), expected


def measure(
    dist: Any, torch: Any, collective: str, size_bytes: int, iters: int, warmup: int, device: Any
) -> dict[str, Any]:
    rank, world = dist.get_rank(), dist.get_world_size()
    size_bytes = align_size(collective, size_bytes, TYPE_SIZE, world)
    send, recv, expected = _buffers(torch, collective, size_bytes, rank, world, device)
    _run_collective(dist, torch, collective, send, recv)
    result = send if recv is None else recv
    wrong = torch.tensor([int((result != expected).sum().item())], dtype=torch.float64, device=device)
    dist.all_reduce(wrong)  # every rank's mismatches, like nccl-tests' #wrong
    del expected
    for _ in range(warmup):
        _run_collective(dist, torch, collective, send, recv)
    dist.barrier()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        _run_collective(dist, torch, collective, send, recv)
    sync()
    elapsed = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank defines the time
    seconds = float(elapsed.item())
    return {
        "size_bytes": size_bytes,
        "count": size_bytes // TYPE_SIZE,
        "type": TYPE_NAME,
        "time_seconds": seconds,
        "algbw_bytes_per_second": algbw(size_bytes, seconds),
        "busbw_bytes_per_second": busbw(collective, size_bytes, seconds, world),
        "wrong": int(wrong.item()),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="exporter.probe.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["nccl", "gloo"], required=True)
    parser.add_argument("--collectives", default="all_reduce", help="comma-separated")
    parser.add_argument("--sizes", required=True, help="comma-separated byte counts")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup-iters", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=120.0, help="process-group timeout, seconds")
    args = parser.parse_args(argv)
    args.collectives = [c for c in args.collectives.split(",") if c]
    unknown = [c for c in args.collectives if c not in COLLECTIVES]
    if unknown:
        parser.error(f"unknown collectives {unknown}")
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        emit(
            "error",
            rank=rank,
            error=f"{exc}: the probe's workers need torch (install the package with its 'probe' extra)",
        )
        return 1
    try:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if args.backend == "nccl":
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
        else:
            torch.set_num_threads(1)  # one core per rank: gloo's ops are single-threaded per op
            device = torch.device("cpu")
        dist.init_process_group(args.backend, init_method="env://", timeout=timedelta(seconds=args.timeout))
        # Every node's first local rank reports (the numbers are global: times are MAX-reduced),
        # so each node of a multi-node probe can write its own result file.
        reporter = local_rank == 0
        hosts: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(hosts, socket.gethostname())
        if reporter:
            emit(
                "start",
                backend=args.backend,
                world_size=dist.get_world_size(),
                nnodes=len(set(hosts)),
                torch_version=torch.__version__,
            )
        for collective in args.collectives:
            for size in args.sizes:
                try:
                    row = measure(dist, torch, collective, size, args.iters, args.warmup_iters, device)
                except Unsupported as exc:
                    if reporter:
                        emit(
                            "unsupported",
                            collective=collective,
                            error=f"backend {args.backend} (torch {torch.__version__}) cannot run {collective}: {exc}",
                        )
                    break
                if reporter:
                    emit("row", collective=collective, **row)
        dist.barrier()
        dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which decides
        emit("error", rank=rank, error=f"{type(exc).__name__}: {exc}".splitlines()[0])
        traceback.print_exc(file=sys.stdout)
        return 1
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        emit("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())

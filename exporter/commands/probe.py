"""``ccl-exporter probe``: an nccl-tests-style bus-bandwidth probe over torch.distributed.

Prints the nccl-tests table (or ``--json``: the result document), names the transport the
traffic actually used, and writes the result file that the exporter on the node picks up.
Exit code 0 when every collective ran with correct data, 1 otherwise, 2 on bad flags.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from exporter.flags import PROBE_RESULTS, Flag
from exporter.probe.formulas import busbw_factor, parse_size, size_sweep
from exporter.probe.runner import Identity, ProbeRequest, Rendezvous, resolve_backend, run_probe, visible_gpu_count
from exporter.results.probe_file import COLLECTIVES, SOURCES, ProbeResult, unwritten_reason, write_result

GB = 1e9  # nccl-tests prints GB/s with GB = 10^9 bytes
PROCFS = Flag("--path.procfs", "/proc", "procfs mount point (GPU discovery for --backend auto)", dest="procfs")


def add_probe_arguments(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """Flags shared by ``probe`` and ``preflight --probe`` (sizes, iterations, rendezvous)."""
    rdzv = Rendezvous.from_env(environ)
    g = parser.add_argument_group("probe (nccl-tests flags)")
    g.add_argument(
        "--backend",
        choices=["auto", "nccl", "gloo"],
        default="auto",
        help="nccl on GPUs, gloo on CPU; auto picks nccl when the node has GPUs",
    )
    g.add_argument(
        "--nprocs", type=int, default=0, help="ranks on this node (default: one per visible GPU with nccl, 2 with gloo)"
    )
    g.add_argument("--collective", default="all_reduce", help=f"comma-separated, or 'all': {', '.join(COLLECTIVES)}")
    g.add_argument("-b", "--minbytes", default="32M", help="smallest size (K/M/G suffixes, powers of 1024)")
    g.add_argument("-e", "--maxbytes", default="32M", help="largest size")
    g.add_argument("-f", "--stepfactor", type=float, default=2.0, help="multiply the size by this each step")
    g.add_argument("-i", "--stepbytes", default="0", help="add this to the size each step (instead of -f)")
    g.add_argument("-n", "--iters", type=int, default=20, help="timed iterations per size")
    g.add_argument("-w", "--warmup-iters", type=int, default=5, help="untimed iterations per size")
    g.add_argument("--timeout", type=float, default=300.0, help="seconds before the whole probe is killed")
    r = parser.add_argument_group("multi-node rendezvous (torchrun's static rendezvous; defaults from env)")
    r.add_argument("--master-addr", default=rdzv.master_addr, help="rank 0's address [env MASTER_ADDR]")
    r.add_argument(
        "--master-port",
        type=int,
        default=rdzv.master_port,
        help="rank 0's port; 0 picks a free loopback port on one node [env MASTER_PORT]",
    )
    r.add_argument("--nnodes", type=int, default=rdzv.nnodes, help="nodes (pods) in the probe [env NNODES, PET_NNODES]")
    r.add_argument(
        "--node-rank",
        type=int,
        default=rdzv.node_rank,
        help="this node's index [env NODE_RANK, PET_NODE_RANK, JOB_COMPLETION_INDEX]",
    )
    PROCFS.add_to(parser, environ)


def request_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> ProbeRequest:
    """A ``ProbeRequest`` from parsed flags; ``ValueError`` with a readable message on bad ones."""
    if args.collective == "all":
        names = list(COLLECTIVES)
    else:
        names = [c.strip() for c in args.collective.split(",") if c.strip()]
    unknown = [c for c in names if c not in COLLECTIVES]
    if unknown or not names:
        raise ValueError(f"--collective {args.collective!r}: choose from {', '.join(COLLECTIVES)} or 'all'")
    gpus = visible_gpu_count(Path(args.procfs), environ)
    backend = resolve_backend(args.backend, gpus)
    nprocs = args.nprocs or (gpus if backend == "nccl" else 2)
    if nprocs < 1:
        raise ValueError("--backend nccl needs at least one visible GPU (or --nprocs)")
    if args.iters < 1 or args.warmup_iters < 0:
        raise ValueError("--iters must be >= 1 and --warmup-iters >= 0")
    if args.nnodes < 1 or not 0 <= args.node_rank < args.nnodes:
        raise ValueError(f"--node-rank {args.node_rank} is not in 0..{args.nnodes - 1}")
    if args.nnodes > 1 and not args.master_port:
        raise ValueError("a multi-node probe needs --master-port (or MASTER_PORT)")
    if args.timeout <= 0:
        raise ValueError("--timeout must be positive")
    sizes = size_sweep(
        parse_size(args.minbytes), parse_size(args.maxbytes), args.stepfactor, parse_size(args.stepbytes)
    )
    return ProbeRequest(
        backend=backend,
        nprocs=nprocs,
        collectives=tuple(names),
        sizes=tuple(sizes),
        iters=args.iters,
        warmup_iters=args.warmup_iters,
        timeout_seconds=args.timeout,
        rendezvous=Rendezvous(args.master_addr, args.master_port, args.nnodes, args.node_rank),
    )


def describe_transport(result: ProbeResult) -> str:
    t = result.transport
    network = f", NCCL network {t.network}" if t.network else ""
    gdr = "" if t.gdr is None else f", GPUDirect RDMA {t.gdr}"
    return f"{t.name} ({t.kind}{network}{gdr})"


def print_table(result: ProbeResult, request: ProbeRequest, out: TextIO) -> None:
    """The nccl-tests table, one block per collective, with its ``# Avg bus bandwidth`` line."""

    def p(text: str = "") -> None:
        print(text, file=out)

    p(
        f"# ccl-exporter probe: backend {result.backend}, {result.world_size} ranks on {result.nnodes} node(s), "
        f"{request.warmup_iters} warm-up + {request.iters} timed iterations, time = slowest rank"
    )
    p(f"# transport: {describe_transport(result)}")
    for reason in result.transport.reasons[:3]:
        p(f"#   {reason}")
    for collective in result.collectives:
        reduces = collective.collective in ("all_reduce", "reduce_scatter")
        p("#")
        factor = busbw_factor(collective.collective, max(1, result.world_size))
        p(f"# {collective.collective}: busbw = algbw x {factor:.4g}")
        p(
            f"# {'size':>12} {'count':>12} {'type':>6} {'redop':>6} {'root':>5} {'time':>10} {'algbw':>8} "
            f"{'busbw':>8} {'#wrong':>7}"
        )
        p(f"# {'(B)':>12} {'(elements)':>12} {'':>6} {'':>6} {'':>5} {'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8} {'':>7}")
        for row in collective.rows:
            root = 0 if collective.collective == "broadcast" else -1
            p(
                f"  {row.size_bytes:>12} {row.count:>12} {row.type:>6} {'sum' if reduces else 'none':>6} {root:>5} "
                f"{row.time_seconds * 1e6:>10.1f} {row.algbw_bytes_per_second / GB:>8.2f} "
                f"{row.busbw_bytes_per_second / GB:>8.2f} {row.wrong:>7}"
            )
        if collective.error:
            p(f"# {collective.collective} FAILED: {collective.error}")
        wrong = sum(r.wrong for r in collective.rows)
        p(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
        average = collective.average_busbw
        p(f"# Avg bus bandwidth    : {average / GB if average is not None else float('nan'):.4f} ")
    if result.error:
        p(f"# probe FAILED: {result.error}")


def run_probe_command(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None, out: TextIO | None = None
) -> int:
    environ = os.environ if environ is None else environ
    out = sys.stdout if out is None else out
    try:
        request = request_from_args(args, environ)
    except ValueError as exc:
        print(f"ccl-exporter probe: {exc}", file=sys.stderr)
        return 2
    identity = Identity.from_env(args.source, environ)
    result = run_probe(request, identity, environ)
    if args.write_results:
        try:
            path = write_result(Path(args.probe_results), result)
            why = identity.unattributable()
            print(f"ccl-exporter probe: result written to {path}{f' with {why}' if why else ''}", file=sys.stderr)
        except OSError as exc:
            print(
                "ccl-exporter probe: result not written, so the exporter shows no ccl_probe_* series for it: "
                f"{unwritten_reason(Path(args.probe_results), exc)}",
                file=sys.stderr,
            )
    if args.json:
        out.write(result.to_json())
    else:
        print_table(result, request, out)
    return 0 if result.success else 1


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], environ: Mapping[str, str]
) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "probe",
        help="nccl-tests-style bus-bandwidth probe (NCCL on GPUs, gloo on CPU)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_probe_arguments(parser, environ)
    out = parser.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print the result document instead of the table")
    out.add_argument("--source", choices=SOURCES, default="job", help="who ran it, for the exporter's source label")
    PROBE_RESULTS.add_to(out, environ)
    out.add_argument("--no-write", dest="write_results", action="store_false", help="do not write a result file")
    parser.set_defaults(handler=lambda args: run_probe_command(args))
    return parser

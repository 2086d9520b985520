"""Our probe's all-reduce busbw against MPI all-reduce (mpi4py, Debian Open MPI), same run.

Part 1, 2 ranks, 1 MiB to 256 MiB: the probe (torch.distributed gloo over TCP loopback)
against Open MPI ``Allreduce`` twice: with its default transports (shared memory between
the two ranks) and restricted to TCP (``--mca btl self,tcp``), the same medium gloo uses.
Both are timed the nccl-tests way (warm-up, timed iterations, slowest rank) and converted
with the same formula (busbw = S/t x 2(n-1)/n).

Part 2: how long a probe needs. A long probe (many iterations) gives the reference busbw at
one size; short probes (fewer iterations, each a whole run: spawn, init, warm-up, timing)
are compared with it, three times each. Reported: wall time of each short probe and its
worst deviation from the reference.

    python -m bench.probe_vs_mpi            # about six minutes on two cores
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from bench.common import BenchResult
from exporter.probe.formulas import busbw, format_size, size_sweep
from exporter.probe.runner import ProbeRequest, run_probe

SIZES = size_sweep(1 << 20, 256 << 20)
ITERS, WARMUP = 10, 5
ROUNDS = 3
CONVERGENCE_SIZE = 16 << 20
REFERENCE_ITERS = 200
SHORT_ITERS = (5, 20, 50, 100)
REPEATS = 3
GB = 1e9


def mpi_rank_main(argv: list[str]) -> None:
    """One MPI rank (run under mpirun): float32 in-place Allreduce, nccl-tests timing."""
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    warmup, iters = int(argv[0]), int(argv[1])
    rows = []
    for size in (int(s) for s in argv[2:]):
        buffer = np.ones(size // 4, dtype=np.float32)
        for _ in range(warmup):
            comm.Allreduce(MPI.IN_PLACE, buffer, op=MPI.SUM)
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            comm.Allreduce(MPI.IN_PLACE, buffer, op=MPI.SUM)
        elapsed = comm.allreduce((time.perf_counter() - t0) / iters, op=MPI.MAX)
        rows.append({"size_bytes": size, "time_seconds": elapsed})
    if comm.Get_rank() == 0:
        library = MPI.Get_library_version().split("\x00")[0].splitlines()[0].strip()  # NUL-padded
        print("MPI_RESULT " + json.dumps({"library": library, "rows": rows}))


def mpi_peer(sizes: list[int], tcp_only: bool) -> tuple[str, dict[int, float]]:
    command = ["mpirun", "--allow-run-as-root", "-np", "2"]  # 2 slots on 2 cores: no oversubscription
    if tcp_only:
        command += ["--mca", "btl", "self,tcp", "--mca", "pml", "ob1"]
    command += [sys.executable, "-m", "bench.probe_vs_mpi", "--mpi-rank", str(WARMUP), str(ITERS), *map(str, sizes)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    line = next((text for text in done.stdout.splitlines() if text.startswith("MPI_RESULT ")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"mpirun failed ({done.returncode}): {(done.stderr or done.stdout)[-500:]}")
    result = json.loads(line[len("MPI_RESULT ") :])
    return result["library"], {
        r["size_bytes"]: busbw("all_reduce", r["size_bytes"], r["time_seconds"], 2) for r in result["rows"]
    }


def probe_busbw(sizes: list[int], iters: int, warmup: int = WARMUP) -> tuple[dict[int, float], float, str]:
    request = ProbeRequest(
        "gloo", 2, ("all_reduce",), tuple(sizes), iters=iters, warmup_iters=warmup, timeout_seconds=900
    )
    t0 = time.perf_counter()
    result = run_probe(request)
    wall = time.perf_counter() - t0
    if not result.success:
        raise RuntimeError(f"probe failed: {result.error or result.collectives[0].error}")
    return {r.size_bytes: r.busbw_bytes_per_second for r in result.collectives[0].rows}, wall, result.transport.name


def missing_peer() -> str | None:
    try:
        import mpi4py  # noqa: F401 - only whether it is installed
        import numpy  # noqa: F401 - only whether it is installed
    except ImportError as exc:
        return f"{exc.name} is not installed (pip install mpi4py numpy)"
    if shutil.which("mpirun") is None:
        return "mpirun is not installed (Debian package openmpi-bin)"
    return None


def _spread(values: list[float]) -> str:
    return f"{min(values) / GB:.2f}–{max(values) / GB:.2f}"


def compare_with_mpi() -> tuple[list[str], float, float]:
    """Part 1: ROUNDS interleaved rounds of probe, MPI shm, MPI tcp; medians per size."""
    ours: dict[int, list[float]] = {s: [] for s in SIZES}
    shm: dict[int, list[float]] = {s: [] for s in SIZES}
    tcp: dict[int, list[float]] = {s: [] for s in SIZES}
    library = transport = ""
    for _ in range(ROUNDS):  # interleaved, so that a burst of load from elsewhere hits all three
        probe, _, transport = probe_busbw(SIZES, ITERS)
        library, mpi_shm = mpi_peer(SIZES, tcp_only=False)
        _, mpi_tcp = mpi_peer(SIZES, tcp_only=True)
        for size in SIZES:
            ours[size].append(probe[size])
            shm[size].append(mpi_shm[size])
            tcp[size].append(mpi_tcp[size])
    med = {
        name: {s: statistics.median(v[s]) for s in SIZES} for name, v in (("ours", ours), ("shm", shm), ("tcp", tcp))
    }
    lines = [
        f"Probe transport: {transport}. Peer: {library.strip()}. {WARMUP} warm-up + {ITERS} timed iterations per "
        f"size, time of the slowest rank, busbw = S/t x 2(n-1)/n (= algbw for 2 ranks), GB = 1e9 bytes. "
        f"{ROUNDS} interleaved rounds; the table shows medians (and min–max).",
        "",
        "| size | probe (gloo/tcp) GB/s | MPI shm GB/s | probe / MPI shm | MPI tcp GB/s | probe / MPI tcp |",
        "|---|---|---|---|---|---|",
    ]
    for size in SIZES:
        o, m, t = med["ours"][size], med["shm"][size], med["tcp"][size]
        lines.append(
            f"| {format_size(size)} | {o / GB:.2f} ({_spread(ours[size])}) | {m / GB:.2f} ({_spread(shm[size])}) "
            f"| {o / m:.2f} | {t / GB:.2f} ({_spread(tcp[size])}) | {o / t:.2f} |"
        )
    shm_ratio = statistics.median(med["ours"][s] / med["shm"][s] for s in SIZES)
    tcp_ratio = statistics.median(med["ours"][s] / med["tcp"][s] for s in SIZES)
    return lines, shm_ratio, tcp_ratio


def convergence() -> tuple[list[str], str]:
    """Part 2: short probes against long ones, interleaved; how many iterations reach ±5 %."""
    references: list[float] = []
    short: dict[int, list[tuple[float, float]]] = {k: [] for k in SHORT_ITERS}
    for _ in range(REPEATS):
        reference, _, _ = probe_busbw([CONVERGENCE_SIZE], REFERENCE_ITERS)
        references.append(reference[CONVERGENCE_SIZE])
        for iters in SHORT_ITERS:
            values, wall, _ = probe_busbw([CONVERGENCE_SIZE], iters)
            short[iters].append((values[CONVERGENCE_SIZE], wall))
    ref = statistics.median(references)
    lines = [
        f"How long a probe needs: {format_size(CONVERGENCE_SIZE)} all-reduce. Reference: median of {REPEATS} probes of "
        f"{REFERENCE_ITERS} timed iterations = {ref / GB:.3f} GB/s (runs {_spread(references)}). Each short probe is "
        f"a whole run (spawn, import, init, {WARMUP} warm-up iterations, timing), {REPEATS} runs each, "
        "interleaved with the reference runs.",
        "",
        "| timed iterations | wall s (median) | busbw GB/s (runs) | median deviation | worst deviation |",
        "|---|---|---|---|---|",
    ]
    enough = None
    for iters in SHORT_ITERS:
        values = [v for v, _ in short[iters]]
        deviations = [abs(v / ref - 1) for v in values]
        wall = statistics.median(w for _, w in short[iters])
        lines.append(
            f"| {iters} | {wall:.2f} | {', '.join(f'{v / GB:.3f}' for v in values)} | "
            f"{statistics.median(deviations) * 100:.1f} % | {max(deviations) * 100:.1f} % |"
        )
        if enough is None and max(deviations) <= 0.05:
            enough = (iters, wall)
    spread = max(abs(r / ref - 1) for r in references)
    if enough:
        needed = f"{enough[0]} timed iterations ({enough[1]:.1f} s wall) were within ±5 % in all {REPEATS} runs"
    else:
        needed = (
            f"no probe up to {SHORT_ITERS[-1]} iterations was within ±5 % in all {REPEATS} runs; the "
            f"{REFERENCE_ITERS}-iteration references themselves differ by up to {spread * 100:.0f} % from their median"
        )
    return lines, needed


def run() -> BenchResult:
    command = "python -m bench.probe_vs_mpi"
    peer = (
        "MPI Allreduce via mpi4py on Debian's Open MPI, 2 ranks, with its default transports (shared memory) "
        "and restricted to TCP (--mca btl self,tcp)"
    )
    why = missing_peer()
    if why is not None:
        return BenchResult("Probe busbw vs MPI all-reduce", command, peer, None, f"skipped: {why}", "")
    load_before = os.getloadavg()[0]
    lines, shm_ratio, tcp_ratio = compare_with_mpi()
    more, needed = convergence()
    load = (
        f"1-minute load average {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, "
        f"on {os.cpu_count()} cores"
    )
    lines += ["", *more, "", f"Convergence: {needed}.", "", f"Machine: {load}."]
    summary = (
        f"Probe busbw / MPI busbw, median over 1 MiB–256 MiB: {shm_ratio:.2f} against Open MPI on shared "
        f"memory, {tcp_ratio:.2f} against Open MPI restricted to TCP. {needed}."
    )
    return BenchResult("Probe busbw vs MPI all-reduce", command, peer, shm_ratio, summary, "\n".join(lines))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--mpi-rank":
        mpi_rank_main(sys.argv[2:])
        return
    print(run().section())


if __name__ == "__main__":
    main()

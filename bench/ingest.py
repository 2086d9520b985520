"""Ingest throughput of the pod-log tailer + NCCL analyzer against ``grep -c NCCL``.

A CRI pod log is generated (mostly training output, ``--nccl-percent`` NCCL INFO lines:
init, network and channel lines of many communicators) and read twice from the page cache:
once by ``grep -c NCCL``, once by the exporter's own pipeline (``PodLogTailer.poll`` +
``NcclCollector.step``, which feeds each NCCL line to the stream's ``LogAnalyzer``). The
tailer alone and the analyzer alone are timed too, to show where the time goes. CPU
seconds per GB give the share of a core at a given log rate (1 MB/s = 1 GB per 1000 s),
plus the cost of idle ticks (stat of every tailed file, twice a second).

    python -m bench.ingest [--size-mb 200] [--nccl-percent 3]
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import BenchResult
from exporter.collectors.nccl import NcclCollector, NcclSettings
from exporter.nccl import LogAnalyzer
from exporter.sources.kube import NoPodMetadata
from exporter.sources.podlogs import _NEEDLE_SEARCH, _PARTIAL_TAG_SEARCH, PodLogTailer, TailLimits

STAMP = "2026-03-01T10:00:00.123456789Z"
UID = "0b7c5a1e-1111-2222-3333-444455556666"


def generate(path: Path, size_bytes: int, nccl_percent: float, seed: int = 11) -> int:
    """Write a CRI log of about ``size_bytes``; return the number of NCCL lines."""
    rng = random.Random(seed)
    nccl_lines = 0
    written = 0
    with open(path, "w") as handle:
        while written < size_bytes:
            chunk = []
            for _ in range(1000):
                if rng.random() * 100 < nccl_percent:
                    nccl_lines += 1
                    pid = 100 + rng.randrange(8)
                    kind = rng.random()
                    if kind < 0.05:  # init lines of a job's few communicators (process groups)
                        comm = rng.randrange(16)
                        msg = (
                            f"worker-0:{pid}:{pid} [{pid - 100}] NCCL INFO ncclCommInitRank comm 0x55d4{comm:08x} "
                            f"rank {pid - 100} nranks 16 cudaDev {pid - 100} nvmlDev {pid - 100} busId 18000 "
                            f"commId 0x{comm:016x} - Init START"
                        )
                    elif kind < 0.1:
                        msg = f"worker-0:{pid}:{pid} [{pid - 100}] NCCL INFO Using network IB"
                    else:
                        ch = rng.randrange(32)
                        msg = (
                            f"worker-0:{pid}:{pid} [{pid - 100}] NCCL INFO Channel {ch:02d}/0 : {pid - 100}[{pid - 100}]"
                            f" -> {pid - 99}[{(pid - 99) % 8}] via P2P/CUMEM/read"
                        )
                else:
                    msg = (
                        f"[rank{rng.randrange(8)}]: step {rng.randrange(10**6)} loss {rng.random() * 3:.4f} "
                        f"lr 3.0e-4 grad_norm {rng.random():.3f} tokens/s {rng.randrange(10**5, 10**6)}"
                    )
                chunk.append(f"{STAMP} stdout F {msg}\n")
            text = "".join(chunk)
            handle.write(text)
            written += len(text)
    return nccl_lines


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_grep(path: Path) -> tuple[float, float, int]:
    grep = shutil.which("grep") or "grep"
    before = _children_cpu()
    t0 = time.perf_counter()
    out = subprocess.run([grep, "-c", "NCCL", str(path)], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    return wall, _children_cpu() - before, int(out.stdout.strip() or 0)


def time_scan_floor(path: Path, chunk_bytes: int = 16 << 20) -> float:
    """Wall seconds of the C-level work any correct reader of ours must do over the file: read
    it in the tailer's chunk size, search each chunk for ``NCCL`` and for a CRI partial tag
    (`` P ``; a message split into pieces may hide the needle). No line is touched."""
    t0 = time.perf_counter()
    offset = 0
    with open(path, "rb", buffering=0) as handle:
        while chunk := os.pread(handle.fileno(), chunk_bytes, offset):
            offset += len(chunk)
            for _ in _NEEDLE_SEARCH.finditer(chunk):
                pass
            _PARTIAL_TAG_SEARCH.search(chunk)
    return time.perf_counter() - t0


def time_pipeline(
    pods: Path, state: Path, staged: Path, target: Path, feed: bool
) -> tuple[float, float, int, list[list[str]]]:
    """Read ``staged`` moved to ``target`` after the first scan, so it is read whole (no start
    cap); (wall s, CPU s, NCCL lines, the lines when not fed)."""
    limits = TailLimits(tick_bytes=256 << 20, file_chunk_bytes=16 << 20)
    tailer = PodLogTailer(pods, None, state, limits)
    collector = NcclCollector(tailer, pods / "no-sysfs", NoPodMetadata(), settings=NcclSettings(save_every_seconds=1e9))
    collector.step()
    os.rename(staged, target)
    kept: list[list[str]] = []
    t0, c0 = time.perf_counter(), time.process_time()
    first = True
    while first or tailer.stats.backlog_bytes:
        first = False
        if feed:
            collector.step()
        else:
            kept.extend(tailer.poll().lines.values())
    return time.perf_counter() - t0, time.process_time() - c0, sum(tailer.stats.lines.values()), kept


def time_analyzer(batches: list[list[str]]) -> float:
    analyzer = LogAnalyzer()
    c0 = time.process_time()
    for lines in batches:
        for line in lines:
            analyzer.feed(line)
    analyzer.result()
    return time.process_time() - c0


def idle_tick_seconds(pods: Path, state: Path, ticks: int = 200) -> float:
    tailer = PodLogTailer(pods, None, state)
    collector = NcclCollector(tailer, pods / "no-sysfs", NoPodMetadata(), settings=NcclSettings(save_every_seconds=1e9))
    while True:
        collector.step()
        if not tailer.stats.backlog_bytes:
            break
    c0 = time.process_time()
    for _ in range(ticks):
        collector.step()
    return (time.process_time() - c0) / ticks


def run(size_mb: int = 200, nccl_percent: float = 3.0) -> BenchResult:
    work = Path(tempfile.mkdtemp(prefix="ccl-bench-ingest-"))
    try:
        pods = work / "pods"
        log_dir = pods / f"training_llama-worker-0_{UID}" / "pytorch"
        log_dir.mkdir(parents=True)
        # The pipeline must see the file appear after its first scan (read whole, no start cap).
        staged = work / "0.log"
        nccl_lines = generate(staged, size_mb << 20, nccl_percent)
        size = staged.stat().st_size
        gb = size / 1e9
        grep_wall, grep_cpu, grep_count = time_grep(staged)  # also warms the page cache
        grep_wall, grep_cpu, grep_count = time_grep(staged)
        floor_wall = min(time_scan_floor(staged) for _ in range(3))

        target = log_dir / "0.log"
        tail_wall, tail_cpu, tail_lines, batches = time_pipeline(pods, work / "state-tail", staged, target, False)
        os.rename(target, staged)
        ours_wall, ours_cpu, ours_lines, _ = time_pipeline(pods, work / "state-ours", staged, target, True)
        analyzer_cpu = time_analyzer(batches)
        idle = idle_tick_seconds(pods, work / "state-idle")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    ours_mbps = size / 1e6 / ours_wall
    grep_mbps = size / 1e6 / grep_wall
    ratio = ours_mbps / grep_mbps
    cpu_per_gb = ours_cpu / gb
    core_share_1mbps = cpu_per_gb / 1000 + idle * 2  # 1 MB/s = 1 GB per 1000 s; 2 ticks per s
    summary = (
        f"Ours {ours_mbps:.0f} MB/s vs grep {grep_mbps:.0f} MB/s: ratio {ratio:.2f} (goal >= 0.25); "
        f"{cpu_per_gb:.2f} CPU s/GB, {core_share_1mbps * 100:.2f}% of a core at 1 MB/s (goal < 1%)."
    )
    table = [
        "| reader | wall s | CPU s | MB/s | CPU s per GB | NCCL lines |",
        "|---|---|---|---|---|---|",
        f"| grep -c NCCL | {grep_wall:.3f} | {grep_cpu:.3f} | {grep_mbps:.0f} | {grep_cpu / gb:.2f} | {grep_count} |",
        f"| tailer + analyzer (ours) | {ours_wall:.3f} | {ours_cpu:.3f} | {ours_mbps:.0f} | {cpu_per_gb:.2f} | {ours_lines} |",
        f"| tailer alone | {tail_wall:.3f} | {tail_cpu:.3f} | {size / 1e6 / tail_wall:.0f} | {tail_cpu / gb:.2f} | {tail_lines} |",
        f"| analyzer alone (same lines) | | {analyzer_cpu:.3f} | | {analyzer_cpu / gb:.2f} | {tail_lines} |",
        f"| scan floor: read + search `NCCL` + search ` P ` (no line work) | {floor_wall:.3f} | | "
        f"{size / 1e6 / floor_wall:.0f} | | |",
    ]
    notes = (
        f"\n\nInput: {size / 1e6:.0f} MB CRI log, {nccl_lines} NCCL lines ({nccl_percent:g}% of lines), read from "
        f"the page cache. Idle tick (nothing new; stat of the tailed files): {idle * 1e6:.0f} us CPU, twice a second. "
        f"The analyzer alone takes {analyzer_cpu / (analyzer_cpu + tail_cpu) * 100:.0f}% of tailer-alone + analyzer-alone "
        f"CPU ({analyzer_cpu / max(tail_lines, 1) * 1e6:.1f} us per NCCL line). "
        f"The scan floor is the C-level part of the tailer alone (16 MiB reads and two searches, the "
        f"second for CRI partial pieces, which may split a line anywhere, even inside `NCCL`): "
        f"{grep_wall / floor_wall:.2f} of grep's throughput before any line is handled"
        + (
            ", so the goal of 0.25 is out of reach for this design in Python; the share of a core at a "
            "real log rate is the figure that matters on a node."
            if grep_wall / floor_wall < 0.25
            else "."
        )
    )
    return BenchResult(
        title="NCCL log ingest (tailer + analyzer vs grep)",
        command=f"python -m bench.ingest --size-mb {size_mb} --nccl-percent {nccl_percent:g}",
        peer="GNU grep -c NCCL on the same file, same run",
        ratio=ratio,
        summary=summary,
        markdown="\n".join(table) + notes,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=200)
    parser.add_argument("--nccl-percent", type=float, default=3.0)
    args = parser.parse_args()
    print(run(args.size_mb, args.nccl_percent).section())


if __name__ == "__main__":
    main()

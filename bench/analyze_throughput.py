"""``ccl-exporter analyze`` throughput against ``grep -c NCCL`` and ``mtail --one_shot``.

A CRI pod log of ``--size-mb`` MB is generated in a temporary folder (``bench.ingest.generate``:
training output with ``--nccl-percent`` % NCCL INFO lines) and read from the page cache by three
commands, each a process of its own, in the same run:

* ``grep -c NCCL FILE`` (GNU grep): the floor of any reader;
* ``mtail --one_shot`` with three rules (the network of each ``Using network`` line, the
  transport of each ``Channel ... via`` line, ``NCCL WARN`` lines), a log-to-metrics peer;
* ``ccl-exporter analyze --json FILE``: the full verdict.

Each is run ``--runs`` times (mtail once: it is slow); the best wall time counts. Throughput is
the file size over wall time, with CPU time (user + system of the process) beside it. A second,
smaller log of English-like sentences (capital letters and ``c``/``v`` on every line, where
analyze's memchr shortcut gives way to ``re`` scans) shows the other end, against grep only.

    python -m bench.analyze_throughput [--size-mb 500] [--nccl-percent 2] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.common import BenchResult
from bench.ingest import STAMP, generate

MTAIL_PROGRAM = r"""counter nccl_network_lines by network
counter nccl_channel_lines by transport
counter nccl_warnings

/NCCL INFO Using network (?P<network>\S+)/ {
  nccl_network_lines[$network]++
}
/NCCL INFO Channel \d+\/\d+ : .* via (?P<transport>\S+)/ {
  nccl_channel_lines[$transport]++
}
/NCCL WARN/ {
  nccl_warnings++
}
"""
WORDS = (
    "the checkpoint was saved to cloud storage continuing with epoch of schedule throughput samples per second "
    "on accelerators Python Process Validation provider connection commit vocabulary Unet"
).split()
GOAL_VS_MTAIL = 10.0
GOAL_VS_GREP = 0.06


@dataclass
class Timing:
    wall: float
    cpu: float
    stdout: str
    returncode: int


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(argv: Sequence[str], runs: int) -> Timing:
    """The best wall time of ``runs`` runs of ``argv`` (and that run's CPU time and output)."""
    best: Timing | None = None
    for _ in range(runs):
        before = _children_cpu()
        started = time.perf_counter()
        proc = subprocess.run(list(argv), capture_output=True, text=True, check=False)
        timing = Timing(time.perf_counter() - started, _children_cpu() - before, proc.stdout, proc.returncode)
        if best is None or timing.wall < best.wall:
            best = timing
    assert best is not None
    return best


def generate_letter_rich(path: Path, size_bytes: int, nccl_percent: float, seed: int = 13) -> int:
    """A CRI log of English-like sentences with ``nccl_percent`` % NCCL channel lines."""
    rng = random.Random(seed)
    nccl_lines = written = 0
    with open(path, "w") as handle:
        while written < size_bytes:
            chunk = []
            for i in range(1000):
                if rng.random() * 100 < nccl_percent:
                    nccl_lines += 1
                    message = (
                        f"worker-0:10{i % 8}:10{i % 8} [{i % 8}] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC"
                    )
                else:
                    message = " ".join(rng.choice(WORDS) for _ in range(14))
                chunk.append(f"{STAMP} stdout F {message}\n")
            text = "".join(chunk)
            handle.write(text)
            written += len(text)
    return nccl_lines


def _require(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} is not installed")
    return found


def run(size_mb: int = 500, nccl_percent: float = 2.0, runs: int = 3) -> BenchResult:
    grep, mtail = _require("grep"), _require("mtail")
    work = Path(tempfile.mkdtemp(prefix="ccl-bench-analyze-"))
    try:
        log = work / "0.log"
        nccl_lines = generate(log, size_mb << 20, nccl_percent)
        size = log.stat().st_size
        progs = work / "progs"
        progs.mkdir()
        (progs / "nccl.mtail").write_text(MTAIL_PROGRAM)
        timed([grep, "-c", "NCCL", str(log)], 1)  # warms the page cache
        grep_t = timed([grep, "-c", "NCCL", str(log)], runs)
        ours_t = timed([sys.executable, "-m", "exporter", "analyze", "--json", str(log)], runs)
        mtail_t = timed(
            [
                mtail,
                "--one_shot",
                "--one_shot_format=json",
                "--progs",
                str(progs),
                "--logs",
                str(log),
                "--address=127.0.0.1",
                "--port=0",
                "--logtostderr",
            ],
            1,
        )
        log.unlink()
        prose = work / "prose.log"
        prose_lines = generate_letter_rich(prose, (size_mb // 5) << 20, nccl_percent)
        prose_size = prose.stat().st_size
        timed([grep, "-c", "NCCL", str(prose)], 1)
        prose_grep = timed([grep, "-c", "NCCL", str(prose)], runs)
        prose_ours = timed([sys.executable, "-m", "exporter", "analyze", "--json", str(prose)], runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    if int(grep_t.stdout.strip() or -1) != nccl_lines:
        raise RuntimeError(f"grep counted {grep_t.stdout.strip()} NCCL lines, the generator wrote {nccl_lines}")
    verdict = json.loads(ours_t.stdout)["verdict"]
    counted = json.loads(mtail_t.stdout)
    mtail_lines = sum(
        int(value["Value"]["Value"])
        for name in ("nccl_network_lines", "nccl_channel_lines")
        for metric in counted.get(name, [])
        for value in metric.get("LabelValues", [])
    )

    def mbps(seconds: float) -> float:
        return size / 1e6 / seconds

    vs_mtail = mtail_t.wall / ours_t.wall
    vs_grep = grep_t.wall / ours_t.wall
    met = vs_mtail >= GOAL_VS_MTAIL and vs_grep >= GOAL_VS_GREP
    summary = (
        f"analyze {mbps(ours_t.wall):.0f} MB/s: {vs_mtail:.1f}x mtail ({mbps(mtail_t.wall):.0f} MB/s; goal >= "
        f"{GOAL_VS_MTAIL:g}x) and {vs_grep:.3f}x grep ({mbps(grep_t.wall):.0f} MB/s; goal >= {GOAL_VS_GREP:g}x): "
        f"{'goals met' if met else 'goal missed'}."
    )
    table = [
        "| reader | wall s | CPU s | MB/s (wall) | MB/s (CPU) | what it found |",
        "|---|---|---|---|---|---|",
        f"| grep -c NCCL | {grep_t.wall:.3f} | {grep_t.cpu:.3f} | {mbps(grep_t.wall):.0f} | {mbps(grep_t.cpu):.0f} | "
        f"{grep_t.stdout.strip()} lines |",
        f"| mtail --one_shot, 3 rules | {mtail_t.wall:.3f} | {mtail_t.cpu:.3f} | {mbps(mtail_t.wall):.0f} | "
        f"{mbps(mtail_t.cpu):.0f} | {mtail_lines} network and channel lines |",
        f"| ccl-exporter analyze --json | {ours_t.wall:.3f} | {ours_t.cpu:.3f} | {mbps(ours_t.wall):.0f} | "
        f"{mbps(ours_t.cpu):.0f} | verdict {verdict} (exit {ours_t.returncode}) |",
        f"| English-like log ({prose_size / 1e6:.0f} MB): grep -c NCCL | {prose_grep.wall:.3f} | {prose_grep.cpu:.3f} | "
        f"{prose_size / 1e6 / prose_grep.wall:.0f} | {prose_size / 1e6 / prose_grep.cpu:.0f} | {prose_lines} lines |",
        f"| English-like log: ccl-exporter analyze --json | {prose_ours.wall:.3f} | {prose_ours.cpu:.3f} | "
        f"{prose_size / 1e6 / prose_ours.wall:.0f} | {prose_size / 1e6 / prose_ours.cpu:.0f} | exit {prose_ours.returncode} |",
    ]
    notes = (
        f"\n\nInput: a {size / 1e6:.0f} MB CRI pod log with {nccl_lines} NCCL lines ({nccl_percent:g}% of lines; "
        "init, network and channel lines of many communicators among training output), generated in a temporary "
        f"folder and read from the page cache. Best wall time of {runs} runs (mtail: one run); each command is a "
        "process of its own, Python's start included for analyze. analyze takes the tailer's fast path: a C-level "
        "search of each 4 MiB block for the words a usable line holds (memchr to each rare first byte while they are "
        "few, `re` scans otherwise), so only those lines are decoded. Its output is the line-by-line reading's "
        "(`analyze --json` byte-identical on the corpus). The English-like log is the slow end: its bytes make "
        "memchr give way to `re` on every block: "
        f"{prose_grep.wall / prose_ours.wall:.3f}x grep there."
    )
    return BenchResult(
        title="analyze throughput vs grep and mtail",
        command=f"python -m bench.analyze_throughput --size-mb {size_mb} --nccl-percent {nccl_percent:g} --runs {runs}",
        peer="GNU grep -c NCCL and mtail --one_shot (3 rules) on the same file, same run",
        ratio=vs_mtail,
        summary=summary,
        markdown="\n".join(table) + notes,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=500)
    parser.add_argument("--nccl-percent", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(run(args.size_mb, args.nccl_percent, args.runs).section())


if __name__ == "__main__":
    main()

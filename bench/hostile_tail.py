"""The pod-log tailer against a busy pod and hostile tenants: single-stream drain rate, the
time a new fallback pod takes to be seen, and what a hostile but static tree costs.

(a) **Drain.** One pod writes CRI lines as fast as it can (a writer process) with
kubelet-style rotation: the live file is renamed at 10 MiB, the rotations older than the
newest are gzipped and deleted at once, at most 5 files are kept (48 MiB in all, so nothing
is deleted before it can be read; what the tailer did not reach before compression it reads
from the ``.gz``). The tailer polls like the NCCL collector does (poll, then 0.5 s).
Drain rate = bytes written / time from the first write to the last NCCL line handed over;
NCCL lines carry sequence numbers, so lines lost and duplicated are counted. Compared with
the tailer's own ceiling (``tick_bytes`` per 0.5 s) and with ``cat | grep -c NCCL`` over the
same bytes. A second writer is paced at 4 MiB/s for 8 s (the review's case).

(b) **New fallback pod among hostile tenants.** 500 debug files, each ending in a 63 KiB
line without a newline (20 pods x 25 files), and one noisy pod whose container writes 8 MB/s
of near-matching lines to its log (a writer process): NCCL ``INFO`` connection lines, each
one different, so the analyzer must parse every one (~25 us each) and none decides anything;
more than one core's worth of parsing, so a backlog builds. Then new pods start one by one
and print NCCL's init lines on ``Socket`` (5 in pod logs, 5 in debug files): time from the
first line written to the tailer handing it over; then (5 pods, pod logs) to
``ccl_nccl_tcp_fallback 1`` on ``/metrics`` of a real ``serve`` process on the same tree
(simulated sysfs with ACTIVE InfiniBand ports). Goal <= 2 s.

(c) **Static hostile tree.** Bytes read per second with the 500 files there and nothing
written: the tailer's own counter, the bench process's ``rchar`` and the ``serve`` process's
``rchar`` (``/proc/<pid>/io``). Goal ~0.

    python -m bench.hostile_tail [--drain-mb 48]
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.common import BenchResult
from bench.scrape_rdma import REPO, free_port, wait_ready
from exporter.sources.podlogs import SOURCE_DEBUG_FILE, SOURCE_POD_LOG, PodLogTailer, TailLimits

STAMP = "2026-03-01T10:00:00.123456789Z"
UID = "0b7c5a1e-1111-2222-3333-444455556666"
TICK_SECONDS = 0.5  # the NCCL collector's poll interval
ROTATE_BYTES = 10 << 20  # kubelet containerLogMaxSize default
MAX_FILES = 5  # kubelet containerLogMaxFiles default
HOSTILE_PODS, HOSTILE_FILES_PER_POD = 20, 25
UNFINISHED_BYTES = 63 << 10
NOISY_BYTES_PER_SECOND = 8e6
SERVED_PODS = 5
MB = 1e6


# ---------------------------------------------------------------------------------------
# Writers (run in their own process: ``python -m bench.hostile_tail --writer ...``)


def cri_block(first_seq: int, lines: int = 640) -> tuple[bytes, int]:
    """About 64 KiB of training output, every 10th line an NCCL line with a sequence number."""
    out = []
    seq = first_seq
    for n in range(lines):
        if n % 10 == 0:
            out.append(
                f"{STAMP} stdout F host-0:41:41 [0] NCCL INFO seq {seq} Channel 00/0 : 0[0] -> 1[1] "
                f"via P2P/CUMEM/read\n"
            )
            seq += 1
        else:
            out.append(
                f"{STAMP} stdout F [rank0]: step {first_seq + n} loss 2.3456 lr 3.0e-4 grad_norm 0.812 "
                f"tokens/s 412345\n"
            )
    return "".join(out).encode(), seq - first_seq


def kubelet_compress(folder: Path, max_files: int) -> None:
    """Kubelet after a rotation: gzip every rotation but the newest, keep ``max_files``."""
    plain = sorted(p for p in folder.iterdir() if p.name.startswith("0.log.") and not p.name.endswith((".gz", ".tmp")))
    for rotated in plain[:-1]:
        tmp = rotated.with_name(rotated.name + ".gz.tmp")
        with open(rotated, "rb") as src, gzip.open(tmp, "wb", compresslevel=1) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.rename(tmp, rotated.with_name(rotated.name + ".gz"))
        rotated.unlink()
    rotations = sorted(p for p in folder.iterdir() if p.name.startswith("0.log."))
    for old in rotations[: max(0, len(rotations) + 1 - max_files)]:
        old.unlink()


def write_rotating(folder: Path, total_bytes: int, bytes_per_second: float) -> dict[str, float]:
    folder.mkdir(parents=True, exist_ok=True)
    live = folder / "0.log"
    handle = open(live, "ab", buffering=0)  # noqa: SIM115 - reopened at each rotation below
    started, t0 = time.time(), time.perf_counter()
    written = in_file = seq = rotations = 0
    while written < total_bytes:
        block, count = cri_block(seq)
        seq += count
        handle.write(block)
        written += len(block)
        in_file += len(block)
        if in_file >= ROTATE_BYTES:
            handle.close()
            rotations += 1
            os.rename(live, folder / f"0.log.20260301-{100000 + rotations:06d}")
            handle = open(live, "ab", buffering=0)  # noqa: SIM115 - closed at the next rotation or the end
            in_file = 0
            kubelet_compress(folder, MAX_FILES)
        if bytes_per_second:
            ahead = written / bytes_per_second - (time.perf_counter() - t0)
            if ahead > 0:
                time.sleep(ahead)
    handle.close()
    return {
        "bytes": written,
        "nccl_lines": seq,
        "started": started,
        "seconds": time.perf_counter() - t0,
        "rotations": rotations,
    }


def noisy_block(first: int, lines: int = 256) -> bytes:
    """CRI lines of NCCL connection output, each one different: what the analyzer must parse."""
    return "".join(
        f"{STAMP} stdout F noisy-0:7:{n % 64} [0] NCCL INFO Channel {n % 32:02d}/0 : {n}[0] -> {n + 1}[1] "
        f"via P2P/CUMEM/read\n"
        for n in range(first, first + lines)
    ).encode()


def write_noisy(path: Path, bytes_per_second: float) -> None:
    """Append near-matching CRI lines to ``path`` until killed."""
    handle = open(path, "ab", buffering=0)  # noqa: SIM115 - written until killed
    t0, written, first = time.perf_counter(), 0, 0
    while True:
        block = noisy_block(first)
        first += 256
        handle.write(block)
        written += len(block)
        ahead = written / bytes_per_second - (time.perf_counter() - t0)
        if ahead > 0:
            time.sleep(ahead)


def start_writer(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.hostile_tail", "--writer", *args], cwd=REPO, stdout=subprocess.PIPE, text=True
    )


# ---------------------------------------------------------------------------------------
# (a) drain


def measure_drain(work: Path, total_bytes: int, bytes_per_second: float) -> dict[str, float]:
    pods = work / f"pods-drain-{int(bytes_per_second)}"
    pods.mkdir(parents=True)
    tailer = PodLogTailer(pods, None)
    tailer.poll()  # the stream appears after the first scan: read whole, from byte 0
    writer = start_writer(
        "rotating", str(pods / f"training_fast-0_{UID}" / "pytorch"), str(total_bytes), str(bytes_per_second)
    )
    seen: set[int] = set()
    duplicates = 0
    last_line = time.time()
    deadline = time.perf_counter() + 120
    polls = 0
    while time.perf_counter() < deadline:
        batch = tailer.poll()
        polls += 1
        for lines in batch.lines.values():
            for line in lines:
                seq = int(line.split(" seq ", 1)[1].split(" ", 1)[0])
                duplicates += seq in seen
                seen.add(seq)
            last_line = time.time()
        if writer.poll() is not None and not batch.lines and tailer.stats.backlog_bytes == 0:
            break
        time.sleep(TICK_SECONDS)
    writer.wait(30)
    info = json.loads(writer.stdout.read() if writer.stdout else "{}")
    return {
        "bytes": info["bytes"],
        "writer_seconds": info["seconds"],
        "rotations": info["rotations"],
        "drain_seconds": last_line - info["started"],
        "nccl_lines": info["nccl_lines"],
        "lost": info["nccl_lines"] - len(seen),
        "duplicated": duplicates,
        "polls": polls,
        "read_bytes": tailer.stats.bytes_read[SOURCE_POD_LOG],
    }


def time_grep_peer(work: Path, total_bytes: int) -> tuple[float, int]:
    """``cat | grep -c NCCL`` over the same bytes as the full-speed writer wrote."""
    path = work / "peer.log"
    with open(path, "wb") as handle:
        written = seq = 0
        while written < total_bytes:
            block, count = cri_block(seq)
            handle.write(block)
            written += len(block)
            seq += count
    best, count = float("inf"), 0
    for _ in range(3):  # the first run also warms the page cache
        t0 = time.perf_counter()
        cat = subprocess.Popen(["cat", str(path)], stdout=subprocess.PIPE)
        out = subprocess.run(["grep", "-c", "NCCL"], stdin=cat.stdout, capture_output=True, text=True, check=False)
        cat.wait()
        best = min(best, time.perf_counter() - t0)
        count = int(out.stdout.strip() or 0)
    path.unlink()
    return best, count


# ---------------------------------------------------------------------------------------
# (b), (c) hostile tree


def build_hostile_tree(pods: Path, debug: Path) -> Path:
    """500 files ending in an unfinished 63 KiB line; the noisy pod's log (empty)."""
    filler = b"NCCL INFO hostile\n" + b"A" * UNFINISHED_BYTES
    for pod in range(HOSTILE_PODS):
        for n in range(HOSTILE_FILES_PER_POD):
            path = debug / f"hostile_static-{pod:02d}_{UID}" / f"nccl.{n:02d}.log"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(filler)
    noisy = pods / f"team-x_noisy-0_{UID}" / "main" / "0.log"
    noisy.parent.mkdir(parents=True)
    noisy.touch()
    return noisy


class TailLoop:
    """The tailer polled like the NCCL collector does, in a thread; when each pod was first
    handed lines, and how long polls took."""

    def __init__(self, tailer: PodLogTailer) -> None:
        self.tailer = tailer
        self.first_seen: dict[str, float] = {}
        self.poll_seconds: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            batch = self.tailer.poll()
            done = time.perf_counter()
            self.poll_seconds.append(done - t0)
            for key in batch.lines:
                self.first_seen.setdefault(key.pod, done)
            self._stop.wait(TICK_SECONDS)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def fallback_lines(pod: str) -> list[str]:
    """NCCL's init lines of a 2-node job on Socket (a TCP fallback), as the simulated node prints them."""
    from ccl_sim.podlogs import SimJob, nccl_init_lines

    return nccl_init_lines(SimJob(namespace="research", pod=pod, labels={}, network="Socket"))


def start_pod(pods: Path, debug: Path, pod: str, in_debug_file: bool) -> float:
    lines = fallback_lines(pod)
    if in_debug_file:
        path = debug / f"research_{pod}_{UID}" / f"nccl.{pod}.101.log"
        text = "".join(line + "\n" for line in lines)
    else:
        path = pods / f"research_{pod}_{UID}" / "pytorch" / "0.log"
        text = "".join(f"{STAMP} stdout F {line}\n" for line in lines)
    path.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(path, "a") as handle:
        handle.write(text)
    return started


def wait_seen(loop: TailLoop, pod: str, since: float, timeout: float = 30.0) -> float:
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        seen = loop.first_seen.get(pod)
        if seen is not None:
            return seen - since
        time.sleep(0.01)
    return float("inf")


def rchar(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    return 0


def fallback_on_metrics(port: int, pod: str) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/metrics")
        body = conn.getresponse().read().decode()
    finally:
        conn.close()
    return any(
        line.startswith("ccl_nccl_tcp_fallback{") and f'pod="{pod}"' in line and line.endswith(" 1.0")
        for line in body.splitlines()
    )


def start_serve(work: Path, pods: Path, debug: Path) -> tuple[subprocess.Popen[bytes], int]:
    from ccl_sim.rdma import SimRdma

    SimRdma(random.Random(7)).setup(work / "sysfs")
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "exporter",
            "serve",
            "--path.sysfs",
            str(work / "sysfs" / "sys"),
            "--path.pod-logs",
            str(pods),
            "--path.nccl-debug-files",
            str(debug),
            "--path.state",
            str(work / "state-serve"),
            "--collector.disable-defaults",
            "--collector.nccl",
            "--web.listen-address",
            f"127.0.0.1:{port}",
            "--log.level",
            "warning",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_ready(port)
    return proc, port


def measure_hostile(work: Path) -> dict[str, object]:
    pods, debug = work / "pods", work / "nccl"
    pods.mkdir()
    noisy_log = build_hostile_tree(pods, debug)
    serve, port = start_serve(work, pods, debug)
    tailer = PodLogTailer(pods, debug)
    loop = TailLoop(tailer)
    noisy: subprocess.Popen[str] | None = None
    try:
        time.sleep(4 * TICK_SECONDS + 1)  # first reads of the 500 files, here and in serve
        read0, rchar0, serve0, t0 = tailer.stats.bytes_read[SOURCE_DEBUG_FILE], rchar(), rchar(serve.pid), time.time()
        time.sleep(5)
        static_seconds = time.time() - t0
        static = {
            "tailer_bytes_per_second": (tailer.stats.bytes_read[SOURCE_DEBUG_FILE] - read0) / static_seconds,
            "rchar_per_second": (rchar() - rchar0) / static_seconds,
            "serve_rchar_per_second": (rchar(serve.pid) - serve0) / static_seconds,
        }
        static_polls = list(loop.poll_seconds)

        noisy = start_writer("noisy", str(noisy_log))
        time.sleep(2)  # a backlog builds: more lines than one core parses
        rng = random.Random(3)
        latencies: dict[str, list[float]] = {SOURCE_POD_LOG: [], SOURCE_DEBUG_FILE: []}
        for n in range(5):
            for in_debug_file, source in ((False, SOURCE_POD_LOG), (True, SOURCE_DEBUG_FILE)):
                time.sleep(rng.uniform(0, TICK_SECONDS))
                pod = f"fallback-{source.split('_')[0]}-{n}"
                latencies[source].append(wait_seen(loop, pod, start_pod(pods, debug, pod, in_debug_file)))
        loop.stop()
        busy_polls = loop.poll_seconds[len(static_polls) :]

        serve_latency = []
        for n in range(SERVED_PODS):
            time.sleep(rng.uniform(0, TICK_SECONDS))
            pod = f"served-{n}"
            started = start_pod(pods, debug, pod, False)
            deadline = started + 30
            while time.perf_counter() < deadline and not fallback_on_metrics(port, pod):
                time.sleep(0.02)
            serve_latency.append(time.perf_counter() - started if time.perf_counter() < deadline else float("inf"))
        streams, skipped = tailer.stats.streams, dict(tailer.stats.skipped_bytes)
    finally:
        loop.stop()
        if noisy is not None:
            noisy.kill()
            noisy.wait(10)
        serve.terminate()
        serve.wait(10)
    return {
        "static": static,
        "latencies": latencies,
        "serve_latency": serve_latency,
        "streams": streams,
        "static_poll_ms": statistics.median(static_polls) * 1e3 if static_polls else 0.0,
        "busy_poll_ms": statistics.median(busy_polls) * 1e3 if busy_polls else 0.0,
        "skipped": skipped,
    }


# ---------------------------------------------------------------------------------------


def run(drain_mb: int = 48) -> BenchResult:
    work = Path(tempfile.mkdtemp(prefix="ccl-bench-hostile-"))
    limits = TailLimits()
    ceiling = limits.tick_bytes / TICK_SECONDS
    try:
        total = drain_mb << 20
        fast = measure_drain(work, total, 0)
        paced = measure_drain(work, 32 << 20, 4 << 20)
        grep_seconds, grep_count = time_grep_peer(work, total)
        hostile = measure_hostile(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    drain = fast["bytes"] / fast["drain_seconds"]
    grep_rate = fast["bytes"] / grep_seconds
    latencies = hostile["latencies"]
    assert isinstance(latencies, dict)
    every = [x for values in latencies.values() for x in values]
    serve_latency = hostile["serve_latency"]
    assert isinstance(serve_latency, list)
    static = hostile["static"]
    assert isinstance(static, dict)
    worst = max(every + serve_latency)
    summary = (
        f"One stream drained at {drain / MB:.1f} MB/s = {drain / ceiling:.2f} of the tailer's ceiling "
        f"({ceiling / MB:.1f} MB/s) and {drain / grep_rate:.3f} of cat | grep -c NCCL ({grep_rate / MB:.0f} MB/s), "
        f"{fast['lost']:.0f} lines lost; a new fallback pod among 500 hostile debug files was handed over "
        f"in at most {max(every):.2f} s (goal <= 2 s), on /metrics of serve in at most {max(serve_latency):.2f} s; "
        f"static hostile tree read {static['tailer_bytes_per_second'] / MB:.3f} MB/s (goal ~0)."
    )
    table = [
        "| (a) one pod, kubelet-style rotation | bytes | writer MB/s | drained MB/s | share of ceiling | "
        "NCCL lines | lost | duplicated | rotations |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in (("as fast as it can", fast), ("paced at 4 MiB/s", paced)):
        table.append(
            f"| {name} | {m['bytes'] / MB:.1f} MB | {m['bytes'] / m['writer_seconds'] / MB:.1f} | "
            f"{m['bytes'] / m['drain_seconds'] / MB:.1f} | {m['bytes'] / m['drain_seconds'] / ceiling:.2f} | "
            f"{m['nccl_lines']:.0f} | {m['lost']:.0f} | {m['duplicated']:.0f} | {m['rotations']:.0f} |"
        )
    table += [
        f"| peer: cat \\| grep -c NCCL, same bytes | {fast['bytes'] / MB:.1f} MB | | {grep_rate / MB:.0f} | | "
        f"{grep_count} | | | |",
        "",
        "| (b) new fallback pod, 500 hostile debug files + one pod writing 8 MB/s of near-matching lines "
        "| median s | max s | n |",
        "|---|---|---|---|",
    ]
    for source, values in latencies.items():
        table.append(
            f"| tailer hands over its first lines ({source}) | {statistics.median(values):.2f} | "
            f"{max(values):.2f} | {len(values)} |"
        )
    table += [
        f"| `ccl_nccl_tcp_fallback 1` on /metrics of serve (pod_log) | {statistics.median(serve_latency):.2f} | "
        f"{max(serve_latency):.2f} | {len(serve_latency)} |",
        "",
        "| (c) 500 hostile debug files, nothing written | bytes read per second |",
        "|---|---|",
        f"| tailer counter (`ccl_nccl_log_read_bytes_total`) | {static['tailer_bytes_per_second']:.0f} |",
        f"| bench process, rchar | {static['rchar_per_second']:.0f} |",
        f"| serve process, rchar | {static['serve_rchar_per_second']:.0f} |",
    ]
    notes = (
        f"\n\nCeiling: `tick_bytes` {limits.tick_bytes >> 20} MiB per {TICK_SECONDS} s poll; the collector sleeps "
        f"{TICK_SECONDS} s after each poll, so the drain rate also pays for the polls themselves (and for inflating "
        f"rotations that were compressed before the tailer reached them). Writer: CRI lines of ~100 bytes, every "
        f"10th an NCCL line; rotation at {ROTATE_BYTES >> 20} MiB, older rotations gzipped at once, at most "
        f"{MAX_FILES} files. Hostile tree: {HOSTILE_PODS} pods x {HOSTILE_FILES_PER_POD} debug files ending in a "
        f"{UNFINISHED_BYTES >> 10} KiB unfinished line; during (b) one noisy pod log at "
        f"{NOISY_BYTES_PER_SECOND / MB:.0f} MB/s of NCCL connection lines, each one different (the analyzer parses "
        f"every one; serve reads at most `tick_lines` = {limits.tick_lines} lines per poll, shared round-robin "
        f"between streams, so the victim's lines are parsed at the next poll while the noisy pod's backlog waits). "
        f"Median poll of the bench's own tailer (no parsing): {hostile['static_poll_ms']:.1f} ms "
        f"on the static tree, {hostile['busy_poll_ms']:.1f} ms with the noisy pod. A tailer that read every "
        f"unfinished line again at each poll would read min(500 x {UNFINISHED_BYTES >> 10} KiB, tick_bytes) per poll "
        f"= {min(500 * UNFINISHED_BYTES, limits.tick_bytes) / TICK_SECONDS / MB:.0f} MB/s on the static tree. "
        f"No pod list in this run (serve has no node name): every folder named with a pod UID is read, the hostile "
        f"ones too."
    )
    return BenchResult(
        title="Log tailer under a busy pod and hostile tenants",
        command=f"python -m bench.hostile_tail --drain-mb {drain_mb}",
        peer="the tailer's own ceiling (tick_bytes per poll interval) and cat | grep -c NCCL over the same bytes, "
        "same run",
        ratio=drain / ceiling,
        summary=summary + ("" if worst <= 2.0 and fast["lost"] == 0 and paced["lost"] == 0 else " GOAL MISSED."),
        markdown="\n".join(table) + notes,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drain-mb", type=int, default=48)
    parser.add_argument("--writer", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.writer:
        mode, *rest = args.writer
        if mode == "rotating":
            print(json.dumps(write_rotating(Path(rest[0]), int(rest[1]), float(rest[2]))))
        else:
            write_noisy(Path(rest[0]), NOISY_BYTES_PER_SECOND)
        return
    print(run(args.drain_mb).section())


if __name__ == "__main__":
    main()

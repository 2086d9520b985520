"""Lifecycle hooks: NCCL's TCP-fallback lines written → pod condition and Event at the API server.

One exporter node in process (tests/lifecycle_node.py): the real NCCL collector tailing the pod
log, the real lifecycle hooks writing with the real ``kubernetes`` client to the recorded API
server (tests/kube_api.py), which stamps each request as it arrives. Each run starts a gated pod
whose NCCL falls back to ``Socket`` and times, from the moment the lines are in the pod's log:
the ``ccl-health.io/fabric-ready=False`` patch and the ``NcclTcpFallback`` Event at the server.
Peer, in the same run and from the same lines: ``ccl_nccl_tcp_fallback`` turning 1 in the NCCL
collector's own exposition (polled every 10 ms) -- the same detection without any API write.
The ratio is ours (the condition) / that peer. The goal: both within 2 s.

    python -m bench.lifecycle_latency [--runs 20]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path

from bench.common import BenchResult
from ccl_sim.podlogs import SimJob, pytorchjob_labels
from exporter.lifecycle.controller import LifecycleSettings
from tests.kube_api import wait_for
from tests.lifecycle_node import LifecycleNode, api_pod, lifecycle_node, write_nccl_log

TIMEOUT = 20.0


def _jobs(runs: int) -> list[SimJob]:
    return [SimJob("research", f"bert-worker-{i}", pytorchjob_labels(f"bert-{i}"), network="Socket", nnodes=2,
                   gdr=False) for i in range(runs)]  # fmt: skip


def _metric_seen_at(node: LifecycleNode, job: SimJob, stop: threading.Event, seen: list[float]) -> None:
    """Poll the NCCL collector's snapshot the way a scrape renders it, every 10 ms."""
    while not stop.is_set():
        for family in node.nccl.collect():
            if family.name == "ccl_nccl_tcp_fallback" and any(
                s.labels.get("pod") == job.pod and s.value == 1.0 for s in family.samples
            ):
                seen.append(time.monotonic())
                return
        time.sleep(0.01)


def _one(node: LifecycleNode, job: SimJob, phase: float) -> tuple[float | None, float | None, float | None]:
    stop, seen = threading.Event(), []  # type: ignore[var-annotated]
    poller = threading.Thread(target=_metric_seen_at, args=(node, job, stop, seen), daemon=True)
    poller.start()
    time.sleep(phase)  # the lines land at any point of the collector's 0.5 s poll cycle
    written = write_nccl_log(node.paths, job)
    wait_for(lambda: bool(node.pod_patches(job)) and bool(node.events(job)), timeout=TIMEOUT)
    wait_for(lambda: bool(seen), timeout=2.0)
    stop.set()
    poller.join(5)
    patches = node.pod_patches(job)
    events = [w for w in node.state.writes("events") if w.body["involvedObject"]["name"] == job.pod]
    return (
        patches[0].at - written if patches else None,
        events[0].at - written if events else None,
        seen[0] - written if seen else None,
    )


def _fmt(values: list[float]) -> str:
    if not values:
        return "not seen"
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"median {statistics.median(values):.2f} s, p95 {p95:.2f} s, max {max(values):.2f} s"


def run(runs: int = 20) -> BenchResult:
    jobs = _jobs(runs)
    with tempfile.TemporaryDirectory(prefix="ccl-lifecycle-") as root:
        node = lifecycle_node(Path(root), LifecycleSettings(readiness=True, events=True),
                              pods=tuple(api_pod(job) for job in jobs))  # fmt: skip
        try:
            phases = random.Random(5)
            results = [_one(node, job, phases.uniform(0.0, 0.5)) for job in jobs]
        finally:
            node.close()
    conditions = [r[0] for r in results if r[0] is not None]
    events = [r[1] for r in results if r[1] is not None]
    metrics = [r[2] for r in results if r[2] is not None]
    ratio = statistics.median(conditions) / statistics.median(metrics) if conditions and metrics else None
    within = sum(1 for r in results if r[0] is not None and r[1] is not None and max(r[0], r[1]) < 2.0)
    markdown = f"""
| from the NCCL lines in the pod log to | {runs} runs |
|---|---|
| `ccl_nccl_tcp_fallback` 1 in the NCCL collector's exposition (peer) | {_fmt(metrics)} |
| `ccl-health.io/fabric-ready=False` patch at the API server | {_fmt(conditions)} |
| `NcclTcpFallback` Event at the API server | {_fmt(events)} |

{within} of {runs} runs had both the condition and the Event at the server within 2 s. The NCCL
collector polls the tailer every 0.5 s (so the peer is 0–0.5 s plus parsing); the lifecycle hooks
wait on the verdict feed (woken at once) and write with the real client (strategic merge patch,
then a POST). Through Prometheus the same fallback pages after a scrape, an evaluation and
Alertmanager's group_wait (see the detection-latency section: ~20 s at the shipped settings).
"""
    return BenchResult(
        title="Lifecycle hooks: TCP fallback lines to pod condition and Event",
        command="python -m bench.lifecycle_latency" + (f" --runs {runs}" if runs != 20 else ""),
        peer="`ccl_nccl_tcp_fallback` turning 1 in the same exporter, same run, same lines (no API write)",
        ratio=ratio,
        summary=f"The pod condition reached the API server {_fmt(conditions)} after the NCCL lines "
        f"(goal: under 2 s); the metric itself: {_fmt(metrics)}" + (f" (ratio {ratio:.2f})." if ratio else "."),
        markdown=markdown,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args(argv)
    if not 1 <= args.runs <= 200:
        parser.error("--runs must be 1..200")
    print(run(args.runs).section())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Idle-time probes for ``ccl-exporter serve --probe.interval``.

Every interval the scheduler asks its occupancy checks whether the node's GPUs are free (no
pod holds a GPU per the kubelet's pod-resources API, no compute process per NVML). Only then
does it start ``ccl-exporter probe --source scheduled`` as a subprocess in its own process
group, with a hard timeout; the probe writes its result file like any other. While the probe
runs the checks are polled again: a job that takes the GPUs preempts the probe at once.

Never two probes at once (one loop, one subprocess), never on the event loop (occupancy
checks run in a thread, the probe in another process), so a scrape is never blocked. Every
skipped run is counted by reason and logged. A check that fails to answer counts as busy
(``occupancy_unknown``): the probe only runs when the node is known to be idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from exporter.probe.formulas import parse_size, size_sweep
from exporter.results.probe_file import (
    COLLECTIVES,
    CollectiveResult,
    MalformedResult,
    ProbeResult,
    Transport,
    parse_result,
    result_filename,
    write_result,
)

log = logging.getLogger(__name__)

TERMINATE_GRACE_SECONDS = 5.0
STDERR_TAIL_BYTES = 4096


class GpuOccupancy(Protocol):
    """One way of telling that the GPUs are in use. ``reason`` is the skip metric's label."""

    reason: str

    def busy_reason(self) -> str | None:
        """Why the GPUs are busy (who holds them), or None when this check sees them free."""


@dataclass(frozen=True)
class ProbeSettings:
    interval_seconds: float
    timeout_seconds: float
    backend: str = "auto"
    nprocs: int = 0
    collectives: str = "all_reduce"
    min_bytes: str = "1M"
    max_bytes: str = "64M"
    iters: int = 20
    warmup_iters: int = 5

    def __post_init__(self) -> None:
        """Flag mistakes surface at start-up, not as a failed probe every interval."""
        unknown = [c for c in self.collectives.split(",") if c.strip() not in COLLECTIVES]
        if unknown or not self.collectives.strip():
            raise ValueError(f"collectives {self.collectives!r}: choose from {', '.join(COLLECTIVES)}")
        size_sweep(parse_size(self.min_bytes), parse_size(self.max_bytes))
        if self.interval_seconds <= 0 or self.timeout_seconds <= 0 or self.iters < 1:
            raise ValueError("interval, timeout and iterations must be positive")

    def command(self, results_folder: Path, python: str = sys.executable) -> list[str]:
        # The probe's own timeout fires first and leaves a result file; ours is the backstop.
        inner_timeout = max(1.0, self.timeout_seconds - min(TERMINATE_GRACE_SECONDS, self.timeout_seconds / 2))
        return [
            python,
            "-m",
            "exporter",
            "probe",
            "--source",
            "scheduled",
            "--json",
            "--path.probe-results",
            str(results_folder),
            "--backend",
            self.backend,
            "--nprocs",
            str(self.nprocs),
            "--collective",
            self.collectives,
            "-b",
            self.min_bytes,
            "-e",
            self.max_bytes,
            "-n",
            str(self.iters),
            "-w",
            str(self.warmup_iters),
            "--timeout",
            f"{inner_timeout:g}",
            "--master-port",
            "0",
            "--nnodes",
            "1",
            "--node-rank",
            "0",
        ]


@dataclass
class SchedulerState:
    """What the collector exposes: counters since start and whether a probe runs now."""

    skipped: Counter[str] = field(default_factory=Counter)
    runs: Counter[str] = field(default_factory=Counter)
    running: bool = False
    last_message: str = ""


class ProbeScheduler:
    def __init__(
        self,
        settings: ProbeSettings,
        results_folder: Path,
        occupancy: Sequence[GpuOccupancy],
        poll_seconds: float = 1.0,
        clock: Callable[[], float] = time.time,
        env: dict[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.results_folder = results_folder
        self.occupancy = list(occupancy)
        self.poll_seconds = poll_seconds
        self.clock = clock
        self.env = env
        self.state = SchedulerState()
        self._lock = asyncio.Lock()

    def busy(self) -> tuple[str, str] | None:
        """(reason label, message) of the first check that finds the GPUs in use, or None."""
        for check in self.occupancy:
            try:
                message = check.busy_reason()
            except Exception as exc:  # noqa: BLE001 - an unanswerable check means "do not probe"
                return "occupancy_unknown", f"{check.reason} check failed: {type(exc).__name__}: {exc}"
            if message:
                return check.reason, message
        return None

    def _skip(self, reason: str, message: str) -> str:
        self.state.skipped[reason] += 1
        self.state.last_message = f"skipped ({reason}): {message}"
        log.info("scheduled probe skipped (%s): %s", reason, message)
        return f"skipped:{reason}"

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.interval_seconds)
            await self.run_once()

    async def run_once(self) -> str:
        """One scheduling decision and, when idle, one probe. Returns the outcome."""
        if self._lock.locked():
            return self._skip("probe_running", "a probe is still running")
        async with self._lock:
            busy = await asyncio.to_thread(self.busy)
            if busy is not None:
                return self._skip(*busy)
            self.state.running = True
            try:
                outcome = await self._probe()
            finally:
                self.state.running = False
            self.state.runs[outcome] += 1
            return outcome

    async def _probe(self) -> str:
        started = self.clock()
        command = self.settings.command(self.results_folder)
        log.info("scheduled probe starting: %s", " ".join(command[2:]))
        proc = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
            start_new_session=True,  # probe parent and its workers share a group we can kill
        )
        stderr_task = asyncio.create_task(_tail(proc.stderr))
        deadline = time.monotonic() + self.settings.timeout_seconds
        outcome = ""
        try:
            while proc.returncode is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    outcome = "timeout"
                    break
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(proc.wait(), timeout=min(self.poll_seconds, remaining))
                if proc.returncode is None:
                    busy = await asyncio.to_thread(self.busy)
                    if busy is not None:
                        self._skip(busy[0], f"probe preempted: {busy[1]}")
                        outcome = "preempted"
                        break
        finally:
            if proc.returncode is None:
                await _kill_group(proc)
            stderr = await stderr_task
        if outcome == "preempted":
            return outcome
        fresh = self._fresh_result(started)
        if outcome == "timeout" or fresh is None:
            why = (
                f"probe killed after {self.settings.timeout_seconds:g}s"
                if outcome == "timeout"
                else f"probe exited with {proc.returncode} without a result: {stderr.strip()[-300:]}"
            )
            log.warning("scheduled probe failed: %s", why)
            self._write_failure(started, why)
            return outcome or "failure"
        self.state.last_message = f"probe finished: success={fresh.success}"
        log.info("scheduled probe finished: success=%s transport=%s", fresh.success, fresh.transport.name)
        return "success" if fresh.success else "failure"

    def _fresh_result(self, started: float) -> ProbeResult | None:
        path = self.results_folder / result_filename(ProbeResult("scheduled", 0.0, 0.0))
        try:
            result = parse_result(path.read_text())
        except (OSError, MalformedResult):
            return None
        return result if result.finished_at >= started else None

    def _write_failure(self, started: float, error: str) -> None:
        collectives = tuple(
            CollectiveResult(collective=c.strip(), error=error)
            for c in self.settings.collectives.split(",")
            if c.strip()
        )
        result = ProbeResult(
            source="scheduled",
            started_at=started,
            finished_at=self.clock(),
            hostname=os.uname().nodename,
            backend=self.settings.backend,
            transport=Transport("unknown", "unknown"),
            collectives=collectives,
            error=error,
        )
        try:
            write_result(self.results_folder, result)
        except OSError as exc:
            log.error("cannot write the failed probe's result into %s: %s", self.results_folder, exc)


async def _tail(stream: asyncio.StreamReader | None) -> str:
    """Drain a pipe, keeping only its last few KiB (the child never blocks on a full pipe)."""
    if stream is None:
        return ""
    kept = b""
    while chunk := await stream.read(65536):
        kept = (kept + chunk)[-STDERR_TAIL_BYTES:]
    return kept.decode("utf-8", errors="replace")


async def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM the probe's process group, then SIGKILL whatever is left of it (its workers too)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(proc.wait(), timeout=TERMINATE_GRACE_SECONDS)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    await proc.wait()

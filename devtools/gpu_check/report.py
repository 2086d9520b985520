"""The steps of one gpu-check run, its time budget, and subprocesses bounded by timeouts.

Every subprocess starts in its own session and is killed with its whole process group when its
timeout passes (``make`` and ``mpirun`` start children of their own), so no step can hang the run.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

OK, SKIPPED, FAILED = "OK", "SKIPPED", "FAILED"
STATUSES = (OK, SKIPPED, FAILED)
TIMED_OUT = 124  # the exit code a timed-out command gets, as coreutils' timeout gives it
# Seconds kept back from every step's timeout for the steps that only read and write files.
RESERVE_SECONDS = 20.0
# A step that cannot have this many seconds is not started.
MIN_STEP_SECONDS = 15.0


@dataclasses.dataclass
class Step:
    name: str
    status: str
    detail: str
    seconds: float


class Report:
    """The outcome of each step, in order, with the seconds since the step before it ended; the
    files the run writes; and the seconds left of the run's budget."""

    def __init__(self, out: Path, budget_seconds: float, clock: object = time.monotonic) -> None:
        self.out = out
        self.steps: list[Step] = []
        self.findings: list[str] = []
        self._clock = clock if callable(clock) else time.monotonic
        self.started = self._clock()
        self._mark = self.started
        self.deadline = self.started + budget_seconds

    def add(self, name: str, status: str, detail: str) -> None:
        now = self._clock()
        self.steps.append(Step(name, status, detail, now - self._mark))
        self._mark = now
        print(f"[{status:7}] {name} ({now - self.started:.0f}s): {detail}", flush=True)

    def restart_clock(self) -> None:
        """The next step's time starts now (after work that is not a step of its own)."""
        self._mark = self._clock()

    def finding(self, text: str) -> None:
        """A sentence for the summary's findings: what a step's output shows, beyond OK or FAILED."""
        self.findings.append(text)

    def write(self, name: str, text: str) -> Path:
        path = self.out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def remaining(self) -> float:
        return self.deadline - self._clock()

    def timeout(self, wanted: float) -> float | None:
        """Seconds a step may run: ``wanted``, cut to what the budget leaves (less the reserve);
        None when that is under ``MIN_STEP_SECONDS`` (the step is then skipped, not started)."""
        left = self.remaining() - RESERVE_SECONDS
        allowed = min(wanted, left)
        return allowed if allowed >= MIN_STEP_SECONDS else None

    def out_of_time(self, name: str) -> None:
        self.add(name, SKIPPED, f"not started: {max(0.0, self.remaining()):.0f}s of the time budget left")

    def status_of(self, name: str) -> str | None:
        return next((s.status for s in self.steps if s.name == name), None)

    def summary(self, title: str) -> str:
        lines = [
            f"# {title}",
            "",
            f"Run {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC with `scripts/gpu-check`, "
            f"{self._clock() - self.started:.0f} s in all.",
            "",
            "| step | status | seconds | detail |",
            "|---|---|---|---|",
        ]
        for s in self.steps:
            detail = s.detail.replace("|", "/").replace("\n", " ")
            lines.append(f"| {s.name} | {s.status} | {s.seconds:.1f} | {detail} |")
        if self.findings:
            lines += ["", "## Findings", ""] + [f"- {f}" for f in self.findings]
        files = sorted(str(p.relative_to(self.out)) for p in self.out.rglob("*") if p.is_file())
        files = [f for f in files if f != "summary.md"]
        lines += ["", "Files: " + ", ".join(f"`{f}`" for f in files), ""]
        return "\n".join(lines)


def _kill_group(proc: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def run_command(
    argv: Sequence[str],
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> tuple[int, str]:
    """Run ``argv`` (stdout and stderr together); exit code ``TIMED_OUT`` and what it printed when
    it ran past ``timeout`` (its process group is killed). A command that cannot start gives 127."""
    try:
        proc = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            env=None if env is None else dict(env),
            cwd=cwd,
            start_new_session=True,
        )
    except OSError as exc:
        return 127, f"cannot run {argv[0]}: {exc}\n"
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, _ = proc.communicate()
        return TIMED_OUT, (out or "") + f"\n(timed out after {timeout:g}s)\n"
    return proc.returncode, out or ""


def run_together(
    commands: Sequence[tuple[Sequence[str], Mapping[str, str]]], timeout: float, cwd: Path | None = None
) -> list[tuple[int, str]]:
    """Start every ``(argv, env)`` at once (ranks of one job), wait for all within one ``timeout``;
    each one's exit code and output. When the time is up, every one still running is killed
    (``TIMED_OUT``): a rank waiting for a peer that died never hangs the run. Output goes to files,
    not pipes, so a rank that prints much never blocks while another is waited for."""
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        procs: list[subprocess.Popen[bytes] | None] = []
        failures: dict[int, str] = {}
        for index, (argv, env) in enumerate(commands):
            with open(Path(tmp) / f"{index}.out", "wb") as sink:
                try:
                    procs.append(
                        subprocess.Popen(
                            list(argv),
                            stdout=sink,
                            stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL,
                            env=dict(env),
                            cwd=cwd,
                            start_new_session=True,
                        )
                    )
                except OSError as exc:
                    procs.append(None)
                    failures[index] = f"cannot run {argv[0]}: {exc}\n"
        deadline = time.monotonic() + timeout
        codes: list[int] = []
        for proc in procs:
            if proc is None:
                codes.append(127)
                continue
            try:
                codes.append(proc.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                proc.wait()
                codes.append(TIMED_OUT)
        results = []
        for index, code in enumerate(codes):
            if index in failures:
                results.append((code, failures[index]))
                continue
            text = (Path(tmp) / f"{index}.out").read_text(errors="replace")
            if code == TIMED_OUT:
                text += f"\n(timed out after {timeout:g}s)\n"
            results.append((code, text))
        return results


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


REPO = Path(__file__).resolve().parents[2]


def repo_env(extra: Mapping[str, str] | None = None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with this repository first on ``PYTHONPATH``
    (``python -m exporter`` runs this tree's code, installed or not), plus ``extra``."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without any ``NCCL_*`` setting (each step says what NCCL gets),
    plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    env.update(extra or {})
    return env

"""The pre-flight's result as its container's termination message: written by ``ccl-exporter
preflight``, read back by the exporter from the node's pod list.

Why: a hostPath shared with the exporter is what Pod Security ``baseline`` and ``restricted``
forbid. Every container already has a file the kubelet reads when it ends
(``terminationMessagePath``, default ``/dev/termination-log``, created mode 0666 so any user may
write it) and copies into ``status.initContainerStatuses[].state.terminated.message``, which
the exporter's pod watch sees. The identity is the API server's: a pod can write only its own
containers' messages, so a report speaks for the pod whose status holds it and for no other.

Sizes, from the kubelet (``pkg/kubelet/container/runtime.go``,
``pkg/kubelet/status/status_manager.go``): it reads at most the **last** 4096 bytes of the file
(``MaxContainerTerminationMessageLength``), then keeps the **first** 12 KiB divided by the
number of the pod's containers (app, init and ephemeral: ``MaxPodTerminationMessageLogLength``)
of each message. So the writer stays within ``MAX_MESSAGE_BYTES``, shortening messages and
saying so, and the format survives losing its tail: one record a line, most important first
(the header, then the failed checks, then the names of those that passed); the reader takes
complete lines only and says when some are missing.

Format ``ccl-preflight/v1`` (ASCII; every line ends with a newline)::

    ccl-preflight/v1 failed finished_at=1764457231.700 checks=7 failed=1[ cut]
    error: <why the probe could not run>            (only when there is one)
    FAIL port_state: mlx5_3 port 1 is DOWN/Disabled (expected ACTIVE/LinkUp)
    ok rdma_devices
    ok uverbs_devices
    ...

``cut`` in the header: the writer shortened a message or left out lines to fit.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from exporter.results.probe_file import MAX_CHECKS, Check, ProbeResult

SCHEMA = "ccl-preflight/v1"
# The init container whose termination message is read (the name the webhook gives its pre-flight).
PREFLIGHT_CONTAINER = "ccl-preflight"
DEFAULT_TERMINATION_MESSAGE_PATH = "/dev/termination-log"
MAX_MESSAGE_BYTES = 4096  # the kubelet's MaxContainerTerminationMessageLength
MESSAGE_CAPS = (480, 240, 120, 60, 0)  # per failed check's message, tried in turn until the report fits
ELLIPSIS = "..."
# What a pod's termination message was, for ccl_preflight_termination_messages{status}.
VALID, CUT, MALFORMED = "valid", "cut", "malformed"
STATUSES = (VALID, CUT, MALFORMED)

_HEADER = re.compile(
    r"ccl-preflight/v1 (passed|failed) finished_at=([0-9]{1,12}(?:\.[0-9]{1,9})?) checks=([0-9]{1,4}) "
    r"failed=([0-9]{1,4})( cut)?"
)
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]")


class MalformedReport(ValueError):
    """A termination message that is not a pre-flight report, with the reason."""


@dataclass(frozen=True)
class PreflightReport:
    """What a termination message says: the verdict, when, the checks it holds, whether lines are missing."""

    passed: bool
    finished_at: float
    checks: tuple[Check, ...]
    error: str | None = None
    cut: bool = False  # the writer shortened it, or lines did not reach the API


@dataclass(frozen=True)
class PodPreflight:
    """A pod's pre-flight as its status shows it: the result (None when malformed) and the status."""

    status: str  # one of STATUSES
    result: ProbeResult | None = None
    reason: str = ""  # why it is malformed


def _flat(message: str) -> str:
    """One line of ASCII: non-ASCII escaped, line breaks and runs of blanks as one space."""
    return " ".join(message.encode("ascii", "backslashreplace").decode().split())


def _capped(message: str, cap: int) -> tuple[str, bool]:
    """``message`` flattened and cut to ``cap`` characters (ending in ``...``); True when it was cut."""
    flat = _flat(message)
    if len(flat) <= cap:
        return flat, False
    return (flat[: cap - len(ELLIPSIS)] + ELLIPSIS if cap > len(ELLIPSIS) else ""), True


def _name(check: str) -> str:
    return _UNSAFE_NAME.sub("_", check)[:64] or "_"


def _lines(result: ProbeResult, cap: int) -> tuple[list[str], bool]:
    """The lines after the header, each failed check's message cut to ``cap`` (0: names only)."""
    checks = result.checks[:MAX_CHECKS]
    cut = len(result.checks) > len(checks)
    lines = []
    if result.error:
        error, shortened = _capped(result.error, max(cap, 60))
        lines.append(f"error: {error}")
        cut |= shortened
    for check in checks:
        if check.ok:
            continue
        message, shortened = _capped(check.message, cap)
        cut |= shortened
        lines.append(f"FAIL {_name(check.check)}: {message}" if message else f"FAIL {_name(check.check)}")
    lines += [f"ok {_name(c.check)}" for c in checks if c.ok]
    return lines, cut


def render_report(result: ProbeResult, limit: int = MAX_MESSAGE_BYTES) -> str:
    """The termination message for a pre-flight result: within ``limit`` bytes, cut and said so when longer.

    ``finished_at`` is rounded down to the millisecond: never later than the result file of the same run."""
    verdict = "passed" if result.success else "failed"
    failed = sum(not c.ok for c in result.checks)
    finished = math.floor(max(0.0, result.finished_at) * 1000) / 1000
    header = f"{SCHEMA} {verdict} finished_at={finished:.3f} checks={len(result.checks)} failed={failed}"
    lines: list[str] = []
    for cap in MESSAGE_CAPS:
        lines, cut = _lines(result, cap)
        text = "".join(f"{line}\n" for line in [header + (" cut" if cut else ""), *lines])
        if len(text) <= limit:
            return text
    # Still too long (a tiny limit): whole lines from the end go, the header stays.
    kept = [f"{header} cut"]
    for line in lines:
        if sum(len(k) + 1 for k in kept) + len(line) + 1 > limit:
            break
        kept.append(line)
    return "".join(f"{line}\n" for line in kept)[:limit]


def parse_report(message: str) -> PreflightReport:
    """A ``PreflightReport`` from a termination message (``MalformedReport`` says why not).

    Only complete lines count: a last line without its newline was cut on the way and is left out."""
    text = message[:MAX_MESSAGE_BYTES]
    lines = text.split("\n")
    tail_cut = lines[-1] != "" or len(message) > MAX_MESSAGE_BYTES
    lines = lines[:-1]
    if not lines:
        raise MalformedReport("no complete first line")
    header = _HEADER.fullmatch(lines[0])
    if header is None:
        raise MalformedReport(f"not a {SCHEMA} report: {lines[0][:60]!r}")
    verdict, finished, total, total_failed, writer_cut = header.groups()
    checks: list[Check] = []
    error = None
    for line in lines[1:]:
        if line.startswith("error: ") and error is None and not checks:
            error = line[len("error: ") :]
            continue
        if line.startswith("FAIL "):
            name, _, note = line[5:].partition(": ")
            ok = False
        elif line.startswith("ok "):
            name, note, ok = line[3:], "", True
        else:
            raise MalformedReport(f"a line that is no check: {line[:60]!r}")
        if not _NAME.fullmatch(name):
            raise MalformedReport(f"a check name that is not one: {name[:60]!r}")
        checks.append(Check(name, ok, note))
        if len(checks) > MAX_CHECKS:
            raise MalformedReport(f"more than {MAX_CHECKS} checks")
    passed = verdict == "passed"
    seen_failed = sum(not c.ok for c in checks)
    if passed and (seen_failed or error):
        raise MalformedReport("says passed and lists a failure")
    missing = int(total) - len(checks)
    if missing < 0 or seen_failed > int(total_failed):
        raise MalformedReport("lists more checks than its header counts")
    if not passed and seen_failed < int(total_failed) and error is None:
        error = f"{int(total_failed) - seen_failed} failed check(s) not in the termination message"
    if not passed and not int(total_failed) and error is None:
        error = "failed (no reason in the termination message)"
    return PreflightReport(passed, float(finished), tuple(checks), error, bool(writer_cut) or tail_cut or missing > 0)


def pod_preflight(namespace: str, pod: str, uid: str, job_name: str, message: str) -> PodPreflight:
    """The pod's pre-flight from its ``ccl-preflight`` termination message: a ``preflight`` result
    for that pod (its identity is the API server's), or the reason it is none."""
    try:
        report = parse_report(message)
    except MalformedReport as exc:
        return PodPreflight(MALFORMED, reason=str(exc))
    result = ProbeResult(
        source="preflight",
        started_at=report.finished_at,
        finished_at=report.finished_at,
        namespace=namespace,
        pod=pod,
        pod_uid=uid,
        job_name=job_name,
        checks=report.checks,
        error=report.error,
    )
    return PodPreflight(CUT if report.cut else VALID, result)


def newest_preflights(results: list[ProbeResult]) -> list[ProbeResult]:
    """The results with one pre-flight per pod, its newest by ``finished_at`` (of two alike, the
    later in the list); other sources pass unchanged, in their order."""
    newest: dict[tuple[str, str], ProbeResult] = {}
    for result in results:
        if result.source == "preflight" and result.pod:
            key = (result.namespace, result.pod)
            if key not in newest or result.finished_at >= newest[key].finished_at:
                newest[key] = result
    return [r for r in results if r.source != "preflight" or not r.pod or newest[(r.namespace, r.pod)] is r]

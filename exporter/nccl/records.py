"""One physical log line → NCCL records (prefix, level, message), and which records are warnings.

A physical line may carry wrappers (Open MPI ``[1,26]<stdout>:``, pdsh ``host: ``, a
launcher's ``[3] ``, leading timestamps and indentation, CloudWatch ``| <time> |`` rows), zero,
one or several NCCL records (interleaved writers glue records together), or a bare message
body whose prefix was stripped. :func:`split_records` finds the records. Nothing here raises on
any text; the work per line is bounded by the caller's length cap (regexes never search more
than a small window backwards).
"""

from __future__ import annotations

import re
from typing import NamedTuple

from exporter.nccl.launcher import ANSI_REMNANT_RE, blank_remnants


class Prefix(NamedTuple):
    """``hostname:pid:tid [cudaDev]`` of an NCCL record (cudaDev is not the rank)."""

    host: str
    pid: int
    tid: int
    cuda_dev: int
    location: str | None  # ``file:line`` of a WARN/TRACE call site


class Record(NamedTuple):
    prefix: Prefix | None  # None: a bare message body (prefix stripped by whoever shipped the log)
    level: str | None  # "INFO", "WARN", "TRACE"; None for bare bodies and the bare version line
    message: str


_LEVEL_RE = re.compile(r"NCCL (INFO|WARN|TRACE)(?: |$)")
_PRE_2_3_LEVEL_RE = re.compile(r"\] (INFO|WARN) ")
# Matched against the text just before a level marker; anchored at its end.
_PREFIX_RE = re.compile(
    r"(?<![^\s:|/\[\]>])(?P<host>[^\s:|/\[\]]{1,253}):(?P<pid>\d{1,10}):(?P<tid>\d{1,10}) \[(?P<dev>-?\d{1,6})\] "
    r"(?:\[Rank \d{1,7}\] )?(?:\d{1,12}\.\d{1,9} )?(?:(?P<loc>\S{1,300}:\d{1,7})(?: \([^)]{0,200}\))? )?$"
)
_ISO_TIME_RE = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?")
# One wrapper at the start of a bare line; stripped repeatedly.
_WRAPPER_RE = re.compile(
    r"\s+"
    r"|>+\s?"  # a markdown quote ("> "), or a reply quoting a quote ("> > ", ">> ")
    r"|(?:stdout|stderr) [FP] "  # the stream and tag of a CRI log line (copied from a node's pod log file)
    r"|\[[0-9;]{0,16}m"  # a colour code whose ESC byte was lost in copying
    r"|[|\u2502\u2503\u2551]\s?"
    r"|\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?\s?"
    r"|\[[^\]]{0,256}\](?:<std(?:out|err)>)?:?\s?"
    r"|\([^()]{0,200}pid=\d+[^()]{0,200}\)\s?"  # Ray: "(RayTrainWorker pid=285, ip=10.0.0.2) "
    r"|(?<![\w.-])[A-Za-z0-9][\w.-]{0,253}(?:: (?=\S)|\s+\|\s?)"  # pdsh/srun --label "host: ", compose "svc-1  | "
)
_PREFIX_WINDOW = 512
# Trailing padding and frames: log viewers pad lines to the terminal width and close them with
# a box-drawing bar (│ ┃ ║); CloudWatch rows end in " |".
TRAILER = " \t\r\n|\u2502\u2503\u2551"
# ANSI SGR/CSI sequences (coloured console output, kubectl/k9s/stern colours).
# The first folded line also carries Ray's explanation after the marker: drop both.
_RAY_REPEATED_RE = re.compile(r"(?<!\s)\s*\[repeated \d{1,9}x across cluster\].*$")
_TRAILING_REMNANT_RE = re.compile(r"(?:\[[0-9;]{0,16}m)+$")
_ANSI_RE = re.compile(r"\x1b\[[0-9;?]{0,32}[A-Za-z]|\x1b\][^\x07\x1b]{0,256}(?:\x07|\x1b\\)")


def strip_ansi(text: str) -> str:
    """``text`` without terminal escape sequences (only called when it holds an ESC)."""
    return _ANSI_RE.sub("", text).replace("\x1b", "")


def clean_message(message: str) -> str:
    """A message body without its trailing padding and frames, nor a lost-ESC colour code that ends it
    ("Using network Socket[0m")."""
    message = message.rstrip(TRAILER)
    if message.endswith("m"):
        cut = _TRAILING_REMNANT_RE.search(message)
        if cut is not None:
            message = message[: cut.start()].rstrip(TRAILER)
    return message


def strip_wrappers(text: str) -> str:
    """Remove launcher, MPI, pdsh, timestamp and log-shipper wrappers from the start of ``text``."""
    for _ in range(8):
        m = _WRAPPER_RE.match(text)
        if m is None or m.end() == 0:
            break
        text = text[m.end() :]
    return text


def _match_prefix(window: str) -> re.Match[str] | None:
    if "m" in window and ANSI_REMNANT_RE.search(window):
        window = blank_remnants(window)
    m = _PREFIX_RE.search(window)
    if m is not None and m.group("host")[0].isdigit() and _ISO_TIME_RE.search(window):
        # A timestamp glued to the host name ("...-07:00ip-10-0-0-1:79:79 [0]"): drop it.
        cleaned = _ISO_TIME_RE.sub(" ", window)
        m2 = _PREFIX_RE.search(cleaned)
        if m2 is not None:
            return m2
    return m


def _prefix_before(line: str, start: int, floor: int) -> tuple[Prefix | None, int]:
    """The prefix ending at ``start`` (searched no further back than ``floor`` or the window)."""
    window_start = max(floor, start - _PREFIX_WINDOW)
    m = _match_prefix(line[window_start:start])
    if m is None:
        return None, start
    host, pid, tid, dev, loc = m.group("host", "pid", "tid", "dev", "loc")
    begin = window_start + m.start()
    if host[0] == "N" and line[max(0, begin - 2) : begin] == "] ":
        # Two writers interleaved inside "NCCL INFO": "…[1] NCCg183:161260:…" is host g183.
        cut = next((n for n in (4, 3, 2, 1) if host.startswith("NCCL"[:n])), 0)
        if 0 < cut < len(host):
            host = host[cut:]
    return Prefix(host, int(pid), int(tid), int(dev), loc), begin


_PREFIX_CACHE_SIZE = 4096


def _cached_prefix(line: str, start: int, prefixes: dict[str, Prefix | None]) -> Prefix | None:
    """The prefix before the level marker at ``start``, looked up by the text before it (the
    same few ``host:pid:tid [dev] `` heads repeat on every line of a process)."""
    head = line[:start]
    try:
        return prefixes[head]
    except KeyError:
        pass
    prefix, _ = _prefix_before(line, start, 0)
    if len(head) <= _PREFIX_WINDOW:  # the prefix depends on nothing else then
        if len(prefixes) >= _PREFIX_CACHE_SIZE:
            prefixes.clear()
        prefixes[head] = prefix
    return prefix


def split_records(line: str, prefixes: dict[str, Prefix | None] | None = None) -> list[Record]:
    """Every NCCL record on one physical line (already cut to the caller's length cap).

    ``prefixes`` is the caller's cache of parsed prefixes by the text before ``NCCL <LEVEL>``
    (bounded here); without it every prefix is parsed.
    """
    if "\x1b" in line:
        line = strip_ansi(line)
    if "across cluster]" in line:  # Ray's log deduplication: "... [repeated 7x across cluster]"
        line = _RAY_REPEATED_RE.sub("", line)
    first = _LEVEL_RE.search(line)
    if first is None:
        old = _PRE_2_3_LEVEL_RE.search(line)
        if old is not None:  # NCCL 2.2 and older: "host:pid:tid [dev] INFO message", no "NCCL" word
            prefix, _ = _prefix_before(line, old.start() + 2, 0)
            if prefix is not None:
                return [Record(prefix, old.group(1), clean_message(line[old.end() :]))]
        body = clean_message(strip_wrappers(line))
        return [Record(None, None, body)] if body else []
    start, end = first.span()
    if line.find("NCCL ", end) == -1 or _LEVEL_RE.search(line, end) is None:  # the common case: one record
        if prefixes is None:
            prefix, _ = _prefix_before(line, start, 0)
        else:
            prefix = _cached_prefix(line, start, prefixes)
        return [Record(prefix, first.group(1), clean_message(line[end:]))]
    found: list[tuple[int, int, Prefix | None, str]] = []  # (record start, message start, prefix, level)
    previous_end = 0
    for marker in _LEVEL_RE.finditer(line):
        prefix, start = _prefix_before(line, marker.start(), previous_end)
        found.append((start, marker.end(), prefix, marker.group(1)))
        previous_end = marker.end()
    records = []
    for i, (_, msg_start, prefix, level) in enumerate(found):
        msg_end = found[i + 1][0] if i + 1 < len(found) else len(line)
        records.append(Record(prefix, level, clean_message(line[msg_start:msg_end])))
    return records


# ---------------------------------------------------------------------------------------------
# Warnings

# (category, substrings any of which marks it). Checked in order; a fixed vocabulary keeps the
# ccl_nccl_warnings_total{category} label set bounded.
_WARNING_CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ib_library_missing", ("Failed to open libibverbs",)),
    ("ib_no_device", ("NET/IB : No device found",)),
    # Before the plugin failures: HPC-X's IB plugin (ib_plugin.c) prints net_ib.cc's own completion
    # and async-event warnings, which say the verbs transport carries traffic, not that it failed to load.
    ("ib_completion_error", ("Got completion",)),
    ("ib_async_event", ("async event", "async fatal event", "async non-fatal")),
    (
        "net_plugin_failure",
        (
            "Failed to initialize any NET plugin",
            "NET/OFI",
            "NET/Plugin",
            "not found.",
            "ncclNetPlugin",
            "nccl_net_ofi",
            "ib_plugin.c",
            "p2p_plugin.c",
        ),
    ),
    ("ib_verbs_error", ("ibv_", "NET/IB")),
    ("socket_connection_closed", ("Connection closed by remote peer", "Connection reset", "Broken pipe")),
    ("socket_error", ("socket", "Socket", "connect failed", "Connect to", "bootstrap", "Bootstrap")),
    ("proxy_error", ("[Service thread]", "[Proxy Service", "proxy", "Proxy")),
    ("cuda_error", ("Cuda failure", "CUDA", "cuda")),
    ("timeout", ("timeout", "Timeout", "timed out")),
)
WARNING_CATEGORIES: tuple[str, ...] = tuple(c for c, _ in _WARNING_CATEGORIES) + ("other",)


def warning_category(record: Record) -> str | None:
    """The category of a record worth counting as a warning, or None.

    Every WARN counts; two INFO lines count too because they explain a missing RDMA path
    (``Failed to open libibverbs.so`` is INFO from 2.11, ``NET/IB : No device found.`` always).
    """
    message = record.message
    if record.level != "WARN":
        if message.startswith("Failed to open libibverbs"):
            return "ib_library_missing"
        if message.startswith("NET/IB : No device found"):
            return "ib_no_device"
        return None
    location = record.prefix.location if record.prefix and record.prefix.location else ""
    text = location + " " + message
    for category, needles in _WARNING_CATEGORIES:
        if any(n in text for n in needles):
            return category
    return "other"

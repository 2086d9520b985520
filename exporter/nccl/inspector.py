"""NCCL Inspector output, pure: one JSON Lines record or one ``.prom`` file in, operations out.

The NCCL Inspector (NVIDIA/nccl ``plugins/profiler/inspector``, ``ext-profiler/inspector``
before 2.29.7) is a profiler plugin that writes, from inside the job, one record per collective
(or point-to-point) operation it timed. Two output formats, each in the versions the plugin's
history shows:

* **JSON Lines** (``<dump dir>/<hostname>-pid<pid>.log``, one compact object per line,
  ``inspector_output_format_version`` "v4.0" in every release so far)::

    {"header":{"id":"0x7f8c496ae9f661","comm_name":"DP","rank":2,"n_ranks":8,"nnodes":1},
     "metadata":{"inspector_output_format_version":"v4.0",...,"hostname":"node-a","pid":1639453},
     "coll_perf":{"coll":"AllReduce","coll_sn":1407,"coll_msg_size_bytes":17179869184,
                  "coll_exec_time_us":61974,"coll_timing_source":"kernel_gpu",
                  "coll_algobw_gbs":277.210914,"coll_busbw_gbs":485.119099}}

  ``comm_name`` from 2.30.3; ``p2p_perf`` records (``p2p``, ``p2p_peer`` and ``p2p_*`` twins
  of the fields above) from 2.30.3; verbose mode adds ``event_trace_*`` objects. NCCL 2.28 and
  2.29 write the last completed operation of each communicator per dump (a sample); 2.30 drains a
  ring of every operation above ``NCCL_INSPECTOR_DUMP_MIN_SIZE_BYTES``.
* **Prometheus text** (``nccl_inspector_metrics_<GPU UUID>.prom``, no HELP/TYPE), rewritten per
  dump interval. Version 1 (2.29.3 to 2.29.7) has one line per metric and sampled operation, with
  labels ``comm_id, hostname, rank, ..., nranks, n_nodes, collective, coll_sn, message_size``
  (``"1.00GB"``). Version 5.1 (``version="v5.1"``, 2.30) has one line per metric and bucket
  (communicator, collective, power-of-two message-size range ``"4-5GB"``, algorithm and protocol)
  with the *mean* execution time and the *geometric mean* bus bandwidth of the interval's
  operations, and no count.

``message bytes`` in a record are per rank for AllGather and ReduceScatter; the nccl-tests size
(the whole buffer, what the bus factor applies to) is that times the rank count, as the plugin
computes its own bandwidths.

**Timing source.** Every JSON record of 2.28 and later names how its time was taken
(``coll_timing_source``/``p2p_timing_source``, ``inspectorTimingSourceToString``): ``kernel_gpu``
(the slowest channel's kernel, by the GPU's global timer), ``kernel_cpu`` (a channel's kernel by
CPU timestamps of the profiler events) or ``collective_cpu`` (the whole operation by CPU
timestamps), ``unknown`` for none of them. Only ``kernel_gpu`` is the operation's own time: the
CPU timings hold launch and polling delays (a 1 GiB all-reduce of 9.6 ms on the GPU was seen at
250 ms). NCCL 2.30 drops the others by default (``NCCL_INSPECTOR_REQUIRE_KERNEL_TIMING=1``); here
a record of any version timed otherwise is skipped with its reason (``timing_kernel_cpu``,
``timing_collective_cpu``, ``timing_unknown``), so that one slow CPU timing never drags a job's
bus bandwidth down. A record without the field is taken as it is. ``.prom`` files name no timing
source: what they hold cannot be told apart (2.30 with its default holds GPU timings only).

**Sizes from ``.prom`` files.** Their ``message_size`` is a range, not a size: ``"%.2f<unit>"``
in version 1 (rounded, 1024-based), ``"<n>-<n+1><unit>"`` in version 5.1 (the power-of-1024 unit
below the size, floored: ``"953-954MB"`` holds sizes from 953 MiB up to 954 MiB, 10^9 bytes among
them). Taking the range's lower bound puts an operation one size class lower than its JSON
record does wherever a range straddles a class boundary. The size is therefore the one the
plugin's own bandwidth gives back (traffic = algbw x time in version 1; busbw x time / the
plugin's bus factor in version 5.1, exact for a bucket of equal sizes), kept inside the range
(the range's lower bound when no bandwidth is given, e.g. a bus factor of 0) and taken at a
class boundary when within the printing precision of one (``%.6g`` of two numbers).

No I/O, no clock: the caller reads the files.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

# Inspector collective name -> (label value, the nccl-tests size is message bytes x nranks)
COLLECTIVES: dict[str, tuple[str, bool]] = {
    "AllReduce": ("all_reduce", False),
    "AllGather": ("all_gather", True),
    "AllGatherV": ("all_gather", True),
    "ReduceScatter": ("reduce_scatter", True),
    "Broadcast": ("broadcast", False),
    "Reduce": ("reduce", False),
    "All2All": ("alltoall", False),
    "SendRecv": ("sendrecv", False),
    "Send": ("send", False),
    "Recv": ("recv", False),
}
COLLECTIVE_LABELS: tuple[str, ...] = tuple(sorted({label for label, _ in COLLECTIVES.values()}))

# Size classes of an operation's nccl-tests size (decimal powers of ten; the upper bound is
# exclusive). Small operations are latency-bound; bus bandwidth means something from ~10 MB up.
SIZE_CLASSES: tuple[tuple[str, float], ...] = (
    ("lt_1MB", 1e6),
    ("1MB_10MB", 1e7),
    ("10MB_100MB", 1e8),
    ("100MB_1GB", 1e9),
    ("ge_1GB", math.inf),
)
SIZE_CLASS_LABELS: tuple[str, ...] = tuple(name for name, _ in SIZE_CLASSES)
# Communicator scope from the record's node count; the probe's scope label uses the same words.
SCOPES = ("inter_node", "intra_node", "unknown")

FORMAT_JSON = "json"
FORMAT_PROM = "prom"
FORMATS = (FORMAT_JSON, FORMAT_PROM)

# Why a record or line was not taken (a fixed vocabulary: a label of the skipped counter).
MALFORMED = "malformed"  # not JSON, not an object, not a metric line
NOT_A_RECORD = "not_a_record"  # valid, but no operation in it
INVALID_VALUE = "invalid_value"  # a field missing, of the wrong type or out of range
NO_TIME = "no_time"  # an execution time of 0 (no bandwidth can be derived)
UNKNOWN_COLLECTIVE = "unknown_collective"
INCOMPLETE = "incomplete"  # a .prom bucket without both of its metrics
TIMING_KERNEL_CPU = "timing_kernel_cpu"  # timed by CPU timestamps of a kernel (module docstring)
TIMING_COLLECTIVE_CPU = "timing_collective_cpu"  # timed by CPU timestamps of the whole operation
TIMING_UNKNOWN = "timing_unknown"  # a timing source the plugin calls "unknown", or one it never wrote
SKIP_REASONS = (
    MALFORMED,
    NOT_A_RECORD,
    INVALID_VALUE,
    NO_TIME,
    UNKNOWN_COLLECTIVE,
    INCOMPLETE,
    TIMING_KERNEL_CPU,
    TIMING_COLLECTIVE_CPU,
    TIMING_UNKNOWN,
)

# The timing source of an operation's own time, and why the others are not taken
KERNEL_GPU = "kernel_gpu"
_OTHER_TIMING = {"kernel_cpu": TIMING_KERNEL_CPU, "collective_cpu": TIMING_COLLECTIVE_CPU}

_MAX_BYTES = 1 << 50  # a message above 1 PiB is not a message
_MAX_MICROSECONDS = 1e10  # nor an operation of ~3 hours
_MAX_RANKS = 1 << 20
_MAX_GBS = 1e6  # 1 PB/s
_MAX_PROM_LINE = 4096
_MAX_PROM_LABELS = 32
_SIZE_UNITS = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}
# Relative error of a size given back from two numbers printed with %.6g (5e-6 each), with room
_PRINT_PRECISION = 2e-5


@dataclass(frozen=True)
class Operation:
    """What the Inspector timed: one operation (JSON, .prom v1), or the mean of a bucket of one
    dump interval (.prom v5.1, ``mean`` True)."""

    collective: str  # label value (COLLECTIVES)
    nranks: int
    nnodes: int | None
    size_bytes: int  # the nccl-tests size: the whole buffer
    seconds: float  # execution time (the bucket's mean for a .prom v5.1 bucket)
    # The plugin's own bus bandwidth (bytes/s) when the record gives one: what a .prom bucket
    # offers instead of a size (its geometric mean over the interval).
    stated_bus_bandwidth: float | None = None
    mean: bool = False
    format: str = FORMAT_JSON  # the file it came from: its size is exact in JSON, bucketed in .prom

    @property
    def scope(self) -> str:
        if self.nnodes is None:
            return "unknown"
        return "inter_node" if self.nnodes > 1 else "intra_node"

    @property
    def size_class(self) -> str:
        return size_class(self.size_bytes)


@dataclass
class Parsed:
    """The operations of a block of input, and what was skipped, by reason."""

    operations: list[Operation] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)
    version: str = ""  # the format version the input said it had (.prom)

    def skip(self, reason: str, count: int = 1) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + count


def size_class(size_bytes: float) -> str:
    for name, upper in SIZE_CLASSES:
        if size_bytes < upper:
            return name
    return SIZE_CLASSES[-1][0]


def _integer(value: object, low: int, high: int) -> int | None:
    if type(value) is not int or not low <= value <= high:
        return None
    return value


def _number(value: object, low: float, high: float) -> float | None:
    if type(value) not in (int, float):
        return None
    try:
        number = float(value)  # type: ignore[arg-type]  # int or float, checked above
    except OverflowError:  # an integer of hundreds of digits
        return None
    return number if math.isfinite(number) and low <= number <= high else None


def _buffer_bytes(name: str, message_bytes: int, nranks: int) -> tuple[str, int] | None:
    known = COLLECTIVES.get(name)
    if known is None:
        return None
    label, per_rank = known
    return label, message_bytes * nranks if per_rank else message_bytes


def plugin_bus_factor(name: str, nranks: int, point_to_point: bool = False) -> float:
    """The factor the plugin multiplies its algorithm bandwidth by (``inspectorComputeOpBw``):
    nccl-tests' for the collectives it knows, 1 for point-to-point, 0 for the rest (All2All)."""
    if point_to_point or name in ("Reduce", "Broadcast", "SendRecv", "Send", "Recv"):
        return 1.0
    if name == "AllReduce":
        return 2.0 * (nranks - 1) / nranks
    if name in ("AllGather", "AllGatherV", "ReduceScatter"):
        return (nranks - 1) / nranks
    return 0.0


def parse_json_record(line: str) -> Operation | str:
    """One line of an Inspector JSON Lines file: the operation, or why it was skipped (one of
    ``SKIP_REASONS``). Never raises."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return MALFORMED
    if not isinstance(record, dict):
        return MALFORMED
    header = record.get("header")
    perf, prefix = record.get("coll_perf"), "coll"
    if perf is None:
        perf, prefix = record.get("p2p_perf"), "p2p"
    if not isinstance(header, dict) or not isinstance(perf, dict):
        return NOT_A_RECORD
    nranks = _integer(header.get("n_ranks"), 1, _MAX_RANKS)
    nnodes = _integer(header.get("nnodes", 0), 0, _MAX_RANKS)  # 0 or absent: not known
    size = _integer(perf.get(f"{prefix}_msg_size_bytes"), 0, _MAX_BYTES)
    micros = _number(perf.get(f"{prefix}_exec_time_us"), 0, _MAX_MICROSECONDS)
    name = perf.get(prefix)
    if nranks is None or nnodes is None or size is None or micros is None or not isinstance(name, str):
        return INVALID_VALUE
    timing = perf.get(f"{prefix}_timing_source", KERNEL_GPU)  # absent (before 2.28): taken as it is
    if not isinstance(timing, str):
        return INVALID_VALUE
    if timing != KERNEL_GPU:
        return _OTHER_TIMING.get(timing, TIMING_UNKNOWN)
    stated = _number(perf.get(f"{prefix}_busbw_gbs"), 0, _MAX_GBS)
    buffer = _buffer_bytes(name, size, nranks)
    return _operation(name, nranks, nnodes, None if buffer is None else buffer[1], micros, stated)


def _operation(
    name: str,
    nranks: int,
    nnodes: int | None,
    buffer_bytes: int | None,
    micros: float,
    stated_gbs: float | None,
    mean: bool = False,
    source: str = FORMAT_JSON,
) -> Operation | str:
    """The operation of checked values (``buffer_bytes`` the nccl-tests size), or why it cannot
    be one."""
    if micros == 0:
        return NO_TIME
    known = COLLECTIVES.get(name)
    if known is None or buffer_bytes is None:
        return UNKNOWN_COLLECTIVE
    return Operation(
        collective=known[0],
        nranks=nranks,
        nnodes=nnodes or None,
        size_bytes=buffer_bytes,
        seconds=micros / 1e6,
        stated_bus_bandwidth=None if stated_gbs is None else stated_gbs * 1e9,
        mean=mean,
        format=source,
    )


# ---- Prometheus text -----------------------------------------------------------------------

_PROM_LINE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\}[ \t]+(\S+)(?:[ \t]+\d+)?")
_PROM_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(?:,|$)')
# ASCII digits only, and few of them: int() and float() also take "٣" or 400 digits, which no
# size the plugin writes has (and whose float, times a unit, is beyond an int).
# v5.1 (inspectorPromFormatMessageSizeRange): "%.0f-%.0f%s" of floor(size in its unit) and one
# more, or "0B".
_RANGE_SIZE = re.compile(r"([0-9]{1,15})-([0-9]{1,15})(B|KB|MB|GB|TB)")
# v1 (inspectorFormatHumanReadableSize): "%zuB" below 1 KiB, "%.2f%s" from there.
_HUMAN_SIZE = re.compile(r"([0-9]{1,15})(?:\.([0-9]{1,15}))?(B|KB|MB|GB|TB)")
_COUNT = re.compile(r"[0-9]{1,15}")  # nranks, n_nodes
# What a metric holds
_BUS = "bus_gbs"
_TIME = "exec_us"
_ALGO = "algo_gbs"
_PROM_METRICS = {
    "nccl_bus_bandwidth_gbs": _BUS,
    "nccl_collective_exec_time_microseconds": _TIME,
    "nccl_algorithm_bandwidth_gbs": _ALGO,  # version 1 only
    "nccl_p2p_bus_bandwidth_gbs": _BUS,
    "nccl_p2p_exec_time_microseconds": _TIME,
}
# Labels that tell one operation or bucket from another (the metric name aside).
_PROM_IDENTITY = (
    "comm_id",
    "comm_name",
    "rank",
    "gpu",
    "gpu_device_id",
    "collective",
    "p2p_operation",
    "coll_sn",
    "message_size",
    "algo_proto",
    "nranks",
    "n_nodes",
)
# Class boundaries (bytes) a size given back from printed bandwidths may be taken at
_CLASS_BOUNDARIES = tuple(upper for _, upper in SIZE_CLASSES if math.isfinite(upper))


def _prom_labels(text: str) -> dict[str, str] | None:
    labels: dict[str, str] = {}
    position = 0
    while position < len(text):
        match = _PROM_LABEL.match(text, position)
        if match is None or len(labels) >= _MAX_PROM_LABELS:
            return None
        labels[match.group(1)] = match.group(2)
        position = match.end()
    return labels


def message_size_range(text: str) -> tuple[float, float] | None:
    """The message bytes a ``.prom`` ``message_size`` label allows, ``[low, high)``: ``"4-5GB"``
    (version 5.1) is [4 GiB, 5 GiB), ``"1.00GB"`` (version 1, rounded to its last digit) is
    [0.995 GiB, 1.005 GiB), ``"512B"`` is [512, 513). None for anything else."""
    if text == "0B":
        return 0.0, 1.0
    match = _RANGE_SIZE.fullmatch(text)
    if match is not None:
        lower, upper, unit = int(match.group(1)), int(match.group(2)), _SIZE_UNITS[match.group(3)]
        if lower < 1 or upper != lower + 1:  # the writer floors to 1 at least, and adds one
            return None
        return float(lower * unit), float(upper * unit)
    match = _HUMAN_SIZE.fullmatch(text)
    if match is None:
        return None
    whole, decimals, unit = match.group(1), match.group(2), _SIZE_UNITS[match.group(3)]
    if decimals is None and unit == 1:
        return float(whole), float(whole) + 1.0
    value = float(f"{whole}.{decimals or '0'}")
    half = 0.5 * 10.0 ** -len(decimals or "")
    return max(0.0, value - half) * unit, (value + half) * unit


def _at_boundary(size: float) -> float:
    """A size just under a class boundary, within the printing precision, is taken at it."""
    for boundary in _CLASS_BOUNDARIES:
        if boundary * (1 - _PRINT_PRECISION) <= size < boundary:
            return boundary
    return size


def _prom_buffer_bytes(labels: dict[str, str], values: dict[str, float], nranks: int) -> int | None:
    """The nccl-tests size of a sample or bucket (see the module docstring), None when its
    ``message_size`` is not one the plugin writes."""
    allowed = message_size_range(labels.get("message_size", ""))
    if allowed is None or allowed[1] > _MAX_BYTES:
        return None
    name = labels.get("collective") or labels.get("p2p_operation") or ""
    per_rank = COLLECTIVES.get(name, ("", False))[1]
    scale = nranks if per_rank else 1
    low, high = math.ceil(allowed[0] * scale), math.ceil(allowed[1] * scale) - 1  # integers in [low, high)
    seconds = values[_TIME] / 1e6
    algo = values.get(_ALGO, 0.0)
    factor = plugin_bus_factor(name, nranks, point_to_point="p2p_operation" in labels)
    if algo > 0:
        traffic: float | None = algo * 1e9 * seconds
    elif values[_BUS] > 0 and factor > 0:
        traffic = values[_BUS] * 1e9 * seconds / factor
    else:
        traffic = None
    if traffic is None:
        return low
    return min(max(round(_at_boundary(traffic)), low), max(high, low))


def _prom_operation(labels: dict[str, str], values: dict[str, float]) -> Operation | str:
    if _BUS not in values or _TIME not in values:
        return INCOMPLETE
    name = labels.get("collective") or labels.get("p2p_operation") or ""
    nranks = int(labels["nranks"]) if _COUNT.fullmatch(labels.get("nranks", "")) else None
    nnodes = int(labels["n_nodes"]) if _COUNT.fullmatch(labels.get("n_nodes", "")) else None
    micros, gbs, algo = values[_TIME], values[_BUS], values.get(_ALGO, 0.0)
    if nranks is None or not 1 <= nranks <= _MAX_RANKS:
        return INVALID_VALUE
    if nnodes is not None and nnodes > _MAX_RANKS:
        return INVALID_VALUE
    if not all(math.isfinite(v) and 0 <= v <= limit for v, limit in ((micros, _MAX_MICROSECONDS), (gbs, _MAX_GBS),
                                                                       (algo, _MAX_GBS))):  # fmt: skip
        return INVALID_VALUE
    if micros == 0:
        return NO_TIME
    if name not in COLLECTIVES:
        return UNKNOWN_COLLECTIVE
    buffer = _prom_buffer_bytes(labels, values, nranks)
    if buffer is None:
        return INVALID_VALUE
    mean = labels.get("version", "").startswith("v5")
    return _operation(name, nranks, nnodes, buffer, micros, gbs, mean, FORMAT_PROM)


def parse_prom(text: str) -> Parsed:
    """The operations (v1) or interval means (v5.1) of one complete ``.prom`` file. Lines of
    other metrics, comments and blank lines are ignored; a line that is not a metric line is
    skipped as malformed. A sample or bucket written twice in one file (a dump appended to the
    last) is two. Never raises."""
    parsed = Parsed()
    groups: dict[tuple[tuple[str, str], ...], list[tuple[dict[str, str], dict[str, float]]]] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        match = _PROM_LINE.fullmatch(line.strip()) if len(line) <= _MAX_PROM_LINE else None
        labels = _prom_labels(match.group(2)) if match is not None else None
        if match is None or labels is None:
            parsed.skip(MALFORMED)
            continue
        kind = _PROM_METRICS.get(match.group(1))
        if kind is None:
            continue
        try:
            if not match.group(3).isascii():  # float() takes "٣"; the text format does not
                raise ValueError(match.group(3))
            value = float(match.group(3))
        except ValueError:
            parsed.skip(MALFORMED)
            continue
        parsed.version = parsed.version or labels.get("version", "v1")
        identity = tuple((name, labels.get(name, "")) for name in _PROM_IDENTITY)
        same = groups.setdefault(identity, [])
        group = next((g for g in same if kind not in g[1]), None)
        if group is None:
            group = (labels, {})
            same.append(group)
        group[1][kind] = value
    for same in groups.values():
        for labels, values in same:
            operation = _prom_operation(labels, values)
            if isinstance(operation, str):
                parsed.skip(operation)
            else:
                parsed.operations.append(operation)
    return parsed

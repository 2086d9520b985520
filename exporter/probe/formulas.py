"""nccl-tests arithmetic: sizes, sweeps, algorithm and bus bandwidth (pure functions).

Definitions follow NVIDIA/nccl-tests ``doc/PERFORMANCE.md``:

* ``S`` is the size column of the table: the whole buffer of the operation (for all_gather
  the gathered output, for reduce_scatter the input, for alltoall one rank's send buffer).
* ``algbw = S / t`` with ``t`` the time of one operation.
* ``busbw = algbw x factor``: ``2(n-1)/n`` for all_reduce, ``(n-1)/n`` for all_gather,
  reduce_scatter and alltoall, ``1`` for broadcast (and for reduce and sendrecv, which jobs run
  and the probe does not). busbw is the number comparable to the
  hardware bottleneck (NVLink, PCIe, network) whatever the rank count.

Units here are bytes and bytes/second; the table printer shows GB/s with GB = 1e9 bytes, as
nccl-tests does.
"""

from __future__ import annotations

import re

from exporter.results.probe_file import COLLECTIVES, MAX_SWEEP_POINTS

# Collectives whose buffer is split into one chunk per rank: sizes are rounded to a multiple
# of (type size x ranks), as nccl-tests does.
CHUNKED = frozenset({"all_gather", "reduce_scatter", "alltoall"})
# Collectives whose bus traffic is their buffer once (nccl-tests' broadcast, reduce, sendrecv).
FACTOR_ONE = frozenset({"broadcast", "reduce", "sendrecv"})

_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]?)(?:i?B)?\s*$", re.IGNORECASE)
_MULTIPLIER = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}

# Bounds that keep a mistyped flag from allocating terabytes or looping forever.
MAX_SIZE_BYTES = 64 * 1024**3


def busbw_factor(collective: str, nranks: int) -> float:
    """The nccl-tests bus-bandwidth factor of ``collective`` on ``nranks`` ranks."""
    if nranks < 1:
        raise ValueError(f"nranks must be >= 1, not {nranks}")
    if collective == "all_reduce":
        return 2.0 * (nranks - 1) / nranks
    if collective in CHUNKED:
        return (nranks - 1) / nranks
    if collective in FACTOR_ONE:
        return 1.0
    raise ValueError(f"unknown collective {collective!r} (known: {', '.join(COLLECTIVES)})")


def algbw(size_bytes: int, seconds: float) -> float:
    """Algorithm bandwidth in bytes/s: the buffer size over the time of one operation."""
    if seconds <= 0:
        raise ValueError(f"operation time must be positive, not {seconds}")
    return size_bytes / seconds


def busbw(collective: str, size_bytes: int, seconds: float, nranks: int) -> float:
    """Bus bandwidth in bytes/s (algbw x the collective's factor)."""
    return algbw(size_bytes, seconds) * busbw_factor(collective, nranks)


def parse_size(text: str) -> int:
    """``"32M"`` → 33554432. Suffixes K, M, G are powers of 1024 (as nccl-tests' ``-b/-e``)."""
    match = _SIZE.match(str(text))
    if not match:
        raise ValueError(f"size {text!r} is not a number with an optional K, M or G suffix")
    value = int(match.group(1)) * _MULTIPLIER[match.group(2).upper()]
    if value > MAX_SIZE_BYTES:
        raise ValueError(f"size {text!r} is above the {format_size(MAX_SIZE_BYTES)} limit")
    return value


def format_size(size_bytes: int) -> str:
    """The shortest exact K/M/G spelling of a size: 1048576 → ``"1M"``, 1000 → ``"1000"``."""
    for suffix in ("G", "M", "K"):
        unit = _MULTIPLIER[suffix]
        if size_bytes >= unit and size_bytes % unit == 0:
            return f"{size_bytes // unit}{suffix}"
    return str(size_bytes)


def align_size(collective: str, size_bytes: int, type_size: int, nranks: int) -> int:
    """Round a size down to whole elements (and whole per-rank chunks for chunked collectives).

    Never below one element (one per rank for chunked collectives).
    """
    unit = type_size * (nranks if collective in CHUNKED else 1)
    return max(unit, size_bytes - size_bytes % unit)


def size_sweep(min_bytes: int, max_bytes: int, step_factor: float = 2.0, step_bytes: int = 0) -> list[int]:
    """The sizes of an nccl-tests sweep ``-b min -e max`` with ``-f factor`` or ``-i step``.

    With ``step_bytes`` > 0 sizes grow by addition, otherwise they are multiplied by
    ``step_factor``. The sweep always includes ``min_bytes`` and stops at ``max_bytes``.
    """
    if min_bytes < 1 or max_bytes < min_bytes:
        raise ValueError(f"need 1 <= min ({min_bytes}) <= max ({max_bytes})")
    if step_bytes <= 0 and step_factor <= 1.0 and max_bytes > min_bytes:
        raise ValueError(f"step factor must be > 1 (got {step_factor}) unless min == max")
    sizes: list[int] = []
    size = min_bytes
    while size <= max_bytes:
        sizes.append(size)
        if len(sizes) > MAX_SWEEP_POINTS:
            raise ValueError(f"sweep {min_bytes}..{max_bytes} has more than {MAX_SWEEP_POINTS} sizes")
        if min_bytes == max_bytes:
            break
        size = size + step_bytes if step_bytes > 0 else int(size * step_factor)
        if sizes[-1] == size:  # a factor too small to move an integer size
            raise ValueError(f"step factor {step_factor} does not grow size {size}")
    return sizes

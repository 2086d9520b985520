"""NCCL-shaped hostile lines: 64 KiB built from NCCL's own tokens (``NET/`` x 16,000 before ``GPU
Direct RDMA``, ``comm `` runs, ``nccl`` runs, whitespace runs, ...), each ending in a tail that
completes a match, so that a pattern which backtracks does so. ``tests/nccl/test_hostile_lines.py``
bounds every pattern and entry point of the parser on them; ``bench/hostile_parse.py`` times them.

``communicator_flood`` is the other hostile shape: lines that fill an analyzer to its caps (the
parser-budget tests and benchmark use it).
"""

from __future__ import annotations

from collections.abc import Iterator

LINE_CHARS = 64 * 1024
# Pieces of NCCL output that the patterns anchor on or repeat over.
TOKENS = (
    "NET/",
    "NET/IB : ",
    "NET/Socket : ",
    "NET/OFI ",
    "NET/Plugin: ",
    "comm ",
    "nccl",
    "ncclComm",
    "Channel 00/0 : ",
    "Ring 00 : ",
    "0[0] -> 1[1] ",
    " via ",
    "via NET/",
    "COLLNET/",
    "Coll 00 : 0 [send] via COLLNET/",
    "GPU Direct RDMA ",
    " coll channels, ",
    "[0]",
    "[0]mlx5_0:1/IB ",
    "; OOB ",
    "h:1:2 [0] ",
    "a:1:1 [0] NCCL INFO ",
    "NCCL INFO ",
    "NCCL ",
    " ",
    "\t",
    ":",
    "1",
    "a",
    "-",
    ".",
    "[",
    "]",
    "(",
    "(RayTrainWorker pid=1) ",
    "[repeated 2x across cluster]",
    "2024-01-01T00:00:00.000000001Z ",
    "rank 1 nranks 2 ",
    "nRanks 2 nNodes 1 ",
    "Using network ",
    "Loaded net plugin ",
    "set by environment to ",
    "# Rank 0 Group 0 Pid 1 on ",
    "\x1b[",
    "| ",
    "Bootstrap : Using ",
    "busId ",
    "commId 0x",
    "Selected provider is ",
    "NCCL_",
    "0x",
    "stdout F ",
    " P ",
)
# Tails that complete a match at the end of the line, so that a pattern which backtracks does so.
TAILS = (
    "",
    "GPU Direct RDMA Enabled for x",
    "comm 0x1 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE",
    "Coll 0 : 0 [send] via COLLNET/x/0",
    "Channel 00/0 : 0[0] -> 1[1] [send] via NET/Socket/0",
    "[repeated 2x across cluster]",
    "h:1:1 [0] NCCL INFO Using network Socket",
    ": Using [0]eth0:10.0.0.1<0>",
    "NCCL_IB_DISABLE set by environment to 1.",
    "x:1",
    "]:1 x",
)


def hostile_lines(line_chars: int = LINE_CHARS) -> Iterator[tuple[str, str]]:
    """(description, line): every token repeated to ``line_chars``, then every tail."""
    for token in TOKENS:
        body = token * (line_chars // len(token) + 1)
        for tail in TAILS:
            yield f"{token!r}*N + {tail!r}", body[: line_chars - len(tail)] + tail


def communicator_flood(host: str, communicators: int, ranks: int) -> Iterator[str]:
    """What a pod can print to fill an analyzer: many communicators of many ranks (init lines only)."""
    for c in range(communicators):
        for r in range(ranks):
            pid = 1000 + r % 64
            yield (
                f"{host}:{pid}:{pid} [0] NCCL INFO ncclCommInitRank comm 0x{c:x}{r:05x} rank {r} nranks {ranks} "
                f"cudaDev 0 nvmlDev {r % 8} busId {r:x}000 commId 0x{c + 1:016x} - Init COMPLETE"
            )

"""What launchers add to a log: the host a line came from, the launch it belongs to, the rank a
process runs as. Pure text functions; :mod:`reader` keeps what they find.

* pdsh (``pdsh -R ssh``, ``clush``, ``deepspeed`` over pdsh) prefix each line with ``host: ``. Such a
  word only names a host once the log shows it doing so: the same word before an NCCL record of
  that host (an srun ``--label`` ``3: `` or any other ``word: `` is not a host).
* Open MPI's ``--tag-output`` (horovod, ``mpirun``) prefixes ``[jobid,rank]<stdout>:``: lines with
  two job ids come from two launches.
* PyTorch Lightning prints ``Initializing distributed: GLOBAL_RANK: 8, MEMBER: 9/16`` in each
  process: a rank of the job, and the job's size.
"""

from __future__ import annotations

import re
from typing import NamedTuple

# After what may come before a launcher's word: indentation, markdown quotes, a timestamp.
_PDSH_HOST_RE = re.compile(
    r"[\s>]{0,16}"
    r"(?:\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?\s{1,4}(?:std(?:out|err) [FP] )?)?"
    r"(?P<host>[A-Za-z0-9][\w.-]{0,253}): (?=\S)"
)
_MPI_TAG_RE = re.compile(r"\[(?P<job>\d{1,9}),(?P<rank>\d{1,9})\]<std(?:out|err)>:")
_GLOBAL_RANK_RE = re.compile(r"GLOBAL_RANK: (?P<rank>\d{1,7}), MEMBER: (?P<member>\d{1,7})/(?P<world>\d{1,7})")
# A colour code whose ESC byte was lost in copying: "[0m", "[1;32m", "[m".
ANSI_REMNANT_RE = re.compile(r"\[[0-9;]{0,16}m")


class RankLine(NamedTuple):
    """A launcher's line naming one rank of the job and the job's size."""

    rank: int
    world: int


def line_host(head: str) -> str | None:
    """The ``host: `` word a launcher put at the start of a line, if any (not yet shown to be a host)."""
    m = _PDSH_HOST_RE.match(head)
    if m is None or m.group("host").isdigit():  # srun --label's task number
        return None
    return m.group("host")


def names_host(word: str, host: str) -> bool:
    """Whether the launcher's ``word`` is ``host`` as NCCL prints it (cut at the first dot)."""
    return word == host or word.split(".", 1)[0] == host or host.split(".", 1)[0] == word


def mpi_job(head: str) -> str | None:
    """Open MPI's job id from a ``[jobid,rank]<stdout>:`` tag in ``head``."""
    m = _MPI_TAG_RE.search(head)
    return m.group("job") if m else None


def rank_line(line: str) -> RankLine | None:
    """Lightning's ``GLOBAL_RANK: R, MEMBER: M/N`` (R + 1 == M, M <= N), or None."""
    m = _GLOBAL_RANK_RE.search(line)
    if m is None:
        return None
    rank, member, world = int(m.group("rank")), int(m.group("member")), int(m.group("world"))
    return RankLine(rank, world) if member == rank + 1 and member <= world else None


def blank_remnants(text: str) -> str:
    """``text`` with lost-ESC colour codes turned into spaces of the same length (offsets kept)."""
    return ANSI_REMNANT_RE.sub(lambda m: " " * len(m.group()), text)

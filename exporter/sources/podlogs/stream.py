"""One log stream being tailed: its plain files, its compressed rotations being read, and the
CRI message it has in pieces."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from exporter.sources.podlogs.compressed import Compressed
from exporter.sources.podlogs.cri import CriJoiner
from exporter.sources.podlogs.files import File
from exporter.sources.podlogs.layout import StreamKey


@dataclass
class Stream:
    """One stream being tailed: a container run's pod log, or one NCCL debug file."""

    key: StreamKey
    root: Path
    cri: bool
    joiner: CriJoiner[bytes]  # a CRI line in pieces, per stdout/stderr
    files: dict[tuple[int, int], File] = field(default_factory=dict)
    # Compressed rotations being read, oldest first; read before ``files``.
    compressed: list[Compressed] = field(default_factory=list)
    bootstrapped: bool = False
    resumed: bool = False  # restored from saved state: replay the head, then go on
    # .gz names of the stream already accounted for (history, or found and handled)
    gz_known: set[str] = field(default_factory=set)

    def ordered(self) -> list[File]:
        return sorted(self.files.values(), key=lambda f: (f.order, f.path.name))

    def waiting(self, now: float) -> int:
        """Bytes there is a reason to read now (1 for a stream not bootstrapped yet)."""
        if not self.bootstrapped:
            return max(1, sum(f.size for f in self.files.values()))
        return sum(c.left() for c in self.compressed) + sum(f.unread(now) for f in self.files.values())

    def unread(self) -> int:
        """Bytes not read yet, for the skipped counters when the stream is dropped."""
        return sum(c.left() for c in self.compressed) + sum(max(0, f.size - f.offset) for f in self.files.values())

"""One file of a stream: its identity (device, inode, checksum of its first bytes), how far it
is read, and reads that never follow a symlink."""

from __future__ import annotations

import os
import stat
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HEAD_BYTES = 256  # checksum of a file's first bytes: tells a replaced file from the one we read
# A rotated file not modified for this long gets no more bytes: a last line without its
# newline (a runtime killed mid-write) is taken as it is rather than waited for.
ROTATED_QUIET_SECONDS = 5.0
# A copytruncate copy is told by its first bytes: fewer than this could be a shared prefix.
MIN_COPY_HEAD_BYTES = 64
# Never follow a symlink in the last component; never block on a FIFO swapped in after lstat.
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


@dataclass
class File:
    """A plain file of a stream, followed by its identity whatever its name becomes."""

    path: Path
    dev: int
    ino: int
    order: str  # rotation timestamp; "~" (sorts last) for the live file
    offset: int = 0  # bytes done with (lines delivered, or dropped)
    size: int = 0
    head_len: int = 0
    head_crc: int = 0
    skipping: bool = False  # inside an over-long line: drop bytes until the next newline
    mtime: float = 0.0
    # Bytes read so far; [offset, read_to) is an unfinished line (no newline in it), so
    # nothing is read again until the file grows past read_to.
    read_to: int = 0

    @property
    def identity(self) -> tuple[int, int]:
        return self.dev, self.ino

    @property
    def rotated(self) -> bool:
        return self.order != "~"

    def unread(self, now: float) -> int:
        """Bytes there is a reason to read now: new ones, or the last line of a rotated file
        that has been quiet long enough to be taken without its newline."""
        start = max(self.offset, self.read_to)
        if self.size > start:
            return self.size - start
        if self.rotated and self.offset < self.size and now - self.mtime >= ROTATED_QUIET_SECONDS:
            return self.size - self.offset
        return 0

    def to_state(self, root: Path) -> dict[str, Any]:
        try:
            path = str(self.path.relative_to(root))
        except ValueError:  # the root was moved under us: the name is enough to find it again
            path = self.path.name
        return {
            "path": path,
            "dev": self.dev,
            "ino": self.ino,
            "offset": self.offset,
            "head_len": self.head_len,
            "head_crc": self.head_crc,
            "skipping": self.skipping,
        }

    def remember_head(self) -> None:
        """Take the checksum of the first bytes, once there are ``HEAD_BYTES`` of them (or
        as many as the file has, until it grows)."""
        if self.head_len >= HEAD_BYTES or self.size <= self.head_len:
            return
        length = min(HEAD_BYTES, self.size)
        crc = head_checksum(self.path, self.identity, length)
        if crc is not None:
            self.head_len, self.head_crc = length, crc


def _opened_where_expected(fd: int, path: Path) -> bool:
    """Whether ``fd`` was reached through ``path`` with no symlink on the way (the roots
    are resolved; a folder below one swapped for a symlink after it was listed is caught
    here). Without /proc the path is resolved by name instead."""
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        real = os.path.realpath(path)
    return real == str(path)


def read_at(path: Path, identity: tuple[int, int], offset: int, length: int) -> bytes | None:
    """``length`` bytes at ``offset`` of ``path`` if it is still the regular file
    ``identity``, reached without following a symlink; None otherwise."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != identity or not stat.S_ISREG(st.st_mode):
            return None
        if not _opened_where_expected(fd, path):
            return None
        return os.pread(fd, length, offset)
    except OSError:
        return None
    finally:
        os.close(fd)


def head_checksum(path: Path, identity: tuple[int, int], length: int) -> int | None:
    data = read_at(path, identity, 0, length)
    return zlib.crc32(data) if data is not None and len(data) == length else None


def regular_file(path: Path) -> os.stat_result | None:
    """``lstat`` of ``path`` if it is a regular file (a symlink is not)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None

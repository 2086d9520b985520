"""Rotations kubelet compressed (``<n>.log.<timestamp>.gz``): found again by the checksum of
their decompressed first bytes, and inflated in bounded steps."""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from exporter.sources.podlogs.files import File, read_at, regular_file
from exporter.sources.podlogs.layout import (
    SOURCE_POD_LOG,
    StreamKey,
    pod_log_compressed_generation,
    pod_log_generation,
)

GZ_READ_BYTES = 64 * 1024  # compressed bytes read from a .gz at a time
_GZIP_WBITS = 16 + zlib.MAX_WBITS  # zlib with gzip header and trailer


@dataclass(eq=False)
class Compressed(File):
    """A rotated file of a stream that kubelet compressed (``.gz``) while the exporter was
    down, known from saved state. ``offset`` counts decompressed bytes; the file is inflated
    from its start in bounded steps, the part before ``offset`` only replayed or dropped.
    ``size`` is the compressed size."""

    trailer_size: int | None = None  # the gzip trailer's content size (mod 2**32)
    position: int = 0  # decompressed bytes produced so far
    raw_offset: int = 0  # compressed bytes read so far
    pending: bytes = b""  # compressed bytes read, not inflated yet
    carry: bytes = b""  # decompressed bytes after ``offset``: an unfinished line
    ended: bool = False  # the last gzip member is inflated
    done: bool = False  # no longer read (ended, failed or dropped)
    fresh_member: bool = True  # no input given to ``inflater`` yet
    inflater: zlib._Decompress = field(default_factory=lambda: zlib.decompressobj(_GZIP_WBITS))

    def inflate(self, want: int) -> bytes:
        """Up to ``want`` more decompressed bytes: fewer at the end, or when about ``want``
        compressed bytes gave less (at most ``want + GZ_READ_BYTES`` are read per call).

        Raises ``zlib.error`` (corrupt), ``EOFError`` (truncated) or ``OSError`` (gone or
        replaced). Concatenated gzip members are read one after the other.
        """
        out: list[bytes] = []
        got = 0
        raw_left = want + GZ_READ_BYTES
        while got < want and not self.ended:
            if not self.pending:
                if raw_left <= 0:
                    break
                raw = read_at(self.path, self.identity, self.raw_offset, min(GZ_READ_BYTES, want + 1024, raw_left))
                if raw is None:
                    raise FileNotFoundError(f"{self.path} is gone or was replaced")
                if not raw:
                    if not self.fresh_member:
                        raise EOFError(f"{self.path} ends inside a gzip member")
                    self.ended = True
                    break
                self.raw_offset += len(raw)
                raw_left -= len(raw)
                self.pending = raw
            self.fresh_member = False
            piece = self.inflater.decompress(self.pending, want - got)
            if self.inflater.eof:
                self.pending = self.inflater.unused_data
                self.inflater = zlib.decompressobj(_GZIP_WBITS)
                self.fresh_member = True
            else:
                self.pending = self.inflater.unconsumed_tail
            if piece:
                out.append(piece)
                got += len(piece)
        self.position += got
        return b"".join(out)

    def left(self) -> int:
        """What is left unread: the unfinished line and the compressed bytes not inflated."""
        return len(self.carry) + len(self.pending) + max(0, self.size - self.raw_offset)


def gz_head(path: Path, identity: tuple[int, int], length: int) -> bytes | None:
    """The first ``length`` decompressed bytes of a .gz (fewer if it holds fewer); None
    when it cannot be read or is not gzip."""
    probe = Compressed(path, identity[0], identity[1], "")
    try:
        return probe.inflate(length)
    except (zlib.error, EOFError, OSError):
        return None


def gz_head_checksum(path: Path, identity: tuple[int, int], length: int) -> int | None:
    """Checksum of the first ``length`` decompressed bytes of a .gz (None if it has fewer)."""
    head = gz_head(path, identity, length)
    return zlib.crc32(head) if head is not None and len(head) == length else None


def gz_trailer_size(path: Path, identity: tuple[int, int], size: int) -> int | None:
    """The content size (mod 2**32) a gzip file's trailer states for its last member."""
    trailer = read_at(path, identity, size - 4, 4) if size >= 18 else None
    return int.from_bytes(trailer, "little") if trailer is not None and len(trailer) == 4 else None


def find_compressed(
    key: StreamKey, folder: Path, gz_names: list[str], saved_name: str, head_len: int, head_crc: int, claimed: set[str]
) -> Compressed | None:
    """The ``.gz`` that a pod-log file became, if its decompressed head matches.

    A rotated file must be ``<its name>.gz``; a saved ``.gz`` (read halfway before a
    restart) keeps its name; a live file may be any compressed rotation of its
    generation. Only the first ``head_len`` bytes are inflated to check.
    """
    if key.source != SOURCE_POD_LOG or not head_len:
        return None
    if saved_name.endswith(".gz"):
        saved = pod_log_compressed_generation(saved_name)
    else:
        saved = pod_log_generation(saved_name)
    if saved is None or saved[0] != key.name:
        return None
    if saved_name.endswith(".gz"):
        names = [saved_name]
    elif saved[1]:
        names = [saved_name + ".gz"]
    else:
        names = sorted(gz_names)
    for name in names:
        if name in claimed or name not in gz_names:
            continue
        path = folder / name
        st = regular_file(path)
        if st is None:
            continue
        identity = (st.st_dev, st.st_ino)
        if gz_head_checksum(path, identity, head_len) != head_crc:
            continue
        claimed.add(name)
        return open_compressed(path, st, head_len, head_crc)
    return None


def open_compressed(path: Path, st: os.stat_result, head_len: int, head_crc: int) -> Compressed:
    """A compressed rotation to read, known by the checksum of its first ``head_len`` bytes."""
    identity = (st.st_dev, st.st_ino)
    stamp = (pod_log_compressed_generation(path.name) or ("", ""))[1]
    return Compressed(
        path,
        st.st_dev,
        st.st_ino,
        stamp,
        size=st.st_size,
        head_len=head_len,
        head_crc=head_crc,
        trailer_size=gz_trailer_size(path, identity, st.st_size),
    )

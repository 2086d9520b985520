"""Following a stream's files as they change between two scans: renamed (rotated), copied
(copytruncate), truncated, replaced, deleted, or compressed by kubelet."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from exporter.sources.podlogs.compressed import find_compressed, gz_head, gz_trailer_size, open_compressed
from exporter.sources.podlogs.files import HEAD_BYTES, MIN_COPY_HEAD_BYTES, File, head_checksum, read_at, regular_file
from exporter.sources.podlogs.layout import SOURCE_DEBUG_FILE, pod_log_compressed_generation
from exporter.sources.podlogs.limits import TailBatch, TailLimits, TailStats
from exporter.sources.podlogs.scan import Candidate
from exporter.sources.podlogs.stream import Stream


class FileSync:
    """Brings a stream's files in line with what a scan found (``sync``).

    ``compressed_readers`` tells how many compressed rotations are being read node-wide, for
    ``TailLimits.max_compressed_readers``.
    """

    def __init__(self, limits: TailLimits, stats: TailStats, compressed_readers: Callable[[], int]) -> None:
        self.limits = limits
        self.stats = stats
        self._compressed_readers = compressed_readers

    def sync(self, stream: Stream, cands: list[Candidate], gz_names: list[str], batch: TailBatch) -> None:
        """Follow renames; notice new, copied, vanished, truncated and replaced files, and
        compressed rotations of the stream."""
        current = {(c.dev, c.ino): c for c in cands}
        before = {identity: replace(f) for identity, f in stream.files.items()}  # as followed until now
        gone = [stream.files.pop(i) for i in [i for i in stream.files if i not in current]]
        added = [identity for identity in current if identity not in stream.files]
        copies = self._add_files(stream, [current[i] for i in added], list(before.values()))
        reset: list[File] = []  # truncated or replaced: what they held may live on in a .gz
        for identity, cand in current.items():
            if identity in added:
                continue
            tracked = stream.files[identity]
            tracked.path, tracked.order, tracked.mtime = cand.path, cand.order, cand.mtime
            replaced = False
            if cand.size != tracked.size and tracked.head_len:
                replaced = head_checksum(cand.path, identity, tracked.head_len) != tracked.head_crc
            if cand.size < max(tracked.offset, tracked.read_to) or replaced:
                self.stats.event("replaced" if replaced and cand.size >= tracked.offset else "truncated")
                reset.append(before[identity])
                tracked.offset = tracked.read_to = 0
                tracked.skipping, tracked.head_len, tracked.head_crc = False, 0, 0
                if identity not in copies:
                    stream.joiner.partials.clear()  # else an unfinished message goes on in the copy
                    # A debug file is rewritten by a new process; a pod log (copytruncate) goes on.
                    if stream.key not in batch.restarted and stream.key.source == SOURCE_DEBUG_FILE:
                        batch.restarted.append(stream.key)
            elif identity in copies:
                # Copied, not truncated yet: the copy holds what the original has up to the
                # copy's size; the original goes on after it.
                copy = copies[identity]
                if copy.size > tracked.offset:
                    last = read_at(copy.path, copy.identity, copy.size - 1, 1)
                    tracked.offset = tracked.read_to = copy.size
                    tracked.skipping = last != b"\n"
            tracked.size = cand.size
        self._sync_compressed(stream, gone, reset, gz_names)

    def _add_files(self, stream: Stream, cands: list[Candidate], followed: list[File]) -> dict[tuple[int, int], File]:
        """Follow new files from byte 0, except a copy of a followed file (copytruncate),
        read on from where the original was; returns the copies by their original."""
        copies: dict[tuple[int, int], File] = {}
        originals = [f for f in followed if f.head_len >= MIN_COPY_HEAD_BYTES]
        for cand in cands:
            fresh = File(cand.path, cand.dev, cand.ino, cand.order, size=cand.size, mtime=cand.mtime)
            origin = self._copied_from(fresh, originals)
            if origin is not None:
                fresh.offset = fresh.read_to = min(origin.offset, fresh.size)
                fresh.skipping = origin.skipping and origin.offset <= fresh.size
                fresh.head_len, fresh.head_crc = origin.head_len, origin.head_crc
                copies[origin.identity] = fresh
            stream.files[fresh.identity] = fresh
        return copies

    def _sync_compressed(self, stream: Stream, gone: list[File], reset: list[File], gz_names: list[str]) -> None:
        """What a followed pod-log file held is read on from its ``.gz`` when the file is gone
        or its inode now holds another file (kubelet rotated, compressed and deleted it
        between two polls); a ``.gz`` of a rotation never seen plain is read whole. What
        cannot be read is counted as vanished."""
        claimed = {c.path.name for c in stream.compressed}
        for old in [*gone, *reset]:
            comp = None
            if self._compressed_readers() < self.limits.max_compressed_readers:
                comp = find_compressed(
                    stream.key, old.path.parent, gz_names, old.path.name, old.head_len, old.head_crc, claimed
                )
            if comp is not None:
                comp.offset, comp.skipping = old.offset, old.skipping
                stream.compressed.append(comp)
            elif old in gone:
                self.stats.skip("vanished", max(0, old.size - old.offset))
        folder = next(iter(stream.files.values())).path.parent if stream.files else None
        unseen = set(gz_names) - stream.gz_known - claimed
        for name in sorted(unseen, key=lambda n: (pod_log_compressed_generation(n) or ("", ""))[1]):
            if folder is not None:
                self._unseen_rotation(stream, folder / name)
        stream.gz_known = set(gz_names)
        stream.compressed.sort(key=lambda c: (c.order, c.path.name))

    def _unseen_rotation(self, stream: Stream, path: Path) -> None:
        """A ``.gz`` that appeared while running for a rotation never seen as a plain file
        (rotated and compressed between two polls): read whole, unless it is the compressed
        copy of a file still followed."""
        st = regular_file(path)
        if st is None:
            return
        identity = (st.st_dev, st.st_ino)
        head = gz_head(path, identity, HEAD_BYTES)
        if head is None:
            self.stats.event("gz_corrupt")
            self.stats.skip("gz_corrupt", st.st_size)
            return
        if any(read_at(f.path, f.identity, 0, len(head)) == head for f in stream.files.values()):
            return
        if self._compressed_readers() >= self.limits.max_compressed_readers:
            self.stats.skip("vanished", gz_trailer_size(path, identity, st.st_size) or st.st_size)
            return
        stream.compressed.append(open_compressed(path, st, len(head), zlib.crc32(head)))

    @staticmethod
    def _copied_from(fresh: File, followed: list[File]) -> File | None:
        """The followed file whose first bytes ``fresh`` starts with (a copytruncate copy)."""
        for origin in followed:
            if (
                fresh.size >= origin.head_len
                and head_checksum(fresh.path, fresh.identity, origin.head_len) == origin.head_crc
            ):
                return origin
        return None

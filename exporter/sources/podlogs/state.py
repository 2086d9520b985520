"""Offsets saved across restarts (``<state>/podlogs-state.json``): written atomically, every
value type- and range-checked when read back, a bad entry dropped rather than trusted."""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from exporter.atomic_write import write_atomically
from exporter.sources.podlogs.compressed import find_compressed
from exporter.sources.podlogs.cri import STREAMS, Partial
from exporter.sources.podlogs.files import HEAD_BYTES, File, head_checksum
from exporter.sources.podlogs.layout import StreamKey
from exporter.sources.podlogs.limits import StreamNote, TailLimits, TailSelection, TailStats
from exporter.sources.podlogs.scan import Candidate
from exporter.sources.podlogs.stream import Stream

log = logging.getLogger(__name__)

STATE_FILE_NAME = TailSelection().state_file_name
STATE_VERSION = 1
_MAX_OFFSET = 1 << 62  # a saved offset beyond this is not a file offset
_CRC_LIMIT = 1 << 32


@dataclass(frozen=True)
class SavedFile:
    """One file entry of the state file, checked."""

    name: str
    identity: tuple[int, int]
    offset: int
    head_len: int
    head_crc: int
    skipping: bool

    @classmethod
    def parse(cls, entry: object) -> SavedFile | None:
        """None unless every field has its type and range (a hand-edited or damaged state
        file must not blind a stream: a negative offset, a string, a float, Infinity)."""
        if not isinstance(entry, dict):
            return None
        path, skipping = entry.get("path", ""), entry.get("skipping", False)
        numbers = [entry.get(name) for name in ("dev", "ino", "offset", "head_len", "head_crc")]
        if not isinstance(path, str) or not isinstance(skipping, bool) or any(type(n) is not int for n in numbers):
            return None
        dev, ino, offset, head_len, head_crc = cast("list[int]", numbers)  # each checked to be an int above
        if min(dev, ino) < 0 or not 0 <= offset <= _MAX_OFFSET or not 0 <= head_len <= HEAD_BYTES:
            return None
        if not 0 <= head_crc < _CRC_LIMIT:
            return None
        return cls(Path(path).name, (dev, ino), offset, head_len, head_crc, skipping)


def saved_partials(raw: object, max_line: int) -> dict[str, Partial[bytes]] | None:
    """Unfinished CRI messages of the state file, checked; None when malformed."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        return None
    partials: dict[str, Partial[bytes]] = {}
    for name, value in raw.items():
        if name not in STREAMS or not isinstance(value, dict):
            return None
        data, cut = value.get("data"), value.get("cut", False)
        if not isinstance(data, str) or not isinstance(cut, bool):
            return None
        try:
            decoded = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            return None
        kept = decoded[:max_line]
        partials[name] = Partial([kept], len(kept), cut)
    return partials


class TailState:
    """The state file of one tailer: ``load`` at start, ``save`` now and then, ``restore`` a
    stream from what was loaded."""

    def __init__(
        self, state_dir: Path | None, limits: TailLimits, stats: TailStats, file_name: str = STATE_FILE_NAME
    ) -> None:
        self.path = state_dir / file_name if state_dir is not None else None
        self.limits = limits
        self.stats = stats
        self._save_failing = False

    def load(self) -> dict[str, dict[str, Any]]:
        """The saved entry of each stream, by ``StreamKey.text()`` (empty when there is none
        or it cannot be read)."""
        path = self.path
        if path is None:
            return {}
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, RecursionError) as exc:  # RecursionError: deeply nested JSON
            log.warning("ignoring unreadable tail state %s: %s", path, exc)
            self.stats.state_errors += 1
            return {}
        if not isinstance(raw, dict) or raw.get("version") != STATE_VERSION or not isinstance(raw.get("streams"), dict):
            log.warning("ignoring tail state %s of an unknown version", path)
            self.stats.state_errors += 1
            return {}
        return {k: v for k, v in raw["streams"].items() if isinstance(v, dict)}

    def save(self, streams: Mapping[StreamKey, Stream], notes: Mapping[StreamKey, StreamNote] | None = None) -> bool:
        """Write offsets, partial messages and ``notes`` atomically; False if it failed."""
        path = self.path
        if path is None:
            return False
        entries: dict[str, dict[str, Any]] = {}
        for key, stream in streams.items():
            root = stream.root
            entries[key.text()] = {
                "files": [f.to_state(root) for f in [*stream.compressed, *stream.ordered()]],
                "partials": {
                    name: {"data": base64.b64encode(p.joined()).decode(), "cut": p.cut}
                    for name, p in stream.joiner.partials.items()
                    if p.size or p.cut
                },
                "note": (notes or {}).get(key),
            }
        body = json.dumps({"version": STATE_VERSION, "streams": entries}, sort_keys=True)
        try:
            write_atomically(path, body.encode(), mode=0o644, prefix=f".{path.name}.", suffix=".tmp")
        except OSError as exc:
            self.stats.state_errors += 1
            if not self._save_failing:  # say it once, not every few seconds
                log.warning(
                    "could not save tail state to %s (a restart will re-read from the start caps): %s", path, exc
                )
            self._save_failing = True
            return False
        if self._save_failing:
            log.info("tail state saved to %s again", path)
        self._save_failing = False
        self.stats.state_saves += 1
        return True

    def restore(self, stream: Stream, saved: dict[str, Any], cands: list[Candidate], gz_names: list[str]) -> None:
        """Resume the files of ``stream`` at their saved offsets, and its unfinished message."""
        by_identity = {(c.dev, c.ino): c for c in cands}
        folder = cands[0].path.parent
        claimed: set[str] = set()
        entries = saved.get("files", [])
        if not isinstance(entries, list):
            self.stats.event("state_invalid")
            entries = []
        for entry in entries:
            saved_file = SavedFile.parse(entry)
            if saved_file is None:
                self.stats.event("state_invalid")  # that file is then read as a new one
                continue
            identity = saved_file.identity
            cand = by_identity.get(identity)
            if cand is None or (
                saved_file.head_len and head_checksum(cand.path, identity, saved_file.head_len) != saved_file.head_crc
            ):
                # Rotated away and compressed, or deleted, while we were down (its inode may
                # hold another file now).
                comp = find_compressed(
                    stream.key, folder, gz_names, saved_file.name, saved_file.head_len, saved_file.head_crc, claimed
                )
                if comp is not None:
                    comp.offset, comp.skipping = saved_file.offset, saved_file.skipping
                    stream.compressed.append(comp)
                continue
            tracked = File(
                cand.path,
                cand.dev,
                cand.ino,
                cand.order,
                offset=min(saved_file.offset, cand.size),
                size=cand.size,
                head_len=saved_file.head_len,
                head_crc=saved_file.head_crc,
                skipping=saved_file.skipping,
                mtime=cand.mtime,
            )
            if saved_file.offset > cand.size:
                self.stats.event("truncated")
                tracked.offset, tracked.skipping = 0, False
            tracked.read_to = tracked.offset
            stream.files[identity] = tracked
        stream.compressed.sort(key=lambda c: (c.order, c.path.name))
        stream.gz_known |= claimed
        partials = saved_partials(saved.get("partials"), self.limits.max_line_bytes)
        if partials is None:
            self.stats.event("state_invalid")
        else:
            stream.joiner.partials = partials

"""CRI container-log lines (``<RFC3339Nano> stdout|stderr F|P <message>``), partials joined.

Kubelet writes one record per line; a message longer than the runtime's buffer is split
into ``P`` (partial) records closed by an ``F`` (full) record. Pure: the caller reads files.
"""

from __future__ import annotations

import re

CRI_RE = re.compile(r"^(?P<time>\d{4}-\d{2}-\d{2}T\S+) (?P<stream>stdout|stderr) (?P<tag>[FP])(?::\S*)? ?(?P<msg>.*)$",
                    re.DOTALL)


class CriJoiner:
    """Turns CRI records back into the lines the container printed.

    ``feed`` returns the completed line, or None while a partial is pending. Lines that are not
    CRI records are returned unchanged, so plain logs pass through. A partial longer than
    ``max_chars`` is cut there (the rest of that line is dropped, ``truncated`` counts it).
    """

    def __init__(self, max_chars: int = 65536) -> None:
        self.max_chars = max_chars
        self.truncated = 0  # lines cut at max_chars
        self._partial: dict[str, list[str]] = {}
        self._partial_len: dict[str, int] = {}
        self._cut: set[str] = set()

    def _append(self, stream: str, msg: str) -> None:
        parts = self._partial.setdefault(stream, [])
        used = self._partial_len.get(stream, 0)
        room = self.max_chars - used
        if len(msg) > room:
            self._cut.add(stream)
            msg = msg[:max(room, 0)]
        parts.append(msg)
        self._partial_len[stream] = used + len(msg)

    def _take(self, stream: str) -> str:
        line = "".join(self._partial.pop(stream, ()))
        self._partial_len.pop(stream, None)
        if stream in self._cut:
            self._cut.discard(stream)
            self.truncated += 1
        return line

    def feed(self, line: str) -> str | None:
        line = line.rstrip("\r\n")
        m = CRI_RE.match(line)
        if m is None:
            return line
        stream, msg = m.group("stream"), m.group("msg")
        self._append(stream, msg)
        if m.group("tag") == "P":
            return None
        return self._take(stream)

    def flush(self) -> list[str]:
        """Partials still open at the end of the input, as lines."""
        return [self._take(stream) for stream in list(self._partial)]

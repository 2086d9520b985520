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
        self.truncated = 0
        self._partial: dict[str, list[str]] = {}
        self._partial_len: dict[str, int] = {}

    def feed(self, line: str) -> str | None:
        line = line.rstrip("\r\n")
        m = CRI_RE.match(line)
        if m is None:
            return line
        stream, msg = m.group("stream"), m.group("msg")
        parts = self._partial.get(stream)
        if m.group("tag") == "P":
            if parts is None:
                parts = self._partial[stream] = []
                self._partial_len[stream] = 0
            room = self.max_chars - self._partial_len[stream]
            if room > 0:
                parts.append(msg[:room])
                self._partial_len[stream] += min(len(msg), room)
                if len(msg) > room:
                    self.truncated += 1
            return None
        if parts is None:
            return msg
        del self._partial[stream]
        del self._partial_len[stream]
        parts.append(msg)
        return "".join(parts)

    def flush(self) -> list[str]:
        """Partials still open at the end of the input, as lines."""
        lines = ["".join(parts) for parts in self._partial.values()]
        self._partial.clear()
        self._partial_len.clear()
        return lines

"""CRI container-log records: the one reader of the format, for the pod-log tailer (bytes) and
``ccl-exporter analyze`` (text).

The container runtime writes one record per line::

    <RFC3339Nano timestamp> stdout|stderr <tag> <message>

The tag is ``F`` (the record ends a line the container printed) or ``P`` (a piece of a longer
line, cut at the runtime's buffer size; the pieces of a stream end at its next ``F`` record,
and stdout and stderr pieces may interleave), optionally followed by more ``:``-separated tags
(``F:x``), which are ignored. A space separates the tag from the message; a tag at the end of
the line is an empty message.

What both readers decide alike:

* ``\\r`` before the newline belongs to the line end (a log copied through a CRLF conversion),
  in a record and in a piece alike.
* A line that is not a record (no timestamp, a stream other than stdout or stderr, a tag other
  than ``F`` or ``P``, no space after the tag) is not taken apart. ``analyze`` passes it on as
  text (a plain log); the tailer reads kubelet's files, where every line is a record, so it
  counts such a line (``malformed_cri``) and passes it on whole.
* A joined line is capped at ``max_chars`` (characters of text, bytes of bytes); the rest of
  it is dropped and counted.

Every pattern here is linear in the length of the line. Pure: the caller reads the files.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, AnyStr, Generic

# A record's framing, up to its message: the message starts where the match ends. One pattern,
# compiled for text and for bytes; it matches at the start of a line only (``^`` with MULTILINE:
# a match from a position inside a block of lines works too), so no search is quadratic.
_RECORD = r"(?m)^\d{4}-\d{2}-\d{2}T\S+ (?P<stream>stdout|stderr) (?:(?P<partial>P)|F)(?::\S*)?(?: |\Z)"
CRI_RE = re.compile(_RECORD)
CRI_RE_BYTES = re.compile(_RECORD.encode())
# Where a P record with a message may be: " P" then ":" or a space (a P record without a message
# adds nothing to its line). A block with no hit holds whole lines only; a hit in a message
# only costs the record-by-record path.
PARTIAL_TAG_SEARCH = re.compile(rb" P[ :]")
STREAMS = ("stdout", "stderr")
_STREAM_NAMES = {"stdout": "stdout", "stderr": "stderr", b"stdout": "stdout", b"stderr": "stderr"}
# By the type of the line (str or bytes): one lookup instead of an isinstance test per line.
_LINE_ENDS: dict[type, Any] = {str: "\r\n", bytes: b"\r\n"}
_MATCH: dict[type, Callable[[Any], re.Match[Any] | None]] = {str: CRI_RE.match, bytes: CRI_RE_BYTES.match}
# Pieces of a line kept as they came before they are joined into one: many tiny pieces cost
# little more memory than their text.
_MAX_PIECES = 32

# (line, dropped, cut): what one record gives: the complete line once its F record comes (None
# after a P record); what the cap dropped of this record's message; whether the line lost text.
# A plain tuple: the tailer makes one per record.
Joined = tuple[AnyStr | None, int, bool]


class Partial(Generic[AnyStr]):
    """The pieces of one stream's line so far, within the cap (never empty: at least one piece)."""

    __slots__ = ("pieces", "size", "cut")

    def __init__(self, pieces: list[AnyStr], size: int, cut: bool) -> None:
        self.pieces: list[AnyStr] = pieces
        self.size = size
        self.cut = cut  # text beyond the cap was dropped

    def joined(self, last: AnyStr | None = None) -> AnyStr:
        if last is None:
            return self.pieces[0][:0].join(self.pieces)
        if len(self.pieces) == 1:  # the common case: a line in two pieces
            return self.pieces[0] + last
        return last[:0].join(self.pieces + [last])

    def add(self, piece: AnyStr, cut: bool) -> None:
        if cut:
            self.cut = True
        if piece:
            self.pieces.append(piece)
            self.size += len(piece)
            if len(self.pieces) > _MAX_PIECES:
                self.pieces = [self.joined()]


class CriJoiner(Generic[AnyStr]):
    """Turns CRI records back into the lines the container printed; one joiner per log.

    ``feed`` takes a line of the log and gives back the container's line; ``read`` does the same
    for a caller that counts (it tells a line that is not a record, and what the cap cut).
    ``flush`` gives the lines still in pieces at the end of the input. ``truncated`` counts the
    lines cut at ``max_chars``.
    """

    def __init__(self, max_chars: int = 65536) -> None:
        self.max_chars = max_chars
        self.truncated = 0
        self.partials: dict[str, Partial[AnyStr]] = {}  # by stream

    @property
    def pending(self) -> bool:
        """Whether a line is in pieces (or was cut and has not ended yet)."""
        return any(p.size or p.cut for p in self.partials.values())

    def feed(self, line: AnyStr) -> AnyStr | None:
        """One line of the log (with or without its line end): the container's line, or None
        while it is in pieces; a line that is not a record comes back without its line end."""
        line = line.rstrip(_LINE_ENDS[type(line)])
        joined = self.read(line)
        return line if joined is None else joined[0]

    def read(self, line: AnyStr) -> Joined[AnyStr] | None:
        """One line of the log, its line end taken off: None when it is not a record, else what
        its record gives (see ``Joined``)."""
        found = _MATCH[type(line)](line)
        if found is None:
            return None
        stream_name, partial_tag = found.groups()
        stream = _STREAM_NAMES[stream_name]
        message = line[found.end() :]
        pieces = self.partials.get(stream)
        room = self.max_chars if pieces is None else self.max_chars - pieces.size
        dropped = len(message) - room
        if dropped > 0:
            message = message[:room]
        else:
            dropped = 0
        if partial_tag is not None:
            if pieces is None:
                self.partials[stream] = Partial([message], len(message), dropped > 0)
            else:
                pieces.add(message, dropped > 0)
            return None, dropped, False
        if pieces is None:  # a whole line, the common case
            whole, cut = message, dropped > 0
        else:
            del self.partials[stream]
            whole, cut = pieces.joined(message), pieces.cut or dropped > 0
        if cut:
            self.truncated += 1
        return whole, dropped, cut

    def flush(self) -> list[AnyStr]:
        """Lines still in pieces at the end of the input, as they are."""
        lines = []
        for partial in self.partials.values():
            if partial.cut:
                self.truncated += 1
            lines.append(partial.joined())
        self.partials.clear()
        return lines

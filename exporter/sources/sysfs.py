"""Bounded, failure-tolerant reads of sysfs attribute files.

Like prometheus/procfs ``SysReadFile``: one ``read()`` of at most 4 KiB (some drivers return
EAGAIN forever to a read loop), trailing whitespace stripped. Errors that mean "this value
is not available here" (ENOENT, EACCES, EINVAL, EOPNOTSUPP, EIO, EAGAIN, EISDIR, ...) become
``None``; the caller skips that one value, never the device.
"""

from __future__ import annotations

import os
from collections.abc import Callable

MAX_ATTRIBUTE_BYTES = 4096

# A reader takes a path and returns the attribute's text or None.
AttributeReader = Callable[["str | os.PathLike[str]"], "str | None"]
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def read_attribute(path: str | os.PathLike[str]) -> str | None:
    """The stripped text of one sysfs attribute, or None when it cannot be read."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError:
        return None
    try:
        data = os.read(fd, MAX_ATTRIBUTE_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data.decode("utf-8", errors="replace").strip()


def parse_uint(text: str | None) -> int | None:
    """A non-negative decimal integer (a counter), or None for 'N/A (no PMA)' and the like."""
    if text is None:
        return None
    text = text.strip()
    if not text.isdigit() or not text.isascii():
        return None
    value = int(text)
    return value if value < 2**64 else None


def list_dir(path: str | os.PathLike[str]) -> list[str]:
    """Sorted entry names of a directory, or [] when it is missing or unreadable."""
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []

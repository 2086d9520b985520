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
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
MAX_COUNTER = 2**64


def _read_bytes(path: str | os.PathLike[str], folder_fd: int | None = None) -> bytes | None:
    """One read of at most ``MAX_ATTRIBUTE_BYTES`` of ``path`` (relative to ``folder_fd`` when
    given), or None when it cannot be opened or read."""
    try:
        fd = os.open(path, _OPEN_FLAGS, dir_fd=folder_fd)
    except OSError:
        return None
    try:
        return os.read(fd, MAX_ATTRIBUTE_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_attribute(path: str | os.PathLike[str]) -> str | None:
    """The stripped text of one sysfs attribute, or None when it cannot be read."""
    data = _read_bytes(path)
    return None if data is None else data.decode("utf-8", errors="replace").strip()


def parse_uint(text: str | bytes | None) -> int | None:
    """A non-negative decimal integer (a counter), or None for 'N/A (no PMA)' and the like."""
    if text is None:
        return None
    text = text.strip()
    if not text.isdigit() or not text.isascii():
        return None
    value = int(text)
    return value if value < MAX_COUNTER else None


def read_counters(folder: str) -> dict[str, int]:
    """Every file of ``folder`` that holds a non-negative integer (a counter folder such as an RDMA
    port's ``counters/``), by file name in name order; files that cannot be read or hold anything
    else ('N/A (no PMA)') are skipped, and a missing or unreadable folder gives {}.

    The same read and parse as ``read_attribute`` and ``parse_uint``, but each file is opened
    relative to the open folder and parsed from its bytes: a scrape reads ~60 such files per port,
    and this is the cheapest way there.
    """
    try:
        folder_fd = os.open(folder, _FOLDER_FLAGS)
    except OSError:
        return {}
    values: dict[str, int] = {}
    try:
        for name in sorted(os.listdir(folder_fd)):
            value = parse_uint(_read_bytes(name, folder_fd))
            if value is not None:
                values[name] = value
    except OSError:
        return values
    finally:
        os.close(folder_fd)
    return values


def list_dir(path: str | os.PathLike[str]) -> list[str]:
    """Sorted entry names of a directory, or [] when it is missing or unreadable."""
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []

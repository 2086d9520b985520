"""Bounded, failure-tolerant reads of sysfs attribute files.

Like prometheus/procfs ``SysReadFile``: one ``read()`` of at most 4 KiB (some drivers return
EAGAIN forever to a read loop), trailing whitespace stripped. Errors that mean "this value
is not available here" (ENOENT, EACCES, EINVAL, EOPNOTSUPP, EIO, EAGAIN, EISDIR, ...) become
``None``; the caller skips that one value, never the device.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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


def attribute_text(data: bytes | None) -> str | None:
    """An attribute's bytes as ``read_attribute`` gives them: decoded, whitespace stripped."""
    return None if data is None else data.decode("utf-8", errors="replace").strip()


def read_attribute(path: str | os.PathLike[str]) -> str | None:
    """The stripped text of one sysfs attribute, or None when it cannot be read."""
    return attribute_text(_read_bytes(path))


def parse_uint(text: str | bytes | None) -> int | None:
    """A non-negative decimal integer (a counter), or None for 'N/A (no PMA)' and the like."""
    if text is None:
        return None
    text = text.strip()
    if not text.isdigit() or not text.isascii():
        return None
    value = int(text)
    return value if value < MAX_COUNTER else None


def _counter_values(data: dict[str, bytes]) -> dict[str, int]:
    values = {}
    for name, text in data.items():
        value = parse_uint(text)
        if value is not None:
            values[name] = value
    return values


def read_counters(folder: str) -> dict[str, int]:
    """Every file of ``folder`` that holds a non-negative integer (a counter folder such as an RDMA
    port's ``counters/``), by file name in name order; files that cannot be read or hold anything
    else ('N/A (no PMA)') are skipped, and a missing or unreadable folder gives {}.

    The same read and parse as ``read_attribute`` and ``parse_uint``, but each file is opened
    relative to the open folder and parsed from its bytes: a scrape reads ~60 such files per port,
    and this is the cheapest way there.
    """
    return _counter_values(_read_folder(folder, None))


def _read_folder(folder: str, names: Sequence[str] | None) -> dict[str, bytes]:
    """The bytes of each file ``names`` lists in ``folder`` (every entry, in name order, when
    None), each opened relative to the open folder; files that cannot be read are left out."""
    try:
        folder_fd = os.open(folder, _FOLDER_FLAGS)
    except OSError:
        return {}
    try:
        return _read_names(folder_fd, sorted(os.listdir(folder_fd)) if names is None else names)
    except OSError:
        return {}
    finally:
        os.close(folder_fd)


def _read_names(folder_fd: int, names: Sequence[str]) -> dict[str, bytes]:
    """The bytes of each of ``names`` in the open folder, opened and closed one at a time."""
    data: dict[str, bytes] = {}
    for name in names:
        content = _read_bytes(name, folder_fd)
        if content is not None:
            data[name] = content
    return data


# At most this many files held open at once, and at most a quarter of the process's soft
# RLIMIT_NOFILE: the log tailer and client connections need descriptors too.
MAX_HELD_FILES = 2048
# A folder whose mtime is this close to now is read afresh, not held: file system timestamps
# are coarse (a clock tick), so a second change within the same tick would leave the mtime as it
# was and the held files unnoticed. git's index treats "racily clean" entries the same way.
RACY_SECONDS = 2.0


@dataclass
class _HeldFolder:
    identity: tuple[int, int, int]  # st_dev, st_ino, st_mtime_ns of the folder when opened
    names: tuple[str, ...] | None  # what the caller asked for; None: every entry
    files: list[tuple[str, int]]  # (name, open descriptor), in read order


class HeldFolders:
    """sysfs folders whose files stay open between reads, each read again with one ``pread`` at
    offset 0 instead of an open, a read and a close.

    sysfs runs an attribute's ``show()`` again on every read from offset 0 (its seq_file resets
    there), so a held file gives the current value each time. What would make a held file wrong
    is caught by one ``stat`` of its folder per read:
    - a folder re-created (a device that went away and came back) has another inode;
    - a file added, removed or replaced by a rename (how writers that must never be read
      half-written work) moves the folder's mtime; on sysfs a kernel object's files are fixed
      for its lifetime, so there the inode is the check that matters.
    Such a folder, and one changed too recently to trust its mtime (``RACY_SECONDS``), is read
    afresh and opened again. A held file that fails to read skips that value, as a fresh read
    would. A folder with a file that cannot be opened, and any beyond ``max_files`` held, are
    read afresh each time.

    Not thread-safe: its owner serializes reads (the RDMA collector reads under its lock).
    ``close_unread`` closes what was not read since its last call, so a folder that went away
    does not hold its files.
    """

    def __init__(self, max_files: int | None = None, clock: Callable[[], float] = time.time) -> None:
        self.max_files = _held_files_budget() if max_files is None else max_files
        self._clock = clock
        self._folders: dict[str, _HeldFolder] = {}
        self._read: set[str] = set()
        self.held_files = 0

    def read(self, folder: str, names: Sequence[str] | None = None) -> dict[str, bytes]:
        """What ``_read_folder`` gives, from held files where the folder is unchanged."""
        self._read.add(folder)
        key = tuple(names) if names is not None else None
        try:
            stat = os.stat(folder)
        except OSError:
            self._drop(folder)
            return {}
        identity = (stat.st_dev, stat.st_ino, stat.st_mtime_ns)
        held = self._folders.get(folder)
        if held is not None and held.identity == identity and held.names == key:
            return _pread_all(held.files)
        self._drop(folder)
        if self._clock() - stat.st_mtime_ns / 1e9 < RACY_SECONDS:
            return _read_folder(folder, names)
        return self._read_and_hold(folder, identity, key)

    def counters(self, folder: str) -> dict[str, int]:
        """``read_counters`` from held files."""
        return _counter_values(self.read(folder))

    def close_unread(self) -> None:
        """Close the folders not read since the last call."""
        for folder in [f for f in self._folders if f not in self._read]:
            self._drop(folder)
        self._read.clear()

    def close(self) -> None:
        for folder in list(self._folders):
            self._drop(folder)

    def _read_and_hold(
        self, folder: str, identity: tuple[int, int, int], names: tuple[str, ...] | None
    ) -> dict[str, bytes]:
        """Read ``folder`` afresh, in one pass, and hold its files when the folder is still the one
        ``stat`` saw, they fit the budget and every one of them opens."""
        try:
            folder_fd = os.open(folder, _FOLDER_FLAGS)
        except OSError:
            return {}
        files: list[tuple[str, int]] = []
        whole = True
        try:
            wanted = sorted(os.listdir(folder_fd)) if names is None else names
            if os.fstat(folder_fd).st_ino != identity[1] or self.held_files + len(wanted) > self.max_files:
                return _read_names(folder_fd, wanted)  # replaced since the stat, or over budget: hold nothing
            for name in wanted:
                try:
                    files.append((name, os.open(name, _OPEN_FLAGS, dir_fd=folder_fd)))
                except OSError:
                    whole = False  # skipped, as a fresh read would; it might open later, so nothing is held
        except OSError:
            whole = False
        finally:
            os.close(folder_fd)
        data = _pread_all(files)
        if whole:
            self._folders[folder] = _HeldFolder(identity, names, files)
            self.held_files += len(files)
        else:
            for _, fd in files:
                os.close(fd)
        return data

    def _drop(self, folder: str) -> None:
        held = self._folders.pop(folder, None)
        if held is not None:
            self.held_files -= len(held.files)
            for _, fd in held.files:
                os.close(fd)


def _pread_all(files: list[tuple[str, int]]) -> dict[str, bytes]:
    data: dict[str, bytes] = {}
    for name, fd in files:
        try:
            data[name] = os.pread(fd, MAX_ATTRIBUTE_BYTES, 0)
        except OSError:
            continue
    return data


def _held_files_budget() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return MAX_HELD_FILES if soft == resource.RLIM_INFINITY else max(0, min(MAX_HELD_FILES, soft // 4))


def list_dir(path: str | os.PathLike[str]) -> list[str]:
    """Sorted entry names of a directory, or [] when it is missing or unreadable."""
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []

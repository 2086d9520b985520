"""``ccl-exporter prepare-results``: make the node's probe-results folder writable by its writers.

Result files (``exporter.results.probe_file``) are written into a hostPath by pre-flight init containers
and probe Jobs, which run as the image's user (UID 65532) or whatever user their pod sets.
kubelet creates a ``DirectoryOrCreate`` hostPath as root with mode 0755, so none of them could
write there. The exporter's DaemonSet runs this command in an init container (UID 0, every
capability dropped, read-only root filesystem) with the folder's *parent* mounted read-write
there only. It

* creates the folder when it is missing (mode 0700 first, so it is never world-writable
  without the sticky bit);
* sets it to mode 1777: anyone may create a file in it, and the sticky bit keeps a writer from
  deleting or renaming a file that another user owns. Writers that share one UID (every pod
  running the image as 65532) are one owner to the kernel and can still replace each other's
  files: docs/logs.md#trust-model says what the exporter believes from them;
* never follows a symlink: the folder is looked at and opened relative to its parent
  (``O_NOFOLLOW``), and its mode is changed through that open descriptor, so a symlink planted
  at its path (or swapped in meanwhile) is refused rather than making its target
  world-writable. That is why the parent is mounted: a hostPath of the folder itself is already
  the symlink's target by the time any code runs in the container;
* refuses anything but a folder in its place, and a folder it may not change (another owner:
  without ``CAP_FOWNER`` only the owner may change a mode), unless it is already mode 1777;
* is idempotent: a folder already at mode 1777 is left exactly as it is.

Exit 0 with one line saying what it did, 1 with one line on stderr saying why it could not, 2 on
bad flags. With ``--warn-only`` (how the DaemonSet runs it) a folder it cannot prepare is one
``WARNING`` line on stderr and exit 0: the exporter must start anyway, because TCP-fallback
detection does not depend on result files; the line stays in ``kubectl logs -c
prepare-results``, and every pre-flight or probe that then cannot write says so in its own log.
"""

from __future__ import annotations

import argparse
import errno
import os
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from exporter.flags import PROBE_RESULTS

COMMAND = "prepare-results"
FOLDER_MODE = 0o1777  # rwx for all, sticky
_NEW_FOLDER_MODE = 0o700  # until the chmod through the open descriptor


class FolderNotPrepared(Exception):
    """The folder could not be made ready; the message is one line saying why and what to do."""


@dataclass(frozen=True)
class PreparedFolder:
    """What ``prepare_results_folder`` found and did."""

    path: Path
    created: bool
    previous_mode: int | None  # None when it was created here
    owner_uid: int

    @property
    def changed(self) -> bool:
        return self.created or self.previous_mode != FOLDER_MODE

    def describe(self) -> str:
        if self.created:
            done = f"created with mode {FOLDER_MODE:o}"
        elif self.previous_mode != FOLDER_MODE:
            done = f"mode {self.previous_mode:04o} changed to {FOLDER_MODE:o}"
        else:
            done = f"already mode {FOLDER_MODE:o}, left as it is"
        return f"{self.path} is ready: {done} (owner UID {self.owner_uid})"


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device file"
    return "not a folder"


def _refuse_symlink(name: str, parent_fd: int, folder: Path) -> FolderNotPrepared:
    try:
        target = os.readlink(name, dir_fd=parent_fd)
    except OSError:
        target = "?"
    return FolderNotPrepared(
        f"{folder} is a symlink (to {target}); refusing to follow it: remove it on the node "
        "(kubelet then creates the folder) and find out who planted it"
    )


def _open_folder(name: str, parent_fd: int, folder: Path) -> tuple[int, os.stat_result]:
    """The folder opened without following a symlink, and its status; FolderNotPrepared otherwise."""
    try:
        seen = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except OSError as exc:
        raise FolderNotPrepared(f"cannot look at {folder}: {exc.strerror}") from None
    if stat.S_ISLNK(seen.st_mode):
        raise _refuse_symlink(name, parent_fd, folder)
    if not stat.S_ISDIR(seen.st_mode):
        raise FolderNotPrepared(
            f"{folder} is {_kind(seen.st_mode)}, not a folder; refusing to touch it: remove it on the node "
            "(kubelet then creates the folder)"
        )
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise FolderNotPrepared(f"{folder} was replaced while being prepared (now no folder); refusing") from None
        raise FolderNotPrepared(
            f"cannot open {folder} (owner UID {seen.st_uid}, mode {stat.S_IMODE(seen.st_mode):04o}): {exc.strerror}; "
            f"set it to mode {FOLDER_MODE:o} on the node, or remove it (kubelet then creates the folder)"
        ) from None
    opened = os.fstat(fd)
    if (opened.st_dev, opened.st_ino) != (seen.st_dev, seen.st_ino):
        os.close(fd)
        raise FolderNotPrepared(f"{folder} was replaced while being prepared; refusing")
    return fd, opened


def _set_mode(fd: int, opened: os.stat_result, folder: Path) -> None:
    try:
        os.fchmod(fd, FOLDER_MODE)
    except OSError as exc:
        if exc.errno == errno.EPERM:
            why = (
                f"it belongs to UID {opened.st_uid}, and only its owner may change its mode "
                f"(this is UID {os.geteuid()} without capabilities)"
            )
        elif exc.errno == errno.EROFS:
            why = "it is on a read-only mount"
        else:
            why = exc.strerror or str(exc)
        raise FolderNotPrepared(
            f"cannot set {folder} (mode {stat.S_IMODE(opened.st_mode):04o}) to mode {FOLDER_MODE:o}: {why}; "
            f"chmod {FOLDER_MODE:o} it on the node, or remove it (kubelet then creates the folder)"
        ) from None


def prepare_results_folder(folder: Path) -> PreparedFolder:
    """Make ``folder`` a folder of mode 1777, never through a symlink; FolderNotPrepared says why not."""
    folder = Path(os.path.abspath(folder))
    name = folder.name
    if not name or folder.parent == folder:
        raise FolderNotPrepared(f"{folder} names no folder below another one")
    try:
        parent_fd = os.open(folder.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise FolderNotPrepared(f"cannot open {folder.parent}, the folder's parent: {exc.strerror}") from None
    try:
        created = True
        try:
            os.mkdir(name, _NEW_FOLDER_MODE, dir_fd=parent_fd)  # never follows a symlink named ``name``
        except FileExistsError:
            created = False
        except OSError as exc:
            raise FolderNotPrepared(f"cannot create {folder}: {exc.strerror}") from None
        fd, opened = _open_folder(name, parent_fd, folder)
        try:
            previous = stat.S_IMODE(opened.st_mode)
            if created or previous != FOLDER_MODE:
                _set_mode(fd, opened, folder)
        finally:
            os.close(fd)
    finally:
        os.close(parent_fd)
    return PreparedFolder(folder, created, None if created else previous, opened.st_uid)


def run_prepare_results(args: argparse.Namespace) -> int:
    try:
        prepared = prepare_results_folder(Path(args.probe_results))
    except FolderNotPrepared as exc:
        if args.warn_only:
            print(
                f"ccl-exporter {COMMAND}: WARNING: {exc} (pre-flight and probe results cannot be written on this "
                "node until it is fixed; the exporter starts anyway)",
                file=sys.stderr,
            )
            return 0
        print(f"ccl-exporter {COMMAND}: {exc}", file=sys.stderr)
        return 1
    print(f"ccl-exporter {COMMAND}: {prepared.describe()}")
    return 0


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], environ: Mapping[str, str]
) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        COMMAND,
        help="make the probe-results folder writable by pre-flights and probe Jobs (mode 1777; an init container)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    PROBE_RESULTS.add_to(
        parser, environ, help="the folder to prepare, below its parent as mounted (never a symlink, never followed)"
    )
    parser.add_argument(
        "--warn-only",
        action="store_true",
        help="a folder that cannot be prepared is a WARNING line and exit 0 (the DaemonSet's init container: "
        "the exporter must start whatever happens to result files)",
    )
    parser.set_defaults(handler=run_prepare_results)
    return parser

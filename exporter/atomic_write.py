"""Files that readers see whole or not at all: the one way the exporter and its commands write one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomically(
    path: Path, body: bytes, *, mode: int | None = None, prefix: str = ".tmp-", suffix: str = ""
) -> None:
    """Write ``body`` to ``path`` through a temporary file in the same folder (``prefix``,
    ``suffix``: how readers of the folder tell it from the real files), flushed to disk, given
    ``mode`` and renamed over ``path``: a reader sees the old file or the whole new one. The
    folder is made if missing; on any failure the temporary file is removed and the error raised."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=suffix)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(body)
            handle.flush()
            os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise

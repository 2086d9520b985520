"""Fixture folder trees kept as reviewable text (the idea of node_exporter's ttar).

Format: an entry starts with a header line; the lines up to the next header are the file's
content, written with a trailing newline as sysfs does.

    >>> class/infiniband/mlx5_0/fw_ver
    28.39.1002
    >>> class/infiniband/mlx5_0/device -> ../../../devices/pci0000:00/0000:00:02.0
    >>> class/infiniband/mlx5_0/ports/1/counters/
    (a header ending in "/" makes an empty folder)

Lines starting with ``#`` before the first header are comments. Names with colons and
symlinks survive, which plain checked-in trees do not on every OS.
"""

from __future__ import annotations

import os
from pathlib import Path

HEADER = ">>> "


def unpack(text: str, root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    current: Path | None = None
    body: list[str] = []

    def flush() -> None:
        if current is not None:
            current.parent.mkdir(parents=True, exist_ok=True)
            current.write_text("".join(line + "\n" for line in body))

    for line in text.splitlines():
        if line.startswith(HEADER):
            flush()
            current, body = None, []
            spec = line[len(HEADER) :]
            if " -> " in spec:
                name, target = spec.split(" -> ", 1)
                link = root / name
                link.parent.mkdir(parents=True, exist_ok=True)
                os.symlink(target, link)
            elif spec.endswith("/"):
                (root / spec).mkdir(parents=True, exist_ok=True)
            else:
                current = root / spec
        elif current is not None:
            body.append(line)
    flush()
    return root


def pack(root: Path) -> str:
    """The text form of a folder tree (for writing new fixtures from a real /sys copy)."""
    lines: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        base = Path(dirpath)
        for name in sorted(dirnames):
            path = base / name
            if path.is_symlink():
                lines.append(f"{HEADER}{path.relative_to(root)} -> {os.readlink(path)}")
        if not filenames and not dirnames and base != root:
            lines.append(f"{HEADER}{base.relative_to(root)}/")
        for name in sorted(filenames):
            path = base / name
            rel = path.relative_to(root)
            if path.is_symlink():
                lines.append(f"{HEADER}{rel} -> {os.readlink(path)}")
                continue
            lines.append(f"{HEADER}{rel}")
            lines.extend(path.read_text().rstrip("\n").split("\n"))
    return "\n".join(lines) + "\n"

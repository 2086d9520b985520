"""Which build of the exporter this is: version, source revision, Python version.

The revision is looked up once, when the exporter starts, never per scrape and never by
running a program. In order:

1. the environment variable ``CCL_EXPORTER_REVISION`` (the image sets it from its ``REVISION``
   build argument);
2. the file ``REVISION`` next to this module (written into the package when a wheel is built
   from a release tarball or by a packager);
3. the git checkout the package is imported from (``.git`` read as files: ``HEAD``, loose and
   packed refs, linked checkouts), as when running from a clone;
4. the commit the package was built from, as setuptools-scm wrote it into ``exporter/_version.py``
   (abbreviated: a wheel installed outside a checkout, ``pip install`` of a release);
5. ``"unknown"``.

The version is the package's (``exporter.__version__``, from the git tag at build time).

A value is accepted only when it looks like a revision (letters, digits, ``.``, ``_``, ``-``,
``+``; at most 64 characters), so a stray file never turns into a label value.
"""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from exporter import BUILT_COMMIT_ID, __version__

REVISION_ENV = "CCL_EXPORTER_REVISION"
REVISION_FILE = Path(__file__).resolve().parent / "REVISION"
UNKNOWN = "unknown"

_REVISION = re.compile(r"^[0-9A-Za-z][0-9A-Za-z._+-]{0,63}$")
_OBJECT_ID = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")
_ABBREVIATED_OBJECT_ID = re.compile(r"^[0-9a-f]{7,64}$")
# Files read here are a few bytes (HEAD, a ref, a "gitdir:" pointer); packed-refs is read line
# by line up to this many lines, so a huge or hostile checkout cannot stall the start.
_SMALL_FILE_BYTES = 4096
_PACKED_REFS_MAX_LINES = 100_000


@dataclass(frozen=True)
class BuildInfo:
    """The labels of ``ccl_exporter_build_info``."""

    version: str
    revision: str
    python_version: str


def read_build_info(
    environ: Mapping[str, str] | None = None,
    package_dir: Path | None = None,
    built_commit_id: str | None = BUILT_COMMIT_ID,
) -> BuildInfo:
    """This process's build. ``package_dir`` is where the ``exporter`` package lives, and
    ``built_commit_id`` what the build wrote into ``exporter/_version.py`` (tests)."""
    environ = os.environ if environ is None else environ
    package_dir = REVISION_FILE.parent if package_dir is None else package_dir
    revision = (
        _valid(environ.get(REVISION_ENV, ""))
        or _valid(_read_small(package_dir / REVISION_FILE.name))
        or _git_revision(package_dir.parent)
        or _built_commit(built_commit_id)
        or UNKNOWN
    )
    return BuildInfo(version=__version__, revision=revision, python_version=platform.python_version())


def _valid(text: str | None) -> str | None:
    text = (text or "").strip()
    return text if _REVISION.match(text) else None


def _built_commit(commit_id: str | None) -> str | None:
    """setuptools-scm's abbreviated commit, ``g`` and hex digits, as the hex digits."""
    text = (commit_id or "").strip()
    if text.startswith("g") and _ABBREVIATED_OBJECT_ID.match(text[1:]):
        return text[1:]
    return None


def _read_small(path: Path) -> str | None:
    try:
        with path.open("rb") as handle:
            return handle.read(_SMALL_FILE_BYTES).decode("utf-8", "replace")
    except OSError:
        return None


def _git_dir(checkout: Path) -> Path | None:
    """The git folder of ``checkout``: ``.git`` itself, or where a linked checkout's ``.git`` file points."""
    dot_git = checkout / ".git"
    if dot_git.is_dir():
        return dot_git
    pointer = _read_small(dot_git)
    if pointer and pointer.startswith("gitdir:"):
        target = Path(pointer[len("gitdir:") :].strip())
        return target if target.is_absolute() else checkout / target
    return None


def _git_revision(checkout: Path) -> str | None:
    """The commit ``HEAD`` names in ``checkout``, read from files; None when it is not a checkout."""
    git_dir = _git_dir(checkout)
    if git_dir is None:
        return None
    head = (_read_small(git_dir / "HEAD") or "").strip()
    if _OBJECT_ID.match(head):
        return head  # a detached HEAD
    if not head.startswith("ref: "):
        return None
    ref = head[len("ref: ") :].strip()
    if not ref.startswith("refs/") or ".." in ref:
        return None
    # A linked checkout keeps its own HEAD; branches live in the main repository (its "commondir").
    common = (_read_small(git_dir / "commondir") or "").strip()
    common_dir = (git_dir / common) if common else git_dir
    for folder in (git_dir, common_dir):
        loose = (_read_small(folder / ref) or "").strip()
        if _OBJECT_ID.match(loose):
            return loose
    return _packed_ref(common_dir / "packed-refs", ref)


def _packed_ref(path: Path, ref: str) -> str | None:
    try:
        with path.open(encoding="utf-8", errors="replace") as handle:
            for number, line in enumerate(handle):
                if number >= _PACKED_REFS_MAX_LINES:
                    return None
                object_id, _, name = line.strip().partition(" ")
                if name == ref and _OBJECT_ID.match(object_id):
                    return object_id
    except OSError:
        return None
    return None

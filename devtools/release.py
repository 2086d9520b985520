"""Cut a release: ``python -m devtools.release X.Y.Z`` (``make release RELEASE=X.Y.Z``).

The version of everything built from a commit comes from its git tag (setuptools-scm: the wheel,
``ccl_exporter_build_info{version}``, the image's tag and version label); the files that must
name a version before any build reads them are set here, in the commit the tag points at:

- ``CHANGELOG.md``: the entries under "Unreleased" move under ``## [X.Y.Z] - <date>``, a new empty
  "Unreleased" opens above it, and the links at the bottom follow;
- the Helm chart's ``appVersion`` (the default image tag) becomes ``X.Y.Z``, and its ``version`` is
  raised (patch) unless it was already raised since the previous release;
- the kustomize base's image ``newTag`` becomes ``X.Y.Z``, and every other reference to the
  latest release's image under ``manifests/`` follows: ``ccl-health-exporter:<latest>`` in the
  examples and the webhook overlay's pre-flight flag, ``newTag: <latest>`` (and ``-probe``) in the
  overlays' kustomizations.

Then one commit, "Release X.Y.Z", and an annotated tag ``vX.Y.Z`` on it. Nothing is pushed.
Between releases these files keep naming the latest release, whose image exists, while builds of
later commits are ``X.Y.(Z+1).devN`` (tests/house/test_release.py holds both). Refuses a dirty working
tree, a version not above the latest tag, an existing tag, and an empty "Unreleased".
"""

from __future__ import annotations

import argparse
import datetime
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHANGELOG = Path("CHANGELOG.md")
CHART = Path("manifests/helm/ccl-health-exporter/Chart.yaml")
KUSTOMIZATION = Path("manifests/base/kustomization.yaml")
# Manifests that name the image with its tag outside the kustomize images transformer (the Helm
# chart takes its tag from appVersion and is not among them).
IMAGE_REFERENCE_FILES = ("manifests/examples/*.yaml", "manifests/overlays/*/*.yaml")
IMAGE = "ccl-health-exporter"
RELEASE_VERSION = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$")
TAG_PREFIX = "v"
UNRELEASED = "## [Unreleased]"
_HEADING = re.compile(r"^## \[([^\]]+)\]", flags=re.M)
_LINK = re.compile(r"^\[([^\]]+)\]: (\S+)$", flags=re.M)
_APP_VERSION = re.compile(r"^appVersion: .*$", flags=re.M)
_CHART_VERSION = re.compile(r"^version: (\S+)$", flags=re.M)
_NEW_TAG = re.compile(r"^(\s+newTag: ).*$", flags=re.M)


class ReleaseError(Exception):
    """A release that cannot be cut as asked; the message says why and what to do."""


@dataclass(frozen=True)
class Release:
    version: str
    date: datetime.date
    previous: str | None  # the latest release tag's version, None before the first tag


def version_key(version: str) -> tuple[int, int, int]:
    match = RELEASE_VERSION.match(version)
    if not match:
        raise ReleaseError(f"{version!r} is not a release version X.Y.Z (no v prefix, no suffix)")
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


def latest_release(changelog: str) -> str | None:
    """The newest release heading of the changelog (the first after "Unreleased")."""
    headings = [heading for heading in _HEADING.findall(changelog) if heading != "Unreleased"]
    return headings[0] if headings else None


def cut_changelog(changelog: str, release: Release) -> str:
    """The changelog with "Unreleased" become ``release``, a new empty "Unreleased", links updated."""
    if UNRELEASED not in changelog:
        raise ReleaseError(f"CHANGELOG.md has no '{UNRELEASED}' heading")
    start = changelog.index(UNRELEASED) + len(UNRELEASED)
    following = _HEADING.search(changelog, start)
    entries = changelog[start : following.start() if following else len(changelog)]
    if not re.search(r"^- ", entries, flags=re.M):
        raise ReleaseError("CHANGELOG.md: nothing under Unreleased to release")
    if f"## [{release.version}]" in changelog:
        raise ReleaseError(f"CHANGELOG.md already has a heading for {release.version}")
    heading = f"## [{release.version}] - {release.date.isoformat()}"
    text = changelog.replace(UNRELEASED, f"{UNRELEASED}\n\n{heading}", 1)
    links = dict(_LINK.findall(text))
    unreleased_link = links.get("Unreleased")
    if unreleased_link is None or "/compare/" not in unreleased_link:
        raise ReleaseError("CHANGELOG.md has no '[Unreleased]: .../compare/vA.B.C...HEAD' link")
    base = unreleased_link.split("/compare/", 1)[0]
    tag = TAG_PREFIX + release.version
    release_link = (
        f"{base}/compare/{TAG_PREFIX}{release.previous}...{tag}" if release.previous else f"{base}/releases/tag/{tag}"
    )
    text = text.replace(
        f"[Unreleased]: {unreleased_link}",
        f"[Unreleased]: {base}/compare/{tag}...HEAD\n[{release.version}]: {release_link}",
        1,
    )
    return text


def set_app_version(chart: str, version: str, raise_chart_version: bool) -> str:
    """Chart.yaml with ``appVersion`` set, and ``version``'s patch raised when asked."""
    if not _APP_VERSION.search(chart) or not _CHART_VERSION.search(chart):
        raise ReleaseError(f"{CHART}: no 'version:' or 'appVersion:' line")
    text = _APP_VERSION.sub(f'appVersion: "{version}"', chart, count=1)
    if raise_chart_version:
        major, minor, patch = version_key(chart_version(text))
        text = _CHART_VERSION.sub(f"version: {major}.{minor}.{patch + 1}", text, count=1)
    return text


def chart_version(chart: str) -> str:
    match = _CHART_VERSION.search(chart)
    if not match:
        raise ReleaseError(f"{CHART}: no 'version:' line")
    return match.group(1)


def set_image_tag(kustomization: str, version: str) -> str:
    if len(_NEW_TAG.findall(kustomization)) != 1:
        raise ReleaseError(f"{KUSTOMIZATION}: expected one image with a 'newTag:'")
    return _NEW_TAG.sub(lambda match: f"{match.group(1)}{version}", kustomization, count=1)


_REFERENCE = re.compile(rf"(\b{IMAGE}:|^\s+newTag: )([0-9][0-9A-Za-z.+-]*)", flags=re.M)


def image_references(text: str) -> list[str]:
    """The tags of ``ccl-health-exporter:<tag>`` image references and of kustomize ``newTag:``
    lines (this project's images are the only ones its manifests retag) in ``text``, ``-probe``
    cut off."""
    return [match.group(2).removesuffix("-probe") for match in _REFERENCE.finditer(text)]


def set_image_references(text: str, old: str, new: str) -> str:
    """References to ``<old>`` (and ``<old>-probe``) become ``<new>`` (and ``<new>-probe``)."""

    def moved(match: re.Match[str]) -> str:
        tag = match.group(2)
        if tag not in (old, f"{old}-probe"):
            return match.group(0)
        return match.group(1) + new + tag.removeprefix(old)

    return _REFERENCE.sub(moved, text)


def _git(root: Path, *args: str, check: bool = True) -> str:
    result = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise ReleaseError(f"git {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout.strip() if result.returncode == 0 else ""


def latest_tag_version(root: Path) -> str | None:
    """The newest release tag reachable from HEAD, without its v; None when there is none."""
    tag = _git(root, "describe", "--tags", "--abbrev=0", "--match", f"{TAG_PREFIX}[0-9]*", check=False)
    return tag[len(TAG_PREFIX) :] if tag and RELEASE_VERSION.match(tag[len(TAG_PREFIX) :]) else None


def cut(root: Path, version: str, date: datetime.date) -> str:
    """Edit, commit and tag the release in the checkout at ``root``; the tag's name."""
    version_key(version)
    if _git(root, "status", "--porcelain", "--untracked-files=no"):
        raise ReleaseError("the working tree has uncommitted changes: commit or stash them first")
    tag = TAG_PREFIX + version
    if _git(root, "tag", "--list", tag):
        raise ReleaseError(f"tag {tag} exists already")
    previous = latest_tag_version(root)
    if previous is not None and version_key(version) <= version_key(previous):
        raise ReleaseError(f"{version} is not above the latest release tag {TAG_PREFIX}{previous}")
    release = Release(version=version, date=date, previous=previous)

    changelog = (root / CHANGELOG).read_text()
    latest = latest_release(changelog)
    chart_text = (root / CHART).read_text()
    chart_before = _git(root, "show", f"{TAG_PREFIX}{previous}:{CHART}", check=False) if previous else ""
    # Raised since the previous release already (a chart change did it): leave it as it is.
    raise_chart = not chart_before or chart_version(chart_before) == chart_version(chart_text)
    edits = {
        CHANGELOG: cut_changelog(changelog, release),
        CHART: set_app_version(chart_text, version, raise_chart),
        KUSTOMIZATION: set_image_tag((root / KUSTOMIZATION).read_text(), version),
    }
    for pattern in IMAGE_REFERENCE_FILES:
        for path in sorted(root.glob(pattern)):
            text = path.read_text()
            if latest and image_references(text):
                edits[path.relative_to(root)] = set_image_references(text, latest, version)
    for path, text in edits.items():
        (root / path).write_text(text)
    _git(root, "add", "--", *(str(path) for path in edits))
    _git(root, "commit", "--quiet", "-m", f"Release {version}")
    _git(root, "tag", "--annotate", tag, "-m", f"ccl-health-exporter {version}")
    return tag


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("version", help="X.Y.Z, without the v")
    parser.add_argument("--root", type=Path, default=REPO, help="the checkout (default: this one)")
    parser.add_argument(
        "--date", type=datetime.date.fromisoformat, default=None, help="YYYY-MM-DD (default: today, UTC)"
    )
    args = parser.parse_args(argv)
    date = args.date or datetime.datetime.now(datetime.timezone.utc).date()
    try:
        tag = cut(args.root, args.version, date)
    except ReleaseError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 1
    print(f"tagged {tag}; next: make image sbom, then push the tag and the images")
    return 0


if __name__ == "__main__":
    sys.exit(main())

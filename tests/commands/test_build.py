"""ccl_exporter_build_info: version, revision and Python version, the revision found once at start."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

import pytest

import exporter
from exporter.build import REVISION_ENV, UNKNOWN, BuildInfo, read_build_info
from exporter.collectors.umbrella import UmbrellaCollector
from tests.conftest import REPO

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"


def _package(tmp_path: Path) -> Path:
    """An ``exporter`` folder inside a would-be checkout at ``tmp_path``."""
    package = tmp_path / "exporter"
    package.mkdir(parents=True)
    return package


def _git(checkout: Path, head: str, refs: dict[str, str] | None = None, packed: str = "") -> Path:
    git = checkout / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text(head + "\n")
    for ref, commit in (refs or {}).items():
        (git / ref).parent.mkdir(parents=True, exist_ok=True)
        (git / ref).write_text(commit + "\n")
    if packed:
        (git / "packed-refs").write_text(packed)
    return git


def test_the_environment_wins_then_the_file_then_git(tmp_path: Path) -> None:
    package = _package(tmp_path)
    _git(tmp_path, "ref: refs/heads/main", {"refs/heads/main": COMMIT})
    assert read_build_info({}, package).revision == COMMIT
    (package / "REVISION").write_text("v0.1.0-3-gabcdef0\n")
    assert read_build_info({}, package).revision == "v0.1.0-3-gabcdef0"
    assert read_build_info({REVISION_ENV: OTHER}, package).revision == OTHER


def test_version_and_python_version() -> None:
    info = read_build_info({REVISION_ENV: COMMIT})
    assert info == BuildInfo(version=exporter.__version__, revision=COMMIT, python_version=platform.python_version())


def test_unknown_outside_a_checkout_and_without_a_revision(tmp_path: Path) -> None:
    assert read_build_info({}, _package(tmp_path), built_commit_id=None).revision == UNKNOWN


def test_an_installed_wheel_reports_the_commit_it_was_built_from(tmp_path: Path) -> None:
    """Outside a checkout, the abbreviated commit setuptools-scm wrote into exporter/_version.py;
    a checkout or the image's variable still wins (an editable install's file is as old as its
    install)."""
    package = _package(tmp_path)
    assert read_build_info({}, package, built_commit_id="g78180b2ee").revision == "78180b2ee"
    _git(tmp_path, "ref: refs/heads/main", {"refs/heads/main": COMMIT})
    assert read_build_info({}, package, built_commit_id="g78180b2ee").revision == COMMIT
    assert read_build_info({REVISION_ENV: OTHER}, package, built_commit_id="g78180b2ee").revision == OTHER


@pytest.mark.parametrize("bad", ["", "78180b2ee", "gXYZ", "g123", "g" + "a" * 65, "g78180b2ee;rm"])
def test_a_built_commit_that_is_no_commit_is_ignored(tmp_path: Path, bad: str) -> None:
    assert read_build_info({}, _package(tmp_path), built_commit_id=bad).revision == UNKNOWN


@pytest.mark.parametrize("bad", ["", "   ", "not a revision", "x" * 65, "$(reboot)", "a\nb", "-leading-dash"])
def test_a_value_that_is_no_revision_is_ignored(tmp_path: Path, bad: str) -> None:
    package = _package(tmp_path)
    (package / "REVISION").write_text(bad)
    assert read_build_info({REVISION_ENV: bad}, package, built_commit_id=None).revision == UNKNOWN


def test_detached_head(tmp_path: Path) -> None:
    package = _package(tmp_path)
    _git(tmp_path, COMMIT)
    assert read_build_info({}, package).revision == COMMIT


def test_packed_ref(tmp_path: Path) -> None:
    package = _package(tmp_path)
    _git(
        tmp_path,
        "ref: refs/heads/release",
        packed=f"# pack-refs with: peeled fully-peeled sorted\n{OTHER} refs/heads/main\n{COMMIT} refs/heads/release\n",
    )
    assert read_build_info({}, package).revision == COMMIT


def test_a_linked_checkout_reads_its_head_and_the_shared_refs(tmp_path: Path) -> None:
    git = _git(tmp_path / "main", "ref: refs/heads/main", {"refs/heads/main": OTHER, "refs/heads/feature": COMMIT})
    linked_git = git / "worktrees" / "feature"
    linked_git.mkdir(parents=True)
    (linked_git / "HEAD").write_text("ref: refs/heads/feature\n")
    (linked_git / "commondir").write_text("../..\n")
    checkout = tmp_path / "feature"
    package = _package(checkout)
    (checkout / ".git").write_text(f"gitdir: {linked_git}\n")
    assert read_build_info({}, package).revision == COMMIT


@pytest.mark.parametrize("head", ["ref: refs/heads/../../../etc/passwd", "ref: HEAD", "garbage", ""])
def test_a_strange_head_gives_unknown(tmp_path: Path, head: str) -> None:
    package = _package(tmp_path)
    _git(tmp_path, head)
    assert read_build_info({}, package, built_commit_id=None).revision == UNKNOWN


def test_this_checkout_gives_what_git_says() -> None:
    """Against the real git, on the checkout the tests run from (a clone or a linked checkout)."""
    result = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        pytest.skip("not run from a git checkout")
    assert read_build_info({}).revision == result.stdout.strip()


def test_the_revision_is_read_once_not_per_scrape(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def counting(*args: object, **kwargs: object) -> BuildInfo:
        calls.append(1)
        return BuildInfo(version="9.9.9", revision=COMMIT, python_version="3.99.0")

    monkeypatch.setattr("exporter.collectors.umbrella.read_build_info", counting)
    umbrella = UmbrellaCollector([])
    for _ in range(3):
        families = {family.name: family for family in umbrella.collect()}
    assert len(calls) == 1
    (sample,) = families["ccl_exporter_build_info"].samples
    assert sample.labels == {"version": "9.9.9", "revision": COMMIT, "python_version": "3.99.0"}
    assert sample.value == 1.0


def test_docs_name_the_labels_served() -> None:
    """Both tables of docs/metrics.md list the labels the exporter serves on ccl_exporter_build_info."""
    served = {"version", "revision", "python_version"}
    rows = [
        line
        for line in (REPO / "docs" / "metrics.md").read_text().splitlines()
        if line.startswith("| `ccl_exporter_build_info` |")
    ]
    assert len(rows) == 2
    for row in rows:
        assert {label.strip() for label in row.split("|")[3].split(",")} == served, row
    assert set(BuildInfo.__dataclass_fields__) == served

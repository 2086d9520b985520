"""Release hygiene: the license, the changelog, one version from the git tag, the image's build.

The version of a build comes from its git tag (setuptools-scm, pyproject.toml): the wheel's, the
exporter's ``ccl_exporter_build_info{version}``, the image's tag and version label. The files that
must name a version before any build (the chart's ``appVersion``, the kustomize image tag, the
changelog's newest release) name the latest release and are set by ``devtools/release.py`` in the
commit it tags. The image (Dockerfile) installs the wheel of that version and dependencies from a
lock file with hashes, on a base image pinned by digest; docker cannot run here, so the Dockerfile
is read as Docker reads it (instructions, stages, bind mounts, the build context) and checked.
"""

from __future__ import annotations

import datetime
import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

from devtools import release
from tests.conftest import REPO

# SHA-256 of the Apache License 2.0 as the Apache Software Foundation publishes it (LICENSE-2.0.txt).
APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
CHART_YAML = REPO / release.CHART
KUSTOMIZATION = REPO / release.KUSTOMIZATION
LOCKS = ("exporter", "probe", "sbom")
WHEEL = "ccl_health_exporter-{version}-py3-none-any.whl"


def _changelog() -> str:
    return (REPO / "CHANGELOG.md").read_text()


# Who commits and tags in the scratch checkouts (CI has no git identity of its own).
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "Release Test",
    "GIT_AUTHOR_EMAIL": "release@example.invalid",
    "GIT_COMMITTER_NAME": "Release Test",
    "GIT_COMMITTER_EMAIL": "release@example.invalid",
}


@pytest.fixture
def git_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """For devtools.release, which commits and tags with the environment it is given."""
    for name, value in GIT_IDENTITY.items():
        monkeypatch.setenv(name, value)


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **GIT_IDENTITY}
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=60, env=env)


def test_the_license_is_the_full_apache_2_text() -> None:
    text = (REPO / "LICENSE").read_bytes()
    assert hashlib.sha256(text).hexdigest() == APACHE_2_SHA256
    pyproject = (REPO / "pyproject.toml").read_text()  # no tomllib: Python 3.10 is supported
    assert re.search(r'^license = "Apache-2.0"$', pyproject, flags=re.M)
    assert re.search(r'^license-files = \["LICENSE"\]$', pyproject, flags=re.M)


# --- the version ------------------------------------------------------------------------------


def test_the_version_comes_from_the_git_tag() -> None:
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(r'^dynamic = \["version"\]$', pyproject, flags=re.M)
    assert "[tool.setuptools_scm]" in pyproject and 'version_file = "exporter/_version.py"' in pyproject
    assert 'local_scheme = "no-local-version"' in pyproject, "no +g<hash>: the revision is a label of its own"
    assert "exporter/_version.py" in (REPO / ".gitignore").read_text().splitlines()
    assert not re.search(r"^__version__ = \"", (REPO / "exporter" / "__init__.py").read_text(), flags=re.M), (
        "no second copy of the version in the source"
    )


def check_changelog(text: str) -> None:
    """Unreleased first, then releases newest first, each with a link; each section with a
    **Breaking:** entry has an "### Upgrading" part naming what each breaking entry changed (the
    first name in backticks after "**Breaking:**")."""
    headings = re.findall(r"^## \[([^\]]+)\]", text, flags=re.M)
    assert headings[0] == "Unreleased"
    releases = headings[1:]
    assert releases, "at least one release"
    assert [release.version_key(v) for v in releases] == sorted(
        (release.version_key(v) for v in releases), reverse=True
    ), "newest first"
    for heading in headings:
        assert re.search(rf"^\[{re.escape(heading)}\]: https://", text, flags=re.M), f"no link for [{heading}]"
    versions = text[text.index("## Versions") :]
    assert "git tag" in versions and "make release" in versions, "the version scheme is written down"
    sections = re.split(r"^## ", text[: text.index("## Versions")], flags=re.M)[1:]
    for section in sections:
        breaking = re.findall(r"\*\*Breaking:\*\*[^`]*?`([^`]+)`", section)
        assert len(breaking) == section.count("**Breaking:**"), "every breaking entry names what changed"
        if not breaking:
            continue
        assert "### Upgrading" in section, f"{section.splitlines()[0]}: breaking changes without upgrade notes"
        start = section.index("### Upgrading")
        end = section.find("\n### ", start + 1)
        notes = section[start : end if end > 0 else len(section)]
        for key in breaking:
            assert f"`{key}`" in notes, f"{section.splitlines()[0]}: no upgrade note names `{key}`"


def test_the_changelog_has_releases_with_links_and_upgrade_notes() -> None:
    check_changelog(_changelog())
    assert "### Upgrading from 0.1.0" in _changelog(), "the notes of 0.2.0"


def test_the_changelog_check_sees_a_breaking_change_without_a_note() -> None:
    text = _changelog().replace("### Upgrading from 0.1.0", "### Upgrade notes elsewhere", 1)
    with pytest.raises(AssertionError, match="breaking changes without upgrade notes"):
        check_changelog(text)


def test_the_release_files_name_the_latest_release() -> None:
    """Chart appVersion (the default image tag), the kustomize image tag and the changelog's newest
    release: one version, which devtools/release.py sets with the tag."""
    latest = release.latest_release(_changelog())
    chart = yaml.safe_load(CHART_YAML.read_text())
    (image,) = yaml.safe_load(KUSTOMIZATION.read_text())["images"]
    assert chart["appVersion"] == latest
    assert image["newTag"] == latest
    references = {
        str(path.relative_to(REPO)): release.image_references(path.read_text())
        for pattern in release.IMAGE_REFERENCE_FILES
        for path in REPO.glob(pattern)
    }
    assert sum(map(len, references.values())) >= 4, "the examples and the webhook overlay name the image"
    assert {path: tags for path, tags in references.items() if set(tags) - {latest}} == {}, (
        "every image reference in the manifests names the latest release, which devtools/release.py moves"
    )


def _scm_version(root: Path) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "setuptools_scm", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=root,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def test_this_checkout_builds_the_version_its_tag_says() -> None:
    """On a tagged commit the build's version is the tag's, which is the latest release; on any
    other commit a development version above the latest tag."""
    if _git(REPO, "rev-parse", "HEAD").returncode != 0:
        pytest.skip("not run from a git checkout")
    built = _scm_version(REPO)
    latest = release.latest_release(_changelog())
    exact = _git(REPO, "describe", "--tags", "--exact-match", "--match", "v[0-9]*").stdout.strip()
    if exact:
        assert built == exact[1:] == latest
        return
    assert Version(built).is_devrelease, built
    tag = release.latest_tag_version(REPO)
    if tag is None:
        pytest.skip(
            f"no release tag reachable from HEAD, builds say {built} (a shallow clone, or before the first "
            f"tag: {latest} was never tagged here, docs/release.md)"
        )
    assert tag == latest, "the latest tag and the changelog's newest release are one commit's"
    assert Version(built) > Version(tag)


# --- the release command, end to end on a checkout of its own ----------------------------------


def _scratch_checkout(root: Path) -> Path:
    """What a release touches and a wheel is built from, committed into a new repository."""
    root.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md"):
        shutil.copy2(REPO / name, root / name)
    # Something to release, also where this checkout is a release's commit (Unreleased empty).
    changelog = (root / "CHANGELOG.md").read_text()
    (root / "CHANGELOG.md").write_text(
        changelog.replace("## [Unreleased]\n", "## [Unreleased]\n\n### Fixed\n\n- A fix to release.\n", 1)
    )
    shutil.copytree(
        REPO / "exporter",
        root / "exporter",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "_version.py", "REVISION"),
    )
    for path in (release.CHART, release.KUSTOMIZATION):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / path, root / path)
    for pattern in release.IMAGE_REFERENCE_FILES:
        for path in REPO.glob(pattern):
            (root / path.relative_to(REPO)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, root / path.relative_to(REPO))
    assert _git(root, "init", "--quiet", "--initial-branch=main").returncode == 0
    assert _git(root, "add", "--all").returncode == 0
    assert _git(root, "commit", "--quiet", "-m", "the tree as it is").returncode == 0
    return root


def _build_wheel(root: Path, dist: Path) -> Path:
    """`make dist` without build isolation (setuptools and setuptools-scm from the test venv)."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(dist),
            str(root),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    (wheel,) = dist.glob("*.whl")
    return wheel


def test_the_wheel_carries_the_runtime_only(tmp_path: Path) -> None:
    """Built from a tree that holds the development packages too (the simulated node, devtools,
    bench), the wheel holds ``exporter`` and its metadata, nothing of the simulator."""
    root = tmp_path / "tree"
    root.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, root / name)
    for package in ("exporter", "sim", "devtools", "bench"):
        shutil.copytree(
            REPO / package,
            root / package,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "_version.py", "REVISION", "*.egg-info"),
        )
    assert (root / "sim" / "ccl_sim" / "node.py").is_file()
    env = {**os.environ, "SETUPTOOLS_SCM_PRETEND_VERSION": "0.0.1"}  # no .git in this tree
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(tmp_path / "dist"),
            str(root),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        top_level = archive.read(next(n for n in names if n.endswith(".dist-info/top_level.txt"))).decode()
    assert "exporter/commands/serve.py" in names and "exporter/collectors/nccl/families.py" in names
    outside = sorted({name.split("/")[0] for name in names} - {"exporter", "ccl_health_exporter-0.0.1.dist-info"})
    assert outside == [], "the wheel holds the runtime package only"
    assert not [name for name in names if "ccl_sim" in name or "/sim/" in name]
    assert top_level.split() == ["exporter"]


def test_the_simulated_node_is_a_distribution_of_its_own(tmp_path: Path) -> None:
    """sim/ builds its own wheel (ccl-health-sim): the simulator and nothing of the exporter, which
    it names as a dependency."""
    tree = tmp_path / "sim"  # a copy: building in place would leave build/ in the checkout
    shutil.copytree(REPO / "sim", tree, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(tmp_path / "dist"),
            str(tree),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    (wheel,) = (tmp_path / "dist").glob("ccl_health_sim-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "ccl_sim/serve.py" in names and "ccl_sim/node.py" in names
    assert {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")} == {"ccl_sim"}
    assert "Requires-Dist: ccl-health-exporter" in metadata


def _build_info_of(wheel: Path, unpacked: Path) -> dict[str, str]:
    """ccl_exporter_build_info's labels as the installed wheel reports them, outside any checkout."""
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(unpacked)
    env = {key: value for key, value in os.environ.items() if key != "CCL_EXPORTER_REVISION"}
    env["PYTHONPATH"] = str(unpacked)
    code = (
        "import dataclasses, json; from exporter.build import read_build_info; "
        "print(json.dumps(dataclasses.asdict(read_build_info())))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env, cwd=unpacked
    )
    assert result.returncode == 0, result.stderr
    info: dict[str, str] = json.loads(result.stdout)
    return info


def test_a_release_tags_a_commit_whose_wheel_build_info_chart_and_image_agree(
    tmp_path: Path, git_identity: None
) -> None:
    root = _scratch_checkout(tmp_path / "checkout")
    latest = release.latest_release(_changelog())
    assert latest is not None
    major, minor, _ = release.version_key(latest)
    version = f"{major}.{minor + 1}.0"
    chart_before = yaml.safe_load((root / release.CHART).read_text())["version"]

    assert release.main([version, "--root", str(root), "--date", "2026-01-31"]) == 0

    assert _git(root, "describe", "--tags", "--exact-match").stdout.strip() == f"v{version}"
    assert _git(root, "status", "--porcelain").stdout == "", "everything the release edits is in its commit"
    chart = yaml.safe_load((root / release.CHART).read_text())
    assert chart["appVersion"] == version
    assert chart["version"] != chart_before, "appVersion changed, so the chart's version is raised"
    (image,) = yaml.safe_load((root / release.KUSTOMIZATION).read_text())["images"]
    assert image["newTag"] == version
    moved = [
        tag
        for pattern in release.IMAGE_REFERENCE_FILES
        for path in root.glob(pattern)
        for tag in release.image_references(path.read_text())
    ]
    assert moved and set(moved) == {version}, "the examples and overlays name the new release"
    changelog = (root / "CHANGELOG.md").read_text()
    assert release.latest_release(changelog) == version
    check_changelog(changelog)  # what this file's tests ask of the changelog holds after the cut
    assert f"## [{version}] - 2026-01-31" in changelog
    assert re.search(rf"^\[Unreleased\]: https://\S+/compare/v{re.escape(version)}\.\.\.HEAD$", changelog, flags=re.M)

    wheel = _build_wheel(root, tmp_path / "dist")
    assert wheel.name == WHEEL.format(version=version), "the name the Dockerfile installs for VERSION"
    commit = _git(root, "rev-parse", "HEAD").stdout.strip()
    info = _build_info_of(wheel, tmp_path / "unpacked")
    assert info["version"] == version
    assert commit.startswith(info["revision"]) and len(info["revision"]) >= 7

    # The next commit: a development version above the release, and another revision.
    (root / "README.md").write_text((root / "README.md").read_text() + "\n")
    assert _git(root, "commit", "--quiet", "-am", "after the release").returncode == 0
    next_wheel = _build_wheel(root, tmp_path / "dist-next")
    next_info = _build_info_of(next_wheel, tmp_path / "unpacked-next")
    assert next_info["version"] == f"{major}.{minor + 1}.1.dev1"
    assert Version(next_info["version"]) > Version(version)
    assert next_info["revision"] != info["revision"]
    assert _git(root, "rev-parse", "HEAD").stdout.startswith(next_info["revision"])


def test_a_release_is_refused_when_it_cannot_be_cut(tmp_path: Path, git_identity: None) -> None:
    root = _scratch_checkout(tmp_path / "checkout")
    assert release.main(["v9.0.0", "--root", str(root)]) == 1, "no v prefix"
    assert release.main(["9.0", "--root", str(root)]) == 1
    (root / "README.md").write_text("changed\n")
    assert release.main(["9.0.0", "--root", str(root)]) == 1, "uncommitted changes"
    _git(root, "checkout", "--", "README.md")
    assert release.main(["9.0.0", "--root", str(root), "--date", "2026-02-01"]) == 0
    assert release.main(["9.0.0", "--root", str(root)]) == 1, "the tag exists"
    (root / "README.md").write_text("a change\n")
    _git(root, "commit", "--quiet", "-am", "a change")
    assert release.main(["8.9.9", "--root", str(root)]) == 1, "below the latest tag"
    assert release.main(["9.0.1", "--root", str(root)]) == 1, "nothing under Unreleased"


def test_the_changelog_cut() -> None:
    text = (
        "# Changelog\n\n## [Unreleased]\n\n### Fixed\n\n- a fix\n\n## [1.2.0]\n\n- old\n\n## Versions\n\n"
        "[Unreleased]: https://example.invalid/p/compare/v1.2.0...HEAD\n"
        "[1.2.0]: https://example.invalid/p/releases/tag/v1.2.0\n"
    )
    cut = release.cut_changelog(text, release.Release("1.3.0", datetime.date(2026, 3, 4), previous="1.2.0"))
    assert cut.index("## [Unreleased]") < cut.index("## [1.3.0] - 2026-03-04") < cut.index("- a fix")
    assert cut.index("- a fix") < cut.index("## [1.2.0]")
    assert "[Unreleased]: https://example.invalid/p/compare/v1.3.0...HEAD\n" in cut
    assert "[1.3.0]: https://example.invalid/p/compare/v1.2.0...v1.3.0\n" in cut
    first = release.cut_changelog(text, release.Release("1.3.0", datetime.date(2026, 3, 4), previous=None))
    assert "[1.3.0]: https://example.invalid/p/releases/tag/v1.3.0\n" in first
    with pytest.raises(release.ReleaseError, match="already has a heading"):
        release.cut_changelog(text, release.Release("1.2.0", datetime.date(2026, 3, 4), previous=None))
    with pytest.raises(release.ReleaseError, match="nothing under Unreleased"):
        release.cut_changelog(cut, release.Release("1.4.0", datetime.date(2026, 3, 4), previous="1.3.0"))


# --- the lock files ---------------------------------------------------------------------------

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+?)(?: \\)?$")
_HASH = re.compile(r"^\s+--hash=sha256:[0-9a-f]{64}(?: \\)?$")


@dataclass(frozen=True)
class Locked:
    version: str
    hashes: int
    via: tuple[str, ...]


def _lock(name: str) -> dict[str, Locked]:
    """requirements/<name>.txt as uv writes it: ``name==version \\``, hash lines, ``# via`` lines."""
    pins: dict[str, Locked] = {}
    current: str | None = None
    version, hashes, via = "", 0, []
    lines = (REPO / "requirements" / f"{name}.txt").read_text().splitlines()
    for line in [*lines, ""]:
        pin = _PIN.match(line)
        if pin or not line:
            if current:
                pins[current] = Locked(version, hashes, tuple(via))
            if pin:
                current, version, hashes, via = pin.group(1).lower().replace("_", "-"), pin.group(2), 0, []
            continue
        if _HASH.match(line):
            hashes += 1
        elif line.strip().startswith("#"):
            words = line.strip().lstrip("#").strip().removeprefix("via").strip()
            via.extend(word for word in words.split() if word)
        else:
            raise AssertionError(f"requirements/{name}.txt: unexpected line {line!r}")
    return pins


@pytest.mark.parametrize("name", LOCKS)
def test_a_lock_file_pins_every_package_with_hashes_and_names_no_index(name: str) -> None:
    text = (REPO / "requirements" / f"{name}.txt").read_text()
    assert text.startswith("# This file was autogenerated by uv via the following command:\n#    make lock\n")
    for forbidden in ("://", "--index-url", "--extra-index-url", "--find-links", "-e ", "file:"):
        assert forbidden not in text, f"requirements/{name}.txt names {forbidden!r}"
    assert not re.search(r"(^|\s)/(work|tmp|opt|home|root)/", text), "no local paths"
    pins = _lock(name)
    assert pins
    assert all(locked.hashes >= 1 for locked in pins.values()), [p for p, locked in pins.items() if not locked.hashes]
    for package, locked in pins.items():
        assert locked.via, f"{package}: why it is locked"


def test_the_exporter_lock_holds_what_the_package_depends_on() -> None:
    """Every dependency of pyproject.toml pinned within its range, and nothing that nothing needs."""
    pyproject = (REPO / "pyproject.toml").read_text()
    block = re.search(r"^dependencies = \[\n(.*?)^\]", pyproject, flags=re.M | re.S)
    assert block
    requirements = [Requirement(r) for r in re.findall(r'^\s+"([^"]+)",', block.group(1), flags=re.M)]
    pins = _lock("exporter")
    for requirement in requirements:
        name = requirement.name.lower().replace("_", "-")
        assert name in pins, f"{name} is not locked"
        assert requirement.specifier.contains(pins[name].version), f"{name}=={pins[name].version} vs {requirement}"
    direct = {r.name.lower().replace("_", "-") for r in requirements}
    for package, locked in pins.items():
        assert package in direct or set(locked.via) & set(pins), f"{package} is needed by nothing locked"


def test_the_probe_and_sbom_locks_agree_with_the_rest() -> None:
    exporter_pins, probe_pins, sbom_pins = _lock("exporter"), _lock("probe"), _lock("sbom")
    makefile = (REPO / "Makefile").read_text()
    torch_pin = re.search(r"^TORCH_PIN \?= torch==(\S+)$", makefile, flags=re.M)
    assert torch_pin and probe_pins["torch"].version == torch_pin.group(1), "the torch the tests run"
    for package in set(probe_pins) & set(exporter_pins):
        assert probe_pins[package].version == exporter_pins[package].version, f"{package}: one version in the image"
    cyclonedx = re.search(r'"cyclonedx-bom==([^"]+)"', (REPO / "pyproject.toml").read_text())
    assert cyclonedx and sbom_pins["cyclonedx-bom"].version == cyclonedx.group(1), "the SBOM tool the tests run"


def test_the_sbom_tool_lists_every_locked_package() -> None:
    """cyclonedx-py (the tool the image runs) reads the exporter's lock into a CycloneDX SBOM
    naming each locked package at its version, with the lock's hashes."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "cyclonedx_py",
            "requirements",
            "--of",
            "JSON",
            "-o",
            "-",
            str(REPO / "requirements" / "exporter.txt"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    sbom = json.loads(result.stdout)
    assert sbom["bomFormat"] == "CycloneDX" and sbom["specVersion"] == "1.6"
    found = {c["name"].lower().replace("_", "-"): c for c in sbom["components"]}
    pins = _lock("exporter")
    assert {name: c["version"] for name, c in found.items()} == {name: p.version for name, p in pins.items()}
    for name, component in found.items():
        assert component["purl"] == f"pkg:pypi/{name}@{pins[name].version}"
        refs = [ref for ref in component.get("externalReferences", []) if ref.get("hashes")]
        assert sum(len(ref["hashes"]) for ref in refs) == pins[name].hashes, name


def test_the_sbom_of_an_environment_names_the_built_version(tmp_path: Path) -> None:
    """`cyclonedx-py environment`, as the image's sbom stage runs it, on an environment that holds
    the wheel of a tagged commit: the SBOM names the package at the tag's version."""
    root = _scratch_checkout(tmp_path / "checkout")
    assert _git(root, "tag", "--annotate", "v7.1.0", "-m", "test").returncode == 0
    wheel = _build_wheel(root, tmp_path / "dist")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "cyclonedx_py",
            "environment",
            "--output-reproducible",
            "--of",
            "JSON",
            "-o",
            "-",
            str(venv / "bin" / "python"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    components = {c["name"]: c["version"] for c in json.loads(result.stdout)["components"]}
    assert components.get("ccl-health-exporter") == "7.1.0", components


# --- the Dockerfile, read as Docker reads it ----------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str


@dataclass(frozen=True)
class Stage:
    base: str
    name: str
    instructions: tuple[Instruction, ...]

    def all(self, keyword: str) -> list[str]:
        return [i.arguments for i in self.instructions if i.keyword == keyword]


def _dockerfile() -> tuple[list[Instruction], dict[str, Stage]]:
    """Global instructions and the stages by name: comments and blank lines dropped, lines ending
    in a backslash joined, each instruction split into its keyword and the rest."""
    logical: list[str] = []
    pending = ""
    for line in (REPO / "Dockerfile").read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "the Dockerfile ends inside an instruction"
    preamble: list[Instruction] = []
    stages: dict[str, tuple[str, list[Instruction]]] = {}
    current: list[Instruction] = preamble
    for text in logical:
        keyword, _, arguments = text.strip().partition(" ")
        assert keyword == keyword.upper(), f"instructions in capitals: {keyword}"
        if keyword == "FROM":
            match = re.fullmatch(r"(\S+) AS (\S+)", arguments.strip())
            assert match, f"every stage is named: FROM {arguments}"
            current = []
            stages[match.group(2)] = (match.group(1), current)
        else:
            current.append(Instruction(keyword, arguments.strip()))
    return preamble, {name: Stage(base, name, tuple(found)) for name, (base, found) in stages.items()}


def _mounts(run: str) -> dict[str, dict[str, str]]:
    """RUN --mount=type=bind,... options by target."""
    mounts = {}
    for spec in re.findall(r"--mount=(\S+)", run):
        options = dict(option.split("=", 1) for option in spec.split(","))
        mounts[options["target"]] = options
    return mounts


def test_the_base_image_is_pinned_by_digest_and_stages_build_on_each_other() -> None:
    preamble, stages = _dockerfile()
    assert preamble == [], "no ARG before FROM: the base is written out, digest and all"
    names = list(stages)
    assert names[-1] == "exporter", "the default target (the last stage) is the exporter"
    for index, stage in enumerate(stages.values()):
        if stage.base == "scratch" or stage.base in names[:index]:
            continue
        assert re.fullmatch(r"[a-z0-9./-]+:[A-Za-z0-9._-]+@sha256:[0-9a-f]{64}", stage.base), (
            f"stage {stage.name}: {stage.base} is pinned by tag only"
        )
    assert stages["runtime"].base.startswith("python:3.11-slim-bookworm@sha256:")
    assert "docker-library/repo-info" in (REPO / "Dockerfile").read_text(), "where the digest came from"


def test_the_image_carries_oci_labels_from_its_build_arguments() -> None:
    runtime = _dockerfile()[1]["runtime"]
    args = {name: value if sep else None for name, sep, value in (a.partition("=") for a in runtime.all("ARG"))}
    assert args["VERSION"] is None, "no default: an image cannot claim a version it was not built from"
    assert args["REVISION"] == '""' and args["CREATED"] == '""'
    labels = dict(re.findall(r'(org\.opencontainers\.image\.[a-z.]+)="([^"]*)"', " ".join(runtime.all("LABEL"))))
    assert labels["org.opencontainers.image.version"] == "${VERSION}"
    assert labels["org.opencontainers.image.revision"] == "${REVISION}"
    assert labels["org.opencontainers.image.created"] == "${CREATED}"
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.base.name"].endswith(runtime.base.split("@")[0])
    assert {"title", "description", "source", "url", "documentation"} <= {key.rsplit(".", 1)[1] for key in labels}
    assert any("CCL_EXPORTER_REVISION=${REVISION}" in env for env in runtime.all("ENV")), (
        "ccl_exporter_build_info{revision} from the same argument"
    )


def test_the_exporter_image_installs_the_versioned_wheel_and_locked_dependencies_only() -> None:
    stages = _dockerfile()[1]
    runtime = stages["runtime"]
    assert runtime.all("COPY") == [] and runtime.all("ADD") == [], "bind mounts, so nothing stays in a layer"
    (install,) = [run for run in runtime.all("RUN") if "pip install" in run]
    mounts = _mounts(install)
    assert mounts["/tmp/requirements/exporter.txt"]["source"] == "requirements/exporter.txt"
    assert mounts["/tmp/dist"]["source"] == "dist"
    assert all(m["type"] == "bind" for m in mounts.values())
    assert re.search(r'test -n "\$\{VERSION\}" \|\| \{ .*exit 1; \}', install), "fails without a VERSION"
    deps = re.search(r"pip install ([^&;]*)-r /tmp/requirements/exporter.txt", install)
    assert deps and {"--require-hashes", "--no-deps", "--only-binary=:all:"} <= set(deps.group(1).split())
    wheel = re.search(r'pip install ([^&;]*)"/tmp/dist/(\S+)"', install)
    assert wheel and {"--no-deps", "--no-index"} <= set(wheel.group(1).split())
    assert wheel.group(2) == WHEEL.format(version="${VERSION}")
    assert "pip check" in install
    assert "torch" not in " ".join(i.arguments for i in runtime.instructions)
    assert runtime.all("USER") == ["65532:65532"]
    assert runtime.all("ENTRYPOINT") == ['["ccl-exporter"]'] and runtime.all("CMD") == ['["serve"]']
    assert stages["exporter"].base == "runtime" and stages["exporter"].instructions == ()


def test_the_probe_image_adds_torch_from_its_lock_file() -> None:
    probe = _dockerfile()[1]["probe"]
    assert probe.base == "runtime"
    (install,) = probe.all("RUN")
    assert _mounts(install)["/tmp/requirements/probe.txt"]["source"] == "requirements/probe.txt"
    assert re.search(r"pip install [^&]*--require-hashes[^&]*-r /tmp/requirements/probe.txt", install)
    assert probe.all("USER")[-1] == "65532:65532"


def test_the_sbom_stage_lists_the_exporter_images_environment() -> None:
    stages = _dockerfile()[1]
    scan, sbom = stages["sbom-scan"], stages["sbom"]
    assert scan.base == "runtime", "the SBOM of what the exporter image holds"
    (run,) = scan.all("RUN")
    assert _mounts(run)["/tmp/requirements/sbom.txt"]["source"] == "requirements/sbom.txt"
    assert re.search(r"pip install [^&]*--require-hashes[^&]*-r /tmp/requirements/sbom.txt", run)
    assert "python -m venv /opt/sbom" in run, "the tool in an environment of its own, not in what it lists"
    assert re.search(r"/opt/sbom/bin/cyclonedx-py environment .*-o /sbom.cdx.json /usr/local/bin/python$", run)
    assert sbom.base == "scratch" and sbom.all("COPY") == ["--from=sbom-scan /sbom.cdx.json /sbom.cdx.json"]
    makefile = (REPO / "Makefile").read_text()
    assert "--target sbom --output type=local,dest=dist" in makefile


def _in_build_context(path: str) -> bool:
    """Whether .dockerignore lets ``path`` into the build context (the last matching rule wins)."""
    included = True
    for rule in (REPO / ".dockerignore").read_text().splitlines():
        rule = rule.strip()
        if not rule or rule.startswith("#"):
            continue
        negated = rule.startswith("!")
        pattern = rule.lstrip("!")
        if fnmatch.fnmatchcase(path, pattern) or any(fnmatch.fnmatchcase(p, pattern) for p in _parents(path)):
            included = negated
    return included


def _parents(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def test_the_build_context_holds_what_the_build_mounts_and_nothing_else() -> None:
    stages = _dockerfile()[1]
    sources = {
        m["source"] for s in stages.values() for run in s.all("RUN") for m in _mounts(run).values() if "from" not in m
    }
    assert sources == {"requirements/exporter.txt", "requirements/probe.txt", "requirements/sbom.txt", "dist"}
    for source in sources - {"dist"}:
        assert (REPO / source).is_file() and _in_build_context(source), source
    assert _in_build_context(f"dist/{WHEEL.format(version='0.2.0')}")
    for left_out in (
        "exporter/cli.py",
        "tests/conftest.py",
        ".git/HEAD",
        ".venv/bin/python",
        "dist/other.tar.gz",
        "requirements/probe.in",
    ):
        assert not _in_build_context(left_out), left_out


def test_the_makefile_builds_the_image_from_the_tag() -> None:
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^VERSION = \$\(shell \$\(BIN\)/python -m setuptools_scm\)$", makefile, flags=re.M)
    assert "--build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION)" in makefile
    assert re.search(r"^image: dist$", makefile, flags=re.M) and re.search(r"^sbom: dist$", makefile, flags=re.M)
    assert "-t $(IMAGE):$(VERSION) ." in makefile and "-t $(IMAGE):$(VERSION)-probe ." in makefile
    assert "$(BIN)/python -m devtools.release $(RELEASE)" in makefile

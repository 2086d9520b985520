"""Release hygiene: the license, the changelog, and one version everywhere it is written.

The version lives in ``exporter/__init__.py``; every other place that names it (the image tag
of the kustomize base, the Dockerfile's VERSION default, the changelog's newest release) must
agree, and the image carries OCI labels filled from its build arguments.
"""

from __future__ import annotations

import hashlib
import re

import yaml

import exporter
from tests.conftest import REPO

# SHA-256 of the Apache License 2.0 as the Apache Software Foundation publishes it (LICENSE-2.0.txt).
APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?$")


def test_the_license_is_the_full_apache_2_text() -> None:
    text = (REPO / "LICENSE").read_bytes()
    assert hashlib.sha256(text).hexdigest() == APACHE_2_SHA256
    pyproject = (REPO / "pyproject.toml").read_text()  # no tomllib: Python 3.10 is supported
    assert re.search(r'^license = "Apache-2.0"$', pyproject, flags=re.M)
    assert re.search(r'^license-files = \["LICENSE"\]$', pyproject, flags=re.M)


def test_the_version_is_semver() -> None:
    assert SEMVER.match(exporter.__version__)


def test_the_changelog_has_unreleased_and_the_current_version() -> None:
    text = (REPO / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## \[([^\]]+)\]", text, flags=re.M)
    assert headings[0] == "Unreleased"
    assert headings[1] == exporter.__version__, "the newest release heading is the package's version"
    for heading in headings:
        assert re.search(rf"^\[{re.escape(heading)}\]: https://", text, flags=re.M), f"no link for [{heading}]"
    assert "## Versions" in text and "exporter/__init__.py" in text, "the version scheme is written down"


def test_the_kustomize_image_tag_is_the_version() -> None:
    kustomization = yaml.safe_load((REPO / "manifests" / "base" / "kustomization.yaml").read_text())
    (image,) = kustomization["images"]
    assert image["newTag"] == exporter.__version__


def _dockerfile_stage(name: str) -> str:
    text = (REPO / "Dockerfile").read_text()
    stage = re.search(rf"^FROM \S+ AS {name}\n(.*?)(?=^FROM |\Z)", text, flags=re.M | re.S)
    assert stage, f"no stage {name}"
    return stage.group(1).replace("\\\n", " ")


def test_the_image_carries_oci_labels_from_its_build_arguments() -> None:
    runtime = _dockerfile_stage("runtime")
    args = dict(re.findall(r'^ARG (\w+)=(".*?"|\S*)', runtime, flags=re.M))
    assert args["VERSION"] == exporter.__version__
    assert args["REVISION"] == '""', "no revision unless the build says: the exporter then reports unknown"
    labels = dict(re.findall(r'(org\.opencontainers\.image\.[a-z]+)="([^"]*)"', runtime))
    assert labels["org.opencontainers.image.version"] == "${VERSION}"
    assert labels["org.opencontainers.image.revision"] == "${REVISION}"
    assert labels["org.opencontainers.image.created"] == "${CREATED}"
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert {"title", "description", "source", "url", "documentation"} <= {key.rsplit(".", 1)[1] for key in labels}
    assert "CCL_EXPORTER_REVISION=${REVISION}" in runtime, "ccl_exporter_build_info{revision} from the same argument"


def test_the_exporter_image_installs_no_extras() -> None:
    """Serving needs the package's own dependencies only: no probe (torch), test or codegen extra."""
    build, runtime = _dockerfile_stage("build"), _dockerfile_stage("runtime")
    assert re.search(r"pip wheel --no-cache-dir --wheel-dir /wheels \.$", build, flags=re.M), "'.', not '.[extra]'"
    assert "torch" not in runtime and "COPY --from=build" not in runtime, "wheels are bind-mounted, not kept"
    assert "--mount=type=bind,from=build,source=/wheels" in runtime

"""ccl-health-exporter: is this node's collective communication on the fabric it should be?"""

from __future__ import annotations

# The version a build gave this package: setuptools-scm writes exporter/_version.py from the git
# tag when a wheel is built or the checkout is installed (pyproject.toml, docs/release.md). A
# source tree that was never built has no such file and says so with a development version below
# every release.
UNBUILT_VERSION = "0.0.0.dev0"

try:
    from exporter import _version
except ImportError:  # a source tree that was never built or installed
    __version__ = UNBUILT_VERSION
    # The commit the build was made from, abbreviated ("g" and hex digits), or None.
    BUILT_COMMIT_ID: str | None = None
else:
    __version__ = _version.__version__
    BUILT_COMMIT_ID = getattr(_version, "__commit_id__", None)

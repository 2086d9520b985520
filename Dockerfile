# syntax=docker/dockerfile:1
# ccl-health-exporter images, built by `make image` (docs/release.md) from the wheel `make dist`
# built from the git tag and the lock files in requirements/:
#   make image      ccl-health-exporter:VERSION (the exporter, no torch) and VERSION-probe (+ torch)
#   make sbom       dist/ccl-health-exporter-VERSION.cdx.json, the exporter image's SBOM
# By hand, after `make dist`:
#   docker build --build-arg VERSION="$(python -m setuptools_scm)" --build-arg REVISION="$(git rev-parse HEAD)" \
#     --build-arg CREATED="$(date -u +%Y-%m-%dT%H:%M:%SZ)" -t ccl-health-exporter:VERSION .
# VERSION has no default: it names the wheel to install and fills the version label, so an image
# cannot say a version it does not hold. REVISION fills the revision label and
# ccl_exporter_build_info{revision}.
# The exporter never imports torch (only the probe's worker subprocess does), so the default
# image installs the package and its serving dependencies only (no extras, no build tools, none
# of the development packages: the simulated node, sim/, is a distribution of its own);
# the probe image adds the locked torch build and its bundled NCCL.

# The base image, pinned by digest: the multi-platform index of python:3.11-slim-bookworm
# (Python 3.11.16, built 2026-08-25), as docker-library/repo-info records it in
# repos/python/remote/3.11-slim-bookworm.md. To refresh (docs/release.md#the-base-image):
# `docker buildx imagetools inspect python:3.11-slim-bookworm` (the "Digest:" line) or that file's
# first `docker pull python@sha256:...` line, then rebuild and run the tests.
FROM python:3.11-slim-bookworm@sha256:fe556eaffd0d96abd8685b83bb8a69addd0dc730fa193669a7df0d49ddcfac02 AS runtime
ARG VERSION
ARG REVISION=""
ARG CREATED=""
LABEL org.opencontainers.image.title="ccl-health-exporter" \
      org.opencontainers.image.description="Per-node Prometheus exporter that tells whether GPU training jobs' NCCL traffic runs on RDMA or fell back to TCP." \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="docker.io/library/python:3.11-slim-bookworm" \
      org.opencontainers.image.source="https://github.com/ccl-health-exporter/ccl-health-exporter" \
      org.opencontainers.image.url="https://github.com/ccl-health-exporter/ccl-health-exporter" \
      org.opencontainers.image.documentation="https://github.com/ccl-health-exporter/ccl-health-exporter/blob/main/docs/deploy.md"
# ccl_exporter_build_info{revision} (exporter/build.py reads it once at start; empty: the commit
# the wheel was built from, abbreviated).
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 CCL_EXPORTER_REVISION=${REVISION}
# The dependencies from the lock file, each checked against its hashes, wheels only (nothing is
# compiled in the image); then the wheel of this version, and nothing else (no index). The lock
# file and the wheel are bind-mounted, not copied: a COPY layer would keep them in the image.
RUN --mount=type=bind,source=requirements/exporter.txt,target=/tmp/requirements/exporter.txt \
    --mount=type=bind,source=dist,target=/tmp/dist \
    test -n "${VERSION}" || { echo "build with --build-arg VERSION=X.Y.Z (make image)" >&2; exit 1; } ; \
    test -f "/tmp/dist/ccl_health_exporter-${VERSION}-py3-none-any.whl" \
      || { echo "no dist/ccl_health_exporter-${VERSION}-py3-none-any.whl: run make dist" >&2; exit 1; } ; \
    python -m pip install --no-cache-dir --no-deps --require-hashes --only-binary=:all: -r /tmp/requirements/exporter.txt \
    && python -m pip install --no-cache-dir --no-deps --no-index "/tmp/dist/ccl_health_exporter-${VERSION}-py3-none-any.whl" \
    && python -m pip check
# A non-root default user: `analyze` and the probe need no privilege. The
# DaemonSet overrides it with UID 0 (runAsUser), with every capability dropped, because
# kubelet writes pod logs as root:root 0640 and only their owner can read them.
RUN useradd --system --uid 65532 --no-create-home --shell /usr/sbin/nologin ccl
USER 65532:65532
EXPOSE 19400
HEALTHCHECK --interval=30s --timeout=5s CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:19400/healthz', timeout=4).status == 200 else 1)"
ENTRYPOINT ["ccl-exporter"]
CMD ["serve"]

FROM runtime AS probe
USER 0:0
# torch as the tests run it (2.13.0) and its dependencies, from their own lock file; on Linux
# x86_64 the wheel is the CUDA build, which brings its own NCCL.
RUN --mount=type=bind,source=requirements/probe.txt,target=/tmp/requirements/probe.txt \
    python -m pip install --no-cache-dir --require-hashes --only-binary=:all: -r /tmp/requirements/probe.txt \
    && python -m pip check
USER 65532:65532
ENTRYPOINT ["ccl-exporter"]
CMD ["probe", "--help"]

# The exporter image's SBOM: cyclonedx-py (cyclonedx-bom, from its own lock file) in a virtual
# environment of its own lists the image's Python environment, what the exporter runs on.
# `make sbom` writes it to dist/ (docker build --target sbom --output type=local,dest=dist .).
FROM runtime AS sbom-scan
USER 0:0
RUN --mount=type=bind,source=requirements/sbom.txt,target=/tmp/requirements/sbom.txt \
    python -m venv /opt/sbom \
    && /opt/sbom/bin/python -m pip install --no-cache-dir --require-hashes --only-binary=:all: -r /tmp/requirements/sbom.txt \
    && /opt/sbom/bin/cyclonedx-py environment --output-reproducible --of JSON -o /sbom.cdx.json /usr/local/bin/python

FROM scratch AS sbom
COPY --from=sbom-scan /sbom.cdx.json /sbom.cdx.json

# The default target (`docker build .` without --target) is the exporter.
FROM runtime AS exporter

# syntax=docker/dockerfile:1
# ccl-health-exporter images.
#   docker build -t ccl-health-exporter:0.1.0 .                        the exporter (no torch)
#   docker build --target probe -t ccl-health-exporter:0.1.0-probe .   + torch, for `ccl-exporter probe`
# Release builds pass what the OCI labels and ccl_exporter_build_info{revision} say:
#   docker build --build-arg VERSION=0.1.0 --build-arg REVISION="$(git rev-parse HEAD)" \
#     --build-arg CREATED="$(date -u +%Y-%m-%dT%H:%M:%SZ)" -t ccl-health-exporter:0.1.0 .
# The exporter never imports torch (only the probe's worker subprocess does), so the default
# image installs the package and its serving dependencies only (no extras, no build tools);
# the probe image adds the pinned torch build and its bundled NCCL.

FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY exporter ./exporter
RUN python -m pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim-bookworm AS runtime
ARG VERSION=0.1.0
ARG REVISION=""
ARG CREATED=""
LABEL org.opencontainers.image.title="ccl-health-exporter" \
      org.opencontainers.image.description="Per-node Prometheus exporter that tells whether GPU training jobs' NCCL traffic runs on RDMA or fell back to TCP." \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/ccl-health-exporter/ccl-health-exporter" \
      org.opencontainers.image.url="https://github.com/ccl-health-exporter/ccl-health-exporter" \
      org.opencontainers.image.documentation="https://github.com/ccl-health-exporter/ccl-health-exporter/blob/main/docs/deploy.md"
# ccl_exporter_build_info{revision} (exporter/build.py reads it once at start; empty: "unknown").
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 CCL_EXPORTER_REVISION=${REVISION}
# The wheels are bind-mounted from the build stage, not copied: a COPY layer would keep them in
# the image even after they are deleted.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m pip install --no-cache-dir /wheels/*.whl
# A non-root default user: `analyze`, `--simulate` and the probe need no privilege. The
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
# The probe extra with torch pinned (2.13.0 is the version the tests run); the default wheel
# on Linux x86_64 is the CUDA build, which brings its own NCCL.
RUN python -m pip install --no-cache-dir "torch==2.13.0" "numpy>=1.24"
USER 65532:65532
ENTRYPOINT ["ccl-exporter"]
CMD ["probe", "--help"]

# The default target (`docker build .` without --target) is the exporter.
FROM runtime AS exporter

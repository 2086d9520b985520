"""``ccl-exporter webhook``: the mutating admission webhook, served over HTTPS.

``POST /mutate`` answers AdmissionReview v1 requests (``exporter.webhook.admission``),
``GET /metrics`` serves the webhook's own registry, ``GET /healthz`` says it is up. The
certificate and key (``--tls.cert-file``, ``--tls.key-file``) are read again when they change
on disk, so a certificate renewed by cert-manager is picked up without a restart.
"""

from __future__ import annotations

import argparse
import logging
import shlex
from collections.abc import Mapping

from exporter.flags import DEFAULT_PROBE_RESULTS, LOG_LEVEL, EnvHelpFormatter, Flag, parse_listen_address
from exporter.logs import LOG_FORMAT, configure_logging
from exporter.webhook.admission import DEFAULT_PREFLIGHT_IMAGE, GPU_RESOURCE, WebhookConfig
from exporter.webhook.body import MAX_REVIEW_BYTES

log = logging.getLogger("exporter.webhook")

DEFAULT_LISTEN = "0.0.0.0:8443"
# What the API server can send (exporter/webhook/body.py says why); a tighter value is safe.
DEFAULT_MAX_BODY_BYTES = MAX_REVIEW_BYTES

SERVER_FLAGS = (
    Flag("--web.listen-address", DEFAULT_LISTEN, "address to listen on (HTTPS)", dest="listen_address"),
    Flag("--tls.cert-file", "", "TLS certificate (PEM); read again when it changes on disk", dest="tls_cert_file"),
    Flag("--tls.key-file", "", "TLS private key (PEM); read again when it changes on disk", dest="tls_key_file"),
    Flag(
        "--web.max-body-bytes",
        DEFAULT_MAX_BODY_BYTES,
        "largest request body accepted (413 beyond it)",
        dest="max_body_bytes",
        type=int,
    ),
    LOG_LEVEL,
    LOG_FORMAT,
)
MUTATION_FLAGS = (
    Flag(
        "--webhook.gpu-resources",
        GPU_RESOURCE,
        f"comma-separated resource names that mean a GPU ({GPU_RESOURCE} always counts)",
        dest="gpu_resources",
    ),
    Flag(
        "--webhook.nccl-debug-subsys",
        "INIT,NET",
        "NCCL_DEBUG_SUBSYS added with NCCL_DEBUG=INFO (INIT,NET holds every line the verdict reads)",
        dest="nccl_debug_subsys",
    ),
    Flag(
        "--webhook.nccl-debug-file-host-path",
        "",
        "host folder for NCCL_DEBUG_FILE, one folder per pod below it (the exporter's --path.nccl-debug-files); "
        "empty: NCCL's lines stay on the container's stdout",
        dest="nccl_debug_file_host_path",
    ),
    Flag(
        "--webhook.preflight-image",
        DEFAULT_PREFLIGHT_IMAGE,
        "image of the pre-flight init container",
        dest="preflight_image",
    ),
    Flag(
        "--webhook.preflight-args",
        "preflight",
        "arguments of the pre-flight init container, split as a shell would "
        '(e.g. "preflight --expect-link-layer=InfiniBand --expect-rate=400")',
        dest="preflight_args",
    ),
    Flag(
        "--webhook.preflight-results-host-path",
        "",
        "host folder the pre-flight also writes a result file to (the exporter's --path.probe-results, e.g. "
        f"{DEFAULT_PROBE_RESULTS}), through a hostPath volume that Pod Security baseline and restricted "
        "forbid; empty: no volume, the result reaches the exporter as the container's termination message",
        dest="preflight_results_host_path",
    ),
)


def webhook_config_from_args(args: argparse.Namespace) -> WebhookConfig:
    """The mutation settings from the flags; SystemExit with a clear message on bad ones."""
    try:
        preflight_args = tuple(shlex.split(str(args.preflight_args)))
    except ValueError as exc:
        raise SystemExit(f"ccl-exporter webhook: --webhook.preflight-args: {exc}") from exc
    if not preflight_args:
        raise SystemExit("ccl-exporter webhook: --webhook.preflight-args is empty")
    names = tuple(n.strip() for n in str(args.gpu_resources).split(",") if n.strip())
    return WebhookConfig(
        gpu_resources=names or (GPU_RESOURCE,),
        nccl_debug_subsys=str(args.nccl_debug_subsys),
        nccl_debug_file_host_path=str(args.nccl_debug_file_host_path),
        preflight_image=str(args.preflight_image),
        preflight_args=preflight_args,
        probe_results_host_path=str(args.preflight_results_host_path),
    )


def run_webhook(args: argparse.Namespace) -> int:
    """Check the flags, then serve until SIGTERM."""
    config = webhook_config_from_args(args)
    configure_logging(str(args.log_level), str(args.log_format))
    try:
        parse_listen_address(str(args.listen_address))
    except ValueError as exc:
        raise SystemExit(f"ccl-exporter webhook: --web.listen-address: {exc}") from exc
    if not args.tls_cert_file or not args.tls_key_file:
        raise SystemExit(
            "ccl-exporter webhook: --tls.cert-file and --tls.key-file are required "
            "(the API server calls webhooks over HTTPS only)"
        )
    if int(args.max_body_bytes) < 1024:
        raise SystemExit("ccl-exporter webhook: --web.max-body-bytes must be at least 1024")
    from exporter.webhook.serving import serve_forever

    return serve_forever(config, args)


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], environ: Mapping[str, str]
) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "webhook",
        help="mutating admission webhook: NCCL logging, the fabric readiness gate, the pre-flight init container",
        description=__doc__,
        formatter_class=EnvHelpFormatter,
    )
    server = parser.add_argument_group("server")
    for flag in SERVER_FLAGS:
        flag.add_to(server, environ)
    mutation = parser.add_argument_group("what GPU pods get")
    for flag in MUTATION_FLAGS:
        flag.add_to(mutation, environ)
    parser.set_defaults(handler=run_webhook)
    return parser

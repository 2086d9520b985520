"""``ccl-exporter serve``: the exporter, and the one composition root.

Flags follow node_exporter (``--web.listen-address``, ``--path.sysfs``,
``--collector.<name>`` / ``--no-collector.<name>``). Every flag can also be set by an
environment variable named after it: ``--path.sysfs`` is ``CCL_EXPORTER_PATH_SYSFS``,
``--collector.rdma`` is ``CCL_EXPORTER_COLLECTOR_RDMA`` (true/false); see ``exporter.flags``.

``ServeConfig`` is what the flags say; ``run_serve`` builds the node (``NodeProvider``: this host
unless a caller supplies another through ``ServedNode``), the collectors from their specs, and the
app, and serves until a signal ends it.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from exporter import __version__
from exporter.collectors import all_collectors
from exporter.collectors.base import Collector, CollectorSpec
from exporter.flags import (
    LOG_LEVEL,
    PROBE_RESULTS,
    SYSFS,
    EnvHelpFormatter,
    Flag,
    Switch,
    on_off_flag,
    parse_listen_address,
)
from exporter.http.exposition import DEFAULT_MAX_PAGE_BYTES, MIN_PAGE_BYTES
from exporter.logs import LOG_FORMAT, configure_logging
from exporter.resources import DEFAULT_NCCL_INSPECTOR, HostPaths, NodeResources, real_node_resources
from exporter.sources.podresources import DEFAULT_SOCKET

if TYPE_CHECKING:  # the server is loaded by ``serve`` only
    from exporter.http.connections import ConnectionLimits
    from exporter.http.endpoints import ExporterApp, StartupHook
    from exporter.http.webconfig import WebConfigSource

DEFAULT_PORT = 19400


@dataclass(frozen=True)
class ServeConfig:
    """What the ``serve`` flags say. ``paths`` are the flags' (a node supplied to ``serve`` brings its own)."""

    listen_address: str
    max_requests: int
    scrape_timeout_seconds: float
    paths: HostPaths
    node_name: str
    enabled_collectors: tuple[str, ...]
    log_level: str
    # collector name -> its settings (CollectorSpec.settings), for every collector, enabled or not
    collector_settings: Mapping[str, object]


log = logging.getLogger("exporter")

WEB_FLAGS = (
    Flag("--web.listen-address", f"0.0.0.0:{DEFAULT_PORT}", "address to listen on", dest="listen_address"),
    Flag(
        "--web.config.file",
        "",
        "exporter-toolkit web configuration file (TLS, client certificates, basic auth); re-read when it changes",
        dest="web_config_file",
    ),
    Flag(
        "--web.max-requests",
        4,
        "/metrics pages built at once, one per format and compression; requests that arrive while a page "
        "is built share the next one",
        dest="max_requests",
        type=int,
    ),
    Flag(
        "--web.max-connections",
        256,
        "open connections allowed (a TLS one holds ~256 KiB); a new one closes the least recently active "
        "idle one, or is refused when every one is busy",
        dest="max_connections",
        type=int,
    ),
    Flag(
        "--web.read-header-timeout",
        10.0,
        "seconds a new connection may take to send its first request headers (TLS handshake included)",
        dest="read_header_timeout",
        type=float,
    ),
    Flag(
        "--web.keepalive-timeout",
        45.0,
        "seconds an idle keep-alive connection stays open",
        dest="keepalive_timeout",
        type=float,
    ),
    Flag(
        "--web.write-timeout",
        10.0,
        "seconds a client may take to receive a response; one that does not read has its connection closed",
        dest="write_timeout",
        type=float,
    ),
    Flag(
        "--web.max-page-bytes",
        DEFAULT_MAX_PAGE_BYTES,
        "largest /metrics page (uncompressed); beyond it the largest families are left out",
        dest="max_page_bytes",
        type=int,
    ),
    Flag(
        "--scrape.timeout",
        10.0,
        "seconds a collector may take before it is reported failed",
        dest="scrape_timeout",
        type=float,
    ),
)
PATH_FLAGS = (
    SYSFS,
    Flag("--path.pod-logs", "/var/log/pods", "kubelet pod log folder (CRI format)", dest="pod_logs"),
    Flag("--path.nccl-debug-files", "/var/log/nccl", "folder of NCCL_DEBUG_FILE outputs", dest="nccl_debug_files"),
    Flag(
        "--path.state",
        "/var/lib/ccl-exporter",
        "writable folder for tail offsets and the collectors' last success times",
        dest="state",
    ),
    Flag("--path.pod-resources", str(DEFAULT_SOCKET), "kubelet pod-resources socket", dest="pod_resources"),
    # NCCL Inspector output (NCCL_INSPECTOR_DUMP_DIR): per-pod folders, as for NCCL debug files
    Flag(
        "--path.nccl-inspector",
        str(DEFAULT_NCCL_INSPECTOR),
        "folder of NCCL Inspector output (<namespace>_<pod>_<uid>/ per pod: JSON Lines and .prom files)",
        dest="nccl_inspector",
    ),
)
NODE_NAME = Flag(
    "--kube.node-name",
    "",
    "this node's name (downward API; also read from NODE_NAME)",
    dest="node_name",
    also_env="NODE_NAME",
)
DISABLE_DEFAULTS = Switch(
    "--collector.disable-defaults",
    "disable every collector not enabled explicitly with --collector.<name>",
    dest="disable_defaults",
)
MISC_FLAGS = (LOG_LEVEL, LOG_FORMAT)


def add_serve_arguments(
    parser: argparse.ArgumentParser, environ: Mapping[str, str], specs: Sequence[CollectorSpec]
) -> None:
    """serve's own flags, then one switch per collector and each collector's own flags."""
    web = parser.add_argument_group("web")
    for flag in WEB_FLAGS:
        flag.add_to(web, environ)
    paths = parser.add_argument_group("host paths (read-only, except --path.state)")
    for flag in PATH_FLAGS:
        flag.add_to(paths, environ)
    PROBE_RESULTS.add_to(paths, environ, help="folder where probe and preflight result files are written")
    NODE_NAME.add_to(parser.add_argument_group("kubernetes"), environ)

    collectors = parser.add_argument_group("collectors")
    DISABLE_DEFAULTS.add_to(collectors, environ)
    for spec in specs:
        on_off_flag(
            collectors,
            environ,
            f"--collector.{spec.name}",
            dest=f"collector_{spec.name}",
            help=f"{spec.help} (enabled by default: {'yes' if spec.default_enabled else 'no'})",
            default=spec.default_enabled,
        )
    for spec in specs:
        if spec.flags:
            group = parser.add_argument_group(spec.flag_group or f"collector {spec.name}")
            for own_flag in spec.flags:
                own_flag.add_to(group, environ)

    misc = parser.add_argument_group("misc")
    for flag in MISC_FLAGS:
        flag.add_to(misc, environ)


def config_from_args(args: argparse.Namespace, specs: Sequence[CollectorSpec]) -> ServeConfig:
    enabled = []
    for spec in specs:
        explicit = getattr(args, f"collector_{spec.name}")
        if explicit is None:
            on = spec.default_enabled and not args.disable_defaults
        else:
            on = explicit
        if on:
            enabled.append(spec.name)
    listen = str(args.listen_address)
    try:
        parse_listen_address(listen)
    except ValueError as exc:
        raise SystemExit(f"ccl-exporter: --web.listen-address: {exc}") from exc
    return ServeConfig(
        listen_address=listen,
        max_requests=int(args.max_requests),
        scrape_timeout_seconds=float(args.scrape_timeout),
        paths=HostPaths(
            sysfs=Path(args.sysfs),
            pod_logs=Path(args.pod_logs),
            nccl_debug_files=Path(args.nccl_debug_files),
            state=Path(args.state),
            pod_resources=Path(args.pod_resources),
            probe_results=Path(args.probe_results),
            nccl_inspector=Path(args.nccl_inspector),
        ),
        node_name=str(args.node_name),
        enabled_collectors=tuple(enabled),
        log_level=str(args.log_level),
        collector_settings={spec.name: spec.settings(args) for spec in specs},
    )


def _web_settings(args: argparse.Namespace) -> tuple[ConnectionLimits, int]:
    """(connection limits, largest page in bytes) from the --web.* flags; SystemExit when invalid."""
    from exporter.http.connections import ConnectionLimits

    if int(args.max_page_bytes) < MIN_PAGE_BYTES:
        raise SystemExit(f"ccl-exporter: --web.max-page-bytes must be at least {MIN_PAGE_BYTES}")
    try:
        limits = ConnectionLimits(
            max_connections=int(args.max_connections),
            read_header_timeout_seconds=float(args.read_header_timeout),
            keepalive_timeout_seconds=float(args.keepalive_timeout),
            write_timeout_seconds=float(args.write_timeout),
        )
    except ValueError as exc:
        raise SystemExit(f"ccl-exporter: --web.*: {exc}") from exc
    return limits, int(args.max_page_bytes)


def _web_config(args: argparse.Namespace) -> WebConfigSource | None:
    """The --web.config.file in force, or None; SystemExit with one line when it does not load."""
    if not args.web_config_file:
        return None
    from exporter.http.webconfig import WebConfigError, WebConfigSource

    try:
        return WebConfigSource.from_file(args.web_config_file)
    except WebConfigError as exc:
        raise SystemExit(f"ccl-exporter: --web.config.file {args.web_config_file}: {exc}") from None


@dataclass(frozen=True)
class ServedNode:
    """What ``serve`` runs on: the node's shared resources and, from whoever supplies them, what the
    server runs besides them. ``startup_hooks`` run for the server's lifetime (background tasks),
    before the resources' own watches start; ``add_routes`` adds endpoints to the app;
    ``collector_settings`` (collector name -> settings) stand in for what the flags gave those
    collectors. A real node has none of these: only its resources."""

    resources: NodeResources
    startup_hooks: Sequence[StartupHook] = ()
    add_routes: Callable[[ExporterApp], None] | None = None
    collector_settings: Mapping[str, object] = field(default_factory=dict)


# ``serve``'s node, from its configuration; entered for as long as the server runs.
NodeProvider = Callable[[ServeConfig], AbstractContextManager[ServedNode]]


@contextlib.contextmanager
def this_node(config: ServeConfig) -> Iterator[ServedNode]:
    """The node ``serve`` runs on: this host's files (``--path.*``), NVML, kubelet and API server."""
    nvml_collected = "nvml" in config.enabled_collectors  # --no-collector.nvml keeps NVML out of every series
    with real_node_resources(config.paths, config.node_name, nvml_collected=nvml_collected) as resources:
        yield ServedNode(resources)


def build_collectors(specs: Sequence[CollectorSpec], config: ServeConfig, resources: NodeResources) -> list[Collector]:
    """The enabled collectors, in exposition order, each from its settings and the node's resources."""
    return [
        spec.factory(config.collector_settings[spec.name], resources)
        for spec in specs
        if spec.name in config.enabled_collectors
    ]


def _watching(resources: NodeResources) -> StartupHook:
    """A startup hook: the shared resources start their watches (the pod list) with the server."""

    async def hook(app: object) -> AsyncIterator[None]:
        resources.start()
        yield

    return hook


def run_serve(args: argparse.Namespace, node_provider: NodeProvider = this_node) -> int:
    """The composition root: the node (``node_provider``: this host unless a caller supplies another),
    the collectors, the app."""
    from exporter.collectors.history import FILE_NAME as HISTORY_FILE
    from exporter.collectors.history import CollectorHistory
    from exporter.http.endpoints import create_app, run_server

    specs = all_collectors()
    config = config_from_args(args, specs)
    limits, max_page_bytes = _web_settings(args)
    web_config = _web_config(args)
    configure_logging(config.log_level, str(args.log_format))
    with node_provider(config) as node:
        if node.collector_settings:
            config = replace(config, collector_settings={**config.collector_settings, **node.collector_settings})
        resources = node.resources
        host, port = parse_listen_address(config.listen_address)
        app = create_app(
            build_collectors(specs, config, resources),
            max_requests=config.max_requests,
            max_page_bytes=max_page_bytes,
            scrape_timeout_seconds=config.scrape_timeout_seconds,
            startup_hooks=[*node.startup_hooks, _watching(resources)],
            collector_history=CollectorHistory(resources.paths.state / HISTORY_FILE),
        )
        if node.add_routes is not None:
            node.add_routes(app)
        log.info(
            "ccl-exporter %s listening on %s://%s:%d/metrics (collectors: %s)",
            __version__,
            "https" if web_config is not None and web_config.tls else "http",
            host,
            port,
            ", ".join(config.enabled_collectors) or "none",
        )
        try:
            run_server(app, host, port, limits, web_config)
        except OSError as exc:  # the address is taken or not this host's
            log.error("cannot listen on %s: %s", config.listen_address, exc.strerror or exc)
            return 1
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], environ: Mapping[str, str]) -> None:
    """``serve`` and its flags (the collectors' own among them)."""
    parser = sub.add_parser(
        "serve",
        help="run the exporter",
        description="Serve /metrics for this node. Every flag can also be set by its environment variable.",
        formatter_class=EnvHelpFormatter,
    )
    add_serve_arguments(parser, environ, all_collectors())
    parser.set_defaults(handler=run_serve)

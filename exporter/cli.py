"""``ccl-exporter``: serve | analyze | probe | preflight.

Flags follow node_exporter (``--web.listen-address``, ``--path.sysfs``,
``--collector.<name>`` / ``--no-collector.<name>``). Every flag can also be set by an
environment variable named after it: ``--path.sysfs`` is ``CCL_EXPORTER_PATH_SYSFS``,
``--collector.rdma`` is ``CCL_EXPORTER_COLLECTOR_RDMA`` (true/false).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from exporter import __version__, analyze
from exporter.collectors import all_collectors
from exporter.collectors.base import CollectorSpec
from exporter.collectors.probe import probe_settings
from exporter.config import DEFAULT_PORT, ServeConfig, env_name, parse_listen_address
from exporter.exposition import DEFAULT_MAX_PAGE_BYTES, MIN_PAGE_BYTES
from exporter.probe import command as probe_command
from exporter.probe import preflight

if TYPE_CHECKING:
    from exporter.server import ConnectionLimits

log = logging.getLogger("exporter")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _env_bool(environ: Mapping[str, str], flag: str, default: bool) -> bool:
    raw = environ.get(env_name(flag))
    if raw is None:
        return default
    if raw.strip().lower() in _TRUE:
        return True
    if raw.strip().lower() in _FALSE:
        return False
    raise SystemExit(f"ccl-exporter: {env_name(flag)}={raw!r} is not true/false")


class _EnvHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each flag's environment variable next to its default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = super()._get_help_string(action) or ""
        long_flags = [o for o in action.option_strings if o.startswith("--") and not o.startswith("--no-")]
        if long_flags and long_flags[0] not in ("--help", "--version"):
            text += f" [env {env_name(long_flags[0])}]"
        return text


def _add(group: argparse._ActionGroup, environ: Mapping[str, str], flag: str, default: object, help: str, **kw: object) -> None:
    value = environ.get(env_name(flag), default)
    group.add_argument(flag, default=value, help=help, **kw)  # type: ignore[arg-type]


def add_serve_arguments(parser: argparse.ArgumentParser, environ: Mapping[str, str], specs: Sequence[CollectorSpec]) -> None:
    web = parser.add_argument_group("web")
    _add(web, environ, "--web.listen-address", None,
         f"address to listen on (default 0.0.0.0:{DEFAULT_PORT}; 127.0.0.1:{DEFAULT_PORT} with --simulate)",
         dest="listen_address")
    _add(web, environ, "--web.max-requests", 4, "concurrent /metrics renders allowed", type=int, dest="max_requests")
    _add(web, environ, "--web.max-connections", 64,
         "open connections allowed; a new one closes the least recently active idle one, or is refused",
         type=int, dest="max_connections")
    _add(web, environ, "--web.read-header-timeout", 10.0,
         "seconds a connection may take to send its request headers", type=float, dest="read_header_timeout")
    _add(web, environ, "--web.keepalive-timeout", 45.0,
         "seconds an idle keep-alive connection stays open", type=float, dest="keepalive_timeout")
    _add(web, environ, "--web.max-page-bytes", DEFAULT_MAX_PAGE_BYTES,
         "largest /metrics page (uncompressed); beyond it the largest families are left out",
         type=int, dest="max_page_bytes")
    _add(web, environ, "--scrape.timeout", 10.0, "seconds a collector may take before it is reported failed",
         type=float, dest="scrape_timeout")

    paths = parser.add_argument_group("host paths (read-only, except --path.state)")
    _add(paths, environ, "--path.sysfs", "/sys", "sysfs mount point", dest="sysfs")
    _add(paths, environ, "--path.pod-logs", "/var/log/pods", "kubelet pod log folder (CRI format)", dest="pod_logs")
    _add(paths, environ, "--path.nccl-debug-files", "/var/log/nccl", "folder of NCCL_DEBUG_FILE outputs",
         dest="nccl_debug_files")
    _add(paths, environ, "--path.state", "/var/lib/ccl-exporter", "writable folder for tail offsets", dest="state")
    _add(paths, environ, "--path.pod-resources", "/var/lib/kubelet/pod-resources/kubelet.sock",
         "kubelet pod-resources socket", dest="pod_resources")
    _add(paths, environ, "--path.probe-results", "/var/lib/ccl-exporter/probe-results",
         "folder where probe and preflight result files are written", dest="probe_results")

    kube = parser.add_argument_group("kubernetes")
    _add(kube, environ, "--kube.node-name", environ.get("NODE_NAME", ""),
         "this node's name (downward API; also read from NODE_NAME)", dest="node_name")

    collectors = parser.add_argument_group("collectors")
    collectors.add_argument(
        "--collector.disable-defaults",
        action="store_true",
        default=_env_bool(environ, "--collector.disable-defaults", False),
        dest="disable_defaults",
        help="disable every collector not enabled explicitly with --collector.<name>",
    )
    for spec in specs:
        flag = f"--collector.{spec.name}"
        collectors.add_argument(
            flag,
            action=argparse.BooleanOptionalAction,
            default=None if env_name(flag) not in environ else _env_bool(environ, flag, spec.default_enabled),
            dest=f"collector_{spec.name}",
            help=f"{spec.help} (enabled by default: {'yes' if spec.default_enabled else 'no'})",
        )

    nccl = parser.add_argument_group("collector nccl")
    _add(nccl, environ, "--collector.nccl.grace-period", 300.0,
         "seconds the series of a pod whose logs are gone (or that left the node) stay exposed",
         type=float, dest="nccl_grace_period")
    _add(nccl, environ, "--collector.nccl.parser-memory-budget", 64 * 1024 * 1024,
         "bytes all streams' NCCL log analyzers may hold together; over it the largest forget their "
         "oldest communicators (their conclusions are kept)", type=int, dest="nccl_parser_memory_budget")
    probe = parser.add_argument_group("idle-time bus-bandwidth probes (collector probe)")
    _add(probe, environ, "--probe.interval", 0.0, "seconds between probes while the GPUs are idle; 0 = off",
         type=float, dest="probe_interval")
    _add(probe, environ, "--probe.timeout", 120.0, "seconds before a probe is killed", type=float, dest="probe_timeout")
    _add(probe, environ, "--probe.backend", "auto", "auto, nccl or gloo (gloo with --simulate)", dest="probe_backend",
         choices=["auto", "nccl", "gloo"])
    _add(probe, environ, "--probe.collectives", "all_reduce", "comma-separated collectives", dest="probe_collectives")
    _add(probe, environ, "--probe.min-bytes", "", "smallest size (default 1M; 64K with --simulate)", dest="probe_min_bytes")
    _add(probe, environ, "--probe.max-bytes", "", "largest size (default 64M; 1M with --simulate)", dest="probe_max_bytes")
    _add(probe, environ, "--probe.iters", 20, "timed iterations per size", type=int, dest="probe_iters")
    _add(probe, environ, "--probe.max-age", 86400.0, "seconds after which a result file is stale (ignored)",
         type=float, dest="probe_max_age")

    misc = parser.add_argument_group("misc")
    misc.add_argument("--simulate", action="store_true", default=_env_bool(environ, "--simulate", False),
                      help="run on a built-in simulated node (no GPU or NIC needed) in a temporary folder; "
                      "adds POST /-/sim/<action> (loopback clients only) to drive it, see exporter/sim/control.py")
    _add(misc, environ, "--simulate.seed", 7, "random seed of the simulated node (vary it across a simulated fleet)",
         type=int, dest="simulate_seed")
    _add(misc, environ, "--simulate.tick", 1.0, "seconds between updates of the simulated node",
         type=float, dest="simulate_tick")
    _add(misc, environ, "--simulate.job-ends-after", 0.0,
         "with --simulate: seconds after which the simulated training pod ends and frees its GPUs (0 = never)",
         type=float, dest="simulate_job_ends_after")
    _add(misc, environ, "--log.level", "info", "debug, info, warning or error", dest="log_level",
         choices=["debug", "info", "warning", "error"])


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
    listen = args.listen_address or (f"127.0.0.1:{DEFAULT_PORT}" if args.simulate else f"0.0.0.0:{DEFAULT_PORT}")
    try:
        parse_listen_address(listen)
    except ValueError as exc:
        raise SystemExit(f"ccl-exporter: --web.listen-address: {exc}") from exc
    config = ServeConfig(
        listen_address=listen,
        max_requests=int(args.max_requests),
        scrape_timeout_seconds=float(args.scrape_timeout),
        sysfs=Path(args.sysfs),
        pod_logs=Path(args.pod_logs),
        nccl_debug_files=Path(args.nccl_debug_files),
        state=Path(args.state),
        pod_resources=Path(args.pod_resources),
        probe_results=Path(args.probe_results),
        node_name=str(args.node_name),
        simulate=bool(args.simulate),
        enabled_collectors=tuple(enabled),
        log_level=str(args.log_level),
        nccl_grace_period_seconds=float(args.nccl_grace_period),
        nccl_parser_memory_budget_bytes=int(args.nccl_parser_memory_budget),
        probe_interval_seconds=float(args.probe_interval),
        probe_timeout_seconds=float(args.probe_timeout),
        probe_backend=str(args.probe_backend),
        probe_collectives=str(args.probe_collectives),
        probe_min_bytes=str(args.probe_min_bytes) or ("64K" if args.simulate else "1M"),
        probe_max_bytes=str(args.probe_max_bytes) or ("1M" if args.simulate else "64M"),
        probe_iters=int(args.probe_iters),
        probe_max_age_seconds=float(args.probe_max_age),
        simulate_job_ends_after_seconds=float(args.simulate_job_ends_after),
    )
    try:
        probe_settings(config)
    except ValueError as exc:
        raise SystemExit(f"ccl-exporter: --probe.*: {exc}") from exc
    return config


def build_parser(environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    environ = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(
        prog="ccl-exporter",
        description="Prometheus exporter for the health of GPU collective communication "
        "(NCCL transport, RDMA ports, NVLink, bus bandwidth).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    serve = sub.add_parser(
        "serve",
        help="run the exporter",
        description="Serve /metrics for this node. Every flag can also be set by its environment variable.",
        formatter_class=_EnvHelpFormatter,
    )
    add_serve_arguments(serve, environ, all_collectors())
    serve.set_defaults(handler=run_serve)
    # Other commands register themselves here, one line each: module.add_parser(sub, environ),
    # which sets ``handler`` (args -> exit code) on its subparser.
    analyze.add_parser(sub, environ)
    probe_command.add_parser(sub, environ)
    preflight.add_parser(sub, environ)
    return parser


def _simulation_hook(control: "SimControl", tick_seconds: float = 1.0) -> Callable[..., AsyncIterator[None]]:  # noqa: F821
    async def hook(app: object) -> AsyncIterator[None]:
        async def ticker() -> None:
            while True:
                await asyncio.sleep(tick_seconds)
                await asyncio.to_thread(control.advance, tick_seconds)

        task = asyncio.create_task(ticker(), name="simulated-node")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return hook


def _web_settings(args: argparse.Namespace) -> tuple[ConnectionLimits, int]:
    """(connection limits, largest page in bytes) from the --web.* flags; SystemExit when invalid."""
    from exporter.server import ConnectionLimits

    if int(args.max_page_bytes) < MIN_PAGE_BYTES:
        raise SystemExit(f"ccl-exporter: --web.max-page-bytes must be at least {MIN_PAGE_BYTES}")
    try:
        limits = ConnectionLimits(
            max_connections=int(args.max_connections),
            read_header_timeout_seconds=float(args.read_header_timeout),
            keepalive_timeout_seconds=float(args.keepalive_timeout),
        )
    except ValueError as exc:
        raise SystemExit(f"ccl-exporter: --web.*: {exc}") from exc
    return limits, int(args.max_page_bytes)


def run_serve(args: argparse.Namespace) -> int:
    from exporter.server import create_app, run_server

    specs = all_collectors()
    config = config_from_args(args, specs)
    limits, max_page_bytes = _web_settings(args)
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    hooks = []
    sim_root: Path | None = None
    control = None
    if config.simulate:
        from exporter.sim.control import SimControl
        from exporter.sim.node import default_node

        sim_root = Path(tempfile.mkdtemp(prefix="ccl-exporter-sim-"))
        node = default_node(sim_root, seed=int(args.simulate_seed),
                            job_ends_after_seconds=config.simulate_job_ends_after_seconds)
        node.setup()
        node.advance(1.0)
        config.sysfs = node.sysfs
        config.pod_logs = sim_root / "pods"
        config.nccl_debug_files = sim_root / "nccl"
        config.state = sim_root / "state"
        config.pod_resources = sim_root / "pod-resources" / "kubelet.sock"
        config.probe_results = sim_root / "probe-results"
        config.extra["simulated_node"] = node
        control = SimControl(node)
        hooks.append(_simulation_hook(control, max(0.1, float(args.simulate_tick))))
        log.info("simulated node in %s", sim_root)

    by_name = {spec.name: spec for spec in specs}
    collectors = [by_name[name].factory(config) for name in config.enabled_collectors]
    host, port = parse_listen_address(config.listen_address)
    app = create_app(
        collectors,
        max_requests=config.max_requests,
        max_page_bytes=max_page_bytes,
        scrape_timeout_seconds=config.scrape_timeout_seconds,
        startup_hooks=hooks,
    )
    if control is not None:
        from exporter.sim.control import add_control_routes

        add_control_routes(app, control)
    log.info("ccl-exporter %s listening on http://%s:%d/metrics (collectors: %s)",
             __version__, host, port, ", ".join(config.enabled_collectors) or "none")
    try:
        run_server(app, host, port, limits)
    except OSError as exc:  # the address is taken or not this host's
        log.error("cannot listen on %s: %s", config.listen_address, exc.strerror or exc)
        return 1
    finally:
        if sim_root is not None:
            node.close()
            shutil.rmtree(sim_root, ignore_errors=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

"""``python -m ccl_sim serve``: ``ccl-exporter serve`` on the simulated node.

The same ``serve`` code (``exporter.commands.serve.run_serve``) with every one of its flags, handed the
simulated node through its one seam (``exporter.commands.serve.ServedNode``): the node's resources
(``ccl_sim.resources``), a ticker that advances it while the server runs, the control routes
``POST /-/sim/<action>`` (``ccl_sim.control``), and the collector settings that point at the
node's own stand-ins (its kubelet; probe results not bound to its pod list). The node is laid out
in a new temporary folder and removed on exit. Three flags of its own: ``--seed``, ``--tick``,
``--job-ends-after``.

What differs from ``ccl-exporter serve`` by default: it listens on 127.0.0.1:19400 (loopback),
and idle-time probes (``--probe.interval``) run gloo over 64K..1M (no GPU here).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace

from ccl_sim.control import SimControl, add_control_routes, ticker_hook
from ccl_sim.resources import simulated_node_resources, temporary_simulated_node
from exporter.collectors import all_collectors
from exporter.collectors.probe import ProbeCollectorSettings
from exporter.commands.serve import DEFAULT_PORT, NodeProvider, ServeConfig, ServedNode, add_serve_arguments, run_serve
from exporter.flags import EnvHelpFormatter, Flag, env_name
from exporter.sources.kubelet_stats import KubeletStatsSettings

log = logging.getLogger("ccl_sim")

MIN_TICK_SECONDS = 0.1
# The simulated node's own flags, beside every flag of serve (each with its environment variable).
NODE_FLAGS = (
    Flag("--seed", 7, "random seed of the node (vary it across a fleet)", dest="seed", type=int),
    Flag("--tick", 1.0, "seconds between updates of the node", dest="tick", type=float),
    Flag(
        "--job-ends-after",
        0.0,
        "seconds after which the training pod ends and frees its GPUs (0 = never)",
        dest="job_ends_after",
        type=float,
    ),
)


def simulated_node(seed: int, tick_seconds: float = 1.0, job_ends_after_seconds: float = 0.0) -> NodeProvider:
    """``serve``'s node: a new simulated node (random seed ``seed``) advanced every ``tick_seconds``
    while the server runs; its training pod ends after ``job_ends_after_seconds`` (0: never)."""

    @contextlib.contextmanager
    def provide(config: ServeConfig) -> Iterator[ServedNode]:
        nvml_collected = "nvml" in config.enabled_collectors
        with (
            temporary_simulated_node(seed, job_ends_after_seconds) as node,
            simulated_node_resources(node, nvml_collected=nvml_collected) as resources,
        ):
            control = SimControl(node)
            log.info("simulated node in %s", node.root)
            yield ServedNode(
                resources,
                startup_hooks=[ticker_hook(control, max(MIN_TICK_SECONDS, tick_seconds))],
                add_routes=lambda app: add_control_routes(app, control),
                collector_settings=simulated_collector_settings(config, node.kubelet.url if node.kubelet else ""),
            )

    return provide


def simulated_collector_settings(config: ServeConfig, kubelet_url: str) -> dict[str, object]:
    """The settings the simulated node gives in place of the flags': the podnetwork collector reads
    the node's kubelet stand-in (no token, plain HTTP), and probe results are used as they say (the
    node's pod list holds its training pods only, not the pods its result files name)."""
    settings: dict[str, object] = {}
    if kubelet_url:
        settings["podnetwork"] = KubeletStatsSettings(url=kubelet_url, token_file="", ca_file="")
    probe = config.collector_settings.get("probe")
    if isinstance(probe, ProbeCollectorSettings):
        settings["probe"] = replace(probe, bind_results_to_node_pods=False)
    return settings


def with_simulated_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with what the simulated node takes when the flags leave it open: small gloo probes
    (there is no GPU). Its listen address defaults to loopback in ``build_parser``."""
    args.probe_backend = "gloo"
    args.probe_min_bytes = args.probe_min_bytes or "64K"
    args.probe_max_bytes = args.probe_max_bytes or "1M"
    return args


def build_parser(environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    environ = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(
        prog="python -m ccl_sim",
        description="A simulated GPU node for development: no GPU or NIC needed.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    serve = sub.add_parser(
        "serve",
        help="ccl-exporter serve on a simulated node",
        description="ccl-exporter serve, every flag of it, on a simulated node laid out in a temporary folder; "
        f"listens on 127.0.0.1:{DEFAULT_PORT} unless --web.listen-address says otherwise. Adds GET /-/sim and "
        "POST /-/sim/<action> (loopback clients only) to drive the node, see sim/ccl_sim/control.py.",
        formatter_class=EnvHelpFormatter,
    )
    add_serve_arguments(serve, environ, all_collectors())
    if env_name("--web.listen-address") not in environ:  # loopback unless told otherwise
        serve.set_defaults(listen_address=f"127.0.0.1:{DEFAULT_PORT}")
    node = serve.add_argument_group("simulated node")
    for flag in NODE_FLAGS:
        flag.add_to(node, environ)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = with_simulated_defaults(build_parser().parse_args(argv))
    return run_serve(args, simulated_node(int(args.seed), float(args.tick), float(args.job_ends_after)))


if __name__ == "__main__":
    sys.exit(main())

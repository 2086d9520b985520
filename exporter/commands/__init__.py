"""The ``ccl-exporter`` command (and ``python -m exporter``): one module here per subcommand, each
owning its flags and registering itself with ``add_parser(sub, environ)``, which sets the
``handler`` (args -> exit code) of its subparser.

* ``serve`` (``serve.py``): the exporter, and the one composition root;
* ``analyze`` (``analyze.py``, its HTML page ``analyze_report.py``): offline verdicts on NCCL logs;
* ``probe`` (``probe.py``): the bus-bandwidth probe;
* ``preflight`` (``preflight.py``): a training pod's init-container check of its fabric;
* ``webhook`` (``webhook.py``): the admission webhook that injects the pre-flight;
* ``prepare-results`` (``prepare_results.py``): makes the node's probe-results folder writable.

``analyze`` starts without loading the code of the others (collectors, client libraries, the HTTP
server: a tenth of a second), since it is run by hand on large logs where start-up shows; nothing
but the standard library is imported here before a command is chosen.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence


def build_parser(environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """Every subcommand with its flags; each flag's environment variable read from ``environ``."""
    from exporter import __version__
    from exporter.commands import analyze, preflight, prepare_results, probe, serve, webhook

    environ = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(
        prog="ccl-exporter",
        description="Prometheus exporter for the health of GPU collective communication "
        "(NCCL transport, RDMA ports, NVLink, bus bandwidth).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in (serve, analyze, probe, preflight, webhook, prepare_results):
        command.add_parser(sub, environ)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["analyze"]:
        from exporter.commands.analyze import standalone_main

        return standalone_main(args[1:])
    parsed = build_parser().parse_args(args)
    return int(parsed.handler(parsed) or 0)

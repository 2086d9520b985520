"""``make demo``: the exporter on the built-in simulated node, and where to look."""

from __future__ import annotations

import sys

from exporter.cli import main as cli_main


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    print(
        "ccl-health-exporter demo: serving a simulated GPU node (8 x NDR InfiniBand, 2 x RoCE).\n"
        "  metrics:      http://127.0.0.1:9400/metrics\n"
        "  landing page: http://127.0.0.1:9400/\n"
        "  try:          curl -s 127.0.0.1:9400/metrics | grep ^ccl_rdma_port_transmit_bytes_total\n"
        "Ctrl-C stops it.",
        flush=True,
    )
    return cli_main(["serve", "--simulate", *args])


if __name__ == "__main__":
    raise SystemExit(main())

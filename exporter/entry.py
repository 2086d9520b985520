"""The ``ccl-exporter`` command (and ``python -m exporter``): ``analyze`` starts without loading
the code of ``serve`` (collectors, client libraries, the HTTP server: a tenth of a second), since
it is run by hand on large logs where start-up shows; every other command goes through
``exporter.cli``."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["analyze"]:
        from exporter.analyze import standalone_main

        return standalone_main(args[1:])
    from exporter.cli import main as cli_main

    return cli_main(args)

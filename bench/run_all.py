"""``make bench``: run every benchmark in bench/ and rewrite docs/benchmarks.md with the results.

Every ``bench/<name>.py`` that defines ``run()`` is a benchmark (``run() -> BenchResult``,
measuring us against a peer in the same run). Each result replaces the section of
docs/benchmarks.md with the same ``## <title>``; sections whose benchmark was skipped (its
peer is not installed) or failed keep their previous text, with a note saying so. The text
above the first section is kept (a new file gets ``HEADER``).

    python -m bench.run_all [--only NAME ...] [--skip NAME ...] [--list]
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import re
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import bench
from bench.common import BenchResult

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
HEADER = """# Benchmarks

Each section is written by `make bench` (`python -m bench.run_all`) from a benchmark in
`bench/` that measures ccl-health-exporter against a peer in the same run and states the
ratio. The command under each heading reruns that benchmark alone. Numbers are from the
machine `make bench` last ran on (a 2-core CI-class machine unless a section says otherwise).
"""
# What a benchmark raises when its peer or a tool it needs is not installed: skipped, not failed.
PEER_MISSING = (FileNotFoundError, ModuleNotFoundError)


@dataclass
class Outcome:
    name: str
    result: BenchResult | None = None
    skipped: str = ""
    failed: str = ""
    seconds: float = 0.0


def discover() -> dict[str, Callable[[], BenchResult]]:
    """Every module in bench/ with a ``run`` function, by module name."""
    found: dict[str, Callable[[], BenchResult]] = {}
    for info in sorted(pkgutil.iter_modules(bench.__path__), key=lambda i: i.name):
        if info.name in ("run_all", "common") or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"bench.{info.name}")
        run = getattr(module, "run", None)
        if callable(run):
            found[info.name] = run
    return found


def run_one(name: str, run: Callable[[], BenchResult]) -> Outcome:
    started = time.monotonic()
    outcome = Outcome(name)
    try:
        outcome.result = run()
    except PEER_MISSING as exc:
        outcome.skipped = str(exc)
    except Exception as exc:  # noqa: BLE001 - one broken benchmark must not lose the others' results
        outcome.failed = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    outcome.seconds = time.monotonic() - started
    return outcome


def split_sections(text: str) -> tuple[str, list[tuple[str, str]]]:
    """(text before the first ``## ``, [(title, whole section text)])."""
    parts = re.split(r"(?m)^(?=## )", text)
    head, sections = parts[0], []
    for part in parts[1:]:
        title = part.splitlines()[0][3:].strip()
        sections.append((title, part.rstrip() + "\n"))
    return head, sections


def _unfresh(section: str, why: str) -> str:
    lines = section.rstrip().splitlines()
    lines = [line for line in lines if not line.startswith("> Not re-run by the last `make bench`")]
    lines.insert(1, f"\n> Not re-run by the last `make bench`: {why}. The numbers below are from an earlier run.")
    return "\n".join(lines) + "\n"


def render(previous: str, outcomes: list[Outcome]) -> str:
    head, sections = split_sections(previous)
    fresh = {o.result.title: o.result.section() for o in outcomes if o.result is not None}
    stale = {
        o.name: (o.skipped and f"skipped ({o.skipped})") or f"failed ({o.failed})" for o in outcomes if o.result is None
    }
    out: list[str] = []
    seen: set[str] = set()
    for title, text in sections:
        if title in fresh:
            out.append(fresh[title])
            seen.add(title)
            continue
        owner = next((name for name in stale if f"python -m bench.{name}" in text), None)
        out.append(_unfresh(text, stale[owner]) if owner else text)
    out += [text for title, text in fresh.items() if title not in seen]
    return (
        (head.rstrip() + "\n" if head.strip() else HEADER)
        + "\n"
        + "\n".join(section.rstrip() + "\n" for section in out)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=[], metavar="NAME", help="run only these benchmarks")
    parser.add_argument("--skip", action="append", default=[], metavar="NAME", help="do not run these")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument("--output", type=Path, default=DOC, help="the markdown file to rewrite")
    args = parser.parse_args(argv)
    benchmarks = discover()
    if args.list:
        print("\n".join(benchmarks))
        return 0
    unknown = [n for n in args.only + args.skip if n not in benchmarks]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; have {', '.join(benchmarks)}")
    chosen = [n for n in benchmarks if (not args.only or n in args.only) and n not in args.skip]
    outcomes = []
    for name in chosen:
        print(f"== bench.{name}", flush=True)
        outcome = run_one(name, benchmarks[name])
        if outcome.result is not None:
            print(f"   {outcome.result.summary} ({outcome.seconds:.0f} s)", flush=True)
        else:
            print(f"   {'SKIPPED' if outcome.skipped else 'FAILED'}: {outcome.skipped or outcome.failed}", flush=True)
        outcomes.append(outcome)
    previous = args.output.read_text() if args.output.exists() else ""
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(render(previous, outcomes))
    print(f"wrote {args.output}")
    return 1 if any(o.failed for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())

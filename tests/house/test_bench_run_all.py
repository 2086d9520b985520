"""``make bench``'s driver: discovery and how docs/benchmarks.md is rewritten."""

from __future__ import annotations

from pathlib import Path

from bench.common import BenchResult
from bench.run_all import HEADER, Outcome, discover, main, render


def _result(title: str, name: str, number: str) -> BenchResult:
    return BenchResult(title, f"python -m bench.{name}", "a peer", 2.0, f"headline {number}", f"| x | {number} |")


PREVIOUS = """# Benchmarks

old header

## Scrape latency

Command: `python -m bench.scrape_latency`

| x | 1 |

## Log ingest vs grep

Command: `python -m bench.log_ingest`

| x | 5 |

## Hand-written notes

kept as is
"""


def test_fresh_results_replace_their_sections_and_skipped_ones_keep_old_numbers_with_a_note() -> None:
    outcomes = [
        Outcome("scrape_latency", result=_result("Scrape latency", "scrape_latency", "9")),
        Outcome("log_ingest", skipped="grep not installed"),
        Outcome("fleet", result=_result("Simulated fleet", "fleet", "32")),
    ]
    text = render(PREVIOUS, outcomes)
    assert text.startswith("# Benchmarks\n\nold header\n"), "the text above the sections is kept"
    assert render("", outcomes[:1]).startswith(HEADER), "a new file gets the standard header"
    assert "| x | 9 |" in text and "| x | 1 |" not in text
    assert "| x | 5 |" in text and "Not re-run by the last `make bench`: skipped (grep not installed)" in text
    assert "kept as is" in text
    assert text.index("## Scrape latency") < text.index("## Log ingest") < text.index("## Simulated fleet")
    again = render(text, [Outcome("log_ingest", failed="boom")])
    assert again.count("Not re-run") == 1 and "failed (boom)" in again


def test_discover_finds_benchmarks_and_not_helpers() -> None:
    found = discover()
    assert {"fleet", "rest_usage"} <= set(found)
    assert not {"proc", "common", "run_all"} & set(found)


def test_unknown_benchmark_names_are_refused(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    import pytest

    with pytest.raises(SystemExit):
        main(["--only", "no_such_bench", "--output", str(tmp_path / "b.md")])
    assert "unknown benchmark" in capsys.readouterr().err
    assert not (tmp_path / "b.md").exists()

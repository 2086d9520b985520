"""What must not change a verdict, on every log of the corpus: a wrapper around each line (quoted in a
reply, coloured, time-stamped, indented), and the names the hosts happen to have.

A rule that only holds for the shapes it was written on breaks here first.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.nccl.conftest import FIXTURES, analyze_text

CORPUS_LOGS = sorted((FIXTURES / "public").glob("*.log")) + sorted((FIXTURES / "synthetic").glob("*.log"))

WRAPPERS: dict[str, Callable[[str], str]] = {
    "markdown quote": lambda line: "> " + line,
    "a reply quoting a quote": lambda line: "> > " + line,
    "colour codes": lambda line: "\x1b[32m" + line + "\x1b[0m",
    "colour codes without their ESC byte": lambda line: "[0m[32m" + line + "[0m",
    "ISO timestamp": lambda line: "2024-05-01T10:00:00.123456Z " + line,
    "indentation": lambda line: "    " + line,
    "CRLF line ends": lambda line: line + "\r",
    "CRI stream and tag": lambda line: "2024-05-01T10:00:00.123456789Z stdout F " + line,
}
_PREFIX_HOST = re.compile(r"(?<![\w.-])([A-Za-z][\w.-]{0,60}):\d{1,10}:\d{1,10} \[")


def _verdict(lines: list[str]) -> tuple[str, bool | None]:
    verdict = analyze_text("\n".join(lines)).result()
    return verdict.verdict, verdict.inter_node_tcp


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8", errors="replace").splitlines()


@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
def test_a_wrapper_around_every_line_changes_no_verdict(wrapper: str) -> None:
    wrap = WRAPPERS[wrapper]
    changed = []
    for path in CORPUS_LOGS:
        lines = _lines(path)
        before, after = _verdict(lines), _verdict([wrap(line) for line in lines])
        if before != after:
            changed.append(f"{path.parent.name}/{path.name}: {before} -> {after}")
    assert not changed, "\n".join(changed)


def test_renaming_the_hosts_changes_no_verdict() -> None:
    """Every hostname replaced, consistently, by a made-up one (also where interleaved writers glue
    a record's tail to it): only equal and different names may matter."""
    changed = []
    for path in CORPUS_LOGS:
        text = path.read_text(encoding="utf-8", errors="replace")
        found = {m.group(1) for m in _PREFIX_HOST.finditer(text)}
        # A name that ends with another is that host behind a glued writer's tail ("STAnode-1").
        hosts = sorted(h for h in found if not any(h != other and h.endswith(other) for other in found))
        names = {host: f"renamed{n}x" for n, host in enumerate(hosts)}
        renamed = text
        for host, name in sorted(names.items(), key=lambda item: -len(item[0])):
            in_prefix = re.escape(host) + r"(?=:\d{1,10}:\d{1,10} \[)"  # also behind a glued tail
            renamed = re.sub(r"(?<![A-Za-z.-])" + re.escape(host) + r"(?![\w-])|" + in_prefix, name, renamed)
        before, after = _verdict(text.splitlines()), _verdict(renamed.splitlines())
        if before != after:
            changed.append(f"{path.parent.name}/{path.name}: {before} -> {after}")
    assert not changed, "\n".join(changed)

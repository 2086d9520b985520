"""How well ``ccl-exporter analyze`` tells a TCP fallback from the log alone, on the labelled corpus,
per NCCL version range, against the check an SRE would grep for; and whether the rules generalise.

Each log of ``tests/fixtures/nccl/{public,synthetic}`` (labels in ``labels.json``, rules in
``CORPUS.md``) is read by the real ``analyze`` code. Reported per NCCL version range: TCP
fallbacks caught, false alarms (a fallback claimed where the label says otherwise), ``inter_node_tcp``
right on the logs whose answer is knowable, and the share answered "cannot tell" (``unknown``, exit
4). The peer is the usual grep: a fallback when the log holds ``via NET/Socket`` or ``Using network
Socket``, healthy otherwise (it has no "cannot tell").

The second table splits the public logs into the part the rules were written with and the
held-out part (``public/holdout.json``: 30 % of the threads, chosen once by hash, that no
rule-writing change looks at). A rule that only helps the logs it was written for scores higher
on the first than on the second; the goal is a gap of at most 3 points.

    python -m bench.detection_corpus
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.common import BenchResult
from devtools.corpus import Case, cases
from exporter.commands.analyze import feed_file
from exporter.nccl import LogAnalyzer

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


HELD_OUT = "public, held out"
RULES_PART = "public, rules written with"
MAX_GAP_POINTS = 3.0


def tally(
    corpus: list[Case], judge: Callable[[Path], tuple[str, bool | None]]
) -> tuple[dict[str, Tally], dict[str, Tally]]:
    """The tallies by kind and NCCL version range, and of the public logs by part (held out or not)."""
    by_version: dict[str, Tally] = {}
    by_part: dict[str, Tally] = {RULES_PART: Tally(), HELD_OUT: Tally()}
    for case in corpus:
        verdict, inter_node_tcp = judge(case.path)
        for key in (f"{case.kind}: {version_range(case.label['nccl_version'])}", f"{case.kind}: all", "all"):
            by_version.setdefault(key, Tally()).add(case.label, verdict, inter_node_tcp)
        if case.kind == "public":
            by_part[HELD_OUT if case.held_out else RULES_PART].add(case.label, verdict, inter_node_tcp)
    return by_version, by_part


def _row(key: str, m: Tally, p: Tally) -> str:
    return (
        f"| {key} | {m.logs} | {m.caught}/{m.fallbacks} | {m.false_alarms} | {m.right}/{m.knowable} "
        f"({m.accuracy():.0%}) | {m.cannot_tell} ({m.cannot_tell / m.logs:.0%}) | {p.caught}/{p.fallbacks} | "
        f"{p.false_alarms} | {p.right}/{p.knowable} ({p.accuracy():.0%}) |"
    )


def _order(key: str) -> tuple[int, int]:
    names = [NO_VERSION] + [name for name, _, _ in RANGES] + ["all"]
    kind = 2 if key == "all" else (0 if key.startswith("public") else 1)
    return kind, names.index(key.split(": ")[-1]) if key != "all" else 0


def run() -> BenchResult:
    corpus = cases()
    (mine, mine_parts), (peer, peer_parts) = tally(corpus, ours), tally(corpus, grep_peer)
    header = [
        "| logs | n | fallbacks caught | false alarms | `inter_node_tcp` right (knowable) | cannot tell | "
        "grep: caught | grep: false alarms | grep: right |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    rows = header + [_row(key, mine[key], peer[key]) for key in sorted(mine, key=_order)]
    split = header + [_row(key, mine_parts[key], peer_parts[key]) for key in (RULES_PART, HELD_OUT)]
    public, total, grep_total = mine["public: all"], mine["all"], peer["all"]
    held, rest = mine_parts[HELD_OUT], mine_parts[RULES_PART]
    gap = 100 * (rest.accuracy() - held.accuracy())
    summary = (
        f"Real public logs: {public.caught}/{public.fallbacks} TCP fallbacks caught, {public.false_alarms} false "
        f"alarms, inter_node_tcp right on {public.accuracy():.0%} of the {public.knowable} knowable logs, "
        f'{public.cannot_tell} of {public.logs} answered "cannot tell"; the grep peer: '
        f"{peer['public: all'].caught}/{peer['public: all'].fallbacks} caught, "
        f"{peer['public: all'].false_alarms} false alarms, {peer['public: all'].accuracy():.0%} right. "
        f"Held-out part: {held.right}/{held.knowable} ({held.accuracy():.0%}) right against "
        f"{rest.right}/{rest.knowable} ({rest.accuracy():.0%}) on the part the rules were written with, "
        f"a gap of {gap:.1f} points (goal: at most {MAX_GAP_POINTS:.0f})."
    )
    notes = [
        "",
        "`public` logs are verbatim excerpts of real runs (bug reports, saved logs); `synthetic` ones are "
        "written from NCCL's and the plugins' format strings for shapes no public report shows (aws-ofi-nccl on "
        "TCP providers in each of its three wordings, TCPX/FasTrak known only by their own lines, loopback "
        "sockets, ncclCommInitAll, launcher wrappers, one process driving every rank). A version range is the "
        "`NCCL version` the log prints.",
        "",
        "### Generalisation: the held-out part",
        "",
        "The public logs split by thread: 30 % of the threads, chosen once by the SHA-256 of the thread key "
        "(`tests/fixtures/nccl/public/holdout.json`), are held out of every change that writes a rule; the "
        "rules are written with the rest and the synthetic logs, and stated with the NCCL source they rest on "
        "in `tests/fixtures/nccl/CORPUS.md`. The held-out logs are scored, never read, while rules change.",
        "",
        *split,
        "",
        "Logs outside every corpus here: 48 excerpts from 48 public threads that neither this corpus nor the "
        "reviewed sets hold, labelled by an independent reader from the excerpt alone (not committed: they are "
        "others' logs). On first contact the analyzer of the placement change got 36 of 43 knowable logs right "
        "(84 %), caught 11 of 14 fallbacks and called one 'cannot tell' log a fallback; the rules then added from "
        "NCCL's source (2.4's NIC distance line, Socket's data path, ncclCommInitAll's name, 2.1-2.2 formats, "
        "hosts that only warn, single-rank processes) give 43/43 and 14/14. The remaining disagreement is a "
        "label: two ranks on NVML index 0, which the one-GPU rule places on two nodes.",
        "",
        "A second such set, 40 excerpts from 40 more threads, collected and labelled after those rules were "
        "written: on first contact 32 of 35 knowable logs right (91 %), 8 of 8 fallbacks caught, 1 false alarm "
        "(the analyzer before this work: 29 of 35, 6 of 8, 1 false alarm). The false alarm was a hostname torn by "
        "interleaved writers; with that and aws-ofi-nccl's start line read as NCCL prints them, 33 of 35, 8 of 8, "
        "no false alarm; the two left are disputed labels.",
        "",
        "A third set, 31 excerpts from forums, pages and repositories' saved logs (sources in no set before), "
        "collected after that: on first contact 26 of 30 knowable logs right (87 %), 11 of 12 fallbacks caught, "
        "no false alarm (before this work: 24 of 30, 9 of 12). The misses were evidence NCCL prints and the reader "
        "skipped (a process printing 'Using network' once per GPU it initialises, NET/IB's collective-mismatch "
        "line, hosts known only by lines like cudaDriverVersion, NCCL 2.1's queue-pair line); read now: 30/30, "
        "12/12.",
        "",
        "A fourth set, 29 excerpts (sources in no set before): on first contact 22 of 25 knowable logs right "
        "(88 %), 5 of 5 fallbacks caught, no false alarm. The misses were RDMA networks left unknown: a network "
        "name in no table whose connection lines say /GDRDMA, aws-ofi-nccl's platform line, HPC-X's ib_plugin.c "
        "completion warnings; read now: 25/25.",
        "",
        "A fifth set, 33 excerpts (sources in no set before; RCCL and Soft-RoCE among them): on first contact 25 "
        "of 27 knowable logs right (93 %), 8 of 8 fallbacks caught, no false alarm. One miss was HPC-X's plugin "
        "naming its network in its init ('P2P plugin IBext'), read now; the other is a one-process nccl-tests "
        "run whose communicator size only its command line shows, still 'cannot tell': 26/27. Every fallback "
        "has been caught on first contact in the last three sets, without a false alarm; the 95 % of the issue "
        "is not yet shown on first contact (87 %, 88 %, 93 %).",
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

"""The exporter reaches the conclusions ``analyze`` reaches, on every log of the labelled corpus.

Each corpus log becomes one pod's CRI log on a node (``<root>/<ns>_<pod>_<uid>/<container>/0.log``),
read by the real tailer and the NCCL collector. The tailer hands the analyzer the lines that carry
``NCCL`` (its needle); on those lines the pod's ``ccl_nccl_verdict`` state must be what ``analyze``
says. On the whole log ``analyze`` may know more (an nccl-tests device table, NCCL 2.2's lines
without the word, a launcher's rank lines): the exporter may then only say less, "cannot tell",
never another answer. The node adds nothing here (no GPU inventory): what the node knows is
tested in tests/collectors/test_nccl_verdicts.py.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from devtools.corpus import cases
from exporter.collectors.nccl import NcclCollector
from exporter.nccl import LogAnalyzer
from exporter.sources.podlogs import PodLogTailer

STAMP = "2026-03-01T10:00:00.123456789Z"


def _verdict(lines: list[str]) -> tuple[str, bool | None]:
    analyzer = LogAnalyzer()
    for line in lines:
        analyzer.feed(line)
    verdict = analyzer.result()
    return verdict.verdict, verdict.inter_node_tcp


def test_every_corpus_log_gets_the_same_verdict_from_the_exporter(tmp_path: Path) -> None:
    corpus = cases()
    pods: dict[str, tuple[str, list[str]]] = {}  # pod -> (what a failure may name it, its lines)
    for n, case in enumerate(corpus):
        pod = f"corpus-{n}"
        folder = tmp_path / "pods" / f"parity_{pod}_{uuid.uuid5(uuid.NAMESPACE_URL, case.key)}" / "trainer"
        folder.mkdir(parents=True)
        lines = case.path.read_text(encoding="utf-8", errors="replace").splitlines()
        (folder / "0.log").write_text("".join(f"{STAMP} stdout F {line}\n" for line in lines))
        # A failure names no held-out log: its lines must not invite a rule written for them.
        pods[pod] = ("a held-out public log" if case.held_out else case.key, lines)
    collector = NcclCollector(PodLogTailer(tmp_path / "pods", tmp_path / "nccl", tmp_path / "state"), tmp_path / "sys")
    for _ in range(10):
        snapshot = collector.step()
    reports = {report.pod: report for report in snapshot.pods}
    differ, said_more = [], []
    for pod, (name, lines) in pods.items():
        report = reports.get(pod)
        exporter = report.verdict if report is not None else "unknown"
        handed_over = _verdict([line for line in lines if "NCCL" in line])
        if exporter != handed_over[0]:
            differ.append(f"{name}: exporter {exporter}, analyze on its lines {handed_over[0]}")
        whole = _verdict(lines)
        if exporter not in (whole[0], "unknown"):
            said_more.append(f"{name}: exporter {exporter}, analyze on the whole log {whole[0]}")
    assert len(pods) == len(corpus) > 150
    assert not differ, "\n".join(differ)
    assert not said_more, "\n".join(said_more)

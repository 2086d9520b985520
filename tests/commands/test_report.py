"""``ccl-exporter analyze --html``: the page's picture of the job (``exporter.nccl.topology``), its
self-containedness and escaping, and how it looks in a real headless Chromium: a screenshot is
checked for the red TCP edge between the two node boxes, the amber and green edges of RDMA
with and without GPUDirect, and the verdict banner."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from exporter.commands import main
from exporter.commands.analyze_report import EDGE_COLOURS, VERDICT_COLOURS, render
from exporter.nccl import LogAnalyzer
from exporter.nccl.topology import OUTSIDE, RDMA_EDGE, RDMA_NO_GDR_EDGE, TCP_EDGE, topology
from tests.conftest import require_tool
from tests.pngread import Image, read_png

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "nccl"
TWO_NODES_TCP = CORPUS / "synthetic" / "socket-2.18-two-nodes-ib-disabled.log"
GDR_MIXED = CORPUS / "synthetic" / "ib-2.21-gdr-on-some-connections.log"
ONE_POD = CORPUS / "v2_19_pod_log_socket_fallback_nnodes.log"


def analyzed(*paths: Path) -> LogAnalyzer:
    analyzer = LogAnalyzer()
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            analyzer.feed(line)
    return analyzer


def rgb(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


def test_two_nodes_on_tcp_are_two_boxes_joined_by_one_tcp_edge() -> None:
    view = topology(analyzed(TWO_NODES_TCP))
    assert [node.host for node in view.nodes] == ["node-a", "node-b"]
    assert sum(len(p.ranks) for p in view.nodes[0].processes) == 8
    assert [(e.a, e.b, e.transport, e.network, e.connections) for e in view.edges] == [(0, 1, TCP_EDGE, "Socket", 6)]
    assert "via NET/Socket" in view.edges[0].line


def test_rdma_with_and_without_gpudirect_are_two_edges() -> None:
    view = topology(analyzed(GDR_MIXED))
    assert sorted((e.a, e.b, e.transport) for e in view.edges) == [(0, 1, RDMA_EDGE), (0, 1, RDMA_NO_GDR_EDGE)]


def test_a_pods_own_log_has_its_peers_outside() -> None:
    view = topology(analyzed(ONE_POD))
    assert len(view.nodes) == 1
    assert {(e.a, e.b, e.transport) for e in view.edges} == {(0, OUTSIDE, TCP_EDGE)}


def test_the_page_is_self_contained_and_escapes_what_the_logs_say() -> None:
    analyzer = analyzed(TWO_NODES_TCP)
    analyzer.feed('evil<script>alert(1)</script>:12:12 [0] NCCL WARN "><img src=http://x.invalid/a.png>')
    page = render(analyzer, ["<b>input</b>"], 'summary <script>"')
    assert "<script" not in page.replace("&lt;script", "")
    assert "<img" not in page and "&lt;img src=http://x.invalid/a.png&gt;" in page
    assert "&lt;b&gt;input&lt;/b&gt;" in page
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    for attribute in ("src=", "href=", "url(", "@import"):
        assert attribute not in page.replace("src=http://x.invalid", ""), attribute


def test_analyze_writes_the_page_beside_its_usual_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.html"
    assert main(["analyze", "--json", "--html", str(out), str(TWO_NODES_TCP)]) == 3
    assert capsys.readouterr().out.startswith('{"verdict": "tcp_fallback"')
    page = out.read_text()
    assert "TCP fallback" in page and 'class="edge tcp"' in page
    assert main(["analyze", "--html", str(tmp_path / "missing" / "r.html"), str(TWO_NODES_TCP)]) == 1
    assert "cannot write" in capsys.readouterr().err


def rendered(tmp_path: Path, log: Path, exit_code: int) -> Image:
    """The page ``analyze --html`` writes for ``log``, as headless Chromium shows it."""
    chromium = require_tool("chromium")
    page, shot = tmp_path / "page.html", tmp_path / "page.png"
    assert main(["analyze", "--html", str(page), str(log)]) == exit_code
    subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1100,760",
            f"--screenshot={shot}",
            page.as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=True,
    )
    return read_png(shot)


def test_chromium_shows_the_tcp_edge_in_red_between_the_two_boxes(tmp_path: Path) -> None:
    image = rendered(tmp_path, TWO_NODES_TCP, 3)
    colours = image.colours()
    red = rgb(EDGE_COLOURS[TCP_EDGE])
    assert colours[rgb(VERDICT_COLOURS["tcp_fallback"])] > 20_000  # the banner
    assert colours[red] > 1000, "no red TCP edge"
    assert colours[rgb(EDGE_COLOURS[RDMA_NO_GDR_EDGE])] < 200 and colours[rgb(EDGE_COLOURS[RDMA_EDGE])] < 200
    # The edge: a horizontal run of red between the two boxes, away from the legend's swatch.
    points = [(x, y) for x, y in image.where(red) if y > 300]
    assert points, "the red is only in the legend"
    xs = sorted({x for x, _ in points})
    assert xs[-1] - xs[0] > 100  # it spans the gap between the boxes


def test_chromium_shows_rdma_without_gpudirect_in_amber_and_with_it_in_green(tmp_path: Path) -> None:
    colours = rendered(tmp_path, GDR_MIXED, 0).colours()
    assert colours[rgb(EDGE_COLOURS[RDMA_NO_GDR_EDGE])] > 1000
    assert colours[rgb(EDGE_COLOURS[RDMA_EDGE])] > 1000
    assert colours[rgb(EDGE_COLOURS[TCP_EDGE])] < 200  # the legend's swatch only
    assert colours[rgb(VERDICT_COLOURS["rdma"])] > 20_000

"""``ccl-exporter analyze --html OUT``: one self-contained page for the analysed logs.

The page shows the verdict and the lines that decided it, and a picture of the job as the logs
show it (``exporter.nccl.topology``): each node a box with its processes, ranks and GPUs, each
group of inter-node connections an edge coloured by its transport — TCP red, RDMA without
GPUDirect amber, RDMA green, NVLink across nodes blue, unknown grey — and a dashed box for peers
the logs do not show. Then the communicators and the warnings. Everything is inline (CSS, SVG):
no script, no font, no image, no request; a Content-Security-Policy forbids loading anything.
Every text from the logs is escaped.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from pathlib import Path

from exporter import __version__
from exporter.nccl import LogAnalyzer, Verdict
from exporter.nccl.topology import (
    NVLINK_EDGE,
    OUTSIDE,
    RDMA_EDGE,
    RDMA_NO_GDR_EDGE,
    TCP_EDGE,
    UNKNOWN_EDGE,
    NodeView,
    Topology,
    topology,
)
from exporter.nccl.verdict import transport_key

# Edge colours (also the legend's); no other element of the page uses them.
EDGE_COLOURS = {
    TCP_EDGE: "#e3262b",
    RDMA_NO_GDR_EDGE: "#f2a007",
    RDMA_EDGE: "#2a9d3c",
    NVLINK_EDGE: "#2f6fd6",
    UNKNOWN_EDGE: "#8a8a8a",
}
EDGE_NAMES = {
    TCP_EDGE: "TCP (fallback when the node has RDMA)",
    RDMA_NO_GDR_EDGE: "RDMA without GPUDirect",
    RDMA_EDGE: "RDMA with GPUDirect",
    NVLINK_EDGE: "NVLink across nodes (MNNVL)",
    UNKNOWN_EDGE: "network not classed",
}
VERDICT_COLOURS = {"tcp_fallback": "#9b1c1c", "rdma": "#1d6b2f", "single_node": "#24528f", "unknown": "#555555"}
VERDICT_TITLES = {
    "tcp_fallback": "TCP fallback: inter-node NCCL traffic runs over TCP",
    "rdma": "RDMA: inter-node NCCL traffic runs over RDMA",
    "single_node": "Single node: no inter-node NCCL traffic",
    "unknown": "Cannot tell: the logs do not show which network carries inter-node traffic",
}
BOX_WIDTH, GAP_X, GAP_Y, LINE_HEIGHT, MAX_BOX_LINES, EDGE_SPACING = 300, 170, 70, 17, 18, 26
CSS = """
body{font:14px/1.45 -apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:0;color:#1c1c1c;background:#fff}
main{padding:20px 28px;max-width:1400px}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:26px 0 8px}
.verdict{color:#fff;padding:16px 28px}.verdict h1{font-size:22px}.verdict p{margin:4px 0 0}
code,pre{font:12.5px/1.4 ui-monospace,Menlo,Consolas,monospace}
ul.reasons li{margin:4px 0}ul.reasons code{background:#f3f3f3;padding:1px 4px;word-break:break-all}
table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f6f6f6}.legend span{display:inline-block;margin-right:18px}
.legend i{display:inline-block;width:22px;height:5px;margin-right:6px;vertical-align:middle}
.muted{color:#666}svg text{font:12px ui-monospace,Menlo,Consolas,monospace;fill:#1c1c1c}
svg .host{font-weight:bold;font-size:13px}
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _yes_no(value: object) -> str:
    if value is None:
        return "?"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)  # "mixed"


def _short(comm: str) -> str:
    return comm if len(comm) <= 12 else comm[:10] + "…"


def _box_lines(node: NodeView, several_communicators: bool) -> list[str]:
    """A node's box: a line per process (pid, network) and its ranks with their GPUs."""
    lines = []
    for process in node.processes:
        pid = process.label.rpartition(":")[2]
        lines.append(f"pid {pid}" + (f" · {process.network}" if process.network else ""))
        for rank in process.ranks:
            gpu = f"  GPU {rank.gpu}" if rank.gpu else ""
            comm = f"  {_short(rank.communicator)}" if several_communicators and rank.communicator else ""
            lines.append(f"  rank {rank.rank}{gpu}{comm}")
    if len(lines) > MAX_BOX_LINES:
        lines = lines[: MAX_BOX_LINES - 1] + [f"… {len(lines) - MAX_BOX_LINES + 1} more lines"]
    return lines


def _picture(view: Topology) -> str:
    """The SVG: node boxes in a grid, edges between their centres (under the boxes)."""
    outside = any(edge.b == OUTSIDE for edge in view.edges)
    count = len(view.nodes) + (1 if outside else 0)
    if count == 0:
        return '<p class="muted">The logs name no host (no line with an NCCL prefix).</p>'
    columns = 2 if count <= 4 else math.ceil(math.sqrt(count))
    rows = math.ceil(count / columns)
    communicators = {rank.communicator for node in view.nodes for p in node.processes for rank in p.ranks}
    contents = [_box_lines(node, len(communicators) > 1) for node in view.nodes]
    if outside:
        contents.append(["ranks on other nodes", "(not in these logs)"])
    height = max(LINE_HEIGHT * (len(lines) + 2) + 16 for lines in contents)
    width = columns * BOX_WIDTH + (columns - 1) * GAP_X + 40
    total_height = rows * height + (rows - 1) * GAP_Y + 40

    def place(i: int) -> tuple[int, int]:
        return 20 + (i % columns) * (BOX_WIDTH + GAP_X), 20 + (i // columns) * (height + GAP_Y)

    def centre(i: int) -> tuple[float, float]:
        x, y = place(i)
        return x + BOX_WIDTH / 2, y + height / 2

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{total_height}" role="img" '
        'aria-label="nodes and inter-node connections">'
    ]
    labels = []
    parallel: dict[tuple[int, int], int] = {}  # edges between one pair of boxes, drawn side by side
    for edge in view.edges:
        parallel[(edge.a, edge.b)] = parallel.get((edge.a, edge.b), 0) + 1
    drawn: dict[tuple[int, int], int] = {}
    for edge in view.edges:
        a = centre(edge.a)
        b = centre(len(view.nodes) if edge.b == OUTSIDE else edge.b)
        pair = (edge.a, edge.b)
        shift = (drawn.get(pair, 0) - (parallel[pair] - 1) / 2) * EDGE_SPACING
        drawn[pair] = drawn.get(pair, 0) + 1
        length = math.hypot(b[0] - a[0], b[1] - a[1]) or 1.0
        dx, dy = -(b[1] - a[1]) / length * shift, (b[0] - a[0]) / length * shift
        a, b = (a[0] + dx, a[1] + dy), (b[0] + dx, b[1] + dy)
        colour = EDGE_COLOURS[edge.transport]
        title = f"{EDGE_NAMES[edge.transport]}: {edge.network or '?'} x{edge.connections} — {edge.line}"
        out.append(
            f'<line x1="{a[0]:.0f}" y1="{a[1]:.0f}" x2="{b[0]:.0f}" y2="{b[1]:.0f}" stroke="{colour}" '
            f'stroke-width="9" stroke-linecap="round" class="edge {edge.transport}"><title>{_e(title)}</title></line>'
        )
        text = f"{edge.network or '?'} x{edge.connections}"
        mx, my = (a[0] + b[0]) / 2, (a[1] + b[1]) / 2
        labels.append(
            f'<rect x="{mx - 4 * len(text) - 6:.0f}" y="{my - 22:.0f}" width="{8 * len(text) + 12}" '
            f'height="18" fill="#fff" stroke="#ccc"/><text x="{mx:.0f}" y="{my - 9:.0f}" '
            f'text-anchor="middle">{_e(text)}</text>'
        )
    for i, lines in enumerate(contents):
        x, y = place(i)
        ghost = outside and i == len(view.nodes)
        style = 'stroke="#999" stroke-dasharray="6 4" fill="#fafafa"' if ghost else 'stroke="#444" fill="#fdfdfd"'
        out.append(f'<rect x="{x}" y="{y}" width="{BOX_WIDTH}" height="{height}" rx="8" {style} stroke-width="1.5"/>')
        top = y + 22
        if not ghost:
            node = view.nodes[i]
            host = node.host + (f" ({node.address})" if node.address else "")
            out.append(f'<text class="host" x="{x + 12}" y="{top}">{_e(host)}</text>')
            top += LINE_HEIGHT
        for j, line in enumerate(lines):
            out.append(f'<text x="{x + 12}" y="{top + LINE_HEIGHT * j}" xml:space="preserve">{_e(line)}</text>')
    out += labels
    out.append("</svg>")
    return "\n".join(out)


def _legend() -> str:
    items = "".join(
        f'<span><i style="background:{EDGE_COLOURS[t]}"></i>{_e(EDGE_NAMES[t])}</span>' for t in EDGE_COLOURS
    )
    return f'<p class="legend">{items}</p>'


def render(analyzer: LogAnalyzer, inputs: Sequence[str], summary: str) -> str:
    """The page for what ``analyzer`` was fed (``inputs`` names them, ``summary`` is the one-line verdict)."""
    verdict: Verdict = analyzer.result()
    view = topology(analyzer)
    colour = VERDICT_COLOURS.get(verdict.verdict, "#555555")
    reasons = "".join(f"<li><code>{_e(reason)}</code></li>" for reason in verdict.reasons) or "<li>none given</li>"
    rows = []
    for comm in verdict.communicators:
        transports = ", ".join(f"{transport_key(k)} x{v}" for k, v in sorted(comm.transports.items())) or "—"
        cells = (
            comm.comm_id,
            comm.nranks or "?",
            comm.nnodes or "?",
            comm.network or "?",
            _yes_no(comm.gdr),
            _yes_no(comm.inter_node_tcp),
            transports,
        )
        rows.append("<tr>" + "".join(f"<td>{_e(cell)}</td>" for cell in cells) + "</tr>")
    communicators = (
        "<table><tr><th>communicator</th><th>ranks</th><th>nodes</th><th>network</th><th>GPUDirect</th>"
        "<th>inter-node TCP</th><th>connections</th></tr>" + "".join(rows) + "</table>"
        if rows
        else '<p class="muted">No communicator shown.</p>'
    )
    warnings = "".join(f"<li><b>{_e(w.category)}</b> <code>{_e(w.line)}</code></li>" for w in verdict.warnings)
    counts = ", ".join(f"{_e(k)} x{v}" for k, v in sorted(analyzer.warnings_by_category.items()))
    not_shown = ""
    if view.nodes_not_shown or view.edges_not_shown:
        not_shown = (
            f'<p class="muted">Not drawn: {view.nodes_not_shown} more nodes, {view.edges_not_shown} more edges.</p>'
        )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<title>NCCL verdict: {_e(verdict.verdict)}</title><style>{CSS}</style></head>
<body>
<header class="verdict" style="background:{colour}"><h1>{_e(VERDICT_TITLES.get(verdict.verdict, verdict.verdict))}</h1>
<p>{_e(summary)}</p></header>
<main>
<h2>Why</h2><ul class="reasons">{reasons}</ul>
<h2>Nodes and inter-node connections</h2>{_legend()}{_picture(view)}{not_shown}
<h2>Communicators</h2>{communicators}
<h2>Warnings</h2>{f"<p>{counts}</p><ul>{warnings}</ul>" if counts else '<p class="muted">None.</p>'}
<h2>Input</h2><ul>{"".join(f"<li><code>{_e(name)}</code></li>" for name in inputs)}</ul>
<p class="muted">ccl-exporter {_e(__version__)} analyze --html</p>
</main></body></html>
"""


def write(path: Path, analyzer: LogAnalyzer, inputs: Sequence[str], summary: str) -> None:
    """Write the page to ``path`` (raises OSError when it cannot)."""
    path.write_text(render(analyzer, inputs, summary), encoding="utf-8")

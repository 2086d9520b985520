"""Our NVML collector and GPU x NIC matrix next to ``nvidia-smi``'s own view of the same GPU."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path
from typing import Any

from devtools.gpu_check.report import FAILED, OK, SKIPPED, Report, run_command

# --- our collector ----------------------------------------------------------------------


def collect_ours(report: Report) -> dict[str, Any] | None:
    from prometheus_client import generate_latest

    from exporter.collectors.nvml import NvmlCollector, NvmlSettings
    from exporter.collectors.umbrella import UmbrellaCollector, build_registry
    from exporter.sources.nvml import NvmlUnavailable, PynvmlBackend

    backend = PynvmlBackend()
    try:
        try:
            reading = backend.read()
            processes = backend.compute_processes()
        except NvmlUnavailable as exc:
            report.add("ccl NVML collector", SKIPPED, f"NVML unavailable: {exc}")
            return None
        # Per link as well as per GPU: the comparison with nvidia-smi is per link.
        umbrella = UmbrellaCollector([NvmlCollector(backend, NvmlSettings(per_link=True))])
        text = generate_latest(build_registry(umbrella, process_metrics=False)).decode()
        umbrella.close()
        report.write("ccl-nvml-metrics.txt", text)
        data = {
            "reading": dataclasses.asdict(reading),
            "compute_processes": {u: [dataclasses.asdict(p) for p in ps] for u, ps in processes.items()},
        }
        report.write("nvml-readings.json", json.dumps(data, indent=2) + "\n")
        links = sum(len(g.links) for g in reading.gpus)
        status = OK if not reading.problems else FAILED
        detail = f"{len(reading.gpus)} GPUs, {links} NVLinks" + (
            f"; problems: {reading.problems}" if reading.problems else ""
        )
        report.add("ccl NVML collector", status, detail)
        return data
    finally:
        backend.close()


# --- nvidia-smi ---------------------------------------------------------------------------


SMI_COMMANDS = {
    "nvidia-smi-q.txt": ["-q", "-i", "{gpu}"],
    "nvidia-smi-nvlink-status.txt": ["nvlink", "--status", "-i", "{gpu}"],
    "nvidia-smi-nvlink-errors.txt": ["nvlink", "-e", "-i", "{gpu}"],
    "nvidia-smi-topo.txt": ["topo", "-m"],
}


def run_nvidia_smi(report: Report, smi: str, gpu: int) -> dict[str, str]:
    path = shutil.which(smi)
    if path is None:
        report.add("nvidia-smi", SKIPPED, f"{smi} not found on PATH")
        return {}
    outputs = {}
    for name, args in SMI_COMMANDS.items():
        code, text = run_command([path, *(a.format(gpu=gpu) for a in args)], timeout=60)
        report.write(name, text)
        outputs[name] = text
        report.add(f"nvidia-smi {' '.join(args).format(gpu=gpu)}", OK if code == 0 else FAILED, f"exit {code}, {name}")
    return outputs


def parse_smi_links(status: str, errors: str) -> dict[int, dict[str, str]]:
    """``Link 3: 26.562 GB/s`` / ``Link 3: <inactive>`` and the per-link error lines."""
    links: dict[int, dict[str, str]] = {}
    for match in re.finditer(r"Link (\d+): (.+)", status):
        links.setdefault(int(match.group(1)), {})["status"] = match.group(2).strip()
    current = None
    for line in errors.splitlines():
        head = re.match(r"\s*Link (\d+):\s*(.*)", line)
        if head:
            current = int(head.group(1))
            line = head.group(2)
        pair = re.match(r"\s*(.+?):\s*(\S+)\s*$", line)
        if current is not None and pair:
            links.setdefault(current, {})[pair.group(1).strip()] = pair.group(2)
    return links


def compare(report: Report, ours: dict[str, Any] | None, smi: dict[str, str], gpu: int) -> None:
    theirs = parse_smi_links(smi.get("nvidia-smi-nvlink-status.txt", ""), smi.get("nvidia-smi-nvlink-errors.txt", ""))
    mine: dict[int, Any] = {}
    if ours is not None:
        for g in ours["reading"]["gpus"]:
            if g["gpu"]["index"] == gpu:
                mine = {link["link"]: link for link in g["links"]}
    lines = [f"GPU {gpu}: ours (NVML field values) | nvidia-smi", ""]
    mismatches = 0
    for link in sorted(set(mine) | set(theirs)):
        m, t = mine.get(link), theirs.get(link, {})
        if m is None:
            ours_text = "not read"
        else:
            speed = m["speed_bytes_per_second"]
            state = {True: "active", False: "inactive"}.get(m["active"], "state n/a")
            ours_text = state + (f", {speed / 1e9:.3f} GB/s" if speed is not None else ", speed n/a")
            ours_text += f", tx {m['transmit_bytes']}, rx {m['receive_bytes']}, errors {m['errors']}"
        smi_status = t.get("status", "not available")
        gbs = re.match(r"([\d.]+) GB/s", smi_status)
        flag = ""
        if m is not None and gbs and m["speed_bytes_per_second"] is not None:
            if abs(float(gbs.group(1)) - m["speed_bytes_per_second"] / 1e9) > 0.01:
                flag, mismatches = "  <-- speed differs", mismatches + 1
        if m is not None and "inactive" in smi_status and m["active"]:
            flag, mismatches = "  <-- state differs", mismatches + 1
        extra = ", ".join(f"{k}: {v}" for k, v in t.items() if k != "status")
        lines.append(f"link {link:2}: {ours_text} | {smi_status}{'; ' + extra if extra else ''}{flag}")
    report.write("compare.txt", "\n".join(lines) + "\n")
    if not mine or not theirs:
        report.add("compare", SKIPPED, "needs both our reading and nvidia-smi; compare.txt lists what there is")
    else:
        report.add(
            "compare", OK if mismatches == 0 else FAILED, f"{len(theirs)} links compared, {mismatches} mismatches"
        )


# --- topology: our GPU x NIC matrix next to nvidia-smi topo -m ------------------------------------


def our_topology(report: Report, sysfs: Path) -> dict[tuple[int, str], str] | None:
    """Our matrix from sysfs and NVML (ccl-topology.txt); (GPU index, NIC) -> class, None when NVML or
    sysfs gives nothing to compare."""
    from exporter.sources.nvml import NvmlUnavailable, PynvmlBackend
    from exporter.sources.topology import build_topology

    backend = PynvmlBackend()
    try:
        gpus = backend.gpus()
    except NvmlUnavailable as exc:
        gpus = []
        report.add("ccl topology", SKIPPED, f"no GPU to place: NVML unavailable: {exc}")
    finally:
        backend.close()
    topology = build_topology(sysfs, gpus)
    nics = [n.device for n in topology.physical_nics]
    lines = [f"GPU x NIC affinity from {sysfs} and NVML (nvidia-smi classes; '?' = sysfs does not tell)", ""]
    lines.append("\t".join(["", *nics, "NUMA", "nearest"]))
    for gpu in topology.gpus:
        numa = gpu.placement.numa_node if gpu.placement and gpu.placement.numa_node is not None else "?"
        nearest = topology.nearest(gpu.index)
        row = [topology.affinity(gpu.index, nic) or "?" for nic in nics]
        lines.append("\t".join([f"GPU{gpu.index}", *row, str(numa), ",".join(nearest[1]) if nearest else "?"]))
    lines += ["", *(f"problem: {p}" for p in topology.problems)]
    report.write("ccl-topology.txt", "\n".join(lines) + "\n")
    if not gpus:
        return None
    if not nics:
        report.add("ccl topology", SKIPPED, f"no RDMA device under {sysfs}/class/infiniband: nothing to pair")
        return None
    known = {(g, n): cls for (g, n), cls in topology.classes.items() if n in nics}
    status = OK if not topology.problems else FAILED
    report.add(
        "ccl topology",
        status,
        f"{len(topology.gpus)} GPUs x {len(nics)} NICs, {len(known)} classes known"
        + (f"; problems: {list(topology.problems)[:3]}" if topology.problems else ""),
    )
    return known


def parse_smi_topo(text: str) -> dict[tuple[int, str], str]:
    """(GPU index, NIC device) -> class from ``nvidia-smi topo -m`` (NICn columns named by its NIC
    Legend; older releases print the device name as the column)."""
    legend = dict(re.findall(r"^\s*(NIC\d+):\s*(\S+)\s*$", text, flags=re.M))
    lines = text.splitlines()
    header = next((line for line in lines if re.match(r"^\s+GPU0\b", line) or line.startswith("\tGPU0")), None)
    if header is None:
        return {}
    columns = [c.strip() for c in header.split("\t")][1:]
    found: dict[tuple[int, str], str] = {}
    for line in lines:
        head = re.match(r"^GPU(\d+)\t", line)
        if not head:
            continue
        cells = [c.strip() for c in line.split("\t")][1:]
        for column, cell in zip(columns, cells, strict=False):
            if column.startswith("GPU") or " " in column or not column:
                continue
            if cell in ("PIX", "PXB", "PHB", "NODE", "SYS"):
                found[(int(head.group(1)), legend.get(column, column))] = cell
    return found


def compare_topology(report: Report, ours: dict[tuple[int, str], str] | None, smi: dict[str, str]) -> None:
    theirs = parse_smi_topo(smi.get("nvidia-smi-topo.txt", ""))
    if ours is None or not theirs:
        why = "no GPU/NIC matrix of ours" if ours is None else "no GPU x NIC classes in nvidia-smi topo -m"
        report.add("topology compare", SKIPPED, why)
        return
    lines = ["GPU/NIC: ours | nvidia-smi topo -m", ""]
    mismatches = 0
    for gpu, nic in sorted(set(ours) | set(theirs)):
        mine, their = ours.get((gpu, nic), "?"), theirs.get((gpu, nic), "not shown")
        flag = ""
        if mine != their:
            flag, mismatches = "  <-- differs", mismatches + 1
        lines.append(f"GPU{gpu} {nic}: {mine} | {their}{flag}")
    report.write("topology-compare.txt", "\n".join(lines) + "\n")
    report.add(
        "topology compare",
        OK if mismatches == 0 else FAILED,
        f"{len(set(ours) | set(theirs))} GPU/NIC pairs compared, {mismatches} mismatches",
    )

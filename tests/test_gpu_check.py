"""scripts/gpu-check where no GPU exists: it must run, write its folder and say clearly what
it skipped. NVML is the fake libnvidia-ml; nvidia-smi is either absent or a stand-in script
printing canned `nvidia-smi nvlink` text (the real tool needs a GPU), which checks the
side-by-side comparison and its mismatch flag. The real comparison happens on a GPU machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.cli import build_parser
from tests.conftest import REPO, require_tool
from tests.fakenvml import build_fake_nvml, fake_nvml_env

SCRIPT = REPO / "scripts" / "gpu-check"

FAKE_SMI = """#!/bin/sh
case "$*" in
  "nvlink --status -i 0") printf 'GPU 0: NVIDIA H200 (UUID: GPU-x)\\n\\t Link 0: 26.562 GB/s\\n\\t Link 1: 25.000 GB/s\\n\\t Link 2: <inactive>\\n' ;;
  "nvlink -e -i 0") printf 'GPU 0: NVIDIA H200 (UUID: GPU-x)\\n\\t Link 0: Replay Errors: 0\\n\\t Link 0: Recovery Errors: 0\\n\\t Link 0: CRC Errors: 0\\n' ;;
  *) echo "nvidia-smi stand-in: $*" ;;
esac
"""


@pytest.fixture(scope="module")
def fake_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fake_nvml(require_tool("gcc"), tmp_path_factory.mktemp("fakenvml"))


def run_check(out: Path, lib: Path, *args: str, **fake: object) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **fake_nvml_env(lib, **fake)}
    return subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), *args], env=env,
                          capture_output=True, text=True, timeout=120)


def summary_rows(out: Path) -> dict[str, tuple[str, str]]:
    rows = {}
    for line in (out / "summary.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 3 and cells[1] in ("OK", "SKIPPED", "FAILED"):
            rows[cells[0]] = (cells[1], cells[2])
    return rows


def test_degrades_clearly_without_nvidia_smi_torch_or_gpu(fake_lib: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = run_check(out, fake_lib, "--nvidia-smi", str(tmp_path / "no-such-nvidia-smi"), down_links="0:2")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = summary_rows(out)
    assert rows["ccl NVML collector"] == ("OK", "8 GPUs, 144 NVLinks")
    assert rows["nvidia-smi"][0] == "SKIPPED" and "not found" in rows["nvidia-smi"][1]
    assert rows["compare"][0] == "SKIPPED"
    # here torch is absent or CPU-only: either way the NCCL step is skipped with its reason
    assert rows["NCCL init"][0] == "SKIPPED" and ("torch" in rows["NCCL init"][1])
    assert rows["ccl-exporter analyze"] == ("SKIPPED", "no NCCL log to analyze")
    # no GPU job can run, so neither can the NCCL Inspector's: skipped, saying why
    assert rows["NCCL Inspector"][0] == "SKIPPED" and "no GPU job can run here" in rows["NCCL Inspector"][1]
    assert rows["Inspector records"] == ("SKIPPED", "no Inspector output")
    metrics = (out / "ccl-nvml-metrics.txt").read_text()
    assert ('ccl_gpu_info{gpu="0",name="NVIDIA H200",pci_bus_id="00000000:18:00.0",'
            'uuid="GPU-fa4e0000-0000-4000-8000-000000000000"} 1.0') in metrics
    assert 'ccl_nvlink_state{gpu="0",link="2"} 0.0' in metrics
    assert "link  2: inactive, 0.000 GB/s" in (out / "compare.txt").read_text()


def test_compares_with_nvidia_smi_and_flags_differences(fake_lib: Path, tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    out = tmp_path / "out"
    assert run_check(out, fake_lib, "--nvidia-smi", str(smi), down_links="0:2").returncode == 0
    rows = summary_rows(out)
    assert rows["nvidia-smi nvlink --status -i 0"] == ("OK", "exit 0, nvidia-smi-nvlink-status.txt")
    assert rows["compare"] == ("FAILED", "3 links compared, 1 mismatches")
    compare = (out / "compare.txt").read_text().splitlines()
    assert compare[2].startswith("link  0: active, 26.562 GB/s") and "Replay Errors: 0" in compare[2]
    assert compare[3].endswith("| 25.000 GB/s  <-- speed differs")
    assert compare[4].endswith("| <inactive>")


def test_analyzes_a_given_nccl_log_or_says_analyze_is_missing(fake_lib: Path, tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("node-a:100:100 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"
                   "node-a:100:100 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>\n")
    out = tmp_path / "out"
    assert run_check(out, fake_lib, "--nvidia-smi", str(tmp_path / "none"), "--nccl-log", str(log)).returncode == 0
    rows = summary_rows(out)
    assert (out / "nccl-init.log").read_text() == log.read_text()
    has_analyze = "analyze" in build_parser({})._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    if has_analyze:
        assert rows["ccl-exporter analyze"][0] == "OK" and (out / "analyze.json").exists()
    else:
        assert rows["ccl-exporter analyze"] == (
            "SKIPPED", "this build of ccl-exporter has no analyze command; the log is kept")


def smi_topo(classes: dict[tuple[int, int], str]) -> str:
    """`nvidia-smi topo -m` as it prints an HGX node: GPU rows, NICn columns, the NIC Legend."""
    header = "\t" + "\t".join([*(f"GPU{g}" for g in range(8)), *(f"NIC{n}" for n in range(10)),
                               "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])
    rows = []
    for g in range(8):
        cells = [" X " if h == g else "NV18" for h in range(8)] + [classes[(g, n)] for n in range(10)]
        rows.append(f"GPU{g}\t" + "\t".join(cells) + f"\t{0 if g < 4 else 56}-{55 if g < 4 else 111}\t{g // 4}\t\tN/A")
    legend = "\n".join(f"  NIC{n}: mlx5_{n}" for n in range(10))
    return "\n".join([header, *rows, "", "Legend:", "", "  X    = Self", "", "NIC Legend:", "", legend, ""])


def test_prints_our_affinity_matrix_next_to_nvidia_smi_topo(fake_lib: Path, tmp_path: Path) -> None:
    """The fake NVML's GPUs sit at the simulated HGX node's bus ids; a sysfs tree of that node, and an
    nvidia-smi whose topo -m agrees but for one cell."""
    from exporter.sim.topology import SimTopology

    SimTopology().setup(tmp_path / "node")
    classes = {}
    for g in range(8):
        for n in range(10):
            same_socket = (g < 4) == (n < 4 or n == 8)
            classes[(g, n)] = "PIX" if g == n else ("NODE" if same_socket else "SYS")
    classes[(2, 5)] = "NODE"  # a cell nvidia-smi says differently: flagged
    smi = tmp_path / "nvidia-smi"
    topo = tmp_path / "topo.txt"
    topo.write_text(smi_topo(classes))
    smi.write_text(FAKE_SMI.replace('  *) echo', f'  "topo -m") cat {topo} ;;\n  *) echo'))
    smi.chmod(0o755)
    out = tmp_path / "out"
    done = run_check(out, fake_lib, "--nvidia-smi", str(smi), "--sysfs", str(tmp_path / "node" / "sys"))
    assert done.returncode == 0, done.stdout + done.stderr
    rows = summary_rows(out)
    assert rows["ccl topology"] == ("OK", "8 GPUs x 10 NICs, 80 classes known")
    assert rows["topology compare"] == ("FAILED", "80 GPU/NIC pairs compared, 1 mismatches")
    matrix = (out / "ccl-topology.txt").read_text().splitlines()
    assert matrix[3].split("\t") == ["GPU0", "PIX", "NODE", "NODE", "NODE", "SYS", "SYS", "SYS", "SYS", "NODE", "SYS",
                                     "0", "mlx5_0"]
    compare = (out / "topology-compare.txt").read_text()
    assert "GPU2 mlx5_5: SYS | NODE  <-- differs" in compare
    assert "GPU7 mlx5_7: PIX | PIX\n" in compare


def test_topology_step_says_what_it_skipped_without_gpus(tmp_path: Path) -> None:
    import ctypes.util

    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("a real libnvidia-ml is installed on this machine")
    out = tmp_path / "out"
    env = {**os.environ, "LD_LIBRARY_PATH": str(tmp_path)}  # no libnvidia-ml here
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--nvidia-smi", str(tmp_path / "none"),
                           "--sysfs", str(tmp_path)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = summary_rows(out)
    assert rows["ccl topology"][0] == "SKIPPED" and "NVML" in rows["ccl topology"][1]
    assert rows["topology compare"] == ("SKIPPED", "no GPU/NIC matrix of ours")


def test_reads_given_inspector_output_as_the_exporter_does(fake_lib: Path, tmp_path: Path) -> None:
    """A job's Inspector dump folder (here the fixtures of every format version) is read by the
    exporter's own parser; the bus bandwidth of its counters matches the records'."""
    out = tmp_path / "out"
    dump = REPO / "tests" / "fixtures" / "inspector"
    done = run_check(out, fake_lib, "--nvidia-smi", str(tmp_path / "none"), "--inspector-dir", str(dump))
    assert done.returncode == 0, done.stdout + done.stderr
    rows = summary_rows(out)
    assert rows["NCCL Inspector"][0] == "SKIPPED" and "reading the given output" in rows["NCCL Inspector"][1]
    status, detail = rows["Inspector records"]
    assert status == "OK" and detail.startswith("16 operations"), detail
    records = (out / "inspector-records.txt").read_text()
    assert "all_reduce inter_node ge_1GB" in records and "nccl-2.30-json.log: {" in records
    assert "nccl-2.28-json.log: {" in done.stdout  # the records are printed too

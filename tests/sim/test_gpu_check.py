"""scripts/gpu-check where no GPU exists: it must run, write its folder and say clearly what
it skipped. NVML is the fake libnvidia-ml; nvidia-smi is either absent or a stand-in script
printing canned `nvidia-smi nvlink` text (the real tool needs a GPU), which checks the
side-by-side comparison and its mismatch flag. The real comparison happens on a GPU machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, require_tool
from tests.fakenvml import build_fake_nvml, fake_nvml_env

SCRIPT = REPO / "scripts" / "gpu-check"

FAKE_SMI = """#!/bin/sh
case "$*" in
  "nvlink --status -i 0") printf 'GPU 0: NVIDIA H200 (UUID: GPU-x)\\n\\t Link 0: 26.562 GB/s\\n\\t Link 1: 25.000 GB/s\\n\\t Link 2: <inactive>\\n' ;;
  "nvlink -e -i 0") printf 'GPU 0: NVIDIA H200 (UUID: GPU-x)\\n\\t Link 0: Replay Errors: 0\\n\\t Link 0: Recovery Errors: 0\\n\\t Link 0: CRC Errors: 0\\n' ;;
  *) echo "nvidia-smi stand-in: $*" ;;
esac
"""  # noqa: E501 - a shell script: one printf per command, nvidia-smi's output as it prints it


@pytest.fixture(scope="module")
def fake_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fake_nvml(require_tool("gcc"), tmp_path_factory.mktemp("fakenvml"))


def run_check(out: Path, lib: Path, *args: str, **fake: object) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **fake_nvml_env(lib, **fake)}
    # no carried sources: a developer's own .gpu-check-src must not change what these tests see
    bundle = ["--src-bundle", str(out.parent / "no-bundle")]
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), *bundle, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def summary_rows(out: Path) -> dict[str, tuple[str, str]]:
    rows = {}
    for line in (out / "summary.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 4 and cells[1] in ("OK", "SKIPPED", "FAILED"):
            float(cells[2])  # every step says how long it took
            rows[cells[0]] = (cells[1], cells[3])
    return rows


def test_degrades_clearly_without_nvidia_smi_torch_or_gpu(fake_lib: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = run_check(out, fake_lib, "--nvidia-smi", str(tmp_path / "no-such-nvidia-smi"), down_links="0:2")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = summary_rows(out)
    assert rows["ccl NVML collector"] == ("OK", "8 GPUs, 144 NVLinks")
    assert rows["nvidia-smi"][0] == "SKIPPED" and "not found" in rows["nvidia-smi"][1]
    assert rows["compare"][0] == "SKIPPED"
    # here torch is absent or CPU-only: either way every GPU step is skipped with its reason
    assert rows["torch"][0] == "SKIPPED" and "torch" in rows["torch"][1]
    for step in ("two hosts", "NCCL Inspector job", "ccl-exporter probe (NCCL, two hosts)"):
        assert rows[step] == ("SKIPPED", f"no GPU job can run here: {rows['torch'][1]}"), step
    assert rows["analyze"] == ("SKIPPED", "no rank logs (no two-host run wrote one)")
    assert rows["exporter on pod logs, RDMA node"] == ("SKIPPED", "no rank logs to lay out")
    assert rows["Inspector plugin build"][0] == "SKIPPED" and "no NCCL source" in rows["Inspector plugin build"][1]
    assert rows["Inspector records"] == ("SKIPPED", "no Inspector output")
    assert rows["nccl-tests build"][0] == "SKIPPED" and "no nccl-tests source" in rows["nccl-tests build"][1]
    assert rows["nccl-tests all_reduce_perf"] == ("SKIPPED", "not built")
    assert rows["probe vs nccl-tests"][0] == "SKIPPED"
    metrics = (out / "ccl-nvml-metrics.txt").read_text()
    assert (
        'ccl_gpu_info{gpu="0",name="NVIDIA H200",pci_bus_id="00000000:18:00.0",'
        'uuid="GPU-fa4e0000-0000-4000-8000-000000000000"} 1.0'
    ) in metrics
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
    log.write_text(
        "node-a:100:100 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"
        "node-a:100:100 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>\n"
    )
    out = tmp_path / "out"
    assert run_check(out, fake_lib, "--nvidia-smi", str(tmp_path / "none"), "--nccl-log", str(log)).returncode == 0
    rows = summary_rows(out)
    assert (out / "two-hosts" / "given" / "rank0.nccl.log").read_text() == log.read_text()
    assert rows["two hosts"] == ("SKIPPED", "not run: analyzing the given log job.log")
    # one node's log with no communicator: analyze cannot tell (exit 4), an answer all the same
    assert rows["analyze given"][0] == "OK" and rows["analyze given"][1].startswith("exit 4, verdict unknown")
    assert json.loads((out / "two-hosts" / "given" / "analyze.json").read_text())["verdict"] == "unknown"


def smi_topo(classes: dict[tuple[int, int], str]) -> str:
    """`nvidia-smi topo -m` as it prints an HGX node: GPU rows, NICn columns, the NIC Legend."""
    header = "\t" + "\t".join(
        [
            *(f"GPU{g}" for g in range(8)),
            *(f"NIC{n}" for n in range(10)),
            "CPU Affinity",
            "NUMA Affinity",
            "GPU NUMA ID",
        ]
    )
    rows = []
    for g in range(8):
        cells = [" X " if h == g else "NV18" for h in range(8)] + [classes[(g, n)] for n in range(10)]
        rows.append(f"GPU{g}\t" + "\t".join(cells) + f"\t{0 if g < 4 else 56}-{55 if g < 4 else 111}\t{g // 4}\t\tN/A")
    legend = "\n".join(f"  NIC{n}: mlx5_{n}" for n in range(10))
    return "\n".join([header, *rows, "", "Legend:", "", "  X    = Self", "", "NIC Legend:", "", legend, ""])


def test_prints_our_affinity_matrix_next_to_nvidia_smi_topo(fake_lib: Path, tmp_path: Path) -> None:
    """The fake NVML's GPUs sit at the simulated HGX node's bus ids; a sysfs tree of that node, and an
    nvidia-smi whose topo -m agrees but for one cell."""
    from ccl_sim.topology import SimTopology

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
    smi.write_text(FAKE_SMI.replace("  *) echo", f'  "topo -m") cat {topo} ;;\n  *) echo'))
    smi.chmod(0o755)
    out = tmp_path / "out"
    done = run_check(out, fake_lib, "--nvidia-smi", str(smi), "--sysfs", str(tmp_path / "node" / "sys"))
    assert done.returncode == 0, done.stdout + done.stderr
    rows = summary_rows(out)
    assert rows["ccl topology"] == ("OK", "8 GPUs x 10 NICs, 80 classes known")
    assert rows["topology compare"] == ("FAILED", "80 GPU/NIC pairs compared, 1 mismatches")
    matrix = (out / "ccl-topology.txt").read_text().splitlines()
    assert matrix[3].split("\t") == [
        "GPU0",
        "PIX",
        "NODE",
        "NODE",
        "NODE",
        "SYS",
        "SYS",
        "SYS",
        "SYS",
        "NODE",
        "SYS",
        "0",
        "mlx5_0",
    ]
    compare = (out / "topology-compare.txt").read_text()
    assert "GPU2 mlx5_5: SYS | NODE  <-- differs" in compare
    assert "GPU7 mlx5_7: PIX | PIX\n" in compare


def test_topology_step_says_what_it_skipped_without_gpus(tmp_path: Path) -> None:
    import ctypes.util

    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("a real libnvidia-ml is installed on this machine")
    out = tmp_path / "out"
    env = {**os.environ, "LD_LIBRARY_PATH": str(tmp_path)}  # no libnvidia-ml here
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--out",
            str(out),
            "--nvidia-smi",
            str(tmp_path / "none"),
            "--sysfs",
            str(tmp_path),
            "--src-bundle",
            str(tmp_path / "no-bundle"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
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
    assert rows["NCCL Inspector job"][0] == "SKIPPED" and "reading the given output" in rows["NCCL Inspector job"][1]
    status, detail = rows["Inspector records"]
    assert status == "OK" and detail.startswith("16 operations"), detail
    records = (out / "inspector-records.txt").read_text()
    assert "all_reduce inter_node ge_1GB" in records and "nccl-2.30-json.log: {" in records
    assert "nccl-2.28-json.log: {" in done.stdout  # the records are printed too


# --- recorded runs: the analysis steps on output shaped as the upstream writers write it ----------------

RECORDED = REPO / "tests" / "fixtures" / "gpu-check"


def run_recorded(folder: Path, out: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The analysis steps on a recorded run; this machine's sysfs is an empty folder (no RDMA port)."""
    sysfs = tmp_path / "empty-sysfs"
    sysfs.mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--recorded", str(folder), "--out", str(out), "--sysfs", str(sysfs)],
        capture_output=True,
        text=True,
        timeout=180,
    )


def metric_lines(path: Path, name: str, pod: str) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.startswith(name + "{") and f'pod="{pod}"' in line]


def test_recorded_nccl_2_28_run_is_analysed_again(tmp_path: Path) -> None:
    """Two "hosts" on one GPU with NCCL 2.28.9: analyze calls every Socket run a TCP fallback (nNodes 2
    outranks one hostname and loopback-only sockets), the exporter tailing them as pod logs flags it on a
    node with an active RDMA port and not on one without, the Inspector's records read as the exporter
    reads them, and the probe's busbw beside nccl-tests' fails the ratio check (gloo on a CPU is no NCCL)."""
    out = tmp_path / "out"
    done = run_recorded(RECORDED / "nccl-2.28.9", out, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = summary_rows(out)
    assert rows["recorded run"][0] == "OK"
    for variant in ("socket-lo", "socket-eth0", "defaults"):
        assert rows[f"analyze {variant}"] == ("OK", "exit 3, verdict tcp_fallback, network Socket, nodes 2"), variant
        verdict = json.loads((out / "two-hosts" / variant / "analyze.json").read_text())
        assert (verdict["nccl_version"], verdict["nranks"], verdict["inter_node_tcp"]) == ("2.28.9", 2, True)
    summary = (out / "summary.md").read_text()
    assert (
        "`socket-lo` (IB disabled, Socket): analyze says **tcp_fallback** (network Socket, nodes 2, ranks 2). "
        "The logs show 2 processes, one hostname for both ranks (gpu-node), NCCL 2.28.9+cuda13.0, nNodes 2, "
        "network Socket, NCCL sockets on lo:127.0.0.1, 0 warnings."
    ) in summary
    assert "NCCL sockets on eth0:10.0.2.15" in summary

    assert rows["exporter on pod logs, this node"] == (
        "OK",
        "6 pods, node_rdma_active 0.0; exporter-metrics-this-node.txt",
    )
    assert rows["exporter on pod logs, RDMA node"] == (
        "OK",
        "6 pods, node_rdma_active 1.0; exporter-metrics-rdma-node.txt",
    )
    for label, flagged in (("this-node", "0.0"), ("rdma-node", "1.0")):
        page = out / f"exporter-metrics-{label}.txt"
        for pod in ("socket-lo-rank0", "socket-lo-rank1", "defaults-rank1"):
            assert metric_lines(page, "ccl_nccl_tcp_fallback", pod) == [
                f'ccl_nccl_tcp_fallback{{job_kind="",job_name="",namespace="gpu-check",pod="{pod}"}} {flagged}'
            ]
            assert any('verdict="tcp_fallback"} 1.0' in line for line in metric_lines(page, "ccl_nccl_verdict", pod))
            info = metric_lines(page, "ccl_nccl_communicator_info", pod)
            assert len(info) == 1 and 'network="Socket"' in info[0] and 'nnodes="2"' in info[0]
            assert 'nccl_version="2.28.9"' in info[0]
    pod_log = next((out / "pod-logs").glob("gpu-check_socket-lo-rank0_*/trainer/0.log")).read_text().splitlines()
    source = (RECORDED / "nccl-2.28.9" / "two-hosts" / "socket-lo" / "rank0.nccl.log").read_text().splitlines()
    assert [line.split(" stdout F ", 1)[1] for line in pod_log] == source

    assert rows["Inspector records"] == ("OK", "6 operations; counters vs records busbw differ by at most 0.00%")
    assert (
        "all_reduce inter_node 10MB_100MB: 6 ops, bus bandwidth 5.35 GB/s"
        in (out / "inspector-records.txt").read_text()
    )

    status, detail = rows["probe vs nccl-tests"]
    assert status == "FAILED" and detail.endswith("at 268435456 B the probe gets 0.30x nccl-tests' busbw"), detail
    compared = json.loads((out / "bandwidth-compare.json").read_text())
    assert (compared["probe_ranks"], compared["tests_ranks"]) == (2, 2)
    assert [r["size_bytes"] for r in compared["rows"]] == [1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
    assert [r["tests_busbw_gbs_out_of_place"] for r in compared["rows"]] == [2.99, 4.36, 4.93, 5.37, 5.49]
    probe = json.loads((RECORDED / "nccl-2.28.9" / "probe-rank0.json").read_text())
    assert [r["probe_busbw_gbs"] * 1e9 for r in compared["rows"]] == pytest.approx(
        [r["busbw_bytes_per_second"] for r in probe["collectives"][0]["rows"]]
    )
    # the recorded folder itself is left as it was
    assert not (RECORDED / "nccl-2.28.9" / "summary.md").exists()


def test_recorded_nccl_2_29_run_with_a_one_rank_nccl_tests(tmp_path: Path) -> None:
    """NCCL 2.29.7 prints ``[Rank N]`` before its Init START line; nccl-tests built without MPI runs one rank,
    whose all-reduce bus bandwidth is 0 by definition: the comparison fails and says why."""
    recorded = tmp_path / "recorded"
    shutil.copytree(RECORDED / "nccl-2.29.7", recorded)
    shutil.copy(RECORDED / "nccl-2.28.9" / "probe-rank0.json", recorded)
    out = tmp_path / "out"
    done = run_recorded(recorded, out, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = summary_rows(out)
    assert rows["analyze socket-lo"] == ("OK", "exit 3, verdict tcp_fallback, network Socket, nodes 2")
    assert json.loads((out / "two-hosts" / "socket-lo" / "analyze.json").read_text())["nccl_version"] == "2.29.7"
    assert rows["exporter on pod logs, RDMA node"][0] == "OK"
    assert rows["Inspector records"] == ("SKIPPED", "no Inspector output")
    status, detail = rows["probe vs nccl-tests"]
    assert status == "FAILED" and "the probe ran 2 ranks, nccl-tests 1" in detail, detail


def test_recorded_run_fails_when_the_fallback_is_not_seen(tmp_path: Path) -> None:
    """One rank's log without its nNodes and connection lines: sockets on lo only, so the analyzer's
    loopback rule calls it one node. The check that a Socket run between two hosts is a fallback fails,
    both in analyze and in the exporter's verdict."""
    recorded = tmp_path / "recorded"
    variant = recorded / "two-hosts" / "socket-lo"
    variant.mkdir(parents=True)
    lines = (RECORDED / "nccl-2.28.9" / "two-hosts" / "socket-lo" / "rank0.nccl.log").read_text().splitlines()
    kept = [line for line in lines if "nNodes" not in line and "via NET/" not in line]
    (variant / "rank0.nccl.log").write_text("\n".join(kept) + "\n")
    out = tmp_path / "out"
    done = run_recorded(recorded, out, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = summary_rows(out)
    assert rows["analyze socket-lo"] == (
        "FAILED",
        "exit 0, verdict single_node, network Socket, nodes 1: two hosts on Socket must be a TCP fallback (exit 3)",
    )
    status, detail = rows["exporter on pod logs, RDMA node"]
    assert status == "FAILED" and "socket-lo-rank0: verdict single_node, not tcp_fallback" in detail, detail
    assert "socket-lo-rank0: ccl_nccl_tcp_fallback 0.0, not 1 (rdma-node)" in detail
    assert "NCCL sockets on lo:127.0.0.1" in (out / "summary.md").read_text()


def nccl_tests_table(ranks: int, rows: list[tuple[int, float, float]]) -> str:
    """all_reduce_perf's stdout as NVIDIA/nccl-tests v2.19.6 prints it (src/util.cu): (size, out-of-place
    time in us, in-place time in us) per row; algbw and busbw computed as all_reduce.cu does."""
    out = ["# nccl-tests version 2.19.6 nccl-headers=22809 nccl-library=22809\n", "# Using devices\n"]
    out += [
        f"#  Rank {r:2d} Group {0:2d} Pid {700 + r:6d} on {'gpu-node':>10} device {0:2d} [0000:18:00] NVIDIA H200\n"
        for r in range(ranks)
    ]
    # nccl-tests' own printf formats, as they are in its source
    columns = (
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "time",
        "algbw",
        "busbw",
        "#wrong",
    )
    out.append("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s \n" % columns)  # noqa: UP031 - nccl-tests' printf format
    for size, *times in rows:
        line = "%12i  %12i  %8s  %6s  %6s" % (size, size // 4, "float", "sum", "%6i" % -1)  # noqa: UP031 - nccl-tests' printf format
        for t in times:
            algbw = size / 1e3 / t
            line += "  %7.2f  %6.2f  %6.2f  %6g" % (t, algbw, algbw * 2 * (ranks - 1) / ranks, 0)  # noqa: UP031 - nccl-tests' printf format
        out.append(line + "\n")
    out += [
        "# %-20s : %d %s\n" % ("Out of bounds values", 0, "OK"),  # noqa: UP031 - nccl-tests' printf format
        "# %-20s : %g \n" % ("Avg bus bandwidth", 1.0),  # noqa: UP031 - nccl-tests' printf format
    ]
    return "".join(out)


def test_probe_and_nccl_tests_that_agree_pass_the_comparison(tmp_path: Path) -> None:
    """nccl-tests rows at 1.5x and 0.9x the probe's recorded times: within the ratio band at the largest
    size, so the step is OK and says both numbers."""
    recorded = tmp_path / "recorded"
    recorded.mkdir()
    shutil.copy(RECORDED / "nccl-2.28.9" / "probe-rank0.json", recorded)
    probe_rows = json.loads((recorded / "probe-rank0.json").read_text())["collectives"][0]["rows"]
    times = [(r["size_bytes"], r["time_seconds"] * 1e6 * 1.5, r["time_seconds"] * 1e6 * 0.9) for r in probe_rows]
    (recorded / "nccl-tests-all_reduce_perf.txt").write_text(nccl_tests_table(2, times))
    out = tmp_path / "out"
    assert run_recorded(recorded, out, tmp_path).returncode == 0
    status, detail = summary_rows(out)["probe vs nccl-tests"]
    assert status == "OK", detail
    assert detail.startswith(
        "5 sizes side by side in bandwidth-compare.txt; at 268435456 B probe 1.67 GB/s, nccl-tests 1.11 GB/s"
    )
    table = (out / "bandwidth-compare.txt").read_text().splitlines()
    assert table[-1].split() == ["268435456", "1.67", "1.11", "1.85", "1.50"]


def test_nccl_tests_table_is_read_as_nccl_tests_writes_it() -> None:
    from devtools.gpu_check.bandwidth import parse_nccl_tests

    text = (RECORDED / "nccl-2.28.9" / "nccl-tests-all_reduce_perf.txt").read_text()
    run = parse_nccl_tests(text)
    assert run.header == "# nccl-tests version 2.19.6 nccl-headers=22809 nccl-library=22809"
    assert [r.split()[-2:] for r in run.ranks] == [["NVIDIA", "H200"]] * 2
    assert [(r.size, r.count, r.type, r.redop, r.root) for r in run.rows][-1] == (
        268435456,
        67108864,
        "float",
        "sum",
        -1,
    )
    last = run.rows[-1]
    assert (last.out_of_place.time_us, last.out_of_place.busbw, last.out_of_place.wrong) == (48913.6, 5.49, 0)
    assert (last.in_place.time_us, last.in_place.algbw) == (48870.2, 5.49)
    assert (run.out_of_bounds, run.average_busbw, run.skipped_lines) == (0, 4.63063, 0)
    # mixed with NCCL's INFO lines and mpirun's, data not checked (-c 0: N/A), a row cut short
    noisy = "\n".join(
        [
            "gpu-node:4501:4501 [0] NCCL INFO NCCL version 2.28.9+cuda13.0",
            "--------------------------------------------------------------------------",
            *text.splitlines()[:12],
            "     4194304       1048576     float     sum      -1   962.40    4.36    4.36     N/A"
            "   958.10    4.38    4.38     N/A",
            "    16777216       4194304     float     sum      -1  3402.70    4.93",
        ]
    )
    run = parse_nccl_tests(noisy)
    assert [r.size for r in run.rows] == [1048576, 4194304]
    assert run.rows[1].out_of_place.wrong is None and run.skipped_lines == 1
    assert run.out_of_bounds is None


def test_what_the_rank_logs_show() -> None:
    from devtools.gpu_check.two_hosts import log_facts

    folder = RECORDED / "nccl-2.29.7" / "two-hosts" / "socket-lo"
    assert log_facts(sorted(folder.glob("rank*.nccl.log"))) == {
        "hostnames": ["gpu-node"],
        "processes": 2,
        "nccl_versions": ["2.29.7+cuda13.0"],
        "nnodes": ["2"],
        "networks": ["Socket"],
        "socket_interfaces": ["lo:127.0.0.1"],
        "warnings": 0,
    }


def test_processes_past_their_timeout_are_killed_with_their_children() -> None:
    """A rank that waits forever (here a shell whose child sleeps) ends at the timeout, child included."""
    import time

    from devtools.gpu_check.report import TIMED_OUT, run_command, run_together

    started = time.monotonic()
    marker = f"600.{os.getpid()}"  # sleep's seconds: unique to this test, found again with pgrep
    results = run_together(
        [(["sh", "-c", f"echo up; sleep {marker}"], dict(os.environ)), (["sh", "-c", "echo done"], dict(os.environ))],
        timeout=1.0,
    )
    assert time.monotonic() - started < 15
    assert results[0][0] == TIMED_OUT and results[0][1].startswith("up\n") and "timed out after 1s" in results[0][1]
    assert results[1] == (0, "done\n")
    code, _ = run_command(["sh", "-c", f"sleep {marker} & wait"], timeout=1.0)
    assert code == TIMED_OUT
    time.sleep(0.2)
    survivors = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, text=True).stdout.split()
    assert survivors == []


# The real Makefiles run g++; the stand-in compiles its one symbol as C, with the C compiler CI has.
FAKE_PLUGIN_MAKEFILE = """all: libnccl-profiler-inspector.so
libnccl-profiler-inspector.so: inspector_plugin.cc
\tgcc -shared -fPIC -x c -o $@ $<
"""


def test_inspector_plugin_is_built_from_a_source_tree(tmp_path: Path) -> None:
    """The build step runs the plugin folder's own Makefile in a copy (the source stays clean) and reports
    a failing build as FAILED with its log; no GPU here, so the job that would use it is skipped."""
    require_tool("make")
    require_tool("gcc")
    src = tmp_path / "nccl" / "plugins" / "profiler" / "inspector"
    src.mkdir(parents=True)
    (src / "Makefile").write_text(FAKE_PLUGIN_MAKEFILE)
    (src / "inspector_plugin.cc").write_text("int ncclProfiler_v5 = 5;\n")
    (tmp_path / "nccl" / "makefiles").mkdir()
    (tmp_path / "nccl" / "makefiles" / "version.mk").write_text(
        "NCCL_MAJOR   := 2\nNCCL_MINOR   := 29\nNCCL_PATCH   := 7\n"
    )
    out = tmp_path / "out"
    args = [
        "--nvidia-smi",
        str(tmp_path / "none"),
        "--nccl-src",
        str(tmp_path / "nccl"),
        "--sysfs",
        str(tmp_path),
        "--src-bundle",
        str(tmp_path / "no-bundle"),
    ]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), *args], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = summary_rows(out)
    assert rows["Inspector plugin build"] == (
        "OK",
        "libnccl-profiler-inspector.so from NCCL 2.29.7 plugins/profiler/inspector",
    )
    assert "make -j8 -C" in (out / "inspector-build.log").read_text()
    assert not (src / "libnccl-profiler-inspector.so").exists()
    assert rows["NCCL Inspector job"][0] == "SKIPPED"

    (src / "inspector_plugin.cc").write_text("this is not C\n")
    out = tmp_path / "out2"
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), *args], capture_output=True, timeout=180)
    status, detail = summary_rows(out)["Inspector plugin build"]
    assert status == "FAILED" and detail.startswith("make exit 2 in inspector (NCCL 2.29.7)"), detail


FAKE_ALL_REDUCE_PERF = """#!/bin/sh
# all_reduce_perf's stand-in: each rank leaves its NCCL_HOSTID and NCCL_TESTS_DEVICE; rank 0 prints the
# table (as nccl-tests prints it after gathering the ranks' device lines) once both are there.
echo "$NCCL_HOSTID $NCCL_TESTS_DEVICE $NCCL_IB_DISABLE $NCCL_SOCKET_IFNAME $*" > "$(dirname "$0")/rank-$OMPI_COMM_WORLD_RANK"
[ "$OMPI_COMM_WORLD_RANK" = 0 ] || exit 0
while [ ! -f "$(dirname "$0")/rank-1" ]; do sleep 0.1; done
cat "$(dirname "$0")/table.txt"
"""  # noqa: E501 - a shell script, its command on one line


def test_nccl_tests_run_as_two_hosts_under_mpirun(tmp_path: Path) -> None:
    """Two ranks under a real mpirun, one ``-np 1`` block each with its own NCCL_HOSTID, both on the GPU
    named by NCCL_TESTS_DEVICE, sockets on lo; rank 0's table is read as nccl-tests prints it."""
    mpirun = require_tool("mpirun")
    from devtools.gpu_check.bandwidth import run_nccl_tests
    from devtools.gpu_check.report import Report
    from devtools.gpu_check.sources import Mpi

    home = tmp_path / "mpi"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "mpirun").symlink_to(mpirun)
    build = tmp_path / "build"
    build.mkdir()
    binary = build / "all_reduce_perf"
    binary.write_text(FAKE_ALL_REDUCE_PERF)
    binary.chmod(0o755)
    (build / "table.txt").write_text((RECORDED / "nccl-2.28.9" / "nccl-tests-all_reduce_perf.txt").read_text())
    report = Report(tmp_path / "out", budget_seconds=300)
    run_nccl_tests(report, binary, Mpi(home, {}, "test"), 3, [tmp_path / "lib"])
    step = report.steps[-1]
    assert (step.name, step.status) == ("nccl-tests all_reduce_perf", "OK"), (
        step.detail + (tmp_path / "out" / "nccl-tests-all_reduce_perf.txt").read_text()
    )
    assert step.detail == "exit 0, 2 ranks, 5 sizes, out of bounds 0; nccl-tests-all_reduce_perf.txt"
    sweep = "-b 1M -e 256M -f 4 -n 20 -w 5 -g 1 -c 1"
    assert (build / "rank-0").read_text() == f"gpu-check-host-0 3 1 lo {sweep}\n"
    assert (build / "rank-1").read_text() == f"gpu-check-host-1 3 1 lo {sweep}\n"


def test_the_nccl_source_for_torchs_nccl_is_picked_from_the_carried_folder(tmp_path: Path) -> None:
    from devtools.gpu_check.sources import pick_nccl_source

    for tag, inspector in (("v2.28.9-1", "ext-profiler/inspector"), ("v2.29.7-1", "plugins/profiler/inspector")):
        tree = tmp_path / f"nccl-{tag}"
        (tree / inspector).mkdir(parents=True)
        (tree / inspector / "inspector_plugin.cc").write_text("")
        major, minor, patch = tag[1:].split("-")[0].split(".")
        (tree / "makefiles").mkdir()
        (tree / "makefiles" / "version.mk").write_text(
            f"##### version\nNCCL_MAJOR   := {major}\nNCCL_MINOR   := {minor}\n"
            f"NCCL_PATCH   := {patch}\nNCCL_SUFFIX  :=\n"
        )
    assert pick_nccl_source(tmp_path, "2.28.9") == (tmp_path / "nccl-v2.28.9-1", "NCCL 2.28.9 source nccl-v2.28.9-1")
    assert pick_nccl_source(tmp_path, "2.29.3") == (
        tmp_path / "nccl-v2.29.7-1",
        "NCCL 2.29.7 source nccl-v2.29.7-1 for torch's NCCL 2.29.3 (same minor release)",
    )
    tree, why = pick_nccl_source(tmp_path, "2.30.7")
    assert tree is None and why.endswith("(has nccl-v2.28.9-1 (2.28.9), nccl-v2.29.7-1 (2.29.7))")
    assert pick_nccl_source(tmp_path / "none", "2.28.9")[0] is None


FAKE_PYTHON = '''#!{python}
"""Stands in for the GPU machine's PyTorch Python: answers the facts query as torch 2.11 with NCCL
2.28.9 on an H200 would, and plays each NCCL worker and probe by writing the recorded run's output
where the real ones write theirs, after checking the environment gpu-check gave it."""
import json, os, shutil, sys
from pathlib import Path
RUN = Path({run!r})
args = sys.argv[1:]
if args[:3] == ["-m", "exporter", "probe"]:
    rank = args[args.index("--node-rank") + 1]
    assert os.environ["NCCL_HOSTID"] == f"gpu-check-host-{{rank}}", os.environ.get("NCCL_HOSTID")
    assert (os.environ["NCCL_SOCKET_IFNAME"], os.environ["CUDA_VISIBLE_DEVICES"]) == ("lo", "0")
    print("a warning the probe printed first")
    sys.stdout.write((RUN / "probe-rank0.json").read_text())
    sys.exit(0)
code = args[1]
if "GPU-CHECK-RESULT" not in code:  # the facts query
    print(json.dumps({{"python": "3.12.3", "torch": "2.11.0+cu130", "torch_cuda": "13.0", "nccl": "2.28.9",
                      "device_count": 1, "device": "NVIDIA H200", "capability": "90",
                      "nccl_lib": {nccl_lib!r}, "nccl_include": {nccl_include!r}}}))
    sys.exit(0)
rank = os.environ["RANK"]
assert os.environ["NCCL_HOSTID"] == f"gpu-check-host-{{rank}}" and os.environ["NCCL_MULTI_RANK_GPU_ENABLE"] == "1"
assert (os.environ["NCCL_DEBUG"], os.environ["NCCL_DEBUG_SUBSYS"]) == ("INFO", "INIT,NET")
ifname = os.environ.get("NCCL_SOCKET_IFNAME")
variant = "socket-lo" if ifname == "lo" else "socket-eth0" if ifname else "defaults"
assert (ifname is None) == ("NCCL_IB_DISABLE" not in os.environ)
shutil.copy(RUN / "two-hosts" / variant / f"rank{{rank}}.nccl.log", os.environ["NCCL_DEBUG_FILE"])
if os.environ.get("NCCL_INSPECTOR_ENABLE") == "1":
    source = sorted((RUN / "inspector").iterdir())[int(rank)]
    shutil.copy(source, Path(os.environ["NCCL_INSPECTOR_DUMP_DIR"]) / source.name)
    assert Path(os.environ["NCCL_PROFILER_PLUGIN"]).is_file()
print(f"GPU-CHECK-RESULT rank {{rank}}/2 all_reduce x5 value 32.0 want 32.0 nccl 2.28.9")
'''

FAKE_NCCL_TESTS_MAKEFILE = """$(BUILDDIR)/all_reduce_perf:
\tmkdir -p $(BUILDDIR)
\tcp ../fake_perf.sh $@ && cp ../table.txt $(BUILDDIR)/table.txt && chmod +x $@
\techo "MPI=$(MPI) $(NVCC_GENCODE) MPI_HOME=$(MPI_HOME)" > $(BUILDDIR)/made-with
"""


def test_a_live_run_on_a_stand_in_gpu_machine(fake_lib: Path, tmp_path: Path) -> None:
    """Every GPU step of a live run, in order and with the environment each gets, on a stand-in for
    the GPU machine: its Python answers as PyTorch with NCCL 2.28.9 would and writes the recorded run's
    NCCL logs, Inspector files and probe document where the real ones go; the Inspector plugin and
    nccl-tests are built by their own Makefiles (stand-ins) and nccl-tests runs under a real mpirun."""
    mpirun = require_tool("mpirun")
    require_tool("make")
    require_tool("gcc")
    run = RECORDED / "nccl-2.28.9"
    nccl = tmp_path / "nccl-wheel"
    (nccl / "lib").mkdir(parents=True)
    (nccl / "include").mkdir()
    (nccl / "lib" / "libnccl.so.2").write_text("")
    (nccl / "include" / "nccl.h").write_text("")
    python = tmp_path / "python3"
    python.write_text(
        FAKE_PYTHON.format(
            python=sys.executable,
            run=str(run),
            nccl_lib=str(nccl / "lib" / "libnccl.so.2"),
            nccl_include=str(nccl / "include"),
        )
    )
    python.chmod(0o755)
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    (cuda / "bin" / "nvcc").write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    (cuda / "bin" / "nvcc").chmod(0o755)
    mpi = tmp_path / "mpi"
    (mpi / "bin").mkdir(parents=True)
    (mpi / "include").mkdir()
    (mpi / "bin" / "mpirun").symlink_to(mpirun)
    (mpi / "include" / "mpi.h").write_text("")
    tests_src = tmp_path / "nccl-tests"
    (tests_src / "src").mkdir(parents=True)
    (tests_src / "src" / "Makefile").write_text(FAKE_NCCL_TESTS_MAKEFILE)
    (tests_src / "fake_perf.sh").write_text(FAKE_ALL_REDUCE_PERF)
    (tests_src / "table.txt").write_text((run / "nccl-tests-all_reduce_perf.txt").read_text())
    plugin = tmp_path / "nccl" / "ext-profiler" / "inspector"
    plugin.mkdir(parents=True)
    (plugin / "Makefile").write_text(FAKE_PLUGIN_MAKEFILE)
    (plugin / "inspector_plugin.cc").write_text("int ncclProfiler_v5 = 5;\n")
    sysfs = tmp_path / "sysfs"
    sysfs.mkdir()
    out = tmp_path / "out"
    archive = tmp_path / "back" / "gpu-check.tar.gz"
    env = {**os.environ, **fake_nvml_env(fake_lib), "CUDA_HOME": str(cuda)}
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--out",
            str(out),
            "--python",
            str(python),
            "--nvidia-smi",
            str(tmp_path / "none"),
            "--sysfs",
            str(sysfs),
            "--src-bundle",
            str(tmp_path / "no-bundle"),
            "--nccl-src",
            str(tmp_path / "nccl"),
            "--nccl-tests-src",
            str(tests_src),
            "--mpi-home",
            str(mpi),
            "--archive",
            str(archive),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = summary_rows(out)
    assert rows["torch"] == ("OK", "torch 2.11.0+cu130, NCCL 2.28.9, NVIDIA H200 (sm_90)")
    assert rows["two hosts socket-lo"] == (
        "OK",
        "2 ranks, NCCL_HOSTID per rank, NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo; 2 rank logs",
    )
    assert rows["two hosts defaults"] == ("OK", "2 ranks, NCCL_HOSTID per rank, no NCCL_* setting; 2 rank logs")
    assert rows["analyze socket-lo"] == ("OK", "exit 3, verdict tcp_fallback, network Socket, nodes 2")
    assert rows["exporter on pod logs, RDMA node"][0] == "OK"
    assert rows["Inspector plugin build"] == ("OK", "libnccl-profiler-inspector.so from NCCL ? ext-profiler/inspector")
    assert rows["NCCL Inspector job"] == ("OK", "20 all-reduces of 64 MiB on two hosts; 2 files in inspector/")
    assert rows["Inspector records"] == ("OK", "6 operations; counters vs records busbw differ by at most 0.00%")
    assert rows["ccl-exporter probe (NCCL, two hosts)"] == (
        "OK",
        "exit codes [0, 0], 2 result documents (probe-rank<r>.json)",
    )
    assert rows["nccl-tests build"] == ("OK", "all_reduce_perf with MPI=1, sm_90")
    assert rows["nccl-tests all_reduce_perf"] == (
        "OK",
        "exit 0, 2 ranks, 5 sizes, out of bounds 0; nccl-tests-all_reduce_perf.txt",
    )
    assert rows["probe vs nccl-tests"][0] == "FAILED"  # the recorded probe is gloo on a CPU
    build_log = (out / "nccl-tests-build.log").read_text()
    assert "NVCC_GENCODE=-gencode=arch=compute_90,code=sm_90" in build_log and f"MPI_HOME={mpi}" in build_log
    assert "NCCL_HOME=" in build_log and f"CUDA_HOME={cuda}" in build_log
    socket_variants = [name for name in rows if name.startswith("two hosts socket-") and name != "two hosts socket-lo"]
    for name in socket_variants:  # the machine's own interface, when it has one besides lo
        assert rows[name][0] == "OK" and "NCCL_SOCKET_IFNAME==" in rows[name][1]
    seconds = [
        float(line.split("|")[3])
        for line in (out / "summary.md").read_text().splitlines()
        if line.count("|") == 5 and line.split("|")[2].strip() in ("OK", "SKIPPED", "FAILED")
    ]
    assert len(seconds) == len(rows) and all(s >= 0 for s in seconds)
    import tarfile

    with tarfile.open(archive) as back:
        names = back.getnames()
    assert "out/summary.md" in names and "out/two-hosts/socket-lo/rank1.nccl.log" in names

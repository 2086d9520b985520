"""``ccl-exporter probe`` on the NCCL backend beside nccl-tests' ``all_reduce_perf``, size by size.

Both run the same two-host pair as ``two_hosts`` (two processes on the one GPU, ``NCCL_HOSTID``
per rank, IB disabled, sockets on ``lo``) over the same sizes (1 MiB to 256 MiB, x4; 5 warm-up
and 20 timed iterations), so their bus bandwidths measure the same thing:

* the probe as two one-rank "nodes" (``--nnodes 2 --node-rank r``, torch's static rendezvous on
  127.0.0.1); each node's first rank prints the result document (``--json``);
* nccl-tests built from source on this machine (``make`` of ``src/``'s ``all_reduce_perf`` only,
  for this GPU's architecture, against torch's NCCL), two ranks under ``mpirun`` (one
  ``-np 1`` block per rank, each with its ``NCCL_HOSTID``; ``NCCL_TESTS_DEVICE`` puts both on the
  GPU). Without an MPI it is built with ``MPI=0`` and runs one rank (``-g 1``): its all-reduce then
  has a bus bandwidth of 0 by definition, and the comparison says so.

The nccl-tests table is read as NVIDIA/nccl-tests writes it (src/util.cu ``writeResultHeader``,
``writeBenchmarkLinePreamble``, ``writeBenchmarkLineBody``, ``writeResultFooter``; the rank
lines of ``writeDeviceReport``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from devtools.gpu_check.report import (
    FAILED,
    OK,
    SKIPPED,
    Report,
    clean_env,
    free_port,
    repo_env,
    run_command,
    run_together,
)
from devtools.gpu_check.sources import Mpi
from devtools.gpu_check.two_hosts import HOST_ID, NCCL_LOG_ENV, RANKS

SWEEP = ("-b", "1M", "-e", "256M", "-f", "4", "-n", "20", "-w", "5")
SOCKETS_ON_LO = {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "lo", "NCCL_MULTI_RANK_GPU_ENABLE": "1"}
PROBE_JSON = "probe-rank{rank}.json"
TESTS_OUTPUT = "nccl-tests-all_reduce_perf.txt"
COMPARE_TEXT = "bandwidth-compare.txt"
COMPARE_JSON = "bandwidth-compare.json"
GB = 1e9  # nccl-tests' GB/s
# The busbw ratio (probe / nccl-tests) at the largest size both ran, outside which the step fails.
RATIO_RANGE = (0.5, 2.0)


# --- the probe ------------------------------------------------------------------------------------


def json_document(text: str) -> str | None:
    """The JSON object a command printed among other lines (the first line that starts one)."""
    decoder = json.JSONDecoder()
    for match in re.finditer(r"(?m)^\{", text):
        try:
            document, _ = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        if isinstance(document, dict):
            return json.dumps(document, indent=1, sort_keys=True) + "\n"
    return None


def run_probe(report: Report, gpu: int, python: str) -> None:
    """The probe as two one-rank nodes; each node's result document in ``probe-rank<r>.json``."""
    step = "ccl-exporter probe (NCCL, two hosts)"
    timeout = report.timeout(150)
    if timeout is None:
        report.out_of_time(step)
        return
    port = free_port()
    commands = []
    for rank in range(RANKS):
        argv = [python, "-m", "exporter", "probe", "--backend", "nccl", "--nprocs", "1", "--nnodes", str(RANKS),
                "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", str(port), "--json",
                "--no-write", "--timeout", f"{max(10.0, timeout - 10):.0f}", *SWEEP]  # fmt: skip
        env = repo_env(base=clean_env({**SOCKETS_ON_LO, "NCCL_HOSTID": HOST_ID.format(rank=rank)}))
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        commands.append((argv, env))
    results = run_together(commands, timeout)
    documents = 0
    for rank, (code, out) in enumerate(results):
        report.write(f"probe-rank{rank}.log", f"exit {code}\n{out}")
        document = json_document(out)
        if document is not None:
            report.write(PROBE_JSON.format(rank=rank), document)
            documents += 1
    codes = [code for code, _ in results]
    status = OK if codes == [0] * RANKS and documents == RANKS else FAILED
    report.add(step, status, f"exit codes {codes}, {documents} result documents ({PROBE_JSON.format(rank='<r>')})")


def read_probe(folder: Path) -> tuple[Any | None, str]:
    """Rank 0's result document as the exporter reads result files (exporter.results.probe_file)."""
    from exporter.results.probe_file import MalformedResult, parse_result

    path = folder / PROBE_JSON.format(rank=0)
    try:
        return parse_result(path.read_text()), ""
    except OSError:
        return None, f"no {path.name}"
    except MalformedResult as exc:
        return None, f"{path.name}: {exc}"


# --- nccl-tests -----------------------------------------------------------------------------------


def build_nccl_tests(
    report: Report,
    src: Path | None,
    why_none: str,
    nccl_home: Path | None,
    cuda: Path | None,
    mpi: Mpi | None,
    capability: str | None,
    scratch: Path,
) -> Path | None:
    """``all_reduce_perf`` built from a copy of ``src``; its path, None when it was not built."""
    step = "nccl-tests build"
    missing = [
        why
        for ok, why in (
            (src is not None and (src / "src" / "Makefile").is_file(), why_none or f"no src/Makefile in {src}"),
            (nccl_home is not None, "no NCCL_HOME (torch's NCCL headers and library)"),
            (cuda is not None and (cuda / "bin" / "nvcc").is_file(), "no CUDA toolkit with bin/nvcc (CUDA_HOME)"),
        )
        if not ok
    ]
    if missing or src is None:
        report.add(step, SKIPPED, "; ".join(missing))
        return None
    timeout = report.timeout(240)
    if timeout is None:
        report.out_of_time(step)
        return None
    tree = scratch / "nccl-tests"
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree(src, tree, ignore=shutil.ignore_patterns("build", ".git"))
    build = tree / "build"
    argv = ["make", "-j16", "-C", str(tree / "src"), f"BUILDDIR={build}", str(build / "all_reduce_perf"),
            f"NCCL_HOME={nccl_home}", f"CUDA_HOME={cuda}", f"MPI={1 if mpi else 0}"]  # fmt: skip
    if capability:
        argv.append(f"NVCC_GENCODE=-gencode=arch=compute_{capability},code=sm_{capability}")
    if mpi is not None:
        argv.append(f"MPI_HOME={mpi.home}")
    env = {**os.environ, **(mpi.env if mpi else {})}
    code, out = run_command(argv, timeout, env)
    report.write("nccl-tests-build.log", f"$ {' '.join(argv)}\n{out}")
    binary = build / "all_reduce_perf"
    if code != 0 or not binary.is_file():
        report.add(step, FAILED, f"make exit {code}; see nccl-tests-build.log")
        return None
    report.add(step, OK, f"all_reduce_perf with MPI={1 if mpi else 0}, sm_{capability or 'default'}")
    return binary


def run_nccl_tests(report: Report, binary: Path | None, mpi: Mpi | None, gpu: int, library_dirs: list[Path]) -> None:
    step = "nccl-tests all_reduce_perf"
    if binary is None:
        report.add(step, SKIPPED, "not built")
        return
    timeout = report.timeout(150)
    if timeout is None:
        report.out_of_time(step)
        return
    logs = report.out / "nccl-tests"
    logs.mkdir(parents=True, exist_ok=True)
    paths = [str(p) for p in library_dirs] + ([str(mpi.home / "lib")] if mpi else [])
    paths += [os.environ["LD_LIBRARY_PATH"]] if os.environ.get("LD_LIBRARY_PATH") else []
    shared = {**NCCL_LOG_ENV, **SOCKETS_ON_LO, "NCCL_TESTS_DEVICE": str(gpu),
              "NCCL_DEBUG_FILE": str(logs / "rank-%p.nccl.log"), "LD_LIBRARY_PATH": os.pathsep.join(paths)}  # fmt: skip
    args = [*SWEEP, "-g", "1", "-c", "1"]
    if mpi is None:
        argv = [str(binary), *args]
        env = clean_env(shared)
    else:
        argv = [str(mpi.home / "bin" / "mpirun"), "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
        for rank in range(RANKS):
            exported = {**shared, "NCCL_HOSTID": HOST_ID.format(rank=rank)}
            if rank:
                argv.append(":")
            argv += ["-np", "1", *(a for k, v in exported.items() for a in ("-x", f"{k}={v}")), str(binary), *args]
        env = clean_env({**mpi.env, "PATH": os.pathsep.join([str(mpi.home / "bin"), os.environ.get("PATH", "")])})
        env.setdefault("HOME", tempfile.gettempdir())  # Open MPI reads its settings from $HOME and fails without one
    code, out = run_command(argv, timeout, env)
    report.write(TESTS_OUTPUT, out)
    parsed = parse_nccl_tests(out)
    ranks = len(parsed.ranks)
    detail = f"exit {code}, {ranks} ranks, {len(parsed.rows)} sizes, out of bounds {parsed.out_of_bounds}"
    good = code == 0 and bool(parsed.rows) and parsed.out_of_bounds == 0
    report.add(step, OK if good else FAILED, detail + f"; {TESTS_OUTPUT}")


@dataclasses.dataclass(frozen=True)
class Result:
    time_us: float
    algbw: float  # GB/s
    busbw: float
    wrong: int | None  # None: "N/A" (data not checked)


@dataclasses.dataclass(frozen=True)
class TestsRow:
    size: int
    count: int
    type: str
    redop: str
    root: int
    out_of_place: Result
    in_place: Result


@dataclasses.dataclass
class TestsRun:
    header: str = ""  # "# nccl-tests version 2.19.6 nccl-headers=22809 nccl-library=22809"
    ranks: list[str] = dataclasses.field(default_factory=list)  # the "#  Rank  0 Group ..." lines
    rows: list[TestsRow] = dataclasses.field(default_factory=list)
    out_of_bounds: int | None = None
    average_busbw: float | None = None
    skipped_lines: int = 0  # lines that looked like table rows but did not read as one


_RANK_RE = re.compile(r"^#\s+Rank\s+\d+\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+\S+\s+device\s+\d+")
_OOB_RE = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)")
_AVG_RE = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)")


def _result(cells: list[str]) -> Result:
    wrong = None if cells[3] == "N/A" else int(float(cells[3]))
    return Result(float(cells[0]), float(cells[1]), float(cells[2]), wrong)


def parse_nccl_tests(text: str) -> TestsRun:
    """The table and footer of an nccl-tests run (without -I per-iteration columns; a trailing
    timestamp column of -S is ignored). Lines of other programs (NCCL's INFO lines when
    NCCL_DEBUG goes to stdout, mpirun's) are passed over."""
    run = TestsRun()
    for line in text.splitlines():
        if line.startswith("# nccl-tests version"):
            run.header = line
        elif _RANK_RE.match(line):
            run.ranks.append(line)
        elif found := _OOB_RE.match(line):
            run.out_of_bounds = int(found.group(1))
        elif found := _AVG_RE.match(line):
            try:
                run.average_busbw = float(found.group(1))
            except ValueError:
                run.average_busbw = None
        elif re.match(r"^\s+\d+\s+\d+\s+\S+\s+\S+\s+-?\d+\s", line):
            cells = line.split()
            try:
                run.rows.append(
                    TestsRow(int(cells[0]), int(cells[1]), cells[2], cells[3], int(cells[4]),
                             _result(cells[5:9]), _result(cells[9:13]))
                )  # fmt: skip
            except (ValueError, IndexError):
                run.skipped_lines += 1
    return run


# --- side by side --------------------------------------------------------------------------------


def compare(report: Report, folder: Path) -> None:
    """Per size: the probe's bus bandwidth beside nccl-tests' (out-of-place and in-place)."""
    step = "probe vs nccl-tests"
    probe, why_probe = read_probe(folder)
    tests_path = folder / TESTS_OUTPUT
    tests = parse_nccl_tests(tests_path.read_text(errors="replace")) if tests_path.is_file() else None
    probe_rows = {}
    if probe is not None:
        for collective in probe.collectives:
            if collective.collective == "all_reduce":
                probe_rows = {r.size_bytes: r for r in collective.rows}
    tests_rows = {r.size: r for r in tests.rows} if tests is not None else {}
    probe_ranks = probe.world_size if probe is not None else None
    tests_ranks = len(tests.ranks) if tests is not None else None
    lines = [
        f"all_reduce bus bandwidth (GB/s): ccl-exporter probe ({probe_ranks or '-'} ranks, "
        f"transport {probe.transport.name if probe else '-'}) | nccl-tests all_reduce_perf "
        f"({tests_ranks or '-'} ranks; out-of-place, in-place)",
        "",
        f"{'size (B)':>12}  {'probe':>8}  {'tests oop':>9}  {'tests ip':>8}  {'probe/oop':>9}",
    ]
    rows = []
    for size in sorted(set(probe_rows) | set(tests_rows)):
        p, t = probe_rows.get(size), tests_rows.get(size)
        probe_bw = p.busbw_bytes_per_second / GB if p is not None else None
        oop = t.out_of_place.busbw if t is not None else None
        ratio = probe_bw / oop if probe_bw is not None and oop else None
        rows.append({"size_bytes": size, "probe_busbw_gbs": probe_bw, "tests_busbw_gbs_out_of_place": oop,
                     "tests_busbw_gbs_in_place": t.in_place.busbw if t else None, "ratio": ratio})  # fmt: skip

        def cell(v: float | None, width: int) -> str:
            return f"{v:>{width}.2f}" if v is not None else f"{'-':>{width}}"

        lines.append(
            f"{size:>12}  {cell(probe_bw, 8)}  {cell(oop, 9)}  {cell(t.in_place.busbw if t else None, 8)}  "
            f"{cell(ratio, 9)}"
        )
    report.write(COMPARE_TEXT, "\n".join(lines) + "\n")
    report.write(
        COMPARE_JSON,
        json.dumps({"probe_ranks": probe_ranks, "tests_ranks": tests_ranks, "rows": rows}, indent=1) + "\n",
    )
    if probe is not None:
        report.finding(
            f"probe result: {probe.world_size} ranks, nnodes {probe.nnodes} (the probe counts hostnames), "
            f"scope {probe.scope or '-'}, transport {probe.transport.kind} {probe.transport.name} "
            f"(network {probe.transport.network}); {(probe.transport.reasons or ('no reason given',))[0]}"
        )
    if probe is None or tests is None or not tests.rows:
        missing = why_probe if probe is None else f"no nccl-tests table in {TESTS_OUTPUT}"
        report.add(step, SKIPPED, f"needs both sides: {missing}; {COMPARE_TEXT} lists what there is")
        return
    problems = []
    if any(r.wrong for r in probe_rows.values()):
        problems.append("the probe counted wrong values")
    if tests.out_of_bounds:
        problems.append(f"nccl-tests counted {tests.out_of_bounds} out-of-bounds values")
    if probe_ranks != tests_ranks:
        problems.append(f"the probe ran {probe_ranks} ranks, nccl-tests {tests_ranks} (no MPI: one rank, busbw 0)")
    common = [r for r in rows if r["ratio"] is not None]
    if not common:
        problems.append("no size with a bus bandwidth on both sides")
    else:
        last = common[-1]
        ratio = last["ratio"]
        low, high = RATIO_RANGE
        if ratio is None or not low <= ratio <= high:
            problems.append(f"at {last['size_bytes']} B the probe gets {ratio:.2f}x nccl-tests' busbw")
    detail = f"{len(common)} sizes side by side in {COMPARE_TEXT}"
    if common:
        last = common[-1]
        detail += (
            f"; at {last['size_bytes']} B probe {last['probe_busbw_gbs']:.2f} GB/s, "
            f"nccl-tests {last['tests_busbw_gbs_out_of_place']:.2f} GB/s"
        )
    report.add(step, FAILED if problems else OK, detail + (f"; {'; '.join(problems)}" if problems else ""))

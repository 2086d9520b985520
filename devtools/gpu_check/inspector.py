"""The NCCL Inspector plugin built from NCCL's source on this machine, its own output of an
all-reduce loop, and its records as the exporter reads them.

The plugin is not in NCCL's wheels: its folder (``ext-profiler/inspector`` in 2.28,
``plugins/profiler/inspector`` from 2.29.7) is built with its own Makefile, in a copy outside the
source tree, for the NCCL release torch runs (the carried folder's ``nccl-v<release>/``, or
``--nccl-src``). 2.28's Makefile needs only a C++ compiler (``-march=native`` is right here: it
builds where it runs); 2.29 on also CUDA's headers and ``libcudart`` (``CUDA_HOME``). The job is
the two-host pair of ``two_hosts`` on sockets over ``lo`` (inter-node records, ``nnodes`` 2): 20
all-reduces of 64 MiB with ``NCCL_PROFILER_PLUGIN`` and ``NCCL_INSPECTOR_ENABLE=1``, dumping
every millisecond (JSON Lines, one ``<hostname>-pid<pid>.log`` per process).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from devtools.gpu_check.report import FAILED, OK, SKIPPED, Report, run_command
from devtools.gpu_check.sources import inspector_dir, nccl_source_version
from devtools.gpu_check.two_hosts import run_ranks, skip_reason

PLUGIN = "libnccl-profiler-inspector.so"
INSPECTOR_DIR = "inspector"
JOB_DIR = "inspector-job"
JOB_ITERATIONS = 20
JOB_ELEMENTS = 16 << 20  # float32: 64 MiB


def build_plugin(
    report: Report, nccl_root: Path | None, why_none: str, scratch: Path, cuda: Path | None
) -> Path | None:
    """``make`` in a copy of the plugin's folder; the built library, None when it could not be built."""
    step = "Inspector plugin build"
    plugin_src = inspector_dir(nccl_root) if nccl_root is not None else None
    if plugin_src is None:
        report.add(step, SKIPPED, why_none if nccl_root is None else f"no Inspector plugin folder in {nccl_root}")
        return None
    timeout = report.timeout(180)
    if timeout is None:
        report.out_of_time(step)
        return None
    build = scratch / "inspector-build"
    shutil.rmtree(build, ignore_errors=True)
    shutil.copytree(plugin_src, build, ignore=shutil.ignore_patterns("obj", "*.so", "*.o"))
    env = dict(os.environ)
    if cuda is not None:
        env["CUDA_HOME"] = str(cuda)
    argv = ["make", "-j8", "-C", str(build)]
    code, out = run_command(argv, timeout, env)
    version = nccl_source_version(nccl_root) if nccl_root is not None else None
    report.write("inspector-build.log", f"$ CUDA_HOME={cuda or ''} {' '.join(argv)}\n{out}")
    library = build / PLUGIN
    if code != 0 or not library.is_file():
        report.add(
            step, FAILED, f"make exit {code} in {plugin_src.name} (NCCL {version or '?'}); see inspector-build.log"
        )
        return None
    report.add(
        step, OK, f"{PLUGIN} from NCCL {version or '?'} {plugin_src.relative_to(nccl_root) if nccl_root else ''}"
    )
    return library


def inspector_job(report: Report, gpu: int, plugin: Path | None, gpu_skipped: str | None, python: str) -> Path | None:
    """The two-host all-reduce loop with the plugin; its dump folder."""
    step = "NCCL Inspector job"
    if gpu_skipped is not None:
        report.add(step, SKIPPED, f"no GPU job can run here: {gpu_skipped}")
        return None
    if plugin is None or not plugin.is_file():
        report.add(step, SKIPPED, "no Inspector plugin (see the build step, or pass --inspector-plugin)")
        return None
    timeout = report.timeout(120)
    if timeout is None:
        report.out_of_time(step)
        return None
    dump = report.out / INSPECTOR_DIR
    dump.mkdir(parents=True, exist_ok=True)
    env = {
        "NCCL_IB_DISABLE": "1",
        "NCCL_SOCKET_IFNAME": "lo",
        "NCCL_PROFILER_PLUGIN": str(plugin),
        "NCCL_INSPECTOR_ENABLE": "1",
        "NCCL_INSPECTOR_DUMP_DIR": str(dump),
        "NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS": "1000",
    }
    codes, outputs = run_ranks(report.out / JOB_DIR, gpu, env, timeout, python, JOB_ITERATIONS, JOB_ELEMENTS)
    if all(code == 3 for code in codes):
        report.add(step, SKIPPED, skip_reason(outputs) or "the workers could not start NCCL")
        return None
    files = sorted(p.name for p in dump.iterdir() if p.is_file())
    if any(code != 0 for code in codes):
        report.add(step, FAILED, f"exit codes {codes}; see {JOB_DIR}/; {len(files)} files in {INSPECTOR_DIR}/")
        return dump if files else None
    report.add(step, OK, f"{JOB_ITERATIONS} all-reduces of 64 MiB on two hosts; {len(files)} files in {INSPECTOR_DIR}/")
    return dump


def inspector_records(report: Report, dump: Path | None) -> None:
    """The Inspector's records as the exporter reads them, printed and written, with the bus
    bandwidth the exporter's counters give beside the records' own (time-weighted)."""
    if dump is None:
        report.add("Inspector records", SKIPPED, "no Inspector output")
        return
    from exporter.collectors.inspector import bus_bytes
    from exporter.nccl.inspector import parse_json_record, parse_prom

    operations: list[Any] = []
    skipped: dict[str, int] = {}
    worst = 0.0
    lines: list[str] = []
    for path in sorted(p for p in dump.rglob("*") if p.is_file()):
        text = path.read_text(errors="replace")
        if path.suffix == ".prom":
            parsed = parse_prom(text)
            operations += parsed.operations
            for reason, count in parsed.skipped.items():
                skipped[reason] = skipped.get(reason, 0) + count
            continue
        for line in text.splitlines():
            op = parse_json_record(line)
            if isinstance(op, str):
                skipped[op] = skipped.get(op, 0) + 1
                continue
            operations.append(op)
            lines.append(f"{path.name}: {line}")
    if not operations:
        report.add("Inspector records", FAILED, f"no record in {dump.name}/ (skipped: {skipped or 'none'})")
        return
    rows = [f"{len(operations)} operations (skipped: {skipped or 'none'})", ""]
    by_key: dict[tuple[str, str, str], list[Any]] = {}
    for op in operations:
        by_key.setdefault((op.collective, op.scope, op.size_class), []).append(op)
    for key, ops in sorted(by_key.items()):
        seconds = sum(op.seconds for op in ops)
        if seconds <= 0:
            rows.append(f"{' '.join(key)}: {len(ops)} ops of no measured time")
            continue
        ours = sum(bus_bytes(op) for op in ops) / seconds
        theirs = sum((op.stated_bus_bandwidth or 0.0) * op.seconds for op in ops) / seconds
        worst = max(worst, abs(ours - theirs) / theirs if theirs else 0.0)
        rows.append(
            f"{' '.join(key)}: {len(ops)} ops, bus bandwidth {ours / 1e9:.2f} GB/s from the counters, "
            f"{theirs / 1e9:.2f} GB/s in the records"
        )
    rows += ["", "records:", *lines]
    text = "\n".join(rows) + "\n"
    report.write("inspector-records.txt", text)
    print(text, end="", flush=True)
    report.add(
        "Inspector records",
        OK if worst <= 0.01 else FAILED,
        f"{len(operations)} operations; counters vs records busbw differ by at most {worst * 100:.2f}%",
    )

"""The command line of ``scripts/gpu-check`` and the order of its steps.

Live (the default): every step runs on this machine; the GPU steps are SKIPPED, with the reason,
where PyTorch, CUDA, a GPU or a carried source is missing. Recorded (``--recorded FOLDER``): a
previous run's folder is analysed again, with no GPU: ``analyze`` on its rank logs, the exporter on
them as pod logs, the Inspector's records, the probe beside nccl-tests.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata as md
import os
import platform
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

from devtools.gpu_check import bandwidth, hardware, inspector, pod_logs, sources, two_hosts
from devtools.gpu_check.report import OK, REPO, SKIPPED, Report, run_command

DEFAULT_BUDGET_SECONDS = 540.0
# Files a run writes from what it reads (rewritten by --recorded); everything else is its input.
DERIVED = ("summary.md", "pod-logs", "inspector-records.txt", "bandwidth-compare.txt", "bandwidth-compare.json")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/gpu-check",
        description="The exporter against a real GPU, NCCL and NVML: NVML and topology next to nvidia-smi, "
        "two NCCL 'hosts' on one GPU (Socket fallback) analysed and tailed as pod logs, the NCCL Inspector "
        "plugin's own output, and the probe beside nccl-tests. Writes docs/gpu-check/<UTC date>/.",
    )
    parser.add_argument("--gpu", type=int, default=0, help="GPU index to compare and to run NCCL on")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default docs/gpu-check/<UTC date>)")
    parser.add_argument("--python", default=sys.executable, help="the Python that holds PyTorch (default: this one)")
    parser.add_argument("--nvidia-smi", default="nvidia-smi", dest="smi", help="nvidia-smi to run")
    parser.add_argument("--sysfs", type=Path, default=Path("/sys"), help="sysfs to read the PCI tree from")
    parser.add_argument(
        "--src-bundle",
        type=Path,
        default=REPO / sources.BUNDLE_NAME,
        help="the carried sources made by scripts/fetch-gpu-check-src (default: .gpu-check-src in the repository)",
    )
    parser.add_argument("--nccl-src", type=Path, default=None, help="an NVIDIA/nccl tree (instead of the bundle's)")
    parser.add_argument("--nccl-tests-src", type=Path, default=None, help="an NVIDIA/nccl-tests tree")
    parser.add_argument("--nccl-home", type=Path, default=None, help="NCCL to build nccl-tests against")
    parser.add_argument("--mpi-home", type=Path, default=None, help="an MPI (bin/mpirun, include/mpi.h, lib/)")
    parser.add_argument(
        "--inspector-plugin",
        type=Path,
        default=Path(os.environ["NCCL_PROFILER_PLUGIN"]) if os.environ.get("NCCL_PROFILER_PLUGIN") else None,
        help="a built libnccl-profiler-inspector.so (default: $NCCL_PROFILER_PLUGIN; else built from source)",
    )
    parser.add_argument("--inspector-dir", type=Path, default=None, help="read this Inspector output, run no job")
    parser.add_argument("--nccl-log", type=Path, default=None, help="analyze this NCCL log, run no NCCL job")
    parser.add_argument("--recorded", type=Path, default=None, help="analyse a previous run's folder again")
    parser.add_argument(
        "--budget", type=float, default=DEFAULT_BUDGET_SECONDS, help="seconds the whole run may take (default 540)"
    )
    parser.add_argument("--archive", type=Path, default=None, help="also write the folder as this .tar.gz")
    return parser.parse_args(argv)


def default_out() -> Path:
    now = dt.datetime.now(dt.timezone.utc)
    out = REPO / "docs" / "gpu-check" / f"{now:%Y-%m-%d}"
    if out.exists() and any(out.iterdir()):
        out = out.with_name(f"{now:%Y-%m-%d-%H%M%S}")
    return out


def environment(report: Report, args: argparse.Namespace, facts: sources.TorchFacts, cuda: Path | None) -> None:
    def version(dist: str) -> str:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return "not installed"

    lines = [
        f"python {platform.python_version()} ({sys.executable}); torch's python {args.python}",
        f"kernel {platform.release()} {platform.machine()}",
        f"nvidia-ml-py {version('nvidia-ml-py')}",
        f"torch facts: {facts.raw.strip().splitlines()[-1] if facts.raw.strip() else '-'}",
        f"CUDA_HOME {cuda or 'not found'}",
        f"interfaces {', '.join(f'{n} {a}' for n, a in two_hosts.ipv4_interfaces())}",
    ]
    if cuda is not None and (cuda / "bin" / "nvcc").is_file():
        _, text = run_command([str(cuda / "bin" / "nvcc"), "--version"], timeout=30)
        lines.append("nvcc " + (text.strip().splitlines() or ["?"])[-1])
    path = shutil.which(args.smi)
    if path:
        _, text = run_command([path, "--query-gpu=index,name,driver_version,pci.bus_id", "--format=csv"], timeout=60)
        lines += ["", "nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id:", text.strip()]
    report.write("environment.txt", "\n".join(lines) + "\n")


def analyse_two_hosts(report: Report, folder: Path) -> dict[str, list[Path]]:
    """``analyze`` on each variant's rank logs under ``folder/two-hosts``, with what the logs show."""
    found: dict[str, list[Path]] = {}
    base = folder / two_hosts.TWO_HOSTS_DIR
    for variant_dir in sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []:
        logs = two_hosts.rank_logs(variant_dir)
        if not logs:
            continue
        name = variant_dir.name
        must = name.startswith(pod_logs.MUST_FALL_BACK)
        verdict = two_hosts.analyze(
            report, f"analyze {name}", logs, report.out / two_hosts.TWO_HOSTS_DIR / name / "analyze.json", must
        )
        meaning = "IB disabled, Socket" if must else "NCCL's own choice"
        report.finding(two_hosts.explain(name, meaning, two_hosts.log_facts(logs), verdict))
        found[name] = logs
    if not found:
        report.add("analyze", SKIPPED, "no rank logs (no two-host run wrote one)")
    return found


def live(report: Report, args: argparse.Namespace, scratch: Path) -> None:
    cuda = sources.cuda_home()
    timeout = report.timeout(120) or 15.0
    facts = sources.torch_facts(args.python, args.gpu, timeout)
    environment(report, args, facts, cuda)
    if facts.skip is None:
        report.add("torch", OK, f"torch {facts.torch}, NCCL {facts.nccl}, {facts.device} (sm_{facts.capability})")
    else:
        report.add("torch", SKIPPED, facts.skip)
    ours = hardware.collect_ours(report)
    smi = hardware.run_nvidia_smi(report, args.smi, args.gpu)
    hardware.compare(report, ours, smi, args.gpu)
    hardware.compare_topology(report, hardware.our_topology(report, args.sysfs), smi)

    if args.nccl_log is not None:
        given = report.out / two_hosts.TWO_HOSTS_DIR / "given"
        given.mkdir(parents=True, exist_ok=True)
        (given / "rank0.nccl.log").write_text(args.nccl_log.read_text(errors="replace"))
        report.add("two hosts", SKIPPED, f"not run: analyzing the given log {args.nccl_log.name}")
    elif facts.skip is not None:
        report.add("two hosts", SKIPPED, f"no GPU job can run here: {facts.skip}")
    else:
        chosen, why = two_hosts.variants(two_hosts.ipv4_interfaces())
        if why:
            report.finding(f"no non-loopback variant: {why}")
        for variant in chosen:
            two_hosts.run_variant(report, variant, args.gpu, report.out, args.python)
    rank_logs = analyse_two_hosts(report, report.out)
    pod_logs.exporter_on_pod_logs(report, rank_logs, args.sysfs, scratch)

    if args.inspector_dir is not None:
        report.add("NCCL Inspector job", SKIPPED, f"not run: reading the given output {args.inspector_dir}")
        inspector.inspector_records(report, args.inspector_dir)
    else:
        plugin = args.inspector_plugin
        if plugin is None:
            if args.nccl_src is not None:
                nccl_root, why = args.nccl_src, ""
            else:
                nccl_root, why = sources.pick_nccl_source(args.src_bundle, facts.nccl)
            plugin = inspector.build_plugin(report, nccl_root, why, scratch, cuda)
        inspector.inspector_records(report, inspector.inspector_job(report, args.gpu, plugin, facts.skip, args.python))

    if facts.skip is not None:
        report.add("ccl-exporter probe (NCCL, two hosts)", SKIPPED, f"no GPU job can run here: {facts.skip}")
    else:
        bandwidth.run_probe(report, args.gpu, args.python)
    tests_src = args.nccl_tests_src or (args.src_bundle / "nccl-tests")
    why_tests = "" if (tests_src / "src").is_dir() else f"no nccl-tests source ({tests_src}; --nccl-tests-src)"
    nccl_home, why_home = sources.nccl_home(facts, args.nccl_home, scratch)
    mpi = None
    if not why_tests and nccl_home is not None and cuda is not None:
        mpi, why_mpi = sources.find_mpi(args.mpi_home, args.src_bundle, scratch, report.timeout(120) or 15.0)
        if mpi is None:
            report.finding(f"nccl-tests without MPI (one rank): {why_mpi}")
    elif nccl_home is None:
        report.finding(f"nccl-tests: {why_home}")
    binary = bandwidth.build_nccl_tests(
        report, tests_src if not why_tests else None, why_tests, nccl_home, cuda, mpi, facts.capability, scratch
    )
    library_dirs = [p for p in (facts.nccl_lib.parent if facts.nccl_lib else None, cuda and cuda / "lib64") if p]
    if binary is not None and facts.skip is not None:
        report.add("nccl-tests all_reduce_perf", SKIPPED, f"no GPU job can run here: {facts.skip}")
    else:
        bandwidth.run_nccl_tests(report, binary, mpi, args.gpu, library_dirs)
    bandwidth.compare(report, report.out)


def recorded(report: Report, args: argparse.Namespace, scratch: Path) -> None:
    source: Path = args.recorded
    if source.resolve() != report.out.resolve():
        shutil.copytree(source, report.out, dirs_exist_ok=True, ignore=shutil.ignore_patterns(*DERIVED))
    else:
        shutil.rmtree(report.out / pod_logs.POD_LOGS_DIR, ignore_errors=True)
    report.add("recorded run", OK, f"analysing the files of {source} again; nothing runs on a GPU")
    rank_logs = analyse_two_hosts(report, report.out)
    pod_logs.exporter_on_pod_logs(report, rank_logs, args.sysfs, scratch)
    dump = report.out / inspector.INSPECTOR_DIR
    inspector.inspector_records(report, dump if dump.is_dir() and any(dump.iterdir()) else None)
    bandwidth.compare(report, report.out)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out: Path = args.out or (args.recorded if args.recorded is not None else default_out())
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"gpu-check: cannot create {out}: {exc}", file=sys.stderr)
        return 1
    if args.recorded is not None and not args.recorded.is_dir():
        print(f"gpu-check: --recorded {args.recorded} is not a folder", file=sys.stderr)
        return 1
    report = Report(out, args.budget)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        if args.recorded is not None:
            recorded(report, args, Path(tmp))
        else:
            live(report, args, Path(tmp))
    title = f"GPU check, GPU {args.gpu}" if args.recorded is None else f"GPU check, recorded run {args.recorded.name}"
    report.write("summary.md", report.summary(title))
    if args.archive is not None:
        args.archive.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(args.archive, "w:gz") as archive:
            archive.add(out, arcname=out.name)
        print(f"gpu-check: archived to {args.archive}")
    print(f"gpu-check: wrote {out}")
    return 0

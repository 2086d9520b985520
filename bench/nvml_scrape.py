"""NVML scrape cost for 8 GPUs x 18 NVLinks: one batched call per GPU vs one call per value.

Both sides run the real pynvml binding against the fake libnvidia-ml (tests/fakenvml, built
here with gcc) in this process and produce the same metric families; only the call pattern
differs. The fake counts every NVML call. A real driver spends far longer per call than the
fake (an ioctl into the kernel module), so the run is repeated with a modeled per-call
latency (FAKE_NVML_CALL_LATENCY_US) to show how the call count turns into scrape time.

    python -m bench.nvml_scrape [--scrapes N]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import BenchResult

REPO = Path(__file__).resolve().parent.parent
GPUS, LINKS = 8, 18


def _load_fake(build_dir: Path) -> ctypes.CDLL:
    gcc = shutil.which("gcc")
    if gcc is None:
        raise SystemExit("bench.nvml_scrape needs gcc to build the fake libnvidia-ml")
    sys.path.insert(0, str(REPO))
    from tests.fakenvml import LIBRARY_NAME, build_fake_nvml

    build_fake_nvml(gcc, build_dir)
    # Loaded by absolute path first, pynvml's dlopen("libnvidia-ml.so.1") finds it by SONAME.
    lib = ctypes.CDLL(str(build_dir / LIBRARY_NAME), mode=ctypes.RTLD_GLOBAL)
    lib.fakeNvmlCallCount.restype = ctypes.c_ulonglong
    lib.fakeNvmlCallCount.argtypes = [ctypes.c_char_p]
    return lib


def _naive_scrape(
    nvml: Any, handles: list[Any], requests: list[tuple[list[tuple[int, int]], list[Any], int]]
) -> list[Any]:
    """The same values, fetched one nvmlDeviceGetFieldValues call per value."""
    from exporter.collectors.nvml import NvmlCollector
    from exporter.sources.nvml import GpuIdentity, GpuReading, decode_field_values, links_from_values

    gpus = []
    for index, (handle, (pairs, slots, link_count)) in enumerate(zip(handles, requests, strict=True)):
        values = [decode_field_values(nvml.nvmlDeviceGetFieldValues(handle, [pair]))[0] for pair in pairs]
        links, _ = links_from_values(link_count, slots, values)
        gpus.append(GpuReading(GpuIdentity(index, "", "", ""), tuple(links)))
    return NvmlCollector.families(gpus)


def _measure(scrape: Callable[[], object], lib: ctypes.CDLL, scrapes: int) -> tuple[float, float]:
    """Median seconds per scrape and NVML calls per scrape."""
    scrape()  # warm-up: discovery and remote ends happen once, outside the timing
    times = []
    calls_before = lib.fakeNvmlCallCount(None)
    for _ in range(scrapes):
        t0 = time.perf_counter()
        scrape()
        times.append(time.perf_counter() - t0)
    calls = (lib.fakeNvmlCallCount(None) - calls_before) / scrapes
    return statistics.median(times), calls


def run(scrapes: int = 30, latencies_us: tuple[int, ...] = (0, 20)) -> BenchResult:
    import pynvml

    from exporter.collectors.nvml import NvmlCollector
    from exporter.sources.nvml import PynvmlBackend, field_request

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-nvml-") as folder:
        lib = _load_fake(Path(folder))
        for latency in latencies_us:
            os.environ.update(
                {
                    "FAKE_NVML_GPU_COUNT": str(GPUS),
                    "FAKE_NVML_LINK_COUNT": str(LINKS),
                    "FAKE_NVML_CALL_LATENCY_US": str(latency),
                }
            )
            backend = PynvmlBackend()  # its nvmlInit re-reads the fake's settings
            collector = NvmlCollector(backend)
            ours = _measure(lambda: list(collector.collect()), lib, scrapes)  # noqa: B023 - called in this iteration
            pynvml.nvmlInit()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(GPUS)]
            requests = [(*field_request(LINKS), LINKS) for _ in handles]
            naive = _measure(
                lambda: _naive_scrape(pynvml, handles, requests),  # noqa: B023 - called in this iteration
                lib,
                max(3, scrapes // 5),
            )
            pynvml.nvmlShutdown()
            backend.close()
            rows.append((latency, ours, naive))

    header = (
        "| modeled latency per NVML call | ours: ms/scrape | ours: NVML calls/scrape | "
        "one call per value: ms/scrape | calls/scrape | time ratio | call ratio |\n|---|---|---|---|---|---|---|\n"
    )
    body = "".join(
        f"| {lat} µs | {o[0] * 1e3:.2f} | {o[1]:.0f} | {n[0] * 1e3:.2f} | {n[1]:.0f} | "
        f"{n[0] / o[0]:.1f}x | {n[1] / o[1]:.0f}x |\n"
        for lat, o, n in rows
    )
    base = rows[0]
    values = len(field_request(LINKS)[0]) * GPUS
    return BenchResult(
        title="NVML scrape: 8 GPUs x 18 NVLinks",
        command="python -m bench.nvml_scrape",
        peer="the same values read with one nvmlDeviceGetFieldValues call per value (same binding, same fake library, same run)",
        ratio=base[2][0] / base[1][0],
        summary=(
            f"One scrape reads {values} values with {base[1][1]:.0f} NVML calls (one batched field-values call per GPU) "
            f"in {base[1][0] * 1e3:.2f} ms; one call per value takes {base[2][1]:.0f} calls and "
            f"{base[2][0] / base[1][0]:.1f}x the time. Goal: calls per scrape = GPUs, whatever the link count."
        ),
        markdown=header
        + body
        + (
            "\nTimes are medians over the run on the fake library; the fake answers in microseconds, a real "
            "driver does not, hence the rows with a modeled per-call latency. Discovery (UUID, name, PCI id, "
            "link count) and each link's remote end are read once, before the timed scrapes.\n"
        ),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=30)
    args = parser.parse_args(argv)
    print(run(scrapes=args.scrapes).section())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

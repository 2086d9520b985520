"""Topology per scrape: the source's change check vs walking sysfs on every scrape.

On the simulated HGX node's PCI tree (8 GPUs, 10 RDMA NICs, one PCIe switch per GPU/NIC pair,
real symlinks), both sides answer the same question a scrape asks: the GPU x NIC classes.

- ours: ``TopologySource.read`` with the change check forced on every read (``check_seconds=0``:
  readlink the RDMA class entries, compare with the last fingerprint) and with the shipped
  30-second interval (most scrapes only look at the clock);
- peer: ``build_topology`` on every read, the walk a collector without change detection would do
  (realpath of every device link, every bridge's class file, every NUMA file).

Also counts the attribute files each side reads per scrape.

    python -m bench.topology_scrape [--reads N]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import BenchResult

REPO = Path(__file__).resolve().parent.parent


def _per_read(read: Callable[[], object], reads: int) -> float:
    read()  # warm: the first walk
    started = time.perf_counter()
    for _ in range(reads):
        read()
    return (time.perf_counter() - started) / reads


def run(reads: int = 2000) -> BenchResult:
    sys.path.insert(0, str(REPO))
    from ccl_sim.nvml import GPU_BUSES
    from ccl_sim.topology import SimTopology
    from exporter.sources.nvml import GpuIdentity
    from exporter.sources.sysfs import read_attribute
    from exporter.sources.topology import TopologySource, build_topology

    gpus = [GpuIdentity(i, f"GPU-{i}", "NVIDIA H200", f"00000000:{bus:02X}:00.0") for i, bus in enumerate(GPU_BUSES)]

    class Nvml:
        def gpus(self) -> list[GpuIdentity]:
            return gpus

    files = {"count": 0}

    def counting_reader(path: object) -> str | None:
        files["count"] += 1
        return read_attribute(path)  # type: ignore[arg-type]

    with tempfile.TemporaryDirectory(prefix="bench-topology-") as folder:
        root = Path(folder)
        SimTopology().setup(root)
        sysfs = root / "sys"
        checked = TopologySource(sysfs, Nvml(), check_seconds=0, reader=counting_reader)  # type: ignore[arg-type]
        shipped = TopologySource(sysfs, Nvml())  # type: ignore[arg-type]
        assert checked.read().classes == build_topology(sysfs, gpus).classes, "both sides answer the same"

        def walk() -> object:
            return build_topology(sysfs, gpus, counting_reader)

        files["count"] = 0
        ours_checked = _per_read(checked.read, reads)
        ours_files = files["count"] / (reads + 1)
        ours_shipped = _per_read(shipped.read, reads)
        files["count"] = 0
        peer = _per_read(walk, reads)
        peer_files = files["count"] / (reads + 1)
        walks = checked.walks

    ratio = peer / ours_checked
    summary = (
        f"A scrape's topology costs {ours_checked * 1e6:.0f} µs with the change check on every read and "
        f"{ours_shipped * 1e6:.1f} µs at the shipped 30 s check interval, against {peer * 1e6:.0f} µs for "
        f"walking sysfs each time: {ratio:.0f}x less with the check (goal: the walk only when the node changes)."
    )
    markdown = f"""| per scrape, 8 GPUs x 10 NICs | time | attribute files read | sysfs walks |
|---|---|---|---|
| ours, change check every read (`check_seconds=0`) | {ours_checked * 1e6:.0f} µs | {ours_files:.0f} | {walks} in {reads + 1} reads |
| ours, shipped (check every 30 s) | {ours_shipped * 1e6:.1f} µs | 0 | 1 |
| peer: walk sysfs every scrape | {peer * 1e6:.0f} µs | {peer_files:.0f} | {reads + 1} |

The change check reads no attribute file: it lists `/sys/class/infiniband` and reads each
entry's two links. {reads} reads per side, one process, after one warm-up read.
"""
    return BenchResult(
        title="Topology per scrape: change check vs a sysfs walk",
        command="python -m bench.topology_scrape",
        peer="build_topology on every scrape (the same answer, walked each time)",
        ratio=ratio,
        summary=summary,
        markdown=markdown,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=2000)
    args = parser.parse_args(argv)
    print(run(args.reads).section())
    return 0


if __name__ == "__main__":
    sys.exit(main())

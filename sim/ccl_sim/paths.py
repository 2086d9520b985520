"""Where the simulated node keeps its files: the one place that lays out its folder tree.

The tree mirrors a real node's host paths, so the exporter reads it through the same
``--path.*`` settings (``exporter.resources.HostPaths``).
"""

from __future__ import annotations

from pathlib import Path

from exporter.resources import HostPaths


def simulated_paths(root: Path) -> HostPaths:
    """The host paths of a simulated node whose tree is ``root``."""
    return HostPaths(
        sysfs=root / "sys",
        pod_logs=root / "pods",
        nccl_debug_files=root / "nccl",
        state=root / "state",
        pod_resources=root / "pod-resources" / "kubelet.sock",
        probe_results=root / "probe-results",
        nccl_inspector=root / "nccl-inspector",
    )

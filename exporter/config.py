"""Typed configuration of ``ccl-exporter serve``, built by the CLI from its flags.

No module-level state: the collectors get their own settings and the node's shared resources
(``exporter.resources.NodeResources``) through their factories, so tests point them at fixture
trees.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PORT = 19400
DEFAULT_NCCL_INSPECTOR = Path("/var/log/nccl-inspector")


def parse_listen_address(address: str) -> tuple[str, int]:
    """``host:port``, ``:port`` or ``[v6]:port`` → (host, port); raises ValueError."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"listen address {address!r} is not host:port")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


@dataclass(frozen=True)
class HostPaths:
    """Where the node's files are: the ``--path.*`` flags, or the tree of whichever node ``serve`` is given."""

    sysfs: Path
    pod_logs: Path
    nccl_debug_files: Path
    state: Path  # writable: tail offsets
    pod_resources: Path  # the kubelet's socket
    probe_results: Path
    # NCCL Inspector output (NCCL_INSPECTOR_DUMP_DIR), per-pod folders as for NCCL debug files
    nccl_inspector: Path = DEFAULT_NCCL_INSPECTOR


@dataclass(frozen=True)
class ServeConfig:
    """What the ``serve`` flags say. Paths are the flags' (a node supplied to ``serve`` brings its own)."""

    listen_address: str
    max_requests: int
    scrape_timeout_seconds: float
    sysfs: Path
    pod_logs: Path
    nccl_debug_files: Path
    state: Path
    pod_resources: Path
    probe_results: Path
    node_name: str
    enabled_collectors: tuple[str, ...]
    log_level: str
    # collector name -> its settings (CollectorSpec.settings), for every collector, enabled or not
    collector_settings: Mapping[str, object]
    nccl_inspector: Path = DEFAULT_NCCL_INSPECTOR

    @property
    def paths(self) -> HostPaths:
        return HostPaths(
            self.sysfs,
            self.pod_logs,
            self.nccl_debug_files,
            self.state,
            self.pod_resources,
            self.probe_results,
            self.nccl_inspector,
        )

"""Typed configuration of ``ccl-exporter serve``, built by the CLI and passed to everything.

No module-level state: every collector and source receives the ``ServeConfig`` (or just the
paths it needs) through its constructor, so tests point them at fixture trees.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_PORT = 9400
ENV_PREFIX = "CCL_EXPORTER_"


def env_name(flag: str) -> str:
    """The environment variable that sets ``--flag.name-x``: ``CCL_EXPORTER_FLAG_NAME_X``."""
    return ENV_PREFIX + flag.lstrip("-").replace(".", "_").replace("-", "_").upper()


def parse_listen_address(address: str) -> tuple[str, int]:
    """``host:port``, ``:port`` or ``[v6]:port`` → (host, port); raises ValueError."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"listen address {address!r} is not host:port")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


@dataclass
class ServeConfig:
    listen_address: str = f"0.0.0.0:{DEFAULT_PORT}"
    max_requests: int = 4
    scrape_timeout_seconds: float = 10.0
    sysfs: Path = Path("/sys")
    pod_logs: Path = Path("/var/log/pods")
    nccl_debug_files: Path = Path("/var/log/nccl")
    state: Path = Path("/var/lib/ccl-exporter")
    pod_resources: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    probe_results: Path = Path("/var/lib/ccl-exporter/probe-results")
    node_name: str = ""
    simulate: bool = False
    enabled_collectors: tuple[str, ...] = ()
    log_level: str = "info"
    nccl_grace_period_seconds: float = 300.0
    nccl_parser_memory_budget_bytes: int = 64 * 1024 * 1024
    # idle-time bus-bandwidth probes (collector "probe"); interval 0 = off
    probe_interval_seconds: float = 0.0
    probe_timeout_seconds: float = 120.0
    probe_backend: str = "auto"
    probe_collectives: str = "all_reduce"
    probe_min_bytes: str = "1M"
    probe_max_bytes: str = "64M"
    probe_iters: int = 20
    probe_max_age_seconds: float = 86400.0
    simulate_job_ends_after_seconds: float = 0.0  # 0 = the simulated training pod never ends
    extra: dict[str, object] = field(default_factory=dict)

"""NCCL collector: ``ccl_nccl_*`` — which network and transport each pod's NCCL really uses.

``collector`` runs the pipeline (pod-log tailer → one ``LogAnalyzer`` per stream → a snapshot of
per-pod facts, judged against this node) and composes the parts: ``streams`` holds the streams'
analyzers with their memory budget, replay compensation and expiry; ``attribution`` who each pod
is (its job, the GPUs the job holds on this node); ``pod_reports`` how a pod's streams combine
into one verdict; ``nic_affinity`` the NICs its GPUs send through; ``families`` what a snapshot
is and how it renders as metric families at scrape time.
"""

from __future__ import annotations

from exporter.collectors.nccl.collector import (
    DEFAULT_GRACE_SECONDS,
    EXPORTER_PARSER_LIMITS,
    NCCL_FLAGS,
    SPEC,
    NcclCollector,
    NcclSettings,
    build_collector,
    settings_from_args,
)
from exporter.collectors.nccl.families import VERDICTS, NcclLimits, PodReport, Snapshot, nccl_families

__all__ = [
    "DEFAULT_GRACE_SECONDS",
    "EXPORTER_PARSER_LIMITS",
    "NCCL_FLAGS",
    "SPEC",
    "VERDICTS",
    "NcclCollector",
    "NcclLimits",
    "NcclSettings",
    "PodReport",
    "Snapshot",
    "build_collector",
    "nccl_families",
    "settings_from_args",
]

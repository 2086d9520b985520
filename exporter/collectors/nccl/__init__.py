"""NCCL collector: ``ccl_nccl_*`` — which network and transport each pod's NCCL really uses.

``collector`` runs the pipeline (pod-log tailer → one ``LogAnalyzer`` per stream → a snapshot of
per-pod facts, judged against this node); ``families`` holds what a snapshot is and renders it
as metric families at scrape time.
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

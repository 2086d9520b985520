"""The exporter's collectors. Adding one: a file here, and one line in ``all_collectors``."""

from __future__ import annotations

from exporter.collectors.base import CollectorSpec


def all_collectors() -> tuple[CollectorSpec, ...]:
    """Every collector the exporter knows, in exposition order."""
    from exporter.collectors import (
        inspector,
        lifecycle,
        nccl,
        nvml,
        podnetwork,
        podresources,
        probe,
        rdma,
        topology,
    )

    return (
        rdma.SPEC,
        nvml.SPEC,
        podresources.SPEC,
        podnetwork.SPEC,
        nccl.SPEC,
        inspector.SPEC,
        probe.SPEC,
        topology.SPEC,
        lifecycle.SPEC,
    )

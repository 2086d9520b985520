"""NVML collector: ``ccl_gpu_info`` and ``ccl_nvlink_*`` per GPU and NVLink.

A value NVML does not support is left out (never exported as 0); a GPU that cannot be read
(lost, or its call failed) drops its own series and marks the scrape partial, while the
other GPUs are exported as usual.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter.collectors.base import CollectorSpec, CollectorUnavailable, PartialCollection
from exporter.sources.nvml import ERROR_KINDS, GpuReading, NvmlBackend, NvmlUnavailable

LINK_LABELS = ["gpu", "link"]


class NvmlCollector:
    name = "nvml"

    def __init__(self, backend: NvmlBackend) -> None:
        self._backend = backend

    def collect(self) -> Iterable[Metric]:
        try:
            reading = self._backend.read()
        except NvmlUnavailable as exc:
            raise CollectorUnavailable(str(exc)) from exc
        yield from self.families(reading.gpus)
        if reading.problems:
            raise PartialCollection("; ".join(reading.problems[:5]))

    @staticmethod
    def families(gpus: Iterable[GpuReading]) -> list[Metric]:
        info = GaugeMetricFamily(
            "ccl_gpu_info",
            "GPU facts from NVML; always 1. gpu is the NVML index, pci_bus_id as NVML prints it.",
            labels=["gpu", "uuid", "name", "pci_bus_id"],
        )
        state = GaugeMetricFamily(
            "ccl_nvlink_state",
            "1 if the NVLink is active, 0 if it is inactive, asleep or has traffic disabled "
            "(NVML_FI_DEV_NVLINK_GET_STATE).",
            labels=LINK_LABELS,
        )
        speed = GaugeMetricFamily(
            "ccl_nvlink_speed_bytes_per_second",
            "NVLink speed per direction (NVML_FI_DEV_NVLINK_GET_SPEED, MB/s x 1e6); 0 when down.",
            labels=LINK_LABELS,
        )
        tx = CounterMetricFamily(
            "ccl_nvlink_transmit_bytes_total",
            "Data bytes sent on the NVLink (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, KiB x 1024).",
            labels=LINK_LABELS,
        )
        rx = CounterMetricFamily(
            "ccl_nvlink_receive_bytes_total",
            "Data bytes received on the NVLink (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, KiB x 1024).",
            labels=LINK_LABELS,
        )
        errors = CounterMetricFamily(
            "ccl_nvlink_errors_total",
            "NVLink data-link-layer errors: crc_flit (NVML_FI_DEV_NVLINK_ERROR_DL_CRC), crc_data "
            "(NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L<n>, links 0-11 only), replay, recovery.",
            labels=LINK_LABELS + ["error"],
        )
        remote = GaugeMetricFamily(
            "ccl_nvlink_remote_info",
            "What an active NVLink connects to; always 1. remote_type gpu, nvswitch, ibmnpu or "
            "unknown; remote_pci_bus_id joins ccl_gpu_info{pci_bus_id} for a GPU peer.",
            labels=LINK_LABELS + ["remote_type", "remote_pci_bus_id"],
        )
        for gpu in gpus:
            identity = gpu.gpu
            index = str(identity.index)
            info.add_metric([index, identity.uuid, identity.name, identity.pci_bus_id], 1.0)
            for link in gpu.links:
                labels = [index, str(link.link)]
                if link.active is not None:
                    state.add_metric(labels, 1.0 if link.active else 0.0)
                if link.speed_bytes_per_second is not None:
                    speed.add_metric(labels, float(link.speed_bytes_per_second))
                if link.transmit_bytes is not None:
                    tx.add_metric(labels, float(link.transmit_bytes))
                if link.receive_bytes is not None:
                    rx.add_metric(labels, float(link.receive_bytes))
                for kind in ERROR_KINDS:
                    if kind in link.errors:
                        errors.add_metric(labels + [kind], float(link.errors[kind]))
                if link.remote is not None:
                    remote.add_metric(labels + [link.remote.kind, link.remote.pci_bus_id], 1.0)
        return [info, state, speed, tx, rx, errors, remote]


SPEC = CollectorSpec(
    name="nvml",
    help="GPUs and per-link NVLink state, speed, traffic and error counters from NVML",
    default_enabled=True,
    factory=lambda settings, resources: NvmlCollector(resources.nvml),
)

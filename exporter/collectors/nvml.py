"""NVML collector: ``ccl_gpu_info`` and ``ccl_nvlink_*`` per GPU and NVLink.

A value NVML does not support is left out (never exported as 0); a GPU that cannot be read
(lost, or its call failed) drops its own series and marks the scrape partial, while the
other GPUs are exported as usual.

Every GPU also gets its NVLinks summed up (``ccl_nvlink_gpu_*``: links, active links, bytes
and errors of all its links), and the node all its GPUs' (``ccl_nvlink_node_*``), which is what
the rules read: a fleet's rule cost then grows with nodes, not with GPUs x links.
``--collector.nvml.nvlink-granularity=gpu``, the default, exports only those; ``link`` adds the
per-link series (144 links on an 8-GPU NVLink4 node: 1,248 series, three fifths of a node's).

The per-GPU and node counters only ever grow, as counters must
(``exporter.collectors.counter_sums``):
a link whose counter resets counts from zero, and a link not read this time (down, or the value
unsupported) adds nothing and keeps its last value, so ``rate`` never sees a false reset; the node's
sums are made the same way from the GPUs' sums, so a GPU lost from the bus does not take its
share away.
"""

from __future__ import annotations

import argparse
import threading
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter.collectors.base import CollectorSpec, CollectorUnavailable, PartialCollection
from exporter.collectors.counter_sums import CounterSums, PartCounters
from exporter.flags import Flag
from exporter.sources.nvml import ERROR_KINDS, GpuReading, NvLinkReading, NvmlBackend, NvmlUnavailable

LINK_LABELS = ["gpu", "link"]
GRANULARITIES = ("link", "gpu")
# The per-link counters the per-GPU sums are made of: (family suffix, how to read it from a link).
_TRAFFIC = {"transmit": "transmit_bytes", "receive": "receive_bytes"}


def _link_counters(link: NvLinkReading) -> dict[str, int]:
    """A link's readable counters by name: transmit, receive and each error kind."""
    found = {name: getattr(link, attr) for name, attr in _TRAFFIC.items() if getattr(link, attr) is not None}
    found.update(link.errors)
    return found


class NvlinkTotals:
    """Per-GPU sums of per-link counters that never decrease (``counter_sums``), by GPU UUID, and
    the node's sums of those."""

    _NODE = "node"

    def __init__(self) -> None:
        self._sums = CounterSums()
        self._node = CounterSums()

    def update(self, gpus: Iterable[GpuReading], complete: bool) -> dict[str, dict[str, float]]:
        """Fold one reading in; the totals (counter name -> value) of each GPU read, by UUID."""
        wholes: dict[Hashable, PartCounters] = {
            gpu.gpu.uuid: [(link.link, _link_counters(link)) for link in gpu.links] for gpu in gpus
        }
        return {str(uuid): totals for uuid, totals in self._sums.update(wholes, complete).items()}

    def node(self, gpu_totals: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
        """The node's totals from the GPUs' (``update``'s result): a GPU not read keeps its share."""
        return self._node.update({self._NODE: list(gpu_totals.items())}, complete=True)[self._NODE]


@dataclass(frozen=True)
class NvmlSettings:
    per_link: bool = False  # --collector.nvml.nvlink-granularity=link


def settings_from_args(args: argparse.Namespace) -> NvmlSettings:
    return NvmlSettings(per_link=str(args.nvml_nvlink_granularity) == "link")


class NvmlCollector:
    name = "nvml"

    def __init__(self, backend: NvmlBackend, settings: NvmlSettings | None = None) -> None:
        self._backend = backend
        self._per_link = (settings or NvmlSettings()).per_link
        self._totals = NvlinkTotals()
        # A scrape whose collector ran past its timeout may still be reading when the next one
        # starts: readings reach the totals one at a time and in the order they were taken.
        self._reading = threading.Lock()

    def collect(self) -> Iterable[Metric]:
        with self._reading:
            try:
                reading = self._backend.read()
            except NvmlUnavailable as exc:
                raise CollectorUnavailable(str(exc)) from exc
            totals = self._totals.update(reading.gpus, complete=not reading.problems)
            node_totals = self._totals.node(totals)
        yield from self.gpu_families(reading.gpus, totals)
        yield from self.node_families(reading.gpus, node_totals)
        if self._per_link:
            yield from self.families(reading.gpus)
        if reading.problems:
            raise PartialCollection("; ".join(reading.problems[:5]))

    @staticmethod
    def gpu_families(gpus: Iterable[GpuReading], totals: Mapping[str, Mapping[str, float]]) -> list[Metric]:
        """``ccl_gpu_info`` and the per-GPU NVLink sums (``totals`` from ``NvlinkTotals.update``)."""
        info = GaugeMetricFamily(
            "ccl_gpu_info",
            "GPU facts from NVML; always 1. gpu is the NVML index, pci_bus_id as NVML prints it.",
            labels=["gpu", "uuid", "name", "pci_bus_id"],
        )
        links = GaugeMetricFamily(
            "ccl_nvlink_gpu_links",
            "NVLinks of the GPU whose state NVML reports (NVML_FI_DEV_NVLINK_GET_STATE).",
            labels=["gpu"],
        )
        active = GaugeMetricFamily(
            "ccl_nvlink_gpu_links_active",
            "NVLinks of the GPU that are active (state 1 in ccl_nvlink_state).",
            labels=["gpu"],
        )
        traffic = {
            name: CounterMetricFamily(
                f"ccl_nvlink_gpu_{name}_bytes_total",
                f"Data bytes {'sent' if name == 'transmit' else 'received'} on all NVLinks of the GPU: the sum "
                f"of ccl_nvlink_{name}_bytes_total over its links, never decreasing.",
                labels=["gpu"],
            )
            for name in _TRAFFIC
        }
        errors = CounterMetricFamily(
            "ccl_nvlink_gpu_errors_total",
            "NVLink errors on all links of the GPU, by error kind: the sum of ccl_nvlink_errors_total "
            "over its links, never decreasing.",
            labels=["gpu", "error"],
        )
        for gpu in gpus:
            identity = gpu.gpu
            index = str(identity.index)
            info.add_metric([index, identity.uuid, identity.name, identity.pci_bus_id], 1.0)
            states = [link.active for link in gpu.links if link.active is not None]
            if states:
                links.add_metric([index], float(len(states)))
                active.add_metric([index], float(sum(states)))
            gpu_totals = totals.get(identity.uuid, {})
            for name, family in traffic.items():
                if name in gpu_totals:
                    family.add_metric([index], gpu_totals[name])
            for kind in ERROR_KINDS:
                if kind in gpu_totals:
                    errors.add_metric([index, kind], gpu_totals[kind])
        return [info, links, active, *traffic.values(), errors]

    @staticmethod
    def node_families(gpus: Iterable[GpuReading], totals: Mapping[str, float]) -> list[Metric]:
        """``ccl_nvlink_node_*``: the node's NVLinks and active NVLinks (of the GPUs read now), and its
        counters summed over its GPUs (``totals`` from ``NvlinkTotals.node``)."""
        states = [link.active for gpu in gpus for link in gpu.links if link.active is not None]
        out: list[Metric] = []
        if states:
            out.append(
                GaugeMetricFamily(
                    "ccl_nvlink_node_links",
                    "NVLinks of the node's GPUs whose state NVML reports (the sum of ccl_nvlink_gpu_links).",
                    value=float(len(states)),
                )
            )
            out.append(
                GaugeMetricFamily(
                    "ccl_nvlink_node_links_active",
                    "Active NVLinks of the node's GPUs (the sum of ccl_nvlink_gpu_links_active).",
                    value=float(sum(states)),
                )
            )
        for name in _TRAFFIC:
            if name in totals:
                out.append(
                    CounterMetricFamily(
                        f"ccl_nvlink_node_{name}_bytes_total",
                        f"Data bytes {'sent' if name == 'transmit' else 'received'} on all NVLinks of the node's GPUs: "
                        f"the sum of ccl_nvlink_gpu_{name}_bytes_total, never decreasing (a GPU gone keeps its share).",
                        value=totals[name],
                    )
                )
        errors = CounterMetricFamily(
            "ccl_nvlink_node_errors_total",
            "NVLink errors on all links of the node's GPUs, by error kind: the sum of ccl_nvlink_gpu_errors_total, "
            "never decreasing.",
            labels=["error"],
        )
        for kind in ERROR_KINDS:
            if kind in totals:
                errors.add_metric([kind], totals[kind])
        return [*out, errors]

    @staticmethod
    def families(gpus: Iterable[GpuReading]) -> list[Metric]:
        """The per-link ``ccl_nvlink_*`` families."""
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
            index = str(gpu.gpu.index)
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
        return [state, speed, tx, rx, errors, remote]


SPEC = CollectorSpec(
    name="nvml",
    help="GPUs, and NVLink state, speed, traffic and error counters per link and per GPU, from NVML",
    default_enabled=True,
    factory=lambda settings, resources: NvmlCollector(resources.nvml, settings),
    flags=(
        Flag(
            "--collector.nvml.nvlink-granularity",
            "gpu",
            "gpu: NVLink series per GPU and node only; link: per link as well (1,248 more series on an 8-GPU "
            "NVLink4 node)",
            dest="nvml_nvlink_granularity",
            choices=GRANULARITIES,
        ),
    ),
    flag_group="NVML collector",
    settings=settings_from_args,
)

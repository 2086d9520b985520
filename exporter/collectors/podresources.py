"""Device → pod attribution: ``ccl_gpu_pod_info`` and ``ccl_pod_rdma_device_info``.

GPUs come from the kubelet pod-resources API, through device plugins and Dynamic Resource
Allocation alike (``source``); RDMA NICs from the same answer and from Multus' network-status
annotation of the node's pods, resolved to RDMA devices through the node's topology
(``exporter.sources.rdma_bindings``). Join any GPU or NVLink series to the pod using it::

    ccl_nvlink_transmit_bytes_total * on(gpu) group_left(namespace, pod) ccl_gpu_pod_info

``gpu`` is the NVML index found by the device's UUID; it is "" when NVML is absent or the
device is a MIG instance (whose id is a MIG UUID). A DRA GPU is named by its device
(``gpu-<minor>``) and found in NVML by its minor number.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from exporter.collectors.base import CollectorSpec, CollectorUnavailable, PartialCollection
from exporter.flags import Flag
from exporter.resources import NodeResources
from exporter.sources.kube import NoPodMetadata, PodMetadataSource
from exporter.sources.nvml import NvmlBackend, NvmlUnavailable
from exporter.sources.podresources import (
    SOURCE_DRA,
    GpuAssignment,
    PodResourcesClient,
    PodResourcesError,
    PodResourcesListing,
    PodResourcesUnavailable,
)
from exporter.sources.rdma_bindings import (
    DEFAULT_RDMA_RESOURCES,
    RdmaBinding,
    RdmaResources,
    parse_pools,
    rdma_bindings,
)
from exporter.sources.topology import TopologySource

# A GPU as NVML knows it: its UUID and index ("" when NVML cannot say).
KnownGpu = tuple[str, str]


class PodResourcesCollector:
    name = "podresources"

    def __init__(
        self,
        client: PodResourcesClient,
        nvml: NvmlBackend | None,
        metadata: PodMetadataSource | None = None,
        topology: TopologySource | None = None,
        rdma_resources: RdmaResources | None = None,
    ) -> None:
        self._client = client
        self._nvml = nvml
        self._metadata: PodMetadataSource = metadata or NoPodMetadata()
        self._topology = topology
        self._rdma_resources = rdma_resources or RdmaResources()

    def _known_gpus(self) -> tuple[dict[str, str], dict[str, KnownGpu]]:
        """UUID -> NVML index, and a DRA GPU's device name (gpu-<minor>) -> (UUID, index)."""
        if self._nvml is None:
            return {}, {}
        try:
            gpus = self._nvml.gpus()
        except NvmlUnavailable:
            return {}, {}
        indexes = {gpu.uuid: str(gpu.index) for gpu in gpus}
        by_minor = {f"gpu-{gpu.minor}": (gpu.uuid, str(gpu.index)) for gpu in gpus if gpu.minor is not None}
        return indexes, by_minor

    def collect(self) -> Iterable[Metric]:
        listing: PodResourcesListing | None = None
        failure: Exception | None = None
        try:
            listing = self._client.listing()
        except PodResourcesUnavailable as exc:
            failure = CollectorUnavailable(str(exc))
        except PodResourcesError as exc:
            failure = PartialCollection(str(exc))
        indexes, by_minor = self._known_gpus()
        info = self.family(listing.gpus if listing else (), indexes, self._metadata, by_minor)
        yield info
        yield self.pod_gpus_family(info)
        bindings: list[RdmaBinding] = []
        unresolved = 0
        if self._topology is not None:
            pods = self._metadata.pods()
            bindings, unresolved = rdma_bindings(listing, pods, self._topology.read(), self._rdma_resources)
        rdma = self.rdma_families(bindings, unresolved, self._metadata)
        yield from rdma
        yield self.pod_rdma_devices_family(rdma[0])
        if failure is not None:
            raise failure

    @staticmethod
    def family(
        assignments: Iterable[GpuAssignment],
        gpu_indexes: dict[str, str],
        metadata: PodMetadataSource | None = None,
        dra_gpus: Mapping[str, KnownGpu] | None = None,
    ) -> Metric:
        info = GaugeMetricFamily(
            "ccl_gpu_pod_info",
            "A GPU assigned to a container by the kubelet (pod-resources API); always 1. uuid is "
            "the device id (GPU or MIG UUID; a DRA GPU NVML cannot name keeps its device name), gpu its NVML "
            'index ("" when unknown), resource the extended resource name (nvidia.com/gpu, nvidia.com/mig-...) '
            "or the DRA driver (gpu.nvidia.com), source device_plugin or dra, job_name/job_kind the training "
            "job from the pod's labels (\"\" without Kubernetes API access), host_network the pod's "
            'spec.hostNetwork (true/false, "" unknown).',
            labels=[
                "gpu",
                "uuid",
                "namespace",
                "pod",
                "container",
                "resource",
                "job_name",
                "job_kind",
                "host_network",
                "source",
            ],
        )
        source = metadata or NoPodMetadata()
        for a in assignments:
            meta = source.lookup(a.namespace, a.pod)
            host_network = "" if meta is None or meta.host_network is None else str(meta.host_network).lower()
            uuid, index = a.device_id, gpu_indexes.get(a.device_id, "")
            if a.source == SOURCE_DRA and a.device_id in (dra_gpus or {}):
                uuid, index = (dra_gpus or {})[a.device_id]
            info.add_metric(
                [
                    index,
                    uuid,
                    a.namespace,
                    a.pod,
                    a.container,
                    a.resource,
                    meta.job_name if meta else "",
                    meta.job_kind if meta else "",
                    host_network,
                    a.source,
                ],
                1.0,
            )
        return info

    @staticmethod
    def pod_gpus_family(info: Metric) -> Metric:
        """Per pod, the whole GPUs it holds, from the ccl_gpu_pod_info samples: what rules over a
        fleet read (one series per pod, not one per GPU)."""
        return per_pod_count(
            info,
            "uuid",
            GaugeMetricFamily(
                "ccl_gpu_pod_gpus",
                "Whole GPUs a pod holds on this node (distinct uuids of its ccl_gpu_pod_info; MIG instances and "
                "DRA MIG devices share a GPU and are not counted); one series for every pod holding any GPU "
                "device, 0 when it holds only MIG instances.",
                labels=list(POD_KEY),
            ),
            counted=lambda uuid: not is_gpu_share(uuid),
        )

    @staticmethod
    def pod_rdma_devices_family(info: Metric) -> Metric:
        """Per pod, the distinct RDMA NICs it was given, from the ccl_pod_rdma_device_info samples."""
        return per_pod_count(
            info,
            "device",
            GaugeMetricFamily(
                "ccl_pod_rdma_devices",
                "Distinct RDMA NICs a pod was given on this node (the devices of its ccl_pod_rdma_device_info); "
                "absent for a pod given none.",
                labels=list(POD_KEY),
            ),
        )

    @staticmethod
    def rdma_families(
        bindings: Iterable[RdmaBinding], unresolved: int, metadata: PodMetadataSource | None = None
    ) -> list[Metric]:
        info = GaugeMetricFamily(
            "ccl_pod_rdma_device_info",
            "An RDMA NIC (device, as under /sys/class/infiniband) given to a pod; always 1. source: "
            "device_plugin (a device plugin's resource, e.g. an SR-IOV VF), dra (a DRA claim's device) or "
            "multus (the pod's k8s.v1.cni.cncf.io/network-status device-info); resource: the extended "
            "resource, DRA driver or Multus network that brought it.",
            labels=["namespace", "pod", "job_name", "device", "source", "resource"],
        )
        source = metadata or NoPodMetadata()
        for b in bindings:
            meta = source.lookup(b.namespace, b.pod)
            info.add_metric([b.namespace, b.pod, meta.job_name if meta else "", b.device, b.source, b.resource], 1.0)
        missing = GaugeMetricFamily(
            "ccl_pod_rdma_devices_unresolved",
            "Devices of RDMA resources (--collector.podresources.rdma-resources) held by pods that name no "
            "RDMA NIC of this node: a shared-device pool not listed in "
            "--collector.podresources.rdma-shared-devices, or a device without an RDMA function.",
        )
        missing.add_metric([], float(unresolved))
        return [info, missing]


POD_KEY = ("namespace", "pod", "job_name")


def per_pod_count(
    info: Metric, label: str, family: GaugeMetricFamily, counted: Callable[[str], bool] = lambda value: True
) -> GaugeMetricFamily:
    """``family`` with, per pod of ``info``'s samples, how many distinct values of ``label`` it has
    (those ``counted``); every pod of ``info`` gets a series."""
    values: dict[tuple[str, ...], set[str]] = {}
    for sample in info.samples:
        found = values.setdefault(tuple(sample.labels[key] for key in POD_KEY), set())
        if counted(sample.labels[label]):
            found.add(sample.labels[label])
    for key, distinct in sorted(values.items()):
        family.add_metric(list(key), float(len(distinct)))
    return family


def is_gpu_share(uuid: str) -> bool:
    """A MIG instance (MIG-<uuid>) or a DRA MIG device (gpu-0-mig-1g...): a share of a GPU, not a whole one."""
    return uuid.startswith("MIG-") or "-mig-" in uuid


@dataclass(frozen=True)
class PodResourcesSettings:
    rdma_resources: RdmaResources


PODRESOURCES_FLAGS = (
    Flag(
        "--collector.podresources.rdma-resources",
        ",".join(DEFAULT_RDMA_RESOURCES),
        "device-plugin resources that carry RDMA NICs: names, or prefixes ending in / (comma-separated)",
        dest="podresources_rdma_resources",
    ),
    Flag(
        "--collector.podresources.rdma-shared-devices",
        "",
        "the HCAs of RDMA shared-device pools, whose device ids name none: RESOURCE=mlx5_0+mlx5_1[,RESOURCE=...]",
        dest="podresources_rdma_shared_devices",
    ),
)


def settings_from_args(args: argparse.Namespace) -> PodResourcesSettings:
    names = tuple(filter(None, (n.strip() for n in str(args.podresources_rdma_resources).split(","))))
    try:
        pools = parse_pools(str(args.podresources_rdma_shared_devices))
    except ValueError as exc:
        raise SystemExit(f"ccl-exporter: --collector.podresources.rdma-shared-devices: {exc}") from exc
    return PodResourcesSettings(RdmaResources(names, pools))


def build_collector(settings: PodResourcesSettings | None, resources: NodeResources) -> PodResourcesCollector:
    return PodResourcesCollector(
        resources.pod_resources,
        resources.nvml_if_collected(),
        resources.pod_metadata,
        resources.topology,
        settings.rdma_resources if settings is not None else None,
    )


SPEC = CollectorSpec(
    name="podresources",
    help="GPU and RDMA NIC to pod attribution (ccl_gpu_pod_info, ccl_pod_rdma_device_info) from the kubelet "
    "pod-resources socket and Multus network-status annotations",
    default_enabled=True,
    factory=build_collector,
    flags=PODRESOURCES_FLAGS,
    flag_group="collector podresources",
    settings=settings_from_args,
)

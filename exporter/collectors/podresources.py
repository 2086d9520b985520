"""GPU → pod attribution: ``ccl_gpu_pod_info`` from the kubelet pod-resources API.

Join any GPU or NVLink series to the pod using it::

    ccl_nvlink_transmit_bytes_total * on(gpu) group_left(namespace, pod) ccl_gpu_pod_info

``gpu`` is the NVML index found by the device's UUID; it is "" when NVML is absent or the
device is a MIG instance (whose id is a MIG UUID).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from exporter.collectors.base import CollectorSpec, CollectorUnavailable, PartialCollection
from exporter.resources import NodeResources
from exporter.sources.kube import NoPodMetadata, PodMetadataSource
from exporter.sources.nvml import NvmlBackend, NvmlUnavailable
from exporter.sources.podresources import (
    GpuAssignment,
    PodResourcesClient,
    PodResourcesError,
    PodResourcesUnavailable,
)


class PodResourcesCollector:
    name = "podresources"

    def __init__(
        self, client: PodResourcesClient, nvml: NvmlBackend | None, metadata: PodMetadataSource | None = None
    ) -> None:
        self._client = client
        self._nvml = nvml
        self._metadata: PodMetadataSource = metadata or NoPodMetadata()

    def _gpu_indexes(self) -> dict[str, str]:
        if self._nvml is None:
            return {}
        try:
            return {gpu.uuid: str(gpu.index) for gpu in self._nvml.gpus()}
        except NvmlUnavailable:
            return {}

    def collect(self) -> Iterable[Metric]:
        try:
            assignments = self._client.list_gpus()
        except PodResourcesUnavailable as exc:
            raise CollectorUnavailable(str(exc)) from exc
        except PodResourcesError as exc:
            raise PartialCollection(str(exc)) from exc
        yield self.family(assignments, self._gpu_indexes(), self._metadata)

    @staticmethod
    def family(
        assignments: Iterable[GpuAssignment], gpu_indexes: dict[str, str], metadata: PodMetadataSource | None = None
    ) -> Metric:
        info = GaugeMetricFamily(
            "ccl_gpu_pod_info",
            "A GPU assigned to a container by the kubelet (pod-resources API); always 1. uuid is "
            'the device id (GPU or MIG UUID), gpu its NVML index ("" when unknown), resource '
            "the extended resource name (nvidia.com/gpu, nvidia.com/mig-...), job_name/job_kind "
            'the training job from the pod\'s labels ("" without Kubernetes API access), host_network '
            'the pod\'s spec.hostNetwork (true/false, "" unknown).',
            labels=["gpu", "uuid", "namespace", "pod", "container", "resource", "job_name", "job_kind", "host_network"],
        )
        source = metadata or NoPodMetadata()
        for a in assignments:
            meta = source.lookup(a.namespace, a.pod)
            host_network = "" if meta is None or meta.host_network is None else str(meta.host_network).lower()
            info.add_metric(
                [
                    gpu_indexes.get(a.device_id, ""),
                    a.device_id,
                    a.namespace,
                    a.pod,
                    a.container,
                    a.resource,
                    meta.job_name if meta else "",
                    meta.job_kind if meta else "",
                    host_network,
                ],
                1.0,
            )
        return info


def build_collector(settings: None, resources: NodeResources) -> PodResourcesCollector:
    return PodResourcesCollector(resources.pod_resources, resources.nvml_if_collected(), resources.pod_metadata)


SPEC = CollectorSpec(
    name="podresources",
    help="GPU to pod attribution (ccl_gpu_pod_info) from the kubelet pod-resources socket",
    default_enabled=True,
    factory=build_collector,
)

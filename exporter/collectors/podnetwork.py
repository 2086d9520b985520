"""GPU pods' own network bytes: ``ccl_gpu_pod_network_{transmit,receive}_bytes_total``.

A training job whose NCCL fell back to TCP moves its collectives over the pod's own network
interfaces: heavy, two-way traffic there while the node's RDMA ports stay quiet. That is the
signal of ``CclSuspectedTcpFallback`` for jobs that print no NCCL log. The kubelet knows every
pod's network bytes (``exporter.sources.kubelet_stats``); this collector keeps those of the pods
that hold GPUs on this node (kubelet pod-resources), so that the rules read one series per GPU
pod and direction from the exporter, in the exporter's own shard, instead of every pod's
interfaces from every kubelet's cAdvisor joined in a global ruler.

A GPU pod the kubelet reports no network bytes for (a hostNetwork pod where the runtime gives
none, a pod still starting, a pod in whose network namespace cAdvisor found no interface) gets
``ccl_gpu_pod_network_unreported`` 1: the fallback cannot be inferred from its traffic, and the
exporter says so. None of these is a failure of the collector.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter.collectors.base import CollectorSpec, CollectorUnavailable, PartialCollection
from exporter.flags import Flag, Switch
from exporter.resources import NodeResources
from exporter.sources.kube import NoPodMetadata, PodMetadataSource
from exporter.sources.kubelet_stats import (
    DEFAULT_CA_FILE,
    DEFAULT_TOKEN_FILE,
    KubeletStatsClient,
    KubeletStatsError,
    KubeletStatsSettings,
    KubeletStatsUnavailable,
    PodNetworks,
)
from exporter.sources.podresources import PodResourcesClient, PodResourcesError, PodResourcesUnavailable

LABELS = ["namespace", "pod", "job_name"]


class PodNetworkCollector:
    name = "podnetwork"

    def __init__(
        self, stats: KubeletStatsClient, pod_resources: PodResourcesClient, metadata: PodMetadataSource | None = None
    ) -> None:
        self._stats = stats
        self._pod_resources = pod_resources
        self._metadata: PodMetadataSource = metadata or NoPodMetadata()

    def _gpu_pods(self) -> list[tuple[str, str]]:
        try:
            listing = self._pod_resources.listing()
        except PodResourcesUnavailable as exc:
            raise CollectorUnavailable(f"which pods hold GPUs: {exc}") from exc
        except PodResourcesError as exc:
            raise PartialCollection(f"which pods hold GPUs: {exc}") from exc
        return sorted({(a.namespace, a.pod) for a in listing.gpus})

    def collect(self) -> Iterable[Metric]:
        gpu_pods = self._gpu_pods()
        if not gpu_pods:
            yield from self.families([], PodNetworks(()), self._metadata)
            return
        try:
            networks = self._stats.read()
        except KubeletStatsUnavailable as exc:
            raise CollectorUnavailable(str(exc)) from exc
        except KubeletStatsError as exc:
            raise PartialCollection(f"kubelet stats: {exc}") from exc
        yield from self.families(gpu_pods, networks, self._metadata)
        if networks.malformed:
            raise PartialCollection(f"kubelet stats: {networks.malformed} pod entries malformed or beyond the cap")

    @staticmethod
    def families(
        gpu_pods: Iterable[tuple[str, str]], networks: PodNetworks, metadata: PodMetadataSource | None = None
    ) -> list[Metric]:
        transmit = CounterMetricFamily(
            "ccl_gpu_pod_network_transmit_bytes",
            "Bytes a GPU pod's own network interfaces sent (kubelet /stats/summary: the interfaces of the "
            "pod's network namespace summed, loopback and host-side pod-network devices left out; for a "
            "hostNetwork pod the host's interfaces). Resets when the pod's sandbox is recreated.",
            labels=LABELS,
        )
        receive = CounterMetricFamily(
            "ccl_gpu_pod_network_receive_bytes",
            "Bytes a GPU pod's own network interfaces received (as ccl_gpu_pod_network_transmit_bytes_total).",
            labels=LABELS,
        )
        unreported = GaugeMetricFamily(
            "ccl_gpu_pod_network_unreported",
            "1 for a pod holding GPUs on this node whose network bytes the kubelet does not report (a "
            "hostNetwork pod whose runtime gives none, a pod still starting, no interface found in its "
            "network namespace): its traffic cannot tell a TCP fallback.",
            labels=LABELS,
        )
        source = metadata or NoPodMetadata()
        by_pod = {(p.namespace, p.pod): p for p in networks.pods}
        for namespace, pod in gpu_pods:
            meta = source.lookup(namespace, pod)
            labels = [namespace, pod, meta.job_name if meta else ""]
            found = by_pod.get((namespace, pod))
            if found is None:
                unreported.add_metric(labels, 1.0)
                continue
            transmit.add_metric(labels, float(found.transmit_bytes))
            receive.add_metric(labels, float(found.receive_bytes))
        return [transmit, receive, unreported]


PODNETWORK_FLAGS = (
    Flag(
        "--collector.podnetwork.kubelet-url",
        "",
        "the kubelet's Summary API, e.g. https://$(HOST_IP):10250/stats/summary (empty: the collector is unavailable)",
        dest="podnetwork_kubelet_url",
    ),
    Flag(
        "--collector.podnetwork.bearer-token-file",
        str(DEFAULT_TOKEN_FILE),
        "bearer token sent to the kubelet, read on every request (empty: none); the service account needs get "
        "on nodes/stats",
        dest="podnetwork_bearer_token_file",
    ),
    Flag(
        "--collector.podnetwork.ca-file",
        str(DEFAULT_CA_FILE),
        "CA that signed the kubelet's serving certificate (empty: the system's CAs)",
        dest="podnetwork_ca_file",
    ),
    Switch(
        "--collector.podnetwork.insecure-skip-verify",
        "do not verify the kubelet's serving certificate (kubelets with self-signed certificates; the token is "
        "still sent)",
        dest="podnetwork_insecure_skip_verify",
    ),
)


def settings_from_args(args: argparse.Namespace) -> KubeletStatsSettings:
    url = str(args.podnetwork_kubelet_url).strip()
    if url and not url.startswith(("https://", "http://")):
        raise SystemExit(f"ccl-exporter: --collector.podnetwork.kubelet-url: {url!r} is not an http(s) URL")
    return KubeletStatsSettings(
        url=url,
        token_file=str(args.podnetwork_bearer_token_file),
        ca_file=str(args.podnetwork_ca_file),
        insecure_skip_verify=bool(args.podnetwork_insecure_skip_verify),
    )


def build_collector(settings: KubeletStatsSettings | None, resources: NodeResources) -> PodNetworkCollector:
    chosen = settings or KubeletStatsSettings()
    return PodNetworkCollector(KubeletStatsClient(chosen), resources.pod_resources, resources.pod_metadata)


SPEC = CollectorSpec(
    name="podnetwork",
    help="GPU pods' own network bytes (ccl_gpu_pod_network_*) from the kubelet's Summary API, for the "
    "suspected TCP fallback of jobs without NCCL logs",
    default_enabled=True,
    factory=build_collector,
    flags=PODNETWORK_FLAGS,
    flag_group="collector podnetwork",
    settings=settings_from_args,
)

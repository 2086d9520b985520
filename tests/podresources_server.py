"""A real kubelet pod-resources gRPC server on a unix socket, answering ``List`` with a table of
device-plugin devices and Dynamic Resource Allocation claims."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from exporter.sources.podresources_v1 import api_pb2, api_pb2_grpc


@dataclass
class ClaimDevice:
    """One device a DRA driver allocated for a claim (the driver/pool/device triplet and its CDI names)."""

    driver: str
    pool: str
    device: str
    cdi_devices: Sequence[str] = ()


@dataclass
class Claim:
    namespace: str
    name: str
    devices: list[ClaimDevice]


@dataclass
class Container:
    name: str
    devices: dict[str, list[str]] = field(default_factory=dict)  # resource name → device ids
    cpu_ids: Sequence[int] = ()
    claims: list[Claim] = field(default_factory=list)  # Dynamic Resource Allocation (kubelet 1.34+)


@dataclass
class Pod:
    namespace: str
    name: str
    containers: list[Container]


class TableLister(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, pods: list[Pod], fail_with: grpc.StatusCode | None = None) -> None:
        self.pods = pods
        self.fail_with = fail_with
        self.calls = 0

    def List(  # noqa: N802 - the gRPC method's name, from api.proto
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListPodResourcesResponse:
        self.calls += 1
        if self.fail_with is not None:
            context.abort(self.fail_with, "kubelet is restarting")
        return api_pb2.ListPodResourcesResponse(
            pod_resources=[
                api_pb2.PodResources(
                    name=pod.name,
                    namespace=pod.namespace,
                    containers=[
                        api_pb2.ContainerResources(
                            name=c.name,
                            devices=[
                                api_pb2.ContainerDevices(resource_name=r, device_ids=ids)
                                for r, ids in c.devices.items()
                            ],
                            cpu_ids=list(c.cpu_ids),
                            dynamic_resources=[
                                api_pb2.DynamicResource(
                                    claim_name=claim.name,
                                    claim_namespace=claim.namespace,
                                    claim_resources=[
                                        api_pb2.ClaimResource(
                                            cdi_devices=[api_pb2.CDIDevice(name=n) for n in d.cdi_devices],
                                            driver_name=d.driver,
                                            pool_name=d.pool,
                                            device_name=d.device,
                                        )
                                        for d in claim.devices
                                    ],
                                )
                                for claim in c.claims
                            ],
                        )
                        for c in pod.containers
                    ],
                )
                for pod in self.pods
            ]
        )


@contextmanager
def serve_pod_resources(socket_path: Path, lister: TableLister) -> Iterator[TableLister]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(lister, server)
    server.add_insecure_port(f"unix://{socket_path}")
    server.start()
    try:
        yield lister
    finally:
        server.stop(grace=None).wait(5)

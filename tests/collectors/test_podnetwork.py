"""GPU pods' own network bytes from the kubelet's Summary API (collector ``podnetwork``).

No kubelet runs here. The client is exercised against a real HTTPS server of this test
(certificates made with ``openssl``, a bearer token it checks, the kubelet's JSON shape), and
the collector against the real pod-resources gRPC exchange of ``tests/podresources_server.py``.
"""

from __future__ import annotations

import json
import ssl
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from exporter.collectors.base import CollectorUnavailable, PartialCollection
from exporter.collectors.podnetwork import PodNetworkCollector
from exporter.sources.kube import PodMetadata
from exporter.sources.kubelet_stats import (
    MAX_PODS,
    KubeletStatsClient,
    KubeletStatsError,
    KubeletStatsSettings,
    KubeletStatsUnavailable,
    PodNetwork,
    pod_networks,
    summary_document,
)
from exporter.sources.podresources import PodResourcesClient
from tests.pki import issue, make_ca
from tests.podresources_server import Container, Pod, TableLister, serve_pod_resources

TOKEN = "kubelet-reader-token"


def _pod(namespace: str, name: str, network: object) -> dict[str, Any]:
    return {"podRef": {"namespace": namespace, "name": name, "uid": "u"}, "network": network}


# --- parsing ---------------------------------------------------------------------------------


def test_a_pods_interfaces_are_summed_and_loopback_and_the_host_side_of_pod_networking_left_out() -> None:
    """A hostNetwork pod sees every host interface: the NIC with the collectives counts, loopback
    and the host ends of other pods' veth pairs, bridges and tunnels do not."""
    interfaces = {
        "eth0": (2_000, 1_000),
        "net1": (300, 400),  # a second, Multus-attached interface of the pod: its own traffic
        "lo": (9_000_000, 9_000_000),
        "veth1a2b3c": (7_000_000, 5),
        "cali12345": (1, 6_000_000),
        "cni0": (4, 4),
        "flannel.1": (8, 8),
        "vxlan.calico": (8, 8),
        "tunl0": (8, 8),
        "genev_sys_6081": (8, 8),
        "nodelocaldns": (8, 8),
    }
    found = pod_networks(summary_document([("ml", "worker-0", interfaces)]))
    assert found.pods == (
        PodNetwork("ml", "worker-0", transmit_bytes=1_400, receive_bytes=2_300, interfaces=("eth0", "net1")),
    )
    assert found.malformed == 0


def test_an_interface_listed_twice_counts_once_and_an_older_kubelets_default_interface_is_read() -> None:
    twice = _pod("ml", "a", {"interfaces": [{"name": "eth0", "rxBytes": 5, "txBytes": 7}] * 2})
    top_level_only = _pod("ml", "b", {"name": "eth0", "rxBytes": 11, "txBytes": 13})
    found = pod_networks({"pods": [twice, top_level_only]})
    assert [(p.pod, p.receive_bytes, p.transmit_bytes) for p in found.pods] == [("a", 5, 7), ("b", 11, 13)]


def test_pods_without_network_stats_are_absent_not_malformed() -> None:
    found = pod_networks({"pods": [{"podRef": {"namespace": "ml", "name": "starting"}}]})
    assert found.pods == () and found.malformed == 0


@pytest.mark.parametrize(
    "entry",
    [
        _pod("ml", "neg", {"interfaces": [{"name": "eth0", "rxBytes": -1, "txBytes": 0}]}),
        _pod("ml", "text", {"interfaces": [{"name": "eth0", "rxBytes": "12", "txBytes": 0}]}),
        _pod("ml", "bool", {"interfaces": [{"name": "eth0", "rxBytes": True, "txBytes": 0}]}),
        _pod("ml", "float", {"interfaces": [{"name": "eth0", "rxBytes": 1.5, "txBytes": 0}]}),
        _pod("ml", "huge", {"interfaces": [{"name": "eth0", "rxBytes": 2**64, "txBytes": 0}]}),
        _pod("ml", "noname", {"interfaces": [{"rxBytes": 1, "txBytes": 0}]}),
        _pod("ml", "ctl", {"interfaces": [{"name": "eth0\n", "rxBytes": 1, "txBytes": 0}]}),
        _pod("ml", "many", {"interfaces": [{"name": f"e{i}", "rxBytes": 1, "txBytes": 1} for i in range(65)]}),
        _pod("ml", "list", ["eth0"]),
        {"podRef": {"namespace": "ml"}, "network": {}},
        {"podRef": "ml/x"},
        "a pod",
    ],
)
def test_a_malformed_pod_entry_is_counted_and_skipped_the_others_kept(entry: object) -> None:
    good = _pod("ml", "good", {"interfaces": [{"name": "eth0", "rxBytes": 1, "txBytes": 2}]})
    found = pod_networks({"pods": [entry, good]})
    assert [p.pod for p in found.pods] == ["good"]
    assert found.malformed == 1


def test_a_flood_of_pods_is_capped() -> None:
    pods = [_pod("ml", f"p{i}", {"name": "eth0", "rxBytes": i, "txBytes": i}) for i in range(MAX_PODS + 10)]
    found = pod_networks({"pods": pods})
    assert len(found.pods) == MAX_PODS and found.malformed == 10


@pytest.mark.parametrize("summary", [[], "pods", {"pods": "all"}, None])
def test_an_answer_that_is_not_a_summary_is_an_error(summary: object) -> None:
    with pytest.raises(KubeletStatsError):
        pod_networks(summary)


# --- the client against a real HTTPS server --------------------------------------------------


@dataclass
class FakeKubelet:
    """An HTTPS server answering ``/stats/summary`` as a kubelet does, if the bearer token is right."""

    body: bytes = b""
    status: int = 200
    delay: float = 0.0
    token: str = TOKEN
    seen_tokens: list[str] = field(default_factory=list)
    url: str = ""


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("kubelet-pki")
    make_ca(folder)
    issue(folder, "kubelet", "/CN=gpu-node-01", "IP:127.0.0.1")
    make_ca(folder, "other-ca", "/CN=another CA")
    return folder


@pytest.fixture
def kubelet(pki: Path) -> Iterator[FakeKubelet]:
    state = FakeKubelet(body=json.dumps(summary_document([("ml", "worker-0", {"eth0": (10, 20)})])).encode())

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            sent = self.headers.get("Authorization", "")
            state.seen_tokens.append(sent)
            time.sleep(state.delay)
            if sent != f"Bearer {state.token}":
                self.send_error(401)
                return
            if self.path != "/stats/summary":
                self.send_error(404)
                return
            self.send_response(state.status)
            self.send_header("Content-Length", str(len(state.body)))
            self.end_headers()
            self.wfile.write(state.body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki / "kubelet.crt", pki / "kubelet.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"https://127.0.0.1:{server.server_address[1]}/stats/summary"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def _client(kubelet: FakeKubelet, pki: Path, tmp_path: Path, **changes: Any) -> KubeletStatsClient:
    token = tmp_path / "token"
    if not token.exists():
        token.write_text(TOKEN + "\n")
    settings = KubeletStatsSettings(
        url=kubelet.url, token_file=str(token), ca_file=str(pki / "ca.crt"), timeout_seconds=2.0
    )
    for name, value in changes.items():
        settings = KubeletStatsSettings(**{**settings.__dict__, name: value})
    return KubeletStatsClient(settings)


def test_the_summary_is_read_over_verified_tls_with_the_bearer_token(
    kubelet: FakeKubelet, pki: Path, tmp_path: Path
) -> None:
    found = _client(kubelet, pki, tmp_path).read()
    assert found.pods == (PodNetwork("ml", "worker-0", transmit_bytes=20, receive_bytes=10, interfaces=("eth0",)),)
    assert kubelet.seen_tokens == [f"Bearer {TOKEN}"]


def test_the_token_file_is_read_again_on_every_request(kubelet: FakeKubelet, pki: Path, tmp_path: Path) -> None:
    """Projected service-account tokens rotate: the new token is sent without a restart."""
    client = _client(kubelet, pki, tmp_path)
    client.read()
    (tmp_path / "token").write_text("rotated-token")
    kubelet.token = "rotated-token"
    client.read()
    assert kubelet.seen_tokens == [f"Bearer {TOKEN}", "Bearer rotated-token"]


def test_a_certificate_from_another_ca_is_refused_unless_verification_is_switched_off(
    kubelet: FakeKubelet, pki: Path, tmp_path: Path
) -> None:
    with pytest.raises(KubeletStatsError, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        _client(kubelet, pki, tmp_path, ca_file=str(pki / "other-ca.crt")).read()
    found = _client(kubelet, pki, tmp_path, ca_file=str(pki / "other-ca.crt"), insecure_skip_verify=True).read()
    assert [p.pod for p in found.pods] == ["worker-0"]


def test_a_refused_token_says_which_permission_is_missing(kubelet: FakeKubelet, pki: Path, tmp_path: Path) -> None:
    kubelet.token = "someone-else"
    with pytest.raises(KubeletStatsError, match=r"HTTP 401.*nodes/stats"):
        _client(kubelet, pki, tmp_path).read()


@pytest.mark.parametrize(
    ("body", "message"),
    [(b"<html>busy</html>", "not JSON"), (b"[" * 100_000 + b"]" * 100_000, "not JSON|not an object")],
)
def test_garbage_answers_are_errors(kubelet: FakeKubelet, pki: Path, tmp_path: Path, body: bytes, message: str) -> None:
    kubelet.body = body
    with pytest.raises(KubeletStatsError, match=message):
        _client(kubelet, pki, tmp_path).read()


def test_an_oversized_answer_is_cut_off_not_held(
    kubelet: FakeKubelet, pki: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("exporter.sources.kubelet_stats.MAX_RESPONSE_BYTES", 1024)
    kubelet.body = b" " * 4096 + b"{}"
    with pytest.raises(KubeletStatsError, match="larger than 1024 bytes"):
        _client(kubelet, pki, tmp_path).read()


def test_a_kubelet_that_does_not_answer_in_time_is_an_error_not_a_hang(
    kubelet: FakeKubelet, pki: Path, tmp_path: Path
) -> None:
    kubelet.delay = 3.0
    started = time.monotonic()
    with pytest.raises(KubeletStatsError):
        _client(kubelet, pki, tmp_path, timeout_seconds=0.5).read()
    assert time.monotonic() - started < 2.5


def test_a_missing_token_file_is_an_error_and_no_url_means_unavailable(
    kubelet: FakeKubelet, pki: Path, tmp_path: Path
) -> None:
    with pytest.raises(KubeletStatsError, match="bearer token file"):
        _client(kubelet, pki, tmp_path, token_file=str(tmp_path / "absent")).read()
    with pytest.raises(KubeletStatsUnavailable):
        KubeletStatsClient(KubeletStatsSettings(url="")).read()


# --- the collector ---------------------------------------------------------------------------


class StaticStats:
    def __init__(self, summary: object = None, error: Exception | None = None) -> None:
        self.summary, self.error, self.calls = summary, error, 0

    def read(self) -> Any:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return pod_networks(self.summary)


class Jobs:
    def lookup(self, namespace: str, pod: str) -> PodMetadata | None:
        return PodMetadata(namespace, pod, "uid", "llama", "PyTorchJob") if pod.startswith("llama") else None

    def pods(self) -> list[PodMetadata]:
        return []

    def is_authoritative(self) -> bool:
        return True


NODE_PODS = [
    Pod("ml", "llama-worker-0", [Container("trainer", {"nvidia.com/gpu": ["GPU-0", "GPU-1"]})]),
    Pod("ml", "llama-worker-1", [Container("trainer", {"nvidia.com/mig-1g.18gb": ["MIG-1"]})]),
    Pod("kube-system", "coredns-1", [Container("coredns", {})]),
]
SUMMARY = summary_document(
    [
        ("ml", "llama-worker-0", {"eth0": (2_000_000_000, 1_900_000_000), "lo": (5, 5)}),
        ("kube-system", "coredns-1", {"eth0": (7, 7)}),
    ]
)


@pytest.fixture
def pod_resources() -> Iterator[PodResourcesClient]:
    with tempfile.TemporaryDirectory(prefix="podnet-", dir="/tmp") as folder:
        socket = Path(folder) / "kubelet.sock"
        with serve_pod_resources(socket, TableLister(NODE_PODS)):
            client = PodResourcesClient(socket)
            yield client
            client.close()


def _samples(families: list[Any]) -> dict[tuple[str, str], float]:
    return {(s.name, s.labels["pod"]): s.value for f in families for s in f.samples}


def test_only_gpu_pods_are_exported_with_their_job_and_a_silent_one_is_called_unreported(
    pod_resources: PodResourcesClient,
) -> None:
    collector = PodNetworkCollector(StaticStats(SUMMARY), pod_resources, Jobs())  # type: ignore[arg-type]
    families = list(collector.collect())
    assert _samples(families) == {
        ("ccl_gpu_pod_network_transmit_bytes_total", "llama-worker-0"): 1.9e9,
        ("ccl_gpu_pod_network_receive_bytes_total", "llama-worker-0"): 2.0e9,
        ("ccl_gpu_pod_network_unreported", "llama-worker-1"): 1.0,
    }
    assert {s.labels["job_name"] for f in families for s in f.samples} == {"llama"}


def test_a_failing_kubelet_marks_the_collector_failing_without_series(pod_resources: PodResourcesClient) -> None:
    collector = PodNetworkCollector(StaticStats(error=KubeletStatsError("HTTP 403")), pod_resources, Jobs())  # type: ignore[arg-type]
    with pytest.raises(PartialCollection, match="HTTP 403"):
        list(collector.collect())


def test_malformed_entries_keep_the_good_pods_and_mark_the_scrape_partial(pod_resources: PodResourcesClient) -> None:
    summary = {**SUMMARY, "pods": [*SUMMARY["pods"], {"podRef": "broken"}]}
    collector = PodNetworkCollector(StaticStats(summary), pod_resources, Jobs())  # type: ignore[arg-type]
    families: list[Any] = []
    with pytest.raises(PartialCollection, match="1 pod entries malformed"):
        for family in collector.collect():
            families.append(family)
    assert ("ccl_gpu_pod_network_transmit_bytes_total", "llama-worker-0") in _samples(families)


def test_without_gpu_pods_the_kubelet_is_not_asked(tmp_path: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="podnet-", dir="/tmp") as folder:
        socket = Path(folder) / "kubelet.sock"
        with serve_pod_resources(socket, TableLister([Pod("kube-system", "coredns-1", [Container("coredns", {})])])):
            client = PodResourcesClient(socket)
            stats = StaticStats(SUMMARY)
            families = list(PodNetworkCollector(stats, client, Jobs()).collect())  # type: ignore[arg-type]
            client.close()
    assert stats.calls == 0 and _samples(families) == {}


def test_without_the_pod_resources_socket_the_collector_is_unavailable(tmp_path: Path) -> None:
    client = PodResourcesClient(tmp_path / "absent.sock")
    with pytest.raises(CollectorUnavailable, match="which pods hold GPUs"):
        list(PodNetworkCollector(StaticStats(SUMMARY), client, Jobs()).collect())  # type: ignore[arg-type]


# --- the simulated node's kubelet ------------------------------------------------------------


def test_the_simulated_kubelet_serves_pod_traffic_at_the_rates_set() -> None:
    from ccl_sim.nvml import TRAINING_NAMESPACE, TRAINING_POD
    from ccl_sim.resources import temporary_simulated_node

    with temporary_simulated_node(seed=3) as node:
        assert node.kubelet is not None
        client = KubeletStatsClient(KubeletStatsSettings(url=node.kubelet.url, token_file="", ca_file=""))
        before = {p.pod: p for p in client.read().pods}[TRAINING_POD]
        node.kubelet.set_traffic(TRAINING_NAMESPACE, TRAINING_POD, 2e9, 1e9)
        node.advance(2.0)
        after = {p.pod: p for p in client.read().pods}[TRAINING_POD]
    assert after.transmit_bytes - before.transmit_bytes == pytest.approx(4e9, rel=0.01)
    assert after.receive_bytes - before.receive_bytes == pytest.approx(2e9, rel=0.01)

"""The simulate-mode control endpoint (``/-/sim``) against a real simulated node tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from ccl_sim.control import SimControl, add_control_routes
from ccl_sim.node import default_node
from exporter.collectors.rdma import RdmaCollector
from exporter.http.endpoints import create_app


def _samples(collector: RdmaCollector, name: str) -> dict[str, float]:
    return {
        sample.labels["device"]: sample.value
        for family in collector.collect()
        for sample in family.samples
        if sample.name == name
    }


@pytest.fixture
async def controlled(tmp_path: Path, app_client):  # type: ignore[no-untyped-def]
    """(test client of an app with the control routes, the SimControl, an RDMA collector on its tree)."""
    node = default_node(tmp_path)
    node.setup()
    node.advance(1.0)
    control = SimControl(node)
    collector = RdmaCollector(node.sysfs)
    app = create_app([collector], process_metrics=False)
    add_control_routes(app, control)
    yield await app_client(app), control, collector
    node.close()


async def test_port_down_and_up_change_the_tree_the_collector_reads(controlled) -> None:  # type: ignore[no-untyped-def]
    client, control, collector = controlled
    response = await client.post("/-/sim/rdma-port-down", params={"device": "mlx5_3"})
    assert response.status == 200
    body = await response.json()
    assert body["devices"] == ["mlx5_3"] and body["at"] > 0
    states = _samples(collector, "ccl_rdma_port_state_id")
    assert states["mlx5_3"] == 1 and states["mlx5_2"] == 4

    before = _samples(collector, "ccl_rdma_port_transmit_bytes_total")
    control.advance(1.0)
    after = _samples(collector, "ccl_rdma_port_transmit_bytes_total")
    assert after["mlx5_3"] == before["mlx5_3"], "a DOWN port carries no traffic"
    assert after["mlx5_2"] > before["mlx5_2"]

    assert (await client.post("/-/sim/rdma-port-up", params={"device": "mlx5_3"})).status == 200
    control.advance(1.0)
    assert _samples(collector, "ccl_rdma_port_state_id")["mlx5_3"] == 4
    assert _samples(collector, "ccl_rdma_port_transmit_bytes_total")["mlx5_3"] > after["mlx5_3"]


async def test_traffic_stop_flattens_every_port(controlled) -> None:  # type: ignore[no-untyped-def]
    client, control, collector = controlled
    assert (await client.post("/-/sim/rdma-traffic-stop")).status == 200
    before = _samples(collector, "ccl_rdma_port_receive_bytes_total")
    control.advance(5.0)
    assert _samples(collector, "ccl_rdma_port_receive_bytes_total") == before
    assert all(v == 4 for v in _samples(collector, "ccl_rdma_port_state_id").values()), "ports stay ACTIVE"
    assert (await client.post("/-/sim/rdma-traffic-start")).status == 200
    control.advance(1.0)
    assert all(_samples(collector, "ccl_rdma_port_receive_bytes_total")[d] > v for d, v in before.items())


async def test_bad_requests_are_refused_with_a_reason(controlled) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = controlled
    unknown = await client.post("/-/sim/reboot")
    assert unknown.status == 400 and "unknown action" in (await unknown.json())["error"]
    bad_device = await client.post("/-/sim/rdma-port-down", params={"device": "mlx5_99"})
    assert bad_device.status == 400 and "mlx5_99" in (await bad_device.json())["error"]
    bad_seconds = await client.post("/-/sim/advance", params={"seconds": "-1"})
    assert bad_seconds.status == 400
    for params in (
        {"transmit_bytes_per_second": "2e9"},
        {"transmit_bytes_per_second": "fast", "receive_bytes_per_second": "1"},
        {"transmit_bytes_per_second": "-1", "receive_bytes_per_second": "1"},
    ):
        bad_traffic = await client.post("/-/sim/pod-traffic", params=params)
        assert bad_traffic.status == 400 and "bytes_per_second" in (await bad_traffic.json())["error"]
    listing = await client.get("/-/sim")
    assert "rdma-port-down" in (await listing.json())["actions"]
    assert (await client.get("/-/sim/rdma-port-down")).status == 405, "actions change state: POST only"


def test_plain_serve_has_no_control_routes(exporter_process) -> None:  # type: ignore[no-untyped-def]
    """``ccl-exporter serve`` has nothing to drive: /-/sim does not exist."""
    from tests.conftest import http_get

    exporter = exporter_process("--collector.disable-defaults")
    assert http_get(exporter.url + "/-/sim")[0] == 404


async def test_clients_off_loopback_are_forbidden(tmp_path: Path) -> None:
    """Binding a non-loopback address is not allowed in tests; a request whose peer is 10.0.0.5 is built instead."""
    from unittest import mock

    from aiohttp.test_utils import make_mocked_request

    node = default_node(tmp_path)
    node.setup()
    app = create_app([], process_metrics=False)
    add_control_routes(app, SimControl(node))
    transport = mock.Mock(
        **{"get_extra_info.side_effect": {"peername": ("10.0.0.5", 51000), "sockname": ("10.0.0.1", 40000)}.get}
    )
    try:
        for method, path in (("POST", "/-/sim/rdma-port-down"), ("GET", "/-/sim")):
            handler = app.routes[(method, "/-/sim/{action}" if method == "POST" else path)]
            response = await handler(
                make_mocked_request(method, path, transport=transport, match_info={"action": "rdma-port-down"})
            )
            assert response.status == 403 and b"loopback clients only" in response.body
    finally:
        node.close()


async def test_nvml_actions_reach_the_simulated_gpus(controlled) -> None:  # type: ignore[no-untyped-def]
    client, control, _ = controlled
    nvml = control.node.nvml  # type: ignore[attr-defined]
    assert nvml.assignments()
    assert (await client.post("/-/sim/gpu-release")).status == 200
    assert nvml.assignments() == []
    response = await client.post("/-/sim/gpu-assign", params={"namespace": "ns", "pod": "p-0"})
    assert response.status == 200
    assert {(a.namespace, a.pod) for a in nvml.assignments()} == {("ns", "p-0")}
    assert (await client.post("/-/sim/nvlink-down", params={"gpu": "2", "link": "5"})).status == 200
    assert nvml._links[(2, 5)].active is False
    missing = await client.post("/-/sim/nvlink-down", params={"gpu": "2"})
    assert missing.status == 400 and "link= is required" in (await missing.json())["error"]
    nowhere = await client.post("/-/sim/nvlink-down", params={"gpu": "99", "link": "0"})
    assert nowhere.status == 400


async def test_nccl_job_actions_write_and_remove_pod_logs(controlled) -> None:  # type: ignore[no-untyped-def]
    client, control, _ = controlled
    pods = control.node.root / "pods"
    started = await client.post(
        "/-/sim/nccl-job-start", params={"namespace": "ns", "pod": "gpt-worker-0", "job_name": "gpt"}
    )
    assert started.status == 200
    folder = next(pods.glob("ns_gpt-worker-0_*"))
    assert "Using network IB" in (folder / "pytorch" / "0.log").read_text()

    restarted = await client.post("/-/sim/nccl-job-restart", params={"namespace": "ns", "pod": "gpt-worker-0"})
    assert (await restarted.json())["network"] == "Socket"
    new_log = (folder / "pytorch" / "1.log").read_text()
    assert "Using network Socket" in new_log and "NET/Socket" in new_log

    assert (await client.post("/-/sim/nccl-job-stop", params={"namespace": "ns", "pod": "gpt-worker-0"})).status == 200
    assert not folder.exists()
    gone = await client.post("/-/sim/nccl-job-restart", params={"namespace": "ns", "pod": "gpt-worker-0"})
    assert gone.status == 400 and "no running simulated pod" in (await gone.json())["error"]
    incomplete = await client.post("/-/sim/nccl-job-start", params={"namespace": "ns"})
    assert incomplete.status == 400 and "pod=, job_name= required" in (await incomplete.json())["error"]
    wrong = await client.post(
        "/-/sim/nccl-job-start", params={"namespace": "n", "pod": "p", "job_name": "j", "network": "Ethernet"}
    )
    assert wrong.status == 400


async def test_rdma_errors_bump_one_counter(controlled) -> None:  # type: ignore[no-untyped-def]
    client, control, collector = controlled

    def symbol_errors() -> dict[str, float]:
        return {
            s.labels["device"]: s.value
            for family in collector.collect()
            for s in family.samples
            if s.name == "ccl_rdma_port_errors_total" and s.labels["counter"] == "symbol_error"
        }

    before = symbol_errors()
    response = await client.post("/-/sim/rdma-errors", params={"device": "mlx5_4", "count": "25"})
    assert response.status == 200
    control.advance(1.0)
    after = symbol_errors()
    assert after["mlx5_4"] - before["mlx5_4"] >= 25
    bad = await client.post("/-/sim/rdma-errors", params={"counter": "port_xmit_data"})
    assert bad.status == 400


async def test_hw_counter_errors_and_garbage_attributes(controlled) -> None:  # type: ignore[no-untyped-def]
    from exporter.collectors.base import PartialCollection

    client, _, collector = controlled
    response = await client.post(
        "/-/sim/rdma-errors", params={"device": "mlx5_2", "counter": "out_of_sequence", "count": "7"}
    )
    assert response.status == 200 and (await response.json())["value"] >= 7
    assert (await client.post("/-/sim/rdma-garbage", params={"device": "mlx5_5"})).status == 200
    with pytest.raises(PartialCollection):
        list(collector.collect())
    assert (await client.post("/-/sim/rdma-garbage", params={"attribute": "board_id"})).status == 400


async def test_probe_result_lands_where_the_probe_collector_reads(controlled) -> None:  # type: ignore[no-untyped-def]
    from exporter.results.probe_file import parse_result

    client, control, _ = controlled
    response = await client.post("/-/sim/probe-result", params={"busbw_gbps": "120"})
    assert response.status == 200
    written = control.node.root / "probe-results" / (await response.json())["file"]
    result = parse_result(written.read_text())
    peak = max(row.busbw_bytes_per_second for row in result.collectives[0].rows)
    assert 100e9 < peak <= 120e9 and result.source == "job"
    assert (await client.post("/-/sim/probe-result", params={"busbw_gbps": "-3"})).status == 400


@pytest.mark.parametrize(
    "params",
    [
        {"namespace": "../../..", "pod": "escape", "job_name": "j"},
        {"namespace": "ns", "pod": "../../../../tmp/x", "job_name": "j"},
        {"namespace": "ns", "pod": "..", "job_name": "j"},
        {"namespace": "NS", "pod": "p", "job_name": "j"},
        {"namespace": "ns", "pod": "p", "job_name": "a/b"},
        {"namespace": "n" * 64, "pod": "p", "job_name": "j"},
    ],
)
async def test_names_that_are_not_kubernetes_names_are_refused(controlled, params, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = controlled
    response = await client.post("/-/sim/nccl-job-start", params=params)
    assert response.status == 400 and "Kubernetes name" in (await response.json())["error"]
    assert not list(tmp_path.parent.glob("*escape*")), "nothing written outside the simulated tree"
    for action in ("nccl-job-stop", "nccl-job-restart", "gpu-assign", "probe-result"):
        refused = await client.post(f"/-/sim/{action}", params={"namespace": "../../..", "pod": "p"})
        assert refused.status == 400, action
    assert (await client.post("/-/sim/gpu-assign", params={"container": "../c"})).status == 400
    ok = await client.post("/-/sim/nccl-job-start", params={"namespace": "ns", "pod": "w-0.a", "job_name": "j"})
    assert ok.status == 200, "a pod name may be a DNS-1123 subdomain"


async def test_cross_origin_posts_are_refused(controlled) -> None:  # type: ignore[no-untyped-def]
    """A web page (any other origin, or a rebound DNS name) must not drive the node; curl and our own page may."""
    client, _, _ = controlled
    port = client.server.port
    for headers in (
        {"Origin": "http://evil.example"},
        {"Origin": f"http://evil.example:{port}"},  # DNS rebinding keeps the port, not the origin
        {"Origin": "null"},
        {"Origin": f"https://127.0.0.1:{port}"},
        {"Origin": f"http://127.0.0.1:{port + 1}"},
        {"Referer": "http://evil.example/page.html"},
    ):
        response = await client.post("/-/sim/advance", headers=headers)
        assert response.status == 403, headers
        assert "cross-origin" in await response.text()
    for headers in (
        {},
        {"Origin": f"http://127.0.0.1:{port}"},
        {"Origin": f"http://localhost:{port}"},
        {"Referer": f"http://127.0.0.1:{port}/-/sim"},
    ):
        assert (await client.post("/-/sim/advance", headers=headers)).status == 200, headers


async def test_pod_traffic_sets_the_rates_the_kubelet_summary_counts(controlled) -> None:  # type: ignore[no-untyped-def]
    from ccl_sim.nvml import TRAINING_NAMESPACE, TRAINING_POD

    client, control, _ = controlled
    kubelet = control.node.kubelet

    def sent() -> int:
        pods = kubelet.summary()["pods"]
        entry = next(p for p in pods if p["podRef"]["name"] == TRAINING_POD)
        return int(entry["network"]["txBytes"])

    before = sent()
    control.advance(1.0)
    assert sent() - before == 20_000, "chatter before"
    response = await client.post(
        "/-/sim/pod-traffic",
        params={
            "namespace": TRAINING_NAMESPACE,
            "pod": TRAINING_POD,
            "transmit_bytes_per_second": "2e9",
            "receive_bytes_per_second": "5e7",
        },
    )
    assert response.status == 200 and (await response.json())["transmit_bytes_per_second"] == 2e9
    before = sent()
    control.advance(2.0)
    assert sent() - before == 4_000_000_000

"""The RDMA collector's exposition: golden file, promtool lint, failure isolation."""

from __future__ import annotations

import shutil
from pathlib import Path

from exporter.collectors.rdma import RdmaCollector
from tests.conftest import require_tool
from tests.metrics_text import promtool_check_metrics, samples, scrape_collectors, stable_lines, value

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "rdma_metrics.txt"


def scrape(sysfs: Path) -> str:
    return scrape_collectors(RdmaCollector(sysfs))


def test_golden_metrics(fixture_tree, update_golden: bool) -> None:  # type: ignore[no-untyped-def]
    text = stable_lines(scrape(fixture_tree("sysfs_rdma")))
    if update_golden:
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "run pytest --update-golden after checking the diff"


def test_promtool_accepts_the_exposition(fixture_tree) -> None:  # type: ignore[no-untyped-def]
    promtool = require_tool("promtool")
    result = promtool_check_metrics(promtool, scrape(fixture_tree("sysfs_rdma")))
    assert result.returncode == 0 and result.stdout == "" and result.stderr == "", result.stderr


def test_output_is_deterministic(fixture_tree) -> None:  # type: ignore[no-untyped-def]
    root = fixture_tree("sysfs_rdma")
    assert stable_lines(scrape(root)) == stable_lines(scrape(root))


def test_malformed_device_reports_partial_and_keeps_the_rest(fixture_tree) -> None:  # type: ignore[no-untyped-def]
    text = scrape(fixture_tree("sysfs_rdma_malformed"))
    assert value(text, "ccl_exporter_collector_success", collector="rdma") == 0.0
    assert value(text, "ccl_rdma_port_transmit_bytes_total", device="mlx5_0", port="1") == 400.0
    assert value(text, "ccl_rdma_port_state_id", device="mlx5_0", port="1") == 4.0
    assert value(text, "ccl_rdma_port_receive_bytes_total", device="mlx5_1", port="1") == 200.0
    assert value(text, "ccl_rdma_port_state_id", device="mlx5_1", port="1") is None


def test_node_without_rdma_reports_unavailable(tmp_path: Path) -> None:
    text = scrape(tmp_path)
    assert value(text, "ccl_exporter_collector_success", collector="rdma") == 0.0
    assert "ccl_rdma_port" not in text


def test_counters_follow_the_tree(fixture_tree) -> None:  # type: ignore[no-untyped-def]
    """Values are re-read on every scrape (no caching of counters)."""
    root = fixture_tree("sysfs_rdma")
    counter = root / "devices/pci0000:00/0000:00:00.0/infiniband/mlx5_0/ports/1/counters/port_xmit_data"
    counter.write_text("10\n")
    assert value(scrape(root), "ccl_rdma_port_transmit_bytes_total", device="mlx5_0", port="1") == 40.0
    counter.write_text("11\n")
    assert value(scrape(root), "ccl_rdma_port_transmit_bytes_total", device="mlx5_0", port="1") == 44.0


def _per_port_sum(text: str, name: str, **labels: str) -> float:
    """The sum of a per-port family's samples that carry ``labels``."""
    wanted = set(labels.items())
    return sum(v for (sample, found), v in samples(text).items() if sample == name and wanted <= set(found))


def test_node_summary_is_the_sum_over_ports(fixture_tree) -> None:  # type: ignore[no-untyped-def]
    text = scrape(fixture_tree("sysfs_rdma"))
    ports = [labels for (name, labels) in samples(text) if name == "ccl_rdma_port_info"]
    states = [v for (name, _), v in samples(text).items() if name == "ccl_rdma_port_state_id"]
    assert value(text, "ccl_rdma_node_ports") == len(ports) == 7
    assert value(text, "ccl_rdma_node_ports_active") == sum(1 for state in states if state in (4, 5)) == 5
    for direction in ("transmit", "receive"):
        node = value(text, f"ccl_rdma_node_{direction}_bytes_total")
        assert node == _per_port_sum(text, f"ccl_rdma_port_{direction}_bytes_total") > 0
    counters = {dict(labels)["counter"] for (name, labels) in samples(text) if name == "ccl_rdma_port_errors_total"}
    assert len(counters) == 13 and "port_xmit_wait" not in counters, "congestion ticks are not an error counter"
    for counter in counters:
        node = value(text, "ccl_rdma_node_errors_total", counter=counter)
        assert node == _per_port_sum(text, "ccl_rdma_port_errors_total", counter=counter), counter


def test_node_summary_counts_slow_ports_and_roce_cnps(fixture_tree) -> None:  # type: ignore[no-untyped-def]
    """Rate-degraded ports are ACTIVE ports slower than the fastest ACTIVE port of the same link layer
    and HCA model; the CNP sums cover RoCE (Ethernet) ports only."""
    root = fixture_tree("sysfs_rdma")
    text = scrape(root)
    assert value(text, "ccl_rdma_node_ports_rate_degraded") == 0  # every ACTIVE port is alone in its kind
    for counter in ("np_cnp_sent", "rp_cnp_handled"):
        roce = _per_port_sum(text, "ccl_rdma_port_hw_counters_total", counter=counter, device="mlx5_1")
        assert value(text, "ccl_rdma_node_roce_cnp_total", counter=counter) == roce > 0
    # mlx5_2 (same model and link layer as mlx5_0) comes up at a lower rate: one degraded port
    port = root / "devices/pci0000:00/0000:00:02.0/infiniband/mlx5_2/ports/1"
    (port / "state").write_text("4: ACTIVE\n")
    text = scrape(root)
    assert value(text, "ccl_rdma_port_rate_bytes_per_second", device="mlx5_2", port="1") < value(
        text, "ccl_rdma_port_rate_bytes_per_second", device="mlx5_0", port="1"
    )
    assert value(text, "ccl_rdma_node_ports_rate_degraded") == 1
    # at the same rate it is no longer degraded
    (port / "rate").write_text((root / "devices/pci0000:00/0000:00:00.0/infiniband/mlx5_0/ports/1/rate").read_text())
    assert value(scrape(root), "ccl_rdma_node_ports_rate_degraded") == 0


def test_node_summary_never_falls_when_a_port_resets_or_goes(fixture_tree) -> None:  # type: ignore[no-untyped-def]
    """A port's counter reset counts from zero and a port that disappears keeps what it added:
    the node's sums only grow, so Prometheus' rate never sees a false reset."""
    root = fixture_tree("sysfs_rdma")
    collector = RdmaCollector(root)  # one collector: the sums live across its scrapes
    ports = root / "devices/pci0000:00/0000:00:00.0/infiniband/mlx5_0/ports/1"
    data, symbol = ports / "counters/port_xmit_data", ports / "counters/symbol_error"
    data.write_text("1000\n")
    symbol.write_text("5\n")
    first = scrape_collectors(collector)
    before_bytes = value(first, "ccl_rdma_node_transmit_bytes_total")
    before_errors = value(first, "ccl_rdma_node_errors_total", counter="symbol_error")
    assert before_bytes is not None and before_errors is not None

    data.write_text("1010\n")  # +40 bytes (4-octet words)
    symbol.write_text("7\n")  # +2
    second = scrape_collectors(collector)
    assert value(second, "ccl_rdma_node_transmit_bytes_total") == before_bytes + 40
    assert value(second, "ccl_rdma_node_errors_total", counter="symbol_error") == before_errors + 2

    data.write_text("3\n")  # reset: counts from zero, +12 bytes
    symbol.write_text("1\n")  # reset: +1
    third = scrape_collectors(collector)
    assert value(third, "ccl_rdma_node_transmit_bytes_total") == before_bytes + 52
    assert value(third, "ccl_rdma_node_errors_total", counter="symbol_error") == before_errors + 3

    shutil.rmtree(ports)  # the port disappears (hot-unplug, driver reload)
    fourth = scrape_collectors(collector)
    assert value(fourth, "ccl_rdma_node_ports") == 6
    assert value(fourth, "ccl_rdma_node_transmit_bytes_total") == before_bytes + 52
    # the ports left add up to less: the first reading's 1000 words of the port that went
    assert _per_port_sum(fourth, "ccl_rdma_port_transmit_bytes_total") == before_bytes - 4000


def test_node_summary_skips_what_no_port_reports(tmp_path: Path) -> None:
    """A node whose ports report no data counters has port counts but no byte sums (never 0)."""
    port = tmp_path / "class/infiniband/mlx5_0/ports/1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    text = scrape(tmp_path)
    assert value(text, "ccl_rdma_node_ports") == 1.0
    assert value(text, "ccl_rdma_node_ports_active") == 1.0
    assert value(text, "ccl_rdma_node_transmit_bytes_total") is None
    assert "ccl_rdma_node_errors_total{" not in text

"""The RDMA collector's exposition: golden file, promtool lint, failure isolation."""

from __future__ import annotations

from pathlib import Path

from exporter.collectors.rdma import RdmaCollector
from tests.conftest import require_tool
from tests.metrics_text import promtool_check_metrics, scrape_collectors, stable_lines, value

GOLDEN = Path(__file__).parent / "golden" / "rdma_metrics.txt"


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

"""``python -m ccl_sim serve``: a node with living counters that promtool accepts."""

from __future__ import annotations

import time

from tests.conftest import require_tool
from tests.metrics_text import promtool_check_metrics, samples, value


def test_simulated_counters_advance_and_lint_clean(exporter_process) -> None:  # type: ignore[no-untyped-def]
    proc = exporter_process(simulated=True)
    first = proc.metrics()
    time.sleep(2.2)
    second = proc.metrics()
    ports = [dict(labels) for (name, labels) in samples(first) if name == "ccl_rdma_port_info"]
    assert len(ports) == 10
    assert sorted(p["link_layer"] for p in ports).count("InfiniBand") == 8
    for port in ports:
        labels = {"device": port["device"], "port": port["port"]}
        before = value(first, "ccl_rdma_port_transmit_bytes_total", **labels)
        after = value(second, "ccl_rdma_port_transmit_bytes_total", **labels)
        assert before is not None and after is not None and after > before, port
        assert value(second, "ccl_rdma_port_state_id", **labels) == 4.0
    assert value(second, "ccl_rdma_port_rate_bytes_per_second", device="mlx5_0", port="1") == 50e9
    roce = value(second, "ccl_rdma_port_hw_counters_total", device="mlx5_8", port="1", counter="np_cnp_sent")
    assert roce is not None and roce > 0
    promtool = require_tool("promtool")
    result = promtool_check_metrics(promtool, second)
    assert result.returncode == 0 and result.stderr == "", result.stderr

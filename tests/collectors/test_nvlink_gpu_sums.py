"""The NVML collector's per-GPU NVLink sums (``ccl_nvlink_gpu_*``, what the rules read) and its
per-GPU mode (``--collector.nvml.nvlink-granularity=gpu``): counters that never go back when a
link resets or is not read, and the series each mode keeps."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import pytest

from ccl_sim.node import default_node
from exporter.collectors.nvml import SPEC, NvlinkTotals, NvmlCollector, NvmlSettings, settings_from_args
from exporter.sources.nvml import GpuIdentity, GpuReading, NvLinkReading, NvmlReading
from tests.conftest import require_tool


def gpu(index: int, *links: NvLinkReading, uuid: str | None = None) -> GpuReading:
    return GpuReading(GpuIdentity(index, uuid or f"GPU-{index}", "H100", f"0000:{index:02x}:00.0"), links)


def link(number: int, tx: int | None = 0, replay: int | None = None, active: bool | None = True) -> NvLinkReading:
    errors = {} if replay is None else {"replay": replay}
    return NvLinkReading(number, active=active, transmit_bytes=tx, receive_bytes=tx, errors=errors)


class Backend:
    """An NVML backend that hands out prepared readings in turn."""

    def __init__(self, *readings: NvmlReading) -> None:
        self.readings = list(readings)

    def read(self) -> NvmlReading:
        return self.readings.pop(0)

    def gpus(self) -> list[GpuIdentity]:
        return []

    def compute_processes(self) -> dict[str, list[object]]:
        return {}

    def close(self) -> None:
        return None


def test_a_gpu_starts_at_the_sum_of_its_links() -> None:
    totals = NvlinkTotals().update([gpu(0, link(0, 100, replay=2), link(1, 50, replay=3))], complete=True)
    assert totals == {"GPU-0": {"transmit": 150.0, "receive": 150.0, "replay": 5.0}}


def test_sums_grow_by_each_links_increase() -> None:
    totals = NvlinkTotals()
    totals.update([gpu(0, link(0, 100), link(1, 50))], complete=True)
    assert totals.update([gpu(0, link(0, 130), link(1, 60))], complete=True)["GPU-0"]["transmit"] == 190.0


def test_a_link_counter_reset_counts_from_zero_and_the_sum_never_falls() -> None:
    totals = NvlinkTotals()
    totals.update([gpu(0, link(0, 1000), link(1, 500))], complete=True)
    # link 0 reset (driver reloaded it) and has moved 40 since; link 1 moved 10
    assert totals.update([gpu(0, link(0, 40), link(1, 510))], complete=True)["GPU-0"]["transmit"] == 1550.0


def test_a_link_not_read_adds_nothing_and_resumes_from_its_last_value() -> None:
    totals = NvlinkTotals()
    totals.update([gpu(0, link(0, 1000), link(1, 500))], complete=True)
    # link 1's counter is not read this time (down): the sum keeps it, it does not fall by 500
    assert totals.update([gpu(0, link(0, 1100), link(1, None))], complete=True)["GPU-0"]["transmit"] == 1600.0
    # back, having moved 20 since it was last read
    assert totals.update([gpu(0, link(0, 1100), link(1, 520))], complete=True)["GPU-0"]["transmit"] == 1620.0


def test_a_link_first_read_later_starts_from_its_value_then() -> None:
    totals = NvlinkTotals()
    totals.update([gpu(0, link(0, 1000))], complete=True)
    assert totals.update([gpu(0, link(0, 1000), link(1, 7000))], complete=True)["GPU-0"]["transmit"] == 1000.0
    assert totals.update([gpu(0, link(0, 1000), link(1, 7005))], complete=True)["GPU-0"]["transmit"] == 1005.0


def test_an_error_kind_first_readable_later_starts_at_its_links_sum() -> None:
    totals = NvlinkTotals()
    totals.update([gpu(0, link(0, 0), link(1, 0))], complete=True)
    after = totals.update([gpu(0, link(0, 0, replay=4), link(1, 0, replay=6))], complete=True)["GPU-0"]
    assert after["replay"] == 10.0


def test_a_gpu_whose_read_failed_keeps_its_sums_and_a_gone_gpu_is_forgotten() -> None:
    totals = NvlinkTotals()
    totals.update([gpu(0, link(0, 100)), gpu(1, link(0, 100))], complete=True)
    assert set(totals.update([gpu(0, link(0, 110))], complete=False)) == {"GPU-0"}  # GPU 1 failed to read
    assert totals.update([gpu(1, link(0, 90))], complete=False)["GPU-1"]["transmit"] == 190.0  # it reset meanwhile
    totals.update([gpu(0, link(0, 120))], complete=True)  # a complete reading without GPU 1: it is gone
    assert totals.update([gpu(1, link(0, 90))], complete=True)["GPU-1"]["transmit"] == 90.0  # new: starts afresh


def test_the_node_sums_the_gpus_and_never_falls_when_a_gpu_goes() -> None:
    totals = NvlinkTotals()
    first = totals.update([gpu(0, link(0, 100, replay=1)), gpu(1, link(0, 50))], complete=True)
    assert totals.node(first) == {"transmit": 150.0, "receive": 150.0, "replay": 1.0}
    # GPU 1 falls off the bus (a complete reading without it): its per-GPU sums are gone, the node keeps its share
    second = totals.update([gpu(0, link(0, 120, replay=1))], complete=True)
    assert set(second) == {"GPU-0"}
    assert totals.node(second)["transmit"] == 170.0
    # a new GPU starts from its value then: the node grows by what it moves from now on
    third = totals.update([gpu(0, link(0, 120, replay=1)), gpu(2, link(0, 5000))], complete=True)
    assert totals.node(third)["transmit"] == 170.0
    fourth = totals.update([gpu(0, link(0, 130, replay=1)), gpu(2, link(0, 5005))], complete=True)
    assert totals.node(fourth)["transmit"] == 185.0


def test_no_nvlink_no_node_link_counts() -> None:
    """A GPU without NVLink (PCIe): no link state, so no node link counts and no node counters."""
    families = _families(NvmlCollector(Backend(NvmlReading([gpu(0)]))))
    assert "ccl_nvlink_node_links" not in families and "ccl_nvlink_node_transmit_bytes" not in families
    assert families["ccl_nvlink_node_errors"] == []


def _families(collector: NvmlCollector) -> dict[str, list[tuple[dict[str, str], float]]]:
    return {f.name: [(s.labels, s.value) for s in f.samples] for f in collector.collect()}


def test_per_gpu_series_in_both_modes_and_per_link_series_only_in_link_mode() -> None:
    reading = NvmlReading([gpu(0, link(0, 100, replay=1), link(1, 50, replay=2, active=False))])
    per_link = _families(NvmlCollector(Backend(reading), NvmlSettings(per_link=True)))
    per_gpu = _families(NvmlCollector(Backend(reading)))  # the default
    gpu_names = {
        "ccl_gpu_info",
        "ccl_nvlink_gpu_links",
        "ccl_nvlink_gpu_links_active",
        "ccl_nvlink_gpu_transmit_bytes",
        "ccl_nvlink_gpu_receive_bytes",
        "ccl_nvlink_gpu_errors",
        "ccl_nvlink_node_links",
        "ccl_nvlink_node_links_active",
        "ccl_nvlink_node_transmit_bytes",
        "ccl_nvlink_node_receive_bytes",
        "ccl_nvlink_node_errors",
    }
    assert set(per_gpu) == gpu_names
    assert set(per_link) == gpu_names | {
        "ccl_nvlink_state",
        "ccl_nvlink_speed_bytes_per_second",
        "ccl_nvlink_transmit_bytes",
        "ccl_nvlink_receive_bytes",
        "ccl_nvlink_errors",
        "ccl_nvlink_remote_info",
    }
    assert per_gpu["ccl_nvlink_gpu_links"] == [({"gpu": "0"}, 2.0)]
    assert per_gpu["ccl_nvlink_gpu_links_active"] == [({"gpu": "0"}, 1.0)]
    assert per_gpu["ccl_nvlink_gpu_transmit_bytes"] == [({"gpu": "0"}, 150.0)]
    assert per_gpu["ccl_nvlink_gpu_errors"] == [({"gpu": "0", "error": "replay"}, 3.0)]
    assert per_gpu["ccl_nvlink_node_links"] == [({}, 2.0)] and per_gpu["ccl_nvlink_node_links_active"] == [({}, 1.0)]
    assert per_gpu["ccl_nvlink_node_transmit_bytes"] == [({}, 150.0)]
    assert per_gpu["ccl_nvlink_node_errors"] == [({"error": "replay"}, 3.0)]
    assert {name: per_gpu[name] for name in gpu_names} == {name: per_link[name] for name in gpu_names}


def test_the_flag_chooses_the_mode_and_rejects_anything_else() -> None:
    parser = argparse.ArgumentParser()
    for flag in SPEC.flags:
        flag.add_to(parser, {})
    assert settings_from_args(parser.parse_args([])) == NvmlSettings(per_link=False), "per GPU by default"
    assert settings_from_args(parser.parse_args(["--collector.nvml.nvlink-granularity=gpu"])) == NvmlSettings(False)
    assert settings_from_args(parser.parse_args(["--collector.nvml.nvlink-granularity=link"])) == NvmlSettings(True)
    assert NvmlSettings() == NvmlSettings(per_link=False)
    with pytest.raises(SystemExit):
        parser.parse_args(["--collector.nvml.nvlink-granularity=port"])


def test_series_per_node_in_each_mode_on_the_simulated_node(tmp_path: Path) -> None:
    """The series budget docs/scaling.md gives: an 8-GPU NVLink4 node (18 links per GPU)."""
    node = default_node(tmp_path)
    node.setup()
    try:
        assert node.nvml is not None
        node.advance(1.0)
        per_link = sum(len(v) for v in _families(NvmlCollector(node.nvml, NvmlSettings(per_link=True))).values())
        per_gpu = sum(len(v) for v in _families(NvmlCollector(node.nvml)).values())
    finally:
        node.close()
    # per GPU: info, links, active, tx, rx and four error kinds = 9 x 8; the node's the same 8 once
    assert per_gpu == 72 + 8
    # per link as well: state, speed, tx, rx, remote (5 x 144) and the errors of 144 links
    # (crc_data only on links 0-11: 12 x 4 + 6 x 3 per GPU = 66 x 8 = 528)
    assert per_link == per_gpu + 5 * 144 + 528


def test_promtool_accepts_the_per_gpu_page(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    promtool = require_tool("promtool")
    registry = CollectorRegistry()
    registry.register(
        NvmlCollector(Backend(NvmlReading([gpu(0, link(0, 100, replay=1))])), NvmlSettings(per_link=False))
    )
    page = generate_latest(registry)
    result = subprocess.run([promtool, "check", "metrics"], input=page, capture_output=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr

"""``python -m ccl_sim serve`` with idle-time probes: skipped while the simulated training pod holds
the GPUs (real pod-resources gRPC server of the simulated node), then a real gloo probe runs
once the pod ends, and its ``ccl_probe_*`` series are served. The serving process never loads
torch."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

# Whether torch is there, without importing it (seconds) into every run that collects this module.
if importlib.util.find_spec("torch") is None:
    pytest.skip("torch is not installed (the probe extra)", allow_module_level=True)


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def wait_for(exporter, predicate, timeout: float) -> list[tuple[str, dict[str, str], float]]:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        current = samples(exporter.metrics())
        if predicate(current):
            return current
        if time.monotonic() > deadline:
            raise AssertionError(
                f"condition not met within {timeout}s; probe series: "
                f"{[s for s in current if s[0].startswith('ccl_probe')]}"
            )
        time.sleep(0.5)


def test_scheduled_probe_skips_while_gpus_are_held_then_runs(exporter_process) -> None:  # type: ignore[no-untyped-def]
    exporter = exporter_process(
        "--probe.interval",
        "1",
        "--probe.iters",
        "3",
        "--job-ends-after",
        "4",
        "--collector.disable-defaults",
        "--collector.probe",
        simulated=True,
    )

    def skipped_for_pod(current: list) -> bool:  # type: ignore[type-arg]
        return any(
            n == "ccl_probe_skipped_total" and labels["reason"] == "gpu_held_by_pod" and v >= 1
            for n, labels, v in current
        )

    wait_for(exporter, skipped_for_pod, timeout=20)

    def probed(current: list) -> bool:  # type: ignore[type-arg]
        return any(n == "ccl_probe_success" and labels["source"] == "scheduled" for n, labels, _ in current)

    current = wait_for(exporter, probed, timeout=60)
    scheduled = [(n, labels, v) for n, labels, v in current if labels.get("source") == "scheduled"]
    busbw = [(labels, v) for n, labels, v in scheduled if n == "ccl_probe_bus_bandwidth_bytes_per_second"]
    assert sorted(int(labels["size_bytes"]) for labels, _ in busbw) == [65536, 131072, 262144, 524288, 1048576]
    assert all(
        labels["source"] == "scheduled"
        and labels["collective"] == "all_reduce"
        and labels["scope"] == "intra_node"
        and v > 0
        for labels, v in busbw
    )
    assert [v for n, labels, v in scheduled if n == "ccl_probe_success"] == [1.0]
    assert [labels["transport"] for n, labels, _ in scheduled if n == "ccl_probe_transport_info"] == ["gloo/tcp"]
    assert any(n == "ccl_probe_last_run_timestamp_seconds" and v > time.time() - 120 for n, _, v in scheduled)

    maps = Path(f"/proc/{exporter.proc.pid}/maps").read_text()
    assert "libtorch" not in maps, "the serving process loaded torch"
    log = exporter.stop()
    assert (
        "scheduled probe skipped (gpu_held_by_pod): 8 GPU(s) assigned to pod(s) ml-training/llama-70b-worker-0" in log
    )

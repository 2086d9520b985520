"""The NVML source and collector against the real pynvml binding and a fake libnvidia-ml.

No GPU exists here, so the C library under tests/fakenvml stands in for the driver: the
real nvidia-ml-py loads it by SONAME in a subprocess started with LD_LIBRARY_PATH, and every
struct (nvmlFieldValue_t, nvmlPciInfo_t, nvmlProcessInfo_t) crosses the real ctypes
boundary. What only a real driver can tell (its answers for inactive links, which fields a
given GPU generation supports) is checked by scripts/gpu-check on a GPU machine.
"""

from __future__ import annotations

import ctypes.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REPO, ExporterProcess, http_get, require_tool
from tests.fakenvml import build_fake_nvml, fake_nvml_env, read_call_log

GPUS, LINKS = 8, 18
SPEED = 26562 * 1_000_000


@pytest.fixture(scope="module")
def fake_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fake_nvml(require_tool("gcc"), tmp_path_factory.mktemp("fakenvml"))


@pytest.fixture(scope="module")
def fake_lib_without_v3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fake_nvml(require_tool("gcc"), tmp_path_factory.mktemp("fakenvml-v2"), ["FAKE_NVML_NO_PROCESSES_V3"])


def uuid(gpu: int) -> str:
    return f"GPU-fa4e0000-0000-4000-8000-{gpu:012d}"


def tx_bytes(gpu: int, link: int, call: int) -> int:
    """The fake's TX counter on the call-th field-values call of a GPU, in bytes."""
    return (100 * gpu + link + 1) * 1024 * call * 1024


READ_SCRIPT = """
import dataclasses, json, sys
from exporter.sources.nvml import PynvmlBackend, busy_gpus
backend = PynvmlBackend()
reads = [dataclasses.asdict(backend.read()) for _ in range(int(sys.argv[1]))]
print(json.dumps({"reads": reads, "busy": {k: [dataclasses.asdict(p) for p in v]
                  for k, v in (busy_gpus(backend) or {}).items()}}))
backend.close()
"""


def run_source(lib: Path, reads: int = 1, **settings: object) -> dict:  # type: ignore[type-arg]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), **fake_nvml_env(lib, **settings)}
    done = subprocess.run(
        [sys.executable, "-c", READ_SCRIPT, str(reads)], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def link_of(reading: dict, gpu: int, link: int) -> dict:  # type: ignore[type-arg]
    (found,) = [g for g in reading["gpus"] if g["gpu"]["index"] == gpu]
    return found["links"][link]  # type: ignore[no-any-return]


def test_source_reads_every_gpu_and_link_with_exact_values(fake_lib: Path) -> None:
    result = run_source(fake_lib, reads=2, down_links="1:3", busy_gpus="2,5")
    first, second = result["reads"]
    assert first["problems"] == [] and second["problems"] == []
    assert [g["gpu"] for g in first["gpus"]][:2] == [
        {"index": 0, "uuid": uuid(0), "name": "NVIDIA H200", "pci_bus_id": "00000000:18:00.0", "minor": GPUS - 1},
        {"index": 1, "uuid": uuid(1), "name": "NVIDIA H200", "pci_bus_id": "00000000:2A:00.0", "minor": GPUS - 2},
    ]
    assert all(len(g["links"]) == LINKS for g in second["gpus"]) and len(second["gpus"]) == GPUS
    # Field-values call 1 was discovery (link count), so the reads are calls 2 and 3.
    assert link_of(second, 6, 17) == {
        "link": 17,
        "active": True,
        "speed_bytes_per_second": SPEED,
        "transmit_bytes": tx_bytes(6, 17, 3),
        "receive_bytes": 2 * tx_bytes(6, 17, 3),
        # links 12-17 have no CRC data field id in NVML: that error kind is absent, not 0
        "errors": {"crc_flit": 77, "replay": 17, "recovery": 6},
        "remote": {"kind": "nvswitch", "pci_bus_id": "00000000:06:00.0"},
    }
    assert link_of(first, 2, 4)["errors"] == {"crc_flit": 24, "crc_data": 25, "replay": 4, "recovery": 2}
    down = link_of(second, 1, 3)
    assert (down["active"], down["speed_bytes_per_second"], down["remote"]) == (False, 0, None)
    assert result["busy"] == {
        uuid(2): [{"pid": 4202, "used_memory_bytes": 1 << 30}],
        uuid(5): [{"pid": 4205, "used_memory_bytes": 1 << 30}],
    }


def test_not_supported_values_are_none_never_zero(fake_lib: Path) -> None:
    # crc flit unsupported everywhere, TX on GPU 4 only, speed on GPU 0 link 2 only
    (reading,) = run_source(fake_lib, unsupported="163,138:4,164:0:2")["reads"]
    assert reading["problems"] == []
    assert "crc_flit" not in link_of(reading, 0, 0)["errors"]
    assert link_of(reading, 4, 9)["transmit_bytes"] is None
    assert link_of(reading, 4, 9)["receive_bytes"] == 2 * tx_bytes(4, 9, 2)
    assert link_of(reading, 3, 9)["transmit_bytes"] == tx_bytes(3, 9, 2)
    assert link_of(reading, 0, 2)["speed_bytes_per_second"] is None
    assert link_of(reading, 0, 3)["speed_bytes_per_second"] == SPEED


def test_lost_gpu_drops_only_itself_and_is_retried(fake_lib: Path) -> None:
    first, second, third = run_source(fake_lib, reads=3, lost_gpu="3:2")["reads"]
    assert [g["gpu"]["index"] for g in first["gpus"]] == list(range(8))
    for later in (second, third):
        assert [g["gpu"]["index"] for g in later["gpus"]] == [0, 1, 2, 4, 5, 6, 7]
        assert len(later["problems"]) == 1 and "GPU 3" in later["problems"][0] and "lost" in later["problems"][0]


def test_state_falls_back_to_nvlink_state_call_when_the_field_is_unsupported(fake_lib: Path) -> None:
    (reading,) = run_source(fake_lib, unsupported="165", down_links="0:1")["reads"]
    assert link_of(reading, 0, 0)["active"] is True
    assert link_of(reading, 0, 1)["active"] is False


def test_processes_fall_back_to_v2_on_older_drivers(fake_lib_without_v3: Path) -> None:
    result = run_source(fake_lib_without_v3, busy_gpus="7")
    assert result["busy"] == {uuid(7): [{"pid": 4207, "used_memory_bytes": 1 << 30}]}


def test_gpu_without_nvlink(fake_lib: Path) -> None:
    (reading,) = run_source(fake_lib, gpu_count=2, link_count=0)["reads"]
    assert [(g["gpu"]["index"], g["links"]) for g in reading["gpus"]] == [(0, []), (1, [])]


# --- the exporter process -------------------------------------------------------------


def samples(body: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def value(metrics: dict, metric: str, /, **labels: str) -> float | None:  # type: ignore[type-arg]
    return metrics.get((metric, frozenset(labels.items())))  # type: ignore[no-any-return]


def series(metrics: dict, metric: str, /, **labels: str) -> list[dict[str, str]]:  # type: ignore[type-arg]
    return [dict(ls) for (n, ls) in metrics if n == metric and set(labels.items()) <= set(ls)]


def promtool_check(body: str) -> None:
    promtool = require_tool("promtool")
    done = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr


# Per link as well (the default is per GPU only): these tests read each link's series.
NVML_ONLY = ("--collector.disable-defaults", "--collector.nvml", "--collector.nvml.nvlink-granularity=link")


def test_metrics_exact_values_one_batched_call_per_gpu_per_scrape(
    fake_lib: Path, tmp_path: Path, exporter_process: type[ExporterProcess]
) -> None:
    log = tmp_path / "calls"
    proc = exporter_process(*NVML_ONLY, env=fake_nvml_env(fake_lib, down_links="1:3", call_log=log))
    first = samples(proc.metrics())
    before = read_call_log(log)
    body = proc.metrics()
    after = read_call_log(log)
    promtool_check(body)
    m = samples(body)

    # One nvmlDeviceGetFieldValues per GPU per scrape, and no other NVML call at all.
    assert after["nvmlDeviceGetFieldValues"] - before["nvmlDeviceGetFieldValues"] == GPUS
    assert sum(after.values()) - sum(before.values()) == GPUS

    assert value(m, "ccl_exporter_collector_success", collector="nvml") == 1.0
    assert value(m, "ccl_gpu_info", gpu="7", uuid=uuid(7), name="NVIDIA H200", pci_bus_id="00000000:DB:00.0") == 1.0
    assert len(series(m, "ccl_gpu_info")) == GPUS
    assert len(series(m, "ccl_nvlink_state")) == GPUS * LINKS
    assert value(m, "ccl_nvlink_state", gpu="1", link="3") == 0.0
    assert value(m, "ccl_nvlink_state", gpu="1", link="4") == 1.0
    assert value(m, "ccl_nvlink_speed_bytes_per_second", gpu="5", link="0") == SPEED
    # discovery was call 1, the two scrapes calls 2 and 3
    assert value(first, "ccl_nvlink_transmit_bytes_total", gpu="2", link="7") == tx_bytes(2, 7, 2)
    assert value(m, "ccl_nvlink_transmit_bytes_total", gpu="2", link="7") == tx_bytes(2, 7, 3)
    assert value(m, "ccl_nvlink_receive_bytes_total", gpu="2", link="7") == 2 * tx_bytes(2, 7, 3)
    assert value(m, "ccl_nvlink_errors_total", gpu="3", link="5", error="crc_flit") == 35
    assert value(m, "ccl_nvlink_errors_total", gpu="3", link="5", error="crc_data") == 36
    assert value(m, "ccl_nvlink_errors_total", gpu="3", link="5", error="replay") == 5
    assert value(m, "ccl_nvlink_errors_total", gpu="3", link="5", error="recovery") == 3
    assert value(m, "ccl_nvlink_errors_total", gpu="3", link="12", error="crc_data") is None
    assert len(series(m, "ccl_nvlink_errors_total", error="crc_data")) == GPUS * 12
    assert (
        value(
            m, "ccl_nvlink_remote_info", gpu="0", link="2", remote_type="nvswitch", remote_pci_bus_id="00000000:07:00.0"
        )
        == 1.0
    )
    assert series(m, "ccl_nvlink_remote_info", gpu="1", link="3") == []  # down: no remote end
    assert len(series(m, "ccl_nvlink_remote_info")) == GPUS * LINKS - 1


def test_not_supported_series_are_absent(fake_lib: Path, exporter_process: type[ExporterProcess]) -> None:
    proc = exporter_process(*NVML_ONLY, env=fake_nvml_env(fake_lib, unsupported="163:2,139,164:6:0"))
    m = samples(proc.metrics())
    assert value(m, "ccl_exporter_collector_success", collector="nvml") == 1.0
    assert series(m, "ccl_nvlink_receive_bytes_total") == []
    assert len(series(m, "ccl_nvlink_transmit_bytes_total")) == GPUS * LINKS
    assert series(m, "ccl_nvlink_errors_total", gpu="2", error="crc_flit") == []
    assert len(series(m, "ccl_nvlink_errors_total", gpu="2", error="replay")) == LINKS
    assert value(m, "ccl_nvlink_speed_bytes_per_second", gpu="6", link="0") is None
    assert value(m, "ccl_nvlink_speed_bytes_per_second", gpu="6", link="1") == SPEED


def test_lost_gpu_drops_only_its_series_without_failing_the_scrape(
    fake_lib: Path, exporter_process: type[ExporterProcess]
) -> None:
    proc = exporter_process(*NVML_ONLY, env=fake_nvml_env(fake_lib, lost_gpu="3:2"))
    assert len(series(samples(proc.metrics()), "ccl_gpu_info")) == GPUS
    status, body, _ = http_get(proc.url + "/metrics")
    assert status == 200
    promtool_check(body)
    m = samples(body)
    assert sorted(s["gpu"] for s in series(m, "ccl_gpu_info")) == ["0", "1", "2", "4", "5", "6", "7"]
    assert series(m, "ccl_nvlink_transmit_bytes_total", gpu="3") == []
    assert len(series(m, "ccl_nvlink_transmit_bytes_total")) == (GPUS - 1) * LINKS
    assert value(m, "ccl_exporter_collector_success", collector="nvml") == 0.0
    landing = http_get(proc.url + "/")[1]
    assert "GPU 3" in landing and "GPU is lost" in landing


def test_no_nvml_library_reports_unavailable_once_and_serves_on(
    tmp_path: Path, exporter_process: type[ExporterProcess]
) -> None:
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("a real libnvidia-ml is installed on this machine")
    proc = exporter_process(
        *NVML_ONLY, "--collector.rdma", "--path.sysfs", str(tmp_path), env={"LD_LIBRARY_PATH": str(tmp_path)}
    )
    for _ in range(3):
        status, body, _ = http_get(proc.url + "/metrics")
        assert status == 200
    m = samples(body)
    assert value(m, "ccl_exporter_collector_success", collector="nvml") == 0.0
    assert series(m, "ccl_gpu_info") == []
    output = proc.stop()
    assert output.count("collector nvml unavailable") == 1, output
    assert "libnvidia-ml.so.1 not found" in output


def test_field_value_decoding_from_raw_bytes_matches_the_struct_members() -> None:
    """The fast decoder reads nvmlFieldValue_t's bytes; it must agree with pynvml's members."""
    import pynvml

    from exporter.sources.nvml import _decode_slow, decode_field_values

    array = (pynvml.c_nvmlFieldValue_t * 6)()
    cases = [
        (0, "dVal", 2.5),
        (1, "uiVal", 4_000_000_000),
        (3, "ullVal", 2**63 + 5),
        (4, "sllVal", -7),
        (6, "usVal", 65535),
        (5, "siVal", -3),
    ]
    for entry, (value_type, member, number) in zip(array, cases, strict=True):
        entry.fieldId, entry.scopeId, entry.valueType = 138, 17, value_type
        setattr(entry.value, member, number)
    array[5].nvmlReturn = 3  # NOT_SUPPORTED: no value whatever the union holds
    fast = decode_field_values(array)
    assert fast == [_decode_slow(entry) for entry in array]
    assert fast == [(0, 2.5), (0, 4_000_000_000), (0, 2**63 + 5), (0, -7), (0, 65535), (3, None)]

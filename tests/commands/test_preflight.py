"""``ccl-exporter preflight`` on fixture node trees and fake environments.

No RDMA NIC exists here: the host side is a fixture sysfs/dev/proc tree (the real RDMA
source reads it), the environment is a dict. The optional gang-wide probe is the real gloo
probe (2 ranks on this machine).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from exporter.commands import build_parser
from exporter.commands.preflight import PortSpec, parse_rate_gbps, probe_checks, run_preflight
from exporter.results.preflight_message import parse_report
from exporter.results.probe_file import ProbeResult, Transport, parse_result
from exporter.sources.probe_results import read_probe_results

POD_UID = "3f1e0c9a-7b2d-4e5f-8a6b-1c2d3e4f5a6b"
HEALTHY_ENV = {"POD_NAMESPACE": "team-a", "POD_NAME": "llama-worker-0", "POD_UID": POD_UID, "JOB_NAME": "llama"}


def preflight(root: Path, *flags: str, env: dict[str, str] | None = None) -> tuple[int, list[str], Path]:
    results = root / "results"
    termination_log = root / "termination-log"  # the kubelet makes it, empty, in every container
    if not termination_log.exists():
        termination_log.touch(mode=0o666)
    argv = [
        "preflight",
        "--path.sysfs",
        str(root / "sys"),
        "--path.dev",
        str(root / "dev"),
        "--path.procfs",
        str(root / "proc"),
        "--path.probe-results",
        str(results),
        "--path.termination-message",
        str(termination_log),
        *flags,
    ]
    args = build_parser({}).parse_args(argv)
    out = io.StringIO()
    code = run_preflight(args, environ={**HEALTHY_ENV, **(env or {})}, out=out)
    return code, out.getvalue().splitlines(), results


def failures(lines: list[str]) -> dict[str, str]:
    return {line.split(":", 1)[0][5:]: line.split(": ", 1)[1] for line in lines if line.startswith("FAIL ")}


@pytest.fixture
def node(fixture_tree) -> Path:  # type: ignore[no-untyped-def]
    return fixture_tree("preflight_node")


STRICT = ("--expect-ports", "mlx5_0:1,mlx5_1", "--expect-rate", "400", "--expect-link-layer", "InfiniBand")


def test_healthy_node_passes_and_writes_a_result(node: Path) -> None:
    code, lines, results = preflight(node, *STRICT)
    assert code == 0, lines
    assert failures(lines) == {}
    assert lines[-1] == "preflight: passed (0 of 7 checks failed)"
    files = list(results.iterdir())
    assert [f.name for f in files] == [f"preflight-team-a-llama-worker-0-{POD_UID}.json"]
    result = parse_result(files[0].read_text())
    assert (result.source, result.namespace, result.pod, result.pod_uid, result.job_name) == (
        "preflight",
        "team-a",
        "llama-worker-0",
        POD_UID,
        "llama",
    )
    assert {c.check for c in result.checks} == {
        "rdma_devices",
        "uverbs_devices",
        "port_state",
        "port_rate",
        "port_link_layer",
        "gpudirect_rdma",
        "nccl_env",
    }
    assert result.success


def test_the_webhooks_identity_variables_win_and_name_the_result_file(node: Path) -> None:
    """``CCL_POD_*`` come from the downward API whatever the pod spec says (the webhook sets
    them); a ``POD_NAME`` the user wrote by hand does not name another pod's result."""
    env = {
        "POD_NAME": "someone-else-0",
        "POD_UID": "forged",
        "CCL_POD_NAMESPACE": "team-a",
        "CCL_POD_NAME": "llama-worker-0",
        "CCL_POD_UID": "9e8d7c6b-0000-4000-8000-000000000001",
    }
    code, _, results = preflight(node, env=env)
    assert code == 0
    (written,) = results.iterdir()
    assert written.name == "preflight-team-a-llama-worker-0-9e8d7c6b-0000-4000-8000-000000000001.json"
    assert parse_result(written.read_text()).pod_uid == "9e8d7c6b-0000-4000-8000-000000000001"


def test_without_a_pod_uid_the_result_is_written_and_says_it_will_not_be_used(
    node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, results = preflight(node, env={"POD_UID": ""})
    assert code == 0 and [f.name for f in results.iterdir()] == ["preflight-team-a-llama-worker-0.json"]
    assert capsys.readouterr().err == (
        "ccl-exporter preflight: result written with no pod UID (set CCL_POD_UID from the downward API, fieldPath "
        "metadata.uid): the exporter uses a result for team-a/llama-worker-0 only with that pod's UID\n"
    )
    assert read_probe_results(results, 2e9, 1e10).unattributed == [
        ("preflight-team-a-llama-worker-0.json", "pod_uid_missing")
    ]


def test_port_down_fails_with_the_port_named(node: Path) -> None:
    port = node / "sys/class/infiniband/mlx5_1/ports/1"
    (port / "state").write_text("1: DOWN\n")
    (port / "phys_state").write_text("3: Disabled\n")
    code, lines, results = preflight(node, *STRICT)
    assert code == 1
    assert failures(lines) == {"port_state": "mlx5_1 port 1 is DOWN/Disabled (expected ACTIVE/LinkUp)"}
    result = parse_result(next(results.iterdir()).read_text())
    assert {c.check: c.ok for c in result.checks}["port_state"] is False
    assert not result.success


def test_rate_below_expectation_fails(node: Path) -> None:
    (node / "sys/class/infiniband/mlx5_0/ports/1/rate").write_text("200 Gb/sec (4X HDR)\n")
    code, lines, _ = preflight(node, *STRICT)
    assert code == 1
    assert failures(lines) == {"port_rate": "mlx5_0 port 1 runs at 200 Gb/sec (4X HDR) (expected at least 400 Gb/s)"}


def test_nccl_ib_disable_fails(node: Path) -> None:
    code, lines, _ = preflight(node, *STRICT, env={"NCCL_IB_DISABLE": "1"})
    assert code == 1
    assert failures(lines) == {"nccl_env": "NCCL_IB_DISABLE=1 turns InfiniBand/RoCE off: NCCL will use TCP sockets"}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"NCCL_NET": "Socket"}, "NCCL_NET=Socket forces the TCP socket transport"),
        ({"NCCL_IB_HCA": "=mlx5_7:1"}, "NCCL_IB_HCA==mlx5_7:1 matches no RDMA device here (mlx5_0, mlx5_1)"),
        ({"NCCL_SOCKET_IFNAME": "lo"}, "NCCL_SOCKET_IFNAME=lo selects lo, which other nodes cannot reach"),
        ({"NCCL_SOCKET_IFNAME": "docker0,eth0"}, "selects docker0"),
        ({"NCCL_NET_GDR_LEVEL": "LOC"}, "NCCL_NET_GDR_LEVEL=LOC disables GPUDirect RDMA"),
    ],
)
def test_nccl_env_that_forces_sockets_fails(node: Path, env: dict[str, str], expected: str) -> None:
    code, lines, _ = preflight(node, env=env)
    assert code == 1
    assert expected in failures(lines)["nccl_env"]


@pytest.mark.parametrize(
    "env",
    [
        {"NCCL_IB_DISABLE": "0"},
        {"NCCL_NET": "IB"},
        {"NCCL_IB_HCA": "mlx5"},
        {"NCCL_IB_HCA": "^mlx5_7"},
        {"NCCL_SOCKET_IFNAME": "^lo,docker"},
        {"NCCL_SOCKET_IFNAME": "eth0"},
    ],
)
def test_harmless_nccl_env_passes(node: Path, env: dict[str, str]) -> None:
    code, lines, _ = preflight(node, env=env)
    assert code == 0, lines


def test_link_layer_and_missing_port(node: Path) -> None:
    code, lines, _ = preflight(node, "--expect-ports", "mlx5_0:1,mlx5_2:1", "--expect-link-layer", "Ethernet")
    assert code == 1
    found = failures(lines)
    assert found["rdma_devices"] == "expected device(s) mlx5_2 not present; have mlx5_0, mlx5_1"
    assert found["port_state"] == "port mlx5_2:1 not found (expected ACTIVE/LinkUp)"
    assert found["port_link_layer"] == "mlx5_0 port 1 is InfiniBand (expected Ethernet)"


def test_no_uverbs_and_no_peermem(node: Path) -> None:
    for name in ("uverbs0", "uverbs1"):
        (node / "dev/infiniband" / name).unlink()
    (node / "sys/module/nvidia_peermem/refcnt").unlink()
    (node / "sys/module/nvidia_peermem").rmdir()
    (node / "proc/modules").write_text("nvidia_uvm 1794048 0 - Live 0x0\n")
    code, lines, _ = preflight(node)
    found = failures(lines)
    assert code == 1
    assert set(found) == {"uverbs_devices", "gpudirect_rdma"}
    assert found["uverbs_devices"].startswith(f"no {node}/dev/infiniband/uverbs* in the container")
    assert found["gpudirect_rdma"].startswith("nvidia_peermem is not loaded")
    code, lines, _ = preflight(node, "--skip", "uverbs_devices", "--no-require-gdr")
    assert code == 0, lines


def test_peermem_found_in_proc_modules_only(node: Path) -> None:
    (node / "sys/module/nvidia_peermem/refcnt").unlink()
    (node / "sys/module/nvidia_peermem").rmdir()
    code, lines, _ = preflight(node)
    assert code == 0, lines
    assert any(
        line.startswith("ok   gpudirect_rdma: nvidia_peermem loaded") and "proc/modules" in line for line in lines
    )


@pytest.mark.parametrize("port_down", [False, True], ids=["checks-pass", "a-check-fails"])
def test_an_unwritten_result_is_one_line_and_the_exit_code_stays_that_of_the_checks(
    node: Path, capsys: pytest.CaptureFixture[str], port_down: bool
) -> None:
    """A result that cannot be written (here: a file where the folder should be) is one line on
    stderr naming what the exporter will not show; the exit code is the checks' (0 or 1)."""
    (node / "results").write_text("not a folder")
    if port_down:
        (node / "sys/class/infiniband/mlx5_1/ports/1/state").write_text("1: DOWN\n")
    code, lines, results = preflight(node)
    assert code == (1 if port_down else 0), lines
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(
        "ccl-exporter preflight: result not written, so the exporter shows no "
        "ccl_preflight_result and no PreflightPassed/PreflightFailed for this pod: "
    )
    assert line.endswith(f"for this pod: {results} is not a folder")
    assert results.read_text() == "not a folder"


def test_bad_flags_exit_2(node: Path) -> None:
    assert preflight(node, "--expect-rate", "fast")[0] == 2
    assert preflight(node, "--expect-ports", "mlx5_0:x")[0] == 2
    assert preflight(node, "--skip", "nonsense")[0] == 2


def test_parsers() -> None:
    assert parse_rate_gbps("400") == parse_rate_gbps("400G") == parse_rate_gbps("400Gb/s") == 400.0
    assert PortSpec.parse("mlx5_0:1") == PortSpec("mlx5_0", 1)
    assert PortSpec.parse("mlx5_0") == PortSpec("mlx5_0", None)


def test_gang_probe_requires_rdma_and_a_floor(node: Path) -> None:
    """The real gloo probe runs over TCP: --require-transport rdma must fail, and say why."""
    code, lines, results = preflight(
        node,
        "--probe",
        "--backend",
        "gloo",
        "--nprocs",
        "2",
        "-b",
        "64K",
        "-e",
        "64K",
        "-n",
        "2",
        "-w",
        "1",
        "--require-transport",
        "rdma",
        "--min-busbw",
        "1000",
    )
    found = failures(lines)
    assert code == 1
    assert set(found) == {"probe_transport", "probe_bandwidth"}, lines
    assert found["probe_transport"].startswith("traffic ran on gloo/tcp (tcp), expected rdma")
    assert "(expected at least 1000 GB/s)" in found["probe_bandwidth"]
    assert any(line.startswith("ok   probe: 1 collective(s) correct on 2 ranks") for line in lines)
    document = json.loads(next(results.iterdir()).read_text())
    assert document["transport"]["name"] == "gloo/tcp"
    assert document["collectives"][0]["rows"][0]["size_bytes"] == 65536


@pytest.mark.parametrize(("allow", "ok"), [(False, False), (True, True)])
def test_a_transport_nccl_cannot_tell_fails_closed_unless_allowed(allow: bool, ok: bool) -> None:
    """NCCL's log of the probe did not show the transport: "cannot tell" is not a pass."""
    unknown = ProbeResult(
        source="preflight",
        started_at=0.0,
        finished_at=1.0,
        world_size=16,
        nnodes=2,
        transport=Transport("unknown", "unknown", reasons=("the log shows no NCCL network selection",)),
    )
    (check,) = [
        c for c in probe_checks(unknown, "rdma", None, allow_unknown_transport=allow) if c.check == "probe_transport"
    ]
    assert check.ok is ok
    assert "cannot tell" in check.message and "the log shows no NCCL network selection" in check.message
    if not ok:
        assert "--allow-unknown-transport" in check.message


def test_the_allow_flag_is_parsed_and_read_from_the_environment() -> None:
    assert build_parser({}).parse_args(["preflight"]).allow_unknown_transport is False
    assert build_parser({}).parse_args(["preflight", "--allow-unknown-transport"]).allow_unknown_transport is True
    env = {"CCL_EXPORTER_ALLOW_UNKNOWN_TRANSPORT": "true"}
    assert build_parser(env).parse_args(["preflight"]).allow_unknown_transport is True


def test_the_result_is_also_the_containers_termination_message(node: Path) -> None:
    """What the exporter reads from the pod's status: the same verdict and checks as the file,
    failed checks with their messages first."""
    (node / "sys/class/infiniband/mlx5_1/ports/1/state").write_text("1: DOWN\n")
    code, _, results = preflight(node, *STRICT)
    assert code == 1
    message = (node / "termination-log").read_text()
    assert message.splitlines()[1].startswith("FAIL port_state: mlx5_1 port 1 is DOWN/")
    report = parse_report(message)
    from_file = parse_result(next(results.iterdir()).read_text())
    assert not report.passed and not report.cut
    assert {c.check: c.ok for c in report.checks} == {c.check: c.ok for c in from_file.checks}
    assert [c.message for c in report.checks if not c.ok] == [c.message for c in from_file.checks if not c.ok]
    assert from_file.finished_at - 0.001 <= report.finished_at <= from_file.finished_at


def test_no_write_leaves_the_termination_message_alone_to_carry_the_result(node: Path) -> None:
    code, _, results = preflight(node, "--no-write")
    assert code == 0 and not results.exists()
    report = parse_report((node / "termination-log").read_text())
    assert report.passed and len(report.checks) == 5 and report.error is None


def test_outside_a_pod_no_termination_message_file_is_made(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = preflight(node, "--path.termination-message", str(node / "absent" / "termination-log"))
    assert code == 0 and not (node / "absent").exists()
    assert capsys.readouterr().err == ""
    code, _, _ = preflight(node, "--path.termination-message", "")
    assert code == 0 and capsys.readouterr().err == ""


@pytest.mark.parametrize("port_down", [False, True], ids=["checks-pass", "a-check-fails"])
def test_an_unwritable_termination_message_is_one_line_and_the_exit_code_stays(
    node: Path, capsys: pytest.CaptureFixture[str], port_down: bool
) -> None:
    if port_down:
        (node / "sys/class/infiniband/mlx5_1/ports/1/state").write_text("1: DOWN\n")
    (node / "a-folder").mkdir()
    code, _, _ = preflight(node, "--path.termination-message", str(node / "a-folder"))
    assert code == (1 if port_down else 0)
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(
        "ccl-exporter preflight: termination message not written, so the exporter shows no "
        "ccl_preflight_result and no PreflightPassed/PreflightFailed from it: "
        f"{node / 'a-folder'}: "
    )

"""``ccl-exporter analyze``: paths, folders, .gz, CRI pod logs, exit codes and output shapes.

The command runs in-process through ``exporter.commands.main`` and once as the installed console
script (a real subprocess) to prove the registration.
"""

from __future__ import annotations

import gzip
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.commands import main
from tests.nccl.conftest import FIXTURES

FALLBACK = FIXTURES / "v2_19_pod_log_socket_fallback_nnodes.log"
HEALTHY = FIXTURES / "v2_18_ib_gdr_commid.log"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["analyze", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_is_exactly_one_object_and_exit_3_on_fallback(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--json", str(FALLBACK))
    assert code == 3
    assert out.count("\n") == 1
    obj = json.loads(out)
    assert obj["verdict"] == "tcp_fallback" and obj["inter_node_tcp"] is True
    assert obj["communicators"][0]["transports"]["net_socket/inter_node/no_gdr"] == 18


def test_healthy_exits_0_with_a_table_and_a_one_line_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, str(HEALTHY))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["COMMUNICATOR", "RANKS", "NODES", "NETWORK"]
    assert lines[1].startswith("0x9f3c1d2e4b5a6978")
    verdict_line = next(line for line in lines if line.startswith("NCCL verdict:"))
    assert "RDMA" in verdict_line and "network IB" in verdict_line and "nodes 2" in verdict_line


def test_cannot_tell_exits_4_and_says_what_the_job_needs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--json", str(FIXTURES / "truncated_before_network.log"))
    assert code == 4 and json.loads(out)["inter_node_tcp"] is None and json.loads(out)["verdict"] == "unknown"
    code, out, _ = run(capsys, str(FIXTURES / "truncated_before_network.log"))
    assert code == 4
    assert "cannot tell (exit 4)" in out and "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET" in out


def test_an_empty_log_cannot_tell(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty.log").write_text("")
    code, out, _ = run(capsys, "--json", str(tmp_path / "empty.log"))
    assert code == 4 and json.loads(out)["verdict"] == "unknown"


def test_single_node_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--json", str(FIXTURES / "v2_19_single_node_socket.log"))
    assert code == 0 and json.loads(out)["verdict"] == "single_node"


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["analyze"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        main(["analyze", "--no-such-flag", str(HEALTHY)])
    assert exc.value.code == 2


def test_warning_counts_are_counts_not_the_sample(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The JSON keeps a sample of warning lines; the text output counts every one of them."""
    log = tmp_path / "warnings.log"
    log.write_text(
        HEALTHY.read_text()
        + "".join(
            f"h:7:7 [0] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 10.0.0.{i % 250} "
            f"with error 12, opcode 0, len 0, vendor err 129\n"
            for i in range(100)
        )
    )
    code, out, _ = run(capsys, str(log))
    assert code == 0
    assert "ib_completion_error x100" in out


def test_folder_is_walked_and_gz_rotated_logs_are_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One job's per-process debug files, the older ones rotated and compressed."""
    lines = FALLBACK.read_text().splitlines(keepends=True)
    half = len(lines) // 2
    nested = tmp_path / "job" / "rank-files"
    nested.mkdir(parents=True)
    with gzip.open(nested / "0.log.20260101-000000.gz", "wt") as f:
        f.writelines(lines[:half])
    (nested / "0.log").write_text("".join(lines[half:]))
    code, out, _ = run(capsys, "--json", str(tmp_path))
    assert code == 3
    assert json.loads(out)["nranks"] == 16


def test_cri_pod_log_with_partial_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cri = []
    for i, line in enumerate(FALLBACK.read_text().splitlines()):
        stamp = f"2026-01-01T00:00:{i % 60:02d}.123456789Z"
        if i % 3 == 0 and len(line) > 20:  # split some lines into P + F records
            cri.append(f"{stamp} stdout P {line[:17]}")
            cri.append(f"{stamp} stdout F {line[17:]}")
        else:
            cri.append(f"{stamp} {'stderr' if i % 2 else 'stdout'} F {line}")
    log = tmp_path / "0.log"
    log.write_text("\n".join(cri) + "\n")
    code, out, _ = run(capsys, "--json", str(log))
    plain = main(["analyze", "--json", str(FALLBACK)])
    plain_out, _ = capsys.readouterr()
    assert code == plain == 3
    assert json.loads(out)["communicators"] == json.loads(plain_out)["communicators"]


def test_unreadable_input_exits_1_and_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad_gz = tmp_path / "broken.log.gz"
    bad_gz.write_bytes(b"\x1f\x8b\x08\x00garbage")
    code, out, err = run(capsys, "--json", str(HEALTHY), str(tmp_path / "missing.log"), str(bad_gz))
    assert code == 1
    assert out == ""  # a verdict on part of a job's logs would be a guess
    assert err.count("\n") == 1 and "missing.log" in err and "1 more unreadable" in err
    code, out, err = run(capsys, str(bad_gz))
    assert (code, out) == (1, "") and "broken.log.gz" in err and err.count("\n") == 1


def test_a_line_longer_than_memory_should_hold_is_skipped_not_loaded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "huge.log"
    with log.open("w") as f:
        f.write("x" * (20 * 1024 * 1024) + "\n")
        f.write(FALLBACK.read_text())
    code, _, _ = run(capsys, "--json", str(log))
    assert code == 3


def test_console_script_is_registered() -> None:
    exe = shutil.which("ccl-exporter", path=str(Path(sys.executable).parent))
    assert exe is not None
    proc = subprocess.run([exe, "analyze", "--json", str(FALLBACK)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    assert json.loads(proc.stdout)["verdict"] == "tcp_fallback"


@pytest.mark.parametrize("compress", [False, True])
def test_standard_input_as_in_kubectl_logs_pipe(compress: bool) -> None:
    """``kubectl logs POD | ccl-exporter analyze -`` (plain or gzip), as the runbooks say."""
    data = FALLBACK.read_bytes()
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "analyze", "--json", "-"],
        input=gzip.compress(data) if compress else data,
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 3, proc.stderr
    assert json.loads(proc.stdout)["verdict"] == "tcp_fallback"


@pytest.mark.parametrize("form", [[], ["--json"]], ids=["table", "json"])
def test_a_reader_that_stops_early_gets_no_traceback_and_the_verdicts_exit_code(
    form: list[str], tmp_path: Path
) -> None:
    """`ccl-exporter analyze LOG | head -1`: the reader may close the pipe before the verdict is
    written; the command says nothing on stderr about it and still exits 3 for the fallback."""
    errors = tmp_path / "stderr"
    command = [sys.executable, "-m", "exporter", "analyze", *form, str(FALLBACK)]
    script = f'{" ".join(map(shlex.quote, command))} 2>{shlex.quote(str(errors))} | true; exit "${{PIPESTATUS[0]}}"'
    result = subprocess.run(["bash", "-c", script], timeout=60)
    assert errors.read_text() == ""
    assert result.returncode == 3

"""``devtools.nccl_log_volume``: the bytes NCCL's INFO lines add per rank and communicator init,
which docs/logs.md's sizing rests on."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from devtools.nccl_log_volume import CRI_BYTES_PER_LINE, by_version, main, measure_files, measure_lines
from tests.conftest import REPO

GPU_CHECK = REPO / "tests" / "fixtures" / "gpu-check"
RANK0 = GPU_CHECK / "nccl-2.28.9" / "two-hosts" / "socket-lo" / "rank0.nccl.log"


def test_a_whole_run_is_counted_as_nccl_wrote_it() -> None:
    """The gpu-check logs are NCCL's own output, one process and one communicator each: the
    bytes of a rank-init are the file's, line for line."""
    text = RANK0.read_text()
    found = measure_lines("rank0", text.splitlines(keepends=True))
    assert found is not None
    assert (found.version, found.rank_inits, found.channels) == ("2.28.9", 1, 2)
    assert found.bytes == len(text.encode()) and found.lines == text.count("\n")
    assert found.connection_lines == text.count(" via ") == 4


def test_the_wrappers_of_a_pod_log_are_not_counted() -> None:
    """The same lines as the kubelet writes them (CRI time, stream, tag) weigh the same: the
    table counts NCCL's bytes, and the pod log's are those plus CRI_BYTES_PER_LINE a line."""
    lines = RANK0.read_text().splitlines(keepends=True)
    cri = [f"2026-01-02T03:04:05.123456789Z stdout F {line}" for line in lines]
    plain, wrapped = measure_lines("plain", lines), measure_lines("cri", cri)
    assert plain is not None and wrapped is not None and plain == dataclasses.replace(wrapped, name="plain")
    assert len(cri[0]) - len(lines[0]) == CRI_BYTES_PER_LINE


def test_two_communicators_divide_the_bytes() -> None:
    lines = RANK0.read_text().splitlines(keepends=True)
    second = [re.sub(r"comm 0x[0-9a-f]+", "comm 0x7f0000001000", line) for line in lines if "comm 0x" in line]
    assert len(second) == 4  # Init START, the nNodes line, Init COMPLETE, Destroy COMPLETE
    one, two = measure_lines("one", lines), measure_lines("two", lines + second)
    assert one is not None and two is not None and two.rank_inits == 2
    assert two.bytes == pytest.approx((one.bytes + sum(len(line.encode()) for line in second)) / 2)


def test_a_log_without_a_whole_init_tells_nothing(tmp_path: Path) -> None:
    no_complete = [line for line in RANK0.read_text().splitlines(keepends=True) if "Init COMPLETE" not in line]
    assert measure_lines("cut", no_complete) is None
    assert measure_lines("empty", []) is None
    (tmp_path / "x.log").write_text("no NCCL here\n")
    assert measure_files([tmp_path]) == []
    assert main([str(tmp_path)]) == 1


def test_the_fixtures_give_the_figures_the_docs_quote(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/logs.md quotes the gpu-check runs: 2,478-2,594 bytes and 28-30 lines per rank-init,
    4 connection lines on 2 channels, about 86-89 bytes a line."""
    measured = measure_files([GPU_CHECK])
    assert len(measured) == 8
    assert min(m.bytes for m in measured) == 2478 and max(m.bytes for m in measured) == 2594
    assert {m.lines for m in measured} == {28, 30} and {m.connection_lines for m in measured} == {4}
    versions = {row.version: row for row in by_version(measured)}
    assert set(versions) == {"2.28.9", "2.29.7"} and versions["2.28.9"].rank_inits == 6
    assert main([str(GPU_CHECK)]) == 0
    out = capsys.readouterr().out
    assert out.count("| tests/fixtures/gpu-check/") == 8 and "| 2 log(s) | 2.29.7 |" in out

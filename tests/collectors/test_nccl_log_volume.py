"""``devtools.nccl_log_volume``: the bytes NCCL's INFO lines add per rank and communicator init,
which docs/logs.md's sizing rests on."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from devtools.nccl_log_volume import CRI_BYTES_PER_LINE, by_version, main, measure_files, measure_lines
from tests.conftest import REPO

# A whole run as scripts/gpu-check records one (written here from NCCL's format strings): input for
# the counting rules only. The figures the docs quote come from real public logs.
RANK0 = REPO / "tests" / "fixtures" / "gpu-check" / "nccl-2.28.9" / "two-hosts" / "socket-lo" / "rank0.nccl.log"
PUBLIC = REPO / "tests" / "fixtures" / "nccl" / "public"


def test_a_whole_run_is_counted_as_nccl_wrote_it() -> None:
    """A gpu-check rank log holds one process and one communicator, without wrappers: the bytes of
    a rank-init are the file's, line for line."""
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


def test_the_public_logs_give_the_figures_the_docs_quote(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/logs.md quotes real runs only: the whole Slurm runs (NCCL 2.20.5, 2,079-2,246 bytes and
    22.5-24.5 lines per rank-init) and the 4-node EKS runs (2.27.3, 4,919-5,753 bytes, 51-60 lines),
    4 connection lines on 2 channels each."""
    measured = measure_files([PUBLIC])
    slurm = [m for m in measured if Path(m.name).name.startswith("hubutui-slurm-")]
    eks = [m for m in measured if "training-on-eks-" in m.name and "nnodes-4" in m.name]
    assert len(slurm) == 7 and len(eks) == 2
    assert (min(m.bytes for m in slurm), max(m.bytes for m in slurm)) == (2079, 2246)
    assert (min(m.lines for m in slurm), max(m.lines for m in slurm)) == (22.5, 24.5)
    assert sorted(m.bytes for m in eks) == [4919, 5753] and sorted(m.lines for m in eks) == [51, 60]
    assert {m.connection_lines for m in slurm + eks} == {4} and {m.channels for m in slurm + eks} == {2}
    versions = {row.version: row for row in by_version(measured)}
    assert versions["2.20.5"].rank_inits == 14 and versions["2.27.3"].rank_inits == 6
    assert main([]) == 0  # the default is the public logs
    out = capsys.readouterr().out
    assert "tests/fixtures/nccl/public/hubutui-slurm-" in out and "gpu-check" not in out and "synthetic" not in out

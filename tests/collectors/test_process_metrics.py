"""The exporter's process_* metrics, held to client_python's ProcessCollector on the same process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from prometheus_client import ProcessCollector

from exporter.collectors.process import ProcessMetrics


def _by_name(families) -> dict[str, object]:  # type: ignore[no-untyped-def]
    return {family.name: family for family in families}


def test_the_same_families_as_client_python() -> None:
    ours = _by_name(ProcessMetrics().collect())
    theirs = _by_name(ProcessCollector(registry=None).collect())
    assert list(ours) == list(theirs)
    for name, family in ours.items():
        peer = theirs[name]
        assert (family.type, family.documentation) == (peer.type, peer.documentation), name  # type: ignore[attr-defined]
        [sample], [peer_sample] = family.samples, peer.samples  # type: ignore[attr-defined]
        assert sample.name == peer_sample.name and sample.labels == peer_sample.labels
        if name in ("process_start_time_seconds", "process_max_fds"):
            assert sample.value == peer_sample.value
        elif name == "process_open_fds":
            assert abs(sample.value - peer_sample.value) <= 1  # one descriptor: the listing's own
        else:
            assert sample.value == pytest.approx(peer_sample.value, rel=0.2, abs=1e6), name


def test_open_descriptors_follow_what_the_process_opens() -> None:
    metrics = ProcessMetrics()
    before = metrics.open_descriptors()
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(50)]
    try:
        assert metrics.open_descriptors() == before + 50
    finally:
        for fd in held:
            os.close(fd)


def _fake_proc(root: Path, fd_count: int, limits: str) -> Path:
    (root / "self" / "fd").mkdir(parents=True)
    for index in range(fd_count):  # a regular folder's size is not a count: the listing is used
        (root / "self" / "fd" / str(index)).write_text("")
    (root / "stat").write_text("cpu 1 2 3\nbtime 1700000000\n")
    (root / "self" / "stat").write_text("1 (a) b) S " + " ".join(str(n) for n in range(4, 60)) + "\n")
    (root / "self" / "limits").write_text(limits)
    return root


def test_older_kernels_and_odd_limits(tmp_path: Path) -> None:
    proc = _fake_proc(
        tmp_path,
        3,
        "Limit Soft Hard Units\nMax open files            unlimited            unlimited            files\n",
    )
    families = _by_name(ProcessMetrics(str(proc)).collect())
    assert families["process_open_fds"].samples[0].value == 3  # type: ignore[attr-defined]
    assert "process_max_fds" not in families  # "unlimited": left out, not a crash
    assert families["process_cpu_seconds"].samples[0].value == pytest.approx((14 + 15) / os.sysconf("SC_CLK_TCK"))  # type: ignore[attr-defined]


def test_no_proc_no_families(tmp_path: Path) -> None:
    assert list(ProcessMetrics(str(tmp_path)).collect()) == []

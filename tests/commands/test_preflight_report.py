"""The pre-flight's termination message (exporter/results/preflight_message.py): what the writer puts in
4096 bytes, what survives the kubelet's cuts, and what the reader makes of anything a pod writes.

The kubelet reads at most the last 4096 bytes of the file, then keeps the first 12 KiB / (the
pod's containers) of each message (pkg/kubelet/status/status_manager.go, ``normalizeStatus``):
both cuts are applied here as the kubelet applies them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.results.preflight_message import (
    CUT,
    MALFORMED,
    MAX_MESSAGE_BYTES,
    VALID,
    MalformedReport,
    newest_preflights,
    parse_report,
    pod_preflight,
    render_report,
)
from exporter.results.probe_file import MAX_CHECKS, Check, ProbeResult

POD_BYTES = 12 * 1024  # the kubelet's MaxPodTerminationMessageLogLength
UID = "3f1e0c9a-7b2d-4e5f-8a6b-1c2d3e4f5a6b"
DOWN = "mlx5_3 port 1 is DOWN/Disabled (expected ACTIVE/LinkUp)"


def result(*checks: Check, error: str | None = None, finished_at: float = 1764457231.7006) -> ProbeResult:
    return ProbeResult(
        source="preflight", started_at=finished_at - 30, finished_at=finished_at, checks=checks, error=error
    )


def kubelet_cut(file_text: str, containers: int) -> str:
    """What the API shows: the last 4096 bytes of the file, then the first 12 KiB / containers."""
    data = file_text.encode()[-MAX_MESSAGE_BYTES:]
    return data[: POD_BYTES // containers].decode("utf-8", errors="replace")


FAILED = result(
    Check("rdma_devices", True, "8 RDMA device(s)"),
    Check("port_state", False, DOWN),
    Check("nccl_env", True, "NCCL environment does not force sockets"),
)


def test_a_failed_pre_flight_reads_back_as_it_was_written() -> None:
    text = render_report(FAILED)
    assert text == (
        "ccl-preflight/v1 failed finished_at=1764457231.700 checks=3 failed=1\n"
        f"FAIL port_state: {DOWN}\nok rdma_devices\nok nccl_env\n"
    )
    report = parse_report(text)
    assert (report.passed, report.cut, report.error) == (False, False, None)
    assert report.finished_at == 1764457231.7
    assert [(c.check, c.ok, c.message) for c in report.checks] == [
        ("port_state", False, DOWN),
        ("rdma_devices", True, ""),
        ("nccl_env", True, ""),
    ]


def test_passed_and_the_probes_error() -> None:
    passed = parse_report(render_report(result(Check("rdma_devices", True, "ok"))))
    assert passed.passed and passed.error is None and not passed.cut
    broken = parse_report(render_report(result(Check("probe", False, "rank 1 timed out"), error="rank 1 timed out")))
    assert not broken.passed and broken.error == "rank 1 timed out"


def test_line_breaks_and_non_ascii_in_a_message_stay_on_one_ascii_line() -> None:
    text = render_report(result(Check("nccl_env", False, "NCCL_SOCKET_IFNAME=ümlaut\nFAIL forged: x\r\n")))
    assert text.isascii() and text.count("\n") == 2
    (check,) = parse_report(text).checks
    assert check.message == "NCCL_SOCKET_IFNAME=\\xfcmlaut FAIL forged: x"


def test_long_messages_are_shortened_until_the_report_fits_and_it_says_so() -> None:
    many = result(*(Check(f"check_{i}", False, "x" * 3000) for i in range(MAX_CHECKS)), error="e" * 5000)
    text = render_report(many)
    assert len(text.encode()) <= MAX_MESSAGE_BYTES
    assert text.splitlines()[0].endswith(" cut")
    report = parse_report(text)
    assert report.cut and len(report.checks) == MAX_CHECKS and not report.passed
    assert all(c.message.endswith("...") for c in report.checks)


def test_more_checks_than_a_result_holds_are_counted_not_listed() -> None:
    text = render_report(result(*(Check(f"c{i}", True, "") for i in range(MAX_CHECKS + 5))))
    report = parse_report(text)
    assert report.cut and len(report.checks) == MAX_CHECKS
    assert text.startswith(f"ccl-preflight/v1 passed finished_at=1764457231.700 checks={MAX_CHECKS + 5} failed=0 cut")


@pytest.mark.parametrize("containers", [1, 3, 8, 40, 128])
def test_the_verdict_survives_the_kubelets_share_per_container(containers: int) -> None:
    """A pod with many containers gets less of each message; whole lines that reach the API count,
    the cut one does not, and a failure whose line was lost is still a failure."""
    failing = result(*(Check(f"check_{i}", i % 3 != 0, f"message {i} " * 20) for i in range(10)))
    shown = kubelet_cut(render_report(failing), containers)
    report = parse_report(shown)
    assert not report.passed
    failed_shown = sum(not c.ok for c in report.checks)
    if failed_shown < 4:
        assert report.error == f"{4 - failed_shown} failed check(s) not in the termination message"
    if len(shown) < len(render_report(failing)):
        assert report.cut
    assert all(c.check.startswith("check_") for c in report.checks)


def test_a_message_cut_inside_the_header_is_malformed_not_a_verdict() -> None:
    with pytest.raises(MalformedReport, match="no complete first line"):
        parse_report(render_report(FAILED)[:40])


@pytest.mark.parametrize(
    "message",
    [
        "",
        "Sleep expired\n",  # another program's termination message
        "ccl-preflight/v2 passed finished_at=1 checks=0 failed=0\n",
        # says passed, lists a failure
        "ccl-preflight/v1 passed finished_at=1 checks=1 failed=0\nFAIL port_state: down\n",
        "ccl-preflight/v1 failed finished_at=1 checks=1 failed=1\nFAIL port_state: a\nFAIL port_rate: b\n",
        "ccl-preflight/v1 passed finished_at=1 checks=1 failed=0\nok bad name\n",
        "ccl-preflight/v1 passed finished_at=1 checks=1 failed=0\nhello\n",
        "ccl-preflight/v1 passed finished_at=١٢٣ checks=0 failed=0\n",  # digits that are not ASCII
        "ccl-preflight/v1 passed finished_at=1e9 checks=0 failed=0\n",
        "ccl-preflight/v1 passed finished_at=1 checks=99 failed=0\n" + "ok c\n" * 100,  # over MAX_CHECKS
    ],
    ids=[
        "empty",
        "other-program",
        "other-schema",
        "passed-with-failure",
        "more-failures-than-counted",
        "bad-name",
        "not-a-check",
        "unicode-digits",
        "exponent",
        "too-many-checks",
    ],
)
def test_what_is_no_report_is_malformed(message: str) -> None:
    with pytest.raises(MalformedReport):
        parse_report(message)
    assert pod_preflight("ml", "w-0", UID, "llama", message).status == MALFORMED


def test_a_pods_report_is_a_preflight_result_for_that_pod_only() -> None:
    found = pod_preflight("ml", "w-0", UID, "llama", render_report(FAILED))
    assert found.status == VALID and found.result is not None
    assert (
        found.result.source,
        found.result.namespace,
        found.result.pod,
        found.result.pod_uid,
        found.result.job_name,
    ) == ("preflight", "ml", "w-0", UID, "llama")
    assert not found.result.success
    assert pod_preflight("ml", "w-0", UID, "", render_report(FAILED)[:120]).status == CUT


def test_newest_preflights_keeps_one_per_pod() -> None:
    old = ProbeResult(source="preflight", started_at=0, finished_at=10, namespace="ml", pod="w-0")
    new = ProbeResult(source="preflight", started_at=0, finished_at=20, namespace="ml", pod="w-0")
    tie = ProbeResult(source="preflight", started_at=0, finished_at=20, namespace="ml", pod="w-0", job_name="file")
    other = ProbeResult(source="preflight", started_at=0, finished_at=5, namespace="ml", pod="w-1")
    job = ProbeResult(source="job", started_at=0, finished_at=1, namespace="ml", pod="w-0")
    assert newest_preflights([old, new, other, job]) == [new, other, job]
    assert newest_preflights([new, tie]) == [tie], "of two alike the later in the list"


texts = st.text(st.characters(codec="utf-8"), max_size=600)
checks = st.builds(Check, st.text(min_size=1, max_size=80), st.booleans(), texts)


@settings(max_examples=300, deadline=None)
@given(st.lists(checks, max_size=40), st.none() | texts, st.floats(0, 4e9), st.integers(1, 200))
def test_any_result_fits_and_reads_back_with_its_verdict(
    found: list[Check], error: str | None, finished: float, containers: int
) -> None:
    written = result(*found, error=error, finished_at=finished)
    text = render_report(written)
    assert len(text.encode()) <= MAX_MESSAGE_BYTES and text.isascii()
    report = parse_report(text)
    assert report.passed == written.success
    assert len(report.checks) == min(len(found), MAX_CHECKS)
    try:
        cut = parse_report(kubelet_cut(text, containers))
    except MalformedReport:
        assert len(text) > POD_BYTES // containers, "only a header cut short is no report"
    else:
        assert cut.passed == written.success


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=5000))
def test_any_text_is_a_report_or_malformed_never_an_error(message: str) -> None:
    found = pod_preflight("ml", "w-0", UID, "", message)
    assert found.status in (VALID, CUT, MALFORMED)
    if found.result is not None:
        assert len(found.result.checks) <= MAX_CHECKS

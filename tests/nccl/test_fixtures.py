"""Every fixture log (shapes of real NCCL 2.3-2.27 output and its wrappers) against its expected verdict.

``tests/fixtures/nccl/<name>.log`` is the log; ``expected/<name>.json`` is the ``analyze --json``
object without ``reasons`` (reasons are checked separately: they must quote lines of the log).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.nccl.conftest import FIXTURES, analyze_text

LOGS = sorted(FIXTURES.glob("*.log"))


def test_there_are_many_fixtures() -> None:
    assert len(LOGS) >= 25


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.stem)
def test_fixture_verdict(log: Path) -> None:
    expected = json.loads((FIXTURES / "expected" / f"{log.stem}.json").read_text())
    got = analyze_text(log.read_text()).result().to_json()
    reasons = got.pop("reasons")
    assert got == expected
    assert reasons, "a verdict always says why"


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.stem)
def test_reasons_quote_lines_of_the_log(log: Path) -> None:
    text = log.read_text()
    verdict = analyze_text(text).result()
    quotes = [q for reason in verdict.reasons for q in re.findall(r'"(.+?)"(?:$| and|\))', reason)]
    for quoted in quotes:
        quoted = quoted.removesuffix("...")
        assert quoted in text, f"{quoted!r} is not a line of {log.name}"
    if verdict.verdict in ("tcp_fallback", "rdma"):
        assert quotes, "a decided verdict cites the deciding line"


# The classes of verdict the fixtures cover, so that dropping one is noticed.
FALLBACKS = {
    "v2_4_ib_disabled_socket_two_nodes",
    "v2_7_mpi_socket_fallback",
    "v2_19_pod_log_socket_fallback_nnodes",
    "v2_26_timestamps_socket_over_ipoib",
    "gcp_gpudirecttcpx_two_nodes",
    "gcp_fastsocket_two_nodes",
    "interleaved_records_socket",
    "same_hostname_two_nodes_socket",
    "nccl_tests_table_socket_excerpt",
    "v2_10_same_size_communicators_socket",  # several communicators under one key ("nranks:2")
    "v2_10_one_node_of_two_socket",  # peer on the GPU a local rank's init line names
}
NOT_FALLBACKS = {
    "v2_4_socket_line_on_every_rank_ib": "rdma",  # NET/Socket : Using printed on every rank in 2.4
    "v2_19_single_node_socket": "single_node",
    "single_node_net_socket_p2p_disabled": "single_node",  # via NET/ inside one node
    "single_node_p2p_nvls": "single_node",
    "v2_23_efa_aws_libfabric": "rdma",
    "v2_21_ibext_v8_plugin": "rdma",
    "truncated_before_network": "unknown",
    "single_process_socket_scope_unknown": "unknown",
    "unknown_plugin_name": "unknown",
    "ib_completion_error_only": "rdma",  # socket WARNs are not a network choice; IB completions are IB traffic
}


@pytest.mark.parametrize("name", sorted(FALLBACKS))
def test_every_fallback_is_caught(name: str) -> None:
    verdict = analyze_text((FIXTURES / f"{name}.log").read_text()).result()
    assert verdict.verdict == "tcp_fallback" and verdict.inter_node_tcp is True


@pytest.mark.parametrize("name,expected", sorted(NOT_FALLBACKS.items()))
def test_traps_are_not_fallbacks(name: str, expected: str) -> None:
    verdict = analyze_text((FIXTURES / f"{name}.log").read_text()).result()
    assert verdict.verdict == expected
    assert verdict.inter_node_tcp is not True
    if expected == "unknown":
        assert verdict.inter_node_tcp is None

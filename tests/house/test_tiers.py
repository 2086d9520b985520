"""The test tiers `make test-fast` leaves out are found from the test source (tests/tiers.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import FAST_MIN_EXAMPLES, fewer_examples
from tests.tiers import SLOW, TESTS, tier


@pytest.mark.parametrize(
    ("module", "test", "fixtures", "expected"),
    [
        # its own body calls require_tool("promtool")
        ("collectors/test_rdma_collector.py", "test_promtool_accepts_the_exposition", ["fixture_tree"], "tool"),
        # its own body runs a subprocess
        ("commands/test_cli.py", "test_help_is_readable", [], "tool"),
        # a conftest fixture starts the exporter as a process
        ("sim/test_simulate.py", "test_simulated_counters_advance_and_lint_clean", ["exporter_process"], "tool"),
        # a helper of its module starts processes (the corpus runs `analyze` once per log)
        ("nccl/test_corpus.py", "test_corpus_bars", [], "tool"),
        # a fixture of its module compiles the fake NVML library with gcc
        ("collectors/test_nvml.py", "test_gpu_without_nvlink", ["fake_lib"], "tool"),
        # in-process only: the golden file, parsing flags
        (
            "collectors/test_rdma_collector.py",
            "test_golden_metrics",
            ["fixture_tree", "update_golden", "tmp_path"],
            None,
        ),
        ("commands/test_cli.py", "test_defaults", [], None),
        # everything under tests/e2e
        ("e2e/test_chain.py", "test_stopping_the_cluster_waits_for_every_process", ["tmp_path"], "e2e"),
    ],
)
def test_tier_follows_what_a_test_starts(module: str, test: str, fixtures: list[str], expected: str | None) -> None:
    path = TESTS / module
    assert path.is_file(), path
    assert tier(path, test, fixtures) == expected


def test_a_process_behind_two_helpers_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "tests"
    folder.mkdir()
    (folder / "conftest.py").write_text(
        "import pytest\n\n@pytest.fixture\ndef served():\n    return start()\n\n"
        "def start():\n    return ExporterProcess()\n"
    )
    (folder / "test_x.py").write_text(
        "def test_served(served):\n    pass\n\n"
        "def test_helper():\n    outer()\n\n"
        "def outer():\n    return inner()\n\n"
        "def inner():\n    import subprocess\n    return subprocess.run\n\n"
        'def test_plain():\n    assert len("ab") == 2\n'
    )
    monkeypatch.setattr("tests.tiers.TESTS", folder)
    test_file = folder / "test_x.py"
    assert tier(test_file, "test_served", ["served"]) == "tool"
    assert tier(test_file, "test_helper", []) == "tool"
    assert tier(test_file, "test_plain", []) is None


def test_every_slow_test_is_named_as_it_is_and_says_why() -> None:
    """A renamed or moved test would otherwise fall back into the fast tier without a word."""
    for name, reason in SLOW.items():
        module, _, function = name.partition("::")
        path = TESTS / module
        assert path.is_file(), name
        tree = ast.parse(path.read_text())
        tests = {node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
        assert function in tests, f"{name}: no such test"
        assert reason.strip(), f"{name}: say what makes it slow"
        assert tier(path, function, []) in ("slow", "tool"), name


def test_a_slow_test_is_slow_and_one_starting_processes_stays_tool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "tests"
    folder.mkdir()
    (folder / "test_x.py").write_text(
        "def test_long():\n    assert sum(range(10**6))\n\n"
        "def test_long_tool():\n    require_tool('promtool')\n\n"
        "def test_short():\n    assert 1\n"
    )
    monkeypatch.setattr("tests.tiers.TESTS", folder)
    monkeypatch.setattr("tests.tiers.SLOW", {"test_x.py::test_long": "why", "test_x.py::test_long_tool": "why"})
    test_file = folder / "test_x.py"
    assert tier(test_file, "test_long", []) == "slow"
    assert tier(test_file, "test_long_tool", []) == "tool"
    assert tier(test_file, "test_short", []) is None


@pytest.mark.parametrize(("declared", "fast"), [(600, 60), (300, 30), (25, FAST_MIN_EXAMPLES), (5, 5)])
def test_the_fast_profile_runs_a_tenth_of_the_examples(declared: int, fast: int) -> None:
    @given(st.integers())
    @settings(max_examples=declared, deadline=None)
    def prop(number: int) -> None:
        assert isinstance(number, int)

    fewer_examples(prop)
    assert prop._hypothesis_internal_use_settings.max_examples == fast  # type: ignore[attr-defined]
    assert prop._hypothesis_internal_use_settings.deadline is None, "the other settings are kept"  # type: ignore[attr-defined]
    runs: list[int] = []

    @given(st.integers())
    @settings(max_examples=declared, database=None)
    def counted(number: int) -> None:
        runs.append(number)

    fewer_examples(counted)
    counted()
    assert 0 < len(runs) <= fast

"""Which tier a test belongs to, read from the test source (``tests/conftest.py`` applies it).

``make test-fast`` runs ``pytest -m "not e2e and not tool and not slow"``; ``make test`` and CI run
everything.

- ``e2e``: every test under ``tests/e2e`` (real Prometheus, Alertmanager and exporter processes).
- ``tool``: a test that drives a real system tool or starts processes. A test is one when its
  body, a function it calls or a fixture it uses (the fixture's own helpers and fixtures included)
  names one of ``PROCESS_NAMES``. Functions are followed through the test's own module, the
  ``conftest.py`` files above it and the ``tests.*`` modules it imports from, so a new test lands
  in its tier without a hand-written marker.
- ``slow``: an in-process test that takes seconds of CPU however it is written (a million log
  lines, every Kubernetes version's schema, a real probe): one entry of ``SLOW``, with the reason.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass, field
from pathlib import Path

TESTS = Path(__file__).resolve().parent
E2E = TESTS / "e2e"

# Names that start a process or need a real tool: a system tool found on PATH, a subprocess, the
# exporter as a process (ours, or devtools.stack's simulated one), the fake NVML library compiled
# with gcc, the probe's worker processes (torch.distributed with gloo) started by the scheduler and
# the runner.
PROCESS_NAMES = frozenset(
    {
        "require_tool",
        "subprocess",
        "ExporterProcess",
        "SimulatedExporter",
        "build_fake_nvml",
        "ProbeScheduler",
        "run_probe",
    }
)


# Tests that stay slow however they are written, named ``<file under tests/>::<function>`` (every
# parametrization of it), each with what makes it slow. A test that starts a process is ``tool``
# already; the properties run by Hypothesis are not listed: the fast tier runs fewer examples of
# them (tests/conftest.py). tests/house/test_tiers.py checks that every name here is a test.
SLOW: dict[str, str] = {
    "nccl/test_caps.py::test_a_million_distinct_comm_ids_stay_bounded": "a million log lines through the analyzer",
    "nccl/test_hostile_lines.py::test_every_pattern_is_linear_on_hostile_lines": (
        "every pattern of the grammar on every hostile line, each timed until it is under the bound"
    ),
    "collectors/test_nccl_collector.py::test_hostile_pod_keeps_memory_and_series_bounded": (
        "two waves of hostile input (a 100 MB line among them) measured with tracemalloc"
    ),
    "collectors/test_inspector.py::test_the_simulated_node_shows_each_jobs_bus_bandwidth_by_its_network": (
        "the simulated node's Inspector files, thirteen polls of them"
    ),
    "manifests/test_helm_chart.py::test_renders_validate_strictly_on_every_kubernetes_version": (
        "each render against the schemas of thirteen Kubernetes versions"
    ),
    "manifests/test_helm_lifecycle.py::test_renders_validate_strictly_from_1_30": (
        "each render against the schemas of every Kubernetes version from 1.30"
    ),
    "manifests/test_helm_lifecycle.py::test_renders_without_the_1_30_features_validate_strictly_before_1_30": (
        "each render against the schemas of every Kubernetes version before 1.30"
    ),
    "commands/test_preflight.py::test_gang_probe_requires_rdma_and_a_floor": "the real probe: torch and two gloo ranks",
    "collectors/test_nccl_parser_budget.py::test_the_estimate_follows_what_is_really_held": (
        "24 communicators of 1024 ranks parsed under tracemalloc"
    ),
    "collectors/test_nccl_parser_budget.py::test_the_node_wide_budget_holds_and_says_what_it_dropped": (
        "six pods' floods of communicators, twenty polls, until the node-wide budget bites"
    ),
}


@dataclass
class _Module:
    functions: dict[str, set[str]] = field(default_factory=dict)  # function name -> names its body uses
    imported: dict[str, tuple[Path, str]] = field(default_factory=dict)  # local name -> (module file, name there)


def _module_file(dotted: str) -> Path | None:
    """The file of a ``tests.*`` module, or None for anything else."""
    parts = dotted.split(".")
    if parts[0] != "tests":
        return None
    base = TESTS.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def _read(path: Path) -> _Module:
    module = _Module()
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            used = {name.id for name in ast.walk(node) if isinstance(name, ast.Name)}
            used |= {arg.arg for arg in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)}
            module.functions[node.name] = used
        elif isinstance(node, ast.ImportFrom) and node.module and (source := _module_file(node.module)):
            for alias in node.names:
                module.imported[alias.asname or alias.name] = (source, alias.name)
    return module


def _conftests(test_file: Path) -> list[Path]:
    """The ``conftest.py`` files whose fixtures a test in ``test_file`` can use, nearest first."""
    found = []
    folder = test_file.parent
    while folder == TESTS or TESTS in folder.parents:
        if (folder / "conftest.py").is_file():
            found.append(folder / "conftest.py")
        folder = folder.parent
    return found


@functools.cache
def _starts_processes(path: Path, name: str) -> bool:
    """Whether function ``name`` of module ``path`` names a process, itself or through what it uses
    (a search of everything it reaches; each answer is kept, as tests share helpers and fixtures)."""
    seen: set[tuple[Path, str]] = set()
    to_visit = [(path, name)]
    while to_visit:
        place, function = to_visit.pop()
        if (place, function) in seen:
            continue
        seen.add((place, function))
        module = _read(place)
        if function in module.imported:
            to_visit.append(module.imported[function])
            continue
        used = module.functions.get(function)
        if used is None:
            continue
        if used & PROCESS_NAMES:
            return True
        # Names used here may be functions of this module, names it imports, or fixtures from a conftest.
        places = [place, *_conftests(place)]
        to_visit.extend((where, other) for other in used for where in places)
    return False


def tier(test_file: Path, test_name: str, fixtures: list[str]) -> str | None:
    """``"e2e"``, ``"tool"``, ``"slow"`` or None (the fast tier) for one collected test."""
    if E2E in test_file.parents:
        return "e2e"
    places = [test_file, *_conftests(test_file)]
    if _starts_processes(test_file, test_name):
        return "tool"
    if any(_starts_processes(place, fixture) for fixture in fixtures for place in places):
        return "tool"
    if f"{test_file.relative_to(TESTS).as_posix()}::{test_name}" in SLOW:
        return "slow"
    return None

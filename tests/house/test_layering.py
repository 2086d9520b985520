"""The layering of ``exporter/``, read from the source: data flows one way (sources -> records ->
collectors -> HTTP), ``nccl/`` is pure, the simulator (``sim/ccl_sim/``) is not known to the runtime.

The import graph is built from every ``import`` statement of every module, wherever it stands:
at the top, inside a function (the lazy imports) or under ``if TYPE_CHECKING:``. A module that
imports a name from a package depends on the package (its ``__init__``); importing a submodule
depends on that submodule.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGE = REPO / "exporter"
MAX_LINES = 600
# What reading, writing, waiting or the clock would need: none of it belongs in nccl/.
IO_MODULES = {
    "os",
    "io",
    "pathlib",
    "shutil",
    "tempfile",
    "glob",
    "socket",
    "subprocess",
    "time",
    "datetime",
    "asyncio",
    "threading",
    "logging",
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str) -> set[str]:
    """Every module ``name`` imports (dotted names, ``exporter.*`` resolved to a module of the tree)."""
    modules = _modules()
    path = modules[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            submodules = [f"{target}.{alias.name}" for alias in node.names]
            found.update(sub for sub in submodules if sub in modules)
            if not all(sub in modules for sub in submodules):
                found.add(target)
    return found


def _own(name: str) -> str | None:
    """The module of this tree that an import of ``name`` loads (its nearest enclosing one)."""
    modules = _modules()
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


@functools.cache
def import_graph() -> dict[str, frozenset[str]]:
    graph = {}
    for name in _modules():
        targets = {_own(target) for target in _imports(name) if target.startswith("exporter")}
        graph[name] = frozenset(t for t in targets if t is not None and t != name)
    return graph


def find_cycle(graph: dict[str, frozenset[str]]) -> list[str] | None:
    """One import cycle as a path (first module repeated at the end), or None."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def _under(prefix: str) -> list[str]:
    return [name for name in _modules() if name == prefix or name.startswith(prefix + ".")]


def _offenders(prefixes: tuple[str, ...], forbidden: tuple[str, ...]) -> list[str]:
    """``module -> import`` for every module under ``prefixes`` importing anything under ``forbidden``."""
    bad = []
    for prefix in prefixes:
        for name in _under(prefix):
            for target in sorted(_imports(name)):
                if any(target == f or target.startswith(f + ".") for f in forbidden):
                    bad.append(f"{name} -> {target}")
    return bad


def test_the_graph_sees_lazy_and_type_checking_imports() -> None:
    graph = import_graph()
    assert "exporter.http.endpoints" in graph["exporter.commands.serve"]  # under TYPE_CHECKING and inside serve
    assert "exporter.sources.podresources_v1.api_pb2_grpc" in graph["exporter.sources.podresources"]  # lazy


def test_find_cycle_reports_one() -> None:
    graph = {"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a"}), "d": frozenset({"a"})}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": frozenset({"b"}), "b": frozenset()}) is None


def test_no_import_cycle_in_exporter() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize(
    ("prefixes", "forbidden", "why"),
    [
        (
            ("exporter.sources",),
            ("exporter.probe", "exporter.collectors", "prometheus_client"),
            "sources read the world and return plain records",
        ),
        (
            ("exporter.nccl",),
            ("prometheus_client", "exporter.sources", "exporter.collectors", "exporter.probe", *sorted(IO_MODULES)),
            "nccl/ is pure: text in, events and verdicts out",
        ),
    ],
)
def test_layers_import_only_downwards(prefixes: tuple[str, ...], forbidden: tuple[str, ...], why: str) -> None:
    assert not _offenders(prefixes, forbidden), why


SIMULATOR_PACKAGE = "ccl_sim"


def _simulator_mentions(source: str) -> list[str]:
    """The lines of ``source`` that know the simulator: its package named (an import, a string, a
    comment), or anything about simulating (``config.simulate``, ``--simulate``, "the simulated node")."""
    return [
        f"line {number}: {line.strip()}"
        for number, line in enumerate(source.splitlines(), 1)
        if SIMULATOR_PACKAGE in line or "simulat" in line.lower()
    ]


def test_the_simulator_check_sees_a_branch_an_import_a_flag_and_a_mention() -> None:
    assert _simulator_mentions("x = 1\nif config.simulate:\n    pass\n") == ["line 2: if config.simulate:"]
    assert _simulator_mentions("from ccl_sim.node import default_node\n") == [
        "line 1: from ccl_sim.node import default_node"
    ]
    assert _simulator_mentions("FLAG = Switch('--simulate', 'run')\n") == ["line 1: FLAG = Switch('--simulate', 'run')"]
    assert _simulator_mentions('"""Reads a Simulated node."""\n') == ['line 1: """Reads a Simulated node."""']
    assert _simulator_mentions("def simple(similar: int) -> None: ...\n") == []


def test_the_runtime_does_not_know_the_simulator() -> None:
    """The simulated node is a development package beside the runtime (sim/ccl_sim/), handed to
    ``serve`` through the seam any caller has (``exporter.commands.serve.ServedNode``): no module of
    ``exporter/`` imports it, names it, or has a simulate mode, flag or branch."""
    found = {name: hits for name, path in _modules().items() if (hits := _simulator_mentions(path.read_text()))}
    assert not found


def test_nccl_imports_nothing_of_the_exporter_outside_itself() -> None:
    outside = [
        f"{name} -> {target}"
        for name in _under("exporter.nccl")
        for target in sorted(_imports(name))
        if target.startswith("exporter") and not (target + ".").startswith("exporter.nccl.")
    ]
    assert not outside


def test_a_collector_never_reaches_another() -> None:
    """The collectors are what ``exporter.collectors`` registers; the other modules there
    (``base``, ``counter_sums``) are helpers any collector may use."""
    registered = {target.split(".")[2] for target in _imports("exporter.collectors") if target.count(".") >= 2}
    collectors = registered - {"base"}
    assert {"rdma", "nvml", "nccl", "topology"} <= collectors
    bad = []
    for name in _under("exporter.collectors"):
        if name == "exporter.collectors":
            continue  # the registration list imports every collector
        own = name.split(".")[2]
        for target in _imports(name):
            parts = target.split(".")
            if parts[:2] == ["exporter", "collectors"] and len(parts) > 2 and parts[2] in collectors - {own}:
                bad.append(f"{name} -> {target}")
    assert not bad


def test_no_module_is_over_the_line_limit() -> None:
    long = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these modules (over {MAX_LINES} lines): {long}"


MAX_TOP_LEVEL_MODULES = 10


def test_the_top_level_holds_few_modules() -> None:
    """``exporter/`` keeps at its top only what every layer shares; the rest lives in a package
    named for what it holds (commands, http, collectors, sources, nccl, probe, results, ...)."""
    top = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"{len(top)} modules at the top of exporter/: {top}"

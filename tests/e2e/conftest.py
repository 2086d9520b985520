"""Fixtures for the end-to-end tests (real Prometheus, Alertmanager and exporter processes)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.e2e.harness import Cluster, cluster


@pytest.fixture
def start_cluster(tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    """``start_cluster(nodes=2, intervals=Intervals(), rule_files=None)``: everything is stopped after the test."""
    numbers = itertools.count()
    with ExitStack() as stack:

        def start(**kwargs: object) -> Cluster:
            return stack.enter_context(cluster(tmp_path / f"stack{next(numbers)}", **kwargs))  # type: ignore[arg-type]

        yield start

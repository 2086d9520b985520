from __future__ import annotations

from pathlib import Path

import pytest

from exporter.nccl import Limits, LogAnalyzer

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "nccl"


def analyze_text(text: str, limits: Limits | None = None) -> LogAnalyzer:
    analyzer = LogAnalyzer(limits)
    for line in text.splitlines():
        analyzer.feed(line)
    return analyzer


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES

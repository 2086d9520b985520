"""The labelled NCCL log corpus (``tests/fixtures/nccl``) as data, for its tests and its benchmark.

``public/`` and ``synthetic/`` each hold logs and a ``labels.json`` (rules in ``CORPUS.md``).
``public/holdout.json`` names the held-out part: 30 % of the public threads, chosen once by the
SHA-256 of the thread key, whose logs no rule-writing change may look at. A thread is a label's
``source`` without its ``@commit``: pieces of one public thread are held out (or not) together.
A thread added later is held out when its hash is at most the file's ``cutoff_sha256``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "nccl"
KINDS = ("public", "synthetic")
HOLDOUT_FILE = CORPUS / "public" / "holdout.json"


@dataclass(frozen=True)
class Case:
    kind: str  # "public" or "synthetic"
    name: str
    path: Path
    label: dict[str, Any]
    held_out: bool

    @property
    def key(self) -> str:
        return f"{self.kind}/{self.name}"


def thread_of(source: str) -> str:
    """The public thread a label's source names (``owner/repo#N`` or ``owner/repo:path``)."""
    return source.split("@", 1)[0]


def thread_hash(thread: str) -> str:
    return hashlib.sha256(thread.encode()).hexdigest()


def labels(kind: str) -> dict[str, dict[str, Any]]:
    loaded: dict[str, dict[str, Any]] = json.loads((CORPUS / kind / "labels.json").read_text())
    return loaded


@cache
def holdout() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(HOLDOUT_FILE.read_text())
    return loaded


def is_held_out(source: str) -> bool:
    """Whether a public log of this source belongs to the held-out part."""
    return thread_hash(thread_of(source)) <= holdout()["cutoff_sha256"]


def cases() -> list[Case]:
    """Every labelled log, public then synthetic, by name."""
    found = []
    for kind in KINDS:
        for name, label in sorted(labels(kind).items()):
            held = kind == "public" and is_held_out(label["source"])
            found.append(Case(kind, name, CORPUS / kind / name, label, held))
    return found

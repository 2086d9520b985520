"""A labelled corpus of NCCL logs against ``ccl-exporter analyze --json`` (the DESIGN contract).

``tests/fixtures/nccl/public/`` holds excerpts of NCCL output posted in public bug reports (the
lines exactly as posted, wrappers and interleaved noise included; the issue each came from is in
``labels.json``). ``tests/fixtures/nccl/synthetic/`` holds logs written line by line from NCCL's
format strings for shapes the public reports do not show. Each ``labels.json`` maps a log to what
a careful reader can conclude from that log alone; the rules are in
``tests/fixtures/nccl/CORPUS.md``.

Every log is run through the real command in a subprocess, one log per run, and compared on
``verdict``, ``inter_node_tcp``, ``network``, ``gdr``, ``nccl_version`` and the exit code (3 for a
TCP fallback, else 0). The bars of the product are asserted on the whole corpus: every labelled
TCP fallback caught, ``inter_node_tcp`` right on at least 95% of the logs whose answer is
knowable, and never a non-null ``inter_node_tcp`` on a log whose answer is not.

The held-out part of the public logs (``public/holdout.json``, see ``devtools.corpus``) is not
matched log by log: a failure would name the log and invite a rule written for it. It is held to
scoring within 3 points of the rest, and its test reports counts only.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from devtools.corpus import CORPUS, KINDS, cases, holdout, labels, thread_hash, thread_of
from tests.conftest import IN_CI, REPO

FIELDS = ("verdict", "inter_node_tcp", "network", "gdr", "nccl_version")
LABEL_KEYS = {"source", "why", *FIELDS}
VERDICTS = {"rdma", "tcp_fallback", "single_node", "unknown"}
EXIT_TCP_FALLBACK = 3
EXIT_CANNOT_TELL = 4
TCP_CLASS_NETWORKS = {"Socket"}
TCP_CLASS_PREFIXES = ("GPUDirectTCPX", "FastSocket", "FasTrak")
RUN_TIMEOUT_S = 60


MAX_HELD_OUT_GAP = 0.03

ALL_CASES = [(case.key, case.path, case.label) for case in cases()]
HELD_OUT = {case.key for case in cases() if case.held_out}
# The cases matched log by log: everything but the held-out part.
CASES = [case for case in ALL_CASES if case[0] not in HELD_OUT]


@functools.cache
def _analyze_available() -> bool:
    probe = subprocess.run(
        [sys.executable, "-m", "exporter", "analyze", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    return probe.returncode == 0


def _require_analyze() -> None:
    """The corpus needs the ``analyze`` command; without it skip locally, fail in CI."""
    if _analyze_available():
        return
    message = "`ccl-exporter analyze` is not in this tree"
    if IN_CI:
        pytest.fail(f"CI must run the corpus: {message}")
    pytest.skip(message)


def _run(path: Path) -> tuple[int, dict[str, Any] | None, str]:
    """(exit code, the one JSON object printed, stderr) of ``analyze --json <path>``."""
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "analyze", "--json", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    try:
        obj = json.loads(proc.stdout)
    except json.JSONDecodeError:
        obj = None
    return proc.returncode, obj if isinstance(obj, dict) else None, proc.stderr


@functools.cache
def _run_all() -> dict[str, tuple[int, dict[str, Any] | None, str]]:
    """Every log of the corpus, two runs at a time (the command is CPU-bound; the machine is shared)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda case: _run(case[1]), ALL_CASES))
    return {case[0]: result for case, result in zip(ALL_CASES, results, strict=True)}


def _mismatches(label: dict[str, Any], code: int, got: dict[str, Any] | None) -> list[str]:
    if got is None:
        return [f"no JSON object on stdout (exit {code})"]
    wrong = [
        f"{field}: want {label[field]!r} got {got.get(field, '<missing>')!r}"
        for field in FIELDS
        if field not in got or got[field] != label[field]
    ]
    want_code = {"tcp_fallback": EXIT_TCP_FALLBACK, "unknown": EXIT_CANNOT_TELL}.get(label["verdict"], 0)
    if code != want_code:
        wrong.append(f"exit code: want {want_code} got {code}")
    return wrong


# --- the corpus itself ---------------------------------------------------------------------------


def test_every_log_has_a_valid_label_and_every_label_a_log() -> None:
    for kind in KINDS:
        logs = {p.name for p in (CORPUS / kind).glob("*.log")}
        kind_labels = labels(kind)
        assert logs == set(kind_labels), (
            f"{kind}: logs without label {logs - set(kind_labels)}, labels without log {set(kind_labels) - logs}"
        )
        for name, label in kind_labels.items():
            where = f"{kind}/{name}"
            assert set(label) == LABEL_KEYS, where
            assert label["verdict"] in VERDICTS, where
            assert label["inter_node_tcp"] in (True, False, None), where
            assert label["gdr"] in (True, False, "mixed", None), where
            assert label["network"] is None or (isinstance(label["network"], str) and label["network"]), where
            assert label["why"].strip() and label["source"].strip(), where
            # A verdict and inter_node_tcp that contradict each other are a labelling mistake.
            expected_tcp = {"tcp_fallback": True, "rdma": False, "single_node": False, "unknown": None}
            assert label["inter_node_tcp"] is expected_tcp[label["verdict"]], where
            # GPUDirect RDMA is a property of RDMA-class connections only (CORPUS.md).
            if label["network"] in TCP_CLASS_NETWORKS or str(label["network"]).startswith(TCP_CLASS_PREFIXES):
                assert label["gdr"] is None, f"{where}: gdr on a TCP-class network"
            text = (CORPUS / kind / name).read_text()
            assert 0 < len(text.splitlines()) <= 80, f"{where}: keep excerpts short"
            if label["nccl_version"] is not None:
                assert f"NCCL version {label['nccl_version']}+" in text, f"{where}: version not in the log"
            if label["network"] is not None:
                assert label["network"] in text, f"{where}: network name not in the log"


def test_corpus_covers_the_shapes_it_claims() -> None:
    all_labels = [label for _, _, label in ALL_CASES]
    verdicts = [label["verdict"] for label in all_labels]
    for verdict in VERDICTS:
        assert verdicts.count(verdict) >= 4, f"too few {verdict} logs"
    networks = {label["network"] for label in all_labels}
    assert {"IB", "Socket", "IBext", "IBext_v8", "AWS Libfabric"} <= networks
    public = labels("public")
    assert len(public) >= 40
    versions = {label["nccl_version"].rsplit(".", 1)[0] for label in public.values() if label["nccl_version"]}
    assert {"2.3", "2.4", "2.5", "2.18", "2.19"} <= versions


# --- the command against the corpus --------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "label"), [(case, label) for case, _, label in CASES], ids=[case for case, _, _ in CASES]
)
def test_each_log_gets_its_label(case: str, label: dict[str, Any]) -> None:
    _require_analyze()
    code, got, stderr = _run_all()[case]
    wrong = _mismatches(label, code, got)
    assert not wrong, f"{case}: " + "; ".join(wrong) + f"\n  deciding lines: {label['why']}\n  stderr: {stderr[-500:]}"


def test_the_held_out_part_follows_its_rule() -> None:
    """30 % of the public threads (rounded), the lowest SHA-256 of the thread key; later threads by the cutoff."""
    doc = holdout()
    threads = {thread_of(label["source"]) for label in labels("public").values()}
    listed = set(doc["threads"])
    assert listed <= threads, f"held-out threads without a log: {sorted(listed - threads)}"
    by_hash = {t for t in threads if thread_hash(t) <= doc["cutoff_sha256"]}
    assert by_hash == listed, f"list the threads under the cutoff: {sorted(by_hash ^ listed)}"
    share = len(listed) / len(threads)
    assert 0.25 <= share <= 0.35, f"{len(listed)} of {len(threads)} threads held out"


def test_the_held_out_part_scores_within_3_points_of_the_rest() -> None:
    """Counts only: naming a held-out log that fails would invite a rule written for it."""
    _require_analyze()
    results = _run_all()
    scores = {True: [0, 0, 0, 0], False: [0, 0, 0, 0]}  # right, knowable, fallbacks missed, false alarms
    for case, _, label in ALL_CASES:
        if not case.startswith("public/"):
            continue
        _, got, _ = results[case]
        got_tcp = got.get("inter_node_tcp", "<missing>") if got else "<no output>"
        score = scores[case in HELD_OUT]
        if label["inter_node_tcp"] is not None:
            score[1] += 1
            score[0] += got_tcp is label["inter_node_tcp"]
        score[2] += label["verdict"] == "tcp_fallback" and got_tcp is not True
        score[3] += label["verdict"] != "tcp_fallback" and got_tcp is True
    (held_right, held_knowable, held_missed, held_alarms), (right, knowable, _, _) = scores[True], scores[False]
    held, rest = held_right / held_knowable, right / knowable
    print(
        f"\nheld out: {held_right}/{held_knowable} right ({held:.1%}), {held_missed} fallbacks missed, "
        f"{held_alarms} false alarms; the rest: {right}/{knowable} ({rest:.1%})"
    )
    assert held >= rest - MAX_HELD_OUT_GAP, f"held-out part {held:.1%} against {rest:.1%} on the rest"


def test_corpus_bars() -> None:
    """Every TCP fallback caught; inter_node_tcp >= 95% right where knowable; never a guess (the held-out
    part aside)."""
    _require_analyze()
    results = _run_all()
    table = []
    missed_fallbacks, knowable, knowable_right, guesses = [], 0, 0, []
    for case, _, label in CASES:
        code, got, _ = results[case]
        wrong = _mismatches(label, code, got)
        if wrong:
            table.append(f"  {case}\n      " + "\n      ".join(wrong) + f"\n      why: {label['why']}")
        got_tcp = got.get("inter_node_tcp", "<missing>") if got else "<no output>"
        if label["verdict"] == "tcp_fallback" and (
            got is None or got.get("verdict") != "tcp_fallback" or got_tcp is not True or code != EXIT_TCP_FALLBACK
        ):
            missed_fallbacks.append(case)
        if label["inter_node_tcp"] is None:
            if got_tcp is not None:
                guesses.append(case)
        else:
            knowable += 1
            knowable_right += got_tcp is label["inter_node_tcp"]
    accuracy = knowable_right / knowable if knowable else 0.0
    print(
        f"\ncorpus: {len(CASES)} logs, inter_node_tcp right on {knowable_right}/{knowable} knowable "
        f"({accuracy:.1%}), {len(guesses)} guesses on unknowable, {len(missed_fallbacks)} fallbacks missed"
    )
    print(f"mismatches ({len(table)} logs):\n" + "\n".join(table) if table else "no mismatches")
    assert not missed_fallbacks, f"TCP fallbacks not caught: {missed_fallbacks}"
    assert not guesses, f"non-null inter_node_tcp where the log does not show it: {guesses}"
    assert accuracy >= 0.95, f"inter_node_tcp right on {accuracy:.1%} of knowable logs (< 95%)"

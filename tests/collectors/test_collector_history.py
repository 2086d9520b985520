"""``ccl_exporter_collector_status``: ok, failing (succeeded within the day) or unavailable, kept
across restarts in --path.state, and what a broken or hostile history file does."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import pytest

from exporter.collectors.history import FILE_NAME, MAX_FILE_BYTES, SAVE_SECONDS, WINDOW_SECONDS, CollectorHistory
from exporter.collectors.umbrella import UmbrellaCollector
from tests.clocks import ManualClock
from tests.metrics_text import samples, scrape_collectors

NOW = 1_800_000_000.0  # the histories' wall clock, as a test leaves it


def test_a_collector_that_worked_today_is_failing_then_unavailable_after_a_day() -> None:
    clock = ManualClock(NOW)
    history = CollectorHistory(clock=clock)
    assert history.observe([("rdma", True), ("nvml", False)]) == {"rdma": "ok", "nvml": "unavailable"}
    clock.now += 3600
    assert history.observe([("rdma", False), ("nvml", False)]) == {"rdma": "failing", "nvml": "unavailable"}
    clock.now += WINDOW_SECONDS - 3600  # exactly a day after its last success
    assert history.observe([("rdma", False)]) == {"rdma": "failing"}
    clock.now += 1
    assert history.observe([("rdma", False)]) == {"rdma": "unavailable"}
    assert history.observe([("rdma", True)]) == {"rdma": "ok"}


def test_a_restarted_exporter_still_knows_what_worked(tmp_path: Path) -> None:
    clock = ManualClock(NOW)
    path = tmp_path / "state" / FILE_NAME
    first = CollectorHistory(path, clock=clock)
    first.observe([("rdma", True), ("probe", False)])
    first.write_pending()
    clock.now += 60
    first.observe([("rdma", False), ("probe", False)])  # nothing newer to write: the file holds rdma's success
    assert not first.write_due
    assert json.loads(path.read_text()) == {"last_success": {"rdma": clock.now - 60}}
    clock.now += 600
    restarted = CollectorHistory(path, clock=clock)
    assert restarted.observe([("rdma", False), ("probe", False)]) == {"rdma": "failing", "probe": "unavailable"}
    assert not list(path.parent.glob(".collectors-*")), "no temporary file is left behind"


def test_steady_success_is_written_at_most_every_save_interval(tmp_path: Path) -> None:
    clock = ManualClock(NOW)
    path = tmp_path / FILE_NAME
    history = CollectorHistory(path, clock=clock)
    history.observe([("rdma", True)])
    history.write_pending()
    written = path.stat().st_mtime_ns
    os.utime(path, ns=(0, 0))
    clock.now += SAVE_SECONDS / 2
    history.observe([("rdma", True)])
    assert not history.write_due
    history.write_pending()
    assert path.stat().st_mtime_ns == 0, "not written again within the interval"
    clock.now += SAVE_SECONDS
    history.observe([("rdma", True)])
    history.write_pending()
    assert path.stat().st_mtime_ns != 0 and written
    assert json.loads(path.read_text())["last_success"]["rdma"] == clock.now


@pytest.mark.parametrize(
    "content",
    [
        b"not json",
        b"[1, 2]",
        b'{"last_success": [1]}',
        b"[" * 100_000,
        b'{"last_success": {"rdma": "yesterday"}}',
        b" " * (MAX_FILE_BYTES + 1),
    ],
    ids=["garbage", "a list", "no object", "deep nesting", "a string time", "too big"],
)
def test_a_broken_history_file_is_ignored_and_said_so(tmp_path: Path, content: bytes, caplog) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / FILE_NAME
    path.write_bytes(content)
    with caplog.at_level(logging.WARNING):
        history = CollectorHistory(path, clock=ManualClock(NOW))
    assert history.observe([("rdma", False)]) == {"rdma": "unavailable"}
    assert "collector history" in caplog.text


def test_impossible_entries_are_dropped_and_the_rest_kept(tmp_path: Path) -> None:
    clock = ManualClock(NOW)
    path = tmp_path / FILE_NAME
    entries = {
        "rdma": clock.now - 10,
        "future": clock.now + 10 * 86400,
        "nan": float("nan"),
        "flag": True,
        "x" * 100: clock.now - 10,
        "zero": 0,
    }
    path.write_text(json.dumps({"last_success": entries}))
    history = CollectorHistory(path, clock=clock)
    statuses = history.observe([(name, False) for name in ("rdma", "future", "nan", "flag", "zero")])
    assert statuses == {
        "rdma": "failing",
        "future": "unavailable",
        "nan": "unavailable",
        "flag": "unavailable",
        "zero": "unavailable",
    }


def test_a_symlinked_history_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps({"last_success": {"rdma": ManualClock(NOW).now}}))
    (tmp_path / FILE_NAME).symlink_to(target)
    assert CollectorHistory(tmp_path / FILE_NAME, clock=ManualClock(NOW)).observe([("rdma", False)]) == {
        "rdma": "unavailable"
    }


def test_an_unwritable_folder_keeps_the_history_in_memory(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    blocker = tmp_path / "file"
    blocker.write_text("")
    clock = ManualClock(NOW)
    history = CollectorHistory(blocker / "sub" / FILE_NAME, clock=clock)  # its parent is a file
    with caplog.at_level(logging.WARNING):
        history.observe([("rdma", True)])
        history.write_pending()
        clock.now += 60
        assert history.observe([("rdma", False)]) == {"rdma": "failing"}
        history.write_pending()
    assert caplog.text.count("cannot keep collector history") == 1


class Failing:
    name = "rdma"

    def collect(self):  # type: ignore[no-untyped-def]
        raise RuntimeError("sysfs went away")
        yield


class Working:
    name = "nvml"

    def collect(self):  # type: ignore[no-untyped-def]
        return iter(())


def test_the_umbrella_labels_each_collector_with_its_status() -> None:
    text = scrape_collectors(Working(), Failing())
    status = {
        dict(labels)["collector"]: dict(labels)["status"]
        for (name, labels) in samples(text)
        if name == "ccl_exporter_collector_status"
    }
    assert status == {"nvml": "ok", "rdma": "unavailable"}


def test_status_follows_the_umbrellas_history() -> None:
    clock = ManualClock(NOW)
    history = CollectorHistory(clock=clock)

    class Flaky:
        name = "rdma"
        ok = True

        def collect(self):  # type: ignore[no-untyped-def]
            if not self.ok:
                raise RuntimeError("gone")
            return iter(())

    flaky = Flaky()
    umbrella = UmbrellaCollector([flaky], history=history)  # type: ignore[list-item]
    try:
        list(umbrella.collect())
        flaky.ok = False
        families = {f.name: f for f in umbrella.collect()}
    finally:
        umbrella.close()
    assert [(s.labels["collector"], s.labels["status"]) for s in families["ccl_exporter_collector_status"].samples] == [
        ("rdma", "failing")
    ]


def test_the_umbrella_writes_the_history_off_the_scrape_path(tmp_path: Path) -> None:
    """A scrape only takes a copy; the file is written by the umbrella's thread pool."""
    path = tmp_path / FILE_NAME
    history = CollectorHistory(path, clock=ManualClock(NOW))
    umbrella = UmbrellaCollector([Working()], history=history)  # type: ignore[list-item]
    try:
        list(umbrella.collect())
        deadline = time.monotonic() + 10
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        umbrella.close()
    assert json.loads(path.read_text()) == {"last_success": {"nvml": ManualClock(NOW).now}}

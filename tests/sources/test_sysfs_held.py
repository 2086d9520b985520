"""``HeldFolders``: sysfs files kept open between reads give what a fresh read gives.

A real sysfs cannot be built here (its files re-run the kernel's show() on each read at offset 0;
a regular file simply holds its bytes), so these tests hold the reader to the fresh read on
regular files changed every way a tree can change: rewritten in place, replaced by a rename,
added, removed, and whole folders re-created. On sysfs only the first and the last happen.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.collectors.rdma import RdmaCollector
from exporter.sources.rdma import read_rdma
from exporter.sources.sysfs import RACY_SECONDS, HeldFolders, read_counters

FOLDERS = ("a", "b")
NAMES = ("rx", "tx", "wait", "errs")


def _later() -> float:
    """A clock far enough ahead that no folder looks recently changed."""
    return time.time() + 10 * RACY_SECONDS


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _age(folder: Path, step: int) -> None:
    """Give ``folder`` an old mtime of its own, as if a clock tick had passed since it changed."""
    stamp = (1_000_000 + step) * 1_000_000_000
    os.utime(folder, ns=(stamp, stamp))


operations = st.lists(
    st.tuples(
        st.sampled_from(["rewrite", "replace", "add", "remove", "recreate", "garbage"]),
        st.sampled_from(FOLDERS),
        st.sampled_from(NAMES),
        st.integers(min_value=0, max_value=2**64 - 1),
        st.booleans(),  # the folder's mtime left at "now" (a change within the racy window)
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations)
def test_held_reads_equal_fresh_reads_whatever_changes(ops: list[tuple[str, str, str, int, bool]]) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        for folder in FOLDERS:
            (root / folder).mkdir()
            for name in NAMES[:2]:
                (root / folder / name).write_text("1\n")
            _age(root / folder, 0)
        held = HeldFolders()
        for step, (operation, folder_name, name, value, racy) in enumerate(ops, start=1):
            folder = root / folder_name
            target = folder / name
            if operation == "rewrite" and target.exists():
                with open(target, "r+") as file:  # in place: a held descriptor sees it
                    file.truncate(0)
                    file.write(f"{value}\n")
            elif operation in ("replace", "add", "garbage"):
                spare = root / "spare"
                spare.write_text("N/A (no PMA)\n" if operation == "garbage" else f"{value}\n")
                os.replace(spare, target)
            elif operation == "remove" and target.exists():
                target.unlink()
            elif operation == "recreate":
                shutil.rmtree(folder)
                folder.mkdir()
                (folder / name).write_text(f"{value}\n")
            if not racy:
                _age(folder, step)
            for each in FOLDERS:
                assert held.counters(str(root / each)) == read_counters(str(root / each)), (step, operation)
            held.close_unread()
        held.close()
        assert held.held_files == 0


def test_unchanged_folders_are_read_from_held_files(tmp_path: Path) -> None:
    for name in NAMES:
        (tmp_path / name).write_text("5\n")
    held = HeldFolders(clock=_later)
    assert held.counters(str(tmp_path)) == dict.fromkeys(NAMES, 5)
    assert held.held_files == len(NAMES)
    before = _open_fds()
    with open(tmp_path / "rx", "w") as file:  # how a counter changes on sysfs: same file, new value
        file.write("6\n")
    assert held.counters(str(tmp_path))["rx"] == 6
    assert _open_fds() == before, "read from the held files, none opened"
    held.close()
    assert _open_fds() == before - len(NAMES)


def test_a_folder_changed_within_the_racy_window_is_read_afresh(tmp_path: Path) -> None:
    (tmp_path / "rx").write_text("1\n")
    held = HeldFolders()  # the real clock: the folder was just written
    assert held.counters(str(tmp_path)) == {"rx": 1}
    assert held.held_files == 0
    spare = tmp_path.parent / "spare"
    spare.write_text("2\n")
    os.replace(spare, tmp_path / "rx")  # within the same clock tick, perhaps: the mtime may not move
    assert held.counters(str(tmp_path)) == {"rx": 2}


def test_the_budget_bounds_what_is_held(tmp_path: Path) -> None:
    for folder in ("a", "b", "c"):
        (tmp_path / folder).mkdir()
        for name in NAMES:
            (tmp_path / folder / name).write_text(f"{len(folder) + len(name)}\n")
    held = HeldFolders(max_files=len(NAMES) * 2, clock=_later)
    for _ in range(2):
        for folder in ("a", "b", "c"):
            assert held.counters(str(tmp_path / folder)) == read_counters(str(tmp_path / folder))
        assert held.held_files == len(NAMES) * 2
    held.close()


def test_folders_no_longer_read_are_closed(tmp_path: Path) -> None:
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "rx").write_text("1\n")
    held = HeldFolders(clock=_later)
    held.counters(str(tmp_path / "a"))
    held.counters(str(tmp_path / "b"))
    held.close_unread()
    assert held.held_files == 2
    held.counters(str(tmp_path / "a"))  # b went away, or is no longer asked for
    held.close_unread()
    assert held.held_files == 1
    shutil.rmtree(tmp_path / "a")
    assert held.counters(str(tmp_path / "a")) == {}
    assert held.held_files == 0


def test_a_held_file_that_fails_to_read_skips_its_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in NAMES:
        (tmp_path / name).write_text("3\n")
    held = HeldFolders(clock=_later)
    held.counters(str(tmp_path))
    real_pread = os.pread
    failing = {held._folders[str(tmp_path)].files[0][1]}  # the first held descriptor

    def pread(fd: int, size: int, offset: int) -> bytes:
        if fd in failing:
            raise OSError(errno.ENODEV, os.strerror(errno.ENODEV))
        return real_pread(fd, size, offset)

    monkeypatch.setattr(os, "pread", pread)
    values = held.counters(str(tmp_path))
    assert len(values) == len(NAMES) - 1 and set(values.values()) == {3}
    held.close()


@pytest.mark.parametrize("tree", ["sysfs_rdma", "sysfs_rdma_malformed"])
def test_rdma_reading_from_held_files_equals_a_fresh_one(fixture_tree, tree: str) -> None:  # type: ignore[no-untyped-def]
    root = fixture_tree(tree)
    held = HeldFolders(clock=_later)
    for _ in range(2):  # the first read opens, the second reads what it holds
        assert read_rdma(root, held=held) == read_rdma(root)
    assert held.held_files > 0
    held.close()


def test_the_rdma_collector_closes_what_it_holds(fixture_tree) -> None:  # type: ignore[no-untyped-def]
    root = fixture_tree("sysfs_rdma")
    for path in sorted(root.rglob("*"), reverse=True):  # nothing "recently changed": files are held
        if path.is_dir() and not path.is_symlink():
            _age(path, 0)
    before = _open_fds()
    collector = RdmaCollector(root)
    list(collector.collect())
    assert _open_fds() > before
    collector.close()
    assert _open_fds() == before


def test_a_folder_with_a_file_that_will_not_open_is_not_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Held without it, a file that failed to open once would be missing for as long as the
    folder lives (on sysfs, until the device goes away)."""
    for name in NAMES:
        (tmp_path / name).write_text("4\n")
    real_open = os.open
    refusing = {"tx"}

    def flaky_open(path, flags, *args, **kwargs):  # type: ignore[no-untyped-def]
        if os.path.basename(path) in refusing:
            raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", flaky_open)
    held = HeldFolders(clock=_later)
    assert "tx" not in held.counters(str(tmp_path))
    assert held.held_files == 0
    refusing.clear()  # it opens again
    assert held.counters(str(tmp_path))["tx"] == 4
    assert held.held_files == len(NAMES)
    held.close()

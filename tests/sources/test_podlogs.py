"""The pod-log / NCCL debug-file tailer on real files: rotation, truncation, partial lines,
restarts, start caps and bounds. Every test checks that each NCCL line arrives exactly once."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import time
import tracemalloc
from pathlib import Path

import pytest

from exporter.sources import podlogs
from exporter.sources.podlogs import (
    SOURCE_DEBUG_FILE,
    SOURCE_POD_LOG,
    PodLogTailer,
    StreamKey,
    TailBatch,
    TailLimits,
    parse_pod_folder,
    pod_log_compressed_generation,
    pod_log_generation,
)

STAMP = "2026-03-01T10:00:00.123456789Z"
UID = "0b7c5a1e-1111-2222-3333-444455556666"


def cri(message: str, tag: str = "F", stream: str = "stdout") -> str:
    return f"{STAMP} {stream} {tag} {message}\n"


def nccl(n: int) -> str:
    return f"host-0:41:41 [0] NCCL INFO line {n}"


def append(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        handle.write(text)


def container_dir(
    root: Path, namespace: str = "training", pod: str = "llama-worker-0", container: str = "pytorch"
) -> Path:
    return root / f"{namespace}_{pod}_{UID}" / container


def all_lines(batches: list[TailBatch], *, replayed: bool = False) -> list[str]:
    out: list[str] = []
    for batch in batches:
        source = batch.replayed if replayed else batch.lines
        for lines in source.values():
            out.extend(lines)
    return out


def drain(tailer: PodLogTailer, rounds: int = 5) -> list[TailBatch]:
    return [tailer.poll() for _ in range(rounds)]


def test_path_conventions() -> None:
    assert parse_pod_folder(f"training_llama-worker-0_{UID}") == ("training", "llama-worker-0", UID)
    assert parse_pod_folder("no-uid_here") is None
    assert pod_log_generation("0.log") == ("0", "")
    assert pod_log_generation("2.log.20260301-100000") == ("2", "20260301-100000")
    assert pod_log_generation("2.log.20260301-100000.gz") is None
    assert pod_log_generation("2.log.20260301-100000.gz.tmp") is None
    assert pod_log_generation("app.log") is None
    assert pod_log_compressed_generation("2.log.20260301-100000.gz") == ("2", "20260301-100000")
    assert pod_log_compressed_generation("2.log.gz") is None
    assert pod_log_compressed_generation("2.log.20260301-100000.gz.tmp") is None


def test_only_nccl_lines_are_returned_with_their_stream(tmp_path: Path) -> None:
    log = container_dir(tmp_path) / "0.log"
    append(log, cri("epoch 1 loss 2.3") + cri(nccl(1)) + cri("NCCL WARN oops", stream="stderr"))
    tailer = PodLogTailer(tmp_path, None)
    batch = tailer.poll()
    key = StreamKey(SOURCE_POD_LOG, "training", "llama-worker-0", UID, "pytorch", "0")
    assert batch.lines == {key: [nccl(1), "NCCL WARN oops"]}
    assert key in batch.opened
    assert tailer.stats.files[SOURCE_POD_LOG] == 1


def test_partial_cri_lines_are_joined_even_across_polls_and_streams(tmp_path: Path) -> None:
    log = container_dir(tmp_path) / "0.log"
    append(log, cri("host-0:41:41 [0] NC", tag="P") + cri("interleaved stderr NCCL F", stream="stderr"))
    tailer = PodLogTailer(tmp_path, None)
    first = all_lines([tailer.poll()])
    append(log, cri("CL INFO Using net", tag="P") + cri("work IB"))
    second = all_lines([tailer.poll()])
    assert first == ["interleaved stderr NCCL F"]
    assert second == ["host-0:41:41 [0] NCCL INFO Using network IB"]


def test_incomplete_last_line_waits_for_its_newline(tmp_path: Path) -> None:
    log = container_dir(tmp_path) / "0.log"
    append(log, cri(nccl(1)) + cri(nccl(2))[:30])
    tailer = PodLogTailer(tmp_path, None)
    assert all_lines([tailer.poll()]) == [nccl(1)]
    append(log, cri(nccl(2))[30:])
    assert all_lines([tailer.poll()]) == [nccl(2)]


def test_rotation_follows_the_renamed_file_to_its_end_first(tmp_path: Path) -> None:
    folder = container_dir(tmp_path)
    live = folder / "0.log"
    append(live, cri(nccl(1)))
    tailer = PodLogTailer(tmp_path, None)
    got = all_lines([tailer.poll()])
    append(live, cri(nccl(2)))
    rotated = folder / "0.log.20260301-100500"
    os.rename(live, rotated)  # kubelet rotates ...
    append(rotated, cri(nccl(3)))  # ... the runtime still writes a line before reopening
    append(live, cri(nccl(4)))  # the new live file
    got += all_lines(drain(tailer, 2))
    # kubelet compresses the rotated file and deletes the plain one
    (folder / "0.log.20260301-100500.gz").write_bytes(b"\x1f\x8b compressed")
    rotated.unlink()
    append(live, cri(nccl(5)))
    got += all_lines(drain(tailer, 2))
    assert got == [nccl(n) for n in range(1, 6)]
    assert tailer.stats.skipped_bytes.get("vanished", 0) == 0


def test_rotated_file_ending_without_a_newline_does_not_hold_back_the_stream(tmp_path: Path) -> None:
    """A runtime killed mid-write leaves a rotated file whose last line has no newline. While
    the file may still grow (just rotated), the line waits for its end; once the file is
    quiet, the line is taken as it is and the newer live file is read."""
    folder = container_dir(tmp_path)
    live = folder / "0.log"
    append(live, cri(nccl(1)))
    tailer = PodLogTailer(tmp_path, None)
    got = all_lines([tailer.poll()])
    append(live, cri(nccl(2)).rstrip("\n"))
    rotated = folder / "0.log.20260301-100500"
    os.rename(live, rotated)
    append(live, cri(nccl(3)))
    got += all_lines(drain(tailer, 2))
    assert got == [nccl(1)], "a rotated file modified just now may still get its newline"
    quiet = time.time() - podlogs.ROTATED_QUIET_SECONDS - 1
    os.utime(rotated, (quiet, quiet))
    got += all_lines(drain(tailer, 2))
    assert got == [nccl(1), nccl(2), nccl(3)]
    append(live, cri(nccl(4)))
    assert all_lines(drain(tailer, 2)) == [nccl(4)], "nothing read twice"
    assert tailer.stats.backlog_bytes == 0


def test_copytruncate_restarts_a_pod_log_at_zero(tmp_path: Path) -> None:
    log = container_dir(tmp_path) / "0.log"
    append(log, cri(nccl(1)) + cri(nccl(2)))
    tailer = PodLogTailer(tmp_path, None)
    got = all_lines([tailer.poll()])
    with open(log, "w") as handle:  # truncate in place, same inode
        handle.write(cri(nccl(3)))
    batch = tailer.poll()
    got += all_lines([batch])
    assert got == [nccl(1), nccl(2), nccl(3)]
    assert tailer.stats.events["truncated"] == 1
    assert batch.restarted == []  # a pod log goes on; only debug files start a new log


def test_debug_file_rewritten_by_a_new_process_is_a_restarted_stream(tmp_path: Path) -> None:
    debug = tmp_path / "nccl" / f"training_llama-worker-0_{UID}" / "nccl.llama-worker-0.41.log"
    append(debug, "\n".join(nccl(n) for n in range(1, 40)) + "\n")
    tailer = PodLogTailer(None, tmp_path / "nccl")
    assert len(all_lines([tailer.poll()])) == 39
    # A new process overwrites the file and writes more than we had read before we look.
    with open(debug, "w") as handle:
        handle.write("\n".join(f"host-0:77:77 [0] NCCL INFO new {n}" for n in range(80)) + "\n")
    batch = tailer.poll()
    key = StreamKey(SOURCE_DEBUG_FILE, "training", "llama-worker-0", UID, "", "nccl.llama-worker-0.41.log")
    assert batch.restarted == [key]
    assert batch.lines[key][0] == "host-0:77:77 [0] NCCL INFO new 0"
    assert len(batch.lines[key]) == 80


def test_restart_resumes_at_saved_offsets_and_replays_the_head(tmp_path: Path) -> None:
    pods, state = tmp_path / "pods", tmp_path / "state"
    log = container_dir(pods) / "0.log"
    append(log, cri(nccl(1)) + cri(nccl(2)) + cri("host-0:41:41 [0] NC", tag="P"))
    first = PodLogTailer(pods, None, state)
    assert all_lines([first.poll()]) == [nccl(1), nccl(2)]
    key = next(iter(first._streams))
    assert first.save_state({key: {"warnings": {"ib": 2}}})
    append(log, cri("CL INFO line 3") + cri(nccl(4)))

    second = PodLogTailer(pods, None, state)
    batch = second.poll()
    assert batch.opened == {key: {"warnings": {"ib": 2}}}
    assert all_lines([batch], replayed=True) == [nccl(1), nccl(2)]
    assert all_lines([batch]) == ["host-0:41:41 [0] NCCL INFO line 3", nccl(4)]
    assert all_lines(drain(second, 2)) == []


def test_restart_after_rotation_while_down(tmp_path: Path) -> None:
    pods, state = tmp_path / "pods", tmp_path / "state"
    folder = container_dir(pods)
    append(folder / "0.log", cri(nccl(1)))
    first = PodLogTailer(pods, None, state)
    first.poll()
    first.save_state()
    append(folder / "0.log", cri(nccl(2)))
    os.rename(folder / "0.log", folder / "0.log.20260301-110000")
    append(folder / "0.log", cri(nccl(3)))
    second = PodLogTailer(pods, None, state)
    assert all_lines(drain(second, 2)) == [nccl(2), nccl(3)]


def test_inode_reused_by_another_file_is_not_resumed(tmp_path: Path) -> None:
    pods, state = tmp_path / "pods", tmp_path / "state"
    log = container_dir(pods) / "0.log"
    append(log, "".join(cri(nccl(n)) for n in range(20)))
    first = PodLogTailer(pods, None, state)
    first.poll()
    first.save_state()
    # Same path and inode, other bytes (e.g. the folder was recreated): read from 0.
    with open(log, "r+") as handle:
        handle.write(cri("host-9:1:1 [0] NCCL INFO other job"))
    second = PodLogTailer(pods, None, state, TailLimits(start_bytes=1 << 20))
    lines = all_lines(drain(second, 2))
    assert lines[0] == "host-9:1:1 [0] NCCL INFO other job"
    assert all_lines([second.poll()], replayed=True) == []


def test_busy_log_at_first_start_reads_the_head_then_follows_the_end(tmp_path: Path) -> None:
    log = container_dir(tmp_path) / "0.log"
    append(log, cri(nccl(0)) + "".join(cri(f"noise {n} " + "x" * 100) for n in range(2000)) + cri(nccl(1))[:20])
    limits = TailLimits(start_bytes=4096)
    tailer = PodLogTailer(tmp_path, None, limits=limits)
    got = all_lines([tailer.poll()])
    assert got == [nccl(0)]  # the head (init lines) is read
    assert tailer.stats.skipped_bytes["initial_cap"] > 200_000
    append(log, cri(nccl(1))[20:] + cri(nccl(2)))  # the fragment at the end is skipped whole
    assert all_lines([tailer.poll()]) == [nccl(2)]


def test_small_log_at_first_start_is_read_whole_and_new_pods_from_zero(tmp_path: Path) -> None:
    append(container_dir(tmp_path) / "0.log", "".join(cri(nccl(n)) for n in range(10)))
    tailer = PodLogTailer(tmp_path, None, limits=TailLimits(start_bytes=1 << 20))
    assert len(all_lines([tailer.poll()])) == 10
    # A pod that appears later is read from byte 0 whatever its size.
    late = container_dir(tmp_path, pod="late-0") / "0.log"
    append(late, "".join(cri(nccl(n)) for n in range(5000)))
    assert len(all_lines(drain(tailer, 3))) == 5000


def test_removed_pod_is_reported(tmp_path: Path) -> None:
    folder = container_dir(tmp_path)
    append(folder / "0.log", cri(nccl(1)))
    tailer = PodLogTailer(tmp_path, None)
    tailer.poll()
    for child in folder.iterdir():
        child.unlink()
    folder.rmdir()
    folder.parent.rmdir()
    batch = tailer.poll()
    assert [k.pod for k in batch.removed] == ["llama-worker-0"]
    assert tailer.stats.streams == 0


def test_container_restart_is_a_new_stream(tmp_path: Path) -> None:
    folder = container_dir(tmp_path)
    append(folder / "0.log", cri(nccl(1)))
    tailer = PodLogTailer(tmp_path, None)
    tailer.poll()
    append(folder / "1.log", cri(nccl(2)))
    batch = tailer.poll()
    assert [(k.name, v) for k, v in batch.lines.items()] == [("1", [nccl(2)])]
    assert [k.generation for k in batch.opened] == [1]


def test_debug_file_convention_and_unattributed_files(tmp_path: Path) -> None:
    root = tmp_path / "nccl"
    append(root / f"research_bert-0_{UID}" / "rank0" / "nccl.bert-0.12.log", nccl(1) + "\n")
    append(root / "stray.log", nccl(2) + "\n")
    append(root / "no-pod-folder" / "x.log", nccl(3) + "\n")
    tailer = PodLogTailer(None, root)
    batch = tailer.poll()
    assert {(k.namespace, k.pod, k.name): v for k, v in batch.lines.items()} == {
        ("research", "bert-0", "rank0/nccl.bert-0.12.log"): [nccl(1)]
    }
    assert tailer.stats.unattributed_files == 2


def test_long_lines_are_cut_and_memory_stays_bounded(tmp_path: Path) -> None:
    """A 100 MB line without a newline in a debug file, then a normal line."""
    debug = tmp_path / "nccl" / f"evil_pod-0_{UID}" / "nccl.log"
    debug.parent.mkdir(parents=True)
    limits = TailLimits(tick_bytes=8 << 20, file_chunk_bytes=1 << 20, max_line_bytes=64 << 10)
    tailer = PodLogTailer(None, tmp_path / "nccl", limits=limits)
    tailer.poll()  # the file appears after the first scan: read from byte 0, no start cap
    with open(debug, "wb") as handle:
        handle.write(b"NCCL " + b"A" * (100 * 1024 * 1024))
    tracemalloc.start()
    try:
        lines = all_lines(drain(tailer, 110))
        with open(debug, "ab") as handle:
            handle.write(b"\n" + nccl(1).encode() + b"\n")
        lines += all_lines(drain(tailer, 2))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert lines == [nccl(1)]
    assert tailer.stats.skipped_bytes["long_line"] >= 100 * 1024 * 1024
    assert peak < 8 * 1024 * 1024, peak  # a few chunks, never the line


def test_joined_partial_lines_are_capped(tmp_path: Path) -> None:
    log = container_dir(tmp_path) / "0.log"
    piece = "B" * 16384
    append(log, cri("NCCL " + piece, tag="P") + "".join(cri(piece, tag="P") for _ in range(200)) + cri("end"))
    tailer = PodLogTailer(tmp_path, None, limits=TailLimits(max_line_bytes=65536))
    lines = all_lines(drain(tailer, 6))  # 3.3 MB at 1 MiB per file and poll
    assert len(lines) == 1 and len(lines[0]) == 65536 and lines[0].startswith("NCCL ")
    assert tailer.stats.events["long_line"] == 1


def test_stream_caps_evict_the_least_recent_and_do_not_reread(tmp_path: Path) -> None:
    folder = tmp_path / "nccl" / f"evil_pod-0_{UID}"
    for n in range(30):
        append(folder / f"f{n:02d}.log", nccl(n) + "\n")
        os.utime(folder / f"f{n:02d}.log", (1_000_000 + n, 1_000_000 + n))
    limits = TailLimits(max_streams_per_pod=8, max_streams=100)
    tailer = PodLogTailer(None, tmp_path / "nccl", limits=limits)
    lines = all_lines([tailer.poll()])
    assert sorted(lines) == [nccl(n) for n in range(22, 30)]  # the 8 most recently written
    assert tailer.stats.streams == 8
    # Older files become the most recent: tracked ones are evicted, newcomers read once.
    for n in range(0, 8):
        append(folder / f"f{n:02d}.log", f"again {n} NCCL\n")
        os.utime(folder / f"f{n:02d}.log", (2_000_000 + n, 2_000_000 + n))
    lines = all_lines(drain(tailer, 2))
    assert sorted(lines) == sorted([nccl(n) for n in range(8)] + [f"again {n} NCCL" for n in range(8)])
    assert tailer.stats.events["stream_evicted"] == 8
    # An evicted stream that comes back resumes where it was (its head replayed, nothing
    # counted twice), so lines written while it was evicted are not lost.
    for n in range(22, 30):
        append(folder / f"f{n:02d}.log", f"late {n} NCCL\n")
        os.utime(folder / f"f{n:02d}.log", (3_000_000 + n, 3_000_000 + n))
    batches = drain(tailer, 2)
    assert sorted(all_lines(batches)) == [f"late {n} NCCL" for n in range(22, 30)]
    assert sorted(all_lines(batches, replayed=True)) == [nccl(n) for n in range(22, 30)]


def test_tick_budget_bounds_each_poll(tmp_path: Path) -> None:
    for pod in range(4):
        append(container_dir(tmp_path, pod=f"p{pod}") / "0.log", "".join(cri(nccl(n)) for n in range(3000)))
    limits = TailLimits(tick_bytes=64 * 1024, file_chunk_bytes=32 * 1024)
    tailer = PodLogTailer(tmp_path, None, limits=limits)
    tailer.poll()  # first scan: discovery plus bootstrap
    before = sum(tailer.stats.bytes_read.values())
    tailer.poll()
    assert sum(tailer.stats.bytes_read.values()) - before <= 64 * 1024
    assert tailer.stats.backlog_bytes > 0
    total = len(all_lines(drain(tailer, 60)))
    assert tailer.stats.backlog_bytes == 0 and total > 0


# ---------------------------------------------------------------------------------------
# A rotation compressed while the exporter was down, resumed from saved state


def compress(plain: Path) -> Path:
    """What kubelet does to an older rotation: write ``<name>.gz``, delete the plain file."""
    packed = plain.with_name(plain.name + ".gz")
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    plain.unlink()
    return packed


def down_while(pods: Path, state: Path, limits: TailLimits | None = None) -> PodLogTailer:
    """A tailer that reads what is there, saves its state and stops."""
    tailer = PodLogTailer(pods, None, state, limits)
    drain(tailer, 2)
    assert tailer.save_state()
    return tailer


@pytest.mark.parametrize("tick_lines", [16384, 7], ids=["bytes_bound", "lines_bound"])
def test_rotation_compressed_while_down_is_read_from_the_saved_offset(tmp_path: Path, tick_lines: int) -> None:
    """In small steps (several polls), in order, before the new live file; a CRI ``P`` piece
    at the end of the .gz is joined with its ``F`` end at the start of the live file. With
    few lines per poll, the lines inflated but not handed back wait for the next poll."""
    pods, state = tmp_path / "pods", tmp_path / "state"
    folder = container_dir(pods)
    append(folder / "0.log.20260301-090000", "".join(cri(nccl(n) + " older history") for n in range(50)))
    compress(folder / "0.log.20260301-090000")  # another compressed rotation of the same stream
    append(folder / "0.log", "".join(cri(nccl(n)) for n in range(50)))
    down_while(pods, state)
    # While down: the job writes on, kubelet rotates, the runtime reopens, kubelet compresses.
    append(folder / "0.log", "".join(cri(nccl(n)) + cri(f"step {n} loss 0.1") for n in range(50, 2000)))
    append(folder / "0.log", cri("host-0:41:41 [0] NCCL INFO joined ac", tag="P"))
    os.rename(folder / "0.log", folder / "0.log.20260301-110000")
    compress(folder / "0.log.20260301-110000")
    append(folder / "0.log", cri("ross files") + "".join(cri(nccl(n)) for n in range(2000, 2100)))

    limits = TailLimits(tick_bytes=16 * 1024, file_chunk_bytes=8 * 1024, start_bytes=1024, tick_lines=tick_lines)
    second = PodLogTailer(pods, None, state, limits)
    batches = drain(second, 40 if tick_lines > 100 else 400)
    assert max(len(all_lines([b])) for b in batches) <= tick_lines
    expected = [nccl(n) for n in range(50, 2000)] + ["host-0:41:41 [0] NCCL INFO joined across files"]
    expected += [nccl(n) for n in range(2000, 2100)]
    assert all_lines(batches) == expected
    replayed = all_lines(batches, replayed=True)
    assert replayed and replayed == [nccl(n) for n in range(len(replayed))]  # the head, up to start_bytes
    assert len([b for b in batches if b.lines]) > 10  # bounded per poll: it took many
    assert second.stats.skipped_bytes == {} and second.stats.backlog_bytes == 0
    assert all_lines(drain(second, 2)) == []


def test_state_saved_halfway_through_a_gz_resumes_it_and_a_finished_gz_is_not_read_again(tmp_path: Path) -> None:
    pods, state = tmp_path / "pods", tmp_path / "state"
    folder = container_dir(pods)
    append(folder / "0.log", "".join(cri(nccl(n)) for n in range(10)))
    down_while(pods, state)
    append(folder / "0.log", "".join(cri(nccl(n)) for n in range(10, 1000)))
    os.rename(folder / "0.log", folder / "0.log.20260301-110000")
    compress(folder / "0.log.20260301-110000")
    append(folder / "0.log", cri(nccl(1000)))

    limits = TailLimits(tick_bytes=4096, file_chunk_bytes=4096, start_bytes=512)
    second = PodLogTailer(pods, None, state, limits)
    got = all_lines(drain(second, 5))
    assert 0 < len(got) < 990  # halfway through the .gz
    assert second.save_state()
    saved = json.loads((state / "podlogs-state.json").read_text())
    assert [Path(f["path"]).name for s in saved["streams"].values() for f in s["files"]] == [
        "0.log.20260301-110000.gz",
        "0.log",
    ]

    third = PodLogTailer(pods, None, state, limits)
    got += all_lines(drain(third, 80))
    assert got == [nccl(n) for n in range(10, 1001)]
    assert third.save_state()
    saved = json.loads((state / "podlogs-state.json").read_text())
    assert [Path(f["path"]).name for s in saved["streams"].values() for f in s["files"]] == ["0.log"]

    fourth = PodLogTailer(pods, None, state, limits)
    assert all_lines(drain(fourth, 3)) == []
    assert fourth.stats.bytes_read[SOURCE_POD_LOG] == 0


def test_saved_rotation_is_looked_up_as_its_name_gz_and_needs_a_matching_head(tmp_path: Path) -> None:
    """A saved rotated file is only resumed from ``<its name>.gz`` with the same first bytes;
    .gz files never known from saved state (older history) are not read."""
    pods, state = tmp_path / "pods", tmp_path / "state"
    folder = container_dir(pods)
    old = folder / "0.log.20260301-090000"
    append(old, cri("host-0:41:41 [0] NCCL INFO older history"))
    compress(old)  # there before the first start: never read
    append(folder / "0.log", "".join(cri(nccl(n)) for n in range(5)))
    first = PodLogTailer(pods, None, state)
    assert all_lines(drain(first, 2)) == [nccl(n) for n in range(5)]
    os.rename(folder / "0.log", folder / "0.log.20260301-100000")  # rotated while running
    append(folder / "0.log", cri(nccl(5)))
    assert all_lines(drain(first, 2)) == [nccl(5)]
    assert first.save_state()

    # While down: more lines reach neither file we know; kubelet compresses the rotation.
    # Another stream gets a .gz whose head differs from what its saved file began with.
    append(folder / "0.log.20260301-100000", cri(nccl(100)))
    compress(folder / "0.log.20260301-100000")
    other = container_dir(pods, pod="other-0")
    append(other / "0.log", "".join(cri(nccl(n)) for n in range(3)))
    second = PodLogTailer(pods, None, state)
    drain(second, 2)
    assert second.save_state()
    append(other / "0.log", cri(nccl(200)))
    os.rename(other / "0.log", other / "0.log.20260301-120000")
    foreign = gzip.compress(cri("host-9:1:1 [0] NCCL INFO other bytes").encode())
    (other / "0.log.20260301-120000.gz").write_bytes(foreign)
    (other / "0.log.20260301-120000").unlink()
    append(other / "0.log", cri(nccl(201)))

    third = PodLogTailer(pods, None, state)
    lines = {(k.pod, tuple(v)) for b in drain(third, 3) for k, v in b.lines.items()}
    assert lines == {("other-0", (nccl(201),))}
    assert third.stats.skipped_bytes == {}


def test_corrupt_gz_is_skipped_with_a_stat(tmp_path: Path) -> None:
    pods, state = tmp_path / "pods", tmp_path / "state"
    folder = container_dir(pods)
    append(folder / "0.log", "".join(cri(nccl(n)) for n in range(5)))
    down_while(pods, state)
    append(folder / "0.log", "".join(cri(nccl(n) + f" {os.urandom(24).hex()}") for n in range(5, 3000)))
    os.rename(folder / "0.log", folder / "0.log.20260301-110000")
    packed = compress(folder / "0.log.20260301-110000")
    whole = packed.read_bytes()
    packed.write_bytes(whole[: len(whole) // 2])  # truncated: cut off inside the deflate stream
    append(folder / "0.log", cri(nccl(9000)))

    second = PodLogTailer(pods, None, state, TailLimits(file_chunk_bytes=16 * 1024))
    got = all_lines(drain(second, 30))
    assert got[-1] == nccl(9000)
    from_gz = got[:-1]
    assert 0 < len(from_gz) < 2995
    assert [line.split(" ")[:6] for line in from_gz] == [nccl(n).split(" ") for n in range(5, 5 + len(from_gz))]
    assert second.stats.events["gz_corrupt"] == 1
    assert second.stats.skipped_bytes["gz_corrupt"] > 0
    assert all_lines(drain(second, 2)) == []


def test_gzip_bomb_is_cut_at_the_decompression_cap(tmp_path: Path) -> None:
    """32 MiB of noise lines in a .gz of about 100 KB: inflated up to the cap only, in
    bounded memory; the rest is counted as skipped and the live file is read after it."""
    pods, state = tmp_path / "pods", tmp_path / "state"
    folder = container_dir(pods)
    append(folder / "0.log", cri(nccl(0)))
    down_while(pods, state)
    noise = cri("A" * 1000).encode() * 1024  # 1 MiB of one repeated line
    with open(folder / "0.log", "ab") as handle:
        handle.write(cri(nccl(1)).encode())
    with gzip.open(folder / "0.log.20260301-110000.gz", "wb") as handle:
        handle.write((folder / "0.log").read_bytes())
        for _ in range(32):
            handle.write(noise)
    (folder / "0.log").unlink()
    append(folder / "0.log", cri(nccl(2)))

    limits = TailLimits(max_decompressed_bytes=4 * 1024 * 1024)
    second = PodLogTailer(pods, None, state, limits)
    tracemalloc.start()
    try:
        got = all_lines(drain(second, 8))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == [nccl(1), nccl(2)]
    assert second.stats.events["gz_cap"] == 1
    assert second.stats.skipped_bytes["gz_cap"] > 0
    assert second.stats.bytes_read[SOURCE_POD_LOG] <= 4 * 1024 * 1024 + len(cri(nccl(2)))
    assert peak < 8 * 1024 * 1024, peak


def test_fully_read_rotation_compressed_while_down_is_not_inflated(tmp_path: Path) -> None:
    """The gzip trailer's size equals the saved offset: nothing follows, so the .gz is done
    at once and the live file is read on the first poll, even with a tiny chunk size."""
    pods, state = tmp_path / "pods", tmp_path / "state"
    folder = container_dir(pods)
    append(folder / "0.log", "".join(cri(nccl(n)) for n in range(2000)))
    first = PodLogTailer(pods, None, state)
    drain(first, 2)
    os.rename(folder / "0.log", folder / "0.log.20260301-110000")
    append(folder / "0.log", cri(nccl(2000)))
    drain(first, 2)  # the rotation is read to its end
    assert first.save_state()
    compress(folder / "0.log.20260301-110000")
    append(folder / "0.log", cri(nccl(2001)))

    limits = TailLimits(tick_bytes=8192, file_chunk_bytes=1024, start_bytes=1024)
    second = PodLogTailer(pods, None, state, limits)
    assert all_lines([second.poll()]) == [nccl(2001)]
    assert second.stats.backlog_bytes == 0


def test_a_gz_that_is_not_gzip_is_not_read(tmp_path: Path) -> None:
    pods, state = tmp_path / "pods", tmp_path / "state"
    folder = container_dir(pods)
    append(folder / "0.log", cri(nccl(0)))
    down_while(pods, state)
    append(folder / "0.log", cri(nccl(1)))
    os.rename(folder / "0.log", folder / "0.log.20260301-110000")
    (folder / "0.log.20260301-110000.gz").write_bytes(b"\x1f\x8b\x08\x00" + os.urandom(4096))
    (folder / "0.log.20260301-110000").unlink()
    append(folder / "0.log", cri(nccl(2)))
    second = PodLogTailer(pods, None, state)
    assert all_lines(drain(second, 3)) == [nccl(2)]
    assert "gz_corrupt" not in second.stats.events  # its head could not be checked: never taken


# ---------------------------------------------------------------------------------------
# Rotation and saved-state edge cases


@pytest.mark.parametrize("poll_between_copy_and_truncate", [False, True])
def test_copytruncate_copy_is_read_on_from_where_the_original_was(
    tmp_path: Path, poll_between_copy_and_truncate: bool
) -> None:
    """logrotate's copytruncate copies ``0.log`` to ``0.log.1`` and truncates ``0.log`` in
    place: the copy starts with bytes already read; each line must arrive once."""
    folder = container_dir(tmp_path)
    live = folder / "0.log"
    append(live, "".join(cri(nccl(n)) for n in range(100)))
    tailer = PodLogTailer(tmp_path, None)
    got = all_lines([tailer.poll()])
    append(live, "".join(cri(nccl(n)) for n in range(100, 120)))  # not read before the copy
    shutil.copyfile(live, folder / "0.log.1")
    if poll_between_copy_and_truncate:
        got += all_lines([tailer.poll()])
    with open(live, "r+") as handle:
        handle.truncate(0)
    append(live, "".join(cri(nccl(n)) for n in range(120, 150)))
    got += all_lines(drain(tailer, 3))
    assert got == [nccl(n) for n in range(150)]
    assert tailer.stats.lines[SOURCE_POD_LOG] == 150


def test_rotations_compressed_and_deleted_between_two_polls_are_read_from_their_gz(tmp_path: Path) -> None:
    """Rename, gzip, delete faster than the tailer polls: the followed file is read on from
    its .gz, rotations never seen plain are read whole, in order; nothing is lost."""
    folder = container_dir(tmp_path)
    live = folder / "0.log"
    append(live, "".join(cri(nccl(n)) for n in range(10)))
    tailer = PodLogTailer(tmp_path, None)
    got = all_lines([tailer.poll()])
    written = 10
    for stamp in ("20260301-100000", "20260301-100001", "20260301-100002"):
        append(live, "".join(cri(nccl(n)) + cri(f"step {n}") for n in range(written, written + 10)))
        written += 10
        rotated = folder / f"0.log.{stamp}"
        os.rename(live, rotated)
        compress(rotated)
    append(live, "".join(cri(nccl(n)) for n in range(written, written + 5)))
    got += all_lines(drain(tailer, 3))
    assert got == [nccl(n) for n in range(written + 5)]
    assert tailer.stats.skipped_bytes == {}
    rotated = folder / "0.log.20260301-100003"
    os.rename(live, rotated)
    compress(rotated)  # read to its end before: its .gz gives nothing new
    append(live, cri(nccl(999)))
    assert all_lines(drain(tailer, 2)) == [nccl(999)]


def test_deeply_nested_state_file_is_ignored_not_a_crash(tmp_path: Path) -> None:
    pods, state = tmp_path / "pods", tmp_path / "state"
    state.mkdir()
    (state / podlogs.STATE_FILE_NAME).write_text("[" * 200_000 + "]" * 200_000)
    append(container_dir(pods) / "0.log", cri(nccl(1)))
    tailer = PodLogTailer(pods, None, state)
    assert tailer.stats.state_errors == 1
    assert all_lines([tailer.poll()]) == [nccl(1)]


def _mutate_first_file(doc: dict, field_name: str, value: object) -> None:
    entry = next(iter(doc["streams"].values()))["files"][0]
    entry[field_name] = value


STATE_DAMAGE = {
    "negative offset": lambda doc: _mutate_first_file(doc, "offset", -5),
    "offset as text": lambda doc: _mutate_first_file(doc, "offset", "12"),
    "offset as float": lambda doc: _mutate_first_file(doc, "offset", 1.5),
    "offset beyond any file": lambda doc: _mutate_first_file(doc, "offset", 10**30),
    "boolean inode": lambda doc: _mutate_first_file(doc, "ino", True),
    "negative checksum": lambda doc: _mutate_first_file(doc, "head_crc", -1),
    "head longer than a head": lambda doc: _mutate_first_file(doc, "head_len", 10_000),
    "skipping as text": lambda doc: _mutate_first_file(doc, "skipping", "yes"),
    "file entry a list": lambda doc: next(iter(doc["streams"].values()))["files"].__setitem__(0, [1, 2]),
    "files a mapping": lambda doc: next(iter(doc["streams"].values())).__setitem__("files", {"a": 1}),
    "partial a list": lambda doc: next(iter(doc["streams"].values())).__setitem__("partials", {"stdout": [1]}),
    "partial not base64": lambda doc: next(iter(doc["streams"].values())).__setitem__(
        "partials", {"stdout": {"data": "!!", "cut": False}}
    ),
    "partial of no CRI stream": lambda doc: next(iter(doc["streams"].values())).__setitem__(
        "partials", {"stdin": {"data": "", "cut": False}}
    ),
}


@pytest.mark.parametrize("damage", sorted(STATE_DAMAGE))
def test_damaged_saved_values_are_dropped_and_the_stream_still_read(tmp_path: Path, damage: str) -> None:
    pods, state = tmp_path / "pods", tmp_path / "state"
    log = container_dir(pods) / "0.log"
    append(log, "".join(cri(nccl(n)) for n in range(5)))
    first = PodLogTailer(pods, None, state)
    drain(first, 2)
    assert first.save_state()
    path = state / podlogs.STATE_FILE_NAME
    doc = json.loads(path.read_text())
    STATE_DAMAGE[damage](doc)
    path.write_text(json.dumps(doc))
    append(log, cri(nccl(99)))
    second = PodLogTailer(pods, None, state)
    assert nccl(99) in all_lines(drain(second, 2))
    assert second.stats.events["state_invalid"] >= 1


def test_infinite_saved_offset_is_dropped(tmp_path: Path) -> None:
    pods, state = tmp_path / "pods", tmp_path / "state"
    log = container_dir(pods) / "0.log"
    append(log, cri(nccl(0)))
    first = PodLogTailer(pods, None, state)
    drain(first, 2)
    assert first.save_state()
    path = state / podlogs.STATE_FILE_NAME
    path.write_text(re.sub(r'"offset": \d+', '"offset": Infinity', path.read_text()))
    append(log, cri(nccl(1)))
    second = PodLogTailer(pods, None, state)
    assert nccl(1) in all_lines(drain(second, 2))
    assert second.stats.events["state_invalid"] == 1


def test_a_tailer_with_its_own_selection_reads_its_files_lines_and_state_only(tmp_path: Path) -> None:
    """A second tailer (the NCCL Inspector's JSON Lines) on the same kind of folder: only the
    files its name test accepts (in sub-folders too), only lines with its needle, offsets in its
    own state file; the NCCL tailer's state is not touched."""
    root, state = tmp_path / "inspector", tmp_path / "state"
    record = '{"header":{"id":"0x1"},"coll_perf":{"coll":"AllReduce"}}'
    folder = root / f"ml_llama-0_{UID}"
    append(folder / "llama-0-pid7.log", f"{record}\nnot a record\n")
    append(folder / "rank1" / "llama-0-pid8.log", f"{record}\n")
    append(folder / "nccl_inspector_metrics_GPU-1.prom", 'nccl_bus_bandwidth_gbs{coll_perf="x"} 1\n')
    selection = podlogs.TailSelection(
        needle=b'_perf"', debug_file_name=lambda name: name.endswith(".log"), state_file_name="inspector-state.json"
    )
    tailer = PodLogTailer(None, root, state, pod_known=None, selection=selection)
    batch = tailer.poll()
    assert {k.name: v for k, v in batch.lines.items()} == {
        "llama-0-pid7.log": [record],
        "rank1/llama-0-pid8.log": [record],
    }
    assert tailer.save_state()
    assert sorted(p.name for p in state.iterdir()) == ["inspector-state.json"]
    append(folder / "llama-0-pid7.log", f"{record}\n")
    again = PodLogTailer(None, root, state, selection=selection)
    assert [line for lines in again.poll().lines.values() for line in lines] == [record]
    # The NCCL tailer on its default selection reads none of these lines (no "NCCL" in them).
    assert all_lines([PodLogTailer(None, root, state).poll()]) == []


def test_start_bytes_zero_follows_what_is_there_at_the_first_start_from_its_end(tmp_path: Path) -> None:
    """History written before the first start (no saved state) is skipped and counted; what is
    written afterwards, and files that appear later, are read whole."""
    root = tmp_path / "nccl"
    old = root / f"ml_llama-0_{UID}" / "a.log"
    append(old, "".join(nccl(n) + "\n" for n in range(5)) + "host-0:41:41 [0] NCCL INFO unfini")
    tailer = PodLogTailer(None, root, limits=TailLimits(start_bytes=0))
    assert all_lines([tailer.poll()]) == []
    assert tailer.stats.skipped_bytes["initial_cap"] == old.stat().st_size
    append(old, "shed\n" + nccl(9) + "\n")
    append(root / f"ml_llama-0_{UID}" / "b.log", nccl(10) + "\n")
    assert sorted(all_lines(drain(tailer, 2))) == sorted([nccl(9), nccl(10)])

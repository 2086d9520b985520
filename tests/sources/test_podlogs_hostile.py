"""The tailer against hostile and busy tenants: fair budgets, no re-reads of an unfinished
line, no symlinks followed, folders bound to the pods of this node, crowded folders."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from devtools.hostile_lines import hostile_lines
from exporter.sources import podlogs
from exporter.sources.kube import PodMetadata
from exporter.sources.podlogs import (
    SOURCE_DEBUG_FILE,
    SOURCE_POD_LOG,
    PodLogTailer,
    StreamKey,
    TailBatch,
    TailLimits,
    TailStats,
    extract_lines,
    parse_debug_folder,
    pod_known_on_node,
)
from exporter.sources.podlogs.cri import CRI_RE_BYTES, PARTIAL_TAG_SEARCH, CriJoiner
from tests.nccl.test_hostile_lines import PER_LINE_SECONDS
from tests.sources.test_podlogs import UID, all_lines, append, container_dir, cri, drain, nccl

OTHER_UID = "99999999-8888-7777-6666-555544443333"
UNFINISHED = "A" * (63 * 1024)  # a 63 KiB last line that never gets its newline


class NodePods:
    """A pod list like ``exporter.sources.kube.KubePodCache``'s."""

    def __init__(self, uids: dict[tuple[str, str], str], authoritative: bool = True) -> None:
        self.uids = uids
        self.authoritative = authoritative

    def lookup(self, namespace: str, pod: str) -> PodMetadata | None:
        uid = self.uids.get((namespace, pod))
        return None if uid is None else PodMetadata(namespace, pod, uid, "job", "Job")

    def is_authoritative(self) -> bool:
        return self.authoritative

    def pods(self) -> list[PodMetadata]:
        return [PodMetadata(namespace, pod, uid, "job", "Job") for (namespace, pod), uid in sorted(self.uids.items())]


def lines_by_pod(batches: list[TailBatch]) -> dict[tuple[str, str, str], list[str]]:
    out: dict[tuple[str, str, str], list[str]] = {}
    for batch in batches:
        for key, lines in batch.lines.items():
            out.setdefault((key.source, key.pod, key.pod_uid), []).extend(lines)
    return out


def debug_file(root: Path, folder: str, name: str = "nccl.log", uid: str = UID) -> Path:
    """``<root>/<folder>_<uid>/<name>``: a pod's debug-file folder names its UID (unless ``folder``
    has one already, or ``uid`` is "")."""
    if uid and folder.count("_") == 1:
        folder = f"{folder}_{uid}"
    return root / folder / name


def count_preads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Bytes returned by every ``os.pread`` from now on."""
    sizes: list[int] = []
    real = os.pread

    def counting(fd: int, length: int, offset: int) -> bytes:
        data = real(fd, length, offset)
        sizes.append(len(data))
        return data

    monkeypatch.setattr(os, "pread", counting)
    return sizes


# ---------------------------------------------------------------------------------------
# Budgets: pod logs first, separate stream caps, fair turns, no re-reads


def test_debug_files_cannot_push_pod_log_streams_out_of_the_cap(tmp_path: Path) -> None:
    pods, debug = tmp_path / "pods", tmp_path / "nccl"
    for n in range(4):
        log = container_dir(pods, pod=f"train-{n}") / "0.log"
        append(log, cri(nccl(n)))
        os.utime(log, (1_000_000, 1_000_000))  # older than any debug file
    limits = TailLimits(max_streams=4)
    tailer = PodLogTailer(pods, debug, limits=limits)
    tailer.poll()
    for n in range(10):
        append(debug_file(debug, f"noisy_spam-{n}"), "NCCL INFO spam\n")
    batches = drain(tailer, 2)
    assert not [k for b in batches for k in b.removed if k.source == SOURCE_POD_LOG]
    assert tailer.stats.files == {SOURCE_POD_LOG: 4, SOURCE_DEBUG_FILE: 4}
    for n in range(4):
        append(container_dir(pods, pod=f"train-{n}") / "0.log", cri(nccl(100 + n)))
    got = lines_by_pod(drain(tailer, 2))
    assert sorted(v for k, lines in got.items() if k[0] == SOURCE_POD_LOG for v in lines) == [
        nccl(100 + n) for n in range(4)
    ]


def test_an_unfinished_last_line_is_not_read_again_until_its_file_grows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "nccl"
    for n in range(20):
        append(debug_file(root, f"hostile_pod-{n}"), nccl(n) + "\n" + UNFINISHED)
    tailer = PodLogTailer(None, root)
    assert len(all_lines(drain(tailer, 2))) == 20
    read_before = tailer.stats.bytes_read[SOURCE_DEBUG_FILE]
    preads = count_preads(monkeypatch)
    drain(tailer, 5)
    assert sum(preads) == 0
    assert tailer.stats.bytes_read[SOURCE_DEBUG_FILE] == read_before
    assert tailer.stats.backlog_bytes == 0  # nothing there is a reason to read

    grown = debug_file(root, "hostile_pod-3")
    append(grown, "B" * 10)  # grows, still no newline: only the new bytes are read
    tailer.poll()
    assert sum(preads) <= 10 + podlogs.HEAD_BYTES  # the new bytes, and the head checked once
    preads.clear()
    append(grown, "\n" + nccl(99) + "\n")
    assert all_lines([tailer.poll()]) == [nccl(99)]  # the cut line had no NCCL; nothing lost
    assert sum(preads) <= len(UNFINISHED) + 100 + podlogs.HEAD_BYTES  # the unfinished line, once
    assert tailer.stats.bytes_read[SOURCE_DEBUG_FILE] == read_before + 10 + len(nccl(99)) + 2


def test_pod_logs_are_read_first_and_debug_files_keep_their_share(tmp_path: Path) -> None:
    pods, debug = tmp_path / "pods", tmp_path / "nccl"
    limits = TailLimits(tick_bytes=256 << 10, debug_file_tick_bytes=64 << 10, file_chunk_bytes=64 << 10)
    tailer = PodLogTailer(pods, debug, limits=limits)
    tailer.poll()
    for n in range(8):  # busy debug files, written after the first scan: read from byte 0
        append(debug_file(debug, f"noisy_spam-{n}"), "".join(f"NCCL INFO spam {i}\n" for i in range(60_000)))
    append(container_dir(pods) / "0.log", cri(nccl(1)))
    batch = tailer.poll()
    assert lines_by_pod([batch])[(SOURCE_POD_LOG, "llama-worker-0", UID)] == [nccl(1)]

    # A busy pod log does not starve debug files either: they keep their share.
    append(container_dir(pods) / "0.log", "".join(cri(nccl(n)) for n in range(20_000)))
    before = dict(tailer.stats.bytes_read)
    tailer.poll()
    pod_read = tailer.stats.bytes_read[SOURCE_POD_LOG] - before[SOURCE_POD_LOG]
    debug_read = tailer.stats.bytes_read[SOURCE_DEBUG_FILE] - before[SOURCE_DEBUG_FILE]
    assert debug_read >= 64 << 10
    assert pod_read >= (256 - 64 - 64) << 10  # the rest, less at most one line's re-read
    assert pod_read + debug_read <= 256 << 10


def test_round_robin_resumes_where_the_budget_ran_out(tmp_path: Path) -> None:
    root = tmp_path / "nccl"
    limits = TailLimits(tick_bytes=128 << 10, debug_file_tick_bytes=0, file_chunk_bytes=64 << 10)
    tailer = PodLogTailer(None, root, limits=limits)
    tailer.poll()
    for n in range(10):
        append(debug_file(root, f"team_pod-{n}"), "".join(f"NCCL INFO pod {n} line {i}\n" for i in range(40_000)))
    first_served: dict[str, int] = {}
    for poll in range(1, 11):
        for key in tailer.poll().lines:
            first_served.setdefault(key.pod, poll)
    # 2 of 10 streams fit in a poll: every one has had its turn after 5 polls.
    assert len(first_served) == 10 and max(first_served.values()) <= 5, first_served


def test_one_busy_stream_may_use_the_whole_tick_budget(tmp_path: Path) -> None:
    """One pod writing fast on an idle node is not held to one chunk per poll."""
    limits = TailLimits(tick_bytes=8 << 20, file_chunk_bytes=1 << 20, tick_lines=65536)
    tailer = PodLogTailer(tmp_path, None, limits=limits)
    tailer.poll()
    log = container_dir(tmp_path) / "0.log"
    append(log, "".join(cri(nccl(n) + " " + "x" * 40) for n in range(50_000)))
    assert log.stat().st_size > 5 << 20
    assert len(all_lines([tailer.poll()])) == 50_000
    assert tailer.stats.backlog_bytes == 0


def test_busy_streams_share_the_budget_evenly(tmp_path: Path) -> None:
    limits = TailLimits(tick_bytes=2 << 20, file_chunk_bytes=1 << 20)
    tailer = PodLogTailer(tmp_path, None, limits=limits)
    tailer.poll()
    for pod in ("a-0", "b-0", "c-0"):
        append(container_dir(tmp_path, pod=pod) / "0.log", "".join(cri(nccl(n)) for n in range(60_000)))
    got = lines_by_pod([tailer.poll()])
    counts = sorted(len(lines) for lines in got.values())
    assert len(counts) == 3 and counts[-1] - counts[0] <= counts[-1] // 4, counts


@pytest.mark.parametrize("in_pieces", [False, True], ids=["whole_lines", "cri_partial_pieces"])
def test_a_poll_hands_back_at_most_tick_lines_and_the_rest_follows_in_order(tmp_path: Path, in_pieces: bool) -> None:
    """The line budget cuts a turn at a line boundary: the next poll goes on from there, nothing
    lost, nothing twice, every byte counted once (whole lines, and CRI lines in P pieces)."""
    limits = TailLimits(tick_lines=100, min_turn_lines=10)
    tailer = PodLogTailer(tmp_path, None, limits=limits)
    tailer.poll()
    log = container_dir(tmp_path) / "0.log"

    def record(n: int) -> str:
        if in_pieces:
            return cri(nccl(n)[:20], tag="P") + cri(nccl(n)[20:]) + cri(f"step {n}")
        return cri(nccl(n)) + cri(f"step {n}")

    append(log, "".join(record(n) for n in range(3000)))
    batches = drain(tailer, 40)
    assert max(len(all_lines([b])) for b in batches) == 100
    assert all_lines(batches) == [nccl(n) for n in range(3000)]
    assert tailer.stats.bytes_read[SOURCE_POD_LOG] == log.stat().st_size
    assert tailer.stats.backlog_bytes == 0


def test_streams_with_a_backlog_share_the_lines_of_a_poll_evenly(tmp_path: Path) -> None:
    limits = TailLimits(tick_lines=3000)
    tailer = PodLogTailer(tmp_path, None, limits=limits)
    tailer.poll()
    for pod in ("a-0", "b-0", "c-0"):
        append(container_dir(tmp_path, pod=pod) / "0.log", "".join(cri(nccl(n)) for n in range(20_000)))
    for _ in range(3):
        counts = [len(lines) for lines in lines_by_pod([tailer.poll()]).values()]
        assert counts == [1000, 1000, 1000]


@pytest.mark.parametrize("victim_in_debug_file", [False, True], ids=["victim_pod_log", "victim_debug_file"])
def test_a_noisy_stream_cannot_hold_back_another_streams_lines(tmp_path: Path, victim_in_debug_file: bool) -> None:
    """One pod's backlog of NCCL-looking lines (50 polls' worth) bounds no one else: a new pod's
    lines are all handed back at the next poll, and no poll hands back more than tick_lines, so
    the caller's work per poll stays bounded too."""
    pods, debug = tmp_path / "pods", tmp_path / "nccl"
    limits = TailLimits(tick_lines=1000, min_turn_lines=50)
    tailer = PodLogTailer(pods, debug, limits=limits)
    tailer.poll()
    noisy = container_dir(pods, pod="noisy-0") / "0.log"
    append(
        noisy,
        "".join(
            cri(f"host-9:9:{n} [0] NCCL INFO Channel {n % 32:02d}/0 : {n}[0] -> {n + 1}[1] via NET/Socket/0")
            for n in range(50_000)
        ),
    )
    per_poll = [len(all_lines([tailer.poll()]))]
    victim = [nccl(n) for n in range(40)]
    if victim_in_debug_file:
        append(debug_file(debug, f"research_victim-0_{UID}"), "".join(line + "\n" for line in victim))
    else:
        append(container_dir(pods, pod="victim-0") / "0.log", "".join(cri(line) for line in victim))
    batch = tailer.poll()
    per_poll.append(len(all_lines([batch])))
    got = {key.pod: lines for key, lines in batch.lines.items()}
    assert got["victim-0"] == victim
    assert len(got["noisy-0"]) >= 900  # the noisy pod keeps what the victim leaves
    per_poll += [len(all_lines([tailer.poll()])) for _ in range(5)]
    assert max(per_poll) <= 1000, per_poll


def test_a_new_pod_is_read_at_once_among_static_hostile_debug_files(tmp_path: Path) -> None:
    root = tmp_path / "nccl"
    for n in range(100):
        append(debug_file(root, f"hostile_pod-{n:03d}"), nccl(n) + "\n" + UNFINISHED)
    tailer = PodLogTailer(None, root, limits=TailLimits(tick_bytes=2 << 20))
    drain(tailer, 5)
    append(debug_file(root, "research_new-0"), "".join(nccl(n) + "\n" for n in range(3)))
    assert lines_by_pod([tailer.poll()]) == {(SOURCE_DEBUG_FILE, "new-0", UID): [nccl(n) for n in range(3)]}


# ---------------------------------------------------------------------------------------
# Symlinks


def test_symlinks_are_never_followed(tmp_path: Path) -> None:
    pods, debug = tmp_path / "pods", tmp_path / "nccl"
    victim = container_dir(pods, pod="victim-0") / "0.log"
    append(victim, cri(nccl(1)))
    evil = container_dir(pods, pod="evil-0")
    evil.mkdir(parents=True)
    (evil / "0.log").symlink_to(victim)  # another pod's log, in this pod's folder
    (debug / f"team_evil-0_{UID}").mkdir(parents=True)
    (debug / f"team_evil-0_{UID}" / "nccl.log").symlink_to(victim)
    (debug / f"team_evil-0_{UID}" / "rank0").symlink_to(victim.parent, target_is_directory=True)
    (debug / f"team_evil-1_{UID}").symlink_to(victim.parent, target_is_directory=True)
    tailer = PodLogTailer(pods, debug)
    got = lines_by_pod(drain(tailer, 3))
    assert got == {(SOURCE_POD_LOG, "victim-0", UID): [cri(nccl(1)).split(" F ", 1)[1].rstrip("\n")]}
    assert tailer.stats.events["symlink"] == 4  # once each, not once per poll


def test_a_folder_swapped_for_a_symlink_after_it_was_listed_is_not_read(tmp_path: Path) -> None:
    victim = tmp_path / "victim" / "rank0" / "nccl.log"
    append(victim, nccl(1) + "\n")
    (tmp_path / "evil").mkdir()
    (tmp_path / "evil" / "rank0").symlink_to(victim.parent, target_is_directory=True)
    through_link = tmp_path / "evil" / "rank0" / "nccl.log"
    st = os.stat(through_link)  # what a scan racing with the swap would have seen
    assert podlogs._read_at(through_link, (st.st_dev, st.st_ino), 0, 64) is None
    assert podlogs._read_at(victim, (st.st_dev, st.st_ino), 0, 64) == (nccl(1) + "\n").encode()


def test_a_root_that_is_itself_a_symlink_is_read(tmp_path: Path) -> None:
    append(container_dir(tmp_path / "real-pods") / "0.log", cri(nccl(1)))
    (tmp_path / "pods").symlink_to(tmp_path / "real-pods", target_is_directory=True)
    tailer = PodLogTailer(tmp_path / "pods", None)
    assert all_lines([tailer.poll()]) == [nccl(1)]


# ---------------------------------------------------------------------------------------
# Folders bound to the pods of this node


def test_path_convention_of_debug_folders() -> None:
    assert parse_debug_folder("training_llama-0") == ("training", "llama-0", "")
    assert parse_debug_folder(f"training_llama-0_{UID}") == ("training", "llama-0", UID)
    assert parse_debug_folder("training") is None
    assert parse_debug_folder("a_b_c_d") is None


def test_folders_naming_pods_not_on_this_node_or_another_uid_are_not_read(tmp_path: Path) -> None:
    pods, debug = tmp_path / "pods", tmp_path / "nccl"
    node = NodePods({("training", "real-0"): UID})
    append(pods / f"training_real-0_{UID}" / "c" / "0.log", cri(nccl(1)))
    append(pods / f"training_real-0_{OTHER_UID}" / "c" / "0.log", cri(nccl(2)))  # a deleted pod's folder
    append(pods / f"training_ghost-0_{UID}" / "c" / "0.log", cri(nccl(3)))
    append(debug_file(debug, "training_real-0", uid=""), nccl(4) + "\n")  # a neighbour's forgery: no UID
    append(debug_file(debug, f"training_real-0_{UID}"), nccl(5) + "\n")
    append(debug_file(debug, f"training_real-0_{OTHER_UID}"), nccl(6) + "\n")
    append(debug_file(debug, f"training_ghost-0_{UID}"), nccl(7) + "\n")  # speaks for a pod elsewhere
    tailer = PodLogTailer(pods, debug, pod_known=pod_known_on_node(node))
    got = lines_by_pod(drain(tailer, 3))
    assert got == {(SOURCE_POD_LOG, "real-0", UID): [nccl(1)], (SOURCE_DEBUG_FILE, "real-0", UID): [nccl(5)]}
    events = tailer.stats.events
    assert (events["pod_uid_mismatch"], events["pod_not_on_node"], events["pod_uid_missing"]) == (2, 2, 1)

    # Without a complete pod list pod-log folders (kubelet names them) are read as named; of the
    # debug-file folders (any pod with the hostPath names them) only the one already bound.
    node.authoritative = False
    append(debug_file(debug, f"training_real-0_{UID}"), nccl(8) + "\n")
    got = lines_by_pod(drain(tailer, 2))
    assert sorted(line for lines in got.values() for line in lines) == [nccl(2), nccl(3), nccl(8)]
    assert events["pod_list_unavailable"] == 2 and events["pod_uid_missing"] == 1


def test_a_debug_folder_without_a_uid_never_speaks_for_a_pod(tmp_path: Path) -> None:
    """``<namespace>_<pod>`` is what a neighbour writing the whole hostPath can forge for any pod
    whose name it knows: it is counted and never read, with a pod list or without one."""
    debug = tmp_path / "nccl"
    append(debug_file(debug, "training_victim-0", uid=""), "h:1:1 [0] NCCL INFO Using network Socket\n")
    for pod_known in (None, pod_known_on_node(NodePods({("training", "victim-0"): UID}))):
        tailer = PodLogTailer(None, debug, pod_known=pod_known)
        assert all_lines(drain(tailer, 3)) == []
        assert tailer.stats.events["pod_uid_missing"] == 1  # once while it lasts


def test_debug_folders_wait_for_the_pod_list_and_then_read_as_at_the_start(tmp_path: Path) -> None:
    """At start the pod list comes a moment after the first poll: a folder there from the start
    waits (``pod_list_unavailable``), then is read as a stream found at the first scan (its head,
    then from its end), not replayed from byte 0; a folder that appears later is read whole."""
    debug = tmp_path / "nccl"
    node = NodePods({("training", "real-0"): UID, ("training", "new-0"): UID}, authoritative=False)
    busy = debug_file(debug, "training_real-0")
    append(busy, "".join(nccl(n) + "\n" for n in range(2000)))
    limits = TailLimits(start_bytes=1024)
    tailer = PodLogTailer(None, debug, limits=limits, pod_known=pod_known_on_node(node))
    assert all_lines(drain(tailer, 2)) == [] and tailer.stats.events["pod_list_unavailable"] == 1
    node.authoritative = True
    got = all_lines([tailer.poll()])
    assert got and got == [nccl(n) for n in range(len(got))] and len(got) < 50  # the head only
    assert tailer.stats.skipped_bytes["initial_cap"] > 0
    append(busy, nccl(5000) + "\n")
    append(debug_file(debug, "training_new-0"), "".join(nccl(n) + "\n" for n in range(100)))
    assert lines_by_pod(drain(tailer, 2)) == {
        (SOURCE_DEBUG_FILE, "real-0", UID): [nccl(5000)],
        (SOURCE_DEBUG_FILE, "new-0", UID): [nccl(n) for n in range(100)],
    }


def test_a_pod_that_leaves_the_node_stops_speaking(tmp_path: Path) -> None:
    node = NodePods({("training", "llama-worker-0"): UID})
    log = container_dir(tmp_path) / "0.log"
    append(log, cri(nccl(1)))
    tailer = PodLogTailer(tmp_path, None, pod_known=pod_known_on_node(node))
    assert all_lines([tailer.poll()]) == [nccl(1)]
    del node.uids[("training", "llama-worker-0")]
    append(log, cri(nccl(2)))
    batch = tailer.poll()
    assert batch.lines == {} and [k.pod for k in batch.removed] == ["llama-worker-0"]
    assert tailer.stats.events["pod_not_on_node"] == 1
    node.uids[("training", "llama-worker-0")] = OTHER_UID  # a new pod of the same name
    assert all_lines(drain(tailer, 2)) == []


def test_pod_known_on_node_answers_none_without_a_complete_list() -> None:
    node = NodePods({("a", "p"): UID}, authoritative=False)
    known = pod_known_on_node(node)
    assert known("a", "p", "") is None and known("a", "ghost", "") is None
    node.authoritative = True
    assert known("a", "p", "") is True and known("a", "p", UID) is True
    assert known("a", "p", OTHER_UID) is False and known("a", "ghost", "") is False
    node.uids[("a", "p")] = ""  # a record without a UID cannot refuse one
    assert known("a", "p", OTHER_UID) is True


# ---------------------------------------------------------------------------------------
# Crowded folders and honest byte counts


def test_a_crowded_folder_is_counted_and_known_pods_are_examined_first(tmp_path: Path) -> None:
    root = tmp_path / "nccl"
    for n in range(40):
        append(debug_file(root, f"aaa_ghost-{n:02d}"), f"NCCL ghost {n}\n")
    append(debug_file(root, "zzz_real-0"), nccl(1) + "\n")
    limits = TailLimits(max_entries_per_folder=8)

    blind = PodLogTailer(None, root, limits=limits)
    drain(blind, 3)
    assert blind.stats.events["folder_cap"] == 1  # said once, while it lasts
    assert blind.stats.streams == 8

    bound = PodLogTailer(None, root, limits=limits, pod_known=pod_known_on_node(NodePods({("zzz", "real-0"): UID})))
    assert all_lines(drain(bound, 2)) == [nccl(1)]
    assert "folder_cap" not in bound.stats.events and bound.stats.events["pod_not_on_node"] == 40


def test_listing_stops_at_its_own_cap_and_says_so(tmp_path: Path) -> None:
    root = tmp_path / "nccl"
    for n in range(30):
        append(debug_file(root, f"team_pod-{n:02d}"), f"NCCL pod {n}\n")
    tailer = PodLogTailer(None, root, limits=TailLimits(max_listed_entries_per_folder=10))
    assert len(all_lines(drain(tailer, 2))) == 10
    assert tailer.stats.events["folder_cap"] == 1


def test_read_bytes_count_each_byte_of_a_file_once(tmp_path: Path) -> None:
    debug = debug_file(tmp_path / "nccl", "team_pod-0")
    tailer = PodLogTailer(None, tmp_path / "nccl")
    tailer.poll()
    append(debug, "NCCL INFO " + "x" * (60 << 10))
    tailer.poll()
    for _ in range(3):
        append(debug, "y" * 100)
        tailer.poll()
    append(debug, "\n" + nccl(1) + "\n")
    lines = all_lines(drain(tailer, 2))
    assert [line[:10] for line in lines] == ["NCCL INFO ", nccl(1)[:10]] and lines[1] == nccl(1)
    assert tailer.stats.bytes_read[SOURCE_DEBUG_FILE] == debug.stat().st_size


def test_stream_keys_of_debug_folders_with_a_uid_survive_a_restart(tmp_path: Path) -> None:
    root, state = tmp_path / "nccl", tmp_path / "state"
    debug = debug_file(root, f"team_pod-0_{UID}")
    append(debug, nccl(1) + "\n")
    first = PodLogTailer(None, root, state)
    assert all_lines(drain(first, 2)) == [nccl(1)]
    assert first.save_state()
    append(debug, nccl(2) + "\n")
    second = PodLogTailer(None, root, state)
    batch = second.poll()
    key = StreamKey(SOURCE_DEBUG_FILE, "team", "pod-0", UID, "", "nccl.log")
    assert batch.replayed == {key: [nccl(1)]} and batch.lines == {key: [nccl(2)]}


def test_a_deep_and_wide_debug_folder_costs_a_bounded_listing(tmp_path: Path) -> None:
    """One pod's folder is examined within one entry budget over all its depth."""
    root = tmp_path / "nccl"
    for a in range(12):
        for b in range(12):
            append(root / f"team_wide-0_{UID}" / f"d{a:02d}" / f"e{b:02d}" / "x.log", f"NCCL {a} {b}\n")
    append(debug_file(root, "team_real-0"), nccl(1) + "\n")
    tailer = PodLogTailer(None, root, limits=TailLimits(max_entries_per_debug_folder=40))
    got = lines_by_pod(drain(tailer, 2))
    assert got[(SOURCE_DEBUG_FILE, "real-0", UID)] == [nccl(1)]
    assert len(got[(SOURCE_DEBUG_FILE, "wide-0", UID)]) < 40
    assert tailer.stats.events["folder_cap"] >= 1
    listed = sum(len(listing.entries) for _, _, listing in tailer._folders._entries.values())
    assert listed <= 40 + 2 + 40  # the pod folder's budget, the root, and one cut listing's room


def cri_hostile_lines() -> list[tuple[str, bytes]]:
    """The parser's hostile lines, and lines made of CRI framing itself, as bytes."""
    own = [
        ("timestamps with no space", "2026-03-01T" * 6000),
        ("record headers end to end", "2026-03-01T10:00:00Z stdout P:" * 2200),
        ("record headers on lines of their own", "2026-03-01T00:00:00Z\n" * 3200),
    ]
    return [(label, line.encode()) for label, line in [*hostile_lines(), *own]]


TAILER_PATTERNS = {
    "CRI_RE_BYTES": CRI_RE_BYTES,
    "PARTIAL_TAG_SEARCH": PARTIAL_TAG_SEARCH,
    "NEEDLE_SEARCH": podlogs.NEEDLE_SEARCH,
}


@pytest.mark.parametrize(("name", "pattern"), TAILER_PATTERNS.items(), ids=list(TAILER_PATTERNS))
def test_every_pattern_the_tailer_applies_to_bytes_is_linear(name: str, pattern: re.Pattern[bytes]) -> None:
    """What ``tests/nccl/test_hostile_lines.py`` asks of the text patterns (same bound)."""
    worst, worst_line = 0.0, ""
    for label, line in cri_hostile_lines():
        started = time.perf_counter()
        pattern.search(line)
        pattern.match(line)
        for _ in zip(range(64), pattern.finditer(line), strict=False):  # at most 64 matches
            pass
        took = time.perf_counter() - started
        if took > worst:
            worst, worst_line = took, label
    assert worst < PER_LINE_SECONDS, f"{name} took {worst:.2f} s on {worst_line}"


@pytest.mark.parametrize("path", ["fast", "joining"])
def test_extracting_lines_is_linear_on_hostile_lines(path: str) -> None:
    """Both paths of the tailer through a chunk, on hostile lines framed as CRI records."""
    limits = TailLimits()
    worst, worst_line = 0.0, ""
    for label, line in cri_hostile_lines():
        block = b"2026-03-01T10:00:00Z stdout " + (b"P " if path == "joining" else b"F ") + line + b"\n"
        started = time.perf_counter()
        extract_lines(block, True, CriJoiner(limits.max_line_bytes), limits, TailStats())
        took = time.perf_counter() - started
        if took > worst:
            worst, worst_line = took, label
    assert worst < PER_LINE_SECONDS, f"the {path} path took {worst:.2f} s on {worst_line}"

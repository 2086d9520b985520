"""``ccl-exporter prepare-results``: the probe-results folder made mode 1777, never through a
symlink, idempotently; and what that means for writers that are not root.

kubelet creates a ``DirectoryOrCreate`` hostPath as root with mode 0755, and pre-flight init
containers and probe Jobs run as UID 65532: without this step no pre-flight result can ever
be written. The tests of other users fork a child that drops to UID 65532 (and 65533) with
``os.setuid``: they need root, which CI has (they fail there rather than skip).
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.commands import build_parser, main
from exporter.commands.preflight import run_preflight
from exporter.commands.prepare_results import FOLDER_MODE, FolderNotPrepared, prepare_results_folder
from exporter.results.probe_file import ProbeResult, parse_result, unwritten_reason, write_result
from tests.conftest import FIXTURES, IN_CI, REPO, require_tool
from tests.fixturetree import unpack

IMAGE_UID = 65532  # the Dockerfile's USER: what pre-flight init containers and probe Jobs run as
OTHER_UID = 65533
POD_UID = "3f1e0c9a-7b2d-4e5f-8a6b-1c2d3e4f5a6b"  # metadata.uid of the pod whose pre-flight runs


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_missing_folder_is_created_with_mode_1777(tmp_path: Path) -> None:
    old_umask = os.umask(0o077)  # the mode must not depend on the umask
    try:
        prepared = prepare_results_folder(tmp_path / "probe-results")
    finally:
        os.umask(old_umask)
    assert mode(tmp_path / "probe-results") == FOLDER_MODE == 0o1777
    assert prepared.created and prepared.changed and prepared.previous_mode is None
    assert (
        prepared.describe()
        == f"{tmp_path / 'probe-results'} is ready: created with mode 1777 (owner UID {os.geteuid()})"
    )


def test_a_folder_as_kubelet_creates_it_gets_mode_1777(tmp_path: Path) -> None:
    folder = tmp_path / "probe-results"
    folder.mkdir(mode=0o755)
    (folder / "preflight-a-b.json").write_text("{}")
    prepared = prepare_results_folder(folder)
    assert mode(folder) == 0o1777
    assert not prepared.created and prepared.previous_mode == 0o755
    assert "mode 0755 changed to 1777" in prepared.describe()
    assert (folder / "preflight-a-b.json").read_text() == "{}", "what was in it stays"


def test_preparing_twice_changes_nothing_the_second_time(tmp_path: Path) -> None:
    folder = tmp_path / "probe-results"
    prepare_results_folder(folder)
    before = os.stat(folder)
    again = prepare_results_folder(folder)
    after = os.stat(folder)
    assert not again.changed and "already mode 1777, left as it is" in again.describe()
    assert after.st_ctime_ns == before.st_ctime_ns, "no chmod on a folder that is already right"
    assert (after.st_ino, mode(folder)) == (before.st_ino, 0o1777)


def test_extra_mode_bits_are_taken_off(tmp_path: Path) -> None:
    folder = tmp_path / "probe-results"
    folder.mkdir()
    os.chmod(folder, 0o3777)  # setgid on top
    assert prepare_results_folder(folder).previous_mode == 0o3777
    assert mode(folder) == 0o1777


@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-folder", "dangling"])
def test_a_symlink_in_its_place_is_refused_and_not_followed(tmp_path: Path, dangling: bool) -> None:
    target = tmp_path / "etc"
    if not dangling:
        target.mkdir(mode=0o755)
    (tmp_path / "probe-results").symlink_to(target)
    with pytest.raises(FolderNotPrepared, match=rf"is a symlink \(to {target}\); refusing to follow it"):
        prepare_results_folder(tmp_path / "probe-results")
    if dangling:
        assert not target.exists(), "nothing created at the symlink's target"
    else:
        assert mode(target) == 0o755, "the target's mode is untouched"
    assert (tmp_path / "probe-results").is_symlink()


def test_a_file_in_its_place_is_refused_and_left_alone(tmp_path: Path) -> None:
    folder = tmp_path / "probe-results"
    folder.write_text("not a folder")
    os.chmod(folder, 0o644)
    with pytest.raises(FolderNotPrepared, match="is a regular file, not a folder; refusing to touch it"):
        prepare_results_folder(folder)
    assert folder.read_text() == "not a folder" and mode(folder) == 0o644
    os.unlink(folder)
    os.mkfifo(folder)
    with pytest.raises(FolderNotPrepared, match="is a named pipe, not a folder"):
        prepare_results_folder(folder)


def test_a_folder_swapped_for_a_symlink_meanwhile_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The folder is swapped for a symlink between the look and the open: the chmod goes through
    a descriptor opened without following symlinks, so the symlink's target is never changed."""
    folder, target = tmp_path / "probe-results", tmp_path / "etc"
    folder.mkdir(mode=0o755)
    target.mkdir(mode=0o755)
    real_stat = os.stat

    def stat_then_swap(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        seen = real_stat(path, *args, **kwargs)
        if path == "probe-results" and not folder.is_symlink():
            folder.rename(tmp_path / "moved")
            folder.symlink_to(target)
        return seen

    monkeypatch.setattr(os, "stat", stat_then_swap)
    with pytest.raises(FolderNotPrepared, match="was replaced while being prepared"):
        prepare_results_folder(folder)
    monkeypatch.undo()
    assert mode(target) == 0o755 and mode(tmp_path / "moved") == 0o755


def test_a_path_without_a_parent_or_with_a_missing_parent_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FolderNotPrepared, match="names no folder below another one"):
        prepare_results_folder(Path("/"))
    with pytest.raises(FolderNotPrepared, match=r"cannot open .*/missing, the folder's parent"):
        prepare_results_folder(tmp_path / "missing" / "probe-results")


def test_the_command_says_in_one_line_what_it_did_or_why_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "probe-results"
    assert main(["prepare-results", "--path.probe-results", str(folder)]) == 0
    out, err = capsys.readouterr()
    assert (
        out == f"ccl-exporter prepare-results: {folder} is ready: created with mode 1777 (owner UID {os.geteuid()})\n"
    )
    assert err == ""
    os.rmdir(folder)
    folder.symlink_to(tmp_path)
    assert main(["prepare-results", "--path.probe-results", str(folder)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith(f"ccl-exporter prepare-results: {folder} is a symlink")
    # As the DaemonSet runs it: the reason is a WARNING and the exporter's pod starts anyway.
    assert main(["prepare-results", "--warn-only", "--path.probe-results", str(folder)]) == 0
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith(f"ccl-exporter prepare-results: WARNING: {folder} is a symlink")
    assert "the exporter starts anyway" in err and folder.is_symlink()


def test_the_folder_flag_is_the_shared_one() -> None:
    parsed = build_parser({"CCL_EXPORTER_PATH_PROBE_RESULTS": "/host/results"}).parse_args(["prepare-results"])
    assert parsed.probe_results == "/host/results"


def test_unwritten_reasons_say_what_to_do(tmp_path: Path) -> None:
    folder = tmp_path / "probe-results"
    folder.mkdir(mode=0o755)
    denied = unwritten_reason(folder, PermissionError(errno.EACCES, "Permission denied", str(folder / ".tmp-x")))
    assert f"{folder} is not writable by UID {os.geteuid()} (owner UID {os.geteuid()}, mode 0755)" in denied
    assert "prepare-results init container" in denied
    sticky = unwritten_reason(
        folder, PermissionError(errno.EPERM, "Operation not permitted", "tmp", None, str(folder / "x.json"))
    )
    assert sticky.startswith(f"x.json in {folder} belongs to another user; the folder's sticky bit")
    assert (
        unwritten_reason(folder, OSError(errno.EROFS, "Read-only file system"))
        == f"{folder} is on a read-only filesystem in this container (mount the probe-results hostPath there)"
    )
    assert unwritten_reason(folder, OSError(errno.ENOSPC, "No space left on device")).endswith(
        "No space left on device"
    )


# ---- other users, as on a node: the exporter's init container is root, the writers are not ----


def require_root(reason: str) -> None:
    """Skip with the reason unless root; CI runs as root, so there it never skips."""
    if os.geteuid() != 0:
        if IN_CI:
            pytest.fail(f"CI runs as root and must run this test: {reason}")
        pytest.skip(reason)


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder every user may traverse (pytest's own temporary folders are 0700)."""
    require_root("needs root to switch to other users with os.setuid")
    root = Path(tempfile.mkdtemp(prefix="ccl-results-folder-"))
    os.chmod(root, 0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root)


def as_user(uid: int, work: Callable[[], Any]) -> Any:
    """``work()`` in a forked child running as ``uid`` (gid too, no supplementary groups): its
    return value, or ``{"raised": ...}``. Whatever it needs must be imported here, in the parent:
    the child may not be allowed to read the interpreter's files."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            payload = json.dumps({"value": work()})
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which asserts
            payload = json.dumps({"raised": f"{type(exc).__name__}: {exc}"})
        os.write(write_end, payload.encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        data = reader.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    answer = json.loads(data)
    return answer.get("value", answer)


def preflight_as(uid: int, node: Path, results: Path) -> dict[str, Any]:
    """``ccl-exporter preflight`` of pod team-a/llama-worker-0, run as ``uid``."""
    args = build_parser({}).parse_args(
        [
            "preflight",
            "--path.sysfs",
            str(node / "sys"),
            "--path.dev",
            str(node / "dev"),
            "--path.procfs",
            str(node / "proc"),
            "--path.probe-results",
            str(results),
        ]
    )
    env = {"POD_NAMESPACE": "team-a", "POD_NAME": "llama-worker-0", "POD_UID": POD_UID, "JOB_NAME": "llama"}

    def run() -> dict[str, Any]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err):
            code = run_preflight(args, environ=env, out=out)
        return {"code": code, "summary": out.getvalue().splitlines()[-1], "stderr": err.getvalue()}

    return as_user(uid, run)  # type: ignore[no-any-return]


def test_the_image_user_cannot_write_into_a_folder_as_kubelet_creates_it(shared_tmp: Path) -> None:
    """The bug: a root 0755 folder. The pre-flight says so in one line and keeps its exit code."""
    unpack((FIXTURES / "preflight_node.txt").read_text(), shared_tmp / "node")
    results = shared_tmp / "probe-results"
    results.mkdir(mode=0o755)
    ran = preflight_as(IMAGE_UID, shared_tmp / "node", results)
    assert ran["code"] == 0 and ran["summary"] == "preflight: passed (0 of 5 checks failed)", ran
    (line,) = ran["stderr"].splitlines()
    assert line == (
        "ccl-exporter preflight: result not written, so the exporter shows no ccl_preflight_result and no "
        f"PreflightPassed/PreflightFailed for this pod: {results} is not writable by UID {IMAGE_UID} "
        "(owner UID 0, mode 0755): the exporter's DaemonSet makes it mode 1777 (its prepare-results init "
        "container; is the exporter running on this node?)"
    )
    assert list(results.iterdir()) == []
    refused = as_user(IMAGE_UID, lambda: prepare_results_folder(results).describe())
    assert "belongs to UID 0, and only its owner may change its mode" in refused["raised"], refused


def test_a_prepared_folder_takes_results_from_other_users_but_keeps_each_users_files(shared_tmp: Path) -> None:
    unpack((FIXTURES / "preflight_node.txt").read_text(), shared_tmp / "node")
    results = shared_tmp / "probe-results"
    results.mkdir(mode=0o755)  # as kubelet leaves it
    prepare_results_folder(results)  # as the exporter's init container does, as root
    scheduled = write_result(results, ProbeResult(source="scheduled", started_at=1.0, finished_at=2.0))

    ran = preflight_as(IMAGE_UID, shared_tmp / "node", results)
    assert ran["stderr"] == "" and ran["code"] == 0, ran
    written = results / f"preflight-team-a-llama-worker-0-{POD_UID}.json"
    assert (os.stat(written).st_uid, mode(written)) == (IMAGE_UID, 0o644)
    assert parse_result(written.read_text()).pod == "llama-worker-0", "the exporter (root, no capabilities) reads it"

    def attack_the_others() -> dict[str, str]:
        outcome = {}
        for name, action in (
            ("delete", lambda: os.unlink(scheduled)),
            ("replace", lambda: write_result(results, ProbeResult(source="scheduled", started_at=3, finished_at=4))),
            ("delete another pod's", lambda: os.unlink(written)),
        ):
            try:
                action()
                outcome[name] = "done"
            except OSError as exc:
                outcome[name] = unwritten_reason(results, exc) if name == "replace" else exc.strerror or ""
        return outcome

    outcome = as_user(OTHER_UID, attack_the_others)
    assert outcome["delete"] == outcome["delete another pod's"] == "Operation not permitted", outcome
    assert outcome["replace"] == (
        f"scheduled.json in {results} belongs to another user; the folder's sticky bit keeps UID {OTHER_UID} "
        "from replacing it"
    )
    assert parse_result(scheduled.read_text()).finished_at == 2.0 and written.exists()
    assert sorted(p.name for p in results.iterdir()) == [written.name, "scheduled.json"], (
        "no temporary file left behind"
    )
    # What the sticky bit cannot stop: a writer of the pre-flights' own numeric UID may replace
    # another pod's file (docs/probe.md: mount the folder only into the injected pre-flight, which
    # writes only its own pod's identity). The reader still uses it for that pod only if it names
    # that pod's UID under that pod's file name.
    same_user = as_user(IMAGE_UID, lambda: (os.unlink(written), "done")[1])
    assert same_user == "done"
    assert preflight_as(IMAGE_UID, shared_tmp / "node", results)["code"] == 0 and written.exists()
    # The exporter's init container, run again (a restarted pod): nothing changes, nothing is lost.
    assert not prepare_results_folder(results).changed and len(list(results.iterdir())) == 2


def test_root_without_capabilities_prepares_kubelets_folder_and_no_other_owners(tmp_path: Path) -> None:
    """What the init container is: UID 0 with every capability dropped (setpriv empties the
    bounding set, so the command gets no capability, as with `drop: [ALL]`). It may change the
    folder kubelet made (root's), not a folder another user owns, unless that is 1777 already."""
    require_root("needs root to own folders of other users (chown)")
    setpriv = require_tool("setpriv")

    def prepare(folder: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                setpriv,
                "--bounding-set=-all",
                "--inh-caps=-all",
                "--no-new-privs",
                sys.executable,
                "-m",
                "exporter",
                "prepare-results",
                f"--path.probe-results={folder}",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )

    kubelets, users, ready = tmp_path / "kubelets", tmp_path / "users", tmp_path / "ready"
    for folder, owner, folder_mode in ((kubelets, 0, 0o755), (users, IMAGE_UID, 0o755), (ready, IMAGE_UID, 0o1777)):
        folder.mkdir()
        os.chown(folder, owner, owner)
        os.chmod(folder, folder_mode)
    done = prepare(kubelets)
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout == f"ccl-exporter prepare-results: {kubelets} is ready: mode 0755 changed to 1777 (owner UID 0)\n"
    )
    assert mode(kubelets) == 0o1777
    refused = prepare(users)
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr == (
        f"ccl-exporter prepare-results: cannot set {users} (mode 0755) to mode 1777: it belongs to UID {IMAGE_UID}, "
        "and only its owner may change its mode (this is UID 0 without capabilities); chmod 1777 it on the node, "
        "or remove it (kubelet then creates the folder)\n"
    )
    assert mode(users) == 0o755
    accepted = prepare(ready)
    assert accepted.returncode == 0, accepted.stderr
    assert "already mode 1777, left as it is" in accepted.stdout

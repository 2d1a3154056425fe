"""Tree states an agent can leave behind that the executor's own steps once could not handle,
done for real through the routes: a session shell (root in its sandbox) makes files unreadable,
plants FIFOs and sockets, nests directories past Python's recursion limit or past PATH_MAX, then
finish, snapshot and DELETE are called over HTTP. Each state once answered 500 (no verdict, or
host disk left behind); each must now give a verdict or a clear 4xx, and leave nothing behind.
A sandbox that fails to start a step must stay no verdict (a retryable 503), never a verdict."""

from __future__ import annotations

import os
import stat
import uuid
from pathlib import Path

import pytest

from task_executor.sandbox.mounts import mount_tmpfs, unmount
from task_executor.sandbox.namespaces import Launcher
from task_executor.workspaces.fsutil import remove_tree
from task_executor.workspaces.workspace import Workspace
from tests.executor.test_file_attacks import _assert_no_host_path
from tests.executor.test_sessions_api import _exec, _start
from tests.processes import PROBE_VARIABLE, ProcessWatch, wait_until

MiB = 1024 * 1024
FIX = "sed -i 's/return a - b/return a + b/' calc/__init__.py"
SOCKET = "python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); s.bind(\"{}\")'"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs a root executor")


def _require_sandbox(executor) -> dict:
    sandbox = executor.get("/health").json()["capabilities"]["sandbox"]
    if sandbox["tool"] != "bwrap":
        pytest.skip(f"no bubblewrap sandbox here: {sandbox['missing']}")
    return sandbox


def _finish(executor, sid: str, demo_task):
    return executor.post(f"/session/{sid}/finish", json={
        "test_patch": demo_task.test_patch, "fail_to_pass": demo_task.fail_to_pass,
        "pass_to_pass": demo_task.pass_to_pass})


def _holders(executor) -> list[Path]:
    """The workspace holders, in their buckets (see ``WorkspaceFactory._holder_parent``)."""
    work = executor.settings.base_dir / "work"
    return sorted([*work.glob("ws-*"), *work.glob("holders-*/ws-*")])


# ------------------------------------------------------------------ finish: odd entries


@pytest.mark.parametrize(("odd", "new_files", "excluded"), [
    # The fixed file itself unreadable: made readable again, its recorded mode unchanged.
    ("chmod 000 calc/__init__.py && echo 'X = 1' > notes.py && chmod 000 notes.py",
     ["notes.py"], []),
    ("mkdir -p d/e && echo 'Y = 2' > d/e/y.py && chmod 000 d/e d", ["d/e/y.py"], []),
    # The tree's root: bwrap could not enter it (exit 1, before any script ran).
    ("chmod 000 .", [], []),
    ("mkfifo pipe", [], ["pipe"]),
    (SOCKET.format("sock"), [], ["sock"]),
    # All at once, the FIFO and the socket inside a directory nobody may read.
    ("mkdir -p d && mkfifo d/pipe && " + SOCKET.format("d/sock") + " && echo 'Y = 2' > d/y.py"
     " && chmod 000 d/y.py d", ["d/y.py"], ["d/pipe", "d/sock"]),
], ids=["unreadable-files", "unreadable-dirs", "unreadable-root", "fifo", "socket", "all-nested"])
def test_finish_gives_a_verdict_whatever_the_agent_left_in_its_tree(executor, demo_task, odd,
                                                                    new_files, excluded):
    """Was a hole (no verdict): `git add -A` cannot index an unreadable file or directory, a
    FIFO or a socket, and finish answered 500 internal_error, so the agent's failing session was
    never graded. Now the tree's owner makes what it can readable (u+r files, u+rwx
    directories: no u+x, so git records the modes it would have), special files are left out
    and listed, and the gold fix in the tree resolves."""
    _require_sandbox(executor)
    sid = _start(executor, demo_task)
    _exec(executor, sid, f"{FIX} && {odd}")
    answer = _finish(executor, sid, demo_task)
    assert answer.status_code == 200, answer.text
    finished = answer.json()
    result = finished["result"]
    assert result["status"] == "resolved", (result["status"], result["error"])
    assert "+    return a + b" in finished["patch"]
    assert "old mode" not in finished["patch"] and "100755" not in finished["patch"]
    for name in new_files:
        assert f"b/{name}\nnew file mode 100644" in finished["patch"], name
    assert set(excluded) <= set(result["excluded_files"])
    for name in excluded:
        assert f"b/{name}" not in finished["patch"]
    assert executor.get(f"/session/{sid}").status_code == 404
    assert executor.work_dirs() == []


def test_a_tree_git_cannot_read_after_fixing_is_a_verdict(executor, demo_task):
    """A tree git still refuses once everything is readable (here the agent's .gitattributes
    asks for an encoding its file is not in) is the agent's doing: a verdict, never no verdict.
    It was 500 internal_error."""
    _require_sandbox(executor)
    sid = _start(executor, demo_task)
    _exec(executor, sid, f"{FIX} && printf '*.py working-tree-encoding=UTF-16\\n' > "
                         ".gitattributes && printf '\\xd8\\x00' > odd.py")
    answer = _finish(executor, sid, demo_task)
    assert answer.status_code == 200, answer.text
    result = answer.json()["result"]
    assert (result["status"], result["resolved"]) == ("patch_apply_failed", False)
    assert result["error_code"] == "capture_failed"
    assert "UTF-16" in result["error"]
    _assert_no_host_path(executor, answer)
    assert executor.get(f"/session/{sid}").status_code == 404
    assert executor.work_dirs() == []


def _fail_tree_steps(monkeypatch, exit_status: int) -> None:
    """Every step on a tree (git, patch: the launches that start in their scratch directory)
    fails as bwrap does on its own setup failures, before the script runs."""
    real = Workspace.launcher

    def failing(self, deny_network, binds=(), chdir=None, group=None):  # type: ignore[no-untyped-def]
        launcher = real(self, deny_network, binds, chdir, group)
        if chdir is None:
            return launcher  # shells and test runs start as ever
        return Launcher(("/bin/sh", "-c", f"exit {exit_status}", "bwrap"), launcher.namespace)

    monkeypatch.setattr(Workspace, "launcher", failing)


@pytest.mark.parametrize("exit_status", [1, 125])
def test_a_capture_step_the_sandbox_never_started_is_no_verdict_and_keeps_the_session(
        executor, demo_task, monkeypatch, exit_status):
    """bwrap exits 1 on its own setup failures (and the wrapper 125): that is the executor's
    failure, never the agent's. Read as "git failed" it would be a verdict (reward 0) for an
    infrastructure fault; it is a retryable 503, and the session is kept for the retry."""
    _require_sandbox(executor)
    sid = _start(executor, demo_task)
    _exec(executor, sid, FIX)
    _fail_tree_steps(monkeypatch, exit_status)
    answer = _finish(executor, sid, demo_task)
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "capture_unavailable"
    assert int(answer.headers["Retry-After"]) > 0
    _assert_no_host_path(executor, answer)
    monkeypatch.undo()
    assert _exec(executor, sid, "grep -c 'a + b' calc/__init__.py")["output"] == "1\n"
    retried = _finish(executor, sid, demo_task)
    assert retried.status_code == 200, retried.text
    assert retried.json()["result"]["status"] == "resolved"


def test_a_patch_step_the_sandbox_never_started_is_no_verdict(executor, demo_task, monkeypatch):
    """Was a hole (reward 0 for the executor's fault): the grading's apply step read exit 1 as
    "the agent's patch does not apply", so a sandbox that failed to start made the gold patch
    patch_apply_failed. It is execution_error (no verdict), code sandbox_failed."""
    _require_sandbox(executor)
    _fail_tree_steps(monkeypatch, 1)
    result = executor.submit(demo_task.request("sandbox-down", demo_task.gold_patch)).json()
    assert (result["status"], result["resolved"]) == ("execution_error", None), result
    assert result["error_code"] == "sandbox_failed"


# ------------------------------------------------------------------ snapshot: deep trees


def test_a_deep_tree_snapshots_counts_against_the_quota_and_deletes(executor_factory,
                                                                    demo_task):
    """Was a hole (host disk): a directory 1,200 deep made the snapshot's size walk (Python's
    recursive rglob) raise RecursionError after the copy was made: 500, the copy kept on the
    host disk and never counted, so every snapshot name added one; DELETE then failed in
    shutil.rmtree and the holder stayed in BASE/work."""
    executor = executor_factory(disk_limit_bytes=32 * MiB, runtime_dirs=())
    sandbox = _require_sandbox(executor)
    sid = _start(executor, demo_task)
    _exec(executor, sid, "d=deep; for i in $(seq 1200); do d=$d/a; done; mkdir -p $d && "
                         "echo leaf > $d/f && head -c $((20 << 20)) /dev/urandom > blob")
    first = executor.post(f"/session/{sid}/snapshot", json={"name": "s0"})
    assert first.status_code == 200, first.text
    assert first.json()["size_bytes"] >= 20 * MiB
    [holder] = _holders(executor)
    if sandbox["limits"]["disk"]["enforced_by"] == "tmpfs":
        second = executor.post(f"/session/{sid}/snapshot", json={"name": "s1"})
        assert second.status_code == 409, second.text
        assert second.json()["error"]["code"] == "snapshot_quota_exceeded"
        assert sorted(p.name for p in (holder / "snapshots").iterdir()) == ["s0"]
    forked = executor.post(f"/session/{sid}/fork", json={"snapshot": "s0"})
    assert forked.status_code == 200, forked.text
    fork_id = forked.json()["session_id"]
    assert _exec(executor, fork_id, "cat deep" + "/a" * 1200 + "/f")["output"] == "leaf\n"
    for session in (fork_id, sid):
        closed = executor.delete(f"/session/{session}")
        assert closed.status_code == 200, closed.text
    assert executor.work_dirs() == []
    assert not holder.exists()


def test_a_tree_too_deep_to_copy_is_a_clear_409_and_leaves_nothing(executor, demo_task):
    """Deeper than PATH_MAX, `cp -a` cannot copy the tree: a clear 4xx naming why (no host
    path), the partial copy removed, the session usable and removable."""
    _require_sandbox(executor)
    sid = _start(executor, demo_task)
    # 2,200 deep in two mkdir -p of 1,100 each: a path of 4,400 characters.
    _exec(executor, sid, "d=$(printf 'a/%.0s' $(seq 1100)); mkdir deep && cd deep && "
                         "mkdir -p $d && cd $d && mkdir -p $d && cd $d && echo leaf > f")
    answer = executor.post(f"/session/{sid}/snapshot", json={"name": "s0"})
    assert answer.status_code == 409, answer.text
    assert answer.json()["error"]["code"] == "snapshot_failed"
    _assert_no_host_path(executor, answer)
    [holder] = _holders(executor)
    assert not (holder / "snapshots" / "s0").exists()
    fork = executor.post(f"/session/{sid}/fork", json={})
    assert fork.status_code == 409, fork.text
    assert fork.json()["error"]["code"] == "snapshot_failed"
    assert not any((holder / "forks").glob("*"))
    assert _exec(executor, sid, "echo alive")["output"] == "alive\n"
    assert executor.delete(f"/session/{sid}").status_code == 200
    assert executor.work_dirs() == []
    assert not holder.exists()


# ------------------------------------------------------------------ remove_tree


def test_remove_tree_never_changes_the_mode_of_what_holds_the_tree(tmp_path):
    """Was a hole (every later sandbox refused): when the tree's root itself could not be
    removed (here: a mount point), the retry chmodded os.path.dirname(root) -- the parent,
    BASE/work -- to 0700, and the sandbox uid could no longer pass through it."""
    parent = tmp_path / "work"
    parent.mkdir()
    parent.chmod(0o711)
    tree = parent / "ws-1"
    tree.mkdir()
    try:
        mount_tmpfs(tree, 1 * MiB, mode=0o755)
    except OSError as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    try:
        (tree / "sub").mkdir()
        (tree / "sub" / "f").write_text("x")
        (tree / "sub").chmod(0)
        remove_tree(tree)
        assert stat.S_IMODE(parent.stat().st_mode) == 0o711
        assert list(tree.iterdir()) == []  # everything the mount held went
    finally:
        unmount(tree)
    remove_tree(tree)
    assert not tree.exists()
    assert stat.S_IMODE(parent.stat().st_mode) == 0o711


def test_a_fork_snapshots_what_its_agent_replaced_of_the_tree_it_inherited(executor, demo_task):
    """A fork's snapshot merges its upper directory onto a copy of the layer it inherited:
    a directory it replaced by a file, a file by a directory, a directory it emptied and made
    again, one it removed -- each must come out as the fork left it, in the fork of the fork
    (a red-team found the first two answered 500: cp cannot put a file where a directory is)."""
    sid = _start(executor, demo_task)
    _exec(executor, sid, "mkdir -p gone keep was-dir remade && echo a > was-dir/f && "
                         "echo b > was-file && echo c > remade/old && echo d > gone/f")
    assert executor.post(f"/session/{sid}/snapshot", json={"name": "s"}).status_code == 200
    forked = executor.post(f"/session/{sid}/fork", json={"snapshot": "s"})
    assert forked.status_code == 200, forked.text
    fork_id = forked.json()["session_id"]
    _exec(executor, fork_id, "rm -r gone was-dir was-file remade && echo file > was-dir && "
                             "mkdir was-file && echo dir > was-file/f && mkdir remade && "
                             "echo new > remade/new")
    snapshot = executor.post(f"/session/{fork_id}/snapshot", json={"name": "t"})
    assert snapshot.status_code == 200, snapshot.text
    again = executor.post(f"/session/{fork_id}/fork", json={"snapshot": "t"})
    assert again.status_code == 200, again.text
    seen = _exec(executor, again.json()["session_id"],
                 "cat was-dir was-file/f; ls remade; ls -d gone keep 2>&1")["output"]
    assert seen.splitlines() == ["file", "dir", "new", "ls: cannot access 'gone': No such file "
                                 "or directory", "keep"], seen


def test_a_copy_error_names_no_host_path():
    from task_executor.workspaces.fsutil import _reason

    assert _reason(b"cp: cannot stat '/srv/base/work/ws-1/x': File name too long\n", 1) == (
        "File name too long")
    generic = _reason(b"cp: cannot overwrite non-directory '/srv/base/snapshots/t/./f' with "
                      b"directory '/srv/base/rw/upper/./f'\n", 1)
    assert generic == "the copy failed (exit status 1)"


# ------------------------------------------------------------------ finish: what still runs


def test_processes_left_holding_the_pids_limit_cannot_keep_finish_from_a_verdict(
        executor_factory, demo_task):
    """Was a hole (no verdict at will): the capture step started in the workspace's own pids
    cgroup, so background processes holding its limit at finish made every launch of the
    step fail, a 503 the client retried forever. The capture has a group of its own now, but
    the budget of all workspaces (here no larger than one's) is shared: finish stops the
    session's processes before capturing."""
    from tests.executor.test_sandbox_attacks import FORKS, _group_pids, pids_limited_executor

    executor = pids_limited_executor(executor_factory, all_workspaces_pids_limit=64)
    token = uuid.uuid4().hex
    sid = _start(executor, demo_task, env={PROBE_VARIABLE: token})
    _exec(executor, sid, FIX)
    with ProcessWatch(token) as watch:
        held = _exec(executor, sid, FORKS.format(count=500, hold="hold") + " >/dev/null 2>&1 &")
        assert held["exit_code"] == 0
        wait_until(lambda: _group_pids(token) >= 60)
        answer = _finish(executor, sid, demo_task)
        assert answer.status_code == 200, answer.text
        assert answer.json()["result"]["status"] == "resolved", answer.json()["result"]
        assert watch.alive() == []
    assert executor.work_dirs() == []



def _slow_tree_capture(monkeypatch, seconds: float) -> None:
    """The capture step may take ``seconds`` once started, and its script first waits longer
    than that, as git does on a tree of millions of files (the real tree: the slow tier)."""
    from task_executor.sessions import capture

    monkeypatch.setattr(capture, "CAPTURE_TIMEOUT_S", seconds)
    monkeypatch.setattr(capture, "_CAPTURE", "sleep 600\n" + capture._CAPTURE)


@pytest.mark.slow  # ~10 s (a capture that must time out) of the default suite's budget
def test_a_tree_too_large_to_capture_in_time_is_a_verdict(executor, demo_task, monkeypatch):
    """Was a hole (no verdict at will): a capture step that started and timed out was a 503,
    retried forever, and a tree of millions of empty files is the agent's to make."""
    _require_sandbox(executor)
    sid = _start(executor, demo_task)
    _exec(executor, sid, FIX)
    _slow_tree_capture(monkeypatch, 10.0)
    answer = _finish(executor, sid, demo_task)
    assert answer.status_code == 200, answer.text
    result = answer.json()["result"]
    assert (result["status"], result["resolved"]) == ("patch_apply_failed", False), result
    assert result["error_code"] == "capture_failed"
    assert "within 10 s" in result["error"]
    assert executor.work_dirs() == []


@pytest.mark.slow
def test_a_real_tree_of_many_files_past_the_capture_time_is_a_verdict(
        executor, demo_task, monkeypatch):
    """The real thing: 300,000 empty files (git takes many seconds over them) and a capture
    step allowed 3 s."""
    from task_executor.sessions import capture

    _require_sandbox(executor)
    sid = _start(executor, demo_task)
    _exec(executor, sid, f"{FIX} && mkdir many && cd many && "
                         "seq 300000 | xargs -n 5000 touch", timeout=600)
    monkeypatch.setattr(capture, "CAPTURE_TIMEOUT_S", 3.0)
    answer = _finish(executor, sid, demo_task)
    assert answer.status_code == 200, answer.text
    assert answer.json()["result"]["error_code"] == "capture_failed", answer.json()["result"]


# ------------------------------------------------------------------ finish: a full workspace

_EMPTY_FILES = """python3 - <<'PY'
import os
os.makedirs("/tmp/d", exist_ok=True)
made = 0
try:
    while True:
        if made % 5000 == 0:
            os.makedirs(f"/tmp/d/{made // 5000}", exist_ok=True)
        os.close(os.open(f"/tmp/d/{made // 5000}/{'x' * 200}{made}", os.O_CREAT | os.O_WRONLY))
        made += 1
except OSError as exc:
    print("stopped", made, exc.errno)
PY"""


def _fixed_under(executor_factory, demo_task, limit: str, enforced_by: str, **settings):
    """(an executor with ``settings``, a session on it whose tree holds the fix); skipped where
    ``limit`` is not enforced by ``enforced_by``."""
    executor = executor_factory(**settings)
    sandbox = _require_sandbox(executor)
    if sandbox["limits"][limit]["enforced_by"] != enforced_by:
        pytest.skip(f"no {limit} limit by {enforced_by} here")
    sid = _start(executor, demo_task)
    _exec(executor, sid, FIX)
    return executor, sid


def test_a_workspace_whose_memory_its_files_fill_still_gets_a_verdict(executor_factory,
                                                                      demo_task):
    """Was a hole (no verdict at will, found by the red team): empty files in /tmp cost no
    disk blocks, and their inodes are memory charged to the workspace's cgroup, which stays
    full once every process is gone; the capture step, launched in that group, was OOM-killed
    at every retry (503). It runs in a group of its own now. And an exec whose shell could not
    be started again in the full group answered 500; it answers 200 with the error now."""
    executor, sid = _fixed_under(executor_factory, demo_task, "memory", "cgroup",
                                 memory_limit_bytes=96 * MiB)
    _exec(executor, sid, _EMPTY_FILES, timeout=600)  # python, killed at the limit
    # Then a smaller writer, twice, fills what the killed ones had held.
    for _ in range(2):
        _exec(executor, sid, "mkdir -p /tmp/e; i=0; n=$(printf 'y%.0s' {1..200}); "
                             "while : > /tmp/e/$n$i; do i=$((i+1)); done", timeout=600)
    answer = _finish(executor, sid, demo_task)
    assert answer.status_code == 200, answer.text
    assert answer.json()["result"]["status"] == "resolved", answer.json()["result"]
    assert executor.work_dirs() == []


def test_a_workspace_out_of_inodes_is_a_verdict_not_a_500(executor_factory, demo_task):
    """Was a 500 at every retry (the red team): with every inode of the workspace's tmpfs used,
    the executor could not make the capture step's scratch directory. The quota now caps
    inodes too (one per 2 KiB), and a workspace full of its own files is the agent's doing."""
    executor, sid = _fixed_under(executor_factory, demo_task, "disk", "tmpfs",
                                 disk_limit_bytes=32 * MiB)
    stopped = _exec(executor, sid, _EMPTY_FILES, timeout=600)["output"].split()
    assert stopped[0] == "stopped" and stopped[2] == "28", stopped  # ENOSPC
    assert int(stopped[1]) < 32 * MiB // 2048  # the inode cap, not the kernel's millions
    answer = _finish(executor, sid, demo_task)
    assert answer.status_code == 200, answer.text
    result = answer.json()["result"]
    assert (result["status"], result["error_code"]) == ("patch_apply_failed", "capture_failed")
    assert "disk is full" in result["error"]
    _assert_no_host_path(executor, answer)
    assert executor.work_dirs() == []


def test_a_tree_too_big_for_git_within_a_workspaces_memory_is_a_verdict(executor_factory,
                                                                        demo_task):
    """A file git needs more memory than a workspace's limit to diff is the tree's doing: git
    is killed, the step's own shell says so (capture_failed), never a 503 to retry forever."""
    executor, sid = _fixed_under(executor_factory, demo_task, "memory", "cgroup",
                                 memory_limit_bytes=96 * MiB)
    _exec(executor, sid, "head -c 80M /dev/urandom > big.bin")
    answer = _finish(executor, sid, demo_task)
    assert answer.status_code == 200, answer.text
    result = answer.json()["result"]
    assert (result["status"], result["error_code"]) == ("patch_apply_failed", "capture_failed")
    assert "Killed" in result["error"], result
    assert executor.work_dirs() == []

"""Attacks on the executor's own file access, done for real: a session shell (root in its
sandbox) plants symlinks, FIFOs and swaps in its tree, then the file API is called over HTTP; a
test command replaces the reporter's file. Each attack once worked against the path-checking
implementation (realpath, then open, as root); each must now fail without touching, reading or
naming anything outside the tree, and without wedging the session."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.executor.test_sessions_api import _exec, _start

SECRET = b"HOST-SECRET-7f3a: a host file the API must never serve\n"


@pytest.fixture
def outside(shared_dir: Path) -> Path:
    """A file outside the tree that the sandboxed shell can see (and point links at)."""
    path = shared_dir / "outside.txt"
    path.write_bytes(SECRET)
    return path


def _error(answer) -> dict:
    return answer.json()["error"]


def _assert_no_host_path(executor, answer) -> None:
    text = answer.text
    for host in (str(executor.settings.base_dir), str(executor.settings.base_dir.resolve())):
        assert host not in text, text
    assert "/work/" not in text and "merged" not in text, text


def _still_usable(executor, sid: str) -> None:
    """The session answers and closes: no request thread is stuck holding it."""
    assert _exec(executor, sid, "echo alive")["output"] == "alive\n"
    assert executor.delete(f"/session/{sid}").status_code == 200
    assert executor.work_dirs() == []


def test_put_never_writes_through_a_planted_temporary_name(executor, demo_task, outside):
    # Attack 1: the old writer wrote `.<name>.dockyard-write`, then renamed it; a symlink
    # planted there was followed, as root, and the reply (403) came after the write.
    sid = _start(executor, demo_task)
    _exec(executor, sid, f"ln -s {outside} .f.dockyard-write && ln -s {outside} g && "
                         f"ln -s {outside.parent} out")
    wrote = executor.put(f"/session/{sid}/file?path=f", data=b"agent bytes")
    assert outside.read_bytes() == SECRET
    assert wrote.status_code == 200, wrote.text
    for path, code in (("g", "not_a_regular_file"), ("out/new.txt", "path_outside_workspace"),
                       ("out/outside.txt", "path_outside_workspace")):
        refused = executor.put(f"/session/{sid}/file", params={"path": path}, data=b"evil")
        assert _error(refused)["code"] == code, path
        _assert_no_host_path(executor, refused)
    assert outside.read_bytes() == SECRET
    assert sorted(p.name for p in outside.parent.iterdir()) == ["outside.txt"]
    shell = _exec(executor, sid, "cat f; echo; test -L g && test -L .f.dockyard-write && "
                                 "echo links-intact; find . -name '.dockyard-*' | wc -l")
    assert shell["output"] == "agent bytes\nlinks-intact\n0\n"
    _still_usable(executor, sid)


@pytest.mark.parametrize("swapped", ["file", "parent"])
def test_get_racing_a_symlink_swap_never_reads_outside(executor, demo_task, outside, swapped):
    # Attack 2: the old reader checked realpath, then opened the name: a swap in between read
    # the host file (4 of 400 tries).
    sid = _start(executor, demo_task)
    if swapped == "file":
        loop = (f"ln -sfn {outside} f.link && mv -Tf f.link f; "
                "cp real.txt f.new && mv -Tf f.new f")
        path = "f"
    else:
        loop = (f"rm -rf d; ln -sfn {outside.parent} d; cp -r realdir d.new; rm -f d; "
                "mv -T d.new d")
        path = "d/outside.txt"
    _exec(executor, sid, "echo inside > real.txt && mkdir realdir && cp real.txt "
                         "realdir/outside.txt && cp real.txt f && cp -r realdir d && "
                         f"(while [ ! -e stop ]; do {loop}; done) >/dev/null 2>&1 &")
    outcomes: dict[str, int] = {}
    for _ in range(400):
        read = executor.get(f"/session/{sid}/file", params={"path": path})
        assert SECRET not in read.content
        key = "inside" if read.status_code == 200 else _error(read)["code"]
        if read.status_code == 200:
            assert read.content == b"inside\n"
        else:
            _assert_no_host_path(executor, read)
        outcomes[key] = outcomes.get(key, 0) + 1
    _exec(executor, sid, "touch stop; wait")
    assert set(outcomes) <= {"inside", "not_a_regular_file", "file_not_found"}, outcomes
    assert len(outcomes) > 1, outcomes  # the swap really raced the reads
    _still_usable(executor, sid)


def test_fifos_and_devices_never_wedge_a_request_or_the_session(executor, demo_task):
    # Attack 3: a FIFO at the old temporary name or at the target blocked the request thread in
    # open() while it held the session: exec got 409 and DELETE blocked.
    sid = _start(executor, demo_task)
    made = _exec(executor, sid, "mkfifo .h.dockyard-write t && mkdir sub && mkfifo sub/p && "
                                "(mknod dev c 1 3 2>/dev/null && echo mknod || echo no-mknod)")
    wrote = executor.put(f"/session/{sid}/file?path=h", data=b"fine")
    assert wrote.status_code == 200, wrote.text
    # The shell is root in its sandbox; where a user namespace forbids mknod, FIFOs remain.
    nodes = ["t", "sub/p", *(["dev"] if made["output"] == "mknod\n" else [])]
    for path in nodes:
        read = executor.get(f"/session/{sid}/file", params={"path": path})
        assert _error(read)["code"] == "not_a_regular_file", path
        refused = executor.put(f"/session/{sid}/file", params={"path": path}, data=b"x")
        assert _error(refused)["code"] == "not_a_regular_file", path
    kinds = _exec(executor, sid, "stat -c %F t sub/p .h.dockyard-write; cat h; echo")
    assert kinds["output"] == "fifo\nfifo\nfifo\nfine\n"
    _still_usable(executor, sid)


def test_refusals_never_name_a_host_path(executor, demo_task, outside):
    # Attack 4: the 403 message echoed the mapped host path of the tree.
    sid = _start(executor, demo_task)
    workdir = _exec(executor, sid, f"ln -s {outside} link && ln -s {outside.parent} out && "
                                   "mkfifo fifo && pwd")["output"].strip()
    requests = [
        ("GET", f"{workdir}/link", "not_a_regular_file"),
        ("PUT", f"{workdir}/link", "not_a_regular_file"),
        ("PUT", f"{workdir}/out/x", "path_outside_workspace"),
        ("GET", f"{workdir}/out/outside.txt", "file_not_found"),
        ("GET", f"{workdir}/fifo", "not_a_regular_file"),
        ("GET", f"{workdir}/../etc/passwd", "path_outside_workspace"),
        # Absolute paths outside the tree are the sandbox's view (issue 25): the host root
        # is read-only there.
        ("PUT", str(outside), "path_not_writable"),
        ("PUT", "/etc/passwd", "path_not_writable"),
        ("GET", f"{workdir}/calc", "is_a_directory"),
        ("GET", "nope/../../x", "path_outside_workspace"),
    ]
    for method, path, code in requests:
        answer = executor.request(method, f"/session/{sid}/file", params={"path": path},
                                  data=b"x" if method == "PUT" else None)
        assert _error(answer)["code"] == code, (method, path)
        assert repr(path) in _error(answer)["message"], answer.text  # named as requested
        _assert_no_host_path(executor, answer)
    # The agent's absolute view of its tree still works both ways.
    assert executor.put(f"/session/{sid}/file?path={workdir}/new.txt", data=b"v").status_code == 200
    assert executor.get(f"/session/{sid}/file?path={workdir}/new.txt").content == b"v"
    assert outside.read_bytes() == SECRET
    # Read, it is what the sandboxed shell itself sees there, no more.
    seen = _exec(executor, sid, f"cat {outside}")["output"].encode()
    assert executor.get(f"/session/{sid}/file", params={"path": str(outside)}).content == seen
    _still_usable(executor, sid)


def _fake_report(demo_task) -> bytes:
    """A report claiming every required test passed, plus a marker test only it names."""
    lines = [
        {"kind": "test", "id": name, "when": when, "outcome": "passed"}
        for name in [*demo_task.fail_to_pass, *demo_task.pass_to_pass, "HOST-SECRET::marker"]
        for when in ("setup", "call", "teardown")
    ]
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


@pytest.mark.parametrize("plant", ["symlink", "fifo"])
def test_a_replaced_report_file_reads_as_no_report(shared_dir, executor, demo_task, plant):
    # The grader read `tmp/<report>` on the host after the tests ran; the test command can
    # replace it: by a symlink to a host file (a forged report claiming passes) or by a FIFO
    # (the grading thread blocked in open() forever).
    host_report = shared_dir / "forged.jsonl"
    host_report.write_bytes(_fake_report(demo_task))
    command = {
        "symlink": f'ln -sf {host_report} "$DOCKYARD_REPORT_FILE"; exit 0',
        "fifo": 'rm -f "$DOCKYARD_REPORT_FILE"; mkfifo "$DOCKYARD_REPORT_FILE"; exit 0',
    }[plant]
    body = {**demo_task.request(f"report-{plant}", ""), "test_command": command}
    answer = executor.submit(body)
    assert answer.status_code == 200, answer.text
    result = answer.json()
    # The forged passes were never read: no tests reported. The command is the task's own here,
    # so the control (no agent patch) reports none either: no verdict, never a pass.
    assert (result["status"], result["error_code"]) == ("execution_error",
                                                        "control_no_tests_reported"), result
    assert all(state == "MISSING" for state in result["tests"].values()), result["tests"]
    assert "HOST-SECRET::marker" not in json.dumps(result)
    assert executor.work_dirs() == []

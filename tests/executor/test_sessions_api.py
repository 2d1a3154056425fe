"""Session routes end to end: a real executor, real bash, real git, real pytest."""

from __future__ import annotations

import hashlib
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import FAST_PYTEST_ENV
from tests.executor.test_grading_integrity import CHEAT_CONFTEST
from tests.processes import PROBE_VARIABLE, ProcessWatch, wait_until


def _start(executor, demo_task, **extra) -> str:
    body = {"repo": demo_task.repo, "base_commit": demo_task.base_commit,
            "env": FAST_PYTEST_ENV, **extra}
    answer = executor.post("/session/start", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()["session_id"]


def _exec(executor, session_id: str, command: str, **extra) -> dict:
    answer = executor.post(f"/session/{session_id}/exec", json={"command": command, **extra})
    assert answer.status_code == 200, answer.text
    return answer.json()


def _finish(executor, session_id: str, demo_task) -> dict:
    answer = executor.post(f"/session/{session_id}/finish", json={
        "test_patch": demo_task.test_patch, "fail_to_pass": demo_task.fail_to_pass,
        "pass_to_pass": demo_task.pass_to_pass})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_shell_state_persists_between_calls(executor, demo_task):
    sid = _start(executor, demo_task)
    _exec(executor, sid, "cd calc && export GREETING=hi && COUNT=3 && f() { echo fn$1; }")
    result = _exec(executor, sid, 'echo "$PWD $GREETING $COUNT" && f 7')
    assert result["exit_code"] == 0
    assert result["output"].endswith("/calc hi 3\nfn7\n")
    state = executor.get(f"/session/{sid}").json()
    assert state["alive"] is True
    assert state["cwd"].endswith("/calc")
    assert state["commands_run"] == 2


def test_finish_with_a_fix_resolves_and_closes_the_session(executor, demo_task):
    sid = _start(executor, demo_task)
    _exec(executor, sid, "sed -i 's/return a - b/return a + b/' calc/__init__.py")
    finished = _finish(executor, sid, demo_task)
    assert finished["result"]["status"] == "resolved"
    assert "+    return a + b" in finished["patch"]
    assert executor.get(f"/session/{sid}").status_code == 404
    assert executor.post(f"/session/{sid}/exec", json={"command": "true"}).status_code == 404
    assert executor.work_dirs() == []


def test_finish_with_a_planted_conftest_is_unresolved(executor, demo_task):
    sid = _start(executor, demo_task)
    written = executor.put(f"/session/{sid}/file?path=conftest.py", data=CHEAT_CONFTEST.encode())
    assert written.status_code == 200
    _exec(executor, sid, "python -m pytest -q -p no:cacheprovider tests >/dev/null; echo $?")
    finished = _finish(executor, sid, demo_task)
    assert finished["result"]["status"] == "unresolved"
    assert "conftest.py" in finished["result"]["excluded_files"]
    assert "conftest.py" not in finished["patch"]


def test_same_patch_same_verdict_via_finish_and_submit(executor, demo_task):
    sid = _start(executor, demo_task)
    _exec(executor, sid, "printf 'def sub(a, b):\\n    return a - b\\n' > calc/extra.py && "
                         "sed -i 's/return a - b/return b + a/' calc/__init__.py && "
                         "git mv tests/__init__.py tests/init_moved.py && rm calc/__init__.py.bak"
                         " 2>/dev/null; true")
    finished = _finish(executor, sid, demo_task)
    submitted = executor.submit(demo_task.request("via-submit", finished["patch"])).json()
    assert finished["result"]["status"] == submitted["status"]
    assert finished["result"]["tests"] == submitted["tests"]
    assert "rename from tests/__init__.py" in finished["patch"]


def test_binary_and_deleted_files_are_captured(executor, demo_task):
    sid = _start(executor, demo_task)
    executor.put(f"/session/{sid}/file?path=data/blob.bin", data=bytes(range(256)))
    _exec(executor, sid, "git rm -q tests/__init__.py")
    patch = _finish(executor, sid, demo_task)["patch"]
    assert "GIT binary patch" in patch
    assert "deleted file mode" in patch


@pytest.mark.parametrize(
    "content",
    [
        b"lf\nonly\n",
        b"crlf\r\nonly\r\n",
        b"\xef\xbb\xbfbom then text\n",
        b"mixed\r\nendings\nhere\r\n",
        b"bare\rcr inside\n",
        b"not utf-8: \xff\xfe\xc3\x28\n",
        bytes(range(256)) * 4,
        b"",
    ],
    ids=["lf", "crlf", "bom", "mixed", "bare-cr", "invalid-utf8", "binary", "empty"],
)
def test_files_round_trip_byte_exact(executor, demo_task, content):
    sid = _start(executor, demo_task)
    written = executor.put(f"/session/{sid}/file?path=sub/dir/f.dat", data=content).json()
    assert written == {"size": len(content), "sha256": hashlib.sha256(content).hexdigest()}
    read = executor.get(f"/session/{sid}/file?path=sub/dir/f.dat")
    assert read.content == content
    assert read.headers["X-File-SHA256"] == hashlib.sha256(content).hexdigest()
    assert read.headers["X-File-Size"] == str(len(content))
    # The shell sees the same bytes.
    shell_digest = _exec(executor, sid, "sha256sum sub/dir/f.dat")["output"].split()[0]
    assert shell_digest == hashlib.sha256(content).hexdigest()


def test_paths_outside_the_workspace_are_refused(executor, demo_task, tmp_path):
    sid = _start(executor, demo_task)
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    _exec(executor, sid, f"ln -s {tmp_path} escape && ln -s {outside} link.txt")
    for path in ["../../../etc/passwd", "calc/../../x"]:
        read = executor.get(f"/session/{sid}/file", params={"path": path})
        assert read.status_code == 403, path
        assert read.json()["error"]["code"] == "path_outside_workspace"
        wrote = executor.put(f"/session/{sid}/file", params={"path": path}, data=b"x")
        assert wrote.status_code == 403, path
    # An absolute path outside the tree is the sandbox's own (issue 25), never the host's:
    # the host's file is not there, and a write lands in the sandbox's private /tmp.
    assert executor.get(f"/session/{sid}/file", params={"path": str(outside)}).status_code == 404
    assert executor.put(f"/session/{sid}/file", params={"path": str(outside)},
                        data=b"x").status_code == 200
    assert _exec(executor, sid, f"cat {outside}")["output"] == "x"
    refused = executor.put(f"/session/{sid}/file", params={"path": "/etc/passwd"}, data=b"x")
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "path_not_writable"
    # Symlinks are resolved inside the tree (as if it were /), so one pointing out finds nothing
    # there; a symlink as the file itself is never followed (tests/executor/test_file_attacks.py).
    codes = {
        "escape/outside.txt": ("file_not_found", "path_outside_workspace"),
        "link.txt": ("not_a_regular_file", "not_a_regular_file"),
    }
    for path, (read_code, write_code) in codes.items():
        read = executor.get(f"/session/{sid}/file", params={"path": path})
        assert read.json()["error"]["code"] == read_code, path
        wrote = executor.put(f"/session/{sid}/file", params={"path": path}, data=b"x")
        assert wrote.json()["error"]["code"] == write_code, path
    assert outside.read_text() == "secret"
    assert executor.get(f"/session/{sid}/file").json()["error"]["code"] == "missing_path"
    assert executor.get(f"/session/{sid}/file?path=nope").status_code == 404
    assert executor.get(f"/session/{sid}/file?path=calc").json()["error"]["code"] == (
        "is_a_directory")


def test_reset_restores_the_base_tree_and_a_fresh_shell(executor, demo_task):
    sid = _start(executor, demo_task)
    _exec(executor, sid, "export X=1; echo junk > calc/__init__.py; sleep 987.654 &")
    reset = executor.post(f"/session/{sid}/reset")
    assert reset.status_code == 200
    after = _exec(executor, sid, 'echo "[$X]"; grep -c "a - b" calc/__init__.py')
    assert after["output"] == "[]\n1\n"
    assert _exec(executor, sid, "pgrep -f 'sleep 987.654' || echo none")["output"] == "none\n"


def test_delete_kills_every_process_and_removes_the_tree(executor, demo_task):
    token = uuid.uuid4().hex
    sid = _start(executor, demo_task, env={**FAST_PYTEST_ENV, PROBE_VARIABLE: token})
    with ProcessWatch(token) as watch:
        _exec(executor, sid, "(trap '' TERM; sleep 1000) & setsid bash -c 'sleep 1000' & "
                             "sleep 0.3")
        wait_until(lambda: len(watch.alive()) >= 3)  # the shell and its two sleepers
        assert executor.delete(f"/session/{sid}").status_code == 200
        assert watch.alive() == []
    assert executor.delete(f"/session/{sid}").status_code == 404
    assert executor.work_dirs() == []


def test_timeout_returns_partial_output_and_the_session_stays_usable(executor, demo_task):
    sid = _start(executor, demo_task)
    result = _exec(executor, sid, "echo started; sleep 30", timeout=1)
    assert result["timed_out"] is True
    assert result["output"].startswith("started")
    assert _exec(executor, sid, "echo still here")["output"] == "still here\n"


def test_session_limits_unknown_ids_and_busy_sessions(executor_factory, demo_task):
    small = executor_factory(max_sessions=2)
    first = _start(small, demo_task)
    _start(small, demo_task)
    refused = small.post("/session/start", json={"repo": demo_task.repo,
                                                "base_commit": demo_task.base_commit})
    assert refused.status_code == 429
    assert refused.headers["Retry-After"]
    assert small.get("/session/does-not-exist").status_code == 404
    with ThreadPoolExecutor(2) as pool:
        slow = pool.submit(_exec, small, first, "sleep 2")
        time.sleep(0.5)
        busy = small.post(f"/session/{first}/exec", json={"command": "true"})
        assert busy.status_code == 409
        assert busy.json()["error"]["code"] == "session_busy"
        slow.result()


def test_idle_sessions_are_reaped(executor_factory, demo_task):
    quick = executor_factory(session_idle_timeout=1.0)
    sid = _start(quick, demo_task)
    deadline = time.monotonic() + 10
    # 409 session_busy while the reaper holds the session is still "not gone yet".
    while quick.get(f"/session/{sid}").status_code in (200, 409):
        assert time.monotonic() < deadline
        time.sleep(0.3)
    assert quick.work_dirs() == []


def test_bad_session_requests(executor, demo_task):
    assert executor.post("/session/start", json={"repo": demo_task.repo}).status_code == 422
    missing = executor.post("/session/start", json={"repo": "/no/such/repo", "base_commit": "x"})
    assert missing.json()["error"]["code"] == "unknown_repo"
    sid = _start(executor, demo_task)
    bad = executor.post(f"/session/{sid}/exec", json={"cmd": "ls"})
    assert bad.status_code == 422
    assert executor.post(f"/session/{sid}/exec", data=b"{").json()["error"]["code"] == (
        "invalid_json")


def test_a_finish_that_cannot_be_graded_is_refused_and_keeps_the_session(executor, demo_task):
    """Was a loss: a finish with nothing to grade was refused (400 no_tests) only after the
    diff was captured and the session closed, so the agent's work was gone with the answer."""
    sid = _start(executor, demo_task)
    _exec(executor, sid, "sed -i 's/return a - b/return a + b/' calc/__init__.py")
    refused = executor.post(f"/session/{sid}/finish", json={
        "test_patch": demo_task.test_patch, "fail_to_pass": [], "pass_to_pass": []})
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "no_tests"
    assert _finish(executor, sid, demo_task)["result"]["status"] == "resolved"


def test_fifty_concurrent_sessions(executor_factory, demo_task):
    many = executor_factory(threads=24, max_sessions=60)

    def rollout(index: int) -> str:
        sid = _start(many, demo_task)
        outputs = [_exec(many, sid, f"echo {index}-{turn}")["output"] for turn in range(5)]
        assert many.delete(f"/session/{sid}").status_code == 200
        return "".join(outputs)

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(rollout, range(50)))
    assert results == ["".join(f"{i}-{t}\n" for t in range(5)) for i in range(50)]
    assert many.work_dirs() == []


def test_health_counts_sessions(executor, demo_task):
    _start(executor, demo_task)
    assert executor.get("/health").json()["load"]["sessions"] == 1

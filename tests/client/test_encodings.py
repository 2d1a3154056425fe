"""Bytes that are not UTF-8 (latin-1 contents, file names) through finish, the client and
``/task/submit``: every route answers a valid body with the verdict the bytes deserve."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from sandbox_client import SandboxClient
from sandbox_client.protocol import FinishResult, TaskResult
from task_executor.demo import diff_of, init_repo, write_files
from task_executor.workspaces.gitcmd import git

from .conftest import FAST_ENV

LATIN1_SOURCE = b'# -*- coding: latin-1 -*-\nGREETING = "caf\xe9"\n'
LATIN1_FIXED = b'# -*- coding: latin-1 -*-\nGREETING = "caf\xe9 au lait"\n'
RAW_NAME = "data/caf\udce9.txt"  # the bytes data/caf\xe9.txt, as surrogateescape spells them
RAW_CONTENT = b"\xff\xfe not UTF-8\n"
HELD_OUT = (
    "import mod\n\n\n"
    "def test_latin1_source():\n"
    "    assert mod.GREETING == 'caf\\u00e9 au lait'\n\n\n"
    "def test_raw_name_and_bytes():\n"
    "    with open(b'data/caf\\xe9.txt', 'rb') as handle:\n"
    f"        assert handle.read() == {RAW_CONTENT!r}\n"
)
F2P = ["test_bytes.py::test_latin1_source", "test_bytes.py::test_raw_name_and_bytes"]


def _task(tmp_path: Path) -> dict[str, Any]:
    repo = tmp_path / "latin1-repo"
    base = init_repo(repo, {"mod.py": LATIN1_SOURCE})
    return {"repo": str(repo), "base_commit": base, "env": dict(FAST_ENV),
            "test_patch": diff_of(repo, {"test_bytes.py": HELD_OUT}), "fail_to_pass": F2P}


def _raw_diff(task: dict[str, Any], tmp_path: Path) -> bytes:
    """The fix as a trainer's own git would write it: raw latin-1 lines and a raw file name."""
    clone = tmp_path / "clone"
    git(["clone", "-q", task["repo"], str(clone)])
    write_files(clone, {"mod.py": LATIN1_FIXED, RAW_NAME: RAW_CONTENT})
    git(["add", "-A"], cwd=clone)
    return git(["-c", "core.quotePath=false", "diff", "--cached", "HEAD"], cwd=clone).stdout


def test_latin1_and_raw_names_through_finish_client_and_submit(
    executor: Any, tmp_path: Path
) -> None:
    task = _task(tmp_path)
    grading = {name: task[name] for name in ("test_patch", "fail_to_pass")}
    with SandboxClient(executor.url) as client:
        start = {name: task[name] for name in ("repo", "base_commit", "env")}
        with client.start_session(start) as session:
            session.write_file("mod.py", LATIN1_FIXED)
            session.exec("mkdir -p data $'t\\xe9st' && printf '\\xff\\xfe not UTF-8\\n' > "
                         "$'data/caf\\xe9.txt' && echo 'x = 1' > $'t\\xe9st/conftest.py'")
            done = session.finish(**grading)
        # The client parsed it (a lone surrogate would have been refused), and the verdict holds.
        assert done.result.status == "resolved", done.result.log
        assert done.result.excluded_files == ["t\\xe9st/conftest.py"]  # shown, bytes escaped
        assert "GIT binary patch" in done.patch and '"b/data/caf\\351.txt"' in done.patch
        assert FinishResult.model_validate_json(done.model_dump_json()) == done

        # The captured patch applies with git, as SWE-bench's harness applies a model_patch.
        clone = tmp_path / "check"
        git(["clone", "-q", task["repo"], str(clone)])
        (tmp_path / "captured.diff").write_text(done.patch)
        git(["apply", str(tmp_path / "captured.diff")], cwd=clone)
        assert (clone / "mod.py").read_bytes() == LATIN1_FIXED
        assert (clone / RAW_NAME).read_bytes() == RAW_CONTENT

        # ... and grades the same when submitted; so does the raw diff, which the client sends
        # as patch_base64 because no JSON string can hold it.
        raw = _raw_diff(task, tmp_path)
        assert b"caf\xe9 au lait" in raw and b"data/caf\xe9.txt" in raw
        for patch in (done.patch, raw.decode("utf-8", "surrogateescape"), raw):
            result = client.run_task({**task, "task_id": "bytes", "patch": patch})
            assert result.status == "resolved", result.log
        # The bytes decide: the same diff with them replaced does not even apply.
        lossy = raw.decode("utf-8", "replace")
        lost = client.run_task({**task, "task_id": "lossy", "patch": lossy})
        assert lost.status == "patch_apply_failed"

    body = {**task, "task_id": "wire", "patch_base64": base64.b64encode(raw).decode()}
    answer = executor.submit(body)
    assert TaskResult.model_validate_json(answer.content).status == "resolved"
    both = executor.submit({**body, "patch": done.patch})
    assert both.status_code == 422 and "not both" in both.json()["error"]["message"]
    not_base64 = executor.submit({**body, "patch_base64": "caf\u00e9!"})
    assert not_base64.status_code == 422 and "patch_base64" in not_base64.json()["error"]["message"]
    # A lone surrogate escape in a JSON string is refused whole, never half-read.
    escaped = b'{"task_id": "x", "repo": "/r", "base_commit": "b", "patch": "caf\\udce9"}'
    refused = executor.post("/task/submit", data=escaped,
                            headers={"Content-Type": "application/json"})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_json"

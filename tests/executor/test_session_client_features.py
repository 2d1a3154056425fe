"""RemoteSession's issue-25 methods against a real executor: the client side of the contract."""

from __future__ import annotations

import os
import threading

from sandbox_client import SandboxClient
from sandbox_client.protocol import FinishSpec
from tests.executor import session_fixtures
from tests.processes import wait_until

# The shared fixtures, made visible to pytest in this module.
shared_executor = session_fixtures.shared_executor
task = session_fixtures.task


def test_remote_session_features(shared_executor, task, tmp_path):
    client = SandboxClient(urls=[shared_executor.url])
    grading = FinishSpec(test_patch=task.test_patch, fail_to_pass=task.fail_to_pass,
                         pass_to_pass=task.pass_to_pass)
    with client.start_session({"repo": task.repo, "base_commit": task.base_commit}) as s:
        assert s.exec("pwd", cwd="calc", env={"A": "1"}).output.endswith("/calc\n")
        separate = s.exec("echo o; echo e >&2", stderr="separate", stateless=True)
        assert (separate.output, separate.stderr) == ("o\n", "e\n")
        assert s.exec("echo 'open").not_run == "syntax_error"
        assert s.exec("X=2", shell="two").exit_code == 0
        assert s.exec("echo ${X-unset}").output == "unset\n"
        assert s.state().shells == ["default", "two"]
        s.close_shell("two")
        answers = []
        running = threading.Thread(target=lambda: answers.append(s.exec("sleep 1000444")))
        running.start()
        wait_until(lambda: os.system("pgrep -f 'sleep 1000444' >/dev/null") == 0, timeout=30)
        assert s.interrupt() is True
        running.join(30)
        # 130 by SIGINT, 137 by the SIGKILL after the grace on a machine too loaded to run it
        assert answers[0].interrupted and answers[0].exit_code in (130, 137), answers
        assert s.interrupt() is False
        tools = tmp_path / "tools"
        (tools / "bin").mkdir(parents=True)
        (tools / "bin" / "hello").write_text("#!/bin/sh\necho hello\n")
        (tools / "bin" / "hello").chmod(0o755)
        assert s.upload(tools, "/root/tools").files == 1
        assert s.exec("/root/tools/bin/hello").output == "hello\n"
        s.write_file("/tmp/abs.txt", b"abs")
        assert s.read_file("/tmp/abs.txt") == b"abs"
        s.exec("sed -i 's/return a - b/return a + b/' calc/__init__.py && echo p > patch.txt")
        done = s.finish(grading, exclude_paths=["patch.txt"])
    assert done.result.status == "resolved" and "patch.txt" not in done.patch
    with client.start_session({"repo": task.repo, "base_commit": task.base_commit}) as s:
        submitted = s.finish(grading, patch=task.gold_patch)
    assert submitted.result.status == "resolved" and submitted.patch == task.gold_patch

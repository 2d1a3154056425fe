"""Whose failure is a patch step that failed? The agent's patch must not earn "no verdict" by
making the step fail (filling the disk before the test patch, taking the step's time), and a
sandbox that never started must not become the agent's verdict (reward 0 for nothing).

Every test grades through a real executor (waitress on loopback) with real git and real pytest.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from sandbox_client.protocol import task_is_broken
from task_executor.demo import DemoTask
from task_executor.sandbox.capabilities import detect

MiB = 1024 * 1024
CAPS = detect(Path("/var/tmp"), 64000)


def binary_file_patch(demo: DemoTask, scratch: Path, name: str, size: int) -> str:
    """A git binary patch adding ``size`` zero bytes (deflated: a few hundred KiB for 32 MiB)."""
    clone = scratch / f"clone-{size}"
    subprocess.run(["git", "clone", "-q", demo.repo, str(clone)], check=True)
    (clone / name).write_bytes(b"\0" * size)
    subprocess.run(["git", "-C", str(clone), "add", "-A"], check=True)
    return subprocess.run(["git", "-C", str(clone), "diff", "--cached", "--binary"],
                          capture_output=True, text=True, check=True).stdout


@pytest.mark.skipif(not (CAPS.sandbox and CAPS.tmpfs_quota),
                    reason="needs the sandbox's per-workspace disk quota")
def test_a_patch_that_fills_the_disk_before_the_test_patch_is_the_agents_failure(
    executor_factory: Any, demo_task: DemoTask, tmp_path: Path
) -> None:
    """The gold fix plus a file sized to leave the test patch no room: the agent's patch
    applies, the test patch cannot be written. Searched by size between "all fits" and "the
    agent's own patch does not fit"; no size may give execution_error."""
    executor = executor_factory(disk_limit_bytes=32 * MiB)
    low, high = 24 * MiB, 33 * MiB  # resolved at low; the agent's patch fails at high
    seen: list[tuple[int, str, str | None]] = []
    while high - low > 4096:
        size = (low + high) // 2 // 4096 * 4096
        patch = demo_task.gold_patch + binary_file_patch(demo_task, tmp_path, "fill.bin", size)
        result = executor.submit(demo_task.request(f"fill-{size}", patch)).json()
        seen.append((size, result["status"], result["error_code"]))
        assert result["status"] != "execution_error", seen
        if result["error_code"] == "patch_blocks_test_patch":
            assert (result["status"], result["resolved"]) == ("patch_apply_failed", False)
            assert "applies without the agent's patch" in result["error"]
            break
        if result["status"] == "resolved":
            low = size
        else:
            assert result["error_code"] == "patch_apply_failed", seen  # the agent's own
            high = size
    else:
        pytest.fail(f"no size left the test patch without room: {seen}")


def test_a_patch_too_slow_to_apply_within_the_wall_clock_is_the_agents_failure(
    executor: Any, demo_task: DemoTask
) -> None:
    """One hunk with a million lines of identical context over two million identical lines:
    git's search for where it applies is quadratic (hours), so the step meets the task's wall
    clock; that is the agent's patch not applying, not the task's fault."""
    lines, context = 2_000_000, 1_000_000
    patch = (
        "diff --git a/big.txt b/big.txt\nnew file mode 100644\n--- /dev/null\n+++ b/big.txt\n"
        f"@@ -0,0 +1,{lines} @@\n" + "+a\n" * lines
        + "diff --git a/big.txt b/big.txt\n--- a/big.txt\n+++ b/big.txt\n"
        f"@@ -2,{context + 2} +2,{context + 2} @@\n" + " a\n" * context + "-b\n+c\n a\n"
    )
    result = executor.submit({**demo_task.request("slow-apply", patch), "timeout": 5}).json()
    assert (result["status"], result["error_code"]) == ("patch_apply_failed",
                                                         "patch_apply_failed"), result
    assert "applying took longer than" in result["error"]


@pytest.mark.skipif(not CAPS.sandbox, reason="needs the bubblewrap sandbox")
def test_a_sandbox_that_cannot_start_is_no_verdict_not_the_agents_failure(
    executor: Any, demo_task: DemoTask
) -> None:
    """The sandbox uid cannot pass the work directory (what a co-tenant executor once made of
    it): bubblewrap cannot find its bind sources and exits 1, as git apply does when a patch
    does not apply. A correct patch must not be scored 0 for it."""
    work = executor.settings.base_dir / "work"
    mode = work.stat().st_mode & 0o7777
    work.chmod(0o700)
    try:
        broken = executor.submit(demo_task.request("no-sandbox", demo_task.gold_patch)).json()
    finally:
        work.chmod(mode)
    assert (broken["status"], broken["resolved"], broken["error_code"]) == (
        "execution_error", None, "sandbox_failed"), broken
    assert str(executor.settings.base_dir) not in broken["error"]  # no host path
    again = executor.submit(demo_task.request("sandbox-back", demo_task.gold_patch)).json()
    assert again["status"] == "resolved"


def test_a_test_patch_that_does_not_apply_to_base_is_the_tasks_fault(
    executor: Any, demo_task: DemoTask
) -> None:
    """The control for the disk test: a test patch that applies nowhere is the task's, with or
    without the agent's patch, and says the task is broken (no retry elsewhere helps)."""
    bad_test_patch = (
        "diff --git a/tests/test_calc.py b/tests/test_calc.py\n"
        "--- a/tests/test_calc.py\n+++ b/tests/test_calc.py\n"
        "@@ -1 +1 @@\n-a line the file does not hold\n+x = 1\n"
    )
    for patch in (demo_task.gold_patch, ""):
        result = executor.submit({**demo_task.request(f"bad-test-{bool(patch)}", patch),
                                  "test_patch": bad_test_patch}).json()
        assert (result["status"], result["error_code"]) == ("execution_error",
                                                            "test_patch_failed"), result
        assert task_is_broken(result["error_code"])

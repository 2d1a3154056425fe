"""What the pool's end-to-end tests share: starting sessions at once, and telling a process gone."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from sandbox_client import SandboxClient


def start_at_once(client: SandboxClient, spec: dict[str, Any], count: int) -> list[Any]:
    """``count`` sessions of ``spec`` started from as many threads at once; any error raises."""
    sessions: list[Any] = []
    errors: list[BaseException] = []

    def start() -> None:
        try:
            sessions.append(client.start_session(spec))
        except BaseException as exc:  # noqa: BLE001 -- re-raised below, in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return sessions


def gone(pid: int) -> bool:
    """Whether process ``pid`` no longer runs (absent, or a zombie awaiting its reaper)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except OSError:
        return True


def fix_finish_and_grade(client: SandboxClient, session: Any, demo_task: Any, image: str,
                         env: dict[str, str]) -> None:
    """The demo task's whole round on ``image``: fix it in ``session``, finish (graded
    resolved), then grade the gold patch as a task of the same image (resolved too)."""
    fix = "sed -i 's/return a - b/return a + b/' calc/__init__.py"
    assert session.exec(fix).exit_code == 0
    finished = session.finish(test_patch=demo_task.test_patch,
                              fail_to_pass=demo_task.fail_to_pass,
                              pass_to_pass=demo_task.pass_to_pass)
    assert finished.result.status == "resolved", finished.result.error
    graded = client.run_task({**demo_task.request("pooled", demo_task.gold_patch),
                              "image": image, "env": env})
    assert graded.status == "resolved"

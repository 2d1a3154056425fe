"""An executor that runs one task image: its sandboxes see the image's root, and it refuses
work meant for another image before doing any.

The image is a real unpacked root filesystem made here: a hard-linked copy of the host's /usr
(the merged-/usr symlinks beside it), an etc with what bash, git and the dynamic linker read,
and two marker files the host does not have.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from task_executor.demo import DemoTask
from tests.conftest import FAST_PYTEST_ENV, RunningExecutor
from tests.images import IMAGE_A

IMAGE = "registry.example/dockyard/task:demo"


@dataclass(frozen=True)
class ImageRoot:
    path: Path
    token: str
    """What the image's /etc/dockyard-image says (the host has no such file)."""
    local_token: str
    """What the image's /usr/local/marker says."""


@pytest.fixture(scope="module")
def image_root(task_images: tuple[Path, dict[str, str]]) -> ImageRoot:
    from sandbox_client.pool import image_root as root_of

    path = root_of(task_images[0], IMAGE_A)
    local_token = secrets.token_hex(8)
    # A file of its own, not a link: writes through the image must never reach the host's /usr.
    (path / "usr" / "local" / "marker").write_text(local_token + "\n")
    return ImageRoot(path, task_images[1][IMAGE_A], local_token)


@pytest.fixture
def image_executor(executor_factory: Callable[..., RunningExecutor],
                   image_root: ImageRoot) -> RunningExecutor:
    return executor_factory(image=IMAGE, image_root=image_root.path)


def _start(executor: RunningExecutor, demo_task: DemoTask, image: str | None) -> str:
    body: dict[str, object] = {"repo": demo_task.repo, "base_commit": demo_task.base_commit,
                               "env": FAST_PYTEST_ENV}
    if image is not None:
        body["image"] = image
    answer = executor.post("/session/start", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()["session_id"]


def _run(executor: RunningExecutor, session: str, command: str) -> str:
    answer = executor.post(f"/session/{session}/exec", json={"command": command})
    assert answer.status_code == 200, answer.text
    return answer.json()["output"]


def test_the_view_of_an_image_root_shows_its_entries_at_the_root(tmp_path: Path) -> None:
    """What every sandbox is shown (prebuilt, or entry by entry where it cannot be): the
    image's entries each at /NAME, its symlinks as they are, its private tops left out."""
    from task_executor.sandbox.hostview import host_view_argv

    root = tmp_path / "image"
    for name in ("usr", "etc", "proc", "tmp"):
        (root / name).mkdir(parents=True)
    (root / "bin").symlink_to("usr/bin")
    argv = host_view_argv(tmp_path / "base", root=root)
    assert argv[:2] == ("--tmpfs", "/")
    at = argv.index("/usr")
    assert argv[at - 2:at + 1] == ("--ro-bind-try", str(root / "usr"), "/usr")
    assert ("--symlink", "usr/bin", "/bin") == argv[2:5]
    assert "/proc" not in argv and "/tmp" not in argv
    assert not any(arg.startswith("/home") or arg == "/root" for arg in argv)  # nothing of the host


def test_health_reports_the_image_the_root_and_the_capacity(
    image_executor: RunningExecutor, executor: RunningExecutor,
) -> None:
    image = image_executor.get("/health").json()
    plain = executor.get("/health").json()
    assert image["capabilities"]["image"] == IMAGE
    assert image["capabilities"]["sandbox"]["root"] == "image"
    assert plain["capabilities"]["image"] is None
    assert plain["capabilities"]["sandbox"]["root"] == "host"
    # What a pool sizes its pods by.
    settings = image_executor.settings
    assert image["load"]["session_capacity"] == settings.max_sessions
    assert image["load"]["task_capacity"] == settings.max_tasks


def test_a_session_sees_the_image_and_a_plain_one_the_host(
    image_root: ImageRoot, image_executor: RunningExecutor, executor: RunningExecutor,
    demo_task: DemoTask,
) -> None:
    in_image = _start(image_executor, demo_task, IMAGE)
    on_host = _start(executor, demo_task, None)
    command = "cat /etc/dockyard-image /usr/local/marker; git --version"
    seen = _run(image_executor, in_image, command)
    assert image_root.token in seen and image_root.local_token in seen
    assert "git version" in seen  # the image's git, on the image's PATH
    seen = _run(executor, on_host, command)
    assert image_root.token not in seen and image_root.local_token not in seen
    assert "No such file" in seen


def test_the_images_root_home_is_writable_per_session_and_the_image_untouched(
    image_root: ImageRoot, image_executor: RunningExecutor, demo_task: DemoTask,
) -> None:
    """SWE-agent installs its tools under /root/tools in the task image."""
    first = _start(image_executor, demo_task, IMAGE)
    second = _start(image_executor, demo_task, IMAGE)
    tool = "/root/tools/bin/dockyard-tool"
    made = _run(image_executor, first, "mkdir -p /root/tools/bin && printf '#!/bin/sh\\necho "
                f"tool-ran\\n' > {tool} && chmod +x {tool} && {tool} && echo $HOME")
    assert made.split() == ["tool-ran", "/root"], made
    assert "No such file" in _run(image_executor, second, f"ls {tool}")
    assert not (image_root.path / "root/tools").exists()
    # The image's own home is there, copy-on-write (conda's activation lives in its .bashrc).
    assert "from the image" in _run(image_executor, first, "cat /root/.image-profile")
    _run(image_executor, first, "echo changed > /root/.image-profile")
    assert "from the image" in _run(image_executor, second, "cat /root/.image-profile")
    assert (image_root.path / "root/.image-profile").read_text() == "from the image\n"


def test_usr_local_is_copy_on_write_per_session(
    image_root: ImageRoot, image_executor: RunningExecutor, demo_task: DemoTask,
) -> None:
    first = _start(image_executor, demo_task, IMAGE)
    second = _start(image_executor, demo_task, IMAGE)
    written = secrets.token_hex(8)
    _run(image_executor, first, f"echo {written} > /usr/local/marker; echo {written} > "
         "/usr/local/added")
    assert written in _run(image_executor, first, "cat /usr/local/marker /usr/local/added")
    other = _run(image_executor, second, "cat /usr/local/marker; cat /usr/local/added")
    assert image_root.local_token in other and written not in other
    assert (image_root.path / "usr/local/marker").read_text() == image_root.local_token + "\n"
    assert not (image_root.path / "usr/local/added").exists()
    assert not Path("/usr/local/added").exists()


def test_a_grading_in_the_image_gives_both_verdicts(
    image_executor: RunningExecutor, demo_task: DemoTask,
) -> None:
    fixed = image_executor.submit({**demo_task.request("gold", demo_task.gold_patch),
                                   "image": IMAGE})
    assert fixed.status_code == 200, fixed.text
    assert fixed.json()["status"] == "resolved", fixed.json()
    unfixed = image_executor.submit({**demo_task.request("empty", ""), "image": IMAGE})
    assert unfixed.json()["status"] == "unresolved", unfixed.json()


def test_a_session_in_the_image_finishes_with_a_verdict(
    image_executor: RunningExecutor, demo_task: DemoTask,
) -> None:
    """finish captures the diff with the image's git and grades it in the image: the spec's
    image is the session's, never refused."""
    session = _start(image_executor, demo_task, IMAGE)
    _run(image_executor, session, "sed -i 's/return a - b/return a + b/' calc/__init__.py")
    finished = image_executor.post(f"/session/{session}/finish", json={
        "test_patch": demo_task.test_patch, "fail_to_pass": demo_task.fail_to_pass,
        "pass_to_pass": demo_task.pass_to_pass})
    assert finished.status_code == 200, finished.text
    assert finished.json()["result"]["status"] == "resolved", finished.json()
    assert "+    return a + b" in finished.json()["patch"]


def _refused_before_any_work(executor: RunningExecutor, answer_of: Callable[[], object],
                             wanted: str | None, running: str | None) -> None:
    answer = answer_of()
    assert answer.status_code == 421, answer.text  # type: ignore[attr-defined]
    error = answer.json()["error"]  # type: ignore[attr-defined]
    assert error["code"] == "image_mismatch"
    for reference in (wanted, running):
        if reference is not None:
            assert repr(reference) in error["message"]
    assert executor.work_dirs() == []
    mirrors = executor.settings.base_dir / "mirrors"
    assert not mirrors.exists() or not any(mirrors.iterdir())  # nothing was fetched


@pytest.mark.parametrize("route", ["/task/submit", "/session/start"])
def test_misdirected_work_is_refused_with_421_before_any_work(
    route: str, image_executor: RunningExecutor, executor: RunningExecutor,
    demo_task: DemoTask,
) -> None:
    def send(target: RunningExecutor, image: str | None) -> Callable[[], object]:
        body: dict[str, object] = dict(demo_task.request("t", demo_task.gold_patch))
        if route == "/session/start":
            body = {"repo": demo_task.repo, "base_commit": demo_task.base_commit}
        if image is not None:
            body["image"] = image
        return lambda: target.post(route, json=body)

    other = "registry.example/dockyard/task:other"
    _refused_before_any_work(image_executor, send(image_executor, other), other, IMAGE)
    _refused_before_any_work(image_executor, send(image_executor, None), None, IMAGE)
    _refused_before_any_work(executor, send(executor, IMAGE), IMAGE, None)


@pytest.mark.parametrize("image", ["", "a b", "tab\there", "x" * 256, "new\nline"])
def test_a_malformed_image_reference_is_a_422(executor: RunningExecutor, demo_task: DemoTask,
                                              image: str) -> None:
    answer = executor.post("/session/start", json={
        "repo": demo_task.repo, "base_commit": demo_task.base_commit, "image": image})
    assert answer.status_code == 422, answer.text
    assert "image" in answer.json()["error"]["message"]


@pytest.mark.parametrize(("flags", "named"), [
    (["--image", "x", "--image-root", "/nonexistent"], "/nonexistent does not exist"),
    (["--image", "x"], "go together"),
    (["--image-root", "/"], "go together"),
    (["--image", "x", "--image-root", "EMPTY"], "lacks bin/sh, bin/bash"),
    # bin -> /usr/bin resolves in the image, not on the host (which has a shell there).
    (["--image", "x", "--image-root", "HOST_LINK"], "lacks bin/sh, bin/bash"),
    (["--image", "a b", "--image-root", "/"], "is not an image reference"),
])
def test_serve_refuses_an_image_root_it_cannot_use(tmp_path: Path, flags: list[str],
                                                   named: str) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "host-link" / "usr" / "bin").mkdir(parents=True)
    (tmp_path / "host-link" / "bin").symlink_to("/usr/bin")
    roots = {"EMPTY": str(tmp_path / "empty"), "HOST_LINK": str(tmp_path / "host-link")}
    flags = [roots.get(flag, flag) for flag in flags]
    done = subprocess.run(
        [sys.executable, "-m", "task_executor", "serve", "--host", "127.0.0.1", "--port", "0",
         "--base-dir", str(tmp_path / "base"), *flags],
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2],
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0], done.stderr
    assert not (tmp_path / "base").exists()  # refused before anything was made

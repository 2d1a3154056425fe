"""The bearer token stays out of procfs: real ``task-executor serve`` processes, read from outside.

procfs shows a process's argv to every uid (``/proc/PID/cmdline``) and its initial environment to
its own uid (``/proc/PID/environ``), and lets a same-uid process open ``/proc/PID/mem`` or ptrace
it. The executor re-execs itself (same pid) without the token in argv or environment, and makes
itself non-dumpable, so those entries belong to root. Each test starts the executor as a real
process, as a supervisor or Kubernetes would, and looks at it the way another process could.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

import task_executor
from task_executor import hardening
from task_executor.cli import main
from task_executor.demo import make_demo_task

TOKEN = "tok-3f9a1c-do-not-leak"
NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="procfs is Linux's")
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="switching to an unprivileged uid needs root and setpriv",
)


@dataclass
class Executor:
    proc: subprocess.Popen[str]
    url: str
    stderr_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cmdline(self) -> list[str]:
        raw = Path(f"/proc/{self.pid}/cmdline").read_bytes()
        return raw.decode().split("\0")[:-1]


def start(
    base: Path,
    *extra: str,
    env: dict[str, str] | None = None,
    command: list[str] | None = None,
    user: list[str] | None = None,
) -> Executor:
    """``python -m task_executor serve`` on a free loopback port, as a real child process."""
    command = command or [sys.executable, "-m", "task_executor"]
    argv = [*(user or []), *command, "serve", "--host", "127.0.0.1", "--port", "0",
            "--base-dir", str(base), *extra]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("API_TOKEN")}
    stderr_path = base.parent / f"{base.name}.stderr"
    with open(stderr_path, "w") as stderr:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                env={**environment, **(env or {})})
    line = proc.stdout.readline()
    if "listening on http://127.0.0.1:" not in line:
        stop(proc)
        raise AssertionError(f"executor did not start: {stderr_path.read_text()}")
    return Executor(proc, line.strip().rsplit(" ", 1)[1], stderr_path)


def stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=15)
    proc.stdout.close()


@pytest.fixture
def executors() -> Iterator[list[Executor]]:
    started: list[Executor] = []
    yield started
    for executor in started:
        if executor.proc.poll() is None:
            stop(executor.proc)


def listening_inode(port: int) -> str:
    """The inode of the socket listening on 127.0.0.1:port, from /proc/net/tcp."""
    wanted = f"0100007F:{port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == wanted and fields[3] == "0A":  # 0A: LISTEN
            return fields[9]
    raise AssertionError(f"nothing listens on 127.0.0.1:{port}")


def assert_serving_pid(executor: Executor) -> None:
    """The pid we started is the one holding the listening socket: the re-exec kept the pid."""
    port = int(executor.url.rsplit(":", 1)[1])
    links = {os.readlink(f"/proc/{executor.pid}/fd/{fd}")
             for fd in os.listdir(f"/proc/{executor.pid}/fd")}
    assert f"socket:[{listening_inode(port)}]" in links
    assert Path(f"/proc/{executor.pid}/task").exists()


def assert_auth(executor: Executor) -> None:
    authed = requests.get(executor.url + "/metrics", timeout=10,
                          headers={"Authorization": f"Bearer {TOKEN}"})
    assert authed.status_code == 200
    assert requests.get(executor.url + "/metrics", timeout=10).status_code == 401
    wrong = requests.get(executor.url + "/metrics", timeout=10,
                         headers={"Authorization": "Bearer not-it"})
    assert wrong.status_code == 401


def assert_no_token_in_proc(pid: int) -> None:
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    assert TOKEN.encode() not in cmdline and b"API_TOKEN" not in cmdline
    environ = Path(f"/proc/{pid}/environ").read_bytes()
    assert TOKEN.encode() not in environ
    # By name: PYTEST_CURRENT_TEST names this test, which may hold "API_TOKEN" in its id.
    names = [entry.split(b"=", 1)[0] for entry in environ.split(b"\0")]
    assert not [name for name in names if b"API_TOKEN" in name]


def token_file(directory: Path, text: str = TOKEN + "\n", name: str = "token") -> Path:
    path = directory / name
    path.write_text(text)
    path.chmod(0o644)
    return path


# -- every way in: the token ends up in neither argv nor environment, the pid stays ------------


@linux_only
@pytest.mark.parametrize("way", ["--token", "--token=", "API_TOKEN", "--token-file",
                                 "API_TOKEN_FILE", "--token-file+API_TOKEN"])
def test_the_token_leaves_argv_and_environ_and_the_pid_stays(tmp_path, executors, way):
    base = tmp_path / "base"
    secret = token_file(tmp_path)
    flags, env = {
        "--token": (["--token", TOKEN], {}),
        "--token=": ([f"--token={TOKEN}"], {}),
        "API_TOKEN": ([], {"API_TOKEN": TOKEN}),
        "--token-file": (["--token-file", str(secret)], {}),
        "API_TOKEN_FILE": ([], {"API_TOKEN_FILE": str(secret)}),
        # The file wins (a flag beats the environment), and the unused variable goes too.
        "--token-file+API_TOKEN": (["--token-file", str(secret)], {"API_TOKEN": "from-env"}),
    }[way]
    executor = start(base, "--threads", "4", *flags, env=env)
    executors.append(executor)

    assert_no_token_in_proc(executor.pid)
    assert b"from-env" not in Path(f"/proc/{executor.pid}/environ").read_bytes()
    assert_serving_pid(executor)
    assert_auth(executor)
    # Every other flag survived exactly, in order; the hand-over (if any) is appended.
    head = [sys.executable, "-m", "task_executor", "serve", "--host", "127.0.0.1", "--port", "0",
            "--base-dir", str(base), "--threads", "4"]
    cmdline = executor.cmdline()
    assert cmdline[: len(head)] == head
    tail = cmdline[len(head):]
    if way in ("--token", "--token=", "API_TOKEN"):
        assert tail[0] == "--token-fd" and tail[1].isdigit() and len(tail) == 2
    elif way == "API_TOKEN_FILE":
        assert tail == [f"--token-file={secret}"]
    else:
        assert tail == ["--token-file", str(secret)]
    health = requests.get(executor.url + "/health", timeout=10).json()
    # --threads 4 reached the new image: one grading, one long session call, two kept.
    assert (health["load"]["task_capacity"], health["load"]["exec_capacity"]) == (1, 1)
    log = (base / "task_executor.log").read_text()
    assert "process made non-dumpable" in log
    assert TOKEN not in log


@linux_only
def test_the_console_script_and_interpreter_flags_survive_the_reexec(tmp_path, executors):
    script = Path(sys.executable).with_name("task-executor")
    if not script.exists():
        pytest.skip("the task-executor console script is not installed beside the interpreter")
    base = tmp_path / "base"
    # The console script, run by an interpreter with flags of its own (as a shebang line would).
    executor = start(base, "--token", TOKEN, command=[sys.executable, "-X", "utf8", str(script)])
    executors.append(executor)
    assert_no_token_in_proc(executor.pid)
    assert_serving_pid(executor)
    assert_auth(executor)
    cmdline = executor.cmdline()
    assert cmdline[:4] == [sys.executable, "-X", "utf8", str(script)]
    assert cmdline[4:-2] == ["serve", "--host", "127.0.0.1", "--port", "0", "--base-dir", str(base)]
    assert cmdline[-2] == "--token-fd"


# -- other uids: environ and mem closed, ptrace refused ----------------------------------------


def run_as_nobody(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*AS_NOBODY, *argv], capture_output=True, text=True, timeout=30)


OPEN_MEM = "import sys; open(f'/proc/{sys.argv[1]}/mem', 'r+b')"
# PTRACE_SEIZE (0x4206) attaches without stopping the tracee; the attach ends when we exit.
SEIZE = (
    "import ctypes, os, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]\n"
    "if libc.ptrace(0x4206, int(sys.argv[1]), None, None) != 0:\n"
    "    sys.exit(os.strerror(ctypes.get_errno()))\n"
)


def nobody_python() -> tuple[str, dict[str, str]]:
    """An interpreter that uid 65534 can run and re-exec (the venv's may sit under /root, 0700),
    with this checkout and its packages importable; skip if there is none."""
    paths = [str(Path(task_executor.__file__).resolve().parent.parent),
             sysconfig.get_paths()["purelib"]]
    env = {"PYTHONPATH": os.pathsep.join(paths)}
    probe = ("import os, sys; os.execv(sys.executable, "
             "[sys.executable, '-c', 'import flask, waitress, task_executor.cli'])")
    system_python = "/usr/bin/python{}.{}".format(*sys.version_info[:2])
    for candidate in (sys.executable, system_python):
        if not os.path.exists(candidate):
            continue
        done = subprocess.run([*AS_NOBODY, candidate, "-c", probe], capture_output=True,
                              env={**os.environ, **env}, timeout=60)
        if done.returncode == 0:
            return candidate, env
    pytest.skip("no interpreter that uid 65534 can exec with the executor's packages")


@pytest.fixture
def nobody_dir() -> Iterator[Path]:
    """A directory uid 65534 can use (pytest's tmp_path sits under a 0700 directory of root's)."""
    path = Path(tempfile.mkdtemp(prefix="dockyard-token-"))
    path.chmod(0o755)
    os.chown(path, NOBODY, NOBODY)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@linux_only
@needs_root
def test_an_unprivileged_uid_reads_neither_environ_nor_mem_of_a_root_executor(tmp_path, executors):
    executor = start(tmp_path / "base", "--token", TOKEN)
    executors.append(executor)
    pid = str(executor.pid)

    environ = run_as_nobody("cat", f"/proc/{pid}/environ")
    assert environ.returncode != 0 and "Permission denied" in environ.stderr
    mem = run_as_nobody(sys.executable, "-c", OPEN_MEM, pid)
    assert mem.returncode != 0 and "PermissionError" in mem.stderr
    seize = run_as_nobody(sys.executable, "-c", SEIZE, pid)
    assert seize.returncode != 0 and "Operation not permitted" in seize.stderr
    cmdline = run_as_nobody("cat", f"/proc/{pid}/cmdline")
    assert cmdline.returncode == 0 and "--token-fd" in cmdline.stdout  # readable, but clean
    assert TOKEN not in cmdline.stdout and "API_TOKEN" not in cmdline.stdout
    assert_auth(executor)


@linux_only
@needs_root
@pytest.mark.parametrize("way", ["--token", "--token-file"])
def test_the_same_uid_reads_neither_environ_nor_mem_nor_ptraces(nobody_dir, executors, way):
    """The executor and the prying process are both uid 65534: only non-dumpability stops it.

    A dumpable process of that uid (``sleep``) is the control: the same reads succeed on it."""
    python, env = nobody_python()
    secret = token_file(nobody_dir)
    flags = ["--token", TOKEN] if way == "--token" else ["--token-file", str(secret)]
    base = nobody_dir / "base"
    executor = start(base, *flags, env=env, command=[python, "-m", "task_executor"],
                     user=AS_NOBODY)
    executors.append(executor)
    pid = str(executor.pid)
    control = subprocess.Popen([*AS_NOBODY, "sleep", "60"])
    try:
        # Until setpriv has exec'd sleep, the control is setpriv having dropped root, which the
        # kernel makes non-dumpable too (suid_dumpable) until its execve.
        deadline = time.monotonic() + 10
        while Path(f"/proc/{control.pid}/cmdline").read_bytes() != b"sleep\x0060\x00":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        status = Path(f"/proc/{pid}/status").read_text()
        assert f"Uid:\t{NOBODY}\t" in status
        # Non-dumpable: the kernel hands the process's /proc entries to root.
        assert os.stat(f"/proc/{pid}/environ").st_uid == 0
        assert os.stat(f"/proc/{control.pid}/environ").st_uid == NOBODY

        environ = run_as_nobody("cat", f"/proc/{pid}/environ")
        assert environ.returncode != 0 and "Permission denied" in environ.stderr
        mem = run_as_nobody(python, "-c", OPEN_MEM, pid)
        assert mem.returncode != 0 and "PermissionError" in mem.stderr
        seize = run_as_nobody(python, "-c", SEIZE, pid)
        assert seize.returncode != 0 and "Operation not permitted" in seize.stderr
        cmdline = run_as_nobody("cat", f"/proc/{pid}/cmdline")
        assert cmdline.returncode == 0 and TOKEN not in cmdline.stdout
        assert "API_TOKEN" not in cmdline.stdout

        assert run_as_nobody("cat", f"/proc/{control.pid}/environ").returncode == 0
        assert run_as_nobody(python, "-c", OPEN_MEM, str(control.pid)).returncode == 0
        assert run_as_nobody(python, "-c", SEIZE, str(control.pid)).returncode == 0
    finally:
        control.kill()
        control.wait()
    assert_no_token_in_proc(executor.pid)  # read as root
    assert_serving_pid(executor)
    assert_auth(executor)


@linux_only
@needs_root
def test_code_under_test_of_the_executors_own_uid_cannot_pry_either(nobody_dir, executors):
    """The threat itself: an executor without namespaces (uid 65534 has none here: git-clone
    mode) runs a session's shell as its own uid, and the shell aims at the executor's /proc."""
    python, env = nobody_python()
    demo = make_demo_task(nobody_dir / "repo")
    for path in [nobody_dir / "repo", *(nobody_dir / "repo").rglob("*")]:
        os.lchown(path, NOBODY, NOBODY)
    executor = start(nobody_dir / "base", "--token", TOKEN, env={**env, "HOME": str(nobody_dir)},
                     command=[python, "-m", "task_executor"], user=AS_NOBODY)
    executors.append(executor)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    started = requests.post(executor.url + "/session/start", headers=headers, timeout=60,
                            json={"repo": demo.repo, "base_commit": demo.base_commit})
    assert started.status_code == 200, started.text
    session = started.json()["session_id"]
    pid = executor.pid
    command = (
        f"id -u; test -e /proc/{pid} && echo visible; "
        f"cat /proc/{pid}/environ >/dev/null; echo environ=$?; "
        f"(exec 3<>/proc/{pid}/mem) 2>/dev/null; echo mem=$?; "
        f"tr '\\0' ' ' </proc/{pid}/cmdline; echo; env | grep -c API_TOKEN"
    )
    answer = requests.post(f"{executor.url}/session/{session}/exec", headers=headers,
                           json={"command": command}, timeout=60)
    assert answer.status_code == 200, answer.text
    output = answer.json()["output"]
    assert TOKEN not in output
    lines = output.splitlines()
    if "visible" not in lines:
        pytest.skip(f"the session cannot see the executor's pid (its own pid namespace): {output}")
    assert lines[0] == str(NOBODY)  # the same uid as the executor
    assert "environ=1" in lines and "mem=1" in lines
    assert "Permission denied" in output  # cat's message: the entry is root's now
    assert "-m task_executor serve" in output and "--token-fd" in output  # cmdline: clean
    assert lines[-1] == "0"  # nor is it in the shell's environment
    requests.delete(f"{executor.url}/session/{session}", headers=headers, timeout=60)


# -- bad input: one line on stderr, exit 2, nothing served -------------------------------------


@pytest.mark.parametrize("case", ["missing", "empty", "only-newline", "two-lines", "directory",
                                  "env-missing", "token-and-file", "fd-with-token", "fd-not-open"])
def test_bad_token_input_exits_2_with_one_line(tmp_path, case):
    empty = token_file(tmp_path, "", "empty")
    newline = token_file(tmp_path, "\n", "newline")
    two_lines = token_file(tmp_path, "a\nb\n", "two-lines")
    flags, env, expected = {
        "missing": (["--token-file", str(tmp_path / "nope")], {}, "No such file or directory"),
        "empty": (["--token-file", str(empty)], {}, "is empty"),
        "only-newline": (["--token-file", str(newline)], {}, "is empty"),
        "two-lines": (["--token-file", str(two_lines)], {}, "line break"),
        "directory": (["--token-file", str(tmp_path)], {}, "Is a directory"),
        "env-missing": ([], {"API_TOKEN_FILE": str(tmp_path / "nope")}, "No such file"),
        "token-and-file": (["--token", "x", "--token-file", str(empty)], {}, "not both"),
        "fd-with-token": (["--token-fd", "0", "--token", "x"], {}, "cannot be combined"),
        "fd-not-open": (["--token-fd", "987"], {}, "not an open file descriptor"),
    }[case]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("API_TOKEN")}
    done = subprocess.run(
        [sys.executable, "-m", "task_executor", "serve", "--port", "0",
         "--base-dir", str(tmp_path / "base"), *flags],
        capture_output=True, text=True, timeout=60, env={**environment, **env},
    )
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("task-executor: ") and expected in lines[0]
    assert not (tmp_path / "base").exists()  # refused before anything was set up


def test_an_explicit_argv_reads_a_token_file_without_reexec(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("API_TOKEN", raising=False)
    monkeypatch.setenv("API_TOKEN_FILE", str(token_file(tmp_path, "")))
    assert main(["serve", "--base-dir", str(tmp_path / "base")]) == 2
    err = capsys.readouterr().err
    assert "API_TOKEN_FILE" in err and "is empty" in err


# -- the pieces ----------------------------------------------------------------------------------


def test_strip_token_flag_removes_the_token_and_nothing_else():
    strip = hardening.strip_token_flag
    assert strip(["serve", "--token", "x", "--port", "0"]) == ["serve", "--port", "0"]
    assert strip(["serve", "--token=x", "--host=h"]) == ["serve", "--host=h"]
    assert strip(["serve", "--token-file", "f", "--token=", "--threads", "4"]) == [
        "serve", "--token-file", "f", "--threads", "4"]
    assert strip(["serve", "--", "--token", "x"]) == ["serve", "--", "--token", "x"]


def test_abbreviations_of_token_are_refused_not_left_in_argv(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--tok", "x"])
    assert exit_info.value.code == 2
    assert "ambiguous option" in capsys.readouterr().err


def test_token_file_loses_exactly_one_trailing_newline(tmp_path):
    def load(text: str) -> str | None:
        path = token_file(tmp_path, text)
        return hardening.load_token(hardening.choose_source(None, str(path), None, {}))

    assert load("abc") == "abc"
    assert load("abc\n") == "abc"
    assert load("abc\r\n") == "abc"
    assert load(" abc \n") == " abc "
    with pytest.raises(hardening.TokenError, match="line break"):
        load("abc\n\n")


def test_choose_source_flags_beat_the_environment():
    env = {"API_TOKEN": "e", "API_TOKEN_FILE": "/f"}
    assert hardening.choose_source("v", None, None, env) == hardening.TokenSource(
        "value", "--token", value="v")
    assert hardening.choose_source(None, "/g", None, env).path == "/g"
    with pytest.raises(hardening.TokenError, match="not both"):
        hardening.choose_source(None, None, None, env)
    assert hardening.choose_source(None, None, None, {"API_TOKEN": ""}) is None
    assert hardening.choose_source(None, None, None, {}) is None


def test_no_reexec_loop():
    """An image with --token-fd never re-execs; the image it would exec holds no token source."""
    assert not hardening.needs_reexec(None, 5, {"API_TOKEN": "x"})
    assert hardening.needs_reexec("x", None, {})
    assert hardening.needs_reexec(None, None, {"API_TOKEN_FILE": "/f"})
    new_env = hardening.scrubbed_environ({"API_TOKEN": "x", "API_TOKEN_FILE": "/f", "A": "1"})
    source = hardening.TokenSource("value", "--token", value="x")
    new_args = hardening.reexec_argv(["serve", "--token", "x"], source, 7)
    assert new_args == ["serve", "--token-fd", "7"]
    assert new_env == {"A": "1"}
    assert not hardening.needs_reexec(None, 7, new_env)


def test_the_handover_pipe_is_read_and_closed():
    read_end, write_end = os.pipe()
    os.set_inheritable(read_end, True)
    os.write(write_end, TOKEN.encode())
    os.close(write_end)
    token = hardening.load_token(hardening.TokenSource("fd", "--token-fd", fd=read_end))
    assert token == TOKEN
    with pytest.raises(OSError):
        os.fstat(read_end)


def test_an_emptied_handover_pipe_refuses_to_start():
    """A pipe someone else drained must not mean "no token": that would serve without auth."""
    read_end, write_end = os.pipe()
    os.close(write_end)
    with pytest.raises(hardening.TokenError, match="empty"):
        hardening.load_token(hardening.TokenSource("fd", "--token-fd", fd=read_end))

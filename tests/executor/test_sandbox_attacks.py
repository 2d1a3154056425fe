"""The hostile agent against the sandbox: every attack that worked on the old launcher, for real.

Each attack runs through the real routes of a real executor: from a session shell
(``POST /session/<id>/exec``) and, where it makes sense, from a single-shot ``POST /task/submit``
whose agent patch puts the attack in module code the held-out tests import (run with ``-s``, so
what the attack saw reaches the log). The attack scripts print ``ESCAPED: ...`` for anything
that worked and ``ATTACK-DONE`` at their end; a test asserts the script ran to its end, that
nothing escaped, and that nothing of the attack survives the task (processes, files on the host,
later verdicts).
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from task_executor.demo import BASE_FILES, diff_of
from tests.conftest import FAST_PYTEST_ENV, RunningExecutor
from tests.executor.test_grading_integrity import CHEAT_CONFTEST
from tests.processes import PROBE_VARIABLE, ProcessWatch, alive, pids_carrying, wait_until

MiB = 1024 * 1024
VERBOSE_TESTS = "python -m pytest -p no:cacheprovider -s tests/test_calc.py"
"""The held-out tests with -s: what the attack in the imported module prints reaches the log."""

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs a root executor")


# ---------------------------------------------------------------------------------- helpers


def _require_sandbox(executor: RunningExecutor) -> dict:
    sandbox = executor.get("/health").json()["capabilities"]["sandbox"]
    if sandbox["tool"] != "bwrap":
        pytest.skip(f"no bubblewrap sandbox here: {sandbox['missing']}")
    return sandbox


def _start(executor: RunningExecutor, demo_task, **extra) -> str:
    env = {**FAST_PYTEST_ENV, **extra.pop("env", {})}
    body = {"repo": demo_task.repo, "base_commit": demo_task.base_commit, "env": env, **extra}
    answer = executor.post("/session/start", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()["session_id"]


def _exec(executor: RunningExecutor, session_id: str, command: str, timeout: float = 120) -> dict:
    answer = executor.post(f"/session/{session_id}/exec",
                           json={"command": command, "timeout": timeout})
    assert answer.status_code == 200, answer.text
    return answer.json()


def _finish(executor: RunningExecutor, session_id: str, demo_task) -> dict:
    answer = executor.post(f"/session/{session_id}/finish", json={
        "test_patch": demo_task.test_patch, "fail_to_pass": demo_task.fail_to_pass,
        "pass_to_pass": demo_task.pass_to_pass})
    assert answer.status_code == 200, answer.text
    return answer.json()


def _script(template: str, **values: object) -> str:
    """An attack script with its ``@NAME@`` placeholders filled in."""
    for name, value in values.items():
        template = template.replace(f"@{name.upper()}@", str(value))
    assert not re.search(r"@[A-Z_]+@", template), template
    return template


def _clean(output: str) -> str:
    """What an attack script printed: it ran to its end, and nothing escaped."""
    assert "ATTACK-DONE" in output, output[-3000:]
    escaped = [line for line in output.splitlines() if line.startswith("ESCAPED")]
    assert escaped == [], output[-3000:]
    return output


def _in_session(executor: RunningExecutor, session_id: str, script: str) -> str:
    return _clean(_exec(executor, session_id, script, timeout=300)["output"])


def _attack_patch(demo_task, script: str) -> str:
    """An agent patch whose module code (imported by the held-out tests) runs ``script``."""
    prelude = (
        "import subprocess as _dy_sp\n"
        f"_dy_out = _dy_sp.run(['bash', '-c', {script!r}], stdout=_dy_sp.PIPE,\n"
        "                      stderr=_dy_sp.STDOUT, timeout=300).stdout\n"
        "print('<<<ATTACK\\n' + _dy_out.decode('utf-8', 'replace') + 'ATTACK>>>', flush=True)\n"
        "del _dy_sp, _dy_out\n"
    )
    source = BASE_FILES["calc/__init__.py"]
    return diff_of(Path(demo_task.repo), {"calc/__init__.py": prelude + source})


def _submitted(executor: RunningExecutor, demo_task, task_id: str, script: str,
               **extra) -> tuple[dict, str]:
    """Grade an attack patch single-shot: (TaskResult, what the attack printed)."""
    body = {**demo_task.request(task_id, _attack_patch(demo_task, script)),
            "test_command": VERBOSE_TESTS, **extra}
    answer = executor.submit(body)
    assert answer.status_code == 200, answer.text
    result = answer.json()
    found = re.search(r"<<<ATTACK\n(.*?)ATTACK>>>", result["log"], re.S)
    assert found, result["log"][-3000:]
    return result, _clean(found.group(1))


def _empty_patch_is_unresolved(executor: RunningExecutor, demo_task) -> None:
    """The canonical verdict of doing nothing: no attack may have changed it."""
    result = executor.submit(demo_task.request(f"empty-{uuid.uuid4().hex[:8]}", "")).json()
    assert result["status"] == "unresolved", result["log"][-3000:]
    assert result["tests"]["tests/test_calc.py::test_add"] == "FAILED"
    assert result["tests"]["tests/test_calc.py::test_mul"] == "PASSED"


def _cmdline_pids(fragment: bytes) -> list[int]:
    """Host pids of live processes whose command line holds ``fragment`` (found even when they
    scrubbed their environment)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        if fragment in cmdline and alive(int(name)):
            found.append(int(name))
    return found


def _du(path: Path) -> int:
    """Bytes under ``path`` on its own filesystem (the workspaces' tmpfs quotas not counted)."""
    proc = subprocess.run(["du", "-sxb", str(path)], capture_output=True, text=True, check=False)
    return int(proc.stdout.split()[0])


def _executor_interpreter_paths() -> list[str]:
    import task_executor

    package_root = Path(task_executor.__file__).resolve().parent.parent
    return sorted({sys.prefix, str(package_root)})


@pytest.fixture
def outside_tmp_base() -> Iterator[Path]:
    """A base directory outside /tmp (which every sandbox replaces by its own anyway), so that
    hiding it is the launcher's doing. Request it *before* ``executor_factory``: it is torn down
    after the executors are stopped (their mounts go, then the directory)."""
    from task_executor.service.lifecycle import unmount_under

    parent = Path("/var/cache") if Path("/var/cache").is_dir() else Path("/var/tmp")
    holder = parent / f"dockyard-attack-{uuid.uuid4().hex[:12]}"
    holder.mkdir(mode=0o711)
    yield holder / "base"
    unmount_under(holder)
    shutil.rmtree(holder, ignore_errors=True)


@contextlib.contextmanager
def loopback_listeners() -> Iterator[dict]:
    """A TCP listener on 127.0.0.1 and an abstract unix socket on the host, counting every
    connection they accept."""
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(16)
    abstract = f"dockyard-attack-{uuid.uuid4().hex}"
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind("\0" + abstract)
    unix.listen(16)
    state = {"port": tcp.getsockname()[1], "abstract": abstract, "accepted": 0}
    stop = threading.Event()

    def accept(listener: socket.socket) -> None:
        listener.settimeout(0.05)
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except (TimeoutError, OSError):
                continue
            state["accepted"] += 1
            connection.close()

    threads = [threading.Thread(target=accept, args=(s,), daemon=True) for s in (tcp, unix)]
    for thread in threads:
        thread.start()
    try:
        yield state
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        tcp.close()
        unix.close()


# ---------------------------------------------------------------------------------- scripts

_PROBE = r"""
probe() { if "$@" >/dev/null 2>&1; then echo "ESCAPED: $*"; fi; }
# The attacker learns the host's base directory from the sandbox's pid 1 (bwrap's argv).
HOLDER='/work/\(holders-[0-9a-f]*/\)\?ws-[0-9a-f]*'
LEARNED=$(tr '\0' '\n' < /proc/1/cmdline | grep -o "^/.*$HOLDER" | head -n1 | sed "s#$HOLDER\$##")
"""

UNMOUNT_AND_READ_BASE = _PROBE + r"""
BASE='@BASE@'
for point in "$BASE" "$LEARNED" /testbed /tmp /usr/local /opt /run/dockyard/reporter /; do
    [ -n "$point" ] || continue
    probe umount "$point"; probe umount -l "$point"; probe umount -f "$point"
done
for base in "$BASE" "$LEARNED" "/proc/1/root$BASE" "/testbed/../..$BASE"; do
    [ -n "$base" ] || continue
    probe cat "$base/canary"
    probe cat "$base/task_executor.log"
    for d in "$base" "$base/work" "$base/templates" "$base/mirrors" "$base/runtime"; do
        [ -n "$(ls -A "$d" 2>/dev/null)" ] && echo "ESCAPED: listed $d"
    done
done
env | grep -qF -- "$BASE" && echo "ESCAPED: the environment names the base dir"
case "$DOCKYARD_EXECUTOR" in
    */*|'') echo "ESCAPED: DOCKYARD_EXECUTOR is '$DOCKYARD_EXECUTOR'";;
esac
[ -n "$LEARNED" ] && env | grep -qF -- "$LEARNED" && echo "ESCAPED: the environment names it"
ls /testbed/calc/__init__.py >/dev/null || echo "ESCAPED: the tree is gone"
echo ATTACK-DONE
"""

POISON_TEMPLATES = _PROBE + r"""
BASE='@BASE@'
CHEAT=$(printf '%s' '@CHEAT_B64@' | base64 -d)
plant() {
    for t in "$@"; do printf '%s\n' "$CHEAT" > "$t" 2>/dev/null && echo "ESCAPED: wrote $t"; done
}
for point in /testbed "$BASE" "$LEARNED" /; do
    [ -n "$point" ] || continue
    probe umount "$point"; probe umount -l "$point"
done
plant /conftest.py /testbed/../conftest.py /testbed/../../conftest.py /proc/1/root/conftest.py
for base in "$BASE" "$LEARNED" "/proc/1/root$BASE"; do
    [ -n "$base" ] || continue
    plant "$base/conftest.py" "$base/templates/conftest.py" "$base/work/conftest.py"
    for tree in "$base"/templates/*/tree "$base"/templates/* "$base"/work/*/merged; do
        plant "$tree/conftest.py" "$tree/tests/conftest.py"
    done
done
for root in /proc/[0-9]*/root; do
    plant "$root/conftest.py" "$root$BASE/templates/conftest.py"
done
echo ATTACK-DONE
"""

PLANT_OUTSIDE_THE_TREE = r"""
for target in /tmp/planted.py "$HOME/planted.py" /dev/shm/planted /usr/local/planted \
        /usr/local/lib/python3.11/dist-packages/zz_planted.pth /opt/planted \
        /testbed/../planted /etc/planted /var/tmp/planted /run/planted; do
    printf 'import os\n' > "$target" 2>/dev/null
done
mkdir -p /tmp/deep/er && printf 'x\n' > /tmp/deep/er/file
echo ATTACK-DONE
"""

TOKEN_AND_PROCESSES = r"""
python3 - <<'PY'
import os
token = bytes.fromhex('@TOKEN_HEX@')
pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
orphans = []
for pid in pids:
    for name in ('cmdline', 'environ'):
        try:
            with open(f'/proc/{pid}/{name}', 'rb') as handle:
                data = handle.read()
        except OSError:
            continue
        if token in data:
            print(f'ESCAPED: the token is in /proc/{pid}/{name}')
    try:
        with open(f'/proc/{pid}/status') as handle:
            status = dict(line.split(':', 1) for line in handle if ':' in line)
    except OSError:
        continue
    if int(status['PPid']) == 0:
        orphans.append(pid)
# A host process seen from here would have no parent in this PID namespace, like its init.
if orphans != [1]:
    print('ESCAPED: processes from outside the sandbox:', orphans)
with open('/proc/1/comm') as handle:
    print('PID1', handle.read().strip())
print('PROCESSES', len(pids))
PY
echo ATTACK-DONE
"""

NETWORK = _PROBE + r"""
probe nsenter -t 1 -n true
probe nsenter -t 1 -n -m true
for port in @LISTENER_PORT@ @EXECUTOR_PORT@; do
    timeout 20 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port" 2>/dev/null \
        && echo "ESCAPED: connected to 127.0.0.1:$port"
done
python3 - <<'PY'
import socket
targets = ((socket.AF_UNIX, '\0@ABSTRACT@'), (socket.AF_INET, ('127.0.0.1', @LISTENER_PORT@)))
for family, address in targets:
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(20)
    try:
        s.connect(address)
        print('ESCAPED: connected to', address)
    except OSError:
        pass
    finally:
        s.close()
with open('/proc/net/route') as handle:
    routes = handle.read().splitlines()[1:]
if routes:
    print('ESCAPED: routes out:', routes)
PY
echo ATTACK-DONE
"""

NAMESPACE_ESCAPES = _PROBE + r"""
probe nsenter -t 1 -m true
probe nsenter -t 1 -n true
probe nsenter -t 1 -p true
probe nsenter -t 1 -a true
probe chroot /proc/1/root true
probe mount --bind / /mnt
probe mount -t tmpfs none /mnt
probe mount -o remount,rw /
probe mount -o remount,rw /usr
probe unshare -U true
probe unshare -Ur true
probe unshare -Urm true
probe unshare -m true
probe unshare -n true
probe unshare -pf true
probe python3 -c 'import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True)
sys.exit(0 if libc.unshare(0x10000000) == 0 else 1)'
probe python3 -c 'import os, sys; fd = os.open("/proc/1/ns/mnt", os.O_RDONLY)
sys.exit(0 if os.setns(fd, 0) is None else 1)'
probe sh -c 'echo $$ > /sys/fs/cgroup/pids/cgroup.procs'
probe sh -c 'echo $$ > /sys/fs/cgroup/cgroup.procs'
probe sh -c 'echo x > /proc/sys/kernel/hostname'
grep -q '^CapEff:[[:space:]]*0*$' /proc/self/status \
    || echo "ESCAPED: capabilities $(grep CapEff /proc/self/status)"
echo ATTACK-DONE
"""

HOST_READ_ONLY = _PROBE + r"""
probe touch /usr/bin/x
probe touch /etc/x
probe touch /bin/x
probe touch /var/lib/x
for site in /usr/lib/python3*/ /usr/lib/python3/dist-packages/; do
    probe touch "$site/zz_planted.py"
done
mkdir -p /usr/local/bin
printf '#!/bin/sh\necho HACKED-GIT\n' > /usr/local/bin/git && chmod +x /usr/local/bin/git
printf 'import sys; sys.stderr.write("HACKED-PTH")\n' \
    > /usr/local/lib/python3.11/dist-packages/zz_planted.pth 2>/dev/null
echo "GIT-NOW: $(git --version)"
echo ATTACK-DONE
"""


# ---------------------------------------------------------------------------------- 1


@pytest.mark.parametrize("where", ["under-tmp", "outside-tmp"])
def test_unmounting_does_not_reveal_the_base_dir(outside_tmp_base, executor_factory, demo_task,
                                                 where):
    base = outside_tmp_base if where == "outside-tmp" else None
    executor = executor_factory(**({"base_dir": base} if base else {}))
    _require_sandbox(executor)
    base_dir = executor.settings.base_dir.resolve()
    secret = uuid.uuid4().hex
    (base_dir / "canary").write_text(secret)
    script = _script(UNMOUNT_AND_READ_BASE, base=base_dir)

    token = uuid.uuid4().hex
    sid = _start(executor, demo_task, env={PROBE_VARIABLE: token})
    with ProcessWatch(token) as watch:
        output = _in_session(executor, sid, script)
        assert secret not in output
        # The shell's own environment, read from the host: no path of the executor in it.
        shells = watch.alive()
        assert shells
        for pid in shells:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            executor_vars = [v for v in environ if v.startswith(b"DOCKYARD_EXECUTOR=")]
            assert executor_vars and b"/" not in executor_vars[0]
        for templates in (base_dir / "templates").iterdir():
            assert (templates / "tree" / "calc" / "__init__.py").is_file()  # still mounted/there
        assert executor.delete(f"/session/{sid}").status_code == 200
        assert watch.alive() == []

    result, output = _submitted(executor, demo_task, "unmount", script)
    assert secret not in output
    assert result["status"] == "unresolved"
    assert (base_dir / "canary").read_text() == secret
    assert executor.work_dirs() == []
    _empty_patch_is_unresolved(executor, demo_task)


def test_the_sandbox_init_does_not_name_the_base_dir(executor, demo_task):
    # pid 1 is bwrap, readable by all inside: its options (every bind source) come on fd 3 from
    # a root-only file (bwrap --args), and the wrapper drops the host's PWD before it starts.
    _require_sandbox(executor)
    base_dir = str(executor.settings.base_dir.resolve())
    sid = _start(executor, demo_task)
    shown = _exec(executor, sid, "tr '\\0' '\\n' < /proc/1/cmdline; "
                                 "tr '\\0' '\\n' < /proc/1/environ; echo ATTACK-DONE")["output"]
    assert "ATTACK-DONE" in shown
    assert base_dir not in shown


# ---------------------------------------------------------------------------------- 2


def _templates_are_clean(executor: RunningExecutor, demo_task) -> None:
    base_dir = executor.settings.base_dir
    # Not in work/ (live trees), view/ or runtime/ (the host's own directories, read-only: an
    # /opt holding a venv with a package's conftest.py is no plant).
    planted = [p for top in base_dir.iterdir() if top.name not in ("work", "view", "runtime")
               for p in ([top] if top.name == "conftest.py" else top.rglob("conftest.py"))]
    assert planted == []
    for tree in (base_dir / "templates").glob("*/tree"):
        assert (tree / "calc" / "__init__.py").read_text() == BASE_FILES["calc/__init__.py"]


def test_one_submission_cannot_poison_the_template(executor, demo_task):
    _require_sandbox(executor)
    _empty_patch_is_unresolved(executor, demo_task)  # the template exists before the attack
    cheat = base64.b64encode(CHEAT_CONFTEST.encode()).decode()
    script = _script(POISON_TEMPLATES, base=executor.settings.base_dir.resolve(), cheat_b64=cheat)
    result, _ = _submitted(executor, demo_task, "poisoner", script)
    assert result["status"] == "unresolved", result["log"][-3000:]
    _templates_are_clean(executor, demo_task)
    _empty_patch_is_unresolved(executor, demo_task)


def test_one_session_cannot_poison_the_template(executor, demo_task):
    _require_sandbox(executor)
    cheat = base64.b64encode(CHEAT_CONFTEST.encode()).decode()
    script = _script(POISON_TEMPLATES, base=executor.settings.base_dir.resolve(), cheat_b64=cheat)
    sid = _start(executor, demo_task)
    _in_session(executor, sid, script)
    finished = _finish(executor, sid, demo_task)
    assert finished["patch"] == ""
    assert finished["result"]["status"] == "unresolved"
    _templates_are_clean(executor, demo_task)
    _empty_patch_is_unresolved(executor, demo_task)
    second = _start(executor, demo_task)  # a later session of the same repo starts clean too
    assert _exec(executor, second, "ls -A / /testbed | grep -c conftest || true")["output"] == "0\n"


def test_files_planted_outside_the_tree_do_not_break_a_finish(executor, demo_task):
    _require_sandbox(executor)
    sid = _start(executor, demo_task)
    _in_session(executor, sid, PLANT_OUTSIDE_THE_TREE)
    finished = _finish(executor, sid, demo_task)
    assert finished["patch"] == ""
    assert finished["result"]["status"] == "unresolved"

    sid = _start(executor, demo_task)
    _in_session(executor, sid, PLANT_OUTSIDE_THE_TREE)
    _exec(executor, sid, "sed -i 's/return a - b/return a + b/' calc/__init__.py")
    finished = _finish(executor, sid, demo_task)
    assert finished["result"]["status"] == "resolved", finished["result"]["error"]
    assert re.findall(r"^diff --git a/(\S+)", finished["patch"], re.M) == ["calc/__init__.py"]
    assert executor.work_dirs() == []


# ---------------------------------------------------------------------------------- 3


def test_the_token_and_the_host_processes_are_out_of_sight(executor_factory, demo_task):
    token = f"tok-{uuid.uuid4().hex}"
    executor = executor_factory(token=token)
    _require_sandbox(executor)
    script = _script(TOKEN_AND_PROCESSES, token_hex=token.encode().hex())
    sid = _start(executor, demo_task)
    output = _in_session(executor, sid, script)
    assert "PID1 bwrap" in output
    assert int(re.search(r"PROCESSES (\d+)", output).group(1)) <= 6  # bwrap, bash, its tools
    ps = _exec(executor, sid, "ps -eo pid=,comm=")["output"].split()
    assert ps[:2] == ["1", "bwrap"]
    _, output = _submitted(executor, demo_task, "token", script)
    assert "PID1 bwrap" in output


# ---------------------------------------------------------------------------------- 4


def test_no_way_out_when_egress_is_denied(executor, demo_task):
    sandbox = _require_sandbox(executor)
    if not executor.get("/health").json()["capabilities"]["egress_guard"]:
        pytest.skip("no network namespaces here")
    assert sandbox["tool"] == "bwrap"
    executor_port = int(executor.url.rsplit(":", 1)[1])
    with loopback_listeners() as listeners:
        script = _script(NETWORK, listener_port=listeners["port"], executor_port=executor_port,
                         abstract=listeners["abstract"])
        sid = _start(executor, demo_task, deny_network=True)
        _in_session(executor, sid, script)
        result, _ = _submitted(executor, demo_task, "egress", script, deny_network=True)
        assert result["status"] == "unresolved"
        assert listeners["accepted"] == 0
        # Control: the same listeners take a connection from the host.
        with socket.create_connection(("127.0.0.1", listeners["port"]), timeout=10):
            pass
        wait_until(lambda: listeners["accepted"] == 1, timeout=30)


# ---------------------------------------------------------------------------------- 5


def test_namespace_escapes_are_refused_and_kill_all_stays_inside(executor, demo_task):
    _require_sandbox(executor)
    victim_token = uuid.uuid4().hex
    victim = _start(executor, demo_task, env={PROBE_VARIABLE: victim_token})
    _exec(executor, victim, "sleep 1000.31 >/dev/null 2>&1 &")
    attacker = _start(executor, demo_task)
    _in_session(executor, attacker, NAMESPACE_ESCAPES)
    _submitted(executor, demo_task, "namespaces", NAMESPACE_ESCAPES)

    with ProcessWatch(victim_token) as watch:
        wait_until(lambda: len(watch.alive()) >= 2)  # the victim's shell and its sleeper
        before = set(watch.alive())
        executor.post(f"/session/{attacker}/exec",
                      json={"command": "kill -9 -1; kill -9 1; /bin/kill -9 -1", "timeout": 60})
        assert executor.get("/health").json()["status"] == "ok"
        assert _exec(executor, victim, "echo victim-alive; jobs -r | wc -l")["output"] == (
            "victim-alive\n1\n")
        assert before <= set(watch.alive())
    # The attacker's own session is recovered, not broken.
    assert _exec(executor, attacker, "echo attacker-back")["output"] == "attacker-back\n"
    # The same from a test run: it kills its own run (pytest included), nothing else.
    patch = _attack_patch(demo_task, "kill -9 -1; /bin/kill -9 -1")
    result = executor.submit(demo_task.request("kill-all", patch)).json()
    assert result["status"] != "resolved"
    assert executor.get("/health").json()["status"] == "ok"
    assert _exec(executor, victim, "echo still; jobs -r | wc -l")["output"] == "still\n1\n"


# ---------------------------------------------------------------------------------- 6


def test_the_host_is_read_only_and_runtime_writes_stay_in_the_workspace(executor, demo_task):
    _require_sandbox(executor)
    host_git = Path("/usr/local/bin/git")
    host_pth = Path("/usr/local/lib/python3.11/dist-packages/zz_planted.pth")
    assert not host_git.exists() and not host_pth.exists()  # precondition of this host
    a, b = _start(executor, demo_task), _start(executor, demo_task)
    output = _in_session(executor, a, HOST_READ_ONLY)
    assert "GIT-NOW: HACKED-GIT" in output  # it landed in A's own copy-on-write layer
    assert not host_git.exists() and not host_pth.exists()
    seen_by_b = _exec(executor, b, "command -v git; git --version; "
                                   "ls /usr/local/lib/python3.11/dist-packages/ 2>/dev/null")
    assert seen_by_b["output"].startswith("/usr/bin/git\ngit version")
    assert "zz_planted" not in seen_by_b["output"]
    finished = _finish(executor, a, demo_task)  # capture and grading must not use A's git
    assert finished["patch"] == ""
    assert finished["result"]["status"] == "unresolved"
    assert "HACKED" not in finished["result"]["log"]

    result, output = _submitted(executor, demo_task, "runtime", HOST_READ_ONLY)
    assert "GIT-NOW: HACKED-GIT" in output
    assert result["status"] == "unresolved"
    assert not host_git.exists() and not host_pth.exists()
    _empty_patch_is_unresolved(executor, demo_task)
    fresh = _start(executor, demo_task)
    assert _exec(executor, fresh, "command -v git")["output"] == "/usr/bin/git\n"


# ---------------------------------------------------------------------------------- 8


def _group_pids(token: str) -> int:
    return len(pids_carrying(f"{PROBE_VARIABLE}={token}".encode()))


FORKS = """{{ python3 - {count} {hold} <<'PY'
import errno, os, sys, time
children, error = [], None
try:
    while len(children) < int(sys.argv[1]):
        pid = os.fork()
        if pid == 0:
            time.sleep(600)
            os._exit(0)
        children.append(pid)
except OSError as exc:
    error = errno.errorcode[exc.errno]
print(len(children), error, flush=True)
if sys.argv[2] == "hold":
    time.sleep(600)
for pid in children:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
PY
}}"""


def pids_limited_executor(executor_factory, limit: int = 64, **settings):
    """An executor whose workspaces may hold ``limit`` processes each (a pids cgroup)."""
    executor = executor_factory(pids_limit=limit, **settings)
    sandbox = _require_sandbox(executor)
    if sandbox["limits"]["processes"]["enforced_by"] != "cgroup":
        pytest.skip("no pids cgroup here")
    return executor


def test_a_fork_bomb_stops_at_the_pids_limit(executor_factory, demo_task):
    executor = pids_limited_executor(executor_factory)
    token = uuid.uuid4().hex
    bomber = _start(executor, demo_task, env={PROBE_VARIABLE: token})
    forked = _exec(executor, bomber, FORKS.format(count=1000, hold="no"))["output"].split()
    assert int(forked[0]) < 64 and forked[1] == "EAGAIN", forked
    with ProcessWatch(token) as watch:
        _exec(executor, bomber, "(timeout -s KILL 600 bash -c ':(){ :|:& };:' &) 2>/dev/null; "
                                "true")
        wait_until(lambda: _group_pids(token) >= 40)
        assert _group_pids(token) <= 64
        other = _start(executor, demo_task)  # another workspace starts and works meanwhile
        assert _exec(executor, other, "echo fine")["output"] == "fine\n"
        assert _group_pids(token) <= 64
        assert executor.delete(f"/session/{bomber}").status_code == 200
        assert watch.alive() == []
    assert _exec(executor, other, "echo still fine")["output"] == "still fine\n"




def test_workspaces_together_stop_at_the_executors_process_budget(executor_factory, demo_task):
    """Each workspace below its own limit, all of them past the budget of all together: forks
    fail wherever the budget runs out, and the host's process table stays out of reach (eight
    workspaces at the default 4,096 each would fill a 32,768-pid table)."""
    executor = executor_factory(pids_limit=64, all_workspaces_pids_limit=90)
    sandbox = _require_sandbox(executor)
    together = sandbox["limits"]["processes_all_workspaces"]
    if together["enforced_by"] != "cgroup":
        pytest.skip("no pids cgroup here")
    assert together["limit"] == 90
    token = uuid.uuid4().hex
    first = _start(executor, demo_task, env={PROBE_VARIABLE: token})
    second = _start(executor, demo_task)
    with ProcessWatch(token) as watch:
        held = _exec(executor, first, FORKS.format(count=55, hold="hold") + " >/dev/null 2>&1 &")
        assert held["exit_code"] == 0
        wait_until(lambda: _group_pids(token) >= 55)
        forked = _exec(executor, second, FORKS.format(count=55, hold="no"))["output"].split()
        assert int(forked[0]) < 55 and forked[1] == "EAGAIN", forked  # 55 + 55 > 90
        assert executor.delete(f"/session/{first}").status_code == 200
        assert watch.alive() == []
    again = _exec(executor, second, FORKS.format(count=40, hold="no"))
    assert again["output"].split()[:2] == ["40", "None"]  # the budget is back


def test_workspaces_together_stop_at_the_executors_memory_budget(executor_factory, demo_task):
    """A workspace below its own memory limit but past the budget of all workspaces together is
    the one the kernel stops (killed inside the workspace's group); the executor goes on."""
    executor = executor_factory(memory_limit_bytes=1024 * MiB,
                                all_workspaces_memory_limit_bytes=128 * MiB)
    sandbox = _require_sandbox(executor)
    together = sandbox["limits"]["memory_all_workspaces"]
    if together["enforced_by"] != "cgroup":
        pytest.skip("no memory cgroup here")
    assert together["limit"] == 128 * MiB
    hog = _start(executor, demo_task)
    grown = _exec(executor, hog, "python3 -c 'b = b\"x\" * (400 * 1024 * 1024); "
                                 "print(\"HE\" + \"LD\")'; echo exit=$?")
    assert "HELD" not in grown["output"] and "exit=137" in grown["output"], grown
    assert executor.get("/health").status_code == 200
    other = _start(executor, demo_task)
    assert _exec(executor, other, "echo fine")["output"] == "fine\n"


def test_the_disk_quota_binds_root_and_spares_the_host(executor_factory, demo_task):
    executor = executor_factory(disk_limit_bytes=32 * MiB)
    sandbox = _require_sandbox(executor)
    if sandbox["limits"]["disk"]["enforced_by"] != "tmpfs":
        pytest.skip("no tmpfs quota here")
    sid = _start(executor, demo_task)
    before = _du(executor.settings.base_dir)
    for target in ("/testbed/big", "/tmp/big", "$HOME/big", "/usr/local/big", "/opt/big"):
        output = _exec(executor, sid, f"dd if=/dev/zero of={target} bs=1M count=64 2>&1; "
                                      f"echo status=$?")["output"]
        assert "No space left on device" in output and "status=1" in output, (target, output)
    python = _exec(executor, sid, "python3 -c \"open('/testbed/big2', 'wb')"
                                  ".write(b'x' * (64 << 20))\" 2>&1 | tail -n1")["output"]
    assert "No space left on device" in python
    # Everything written went into the workspace's own tmpfs: the host disk did not grow.
    assert _du(executor.settings.base_dir) - before < 4 * MiB
    _exec(executor, sid, "rm -f /testbed/big /testbed/big2 /tmp/big $HOME/big /usr/local/big "
                         "/opt/big")
    assert _exec(executor, sid, "echo usable > /testbed/f && cat /testbed/f")["output"] == (
        "usable\n")


def test_the_file_size_limit_binds_root_in_the_sandbox(executor_factory, demo_task):
    """RLIMIT_FSIZE is set by the launcher's own shell (``ulimit -f``, in 512-byte blocks),
    soft and hard: root inside holds no capability to raise it again. An odd size rounds down
    to a whole block."""
    executor = executor_factory(fsize_limit_bytes=4 * MiB + 100)
    sandbox = _require_sandbox(executor)
    assert sandbox["limits"]["file_size"] == {"limit": 4 * MiB + 100, "enforced_by": "rlimit"}
    sid = _start(executor, demo_task)
    limits = _exec(executor, sid, "grep 'Max file size' /proc/self/limits")["output"].split()
    assert limits[3:6] == [str(4 * MiB), str(4 * MiB), "bytes"], limits
    output = _exec(executor, sid, "ulimit -H -f unlimited 2>&1; echo raised=$?; "
                                  "head -c $((5 << 20)) /dev/zero > /testbed/big 2>&1; "
                                  "echo status=$?; stat -c %s /testbed/big")["output"]
    assert "raised=1" in output and "status=153" in output, output  # 128 + SIGXFSZ
    assert output.rstrip().endswith(str(4 * MiB)), output


def test_dev_shm_is_private_and_size_limited(executor_factory, demo_task):
    executor = executor_factory(shm_bytes=8 * MiB)
    _require_sandbox(executor)
    name = f"shm-{uuid.uuid4().hex}"
    a, b = _start(executor, demo_task), _start(executor, demo_task)
    assert _exec(executor, a, f"echo secret > /dev/shm/{name} && ls /dev/shm")["output"] == (
        f"{name}\n")
    assert _exec(executor, b, f"ls -A /dev/shm; cat /dev/shm/{name} 2>&1")["output"].endswith(
        "No such file or directory\n")
    output = _exec(executor, a, "dd if=/dev/zero of=/dev/shm/big bs=1M count=16 2>&1")["output"]
    assert "No space left on device" in output
    assert not list(Path("/dev/shm").glob(f"{name}*"))  # nor on the host
    _submitted(executor, demo_task, "shm",
                           f"ls -A /dev/shm | grep -q {name} && echo 'ESCAPED: shared /dev/shm';"
                           " echo ATTACK-DONE")


# ---------------------------------------------------------------------------------- 9

DAEMONS = (
    "setsid nohup sleep @A@ >/dev/null 2>&1 & "
    "env -i setsid sleep @B@ >/dev/null 2>&1 & "
    "(env -i setsid nohup bash -c 'exec -a innocent sleep @C@' >/dev/null 2>&1 &) ; "
    "(trap '' TERM HUP; exec setsid sleep @D@ >/dev/null 2>&1 &) ; true"
)


@pytest.mark.parametrize("ending", ["delete", "reset", "finish"])
def test_daemons_die_with_the_session(executor, demo_task, ending):
    _require_sandbox(executor)
    token = uuid.uuid4().hex
    durations = [f"1000.{uuid.uuid4().int % 10**9:09d}" for _ in range(4)]
    command = _script(DAEMONS, a=durations[0], b=durations[1], c=durations[2], d=durations[3])
    sid = _start(executor, demo_task, env={PROBE_VARIABLE: token})

    def daemons() -> list[int]:
        return sorted(pid for d in durations for pid in _cmdline_pids(d.encode()))

    with ProcessWatch(token) as watch:
        _exec(executor, sid, command)
        wait_until(lambda: len(daemons()) == 4)
        if ending == "delete":
            assert executor.delete(f"/session/{sid}").status_code == 200
        elif ending == "reset":
            assert executor.post(f"/session/{sid}/reset").status_code == 200
        else:
            assert _finish(executor, sid, demo_task)["result"]["status"] == "unresolved"
        assert daemons() == []
        survivors = watch.alive()
        if ending == "reset":  # only the fresh shell carries the token now
            assert len(survivors) <= 3  # cgroup joiner is gone; bwrap (outside, inside), bash
            assert _exec(executor, sid, "echo fresh")["output"] == "fresh\n"
            assert executor.delete(f"/session/{sid}").status_code == 200
            assert watch.alive() == []
        else:
            assert survivors == []
    assert executor.work_dirs() == []
    # The single-shot flavour: the test run's daemons are gone when its verdict is.
    durations = [f"1000.{uuid.uuid4().int % 10**9:09d}" for _ in range(4)]
    script = _script(DAEMONS, a=durations[0], b=durations[1], c=durations[2], d=durations[3])
    result, _ = _submitted(executor, demo_task, "daemons", script + "; echo ATTACK-DONE")
    assert result["status"] == "unresolved"
    assert daemons() == []


# ---------------------------------------------------------------------------------- 10


def test_git_clone_mode_setup_writes_the_workspace_not_the_host(executor_factory, demo_task):
    executor = executor_factory(workspace_mode="git-clone")
    health = executor.get("/health").json()["capabilities"]
    assert health["workspace_mode"] == "git-clone"
    if health["sandbox"]["tool"] != "bwrap":
        pytest.skip("no bubblewrap sandbox here")
    name = f"x-{uuid.uuid4().hex}"
    setup = [f"echo from-setup > /testbed/{name}", f"echo from-setup > {name}-relative"]
    result = executor.submit({**demo_task.request("clone-setup", ""), "setup": setup}).json()
    assert result["status"] == "unresolved", result.get("error")
    assert not Path(f"/testbed/{name}").exists()
    assert not Path(f"/testbed/{name}-relative").exists()
    sid = _start(executor, demo_task, setup=setup)
    seen = _exec(executor, sid, f"pwd; cat /testbed/{name} {name}-relative; "
                                f"echo again > /testbed/{name}-exec; ls calc")
    assert seen["output"] == "/testbed\nfrom-setup\nfrom-setup\n__init__.py\n"
    assert not Path(f"/testbed/{name}").exists()
    assert not Path(f"/testbed/{name}-exec").exists()
    finished = _finish(executor, sid, demo_task)
    assert finished["result"]["status"] == "unresolved"
    assert f"{name}-exec" in finished["patch"]  # the agent's own file, in its own tree
    assert not Path(f"/testbed/{name}-exec").exists()
    assert executor.work_dirs() == []


# ---------------------------------------------------------------------------------- 11

INTERPRETER = r"""
python -c 'import flask' 2>/dev/null && echo "ESCAPED: flask imports"
python3 -c 'import waitress' 2>/dev/null && echo "ESCAPED: waitress imports"
python3 -c 'import task_executor' 2>/dev/null && echo "ESCAPED: task_executor imports"
for d in @HIDDEN@; do
    [ -n "$(ls -A "$d" 2>/dev/null)" ] && echo "ESCAPED: $d is visible"
done
python3 -c 'import os, sys; print("EXECUTABLE", os.path.realpath(sys.executable))'
case ":$PATH:" in *:@VENV@*) echo "ESCAPED: the executor's venv is on PATH";; esac
echo ATTACK-DONE
"""


def test_graded_code_does_not_run_in_the_executors_interpreter(executor, demo_task):
    _require_sandbox(executor)
    hidden = _executor_interpreter_paths()
    script = _script(INTERPRETER, hidden=" ".join(hidden), venv=sys.prefix)
    sid = _start(executor, demo_task)
    for output in (_in_session(executor, sid, script),
                   _submitted(executor, demo_task, "interpreter", script)[1]):
        executable = re.search(r"EXECUTABLE (\S+)", output).group(1)
        assert executable.startswith("/usr/bin/python3"), output
        assert not executable.startswith(sys.prefix)


# ---------------------------------------------------------------------------------- found holes
# Holes these attacks found, closed since: each test names the hole it was.


_SH_PAYLOAD = (
    "#!/bin/sh\n"
    "id -u > '@PROOF@' 2>/dev/null\n"
    'exec /bin/sh "$@"\n'
)


@pytest.mark.parametrize("path", [".:/usr/local/bin:/usr/bin:/bin", ":/usr/bin:/bin",
                                  "/nonexistent::/usr/bin:/bin"], ids=["dot", "leading", "double"])
def test_a_relative_task_path_does_not_run_the_agents_sh_on_the_host(executor, demo_task,
                                                                      tmp_path, path):
    """Closed in 195474e (it ran an agent's ``sh`` as root on the host): the launcher's first
    programs were found by subprocess on the *task's* PATH, relative to cwd = the host path of
    the agent's tree; with a relative PATH entry ('.', or an empty one as in ':/usr/bin'), an
    agent patch adding an executable ``sh`` at the repo root ran it as host root when the test
    run was launched."""
    _require_sandbox(executor)
    proof = tmp_path / "host-root-proof"
    payload = _SH_PAYLOAD.replace("@PROOF@", str(proof))
    repo = Path(demo_task.repo)
    for name in ("sh", "setpriv", "prlimit"):
        (repo / name).write_text(payload)
        (repo / name).chmod(0o755)
    patch = diff_of(repo, {})
    assert "new file mode 100755" in patch
    body = {**demo_task.request("relative-path", patch),
            "env": {**FAST_PYTEST_ENV, "PATH": path}}
    result = executor.submit(body).json()
    assert not proof.exists(), f"the agent's sh ran on the host as uid {proof.read_text()}"
    assert result["status"] == "unresolved", (result.get("error"), result["log"][-2000:])


def test_a_relative_session_path_does_not_run_the_agents_sh_on_the_host(executor, demo_task,
                                                                         tmp_path):
    """Closed in 195474e: a session shell respawned after a timeout was started by Popen with
    the session env's PATH and cwd = the tree's host path (the in-sandbox cwd is tried as a
    host path first); with a relative PATH entry, /testbed/sh written by the agent, ``cd
    /testbed/calc`` and one timed-out command ran that sh as root on the host."""
    _require_sandbox(executor)
    proof = tmp_path / "host-root-proof"
    payload = _SH_PAYLOAD.replace("@PROOF@", str(proof))
    sid = _start(executor, demo_task, env={"PATH": ".:/usr/local/bin:/usr/bin:/bin"})
    encoded = base64.b64encode(payload.encode()).decode()
    _exec(executor, sid, f"echo {encoded} | base64 -d > /testbed/sh && chmod +x /testbed/sh && "
                         "cd /testbed/calc")
    assert _exec(executor, sid, "sleep 60", timeout=1)["timed_out"] is True
    assert _exec(executor, sid, "echo back")["output"] == "back\n"
    assert not proof.exists(), f"the agent's sh ran on the host as uid {proof.read_text()}"


FORGE_THE_REPORTER = '''
import atexit as _dy_atexit, os as _dy_os, sys as _dy_sys
_dy_reporter = _dy_sys.modules.get("dockyard_report")
if _dy_reporter is not None:
    _dy_record = _dy_reporter.record
    def _dy_forged(**fields):
        if fields.get("kind") == "test":
            fields["outcome"] = "passed"
        return _dy_record(**fields)
    _dy_reporter.record = _dy_forged
    _dy_atexit.register(lambda: _dy_os._exit(0))
'''


def test_code_under_test_cannot_rewrite_its_own_verdict(executor, demo_task):
    """Was a hole (reward): the reporter runs in the test process, so module code the tests
    import rewrote what it records (sys.modules['dockyard_report'].record) and forced exit status
    0 (atexit os._exit(0)): an unfixed bug was graded `resolved` while pytest's own output showed
    the failures. The reporter's count is now checked against pytest's summary line, which the
    executor reads from the output out of process (they disagree, the control agrees); and the
    replaced record function and the canaries reported passed are tampering (test_tampering)."""
    _require_sandbox(executor)
    source = BASE_FILES["calc/__init__.py"]
    patch = diff_of(Path(demo_task.repo), {"calc/__init__.py": FORGE_THE_REPORTER + source})
    result = executor.submit(demo_task.request("forger", patch)).json()
    assert "assert -1 == 5" in result["log"]  # the bug is still there
    assert result["test_exit_code"] == 0  # the forged exit status
    assert (result["status"], result["error_code"]) == ("unresolved", "tampered"), result


def test_a_test_run_that_kills_itself_is_unresolved(executor, demo_task):
    """Was a hole (reward): module code that killed its own test run (`kill -9 -1`) turned a
    certain 0 into `execution_error` (no verdict, which reward code excludes); a run that
    crashes is now compared with the control (no agent patch), which is consistent."""
    _require_sandbox(executor)
    patch = _attack_patch(demo_task, "kill -9 -1")
    result = executor.submit(demo_task.request("suicide", patch)).json()
    assert result["status"] == "unresolved", (result["status"], result.get("error"))
    assert result["error_code"] == "tests_crashed"
    assert result["control_run"] is True


def test_snapshots_count_against_the_disk_quota(executor_factory, demo_task):
    """Closed in 195474e: snapshots are copied to <workspace>/snapshots on the host disk,
    outside the workspace's tmpfs; a session that filled its quota once and snapshotted N times
    wrote N x quota to the disk holding the base dir."""
    executor = executor_factory(disk_limit_bytes=32 * MiB, runtime_dirs=())
    sandbox = _require_sandbox(executor)
    if sandbox["limits"]["disk"]["enforced_by"] != "tmpfs":
        pytest.skip("no tmpfs quota here")
    sid = _start(executor, demo_task)
    _exec(executor, sid, "head -c $((20 << 20)) /dev/urandom > /testbed/blob")
    before = _du(executor.settings.base_dir)
    for index in range(3):
        answer = executor.post(f"/session/{sid}/snapshot", json={"name": f"s{index}"})
        if answer.status_code != 200:
            break  # refused past the quota: that is the fix
    assert _du(executor.settings.base_dir) - before <= 32 * MiB


def test_a_snapshot_cannot_be_named_dot_dot(executor_factory, demo_task):
    """Closed in 195474e: '..' matched the name pattern; <workspace>/snapshots/.. is the
    workspace's root, whose size walk crossed every mount in it (~9 GB with runtime dirs) and
    whose fork copied the whole workspace root (mounted tree, tmpfs, runtime overlays) onto the
    host disk, outside any quota."""
    executor = executor_factory(runtime_dirs=())
    _require_sandbox(executor)
    sid = _start(executor, demo_task)
    for name in ("..", "."):
        answer = executor.post(f"/session/{sid}/snapshot", json={"name": name})
        assert answer.status_code in (400, 422), (name, answer.text)


def test_a_vanished_sibling_of_the_base_dir_does_not_break_the_sandbox(outside_tmp_base,
                                                                        executor_factory,
                                                                        demo_task):
    """Closed in 195474e: the host view is listed once at start; with plain --ro-bind, a
    sibling of the base dir (or of an ancestor) removed later made every sandbox fail to start
    (bwrap: Can't find source path): every session start and every grading failed."""
    sibling = outside_tmp_base.parent / "sibling"
    sibling.mkdir()
    executor = executor_factory(base_dir=outside_tmp_base)
    _require_sandbox(executor)
    sibling.rmdir()
    answer = executor.post("/session/start", json={"repo": demo_task.repo,
                                                   "base_commit": demo_task.base_commit})
    assert answer.status_code == 200, answer.text


def _holder_pattern(work: str) -> str:
    """A workspace holder's mount point in a mount table line (holders sit in buckets)."""
    return rf" {re.escape(work)}/(?:holders-[0-9a-f]{{2}}/)?(ws-[0-9a-f]+)"


def _holders_seen_by_bwraps(work: str) -> list[set[str]]:
    """For every bubblewrap this process started (the sandbox's monitor, whose namespace is the
    one it was launched from): the workspaces under ``work`` its mount table shows."""
    seen = []
    for pid in _pids_named("bwrap"):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            if re.search(r"^PPid:\s+(\d+)$", status, re.M)[1] != str(os.getpid()):
                continue  # a sandbox's init, or another process's sandbox
            table = Path(f"/proc/{pid}/mountinfo").read_text()
        except OSError:
            continue  # gone meanwhile
        holders = set(re.findall(_holder_pattern(work), table))
        if holders:
            seen.append(holders)
    return seen


def test_sandboxes_start_from_a_mount_table_with_their_own_workspace_only(executor, demo_task):
    # Each workspace's sandboxes start from a launch namespace of its own (the host, the host
    # view and that workspace's mounts): bubblewrap copies and rereads the table it starts from
    # on every launch, so started from the executor's table (every live workspace's tmpfs,
    # overlay and runtime overlays) a launch got slower with every live session. bwrap's
    # monitor process stays in the namespace it started in: its table shows what it copied.
    sandbox = _require_sandbox(executor)
    assert "launch_namespace" not in sandbox["missing"] and "host_view" not in sandbox["missing"]
    work = str((executor.settings.base_dir / "work").resolve())
    sessions = [_start(executor, demo_task) for _ in range(4)]
    host_side = set(re.findall(_holder_pattern(work),
                               Path("/proc/self/mountinfo").read_text()))
    assert len(host_side) == 4  # the executor's own table has them all
    seen = _holders_seen_by_bwraps(work)
    assert len(seen) >= 4, seen
    assert all(len(holders) == 1 for holders in seen), seen
    assert set().union(*seen) == host_side
    for session_id in sessions:
        assert executor.delete(f"/session/{session_id}").status_code == 200
    assert executor.work_dirs() == []


def test_the_launchers_malloc_setting_stays_outside_and_a_tasks_own_is_kept(executor,
                                                                             demo_task):
    # bubblewrap runs with GLIBC_TUNABLES (its init gives big arrays back, see isolation.py);
    # code under test gets the task's environment exactly.
    _require_sandbox(executor)
    show = "echo tunables=${GLIBC_TUNABLES-unset}; echo ATTACK-DONE"
    plain = _start(executor, demo_task)
    assert "tunables=unset\n" in _exec(executor, plain, show)["output"]
    own = _start(executor, demo_task, env={"GLIBC_TUNABLES": "glibc.malloc.check=0"})
    assert "tunables=glibc.malloc.check=0\n" in _exec(executor, own, show)["output"]
    bwrap_env = []
    for pid in _pids_named("bwrap"):  # this executor's sandboxes' monitors
        with contextlib.suppress(OSError):
            if f"\nPPid:\t{os.getpid()}\n" in Path(f"/proc/{pid}/status").read_text():
                bwrap_env.append(Path(f"/proc/{pid}/environ").read_bytes())
    assert len(bwrap_env) >= 2
    tunable = b"GLIBC_TUNABLES=glibc.malloc.mmap_threshold=65536"
    assert sum(tunable in env for env in bwrap_env) >= 1  # the plain session's
    assert any(b"GLIBC_TUNABLES=glibc.malloc.check=0" in env for env in bwrap_env)


def _pids_named(name: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "comm").read_text().strip() == name:
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids

"""Copy-on-write workspaces and isolation: templates, overlay, namespaces, fallback, fork."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from task_executor.config import Settings
from task_executor.sandbox.capabilities import detect
from task_executor.workspaces.fsutil import remove_small_tree, remove_trees
from task_executor.workspaces.mirrors import MirrorCache
from task_executor.workspaces.templates import TemplateCache
from task_executor.workspaces.workspace import SetupFailed
from tests.conftest import FAST_PYTEST_ENV, start_executor
from tests.executor.test_sessions_api import _exec, _finish, _start

CAPS = detect(Path("/var/tmp"), 64000)
needs_overlay = pytest.mark.skipif(
    not (CAPS.overlay and CAPS.mount_namespace), reason="overlay or mount namespaces unavailable"
)
needs_egress_guard = pytest.mark.skipif(
    not CAPS.network_namespace, reason="network namespaces unavailable"
)


@needs_overlay
def test_two_sessions_on_one_template_never_see_each_others_writes(executor, demo_task):
    first, second = _start(executor, demo_task), _start(executor, demo_task)
    _exec(executor, first, "echo mine > private.txt && sed -i 's/a - b/a * b/' calc/__init__.py")
    seen = _exec(executor, second, "ls private.txt 2>&1; grep -c 'a - b' calc/__init__.py; pwd")
    assert "No such file" in seen["output"]
    assert seen["output"].endswith("1\n/testbed\n")
    stats = executor.get("/health").json()["capabilities"]
    assert stats["workspace_mode"] == "overlay" and stats["fixed_path"] == "/testbed"


def _wheel(name: str, version: str, source: str) -> bytes:
    """A minimal pure-Python wheel, so pip can install it with no index and no network."""
    import base64
    import hashlib
    import io
    import zipfile

    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": source,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                         "Tag: py3-none-any\n",
    }
    record = []
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path, text in files.items():
            data = text.encode()
            archive.writestr(path, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.append(f"{path},sha256={digest.decode()},{len(data)}")
        record.append(f"{info}/RECORD,,")
        archive.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return buffer.getvalue()


@needs_overlay
def test_pip_install_into_the_templates_virtualenv_stays_in_the_session(executor_factory,
                                                                        demo_task):
    executor = executor_factory()
    setup = ["python -m venv .venv"]  # with pip (ensurepip, offline)
    body = {"repo": demo_task.repo, "base_commit": demo_task.base_commit, "setup": setup,
            "env": FAST_PYTEST_ENV}
    installer, other = (executor.post("/session/start", json=body).json()["session_id"]
                        for _ in range(2))
    wheel = _wheel("sneaky", "1.0", "VALUE = 42\n")
    uploaded = executor.put(f"/session/{installer}/file?path=sneaky-1.0-py3-none-any.whl",
                            data=wheel)
    assert uploaded.status_code == 200
    installed = _exec(executor, installer, (
        ".venv/bin/pip install --no-index --quiet ./sneaky-1.0-py3-none-any.whl"
        " && rm sneaky-1.0-py3-none-any.whl && .venv/bin/python -c 'import sneaky, sys;"
        " print(sneaky.VALUE, sneaky.__file__)'"), timeout=120)
    assert installed["exit_code"] == 0, installed["output"]
    assert installed["output"].startswith("42 /testbed/.venv/")  # baked at the fixed path
    probe = ".venv/bin/python -c 'import sneaky' 2>&1 | tail -1"
    assert "No module named 'sneaky'" in _exec(executor, other, probe)["output"]
    # The install is environment, not the agent's patch: grading never sees it.
    patch = _finish(executor, installer, demo_task)["patch"]
    assert ".venv" not in patch and "sneaky" not in patch


@needs_overlay
def test_forked_session_diverges_from_its_source(executor, demo_task):
    source = _start(executor, demo_task)
    _exec(executor, source, "cd calc && export PHASE=one && echo shared > note.txt")
    snap = executor.post(f"/session/{source}/snapshot", json={"name": "before"})
    assert snap.status_code == 200 and snap.json()["size_bytes"] > 0
    fork = executor.post(f"/session/{source}/fork", json={}).json()["session_id"]
    inherited = _exec(executor, fork, 'echo "$PWD $PHASE $(cat note.txt)"')["output"]
    assert inherited == "/testbed/calc one shared\n"
    _exec(executor, fork, "echo fork > note.txt && export PHASE=two && touch fork-only")
    _exec(executor, source, "echo source > note.txt")
    assert _exec(executor, source, "cat note.txt; ls fork-only 2>&1 | wc -l; echo $PHASE")[
        "output"] == "source\n1\none\n"
    assert _exec(executor, fork, "cat note.txt; echo $PHASE")["output"] == "fork\ntwo\n"
    from_snapshot = executor.post(f"/session/{source}/fork", json={"snapshot": "before"}).json()
    assert _exec(executor, from_snapshot["session_id"], "cat note.txt")["output"] == "shared\n"
    missing = executor.post(f"/session/{source}/fork", json={"snapshot": "nope"})
    assert missing.status_code == 404
    fixed = _exec(executor, fork, "sed -i 's/a - b/a + b/' __init__.py")
    assert fixed["exit_code"] == 0
    assert _finish(executor, fork, demo_task)["result"]["status"] == "resolved"
    assert _finish(executor, source, demo_task)["result"]["status"] == "unresolved"


def _network_task(tmp_path: Path, more_tests: str) -> tuple[Path, str, str]:
    """A repository and a test patch whose test_only_loopback passes only without egress."""
    from task_executor.demo import diff_of, init_repo

    repo = tmp_path / "net"
    base = init_repo(repo, {"x.py": "X = 1\n"})
    return repo, base, diff_of(repo, {"test_net.py": (
        "import socket, subprocess, time\n"
        "def test_only_loopback():\n"
        "    links = subprocess.run(['ip', '-o', 'link'], capture_output=True, text=True).stdout\n"
        "    assert [l.split(':')[1].strip() for l in links.splitlines()] == ['lo']\n"
        + more_tests
    )})


@needs_egress_guard
def test_egress_is_denied_and_loopback_works(executor, tmp_path):
    # The documentation address (TEST-NET-1): with no route out of the namespace the connect
    # fails inside the kernel, before any packet could leave.
    repo, base, test_patch = _network_task(tmp_path, (
        "def test_connect_out_fails_fast():\n"
        "    started = time.monotonic()\n"
        "    try:\n"
        "        socket.create_connection(('192.0.2.1', 80), timeout=5)\n"
        "    except OSError as exc:\n"
        "        assert 'unreachable' in str(exc).lower()\n"
        "    assert time.monotonic() - started < 1\n"
        "def test_loopback_works():\n"
        "    server = socket.socket(); server.bind(('127.0.0.1', 0)); server.listen()\n"
        "    client = socket.create_connection(server.getsockname(), timeout=2)\n"
        "    client.sendall(b'hi'); assert server.accept()[0].recv(2) == b'hi'\n"
    ))
    body = {"task_id": "net", "repo": str(repo), "base_commit": base, "test_patch": test_patch,
            "fail_to_pass": ["test_net.py::test_only_loopback", "test_net.py::test_loopback_works",
                             "test_net.py::test_connect_out_fails_fast"]}
    result = executor.submit(body).json()
    assert result["status"] == "resolved", result["log"]
    assert executor.get("/health").json()["capabilities"]["deny_network_default"] is True


@needs_egress_guard
def test_finish_runs_the_tests_under_the_egress_it_asks_for(executor_factory, tmp_path):
    # The session's shell may have the network (an agent installing things); the finish's own
    # deny_network decides what the graded tests get, as a TaskSpec's does.
    repo, base, test_patch = _network_task(tmp_path, "")
    executor = executor_factory(deny_network=False)
    results = {}
    for deny in (True, False):
        sid = executor.post("/session/start", json={
            "repo": str(repo), "base_commit": base, "deny_network": False}).json()["session_id"]
        answer = executor.post(f"/session/{sid}/finish", json={
            "test_patch": test_patch, "fail_to_pass": ["test_net.py::test_only_loopback"],
            "deny_network": deny})
        assert answer.status_code == 200, answer.text
        results[deny] = answer.json()["result"]["tests"]["test_net.py::test_only_loopback"]
    assert results[True] == "PASSED"
    if len(os.listdir("/sys/class/net")) > 1:  # the host has more than loopback
        assert results[False] == "FAILED"


def test_egress_denial_fails_closed_without_the_guard(executor_factory, demo_task):
    fallback = executor_factory(workspace_mode="git-clone", sandbox_mode="none")
    assert fallback.get("/health").json()["capabilities"]["egress_guard"] is False
    refused = fallback.submit({**demo_task.request("deny", ""), "deny_network": True})
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "egress_guard_unavailable"
    session = fallback.post("/session/start", json={
        "repo": demo_task.repo, "base_commit": demo_task.base_commit, "deny_network": True})
    assert session.json()["error"]["code"] == "egress_guard_unavailable"


def test_fallback_mode_gives_the_same_verdicts(executor_factory, demo_task):
    from tests.executor.test_grading_integrity import CHEAT_CONFTEST, _cheat_patch

    fast = executor_factory()
    clone = executor_factory(workspace_mode="git-clone")  # sandboxed, a clone per workspace
    bare = executor_factory(workspace_mode="git-clone", sandbox_mode="none")  # a default pod
    assert clone.get("/health").json()["capabilities"]["workspace_mode"] == "git-clone"
    assert bare.get("/health").json()["capabilities"]["sandbox"]["tool"] == "none"
    cheat = _cheat_patch(demo_task, {"conftest.py": CHEAT_CONFTEST})
    bad = demo_task.gold_patch.replace("-    return a - b", "-    return a ** b")
    for name, patch in [("gold", demo_task.gold_patch), ("empty", ""), ("cheat", cheat),
                        ("bad", bad)]:
        body = demo_task.request(name, patch)
        verdicts = [executor.submit(body).json() for executor in (fast, clone, bare)]
        assert verdicts[0]["status"] == verdicts[1]["status"] == verdicts[2]["status"], name
        assert verdicts[0]["tests"] == verdicts[1]["tests"] == verdicts[2]["tests"], name


@pytest.mark.parametrize("under_tmp", [True, False], ids=["base-in-tmp", "base-in-var-tmp"])
def test_sandboxed_code_cannot_see_other_trees_or_the_executor(
    executor_factory, demo_task, shared_dir, under_tmp
):
    if not CAPS.mount_namespace:
        pytest.skip("mount namespaces unavailable")
    executor = executor_factory() if under_tmp else executor_factory(base_dir=shared_dir / "b")
    _start(executor, demo_task)  # another session's tree exists under the base directory
    sid = _start(executor, demo_task)
    base = executor.settings.base_dir
    command = f'ls -A {base} 2>/dev/null | wc -l; ls -A "${{TMPDIR:-/tmp}}"'
    seen = _exec(executor, sid, command)["output"].split("\n")
    assert seen[0] == "0"  # the base directory: hidden under /tmp, or an empty mount
    assert seen[1] == "home"  # a temporary directory of its own
    if executor.get("/health").json()["capabilities"]["private_tmp"]:
        assert _exec(executor, sid, "ls -A /tmp")["output"] == "home\n"


def _template_cache(tmp_path: Path, budget: int, setup_log: Path) -> TemplateCache:
    def run_setup(tree: Path, setup: list[str], env: dict[str, str]) -> None:
        with setup_log.open("a") as handle:
            handle.write(f"{tree}\n")
        if setup == ["fail"]:
            raise SetupFailed("setup failed")  # what the real run_setup raises
        (tree / "built.txt").write_text("x" * 10_000)

    return TemplateCache(tmp_path / "templates", MirrorCache(tmp_path / "mirrors"), run_setup,
                         budget_bytes=budget)


def test_template_is_built_once_under_sixteen_concurrent_requests(tmp_path, demo_task):
    setup_log = tmp_path / "setups.log"
    cache = _template_cache(tmp_path, 10**9, setup_log)
    barrier = threading.Barrier(16)

    def lease(_: int) -> Path:
        barrier.wait()
        template = cache.acquire(demo_task.repo, demo_task.base_commit, ["make"], {})
        cache.release(template)
        return template.root

    with ThreadPoolExecutor(16) as pool:
        roots = set(pool.map(lease, range(16)))
    assert len(roots) == 1
    assert len(setup_log.read_text().splitlines()) == 1
    assert cache.stats()["builds"] == 1 and cache.stats()["hits"] == 15


def test_failed_template_build_is_retried_and_leaves_nothing(tmp_path, demo_task):
    cache = _template_cache(tmp_path, 10**9, tmp_path / "setups.log")
    for _ in range(2):
        with pytest.raises(SetupFailed):
            cache.acquire(demo_task.repo, demo_task.base_commit, ["fail"], {})
    assert len((tmp_path / "setups.log").read_text().splitlines()) == 2
    assert list((tmp_path / "templates").iterdir()) == []


def test_eviction_never_removes_a_template_in_use(tmp_path, demo_task):
    from task_executor.demo import FIXED_FILES, commit_all, write_files

    cache = _template_cache(tmp_path, budget=1, setup_log=tmp_path / "setups.log")
    held = cache.acquire(demo_task.repo, demo_task.base_commit, ["make"], {})
    repo = Path(demo_task.repo)
    commits = []
    for index in range(3):
        write_files(repo, {**FIXED_FILES, "n.txt": str(index)})
        commits.append(commit_all(repo, f"c{index}"))
    for commit in commits:
        cache.release(cache.acquire(demo_task.repo, commit, ["make"], {}))
    assert held.tree.is_dir()  # over budget, but leased
    assert cache.stats()["templates"] == 1
    cache.release(held)
    assert not held.root.exists()
    assert cache.stats()["templates"] == 0


def test_code_under_test_can_run_as_an_unprivileged_uid(executor_factory, demo_task, tmp_path):
    nobody = executor_factory(run_as_uid=65534, run_as_gid=65534)
    sid = _start(nobody, demo_task)
    who = _exec(nobody, sid, "id -u; echo hi > new.txt && echo >> calc/__init__.py && echo ok; "
                             "cat /root/.bashrc >/dev/null 2>&1 || echo denied")
    assert who["output"] == "65534\nok\ndenied\n"
    assert nobody.put(f"/session/{sid}/file?path=sub/up.txt", data=b"x").status_code == 200
    assert _exec(nobody, sid, "echo more >> sub/up.txt && echo ok")["output"] == "ok\n"
    # Graded as that uid too; the interpreter must be one the uid can run (not under /root).
    system_python = Path("/usr/bin/python3")
    if not system_python.exists():
        pytest.skip("no system python for the unprivileged uid")
    from task_executor.demo import diff_of, init_repo

    repo = tmp_path / "uid-repo"
    base = init_repo(repo, {"calc.py": "def add(a, b):\n    return a - b\n"})
    fix = diff_of(repo, {"calc.py": "def add(a, b):\n    return a + b\n"})
    tests = diff_of(repo, {"tests_calc.py": (
        "import os, unittest\nfrom calc import add\n\n"
        "class AddTests(unittest.TestCase):\n"
        "    def test_add(self):\n"
        "        self.assertEqual(os.getuid(), 65534)\n"
        "        self.assertEqual(add(2, 3), 5)\n")})
    body = {"task_id": "uid", "repo": str(repo), "base_commit": base, "patch": fix,
            "test_patch": tests, "log_parser": "unittest",
            "test_command": f"{system_python} -m unittest -v tests_calc",
            "fail_to_pass": ["test_add (tests_calc.AddTests)"]}
    result = nobody.submit(body).json()
    assert result["status"] == "resolved", result["log"]


def test_mirrors_are_evicted_under_their_budget_but_never_when_pinned(tmp_path):
    from task_executor.demo import BASE_FILES, init_repo

    repos = [tmp_path / f"repo-{i}" for i in range(3)]
    commits = [init_repo(repo, dict(BASE_FILES)) for repo in repos]
    cache = MirrorCache(tmp_path / "mirrors", budget_bytes=1)
    pinned, _ = cache.resolve(str(repos[0]), commits[0])
    cache.pin(pinned)
    for repo, commit in zip(repos[1:], commits[1:], strict=True):
        cache.resolve(str(repo), commit)
    assert cache.stats()["mirrors"] == 3  # all used within the last minute: none evicted yet
    removed = cache.evict(recent_s=0)
    assert len(removed) == 2 and pinned not in removed
    assert (pinned / "HEAD").exists()
    cache.unpin(pinned)
    assert cache.evict(recent_s=0) == [pinned]
    # An evicted mirror is simply cloned again on the next request.
    assert cache.resolve(str(repos[1]), commits[1])[1] == commits[1]


def test_setup_runs_once_per_template_or_per_task_in_fallback(executor_factory, demo_task):
    body = {**demo_task.request("setup", demo_task.gold_patch), "setup": ["sleep 0.3"]}
    fallback = executor_factory(workspace_mode="git-clone")
    for name in ("a", "b"):
        result = fallback.submit({**body, "task_id": name}).json()
        assert result["status"] == "resolved" and result["phases"]["setup"] >= 0.3
    if CAPS.overlay and CAPS.mount_namespace:
        fast = executor_factory()
        first = fast.submit({**body, "task_id": "a"}).json()
        second = fast.submit({**body, "task_id": "b"}).json()
        assert first["phases"]["checkout"] >= 0.3  # the template's build, setup included
        assert second["phases"]["setup"] == 0 and second["phases"]["checkout"] < 0.3


@pytest.mark.skipif(not (CAPS.idmap and CAPS.overlay), reason="idmapped mounts unavailable")
def test_runtime_directories_are_copy_on_write_per_workspace_and_template(
    executor_factory, demo_task
):
    """A ``pip install`` into the image's interpreter: what setup puts in /usr/local is a layer
    every workspace of that template shares; what a session writes there is that session's only;
    the host's /usr/local never changes."""
    executor = executor_factory()
    host_git_before = Path("/usr/local/bin/git").exists()
    marker = f"dockyard-runtime-{uuid.uuid4().hex}"
    host = Path("/usr/local/lib") / marker
    setup = [f"echo from-setup > /usr/local/lib/{marker}"]
    a = _start(executor, demo_task, setup=setup)
    b = _start(executor, demo_task, setup=setup)
    plain = _start(executor, demo_task)  # another template: no setup
    assert _exec(executor, a, f"cat /usr/local/lib/{marker}")["output"] == "from-setup\n"
    wrote = _exec(executor, a, f"echo from-a > /usr/local/lib/{marker}-a && "
                               "touch /usr/local/bin/git && id -u")
    assert wrote["exit_code"] == 0, wrote["output"]
    assert _exec(executor, b, f"cat /usr/local/lib/{marker}")["output"] == "from-setup\n"
    assert _exec(executor, b, f"ls /usr/local/lib/{marker}-a /usr/local/bin/git 2>&1; true")[
        "output"].count("No such file") == 2
    assert _exec(executor, plain, f"ls /usr/local/lib/{marker} 2>&1; true")["output"].count(
        "No such file") == 1
    assert not host.exists() and not Path(f"{host}-a").exists()
    assert Path("/usr/local/bin/git").exists() == host_git_before
    # A fake git first on the session's PATH (printing no diff) is not what captures the fix:
    # the executor's git steps run the host's /usr/bin/git.
    _exec(executor, a, "printf '#!/bin/sh\\nexit 0\\n' > /usr/local/bin/git && "
                       "chmod +x /usr/local/bin/git && sed -i 's/a - b/a + b/' calc/__init__.py")
    assert _exec(executor, a, "git --version; echo $?")["output"] == "0\n"  # the fake one
    finished = _finish(executor, a, demo_task)
    assert "return a + b" in finished["patch"]
    assert finished["result"]["status"] == "resolved"


def _drive_probe(where: str, victim: str) -> str:
    """A command that asks the executor at ``where`` to run ``touch pwned`` in ``victim``'s
    session, printing the status (and the error code of a refusal)."""
    probe = (
        "import json, urllib.request, urllib.error\n"
        f"req = urllib.request.Request('http://{where}/session/{victim}/exec',\n"
        "    data=json.dumps({'command': 'touch pwned'}).encode(),\n"
        "    headers={'Content-Type': 'application/json'})\n"
        "try:\n"
        "    print(urllib.request.urlopen(req, timeout=30).status)\n"
        "except urllib.error.HTTPError as e:\n"
        "    print(e.code, json.load(e)['error']['code'])\n"
    )
    return f"python3 -c \"{probe}\""


@needs_overlay
def test_a_sandbox_sharing_the_hosts_network_cannot_drive_the_executor(executor, demo_task):
    """With egress allowed, a session shares the host's network and so the executor's port; with
    no token set, it could run commands in every other session. The kernel names the owner of
    each loopback socket: the sandbox uid's requests are refused."""
    victim = _start(executor, demo_task)
    port = int(executor.url.rsplit(":", 1)[1])
    attacker = _start(executor, demo_task, deny_network=False)
    answer = _exec(executor, attacker, _drive_probe(f"127.0.0.1:{port}", victim))
    assert answer["output"].strip() == "403 from_sandbox", answer["output"]
    assert _exec(executor, victim, "ls pwned 2>&1; true")["output"].count("No such file") == 1
    # the executor itself still answers a caller on the same loopback
    assert executor.get(f"/session/{victim}").status_code == 200


@needs_overlay
def test_a_sandbox_sharing_a_port_with_root_sockets_is_still_refused(executor, demo_task):
    """The kernel lets sockets share a local port when their destinations differ (connect()'s
    ephemeral ports; any bind with SO_REUSEADDR). The check matched the peer's end alone, so a
    root process's socket on the same port, listed first, let the sandbox through (seen once
    under load, by chance). Here the sandbox picks a port root sockets already use, on purpose."""
    victim = _start(executor, demo_task)
    port = int(executor.url.rsplit(":", 1)[1])
    attacker = _start(executor, demo_task, deny_network=False)
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(8)]
    roots = [socket.socket() for _ in listeners]  # root sockets on one port, to 8 destinations
    for one in roots:
        one.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    roots[0].bind(("127.0.0.1", 0))
    local_port = roots[0].getsockname()[1]
    for one, listener in zip(roots, listeners, strict=True):
        if one is not roots[0]:
            one.bind(("127.0.0.1", local_port))
        one.connect(listener.getsockname())
    probe = (
        "import json, socket\n"
        "s = socket.socket()\n"
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f"s.bind(('127.0.0.1', {local_port}))\n"
        f"s.connect(('127.0.0.1', {port}))\n"
        "body = json.dumps({'command': 'touch pwned'}).encode()\n"
        f"s.sendall(b'POST /session/{victim}/exec HTTP/1.1\\r\\nHost: x\\r\\n'\n"
        "          b'Content-Type: application/json\\r\\nConnection: close\\r\\n'\n"
        "          b'Content-Length: ' + str(len(body)).encode() + b'\\r\\n\\r\\n' + body)\n"
        "print(s.makefile('rb').readline().decode().split()[1])\n"
    )
    try:
        answer = _exec(executor, attacker, f"python3 -c \"{probe}\"")
    finally:
        for one in [*roots, *listeners]:
            one.close()
    assert answer["output"].strip() == "403", answer["output"]
    assert _exec(executor, victim, "ls pwned 2>&1; true")["output"].count("No such file") == 1


def _own_non_loopback_address() -> str | None:
    """An IPv4 address of this host's own interfaces other than loopback (traffic to it never
    leaves the host), or None."""
    listed = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True,
                            check=False).stdout
    for line in listed.splitlines():
        address = line.split()[3].split("/")[0]
        if not address.startswith("127."):
            return address
    return None


@needs_overlay
def test_a_sandbox_reaching_the_executor_by_the_hosts_own_address_is_refused(tmp_path, demo_task):
    """The check looked only at loopback peers: a sandbox sharing the host's network reached an
    executor listening on every address (the default, 0.0.0.0) by the host's own IP, as near as
    127.0.0.1, and drove other sessions."""
    address = _own_non_loopback_address()
    if address is None:
        pytest.skip("no non-loopback address on this host")
    settings = Settings(base_dir=tmp_path / "base", threads=8, task_timeout=120)
    executor, stop = start_executor(settings, host="0.0.0.0")
    try:
        victim = _start(executor, demo_task)
        attacker = _start(executor, demo_task, deny_network=False)
        port = executor.url.rsplit(":", 1)[1]
        answer = _exec(executor, attacker, _drive_probe(f"{address}:{port}", victim))
        assert answer["output"].strip() == "403 from_sandbox", answer["output"]
        assert _exec(executor, victim, "ls pwned 2>&1; true")["output"].count("No such file") == 1
    finally:
        stop()


def test_a_tree_whose_root_cannot_go_leaves_its_parent_as_it_was(tmp_path):
    """A workspace root with a mount still on it (EBUSY) made remove_tree chmod its parent,
    BASE/work, to 0700: every later sandbox was refused its binds (bwrap: Permission denied)."""
    from task_executor.sandbox.mounts import mount_tmpfs, unmount
    from task_executor.workspaces.fsutil import remove_tree

    if os.geteuid() != 0:
        pytest.skip("mounting needs root")
    work = tmp_path / "work"
    tree = work / "ws-busy"
    tree.mkdir(parents=True)
    work.chmod(0o711)
    mount_tmpfs(tree, 1 << 20)
    try:
        (tree / "file").write_text("x")
        remove_tree(tree)
        assert work.stat().st_mode & 0o7777 == 0o711
        assert list(tree.iterdir()) == []  # what could go went
    finally:
        unmount(tree)


def test_a_small_tree_goes_in_process_and_a_big_one_through_rm(tmp_path):
    """remove_small_tree takes a holder once unmounted (a few directories, option files) and
    unlinks a symlink without following it; a tree past its bound it refuses, saying so, and
    leaves whole; remove_trees removes every kind."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("kept")
    small = tmp_path / "small"
    for part in ("rw", "merged", "runtime-mnt/usr-local", "runtime-mnt/opt"):
        (small / part).mkdir(parents=True)
    (small / "bwrap-args").write_bytes(b"--ro-bind\0/\0/\0")
    (small / "rw" / "to-outside").symlink_to(outside)
    big = tmp_path / "big"
    big.mkdir()
    for i in range(100):
        (big / f"f{i}").write_text("x")
    locked = tmp_path / "locked"
    (locked / "deep" / "er").mkdir(parents=True)
    (locked / "deep" / "er" / "f").write_text("x")
    (locked / "deep").chmod(0o500)

    assert remove_small_tree(small) is True
    assert not small.exists()
    assert remove_small_tree(big, most=64) is False
    assert len(list(big.iterdir())) == 100

    remove_trees([big, locked], batch=1)
    assert not big.exists() and not locked.exists()
    assert (outside / "keep").read_text() == "kept"  # the symlink went, never followed


def test_the_sandboxs_option_files_live_in_a_tmpfs_and_go_with_their_workspace(executor,
                                                                                demo_task):
    """Written on every workspace's first launch: in a root-only tmpfs, never the disk (two
    files cost 1.25 ms there against 0.1 ms), and removed with the workspace."""
    health = executor.get("/health").json()
    if not health["capabilities"]["sandbox"]["user_namespace"]:
        pytest.skip("no sandbox here")
    args_root = executor.settings.base_dir / "launch-args"
    table = Path("/proc/self/mountinfo").read_text().split("\n")
    assert any(f" {args_root} " in line and " - tmpfs " in line for line in table)
    assert args_root.stat().st_mode & 0o777 == 0o700
    sid = _start(executor, demo_task)
    assert _exec(executor, sid, "echo ok")["output"] == "ok\n"
    (mine,) = args_root.iterdir()
    assert {p.name[:7] for p in mine.iterdir()} == {".bwrap-"}
    assert "--unshare-user" in next(mine.iterdir()).read_bytes().decode()
    # nothing of them reaches the sandbox
    seen = _exec(executor, sid, f"ls {args_root} 2>&1; ls /proc/1/fd")["output"]
    assert "No such file" in seen and "\n3\n" not in seen
    assert executor.delete(f"/session/{sid}").status_code == 200
    executor.work_dirs()  # (once the workspace is removed: after the DELETE's answer)
    assert list(args_root.iterdir()) == []

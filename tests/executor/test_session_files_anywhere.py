"""Files outside the working tree and directory uploads, through the real routes and the real
sandbox (issue 25), including what a hostile agent plants to redirect them."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

import pytest

from tests.conftest import RunningExecutor
from tests.executor import session_fixtures
from tests.executor.test_sessions_api import _exec, _start

# The shared fixtures, made visible to pytest in this module.
session = session_fixtures.session
shared_executor = session_fixtures.shared_executor
task = session_fixtures.task


def _put(executor: RunningExecutor, sid: str, path: str, data: bytes):  # type: ignore[no-untyped-def]
    return executor.put(f"/session/{sid}/file", params={"path": path}, data=data)


def _upload(executor: RunningExecutor, sid: str, path: str, data: bytes):  # type: ignore[no-untyped-def]
    return executor.post(f"/session/{sid}/upload", params={"path": path}, data=data,
                         headers={"Content-Type": "application/x-tar"})


def _tar(*members: tuple[tarfile.TarInfo, bytes | None], compress: bool = False) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz" if compress else "w") as archive:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, *, mode: int = 0o644,
            link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname = kind, mode, link
    return info


def test_a_file_outside_the_tree_is_the_sandboxs(shared_executor, session):
    assert _put(shared_executor, session, "/tmp/notes/a.txt", b"from the api").status_code == 200
    assert _exec(shared_executor, session, "cat /tmp/notes/a.txt")["output"] == "from the api"
    _exec(shared_executor, session, "printf 'from the shell' > /tmp/b.txt")
    read = shared_executor.get(f"/session/{session}/file", params={"path": "/tmp/b.txt"})
    assert read.status_code == 200 and read.content == b"from the shell"
    assert read.headers["X-File-Size"] == "14"
    missing = shared_executor.get(f"/session/{session}/file", params={"path": "/tmp/none"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "file_not_found"
    ro = _put(shared_executor, session, "/usr/bin/dockyard-new", b"x")
    assert ro.status_code == 403 and ro.json()["error"]["code"] == "path_not_writable"
    directory = shared_executor.get(f"/session/{session}/file", params={"path": "/tmp"})
    assert directory.json()["error"]["code"] == "is_a_directory"


def test_a_file_larger_than_its_size_check_is_too_large(shared_executor, session, monkeypatch):
    # What the agent can do between the executor's size check and the read (swap in a larger
    # file): a /proc file shows it without a race, its stat size 0, its bytes many.
    monkeypatch.setattr("task_executor.sessions.manager.MAX_READ_BYTES", 16)
    read = shared_executor.get(f"/session/{session}/file", params={"path": "/proc/self/status"})
    assert read.status_code == 400 and read.json()["error"]["code"] == "too_large"


def test_a_planted_symlink_to_etc_does_not_redirect_a_write(shared_executor, session):
    _exec(shared_executor, session, "ln -s /etc /tmp/x")
    refused = _put(shared_executor, session, "/tmp/x/dockyard-evil", b"pwned")
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "path_not_writable"
    upload = _upload(shared_executor, session, "/tmp/x",
                     _tar((_member("dockyard-evil"), b"pwned")))
    assert upload.status_code == 403
    assert upload.json()["error"]["code"] == "path_not_writable"
    assert not Path("/etc/dockyard-evil").exists()


def test_the_executors_base_dir_cannot_be_reached(shared_executor, session):
    base = shared_executor.settings.base_dir
    _exec(shared_executor, session, f"ln -s {base} /tmp/base")
    for path in (f"{base}/dockyard-pwned", "/tmp/base/dockyard-pwned"):
        _put(shared_executor, session, path, b"pwned")  # hidden there: not the host's dir
        assert not (base / "dockyard-pwned").exists()
    _upload(shared_executor, session, "/tmp/base", _tar((_member("dockyard-pwned"), b"x")))
    assert not (base / "dockyard-pwned").exists()
    # Whatever was written went to the sandbox's own view (here: below its private /tmp,
    # which is where this base dir's path leads inside), never to the executor's directory.
    written = [str(p.relative_to(base)) for p in base.rglob("dockyard-pwned")]
    assert all(p.startswith("work/") and "/rw/tmp/" in p for p in written), written


def test_upload_keeps_modes_and_runs(shared_executor, session):
    script = b"#!/bin/sh\necho tool ran\n"
    archive = _tar((_member("bin", tarfile.DIRTYPE, mode=0o755), None),
                   (_member("bin/tool", mode=0o755), script),
                   (_member("lib/data.txt", mode=0o600), b"data"),
                   (_member("bin/alias", tarfile.SYMTYPE, link="tool"), None),
                   (_member("lib/hard", tarfile.LNKTYPE, link="lib/data.txt"), None),
                   compress=True)
    answer = _upload(shared_executor, session, "/tmp/tools", archive)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"files": 2, "bytes": len(script) + 4}
    ran = _exec(shared_executor, session, "/tmp/tools/bin/alias && stat -c %a "
                "/tmp/tools/bin/tool /tmp/tools/lib/data.txt && cat /tmp/tools/lib/hard")
    assert ran["output"] == "tool ran\n755\n600\ndata"
    # Relative to the tree, as file paths are.
    assert _upload(shared_executor, session, "vendor",
                   _tar((_member("x.py"), b"x = 1\n"))).status_code == 200
    assert _exec(shared_executor, session, "cat vendor/x.py")["output"] == "x = 1\n"


UNSAFE = {
    "absolute": [(_member("/tmp/abs"), b"x")],
    "dotdot": [(_member("a/../../escape"), b"x")],
    "device": [(_member("null", tarfile.CHRTYPE), None)],
    "fifo": [(_member("pipe", tarfile.FIFOTYPE), None)],
    "symlink-absolute": [(_member("l", tarfile.SYMTYPE, link="/etc"), None)],
    "symlink-out": [(_member("d/l", tarfile.SYMTYPE, link="../../etc"), None)],
    "symlink-chain": [(_member("l", tarfile.SYMTYPE, link="."), None),
                      (_member("m", tarfile.SYMTYPE, link="l/.."), None)],
    "through-symlink": [(_member("l", tarfile.SYMTYPE, link="sub"), None),
                        (_member("l/f"), b"x")],
    "through-symlink-dot": [(_member("a/l", tarfile.SYMTYPE, link="b"), None),
                            (_member("a/./l/x"), b"x")],
    "hardlink-out": [(_member("h", tarfile.LNKTYPE, link="/etc/passwd"), None)],
    "hardlink-dotdot": [(_member("h", tarfile.LNKTYPE, link="../x"), None)],
}


@pytest.mark.parametrize("attack", sorted(UNSAFE))
def test_unsafe_archives_are_refused_whole(shared_executor, session, attack):
    archive = _tar((_member("first.txt"), b"written?"), *UNSAFE[attack])
    answer = _upload(shared_executor, session, "/tmp/up", archive)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "unsafe_archive"
    assert _exec(shared_executor, session, "ls /tmp/up 2>&1; ls /tmp")["output"].count(
        "first.txt") == 0


def test_an_archive_of_too_many_entries_is_refused_before_it_is_read_whole(
        shared_executor, session, monkeypatch):
    # Entries weigh nothing against the byte cap; their count is capped on its own.
    monkeypatch.setattr("task_executor.sessions.archive.MAX_MEMBERS", 50)
    archive = _tar(*[(_member(f"d{i}", tarfile.DIRTYPE, mode=0o755), None) for i in range(51)])
    answer = _upload(shared_executor, session, "/tmp/many", archive)
    assert answer.status_code == 413 and answer.json()["error"]["code"] == "payload_too_large"
    fine = _tar(*[(_member(f"d{i}", tarfile.DIRTYPE, mode=0o755), None) for i in range(50)])
    assert _upload(shared_executor, session, "/tmp/many", fine).status_code == 200


def test_bad_and_oversized_archives(shared_executor, session):
    garbage = _upload(shared_executor, session, "/tmp/up", b"not a tar at all" * 100)
    assert garbage.status_code == 400
    assert garbage.json()["error"]["code"] == "invalid_archive"
    empty = _upload(shared_executor, session, "/tmp/up", b"")
    assert empty.status_code == 400 and empty.json()["error"]["code"] == "empty_body"
    no_path = shared_executor.post(f"/session/{session}/upload", data=b"x")
    assert no_path.json()["error"]["code"] == "missing_path"
    cap = shared_executor.settings.max_body_bytes
    bomb = _tar((_member("zeros"), bytes(cap + 1)))
    squeezed = gzip.compress(bomb, compresslevel=1)
    assert len(squeezed) < cap
    too_big = _upload(shared_executor, session, "/tmp/up", squeezed)
    assert too_big.status_code == 413
    assert too_big.json()["error"]["code"] == "payload_too_large"


def test_the_home_is_writable_per_session_and_never_in_the_diff(shared_executor, session, task):
    tool = "/root/tools/bin/dockyard-home-tool"
    ran = _exec(shared_executor, session, f"echo $HOME && mkdir -p {tool.rsplit('/', 1)[0]} && "
                f"printf '#!/bin/sh\\necho tool ok\\n' > {tool} && chmod +x {tool} && {tool}")
    assert ran["output"] == "/root\ntool ok\n", ran
    assert _put(shared_executor, session, "/root/tools/conf.txt", b"c").status_code == 200
    assert _exec(shared_executor, session, "cat ~/tools/conf.txt")["output"] == "c"
    assert not Path(tool).exists()  # the host's /root is never the sandbox's
    other = _start(shared_executor, task)
    assert _exec(shared_executor, other, f"ls {tool} 2>&1; echo $?")["output"].endswith("2\n")
    shared_executor.delete(f"/session/{other}")
    _exec(shared_executor, session, "sed -i 's/return a - b/return a + b/' calc/__init__.py")
    finished = shared_executor.post(f"/session/{session}/finish", json={
        "test_patch": task.test_patch, "fail_to_pass": task.fail_to_pass,
        "pass_to_pass": task.pass_to_pass}).json()
    assert finished["result"]["status"] == "resolved"
    assert "tools" not in finished["patch"] and "calc/__init__.py" in finished["patch"]

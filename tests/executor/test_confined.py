"""sandbox.confined on real files: every escape a hostile tree can set up (symlinks absolute and
``..``, symlinked parents, names swapped while a call runs, FIFOs, device nodes, sockets), in both
resolution modes (openat2, and the component walk forced as where openat2 is missing)."""

from __future__ import annotations

import errno
import os
import socket
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from task_executor.grading.results import read_report
from task_executor.sandbox import confined
from task_executor.sandbox.confined import ConfinedTree, Refusal

SECRET = b"host secret: never read through the tree\n"
HANG_DETECT_S = 30.0  # only to turn a hang into a failure; the calls take microseconds

MODES = ["openat2", "nofollow-walk"]


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test in both modes; the walk is forced the way a missing openat2 forces it."""
    if request.param == "openat2" and confined.MODE != "openat2":
        pytest.skip(f"openat2 unavailable here: {confined.FALLBACK_REASON}")
    monkeypatch.setattr(confined, "MODE", request.param)
    return request.param


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    path = tmp_path / "tree"
    path.mkdir()
    return path


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A host directory beside the tree, with a secret and a file a write must never touch."""
    path = tmp_path / "outside"
    path.mkdir()
    (path / "secret").write_bytes(SECRET)
    (path / "target").write_bytes(b"original")
    return path


@pytest.fixture
def confined_tree(tree: Path, mode: str) -> Iterator[ConfinedTree]:
    with ConfinedTree(tree) as handle:
        assert handle.mode == mode
        yield handle


def listing(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def refusal(call: Callable[[], object]) -> Refusal:
    with pytest.raises(Refusal) as caught:
        call()
    return caught.value


def without_hanging(call: Callable[[], object]) -> object:
    """``call()`` in a thread: its result or exception, or a failure if it never returns."""
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed to the test thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_DETECT_S)
    assert not thread.is_alive(), "the call blocked"
    if "error" in outcome:
        return outcome["error"]
    return outcome["value"]


# ------------------------------------------------------------------ legal use


def test_mode_is_detected_and_openat2_is_used_here():
    assert confined.MODE in MODES
    # This machine's kernel has openat2; a pod's seccomp filter may not (then the walk).
    assert confined.MODE == "openat2", confined.FALLBACK_REASON


def test_missing_openat2_falls_back_to_the_walk(monkeypatch):
    monkeypatch.setattr(confined, "_OPENAT2_NUMBERS", {})
    mode, reason = confined._detect_mode()
    assert mode == "nofollow-walk"
    assert "ENOSYS" in (reason or "")


def test_round_trip_modes_and_parents(confined_tree, tree):
    data = b"crlf\r\n\xef\xbb\xbfbom \xff\xfe" + bytes(range(256))
    confined_tree.write_bytes("a/b/new.bin", data)
    assert (tree / "a/b/new.bin").read_bytes() == data
    assert confined_tree.read_bytes("a/b/new.bin", 1 << 20) == data
    assert stat.S_IMODE((tree / "a/b/new.bin").stat().st_mode) == 0o644
    script = tree / "run.sh"
    script.write_bytes(b"old")
    script.chmod(0o6750)  # an edit keeps the permissions, never the set-id bits
    confined_tree.write_bytes("run.sh", b"#!/bin/sh\n")
    assert script.read_bytes() == b"#!/bin/sh\n"
    assert stat.S_IMODE(script.stat().st_mode) == 0o750
    assert listing(tree) == ["a", "a/b", "a/b/new.bin", "run.sh"]  # no temporary file left


def test_owner_is_given_the_file_and_the_parents_made_for_it(confined_tree, tree):
    (tree / "kept").mkdir()
    confined_tree.write_bytes("kept/made/deeper/f.txt", b"x", owner=(4321, 8765))
    for made in ("kept/made", "kept/made/deeper", "kept/made/deeper/f.txt"):
        info = (tree / made).stat()
        assert (info.st_uid, info.st_gid) == (4321, 8765), made
    assert (tree / "kept").stat().st_uid == 0  # an existing parent is not handed over
    assert stat.S_IMODE((tree / "kept/made").stat().st_mode) == 0o755


def test_symlinks_inside_the_tree_resolve_as_if_it_were_root(tree, mode):
    (tree / "inner").mkdir()
    (tree / "inner/f").write_bytes(b"inside")
    (tree / "abs").symlink_to("/inner")  # absolute: resolved against the tree, not the host
    (tree / "rel").symlink_to("inner")
    with ConfinedTree(tree) as handle:
        if mode == "openat2":
            assert handle.read_bytes("abs/f", 100) == b"inside"
            assert handle.read_bytes("rel/f", 100) == b"inside"
        else:  # the walk follows no symlink at all
            assert refusal(lambda: handle.read_bytes("rel/f", 100)).code == "symlink_refused"
    with ConfinedTree(tree, no_symlinks=True) as handle:
        assert refusal(lambda: handle.read_bytes("rel/f", 100)).code == "symlink_refused"


def test_path_syntax_is_checked_first(confined_tree):
    cases = {
        "": "missing_path",
        "a\0b": "invalid_path",
        "/etc/passwd": "path_outside_workspace",
        "..": "path_outside_workspace",
        "a/../../x": "path_outside_workspace",
        "x" * 256: "path_too_long",
        "/".join(["d"] * 2100): "path_too_long",
        ".": "is_a_directory",
    }
    for path, code in cases.items():
        assert refusal(lambda p=path: confined_tree.read_bytes(p, 10)).code == code, path
        assert refusal(lambda p=path: confined_tree.write_bytes(p, b"x")).code == code, path


def test_sizes_directories_and_missing_files(confined_tree, tree):
    (tree / "big").write_bytes(b"x" * 101)
    (tree / "dir").mkdir()
    (tree / "file").write_bytes(b"x")
    assert refusal(lambda: confined_tree.read_bytes("big", 100)).code == "too_large"
    assert confined_tree.read_bytes("big", 101) == b"x" * 101
    assert refusal(lambda: confined_tree.read_bytes("dir", 100)).code == "is_a_directory"
    assert refusal(lambda: confined_tree.write_bytes("dir", b"x")).code == "is_a_directory"
    assert refusal(lambda: confined_tree.read_bytes("nope", 100)).code == "file_not_found"
    assert refusal(lambda: confined_tree.read_bytes("file/x", 100)).code == "file_not_found"
    assert refusal(lambda: confined_tree.write_bytes("file/x", b"x")).code == "not_a_directory"
    assert listing(tree) == ["big", "dir", "file"]


# ------------------------------------------------------------------ escapes


def test_a_final_symlink_is_never_followed(confined_tree, tree, outside):
    (tree / "abs").symlink_to(outside / "secret")
    (tree / "up").symlink_to("../outside/secret")
    (tree / "to-target").symlink_to(outside / "target")
    for name in ("abs", "up", "to-target"):
        assert refusal(lambda n=name: confined_tree.read_bytes(n, 1000)).code == (
            "not_a_regular_file")
        assert refusal(lambda n=name: confined_tree.write_bytes(n, b"evil")).code == (
            "not_a_regular_file")
    assert (outside / "target").read_bytes() == b"original"
    assert (tree / "to-target").is_symlink()
    assert listing(tree) == ["abs", "to-target", "up"]


@pytest.mark.parametrize("link", ["absolute", "dotdot", "deep-dotdot"])
def test_a_symlinked_parent_never_leads_out(confined_tree, tree, outside, link):
    target = {"absolute": str(outside), "dotdot": "../outside",
              "deep-dotdot": "../../../../../../../../" + str(outside).lstrip("/")}[link]
    (tree / "d").symlink_to(target)
    read = refusal(lambda: confined_tree.read_bytes("d/secret", 1000))
    assert read.code in ("file_not_found", "symlink_refused")  # not found inside the tree
    for path in ("d/target", "d/new.txt", "d/sub/new.txt"):
        wrote = refusal(lambda p=path: confined_tree.write_bytes(p, b"evil"))
        assert wrote.code in ("path_outside_workspace", "symlink_refused"), path
    assert sorted(os.listdir(outside)) == ["secret", "target"]
    assert (outside / "target").read_bytes() == b"original"
    assert listing(tree) == ["d"]


def test_a_planted_temporary_name_is_not_used(confined_tree, tree, outside):
    # The old writer's temporary name was predictable: a symlink there got written as root.
    (tree / ".f.dockyard-write").symlink_to(outside / "target")
    os.mkfifo(tree / ".g.dockyard-write")
    confined_tree.write_bytes("f", b"mine")
    assert without_hanging(lambda: confined_tree.write_bytes("g", b"mine")) is None
    assert (tree / "f").read_bytes() == b"mine"
    assert (outside / "target").read_bytes() == b"original"
    assert listing(tree) == [".f.dockyard-write", ".g.dockyard-write", "f", "g"]


def test_fifos_never_block(confined_tree, tree):
    os.mkfifo(tree / "fifo")
    (tree / "d").mkdir()
    os.mkfifo(tree / "d/fifo")
    for call in (
        lambda: confined_tree.read_bytes("fifo", 100),
        lambda: confined_tree.read_bytes("d/fifo", 100),
        lambda: confined_tree.write_bytes("fifo", b"x"),
        lambda: confined_tree.read_bytes("fifo/x", 100),
    ):
        result = without_hanging(call)
        assert isinstance(result, Refusal)
        assert result.code in ("not_a_regular_file", "file_not_found")
    assert refusal(lambda: confined_tree.write_bytes("fifo/x", b"x")).code == "not_a_directory"
    assert stat.S_ISFIFO((tree / "fifo").lstat().st_mode)
    assert listing(tree) == ["d", "d/fifo", "fifo"]


def test_devices_and_sockets_are_refused(confined_tree, tree):
    os.mknod(tree / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    os.mknod(tree / "disk", stat.S_IFBLK | 0o600, os.makedev(7, 0))
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tree / "sock"))
    try:
        for name, kind in (("null", "character device"), ("disk", "block device"),
                           ("sock", "socket")):
            read = without_hanging(lambda n=name: confined_tree.read_bytes(n, 100))
            assert isinstance(read, Refusal) and read.code == "not_a_regular_file"
            assert kind in str(read)
            wrote = without_hanging(lambda n=name: confined_tree.write_bytes(n, b"x"))
            assert isinstance(wrote, Refusal) and wrote.code == "not_a_regular_file"
    finally:
        listener.close()
    assert stat.S_ISCHR((tree / "null").lstat().st_mode)
    assert listing(tree) == ["disk", "null", "sock"]


def test_a_failed_write_leaves_nothing_behind(confined_tree, tree, monkeypatch):
    (tree / "f").write_bytes(b"before")

    def no_rename(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EIO, "injected rename failure")

    monkeypatch.setattr(confined.os, "rename", no_rename)
    with pytest.raises(OSError, match="injected"):
        confined_tree.write_bytes("f", b"after")
    with pytest.raises(OSError, match="injected"):
        confined_tree.write_bytes("new/g", b"after")
    monkeypatch.undo()
    assert (tree / "f").read_bytes() == b"before"
    assert listing(tree) == ["f", "new"]  # the parent made for it stays; no temporary file


def test_messages_name_the_path_as_requested_never_a_host_path(confined_tree, tree, outside):
    (tree / "link").symlink_to(outside / "secret")
    (tree / "d").symlink_to(outside)
    os.mkfifo(tree / "fifo")
    errors = [
        refusal(lambda: confined_tree.read_bytes("link", 10)),
        refusal(lambda: confined_tree.write_bytes("d/x", b"")),
        refusal(lambda: confined_tree.read_bytes("fifo", 10)),
        refusal(lambda: confined_tree.read_bytes("/etc/passwd", 10)),
    ]
    for error in errors:
        assert str(tree.parent) not in str(error)
        assert error.path in ("link", "d/x", "fifo", "/etc/passwd")
    renamed = errors[0].as_requested("/testbed/link")
    assert "'/testbed/link'" in str(renamed) and renamed.code == errors[0].code


# ------------------------------------------------------------------ races


def _swapping(tree: Path, name: str, real: Callable[[Path], None], link_to: Path) -> Callable:
    """Start a thread swapping ``tree/name`` between a real thing and a symlink to ``link_to``
    (each swap one atomic rename); returns a function that stops it."""
    stop = threading.Event()

    def swap() -> None:
        staging, target = tree / f".{name}.staging", tree / name
        while not stop.is_set():
            for make in (real, lambda p: p.symlink_to(link_to)):
                make(staging)
                try:
                    os.rename(staging, target)
                except OSError:  # a directory and a symlink cannot replace each other
                    _remove(target)
                    os.rename(staging, target)

    thread = threading.Thread(target=swap, daemon=True)
    thread.start()

    def stop_swapping() -> None:
        stop.set()
        thread.join(HANG_DETECT_S)
        assert not thread.is_alive()

    return stop_swapping


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        for child in path.iterdir():
            child.unlink()
        path.rmdir()


def test_reads_racing_a_file_symlink_swap_never_read_outside(confined_tree, tree, outside):
    stop = _swapping(tree, "f", lambda p: p.write_bytes(b"inside"), outside / "secret")
    seen: set[object] = set()
    try:
        for _ in range(2000):
            try:
                seen.add(confined_tree.read_bytes("f", 1000))
            except Refusal as exc:
                seen.add(exc.code)
    finally:
        stop()
    assert SECRET not in seen
    assert seen <= {b"inside", "not_a_regular_file", "file_not_found"}
    assert b"inside" in seen


def test_reads_racing_a_parent_directory_swap_never_read_outside(confined_tree, tree, outside):
    def real_dir(path: Path) -> None:
        path.mkdir()
        (path / "secret").write_bytes(b"inside")

    stop = _swapping(tree, "d", real_dir, outside)
    seen: set[object] = set()
    try:
        for _ in range(2000):
            try:
                seen.add(confined_tree.read_bytes("d/secret", 1000))
            except Refusal as exc:
                seen.add(exc.code)
    finally:
        stop()
    assert SECRET not in seen
    assert seen <= {b"inside", "file_not_found", "symlink_refused"}


def test_writes_racing_a_symlink_swap_never_write_outside(confined_tree, tree, outside):
    stop = _swapping(tree, "f", lambda p: p.write_bytes(b"inside"), outside / "target")
    try:
        for index in range(500):
            try:
                confined_tree.write_bytes("f", b"write %d" % index)
            except Refusal as exc:
                assert exc.code == "not_a_regular_file"
    finally:
        stop()
    assert (outside / "target").read_bytes() == b"original"
    assert sorted(os.listdir(outside)) == ["secret", "target"]
    assert not [name for name in os.listdir(tree) if name.startswith(".dockyard-")]


# ------------------------------------------------------------------ removal


def test_lstat_exists_unlink_and_remove_never_follow(confined_tree, tree, outside):
    (tree / "d/e").mkdir(parents=True)
    (tree / "d/e/f").write_bytes(b"x")
    (tree / "d/out").symlink_to(outside)  # a symlink inside a removed tree: only it goes
    (tree / "dangling").symlink_to("/nowhere")
    os.mkfifo(tree / "d/fifo")
    assert confined_tree.exists("dangling") and not confined_tree.exists("nope")
    assert stat.S_ISLNK(confined_tree.lstat("dangling").st_mode)
    assert stat.S_ISDIR(confined_tree.lstat(".").st_mode)
    assert refusal(lambda: confined_tree.unlink("d")).code == "is_a_directory"
    confined_tree.unlink("dangling")
    assert without_hanging(lambda: confined_tree.remove("d")) is None
    assert listing(tree) == []
    assert sorted(os.listdir(outside)) == ["secret", "target"]
    assert refusal(lambda: confined_tree.remove("d")).code == "file_not_found"
    assert refusal(lambda: confined_tree.remove(".")).code == "is_a_directory"


# ------------------------------------------------------------------ the test report


def test_a_report_replaced_by_a_symlink_or_fifo_reads_as_no_report(tree, outside, mode):
    line = b'{"kind": "test", "id": "t::ok", "when": "call", "outcome": "passed"}\n'
    (outside / "fake.jsonl").write_bytes(line)
    (tree / "good.jsonl").write_bytes(line)
    (tree / "link.jsonl").symlink_to(outside / "fake.jsonl")
    os.mkfifo(tree / "fifo.jsonl")
    assert read_report(tree, "good.jsonl").states == {"t::ok": "PASSED"}
    for name in ("link.jsonl", "fifo.jsonl", "missing.jsonl"):
        run = without_hanging(lambda n=name: read_report(tree, n))
        assert run.states == {} and run.aliases == {}, name  # type: ignore[attr-defined]

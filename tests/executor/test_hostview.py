"""The prebuilt host view: what sandboxes see of the host, built once at start, or the fallback."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from task_executor.sandbox.hostview import build_host_view
from task_executor.sandbox.mounts import (
    MS_SHARED,
    mount_tmpfs,
    mounts_under,
    set_propagation,
    unmount_under,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the view is made of mounts: root")


@pytest.fixture
def base(tmp_path: Path):
    base = tmp_path / "base"
    (base / "secret").mkdir(parents=True)
    yield base
    unmount_under(tmp_path)


@pytest.fixture
def executor_code() -> Iterator[str]:
    """A directory with a file, standing in for the executor's code (never under /tmp, which
    every sandbox has its own of anyway)."""
    directory = Path(tempfile.mkdtemp(prefix="dockyard-hostview-", dir="/var/tmp"))
    (directory / "secret.py").write_text("TOKEN = 1\n")
    yield str(directory)
    shutil.rmtree(directory)


def test_the_view_is_the_host_read_only_without_the_base_dir(executor_code: str,
                                                              base: Path) -> None:
    # (executor_code first: set up before base, torn down after the view is unmounted)
    hidden = executor_code
    view = build_host_view(base / "view", base, (hidden,), keep_hiding_below=(),
                           mount_points=("/proc", "/dev", "/tmp", "/run", "/testbed"))
    assert view.prebuilt, view.reason
    assert view.argv == ("--ro-bind", str(base / "view"), "/")
    assert view.hide == ()  # covered in the view itself
    root = base / "view"
    assert (root / "usr" / "bin" / "git").exists()
    assert sorted(p.name for p in (root / Path(hidden).relative_to("/")).iterdir()) == []
    assert not (root / base.relative_to("/")).exists()  # the base dir is not in it at all
    for point in ("proc", "dev", "tmp", "run", "testbed"):
        assert (root / point).is_dir() and list((root / point).iterdir()) == []
    for target in (root / "usr" / "planted", root / "planted", root / "etc" / "planted"):
        with pytest.raises(OSError):
            target.write_text("x")  # read-only, root or not
    assert mounts_under(base / "view")


def test_a_view_that_cannot_be_built_falls_back_and_leaves_nothing(base: Path) -> None:
    # A mount point below a read-only bound host directory cannot be made.
    view = build_host_view(base / "view", base, (), keep_hiding_below=(),
                           mount_points=("/usr/dockyard-cannot-exist",))
    assert not view.prebuilt and "entry-by-entry" in view.reason
    assert view.argv[:2] == ("--tmpfs", "/")
    assert mounts_under(base) == [] and not (base / "view").exists()
    assert not Path("/usr/dockyard-cannot-exist").exists()


def test_hidden_directories_below_a_runtime_directory_stay_with_bubblewrap(base: Path) -> None:
    view = build_host_view(base / "view", base, ("/usr/local/lib", "/opt/x"),
                           keep_hiding_below=("/usr/local",), mount_points=())
    assert view.prebuilt and view.hide == ("/usr/local/lib",)


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory on the host's own filesystem (not /tmp, which the view never shows)."""
    directory = Path(tempfile.mkdtemp(prefix="dockyard-hostview-", dir="/var/tmp"))
    yield directory
    unmount_under(directory)
    shutil.rmtree(directory)


def view_mounts(view: Path) -> list[str]:
    return [os.path.relpath(point, view) for point in mounts_under(view)]


@pytest.mark.parametrize("hidden", [False, True])
def test_a_hidden_directory_on_the_way_to_the_base_dir_shows_nothing_of_its_own(
        hidden: bool, scratch: Path) -> None:
    """A fleet's directory holds every worker's base dir: hidden, nothing of the other
    workers' shows (their files, their mounts), and none of their mounts is even in the view's
    mount table, below a cover or not."""
    fleet = scratch / "fleet"
    base, neighbour = fleet / "worker-0", fleet / "worker-1"
    (neighbour / "work").mkdir(parents=True)
    (neighbour / "work" / "on-disk").write_text("x")
    (neighbour / "mounted").mkdir()
    mount_tmpfs(neighbour / "mounted", 1 << 20, mode=0o755)
    (neighbour / "mounted" / "in-a-mount").write_text("x")
    base.mkdir()
    view = build_host_view(base / "view", base, (str(fleet),) if hidden else (),
                           keep_hiding_below=(), mount_points=())
    assert view.prebuilt, view.reason
    seen = base / "view" / neighbour.relative_to("/")
    # the control: both shown when not hidden
    assert (seen / "work" / "on-disk").exists() is not hidden
    assert (seen / "mounted" / "in-a-mount").exists() is not hidden
    mounts = view_mounts(base / "view")
    assert any("worker-1" in point for point in mounts) is not hidden
    if hidden:
        assert [p for p in mounts if "fleet" in p] == [str(fleet.relative_to("/"))]  # the cover
        assert list((base / "view" / fleet.relative_to("/")).iterdir()) == []


def test_the_base_dirs_neighbours_show_through_one_mount(scratch: Path) -> None:
    """Every mount in the view is in every sandbox's mount table (bubblewrap reads it back
    after each of its mounts): neighbours of the base dir no longer cost one each."""
    base = scratch / "base"
    base.mkdir()
    counts = []
    for siblings in (0, 30):
        for n in range(siblings):
            (scratch / f"sibling-{n}").mkdir(exist_ok=True)
            (scratch / f"sibling-{n}" / "file").write_text(str(n))
        view = build_host_view(base / "view", base, (), keep_hiding_below=(), mount_points=())
        assert view.prebuilt, view.reason
        shown = base / "view" / scratch.relative_to("/")
        assert sorted(p.name for p in shown.iterdir()) == sorted(
            ["base", *(f"sibling-{n}" for n in range(siblings))])
        if siblings:
            assert (shown / "sibling-29" / "file").read_text() == "29"
        assert list((shown / "base").iterdir()) == []  # covered: the view is in there
        counts.append(len(view_mounts(base / "view")))
        unmount_under(base)
    assert counts[0] == counts[1]


def test_sys_is_shown_without_the_mounts_below_it(base: Path) -> None:
    if not mounts_under(Path("/sys")):
        pytest.skip("nothing is mounted below /sys here")
    view = build_host_view(base / "view", base, (), keep_hiding_below=(), mount_points=())
    assert view.prebuilt, view.reason
    assert [p for p in view_mounts(base / "view") if p.startswith("sys")] == ["sys"]
    assert (base / "view" / "sys" / "kernel").is_dir()  # sysfs itself is there


def test_a_mount_holding_the_base_dir_shows_its_other_entries(scratch: Path) -> None:
    disk = scratch / "disk"
    disk.mkdir()
    mount_tmpfs(disk, 1 << 20, mode=0o755)
    (disk / "data").write_text("kept")
    (disk / "inner").mkdir()
    mount_tmpfs(disk / "inner", 1 << 20, mode=0o755)
    (disk / "inner" / "deeper").write_text("kept too")
    base = disk / "base"
    (base / "secret").mkdir(parents=True)
    view = build_host_view(base / "view", base, (), keep_hiding_below=(), mount_points=())
    assert view.prebuilt, view.reason
    shown = base / "view" / disk.relative_to("/")
    assert (shown / "data").read_text() == "kept"
    assert (shown / "inner" / "deeper").read_text() == "kept too"
    assert list((shown / "base").iterdir()) == []
    assert not any("base/view" in p for p in view_mounts(base / "view"))




def test_nothing_made_in_the_view_propagates_back_to_a_shared_host(scratch: Path) -> None:
    """On most hosts / is a shared mount: a directory bound from it into the view is a peer of
    it, and a cover mounted below that bind (the base dir's, say) would land on the host's own
    directory too, hiding the base dir from the executor itself."""
    disk = scratch / "disk"
    disk.mkdir()
    mount_tmpfs(disk, 1 << 20, mode=0o755)
    set_propagation(disk, MS_SHARED)
    (disk / "neighbour").mkdir()
    base = disk / "base"
    (base / "work").mkdir(parents=True)
    view = build_host_view(base / "view", base, (str(disk / "neighbour"),),
                           keep_hiding_below=(), mount_points=())
    assert view.prebuilt, view.reason
    assert (base / "view" / disk.relative_to("/") / "base").is_dir()  # the cover, in the view
    # ...and only there: the host's base dir and neighbour are as they were
    assert [p for p in mounts_under(disk) if not p.startswith(f"{base}/view")] == []
    assert (base / "work").is_dir()

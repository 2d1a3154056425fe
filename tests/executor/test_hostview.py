"""The prebuilt host view: what sandboxes see of the host, built once at start, or the fallback."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from task_executor.sandbox.hostview import build_host_view
from task_executor.sandbox.mounts import mounts_under, unmount_under

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


@pytest.mark.parametrize("hidden", [False, True])
def test_a_hidden_directory_on_the_way_to_the_base_dir_is_left_out_not_covered(hidden: bool):
    """A fleet's directory holds every worker's base dir: covered by a tmpfs, the binds of the
    other workers' dirs would still be below the cover, named in every sandbox's mount table."""
    fleet = Path(tempfile.mkdtemp(prefix="dockyard-hostview-fleet-", dir="/var/tmp"))
    base, neighbour = fleet / "worker-0", fleet / "worker-1"
    (neighbour / "work").mkdir(parents=True)
    base.mkdir()
    try:
        view = build_host_view(base / "view", base, (str(fleet),) if hidden else (),
                               keep_hiding_below=(), mount_points=())
        assert view.prebuilt, view.reason
        seen = base / "view" / neighbour.relative_to("/")
        assert (seen / "work").is_dir() is not hidden  # the control: shown when not hidden
        assert bool(mounts_under(base / "view" / fleet.relative_to("/"))) is not hidden
        assert (base / "view" / fleet.relative_to("/")).exists() is not hidden
    finally:
        unmount_under(fleet)
        shutil.rmtree(fleet)

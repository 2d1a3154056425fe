"""The host as code under test sees it: read-only, without the base directory or the executor.

Showing the host entry by entry (``--ro-bind-try /usr /usr``, ...: about fifty binds) made every
launch pay for fifty binds, and bubblewrap reads the whole mount table back after each one, so a
launch cost grew with every mount on the machine. So the view is built once, at start, as a tree
of its own in the base directory: an empty tmpfs with every top-level entry of the host bound in
it read-only, the executor's own directories covered by empty read-only tmpfs, and the mount
points the sandbox uses made. Every sandbox then shows it with one ``--ro-bind VIEW /``.

Every mount in the view is in every sandbox's mount table, which bubblewrap reads back after
each of its ~35 mounts, and which the kernel copies at each start and tears down at each end: a
sandbox's start and end cost grows with it (the launcher alone: 24.5 ms with 86 mounts in the
sandbox, 17.7 ms with 43, ``scripts/bench/bench_launch.py``). So the view holds as few mounts
as it can: each top-level entry is bound *alone* (its own filesystem, without the mounts below
it), and then only the mounts below it that sandboxes must see are bound again at their places:
not the base directory's (its siblings show through their parent's bind, where each used to be
a mount of its own), not a hidden directory's, and none below ``/sys`` (the sandbox mounts its
own cgroup tree there; securityfs, debugfs, tracefs and bpffs are no business of code under
test).

Where the view cannot be built (no mount privilege, a kernel without ``mount_setattr``, a mount
point that cannot be made), sandboxes get the entry-by-entry arguments instead (same view,
slower), and the reason is reported.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from .mounts import (
    MS_PRIVATE,
    MS_SLAVE,
    bind,
    bind_alone,
    make_read_only,
    mount_tmpfs,
    mounts_under,
    set_propagation,
    unmount,
    unmount_under,
)

log = logging.getLogger(__name__)

PRIVATE_TOP = frozenset({"proc", "dev", "tmp", "run"})
"""Top-level directories every sandbox gets its own of (bubblewrap mounts them)."""
WITHOUT_SUBMOUNTS = frozenset({"sys"})
"""Top-level directories shown without any mount below them."""


@dataclass(frozen=True)
class HostView:
    """What bubblewrap is given to show the host, and what it must still hide itself."""

    argv: tuple[str, ...]
    hide: tuple[str, ...]
    """Hidden directories the view could not cover (below a directory bubblewrap binds over)."""
    prebuilt: bool
    reason: str = ""
    """Why the view is not prebuilt (empty when it is)."""


def host_view_argv(avoid: Path, hidden: tuple[str, ...] = (),
                   root: Path = Path("/")) -> tuple[str, ...]:
    """bwrap arguments showing the host read-only, entry by entry, without ever binding a
    directory that contains ``avoid`` (the base directory).

    ``--ro-bind / /`` would be one argument, but it copies every mount below / -- the workspaces'
    own among them, which come and go all the time: a sandbox starting while another workspace
    is unmounted fails ("Unable to apply mount flags"). So the root is an empty tmpfs, every
    top-level entry is bound on its own, and along the path to ``avoid`` the siblings are bound
    one level at a time; ``avoid`` itself is never shown. The set of entries is read once, at
    start: what appears later beside the base directory's ancestors is not seen by sandboxes.

    A ``hidden`` directory met on the way (a sibling of the base directory or of an ancestor,
    or an ancestor itself: the directory of every base dir of a fleet) is left out the same
    way. Covered by a tmpfs instead, its binds would still be in the view, below the cover, and
    every sandbox's mount table would name them (another executor's base dir).

    With ``root`` (a task image's unpacked root filesystem) its entries are shown instead of the
    host's, each at the same place below ``/``; its symlinks stay symlinks, resolved inside.
    """
    top = os.path.realpath(root)
    target = os.path.realpath(avoid)
    left_out = {target, *(os.path.realpath(path) for path in hidden)}
    argv: list[str] = ["--tmpfs", "/"]

    def show(directory: str) -> None:
        try:
            entries = sorted(os.listdir(directory))
        except OSError:
            return
        for entry in entries:
            path = os.path.join(directory, entry)
            inside = "/" + os.path.relpath(path, top)  # where the sandbox sees it
            if directory == top and entry in PRIVATE_TOP:
                continue
            if path in left_out:
                continue
            if os.path.islink(path):
                argv.extend(["--symlink", os.readlink(path), inside])
            elif target.startswith(path + "/") and os.path.isdir(path):
                argv.extend(["--dir", inside])
                show(path)
            elif os.path.isdir(path) or os.path.isfile(path):
                # -try: an entry removed after start must not stop every sandbox from starting
                argv.extend(["--ro-bind-try", path, inside])

    show(top)
    return tuple(argv)


def build_host_view(
    view: Path, avoid: Path, hide: tuple[str, ...], keep_hiding_below: tuple[str, ...],
    mount_points: tuple[str, ...], root: Path = Path("/"),
) -> HostView:
    """The host view at ``view`` (see the module), or the entry-by-entry arguments.

    ``hide`` is covered in the view unless it lies below one of ``keep_hiding_below`` (the
    copy-on-write runtime directories, which bubblewrap binds over the view: the hiding has to
    come after them). ``mount_points`` are made where the view's own tmpfs holds them. ``root``
    is the directory shown as ``/`` (the host's, or a task image's).
    """
    def below_kept(path: str) -> bool:
        return any(path == kept or path.startswith(kept.rstrip("/") + "/")
                   for kept in keep_hiding_below)

    try:
        _build(view, avoid, hide, [p for p in hide if not below_kept(p)], mount_points, root)
    except OSError as exc:
        _tear_down(view)
        reason = f"entry-by-entry host view ({exc})"
        log.warning("sandboxes show the host entry by entry, slower: %s", exc)
        return HostView(host_view_argv(avoid, hide, root), hide, prebuilt=False, reason=reason)
    return HostView(("--ro-bind", str(view), "/"), tuple(p for p in hide if below_kept(p)),
                    prebuilt=True)


def _build(view: Path, avoid: Path, left_out: tuple[str, ...], cover: list[str],
           mount_points: tuple[str, ...], root: Path) -> None:
    """The view (see the module): ``avoid`` (the base directory) and ``left_out`` are neither
    shown nor their mounts copied; ``cover`` gets an empty read-only tmpfs each."""
    _tear_down(view)  # a crashed predecessor's
    view.mkdir(mode=0o711, exist_ok=True)
    top = os.path.realpath(root)
    # Read before the view exists: the view's own mounts are below the base directory anyway.
    mounts = mounts_under(Path(top))
    mount_tmpfs(view, 1 << 20, mode=0o755)
    # Nothing made in the view propagates anywhere (the host's mount table stays as it was).
    set_propagation(view, MS_PRIVATE)
    unseen = [os.path.realpath(avoid), *(os.path.realpath(path) for path in left_out)]
    for entry in sorted(os.listdir(top)):
        source = os.path.join(top, entry)
        if entry in PRIVATE_TOP or source in unseen:
            continue
        target = view / entry
        if os.path.islink(source):
            os.symlink(os.readlink(source), target)
            continue
        if os.path.isdir(source):
            target.mkdir(mode=0o755, exist_ok=True)
        elif os.path.isfile(source):
            target.touch(mode=0o644)
        else:
            continue  # a socket, a device: not shown (as bubblewrap's --ro-bind-try skips them)
        _show(source, target, mounts if entry not in WITHOUT_SUBMOUNTS else [], unseen, view,
              top)
        make_read_only(target, recursive=True)
    # What is not shown but lies on a shown entry's own filesystem gets an empty cover; the
    # shallowest first, so that nothing is covered twice.
    for path in sorted({os.path.realpath(avoid), *cover}, key=lambda p: p.count("/")):
        target = view / os.path.relpath(path, top)
        if _below(path, top) and path != top and target.is_dir() and not os.path.ismount(target):
            mount_tmpfs(target, 4096, mode=0o755)
            make_read_only(target, recursive=False)
    for point in mount_points:
        target = view / point.lstrip("/")
        if not target.exists():
            target.mkdir(mode=0o755, parents=True)  # EROFS below a bound entry: not buildable
    make_read_only(view, recursive=False)
    # The host's later mounts (a new /sys entry) still show; nothing flows back.
    set_propagation(view, MS_SLAVE, recursive=True)


def _below(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _show(source: str, target: Path, mounts: list[str], unseen: list[str], view: Path,
          top: str) -> None:
    """Bind ``source`` at ``target`` alone, then bind again each topmost mount below it: whole
    when nothing ``unseen`` lies in it, else alone and the same way down (a mount holding the
    base directory shows its other entries, never the base directory's own mounts). Mounts at
    or below an ``unseen`` path (another executor's workspaces, say) never reach a sandbox."""
    bind_alone(Path(source), target)
    # A slave at once: bound from a shared mount (the host's / is shared on most machines) it
    # would be a peer of it, and every mount made below it here (a cover, a mount shown again)
    # would propagate back out, over the host's own directories.
    set_propagation(target, MS_SLAVE)
    below = [point for point in mounts if point != source and _below(point, source)
             and not any(_below(point, hidden) for hidden in unseen)]
    for point in dict.fromkeys(below):
        if any(other != point and _below(point, other) for other in below):
            continue  # below another one: bound with it or by it
        at = view / os.path.relpath(point, top)
        if any(_below(hidden, point) for hidden in unseen):
            _show(point, at, below, unseen, view, top)
        else:
            bind(Path(point), at)
            set_propagation(at, MS_SLAVE, recursive=True)


def _tear_down(view: Path) -> None:
    """Unmount a view (what is below it first) and remove its directory."""
    if not view.exists():
        return
    unmount_under(view)
    if os.path.ismount(view):
        unmount(view)
    try:
        view.rmdir()
    except OSError:
        pass

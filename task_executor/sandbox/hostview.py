"""The host as code under test sees it: read-only, without the base directory or the executor.

Showing the host entry by entry (``--ro-bind-try /usr /usr``, ...: about fifty binds) made every
launch pay for fifty binds, and bubblewrap reads the whole mount table back after each one, so a
launch cost grew with every mount on the machine. So the view is built once, at start, as a tree
of its own in the base directory: an empty tmpfs with every top-level entry of the host bound in
it read-only, the executor's own directories covered by empty read-only tmpfs, and the mount
points the sandbox uses made. Every sandbox then shows it with one ``--ro-bind VIEW /``.

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
    make_read_only,
    mount_tmpfs,
    set_propagation,
    unmount,
    unmount_under,
)

log = logging.getLogger(__name__)

PRIVATE_TOP = frozenset({"proc", "dev", "tmp", "run"})
"""Top-level directories every sandbox gets its own of (bubblewrap mounts them)."""


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
        _build(view, host_view_argv(avoid, hide, root),
               [p for p in hide if not below_kept(p)], mount_points)
    except OSError as exc:
        _tear_down(view)
        reason = f"entry-by-entry host view ({exc})"
        log.warning("sandboxes show the host entry by entry, slower: %s", exc)
        return HostView(host_view_argv(avoid, hide, root), hide, prebuilt=False, reason=reason)
    return HostView(("--ro-bind", str(view), "/"), tuple(p for p in hide if below_kept(p)),
                    prebuilt=True)


def _build(view: Path, argv: tuple[str, ...], hide: list[str],
           mount_points: tuple[str, ...]) -> None:
    _tear_down(view)  # a crashed predecessor's
    view.mkdir(mode=0o711, exist_ok=True)
    mount_tmpfs(view, 1 << 20, mode=0o755)
    # Nothing made in the view propagates anywhere (the host's mount table stays as it was).
    set_propagation(view, MS_PRIVATE)
    at = 2  # after "--tmpfs /"
    while at < len(argv):
        op = argv[at]
        if op == "--dir":
            (view / argv[at + 1].lstrip("/")).mkdir(mode=0o755, exist_ok=True)
            at += 2
        elif op == "--symlink":
            os.symlink(argv[at + 1], view / argv[at + 2].lstrip("/"))
            at += 3
        else:  # --ro-bind-try SOURCE TARGET
            source, target = Path(argv[at + 1]), view / argv[at + 2].lstrip("/")
            at += 3
            if source.is_dir():
                target.mkdir(mode=0o755, exist_ok=True)
            elif source.is_file():
                target.touch(mode=0o644)
            else:
                continue  # gone since it was listed
            bind(source, target)
            make_read_only(target, recursive=True)
    for point in mount_points:
        target = view / point.lstrip("/")
        if not target.exists():
            target.mkdir(mode=0o755, parents=True)  # EROFS below a bound entry: not buildable
    for hidden in hide:
        target = view / hidden.lstrip("/")
        if target.is_dir():
            mount_tmpfs(target, 4096, mode=0o755)
            make_read_only(target, recursive=False)
    make_read_only(view, recursive=False)
    # The host's later mounts (a new /sys entry) still show; nothing flows back.
    set_propagation(view, MS_SLAVE, recursive=True)


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

